//! The engine's HTTP endpoints and the coordinator that owns the running job.
//!
//! - `GET /metrics`: Prometheus text.
//! - `GET /v1/job`: graph, parallelism, state, record totals ([`JobInfo`]).
//! - `POST /v1/savepoints` `{"stop": true, "drain": false}`: stop-with-savepoint (a barrier
//!   with the stop flag); `{"stop": false}`: a savepoint of the running job (a barrier); 202
//!   with `{"id"}`.
//! - `GET /v1/savepoints/{id}`: [`SavepointStatus`].
//! - `DELETE /v1/savepoints/{id}`: disposes of the completed savepoint `DIR/ID` in the
//!   engine's savepoint directory (Flink's savepoint disposal; rules in
//!   [`crate::savepoint::disposal`]): 204 when removed; 404 when there is no such savepoint
//!   (nothing named `ID`, or an entry that is not a completed savepoint: a symlink, which is
//!   never followed, a file, or a directory without `_metadata.json`, all left in place); 409
//!   when it is the savepoint this engine was restored from or one still pending; 400 for an
//!   invalid id. Once removed, `GET /v1/savepoints/{id}` answers 404.
//! - `GET|POST /v1/shed`: load shedding at the sources ([`crate::shed`]).
//!
//! With a bearer token ([`crate::auth`]) every request but `GET`/`HEAD` needs it.
//!
//! After a stop-with-savepoint reaches a terminal status and a client has read it, the engine
//! asks its process to exit ([`Coordinator::exit_requested`]; later under a supervisor,
//! [`Coordinator::supervised`]). If a stop-with-savepoint's
//! snapshot was taken but cannot be written, the job resumes from that snapshot in memory
//! (nothing is lost) and the savepoint is reported failed.
//!
//! When a subtask fails and the job has a `checkpoint` section, the job restarts in-process
//! from the latest completed checkpoint after the restart delay, up to the allowed attempts
//! ([`RestartPolicy`]).

use axum::extract::{Path as AxPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::savepoint::Savepoint;
use crate::savepoint::disposal::DisposeError;
use crate::spec::JobSpec;

mod api;
mod balance;
mod coordinator;

pub use api::*;
pub use balance::*;
pub use coordinator::*;

impl Coordinator {
    /// The axum router with every endpoint, state-changing requests guarded by `token` when
    /// one is given ([`crate::auth`]).
    pub fn router_with_auth(&self, token: Option<crate::auth::TokenSource>) -> Router {
        match token {
            Some(t) => self.router().layer(axum::middleware::from_fn_with_state(
                t,
                crate::auth::require_token,
            )),
            None => self.router(),
        }
    }

    /// The axum router with every endpoint (no authentication).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/metrics", get(metrics_handler))
            .route("/v1/job", get(job_handler))
            .route("/v1/savepoints", post(trigger_handler))
            .route(
                "/v1/savepoints/{id}",
                get(status_handler).delete(dispose_handler),
            )
            .route("/v1/shed", get(shed_get).post(shed_post))
            .with_state(self.clone())
    }
}

async fn metrics_handler(State(c): State<Coordinator>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        c.metrics.render() + &crate::shed::render(),
    )
        .into_response()
}

/// `GET /v1/shed` (see [`crate::shed`]).
async fn shed_get() -> Json<crate::shed::ShedStatus> {
    Json(crate::shed::status())
}

/// `POST /v1/shed` `{"share": S}` (see [`crate::shed`]).
async fn shed_post(
    body: Result<Json<crate::shed::ShedRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    match body
        .map_err(|e| e.body_text())
        .and_then(|Json(r)| crate::shed::set_share(r.share))
    {
        Ok(()) => Json(crate::shed::status()).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

async fn job_handler(State(c): State<Coordinator>) -> Json<JobInfo> {
    Json(c.job_info())
}

fn error(code: StatusCode, message: String) -> Response {
    (code, Json(serde_json::json!({ "error": message }))).into_response()
}

async fn trigger_handler(
    State(c): State<Coordinator>,
    body: Result<Json<SavepointRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    if let Some(Err(e)) = req.id.as_deref().map(validate_savepoint_id) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    match tokio::task::spawn_blocking(move || c.trigger(req.stop, req.drain, req.id)).await {
        Ok(Ok(id)) => (StatusCode::ACCEPTED, Json(serde_json::json!({ "id": id }))).into_response(),
        Ok(Err(e)) => error(StatusCode::CONFLICT, e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn status_handler(State(c): State<Coordinator>, AxPath(id): AxPath<String>) -> Response {
    match c.status(&id) {
        Some(st) => Json(st).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!("no savepoint with id `{id}`"),
        ),
    }
}

/// `DELETE /v1/savepoints/{id}` (see the module docs).
async fn dispose_handler(State(c): State<Coordinator>, AxPath(id): AxPath<String>) -> Response {
    match tokio::task::spawn_blocking(move || c.dispose(&id)).await {
        Ok(Ok(_)) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => {
            let code = match &e {
                DisposeError::InvalidId(_) => StatusCode::BAD_REQUEST,
                DisposeError::NotFound { .. } | DisposeError::NotASavepoint { .. } => {
                    StatusCode::NOT_FOUND
                }
                DisposeError::RestoredFrom { .. } | DisposeError::Pending { .. } => {
                    StatusCode::CONFLICT
                }
                DisposeError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(code, e.to_string())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Reads a savepoint for restore, verifying it against `spec` before anything starts.
///
/// # Errors
/// The savepoint error, naming the file and reason.
pub fn load_for_restore(
    dir: &std::path::Path,
    spec: &JobSpec,
) -> Result<Savepoint, crate::savepoint::SavepointError> {
    Savepoint::read(dir, spec)
}
