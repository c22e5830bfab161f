//! The types of the engine's REST API (`GET /v1/job`, `/v1/savepoints`), as serialized.

use serde::{Deserialize, Serialize};

/// Lifecycle state of the job, as `GET /v1/job` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Processing records.
    Running,
    /// Stop requested; draining.
    Stopping,
    /// Stopped by a stop-with-savepoint.
    Stopped,
    /// All sources reached their record count and the graph drained.
    Finished,
    /// A subtask failed.
    Failed,
}

/// Status of one savepoint request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavepointStatus {
    /// Savepoint id (also its directory name).
    pub id: String,
    /// `pending`, `completed` or `failed`.
    pub status: String,
    /// Directory of the completed savepoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Body of `POST /v1/savepoints`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavepointRequest {
    /// Stop the job after the savepoint (stop-with-savepoint); false takes a savepoint of the
    /// running job.
    pub stop: bool,
    /// Fire all open windows before stopping (Flink's `--drain`).
    #[serde(default)]
    pub drain: bool,
    /// Savepoint id (and directory name) chosen by the caller, so that a controller can
    /// record it before asking and find the savepoint again after a crash. Letters, digits,
    /// `-`, `_` and `.`, at most 128 characters, not starting with `.`. Default: generated.
    #[serde(default)]
    pub id: Option<String>,
}

/// Checks a caller-chosen savepoint id.
///
/// # Errors
/// A message naming the problem.
pub fn validate_savepoint_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "id: `{id}` is not a valid savepoint id (1-128 letters, digits, `-`, `_`, `.`; not starting with `.`)"
        ))
    }
}

/// One operator in `GET /v1/job`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorInfo {
    /// Operator name.
    pub name: String,
    /// Kind (`source`, `map`, ...).
    pub kind: String,
    /// Current parallelism.
    pub parallelism: u32,
    /// Records received (cumulative across restores).
    pub records_in: u64,
    /// Records emitted, each once however many downstream operators it goes to (cumulative
    /// across restores).
    pub records_out: u64,
}

/// An edge in `GET /v1/job`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EdgeInfo {
    /// Upstream operator.
    pub from: String,
    /// Downstream operator.
    pub to: String,
}

/// Body of `GET /v1/job`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobInfo {
    /// Job name.
    pub name: String,
    /// Structural fingerprint.
    pub fingerprint: String,
    /// Lifecycle state.
    pub state: JobState,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Operators with parallelism and counters.
    pub operators: Vec<OperatorInfo>,
    /// Edges.
    pub edges: Vec<EdgeInfo>,
    /// Record deliveries owed to the sinks (see [`RecordBalance`](crate::server::RecordBalance)): every record a source
    /// emitted, and every record an aggregating operator (`eventWindow`, `windowTop`, `join`)
    /// derived, times its number of paths to a sink. Equals `recordsAccounted +
    /// recordsFiltered` once nothing is in flight (a finished job or a draining stop).
    pub records_emitted: u64,
    /// Records that reached a sink, in source records (a `window` result counts the source
    /// records it aggregates), summed over every sink.
    pub records_accounted: u64,
    /// Records absorbed on purpose on their way to the sinks, times the absorbing operator's
    /// number of paths to a sink: dropped by `filter` or `select`, or consumed by
    /// `eventWindow`, `windowTop` or `join` (whose results are counted in `recordsEmitted`).
    pub records_filtered: u64,
    /// Records the sources emitted, each once (not multiplied by fan-out).
    #[serde(default)]
    pub source_records: u64,
    /// Savepoint this run was restored from.
    pub restored_from: Option<String>,
    /// Subtask failures, if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}
