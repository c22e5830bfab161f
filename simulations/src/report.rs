//! Outputs: `summary.json`, `timeseries.csv`, `comparison.png` (or `.svg`) and the terminal
//! table. Latencies count a window result from its window's end, as the engine and the
//! planner do (see [`crate::des`] and [`crate::fluid`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::Serialize;

use streamscale_controller::plot::COLORS;

use crate::SimError;
use crate::model::JobModel;
use crate::runner::{PolicyRun, PolicySummary};

/// `summary.json`: `{"policies": {NAME: PolicySummary}}` plus the run's settings.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Per policy.
    pub policies: BTreeMap<String, PolicySummary>,
    /// Simulated seconds replayed.
    pub duration_s: f64,
    /// Step, seconds.
    pub step_s: f64,
    /// Latency SLO, seconds.
    pub slo_s: f64,
    /// Percentile the SLO is on (0.99 = p99; [`JobModel::slo_quantile`]): the latency that
    /// `slo_violation_fraction` grades.
    pub latency_percentile: f64,
    /// What the streamscale policies' planner does when the SLO is unattainable even at
    /// maximum parallelism (`utilizationOnly` or `bestEffort`: the job's
    /// `autoscaler.onUnattainableSlo`, or `--on-unattainable-slo` over it).
    pub on_unattainable_slo: streamscale_engine::spec::UnattainableSlo,
    /// `fast` or `event`.
    pub mode: String,
}

fn write(path: &Path, text: &str) -> Result<(), SimError> {
    std::fs::write(path, text).map_err(|e| SimError::Write {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Writes `summary.json` and `timeseries.csv` (columns `policy,t_s,input_rate,capacity,p99_s,
/// p99_engine_s,backlog,queued,p_<operator>...`; `p99_engine_s` empty unless computed) into
/// `dir`, creating it. Each row covers several steps: its latencies are the worst (largest)
/// step's of the row, its rates means over the row. When the SLO is on another percentile
/// than p99 ([`JobModel::slo_quantile`]), one last column holds the latency at it, named after
/// it as in `streamscale run`'s `timeline.csv`: `p95_s`, `p99.9_s`.
///
/// # Errors
/// [`SimError::Write`] naming the file.
pub fn write_files(
    dir: &Path,
    summary: &Summary,
    runs: &[PolicyRun],
    model: &JobModel,
) -> Result<(), SimError> {
    std::fs::create_dir_all(dir).map_err(|e| SimError::Write {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let json = serde_json::to_string_pretty(summary).map_err(|e| SimError::Write {
        path: "summary.json".into(),
        message: e.to_string(),
    })?;
    write(&dir.join("summary.json"), &json)?;
    let mut csv = String::from("policy,t_s,input_rate,capacity,p99_s,p99_engine_s,backlog,queued");
    for op in &model.ops {
        let _ = write!(csv, ",p_{}", op.name);
    }
    let q = &model.slo_quantile;
    if !q.is_p99() {
        let _ = write!(csv, ",{}_s", q.label());
    }
    csv.push('\n');
    for run in runs {
        for r in &run.rows {
            let _ = write!(
                csv,
                "{},{:.3},{:.4},{:.4},{:.6},{},{:.2},{:.2}",
                run.name,
                r.t_s,
                r.input_rate,
                r.capacity,
                r.p99_s,
                r.p99_engine_s.map_or(String::new(), |p| format!("{p:.6}")),
                r.backlog,
                r.queued
            );
            for p in &r.parallelism {
                let _ = write!(csv, ",{p}");
            }
            if !q.is_p99() {
                let _ = write!(csv, ",{:.6}", r.slo_latency_s);
            }
            csv.push('\n');
        }
    }
    write(&dir.join("timeseries.csv"), &csv)
}

/// The comparison table printed on the terminal.
///
/// The policy column is as wide as the longest policy name (`streamscale-forecast`), so the
/// other columns line up whatever policies are compared.
pub fn table(summary: &Summary, order: &[String]) -> String {
    let w = order
        .iter()
        .map(|n| n.chars().count())
        .chain(std::iter::once("policy".len()))
        .max()
        .unwrap_or(0);
    let mut s = format!(
        "{:<w$} {:>14} {:>9} {:>10} {:>9} {:>12} {:>12} {:>10} {:>13}\n",
        "policy",
        "resource-h",
        "vs oracle",
        "SLO viol.",
        "rescales",
        "max backlog",
        "mean backlog",
        "downtime s",
        "records late"
    );
    for name in order {
        if let Some(p) = summary.policies.get(name) {
            let _ = writeln!(
                s,
                "{:<w$} {:>14.2} {:>9.3} {:>9.2}% {:>9.0} {:>12.0} {:>12.1} {:>10.1} {:>13.0}",
                name,
                p.resource_hours,
                p.resource_vs_oracle,
                p.slo_violation_fraction * 100.0,
                p.rescales,
                p.max_backlog,
                p.mean_backlog,
                p.downtime_s,
                p.records_late
            );
        }
    }
    s
}

/// Width of one policy's column of panels, pixels.
pub const PANEL_WIDTH: u32 = 440;
/// Height of the three stacked panels together, pixels.
pub const PANELS_HEIGHT: u32 = 960;

/// Draws the comparison figure: one column of panels per policy, side by side (in `runs`
/// order), rows: input rate vs capacity, parallelism per operator, latency at the SLO's
/// percentile ([`JobModel::slo_quantile`]; each point the worst step of its time-series row)
/// with the SLO line; each panel has axis titles and a legend. Time axis in minutes (replays under an hour)
/// or hours; every column shares the
/// same axes so that the policies compare at a glance. Size: [`PANEL_WIDTH`] × number of
/// policies by [`PANELS_HEIGHT`] pixels. PNG, or SVG when `path` ends in `.svg`.
///
/// # Errors
/// [`SimError::Write`] when the file or fonts cannot be used.
pub fn plot(path: &Path, runs: &[PolicyRun], model: &JobModel) -> Result<(), SimError> {
    let cols = runs.len().max(1) as u32;
    let size = (PANEL_WIDTH * cols, PANELS_HEIGHT);
    let svg = path
        .extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("svg"));
    let drawn = if svg {
        draw(SVGBackend::new(path, size).into_drawing_area(), runs, model)
    } else {
        draw(
            BitMapBackend::new(path, size).into_drawing_area(),
            runs,
            model,
        )
    };
    drawn.map_err(|message| SimError::Write {
        path: path.display().to_string(),
        message,
    })
}

/// A tick label without crowding: 1200 → "1.2k", 3 000 000 → "3M".
fn compact(v: f64) -> String {
    let a = v.abs();
    let (x, unit) = if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{unit}")
}

/// Font sizes: panel titles, axis titles, tick labels and legends.
const TITLE_FONT: u32 = 16;
const AXIS_FONT: u32 = 13;
const TICK_FONT: u32 = 11;

/// The time axis shared by every panel: its end and its title (minutes or hours).
#[derive(Clone, Copy)]
struct TimeAxis {
    max: f64,
    desc: &'static str,
}

/// A panel of `area` over time from 0 to `t.max` and `0..y_max`, titled `title`, its mesh
/// drawn with `y_desc` as the y axis title (tick labels [`compact`] when `compact_y`).
fn time_panel<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    t: TimeAxis,
    y_max: f64,
    y_desc: &str,
    compact_y: bool,
) -> Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    // Room below the plot for the tick labels and, under them, the axis title; left of it for
    // the tick labels and the rotated axis title.
    let (x_area, y_area) = (44, 62);
    let mut ch = ChartBuilder::on(area)
        .caption(title, ("sans-serif", TITLE_FONT))
        .margin(8)
        .x_label_area_size(x_area)
        .y_label_area_size(y_area)
        .build_cartesian_2d(0.0..t.max, 0.0..y_max)
        .map_err(|x| e(&x))?;
    let compact_label = |v: &f64| compact(*v);
    let mut mesh = ch.configure_mesh();
    mesh.x_desc(t.desc)
        .y_desc(y_desc)
        .axis_desc_style(("sans-serif", AXIS_FONT))
        .label_style(("sans-serif", TICK_FONT))
        .x_labels(5)
        .y_labels(6);
    if compact_y {
        mesh.y_label_formatter(&compact_label);
    }
    mesh.draw().map_err(|x| e(&x))?;
    Ok(ch)
}

/// Draws the legend of `ch`'s labelled series in its upper right corner.
fn series_labels<'a, DB: DrawingBackend + 'a>(
    ch: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
) -> Result<(), String> {
    ch.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", TICK_FONT))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| x.to_string())
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    runs: &[PolicyRun],
    model: &JobModel,
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let cols = runs.len().max(1);
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let grid = root.split_evenly((3, cols));
    let t_end = runs
        .iter()
        .flat_map(|r| r.rows.last().map(|x| x.t_s))
        .fold(1.0_f64, f64::max);
    // Minutes for replays under an hour, else hours.
    let (unit_s, t_desc) = if t_end < 3600.0 {
        (60.0, "t (min)")
    } else {
        (3600.0, "t (h)")
    };
    let t_max = t_end / unit_s;
    let finite_max =
        |v: &mut dyn Iterator<Item = f64>| v.filter(|x| x.is_finite()).fold(0.0_f64, f64::max);
    let in_max = finite_max(
        &mut runs
            .iter()
            .flat_map(|r| r.rows.iter().map(|x| x.input_rate)),
    );
    let y_rate = (in_max * 2.0).max(1.0);
    let p_max = runs
        .iter()
        .flat_map(|r| r.rows.iter().flat_map(|x| x.parallelism.iter().copied()))
        .max()
        .unwrap_or(1);
    let slo = model.slo_s;
    let pct = model.slo_quantile.label();
    let lat_max = (slo * 5.0).min(
        finite_max(
            &mut runs
                .iter()
                .flat_map(|r| r.rows.iter().map(|x| x.slo_latency_s)),
        )
        .max(slo)
            * 1.2,
    );
    let t = TimeAxis {
        max: t_max,
        desc: t_desc,
    };
    let legend = |x: i32, y: i32, c: RGBColor| PathElement::new(vec![(x, y), (x + 15, y)], c);
    for (c, run) in runs.iter().enumerate() {
        let title = format!("{}: input vs capacity", run.name);
        let mut ch = time_panel(&grid[c], &title, t, y_rate, "records/s", true)?;
        ch.draw_series(LineSeries::new(
            run.rows.iter().map(|r| (r.t_s / unit_s, r.input_rate)),
            COLORS[0],
        ))
        .map_err(|x| e(&x))?
        .label("input rate")
        .legend(move |(x, y)| legend(x, y, COLORS[0]));
        ch.draw_series(LineSeries::new(
            run.rows
                .iter()
                .map(|r| (r.t_s / unit_s, r.capacity.min(y_rate))),
            COLORS[3],
        ))
        .map_err(|x| e(&x))?
        .label("capacity")
        .legend(move |(x, y)| legend(x, y, COLORS[3]));
        series_labels(&mut ch)?;

        let title = format!("{}: parallelism", run.name);
        let y_max = f64::from(p_max + 1);
        let mut ch = time_panel(&grid[cols + c], &title, t, y_max, "subtasks", true)?;
        for (i, op) in model.ops.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            ch.draw_series(LineSeries::new(
                run.rows
                    .iter()
                    .map(|r| (r.t_s / unit_s, f64::from(r.parallelism[i]))),
                color,
            ))
            .map_err(|x| e(&x))?
            .label(op.name.as_str())
            .legend(move |(x, y)| legend(x, y, color));
        }
        series_labels(&mut ch)?;

        let title = format!("{}: {pct} latency vs SLO", run.name);
        let y_max = lat_max.max(1e-3);
        let mut ch = time_panel(&grid[2 * cols + c], &title, t, y_max, "seconds", false)?;
        ch.draw_series(LineSeries::new(
            run.rows
                .iter()
                .map(|r| (r.t_s / unit_s, r.slo_latency_s.min(lat_max))),
            COLORS[0],
        ))
        .map_err(|x| e(&x))?
        .label(format!("{pct} latency (worst step per bin)"))
        .legend(move |(x, y)| legend(x, y, COLORS[0]));
        ch.draw_series(LineSeries::new([(0.0, slo), (t_max, slo)], COLORS[3]))
            .map_err(|x| e(&x))?
            .label("SLO")
            .legend(move |(x, y)| legend(x, y, COLORS[3]));
        series_labels(&mut ch)?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::compact;

    #[test]
    fn compact_tick_labels() {
        assert_eq!(compact(0.0), "0");
        assert_eq!(compact(250.0), "250");
        assert_eq!(compact(1200.0), "1.2k");
        assert_eq!(compact(3_000_000.0), "3M");
        assert_eq!(compact(0.5), "0.5");
    }
}
