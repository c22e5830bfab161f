//! The loop of `streamscale run`: every interval a [tick](super::tick) (scrape, window, live
//! line), a [decision](super::decide) (the guarded autoscaler) and, when it says so, a
//! [rescale](super::apply); at the end the final stop and the report
//! ([finish](super::finish)). What one phase hands to the next is a [`LoopState`].

use super::*;

/// The run under way: what it runs and what its report is built from (the loop's phases are
/// its methods).
pub(super) struct Loop<'a, R: EngineRuntime> {
    /// The effective job.
    pub(super) job: &'a PreparedJob,
    /// The run's options.
    pub(super) opts: &'a RunOptions,
    /// Starts, stops and rescales the engine.
    pub(super) executor: Executor<'a, R>,
    /// The latency SLO, seconds.
    pub(super) slo_s: f64,
    /// The percentile the SLO is on (`--latency-percentile`, else the job's
    /// `autoscaler.latencyPercentile`), in (0, 1).
    pub(super) slo_percentile: f64,
    /// The operators in report order.
    pub(super) order: Vec<String>,
    /// The source operators.
    pub(super) sources: Vec<String>,
    /// One row per interval (`timeline.csv`).
    pub(super) rows: Vec<IntervalStats>,
    /// Cost and SLO accounting over the intervals.
    pub(super) accounting: Accounting,
    /// Rescales applied.
    pub(super) rescales: Vec<RescaleRecord>,
    /// Rescales that failed (rolled back, or left no engine).
    pub(super) failed_rescales: Vec<RescaleRecord>,
    /// Rescales decided but not applied (`--no-autoscale`).
    pub(super) recommendations: Vec<RescaleRecord>,
    /// HTTP client for the engine's REST API.
    pub(super) client: reqwest::Client,
    /// Records shed by the engines of this run that have stopped.
    pub(super) shed_before: u64,
    /// Records shed by the running engine.
    pub(super) shed_now: u64,
    /// The signal that cut the run short, if any.
    pub(super) interrupted: Option<Interrupt>,
    /// Where the engines write savepoints (`REPORT/savepoints`), pruned to the newest
    /// [`RunOptions::keep_savepoints`].
    pub(super) savepoints_dir: PathBuf,
    /// Savepoints removed by that pruning during this run.
    pub(super) savepoints_removed: usize,
    /// Restarts after the engine died ([`supervise`]).
    pub(super) restarts: Vec<RestartRecord>,
    /// Run second at which the sources last started from the beginning of their rate (0, or
    /// a restart with nothing to restore): trace times are counted from it, since the engine
    /// replays the trace from its start then.
    pub(super) trace_origin_s: f64,
}

/// What the loop's phases hand to each other, from one interval to the next (the engine, the
/// autoscaling session, and what each phase said or measured last).
pub(super) struct LoopState {
    /// When the run started: run seconds count from it.
    pub(super) started: Instant,
    /// The job's parallelism at the start.
    pub(super) initial: BTreeMap<String, u32>,
    /// The running engine.
    pub(super) engine: EngineHandle,
    /// The metric window, the guarded autoscaler and the learned-state file.
    pub(super) session: AutoscaleSession<FileStateStore>,
    /// The signals that stop the run.
    pub(super) signals: Signals,
    /// Why the run failed; set, it ends the loop.
    pub(super) failure: Option<String>,

    // Tick.
    /// Fires every `--interval`.
    pub(super) ticker: tokio::time::Interval,
    /// When the run's duration is over.
    pub(super) deadline: Instant,
    /// Whether the deadline has passed (its timer is not armed again).
    pub(super) deadline_seen: bool,
    /// A signal arrived: the interval under way is the last.
    pub(super) stopping: bool,
    /// Sources with a record count finish the job on their own: the job's state is polled.
    pub(super) bounded: bool,
    /// Whether the wait for the backlog to drain after the trace window was said.
    pub(super) waiting_for_backlog: bool,
    /// The last complete scrape (the start of the next interval).
    pub(super) prev: Option<EngineMetrics>,
    /// Per-operator capacity seen so far (for the timeline).
    pub(super) capacity: CapacityEstimator,
    /// The engine changed since `prev` (a restart or a rescale): counters started over.
    pub(super) engine_changed: bool,
    /// Failed scrapes in a row.
    pub(super) scrape_failures: u32,
    /// Subtasks missing from the last scrape, per operator, as last said.
    pub(super) last_missing: Vec<(String, Vec<usize>)>,
    /// Sources already named for exporting no backlog metric (said once each).
    pub(super) no_backlog_said: Vec<String>,

    // Decide.
    /// Whether the job sheds load at its limits (`autoscaler.limits.onLimit: shed`).
    pub(super) shedding: bool,
    /// The share of the sources' records the last plan wants shed, in [0, 1].
    pub(super) shed_wanted: f64,
    /// The share the running engine sheds, in [0, 1].
    pub(super) shed_applied: f64,
    /// Whether the last plan reported the latency SLO unattainable
    /// ([`progress::slo_unattainable_line`]).
    pub(super) unattainable: bool,
    /// Operators last reported as held overloaded ([`progress::at_limit_line`]).
    pub(super) at_limit: Vec<String>,
    /// The last change held back (operators and directions), the guard that held it
    /// ([`progress::hold_key`]) and when it said it would act.
    pub(super) held: progress::HoldSaid,

    // Apply.
    /// Rescales that failed: the next attempt waits, longer after each failure in a row.
    pub(super) backoff: RescaleBackoff,
    /// Whether the current backoff's hold was said (once per wait).
    pub(super) backoff_said: bool,
}

impl<R: EngineRuntime> Loop<'_, R> {
    /// The REST client of `engine`, carrying the runtime's token.
    pub(super) fn engine_api(&self, engine: &EngineHandle) -> crate::api::EngineApi {
        crate::api::EngineApi::new(self.client.clone(), &engine.base_url)
            .with_token(self.executor.runtime().auth_token())
    }

    /// Runs the loop on `engine`, started at `started`, until the deadline, a signal, the end
    /// of a bounded job or a failure; then stops the engine and writes the report.
    ///
    /// # Errors
    /// [`RunError`] when the report cannot be written.
    pub(super) async fn run(
        &mut self,
        engine: EngineHandle,
        started: Instant,
        signals: Signals,
        print: &mut (dyn FnMut(&str) + Send),
        warn: &mut (dyn FnMut(&str) + Send),
    ) -> Result<RunOutcome, RunError> {
        let initial = self.job.spec.parallelism();
        let session = self.open_session(print, warn).await;
        let shedding = self
            .job
            .spec
            .autoscaler
            .limits
            .as_ref()
            .is_some_and(|l| l.on_limit == streamscale_engine::spec::OnLimit::Shed);
        let mut ticker = tokio::time::interval(Duration::from_secs_f64(self.opts.interval_s));
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let bounded = self
            .job
            .spec
            .operators
            .iter()
            .any(|o| matches!(o.kind, OperatorKind::Source { count: Some(_), .. }));
        let mut st = LoopState {
            started,
            initial,
            engine,
            session,
            signals,
            failure: None,
            ticker,
            deadline: started + Duration::from_secs_f64(self.job.duration_s),
            // A signal or the deadline ends the last interval early: it is still scraped and
            // counted, so that the run's totals cover the whole run.
            deadline_seen: false,
            stopping: false,
            bounded,
            waiting_for_backlog: false,
            prev: None,
            capacity: CapacityEstimator::default(),
            engine_changed: false,
            scrape_failures: 0,
            last_missing: Vec::new(),
            no_backlog_said: Vec::new(),
            shedding,
            shed_wanted: 0.0,
            shed_applied: 0.0,
            unattainable: false,
            at_limit: Vec::new(),
            held: progress::HoldSaid::default(),
            backoff: RescaleBackoff::default(),
            backoff_said: false,
        };
        loop {
            let now_s = match self.tick(&mut st, print, warn).await {
                Tick::Sampled(now_s) => now_s,
                Tick::Skip => continue,
                Tick::End => break,
            };
            let Some(rescale) = self.decide(&mut st, now_s, print).await else {
                continue;
            };
            if let Applied::NoEngine = self.apply(&mut st, now_s, rescale, print, warn).await {
                // Nothing left to stop; write the report with what we have.
                let last = from_last(&self.rows, &st.initial);
                return self
                    .finish(None, st.started, st.failure, None, &st.initial, &last)
                    .await;
            }
        }
        self.stop(st, print, warn).await
    }
}

/// The parallelism of the last interval, else `initial`.
fn from_last(rows: &[IntervalStats], initial: &BTreeMap<String, u32>) -> BTreeMap<String, u32> {
    rows.last()
        .map_or_else(|| initial.clone(), |r| r.parallelism.clone())
}
