//! `streamscale flink`: the autoscaling loop over the jobs of a Flink session cluster.
//!
//! Every interval, per job: collect (topology, per-subtask counters) -> evaluate, plan, guard
//! ([`Autoscaler::decide`](crate::model::Autoscaler::decide)) -> realize (in place, or savepoint + resubmit through
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
use super::topology::{self, FlinkTopology, VertexBounds, VertexRole};
use crate::collect::MetricsSource;

mod error;
mod lifecycle;
mod live;
mod options;
mod realize;
mod report;
mod tick;

pub use error::SessionError;
pub use options::{FlinkOptions, Mode, RescalePath};
pub use report::{FlinkSummary, JobReport, RescaleRecord, TimelineRow};
use report::{describe, describe_map, write_report};

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
    last_hold: crate::progress::HoldSaid,
    last_notes: Vec<String>,
    /// Since when (session seconds) the job could not be read, while it cannot.
    unreadable_since: Option<f64>,
    /// Since when (session seconds) the job has not had every vertex `RUNNING` (a failover, a
    /// restart): its first complete sample after counts as a restart.
    not_running_since: Option<f64>,
    report: JobReport,
    timeline: Vec<TimelineRow>,
    done: bool,
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

/// Job `jid` once Flink lists its plan (its graph can be read), read every interval while it
/// is being created (one line says so), or `None` when `stop` resolves first.
///
/// # Errors
/// [`SessionError::NotRunning`] when the job has ended (or ends while waited for) or is still
/// without a plan when the session's duration is over; a REST error.
async fn job_with_plan(
    rest: &FlinkRest,
    jid: &str,
    opts: &FlinkOptions,
    started: Instant,
    mut stop: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    print: &mut dyn FnMut(&str),
) -> Result<Option<JobDetails>, SessionError> {
    let mut said = false;
    loop {
        let job = rest.job(jid).await?;
        // A job still starting (CREATED, INITIALIZING, RESTARTING) is waited for; one that
        // has ended is not autoscaled.
        if matches!(
            job.state.as_str(),
            "FINISHED" | "CANCELED" | "CANCELLING" | "FAILED" | "FAILING" | "SUSPENDED"
        ) || (opts
            .duration_s
            .is_some_and(|d| started.elapsed().as_secs_f64() >= d)
            && !topology::graph_known(&job))
        {
            return Err(SessionError::NotRunning {
                job: jid.to_string(),
                state: job.state,
            });
        }
        if topology::graph_known(&job) {
            return Ok(Some(job));
        }
        if !said {
            print(&format!(
                "{}: job {} (Flink lists no plan yet): waiting for it to run",
                short(jid),
                job.state
            ));
            said = true;
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs_f64(opts.interval_s)) => {}
            () = stop.as_mut() => return Ok(None),
        }
    }
}

/// Checks that `dir` can be used ([`streamscale_engine::writable_dir::check_usable_dir`], as
/// `streamscale run` does) and creates it.
///
/// # Errors
/// [`SessionError::Option`] naming `flag` and the directory.
fn writable_dir(flag: &str, dir: &Path) -> Result<(), SessionError> {
    use streamscale_engine::writable_dir::{DirError, check_usable_dir};
    check_usable_dir(dir)
        .map_err(|e| match e {
            DirError::NotADirectory { .. } => "is a file, not a directory".to_string(),
            e => format!("cannot be written: {e}"),
        })
        .and_then(|()| std::fs::create_dir_all(dir).map_err(|e| format!("cannot be created: {e}")))
        .map_err(|why| SessionError::Option(format!("{flag}: {} {why}", dir.display())))
}

/// Runs `streamscale flink` until `duration_s` or until `stop` resolves; writes the report.
///
/// # Errors
/// [`SessionError`] when the cluster cannot be reached at the start, a named job is not
/// running, `--resubmit-jar` names no jar of the cluster, or the report or state directory
/// cannot be written.
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
    if let Some(Resubmit::Jar(jar)) = &opts.resubmit {
        let ids = rest.jar_ids().await?;
        if !ids.contains(&jar.jar_id) {
            return Err(SessionError::Option(format!(
                "--resubmit-jar {}: no such jar on the cluster (GET /jars lists {})",
                jar.jar_id,
                if ids.is_empty() {
                    "none".to_string()
                } else {
                    ids.join(", ")
                }
            )));
        }
    }
    let mut stop = std::pin::pin!(stop);
    // The session's clock: seconds since `started`, which is Unix time `unix0`.
    let (started, unix0) = (Instant::now(), unix_now_s());
    // The named jobs first (an unknown or ended one ends the session before anything is
    // written); a job still being created is waited for until Flink lists its plan.
    let mut named = Vec::with_capacity(opts.jobs.len());
    for jid in &opts.jobs {
        let Some(job) = job_with_plan(&rest, jid, opts, started, stop.as_mut(), print).await?
        else {
            print("interrupted before any job ran: nothing to report");
            return Ok(FlinkSummary {
                rest_url: opts.rest_url.clone(),
                mode: opts.mode,
                duration_seconds: started.elapsed().as_secs_f64(),
                jobs: Vec::new(),
            });
        };
        // Bounds for a vertex the named job does not have (a typo) would be dropped silently:
        // refused, naming the job's vertices. With --all, jobs differ and it stays a warning.
        if !opts.all {
            let t = FlinkTopology::from_job(&job, &opts.settings, &opts.bounds)?;
            if let Some(b) = t.unknown_bounds(&opts.bounds).first() {
                return Err(SessionError::Option(format!(
                    "--settings: vertices: no vertex named `{b}` in job {jid} (its vertices: {})",
                    t.vertices
                        .iter()
                        .map(|v| format!("`{}`", v.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        named.push(job);
    }
    // Both written at the end (the report) and after decisions (the state): found unwritable
    // now, not after the session.
    writable_dir("--report", &opts.report_dir)?;
    writable_dir("--state-dir", opts.state_dir())?;
    let mut sessions: Vec<JobSession> = Vec::new();
    for job in &named {
        sessions.push(JobSession::new(&rest, job, opts, unix0, print).await?);
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
                if topology::graph_known(&job) {
                    sessions.push(JobSession::new(&rest, &job, opts, unix0, print).await?);
                }
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
        print(&t.describe());
    }
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
                    print(&s.topology.lock().await.describe());
                    sessions.push(s);
                }
            }
        }
        for s in sessions.iter_mut().filter(|s| !s.done) {
            // Read before each job's turn: a job rescaled just before holds slots now.
            let free = rest.overview().await.ok().map(|o| o.slots_available);
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
    let end_s = started.elapsed().as_secs_f64();
    for s in &mut sessions {
        if let Some(since) = s.unreadable_since.take() {
            s.report.unreadable_seconds += end_s - since;
            print(&format!(
                "{}: could not be read for the last {:.0} s of the session",
                short(&s.report.job_id),
                end_s - since
            ));
        }
        s.save_state().await;
    }
    let summary = FlinkSummary {
        rest_url: opts.rest_url.clone(),
        mode: opts.mode,
        duration_seconds: started.elapsed().as_secs_f64(),
        jobs: sessions.iter().map(|s| s.report.clone()).collect(),
    };
    write_report(
        &opts.report_dir,
        &summary,
        &sessions,
        opts.settings.target_utilization,
    )?;
    print(&format!(
        "report: {}",
        opts.report_dir.join("summary.json").display()
    ));
    Ok(summary)
}

#[cfg(test)]
mod tests;
