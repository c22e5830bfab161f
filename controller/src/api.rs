//! A small client for the engine's REST API (`/v1/job`, `/v1/savepoints`).
//!
//! Used by every [`crate::runtime::EngineRuntime`]: the API is the same whether the engine runs
//! as a local process or in a pod.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Errors talking to an engine's REST API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request failed (connection refused, timeout, bad JSON, ...).
    #[error("{method} {url}: {source}")]
    Http {
        /// HTTP method.
        method: &'static str,
        /// Request URL.
        url: String,
        /// The client's error.
        source: reqwest::Error,
    },
    /// The engine answered with an unexpected status.
    #[error("{method} {url}: HTTP {status}: {body}")]
    Status {
        /// HTTP method.
        method: &'static str,
        /// Request URL.
        url: String,
        /// HTTP status code.
        status: u16,
        /// The response body (truncated).
        body: String,
    },
    /// The savepoint ended in status `failed`.
    #[error("savepoint {id} failed: {reason}")]
    SavepointFailed {
        /// Savepoint id.
        id: String,
        /// The engine's reason.
        reason: String,
    },
    /// The savepoint did not reach a terminal status in time.
    #[error("savepoint {id} still pending after {waited_s:.0} s")]
    SavepointTimeout {
        /// Savepoint id.
        id: String,
        /// Seconds waited.
        waited_s: f64,
    },
    /// The job did not reach state `running` in time.
    #[error("{url}: job not running after {waited_s:.0} s (last: {last})")]
    NotRunning {
        /// The `/v1/job` URL.
        url: String,
        /// Seconds waited.
        waited_s: f64,
        /// The last state or error seen.
        last: String,
    },
}

/// One operator as reported by `GET /v1/job`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobOperator {
    /// Operator name.
    pub name: String,
    /// Operator kind (`source`, `map`, ...).
    pub kind: String,
    /// Number of running subtasks.
    pub parallelism: u32,
    /// Records taken in, all subtasks, since the job first started.
    #[serde(default)]
    pub records_in: u64,
    /// Records emitted, all subtasks, since the job first started.
    #[serde(default)]
    pub records_out: u64,
}

/// The body of `GET /v1/job`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    /// Job name.
    pub name: String,
    /// Structural fingerprint of the job.
    #[serde(default)]
    pub fingerprint: String,
    /// `running`, `stopping`, `stopped`, `finished` or `failed`.
    pub state: String,
    /// Number of key groups.
    #[serde(default)]
    pub max_parallelism: u32,
    /// Operators with their parallelism and record counts.
    #[serde(default)]
    pub operators: Vec<JobOperator>,
    /// Records emitted by all sources since the job first started.
    #[serde(default)]
    pub records_emitted: u64,
    /// Source records whose effect reached a sink.
    #[serde(default)]
    pub records_accounted: u64,
    /// Source records dropped by filters (legitimately never reaching a sink).
    #[serde(default)]
    pub records_filtered: u64,
    /// The savepoint this run was restored from, if any.
    #[serde(default)]
    pub restored_from: Option<String>,
}

#[derive(Deserialize)]
struct SavepointCreated {
    id: String,
}

/// The body of `GET /v1/savepoints/{id}`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SavepointStatus {
    /// Savepoint id.
    pub id: String,
    /// `pending`, `completed` or `failed`.
    pub status: String,
    /// Directory of the completed savepoint.
    #[serde(default)]
    pub path: Option<String>,
    /// Why the savepoint failed.
    #[serde(default)]
    pub reason: Option<String>,
}

/// A completed stop-with-savepoint and the job's final totals.
#[derive(Debug, Clone, PartialEq)]
pub struct SavepointOutcome {
    /// Directory of the savepoint, as the engine names it.
    pub path: String,
    /// `GET /v1/job` once the job had left `stopping`, read just before the completed status
    /// (the engine sets both at once): the final totals.
    pub final_job: JobStatus,
}

/// Client for one engine's REST API at `base_url` (e.g. `http://127.0.0.1:40123`).
#[derive(Debug, Clone)]
pub struct EngineApi {
    client: reqwest::Client,
    base_url: String,
    token: Option<String>,
}

fn truncate(mut s: String) -> String {
    if s.len() > 300 {
        let mut cut = 300;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

impl EngineApi {
    /// A client for the engine at `base_url` (no trailing slash needed).
    pub fn new(client: reqwest::Client, base_url: &str) -> EngineApi {
        EngineApi {
            client,
            base_url: base_url.trim_end_matches('/').to_string(),
            token: None,
        }
    }

    /// Sends `token` as `Authorization: Bearer` on state-changing requests (an engine started
    /// with `--auth-token-file` refuses them without it).
    pub fn with_token(mut self, token: Option<&str>) -> EngineApi {
        self.token = token.map(str::to_string);
        self
    }

    /// `request` with the bearer token, when there is one.
    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => request.bearer_auth(t),
            None => request,
        }
    }

    /// The engine's base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// URL of the engine's Prometheus endpoint.
    pub fn metrics_url(&self) -> String {
        format!("{}/metrics", self.base_url)
    }

    /// `GET /v1/job`.
    ///
    /// # Errors
    /// [`ApiError::Http`] or [`ApiError::Status`].
    pub async fn job(&self) -> Result<JobStatus, ApiError> {
        let url = format!("{}/v1/job", self.base_url);
        self.call("GET", self.client.get(&url), url).await
    }

    /// `GET /v1/shed`: the records the engine's sources have shed so far
    /// (`streamscale_engine::shed`).
    ///
    /// # Errors
    /// [`ApiError::Http`] or [`ApiError::Status`].
    pub async fn shed(&self) -> Result<u64, ApiError> {
        let url = format!("{}/v1/shed", self.base_url);
        let s: streamscale_engine::shed::ShedStatus =
            self.call("GET", self.client.get(&url), url).await?;
        Ok(s.records_shed)
    }

    /// `POST /v1/shed {"share": share}`: every source drops that share of its due records;
    /// returns the records shed so far.
    ///
    /// # Errors
    /// [`ApiError::Http`], or [`ApiError::Status`] (400 for a share outside [0, 1], 401
    /// without the engine's token).
    pub async fn set_shed(&self, share: f64) -> Result<u64, ApiError> {
        let url = format!("{}/v1/shed", self.base_url);
        let request = self
            .authorized(self.client.post(&url))
            .json(&serde_json::json!({ "share": share }));
        let s: streamscale_engine::shed::ShedStatus = self.call("POST", request, url).await?;
        Ok(s.records_shed)
    }

    /// Sends `request` (to `url`, with `method`, both named in errors), checks the status and
    /// decodes the JSON body.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: &'static str,
        request: reqwest::RequestBuilder,
        url: String,
    ) -> Result<T, ApiError> {
        let http = |source| ApiError::Http {
            method,
            url: url.clone(),
            source,
        };
        let response = request.send().await.map_err(http)?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(ApiError::Status {
                method,
                url,
                status: status.as_u16(),
                body: truncate(body),
            });
        }
        response.json().await.map_err(http)
    }

    /// Polls `GET /v1/job` every 100 ms until the state is `running`.
    ///
    /// # Errors
    /// [`ApiError::NotRunning`] after `timeout`, or at once when the job is `failed`/`finished`/`stopped`.
    pub async fn wait_running(&self, timeout: Duration) -> Result<JobStatus, ApiError> {
        let started = tokio::time::Instant::now();
        let url = format!("{}/v1/job", self.base_url);
        loop {
            let last = match self.job().await {
                Ok(job) if job.state == "running" => return Ok(job),
                Ok(job) if matches!(job.state.as_str(), "failed" | "finished" | "stopped") => {
                    return Err(ApiError::NotRunning {
                        url,
                        waited_s: started.elapsed().as_secs_f64(),
                        last: format!("state {}", job.state),
                    });
                }
                Ok(job) => format!("state {}", job.state),
                Err(e) => e.to_string(),
            };
            if started.elapsed() >= timeout {
                return Err(ApiError::NotRunning {
                    url,
                    waited_s: started.elapsed().as_secs_f64(),
                    last,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `POST /v1/savepoints` with `{"stop": true, "drain": drain}`; returns the savepoint id.
    ///
    /// # Errors
    /// [`ApiError::Http`], or [`ApiError::Status`] (409 when the job is not running or a
    /// savepoint is already in progress).
    pub async fn request_stop_with_savepoint(&self, drain: bool) -> Result<String, ApiError> {
        let url = format!("{}/v1/savepoints", self.base_url);
        let request = self
            .authorized(self.client.post(&url))
            .json(&serde_json::json!({ "stop": true, "drain": drain }));
        let created: SavepointCreated = self.call("POST", request, url).await?;
        Ok(created.id)
    }

    /// `POST /v1/savepoints` with `{"stop": true, "drain": drain, "id": id}`: a
    /// stop-with-savepoint under a caller-chosen id, so that a caller can persist the id before
    /// it asks (and poll it after a crash).
    ///
    /// # Errors
    /// As [`Self::request_stop_with_savepoint`]; [`ApiError::Status`] 400 for an invalid id
    /// and 409 when a savepoint with that id already exists (in memory or on disk).
    pub async fn request_stop_with_savepoint_as(
        &self,
        drain: bool,
        id: &str,
    ) -> Result<String, ApiError> {
        let url = format!("{}/v1/savepoints", self.base_url);
        let request = self
            .authorized(self.client.post(&url))
            .json(&serde_json::json!({ "stop": true, "drain": drain, "id": id }));
        let created: SavepointCreated = self.call("POST", request, url).await?;
        Ok(created.id)
    }

    /// `GET /v1/savepoints/{id}`.
    ///
    /// # Errors
    /// [`ApiError::Http`] or [`ApiError::Status`].
    pub async fn savepoint(&self, id: &str) -> Result<SavepointStatus, ApiError> {
        let url = format!("{}/v1/savepoints/{id}", self.base_url);
        self.call("GET", self.client.get(&url), url).await
    }

    /// `DELETE /v1/savepoints/{id}`: disposes of a completed savepoint (the engine answers 204).
    ///
    /// # Errors
    /// [`ApiError::Http`], or [`ApiError::Status`]: 404 when there is no such completed
    /// savepoint, 409 for the one the engine was restored from or a pending one, 400 for an
    /// invalid id.
    pub async fn dispose_savepoint(&self, id: &str) -> Result<(), ApiError> {
        let url = format!("{}/v1/savepoints/{id}", self.base_url);
        let response = self
            .authorized(self.client.delete(&url))
            .send()
            .await
            .map_err(|source| ApiError::Http {
                method: "DELETE",
                url: url.clone(),
                source,
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let body = response.text().await.unwrap_or_default();
        Err(ApiError::Status {
            method: "DELETE",
            url,
            status: status.as_u16(),
            body: truncate(body),
        })
    }

    /// Stop-with-savepoint: requests it, then every 100 ms reads `/v1/job` until the job has
    /// left `stopping`, and only then the savepoint's status. The engine sets the stopped state,
    /// the final counters and the completed status together, and exits 300 ms after the
    /// terminal status was read (`EXIT_GRACE_AFTER_READ`): the job view read just before
    /// holds the final counters, while one read after the status could find the engine gone
    /// on a loaded machine.
    ///
    /// # Errors
    /// [`ApiError::SavepointFailed`] when the engine reports `failed`,
    /// [`ApiError::SavepointTimeout`] after `timeout`, or a request error (after 20 in a row).
    pub async fn stop_with_savepoint(
        &self,
        drain: bool,
        timeout: Duration,
    ) -> Result<SavepointOutcome, ApiError> {
        let id = self.request_stop_with_savepoint(drain).await?;
        let started = tokio::time::Instant::now();
        let mut transient_errors = 0;
        loop {
            let polled = match self.job().await {
                Ok(job) if job.state == "stopping" => Ok(None),
                Ok(job) => self.savepoint(&id).await.map(|s| Some((s, job))),
                Err(e) => Err(e),
            };
            match polled {
                Ok(Some((s, job))) if s.status == "completed" => {
                    let path = s.path.unwrap_or_default();
                    if path.is_empty() {
                        return Err(ApiError::SavepointFailed {
                            id,
                            reason: "completed without a path".into(),
                        });
                    }
                    return Ok(SavepointOutcome {
                        path,
                        final_job: job,
                    });
                }
                Ok(Some((s, _))) if s.status == "failed" => {
                    return Err(ApiError::SavepointFailed {
                        id,
                        reason: s.reason.unwrap_or_else(|| "no reason given".into()),
                    });
                }
                Ok(_) => transient_errors = 0,
                Err(e) => {
                    transient_errors += 1;
                    if transient_errors >= 20 {
                        return Err(e);
                    }
                }
            }
            if started.elapsed() >= timeout {
                return Err(ApiError::SavepointTimeout {
                    id,
                    waited_s: started.elapsed().as_secs_f64(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_status_deserializes_the_engine_json() {
        let body = r#"{"name":"tweets","fingerprint":"ab","state":"running","maxParallelism":128,
            "operators":[{"name":"source","kind":"source","parallelism":1,"recordsIn":0,"recordsOut":10}],
            "edges":[{"from":"source","to":"sink"}],"recordsEmitted":10,"recordsAccounted":9,
            "recordsFiltered":1,"restoredFrom":null}"#;
        let job: JobStatus = serde_json::from_str(body).expect("valid");
        assert_eq!(job.state, "running");
        assert_eq!(job.operators[0].records_out, 10);
        assert_eq!(job.records_accounted, 9);
        assert_eq!(job.restored_from, None);
    }
}
