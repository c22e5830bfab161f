//! `timeline.png`: three stacked panels (input rate vs capacity; parallelism per operator;
//! latency at the SLO's percentile, p99 by default, with the SLO line), each with its key to
//! the right of the plot, off the data.

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

/// The largest finite value, 0 when there is none.
pub(crate) fn max_of(values: impl Iterator<Item = f64>) -> f64 {
    values.filter(|v| v.is_finite()).fold(0.0, f64::max)
}

/// Draws the timeline of `rows` (operators in `operators` order) with the SLO `slo_s` seconds
/// into the PNG file `path` (1390×1000 pixels: the plots, and their keys to the right).
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

pub(crate) type Panel<'a> =
    ChartContext<'a, BitMapBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// What a panel's y axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum YAxis {
    /// A measure: labels wherever the axis puts them.
    Real,
    /// A count (parallelism): labels on whole numbers only.
    Whole,
}

/// One panel: caption, time axis `0..t_max` seconds, y axis `0..y_max`, mesh drawn.
pub(crate) fn panel<'a>(
    area: &DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>,
    caption: &str,
    t_max: f64,
    y_max: f64,
    y_axis: YAxis,
) -> Result<Panel<'a>, String> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)
        .map_err(|x| x.to_string())?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc("t (s)")
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v));
    if y_axis == YAxis::Whole {
        // At most 11 labels; the axis picks whole steps (1, 2, 5, …) for a range from 0.
        mesh.y_labels((y_max.floor() as usize + 1).clamp(2, 11));
    }
    mesh.draw().map_err(|x| x.to_string())?;
    Ok(chart)
}

/// An axis label: a whole number without decimals (`2`, not `2.0`), otherwise at most three
/// decimals without trailing zeros (`0.25`).
fn tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Draws `points` as a line of `color` and `width` pixels and adds `label` to the panel's key.
pub(crate) fn line(
    chart: &mut Panel<'_>,
    key: &mut Vec<(String, RGBColor)>,
    points: impl IntoIterator<Item = (f64, f64)>,
    color: RGBColor,
    width: u32,
    label: &str,
) -> Result<(), String> {
    chart
        .draw_series(LineSeries::new(points, color.stroke_width(width)))
        .map_err(|x| x.to_string())?;
    key.push((label.to_string(), color));
    Ok(())
}

/// How far line `i` of `n` on a parallelism panel is moved up or down, so that lines at the
/// same parallelism stay distinguishable.
pub(crate) fn step_offset(i: usize, n: usize) -> f64 {
    (i as f64 - n as f64 / 2.0) * 0.03
}

/// A parallelism series `(t, p)` as a step line moved by `offset`: a change at `t` is drawn as a
/// vertical step there, not a slope from the previous point.
pub(crate) fn steps(points: impl IntoIterator<Item = (f64, f64)>, offset: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut last: Option<f64> = None;
    for (t, p) in points {
        let y = p + offset;
        if let Some(prev) = last
            && prev != y
        {
            out.push((t, prev));
        }
        out.push((t, y));
        last = Some(y);
    }
    out
}

/// Width of the key to the right of each panel, pixels.
pub(crate) const KEY_WIDTH: u32 = 190;

/// Draws a panel's key (a line of each colour and its label, top to bottom) into `area`, the
/// strip to the right of the panel's plot.
pub(crate) fn draw_key(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    key: &[(String, RGBColor)],
) -> Result<(), String> {
    let font = ("sans-serif", 15).into_font();
    for (i, (label, color)) in key.iter().enumerate() {
        let y = 50 + 22 * i as i32;
        area.draw(&PathElement::new(
            vec![(6, y), (30, y)],
            color.stroke_width(3),
        ))
        .map_err(|x| x.to_string())?;
        area.draw(&Text::new(label.clone(), (36, y - 8), font.clone()))
            .map_err(|x| x.to_string())?;
    }
    Ok(())
}

/// The rate panel's y axis: its top (records/s) and whether capacity goes above it. Capacity
/// can be far above the input (an idle operator looks infinitely fast), so the axis stops at
/// [`CAPACITY_SHOWN`] times the peak input (or target) rate and capacity above it is drawn at
/// the top, which the panel's title then says.
fn rate_axis(rows: &[IntervalStats]) -> (f64, bool) {
    let rate_max = max_of(
        rows.iter()
            .flat_map(|r| [r.input_rate, r.target_rate, r.capacity.unwrap_or(0.0)]),
    );
    let input_max = max_of(rows.iter().flat_map(|r| [r.input_rate, r.target_rate]));
    let top = if input_max > 0.0 {
        rate_max.min(input_max * CAPACITY_SHOWN) * 1.1
    } else {
        rate_max.max(1.0) * 1.1
    }
    .max(1.0);
    let clipped = rows
        .iter()
        .filter_map(|r| r.capacity)
        .any(|c| c.is_finite() && c > top);
    (top, clipped)
}

/// How far above the peak input rate the rate panel shows capacity.
const CAPACITY_SHOWN: f64 = 3.0;

fn draw(
    path: &Path,
    rows: &[IntervalStats],
    operators: &[String],
    slo_s: f64,
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let root = BitMapBackend::new(path, (1200 + KEY_WIDTH, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let panels: Vec<_> = root
        .split_evenly((3, 1))
        .into_iter()
        .map(|p| p.split_horizontally(1200))
        .collect();
    let t_max = rows.last().map_or(1.0, |r| r.t_s).max(1.0);

    // Panel 1: input rate vs capacity.
    let (y1, clipped) = rate_axis(rows);
    let title = if clipped {
        "input rate vs capacity (records/s; capacity above 3× the peak input drawn at the top)"
    } else {
        "input rate vs capacity (records/s)"
    };
    let mut chart = panel(&panels[0].0, title, t_max, y1, YAxis::Real)?;
    let mut key = Vec::new();
    line(
        &mut chart,
        &mut key,
        rows.iter().map(|r| (r.t_s, r.input_rate)),
        COLORS[0],
        2,
        "input",
    )?;
    line(
        &mut chart,
        &mut key,
        rows.iter()
            .filter_map(|r| r.capacity.map(|c| (r.t_s, c.min(y1)))),
        COLORS[3],
        2,
        "capacity (bottleneck)",
    )?;
    draw_key(&panels[0].1, &key)?;

    // Panel 2: parallelism per operator (steps).
    let p_max = rows
        .iter()
        .flat_map(|r| r.parallelism.values().copied())
        .max()
        .unwrap_or(1);
    let mut chart = panel(
        &panels[1].0,
        "parallelism per operator",
        t_max,
        f64::from(p_max) + 1.0,
        YAxis::Whole,
    )?;
    let mut key = Vec::new();
    for (i, op) in operators.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points = steps(
            rows.iter()
                .filter_map(|r| r.parallelism.get(op).map(|p| (r.t_s, f64::from(*p)))),
            step_offset(i, operators.len()),
        );
        line(&mut chart, &mut key, points, color, 2, op)?;
    }
    draw_key(&panels[1].1, &key)?;

    // Panel 3: latency at the SLO's percentile (p99 unless the job says otherwise) and the SLO.
    let percentile = rows.iter().find_map(|r| r.slo_percentile).unwrap_or(0.99);
    let label = crate::progress::percentile_label(percentile);
    let lat_max = max_of(rows.iter().filter_map(|r| r.slo_latency().1)).max(slo_s) * 1.2;
    let mut chart = panel(
        &panels[2].0,
        &format!("{label} end-to-end latency (s)"),
        t_max,
        lat_max.max(0.001),
        YAxis::Real,
    )?;
    let mut key = Vec::new();
    line(
        &mut chart,
        &mut key,
        rows.iter()
            .filter_map(|r| r.slo_latency().1.map(|p| (r.t_s, p))),
        COLORS[0],
        2,
        &label,
    )?;
    line(
        &mut chart,
        &mut key,
        [(0.0, slo_s), (t_max, slo_s)],
        COLORS[3],
        1,
        "SLO",
    )?;
    draw_key(&panels[2].1, &key)?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn axis_labels_print_whole_numbers_without_decimals() {
        assert_eq!(tick(2.0), "2");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(1500.0), "1500");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(0.1 + 0.2), "0.3");
        assert_eq!(tick(-0.5), "-0.5");
    }
    use super::*;

    #[test]
    fn capacity_far_above_the_input_is_drawn_at_the_top_and_said() {
        let row = |input: f64, capacity: f64| IntervalStats {
            input_rate: input,
            target_rate: input,
            capacity: Some(capacity),
            ..IntervalStats::default()
        };
        // A Nexmark run: 66k records/s in, 435k-722k capacity.
        let (top, clipped) = rate_axis(&[row(66_000.0, 435_000.0), row(60_000.0, 722_000.0)]);
        assert!(
            clipped && (top - 66_000.0 * 3.0 * 1.1).abs() < 1e-6,
            "{top}"
        );
        // Capacity within reach: the axis shows all of it.
        let (top, clipped) = rate_axis(&[row(100.0, 150.0), row(120.0, 180.0)]);
        assert!(!clipped && (top - 180.0 * 1.1).abs() < 1e-9, "{top}");
    }

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
