//! Fast reconciler tests against kube's tower-test mock (the ApiServerVerifier pattern of
//! kube-rs's controller-rs). These are NOT a real API server: see `tests/real_apiserver.rs`.

use std::sync::Arc;

use http::{Request, Response};
use kube::client::Body;
use kube::runtime::events::Reporter;
use kube::{Client, Resource};
use streamscale_operator::crd::{FINALIZER, StreamJob};
use streamscale_operator::metrics::Metrics;
use streamscale_operator::reconciler::{Context, reconcile};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn job(with_finalizer: bool) -> StreamJob {
    let yaml = r#"
apiVersion: streamscale.dev/v1alpha1
kind: StreamJob
metadata:
  name: demo
  namespace: ns
  uid: "0000-1111"
  generation: 1
  annotations: {streamscale.dev/engine-url: "http://127.0.0.1:9"}
spec:
  job:
    name: demo
    operators:
      - {name: source, kind: source, rate: {constant: 100}}
      - {name: map, kind: map, cpu: 10, parallelism: 2}
      - {name: sink, kind: sink}
    edges:
      - {from: source, to: map}
      - {from: map, to: sink}
"#;
    let mut j: StreamJob = serde_saphyr::from_str(yaml).expect("valid");
    if with_finalizer {
        j.meta_mut().finalizers = Some(vec![FINALIZER.to_string()]);
    }
    j
}

fn context() -> (Arc<Context>, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "ns");
    let reporter = Reporter {
        controller: "test".into(),
        instance: None,
    };
    (
        Arc::new(Context::new(client, Metrics::new(), reporter)),
        handle,
    )
}

async fn next(
    handle: &mut Handle,
) -> (
    http::Method,
    String,
    serde_json::Value,
    tower_test::mock::SendResponse<Response<Body>>,
) {
    let (req, send) = handle.next_request().await.expect("a request");
    let method = req.method().clone();
    let uri = req.uri().to_string();
    let bytes = req.into_body().collect_bytes().await.expect("body");
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (method, uri, body, send)
}

fn respond(send: tower_test::mock::SendResponse<Response<Body>>, body: &serde_json::Value) {
    send.send_response(
        Response::builder()
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("response"),
    );
}

fn not_found(send: tower_test::mock::SendResponse<Response<Body>>) {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "NotFound", "code": 404, "message": "not found",
    });
    send.send_response(
        Response::builder()
            .status(404)
            .body(Body::from(serde_json::to_vec(&body).expect("json")))
            .expect("response"),
    );
}

/// Answers a request for the engine token Secret as an API server without it would (GET: 404,
/// POST: created), and a GET of the engine Deployment with 404; `Some(send)` back for any
/// other request.
fn answer_secret(
    method: &http::Method,
    uri: &str,
    body: &serde_json::Value,
    send: tower_test::mock::SendResponse<Response<Body>>,
) -> Option<tower_test::mock::SendResponse<Response<Body>>> {
    if *method == http::Method::GET && uri.contains("/deployments/demo-engine") {
        // No Deployment yet (so none deployed without a token).
        not_found(send);
        return None;
    }
    if !uri.contains("/secrets") {
        return Some(send);
    }
    if *method == http::Method::GET {
        assert!(uri.contains("/secrets/demo-engine-token"), "{uri}");
        not_found(send);
    } else {
        assert_eq!(*method, http::Method::POST, "{uri}");
        assert_eq!(body["metadata"]["name"], "demo-engine-token");
        assert_eq!(body["metadata"]["ownerReferences"][0]["kind"], "StreamJob");
        assert_eq!(
            body["data"]["token"].as_str().map(str::len),
            Some(44),
            "32 hex digits, base64: {body}"
        );
        respond(send, body);
    }
    None
}

#[tokio::test]
async fn first_reconcile_adds_the_finalizer() {
    let (ctx, mut handle) = context();
    let j = job(false);
    let verifier = tokio::spawn(async move {
        let (method, uri, body, send) = next(&mut handle).await;
        assert_eq!(method, http::Method::PATCH);
        assert!(
            uri.starts_with("/apis/streamscale.dev/v1alpha1/namespaces/ns/streamjobs/demo"),
            "{uri}"
        );
        assert!(body.to_string().contains(FINALIZER), "{body}");
        let mut j = job(true);
        j.meta_mut().resource_version = Some("2".into());
        respond(send, &serde_json::to_value(&j).expect("json"));
    });
    reconcile(Arc::new(j), ctx).await.expect("reconcile");
    verifier.await.expect("verifier");
}

#[tokio::test]
async fn reconcile_applies_owned_objects_and_writes_status() {
    let (ctx, mut handle) = context();
    let j = job(true);
    let verifier = tokio::spawn(async move {
        let mut kinds = Vec::new();
        for _ in 0..2 {
            let (method, uri, body, send) = next(&mut handle).await;
            assert!(
                answer_secret(&method, &uri, &body, send).is_none(),
                "the token Secret first: {method} {uri}"
            );
        }
        // The Deployment there now (none yet), whose job graph an edit must keep.
        let (method, uri, _, send) = next(&mut handle).await;
        assert_eq!(method, http::Method::GET, "{uri}");
        assert!(uri.ends_with("/deployments/demo-engine"), "{uri}");
        not_found(send);
        for _ in 0..4 {
            let (method, uri, body, send) = next(&mut handle).await;
            assert_eq!(method, http::Method::PATCH, "{uri}");
            assert!(
                uri.contains("fieldManager=streamscale-operator"),
                "server-side apply: {uri}"
            );
            assert!(uri.contains("force=true"), "{uri}");
            let owner = &body["metadata"]["ownerReferences"][0];
            assert_eq!(owner["kind"], "StreamJob", "{uri}");
            assert_eq!(owner["controller"], true);
            kinds.push(body["kind"].as_str().unwrap_or_default().to_string());
            if body["kind"] == "Deployment" {
                let args = body["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
                assert!(args.contains("map=2,sink=1,source=1"), "{args}");
                assert_eq!(
                    body["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"],
                    "1000m"
                );
            }
            respond(send, &body);
        }
        assert_eq!(
            kinds,
            [
                "ConfigMap",
                "PersistentVolumeClaim",
                "Service",
                "Deployment"
            ]
        );
        let (method, uri, body, send) = next(&mut handle).await;
        assert_eq!(method, http::Method::PATCH);
        assert!(uri.contains("/streamjobs/demo/status"), "{uri}");
        let status = &body["status"];
        assert_eq!(status["phase"], "Deploying");
        assert_eq!(status["totalParallelism"], 4);
        assert_eq!(status["currentParallelism"]["map"], 2);
        assert_eq!(status["observedGeneration"], 1);
        let ready = status["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == "Ready")
            .expect("Ready");
        assert_eq!(ready["status"], "False");
        let mut j = job(true);
        j.status = serde_json::from_value(status.clone()).expect("status");
        respond(send, &serde_json::to_value(&j).expect("json"));
    });
    reconcile(Arc::new(j), ctx).await.expect("reconcile");
    verifier.await.expect("verifier");
}

/// A stand-in engine on loopback: `GET /v1/job` says running (restored from `restored_from`),
/// `DELETE /v1/savepoints/{id}` answers with `answers[id]` and records the id.
async fn fake_engine(
    restored_from: &str,
    answers: &[(&str, u16)],
) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use axum::extract::{Path, State};
    use axum::routing::{delete, get};
    type Shared = (
        Arc<std::sync::Mutex<Vec<String>>>,
        std::collections::HashMap<String, u16>,
    );
    let deleted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let answers: std::collections::HashMap<String, u16> =
        answers.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let job = serde_json::json!({
        "name": "demo", "state": "running", "restoredFrom": restored_from,
        "operators": [
            {"name": "source", "kind": "source", "parallelism": 1},
            {"name": "map", "kind": "map", "parallelism": 2},
            {"name": "sink", "kind": "sink", "parallelism": 1},
        ],
    });
    let app = axum::Router::new()
        .route("/v1/job", get(move || async move { axum::Json(job) }))
        .route(
            "/v1/savepoints/{id}",
            delete(
                |State((deleted, answers)): State<Shared>, Path(id): Path<String>| async move {
                    deleted.lock().expect("lock").push(id.clone());
                    let code = answers.get(&id).copied().unwrap_or(404);
                    let status = http::StatusCode::from_u16(code).expect("status");
                    (status, if code == 204 { "" } else { "engine says no" })
                },
            ),
        )
        .with_state((deleted.clone(), answers));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), deleted)
}

fn history_entry(id: &str) -> serde_json::Value {
    serde_json::json!({"id": id, "path": format!("/sp/{id}"), "time": "2026-12-01T10:00:00Z"})
}

#[tokio::test]
async fn the_oldest_savepoints_beyond_the_history_maximum_are_disposed_through_the_engine() {
    // History a, b, c, d (the job runs from d), maximum 1: a, b and c are asked for; the engine
    // removes a (204), has no b (404) and refuses c (409): a and b leave the history, c stays
    // with a Warning Event, d is never asked for.
    let (url, deleted) = fake_engine("/sp/d", &[("a", 204), ("c", 409)]).await;
    let (ctx, mut handle) = context();
    let mut j = job(true);
    j.meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert("streamscale.dev/engine-url".into(), url);
    j.spec.savepoint_history_max_count = 1;
    j.spec.autoscaler.mode = streamscale_operator::crd::AutoscalerMode::Off;
    let history = ["a", "b", "c", "d"].map(history_entry);
    j.status = serde_json::from_value(serde_json::json!({
        "phase": "Running",
        "restoredFrom": "/sp/d",
        "currentParallelism": {"source": 1, "map": 2, "sink": 1},
        "savepointHistory": history,
    }))
    .expect("status");
    let template = j.clone();
    let verifier = tokio::spawn(async move {
        let mut events = Vec::new();
        let mut status = None;
        while let Ok(Some((req, send))) =
            tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request()).await
        {
            let method = req.method().clone();
            let uri = req.uri().to_string();
            let bytes = req.into_body().collect_bytes().await.expect("body");
            let body: serde_json::Value =
                serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            let Some(send) = answer_secret(&method, &uri, &body, send) else {
                continue;
            };
            if uri.contains("/events") {
                events.push((
                    body["type"].as_str().unwrap_or_default().to_string(),
                    body["reason"].as_str().unwrap_or_default().to_string(),
                    body["note"].as_str().unwrap_or_default().to_string(),
                ));
                respond(send, &body);
            } else if uri.contains("/streamjobs/demo/status") {
                let mut j = template.clone();
                j.status = serde_json::from_value(body["status"].clone()).expect("status");
                status = Some(body["status"].clone());
                respond(send, &serde_json::to_value(&j).expect("json"));
            } else {
                respond(send, &body);
            }
        }
        (events, status)
    });
    reconcile(Arc::new(j), ctx).await.expect("reconcile");
    let (events, status) = verifier.await.expect("verifier");
    assert_eq!(*deleted.lock().expect("lock"), ["a", "b", "c"]);
    let status = status.expect("status written");
    let left: Vec<&str> = status["savepointHistory"]
        .as_array()
        .expect("history")
        .iter()
        .map(|e| e["id"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(left, ["c", "d"], "{status}");
    let disposed: Vec<_> = events
        .iter()
        .filter(|(_, r, _)| r == "SavepointDisposed")
        .collect();
    assert_eq!(disposed.len(), 1, "{events:?}");
    assert!(disposed[0].2.contains("/sp/a"), "{events:?}");
    let failed: Vec<_> = events
        .iter()
        .filter(|(_, r, _)| r == "SavepointDisposalFailed")
        .collect();
    assert_eq!(failed.len(), 1, "{events:?}");
    assert_eq!(failed[0].0, "Warning");
    assert!(
        failed[0].2.contains("/sp/c") && failed[0].2.contains("409"),
        "{events:?}"
    );
}

/// Runs one reconcile of `j` against the mock API server, which answers every request (a
/// status patch with `j` carrying that status, anything else by echoing its body); returns the
/// reconcile's requeue and the requests made, as (method, uri, body).
async fn reconcile_recording(
    j: StreamJob,
) -> (
    kube::runtime::controller::Action,
    Vec<(http::Method, String, serde_json::Value)>,
) {
    let (ctx, mut handle) = context();
    let template = j.clone();
    let verifier = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Ok(Some((req, send))) =
            tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request()).await
        {
            let method = req.method().clone();
            let uri = req.uri().to_string();
            let bytes = req.into_body().collect_bytes().await.expect("body");
            let body: serde_json::Value =
                serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            let Some(send) = answer_secret(&method, &uri, &body, send) else {
                continue;
            };
            if uri.contains("/streamjobs/demo/status") {
                let mut j = template.clone();
                j.status = serde_json::from_value(body["status"].clone()).expect("status");
                respond(send, &serde_json::to_value(&j).expect("json"));
            } else {
                respond(send, &body);
            }
            seen.push((method, uri, body));
        }
        seen
    });
    let requeue = reconcile(Arc::new(j), ctx).await.expect("reconcile");
    (requeue, verifier.await.expect("verifier"))
}

fn condition<'a>(status: &'a serde_json::Value, type_: &str) -> &'a serde_json::Value {
    status["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

/// The demo job with an edge `map -> nowhere` (an operator the job does not have).
fn job_with_dangling_edge() -> StreamJob {
    let mut v = serde_json::to_value(job(true)).expect("json");
    v["spec"]["job"]["edges"]
        .as_array_mut()
        .expect("edges")
        .push(serde_json::json!({"from": "map", "to": "nowhere"}));
    serde_json::from_value(v).expect("still a StreamJob")
}

/// The status a refused StreamJob's reconcile wrote, having asserted that it wrote nothing but
/// status and Events (no ConfigMap, PVC, Service or Deployment).
fn refused_status(seen: &[(http::Method, String, serde_json::Value)]) -> serde_json::Value {
    for (method, uri, _) in seen {
        assert!(
            uri.contains("/streamjobs/demo/status") || uri.contains("/events"),
            "{method} {uri}: nothing but status and Events"
        );
    }
    seen.iter()
        .find(|(_, uri, _)| uri.contains("/streamjobs/demo/status"))
        .map(|(_, _, body)| body["status"].clone())
        .expect("status written")
}

#[tokio::test]
async fn a_job_the_engine_would_refuse_is_not_deployed_and_fails_with_invalid_spec() {
    let j = job_with_dangling_edge();
    let (requeue, seen) = reconcile_recording(j.clone()).await;
    // Nothing owned is applied: no ConfigMap, PVC, Service or Deployment.
    let status = refused_status(&seen);
    assert_eq!(status["phase"], "Failed", "{status}");
    assert_eq!(status["observedGeneration"], 1);
    for type_ in ["Ready", "Degraded"] {
        let c = condition(&status, type_);
        assert_eq!(c["reason"], "InvalidSpec", "{c}");
        let msg = c["message"].as_str().unwrap_or_default();
        assert!(
            msg.starts_with("spec.job.edges[2].to") && msg.contains("nowhere"),
            "{msg}"
        );
    }
    assert_eq!(condition(&status, "Ready")["status"], "False");
    assert_eq!(condition(&status, "Degraded")["status"], "True");
    let events: Vec<_> = seen
        .iter()
        .filter(|(_, uri, _)| uri.contains("/events"))
        .map(|(_, _, body)| body)
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(events[0]["reason"], "InvalidSpec");
    let note = events[0]["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("spec.job.edges[2].to") && note.contains("nowhere"),
        "{note}"
    );
    // Not retried in a hot loop: checked again only after the long recheck interval...
    assert_eq!(
        requeue,
        kube::runtime::controller::Action::requeue(
            streamscale_operator::reconciler::INVALID_SPEC_RECHECK
        )
    );
    assert!(streamscale_operator::reconciler::INVALID_SPEC_RECHECK.as_secs() >= 60);
    // ... and a reconcile of the same refused generation writes and announces nothing again.
    let mut again = j;
    again.status = serde_json::from_value(status).expect("status");
    let (_, seen) = reconcile_recording(again).await;
    assert!(seen.is_empty(), "{seen:?}");
}

/// Bounds for an operator the job does not have (a misspelt name) are refused naming the
/// field, not ignored without a word.
#[tokio::test]
async fn bounds_for_an_operator_the_job_lacks_are_refused_with_invalid_spec() {
    let mut v = serde_json::to_value(job(true)).expect("json");
    v["spec"]["autoscaler"]["parallelism"] = serde_json::json!({"mpa": {"min": 2, "max": 4}});
    let j: StreamJob = serde_json::from_value(v).expect("still a StreamJob");
    let (_, seen) = reconcile_recording(j).await;
    let status = refused_status(&seen);
    assert_eq!(status["phase"], "Failed", "{status}");
    let msg = condition(&status, "Degraded")["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.starts_with("spec.autoscaler.parallelism.mpa: no operator named `mpa`")
            && msg.contains("until spec.autoscaler.parallelism is fixed"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_fixed_job_deploys_at_its_next_generation() {
    // Refused at generation 1 ...
    let (_, seen) = reconcile_recording(job_with_dangling_edge()).await;
    let refused = seen
        .iter()
        .find(|(_, uri, _)| uri.contains("/streamjobs/demo/status"))
        .map(|(_, _, body)| body["status"].clone())
        .expect("status written");
    // ... fixed at generation 2 (the dangling edge removed).
    let mut fixed = job(true);
    fixed.meta_mut().generation = Some(2);
    fixed.status = serde_json::from_value(refused).expect("status");
    let (_, seen) = reconcile_recording(fixed).await;
    let kinds: Vec<&str> = seen
        .iter()
        .filter_map(|(_, _, body)| body["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"Deployment"), "{kinds:?}");
    let status = seen
        .iter()
        .find(|(_, uri, _)| uri.contains("/streamjobs/demo/status"))
        .map(|(_, _, body)| body["status"].clone())
        .expect("status written");
    assert_eq!(status["phase"], "Deploying", "{status}");
    assert_eq!(status["observedGeneration"], 2);
    assert_eq!(condition(&status, "Ready")["reason"], "EngineNotReady");
    assert_eq!(
        condition(&status, "Degraded")["status"],
        "False",
        "{status}"
    );
}
