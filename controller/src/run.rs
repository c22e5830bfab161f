//! `streamscale run`: the local autoscaling loop.
//!
//! Prepares an effective job file (trace overrides applied), starts the engine locally (from
//! a staging directory beside the report directory, whose files move into the report only
//! once the engine runs, so a run that cannot start leaves an earlier report as it was),
//! scrapes it every interval, asks the guarded autoscaler for a verdict,
//! rescales by stop-with-savepoint and restore, and finally stops with a draining savepoint and
//! writes the report.

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

mod job;
mod options;
mod plan;
mod report_dir;
mod signals;
mod supervise;
#[cfg(test)]
mod tests;

pub use job::*;
pub use options::*;
pub use plan::*;
use report_dir::*;
use signals::*;

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
    /// Restarts after the engine died ([`supervise`]).
    restarts: Vec<RestartRecord>,
    /// Run second at which the sources last started from the beginning of their rate (0, or
    /// a restart with nothing to restore): trace times are counted from it, since the engine
    /// replays the trace from its start then.
    trace_origin_s: f64,
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

impl<R: EngineRuntime> Loop<'_, R> {
    /// The REST client of `engine`, carrying the runtime's token.
    fn engine_api(&self, engine: &EngineHandle) -> crate::api::EngineApi {
        crate::api::EngineApi::new(self.client.clone(), &engine.base_url)
            .with_token(self.executor.runtime().auth_token())
    }

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
        let settings = GuardSettings {
            window_seconds: (3.0 * self.opts.interval_s).min(self.opts.window_s),
            stabilization_seconds: self.opts.stabilization_s,
            scale_down_delay_seconds: self.opts.scale_down_delay_s,
            planner: crate::model::PlannerSettings {
                latency_percentile: self.opts.latency_percentile,
                ..crate::model::PlannerSettings::default()
            },
            ..GuardSettings::default()
        };
        // What was learned about the job in earlier runs (the forecast's rate history, the
        // operators' scalability) survives runs: kept in the report directory on the Unix-time
        // clock, moved to this run's clock (seconds since `started`).
        let store = FileStateStore::new(&self.opts.report_dir, &self.job.spec.name);
        // Another job's learned state in a shared report directory is set aside, never
        // overwritten, and this job's own is brought back.
        let (notes, warnings) = store.claim();
        notes.iter().for_each(|n| print(n));
        warnings.iter().for_each(|w| warn(&format!("warning: {w}")));
        // Warm-up metrics are not representative: the first start counts as a restart. The
        // next run starts at the job's initial parallelism: no baseline to keep for it.
        let mut session = AutoscaleSession::new(
            &self.job.spec.name,
            settings,
            0.0,
            WindowRule::Horizon(self.opts.window_s),
            store,
            Keep {
                baseline: false,
                downtime: false,
            },
            unix_now_s(),
        );
        match session.load().await {
            Ok(Some(s)) => {
                let store = session.store();
                let from = |legacy: &str| {
                    store
                        .migrated_from()
                        .iter()
                        .find(|p| p.ends_with(legacy))
                        .map_or_else(|| store.location(), |p| p.display().to_string())
                };
                if crate::model::forecast::ForecastConfig::of(&self.job.spec).is_some()
                    && let Some(h) = &s.history
                {
                    print(&format!(
                        "forecast: {} bins of rate history from {}",
                        h.bins.len(),
                        from(LEGACY_HISTORY_FILE)
                    ));
                }
                if !(s.scalability.factors.is_empty() && s.scalability.ineffective.is_empty()) {
                    print(&format!(
                        "learned: scalability factors of {} operator(s) from {}",
                        s.scalability.factors.len(),
                        from(LEGACY_LEARNED_FILE)
                    ));
                }
                // State read from an earlier version's files is written in the new file.
                if !store.migrated_from().is_empty() {
                    session.forget_saved();
                }
            }
            Ok(None) => {}
            Err(e) => warn(&format!("warning: {e}")),
        }
        let shedding = self
            .job
            .spec
            .autoscaler
            .limits
            .as_ref()
            .is_some_and(|l| l.on_limit == streamscale_engine::spec::OnLimit::Shed);
        let (mut shed_wanted, mut shed_applied) = (0.0f64, 0.0f64);
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
        // The last change held back (operators and directions) and the guard that held it
        // ([`progress::hold_key`]).
        let mut held: Option<String> = None;
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
            let url = metrics_url(&engine);
            // The engine's page is always there to read: never `Ok(None)`.
            let scraped = EngineScrape::new(&self.client, &url)
                .collect(&clock)
                .await
                .map(Option::unwrap_or_default);
            let now_s = clock();
            let mut cur = match scraped {
                Ok(m) => {
                    scrape_failures = 0;
                    m
                }
                Err(e) => {
                    if let Some(exit) = self.executor.runtime().exited(&engine).await {
                        if stopping {
                            failure = Some(format!("engine failed at t={now_s:.0}s: {exit}"));
                            break;
                        }
                        match self
                            .restart_engine(&engine, &exit, now_s, started, print, warn)
                            .await
                        {
                            Ok(restarted) => {
                                engine = restarted;
                                // Counters went back to the restore point: no interval spans it.
                                prev = None;
                                engine_changed = true;
                                scrape_failures = 0;
                                self.shed_before += self.shed_now;
                                self.shed_now = 0;
                                shed_applied = 0.0;
                                session.restarted(started.elapsed().as_secs_f64());
                                continue;
                            }
                            Err(f) => {
                                failure = Some(f);
                                break;
                            }
                        }
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
                    self.job.trace_time(now_s - self.trace_origin_s),
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
            session.observe(now_s, cur.sample.clone());
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
            let verdict = session.decide(now_s, &spec);
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
                    shed_wanted = session
                        .autoscaler()
                        .limit_plan()
                        .map_or(0.0, |lp| lp.shed_share);
                }
                if (shed_wanted - shed_applied).abs() > 1e-3 {
                    match self.engine_api(&engine).set_shed(shed_wanted).await {
                        Ok(n) => {
                            let why = session
                                .autoscaler()
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
                    && let Ok(n) = self.engine_api(&engine).shed().await
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
                let learned = session.autoscaler().scalability();
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
            if let Err(e) = session.save_if_changed().await {
                tracing::warn!("{e}");
            }
            // A change the guards hold back: said once per guard and per set of operators
            // and directions (the planned values and the reasons' figures move every
            // interval), so a user sees why nothing happens.
            if let Verdict::Hold {
                reason,
                recommendation: Some(d),
            } = &verdict
                && d.parallelism != engine.parallelism
            {
                let key = progress::hold_key(reason, Some(d));
                if held.as_ref() != Some(&key) {
                    let change =
                        progress::format_change(&engine.parallelism, &d.parallelism, &self.order);
                    print(&progress::hold_line(now_s, &change, reason));
                    held = Some(key);
                }
            } else {
                held = None;
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
                    session
                        .autoscaler_mut()
                        .observe_rescale_downtime(downtime_s);
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
            engine_changed = true;
            session.restarted(done_s);
        }

        let final_parallelism = engine.parallelism.clone();
        if shed_applied > 0.0
            && let Ok(n) = self.engine_api(&engine).shed().await
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

    /// The engine `dead` died (`exit`) at `now_s`: restarts it from the latest completed
    /// checkpoint under the job's restart strategy ([`supervise`]), printing a line before and
    /// after, and records the restart. A failed start counts as an attempt too.
    ///
    /// # Errors
    /// The run's failure when no restart is left or the restore point cannot be found.
    async fn restart_engine(
        &mut self,
        dead: &EngineHandle,
        exit: &crate::runtime::RuntimeError,
        now_s: f64,
        started: Instant,
        print: &mut (dyn FnMut(&str) + Send),
        warn: &mut (dyn FnMut(&str) + Send),
    ) -> Result<EngineHandle, String> {
        let policy = supervise::restart_policy(&self.job.spec);
        let mut reason = exit.to_string();
        let mut restored_from = dead.restored_from.clone();
        loop {
            let n = self.restarts.len() as u32 + 1;
            if n > policy.attempts {
                return Err(format!(
                    "engine failed at t={now_s:.0}s: {reason}; no restart left ({} allowed by the job's checkpoint.restart.attempts)",
                    policy.attempts
                ));
            }
            let died_s = started.elapsed().as_secs_f64();
            print(&supervise::died_line(died_s, &reason, n, &policy));
            tokio::time::sleep(Duration::from_secs_f64(policy.delay_seconds)).await;
            let spec = self.job.spec.clone();
            let first_id = self.job.first_checkpoint_id;
            let from = restored_from.clone();
            let found = tokio::task::spawn_blocking(move || {
                let mut warnings = Vec::new();
                let point = supervise::restore_point(&spec, first_id, from.as_ref(), &mut |w| {
                    warnings.push(w)
                });
                (point, warnings)
            })
            .await
            .map_err(|e| format!("engine failed at t={now_s:.0}s: {reason}; {e}"))?;
            let (point, warnings) = found;
            warnings.iter().for_each(|w| warn(w));
            let point = point.map_err(|e| {
                format!(
                    "engine failed at t={now_s:.0}s: {reason}; cannot restart from a checkpoint: {e}"
                )
            })?;
            let launched = self
                .executor
                .launch(&dead.parallelism, point.as_ref())
                .await;
            let recovery_s = started.elapsed().as_secs_f64() - died_s;
            self.restarts.push(RestartRecord {
                at_s: died_s,
                reason: reason.clone(),
                restored_from: point.as_ref().map(|p| p.path.clone()),
                recovery_s,
            });
            match launched {
                Ok((engine, _)) => {
                    if point.is_none() {
                        self.trace_origin_s = started.elapsed().as_secs_f64();
                    }
                    print(&supervise::restarted_line(
                        started.elapsed().as_secs_f64(),
                        point.as_ref(),
                        recovery_s,
                    ));
                    return Ok(engine);
                }
                Err(e) => {
                    reason = format!("restart failed: {e}");
                    restored_from = point.or(restored_from);
                }
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
            restarts: self.restarts.clone(),
            recovery_s: self.restarts.iter().map(|r| r.recovery_s).sum(),
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
/// also where the autoscaler's learned state ([`STATE_FILE`]) is kept between runs of a job.
pub fn earlier_report(dir: &Path) -> Option<String> {
    let found: Vec<&str> = REPORT_FILES
        .iter()
        .copied()
        .filter(|f| dir.join(f).is_file())
        .collect();
    (!found.is_empty()).then(|| {
        format!(
            "warning: {} holds the report of an earlier run ({}); this run replaces it and its engine logs once its engine has started (savepoints stay, the newest --keep-savepoints; this job's {STATE_FILE} is read and kept, another job's are set aside). Use --report DIR to keep it.",
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
