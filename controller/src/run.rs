//! `streamscale run`: the local autoscaling loop.
//!
//! [`run`] prepares an effective job file (trace overrides applied) and starts the engine
//! locally (from a staging directory beside the report directory, whose files move into the
//! report only once the engine runs, so a run that cannot start leaves an earlier report as it
//! was), then hands it to the loop (`run/run_loop.rs`), one module per phase:
//! - `tick`: every interval, scrape the engine (restart it when it died, `supervise`), turn
//!   two scrapes into the interval's row and live line, add the sample to the window;
//! - `decide`: the guarded autoscaler's verdict and the lines that explain it;
//! - `apply`: rescale by stop-with-savepoint and restore (rolled back when it fails);
//! - `finish`: stop with a draining savepoint, write the summary, the report and its plot.
//!
//! Options, job preparation, the report directory, signals and `streamscale plan` have a
//! module each.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use streamscale_engine::spec::{GapPolicy, JobSpec, OperatorKind, RateSpec, SpecError, TraceRate};
use streamscale_engine::trace::RateFunction;
use tokio::time::{Instant, MissedTickBehavior};

use crate::autoscale_session::{AutoscaleSession, WindowRule};
use crate::collect::{EngineScrape, MetricsSource};
use crate::executor::{Executor, ExecutorError, RescaleOutcome};
use crate::model::{Autoscaler, GuardSettings, MetricSample, Verdict};
use crate::plot::plot_timeline;
use crate::progress;
use crate::report::{
    self, Accounting, RecordTotals, ReportError, RescaleRecord, RestartRecord, Summary,
};
use crate::rescale::RescaleBackoff;
use crate::runtime::{EngineHandle, EngineRuntime, LocalRuntime, RuntimeError};
use crate::savepoint_history;
use crate::scrape::EngineMetrics;
use crate::state_store::file::{
    FileStateStore, LEGACY_HISTORY_FILE, LEGACY_LEARNED_FILE, STATE_FILE,
};
use crate::state_store::{Keep, StateStore};
use crate::stats::{CapacityEstimator, IntervalStats};

mod apply;
mod decide;
mod finish;
mod job;
mod options;
mod plan;
mod report_dir;
mod run_loop;
mod signals;
mod supervise;
#[cfg(test)]
mod tests;
mod tick;

use apply::*;
pub use decide::rescale_reason;
use decide::*;
pub use job::*;
pub use options::*;
pub use plan::*;
use report_dir::*;
pub use report_dir::{REPORT_FILES, SAVEPOINTS_DIR, earlier_report};
use run_loop::*;
use signals::*;
use tick::*;

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
    // Registered first, so a signal while the job is prepared or the engine starts is not lost
    // (nor ignored, as a script's background job inherits SIGINT).
    let signals = Signals::new();
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
    // The job file as given, or where it was found when that is not under the working
    // directory (the default job, run from elsewhere).
    let job_file = if opts.job.exists() {
        &opts.job
    } else {
        &job.file
    };
    print(&format!(
        "streamscale run: job `{}` ({}), {} s, interval {} s, SLO {} s, report in {}",
        job.spec.name,
        job_file.display(),
        // Whole seconds as such (240), a fraction as given (1.5), never rounded to 0.
        job.duration_s,
        opts.interval_s,
        slo_s,
        opts.report_dir.display()
    ));
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
    let spec = job.spec.clone();
    let first_id = job.first_checkpoint_id;
    let executor = Executor::new(&runtime, &job.path).with_restore_point(std::sync::Arc::new(
        move |from: Option<&crate::runtime::Savepoint>| {
            supervise::restore_point(&spec, first_id, from, &mut |w| tracing::warn!("{w}"))
        },
    ));
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
        restarts: Vec::new(),
        trace_origin_s: 0.0,
    };
    lp.run(engine, started, signals, print, warn).await
}
