//! The options of `streamscale run`, their errors and their checks.

use super::*;

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

impl RunOptions {
    /// Least metric history (first to last sample) before the autoscaler decides, seconds:
    /// three scrape intervals, at most the window. The engine's rates are exact counter deltas
    /// from the first second after a restore (no moving averages to refill, unlike Flink's
    /// 60 s meters), so a history of three intervals suffices.
    pub fn guard_window_s(&self) -> f64 {
        (3.0 * self.interval_s).min(self.window_s)
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
pub(super) fn start_error(error: &RuntimeError) -> String {
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

pub(super) fn start_note(report: &Path, kept: Option<&Path>) -> String {
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
    /// The job file read (absolute; [`resolve_job_path`] of the `--job` given).
    pub file: PathBuf,
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
    /// The first checkpoint id this run can write (`supervise::first_checkpoint_id`): the
    /// job's checkpoint directory may hold an earlier run's checkpoints below it.
    pub first_checkpoint_id: u64,
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
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().unwrap_or(manifest);
    let candidate = root.join(job);
    if candidate.exists() {
        candidate
    } else {
        job.to_path_buf()
    }
}

pub(super) fn positive(name: &str, v: Option<f64>) -> Result<(), RunError> {
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
pub(super) fn scrape_interval(x: f64) -> Result<(), RunError> {
    positive("--interval", Some(x))?;
    if x < MIN_INTERVAL_S {
        return Err(RunError::Option(format!(
            "--interval: must be at least {MIN_INTERVAL_S} s, two of the engine's 100 ms metric flushes (got {x})"
        )));
    }
    Ok(())
}

pub(super) fn non_negative(name: &str, x: f64) -> Result<(), RunError> {
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

pub(super) fn at_most_a_year(name: &str, v: Option<f64>) -> Result<(), RunError> {
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
pub(super) fn check_job_outside_report(job: &Path, dir: &Path) -> Result<(), RunError> {
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
pub(super) fn check_report_path(dir: &Path) -> Result<(), RunError> {
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
pub(super) fn check_report_entries(dir: &Path) -> Result<(), RunError> {
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
pub(super) fn existing_file(what: &str, path: &Path, expected: &str) -> Result<(), RunError> {
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
    use streamscale_engine::spec::{MAX_TRACE_SCALE, MAX_TRACE_SPEEDUP};
    for (name, v, max) in [
        ("--speedup", opts.speedup, MAX_TRACE_SPEEDUP),
        ("--scale", opts.scale, MAX_TRACE_SCALE),
    ] {
        if let Some(v) = v.filter(|&v| v > max) {
            return Err(RunError::Option(format!(
                "{name}: {v:e} is above the limit {max:e}"
            )));
        }
    }
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
pub(super) fn explicit_engine(opts: &RunOptions) -> Option<(&'static str, PathBuf)> {
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
pub(super) fn restore_hint(before: Option<&[PathBuf]>) -> String {
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

pub(super) fn absolute(path: &Path) -> Result<PathBuf, RunError> {
    std::path::absolute(path).map_err(|source| RunError::Io {
        path: path.to_path_buf(),
        source,
    })
}
