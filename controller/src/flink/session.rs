//! `streamscale flink`: the autoscaling loop over the jobs of a Flink session cluster.
//!
//! Every interval, per job: collect (topology, per-subtask counters) -> evaluate, plan, guard
//! ([`Autoscaler::decide`]) -> realize (in place, or savepoint + resubmit through
//! [`Executor`]), with the same live lines and the same kind of report as `streamscale run`.
//! What the autoscaler learns about a job (scalability factors, the forecast's rate history,
//! the rescale downtime) is kept in one file per Flink job id ([`flink_state_file`]), read when
//! the job is adopted and written when it changed, as `streamscale run` does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use streamscale_engine::spec::AutoscalerSpec;
use tokio::sync::Mutex;

use crate::autoscale_session::{AutoscaleSession, WindowRule};
use crate::executor::{Executor, RescaleOutcome};
use crate::model::{GuardSettings, MetricSample, Verdict};
use crate::rescale::RescaleBackoff;
use crate::runtime::EngineHandle;
use crate::state_store::file::{FileStateStore, flink_state_file};
use crate::state_store::{Keep, StateStore};

use super::collect::{Collector, FlinkRestSource};
use super::in_place::{self, InPlaceOutcome};
use super::metrics;
use super::rest::{FlinkError, FlinkRest, JobDetails};
use super::runtime::{FlinkRuntime, FlinkTimeouts, Resubmit};
use super::slots;
use super::topology::{FlinkTopology, VertexBounds, VertexRole};
use crate::collect::MetricsSource;

/// Whether decisions are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    /// Apply every rescale the guards let through.
    Auto,
    /// Print and record decisions; never change a job.
    Recommend,
}

/// How a rescale is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RescalePath {
    /// In place when the cluster runs the adaptive scheduler, else savepoint + resubmit.
    Auto,
    /// Only in place (`PUT /jobs/:jid/resource-requirements`).
    InPlace,
    /// Only stop-with-savepoint and resubmit.
    Savepoint,
}

/// Options of `streamscale flink`.
#[derive(Debug, Clone)]
pub struct FlinkOptions {
    /// The cluster's REST URL, e.g. `http://127.0.0.1:8081`.
    pub rest_url: String,
    /// The job ids to autoscale; empty with `all`: every running job.
    pub jobs: Vec<String>,
    /// Autoscale every running job (also those submitted later).
    pub all: bool,
    /// Apply or only recommend.
    pub mode: Mode,
    /// In place, savepoint + resubmit, or whichever the cluster supports.
    pub rescale: RescalePath,
    /// How to resubmit a job from a savepoint (the savepoint path needs it).
    pub resubmit: Option<Resubmit>,
    /// Where savepoints go (`None`: the cluster's default savepoint directory).
    pub savepoint_dir: Option<String>,
    /// The autoscaler settings (the job file's `autoscaler` schema).
    pub settings: AutoscalerSpec,
    /// Per-vertex parallelism bounds by vertex name.
    pub bounds: VertexBounds,
    /// Seconds between scrapes.
    pub interval_s: f64,
    /// Seconds of metrics the planner reads.
    pub window_s: f64,
    /// Seconds after a (re)start before a decision.
    pub stabilization_s: f64,
    /// Seconds a scale-down must be wanted before it applies.
    pub scale_down_delay_s: f64,
    /// Stop after this many seconds (`None`: until interrupted).
    pub duration_s: Option<f64>,
    /// Report directory.
    pub report_dir: PathBuf,
    /// Where the learned state is kept, one file per job id ([`flink_state_file`]; `None`:
    /// the report directory).
    pub state_dir: Option<PathBuf>,
    /// Seconds a rescale may take before it is given up (in place) or rolled back.
    pub rescale_timeout_s: f64,
    /// What every REST request carries (`--rest-token-file`, `--rest-basic-auth-file`).
    pub credentials: crate::flink::rest_auth::RestCredentials,
}

impl Default for FlinkOptions {
    fn default() -> Self {
        FlinkOptions {
            rest_url: "http://127.0.0.1:8081".into(),
            jobs: Vec::new(),
            all: false,
            mode: Mode::Auto,
            rescale: RescalePath::Auto,
            resubmit: None,
            savepoint_dir: None,
            settings: AutoscalerSpec::default(),
            bounds: VertexBounds::new(),
            interval_s: 10.0,
            window_s: 60.0,
            stabilization_s: 30.0,
            scale_down_delay_s: 60.0,
            duration_s: None,
            report_dir: PathBuf::from("report-flink"),
            state_dir: None,
            rescale_timeout_s: 120.0,
            credentials: Default::default(),
        }
    }
}

/// Errors that end `streamscale flink`.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The cluster cannot be reached or answered something unexpected.
    #[error(transparent)]
    Flink(#[from] FlinkError),
    /// A named job has ended.
    #[error("job {job} is {state}: nothing to autoscale")]
    NotRunning {
        /// The job id.
        job: String,
        /// Its state.
        state: String,
    },
    /// No job to autoscale.
    #[error("no RUNNING job on the Flink cluster at {0} (submit one, or wait for it)")]
    NoJobs(String),
    /// A bad option.
    #[error("{0}")]
    Option(String),
    /// The report could not be written.
    #[error("{path}: {source}")]
    Report {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A job's graph could not be read.
    #[error(transparent)]
    Topology(#[from] super::topology::TopologyError),
}

/// One rescale (or rescale attempt) in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RescaleRecord {
    /// Seconds since the session started.
    pub at_seconds: f64,
    /// Parallelism by vertex name before.
    pub from: BTreeMap<String, u32>,
    /// Parallelism by vertex name asked for.
    pub to: BTreeMap<String, u32>,
    /// `inPlace` or `savepoint`.
    pub path: String,
    /// `rescaled`, `timedOut`, `savepointFailed`, `restoreFailed`, `failed` or `recommended`.
    pub outcome: String,
    /// Seconds from the request until every vertex ran at the new parallelism.
    pub downtime_seconds: Option<f64>,
    /// The planner's reason.
    pub reason: String,
    /// The savepoint (savepoint path only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub savepoint: Option<String>,
    /// What went wrong, when something did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One job's part of the report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobReport {
    /// The job id at the start.
    pub first_job_id: String,
    /// The job id at the end (a resubmission gives a new one).
    pub job_id: String,
    /// Job name.
    pub name: String,
    /// The vertices (ids, names as printed, roles).
    pub vertices: Vec<super::topology::FlinkVertex>,
    /// Parallelism by vertex name at the end.
    pub final_parallelism: BTreeMap<String, u32>,
    /// Rescales and attempts (and, in recommend mode, recommendations).
    pub rescales: Vec<RescaleRecord>,
    /// Subtask-seconds used (Σ parallelism × interval), a proxy for slot-seconds.
    pub subtask_seconds: f64,
    /// Seconds of the session with some source's backlog growing.
    pub lag_growing_seconds: f64,
    /// How the session ended for this job, when it ended before the session did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
}

/// The session's `summary.json`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlinkSummary {
    /// The cluster's REST URL.
    pub rest_url: String,
    /// Apply or recommend.
    pub mode: Mode,
    /// Seconds the session ran.
    pub duration_seconds: f64,
    /// One entry per job.
    pub jobs: Vec<JobReport>,
}

/// One job under autoscaling.
struct JobSession {
    topology: Arc<Mutex<FlinkTopology>>,
    runtime: FlinkRuntime,
    handle: EngineHandle,
    /// The window, the autoscaler and the job's learned-state file.
    session: AutoscaleSession<FileStateStore>,
    backoff: RescaleBackoff,
    collector: Collector,
    /// The last hold said: its guard and the operators it held up or down.
    last_hold: String,
    last_notes: Vec<String>,
    report: JobReport,
    timeline: Vec<String>,
    done: bool,
}

/// Rates of one vertex between two samples, for the live line and the timeline.
struct VertexRates {
    busy: f64,
    records_in: f64,
    records_out: f64,
    backlog: Option<f64>,
}

fn vertex_rates(a: &MetricSample, b: &MetricSample, name: &str) -> Option<VertexRates> {
    let dt = b.at_seconds - a.at_seconds;
    let (x, y) = (a.operators.get(name)?, b.operators.get(name)?);
    if dt <= 0.0 || x.len() != y.len() || y.iter().any(|s| s.is_absent()) {
        return None;
    }
    let n = y.len().max(1) as f64;
    let sum = |f: &dyn Fn(&crate::model::SubtaskSample) -> f64| -> f64 {
        x.iter().zip(y).map(|(p, q)| f(q) - f(p)).sum::<f64>()
    };
    let backlog: Option<f64> = y.iter().map(|s| s.source_backlog).sum();
    Some(VertexRates {
        busy: sum(&|s| s.busy_seconds) / dt / n,
        records_in: sum(&|s| s.records_in) / dt,
        records_out: sum(&|s| s.records_out) / dt,
        backlog,
    })
}

impl FlinkOptions {
    /// The directory of the learned-state files (`--state-dir`, else the report directory).
    pub fn state_dir(&self) -> &Path {
        self.state_dir.as_deref().unwrap_or(&self.report_dir)
    }
}

impl JobSession {
    /// The session of `job`, with what an earlier session learned about it (a line says so; a
    /// state file that cannot be used is a warning line). `unix0` is the Unix time of the
    /// session clock's zero, seconds.
    async fn new(
        rest: &FlinkRest,
        job: &JobDetails,
        opts: &FlinkOptions,
        unix0: f64,
        print: &mut dyn FnMut(&str),
    ) -> Result<JobSession, SessionError> {
        let topo = FlinkTopology::from_job(job, &opts.settings, &opts.bounds)?;
        let by_name = topo.by_name(&job.parallelism_by_id());
        let report = JobReport {
            first_job_id: job.jid.clone(),
            job_id: job.jid.clone(),
            name: job.name.clone(),
            vertices: topo.vertices.clone(),
            final_parallelism: by_name.clone(),
            rescales: Vec::new(),
            subtask_seconds: 0.0,
            lag_growing_seconds: 0.0,
            ended: None,
        };
        let topology = Arc::new(Mutex::new(topo));
        let timeout = Duration::from_secs_f64(opts.rescale_timeout_s);
        let runtime = FlinkRuntime::new(
            rest.clone(),
            Arc::clone(&topology),
            opts.resubmit.clone(),
            opts.savepoint_dir.clone(),
            FlinkTimeouts {
                savepoint: timeout,
                running: timeout,
            },
        );
        let handle = runtime.adopt(&job.jid, by_name).await;
        let settings = GuardSettings {
            window_seconds: opts
                .window_s
                .min(3.0 * opts.interval_s)
                .max(opts.interval_s),
            stabilization_seconds: opts.stabilization_s,
            scale_down_delay_seconds: opts.scale_down_delay_s,
            ..GuardSettings::default()
        };
        let store =
            FileStateStore::in_file(opts.state_dir(), &flink_state_file(&job.jid), &job.name);
        // The measured rescale downtime is the job's (its state size, the cluster's restart):
        // kept. The last observation is not: the next session may start long after, under
        // another load, and a factor learned across that gap would not be a rescale's.
        let mut session = AutoscaleSession::new(
            &job.name,
            settings,
            0.0,
            WindowRule::SpanAtLeast(opts.window_s),
            store,
            Keep {
                baseline: false,
                downtime: true,
            },
            unix0,
        );
        match session.load().await {
            Ok(Some(s)) => print(&format!(
                "{}: {} from {}",
                short(&job.jid),
                learned_summary(&s),
                session.store().location()
            )),
            Ok(None) => {}
            Err(e) => print(&format!("{}: warning: {e}", short(&job.jid))),
        }
        Ok(JobSession {
            topology,
            runtime,
            handle,
            session,
            backoff: RescaleBackoff::default(),
            collector: Collector::new(),
            last_hold: String::new(),
            last_notes: Vec::new(),
            report,
            timeline: Vec::new(),
            done: false,
        })
    }

    fn live_line(&mut self, at_s: f64, topo: &FlinkTopology, print: &mut dyn FnMut(&str)) {
        let window = self.session.window();
        let n = window.len();
        if n < 2 {
            return;
        }
        let (a, b) = (&window[n - 2], &window[n - 1]);
        let mut parts = Vec::new();
        let mut growing = false;
        for v in &topo.vertices {
            let p = b.operators.get(&v.name).map_or(0, Vec::len);
            let Some(r) = vertex_rates(a, b, &v.name) else {
                parts.push(format!("{} p={p} (no data)", v.name));
                continue;
            };
            let lag = match (v.role, r.backlog) {
                (VertexRole::Source, Some(l)) => {
                    let before: Option<f64> = a
                        .operators
                        .get(&v.name)
                        .and_then(|x| x.iter().map(|s| s.source_backlog).sum());
                    if before.is_some_and(|x| l > x + 1.0) {
                        growing = true;
                    }
                    format!(" lag {l:.0}")
                }
                (VertexRole::Source, None) => " lag ?".to_string(),
                _ => String::new(),
            };
            let rate = if v.role == VertexRole::Source {
                format!("out {:.0}/s", r.records_out)
            } else {
                format!("in {:.0}/s", r.records_in)
            };
            parts.push(format!(
                "{} p={p} busy {:.0}% {rate}{lag}",
                v.name,
                100.0 * r.busy.clamp(0.0, 9.99)
            ));
            self.timeline.push(format!(
                "{at_s:.1},{},{},{},{p},{:.4},{:.2},{:.2},{}",
                self.report.job_id,
                csv_field(&v.name),
                v.id,
                r.busy,
                r.records_in,
                r.records_out,
                r.backlog.map_or(String::new(), |l| format!("{l:.0}"))
            ));
        }
        let dt = b.at_seconds - a.at_seconds;
        if growing {
            self.report.lag_growing_seconds += dt;
        }
        self.report.subtask_seconds +=
            dt * b.operators.values().map(|s| s.len() as f64).sum::<f64>();
        print(&format!(
            "t={at_s:>6.0}s {}: {}",
            short(&self.report.job_id),
            parts.join(" | ")
        ));
    }

    /// One interval: collect, decide, apply.
    async fn tick(
        &mut self,
        rest: &FlinkRest,
        opts: &FlinkOptions,
        now_s: f64,
        slots_available: Option<u32>,
        print: &mut dyn FnMut(&str),
    ) {
        let jid = self.topology.lock().await.job_id.clone();
        let job = match rest.job(&jid).await {
            Ok(job) => job,
            Err(FlinkError::JobNotFound { .. }) => {
                self.end(format!("job {jid} is gone from the cluster"), print);
                return;
            }
            Err(e) => {
                print(&format!("{}: cannot read the job: {e}", short(&jid)));
                return;
            }
        };
        if matches!(job.state.as_str(), "FINISHED" | "CANCELED" | "FAILED") {
            self.end(format!("job {jid} ended ({})", job.state), print);
            return;
        }
        let mut topo = {
            let mut topo = self.topology.lock().await;
            if !topo.same_graph(&job) {
                match FlinkTopology::from_job(&job, &opts.settings, &opts.bounds) {
                    Ok(t) => {
                        print(&format!(
                            "{}: the job graph changed; reading it again",
                            short(&jid)
                        ));
                        *topo = t;
                        self.session.clear_window();
                    }
                    Err(e) => {
                        print(&format!("{}: {e}", short(&jid)));
                        return;
                    }
                }
            }
            topo.clone()
        };
        let mut source = FlinkRestSource {
            collector: &mut self.collector,
            rest,
            job: &job,
            topo: &topo,
            previous: self.session.window().back(),
        };
        let sample = match source.collect(&|| now_s).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                print(&format!(
                    "{}: job {} (not every vertex RUNNING): waiting",
                    short(&jid),
                    job.state
                ));
                return;
            }
            Err(e) => {
                print(&format!("{}: cannot read metrics: {e}", short(&jid)));
                return;
            }
        };
        if self
            .session
            .window()
            .back()
            .is_some_and(|last| metrics::same_counters(last, &sample.sample))
        {
            // Flink has not refreshed its metrics since the last scrape.
            return;
        }
        let parallelism_changed = self.session.window().back().is_some_and(|last| {
            last.operators
                .iter()
                .any(|(n, s)| sample.sample.operators.get(n).map(Vec::len) != Some(s.len()))
        });
        // What the job runs now (a change made outside streamscale included): a savepoint
        // rescale's rollback goes back to it.
        self.handle.parallelism = topo.by_name(&job.parallelism_by_id());
        if parallelism_changed {
            // Rescaled from outside (the user, Flink's own scheduler): a new deployment.
            print(&format!(
                "{}: parallelism changed outside streamscale; measuring again",
                short(&jid)
            ));
            self.session.restarted(now_s);
        }
        if sample.notes != self.last_notes {
            for n in &sample.notes {
                print(&format!("{}: {n}", short(&jid)));
            }
            self.last_notes.clone_from(&sample.notes);
        }
        self.session.observe(now_s, sample.sample);
        self.live_line(now_s, &topo, print);
        let limit = slots_available.map(|free| slots::limit(free, &job));
        if let Some(limit) = limit {
            slots::cap(&mut topo.spec, limit);
        }
        let verdict = self.session.decide(now_s, &topo.spec);
        self.save_state().await;
        match verdict {
            Verdict::Hold {
                reason,
                recommendation,
            } => {
                // A plan held at the slot limit says so.
                let note = limit.zip(recommendation.as_ref()).and_then(|(l, d)| {
                    slots::held_note(d, l, "the cluster's free slots plus the job's")
                });
                let reason = match note {
                    Some(n) => format!("{reason}; {n}"),
                    None => reason,
                };
                // Once per guard and set of operators it holds up or down.
                let key = crate::progress::hold_key(&reason, recommendation.as_ref());
                if key != self.last_hold {
                    print(&format!("{}: HOLD {reason}", short(&jid)));
                    self.last_hold = key;
                }
            }
            Verdict::Rescale(decision) => {
                self.last_hold.clear();
                let from: BTreeMap<String, u32> = decision
                    .current
                    .iter()
                    .map(|(k, v)| (k.to_string(), *v))
                    .collect();
                let to = decision.parallelism.clone();
                let reason = crate::run::rescale_reason(&decision);
                if let Some(left) = self.backoff.wait_at(now_s) {
                    print(&format!(
                        "{}: RESCALE HELD: backing off for {:.0} s more after {} failed attempt(s)",
                        short(&jid),
                        left,
                        self.backoff.failures()
                    ));
                    return;
                }
                let changes = describe(&from, &to);
                if opts.mode == Mode::Recommend {
                    print(&format!("{}: RECOMMEND {changes} ({reason})", short(&jid)));
                    self.report.rescales.push(RescaleRecord {
                        at_seconds: now_s,
                        from,
                        to,
                        path: "none".into(),
                        outcome: "recommended".into(),
                        downtime_seconds: None,
                        reason,
                        savepoint: None,
                        error: None,
                    });
                    // Recommend mode never changes the job: forget the plan's pending state.
                    self.session.autoscaler_mut().restarted(now_s);
                    return;
                }
                print(&format!("{}: RESCALE {changes} ({reason})", short(&jid)));
                let record = self
                    .apply(rest, opts, now_s, &from, &to, reason, &topo, &job)
                    .await;
                match record.outcome.as_str() {
                    "rescaled" => {
                        self.backoff.succeeded();
                        if let Some(d) = record.downtime_seconds {
                            self.session.autoscaler_mut().observe_rescale_downtime(d);
                        }
                        print(&format!(
                            "{}: rescaled by {} in {:.1} s{}",
                            short(&jid),
                            record.path,
                            record.downtime_seconds.unwrap_or(0.0),
                            record
                                .savepoint
                                .as_ref()
                                .map(|s| format!(" (savepoint {s})"))
                                .unwrap_or_default()
                        ));
                        self.report.final_parallelism.clone_from(&to);
                    }
                    "failed" => {
                        print(&format!(
                            "{}: RESCALE FAILED and the job is not running: {}",
                            short(&jid),
                            record.error.clone().unwrap_or_default()
                        ));
                        self.end("rescale failed; the job is not running".into(), print);
                    }
                    other => {
                        let wait = self.backoff.failed(now_s, &to);
                        print(&format!(
                            "{}: RESCALE {other}: {}; the job runs at the old parallelism; BACKOFF {wait:.0} s",
                            short(&jid),
                            record.error.clone().unwrap_or_default()
                        ));
                    }
                }
                let now = now_s + record.downtime_seconds.unwrap_or(0.0);
                self.session.restarted(now);
                let job_id = self.topology.lock().await.job_id.clone();
                if job_id != self.report.job_id {
                    // Resubmitted from a savepoint: the learned state follows the new id.
                    if let Err(e) = self.session.store_mut().move_to(&flink_state_file(&job_id)) {
                        print(&format!("{}: warning: {e}", short(&job_id)));
                    }
                    self.session.forget_saved();
                }
                self.report.job_id = job_id;
                self.report.rescales.push(record);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn apply(
        &mut self,
        rest: &FlinkRest,
        opts: &FlinkOptions,
        now_s: f64,
        from: &BTreeMap<String, u32>,
        to: &BTreeMap<String, u32>,
        reason: String,
        topo: &FlinkTopology,
        job: &JobDetails,
    ) -> RescaleRecord {
        let jid = topo.job_id.clone();
        let mut record = RescaleRecord {
            at_seconds: now_s,
            from: from.clone(),
            to: to.clone(),
            path: "inPlace".into(),
            outcome: "failed".into(),
            downtime_seconds: None,
            reason,
            savepoint: None,
            error: None,
        };
        let timeout = Duration::from_secs_f64(opts.rescale_timeout_s);
        // `auto` rescales in place unless the job says it runs another scheduler than the
        // adaptive one (FLIP-291's resource requirements need it).
        let in_place = match opts.rescale {
            RescalePath::InPlace => true,
            RescalePath::Savepoint => false,
            RescalePath::Auto => job.adaptive_scheduler() != Some(false),
        };
        if in_place {
            match in_place::rescale(rest, &jid, &topo.by_id(to), &topo.by_id(from), timeout).await {
                Ok(InPlaceOutcome::Rescaled { seconds }) => {
                    record.outcome = "rescaled".into();
                    record.downtime_seconds = Some(seconds);
                    self.handle.parallelism.clone_from(to);
                    return record;
                }
                Ok(InPlaceOutcome::TimedOut { seen, seconds }) => {
                    record.outcome = "timedOut".into();
                    record.downtime_seconds = Some(seconds);
                    record.error = Some(format!(
                        "not at the new parallelism within {seconds:.0} s (seen {})",
                        describe_map(&topo.by_name(&seen))
                    ));
                    return record;
                }
                Err(e) => {
                    record.outcome = "refused".into();
                    record.error = Some(e.to_string());
                    return record;
                }
            }
        }
        record.path = "savepoint".into();
        if opts.resubmit.is_none() {
            record.outcome = "notApplied".into();
            record.error = Some(format!(
                "the job runs the {} scheduler, which cannot rescale in place, and no --resubmit-jar/--resubmit-command says how to resubmit it from a savepoint",
                job.scheduler_type.as_deref().unwrap_or("unknown")
            ));
            return record;
        }
        let executor = Executor::new(&self.runtime, Path::new(""))
            .with_running_timeout(Duration::from_secs(5));
        match executor.rescale(self.handle.clone(), to).await {
            Ok(outcome) => {
                record.downtime_seconds = Some(outcome.downtime_s());
                match outcome {
                    RescaleOutcome::Rescaled {
                        engine, savepoint, ..
                    } => {
                        record.outcome = "rescaled".into();
                        record.savepoint = Some(savepoint.path);
                        self.handle = engine;
                    }
                    RescaleOutcome::SavepointFailed { engine, error, .. } => {
                        record.outcome = "savepointFailed".into();
                        record.error = Some(error);
                        self.handle = engine;
                    }
                    RescaleOutcome::RestoreFailed {
                        engine,
                        savepoint,
                        error,
                        ..
                    } => {
                        record.outcome = "restoreFailed".into();
                        record.error = Some(error);
                        record.savepoint = Some(savepoint.path);
                        self.handle = engine;
                    }
                }
            }
            Err(e) => {
                record.outcome = "failed".into();
                record.error = Some(e.to_string());
            }
        }
        record
    }

    /// Writes the learned state when it changed since it was last written (a failure is
    /// logged: the session goes on).
    async fn save_state(&mut self) {
        if let Err(e) = self.session.save_if_changed().await {
            tracing::warn!("{e}");
        }
    }

    fn end(&mut self, why: String, print: &mut dyn FnMut(&str)) {
        print(&format!(
            "{}: {why}; no longer autoscaled",
            short(&self.report.job_id)
        ));
        self.report.ended = Some(why);
        self.done = true;
    }
}

/// What a loaded state holds, for the line that says it was read: `learned: scalability
/// factors of N vertex(es)[, N bins of rate history][, rescale downtime S s]`.
fn learned_summary(s: &crate::state_store::LearnedState) -> String {
    let mut parts = vec![format!(
        "learned: scalability factors of {} vertex(es)",
        s.scalability.factors.len()
    )];
    if let Some(h) = s.history.as_ref().filter(|h| !h.bins.is_empty()) {
        parts.push(format!("{} bins of rate history", h.bins.len()));
    }
    if let Some(d) = s.rescale_downtime_seconds {
        parts.push(format!("rescale downtime {d:.1} s"));
    }
    parts.join(", ")
}

/// Seconds since the Unix epoch now (0 when the clock is before it).
fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn short(jid: &str) -> &str {
    jid.get(..8).unwrap_or(jid)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn describe_map(p: &BTreeMap<String, u32>) -> String {
    p.iter()
        .map(|(n, p)| format!("{n}={p}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `name p→q` for every vertex whose parallelism changes.
fn describe(from: &BTreeMap<String, u32>, to: &BTreeMap<String, u32>) -> String {
    to.iter()
        .filter(|(n, p)| from.get(*n) != Some(*p))
        .map(|(n, p)| format!("{n} {}→{p}", from.get(n).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs `streamscale flink` until `duration_s` or until `stop` resolves; writes the report.
///
/// # Errors
/// [`SessionError`] when the cluster cannot be reached at the start, a named job is not
/// running, or the report cannot be written.
pub async fn run(
    opts: &FlinkOptions,
    client: reqwest::Client,
    stop: impl std::future::Future<Output = ()>,
    print: &mut dyn FnMut(&str),
) -> Result<FlinkSummary, SessionError> {
    if !(opts.interval_s > 0.0 && opts.interval_s.is_finite()) {
        return Err(SessionError::Option(format!(
            "--interval must be a positive number of seconds (got {})",
            opts.interval_s
        )));
    }
    if opts.window_s < opts.interval_s {
        return Err(SessionError::Option(format!(
            "--window ({} s) must be at least --interval ({} s)",
            opts.window_s, opts.interval_s
        )));
    }
    let rest = FlinkRest::new(client, &opts.rest_url).with_credentials(opts.credentials.clone());
    let overview = rest.overview().await?;
    print(&format!(
        "Flink {} at {}: {} TaskManager(s), {} slots ({} free); mode {:?}, rescale {:?}",
        overview.flink_version,
        opts.rest_url,
        overview.task_managers,
        overview.slots_total,
        overview.slots_available,
        opts.mode,
        opts.rescale
    ));
    std::fs::create_dir_all(&opts.report_dir).map_err(|source| SessionError::Report {
        path: opts.report_dir.display().to_string(),
        source,
    })?;
    std::fs::create_dir_all(opts.state_dir()).map_err(|e| {
        SessionError::Option(format!(
            "--state-dir: cannot create {}: {e}",
            opts.state_dir().display()
        ))
    })?;
    // The session's clock: seconds since `started`, which is Unix time `unix0`.
    let (started, unix0) = (Instant::now(), unix_now_s());
    let mut sessions: Vec<JobSession> = Vec::new();
    for jid in &opts.jobs {
        let job = rest.job(jid).await?;
        // A job still starting (CREATED, INITIALIZING, RESTARTING) is waited for; one that
        // has ended is not autoscaled.
        if matches!(
            job.state.as_str(),
            "FINISHED" | "CANCELED" | "CANCELLING" | "FAILED" | "FAILING" | "SUSPENDED"
        ) {
            return Err(SessionError::NotRunning {
                job: jid.clone(),
                state: job.state,
            });
        }
        sessions.push(JobSession::new(&rest, &job, opts, unix0, print).await?);
    }
    let adopt_new = |sessions: &[JobSession], jid: &str| {
        !sessions
            .iter()
            .any(|s| s.report.first_job_id == jid || s.report.job_id == jid)
    };
    if opts.all {
        for j in rest.jobs().await? {
            if j.state == "RUNNING" && adopt_new(&sessions, &j.jid) {
                let job = rest.job(&j.jid).await?;
                sessions.push(JobSession::new(&rest, &job, opts, unix0, print).await?);
            }
        }
    }
    if sessions.is_empty() && !opts.all {
        return Err(SessionError::Option(
            "name the jobs to autoscale (--job ID, repeatable) or pass --all".into(),
        ));
    }
    if sessions.is_empty() {
        print(&format!(
            "no RUNNING job at {} yet; waiting for one",
            opts.rest_url
        ));
    }
    for s in &sessions {
        let t = s.topology.lock().await;
        for b in t.unknown_bounds(&opts.bounds) {
            print(&format!(
                "warning: no vertex named `{b}` in job {}: its bounds are ignored",
                t.job_id
            ));
        }
        print(&format!(
            "job {} `{}`: {}",
            t.job_id,
            t.job_name,
            t.vertices
                .iter()
                .map(|v| format!(
                    "{} ({}, p={}, max {})",
                    v.name,
                    v.role.name(),
                    v.parallelism,
                    v.max_parallelism
                ))
                .collect::<Vec<_>>()
                .join(" -> ")
        ));
    }
    let mut stop = std::pin::pin!(stop);
    let mut next = tokio::time::Instant::now();
    loop {
        let now_s = started.elapsed().as_secs_f64();
        if opts.duration_s.is_some_and(|d| now_s >= d) {
            break;
        }
        if opts.all
            && let Ok(jobs) = rest.jobs().await
        {
            for j in jobs {
                if j.state != "RUNNING" || !adopt_new(&sessions, &j.jid) {
                    continue;
                }
                if let Ok(job) = rest.job(&j.jid).await
                    && let Ok(s) = JobSession::new(&rest, &job, opts, unix0, print).await
                {
                    print(&format!("job {} `{}`: now autoscaled", j.jid, j.name));
                    sessions.push(s);
                }
            }
        }
        let free = rest.overview().await.ok().map(|o| o.slots_available);
        for s in sessions.iter_mut().filter(|s| !s.done) {
            s.tick(&rest, opts, started.elapsed().as_secs_f64(), free, print)
                .await;
        }
        if !opts.all && sessions.iter().all(|s| s.done) {
            print("no job left to autoscale");
            break;
        }
        next += Duration::from_secs_f64(opts.interval_s);
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = &mut stop => {
                print("interrupted: writing the report (the jobs keep running)");
                break;
            }
        }
    }
    for s in &mut sessions {
        s.save_state().await;
    }
    let summary = FlinkSummary {
        rest_url: opts.rest_url.clone(),
        mode: opts.mode,
        duration_seconds: started.elapsed().as_secs_f64(),
        jobs: sessions.iter().map(|s| s.report.clone()).collect(),
    };
    write_report(&opts.report_dir, &summary, &sessions)?;
    print(&format!(
        "report: {}",
        opts.report_dir.join("summary.json").display()
    ));
    Ok(summary)
}

fn write_report(
    dir: &Path,
    summary: &FlinkSummary,
    sessions: &[JobSession],
) -> Result<(), SessionError> {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|source| SessionError::Report {
                path: path.display().to_string(),
                source,
            })
    };
    let json = serde_json::to_string_pretty(summary).map_err(|e| SessionError::Report {
        path: dir.join("summary.json").display().to_string(),
        source: std::io::Error::other(e),
    })?;
    write("summary.json", json + "\n")?;
    let mut csv = String::from(
        "t_seconds,job_id,vertex,vertex_id,parallelism,busy_share,records_in_per_s,records_out_per_s,backlog\n",
    );
    for s in sessions {
        for line in &s.timeline {
            csv.push_str(line);
            csv.push('\n');
        }
    }
    write("timeline.csv", csv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_name_only_the_vertices_that_change() {
        let from: BTreeMap<String, u32> = [("a".to_string(), 1), ("b".to_string(), 2)]
            .into_iter()
            .collect();
        let to: BTreeMap<String, u32> = [("a".to_string(), 1), ("b".to_string(), 4)]
            .into_iter()
            .collect();
        assert_eq!(describe(&from, &to), "b 2→4");
    }

    fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    /// The demo job as a real Flink 2.3 cluster described it (`tests/data/flink/job.json`).
    fn recorded_job() -> JobDetails {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/flink/job.json");
        let text = std::fs::read_to_string(&path).expect("recorded job");
        serde_json::from_str(&text).expect("job details")
    }

    #[test]
    fn a_second_session_starts_from_what_the_first_learned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = FlinkOptions {
            report_dir: dir.path().join("report"),
            state_dir: Some(dir.path().join("state")),
            ..FlinkOptions::default()
        };
        std::fs::create_dir_all(opts.state_dir()).expect("state dir");
        let job = recorded_job();
        // No request is sent while a session is set up and its state kept: nothing listens here.
        let rest = FlinkRest::new(reqwest::Client::new(), "http://127.0.0.1:9");
        let mut lines: Vec<String> = Vec::new();
        block(async {
            let unix0 = 1.0e9;
            let mut first = JobSession::new(&rest, &job, &opts, unix0, &mut |l| {
                lines.push(l.to_string())
            })
            .await
            .expect("first session");
            assert!(lines.is_empty(), "nothing learned yet: {lines:?}");
            let vertex = first.report.vertices[1].name.clone();
            let mut learned = first.session.autoscaler().scalability().clone();
            learned.factors.insert(vertex.clone(), 0.8);
            first.session.autoscaler_mut().set_scalability(learned);
            first.session.autoscaler_mut().observe_rescale_downtime(3.0);
            // Bin 10 of 300 s on the first session's clock: Unix second 1e9 + 3000.
            first
                .session
                .autoscaler_mut()
                .set_rate_history(crate::model::forecast::RateHistory {
                    bin_seconds: 300.0,
                    season_seconds: 86_400.0,
                    bins: vec![(10, 5.0)],
                    ..Default::default()
                });
            first.save_state().await;
            let file = opts.state_dir().join(flink_state_file(&job.jid));
            assert!(file.is_file(), "{} written", file.display());
            assert!(!opts.report_dir.join("learned-state.json").exists());

            // A session started 600 s later (by the Unix clock) reads it back.
            let mut second = JobSession::new(&rest, &job, &opts, unix0 + 600.0, &mut |l| {
                lines.push(l.to_string())
            })
            .await
            .expect("second session");
            let a = second.session.autoscaler();
            assert_eq!(a.scalability().factor(&vertex), 0.8);
            assert_eq!(a.settings().planner.rescale_downtime_seconds, Some(3.0));
            assert_eq!(a.rate_history().bins, vec![(8, 5.0)], "moved to its clock");
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(
                lines[0].contains("scalability factors of 1 vertex")
                    && lines[0].contains(&file.display().to_string()),
                "{lines:?}"
            );
            // Unchanged: not written again.
            assert_eq!(second.session.save_if_changed().await, Ok(false));

            // Another job id has a file of its own, and starts with nothing learned.
            let other = JobDetails {
                jid: "0123456789abcdef0123456789abcdef".into(),
                ..job.clone()
            };
            let third = JobSession::new(&rest, &other, &opts, unix0, &mut |_| {})
                .await
                .expect("other job");
            assert!(third.session.autoscaler().scalability().factors.is_empty());
        });
    }

    #[test]
    fn csv_fields_with_commas_are_quoted() {
        assert_eq!(csv_field("a, b"), "\"a, b\"");
        assert_eq!(csv_field("Source: x"), "Source: x");
    }
}
