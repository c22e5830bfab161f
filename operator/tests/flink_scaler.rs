//! The FlinkScaler against real parts: the `streamscale-operator` binary as a local process,
//! authenticated as the Helm chart's ServiceAccount (so the chart's RBAC is what is exercised),
//! against a REAL kube-apiserver + etcd (`scripts/k8s-testenv.sh`) with the Apache Flink
//! Kubernetes Operator 1.15 CRDs installed (`tests/data/flink-kubernetes-operator-crds/`), and a
//! REAL Apache Flink 2.3 session cluster on loopback (`scripts/flink-testenv.sh`, adaptive
//! scheduler) running the project's demo job as the target's job (the FlinkScaler's `restUrl`
//! points at it).
//!
//! STAND-IN: no Flink Kubernetes Operator runs here. The test plays it ([`FlinkOperatorStandIn`]):
//! it sets the FlinkDeployment's `status.jobStatus` to the local job, and when the overrides in
//! `spec.flinkConfiguration["pipeline.jobvertex-parallelism-overrides"]` change it applies them
//! to the local Flink in place (`PUT /jobs/:jid/resource-requirements`, as the Flink operator
//! does with the adaptive scheduler) and writes `status.observedGeneration`,
//! `status.reconciliationStatus.lastReconciledSpec` and `status.lifecycleState` as the Flink
//! operator does. It can be paused (observe nothing) or made to observe without applying, to
//! hold a rescale at a step.
//!
//! One test, its scenarios in sequence on one Flink cluster (a cluster takes 1.2 GB and the
//! script's fixed ports):
//! 0. a StreamQuota of 1 subtask names the FlinkScaler: its plan is held at its share (1 slot,
//!    `status.quota`, a `QuotaShare` Event), and `status.lastDecision` is that hold with its
//!    reason (an Event `Hold`); the quota grows to 2;
//! 1. mode `recommend` on an overloaded job: a recommendation in status and an Event, nothing
//!    written to the target, the job untouched;
//! 2. mode `auto` with a Flink operator that observes the overrides but never gets the job
//!    running at them: after the timeout the previous overrides go back and the failing
//!    parallelism is remembered with a backoff; after it, the overrides written again (only
//!    that key, under the operator's field manager); the operator is SIGKILLed while the
//!    rescale waits at `Requested`, and again at `Observed`, and each restarted operator
//!    resumes it; the job then runs at the new parallelism, and the
//!    FlinkScaler's status says so with the measured downtime; the learned state is in the
//!    FlinkScaler's ConfigMap;
//! 3. the target turns on Flink's own autoscaler: refused (`Degraded`, Warning Event), nothing
//!    written;
//! 4. the target is deleted: `TargetMissing`, Warning Event; a FlinkSessionJob target is read
//!    like a FlinkDeployment;
//! 5. RBAC: the chart's ServiceAccount may patch FlinkDeployments but not delete them; with
//!    `flink.enabled=false` the chart grants nothing on `flink.apache.org`.
//!
//! Needs both environments (the README's test command installs them). Without them the test is
//! skipped locally and fails with CI=true.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use common::{env, root, run, var};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use serde_json::{Value, json};
use streamscale_controller::flink::FlinkRest;
use streamscale_operator::crd::{DecisionAction, StreamQuota};
use streamscale_operator::flink_scaler_crd::{
    FlinkScaler, FlinkScalerPhase, FlinkScalerStatus, OVERRIDES_KEY, TargetKind,
};
use streamscale_operator::flink_target::api_resource;

const RELEASE: &str = "fsc";
const RELEASE_NS: &str = "streamscale-fsc";
/// The chart's ServiceAccount (the release's full name).
const SERVICE_ACCOUNT: &str = "fsc-streamscale";
const TARGET: &str = "trace-job";
const SCALER: &str = "trace-job";
const KEYED: &str = "count -> discard: Writer";
const SOURCE: &str = "Source: trace";
const QUOTA: &str = "flink-team";

fn flink_testenv(args: &[&str], extra_config: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(root().join("scripts/flink-testenv.sh"));
    cmd.args(args);
    if let Some(c) = extra_config {
        cmd.env("FLINK_EXTRA_CONFIG", c);
    }
    cmd.output().expect("run scripts/flink-testenv.sh")
}

/// `KEY=value` lines of `flink-testenv.sh env`, when Flink is installed (`None`: skip, never
/// under CI=true).
fn flink_env() -> Option<BTreeMap<String, String>> {
    let out = flink_testenv(&["env"], None);
    let env: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches(['"', '\'']).to_string()))
        .collect();
    if out.status.success()
        && env
            .get("FLINK_DEMO_JAR")
            .is_some_and(|j| Path::new(j).is_file())
    {
        return Some(env);
    }
    let why = "Flink is not installed (run scripts/flink-testenv.sh install)";
    assert!(!std::env::var("CI").is_ok_and(|v| v == "true"), "{why}");
    eprintln!("SKIP: {why}");
    None
}

/// Stops the Flink cluster when the test ends, passed or not.
struct Cluster;

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = flink_testenv(&["stop"], None);
    }
}

/// The operator process; SIGKILLed when dropped.
struct Operator(Option<Child>);

impl Operator {
    fn start(kubeconfig: &Path, ns: &str, log: &Path) -> Operator {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("operator log");
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
            .env("RUST_LOG", "info,kube=warn")
            .env("NO_COLOR", "1")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn streamscale-operator");
        Operator(Some(child))
    }

    /// SIGKILL, as a node failure or an OOM kill would.
    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the stand-in for the Flink operator does.
const RUN: u8 = 0;
/// Nothing (the Flink operator has not looked at the resource yet).
const PAUSED: u8 = 1;
/// Observe new specs (status) but do not apply them to the job yet.
const OBSERVE_ONLY: u8 = 2;

/// The test's STAND-IN for the Apache Flink Kubernetes Operator (see the module docs).
struct FlinkOperatorStandIn {
    mode: Arc<AtomicU8>,
    task: tokio::task::JoinHandle<()>,
}

impl FlinkOperatorStandIn {
    fn start(admin: Client, ns: &str, rest: FlinkRest, jid: String) -> FlinkOperatorStandIn {
        let mode = Arc::new(AtomicU8::new(RUN));
        let m = mode.clone();
        let api: Api<DynamicObject> =
            Api::namespaced_with(admin, ns, &api_resource(TargetKind::FlinkDeployment));
        let task = tokio::spawn(async move {
            let mut applied: Option<String> = None;
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let mode = m.load(Ordering::SeqCst);
                if mode == PAUSED {
                    continue;
                }
                let Ok(Some(fd)) = api.get_opt(TARGET).await else {
                    continue;
                };
                let obj = serde_json::to_value(&fd).unwrap_or_default();
                let spec = obj["spec"].clone();
                let overrides = spec["flinkConfiguration"][OVERRIDES_KEY]
                    .as_str()
                    .map(str::to_string);
                if mode == RUN && overrides.is_some() && overrides != applied {
                    let by_id: BTreeMap<String, u32> = overrides
                        .as_deref()
                        .unwrap_or_default()
                        .split(',')
                        .filter_map(|p| {
                            let (v, n) = p.split_once(':')?;
                            Some((v.to_string(), n.parse().ok()?))
                        })
                        .collect();
                    // In place, as the Flink operator does under the adaptive scheduler.
                    if rest.set_parallelism(&jid, &by_id).await.is_ok() {
                        applied.clone_from(&overrides);
                    }
                }
                let state = rest
                    .job(&jid)
                    .await
                    .map_or_else(|_| "RECONCILING".to_string(), |j| j.state);
                let last = json!({
                    "spec": spec,
                    "resource_metadata": {
                        "apiVersion": "flink.apache.org/v1beta1",
                        "metadata": {"generation": fd.metadata.generation},
                        "firstDeployment": false
                    }
                });
                let status = json!({"status": {
                    "observedGeneration": fd.metadata.generation,
                    "lifecycleState": "STABLE",
                    "jobManagerDeploymentStatus": "READY",
                    "jobStatus": {"jobId": jid, "jobName": "trace-job", "state": state},
                    "reconciliationStatus": {
                        "state": "DEPLOYED",
                        "lastReconciledSpec": last.to_string(),
                    },
                }});
                let _ = api
                    .patch_status(TARGET, &PatchParams::default(), &Patch::Merge(&status))
                    .await;
            }
        });
        FlinkOperatorStandIn { mode, task }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
}

impl Drop for FlinkOperatorStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A kubeconfig for the chart's ServiceAccount (token from the TokenRequest API).
async fn service_account_kubeconfig(
    admin: &Client,
    env: &[(String, String)],
    dir: &Path,
) -> PathBuf {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), RELEASE_NS);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let mut token = None;
    for _ in 0..50 {
        match sas
            .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
            .await
        {
            Ok(t) => {
                token = t.status.map(|s| s.token);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let token = token.expect("TokenRequest for the chart's ServiceAccount");
    let path = dir.join("operator.kubeconfig");
    std::fs::write(
        &path,
        format!(
            r#"apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster: {{server: "{}", certificate-authority: "{}"}}
users:
- name: {SERVICE_ACCOUNT}
  user: {{token: "{token}"}}
contexts:
- name: operator
  context: {{cluster: testenv, user: {SERVICE_ACCOUNT}}}
current-context: operator
"#,
            var(env, "KUBE_APISERVER_URL"),
            var(env, "KUBE_CA_FILE")
        ),
    )
    .expect("write kubeconfig");
    path
}

async fn client_for(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

async fn status(scalers: &Api<FlinkScaler>) -> FlinkScalerStatus {
    scalers
        .get(SCALER)
        .await
        .expect("get FlinkScaler")
        .status
        .unwrap_or_default()
}

/// Polls the FlinkScaler's status until `ok` holds, for at most `secs`.
async fn wait_status(
    scalers: &Api<FlinkScaler>,
    secs: u64,
    what: &str,
    log: &Path,
    ok: impl Fn(&FlinkScalerStatus) -> bool,
) -> FlinkScalerStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let s = status(scalers).await;
        if ok(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {secs} s; status: {}\n--- operator log ---\n{}",
            serde_json::to_string_pretty(&s).unwrap_or_default(),
            tail(log, 40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn condition(s: &FlinkScalerStatus, type_: &str) -> (String, String) {
    s.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
        .unwrap_or_default()
}

async fn event_reasons(admin: &Client, ns: &str) -> Vec<(String, String, String)> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

async fn target_json(targets: &Api<DynamicObject>) -> Value {
    serde_json::to_value(targets.get(TARGET).await.expect("get FlinkDeployment")).expect("json")
}

/// The field managers of the target and the `spec.flinkConfiguration` keys each owns.
fn managers(target: &Value) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for m in target["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let keys = m["fieldsV1"]["f:spec"]["f:flinkConfiguration"]
            .as_object()
            .map(|o| o.keys().filter(|k| *k != ".").cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        let name = m["manager"].as_str().unwrap_or_default().to_string();
        let spec_fields = m["fieldsV1"]["f:spec"]
            .as_object()
            .map(|o| o.keys().filter(|k| *k != ".").cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        out.entry(name).or_insert_with(Vec::new).extend(
            keys.into_iter().chain(
                spec_fields
                    .into_iter()
                    .filter(|k| k != "f:flinkConfiguration")
                    .map(|k| format!("spec.{k}")),
            ),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flink_scaler_autoscales_a_flink_deployment_through_its_overrides() {
    let Some(kenv) = env() else {
        return;
    };
    let Some(fenv) = flink_env() else {
        return;
    };
    let started = Instant::now();
    // The chart (CRDs, ServiceAccount, RBAC with Flink support on, the default).
    common::cluster::install_chart(kenv, RELEASE, RELEASE_NS);
    // The Flink Kubernetes Operator's CRDs, as a cluster running it has them (server-side:
    // the FlinkDeployment CRD is too large for client-side apply's annotation).
    let crd_dir = root().join("operator/tests/data/flink-kubernetes-operator-crds");
    for file in [
        "flinkdeployments.flink.apache.org-v1.yml",
        "flinksessionjobs.flink.apache.org-v1.yml",
    ] {
        let path = crd_dir.join(file);
        let (ok, out) = run(
            kenv,
            &var(kenv, "KUBECTL"),
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                path.to_str().unwrap_or_default(),
            ],
            None,
        );
        assert!(ok, "kubectl apply {file}: {out}");
    }
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
    let ns = format!("fsc-{}", std::process::id());
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns");
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");

    // The real Flink cluster and its job: 5,000 records/s into a keyed count that serves about
    // 3,300/s per subtask, so one keyed subtask is too few.
    let _ = flink_testenv(&["stop"], None);
    let up = flink_testenv(&["start"], Some("metrics.fetcher.update-interval: 1000"));
    assert!(
        up.status.success(),
        "Flink did not start: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let _cluster = Cluster;
    let rest_url = fenv
        .get("FLINK_REST_URL")
        .cloned()
        .unwrap_or_else(|| "http://127.0.0.1:8081".into());
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
        .to_string();
    let submitted = flink_testenv(
        &[
            "submit",
            "--rate",
            "5000",
            "--cost-us",
            "300",
            "--keys",
            "500",
            "--epoch-ms",
            &epoch,
        ],
        None,
    );
    let text = String::from_utf8_lossy(&submitted.stdout).to_string();
    assert!(submitted.status.success(), "submit: {text}");
    let jid = text
        .split_whitespace()
        .rev()
        .find(|t| t.len() == 32 && t.chars().all(|c| c.is_ascii_hexdigit()))
        .expect("a job id")
        .to_string();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http");
    let rest = FlinkRest::new(http, &rest_url);
    let parallelism = |rest: FlinkRest, jid: String| async move {
        let j = rest.job(&jid).await.expect("job");
        let by_name: BTreeMap<String, u32> = j
            .vertices
            .iter()
            .map(|v| (v.name.clone(), v.parallelism))
            .collect();
        (j.all_running(), by_name)
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while !parallelism(rest.clone(), jid.clone()).await.0 {
        assert!(Instant::now() < deadline, "job {jid} not running");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The FlinkDeployment as its user wrote it, and the stand-in for the Flink operator.
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
            "image": "flink:2.3",
            "flinkVersion": "v2_2",
            "serviceAccount": "flink",
            "flinkConfiguration": {
                "jobmanager.scheduler": "adaptive",
                "taskmanager.numberOfTaskSlots": "4",
            },
            "jobManager": {"resource": {"memory": "1024m", "cpu": 1}},
            "taskManager": {"resource": {"memory": "1280m", "cpu": 1}},
            "job": {
                "jarURI": "local:///opt/flink/usrlib/trace-job.jar",
                "entryClass": "streamscale.tracejob.TraceJob",
                "parallelism": 1,
                "upgradeMode": "savepoint",
            },
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
    let stand_in = FlinkOperatorStandIn::start(admin.clone(), &ns, rest.clone(), jid.clone());

    // 0. A StreamQuota of 1 subtask the FlinkScaler is a member of: the plan is held at its
    // share (1 slot), then the quota grows to 2 and the recommendation follows.
    let quotas: Api<StreamQuota> = Api::namespaced(admin.clone(), &ns);
    let quota: StreamQuota = serde_json::from_value(json!({
        "apiVersion": "streamscale.dev/v1alpha1",
        "kind": "StreamQuota",
        "metadata": {"name": QUOTA},
        "spec": {"subtasks": 1},
    }))
    .expect("StreamQuota");
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .expect("create the StreamQuota");

    // 1. Mode recommend: a recommendation, nothing written to the target.
    let scalers: Api<FlinkScaler> = Api::namespaced(admin.clone(), &ns);
    let scaler: FlinkScaler = serde_json::from_value(json!({
        "apiVersion": "streamscale.dev/v1alpha1",
        "kind": "FlinkScaler",
        "metadata": {"name": SCALER},
        "spec": {
            "targetRef": {"kind": "FlinkDeployment", "name": TARGET},
            "restUrl": rest_url,
            "autoscaler": {
                "mode": "recommend",
                "metricsIntervalSeconds": 1,
                "metricsWindowSeconds": 10,
                "stabilizationSeconds": 4,
                "scaleDownDelaySeconds": 600,
                "restoreTimeoutSeconds": 90,
                "parallelism": {KEYED: {"min": 1, "max": 2}, SOURCE: {"min": 1, "max": 1}},
                "quota": QUOTA,
            },
        },
    }))
    .expect("FlinkScaler");
    scalers
        .create(&PostParams::default(), &scaler)
        .await
        .expect("create the FlinkScaler");
    let log = dir.path().join("operator.log");
    let mut operator = Operator::start(&kubeconfig, &ns, &log);
    let s = wait_status(&scalers, 90, "a plan held at the quota share", &log, |s| {
        s.recommended_parallelism.get(KEYED) == Some(&1)
            && s.quota.as_ref().is_some_and(|q| {
                q.allocated_subtasks == 1 && q.demand.first().is_some_and(|d| d.need > 1.0)
            })
            && s.last_decision
                .as_ref()
                .is_some_and(|d| d.reason.contains("held at 1 slots"))
    })
    .await;
    // The hold and its reason are in status (as the planner's hold reason, with the cap).
    let d = s.last_decision.clone().expect("status.lastDecision");
    assert_eq!(
        (d.action, d.applied),
        (DecisionAction::Hold, false),
        "{d:?}"
    );
    assert!(
        d.reason.contains(&format!(
            "held at 1 slots (the share of StreamQuota {QUOTA}: 1 of 1 slots): {KEYED} would need more"
        )),
        "{d:?}"
    );
    assert_eq!(d.to.get(KEYED), Some(&1), "{d:?}");
    let q = s.quota.clone().expect("status.quota");
    assert_eq!((q.quota_subtasks, q.running_subtasks), (1, 1), "{q:?}");
    assert!(
        q.message.contains("FlinkScaler/trace-job 1 subtasks"),
        "{q:?}"
    );
    let events = event_reasons(&admin, &ns).await;
    assert!(
        events
            .iter()
            .any(|(_, r, n)| r == "QuotaShare" && n.contains(QUOTA)),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|(_, r, n)| r == "Hold" && n.contains("held at 1 slots")),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|(_, r, _)| r == "UnsupportedSetting"),
        "{events:?}"
    );
    quotas
        .patch(
            QUOTA,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"subtasks": 2}})),
        )
        .await
        .expect("grow the StreamQuota");
    let s = wait_status(&scalers, 90, "a recommendation", &log, |s| {
        s.recommended_parallelism.get(KEYED) == Some(&2)
    })
    .await;
    assert_eq!(s.phase, FlinkScalerPhase::Running, "{s:?}");
    assert_eq!(s.job_id.as_deref(), Some(jid.as_str()));
    assert_eq!(condition(&s, "Ready").0, "True", "{s:?}");
    let keyed = s
        .vertices
        .iter()
        .find(|v| v.name == KEYED)
        .expect("the keyed vertex in status");
    assert_eq!((keyed.current, keyed.recommended), (1, Some(2)));
    assert_eq!(keyed.id.len(), 32, "{keyed:?}");
    assert!(
        s.rescale.is_none(),
        "recommend mode started a rescale: {s:?}"
    );
    let t = target_json(&targets).await;
    assert!(
        t["spec"]["flinkConfiguration"][OVERRIDES_KEY].is_null(),
        "recommend mode wrote the target: {t}"
    );
    assert!(
        !managers(&t).contains_key("streamscale-operator"),
        "recommend mode wrote the target: {:?}",
        managers(&t)
    );
    assert_eq!(
        parallelism(rest.clone(), jid.clone()).await.1.get(KEYED),
        Some(&1)
    );
    let events = event_reasons(&admin, &ns).await;
    assert!(
        events
            .iter()
            .any(|(_, r, n)| r == "Recommendation" && n.contains(KEYED)),
        "{events:?}"
    );

    // 2. Mode auto, with a Flink operator that observes the overrides but never gets the job
    // running at them, and a short timeout: the previous overrides (none: those of the current
    // parallelism) go back, and the failing parallelism is remembered with a backoff.
    stand_in.set(OBSERVE_ONLY);
    scalers
        .patch(
            SCALER,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"autoscaler": {"mode": "auto", "restoreTimeoutSeconds": 8}}}),
            ),
        )
        .await
        .expect("mode auto");
    let s = wait_status(&scalers, 60, "a rescale rolled back", &log, |s| {
        s.rescale.is_none()
            && s.last_rescale
                .as_ref()
                .is_some_and(|l| l.outcome == "RolledBack" && l.to.get(KEYED) == Some(&2))
    })
    .await;
    // The next attempt (after the backoff) is held at Requested: the Flink operator pauses.
    stand_in.set(PAUSED);
    scalers
        .patch(
            SCALER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"autoscaler": {"restoreTimeoutSeconds": 90}}})),
        )
        .await
        .expect("timeout back");
    let backoff = s.backoff.clone().expect("backoff");
    assert_eq!(backoff.failures, 1, "{backoff:?}");
    assert!(
        backoff
            .failed
            .iter()
            .any(|f| f.parallelism.get(KEYED) == Some(&2) && f.failures == 1),
        "{backoff:?}"
    );
    let t = target_json(&targets).await;
    let back = t["spec"]["flinkConfiguration"][OVERRIDES_KEY]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let keyed_id = s
        .vertices
        .iter()
        .find(|v| v.name == KEYED)
        .map(|v| v.id.clone())
        .expect("keyed id");
    assert!(
        back.contains(&format!("{keyed_id}:1")),
        "the overrides of the old parallelism are back: {t}"
    );
    assert_eq!(s.rescales, 0, "{s:?}");
    assert_eq!(
        parallelism(rest.clone(), jid.clone()).await.1.get(KEYED),
        Some(&1)
    );
    let events = event_reasons(&admin, &ns).await;
    assert!(
        events
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "RescaleFailed"),
        "{events:?}"
    );
    assert!(
        events.iter().any(|(_, r, _)| r == "RolledBack"),
        "{events:?}"
    );

    // 2b. After the backoff the rescale is tried again and waits at Requested with the
    // overrides on the target (the Flink operator not looking). SIGKILL the operator there,
    // start another.
    let s = wait_status(&scalers, 60, "a rescale requested", &log, |s| {
        s.rescale
            .as_ref()
            .is_some_and(|r| r.target_generation.is_some())
    })
    .await;
    let r = s.rescale.clone().expect("rescale");
    assert_eq!(r.to.get(KEYED), Some(&2), "{r:?}");
    assert_eq!(s.phase, FlinkScalerPhase::Rescaling);
    let t = target_json(&targets).await;
    assert_eq!(
        t["spec"]["flinkConfiguration"][OVERRIDES_KEY].as_str(),
        Some(r.overrides.as_str()),
        "{t}"
    );
    // The user's keys stay theirs; the operator's field manager owns that one key only.
    assert_eq!(
        t["spec"]["flinkConfiguration"]["jobmanager.scheduler"],
        "adaptive"
    );
    let owned = managers(&t);
    assert_eq!(
        owned.get("streamscale-operator"),
        Some(&vec![format!("f:{OVERRIDES_KEY}")]),
        "{owned:?}"
    );
    operator.kill();
    let mut operator = Operator::start(&kubeconfig, &ns, &log);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = status(&scalers).await;
    assert_eq!(
        s.rescale.as_ref().map(|r| (r.step, &r.started_at)),
        Some((
            streamscale_operator::flink_scaler_crd::FlinkRescaleStep::Requested,
            &r.started_at
        )),
        "the restarted operator resumes the same rescale: {s:?}"
    );
    // The Flink operator observes the new spec but has not applied it: step Observed. SIGKILL
    // again there.
    stand_in.set(OBSERVE_ONLY);
    wait_status(&scalers, 30, "the overrides observed", &log, |s| {
        s.rescale.as_ref().is_some_and(|r| {
            r.step == streamscale_operator::flink_scaler_crd::FlinkRescaleStep::Observed
        })
    })
    .await;
    assert_eq!(
        parallelism(rest.clone(), jid.clone()).await.1.get(KEYED),
        Some(&1)
    );
    operator.kill();
    let _operator = Operator::start(&kubeconfig, &ns, &log);
    // Applied in place: the job runs at the new parallelism, and the FlinkScaler says so.
    stand_in.set(RUN);
    let s = wait_status(&scalers, 90, "the rescale done", &log, |s| {
        s.rescale.is_none() && s.rescales >= 1
    })
    .await;
    assert_eq!(s.rescales, 1, "{s:?}");
    assert!(
        s.backoff.is_none(),
        "a completed rescale clears the backoff: {s:?}"
    );
    let last = s.last_rescale.clone().expect("last rescale");
    assert_eq!(last.outcome, "Rescaled", "{last:?}");
    assert!(
        last.downtime_seconds.is_some_and(|d| d > 0.0),
        "measured downtime: {last:?}"
    );
    assert_eq!(s.current_parallelism.get(KEYED), Some(&2), "{s:?}");
    assert_eq!(s.phase, FlinkScalerPhase::Running);
    assert_eq!(
        condition(&s, "Scaling"),
        ("False".into(), "Rescaled".into())
    );
    // The rescale's decision, or the hold that follows it at the new parallelism.
    let decision = s.last_decision.clone().expect("last decision");
    assert!(
        !decision.reason.is_empty()
            && (decision.applied
                || (decision.action == DecisionAction::Hold
                    && decision.from.get(KEYED) == Some(&2))),
        "{decision:?}"
    );
    let (running, p) = parallelism(rest.clone(), jid.clone()).await;
    assert!(running, "{p:?}");
    assert_eq!(p.get(KEYED), Some(&2), "{p:?}");
    let events = event_reasons(&admin, &ns).await;
    for reason in ["RescaleStarted", "RescaleObserved", "Rescaled"] {
        assert!(
            events.iter().any(|(_, r, _)| r == reason),
            "{reason}: {events:?}"
        );
    }
    // What the planner learned (the measured downtime) is in the FlinkScaler's ConfigMap.
    let cm = Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .get(&format!("{SCALER}-autoscaler"))
        .await
        .expect("the learned-state ConfigMap");
    let fsc = scalers.get(SCALER).await.expect("get");
    assert!(
        cm.owner_references()
            .iter()
            .any(|o| o.kind == "FlinkScaler" && Some(&o.uid) == fsc.metadata.uid.as_ref()),
        "{cm:?}"
    );
    let state: Value = serde_json::from_str(
        cm.data
            .as_ref()
            .and_then(|d| d.get("state.json"))
            .expect("state.json"),
    )
    .expect("state json");
    assert!(
        state["rescaleDowntimeSeconds"].as_f64().is_some(),
        "{state}"
    );

    // 3. The target turns Flink's own autoscaler on: refused, nothing written.
    let overrides_before =
        target_json(&targets).await["spec"]["flinkConfiguration"][OVERRIDES_KEY].clone();
    targets
        .patch(
            TARGET,
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(json!({
                "apiVersion": "flink.apache.org/v1beta1",
                "kind": "FlinkDeployment",
                "metadata": {"name": TARGET},
                "spec": {"flinkConfiguration": {
                    "jobmanager.scheduler": "adaptive",
                    "taskmanager.numberOfTaskSlots": "4",
                    "job.autoscaler.enabled": "true",
                }},
            })),
        )
        .await
        .expect("turn on Flink's autoscaler");
    let s = wait_status(&scalers, 30, "refused", &log, |s| {
        s.phase == FlinkScalerPhase::Refused
    })
    .await;
    assert_eq!(
        condition(&s, "Degraded"),
        ("True".into(), "FlinkAutoscalerEnabled".into())
    );
    let events = event_reasons(&admin, &ns).await;
    assert!(
        events
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "FlinkAutoscalerEnabled"),
        "{events:?}"
    );
    assert_eq!(
        target_json(&targets).await["spec"]["flinkConfiguration"][OVERRIDES_KEY],
        overrides_before
    );

    // 4. The target disappears.
    targets
        .delete(TARGET, &DeleteParams::default())
        .await
        .expect("delete the FlinkDeployment");
    let s = wait_status(&scalers, 30, "target missing", &log, |s| {
        s.phase == FlinkScalerPhase::TargetMissing
    })
    .await;
    assert_eq!(
        condition(&s, "Degraded"),
        ("True".into(), "TargetNotFound".into())
    );
    assert!(s.vertices.is_empty() && s.job_id.is_none(), "{s:?}");
    let events = event_reasons(&admin, &ns).await;
    assert!(
        events
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "TargetNotFound"),
        "{events:?}"
    );

    // 4b. A FlinkSessionJob target: its job (the same Flink job; the Flink operator's status
    // written once by the test) is read and planned, in recommend mode nothing is written.
    let session_jobs: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        &ns,
        &api_resource(TargetKind::FlinkSessionJob),
    );
    let sj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "flink.apache.org/v1beta1",
        "kind": "FlinkSessionJob",
        "metadata": {"name": "trace-session-job"},
        "spec": {
            "deploymentName": "session-cluster",
            "job": {
                "jarURI": "local:///opt/flink/usrlib/trace-job.jar",
                "parallelism": 1,
                "upgradeMode": "stateless",
            },
        },
    }))
    .expect("FlinkSessionJob");
    session_jobs
        .patch(
            "trace-session-job",
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(&sj),
        )
        .await
        .expect("create the FlinkSessionJob");
    session_jobs
        .patch_status(
            "trace-session-job",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "observedGeneration": 1,
                "lifecycleState": "STABLE",
                "jobStatus": {"jobId": jid, "state": "RUNNING"},
            }})),
        )
        .await
        .expect("the session job's status");
    let session_scaler: FlinkScaler = serde_json::from_value(json!({
        "apiVersion": "streamscale.dev/v1alpha1",
        "kind": "FlinkScaler",
        "metadata": {"name": "session-scaler"},
        "spec": {
            "targetRef": {"kind": "FlinkSessionJob", "name": "trace-session-job"},
            "restUrl": rest_url,
            "autoscaler": {"mode": "recommend", "metricsIntervalSeconds": 1},
        },
    }))
    .expect("FlinkScaler");
    scalers
        .create(&PostParams::default(), &session_scaler)
        .await
        .expect("create the session FlinkScaler");
    let deadline = Instant::now() + Duration::from_secs(30);
    let s = loop {
        let s = scalers
            .get("session-scaler")
            .await
            .expect("get")
            .status
            .unwrap_or_default();
        if s.phase == FlinkScalerPhase::Running && !s.vertices.is_empty() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the FlinkSessionJob's scaler: {s:?}\n{}",
            tail(&log, 30)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(s.job_id.as_deref(), Some(jid.as_str()));
    assert_eq!(s.current_parallelism.get(KEYED), Some(&2), "{s:?}");
    let sj_now = serde_json::to_value(session_jobs.get("trace-session-job").await.expect("get"))
        .expect("json");
    assert!(
        sj_now["spec"]["flinkConfiguration"][OVERRIDES_KEY].is_null(),
        "{sj_now}"
    );

    // 5. RBAC: the chart's ServiceAccount may patch Flink resources, not delete them; without
    // Flink support the chart grants nothing on flink.apache.org.
    targets
        .patch(
            TARGET,
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(&fd),
        )
        .await
        .expect("create the FlinkDeployment again");
    let as_operator = client_for(&kubeconfig).await;
    let op_targets: Api<DynamicObject> =
        Api::namespaced_with(as_operator, &ns, &api_resource(TargetKind::FlinkDeployment));
    assert!(op_targets.get(TARGET).await.is_ok());
    let denied = op_targets.delete(TARGET, &DeleteParams::default()).await;
    assert!(
        matches!(&denied, Err(kube::Error::Api(e)) if e.code == 403),
        "{denied:?}"
    );
    let (ok, rendered) = run(
        kenv,
        &var(kenv, "HELM"),
        &[
            "template",
            RELEASE,
            root()
                .join("charts/streamscale")
                .to_str()
                .unwrap_or_default(),
            "--kube-version",
            "1.34.0",
            "--set",
            "flink.enabled=false",
        ],
        None,
    );
    assert!(ok, "{rendered}");
    assert!(!rendered.contains("flink.apache.org"), "{rendered}");
    assert!(
        rendered.contains("name: FLINK_SUPPORT, value: \"false\""),
        "{rendered}"
    );

    let _ = Api::<Namespace>::all(admin.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    eprintln!(
        "flink_scaler test took {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
