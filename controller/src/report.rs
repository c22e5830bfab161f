//! The run report: `summary.json` and `timeline.csv` (and, via [`crate::plot`], `timeline.png`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::stats::IntervalStats;

/// Errors writing the report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A report file could not be written.
    #[error("{path}: cannot write report: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The summary could not be serialized.
    #[error("cannot serialize the summary: {0}")]
    Json(#[from] serde_json::Error),
}

/// One executed rescale.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RescaleRecord {
    /// When the rescale was decided, seconds since the run started.
    pub at_s: f64,
    /// Parallelism per operator before.
    pub from: BTreeMap<String, u32>,
    /// Parallelism per operator after (for a failed attempt: the parallelism that was tried).
    pub to: BTreeMap<String, u32>,
    /// Why the planner decided it.
    pub reason: String,
    /// Seconds from the savepoint request until the new engine was running.
    pub downtime_s: f64,
    /// `rescaled`, `savepoint_failed`, `restore_failed`, `unrecoverable`, or `recommended`
    /// (decided but not applied: `--no-autoscale`).
    pub outcome: String,
    /// What went wrong, for failed attempts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The savepoint taken, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub savepoint: Option<String>,
}

/// Time integrals over the intervals of a run.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Accounting {
    /// Seconds covered by intervals.
    pub seconds: f64,
    /// ∫ total parallelism dt, in subtask-seconds.
    pub parallelism_seconds: f64,
    /// Seconds of intervals whose latency at the SLO's percentile (p99 by default) exceeded
    /// the SLO.
    pub slo_violation_seconds: f64,
    /// Seconds of intervals in which no record reached a sink.
    pub no_output_seconds: f64,
}

impl Accounting {
    /// Adds one interval of `dt_s` seconds at `total_parallelism` subtasks with interval p99
    /// `p99_s` (seconds; `None` when no record reached a sink) against an SLO of `slo_s` seconds.
    pub fn add(&mut self, dt_s: f64, total_parallelism: u32, p99_s: Option<f64>, slo_s: f64) {
        if !(dt_s > 0.0 && dt_s.is_finite()) {
            return;
        }
        self.add_cost(dt_s, total_parallelism);
        match p99_s {
            Some(p) if p > slo_s => self.slo_violation_seconds += dt_s,
            Some(_) => {}
            None => self.no_output_seconds += dt_s,
        }
    }

    /// Adds `dt_s` seconds at `total_parallelism` subtasks to the cost alone ([`Self::seconds`]
    /// and [`Self::parallelism_seconds`]): time in which no latency was measured, such as the
    /// final draining stop.
    pub fn add_cost(&mut self, dt_s: f64, total_parallelism: u32) {
        if dt_s > 0.0 && dt_s.is_finite() {
            self.seconds += dt_s;
            self.parallelism_seconds += dt_s * f64::from(total_parallelism);
        }
    }

    /// Adds an [`IntervalStats`].
    pub fn add_interval(&mut self, stats: &IntervalStats, slo_s: f64) {
        let total = stats.parallelism.values().sum();
        self.add(stats.dt_s, total, stats.slo_latency().1, slo_s);
    }

    /// Mean total parallelism over the covered time (0 when nothing was covered).
    pub fn mean_parallelism(&self) -> f64 {
        if self.seconds > 0.0 {
            self.parallelism_seconds / self.seconds
        } else {
            0.0
        }
    }
}

/// Record totals of a run, from the engine's `/v1/job` after the final draining stop
/// (the engine's record balance, `streamscale_engine::server::RecordBalance`: exact for any
/// job graph, with fan-out counted once per path to a sink).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct RecordTotals {
    /// Record deliveries owed to the sinks: source records and records derived by
    /// aggregations (windows, joins), each times its number of paths to a sink.
    pub records_emitted: u64,
    /// Source records whose effect reached a sink, over every sink.
    pub records_accounted: u64,
    /// Records removed on purpose (filter, select) or consumed by aggregations, times the
    /// operator's number of paths to a sink.
    pub records_filtered: u64,
}

impl RecordTotals {
    /// Records neither accounted at a sink nor dropped by a filter (negative: counted twice).
    pub fn lost(&self) -> i128 {
        i128::from(self.records_emitted)
            - i128::from(self.records_accounted)
            - i128::from(self.records_filtered)
    }
}

/// A restart of a run's engine after it died (a crash, SIGKILL): `streamscale run`
/// supervises its engine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RestartRecord {
    /// When the engine's death was noticed (seconds since the run started).
    pub at_s: f64,
    /// How the engine ended (its exit status and last error line).
    pub reason: String,
    /// The completed checkpoint or savepoint the new engine was restored from; `None`: from
    /// the beginning (nothing completed yet).
    pub restored_from: Option<String>,
    /// Seconds from noticing the death to the new engine's job running (the restart delay
    /// included).
    pub recovery_s: f64,
}

/// `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Job name.
    pub job: String,
    /// The effective job file the engine ran.
    pub job_file: String,
    /// Wall-clock seconds the run lasted (first engine running to final savepoint).
    pub duration_s: f64,
    /// Scrape interval, seconds (`--interval`).
    pub interval_s: f64,
    /// Sliding metric window given to the planner, seconds (`--window`).
    pub window_s: f64,
    /// Least metric history before a decision, seconds (three intervals, at most the window).
    pub guard_window_s: f64,
    /// No decision this long after a (re)start, seconds (`--stabilization`).
    pub stabilization_s: f64,
    /// A scale-down must be wanted this long before it happens, seconds
    /// (`--scale-down-delay`).
    pub scale_down_delay_s: f64,
    /// Latency SLO, seconds.
    pub slo_s: f64,
    /// The percentile of end-to-end latency the SLO is on (0.99 = p99).
    pub latency_percentile: f64,
    /// Records emitted by all sources (`null` when the final totals could not be read).
    pub records_emitted: Option<u64>,
    /// Source records whose effect reached a sink.
    pub records_accounted: Option<u64>,
    /// Source records dropped by filters.
    pub records_filtered: Option<u64>,
    /// `records_emitted - records_accounted - records_filtered`.
    pub records_lost: Option<i128>,
    /// Source records dropped by load shedding (`autoscaler.limits.onLimit: shed`), summed
    /// over every engine of the run; never emitted, so not part of `records_emitted`.
    #[serde(default)]
    pub records_shed: u64,
    /// ∫ total parallelism dt, subtask-seconds, over the whole run: every metric interval (the
    /// last, partial one included) and the final draining stop.
    pub parallelism_seconds: f64,
    /// Mean total parallelism over the same time.
    pub mean_parallelism: f64,
    /// Seconds with the interval's latency at [`Self::latency_percentile`] above the SLO.
    pub slo_violation_seconds: f64,
    /// Seconds in which no record reached a sink.
    pub no_output_seconds: f64,
    /// Records due at the sources (by their rate or trace) but not emitted when the run
    /// stopped: the sources' backlog in the last metric interval. A trace whose window is over
    /// gets up to 120 s to drain it; a constant or stepped rate has no end, so a run cut at
    /// `--duration` while behind leaves it here (never emitted, so not part of
    /// `records_emitted`).
    #[serde(default)]
    pub source_backlog_at_end: f64,
    /// Parallelism at the start.
    pub initial_parallelism: BTreeMap<String, u32>,
    /// Parallelism at the end.
    pub final_parallelism: BTreeMap<String, u32>,
    /// Completed rescales.
    pub rescales: Vec<RescaleRecord>,
    /// Failed rescale attempts (the job continued at the old parallelism).
    pub failed_rescales: Vec<RescaleRecord>,
    /// With `--no-autoscale`: the rescales the planner decided but the run did not apply
    /// (outcome `recommended`, downtime 0), one per change of the recommended parallelism.
    #[serde(default)]
    pub recommendations: Vec<RescaleRecord>,
    /// Total rescale downtime, seconds.
    pub downtime_s: f64,
    /// Restarts after the engine died, in order.
    pub restarts: Vec<RestartRecord>,
    /// Total seconds of recovery over [`Summary::restarts`].
    pub recovery_s: f64,
    /// The final (drained) savepoint.
    pub final_savepoint: Option<String>,
    /// Why the run failed, if it did.
    pub failure: Option<String>,
    /// Whether the run was cut short by SIGINT, SIGTERM or SIGHUP (it then still stops with a
    /// draining savepoint, so the totals cover what ran).
    pub interrupted: bool,
}

impl Summary {
    /// Whether the run succeeded: no failure and no lost records.
    pub fn ok(&self) -> bool {
        self.failure.is_none() && self.records_lost.is_none_or(|l| l == 0)
    }
}

/// Writes `contents` to `path` whole or not at all: into a hidden temporary file beside it,
/// then renamed over it (a full disk leaves no truncated report file, and an earlier file
/// stays until the new one is complete).
fn write_file(path: &Path, contents: &[u8]) -> Result<(), ReportError> {
    replace_file(path, |tmp| std::fs::write(tmp, contents))
}

/// Creates `path` by `write` into a hidden temporary file beside it (`.tmp-PID.NAME`: the same
/// extension, for writers that choose the format by it), then
/// renames that over `path`; the temporary file is removed when either step fails.
///
/// # Errors
/// [`ReportError::Write`] naming `path` with the error of the write or the rename.
pub fn replace_file(
    path: &Path,
    write: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<(), ReportError> {
    let name = path
        .file_name()
        .map_or_else(|| "report".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".tmp-{}.{name}", std::process::id()));
    let result = write(&tmp).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `summary.json` (pretty-printed) into `dir`.
///
/// # Errors
/// [`ReportError`] when the file cannot be written.
pub fn write_summary(dir: &Path, summary: &Summary) -> Result<PathBuf, ReportError> {
    let path = dir.join("summary.json");
    let mut value = serde_json::to_value(summary)?;
    tidy_numbers(&mut value);
    let mut text = serde_json::to_string_pretty(&value)?;
    text.push('\n');
    write_file(&path, text.as_bytes())?;
    Ok(path)
}

/// Rounds every fractional number in `value` to 12 significant digits and turns `-0.0` into
/// `0.0`, so that sums of floats read as a person would write them (`5.0`, not
/// `4.999999999999999`); integers are left as they are.
fn tidy_numbers(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Number(n) if n.is_f64() => {
            if let Some(x) = n.as_f64() {
                let tidy = format!("{x:.11e}").parse::<f64>().unwrap_or(x) + 0.0;
                if let Some(t) = serde_json::Number::from_f64(tidy) {
                    *n = t;
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(tidy_numbers),
        serde_json::Value::Object(map) => map.values_mut().for_each(tidy_numbers),
        _ => {}
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |x| format!("{x:.6}"))
}

/// Renders the timeline CSV: `t_s,trace_time_s,input_rate,target_rate,capacity,p_<op>...,
/// rho_<op>...,p99_s,backlog`; empty cells for unknown values. When the SLO is on another
/// percentile than p99 (`latencyPercentile`), one more column holds the interval's latency at
/// it, in seconds, named after it: `p95_s`, `p99.9_s`.
pub fn timeline_csv(rows: &[IntervalStats], operators: &[String]) -> String {
    let mut out = String::from("t_s,trace_time_s,input_rate,target_rate,capacity");
    for op in operators {
        let _ = write!(out, ",p_{op}");
    }
    for op in operators {
        let _ = write!(out, ",rho_{op}");
    }
    out.push_str(",p99_s,backlog");
    let slo_percentile = rows
        .iter()
        .find_map(|r| r.slo_percentile)
        .filter(|q| (q - 0.99).abs() > 1e-12);
    if let Some(q) = slo_percentile {
        let _ = write!(out, ",{}_s", crate::progress::percentile_label(q));
    }
    out.push('\n');
    for r in rows {
        let _ = write!(
            out,
            "{:.3},{},{:.3},{:.3},{}",
            r.t_s,
            opt(r.trace_time_s),
            r.input_rate,
            r.target_rate,
            opt(r.capacity)
        );
        for op in operators {
            match r.parallelism.get(op) {
                Some(p) => {
                    let _ = write!(out, ",{p}");
                }
                None => out.push(','),
            }
        }
        for op in operators {
            let _ = write!(out, ",{}", opt(r.utilization.get(op).copied()));
        }
        // An unknown backlog (NaN) is an empty cell, as other unknown figures are.
        let _ = write!(out, ",{},", opt(r.p99_s));
        if !r.backlog.is_nan() {
            let _ = write!(out, "{:.0}", r.backlog);
        }
        if slo_percentile.is_some() {
            let _ = write!(out, ",{}", opt(r.slo_latency_s));
        }
        out.push('\n');
    }
    out
}

/// Writes `timeline.csv` into `dir`.
///
/// # Errors
/// [`ReportError`] when the file cannot be written.
pub fn write_timeline(
    dir: &Path,
    rows: &[IntervalStats],
    operators: &[String],
) -> Result<PathBuf, ReportError> {
    let path = dir.join("timeline.csv");
    write_file(&path, timeline_csv(rows, operators).as_bytes())?;
    Ok(path)
}

/// Renders the measured true processing rates per interval in the simulator's
/// `--service-rates` format (`streamscale-sim`, `simulations/src/rates.rs`): a header
/// `t_s,<op>...` naming the operators that were measured at least once (in `operators` order),
/// then one row per interval: its start (seconds since the run started) and each operator's μ
/// over the interval (records per busy second per subtask, [`IntervalStats::service_rate`]),
/// empty where it was not measured (the simulator then holds the previous value).
pub fn service_rates_csv(rows: &[IntervalStats], operators: &[String]) -> String {
    let ops: Vec<&String> = operators
        .iter()
        .filter(|op| rows.iter().any(|r| r.service_rate.contains_key(*op)))
        .collect();
    let mut out = String::from("t_s");
    for op in &ops {
        let _ = write!(out, ",{op}");
    }
    out.push('\n');
    for r in rows {
        let _ = write!(out, "{:.3}", (r.t_s - r.dt_s).max(0.0));
        for op in &ops {
            let _ = write!(out, ",{}", opt(r.service_rate.get(*op).copied()));
        }
        out.push('\n');
    }
    out
}

/// Writes `service_rates.csv` ([`service_rates_csv`]) into `dir`.
///
/// # Errors
/// [`ReportError`] when the file cannot be written.
pub fn write_service_rates(
    dir: &Path,
    rows: &[IntervalStats],
    operators: &[String],
) -> Result<PathBuf, ReportError> {
    let path = dir.join("service_rates.csv");
    write_file(&path, service_rates_csv(rows, operators).as_bytes())?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_file_is_replaced_whole_or_not_at_all() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("summary.json");
        write_file(&path, b"{\"first\": 1}\n").expect("write");
        // A writer that fails halfway (a full disk): the earlier file stays as it was and no
        // temporary file is left behind.
        let err = replace_file(&path, |tmp| {
            std::fs::write(tmp, b"{\"sec")?;
            Err(std::io::Error::other("No space left on device"))
        })
        .expect_err("the write failed");
        assert!(
            err.to_string()
                .contains("summary.json: cannot write report: No space left"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "{\"first\": 1}\n"
        );
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["summary.json"]);
        // The temporary file keeps the extension (the chart's writer picks PNG by it).
        replace_file(&path, |tmp| {
            assert_eq!(tmp.extension().and_then(|e| e.to_str()), Some("json"));
            std::fs::write(tmp, b"{}")
        })
        .expect("replace");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "{}");
    }

    #[test]
    fn accounting_integrates_parallelism_and_violations() {
        let mut a = Accounting::default();
        a.add(1.0, 5, Some(0.2), 1.0);
        a.add(2.0, 8, Some(1.5), 1.0);
        a.add(0.5, 8, None, 1.0);
        a.add(0.0, 100, Some(9.0), 1.0);
        a.add(f64::NAN, 100, Some(9.0), 1.0);
        assert_eq!(a.seconds, 3.5);
        assert_eq!(a.parallelism_seconds, 5.0 + 16.0 + 4.0);
        assert_eq!(a.slo_violation_seconds, 2.0);
        assert_eq!(a.no_output_seconds, 0.5);
        assert!((a.mean_parallelism() - 25.0 / 3.5).abs() < 1e-12);
    }

    #[test]
    fn cost_alone_adds_time_and_subtask_seconds_but_no_latency_verdict() {
        let mut a = Accounting::default();
        a.add(2.0, 3, Some(0.2), 1.0);
        a.add_cost(0.5, 3);
        a.add_cost(-1.0, 3);
        a.add_cost(f64::NAN, 3);
        assert_eq!(a.seconds, 2.5);
        assert_eq!(a.parallelism_seconds, 7.5);
        assert_eq!((a.slo_violation_seconds, a.no_output_seconds), (0.0, 0.0));
        assert_eq!(a.mean_parallelism(), 3.0);
    }

    #[test]
    fn lost_records_count_filtered_ones_as_accounted_for() {
        let t = RecordTotals {
            records_emitted: 100,
            records_accounted: 90,
            records_filtered: 10,
        };
        assert_eq!(t.lost(), 0);
        let t = RecordTotals {
            records_emitted: 100,
            records_accounted: 95,
            records_filtered: 0,
        };
        assert_eq!(t.lost(), 5);
    }

    fn summary() -> Summary {
        Summary {
            job: "tweets".into(),
            job_file: "report/job.yaml".into(),
            duration_s: 60.0,
            interval_s: 1.0,
            window_s: 10.0,
            guard_window_s: 3.0,
            stabilization_s: 3.0,
            scale_down_delay_s: 15.0,
            slo_s: 1.0,
            latency_percentile: 0.99,
            records_emitted: Some(10),
            records_accounted: Some(10),
            records_filtered: Some(0),
            records_lost: Some(0),
            records_shed: 0,
            parallelism_seconds: 300.0,
            mean_parallelism: 5.0,
            slo_violation_seconds: 2.0,
            no_output_seconds: 0.0,
            source_backlog_at_end: 0.0,
            initial_parallelism: BTreeMap::new(),
            final_parallelism: BTreeMap::new(),
            rescales: vec![RescaleRecord {
                at_s: 30.0,
                from: [("enrich".to_string(), 2)].into_iter().collect(),
                to: [("enrich".to_string(), 4)].into_iter().collect(),
                reason: "enrich ρ 0.92 > 0.70".into(),
                downtime_s: 1.5,
                outcome: "rescaled".into(),
                error: None,
                savepoint: Some("/tmp/sp".into()),
            }],
            failed_rescales: vec![],
            recommendations: vec![],
            downtime_s: 1.5,
            restarts: Vec::new(),
            recovery_s: 0.0,
            final_savepoint: None,
            failure: None,
            interrupted: false,
        }
    }

    #[test]
    fn summary_json_has_the_documented_fields() {
        let s = summary();
        assert!(s.ok());
        let v = serde_json::to_value(&s).expect("serializes");
        for key in [
            "duration_s",
            "interval_s",
            "window_s",
            "guard_window_s",
            "stabilization_s",
            "scale_down_delay_s",
            "records_emitted",
            "records_accounted",
            "parallelism_seconds",
            "slo_violation_seconds",
            "rescales",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        let r = &v["rescales"][0];
        assert_eq!(r["from"]["enrich"], 2);
        assert_eq!(r["to"]["enrich"], 4);
        assert_eq!(r["downtime_s"], 1.5);
        assert!(r.get("error").is_none());
        let mut lost = summary();
        lost.records_lost = Some(3);
        assert!(!lost.ok());
    }

    #[test]
    fn summary_json_reads_sums_of_floats_as_a_person_writes_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = summary();
        s.duration_s = 4.999_999_999_999_999;
        s.slo_violation_seconds = -0.0;
        s.parallelism_seconds = 1643.25;
        let path = write_summary(dir.path(), &s).expect("written");
        let text = std::fs::read_to_string(path).expect("read");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["duration_s"], 5.0, "{text}");
        assert_eq!(v["parallelism_seconds"], 1643.25);
        assert!(!text.contains("-0.0"), "{text}");
        assert!(text.contains("\"slo_violation_seconds\": 0.0"), "{text}");
        assert_eq!(v["records_emitted"], s.records_emitted.expect("some"));
    }

    #[test]
    fn slo_violations_are_graded_at_the_slo_percentile() {
        let p95_slo = |p99_s, p95_s| IntervalStats {
            dt_s: 2.0,
            p99_s: Some(p99_s),
            slo_percentile: Some(0.95),
            slo_latency_s: Some(p95_s),
            ..IntervalStats::default()
        };
        let mut a = Accounting::default();
        // p99 over a 1 s SLO but p95 under it: not a violation of a p95 SLO.
        a.add_interval(&p95_slo(1.5, 0.5), 1.0);
        assert_eq!(a.slo_violation_seconds, 0.0);
        a.add_interval(&p95_slo(1.5, 1.1), 1.0);
        assert_eq!(a.slo_violation_seconds, 2.0);
        // Without a percentile of its own the SLO is on p99.
        let p99_slo = IntervalStats {
            dt_s: 1.0,
            p99_s: Some(1.5),
            ..IntervalStats::default()
        };
        a.add_interval(&p99_slo, 1.0);
        assert_eq!(a.slo_violation_seconds, 3.0);
    }

    #[test]
    fn timeline_csv_has_a_column_per_operator() {
        let ops = vec!["source".to_string(), "enrich".to_string()];
        let row = IntervalStats {
            t_s: 1.0,
            dt_s: 1.0,
            trace_time_s: Some(300.0),
            input_rate: 10.0,
            target_rate: 10.0,
            capacity: Some(50.0),
            parallelism: [("source".to_string(), 1), ("enrich".to_string(), 3)]
                .into_iter()
                .collect(),
            utilization: [("enrich".to_string(), 0.5)].into_iter().collect(),
            busiest_utilization: BTreeMap::new(),
            backlog: 4.0,
            p99_s: None,
            slo_percentile: None,
            slo_latency_s: None,
            service_rate: [("enrich".to_string(), 190.5)].into_iter().collect(),
        };
        let csv = timeline_csv(std::slice::from_ref(&row), &ops);
        let mut lines = csv.lines();
        assert_eq!(
            lines.next(),
            Some(
                "t_s,trace_time_s,input_rate,target_rate,capacity,p_source,p_enrich,rho_source,rho_enrich,p99_s,backlog"
            )
        );
        assert_eq!(
            lines.next(),
            Some("1.000,300.000000,10.000,10.000,50.000000,1,3,,0.500000,,4")
        );
        // The measured μ of the interval starting at t_s − dt_s, only for measured operators.
        let rates = service_rates_csv(std::slice::from_ref(&row), &ops);
        assert_eq!(rates, "t_s,enrich\n0.000,190.500000\n");

        // An SLO on p95 adds the p95 column after the fixed ones.
        let p95 = IntervalStats {
            p99_s: Some(2.0),
            slo_percentile: Some(0.95),
            slo_latency_s: Some(0.75),
            ..row
        };
        let csv = timeline_csv(&[p95], &ops);
        let mut lines = csv.lines();
        assert!(
            lines
                .next()
                .is_some_and(|h| h.ends_with(",p99_s,backlog,p95_s"))
        );
        assert!(
            lines
                .next()
                .is_some_and(|l| l.ends_with(",2.000000,4,0.750000"))
        );
    }
}
