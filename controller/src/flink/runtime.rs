//! [`FlinkRuntime`]: a Flink job as an [`EngineRuntime`], so that the one rescale protocol of
//! [`crate::executor::Executor`] (stop-with-savepoint, start at the new parallelism from it,
//! back to the old parallelism from the same savepoint when that fails) drives Flink's
//! savepoint + resubmit path too.
//!
//! A "start" resubmits the job from a savepoint with `pipeline.jobvertex-parallelism-overrides`
//! and returns once every vertex runs at the requested parallelism; a job that comes up at
//! another parallelism (a submission route that ignores the overrides, FLINK-38770) is
//! cancelled and the start fails, so the executor rolls back.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;

use crate::api::{JobOperator, JobStatus};
use crate::runtime::{EngineHandle, EngineRuntime, RuntimeError, Savepoint, StopOutcome};

use super::rest::{FlinkRest, JarSubmission};
use super::topology::FlinkTopology;

/// The configuration key that sets each vertex's parallelism at submission (`vid:p,...`).
pub const OVERRIDES_KEY: &str = "pipeline.jobvertex-parallelism-overrides";
/// The configuration key that restores a submission from a savepoint.
pub const RECOVERY_KEY: &str = "execution.state-recovery.path";

/// How long a failed submission is watched for a job it started all the same.
const SUBMITTED_ANYWAY_WAIT: Duration = Duration::from_secs(5);

/// How a stopped job is submitted again from its savepoint.
#[derive(Debug, Clone, PartialEq)]
pub enum Resubmit {
    /// `POST /jars/:jarid/run` of a jar already uploaded to the cluster, with the savepoint and
    /// the overrides in its `flinkConfiguration`.
    Jar(JarSubmission),
    /// A shell command (run with `sh -c`) whose output names the new job (`JobID <32 hex>`, as
    /// `flink run -d` and PyFlink print it); `{savepoint}` and `{overrides}` in it are
    /// replaced by the savepoint path and the overrides value.
    Command(String),
}

/// Timeouts of the Flink runtime.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlinkTimeouts {
    /// How long a stop-with-savepoint may take.
    pub savepoint: Duration,
    /// How long a resubmitted job may take to run every vertex.
    pub running: Duration,
}

impl Default for FlinkTimeouts {
    fn default() -> Self {
        FlinkTimeouts {
            savepoint: Duration::from_secs(120),
            running: Duration::from_secs(120),
        }
    }
}

/// Flink jobs of one session cluster, started by resubmission from savepoints.
pub struct FlinkRuntime {
    rest: FlinkRest,
    topology: Arc<Mutex<FlinkTopology>>,
    resubmit: Option<Resubmit>,
    savepoint_dir: Option<String>,
    timeouts: FlinkTimeouts,
    next_id: AtomicU64,
    jobs: Mutex<HashMap<u64, String>>,
}

impl FlinkRuntime {
    /// A runtime submitting by `resubmit` (`None`: a start fails, saying how to give one), taking savepoints into `savepoint_dir` (the
    /// cluster's `execution.checkpointing.savepoint-dir` when `None`). `topology` maps the
    /// model's operator names to vertex ids.
    pub fn new(
        rest: FlinkRest,
        topology: Arc<Mutex<FlinkTopology>>,
        resubmit: Option<Resubmit>,
        savepoint_dir: Option<String>,
        timeouts: FlinkTimeouts,
    ) -> FlinkRuntime {
        FlinkRuntime {
            rest,
            topology,
            resubmit,
            savepoint_dir,
            timeouts,
            next_id: AtomicU64::new(1),
            jobs: Mutex::new(HashMap::new()),
        }
    }

    /// A handle for a job that is already running (the one the controller was pointed at).
    pub async fn adopt(&self, jid: &str, parallelism: BTreeMap<String, u32>) -> EngineHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.jobs.lock().await.insert(id, jid.to_string());
        EngineHandle {
            id,
            base_url: format!("{}/jobs/{jid}", self.rest.base_url()),
            parallelism,
            restored_from: None,
        }
    }

    /// The Flink job id of a handle.
    ///
    /// # Errors
    /// [`RuntimeError::UnknownHandle`].
    pub async fn job_id(&self, handle: &EngineHandle) -> Result<String, RuntimeError> {
        self.jobs
            .lock()
            .await
            .get(&handle.id)
            .cloned()
            .ok_or(RuntimeError::UnknownHandle { id: handle.id })
    }

    async fn submit(&self, savepoint: &str, overrides: &str) -> Result<String, RuntimeError> {
        match &self.resubmit {
            None => Err(RuntimeError::Submit(
                "no --resubmit-jar/--resubmit-command says how to submit the job again".into(),
            )),
            Some(Resubmit::Jar(jar)) => {
                let config: BTreeMap<String, String> = [
                    (RECOVERY_KEY.to_string(), savepoint.to_string()),
                    (OVERRIDES_KEY.to_string(), overrides.to_string()),
                ]
                .into_iter()
                .collect();
                Ok(self.rest.run_jar(jar, &config, Some(savepoint)).await?)
            }
            Some(Resubmit::Command(template)) => {
                let command = template
                    .replace("{savepoint}", savepoint)
                    .replace("{overrides}", overrides);
                // Its own process group, so that a command that does not return (a `flink run`
                // without `-d` waits for the job to end) is stopped with what it started.
                let child = tokio::process::Command::new("sh")
                    .arg("-c")
                    .arg(&command)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .process_group(0)
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|e| RuntimeError::Submit(format!("cannot run `{command}`: {e}")))?;
                let pid = child.id();
                let out = match tokio::time::timeout(
                    self.timeouts.running,
                    child.wait_with_output(),
                )
                .await
                {
                    Ok(out) => out.map_err(|e| {
                        RuntimeError::Submit(format!("cannot run `{command}`: {e}"))
                    })?,
                    Err(_) => {
                        if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                            let _ = nix::sys::signal::killpg(
                                nix::unistd::Pid::from_raw(pid),
                                nix::sys::signal::Signal::SIGKILL,
                            );
                        }
                        return Err(RuntimeError::Submit(format!(
                            "resubmit command `{command}` did not return within {:.0} s (stopped; a `flink run` must be detached, `-d`)",
                            self.timeouts.running.as_secs_f64()
                        )));
                    }
                };
                let text = format!(
                    "{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                match job_id_in(&text) {
                    Some(jid) if out.status.success() => Ok(jid),
                    // It said it submitted the job: that job is the one to wait for (it is
                    // checked to run at the asked parallelism); submitting again would start a
                    // second copy from the same savepoint.
                    Some(jid) => {
                        tracing::warn!(
                            "resubmit command `{command}` exited with {} after printing JobID {jid}: taking that job",
                            out.status
                        );
                        Ok(jid)
                    }
                    None => Err(RuntimeError::Submit(format!(
                        "resubmit command `{command}` ({}) printed no `JobID <id>`; its last line: {}",
                        out.status,
                        text.lines()
                            .rev()
                            .map(str::trim)
                            .find(|l| !l.is_empty())
                            .unwrap_or("(no output)")
                    ))),
                }
            }
        }
    }

    /// The job's name and the ids of every job the cluster knows now (`None` when it cannot
    /// be asked).
    async fn jobs_named(&self) -> (String, Option<HashSet<String>>) {
        let name = self.topology.lock().await.job_name.clone();
        let ids = self
            .rest
            .jobs()
            .await
            .ok()
            .map(|jobs| jobs.into_iter().map(|j| j.jid).collect());
        (name, ids)
    }

    /// A job of this program (named `name`, or with the job's vertex ids), not ended, not
    /// among `before` and not restored from another savepoint than `savepoint` (when Flink says
    /// already), that shows on the cluster within [`SUBMITTED_ANYWAY_WAIT`] after a failed
    /// submission.
    async fn submitted_anyway(
        &self,
        name: &str,
        before: &HashSet<String>,
        savepoint: &str,
    ) -> Option<String> {
        let started = std::time::Instant::now();
        let vertex_ids: BTreeSet<String> = {
            let t = self.topology.lock().await;
            t.vertices.iter().map(|v| v.id.clone()).collect()
        };
        loop {
            let new: Vec<_> = self
                .rest
                .jobs()
                .await
                .unwrap_or_default()
                .into_iter()
                .filter(|j| {
                    !before.contains(&j.jid)
                        && !matches!(j.state.as_str(), "FAILED" | "CANCELED" | "FINISHED")
                })
                .collect();
            // The same name, or the same program under another name (its vertex ids, hashes
            // of the job graph, are the job's); not a copy restored from elsewhere.
            for j in new {
                let ours = j.name == name
                    || self.rest.job(&j.jid).await.is_ok_and(|details| {
                        !vertex_ids.is_empty()
                            && details
                                .vertices
                                .iter()
                                .map(|v| v.id.clone())
                                .collect::<BTreeSet<_>>()
                                == vertex_ids
                    });
                // Asked only of a job of this program.
                if ours
                    && !matches!(
                        self.rest.restored_from(&j.jid).await,
                        Ok(Some(from)) if same_location(&from, savepoint) == Some(false)
                    )
                {
                    return Some(j.jid);
                }
            }
            if started.elapsed() >= SUBMITTED_ANYWAY_WAIT {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until `jid` runs every vertex; then checks the parallelism against `wanted` (by
    /// vertex id).
    async fn wait_at(&self, jid: &str, wanted: &BTreeMap<String, u32>) -> Result<(), RuntimeError> {
        let started = std::time::Instant::now();
        loop {
            let last = match self.rest.job(jid).await {
                Ok(job) if job.all_running() => {
                    let got = job.parallelism_by_id();
                    let off: Vec<String> = wanted
                        .iter()
                        .filter(|(vid, p)| got.get(*vid) != Some(*p))
                        .map(|(vid, p)| {
                            format!(
                                "{vid} at {} (asked {p})",
                                got.get(vid).copied().unwrap_or(0)
                            )
                        })
                        .collect();
                    if off.is_empty() {
                        return Ok(());
                    }
                    let _ = self.rest.cancel(jid).await;
                    let slots = self.rest.overview().await.map(|o| o.slots_total).ok();
                    let most = wanted.values().copied().max().unwrap_or(0);
                    let why = match slots {
                        Some(s) if most > s => format!("the cluster has {s} slots"),
                        _ => format!(
                            "the submission ignored {OVERRIDES_KEY} (Flink 2.x applies it only to a job graph built by the client, FLINK-38770), or slots were short"
                        ),
                    };
                    return Err(RuntimeError::Submit(format!(
                        "job {jid} came up at another parallelism: {} ({why}); cancelled",
                        off.join(", ")
                    )));
                }
                Ok(job) if matches!(job.state.as_str(), "FAILED" | "CANCELED" | "FINISHED") => {
                    return Err(RuntimeError::Exited {
                        status: format!("job {jid} {}", job.state),
                        last_error: "see the JobManager's log or GET /jobs/<id>/exceptions".into(),
                    });
                }
                Ok(job) => format!("job {}", job.state),
                Err(e) => e.to_string(),
            };
            if started.elapsed() >= self.timeouts.running {
                let _ = self.rest.cancel(jid).await;
                return Err(RuntimeError::Submit(format!(
                    "job {jid} was not running within {:.0} s (last: {last}); cancelled",
                    self.timeouts.running.as_secs_f64()
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Whether two savepoint locations name the same directory (`file:/a`, `file:///a` and `/a`
/// alike; a trailing `/` ignored); `None` when either is empty.
fn same_location(a: &str, b: &str) -> Option<bool> {
    let norm = |s: &str| {
        let s = s.strip_prefix("file:").unwrap_or(s);
        s.trim_start_matches('/').trim_end_matches('/').to_string()
    };
    let (a, b) = (norm(a), norm(b));
    (!a.is_empty() && !b.is_empty()).then_some(a == b)
}

/// The first `JobID <32 hex digits>` (or `JobID: <id>`) of a submission's output.
pub fn job_id_in(text: &str) -> Option<String> {
    let mut rest = text;
    while let Some(i) = rest.find("JobID") {
        rest = &rest[i + "JobID".len()..];
        let token: String = rest
            .trim_start_matches([' ', ':', '\t'])
            .chars()
            .take_while(char::is_ascii_hexdigit)
            .collect();
        if token.len() == 32 {
            return Some(token);
        }
    }
    None
}

fn status_of(job: &super::rest::JobDetails, topology: &FlinkTopology) -> JobStatus {
    let state = match job.state.as_str() {
        "RUNNING" if job.all_running() => "running",
        "FINISHED" => "finished",
        "FAILED" => "failed",
        "CANCELED" => "stopped",
        _ => "starting",
    };
    JobStatus {
        name: job.name.clone(),
        state: state.to_string(),
        max_parallelism: topology.spec.max_parallelism,
        operators: job
            .vertices
            .iter()
            .map(|v| JobOperator {
                name: topology
                    .vertices
                    .iter()
                    .find(|t| t.id == v.id)
                    .map_or_else(|| v.name.clone(), |t| t.name.clone()),
                parallelism: v.parallelism,
                ..JobOperator::default()
            })
            .collect(),
        ..JobStatus::default()
    }
}

impl EngineRuntime for FlinkRuntime {
    async fn start(
        &self,
        _job: &Path,
        parallelism: &BTreeMap<String, u32>,
        restore: Option<&Savepoint>,
    ) -> Result<EngineHandle, RuntimeError> {
        let Some(savepoint) = restore else {
            return Err(RuntimeError::Submit(
                "a Flink job is only started again from a savepoint (its state would be lost)"
                    .into(),
            ));
        };
        let (overrides, wanted) = {
            let t = self.topology.lock().await;
            (t.overrides(parallelism), t.by_id(parallelism))
        };
        let (name, before) = self.jobs_named().await;
        let jid = match self.submit(&savepoint.path, &overrides).await {
            Ok(jid) => jid,
            // A submission whose answer failed may have started the job all the same (a client
            // or proxy timeout while `main()` ran, a command that printed its JobID and exited
            // non-zero): submitting again would run two copies from one savepoint.
            Err(e) => match match &before {
                Some(before) => self.submitted_anyway(&name, before, &savepoint.path).await,
                None => None,
            } {
                Some(jid) => {
                    tracing::warn!(
                        "the submission failed ({e}), but job {jid} named `{name}` started on the cluster meanwhile: taking it as the resubmitted job"
                    );
                    jid
                }
                None => return Err(e),
            },
        };
        self.wait_at(&jid, &wanted).await?;
        let mut handle = self.adopt(&jid, parallelism.clone()).await;
        handle.restored_from = Some(savepoint.clone());
        // The new job has a new id: the topology follows it (vertex ids stay).
        self.topology.lock().await.job_id = jid;
        Ok(handle)
    }

    async fn stop_with_savepoint(
        &self,
        handle: &EngineHandle,
        _drain: bool,
    ) -> Result<StopOutcome, RuntimeError> {
        let jid = self.job_id(handle).await?;
        let path = self
            .rest
            .stop_with_savepoint(&jid, self.savepoint_dir.as_deref(), self.timeouts.savepoint)
            .await?;
        Ok(StopOutcome {
            savepoint: Savepoint { path },
            final_job: None,
        })
    }

    async fn job_status(&self, handle: &EngineHandle) -> Result<JobStatus, RuntimeError> {
        let jid = self.job_id(handle).await?;
        let job = self.rest.job(&jid).await?;
        Ok(status_of(&job, &*self.topology.lock().await))
    }

    async fn shutdown(&self, handle: &EngineHandle) -> Result<(), RuntimeError> {
        // A stopped Flink job has ended on the cluster; only the handle goes.
        self.jobs
            .lock()
            .await
            .remove(&handle.id)
            .map(|_| ())
            .ok_or(RuntimeError::UnknownHandle { id: handle.id })
    }

    async fn kill(&self, handle: &EngineHandle) -> Result<(), RuntimeError> {
        let jid = self.job_id(handle).await?;
        self.jobs.lock().await.remove(&handle.id);
        self.rest.cancel(&jid).await?;
        Ok(())
    }

    fn recovers_on_its_own(&self) -> bool {
        true
    }

    async fn exited(&self, handle: &EngineHandle) -> Option<RuntimeError> {
        let jid = self.job_id(handle).await.ok()?;
        match self.rest.job(&jid).await {
            Ok(job) if matches!(job.state.as_str(), "FAILED" | "CANCELED" | "FINISHED") => {
                Some(RuntimeError::Exited {
                    status: format!("job {jid} {}", job.state),
                    last_error: "see the JobManager's log or GET /jobs/<id>/exceptions".into(),
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod submit_mock_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn savepoint_locations_compare_across_their_spellings() {
        assert_eq!(
            same_location("file:/tmp/sp/1", "file:///tmp/sp/1/"),
            Some(true)
        );
        assert_eq!(same_location("/tmp/sp/1", "file:/tmp/sp/1"), Some(true));
        assert_eq!(
            same_location("file:/tmp/sp/1", "file:/tmp/sp/2"),
            Some(false)
        );
        assert_eq!(same_location("", "file:/tmp/sp/2"), None);
    }

    #[test]
    fn the_job_id_is_read_from_flink_run_and_pyflink_output() {
        let id = "a1b2c3d4e5f60718293a4b5c6d7e8f90";
        assert_eq!(
            job_id_in(&format!("Job has been submitted with JobID {id}\n")),
            Some(id.to_string())
        );
        assert_eq!(
            job_id_in(&format!("JobID: {id} submitted in 3.1s")),
            Some(id.to_string())
        );
        assert_eq!(job_id_in("JobID abc"), None);
        assert_eq!(job_id_in("nothing"), None);
    }
}
