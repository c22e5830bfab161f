//! `timeline.png`: three stacked panels (input rate vs capacity; parallelism per operator;
//! latency at the SLO's percentile, p99 by default, with the SLO line).

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::stats::IntervalStats;

/// Errors drawing the chart.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The drawing backend failed (font, file, ...).
    #[error("{path}: cannot draw the timeline: {message}")]
    Draw {
        /// The PNG file.
        path: String,
        /// The backend's message.
        message: String,
    },
}

/// The line colours of streamscale's plots (matplotlib's "tab10" order), shared by the
/// simulator's comparison plot.
pub const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn max_of(values: impl Iterator<Item = f64>) -> f64 {
    values.filter(|v| v.is_finite()).fold(0.0, f64::max)
}

/// Draws the timeline of `rows` (operators in `operators` order) with the SLO `slo_s` seconds
/// into the PNG file `path` (1200×1000 pixels).
///
/// # Errors
/// [`PlotError::Draw`] when the file or fonts cannot be used.
pub fn plot_timeline(
    path: &Path,
    rows: &[IntervalStats],
    operators: &[String],
    slo_s: f64,
) -> Result<(), PlotError> {
    draw(path, rows, operators, slo_s).map_err(|message| PlotError::Draw {
        path: path.display().to_string(),
        message,
    })
}

type Panel<'a> = ChartContext<'a, BitMapBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One panel: caption, time axis `0..t_max` seconds, y axis `0..y_max`, mesh drawn.
fn panel<'a>(
    area: &DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>,
    caption: &str,
    t_max: f64,
    y_max: f64,
) -> Result<Panel<'a>, String> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)
        .map_err(|x| x.to_string())?;
    chart
        .configure_mesh()
        .x_desc("t (s)")
        .draw()
        .map_err(|x| x.to_string())?;
    Ok(chart)
}

/// Draws `points` as a labelled line of `color` and `width` pixels.
fn line(
    chart: &mut Panel<'_>,
    points: impl IntoIterator<Item = (f64, f64)>,
    color: RGBColor,
    width: u32,
    label: &str,
) -> Result<(), String> {
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(width)))
        .map_err(|x| x.to_string())?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    Ok(())
}

/// Draws the panel's legend.
fn legend(chart: &mut Panel<'_>) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| x.to_string())
}

fn draw(
    path: &Path,
    rows: &[IntervalStats],
    operators: &[String],
    slo_s: f64,
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let root = BitMapBackend::new(path, (1200, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let panels = root.split_evenly((3, 1));
    let t_max = rows.last().map_or(1.0, |r| r.t_s).max(1.0);

    // Panel 1: input rate vs capacity.
    let rate_max = max_of(
        rows.iter()
            .flat_map(|r| [r.input_rate, r.target_rate, r.capacity.unwrap_or(0.0)]),
    );
    // Keep capacity spikes (idle operators look infinitely fast) from flattening the rate.
    let input_max = max_of(rows.iter().flat_map(|r| [r.input_rate, r.target_rate]));
    let y1 = if input_max > 0.0 {
        rate_max.min(input_max * 3.0) * 1.1
    } else {
        rate_max.max(1.0) * 1.1
    }
    .max(1.0);
    let mut chart = panel(&panels[0], "input rate vs capacity (records/s)", t_max, y1)?;
    line(
        &mut chart,
        rows.iter().map(|r| (r.t_s, r.input_rate)),
        COLORS[0],
        2,
        "input",
    )?;
    line(
        &mut chart,
        rows.iter()
            .filter_map(|r| r.capacity.map(|c| (r.t_s, c.min(y1)))),
        COLORS[3],
        2,
        "capacity (bottleneck)",
    )?;
    legend(&mut chart)?;

    // Panel 2: parallelism per operator (steps).
    let p_max = rows
        .iter()
        .flat_map(|r| r.parallelism.values().copied())
        .max()
        .unwrap_or(1);
    let mut chart = panel(
        &panels[1],
        "parallelism per operator",
        t_max,
        f64::from(p_max) + 1.0,
    )?;
    for (i, op) in operators.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        // Offset lines slightly so operators at the same parallelism stay distinguishable.
        let offset = (i as f64 - operators.len() as f64 / 2.0) * 0.03;
        let mut points = Vec::new();
        let mut last: Option<f64> = None;
        for r in rows {
            if let Some(p) = r.parallelism.get(op) {
                let y = f64::from(*p) + offset;
                if let Some(prev) = last
                    && prev != y
                {
                    points.push((r.t_s, prev));
                }
                points.push((r.t_s, y));
                last = Some(y);
            }
        }
        line(&mut chart, points, color, 2, op)?;
    }
    legend(&mut chart)?;

    // Panel 3: latency at the SLO's percentile (p99 unless the job says otherwise) and the SLO.
    let percentile = rows.iter().find_map(|r| r.slo_percentile).unwrap_or(0.99);
    let label = crate::progress::percentile_label(percentile);
    let lat_max = max_of(rows.iter().filter_map(|r| r.slo_latency().1)).max(slo_s) * 1.2;
    let mut chart = panel(
        &panels[2],
        &format!("{label} end-to-end latency (s)"),
        t_max,
        lat_max.max(0.001),
    )?;
    line(
        &mut chart,
        rows.iter()
            .filter_map(|r| r.slo_latency().1.map(|p| (r.t_s, p))),
        COLORS[0],
        2,
        &label,
    )?;
    line(
        &mut chart,
        [(0.0, slo_s), (t_max, slo_s)],
        COLORS[3],
        1,
        "SLO",
    )?;
    legend(&mut chart)?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("timeline.png");
        let ops = vec!["source".to_string(), "enrich".to_string()];
        let rows: Vec<IntervalStats> = (1..=30)
            .map(|i| IntervalStats {
                t_s: f64::from(i),
                dt_s: 1.0,
                input_rate: 100.0 + f64::from(i),
                target_rate: 100.0,
                capacity: Some(150.0),
                parallelism: [
                    ("source".to_string(), 1),
                    ("enrich".to_string(), if i < 15 { 2 } else { 4 }),
                ]
                .into_iter()
                .collect(),
                p99_s: (i % 7 != 0).then_some(0.1 * f64::from(i % 5)),
                ..IntervalStats::default()
            })
            .collect();
        match plot_timeline(&path, &rows, &ops, 1.0) {
            Ok(()) => {
                let bytes = std::fs::read(&path).expect("png written");
                assert_eq!(&bytes[1..4], b"PNG");
            }
            // Machines without any font cannot render text; that is not this module's bug.
            Err(e) if e.to_string().to_lowercase().contains("font") => {}
            Err(e) => panic!("{e}"),
        }
    }
}
