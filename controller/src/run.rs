//! `streamscale run`: the local autoscaling loop.
//!
//! Prepares an effective job file (trace overrides applied), starts the engine locally (from
//! a staging directory beside the report directory, whose files move into the report only
//! once the engine runs, so a run that cannot start leaves an earlier report as it was),
//! scrapes it every interval, asks the guarded autoscaler for a verdict,
//! rescales by stop-with-savepoint and restore, and finally stops with a draining savepoint and
//! writes the report.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use streamscale_engine::spec::{GapPolicy, JobSpec, OperatorKind, RateSpec, SpecError, TraceRate};
use streamscale_engine::trace::RateFunction;
use tokio::time::{Instant, MissedTickBehavior};

use crate::executor::{Executor, ExecutorError, RescaleBackoff, RescaleOutcome};
use crate::learned_file::{
    HISTORY_FILE, LEARNED_FILE, claim_job_file, load_history, load_learned, save_history,
    save_learned,
};
use crate::model::{Autoscaler, GuardSettings, MetricSample, Verdict};
use crate::plot::plot_timeline;
use crate::progress;
use crate::report::{self, Accounting, RecordTotals, ReportError, RescaleRecord, Summary};
use crate::runtime::{EngineHandle, EngineRuntime, LocalRuntime, RuntimeError};
use crate::savepoint_history;
use crate::scrape::{EngineMetrics, scrape_stamped};
use crate::stats::{CapacityEstimator, IntervalStats};

/// Job file used when none is given, relative to the current directory or the workspace root.
pub const DEFAULT_JOB: &str = "examples/jobs/tweets.yaml";
/// Run length when the source does not follow a trace with an end, seconds.
pub const DEFAULT_DURATION_S: f64 = 300.0;
/// Consecutive failed scrapes after which a live engine is declared failed.
pub const MAX_SCRAPE_FAILURES: u32 = 10;

/// Longest wait after the run's duration for the sources' backlog to drain.
pub const DRAIN_GRACE: Duration = Duration::from_secs(120);

/// Options of `streamscale run`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOptions {
    /// Job file (relative paths: current directory first, then the workspace root).
    pub job: PathBuf,
    /// Trace file replacing the first source's rate trace.
    pub trace: Option<PathBuf>,
    /// Trace-seconds per wall-clock second for the first source's trace.
    pub speedup: Option<f64>,
    /// Factor on the trace's rates.
    pub scale: Option<f64>,
    /// Run length, seconds (default: the trace window / speedup, else 300 s).
    pub duration_s: Option<f64>,
    /// Report directory.
    pub report_dir: PathBuf,
    /// Scrape interval, seconds.
    pub interval_s: f64,
    /// Latency SLO override, seconds (default: `autoscaler.latencySloSeconds`).
    pub slo_s: Option<f64>,
    /// Length of the sliding metric window given to the planner, seconds.
    pub window_s: f64,
    /// Engine binary (default: [`crate::runtime::local::locate_engine_binary`]).
    pub engine_bin: Option<PathBuf>,
    /// No decision within this many seconds after a (re)start, seconds.
    pub stabilization_s: f64,
    /// A scale-down must be wanted this long before it happens, seconds.
    pub scale_down_delay_s: f64,
    /// Whether to apply decisions (`false`: run at the job's parallelism, like mode `off`).
    pub autoscale: bool,
    /// Percentile of end-to-end latency the SLO is on, in (0, 1) (default 0.99, p99); see
    /// [`crate::model::PlannerSettings::latency_percentile`].
    pub latency_percentile: Option<f64>,
    /// Completed savepoints of the job kept in `REPORT/savepoints` (at least 1; default
    /// [`savepoint_history::DEFAULT_KEEP_SAVEPOINTS`]): older ones of the same job are removed
    /// after each rescale and at the end of the run, never the one the job runs from.
    pub keep_savepoints: u32,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            job: PathBuf::from(DEFAULT_JOB),
            trace: None,
            speedup: None,
            scale: None,
            duration_s: None,
            report_dir: PathBuf::from("report"),
            interval_s: 1.0,
            slo_s: None,
            window_s: 10.0,
            engine_bin: None,
            stabilization_s: 3.0,
            scale_down_delay_s: 15.0,
            autoscale: true,
            latency_percentile: None,
            keep_savepoints: savepoint_history::DEFAULT_KEEP_SAVEPOINTS,
        }
    }
}

/// Errors of `streamscale run` (and `plan`).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A command-line option is out of range; the message names it (`--scale: must be > 0`).
    #[error("{0}")]
    Option(String),
    /// The job file is unreadable or invalid (the message names the file and field).
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A file or directory could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The engine could not be started.
    #[error("engine: {0}")]
    Runtime(#[from] RuntimeError),
    /// The report could not be written.
    #[error(transparent)]
    Report(#[from] ReportError),
    /// Metrics could not be scraped.
    #[error(transparent)]
    Scrape(#[from] crate::scrape::ScrapeError),
    /// The planner rejected the metric window.
    #[error("planner: {0}")]
    Model(#[from] crate::model::ModelError),
    /// The run failed (`failure`, what `summary.json` would have said) and then its report
    /// could not be written either.
    #[error("run failed: {failure}; and its report could not be written: {source}")]
    ReportAfterFailure {
        /// Why the run failed.
        failure: String,
        /// Why the report could not be written.
        source: ReportError,
    },
    /// The run's first engine did not start; the report directory was left as it was. One
    /// line: an engine that exited is said to have exited before serving metrics, with its
    /// exit status and last warning or error line (or that there was none) and its log.
    #[error("{}; {}", start_error(.error), start_note(.report, .kept.as_deref()))]
    Start {
        /// Why the engine did not start.
        error: RuntimeError,
        /// The report directory, unchanged.
        report: PathBuf,
        /// Where this attempt's job file and engine log were kept, if anywhere.
        kept: Option<PathBuf>,
    },
}

/// Why the first engine did not start, without repeating "engine".
fn start_error(error: &RuntimeError) -> String {
    match error {
        RuntimeError::Exited { status, last_error } => {
            format!("the engine exited before serving metrics ({status}): {last_error}")
        }
        RuntimeError::Spawn { .. }
        | RuntimeError::StartTimeout { .. }
        | RuntimeError::BadListeningLine { .. } => error.to_string(),
        _ => format!("the engine could not be started: {error}"),
    }
}

fn start_note(report: &Path, kept: Option<&Path>) -> String {
    let mut note = format!("{} was left as it was", report.display());
    if let Some(k) = kept {
        note.push_str(&format!(
            " (this attempt's job.yaml and engine log are in {})",
            k.display()
        ));
    }
    note
}

/// The job as it will run: the effective spec, where it was written, and its time base.
#[derive(Debug, Clone)]
pub struct PreparedJob {
    /// The effective spec (overrides applied, trace path absolute).
    pub spec: JobSpec,
    /// Where the effective job file goes: `job.yaml` in the report directory (absolute).
    pub path: PathBuf,
    /// The effective job file's text (what the engines are started with).
    pub yaml: String,
    /// Run length, seconds.
    pub duration_s: f64,
    /// The first source's rate function (for the trace time).
    pub rate: Option<RateFunction>,
}

impl PreparedJob {
    /// Trace time (seconds) at `elapsed_s` wall-clock seconds since the job started, when the
    /// first source follows a trace.
    pub fn trace_time(&self, elapsed_s: f64) -> Option<f64> {
        self.rate.as_ref().and_then(|r| r.trace_time(elapsed_s))
    }

    /// The first source's trace `startSeconds` (0 without a trace).
    pub fn trace_start(&self) -> f64 {
        match &self.rate {
            Some(RateFunction::Trace { settings, .. }) => settings.start_seconds,
            _ => 0.0,
        }
    }

    /// Source operator names.
    pub fn sources(&self) -> Vec<String> {
        self.spec
            .operators
            .iter()
            .filter(|o| matches!(o.kind, OperatorKind::Source { .. }))
            .map(|o| o.name.clone())
            .collect()
    }

    /// Operator names in topological order, as close to the job file's order as the edges
    /// allow (of the operators whose inputs are all listed, the first in the file comes next;
    /// file order where a cycle leaves no choice), for progress lines and report columns.
    pub fn order(&self) -> Vec<String> {
        let mut left: Vec<&str> = self
            .spec
            .operators
            .iter()
            .map(|o| o.name.as_str())
            .collect();
        let mut order: Vec<String> = Vec::with_capacity(left.len());
        while !left.is_empty() {
            let ready = left.iter().position(|name| {
                self.spec
                    .edges
                    .iter()
                    .filter(|e| e.to == *name)
                    .all(|e| order.contains(&e.from))
            });
            order.push(left.remove(ready.unwrap_or(0)).to_string());
        }
        order
    }
}

/// Resolves a job path: as given if it exists (or is absolute), else relative to the workspace
/// root baked in at compile time.
pub fn resolve_job_path(job: &Path) -> PathBuf {
    if job.is_absolute() || job.exists() {
        return job.to_path_buf();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidate = root.join(job);
    if candidate.exists() {
        candidate
    } else {
        job.to_path_buf()
    }
}

fn positive(name: &str, v: Option<f64>) -> Result<(), RunError> {
    match v {
        Some(x) if x.is_infinite() && x > 0.0 => Err(RunError::Option(format!(
            "{name}: must be > 0 and finite (got {x})"
        ))),
        Some(x) if !(x > 0.0 && x.is_finite()) => {
            Err(RunError::Option(format!("{name}: must be > 0 (got {x})")))
        }
        _ => Ok(()),
    }
}

/// Shortest scrape interval `streamscale run` and `plan` accept, seconds: two of the
/// engine's metric flushes (every 100 ms, `RuntimeOptions::flush_interval`), so that every
/// interval sees its counters move; shorter ones read most intervals as empty.
pub const MIN_INTERVAL_S: f64 = 0.2;

/// `--interval` (or `plan`'s gap) `x`: > 0, finite and at least [`MIN_INTERVAL_S`].
fn scrape_interval(x: f64) -> Result<(), RunError> {
    positive("--interval", Some(x))?;
    if x < MIN_INTERVAL_S {
        return Err(RunError::Option(format!(
            "--interval: must be at least {MIN_INTERVAL_S} s, two of the engine's 100 ms metric flushes (got {x})"
        )));
    }
    Ok(())
}

fn non_negative(name: &str, x: f64) -> Result<(), RunError> {
    if x >= 0.0 && x.is_finite() {
        Ok(())
    } else {
        Err(RunError::Option(format!(
            "{name}: must be a number of seconds >= 0 (got {x})"
        )))
    }
}

/// Longest span a seconds option (`--duration`, `--interval`, `--slo`, `--window`,
/// `--stabilization`, `--scale-down-delay`) may give: 365 days, in seconds. Longer is a typo
/// (`1e300h`), and past about 584 billion years not even a timer can hold it.
pub const MAX_SECONDS: f64 = 365.0 * 86_400.0;

fn at_most_a_year(name: &str, v: Option<f64>) -> Result<(), RunError> {
    match v {
        Some(x) if x > MAX_SECONDS => Err(RunError::Option(format!(
            "{name}: {x:e} s is longer than a year; give at most {MAX_SECONDS} s (365 days, 8760h)"
        ))),
        _ => Ok(()),
    }
}

/// Checks that `dir` can be a report directory: it is a directory whose report files
/// ([`REPORT_FILES`]) are files where they exist and whose `logs` is a directory where it
/// exists, or the nearest of its ancestors that exists is a directory (so it can be created);
/// that it, or that ancestor, lets this process create entries in it; and that its
/// `savepoints`, where it exists, is a directory (a symbolic link to one included) in which
/// entries can be created: the engines write every savepoint there, so a file or a read-only
/// directory there would fail the run's first engine start or, worse, its final savepoint.
/// Writability is tried with [`streamscale_engine::writable_dir::check_usable_dir`], which
/// leaves nothing behind.
///
/// # Errors
/// [`RunError::Option`] naming `--report`, the path and why.
pub fn check_report_dir(dir: &Path) -> Result<(), RunError> {
    check_report_path(dir)?;
    streamscale_engine::writable_dir::check_usable_dir(dir)
        .map_err(|e| RunError::Option(format!("--report: {e}")))?;
    let savepoints = dir.join(SAVEPOINTS_DIR);
    let Ok(link) = std::fs::symlink_metadata(&savepoints) else {
        // Absent: the first engine creates it in `dir`, checked above.
        return Ok(());
    };
    let keeps = "a run keeps its savepoints there: move it away or give another --report";
    if link.file_type().is_symlink() && std::fs::metadata(&savepoints).is_err() {
        return Err(RunError::Option(format!(
            "--report: {} is a symbolic link to nothing; {keeps}",
            savepoints.display()
        )));
    }
    streamscale_engine::writable_dir::check_usable_dir(&savepoints)
        .map_err(|e| RunError::Option(format!("--report: {e}; {keeps}")))
}

/// Refuses a job file that is one of the files a run writes into its report directory `dir`
/// ([`REPORT_FILES`]: `streamscale run DIR/job.yaml --report DIR` would replace the user's
/// job file with the report's effective copy, its comments and relative paths lost). A job
/// file that cannot be resolved is left to the job file's own check.
///
/// # Errors
/// [`RunError::Option`] naming `--report`, the file and the job.
fn check_job_outside_report(job: &Path, dir: &Path) -> Result<(), RunError> {
    let Ok(job) = std::fs::canonicalize(job) else {
        return Ok(());
    };
    for name in REPORT_FILES {
        let path = dir.join(name);
        if std::fs::canonicalize(&path).is_ok_and(|p| p == job) {
            return Err(RunError::Option(format!(
                "--report: {} is the job file itself; a run replaces it with its report's copy of the job: give another --report or move the job file",
                path.display()
            )));
        }
    }
    Ok(())
}

/// [`check_report_dir`] without trying to create anything.
fn check_report_path(dir: &Path) -> Result<(), RunError> {
    for a in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        match std::fs::metadata(a) {
            Ok(m) if m.is_dir() && a == dir => return check_report_entries(dir),
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) if a == dir => {
                return Err(RunError::Option(format!(
                    "--report: {} exists and is not a directory (a report is a directory: summary.json, timeline.csv, job.yaml, logs/, ...)",
                    dir.display()
                )));
            }
            Ok(_) => {
                return Err(RunError::Option(format!(
                    "--report: {} cannot be created: {} is not a directory",
                    dir.display(),
                    a.display()
                )));
            }
            // A symbolic link to nothing (`ln -s /gone DIR`): nothing can be created at it or
            // under it, and the run would fail only once its first engine is staged.
            Err(_) if std::fs::symlink_metadata(a).is_ok_and(|m| m.file_type().is_symlink()) => {
                let under = if a == dir {
                    String::new()
                } else {
                    format!(" cannot be created: {}", a.display())
                };
                return Err(RunError::Option(format!(
                    "--report: {}{under} is a symbolic link to nothing (the link's target does not exist)",
                    dir.display()
                )));
            }
            Err(_) => {}
        }
    }
    Ok(())
}

/// Checks that the entries a run replaces in an existing report directory `dir` can be
/// replaced: each of [`REPORT_FILES`] is a file (or absent), `logs` a directory (or absent).
///
/// # Errors
/// [`RunError::Option`] naming `--report`, the entry and what it should be.
fn check_report_entries(dir: &Path) -> Result<(), RunError> {
    let entries = REPORT_FILES
        .iter()
        .map(|f| (*f, false))
        .chain([("logs", true)]);
    for (name, want_dir) in entries {
        let path = dir.join(name);
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if m.is_dir() != want_dir {
            let (is, should) = if want_dir {
                ("not a directory", "a directory")
            } else {
                ("a directory", "a file")
            };
            return Err(RunError::Option(format!(
                "--report: {} is {is}; a run replaces it with {should} of its report: move it away or give another --report",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Checks that `path`, given with an option (`what` starts the message), is a file.
///
/// # Errors
/// [`RunError::Option`]: `WHAT PATH does not exist`, or `is a directory, not EXPECTED`.
fn existing_file(what: &str, path: &Path, expected: &str) -> Result<(), RunError> {
    if path.is_file() {
        return Ok(());
    }
    let why = if path.is_dir() {
        format!("is a directory, not {expected}")
    } else {
        "does not exist".to_string()
    };
    Err(RunError::Option(format!("{what} {} {why}", path.display())))
}

/// Checks the numeric options, the report directory and the engine binary given with
/// `--engine` (or, without it, with `$STREAMSCALE_ENGINE_BIN`).
///
/// # Errors
/// [`RunError::Option`] naming the first option out of range.
pub fn check_options(opts: &RunOptions) -> Result<(), RunError> {
    positive("--speedup", opts.speedup)?;
    positive("--scale", opts.scale)?;
    positive("--duration", opts.duration_s)?;
    scrape_interval(opts.interval_s)?;
    positive("--slo", opts.slo_s)?;
    positive("--window", Some(opts.window_s))?;
    non_negative("--stabilization", opts.stabilization_s)?;
    non_negative("--scale-down-delay", opts.scale_down_delay_s)?;
    if opts.keep_savepoints == 0 {
        return Err(RunError::Option(
            "--keep-savepoints: must be at least 1 (the savepoint the job runs from is always kept)"
                .into(),
        ));
    }
    for (name, v) in [
        ("--duration", opts.duration_s),
        ("--interval", Some(opts.interval_s)),
        ("--slo", opts.slo_s),
        ("--window", Some(opts.window_s)),
        ("--stabilization", Some(opts.stabilization_s)),
        ("--scale-down-delay", Some(opts.scale_down_delay_s)),
    ] {
        at_most_a_year(name, v)?;
    }
    check_report_dir(&opts.report_dir)?;
    check_job_outside_report(&opts.job, &opts.report_dir)?;
    if let Some((what, engine)) = explicit_engine(opts) {
        let full = absolute(&engine)?;
        let why = crate::runtime::engine_binary::engine_binary_problem(&engine)
            .or_else(|| crate::runtime::engine_binary::engine_identity_problem(&full));
        if let Some(why) = why {
            return Err(RunError::Option(format!(
                "{what}: {} {why}",
                engine.display()
            )));
        }
    }
    if let Some(p) = opts.latency_percentile
        && !(p > 0.0 && p < 1.0)
    {
        return Err(RunError::Option(format!(
            "--latency-percentile: must be in (0, 1), e.g. 0.99 for p99 (got {p})"
        )));
    }
    if opts.window_s < 2.0 * opts.interval_s {
        return Err(RunError::Option(format!(
            "--window: {} s must span at least two intervals ({} s)",
            opts.window_s,
            2.0 * opts.interval_s
        )));
    }
    Ok(())
}

/// The engine binary named by the user, with the option that named it: `--engine`, else a
/// non-empty `$STREAMSCALE_ENGINE_BIN`; `None` when the engine is looked for next to this
/// executable ([`crate::runtime::local::locate_engine_binary`]).
fn explicit_engine(opts: &RunOptions) -> Option<(&'static str, PathBuf)> {
    if let Some(engine) = &opts.engine_bin {
        return Some(("--engine", engine.clone()));
    }
    std::env::var_os(crate::runtime::local::ENGINE_BIN_ENV)
        .filter(|v| !v.is_empty())
        .map(|v| (crate::runtime::local::ENGINE_BIN_ENV, PathBuf::from(v)))
}

/// What a run killed during its final savepoint tells the user to restore from: the newest
/// savepoint of the job completed before the stop (`before`, newest first), as
/// "; restore from the newest earlier savepoint PATH"; empty when there is none or the list
/// could not be read.
fn restore_hint(before: Option<&[PathBuf]>) -> String {
    before
        .and_then(<[PathBuf]>::first)
        .map(|p| {
            format!(
                "; restore from the newest earlier savepoint {}",
                p.display()
            )
        })
        .unwrap_or_default()
}

fn absolute(path: &Path) -> Result<PathBuf, RunError> {
    std::path::absolute(path).map_err(|source| RunError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads the job file, applies the trace/SLO overrides to the first source and validates the
/// result exactly as the engine will read it. Writes nothing: [`run`] puts the effective job
/// file into the report directory only once its engine has started.
///
/// # Errors
/// [`RunError::Option`] for out-of-range options (a `--report` that is not a directory
/// included) or trace overrides without a source, [`RunError::Spec`] when the job (or the
/// overridden one) is invalid.
pub fn prepare_job(opts: &RunOptions) -> Result<PreparedJob, RunError> {
    check_options(opts)?;
    let job_path = absolute(&resolve_job_path(&opts.job))?;
    let mut spec = JobSpec::from_file_to_run(&job_path)?;

    if let Some(trace) = &opts.trace {
        existing_file("--trace: trace file", trace, "a trace CSV")?;
    }
    let wants_trace = opts.trace.is_some() || opts.speedup.is_some() || opts.scale.is_some();
    if wants_trace {
        let Some(source) = spec
            .operators
            .iter_mut()
            .find(|o| matches!(o.kind, OperatorKind::Source { .. }))
        else {
            return Err(RunError::Option(format!(
                "--trace/--speedup/--scale: {} has no source operator",
                job_path.display()
            )));
        };
        let name = source.name.clone();
        let OperatorKind::Source { rate, .. } = &mut source.kind else {
            return Err(RunError::Option("internal: source without a rate".into()));
        };
        if !matches!(rate, RateSpec::Trace(_)) {
            let Some(file) = &opts.trace else {
                let flag = if opts.speedup.is_some() {
                    "--speedup"
                } else {
                    "--scale"
                };
                return Err(RunError::Option(format!(
                    "{flag}: source `{name}` does not follow a trace; give --trace FILE too"
                )));
            };
            *rate = RateSpec::Trace(TraceRate {
                file: file.clone(),
                speedup: 1.0,
                scale: 1.0,
                start_seconds: 0.0,
                end_seconds: None,
                gaps: GapPolicy::Hold,
            });
        }
        if let RateSpec::Trace(t) = rate {
            if let Some(file) = &opts.trace {
                t.file = absolute(file)?;
                // A different trace: replay all of it (the job's window belongs to its own
                // trace), as `streamscale-sim --trace` does.
                t.start_seconds = 0.0;
                t.end_seconds = None;
            }
            if let Some(s) = opts.speedup {
                t.speedup = s;
            }
            if let Some(s) = opts.scale {
                t.scale = s;
            }
        }
    }
    // Make every trace path absolute so the effective file works from the report directory.
    for op in &mut spec.operators {
        if let OperatorKind::Source {
            rate: RateSpec::Trace(t),
            ..
        } = &mut op.kind
        {
            t.file = absolute(&t.file)?;
        }
    }
    if let Some(slo) = opts.slo_s {
        spec.autoscaler.latency_slo_seconds = slo;
    }

    spec.validate().map_err(|problem| SpecError::Invalid {
        path: job_path.clone(),
        problem,
    })?;

    let path = absolute(&opts.report_dir.join("job.yaml"))?;
    // Validate exactly what the engine will read (this also checks the trace file exists);
    // every path in it is absolute, so where the file will lie does not matter.
    let yaml = spec.to_yaml();
    let spec = JobSpec::from_yaml(&yaml).map_err(|message| SpecError::Parse {
        path: job_path.clone(),
        message,
    })?;
    spec.validate()
        .and_then(|()| spec.validate_job_file())
        .map_err(|problem| SpecError::Invalid {
            path: job_path.clone(),
            problem,
        })?;

    let rate = spec.operators.iter().find_map(|o| match &o.kind {
        OperatorKind::Source { rate, .. } => Some(rate.clone()),
        _ => None,
    });
    let rate = match rate {
        Some(r) => Some(
            RateFunction::from_spec(&r)
                .map_err(|e| RunError::Option(format!("{}: {e}", job_path.display())))?,
        ),
        None => None,
    };
    if let Some(RateFunction::Trace {
        trace, settings, ..
    }) = &rate
    {
        check_trace_window(trace, settings, &job_path)?;
    }
    let duration_s = opts
        .duration_s
        .or_else(|| rate.as_ref().and_then(RateFunction::wall_end))
        .filter(|d| *d > 0.0)
        .unwrap_or(DEFAULT_DURATION_S);
    Ok(PreparedJob {
        spec,
        path,
        yaml,
        duration_s,
        rate,
    })
}

/// Checks that a source's replay window `[startSeconds, endSeconds)` overlaps its trace: a
/// window outside the trace would replay nothing (0 records/s throughout).
fn check_trace_window(
    trace: &streamscale_engine::trace::Trace,
    t: &TraceRate,
    job_path: &Path,
) -> Result<(), RunError> {
    let first = trace.times.first().copied().unwrap_or(0.0);
    let end = trace.end();
    let window_end = t.end_seconds.unwrap_or(end);
    if t.start_seconds >= end || window_end <= first || window_end <= t.start_seconds {
        return Err(RunError::Option(format!(
            "{}: first source's trace window startSeconds {} .. endSeconds {} lies outside the trace {} (which covers {first} .. {end} s)",
            job_path.display(),
            t.start_seconds,
            t.end_seconds
                .map_or_else(|| "(end)".to_string(), |e| e.to_string()),
            t.file.display()
        )));
    }
    Ok(())
}

/// How a run was cut short: the signal it received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// SIGINT (Ctrl-C in a terminal).
    Int,
    /// SIGTERM (`kill`).
    Term,
    /// SIGHUP (the terminal closed).
    Hup,
}

impl Interrupt {
    /// The signal's name, e.g. `SIGINT`.
    pub fn name(self) -> &'static str {
        match self {
            Interrupt::Int => "SIGINT",
            Interrupt::Term => "SIGTERM",
            Interrupt::Hup => "SIGHUP",
        }
    }

    /// The exit status shells use for a process ended by this signal: 128 + signal number
    /// (130, 143, 129).
    pub fn exit_code(self) -> u8 {
        match self {
            Interrupt::Int => 130,
            Interrupt::Term => 143,
            Interrupt::Hup => 129,
        }
    }
}

/// The result of a run: the summary (already written) and where the report is.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The summary as written to `summary.json`.
    pub summary: Summary,
    /// The report directory.
    pub report_dir: PathBuf,
    /// The signal that cut the run short, if any (`summary.interrupted` is then true).
    pub interrupted: Option<Interrupt>,
}

/// Builds the HTTP client used for loopback engines (no proxy, 5 s timeout).
///
/// # Errors
/// [`RunError::Option`] when the client cannot be built (TLS-less clients always can).
pub fn http_client() -> Result<reqwest::Client, RunError> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| RunError::Option(format!("cannot build the HTTP client: {e}")))
}

struct Loop<'a, R: EngineRuntime> {
    job: &'a PreparedJob,
    opts: &'a RunOptions,
    executor: Executor<'a, R>,
    slo_s: f64,
    /// The percentile the SLO is on (`--latency-percentile`, else the job's
    /// `autoscaler.latencyPercentile`), in (0, 1).
    slo_percentile: f64,
    order: Vec<String>,
    sources: Vec<String>,
    rows: Vec<IntervalStats>,
    accounting: Accounting,
    rescales: Vec<RescaleRecord>,
    failed_rescales: Vec<RescaleRecord>,
    /// Rescales decided but not applied (`--no-autoscale`).
    recommendations: Vec<RescaleRecord>,
    client: reqwest::Client,
    /// Records shed by the engines of this run that have stopped.
    shed_before: u64,
    /// Records shed by the running engine.
    shed_now: u64,
    /// The signal that cut the run short, if any.
    interrupted: Option<Interrupt>,
    /// Where the engines write savepoints (`REPORT/savepoints`), pruned to the newest
    /// [`RunOptions::keep_savepoints`].
    savepoints_dir: PathBuf,
    /// Savepoints removed by that pruning during this run.
    savepoints_removed: usize,
}

/// Runs the autoscaling loop locally and writes the report. Progress and result lines go to
/// `print` (the command prints them on stdout), warnings (lines starting `warning:`) to `warn`
/// (stderr).
///
/// An engine failure during the run does not return an error: the report is still written and
/// `summary.failure` says what happened.
///
/// Nothing in the report directory changes before the first engine runs: its job file and
/// log start in a directory `NAME.starting-PID-N` beside it and replace the earlier report's files only
/// then.
///
/// # Errors
/// [`RunError::Option`] / [`RunError::Spec`] when the options or the job are invalid,
/// [`RunError::Start`] when the first engine cannot start (the report directory as it was),
/// another [`RunError`] when the report cannot be written.
pub async fn run(
    opts: &RunOptions,
    print: &mut (dyn FnMut(&str) + Send),
    warn: &mut (dyn FnMut(&str) + Send),
) -> Result<RunOutcome, RunError> {
    let earlier = earlier_report(&opts.report_dir);
    let job = prepare_job(opts)?;
    let client = http_client()?;
    // A path given by the user is a path (a bare `engine` means the one in the working
    // directory, as checked), never a name looked up on PATH.
    let binary = match explicit_engine(opts) {
        Some((_, engine)) => absolute(&engine)?,
        None => crate::runtime::local::locate_engine_binary(),
    };
    // Symbolic links resolved: the staging directory must lie on the report's file system.
    let report_existed = opts.report_dir.exists();
    let report_dir = if report_existed {
        std::fs::canonicalize(&opts.report_dir).map_err(|source| RunError::Io {
            path: opts.report_dir.clone(),
            source,
        })?
    } else {
        absolute(&opts.report_dir)?
    };
    // One run per report directory: held until this function returns.
    let (_lock, lock_path) = lock_report_dir(&report_dir)?;
    // Until the first engine runs, its job file and log live in a directory beside the
    // report's, so a run that cannot start leaves an earlier report as it was.
    let staging = Staging::create(&report_dir, &job.yaml)?;
    let savepoints = report_dir.join(SAVEPOINTS_DIR);
    let savepoints_existed = savepoints.exists();
    let runtime = LocalRuntime::new(
        binary,
        savepoints.clone(),
        staging.dir.join("logs"),
        client.clone(),
    );
    if let Some(warning) = earlier {
        warn(&warning);
    }
    let slo_s = job.spec.autoscaler.latency_slo_seconds;
    print(&format!(
        "streamscale run: job `{}` ({}), {:.0} s, interval {} s, SLO {} s, report in {}",
        job.spec.name,
        opts.job.display(),
        job.duration_s,
        opts.interval_s,
        slo_s,
        opts.report_dir.display()
    ));
    // Registered before the engine starts, so a signal during start-up is not lost.
    let signals = Signals::new();
    let launched = Executor::new(&runtime, &staging.dir.join("job.yaml"))
        .launch(&job.spec.parallelism(), None)
        .await;
    let engine = match launched {
        Ok((engine, _)) => engine,
        Err(error) => {
            // Only what this run created, and only when empty.
            if !savepoints_existed {
                let _ = std::fs::remove_dir(&savepoints);
            }
            if !report_existed {
                let _ = std::fs::remove_dir(&report_dir);
                // Nothing is left to guard: the lock file goes with the directory it was for
                // (a run started meanwhile has failed on the lock, it does not wait for it).
                if !report_dir.exists() {
                    let _ = std::fs::remove_file(&lock_path);
                }
            }
            let kept = staging.abandon(&error);
            return Err(RunError::Start {
                error,
                report: opts.report_dir.clone(),
                kept,
            });
        }
    };
    let started = Instant::now();
    if let Err(e) = staging.commit(&report_dir, &runtime).await {
        let _ = runtime.kill(&engine).await;
        return Err(e);
    }
    let executor = Executor::new(&runtime, &job.path);
    let mut lp = Loop {
        job: &job,
        opts,
        executor,
        slo_s,
        slo_percentile: opts
            .latency_percentile
            .unwrap_or(job.spec.autoscaler.latency_percentile),
        order: job.order(),
        sources: job.sources(),
        rows: Vec::new(),
        accounting: Accounting::default(),
        rescales: Vec::new(),
        failed_rescales: Vec::new(),
        recommendations: Vec::new(),
        client,
        shed_before: 0,
        shed_now: 0,
        interrupted: None,
        savepoints_dir: savepoints,
        savepoints_removed: 0,
    };
    lp.run(engine, started, signals, print, warn).await
}

/// The report directory's parent (created if missing) and its name.
///
/// # Errors
/// [`RunError::Option`] naming `--report` when the path has no name or the parent cannot be
/// created.
fn report_parent(report_dir: &Path) -> Result<(&Path, &std::ffi::OsStr), RunError> {
    let (Some(parent), Some(name)) = (report_dir.parent(), report_dir.file_name()) else {
        return Err(RunError::Option(format!(
            "--report: {} does not name a directory",
            report_dir.display()
        )));
    };
    std::fs::create_dir_all(parent).map_err(|e| {
        RunError::Option(format!("--report: cannot create {}: {e}", parent.display()))
    })?;
    Ok((parent, name))
}

/// Takes the lock file `.NAME.lock` beside the report directory `NAME` (created if missing,
/// left in place afterwards unless the run could not start and created no `NAME`; an exclusive
/// advisory lock, released when the file is closed or the process exits), so that two runs
/// never write into one report directory. Returns the open file and its path.
///
/// # Errors
/// [`RunError::Option`] naming `--report` when another process holds the lock or the lock file
/// cannot be created.
fn lock_report_dir(report_dir: &Path) -> Result<(std::fs::File, PathBuf), RunError> {
    let (parent, name) = report_parent(report_dir)?;
    let path = parent.join(format!(".{}.lock", name.to_string_lossy()));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| {
            RunError::Option(format!("--report: cannot create {}: {e}", path.display()))
        })?;
    match file.try_lock() {
        Ok(()) => Ok((file, path)),
        Err(std::fs::TryLockError::WouldBlock) => Err(RunError::Option(format!(
            "--report: {} is in use by another streamscale run (it holds {}); give another --report",
            report_dir.display(),
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(RunError::Option(format!(
            "--report: cannot lock {}: {e}",
            path.display()
        ))),
    }
}

/// The first engine's job file and log directory until it has started: a new directory
/// `NAME.starting-PID-N` beside the report directory `NAME` (same file system, so its files
/// can be renamed into the report).
struct Staging {
    dir: PathBuf,
}

impl Staging {
    /// Creates the directory (and the report directory's parent) and writes `job.yaml`.
    fn create(report_dir: &Path, yaml: &str) -> Result<Staging, RunError> {
        let (parent, name) = report_parent(report_dir)?;
        let cannot = |path: &Path, e: std::io::Error| {
            RunError::Option(format!("--report: cannot create {}: {e}", path.display()))
        };
        let mut n = 0u32;
        let dir = loop {
            let dir = parent.join(format!(
                "{}.starting-{}-{n}",
                name.to_string_lossy(),
                std::process::id()
            ));
            match std::fs::create_dir(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(cannot(&dir, e)),
            }
        };
        let job = dir.join("job.yaml");
        if let Err(source) = std::fs::write(&job, yaml) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(RunError::Io { path: job, source });
        }
        Ok(Staging { dir })
    }

    /// After a failed start: keeps the directory when the engine ran long enough to log
    /// something (returns it), else removes it.
    fn abandon(self, error: &RuntimeError) -> Option<PathBuf> {
        if matches!(error, RuntimeError::Spawn { .. }) {
            let _ = std::fs::remove_dir_all(&self.dir);
            None
        } else {
            Some(self.dir)
        }
    }

    /// Makes the report directory this run's: moves this run's `job.yaml` and `logs/` into it
    /// under temporary names (nothing of an earlier report is touched if that fails), removes
    /// the earlier run's report files ([`REPORT_FILES`], `summary.json` first, so that a
    /// `summary.json` always belongs to the rest) and engine logs, then gives the new ones
    /// their names. Savepoints and learned state stay.
    async fn commit(self, report_dir: &Path, runtime: &LocalRuntime) -> Result<(), RunError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RunError::Io { path, source }
        };
        std::fs::create_dir_all(report_dir).map_err(io(report_dir))?;
        let pid = std::process::id();
        let new_logs = report_dir.join(format!(".logs.starting-{pid}"));
        let new_job = report_dir.join(format!(".job.yaml.starting-{pid}"));
        runtime.move_logs(&new_logs).await?;
        std::fs::rename(self.dir.join("job.yaml"), &new_job).map_err(io(&new_job))?;
        for file in REPORT_FILES {
            let path = report_dir.join(file);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&path)(e)),
                _ => {}
            }
        }
        let logs = report_dir.join("logs");
        match std::fs::remove_dir_all(&logs) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&logs)(e)),
            _ => {}
        }
        let job = report_dir.join("job.yaml");
        std::fs::rename(&new_job, &job).map_err(io(&job))?;
        runtime.move_logs(&logs).await?;
        std::fs::remove_dir(&self.dir).map_err(io(&self.dir))
    }
}

impl<R: EngineRuntime> Loop<'_, R> {
    async fn run(
        &mut self,
        mut engine: EngineHandle,
        started: Instant,
        mut signals: Signals,
        print: &mut (dyn FnMut(&str) + Send),
        warn: &mut (dyn FnMut(&str) + Send),
    ) -> Result<RunOutcome, RunError> {
        let initial = self.job.spec.parallelism();
        let metrics_url = |e: &EngineHandle| format!("{}/metrics", e.base_url);

        // The engine's rates are exact counter deltas from the first second after a restore
        // (no moving averages to refill, unlike Flink's 60 s meters), so a short
        // stabilization and a history of three intervals suffice.
        let mut autoscaler = Autoscaler::new(GuardSettings {
            window_seconds: (3.0 * self.opts.interval_s).min(self.opts.window_s),
            stabilization_seconds: self.opts.stabilization_s,
            scale_down_delay_seconds: self.opts.scale_down_delay_s,
            planner: crate::model::PlannerSettings {
                latency_percentile: self.opts.latency_percentile,
                ..crate::model::PlannerSettings::default()
            },
            ..GuardSettings::default()
        });
        // Warm-up metrics are not representative: the first start counts as a restart.
        autoscaler.restarted(0.0);
        // The forecast's rate history survives runs: kept in the report directory on the
        // Unix-time clock, moved to this run's clock (seconds since `started`).
        let history_path = self.opts.report_dir.join(HISTORY_FILE);
        let learned_path = self.opts.report_dir.join(LEARNED_FILE);
        // Another job's learned state in a shared report directory is set aside, never
        // overwritten, and this job's own is brought back.
        for path in [&history_path, &learned_path] {
            match claim_job_file(path, &self.job.spec.name) {
                Ok(notes) => notes.iter().for_each(|n| print(n)),
                Err(warning) => warn(&format!("warning: {warning}")),
            }
        }
        let unix_start = unix_now_s();
        let mut history_bins = 0;
        let shedding = self
            .job
            .spec
            .autoscaler
            .limits
            .as_ref()
            .is_some_and(|l| l.on_limit == streamscale_engine::spec::OnLimit::Shed);
        let (mut shed_wanted, mut shed_applied) = (0.0f64, 0.0f64);
        if crate::model::forecast::ForecastConfig::of(&self.job.spec).is_some() {
            match load_history(&history_path, &self.job.spec.name) {
                Ok(Some(h)) => {
                    history_bins = h.bins.len();
                    print(&format!(
                        "forecast: {} bins of rate history from {}",
                        h.bins.len(),
                        history_path.display()
                    ));
                    autoscaler.set_rate_history(h.shifted(-unix_start));
                }
                Ok(None) => {}
                Err(warning) => warn(&format!("warning: {warning}")),
            }
        }
        // What was learned about the job's operators in earlier runs (same report directory).
        let mut learned_saved = match load_learned(&learned_path, &self.job.spec.name) {
            Ok(Some(t)) => {
                print(&format!(
                    "learned: scalability factors of {} operator(s) from {}",
                    t.factors.len(),
                    learned_path.display()
                ));
                autoscaler.set_scalability(t.clone());
                Some(t)
            }
            Ok(None) => None,
            Err(warning) => {
                warn(&format!("warning: {warning}"));
                None
            }
        };
        let mut window: VecDeque<MetricSample> = VecDeque::new();
        let mut prev: Option<EngineMetrics> = None;
        let mut capacity = CapacityEstimator::default();
        let mut failure: Option<String> = None;
        let mut scrape_failures = 0;
        let mut waiting_for_backlog = false;
        // Operators last reported as held overloaded ([`progress::at_limit_line`]).
        let mut at_limit: Vec<String> = Vec::new();
        // Whether the last plan reported the latency SLO unattainable
        // ([`progress::slo_unattainable_line`]).
        let mut unattainable = false;
        let mut engine_changed = false;
        // Subtasks missing from the last scrape, per operator, as last said.
        let mut last_missing: Vec<(String, Vec<usize>)> = Vec::new();
        // Sources already named for exporting no backlog metric (said once each).
        let mut no_backlog_said: Vec<String> = Vec::new();
        // Rescales that failed: the next attempt waits, longer after each failure in a row.
        let mut backoff = RescaleBackoff::default();
        // Whether the current backoff's hold was said (once per wait).
        let mut backoff_said = false;
        let mut ticker = tokio::time::interval(Duration::from_secs_f64(self.opts.interval_s));
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let deadline = started + Duration::from_secs_f64(self.job.duration_s);
        // Sources with a record count finish the job on their own: poll the job's state.
        let bounded = self
            .job
            .spec
            .operators
            .iter()
            .any(|o| matches!(o.kind, OperatorKind::Source { count: Some(_), .. }));

        // A signal or the deadline ends the last interval early: it is still scraped and
        // counted, so that the run's totals cover the whole run.
        let mut stopping = false;
        let mut deadline_seen = false;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = tokio::time::sleep_until(deadline), if !deadline_seen => {
                    deadline_seen = true;
                }
                sig = signals.recv() => {
                    self.interrupted = Some(sig);
                    print(&format!("interrupted ({}): stopping with a draining savepoint", sig.name()));
                    stopping = true;
                }
            }
            // The sample is stamped when the page arrived (the time its figures are of); the
            // loop's own time is read after it, so a slow answer does not skew the rates.
            let clock = || started.elapsed().as_secs_f64();
            let scraped = scrape_stamped(&self.client, &metrics_url(&engine), &clock).await;
            let now_s = clock();
            let mut cur = match scraped {
                Ok(m) => {
                    scrape_failures = 0;
                    m
                }
                Err(e) => {
                    if let Some(exit) = self.executor.runtime().exited(&engine).await {
                        failure = Some(format!("engine failed at t={now_s:.0}s: {exit}"));
                        break;
                    }
                    if stopping {
                        break;
                    }
                    scrape_failures += 1;
                    tracing::warn!("scrape failed ({scrape_failures}/{MAX_SCRAPE_FAILURES}): {e}");
                    if scrape_failures >= MAX_SCRAPE_FAILURES {
                        failure = Some(format!("engine unresponsive at t={now_s:.0}s: {e}"));
                        break;
                    }
                    continue;
                }
            };
            // Subtasks missing from the scrape: an incomplete sample at the parallelism the
            // engine runs (the planner leaves it out), said when that starts or changes.
            let missing = cur.sample.mark_missing(&engine.parallelism);
            if missing != last_missing {
                if let Some(line) =
                    progress::missing_subtasks_line(now_s, &missing, &engine.parallelism)
                {
                    warn(&line);
                }
                last_missing.clone_from(&missing);
            }
            for src in cur.sources_without_backlog(&self.sources) {
                if !no_backlog_said.iter().any(|s| s == src) {
                    warn(&progress::no_backlog_metric_line(src));
                    no_backlog_said.push(src.to_string());
                }
            }
            // An interval with an incomplete end is not counted; the next one spans both.
            if let Some(p) = prev.as_ref().filter(|_| missing.is_empty()) {
                // Counters restart with a new engine: an interval spanning a restore says
                // nothing about service rates.
                if !engine_changed {
                    capacity.observe(p, &cur, &self.sources);
                }
                let mut stats = IntervalStats::between(
                    p,
                    &cur,
                    &self.sources,
                    &engine.parallelism,
                    self.job.trace_time(now_s),
                    &capacity,
                );
                if engine_changed {
                    stats.service_rate.clear();
                }
                if (self.slo_percentile - 0.99).abs() > 1e-12 {
                    stats.slo_percentile = Some(self.slo_percentile);
                    stats.slo_latency_s = cur
                        .latency
                        .quantile_since(Some(&p.latency), self.slo_percentile);
                }
                self.accounting.add_interval(&stats, self.slo_s);
                print(&progress::progress_line(
                    &stats,
                    &self.order,
                    self.slo_s,
                    self.job.trace_start(),
                ));
                self.rows.push(stats);
            }
            window.push_back(cur.sample.clone());
            while window
                .front()
                .is_some_and(|f| now_s - f.at_seconds > self.opts.window_s)
            {
                window.pop_front();
            }
            if missing.is_empty() {
                prev = Some(cur);
                engine_changed = false;
            }
            if stopping {
                break;
            }
            if bounded
                && let Ok(job) = self.executor.runtime().job_status(&engine).await
                && job.state == "finished"
            {
                print(&progress::job_finished_line(now_s));
                break;
            }
            if Instant::now() >= deadline {
                deadline_seen = true;
                // When the replay window is over, let the sources catch up first so the final
                // state covers the whole window (bounded by DRAIN_GRACE).
                let backlog = self.rows.last().map_or(0.0, |r| r.backlog);
                let trace_over = self
                    .job
                    .rate
                    .as_ref()
                    .and_then(RateFunction::wall_end)
                    .is_some_and(|end| now_s >= end);
                let grace_left = Instant::now() < deadline + DRAIN_GRACE;
                if !(trace_over && backlog >= 1.0 && grace_left) {
                    break;
                }
                if !waiting_for_backlog {
                    waiting_for_backlog = true;
                    print(&format!(
                        "trace window over: waiting for the sources' backlog of {backlog:.0} records to drain"
                    ));
                }
            }

            let spec = self.job.spec.with_parallelism(&engine.parallelism);
            let samples: Vec<MetricSample> = window.iter().cloned().collect();
            let verdict = autoscaler.decide(now_s, &samples, &spec);
            // Load shedding (`autoscaler.limits.onLimit: shed`): the share the last plan wants
            // is applied at the sources (kept while no plan is made, e.g. stabilizing).
            if shedding && self.opts.autoscale {
                let planned = matches!(
                    verdict,
                    Verdict::Rescale(_)
                        | Verdict::Hold {
                            recommendation: Some(_),
                            ..
                        }
                );
                if planned {
                    shed_wanted = autoscaler.limit_plan().map_or(0.0, |lp| lp.shed_share);
                }
                if (shed_wanted - shed_applied).abs() > 1e-3 {
                    match set_shed(
                        &self.client,
                        &engine.base_url,
                        self.executor.runtime().auth_token(),
                        shed_wanted,
                    )
                    .await
                    {
                        Ok(n) => {
                            let why = autoscaler
                                .limit_plan()
                                .map_or("within the limits again".to_string(), |lp| {
                                    lp.reason.clone()
                                });
                            print(&progress::shed_line(now_s, 100.0 * shed_wanted, &why));
                            shed_applied = shed_wanted;
                            self.shed_now = n;
                        }
                        Err(e) => tracing::warn!("{e}"),
                    }
                } else if shed_applied > 0.0
                    && let Ok(n) = get_shed(&self.client, &engine.base_url).await
                {
                    self.shed_now = n;
                }
            }
            // Operators held overloaded (at their largest parallelism, or flagged for
            // ineffective scaling): said once when that starts (and when it ends), since no
            // rescale line will explain the growing backlog.
            // With load shedding the SHED line says it instead.
            let plan_now = match &verdict {
                Verdict::Rescale(d) => Some(d),
                Verdict::Hold { recommendation, .. } => recommendation.as_ref(),
            };
            // The latency SLO unattainable: said once when that starts (and when it ends),
            // since a hold prints no rescale line to carry the planner's reason.
            if let Some(d) = plan_now {
                match progress::slo_unattainable_line(now_s, d) {
                    Some(line) if !unattainable => {
                        print(&line);
                        unattainable = true;
                    }
                    None if unattainable => {
                        print(&progress::slo_attainable_line(now_s));
                        unattainable = false;
                    }
                    _ => {}
                }
            }
            if let Some(d) = plan_now.filter(|_| !shedding) {
                let learned = autoscaler.scalability();
                let overloaded = progress::overloaded_held(d, learned);
                if overloaded != at_limit {
                    if let Some(line) =
                        progress::at_limit_line(now_s, d, learned, &overloaded, self.opts.autoscale)
                    {
                        print(&line);
                    } else if overloaded.is_empty() {
                        print(&progress::within_limits_line(now_s));
                    }
                    at_limit = overloaded;
                }
            }
            let h = autoscaler.rate_history();
            if h.bins.len() != history_bins && h.bin_seconds > 0.0 {
                history_bins = h.bins.len();
                if let Err(e) = save_history(&history_path, &spec.name, &h.shifted(unix_start)) {
                    tracing::warn!("{e}");
                }
            }
            let learned = autoscaler.scalability();
            let learned_changed = learned_saved.as_ref().is_none_or(|t| {
                t.factors != learned.factors || t.ineffective != learned.ineffective
            });
            if learned_changed && !(learned.factors.is_empty() && learned.ineffective.is_empty()) {
                match save_learned(&learned_path, &spec.name, learned) {
                    Ok(saved) => learned_saved = Some(saved),
                    Err(e) => tracing::warn!("{e}"),
                }
            }
            let Verdict::Rescale(decision) = verdict else {
                continue;
            };
            if decision.parallelism == engine.parallelism {
                continue;
            }
            let reason = rescale_reason(&decision);
            let change =
                progress::format_change(&engine.parallelism, &decision.parallelism, &self.order);
            if !self.opts.autoscale {
                // Report the decision once per change of the recommendation; run on as is.
                if self.recommendations.last().map(|r| &r.to) != Some(&decision.parallelism) {
                    print(&progress::rescale_recommended_line(now_s, &change, &reason));
                    self.recommendations.push(RescaleRecord {
                        at_s: now_s,
                        from: engine.parallelism.clone(),
                        to: decision.parallelism.clone(),
                        reason,
                        downtime_s: 0.0,
                        outcome: "recommended".into(),
                        error: None,
                        savepoint: None,
                    });
                }
                continue;
            }
            if let Some(left) = backoff.wait_at(now_s) {
                if !backoff_said {
                    backoff_said = true;
                    print(&progress::rescale_backoff_hold_line(
                        now_s,
                        &change,
                        backoff.failures_of(&decision.parallelism),
                        backoff.failures(),
                        left,
                    ));
                }
                continue;
            }
            print(&progress::rescale_started_line(now_s, &change, &reason));
            let from = engine.parallelism.clone();
            let outcome = match self
                .executor
                .rescale(engine.clone(), &decision.parallelism)
                .await
            {
                Ok(o) => o,
                Err(ExecutorError::Unrecoverable { savepoint, error }) => {
                    failure = Some(format!(
                        "rescale at t={now_s:.0}s left no engine running: {error}{}",
                        savepoint
                            .map(|s| format!(" (last savepoint: {})", s.path))
                            .unwrap_or_default()
                    ));
                    self.failed_rescales.push(RescaleRecord {
                        at_s: now_s,
                        from,
                        to: decision.parallelism.clone(),
                        reason,
                        downtime_s: started.elapsed().as_secs_f64() - now_s,
                        outcome: "unrecoverable".into(),
                        error: failure.clone(),
                        savepoint: None,
                    });
                    // Nothing left to stop; write the report with what we have.
                    return self
                        .finish(
                            None,
                            started,
                            failure,
                            None,
                            &initial,
                            &from_last(&self.rows, &initial),
                        )
                        .await;
                }
                Err(ExecutorError::Runtime(e)) => {
                    failure = Some(format!("rescale at t={now_s:.0}s failed: {e}"));
                    return self
                        .finish(
                            None,
                            started,
                            failure,
                            None,
                            &initial,
                            &from_last(&self.rows, &initial),
                        )
                        .await;
                }
            };
            let done_s = started.elapsed().as_secs_f64();
            let downtime_s = outcome.downtime_s();
            let mut record = RescaleRecord {
                at_s: now_s,
                from,
                to: decision.parallelism.clone(),
                reason,
                downtime_s,
                outcome: String::new(),
                error: None,
                savepoint: None,
            };
            match &outcome {
                RescaleOutcome::Rescaled { savepoint, .. } => {
                    backoff.succeeded();
                    print(&progress::rescale_done_line(done_s, &change, downtime_s));
                    autoscaler.observe_rescale_downtime(downtime_s);
                    record.outcome = "rescaled".into();
                    record.savepoint = Some(savepoint.path.clone());
                    self.rescales.push(record);
                    self.prune_savepoints(&savepoint.path, warn);
                }
                RescaleOutcome::SavepointFailed { error, .. } => {
                    print(&progress::rescale_failed_line(
                        done_s,
                        &change,
                        "savepoint",
                        error,
                        downtime_s,
                    ));
                    record.outcome = "savepoint_failed".into();
                    record.error = Some(error.clone());
                    self.failed_rescales.push(record);
                }
                RescaleOutcome::RestoreFailed {
                    savepoint, error, ..
                } => {
                    print(&progress::rescale_failed_line(
                        done_s, &change, "restore", error, downtime_s,
                    ));
                    record.outcome = "restore_failed".into();
                    record.error = Some(error.clone());
                    record.savepoint = Some(savepoint.path.clone());
                    self.failed_rescales.push(record);
                    self.prune_savepoints(&savepoint.path, warn);
                }
            }
            if !matches!(outcome, RescaleOutcome::Rescaled { .. }) {
                let wait = backoff.failed(done_s, &decision.parallelism);
                backoff_said = false;
                print(&progress::rescale_backoff_line(
                    done_s,
                    &change,
                    backoff.failures(),
                    wait,
                ));
            }
            engine = outcome.engine().clone();
            // A new engine starts without shedding; its counter starts at 0.
            self.shed_before += self.shed_now;
            self.shed_now = 0;
            shed_applied = 0.0;
            window.clear();
            engine_changed = true;
            autoscaler.restarted(done_s);
        }

        let final_parallelism = engine.parallelism.clone();
        if shed_applied > 0.0
            && let Ok(n) = get_shed(&self.client, &engine.base_url).await
        {
            self.shed_now = n;
        }
        if failure.is_some() {
            let _ = self.executor.runtime().kill(&engine).await;
            return self
                .finish(None, started, failure, None, &initial, &final_parallelism)
                .await;
        }
        // A bounded source may have finished the job already: nothing to stop, read the totals.
        // Once every source reached its record count the engine injects no barrier (the final
        // savepoint would fail and the records in flight go unaccounted): wait for the graph
        // to drain instead (at most DRAIN_GRACE; a signal ends the wait).
        let total_count = total_source_count(&self.job.spec);
        let wait_until = Instant::now() + DRAIN_GRACE;
        let mut said_waiting = false;
        let finished = loop {
            let Ok(job) = self.executor.runtime().job_status(&engine).await else {
                break None;
            };
            if job.state == "finished" {
                break Some(job);
            }
            let draining = job.state == "running"
                && total_count.is_some_and(|total| job.records_emitted >= total);
            if !draining || Instant::now() >= wait_until {
                break None;
            }
            if !said_waiting {
                said_waiting = true;
                print(
                    "every source reached its record count: waiting for the job to finish (no savepoint can be taken now)",
                );
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                sig = signals.recv() => {
                    if self.interrupted.is_none() {
                        self.interrupted = Some(sig);
                        print(&format!("interrupted ({}): stopping with a draining savepoint", sig.name()));
                    }
                    break None;
                }
            }
        };
        if let Some(job) = finished {
            if said_waiting {
                print(&progress::job_finished_line(
                    started.elapsed().as_secs_f64(),
                ));
            }
            let _ = self.executor.runtime().kill(&engine).await;
            let totals = RecordTotals {
                records_emitted: job.records_emitted,
                records_accounted: job.records_accounted,
                records_filtered: job.records_filtered,
            };
            return self
                .finish(
                    Some(totals),
                    started,
                    None,
                    None,
                    &initial,
                    &final_parallelism,
                )
                .await;
        }
        // After a signal the `interrupted (…)` line already said so.
        if self.interrupted.is_none() {
            print("stopping with a draining savepoint…");
        }
        // The final savepoint's directory is the engine's to name: the ones there before the
        // stop tell it apart if a second signal kills the engine before it answers (`None`
        // when they cannot be listed: then no savepoint can be told to be the final one).
        let before: Option<Vec<PathBuf>> =
            savepoint_history::completed(&self.savepoints_dir, &self.job.spec.name).ok();
        let stopped = tokio::select! {
            r = self.executor.stop(&engine, true) => r,
            sig = signals.recv() => {
                print(&format!(
                    "interrupted again ({}): killing the engine during its final savepoint",
                    sig.name()
                ));
                self.interrupted = Some(sig);
                let _ = self.executor.runtime().kill(&engine).await;
                // As Flink's stop-with-savepoint: a savepoint that completed is a savepoint,
                // whether or not its stop was acknowledged.
                let (final_savepoint, failure) = match self.completed_after_kill(before.as_deref()).await {
                    FinalAfterKill::Completed(path) => {
                        print(&format!(
                            "final savepoint {path} had completed before the engine was killed (verified): restore from it"
                        ));
                        let failure = format!(
                            "interrupted twice ({}): the engine was killed after its final savepoint {path} completed; the record totals were not read",
                            sig.name()
                        );
                        (Some(path), failure)
                    }
                    FinalAfterKill::Invalid(why) => (None, format!(
                        "interrupted twice ({}): the engine was killed during the final savepoint, which is not usable: {why}{}",
                        sig.name(),
                        restore_hint(before.as_deref())
                    )),
                    FinalAfterKill::None => (None, format!(
                        "interrupted twice ({}): the engine was killed during the final savepoint, before it completed{}",
                        sig.name(),
                        restore_hint(before.as_deref())
                    )),
                };
                for abandoned in savepoint_history::remove_abandoned_in_progress(&self.savepoints_dir) {
                    print(&format!(
                        "removed {}: the killed engine's unfinished savepoint",
                        abandoned.display()
                    ));
                }
                return self
                    .finish(None, started, Some(failure), final_savepoint, &initial, &final_parallelism)
                    .await;
            }
        };
        match stopped {
            Ok(stop) => {
                let totals = stop.final_job.as_ref().map(|j| RecordTotals {
                    records_emitted: j.records_emitted,
                    records_accounted: j.records_accounted,
                    records_filtered: j.records_filtered,
                });
                if totals.is_none() {
                    failure =
                        Some("the engine exited before its final totals could be read".into());
                }
                self.prune_savepoints(&stop.savepoint.path, warn);
                if self.savepoints_removed > 0 {
                    print(&format!(
                        "savepoints: {} older one(s) of job `{}` removed from {}, the newest {} kept (--keep-savepoints)",
                        self.savepoints_removed,
                        self.job.spec.name,
                        self.savepoints_dir.display(),
                        self.opts.keep_savepoints
                    ));
                }
                self.finish(
                    totals,
                    started,
                    failure,
                    Some(stop.savepoint.path),
                    &initial,
                    &final_parallelism,
                )
                .await
            }
            Err(e) => {
                let _ = self.executor.runtime().kill(&engine).await;
                failure = Some(format!("final stop-with-savepoint failed: {e}"));
                self.finish(None, started, failure, None, &initial, &final_parallelism)
                    .await
            }
        }
    }

    /// After the engine was killed during its final stop: the savepoint it was taking, if it
    /// completed. Candidates are the job's completed savepoints
    /// ([`savepoint_history::completed`], newest first) that were not there before the stop
    /// (`before`; none when that could not be listed); each is verified in full as a restore
    /// would ([`streamscale_engine::savepoint::Savepoint::read`]: metadata, fingerprint, every
    /// state file's size and CRC-32), so a directory with `_metadata.json` but damaged state
    /// does not count.
    async fn completed_after_kill(&self, before: Option<&[PathBuf]>) -> FinalAfterKill {
        let candidates: Vec<PathBuf> = match before {
            Some(before) => savepoint_history::completed(&self.savepoints_dir, &self.job.spec.name)
                .unwrap_or_default()
                .into_iter()
                .filter(|path| !before.contains(path))
                .collect(),
            None => Vec::new(),
        };
        let mut invalid = None;
        for dir in candidates {
            let spec = self.job.spec.clone();
            let checked = dir.clone();
            let read = tokio::task::spawn_blocking(move || {
                streamscale_engine::savepoint::Savepoint::read(&checked, &spec).map(drop)
            })
            .await;
            match read {
                Ok(Ok(())) => return FinalAfterKill::Completed(dir.display().to_string()),
                Ok(Err(e)) => invalid = invalid.or(Some(e.to_string())),
                Err(e) => invalid = invalid.or(Some(format!("{}: {e}", dir.display()))),
            }
        }
        invalid.map_or(FinalAfterKill::None, FinalAfterKill::Invalid)
    }

    /// Removes the savepoints beyond the newest [`RunOptions::keep_savepoints`], never
    /// `running_from` (the savepoint the running engine was restored from, or the final one).
    /// A failure is reported as a warning line: the run goes on, nothing else is removed.
    fn prune_savepoints(&mut self, running_from: &str, warn: &mut (dyn FnMut(&str) + Send)) {
        match savepoint_history::prune(
            &self.savepoints_dir,
            &self.job.spec.name,
            self.opts.keep_savepoints,
            Path::new(running_from),
        ) {
            Ok(removed) => self.savepoints_removed += removed.len(),
            Err(e) => warn(&format!("warning: {e}")),
        }
    }

    /// Writes the report files into `dir`, each whole or not at all, `summary.json` last (a
    /// directory with one holds a complete report). A chart that cannot be drawn is a warning.
    fn write_report(&self, dir: &Path, summary: &Summary) -> Result<(), ReportError> {
        report::write_timeline(dir, &self.rows, &self.order)?;
        report::write_service_rates(dir, &self.rows, &self.order)?;
        if let Err(e) = report::replace_file(&dir.join("timeline.png"), |tmp| {
            plot_timeline(tmp, &self.rows, &self.order, self.slo_s)
                .map_err(|e| std::io::Error::other(e.to_string()))
        }) {
            tracing::warn!("{e}");
        }
        report::write_summary(dir, summary)?;
        Ok(())
    }

    async fn finish(
        &mut self,
        totals: Option<RecordTotals>,
        started: Instant,
        failure: Option<String>,
        final_savepoint: Option<String>,
        initial: &BTreeMap<String, u32>,
        final_parallelism: &BTreeMap<String, u32>,
    ) -> Result<RunOutcome, RunError> {
        let dir = &self.opts.report_dir;
        let duration_s = started.elapsed().as_secs_f64();
        if failure.is_none() {
            // From the last scrape to the end of the final stop the engine still held its
            // subtasks: counted in the cost (no latency was measured then).
            let last_s = self.rows.last().map_or(0.0, |r| r.t_s);
            self.accounting
                .add_cost(duration_s - last_s, final_parallelism.values().sum());
        }
        let summary = Summary {
            job: self.job.spec.name.clone(),
            job_file: self.job.path.display().to_string(),
            duration_s,
            interval_s: self.opts.interval_s,
            slo_s: self.slo_s,
            latency_percentile: self.slo_percentile,
            records_emitted: totals.map(|t| t.records_emitted),
            records_accounted: totals.map(|t| t.records_accounted),
            records_filtered: totals.map(|t| t.records_filtered),
            records_lost: totals.map(|t| t.lost()),
            records_shed: self.shed_before + self.shed_now,
            parallelism_seconds: self.accounting.parallelism_seconds,
            mean_parallelism: self.accounting.mean_parallelism(),
            slo_violation_seconds: self.accounting.slo_violation_seconds,
            no_output_seconds: self.accounting.no_output_seconds,
            source_backlog_at_end: self.rows.last().map_or(0.0, |r| r.backlog),
            initial_parallelism: initial.clone(),
            final_parallelism: final_parallelism.clone(),
            downtime_s: self
                .rescales
                .iter()
                .chain(&self.failed_rescales)
                .map(|r| r.downtime_s)
                .fold(0.0, |a, b| a + b),
            rescales: self.rescales.clone(),
            failed_rescales: self.failed_rescales.clone(),
            recommendations: self.recommendations.clone(),
            final_savepoint,
            failure,
            interrupted: self.interrupted.is_some(),
        };
        if let Err(source) = self.write_report(dir, &summary) {
            // Do not let the report's error hide why the run failed.
            return Err(match summary.failure {
                Some(failure) => RunError::ReportAfterFailure { failure, source },
                None => source.into(),
            });
        }
        Ok(RunOutcome {
            summary,
            report_dir: dir.clone(),
            interrupted: self.interrupted,
        })
    }
}

/// What became of the final savepoint when a second signal killed the engine during it.
enum FinalAfterKill {
    /// It completed and verifies: its directory.
    Completed(String),
    /// A new savepoint directory is there but does not verify: why.
    Invalid(String),
    /// No new savepoint directory (the engine writes into a hidden temporary one and renames
    /// it into place only once complete).
    None,
}

/// The sum of the sources' record `count`s when every source has one (the job then finishes
/// on its own once its sources emitted that many records in all), else `None`.
fn total_source_count(spec: &JobSpec) -> Option<u64> {
    spec.operators
        .iter()
        .filter_map(|o| match &o.kind {
            OperatorKind::Source { count, .. } => Some(*count),
            _ => None,
        })
        .try_fold(0u64, |sum, count| count.map(|c| sum.saturating_add(c)))
}

/// The signals that stop a run cleanly (with a draining savepoint): SIGINT, SIGTERM and SIGHUP
/// on Unix, Ctrl-C elsewhere. The engine runs in its own process group, so only the controller
/// receives a terminal's Ctrl-C.
struct Signals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
async fn next_signal(s: &mut Option<tokio::signal::unix::Signal>) {
    if let Some(s) = s
        && s.recv().await.is_some()
    {
        return;
    }
    std::future::pending::<()>().await;
}

impl Signals {
    fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Signals {
                int: signal(SignalKind::interrupt()).ok(),
                term: signal(SignalKind::terminate()).ok(),
                hup: signal(SignalKind::hangup()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Waits for the next signal.
    async fn recv(&mut self) -> Interrupt {
        #[cfg(unix)]
        {
            tokio::select! {
                () = next_signal(&mut self.int) => Interrupt::Int,
                () = next_signal(&mut self.term) => Interrupt::Term,
                () = next_signal(&mut self.hup) => Interrupt::Hup,
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            Interrupt::Int
        }
    }
}

/// `POST BASE/v1/shed {"share": S}` (see `streamscale_engine::shed`); returns the engine's
/// records shed so far.
async fn set_shed(
    client: &reqwest::Client,
    base: &str,
    token: Option<&str>,
    share: f64,
) -> Result<u64, String> {
    let mut request = client.post(format!("{base}/v1/shed"));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let resp = request
        .json(&serde_json::json!({ "share": share }))
        .send()
        .await
        .map_err(|e| format!("{base}/v1/shed: {e}"))?;
    shed_total(resp, base).await
}

/// `GET BASE/v1/shed`: the engine's records shed so far.
async fn get_shed(client: &reqwest::Client, base: &str) -> Result<u64, String> {
    let resp = client
        .get(format!("{base}/v1/shed"))
        .send()
        .await
        .map_err(|e| format!("{base}/v1/shed: {e}"))?;
    shed_total(resp, base).await
}

async fn shed_total(resp: reqwest::Response, base: &str) -> Result<u64, String> {
    let status = resp.status();
    let text = resp
        .text()
        .await
        .map_err(|e| format!("{base}/v1/shed: {e}"))?;
    if !status.is_success() {
        return Err(format!("{base}/v1/shed: {status}: {text}"));
    }
    serde_json::from_str::<streamscale_engine::shed::ShedStatus>(&text)
        .map(|s| s.records_shed)
        .map_err(|e| format!("{base}/v1/shed: {e}"))
}

/// The directory in the report directory where the engines write savepoints.
pub const SAVEPOINTS_DIR: &str = "savepoints";

/// Files of a run's report that the next run in the same directory replaces, `summary.json`
/// first: it is written last, so a `summary.json` marks a complete report.
pub const REPORT_FILES: [&str; 5] = [
    "summary.json",
    "timeline.csv",
    "timeline.png",
    "service_rates.csv",
    "job.yaml",
];

/// The warning for a report directory that holds an earlier run's report (any of
/// [`REPORT_FILES`]), `None` for a new or empty one. A reused directory is not refused: it is
/// also where the forecast's history ([`HISTORY_FILE`]) is kept between runs of a job.
pub fn earlier_report(dir: &Path) -> Option<String> {
    let found: Vec<&str> = REPORT_FILES
        .iter()
        .copied()
        .filter(|f| dir.join(f).is_file())
        .collect();
    (!found.is_empty()).then(|| {
        format!(
            "warning: {} holds the report of an earlier run ({}); this run replaces it and its engine logs once its engine has started (savepoints stay, the newest --keep-savepoints; this job's {HISTORY_FILE} and {LEARNED_FILE} are read and kept, another job's are set aside). Use --report DIR to keep it.",
            dir.display(),
            found.join(", ")
        )
    })
}

fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn from_last(rows: &[IntervalStats], initial: &BTreeMap<String, u32>) -> BTreeMap<String, u32> {
    rows.last()
        .map_or_else(|| initial.clone(), |r| r.parallelism.clone())
}

/// One line explaining a decision: the planner's reason for every operator whose parallelism
/// changes (`enrich: ...`), then the sources' rates (every source's reason, at most three),
/// else the first job-wide reason; the bottleneck when no operator changes.
pub fn rescale_reason(decision: &crate::model::Decision) -> String {
    let mut parts: Vec<String> = decision
        .operators
        .iter()
        .filter(|(name, plan)| decision.current.get(*name) != Some(&plan.parallelism))
        .map(|(name, plan)| {
            if plan.reason.is_empty() {
                format!(
                    "{name}: {} → {}",
                    plan.current_parallelism, plan.parallelism
                )
            } else if plan.reason.starts_with(&**name) {
                plan.reason.clone()
            } else {
                format!("{name}: {}", plan.reason)
            }
        })
        .collect();
    if parts.is_empty()
        && let Some(b) = &decision.bottleneck
    {
        parts.push(b.clone());
    }
    // The sources' rates (one reason each, first in the list), so that the source whose rate
    // moved is named whichever it is; at most three, else the job-wide first reason.
    let sources: Vec<&String> = decision
        .reasons
        .iter()
        .take_while(|r| r.starts_with("source "))
        .collect();
    match sources.len() {
        0 => parts.extend(decision.reasons.iter().take(1).cloned()),
        1..=3 => parts.extend(sources.into_iter().cloned()),
        n => {
            parts.extend(sources.iter().take(3).map(|r| (*r).clone()));
            parts.push(format!("and {} more sources", n - 3));
        }
    }
    // An unattainable SLO (and what best effort does about it) explains the latency the
    // rescale leaves.
    if let Some(r) = crate::progress::unattainable_reason(decision)
        && !parts.iter().any(|p| p == r)
    {
        parts.push(r.to_string());
    }
    if parts.is_empty() {
        "planner decision".to_string()
    } else {
        parts.join("; ")
    }
}

/// Checks that `url` is an absolute `http`/`https` URL.
///
/// # Errors
/// [`RunError::Option`] naming the URL and the reason.
pub fn check_metrics_url(url: &str) -> Result<(), RunError> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => Ok(()),
        Ok(u) => Err(RunError::Option(format!(
            "--metrics-url: `{url}` is not an http(s) URL with a host (scheme `{}`)",
            u.scheme()
        ))),
        Err(e) => Err(RunError::Option(format!(
            "--metrics-url: `{url}` is not a URL: {e} (expected e.g. http://127.0.0.1:40123/metrics)"
        ))),
    }
}

/// Checks that the engine at `metrics_url` runs the job of `job`: every operator of the job
/// must appear in its metrics.
///
/// # Errors
/// [`RunError::Option`] naming the URL, the job file and the operators missing from the
/// engine's metrics, with the operators it does report.
fn check_same_job(
    spec: &JobSpec,
    job: &Path,
    metrics_url: &str,
    running: &BTreeMap<String, u32>,
) -> Result<(), RunError> {
    let missing: Vec<&str> = spec
        .operators
        .iter()
        .map(|o| o.name.as_str())
        .filter(|name| !running.contains_key(*name))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let reported: Vec<&str> = running.keys().map(String::as_str).collect();
    Err(RunError::Option(format!(
        "--metrics-url {metrics_url}: the engine there does not run the job of {}: its operators {} are not in the engine's metrics (it reports {})",
        job.display(),
        missing.join(", "),
        if reported.is_empty() {
            "no operators".to_string()
        } else {
            reported.join(", ")
        }
    )))
}

/// What `streamscale plan` shows: the guarded decision (printed as JSON) and notes for the
/// user (printed on stderr; each is also one of the decision's reasons).
#[derive(Debug, Clone)]
pub struct PlanOutcome {
    /// The decision after the guards (see [`guarded_plan`]).
    pub decision: crate::model::Decision,
    /// Lines for the user: what the guards did, figures the plan had to correct.
    pub notes: Vec<String>,
}

/// `streamscale plan`: scrapes `metrics_url` twice, about `gap_s` seconds apart (each sample
/// stamped with the time its page arrived, so the measured gap is what the rates divide by),
/// and plans the job from those two samples through the guards ([`guarded_plan`]).
///
/// # Errors
/// [`RunError`] when the job is invalid, a scrape fails or the planner rejects the window.
pub async fn plan_once(job: &Path, metrics_url: &str, gap_s: f64) -> Result<PlanOutcome, RunError> {
    scrape_interval(gap_s)?;
    let spec = JobSpec::from_file(&resolve_job_path(job))?;
    check_metrics_url(metrics_url)?;
    let client = http_client()?;
    let started = Instant::now();
    let clock = || started.elapsed().as_secs_f64();
    let first = scrape_stamped(&client, metrics_url, &clock).await?;
    tokio::time::sleep(Duration::from_secs_f64(gap_s)).await;
    let mut second = scrape_stamped(&client, metrics_url, &clock).await?;
    // An operator runs the most subtasks either scrape shows: one missing from a scrape makes
    // that sample incomplete (the planner refuses it), never a smaller operator.
    let mut running = first.parallelism();
    for (op, p) in second.parallelism() {
        let known = running.entry(op).or_insert(p);
        *known = (*known).max(p);
    }
    let mut first = first;
    first.sample.mark_missing(&running);
    second.sample.mark_missing(&running);
    check_same_job(&spec, job, metrics_url, &running)?;
    let spec = spec.with_parallelism(&running);
    guarded_plan(&spec, &[first.sample, second.sample])
}

/// Largest busy share (Δbusy seconds per subtask over the measured Δt) read as measurement
/// noise; above it the counters and the measured time disagree, and `plan` says so.
const BUSY_SHARE_TOLERANCE: f64 = 1.02;

/// Plans `spec` from the two samples of `streamscale plan` and applies the guards of
/// `streamscale run` ([`Autoscaler::decide`]: no scale-down while a source has a backlog or
/// the metrics are incomplete, change thresholds, the rescale's cost) to this one look: no
/// stabilization wait (the engine has been running) and no scale-down delay (one look cannot
/// wait; `run` would want the scale-down for its delay first). A hold keeps the current
/// parallelism and names the unguarded plan. Operators whose busy share exceeds 1 (the plan
/// reads it as 1) are named.
///
/// # Errors
/// [`RunError::Model`] when the planner rejects the window.
pub fn guarded_plan(spec: &JobSpec, window: &[MetricSample]) -> Result<PlanOutcome, RunError> {
    // The unguarded plan first: a window the planner rejects is an error, as it always was.
    let unguarded = crate::model::plan(spec, window, &crate::model::PlannerSettings::default())?;
    let mut notes = busy_share_notes(window);
    let mut autoscaler = Autoscaler::new(GuardSettings {
        min_samples: 2,
        window_seconds: 0.0,
        stabilization_seconds: 0.0,
        scale_down_delay_seconds: 0.0,
        ..GuardSettings::default()
    });
    let now_s = window.last().map_or(0.0, |s| s.at_seconds);
    let mut decision = match autoscaler.decide(now_s, window, spec) {
        Verdict::Rescale(d) => {
            notes.push(
                "guards applied as in `streamscale run` (backlog, change thresholds, rescale cost); a scale-down is shown without run's scale-down delay".to_string(),
            );
            d
        }
        Verdict::Hold {
            reason,
            recommendation,
        } => {
            let mut d = recommendation.unwrap_or_else(|| unguarded.clone());
            let wanted = progress::format_change(
                &current_map(&d),
                &unguarded.parallelism,
                &spec
                    .operators
                    .iter()
                    .map(|o| o.name.clone())
                    .collect::<Vec<_>>(),
            );
            d.parallelism = current_map(&d);
            notes.push(if unguarded.parallelism == d.parallelism {
                format!("guards applied: the plan keeps the current parallelism ({reason})")
            } else {
                format!(
                    "guards hold the current parallelism: {reason}; the unguarded plan was {wanted}"
                )
            });
            d
        }
    };
    decision.reasons.extend(notes.iter().cloned());
    Ok(PlanOutcome { decision, notes })
}

/// The running parallelism of a decision, keyed by plain strings like its plan.
fn current_map(d: &crate::model::Decision) -> BTreeMap<String, u32> {
    d.current.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// A note per operator whose subtasks were busy more than the measured time between the
/// window's first and last samples allows (busy share above [`BUSY_SHARE_TOLERANCE`]): the
/// planner reads the share as 1.
fn busy_share_notes(window: &[MetricSample]) -> Vec<String> {
    let (Some(first), Some(last)) = (window.first(), window.last()) else {
        return Vec::new();
    };
    let dt = last.at_seconds - first.at_seconds;
    if dt.is_nan() || dt <= 0.0 {
        return Vec::new();
    }
    let mut notes = Vec::new();
    for (op, subs) in &last.operators {
        let Some(before) = first.operators.get(op).filter(|b| b.len() == subs.len()) else {
            continue;
        };
        let busy: f64 = before
            .iter()
            .zip(subs)
            .map(|(a, b)| b.busy_seconds - a.busy_seconds)
            .sum();
        let share = busy / (subs.len() as f64 * dt);
        if share > BUSY_SHARE_TOLERANCE {
            notes.push(format!(
                "warning: {op} was busy {share:.2} of the {dt:.2} s measured between the scrapes (more than all of it): its counters and the measured time disagree; planned as fully busy (1.00)"
            ));
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = "name: t\noperators:\n  - name: src\n    kind: source\n    rate:\n      trace:\n        file: trace.csv\n        speedup: 10\n        startSeconds: 100\n        endSeconds: 700\n  - { name: work, kind: map, cpu: 10 }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: work }\n  - { from: work, to: sink }\n";

    fn setup(job: &str) -> (tempfile::TempDir, RunOptions) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("trace.csv"),
            "t_seconds,rate\n0,1\n300,2\n600,3\n900,4\n",
        )
        .expect("trace");
        std::fs::write(dir.path().join("other.csv"), "t_seconds,rate\n0,5\n60,6\n").expect("trace");
        std::fs::write(dir.path().join("job.yaml"), job).expect("job");
        let opts = RunOptions {
            job: dir.path().join("job.yaml"),
            report_dir: dir.path().join("report"),
            ..RunOptions::default()
        };
        (dir, opts)
    }

    const PLAN_CHAIN: &str = "name: chain\noperators:\n  - { name: src, kind: source, rate: { constant: 100 } }\n  - { name: map, kind: map, parallelism: 8 }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: map }\n  - { from: map, to: sink }\n";

    /// `plan`'s two samples, 2 s apart: map (μ = 100 rec/s per subtask) at p = `map_p` taking
    /// `input` rec/s, the source at γ = 200 with `backlog` records.
    fn plan_window(map_p: u32, input: f64, backlog: f64) -> Vec<MetricSample> {
        use crate::model::testutil::{Synth, window};
        window(
            &[
                Synth::source("src", 1, 200.0, backlog),
                Synth::op("map", map_p, input, 100.0, 1.0),
                Synth::op("sink", 1, input, 10_000.0, 0.0),
            ],
            &[0.0, 2.0],
        )
    }

    /// Issue 22, case 10: `plan` during a catch-up (1000 records due at the source, 5 s of
    /// arrivals) recommended scaling map down 8 → 4, which `run`'s guards never do while a source has a
    /// backlog. It applies the guards now and says what they held back.
    #[test]
    fn plan_applies_the_guards_during_a_catch_up() {
        let spec = crate::model::testutil::job(PLAN_CHAIN);
        let spec = spec.with_parallelism(&[("map".to_string(), 8)].into_iter().collect());
        let out = guarded_plan(&spec, &plan_window(8, 200.0, 1000.0)).expect("plans");
        let d = &out.decision;
        assert_eq!(d.parallelism["map"], 8, "{:?}", d.reasons);
        let said = out.notes.join("\n");
        for what in ["guards", "backlog", "map 8→"] {
            assert!(said.contains(what), "{what}: {said}");
        }
        assert!(
            d.reasons.iter().any(|r| r.contains("guards")),
            "{:?}",
            d.reasons
        );
        // Without a backlog the scale-down is shown (no delay in one look), guards named.
        let out = guarded_plan(&spec, &plan_window(8, 200.0, 0.0)).expect("plans");
        assert!(
            out.decision.parallelism["map"] < 8,
            "{:?}",
            out.decision.reasons
        );
        assert!(
            out.notes.iter().any(|n| n.contains("guards applied")),
            "{:?}",
            out.notes
        );
    }

    /// Issue 22, case 2: a busy share of 1.25 (map's subtasks busy 2.5 s in the 2 s measured
    /// between the scrapes) was clamped to 1 without a word.
    #[test]
    fn plan_names_a_busy_share_above_one() {
        let spec = crate::model::testutil::job(PLAN_CHAIN);
        let spec = spec.with_parallelism(&[("map".to_string(), 2)].into_iter().collect());
        let out = guarded_plan(&spec, &plan_window(2, 250.0, 0.0)).expect("plans");
        let said = out.notes.join("\n");
        for what in ["map", "1.25", "2.00 s", "1.00"] {
            assert!(said.contains(what), "{what}: {said}");
        }
        assert!(!said.contains("sink was busy"), "{said}");
        // A consistent window says nothing of the kind.
        let out = guarded_plan(&spec, &plan_window(2, 150.0, 0.0)).expect("plans");
        assert!(
            !out.notes.iter().any(|n| n.contains("busy")),
            "{:?}",
            out.notes
        );
    }

    #[test]
    fn effective_job_keeps_the_trace_absolute_and_takes_the_duration_from_it() {
        let (dir, opts) = setup(JOB);
        let job = prepare_job(&opts).expect("prepares");
        assert_eq!(job.path, dir.path().join("report").join("job.yaml"));
        // Nothing is written before the engine has started.
        assert!(!dir.path().join("report").exists());
        assert_eq!(
            JobSpec::from_yaml(&job.yaml).expect("effective job"),
            job.spec
        );
        // (700 - 100) / 10
        assert!((job.duration_s - 60.0).abs() < 1e-9, "{}", job.duration_s);
        assert_eq!(job.trace_start(), 100.0);
        assert_eq!(job.trace_time(6.0), Some(160.0));
        let OperatorKind::Source {
            rate: RateSpec::Trace(t),
            ..
        } = &job.spec.operators[0].kind
        else {
            panic!("trace source expected");
        };
        assert!(t.file.is_absolute(), "{}", t.file.display());
        assert_eq!(job.order(), vec!["src", "work", "sink"]);
        assert_eq!(job.sources(), vec!["src"]);
    }

    #[test]
    fn overrides_apply_to_the_first_source() {
        let (dir, mut opts) = setup(JOB);
        opts.trace = Some(dir.path().join("other.csv"));
        opts.speedup = Some(20.0);
        opts.scale = Some(3.0);
        opts.slo_s = Some(0.5);
        opts.duration_s = Some(12.0);
        let job = prepare_job(&opts).expect("prepares");
        let OperatorKind::Source {
            rate: RateSpec::Trace(t),
            ..
        } = &job.spec.operators[0].kind
        else {
            panic!("trace source expected");
        };
        assert_eq!(t.file, dir.path().join("other.csv"));
        assert_eq!(t.speedup, 20.0);
        assert_eq!(t.scale, 3.0);
        assert_eq!(job.spec.autoscaler.latency_slo_seconds, 0.5);
        assert_eq!(job.duration_s, 12.0);
    }

    #[test]
    fn a_constant_source_gets_a_trace_only_with_trace() {
        let constant = "name: c\noperators:\n  - { name: src, kind: source, rate: { constant: 5 } }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: sink }\n";
        let (dir, mut opts) = setup(constant);
        let job = prepare_job(&opts).expect("prepares");
        assert_eq!(job.duration_s, DEFAULT_DURATION_S);
        assert_eq!(job.trace_time(1.0), None);
        opts.scale = Some(2.0);
        let err = prepare_job(&opts).expect_err("no trace to scale");
        assert!(err.to_string().starts_with("--scale:"), "{err}");
        opts.trace = Some(dir.path().join("other.csv"));
        let job = prepare_job(&opts).expect("trace given");
        // Trace rows 0 and 60 with resolution 60: ends at 120 trace-seconds, speedup 1.
        assert!((job.duration_s - 120.0).abs() < 1e-9, "{}", job.duration_s);
    }

    #[test]
    fn bad_options_name_the_flag() {
        let (dir, mut opts) = setup(JOB);
        opts.scale = Some(0.0);
        let err = prepare_job(&opts).expect_err("scale 0");
        assert!(err.to_string().starts_with("--scale: must be > 0"), "{err}");
        opts.scale = Some(-1.0);
        assert!(prepare_job(&opts).is_err());
        opts.scale = None;
        opts.interval_s = 0.0;
        assert!(
            prepare_job(&opts)
                .expect_err("interval")
                .to_string()
                .starts_with("--interval")
        );
        opts.interval_s = 0.05;
        let err = prepare_job(&opts).expect_err("interval under two flushes");
        assert!(
            err.to_string()
                .starts_with("--interval: must be at least 0.2 s"),
            "{err}"
        );
        opts.interval_s = MIN_INTERVAL_S;
        assert!(check_options(&opts).is_ok());
        opts.speedup = Some(f64::INFINITY);
        let err = prepare_job(&opts).expect_err("infinite speedup");
        assert!(
            err.to_string().contains("must be > 0 and finite (got inf)"),
            "{err}"
        );
        opts.speedup = None;
        opts.interval_s = 1.0;
        opts.trace = Some(dir.path().join("missing.csv"));
        let err = prepare_job(&opts).expect_err("missing trace");
        let msg = err.to_string();
        assert!(
            msg.starts_with("--trace:") && msg.contains("missing.csv"),
            "{msg}"
        );
        assert!(msg.contains("does not exist"), "{msg}");
        opts.trace = Some(dir.path().to_path_buf());
        let msg = prepare_job(&opts).expect_err("a directory").to_string();
        assert!(
            msg.starts_with("--trace:") && msg.contains("is a directory"),
            "{msg}"
        );
    }

    #[test]
    fn another_trace_replaces_the_jobs_window() {
        let (dir, mut opts) = setup(JOB);
        opts.trace = Some(dir.path().join("other.csv"));
        let job = prepare_job(&opts).expect("prepares");
        // The job's window (100 .. 700) belongs to its own trace: other.csv is replayed whole,
        // 0 .. 120 trace-seconds at the job's speedup 10.
        assert_eq!(job.trace_start(), 0.0);
        assert!((job.duration_s - 12.0).abs() < 1e-9, "{}", job.duration_s);
        assert!(job.rate.as_ref().is_some_and(|r| r.rate(0.0) == 5.0));
    }

    #[test]
    fn a_window_outside_the_trace_is_an_error() {
        // The trace covers 1000 .. 1120 trace-seconds; the job's window is 100 .. 700.
        let (dir, opts) = setup(JOB);
        std::fs::write(
            dir.path().join("trace.csv"),
            "t_seconds,rate\n1000,5\n1060,6\n",
        )
        .expect("trace");
        let err = prepare_job(&opts).expect_err("window before the trace starts");
        let msg = err.to_string();
        assert!(
            msg.contains("startSeconds 100") && msg.contains("outside the trace"),
            "{msg}"
        );
        assert!(matches!(err, RunError::Option(_)), "{err:?}");
        // Past the trace's end: the job file's own validation names the field.
        let (_dir, opts) = setup(
            &JOB.replace("startSeconds: 100", "startSeconds: 5000")
                .replace("endSeconds: 700", "endSeconds: 6000"),
        );
        let err = prepare_job(&opts).expect_err("window after the trace's end");
        assert!(err.to_string().contains("startSeconds: 5000"), "{err}");
    }

    #[test]
    fn negative_delays_and_bad_percentiles_are_rejected() {
        let (_dir, mut opts) = setup(JOB);
        opts.stabilization_s = -5.0;
        let err = prepare_job(&opts).expect_err("negative stabilization");
        assert!(err.to_string().starts_with("--stabilization:"), "{err}");
        opts.stabilization_s = 0.0;
        opts.scale_down_delay_s = -1.0;
        let err = prepare_job(&opts).expect_err("negative delay");
        assert!(err.to_string().starts_with("--scale-down-delay:"), "{err}");
        opts.scale_down_delay_s = 0.0;
        prepare_job(&opts).expect("zero delays are fine");
        for p in [0.0, 1.0, 99.0, f64::NAN] {
            opts.latency_percentile = Some(p);
            let err = prepare_job(&opts).expect_err("bad percentile");
            assert!(
                err.to_string().starts_with("--latency-percentile:"),
                "{err}"
            );
        }
        opts.latency_percentile = Some(0.95);
        prepare_job(&opts).expect("p95");
    }

    #[test]
    fn a_bad_metrics_url_names_the_url_and_the_reason() {
        let err = check_metrics_url("notaurl").expect_err("not a URL");
        let msg = err.to_string();
        assert!(
            msg.contains("`notaurl`") && msg.contains("relative URL without a base"),
            "{msg}"
        );
        let err = check_metrics_url("ftp://host/metrics").expect_err("scheme");
        assert!(err.to_string().contains("scheme `ftp`"), "{err}");
        check_metrics_url("http://127.0.0.1:40123/metrics").expect("fine");
    }

    #[test]
    fn interrupts_exit_like_a_shell() {
        assert_eq!(Interrupt::Int.exit_code(), 130);
        assert_eq!(Interrupt::Term.exit_code(), 143);
        assert_eq!(Interrupt::Hup.exit_code(), 129);
    }

    #[test]
    fn relative_paths_are_relative_to_the_job_file() {
        // The sink's output, like the trace, is relative to the job file, not to the working
        // directory nor to the report directory the effective job.yaml is written to.
        let job = JOB.replace(
            "{ name: sink, kind: sink }",
            "{ name: sink, kind: sink, output: out/results.csv }",
        );
        let (dir, opts) = setup(&job);
        let prepared = prepare_job(&opts).expect("prepares");
        let output = prepared.spec.operators.iter().find_map(|o| match &o.kind {
            OperatorKind::Sink { output } => output.clone(),
            _ => None,
        });
        assert_eq!(output, Some(dir.path().join("out/results.csv")));
        let trace = prepared.spec.operators.iter().find_map(|o| match &o.kind {
            OperatorKind::Source {
                rate: RateSpec::Trace(t),
                ..
            } => Some(t.file.clone()),
            _ => None,
        });
        assert_eq!(trace, Some(dir.path().join("trace.csv")));
    }

    #[test]
    fn a_trace_with_a_byte_order_mark_reads_like_one_without() {
        let (dir, opts) = setup(JOB);
        std::fs::write(
            dir.path().join("trace.csv"),
            "\u{feff}t_seconds,rate\n0,1\n300,2\n600,3\n900,4\n",
        )
        .expect("trace");
        let job = prepare_job(&opts).expect("a BOM is not part of the header");
        assert!((job.duration_s - 60.0).abs() < 1e-9, "{}", job.duration_s);
    }

    #[test]
    fn a_duplicate_key_is_named_without_parser_internals() {
        let (_dir, opts) = setup(&format!("name: u\n{JOB}"));
        let e = prepare_job(&opts).expect_err("duplicate key").to_string();
        assert!(e.contains("duplicate mapping key: name"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        assert!(e.contains("each key may appear only once"), "{e}");
        assert!(!e.contains("DuplicateKeyPolicy"), "{e}");
    }

    #[test]
    fn operators_are_listed_in_file_order_where_the_edges_allow() {
        let (_dir, opts) = setup(
            "name: two
operators:
  - { name: sink, kind: sink }
  - { name: a, kind: source, rate: { constant: 10 } }
  - { name: b, kind: source, rate: { constant: 10 } }
  - { name: u, kind: map }
edges:
  - { from: a, to: u }
  - { from: b, to: u }
  - { from: u, to: sink }
",
        );
        let job = prepare_job(&opts).expect("job");
        assert_eq!(job.order(), ["a", "b", "u", "sink"]);
    }

    #[test]
    fn a_rescale_reason_names_every_source_rate() {
        let decision = |sources: usize| -> crate::model::Decision {
            let mut reasons: Vec<String> = (0..sources)
                .map(|k| format!("source s{k}: arrival rate γ={k}00 rec/s"))
                .collect();
            reasons.push("latency: p99 bound 0.2 s".into());
            serde_json::from_value(serde_json::json!({
                "parallelism": { "m": 2 }, "current": { "m": 1 }, "operators": {},
                "sources": {}, "predictedLatencySeconds": 0.1, "criticalPath": [],
                "latencySloSeconds": 1.0, "targetUtilization": 0.7, "reasons": reasons,
            }))
            .expect("decision")
        };
        let two = rescale_reason(&decision(2));
        assert!(two.contains("source s0: arrival rate γ=000"), "{two}");
        assert!(two.contains("source s1: arrival rate γ=100"), "{two}");
        assert!(!two.contains("latency"), "{two}");
        let five = rescale_reason(&decision(5));
        assert!(five.contains("source s2"), "{five}");
        assert!(!five.contains("source s3"), "{five}");
        assert!(five.ends_with("and 2 more sources"), "{five}");
        assert_eq!(rescale_reason(&decision(0)), "latency: p99 bound 0.2 s");
    }

    #[test]
    fn a_report_entry_of_the_wrong_kind_is_refused_before_anything_starts() {
        let (_dir, opts) = setup(JOB);
        let report = &opts.report_dir;
        std::fs::create_dir_all(report.join("logs")).expect("logs");
        std::fs::write(report.join("summary.json"), "{}").expect("summary");
        check_report_dir(report).expect("an earlier report is replaced");
        std::fs::remove_file(report.join("summary.json")).expect("rm summary");
        std::fs::create_dir(report.join("summary.json")).expect("summary dir");
        let e = check_report_dir(report).expect_err("summary.json a directory");
        let e = e.to_string();
        assert!(e.contains("--report"), "{e}");
        assert!(
            e.contains(&report.join("summary.json").display().to_string()),
            "{e}"
        );
        assert!(e.contains("is a directory"), "{e}");
        std::fs::remove_dir(report.join("summary.json")).expect("rm summary dir");
        std::fs::remove_dir(report.join("logs")).expect("rm logs");
        std::fs::write(report.join("logs"), "").expect("logs file");
        let e = check_report_dir(report)
            .expect_err("logs a file")
            .to_string();
        assert!(e.contains("logs is not a directory"), "{e}");
    }

    #[test]
    fn a_report_directory_that_is_a_link_to_nothing_is_refused_before_anything_starts() {
        // The old code let it pass: the run printed its banner, staged its first engine and
        // failed with exit 1 `…/savepoints: File exists`, leaving DIR.starting-… behind.
        let (dir, opts) = setup(JOB);
        let report = &opts.report_dir;
        std::os::unix::fs::symlink(dir.path().join("gone"), report).expect("symlink");
        let e = check_report_dir(report)
            .expect_err("a dangling link")
            .to_string();
        assert!(e.starts_with("--report: "), "{e}");
        assert!(e.contains(&report.display().to_string()), "{e}");
        assert!(e.contains("symbolic link to nothing"), "{e}");
        let e = check_report_dir(&report.join("sub"))
            .expect_err("under a dangling link")
            .to_string();
        assert!(e.contains(&report.join("sub").display().to_string()), "{e}");
        assert!(
            e.contains(&format!(
                "cannot be created: {} is a symbolic link to nothing",
                report.display()
            )),
            "{e}"
        );
        assert!(!dir.path().join("gone").exists(), "nothing created");
        // A link to a directory is a report directory like any other.
        std::fs::remove_file(report).expect("rm link");
        std::fs::create_dir(dir.path().join("gone")).expect("target");
        std::os::unix::fs::symlink(dir.path().join("gone"), report).expect("symlink");
        check_report_dir(report).expect("a link to a directory");
    }

    #[test]
    fn a_job_file_the_run_would_replace_is_refused() {
        // The old code ran `DIR/job.yaml --report DIR`, warned that DIR held an earlier
        // report (job.yaml) and replaced the user's job file with the effective copy.
        let (dir, mut opts) = setup(JOB);
        let report = dir.path().to_path_buf();
        opts.report_dir = report.clone();
        let e = check_options(&opts).expect_err("DIR/job.yaml").to_string();
        assert!(e.starts_with("--report: "), "{e}");
        assert!(
            e.contains(&report.join("job.yaml").display().to_string()),
            "{e}"
        );
        assert!(e.contains("is the job file itself"), "{e}");
        assert_eq!(std::fs::read_to_string(&opts.job).expect("job"), JOB);
        // Named another way (a relative `.` component) it is the same file.
        opts.report_dir = report.join(".");
        check_options(&opts).expect_err("DIR/./job.yaml");
        // Any other report directory is fine.
        opts.report_dir = report.join("report");
        check_options(&opts).expect("a report beside the job file");
    }

    #[test]
    fn a_reused_report_directory_is_named_in_a_warning() {
        let (dir, opts) = setup(JOB);
        assert_eq!(earlier_report(&opts.report_dir), None, "no directory yet");
        std::fs::create_dir_all(&opts.report_dir).expect("report dir");
        std::fs::write(opts.report_dir.join(HISTORY_FILE), "{}").expect("history");
        assert_eq!(earlier_report(&opts.report_dir), None, "only a history");
        std::fs::write(opts.report_dir.join("summary.json"), "{}").expect("summary");
        let w = earlier_report(&opts.report_dir).expect("warning");
        assert!(w.starts_with("warning: "), "{w}");
        assert!(
            w.contains(&dir.path().join("report").display().to_string()),
            "{w}"
        );
        assert!(w.contains("summary.json"), "{w}");
    }

    #[tokio::test]
    async fn the_first_engines_files_replace_the_earlier_report_only_when_committed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = dir.path().join("report");
        for (f, text) in [
            ("summary.json", "old"),
            ("timeline.csv", "old"),
            ("job.yaml", "old"),
            ("logs/engine-1.log", "old"),
            ("logs/engine-2.log", "old"),
            ("savepoints/sp-a/_metadata.json", "kept"),
            (HISTORY_FILE, "kept"),
        ] {
            let path = report.join(f);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
            std::fs::write(&path, text).expect("write");
        }
        // A failed start: removed when the engine never ran, else kept; the report unchanged.
        let spawn = RuntimeError::Spawn {
            binary: "x".into(),
            source: std::io::Error::other("no"),
        };
        let staging = Staging::create(&report, "new job").expect("staging");
        assert!(staging.dir.starts_with(dir.path()) && !staging.dir.starts_with(&report));
        let kept = staging.dir.clone();
        assert_eq!(staging.abandon(&spawn), None);
        assert!(!kept.exists());
        let staging = Staging::create(&report, "new job").expect("staging");
        let exited = RuntimeError::Exited {
            status: "exit code 2".into(),
            last_error: "error: bad".into(),
        };
        let kept = staging.abandon(&exited).expect("kept");
        assert_eq!(
            std::fs::read_to_string(kept.join("job.yaml")).expect("job"),
            "new job"
        );
        assert_eq!(
            std::fs::read_to_string(report.join("summary.json")).expect("old"),
            "old"
        );
        // A started engine: its job file and logs replace the earlier report's.
        let staging = Staging::create(&report, "new job").expect("staging");
        let runtime = LocalRuntime::new(
            PathBuf::from("streamscale-engine"),
            report.join("savepoints"),
            staging.dir.join("logs"),
            http_client().expect("client"),
        );
        std::fs::create_dir_all(staging.dir.join("logs")).expect("logs");
        std::fs::write(staging.dir.join("logs/engine-1.log"), "new").expect("log");
        let staged = staging.dir.clone();
        staging.commit(&report, &runtime).await.expect("commit");
        assert!(!staged.exists());
        assert_eq!(runtime.log_dir(), report.join("logs"));
        let hidden: Vec<_> = std::fs::read_dir(&report)
            .expect("report")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(hidden.is_empty(), "temporary names left: {hidden:?}");
        let read = |f: &str| std::fs::read_to_string(report.join(f)).ok();
        assert_eq!(read("job.yaml").as_deref(), Some("new job"));
        assert_eq!(read("logs/engine-1.log").as_deref(), Some("new"));
        for gone in ["summary.json", "timeline.csv", "logs/engine-2.log"] {
            assert_eq!(read(gone), None, "{gone}");
        }
        assert_eq!(
            read("savepoints/sp-a/_metadata.json").as_deref(),
            Some("kept")
        );
        assert_eq!(read(HISTORY_FILE).as_deref(), Some("kept"));
    }

    #[test]
    fn a_missing_job_file_is_named() {
        let opts = RunOptions {
            job: PathBuf::from("/nonexistent/job.yaml"),
            ..RunOptions::default()
        };
        let err = prepare_job(&opts).expect_err("missing");
        assert!(err.to_string().contains("/nonexistent/job.yaml"), "{err}");
    }

    #[test]
    fn the_default_job_resolves_from_the_workspace_root() {
        let p = resolve_job_path(Path::new(DEFAULT_JOB));
        // Exists once the example is in the tree; the fallback path is under the workspace.
        assert!(p.ends_with(DEFAULT_JOB));
    }

    #[test]
    fn a_run_killed_in_its_final_savepoint_names_the_newest_earlier_one() {
        let newest_first = [
            PathBuf::from("r/savepoints/sp-j-2"),
            PathBuf::from("r/savepoints/sp-j-1"),
        ];
        assert_eq!(
            restore_hint(Some(&newest_first)),
            "; restore from the newest earlier savepoint r/savepoints/sp-j-2"
        );
        assert_eq!(restore_hint(Some(&[])), "");
        assert_eq!(restore_hint(None), "");
    }
}
