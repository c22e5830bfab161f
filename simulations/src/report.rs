//! Outputs: `summary.json`, `timeseries.csv`, `comparison.png` (or `.svg`) and the terminal
//! table. Latencies count a window result from its window's end, as the engine and the
//! planner do (see [`crate::des`] and [`crate::fluid`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Serialize;

use streamscale_controller::plot::COLORS;

use crate::SimError;
use crate::model::JobModel;
use crate::runner::{PolicyRun, PolicySummary, Row};

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
    /// Metrics (decision) interval of `streamscale` and `ds2`, seconds; the fields below are
    /// named as in `streamscale run`'s `summary.json`.
    pub interval_s: f64,
    /// Metric window of `streamscale` and `ds2`, seconds.
    pub window_s: f64,
    /// `streamscale`: least metric history before a decision, seconds.
    pub guard_window_s: f64,
    /// `streamscale`: no decision this long after a (re)start, seconds.
    pub stabilization_s: f64,
    /// `streamscale`: a scale-down must be wanted this long, seconds.
    pub scale_down_delay_s: f64,
    /// `fast` or `event`.
    pub mode: String,
}

fn write(path: &Path, text: &str) -> Result<(), SimError> {
    std::fs::write(path, text).map_err(|e| SimError::Write {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Writes `summary.json`, `rescales.csv` (one row per rescale: `policy,t_s,from_<operator>...,to_<operator>...`) and `timeseries.csv` (columns `policy,t_s,input_rate,capacity,p99_s,
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
    write(&dir.join("timeseries.csv"), &csv)?;
    write(&dir.join("rescales.csv"), &rescales_csv(runs, model))
}

/// `rescales.csv`: one row per rescale of every policy, `policy,t_s,from_<operator>...,
/// to_<operator>...` (simulated seconds; parallelism before and after, per operator), so that
/// rescales too close together for `timeseries.csv`'s rows stay visible.
fn rescales_csv(runs: &[PolicyRun], model: &JobModel) -> String {
    let mut csv = String::from("policy,t_s");
    for side in ["from", "to"] {
        for op in &model.ops {
            let _ = write!(csv, ",{side}_{}", op.name);
        }
    }
    csv.push('\n');
    for run in runs {
        for r in &run.rescales {
            let _ = write!(csv, "{},{:.3}", run.name, r.at_s);
            for p in r.from.iter().chain(&r.to) {
                let _ = write!(csv, ",{p}");
            }
            csv.push('\n');
        }
    }
    csv
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

/// Width of the comparison figure, pixels.
pub const FIGURE_WIDTH: u32 = 1600;
/// Height of the comparison figure, pixels.
pub const FIGURE_HEIGHT: u32 = 1360;

/// Draws the comparison figure, one picture for every policy in `runs` (each policy one colour,
/// named in the key along the top; black is the input and the SLO):
/// * three full-width panels over the whole replay with the policies overlaid: input rate and
///   each policy's capacity (records/s; capacity above twice the peak input is drawn at that
///   bound and the title says so), subtasks summed over every operator, and the share of each
///   time-series row's time over the SLO at its percentile ([`JobModel::slo_quantile`]; the
///   summary's violation time, row by row);
/// * along the bottom, the summary as bars (resource-hours as a percentage above the oracle's,
///   share of time over the SLO, rescales; each bar's value just beyond its end, its policy's
///   name under it) and the
///   latency at the SLO's percentile zoomed in on the worst interval (each point the worst
///   step of its row; above 5× the SLO drawn at that bound, the axis says so; the SLO
///   dashed): the twentieth of
///   the replay around the largest latency of any policy (around the peak input when no
///   policy has any latency).
///
/// Time in minutes (replays under an hour) or hours. [`FIGURE_WIDTH`] × [`FIGURE_HEIGHT`]
/// pixels; PNG, or SVG when `path` ends in `.svg`.
///
/// # Errors
/// [`SimError::Write`] when the file or fonts cannot be used.
pub fn plot(path: &Path, runs: &[PolicyRun], model: &JobModel) -> Result<(), SimError> {
    let size = (FIGURE_WIDTH, FIGURE_HEIGHT);
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

/// A tick label with at most three decimals and no trailing zeros: 50 → "50", 0.25 → "0.25"
/// (not "50.0").
fn plain(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.to_string() }
}

/// A bar's label of a percentage difference: its sign always shown, more decimals the closer
/// it is to 0 ("+0.002%", "+0.31%", "-4.2%", "+35%"); under 0.0005 it is "0%".
fn signed_percent(v: f64) -> String {
    let a = v.abs();
    if a < 0.0005 {
        "0%".into()
    } else if a < 0.01 {
        format!("{v:+.3}%")
    } else if a < 1.0 {
        format!("{v:+.2}%")
    } else if a < 10.0 {
        format!("{v:+.1}%")
    } else {
        format!("{v:+.0}%")
    }
}

/// Font sizes: panel titles, axis titles, tick labels and legends.
const TITLE_FONT: u32 = 16;
const AXIS_FONT: u32 = 13;
const TICK_FONT: u32 = 11;

/// A panel's time axis: its range and its title (minutes or hours).
#[derive(Clone, Copy)]
struct TimeAxis {
    min: f64,
    max: f64,
    desc: &'static str,
}

/// A panel of `area` over time from `t.min` to `t.max` and `0..y_max`, titled `title`, its mesh
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
        .build_cartesian_2d(t.min..t.max, 0.0..y_max)
        .map_err(|x| e(&x))?;
    let compact_label = |v: &f64| compact(*v);
    let plain_label = |v: &f64| plain(*v);
    let mut mesh = ch.configure_mesh();
    mesh.x_desc(t.desc)
        .y_desc(y_desc)
        .axis_desc_style(("sans-serif", AXIS_FONT))
        .label_style(("sans-serif", TICK_FONT))
        .x_labels(5)
        .y_labels(6)
        .x_label_formatter(&plain_label);
    if compact_y {
        mesh.y_label_formatter(&compact_label);
    } else {
        mesh.y_label_formatter(&plain_label);
    }
    mesh.draw().map_err(|x| e(&x))?;
    Ok(ch)
}

/// Colour of the `k`-th policy.
fn color(k: usize) -> RGBColor {
    COLORS[k % COLORS.len()]
}

/// One line per policy of `runs` on `ch`: `value` of each time-series row against its time
/// in units of `unit_s` seconds, within `t`; the first policy (streamscale) drawn last, on top
/// of the others.
fn overlay<DB: DrawingBackend>(
    ch: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    runs: &[PolicyRun],
    t: TimeAxis,
    unit_s: f64,
    value: impl Fn(&Row) -> f64,
) -> Result<(), String> {
    for (k, run) in runs.iter().enumerate().rev() {
        ch.draw_series(LineSeries::new(
            run.rows
                .iter()
                .map(|r| (r.t_s / unit_s, value(r)))
                .filter(|(x, _)| *x >= t.min && *x <= t.max),
            color(k),
        ))
        .map_err(|x| x.to_string())?;
    }
    Ok(())
}

/// The key along the top of the figure: each policy's colour and name, left to right.
fn draw_key<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    runs: &[PolicyRun],
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let font = ("sans-serif", AXIS_FONT).into_font();
    let mut x = 70;
    let y = 18;
    area.draw(&Text::new(
        "policies:",
        (8, y - 7),
        font.clone().color(&BLACK),
    ))
    .map_err(|x| e(&x))?;
    for (k, run) in runs.iter().enumerate() {
        area.draw(&PathElement::new(
            vec![(x, y), (x + 24, y)],
            color(k).stroke_width(3),
        ))
        .map_err(|x| e(&x))?;
        area.draw(&Text::new(
            run.name.clone(),
            (x + 30, y - 7),
            font.clone().color(&BLACK),
        ))
        .map_err(|x| e(&x))?;
        x += 48 + 8 * run.name.chars().count() as i32;
    }
    Ok(())
}

/// Pixels between a bar's end and its value label.
const LABEL_GAP: i32 = 5;
/// Height under a bar panel for its policies' names, written upwards, pixels.
const NAME_AREA: u32 = 130;

/// A bar per policy (in its colour) of `values`, titled `title`, from a black baseline at 0:
/// upwards for positive values, downwards for negative ones. Each bar's value (`text`) is
/// centred [`LABEL_GAP`] pixels beyond its end, and the axis reaches 15 % of the values' span
/// past the longest bars either way to hold them; `tick` writes the axis's labels. Under the
/// panel each bar's policy (`names`, in the order of `values`) is written upwards, so that a
/// bar is read without the colour key.
fn draw_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    names: &[&str],
    values: &[f64],
    text: &dyn Fn(f64) -> String,
    tick: &dyn Fn(f64) -> String,
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let n = values.len().max(1) as f64;
    let finite = || values.iter().copied().filter(|v| v.is_finite());
    let hi = finite().fold(0.0_f64, f64::max);
    let lo = finite().fold(0.0_f64, f64::min);
    let (y_min, y_max) = if hi - lo > 0.0 {
        let room = 0.15 * (hi - lo);
        (
            if lo < 0.0 { lo - room } else { 0.0 },
            if hi > 0.0 { hi + room } else { room },
        )
    } else {
        (0.0, 1.0)
    };
    let mut ch = ChartBuilder::on(area)
        .caption(title, ("sans-serif", TITLE_FONT))
        .margin(8)
        .x_label_area_size(NAME_AREA)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..n, y_min..y_max)
        .map_err(|x| e(&x))?;
    let tick_label = |v: &f64| tick(*v);
    ch.configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .x_labels(0)
        .y_labels(5)
        .y_label_formatter(&tick_label)
        .label_style(("sans-serif", TICK_FONT))
        .draw()
        .map_err(|x| e(&x))?;
    ch.draw_series(std::iter::once(PathElement::new(
        vec![(0.0, 0.0), (n, 0.0)],
        BLACK,
    )))
    .map_err(|x| e(&x))?;
    let font = ("sans-serif", TICK_FONT).into_font().color(&BLACK);
    // The names hang from the bottom of the plotting area, read upwards.
    let upwards = ("sans-serif", TICK_FONT)
        .into_font()
        .transform(FontTransform::Rotate270)
        .color(&BLACK);
    let (base_x, base_y) = area.get_base_pixel();
    let (_, bottom) = ch.backend_coord(&(0.0, y_min));
    for (k, name) in names.iter().enumerate() {
        let (x, _) = ch.backend_coord(&(k as f64 + 0.5, y_min));
        area.draw(&Text::new(
            name.to_string(),
            (x - base_x, bottom - base_y + LABEL_GAP),
            upwards.clone().pos(Pos::new(HPos::Right, VPos::Center)),
        ))
        .map_err(|x| e(&x))?;
    }
    for (k, &v) in values.iter().enumerate() {
        let x0 = k as f64 + 0.15;
        let v = if v.is_finite() { v } else { 0.0 };
        ch.draw_series(std::iter::once(Rectangle::new(
            [(x0, 0.0), (x0 + 0.7, v)],
            color(k).filled(),
        )))
        .map_err(|x| e(&x))?;
        // Above a bar up, below a bar down, never touching it.
        let (dy, v_pos) = if v < 0.0 {
            (LABEL_GAP, VPos::Top)
        } else {
            (-LABEL_GAP, VPos::Bottom)
        };
        ch.draw_series(std::iter::once(
            EmptyElement::at((x0 + 0.35, v))
                + Text::new(
                    text(v),
                    (0, dy),
                    font.clone().pos(Pos::new(HPos::Center, v_pos)),
                ),
        ))
        .map_err(|x| e(&x))?;
    }
    Ok(())
}

/// The resource panel's bars: each policy's resource-hours as a percentage above the oracle's
/// (`resource_vs_oracle`; below it is negative), and the title naming the oracle's
/// resource-hours. The policies use nearly the same resources over a long replay, so bars of
/// resource-hours from 0 would all look alike; the differences are what compares them. When
/// the oracle used nothing (no input), the resource-hours themselves.
fn resource_bars(runs: &[PolicyRun]) -> (String, Vec<f64>, bool) {
    let oracle_hours = runs.iter().find_map(|r| {
        let s = &r.summary;
        (s.resource_vs_oracle > 0.0 && s.resource_hours > 0.0)
            .then(|| s.resource_hours / s.resource_vs_oracle)
    });
    match oracle_hours {
        Some(h) => (
            format!("resource-hours, % above the oracle ({})", compact(h)),
            runs.iter()
                .map(|r| 100.0 * (r.summary.resource_vs_oracle - 1.0))
                .collect(),
            true,
        ),
        None => (
            "resource-hours".to_string(),
            runs.iter().map(|r| r.summary.resource_hours).collect(),
            false,
        ),
    }
}

/// The time range (seconds) of the zoomed panel: a twentieth of the replay (at least 20 rows)
/// centred on the largest finite latency at the SLO's percentile of any policy, or on the
/// peak input when there is none.
fn worst_interval(runs: &[PolicyRun], t_end: f64) -> (f64, f64) {
    let mut worst: Option<(f64, f64)> = None;
    for r in runs.iter().flat_map(|r| &r.rows) {
        if r.slo_latency_s.is_finite() && worst.is_none_or(|(v, _)| r.slo_latency_s > v) {
            worst = Some((r.slo_latency_s, r.t_s));
        }
    }
    if worst.is_none_or(|(v, _)| v <= 0.0) {
        worst = None;
        for r in runs.iter().flat_map(|r| &r.rows) {
            if r.input_rate.is_finite() && worst.is_none_or(|(v, _)| r.input_rate > v) {
                worst = Some((r.input_rate, r.t_s));
            }
        }
    }
    let center = worst.map_or(t_end / 2.0, |(_, t)| t);
    let row_s = runs
        .first()
        .and_then(|r| r.rows.get(1).zip(r.rows.first()))
        .map_or(1.0, |(b, a)| (b.t_s - a.t_s).max(1e-9));
    let half = (t_end / 40.0).max(10.0 * row_s);
    let from = (center - half).max(0.0);
    let to = (from + 2.0 * half).min(t_end.max(from + 1e-9));
    (from, to)
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    runs: &[PolicyRun],
    model: &JobModel,
) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let (key, body) = root.split_vertically(36);
    draw_key(&key, runs)?;
    let panel_h = (FIGURE_HEIGHT - 36 - 440) / 3;
    let (top, rest) = body.split_vertically(panel_h);
    let (middle, rest) = rest.split_vertically(panel_h);
    let (over_slo, bottom) = rest.split_vertically(panel_h);
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
    let t = TimeAxis {
        min: 0.0,
        max: t_end / unit_s,
        desc: t_desc,
    };
    let finite_max =
        |v: &mut dyn Iterator<Item = f64>| v.filter(|x| x.is_finite()).fold(0.0_f64, f64::max);
    let rows = || runs.iter().flat_map(|r| r.rows.iter());
    let in_max = finite_max(&mut rows().map(|x| x.input_rate));
    let y_rate = (in_max * 2.0).max(1.0);
    let clipped = rows().any(|x| x.capacity > y_rate);
    let title = if clipped {
        "input rate (black) and capacity, records/s (capacity above twice the peak input drawn at it)"
    } else {
        "input rate (black) and capacity, records/s"
    };
    let mut ch = time_panel(&top, title, t, y_rate, "records/s", true)?;
    if let Some(first) = runs.first() {
        // Drawn segment by segment: a thick polyline's joins are mitred, and at a sharp spike
        // the miter reaches far past the data (below the axis, under a one-row dip).
        let points: Vec<(f64, f64)> = first
            .rows
            .iter()
            .map(|r| (r.t_s / unit_s, r.input_rate))
            .collect();
        ch.draw_series(
            points
                .windows(2)
                .map(|w| PathElement::new(vec![w[0], w[1]], BLACK.stroke_width(2))),
        )
        .map_err(|x| e(&x))?;
    }
    overlay(&mut ch, runs, t, unit_s, |r| r.capacity.min(y_rate))?;

    let total = |r: &Row| f64::from(r.parallelism.iter().sum::<u32>());
    let p_max = finite_max(&mut rows().map(total));
    let mut ch = time_panel(
        &middle,
        "subtasks, all operators summed",
        t,
        p_max + 1.0,
        "subtasks",
        true,
    )?;
    overlay(&mut ch, runs, t, unit_s, total)?;

    let slo = model.slo_s;
    let pct = model.slo_quantile.label();
    let lat_top = finite_max(&mut rows().map(|x| x.slo_latency_s));
    let lat_max = (slo * 5.0).min(lat_top.max(slo) * 1.2).max(1e-3);
    // Latencies above 5× the SLO are drawn at that bound, and the axis says so.
    let lat_desc = if lat_top > lat_max {
        "seconds (cut at 5× SLO)"
    } else {
        "seconds"
    };
    let latency_panel = |area: &DrawingArea<DB, plotters::coord::Shift>,
                         title: &str,
                         t: TimeAxis|
     -> Result<(), String> {
        let mut ch = time_panel(area, title, t, lat_max, lat_desc, false)?;
        overlay(&mut ch, runs, t, unit_s, |r| r.slo_latency_s.min(lat_max))?;
        ch.draw_series(DashedLineSeries::new(
            [(t.min, slo), (t.max, slo)],
            8,
            5,
            BLACK.stroke_width(2),
        ))
        .map_err(|x| e(&x))?;
        Ok(())
    };
    // Over the whole replay, how long each policy was over the SLO: a point's share of time
    // (its worst step's latency would draw a 10-second excursion like an hour-long one).
    let share_top = finite_max(&mut rows().map(|x| 100.0 * x.over_slo_share));
    let share_max = (share_top * 1.1).clamp(1.0, 100.0);
    let mut ch = time_panel(
        &over_slo,
        &format!(
            "time over the SLO ({} s on {pct}), % of the time per point",
            plain(slo)
        ),
        t,
        share_max,
        "% of the time",
        false,
    )?;
    overlay(&mut ch, runs, t, unit_s, |r| 100.0 * r.over_slo_share)?;

    let parts = bottom.split_evenly((1, 4));
    let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    let values = |f: &dyn Fn(&PolicySummary) -> f64| -> Vec<f64> {
        runs.iter().map(|r| f(&r.summary)).collect()
    };
    let (title, resources, relative) = resource_bars(runs);
    if relative {
        draw_bars(
            &parts[0],
            &title,
            &names,
            &resources,
            &signed_percent,
            &|v| format!("{}%", plain(v)),
        )?;
    } else {
        draw_bars(&parts[0], &title, &names, &resources, &compact, &compact)?;
    }
    draw_bars(
        &parts[1],
        &format!("time over the SLO (%, {pct})"),
        &names,
        &values(&|s| 100.0 * s.slo_violation_fraction),
        &|v| format!("{v:.2}"),
        &plain,
    )?;
    draw_bars(
        &parts[2],
        "rescales",
        &names,
        &values(&|s| s.rescales),
        &compact,
        &compact,
    )?;
    let (from, to) = worst_interval(runs, t_end);
    let zoom = TimeAxis {
        min: from / unit_s,
        max: to / unit_s,
        desc: t_desc,
    };
    latency_panel(&parts[3], &format!("{pct} latency, worst interval"), zoom)?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{compact, plain, signed_percent};

    #[test]
    fn plain_and_signed_labels() {
        assert_eq!(plain(50.0), "50");
        assert_eq!(plain(116.0), "116");
        assert_eq!(plain(0.25), "0.25");
        assert_eq!(plain(-0.0001), "0");
        assert_eq!(signed_percent(0.0), "0%");
        assert_eq!(signed_percent(-0.0002), "0%");
        assert_eq!(signed_percent(-0.002), "-0.002%");
        assert_eq!(signed_percent(0.317), "+0.32%");
        assert_eq!(signed_percent(2.34), "+2.3%");
        assert_eq!(signed_percent(16.4), "+16%");
    }

    #[test]
    fn compact_tick_labels() {
        assert_eq!(compact(0.0), "0");
        assert_eq!(compact(250.0), "250");
        assert_eq!(compact(1200.0), "1.2k");
        assert_eq!(compact(3_000_000.0), "3M");
        assert_eq!(compact(0.5), "0.5");
    }
}
