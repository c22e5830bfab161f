//! A client for the parts of Apache Flink's REST API the Flink backend uses, and the shapes of
//! their answers.
//!
//! Endpoints (Flink's REST API reference, `/v1` is implied): `GET /overview`, `GET
//! /jobs/overview`, `GET /jobs/:jid`, `GET /jobs/:jid/vertices/:vid`, `GET
//! /jobs/:jid/vertices/:vid/metrics`, `GET|PUT /jobs/:jid/resource-requirements` (FLIP-291),
//! `POST /jobs/:jid/stop` and `GET /jobs/:jid/savepoints/:trigger`, `POST /jars/:jarid/run`,
//! `PATCH /jobs/:jid?mode=cancel`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

/// Errors from talking to a Flink cluster's REST endpoint.
#[derive(Debug, thiserror::Error)]
pub enum FlinkError {
    /// The request failed (connection refused, timeout, ...).
    #[error("{method} {url}: {}", crate::causes::with_causes(source))]
    Http {
        /// `GET`, `PUT`, ...
        method: &'static str,
        /// The URL.
        url: String,
        /// The client's error.
        source: reqwest::Error,
    },
    /// The job id is not known to the cluster (HTTP 404 on a job path).
    #[error(
        "job {job} is not known to the Flink cluster at {base} (finished long ago, cancelled, or a wrong id)"
    )]
    JobNotFound {
        /// The job id.
        job: String,
        /// The cluster's REST URL.
        base: String,
    },
    /// Any other non-success status; `message` is Flink's first error line.
    #[error("{method} {url}: HTTP {status}: {message}")]
    Status {
        /// `GET`, `PUT`, ...
        method: &'static str,
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
        /// Flink's `errors[0]`, first line, or the body's start.
        message: String,
    },
    /// The answer is not the JSON this client expects.
    #[error("{url}: unexpected answer: {message}")]
    Parse {
        /// The URL.
        url: String,
        /// What did not fit.
        message: String,
    },
    /// A savepoint was not completed.
    #[error("savepoint of job {job} failed: {reason}")]
    SavepointFailed {
        /// The job id.
        job: String,
        /// Flink's failure cause, first line.
        reason: String,
    },
    /// An operation did not finish in time.
    #[error("{what}: no result within {seconds:.0} s")]
    Timeout {
        /// What was waited for.
        what: String,
        /// Seconds waited.
        seconds: f64,
    },
}

/// A number from Flink's JSON that may be `NaN` (written as a number, a string, or `null`):
/// `NaN` stands for "not measured" (a source task's busy time).
fn lenient_f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Num {
        N(f64),
        S(String),
        Null(()),
    }
    Ok(match Option::<Num>::deserialize(d)? {
        Some(Num::N(x)) => x,
        Some(Num::S(s)) => s.trim().parse().unwrap_or(f64::NAN),
        Some(Num::Null(())) | None => f64::NAN,
    })
}

/// `GET /overview`: the cluster's slots.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ClusterOverview {
    /// Task slots of all TaskManagers.
    #[serde(rename = "slots-total")]
    pub slots_total: u32,
    /// Task slots not in use.
    #[serde(rename = "slots-available")]
    pub slots_available: u32,
    /// Registered TaskManagers.
    #[serde(rename = "taskmanagers", default)]
    pub task_managers: u32,
    /// Flink's version, e.g. `2.3.0`.
    #[serde(rename = "flink-version", default)]
    pub flink_version: String,
}

/// One job of `GET /jobs/overview`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct JobSummary {
    /// Job id (32 hex digits).
    pub jid: String,
    /// Job name.
    pub name: String,
    /// `RUNNING`, `FINISHED`, `CANCELED`, `FAILED`, `RESTARTING`, ...
    pub state: String,
}

#[derive(Deserialize)]
struct JobsOverview {
    jobs: Vec<JobSummary>,
}

/// One vertex of `GET /jobs/:jid`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VertexSummary {
    /// Vertex id (32 hex digits; stable across submissions of the same job graph).
    pub id: String,
    /// Vertex name, e.g. `Source: trace -> Map` (chained operators joined by ` -> `).
    pub name: String,
    /// Current parallelism.
    pub parallelism: u32,
    /// Max parallelism (the number of key groups of a keyed vertex).
    #[serde(default)]
    pub max_parallelism: i64,
    /// `RUNNING`, `CREATED`, `DEPLOYING`, `INITIALIZING`, ...
    pub status: String,
}

/// One input of a plan node.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PlanInput {
    /// The upstream vertex id.
    pub id: String,
    /// `HASH` (keyed), `FORWARD`, `REBALANCE`, `RESCALE`, `BROADCAST`, ...
    #[serde(default)]
    pub ship_strategy: String,
}

/// One node of the job's plan (a vertex and its inputs).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PlanNode {
    /// The vertex id.
    pub id: String,
    /// The vertex's inputs; absent for sources.
    #[serde(default)]
    pub inputs: Vec<PlanInput>,
}

/// The job's plan: vertices and edges.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Plan {
    /// One node per vertex.
    #[serde(default)]
    pub nodes: Vec<PlanNode>,
}

/// `GET /jobs/:jid`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct JobDetails {
    /// Job id.
    pub jid: String,
    /// Job name.
    pub name: String,
    /// Job state (`RUNNING`, `RESTARTING`, `FINISHED`, ...).
    pub state: String,
    /// JobManager time of the answer, milliseconds since the Unix epoch.
    #[serde(default)]
    pub now: i64,
    /// `Adaptive` or `Default` (Flink 1.17 and later; `None` from older versions).
    #[serde(rename = "schedulerType", default)]
    pub scheduler_type: Option<String>,
    /// The vertices.
    pub vertices: Vec<VertexSummary>,
    /// Vertices and edges.
    #[serde(deserialize_with = "plan_object_or_string")]
    pub plan: Plan,
}

/// Flink 1.x answers the plan as an object, later versions may send it JSON-encoded in a
/// string.
fn plan_object_or_string<'de, D: Deserializer<'de>>(d: D) -> Result<Plan, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum P {
        Obj(Plan),
        Str(String),
    }
    match P::deserialize(d)? {
        P::Obj(p) => Ok(p),
        P::Str(s) => serde_json::from_str(&s).map_err(serde::de::Error::custom),
    }
}

impl JobDetails {
    /// Whether the job and every vertex are `RUNNING`.
    pub fn all_running(&self) -> bool {
        self.state == "RUNNING" && self.vertices.iter().all(|v| v.status == "RUNNING")
    }

    /// Whether the job runs the adaptive scheduler, which rescales in place; `None` when
    /// Flink does not say.
    pub fn adaptive_scheduler(&self) -> Option<bool> {
        self.scheduler_type
            .as_deref()
            .map(|t| t.eq_ignore_ascii_case("adaptive"))
    }

    /// Parallelism per vertex id.
    pub fn parallelism_by_id(&self) -> BTreeMap<String, u32> {
        self.vertices
            .iter()
            .map(|v| (v.id.clone(), v.parallelism))
            .collect()
    }
}

/// The cumulative counters of one subtask in `GET /jobs/:jid/vertices/:vid`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SubtaskCounters {
    /// Records read from the network (0 for sources: they read none).
    #[serde(rename = "read-records", deserialize_with = "lenient_f64", default)]
    pub read_records: f64,
    /// Whether `read_records` covers every input channel.
    #[serde(rename = "read-records-complete", default)]
    pub read_records_complete: bool,
    /// Records written to the network.
    #[serde(rename = "write-records", deserialize_with = "lenient_f64", default)]
    pub write_records: f64,
    /// Whether `write_records` covers every output.
    #[serde(rename = "write-records-complete", default)]
    pub write_records_complete: bool,
    /// Milliseconds busy since the subtask started; `NaN` where Flink does not measure it
    /// (source tasks).
    #[serde(
        rename = "accumulated-busy-time",
        deserialize_with = "lenient_f64",
        default
    )]
    pub busy_ms: f64,
    /// Milliseconds idle (waiting for input) since the subtask started.
    #[serde(
        rename = "accumulated-idle-time",
        deserialize_with = "lenient_f64",
        default
    )]
    pub idle_ms: f64,
    /// Milliseconds back-pressured (waiting for an output buffer) since the subtask started.
    #[serde(
        rename = "accumulated-backpressured-time",
        deserialize_with = "lenient_f64",
        default
    )]
    pub backpressured_ms: f64,
}

/// One subtask of `GET /jobs/:jid/vertices/:vid`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SubtaskDetails {
    /// Subtask index.
    pub subtask: u32,
    /// `RUNNING`, `DEPLOYING`, ...
    pub status: String,
    /// When the current attempt started, milliseconds since the Unix epoch.
    #[serde(rename = "start-time", default)]
    pub start_time_ms: i64,
    /// Its counters; absent before the first metric fetch.
    #[serde(default)]
    pub metrics: Option<SubtaskCounters>,
}

/// `GET /jobs/:jid/vertices/:vid`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct VertexDetails {
    /// Vertex id.
    pub id: String,
    /// Vertex name.
    pub name: String,
    /// Parallelism.
    pub parallelism: u32,
    /// JobManager time of the answer, milliseconds since the Unix epoch.
    #[serde(default)]
    pub now: i64,
    /// The subtasks.
    pub subtasks: Vec<SubtaskDetails>,
}

/// One `{id, value}` of a metrics answer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MetricValue {
    /// Metric id, e.g. `0.Source__trace.pendingRecords`.
    pub id: String,
    /// Its value (a string in Flink's answer); absent in a listing.
    #[serde(default)]
    pub value: Option<String>,
}

#[derive(Deserialize)]
struct TriggerId {
    #[serde(rename = "request-id")]
    request_id: String,
}

#[derive(Deserialize)]
struct AsyncStatus {
    id: String,
}

#[derive(Deserialize)]
struct AsyncOperation {
    status: AsyncStatus,
    #[serde(default)]
    operation: Option<serde_json::Value>,
}

/// How long a stop-with-savepoint still in progress at its timeout is waited for before it
/// counts as timed out (Flink does not abort it; its checkpoint timeout fails it, 10 min by
/// default).
pub const STOP_IN_PROGRESS_WAIT: Duration = Duration::from_secs(600);

/// The parts of `GET /jobs/:jid/checkpoints` read here.
#[derive(Debug, Default, Deserialize)]
struct CheckpointingStatistics {
    #[serde(default)]
    latest: LatestCheckpoints,
    #[serde(default)]
    history: Vec<CheckpointStatistics>,
}

#[derive(Debug, Default, Deserialize)]
struct LatestCheckpoints {
    #[serde(default)]
    savepoint: Option<CheckpointStatistics>,
    #[serde(default)]
    restored: Option<RestoredCheckpoint>,
}

/// `latest.restored`: what the job was restored from.
#[derive(Debug, Default, Deserialize)]
struct RestoredCheckpoint {
    #[serde(default)]
    external_path: Option<String>,
}

/// One checkpoint or savepoint of the statistics.
#[derive(Debug, Clone, Default, Deserialize)]
struct CheckpointStatistics {
    #[serde(default)]
    status: String,
    #[serde(default)]
    is_savepoint: bool,
    #[serde(default)]
    trigger_timestamp: i64,
    #[serde(default)]
    external_path: Option<String>,
}

impl CheckpointingStatistics {
    fn savepoint_since(&self, since_ms: i64) -> Option<String> {
        let fits = |c: &&CheckpointStatistics| {
            c.status == "COMPLETED" && c.trigger_timestamp >= since_ms && c.external_path.is_some()
        };
        self.latest
            .savepoint
            .iter()
            .chain(self.history.iter().filter(|c| c.is_savepoint))
            .filter(fits)
            .max_by_key(|c| c.trigger_timestamp)
            .and_then(|c| c.external_path.clone())
    }
}

#[derive(Deserialize)]
struct JarList {
    #[serde(default)]
    files: Vec<JarFile>,
}

#[derive(Deserialize)]
struct JarFile {
    id: String,
}

#[derive(Deserialize)]
struct JarRunResponse {
    jobid: String,
}

/// A parallelism range of one vertex (FLIP-291's resource requirements).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParallelismRange {
    /// Lowest parallelism the scheduler may run.
    pub lower_bound: u32,
    /// Highest parallelism the scheduler may run.
    pub upper_bound: u32,
}

/// One vertex's resource requirement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VertexRequirement {
    /// Its parallelism range.
    pub parallelism: ParallelismRange,
}

/// How to submit a job to a session cluster from an uploaded jar (`POST /jars/:jarid/run`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JarSubmission {
    /// The jar's id on the cluster (the `filename`'s last part from `POST /jars/upload`).
    pub jar_id: String,
    /// Main class; `None` uses the jar manifest's.
    pub entry_class: Option<String>,
    /// Program arguments.
    pub args: Vec<String>,
}

/// Flink's error answer: `{"errors": ["..."]}`.
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    errors: Vec<String>,
}

/// The first line of Flink's first error (its answers carry whole Java stack traces).
fn first_error_line(body: &str) -> String {
    let errors = serde_json::from_str::<ErrorBody>(body)
        .map(|b| b.errors)
        .unwrap_or_else(|_| vec![body.to_string()]);
    let lines = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("<Exception on server side"))
            .map(str::to_string)
            .collect()
    };
    let first = errors
        .iter()
        .flat_map(|e| lines(e))
        .next()
        .unwrap_or_else(|| "(empty answer)".to_string());
    // Flink answers a handler's exception as `["Internal server error.", "<Exception on server
    // side:\n...stack...>"]`: the stack's innermost cause says what went wrong.
    let cause = (first == "Internal server error.")
        .then(|| {
            errors.iter().skip(1).flat_map(|e| lines(e)).rfind(|l| {
                !l.starts_with("at ")
                    && !l.starts_with("...")
                    && (l.contains("Exception") || l.contains("Error"))
            })
        })
        .flatten();
    let line = match cause {
        Some(c) => format!("{first} ({c})"),
        None => first,
    };
    line.chars().take(300).collect()
}

/// A Flink cluster's REST endpoint.
#[derive(Debug, Clone)]
pub struct FlinkRest {
    client: reqwest::Client,
    base: String,
    credentials: crate::flink::rest_auth::RestCredentials,
}

impl FlinkRest {
    /// A client for the cluster at `base` (e.g. `http://127.0.0.1:8081`; a trailing `/` is
    /// dropped).
    pub fn new(client: reqwest::Client, base: &str) -> FlinkRest {
        FlinkRest {
            client,
            base: base.trim_end_matches('/').to_string(),
            credentials: Default::default(),
        }
    }

    /// The same client, sending `credentials` on every request.
    pub fn with_credentials(
        mut self,
        credentials: crate::flink::rest_auth::RestCredentials,
    ) -> FlinkRest {
        self.credentials = credentials;
        self
    }

    /// The cluster's REST URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&serde_json::Value>,
        job: Option<&str>,
    ) -> Result<T, FlinkError> {
        let url = format!("{}{}", self.base, path);
        let mut req = match method {
            "PUT" => self.client.put(&url),
            "POST" => self.client.post(&url),
            "PATCH" => self.client.patch(&url),
            _ => self.client.get(&url),
        };
        if let Some(b) = body {
            req = req.json(b);
        }
        req = self.credentials.apply(req);
        let resp = req.send().await.map_err(|source| FlinkError::Http {
            method,
            url: url.clone(),
            source,
        })?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|source| FlinkError::Http {
            method,
            url: url.clone(),
            source,
        })?;
        if status == 404
            && let Some(job) = job
        {
            return Err(FlinkError::JobNotFound {
                job: job.to_string(),
                base: self.base.clone(),
            });
        }
        if !(200..300).contains(&status) {
            return Err(FlinkError::Status {
                method,
                url,
                status,
                message: first_error_line(&text),
            });
        }
        let text = if text.trim().is_empty() {
            "null"
        } else {
            &text
        };
        serde_json::from_str(text).map_err(|e| FlinkError::Parse {
            url,
            message: e.to_string(),
        })
    }

    /// `GET /overview`.
    ///
    /// # Errors
    /// [`FlinkError`] on a failed request or an unexpected answer.
    pub async fn overview(&self) -> Result<ClusterOverview, FlinkError> {
        self.send("GET", "/overview", None, None).await
    }

    /// `GET /jars`: the ids of the jars uploaded to the cluster.
    ///
    /// # Errors
    /// [`FlinkError`].
    pub async fn jar_ids(&self) -> Result<Vec<String>, FlinkError> {
        let j: JarList = self.send("GET", "/jars", None, None).await?;
        Ok(j.files.into_iter().map(|f| f.id).collect())
    }

    /// `GET /jobs/overview`: every job the cluster knows, finished ones included.
    ///
    /// # Errors
    /// [`FlinkError`].
    pub async fn jobs(&self) -> Result<Vec<JobSummary>, FlinkError> {
        let o: JobsOverview = self.send("GET", "/jobs/overview", None, None).await?;
        Ok(o.jobs)
    }

    /// `GET /jobs/:jid`.
    ///
    /// # Errors
    /// [`FlinkError::JobNotFound`] for an unknown job; other [`FlinkError`]s.
    pub async fn job(&self, jid: &str) -> Result<JobDetails, FlinkError> {
        self.send("GET", &format!("/jobs/{jid}"), None, Some(jid))
            .await
    }

    /// `GET /jobs/:jid/vertices/:vid`.
    ///
    /// # Errors
    /// [`FlinkError`].
    pub async fn vertex(&self, jid: &str, vid: &str) -> Result<VertexDetails, FlinkError> {
        self.send(
            "GET",
            &format!("/jobs/{jid}/vertices/{vid}"),
            None,
            Some(jid),
        )
        .await
    }

    /// `GET /jobs/:jid/vertices/:vid/metrics[?get=ids]`: the listed metric ids (with `get`
    /// empty), or the values of `get`'s ids.
    ///
    /// # Errors
    /// [`FlinkError`].
    pub async fn vertex_metrics(
        &self,
        jid: &str,
        vid: &str,
        get: &[String],
    ) -> Result<Vec<MetricValue>, FlinkError> {
        let mut path = format!("/jobs/{jid}/vertices/{vid}/metrics");
        if !get.is_empty() {
            path.push_str("?get=");
            path.push_str(&get.join(","));
        }
        self.send("GET", &path, None, Some(jid)).await
    }

    /// `PUT /jobs/:jid/resource-requirements`: asks the adaptive scheduler to run each listed
    /// vertex at exactly the given parallelism (lower bound 1, as Flink's autoscaler does, so
    /// that the job keeps running if slots are lost).
    ///
    /// # Errors
    /// [`FlinkError::Status`] when the cluster does not run the adaptive scheduler (Flink
    /// answers that the operation is not supported) or refuses the values.
    pub async fn set_parallelism(
        &self,
        jid: &str,
        parallelism_by_id: &BTreeMap<String, u32>,
    ) -> Result<(), FlinkError> {
        let body: BTreeMap<&String, VertexRequirement> = parallelism_by_id
            .iter()
            .map(|(vid, &p)| {
                (
                    vid,
                    VertexRequirement {
                        parallelism: ParallelismRange {
                            lower_bound: 1,
                            upper_bound: p,
                        },
                    },
                )
            })
            .collect();
        let body = serde_json::to_value(body).map_err(|e| FlinkError::Parse {
            url: self.base.clone(),
            message: e.to_string(),
        })?;
        let _: serde_json::Value = self
            .send(
                "PUT",
                &format!("/jobs/{jid}/resource-requirements"),
                Some(&body),
                Some(jid),
            )
            .await?;
        Ok(())
    }

    /// `GET /jobs/:jid/resource-requirements`.
    ///
    /// # Errors
    /// [`FlinkError`].
    pub async fn resource_requirements(
        &self,
        jid: &str,
    ) -> Result<BTreeMap<String, VertexRequirement>, FlinkError> {
        self.send(
            "GET",
            &format!("/jobs/{jid}/resource-requirements"),
            None,
            Some(jid),
        )
        .await
    }

    /// Stop-with-savepoint into `target_dir` (the cluster's
    /// `execution.checkpointing.savepoint-dir` when `None`): `POST /jobs/:jid/stop`, then polls
    /// the trigger every 200 ms. Returns the savepoint's location.
    ///
    /// Flink does not abort a stop it has accepted, so `timeout` does not end the wait on its
    /// own: a failed poll is retried until `timeout`; at `timeout` the job is read, and a job
    /// that has `FINISHED` stopped with its savepoint (found in `GET /jobs/:jid/checkpoints`,
    /// triggered after the request), one that `FAILED` or was `CANCELED` ends the wait, and a
    /// stop still in progress is waited for up to [`STOP_IN_PROGRESS_WAIT`] more (Flink's own
    /// checkpoint timeout fails a savepoint that cannot complete, 10 min by default).
    ///
    /// # Errors
    /// [`FlinkError::SavepointFailed`] with Flink's cause (the job keeps running, or it ended
    /// without a savepoint); [`FlinkError::Timeout`] when the stop neither completed nor failed
    /// in time (the job was still running then); request errors.
    pub async fn stop_with_savepoint(
        &self,
        jid: &str,
        target_dir: Option<&str>,
        timeout: Duration,
    ) -> Result<String, FlinkError> {
        self.stop_with_savepoint_within(jid, target_dir, timeout, STOP_IN_PROGRESS_WAIT)
            .await
    }

    async fn stop_with_savepoint_within(
        &self,
        jid: &str,
        target_dir: Option<&str>,
        timeout: Duration,
        in_progress_wait: Duration,
    ) -> Result<String, FlinkError> {
        // The JobManager's clock at the request: a savepoint found in the job's history
        // afterwards must have been triggered after it.
        let asked_ms = self.job(jid).await?.now;
        let mut body = serde_json::json!({ "drain": false });
        if let Some(dir) = target_dir {
            body["targetDirectory"] = serde_json::Value::String(dir.to_string());
        }
        let trigger: TriggerId = self
            .send("POST", &format!("/jobs/{jid}/stop"), Some(&body), Some(jid))
            .await?;
        let started = std::time::Instant::now();
        let mut said_late = false;
        let mut finished_without_savepoint = 0u32;
        loop {
            let polled: Result<AsyncOperation, FlinkError> = self
                .send(
                    "GET",
                    &format!("/jobs/{jid}/savepoints/{}", trigger.request_id),
                    None,
                    Some(jid),
                )
                .await;
            let last_error = match polled {
                Ok(op) if op.status.id == "COMPLETED" => {
                    return savepoint_location(jid, op.operation);
                }
                Ok(_) => None,
                Err(e) => Some(e.to_string()),
            };
            if started.elapsed() >= timeout {
                // Past the timeout every answer counts, and a failed request is tried again
                // until the end of the extra wait: giving up while Flink goes on with the stop
                // leaves a stopped job nobody resubmits.
                let hard = started.elapsed() >= timeout + in_progress_wait;
                let state = match self.job(jid).await {
                    Ok(job) => job.state,
                    Err(e) => format!("unreadable ({e})"),
                };
                match state.as_str() {
                    // Stopped: the savepoint completed, its answer lost or late.
                    "FINISHED" => match self.savepoint_since(jid, asked_ms).await {
                        Ok(Some(path)) => return Ok(path),
                        Ok(None) => {
                            finished_without_savepoint += 1;
                            if hard || finished_without_savepoint >= 5 {
                                return Err(FlinkError::SavepointFailed {
                                    job: jid.to_string(),
                                    reason: "the job finished, but its checkpoint history holds no savepoint triggered since the stop request".into(),
                                });
                            }
                        }
                        Err(e) if hard => return Err(e),
                        Err(_) => {}
                    },
                    "FAILED" | "CANCELED" => {
                        return Err(FlinkError::SavepointFailed {
                            job: jid.to_string(),
                            reason: format!("the job ended {state} during the stop"),
                        });
                    }
                    _ if hard => {
                        return Err(FlinkError::Timeout {
                            what: format!(
                                "stop-with-savepoint of job {jid} (trigger {}, still in progress; the job is {state}{})",
                                trigger.request_id,
                                last_error
                                    .map(|e| format!("; last poll: {e}"))
                                    .unwrap_or_default()
                            ),
                            seconds: started.elapsed().as_secs_f64(),
                        });
                    }
                    _ => {}
                }
                if !said_late {
                    said_late = true;
                    tracing::warn!(
                        "stop-with-savepoint of job {jid} still in progress after {:.0} s; waiting for Flink to complete or fail it (up to {:.0} s more)",
                        timeout.as_secs_f64(),
                        in_progress_wait.as_secs_f64()
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What job `jid` was restored from (`latest.restored.external_path` of
    /// `GET /jobs/:jid/checkpoints`); `None` when it says nothing (yet).
    ///
    /// # Errors
    /// [`FlinkError`].
    pub async fn restored_from(&self, jid: &str) -> Result<Option<String>, FlinkError> {
        let stats: CheckpointingStatistics = self
            .send("GET", &format!("/jobs/{jid}/checkpoints"), None, Some(jid))
            .await?;
        Ok(stats.latest.restored.and_then(|r| r.external_path))
    }

    /// The external path of the newest completed savepoint of `jid` triggered at or after
    /// `since_ms` (JobManager time, ms since the Unix epoch), from `GET /jobs/:jid/checkpoints`
    /// (`latest.savepoint`, else the history); `None` when there is none.
    ///
    /// # Errors
    /// [`FlinkError`].
    pub async fn savepoint_since(
        &self,
        jid: &str,
        since_ms: i64,
    ) -> Result<Option<String>, FlinkError> {
        let stats: CheckpointingStatistics = self
            .send("GET", &format!("/jobs/{jid}/checkpoints"), None, Some(jid))
            .await?;
        Ok(stats.savepoint_since(since_ms))
    }

    /// Runs an uploaded jar (`POST /jars/:jarid/run`) with Flink configuration entries (e.g.
    /// `execution.state-recovery.path`, `pipeline.jobvertex-parallelism-overrides`). Returns
    /// the new job's id.
    ///
    /// # Errors
    /// [`FlinkError::Status`] with Flink's reason (unknown jar, a savepoint that does not
    /// match the job, ...).
    pub async fn run_jar(
        &self,
        jar: &JarSubmission,
        config: &BTreeMap<String, String>,
        savepoint: Option<&str>,
    ) -> Result<String, FlinkError> {
        let mut body = serde_json::json!({
            "programArgsList": jar.args,
            "flinkConfiguration": config,
        });
        if let Some(class) = &jar.entry_class {
            body["entryClass"] = serde_json::Value::String(class.clone());
        }
        if let Some(sp) = savepoint {
            body["savepointPath"] = serde_json::Value::String(sp.to_string());
            body["allowNonRestoredState"] = serde_json::Value::Bool(false);
        }
        let r: JarRunResponse = self
            .send(
                "POST",
                &format!("/jars/{}/run", jar.jar_id),
                Some(&body),
                None,
            )
            .await?;
        Ok(r.jobid)
    }

    /// Cancels a job (`PATCH /jobs/:jid?mode=cancel`).
    ///
    /// # Errors
    /// [`FlinkError`].
    pub async fn cancel(&self, jid: &str) -> Result<(), FlinkError> {
        let _: serde_json::Value = self
            .send(
                "PATCH",
                &format!("/jobs/{jid}?mode=cancel"),
                None,
                Some(jid),
            )
            .await?;
        Ok(())
    }
}

/// A Java stack trace as one line: its first line, then its last two `Caused by:` messages
/// (where the reason is: "Failed to create savepoint directory at ...", "Permission denied").
fn with_root_causes(trace: &str) -> String {
    let first = first_error_line(&serde_json::json!({ "errors": [trace] }).to_string());
    let causes: Vec<&str> = trace
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Caused by: "))
        .collect();
    let root: Vec<&str> = causes.iter().rev().take(2).rev().copied().collect();
    if root.is_empty() {
        first
    } else {
        format!("{first} (caused by: {})", root.join("; "))
    }
}

/// The savepoint location of a completed trigger's `operation`, or its failure cause.
fn savepoint_location(
    jid: &str,
    operation: Option<serde_json::Value>,
) -> Result<String, FlinkError> {
    let op = operation.unwrap_or_default();
    if let Some(loc) = op.get("location").and_then(|l| l.as_str()) {
        return Ok(loc.to_string());
    }
    let cause = op
        .get("failure-cause")
        .map(|c| {
            c.get("stack-trace")
                .or_else(|| c.get("class"))
                .and_then(|s| s.as_str())
                .map(with_root_causes)
                .unwrap_or_else(|| c.to_string())
        })
        .unwrap_or_else(|| "no location and no failure cause in the answer".to_string());
    Err(FlinkError::SavepointFailed {
        job: jid.to_string(),
        reason: cause,
    })
}

#[cfg(test)]
mod stop_mock_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_busy_time_reads_as_not_measured() {
        let c: SubtaskCounters = serde_json::from_str(
            r#"{"read-records":0,"write-records":12,"accumulated-busy-time":"NaN",
                "accumulated-idle-time":5,"accumulated-backpressured-time":null}"#,
        )
        .expect("parse");
        assert!(c.busy_ms.is_nan() && c.backpressured_ms.is_nan());
        assert_eq!((c.write_records, c.idle_ms), (12.0, 5.0));
    }

    #[test]
    fn flink_errors_are_cut_to_their_first_line() {
        let body = r#"{"errors":["org.apache.flink.runtime.rest.handler.RestHandlerException: Job x not found\n\tat a.b.c"]}"#;
        assert_eq!(
            first_error_line(body),
            "org.apache.flink.runtime.rest.handler.RestHandlerException: Job x not found"
        );
        assert_eq!(first_error_line("oops"), "oops");
        let generic = r#"{"errors":["Internal server error.","<Exception on server side:\norg.apache.flink.runtime.rest.handler.RestHandlerException: Could not execute application.\n\tat a.b(C.java:1)\nCaused by: java.lang.IllegalArgumentException: Jar file /tmp/x.jar does not exist\n\tat d.e(F.java:2)\n\nEnd of exception on server side>"]}"#;
        assert_eq!(
            first_error_line(generic),
            "Internal server error. (Caused by: java.lang.IllegalArgumentException: Jar file /tmp/x.jar does not exist)"
        );
    }

    #[test]
    fn a_failed_savepoint_names_its_cause() {
        let op = serde_json::json!({"failure-cause": {"class": "java.io.IOException",
            "stack-trace": "java.io.IOException: Permission denied\n\tat x"}});
        let e = savepoint_location("j1", Some(op)).expect_err("failed");
        assert_eq!(
            e.to_string(),
            "savepoint of job j1 failed: java.io.IOException: Permission denied"
        );
        let trace = "java.util.concurrent.CompletionException: stop failed\n\tat x\nCaused by: a.B: outer\nCaused by: java.io.IOException: Failed to create savepoint directory at file:/x\nCaused by: java.nio.file.AccessDeniedException: /x";
        let op = serde_json::json!({"failure-cause": {"stack-trace": trace}});
        assert_eq!(
            savepoint_location("j1", Some(op))
                .expect_err("failed")
                .to_string(),
            "savepoint of job j1 failed: java.util.concurrent.CompletionException: stop failed (caused by: java.io.IOException: Failed to create savepoint directory at file:/x; java.nio.file.AccessDeniedException: /x)"
        );
        let ok = savepoint_location("j1", Some(serde_json::json!({"location": "file:/sp/1"})));
        assert_eq!(ok.expect("location"), "file:/sp/1");
    }
}
