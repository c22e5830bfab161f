//! [`FlinkRest::stop_with_savepoint`] against a mock of the JobManager's REST API (loopback,
//! scripted answers): a stop whose answer is lost, one still in progress at its timeout, polls
//! that fail for a while.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::*;

/// What the mock answers.
#[derive(Default)]
struct Script {
    /// `GET /jobs/j`'s state.
    job_state: String,
    /// Answers to the trigger polls in order (the last repeats): `None` is an HTTP 500.
    polls: Vec<Option<Value>>,
    polled: usize,
    /// `GET /jobs/j/checkpoints`.
    checkpoints: Value,
    /// Reads of `GET /jobs/j` after the first that fail (HTTP 502, a proxy's).
    failing_job_reads: usize,
    job_reads: usize,
}

type Shared = Arc<Mutex<Script>>;

fn in_progress() -> Option<Value> {
    Some(json!({"status": {"id": "IN_PROGRESS"}}))
}

async fn job(State(s): State<Shared>) -> Result<Json<Value>, StatusCode> {
    let mut s = s.lock().map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    s.job_reads += 1;
    if s.job_reads > 1 && s.job_reads <= 1 + s.failing_job_reads {
        return Err(StatusCode::BAD_GATEWAY);
    }
    Ok(Json(
        json!({"jid": "j", "name": "job", "state": s.job_state, "now": 1000,
        "vertices": [], "plan": {"nodes": []}}),
    ))
}

async fn poll(State(s): State<Shared>) -> Result<Json<Value>, StatusCode> {
    let mut s = s.lock().map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    let i = s.polled.min(s.polls.len() - 1);
    s.polled += 1;
    s.polls[i]
        .clone()
        .map(Json)
        .ok_or(StatusCode::INTERNAL_SERVER_ERROR)
}

async fn checkpoints(State(s): State<Shared>) -> Json<Value> {
    Json(s.lock().map(|s| s.checkpoints.clone()).unwrap_or_default())
}

/// Serves `script` on a loopback port; returns a client of it.
async fn mock_flink(script: Script) -> (FlinkRest, Shared) {
    let shared = Arc::new(Mutex::new(script));
    let app = axum::Router::new()
        .route("/jobs/j", get(job))
        .route(
            "/jobs/j/stop",
            post(|| async { Json(json!({"request-id": "t1"})) }),
        )
        .route("/jobs/j/savepoints/t1", get(poll))
        .route("/jobs/j/checkpoints", get(checkpoints))
        .with_state(Arc::clone(&shared));
    (crate::flink::mock_rest::serve(app).await, shared)
}

fn savepoint(at_ms: i64, path: &str) -> Value {
    json!({"status": "COMPLETED", "is_savepoint": true, "trigger_timestamp": at_ms,
        "external_path": path})
}

const SHORT: Duration = Duration::from_millis(300);

#[tokio::test]
async fn polls_that_fail_for_a_while_are_retried() {
    let done = json!({"status": {"id": "COMPLETED"}, "operation": {"location": "file:/sp/new"}});
    let (rest, shared) = mock_flink(Script {
        job_state: "RUNNING".into(),
        polls: vec![None, None, Some(done)],
        polled: 0,
        checkpoints: json!({}),
        ..Script::default()
    })
    .await;
    let got = rest
        .stop_with_savepoint("j", None, Duration::from_secs(30))
        .await;
    assert_eq!(got.expect("savepoint"), "file:/sp/new");
    assert_eq!(shared.lock().expect("script").polled, 3);
}

#[tokio::test]
async fn a_job_that_stopped_without_an_answer_gives_its_savepoint_and_never_an_older_one() {
    // The answer never comes (the trigger unknown), but the job stopped with a savepoint
    // triggered after the request (JobManager time 1000): that one, not the older one.
    let (rest, _) = mock_flink(Script {
        job_state: "FINISHED".into(),
        polls: vec![None],
        polled: 0,
        checkpoints: json!({"latest": {"savepoint": savepoint(1200, "file:/sp/new")},
            "history": [savepoint(400, "file:/sp/old")]}),
        ..Script::default()
    })
    .await;
    let got = rest
        .stop_with_savepoint_within("j", None, SHORT, SHORT)
        .await;
    assert_eq!(got.expect("the late savepoint"), "file:/sp/new");

    // Only an older savepoint in the history: not taken for this stop's.
    let (rest, _) = mock_flink(Script {
        job_state: "FINISHED".into(),
        polls: vec![None],
        polled: 0,
        checkpoints: json!({"latest": {"savepoint": savepoint(400, "file:/sp/old")}}),
        ..Script::default()
    })
    .await;
    let got = rest
        .stop_with_savepoint_within("j", None, SHORT, SHORT)
        .await;
    assert!(
        matches!(&got, Err(FlinkError::SavepointFailed { reason, .. }) if reason.contains("no savepoint triggered since")),
        "{got:?}"
    );
}

#[tokio::test]
async fn a_stop_still_in_progress_at_its_timeout_is_waited_for() {
    // In progress at the timeout, the job running: waited for, then completed.
    let done = json!({"status": {"id": "COMPLETED"}, "operation": {"location": "file:/sp/late"}});
    let mut polls = vec![in_progress(); 4];
    polls.push(Some(done));
    let (rest, _) = mock_flink(Script {
        job_state: "RUNNING".into(),
        polls,
        polled: 0,
        checkpoints: json!({}),
        ..Script::default()
    })
    .await;
    let got = rest
        .stop_with_savepoint_within(
            "j",
            None,
            Duration::from_millis(100),
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(got.expect("savepoint"), "file:/sp/late");

    // Never done: a timeout after the extra wait, naming the trigger; not before it.
    let (rest, _) = mock_flink(Script {
        job_state: "RUNNING".into(),
        polls: vec![in_progress()],
        polled: 0,
        checkpoints: json!({}),
        ..Script::default()
    })
    .await;
    let started = std::time::Instant::now();
    let got = rest
        .stop_with_savepoint_within("j", None, SHORT, SHORT)
        .await;
    assert!(started.elapsed() >= 2 * SHORT, "{:?}", started.elapsed());
    assert!(
        matches!(&got, Err(FlinkError::Timeout { what, .. }) if what.contains("trigger t1, still in progress; the job is RUNNING")),
        "{got:?}"
    );

    // The job failed during the stop: said at once, not waited for.
    let (rest, _) = mock_flink(Script {
        job_state: "FAILED".into(),
        polls: vec![in_progress()],
        polled: 0,
        checkpoints: json!({}),
        ..Script::default()
    })
    .await;
    let got = rest
        .stop_with_savepoint_within("j", None, SHORT, Duration::from_secs(30))
        .await;
    assert!(
        matches!(&got, Err(FlinkError::SavepointFailed { reason, .. }) if reason.contains("ended FAILED")),
        "{got:?}"
    );
}

#[tokio::test]
async fn requests_that_fail_past_the_timeout_are_tried_again() {
    // The stop's answer lost, and the job's state unreadable for a while (a proxy's 502s):
    // the stopped job's savepoint is found once it can be read.
    let (rest, _) = mock_flink(Script {
        job_state: "FINISHED".into(),
        polls: vec![None],
        checkpoints: json!({"latest": {"savepoint": savepoint(1200, "file:/sp/new")}}),
        failing_job_reads: 3,
        ..Script::default()
    })
    .await;
    let got = rest
        .stop_with_savepoint_within("j", None, SHORT, Duration::from_secs(30))
        .await;
    assert_eq!(got.expect("the late savepoint"), "file:/sp/new");
}
