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
