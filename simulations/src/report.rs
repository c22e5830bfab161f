//! Outputs: `summary.json`, `timeseries.csv`, `comparison.png` and the terminal table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

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
/// `dir`, creating it.
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
            csv.push('\n');
        }
    }
    write(&dir.join("timeseries.csv"), &csv)
}

/// The comparison table printed on the terminal.
pub fn table(summary: &Summary, order: &[String]) -> String {
    let mut s = format!(
        "{:<12} {:>14} {:>9} {:>10} {:>9} {:>12} {:>12} {:>10} {:>13}\n",
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
                "{:<12} {:>14.2} {:>9.3} {:>9.2}% {:>9.0} {:>12.0} {:>12.1} {:>10.1} {:>13.0}",
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

/// Draws `comparison.png`: one column per policy, rows: input rate vs capacity, parallelism per
/// operator, p99 latency with the SLO line. Time axis in hours.
///
/// # Errors
/// [`SimError::Write`] when the file or fonts cannot be used.
pub fn plot(path: &Path, runs: &[PolicyRun], model: &JobModel) -> Result<(), SimError> {
    draw(path, runs, model).map_err(|message| SimError::Write {
        path: path.display().to_string(),
        message,
    })
}

fn draw(path: &Path, runs: &[PolicyRun], model: &JobModel) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let cols = runs.len().max(1);
    let root = BitMapBackend::new(path, ((420 * cols) as u32, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let grid = root.split_evenly((3, cols));
    let t_max = runs
        .iter()
        .flat_map(|r| r.rows.last().map(|x| x.t_s))
        .fold(1.0_f64, f64::max)
        / 3600.0;
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
    let lat_max = (slo * 5.0).min(
        finite_max(&mut runs.iter().flat_map(|r| r.rows.iter().map(|x| x.p99_s))).max(slo) * 1.2,
    );
    for (c, run) in runs.iter().enumerate() {
        let mut ch = ChartBuilder::on(&grid[c])
            .caption(
                format!("{}: input vs capacity (rec/s)", run.name),
                ("sans-serif", 16),
            )
            .margin(6)
            .x_label_area_size(25)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..t_max, 0.0..y_rate)
            .map_err(|x| e(&x))?;
        ch.configure_mesh()
            .x_desc("t (h)")
            .draw()
            .map_err(|x| e(&x))?;
        ch.draw_series(LineSeries::new(
            run.rows.iter().map(|r| (r.t_s / 3600.0, r.input_rate)),
            COLORS[0],
        ))
        .map_err(|x| e(&x))?;
        ch.draw_series(LineSeries::new(
            run.rows
                .iter()
                .map(|r| (r.t_s / 3600.0, r.capacity.min(y_rate))),
            COLORS[3],
        ))
        .map_err(|x| e(&x))?;

        let mut ch = ChartBuilder::on(&grid[cols + c])
            .caption(format!("{}: parallelism", run.name), ("sans-serif", 16))
            .margin(6)
            .x_label_area_size(25)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..t_max, 0.0..f64::from(p_max + 1))
            .map_err(|x| e(&x))?;
        ch.configure_mesh()
            .x_desc("t (h)")
            .draw()
            .map_err(|x| e(&x))?;
        for (i, op) in model.ops.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            ch.draw_series(LineSeries::new(
                run.rows
                    .iter()
                    .map(|r| (r.t_s / 3600.0, f64::from(r.parallelism[i]))),
                color,
            ))
            .map_err(|x| e(&x))?
            .label(op.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
        }
        ch.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|x| e(&x))?;

        let mut ch = ChartBuilder::on(&grid[2 * cols + c])
            .caption(
                format!("{}: p99 latency (s) vs SLO", run.name),
                ("sans-serif", 16),
            )
            .margin(6)
            .x_label_area_size(25)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..t_max, 0.0..lat_max.max(1e-3))
            .map_err(|x| e(&x))?;
        ch.configure_mesh()
            .x_desc("t (h)")
            .draw()
            .map_err(|x| e(&x))?;
        ch.draw_series(LineSeries::new(
            run.rows
                .iter()
                .map(|r| (r.t_s / 3600.0, r.p99_s.min(lat_max))),
            COLORS[0],
        ))
        .map_err(|x| e(&x))?;
        ch.draw_series(LineSeries::new([(0.0, slo), (t_max, slo)], COLORS[3]))
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
