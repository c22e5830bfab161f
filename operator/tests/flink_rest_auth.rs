//! A FlinkScaler's `spec.restAuth` against real parts: the `streamscale-operator` binary as a
//! local process authenticated as the Helm chart's ServiceAccount (so the chart's RBAC is what
//! reads the Secret), against a REAL kube-apiserver + etcd (`scripts/k8s-testenv.sh`) with the
//! Flink Kubernetes Operator's CRDs.
//!
//! STAND-IN: the Flink REST endpoint is a local HTTPS server (rustls, the test certificate of
//! `engine/tests/data/tls`) playing an authenticating proxy in front of a JobManager: it answers
//! with REST answers recorded from a real Flink 2.3 cluster (`controller/tests/data/flink`) and
//! only to requests carrying the expected bearer token. No Flink runs; the FlinkScaler's mode is
//! `off` (it reads the job, it does not scale).
//!
//! Checks: with the Secret's token and `ca.crt` the scaler sees the job running (the stand-in saw
//! the token over TLS); a wrong token in the Secret shows as HTTP 401; a Secret without usable
//! keys is `RestAuthInvalid` with a Warning Event naming the Secret; no token value ever appears
//! in the status, the Events or the operator's log.
//!
//! Needs the Kubernetes environment (the README's test command installs it). Without it the
//! test is skipped locally and fails with CI=true.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use common::{env, root, run, var};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;
use streamscale_operator::flink_scaler_crd::{FlinkScaler, FlinkScalerStatus, TargetKind};
use streamscale_operator::flink_target::api_resource;

const RELEASE: &str = "fra";
const RELEASE_NS: &str = "streamscale-fra";
const SERVICE_ACCOUNT: &str = "fra-streamscale";
const TARGET: &str = "trace-job";
const SCALER: &str = "trace-job";
const JOB: &str = "26a5696f51d939081ea0bd3885f89d04";
const TOKEN: &str = "flink-proxy-token-7c41d2";
const WRONG: &str = "wrong-proxy-token-99e0a1";

fn data(dir: &str, name: &str) -> PathBuf {
    root().join(dir).join(name)
}

/// The `Authorization` headers the stand-in saw.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Option<String>>>>);

async fn check_auth(State(seen): State<Seen>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let ok = given.as_deref() == Some(&format!("Bearer {TOKEN}"));
    seen.0.lock().expect("lock").push(given);
    if ok {
        next.run(request).await
    } else {
        (StatusCode::UNAUTHORIZED, "{\"errors\":[\"unauthorized\"]}").into_response()
    }
}

/// Starts the stand-in proxy on a loopback port.
async fn stand_in() -> (u16, Seen) {
    let seen = Seen::default();
    let flink = |name: &str| {
        std::fs::read_to_string(data("controller/tests/data/flink", name)).expect("recorded")
    };
    let (overview, job, missing) = (
        flink("overview.json"),
        flink("job.json"),
        flink("job-not-found.json"),
    );
    let app = axum::Router::new()
        .route("/overview", get(move || async move { overview }))
        .route(
            "/jobs/{jid}",
            get(move |UrlPath(jid): UrlPath<String>| async move {
                if jid == JOB {
                    ([(header::CONTENT_TYPE, "application/json")], job).into_response()
                } else {
                    (StatusCode::NOT_FOUND, missing).into_response()
                }
            }),
        )
        .layer(axum::middleware::from_fn_with_state(
            seen.clone(),
            check_auth,
        ));
    let cert = streamscale_engine::tls::ReloadingCert::new(
        &data("engine/tests/data/tls", "server.crt"),
        &data("engine/tests/data/tls", "server.key"),
    )
    .expect("test certificate");
    let config = streamscale_engine::tls::server_config(Arc::new(cert)).expect("config");
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let listener = streamscale_engine::tls::TlsListener::new(tcp, config).expect("listener");
    let port = axum::serve::Listener::local_addr(&listener)
        .expect("address")
        .port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (port, seen)
}

/// The operator process; SIGKILLed when dropped.
struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_operator(kubeconfig: &Path, ns: &str, log: &Path) -> Operator {
    let log = std::fs::File::create(log).expect("operator log");
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let child = Command::new(env!("CARGO_BIN_EXE_streamscale-operator"))
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("WATCH_NAMESPACE", ns)
        .env("METRICS_ADDR", metrics.to_string())
        .env("LEADER_ELECTION", "false")
        .env("FLINK_SUPPORT", "true")
        // debug: what the operator would log at its most talkative must not hold a secret.
        .env(
            "RUST_LOG",
            "debug,kube=info,hyper=info,tower=info,rustls=info",
        )
        .env("NO_COLOR", "1")
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn streamscale-operator");
    Operator(child)
}

async fn client_for(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

async fn service_account_kubeconfig(
    admin: &Client,
    env: &[(String, String)],
    dir: &Path,
) -> PathBuf {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), RELEASE_NS);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let mut token = None;
    for _ in 0..50 {
        if let Ok(t) = sas
            .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
            .await
        {
            token = t.status.map(|s| s.token);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let token = token.expect("TokenRequest for the chart's ServiceAccount");
    let path = dir.join("operator.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testenv\n  cluster: {{server: \"{}\", certificate-authority: \"{}\"}}\nusers:\n- name: sa\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: operator\n  context: {{cluster: testenv, user: sa}}\ncurrent-context: operator\n",
            var(env, "KUBE_APISERVER_URL"),
            var(env, "KUBE_CA_FILE")
        ),
    )
    .expect("write kubeconfig");
    path
}

fn ready(s: &FlinkScalerStatus) -> (String, String, String) {
    s.conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

/// Polls the Ready condition until `ok` holds (at most 120 s: a loaded machine delays the
/// operator's requeues).
async fn wait_ready(
    scalers: &Api<FlinkScaler>,
    what: &str,
    log: &Path,
    ok: impl Fn(&(String, String, String)) -> bool,
) -> FlinkScalerStatus {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = scalers
            .get(SCALER)
            .await
            .expect("get")
            .status
            .unwrap_or_default();
        if ok(&ready(&s)) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within 120 s; Ready {:?}\n--- operator log ---\n{}",
            ready(&s),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn put_secret(secrets: &Api<Secret>, data: serde_json::Value) {
    let s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "flink-rest"},
        "stringData": data,
    }))
    .expect("secret");
    // Replace the whole data (apply would merge keys).
    let _ = secrets.delete("flink-rest", &Default::default()).await;
    secrets
        .create(&PostParams::default(), &s)
        .await
        .expect("create secret");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flink_rest_credentials_come_from_a_secret_and_stay_out_of_status_events_and_logs() {
    let Some(kenv) = env() else {
        return;
    };
    common::cluster::install_chart(kenv, RELEASE, RELEASE_NS);
    let crd = root().join(
        "operator/tests/data/flink-kubernetes-operator-crds/flinkdeployments.flink.apache.org-v1.yml",
    );
    let (ok, out) = run(
        kenv,
        &var(kenv, "KUBECTL"),
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            crd.to_str().unwrap_or_default(),
        ],
        None,
    );
    assert!(ok, "kubectl apply: {out}");
    let admin = client_for(Path::new(&var(kenv, "KUBECONFIG"))).await;
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    crds.patch(
        "flinkscalers.streamscale.dev",
        &PatchParams::apply("streamscale-tests").force(),
        &Patch::Apply(FlinkScaler::crd()),
    )
    .await
    .expect("apply the FlinkScaler CRD");
    for name in [
        "flinkdeployments.flink.apache.org",
        "flinkscalers.streamscale.dev",
    ] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !crds.get(name).await.is_ok_and(|c| {
            c.status.and_then(|s| s.conditions).is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
        }) {
            assert!(Instant::now() < deadline, "CRD {name} not established");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = service_account_kubeconfig(&admin, kenv, dir.path()).await;
    let ns = format!("fra-{}", std::process::id());
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns");
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");

    let (port, seen) = stand_in().await;
    let ca = std::fs::read_to_string(data("engine/tests/data/tls", "ca.crt")).expect("ca");
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
    put_secret(&secrets, json!({"token": TOKEN, "ca.crt": ca})).await;

    // The target, with the job its (absent) Flink operator would report.
    let targets: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        &ns,
        &api_resource(TargetKind::FlinkDeployment),
    );
    let fd: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "flink.apache.org/v1beta1",
        "kind": "FlinkDeployment",
        "metadata": {"name": TARGET},
        "spec": {
            "image": "flink:2.3", "flinkVersion": "v2_2", "serviceAccount": "flink",
            "flinkConfiguration": {"jobmanager.scheduler": "adaptive"},
            "jobManager": {"resource": {"memory": "1024m", "cpu": 1}},
            "taskManager": {"resource": {"memory": "1280m", "cpu": 1}},
            "job": {"jarURI": "local:///opt/flink/usrlib/trace-job.jar", "parallelism": 1},
        },
    }))
    .expect("FlinkDeployment");
    targets
        .patch(
            TARGET,
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(&fd),
        )
        .await
        .expect("create the FlinkDeployment");
    targets
        .patch_status(
            TARGET,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "lifecycleState": "STABLE",
                "jobStatus": {"jobId": JOB, "jobName": "trace-job", "state": "RUNNING"},
            }})),
        )
        .await
        .expect("target status");

    let log = dir.path().join("operator.log");
    let _operator = start_operator(&kubeconfig, &ns, &log);
    let scalers: Api<FlinkScaler> = Api::namespaced(admin.clone(), &ns);
    let scaler: FlinkScaler = serde_json::from_value(json!({
        "apiVersion": "streamscale.dev/v1alpha1",
        "kind": "FlinkScaler",
        "metadata": {"name": SCALER},
        "spec": {
            "targetRef": {"kind": "FlinkDeployment", "name": TARGET},
            "restUrl": format!("https://localhost:{port}"),
            "restAuth": {"secretName": "flink-rest"},
            "autoscaler": {"mode": "off", "metricsIntervalSeconds": 1},
        },
    }))
    .expect("FlinkScaler");
    scalers
        .create(&PostParams::default(), &scaler)
        .await
        .expect("create FlinkScaler");

    // 1. The Secret's token over TLS (trusting the Secret's ca.crt): the job is seen running.
    wait_ready(&scalers, "Ready with the Secret's token", &log, |r| {
        r.0 == "True" && r.1 == "JobRunning"
    })
    .await;
    assert!(
        seen.0
            .lock()
            .expect("lock")
            .iter()
            .any(|h| h.as_deref() == Some(&format!("Bearer {TOKEN}"))),
        "the stand-in never saw the token"
    );

    // 2. A wrong token: the proxy's 401 shows in the status, the token does not.
    put_secret(&secrets, json!({"token": WRONG, "ca.crt": ca})).await;
    let s = wait_ready(&scalers, "401 with a wrong token", &log, |r| {
        r.0 == "False" && r.2.contains("HTTP 401")
    })
    .await;
    assert!(!serde_json::to_string(&s).expect("json").contains(WRONG));

    // 3. A Secret without usable keys: RestAuthInvalid, naming the Secret.
    put_secret(&secrets, json!({"username": "flink"})).await;
    let s = wait_ready(&scalers, "RestAuthInvalid", &log, |r| {
        r.1 == "RestAuthInvalid"
    })
    .await;
    let (_, _, message) = ready(&s);
    assert!(
        message.contains(&format!("Secret {ns}/flink-rest")) && message.contains("password"),
        "{message}"
    );

    // 4. Back to the right token: running again.
    put_secret(&secrets, json!({"token": TOKEN, "ca.crt": ca})).await;
    let s = wait_ready(&scalers, "Ready again", &log, |r| {
        r.0 == "True" && r.1 == "JobRunning"
    })
    .await;

    // No secret value in the status, the Events or the operator's log.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), &ns)
        .list(&Default::default())
        .await
        .expect("events");
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("RestAuthInvalid")),
        "a Warning Event for the bad Secret"
    );
    let events = serde_json::to_string(&events.items).expect("json");
    let status = serde_json::to_string(&s).expect("json");
    let log_text = std::fs::read_to_string(&log).expect("log");
    assert!(
        log_text.contains("flink-rest") || log_text.contains("reconcil"),
        "the log is empty?"
    );
    for secret in [TOKEN, WRONG] {
        for (what, text) in [("status", &status), ("events", &events), ("log", &log_text)] {
            assert!(!text.contains(secret), "{what} holds a token:\n{text}");
        }
    }
    let _ = Api::<Namespace>::all(admin)
        .delete(&ns, &Default::default())
        .await;
}
