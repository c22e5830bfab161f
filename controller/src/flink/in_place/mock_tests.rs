//! [`rescale`] against a mock of the JobManager's REST API (loopback, scripted answers).

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::{Value, json};

use super::*;

/// Answers to `GET /jobs/j` in order (the last repeats): `None` is an HTTP 500; and the
/// `PUT /jobs/j/resource-requirements` bodies received.
struct Script {
    reads: Vec<Option<Value>>,
    read: usize,
    puts: Vec<Value>,
    /// Whether a put after the first is refused.
    refuse_put_back: bool,
}

type Shared = Arc<Mutex<Script>>;

fn job(state: &str, p: u32) -> Option<Value> {
    Some(json!({"jid": "j", "name": "job", "state": state, "now": 0,
        "vertices": [{"id": "v", "name": "work", "parallelism": p, "maxParallelism": 128,
            "status": state}],
        "plan": {"nodes": [{"id": "v"}]}}))
}

async fn read(State(s): State<Shared>) -> Result<Json<Value>, StatusCode> {
    let mut s = s.lock().map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    let i = s.read.min(s.reads.len() - 1);
    s.read += 1;
    s.reads[i]
        .clone()
        .map(Json)
        .ok_or(StatusCode::INTERNAL_SERVER_ERROR)
}

async fn put(State(s): State<Shared>, Json(body): Json<Value>) -> Result<Json<Value>, StatusCode> {
    let mut s = s.lock().map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    s.puts.push(body);
    if s.refuse_put_back && s.puts.len() > 1 {
        return Err(StatusCode::SERVICE_UNAVAILABLE);
    }
    Ok(Json(json!({})))
}

/// Serves `reads` (see [`Script`]), refusing the put-back when `refuse_put_back`.
async fn mock_flink(reads: Vec<Option<Value>>, refuse_put_back: bool) -> (FlinkRest, Shared) {
    let shared = Arc::new(Mutex::new(Script {
        reads,
        read: 0,
        puts: Vec::new(),
        refuse_put_back,
    }));
    let app = axum::Router::new()
        .route("/jobs/j", get(read))
        .route("/jobs/j/resource-requirements", axum::routing::put(put))
        .with_state(Arc::clone(&shared));
    (crate::flink::mock_rest::serve(app).await, shared)
}

fn p(n: u32) -> BTreeMap<String, u32> {
    [("v".to_string(), n)].into_iter().collect()
}

#[tokio::test]
async fn reads_that_fail_while_waiting_are_tried_again() {
    let (rest, _) = mock_flink(vec![None, None, job("RUNNING", 2)], false).await;
    let out = rescale(&rest, "j", &p(2), &p(1), Duration::from_secs(20)).await;
    assert!(
        matches!(out, Ok(InPlaceOutcome::Rescaled { .. })),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_job_that_ends_during_the_rescale_is_said_as_such() {
    let (rest, _) = mock_flink(vec![job("CANCELED", 1)], false).await;
    let out = rescale(&rest, "j", &p(2), &p(1), Duration::from_secs(20)).await;
    assert!(
        matches!(&out, Ok(InPlaceOutcome::JobEnded { state, .. }) if state == "CANCELED"),
        "{out:?}"
    );
}

#[tokio::test]
async fn a_put_back_that_fails_is_said() {
    let (rest, shared) = mock_flink(vec![job("RUNNING", 1)], true).await;
    let out = rescale(&rest, "j", &p(2), &p(1), Duration::from_millis(600)).await;
    assert!(
        matches!(&out, Ok(InPlaceOutcome::TimedOut { put_back_error: Some(e), .. }) if e.contains("503")),
        "{out:?}"
    );
    // The request, then three tries of the put-back.
    assert_eq!(shared.lock().expect("script").puts.len(), 4);
}
