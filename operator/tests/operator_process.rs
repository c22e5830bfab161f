//! The `streamscale-operator` binary as a local process against a REAL kube-apiserver + etcd
//! (started by `scripts/k8s-testenv.sh`), authenticated as the Helm chart's ServiceAccount with
//! a token from the TokenRequest API, so the chart's RBAC is what these tests exercise.
//!
//! No kubelet runs here: the test plays it. It watches the engine Deployment's pod template and
//! runs `streamscale-engine` on loopback with the template's arguments (only `--job` and
//! `--bind` are mapped to the host), restarting it when the template changes (strategy
//! `Recreate`) or when it exits (restartPolicy `Always`). The StreamJob's annotations
//! `streamscale.dev/engine-url` and `streamscale.dev/savepoint-dir` point the operator at that
//! engine and at a host directory for savepoints.
//!
//! * `operator_as_chart_service_account_deploys_and_rescales_a_job`: owned objects, status,
//!   finalizer, Events, an autoscaler rescale, and no record lost (the engine's counters after
//!   a final drain);
//! * `operator_killed_between_rescale_steps_resumes_without_losing_records`: SIGKILL at each
//!   rescale step, restart, resume (or roll back);
//! * `operator_that_lost_the_savepoint_id_rolls_back_and_replaces_the_stopped_engine`: the one
//!   window that cannot resume (the savepoint id was never recorded) rolls back.
//!
//! Without the control-plane binaries the tests are skipped with a printed reason, except under
//! CI=true, where they fail.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{env, root, run, var};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Service, ServiceAccount,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, ResourceExt};
use streamscale_controller::api::{EngineApi, JobStatus};
use streamscale_operator::crd::{Phase, RescaleStatus, RescaleStep, StreamJob, StreamJobStatus};

const RELEASE: &str = "op";
const RELEASE_NS: &str = "streamscale-op";
/// The chart's ServiceAccount (the release's full name).
const SERVICE_ACCOUNT: &str = "op-streamscale";
const JOB: &str = "demo";

/// Installs the chart once (CRD, ServiceAccount, RBAC) for every test of this file.
fn chart_installed(env: &[(String, String)]) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let chart = root().join("charts/streamscale");
        let (ok, out) = run(
            env,
            &var(env, "HELM"),
            &[
                "upgrade",
                "--install",
                RELEASE,
                chart.to_str().unwrap_or_default(),
                "-n",
                RELEASE_NS,
                "--create-namespace",
                "--wait=false",
            ],
            None,
        );
        assert!(ok, "helm install: {out}");
    });
}

/// The `streamscale-engine` binary next to this test's target directory, built if missing.
fn engine_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        // target/<profile>/deps/<test> -> target/<profile>/streamscale-engine
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target dir")
            .to_path_buf();
        let bin = dir.join("streamscale-engine");
        if !bin.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .args([
                    "build",
                    "-p",
                    "streamscale-engine",
                    "--bin",
                    "streamscale-engine",
                ])
                .current_dir(root())
                .status()
                .expect("cargo build streamscale-engine");
            assert!(status.success(), "cargo build streamscale-engine failed");
        }
        assert!(bin.exists(), "no engine binary at {}", bin.display());
        bin
    })
    .clone()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| l.chars().take(400).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A running engine "pod".
struct Pod {
    child: Child,
    template: String,
    exited_at: Option<Instant>,
}

/// The test's stand-in for the kubelet of the engine Deployment.
struct Kubelet {
    stop: Arc<AtomicBool>,
    pod: Arc<Mutex<Option<Pod>>>,
    starts: Arc<AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

impl Kubelet {
    fn start(admin: Client, ns: &str, dir: &Path, port: u16) -> Kubelet {
        let stop = Arc::new(AtomicBool::new(false));
        let pod: Arc<Mutex<Option<Pod>>> = Arc::new(Mutex::new(None));
        let starts = Arc::new(AtomicU32::new(0));
        let (s, p, n) = (stop.clone(), pod.clone(), starts.clone());
        let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
        let configmaps: Api<ConfigMap> = Api::namespaced(admin, ns);
        let dir = dir.to_path_buf();
        let bin = engine_bin();
        let task = tokio::spawn(async move {
            while !s.load(Ordering::SeqCst) {
                tick(&deployments, &configmaps, &dir, &bin, port, &p, &n).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Kubelet {
            stop,
            pod,
            starts,
            task,
        }
    }

    /// Stops watching; the engine keeps running.
    async fn detach(&self) {
        self.stop.store(true, Ordering::SeqCst);
        while !self.task.is_finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(mut pod) = self.pod.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = pod.child.kill();
            let _ = pod.child.wait();
        }
    }
}

async fn tick(
    deployments: &Api<Deployment>,
    configmaps: &Api<ConfigMap>,
    dir: &Path,
    bin: &Path,
    port: u16,
    pod: &Mutex<Option<Pod>>,
    starts: &AtomicU32,
) {
    let Ok(d) = deployments.get_opt(&format!("{JOB}-engine")).await else {
        return;
    };
    let template = d.as_ref().and_then(|d| {
        let spec = d.spec.as_ref()?;
        (spec.replicas != Some(0)).then(|| serde_json::to_string(&spec.template).ok())?
    });
    let job_yaml = match &template {
        Some(_) => match configmaps.get_opt(&format!("{JOB}-job")).await {
            Ok(Some(cm)) => cm.data.and_then(|mut d| d.remove("job.yaml")),
            _ => return,
        },
        None => None,
    };
    let mut guard = pod.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = guard.as_mut() {
        if Some(&p.template) == template.as_ref() {
            // Same pod: restart its container when it exited (restartPolicy Always, 1 s backoff).
            match (p.exited_at, p.child.try_wait()) {
                (None, Ok(Some(_))) => p.exited_at = Some(Instant::now()),
                (Some(at), _) if at.elapsed() > Duration::from_secs(1) => {
                    let args = args_of(&p.template);
                    p.child = spawn_engine(bin, dir, port, &args, job_yaml.as_deref(), starts);
                    p.exited_at = None;
                }
                _ => {}
            }
            return;
        }
        // The template changed (or the Deployment went): Recreate.
        let _ = p.child.kill();
        let _ = p.child.wait();
        *guard = None;
    }
    if let Some(template) = template {
        let args = args_of(&template);
        let child = spawn_engine(bin, dir, port, &args, job_yaml.as_deref(), starts);
        *guard = Some(Pod {
            child,
            template,
            exited_at: None,
        });
    }
}

fn args_of(template: &str) -> Vec<String> {
    let t: serde_json::Value = serde_json::from_str(template).unwrap_or_default();
    t["spec"]["containers"][0]["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn spawn_engine(
    bin: &Path,
    dir: &Path,
    port: u16,
    args: &[String],
    job_yaml: Option<&str>,
    starts: &AtomicU32,
) -> Child {
    let n = starts.fetch_add(1, Ordering::SeqCst);
    let job = dir.join(format!("job-{n}.yaml"));
    std::fs::write(&job, job_yaml.unwrap_or_default()).expect("write job file");
    let mut mapped = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        mapped.push(a.clone());
        match a.as_str() {
            "--job" => {
                it.next();
                mapped.push(job.display().to_string());
            }
            "--bind" => {
                it.next();
                mapped.push(format!("127.0.0.1:{port}"));
            }
            _ => {}
        }
    }
    let log = std::fs::File::create(dir.join(format!("engine-{n}.log"))).expect("engine log");
    Command::new(bin)
        .args(&mapped)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn streamscale-engine")
}

/// One test's world: a namespace, the operator process and the kubelet.
struct World {
    admin: Client,
    dir: tempfile::TempDir,
    ns: String,
    kubeconfig: PathBuf,
    identity: String,
    leader_election: bool,
    operator: Option<Child>,
    operator_starts: u32,
    port: u16,
    metrics_port: u16,
    /// Largest `recordsEmitted` the engine reported (a sampler runs while the job exists).
    max_emitted: Arc<AtomicU64>,
}

impl World {
    async fn new(tag: &str, leader_election: bool) -> Option<World> {
        let env = env()?;
        let e = env.clone();
        tokio::task::spawn_blocking(move || chart_installed(&e))
            .await
            .expect("helm");
        let kubeconfig = Kubeconfig::read_from(var(env, "KUBECONFIG")).expect("kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("admin config");
        let admin = Client::try_from(config).expect("admin client");

        // `helm upgrade` leaves CRDs alone: make sure the API server has the current one.
        let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
        crds.patch(
            "streamjobs.streamscale.dev",
            &PatchParams::apply("streamscale-tests").force(),
            &Patch::Apply(StreamJob::crd()),
        )
        .await
        .expect("apply the StreamJob CRD");

        // A token for the chart's ServiceAccount from the TokenRequest API.
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
                // The ServiceAccount may be a moment behind `helm install`.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let token = token.expect("TokenRequest for the chart's ServiceAccount");
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("operator.kubeconfig");
        std::fs::write(
            &kubeconfig,
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
        std::fs::create_dir_all(dir.path().join("savepoints")).expect("savepoint dir");

        let ns = format!("sj-{tag}-{}", std::process::id());
        let nss: Api<Namespace> = Api::all(admin.clone());
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns");
        nss.create(&PostParams::default(), &namespace)
            .await
            .expect("create namespace");
        Some(World {
            admin,
            dir,
            ns,
            kubeconfig,
            identity: format!("it-{tag}"),
            leader_election,
            operator: None,
            operator_starts: 0,
            port: free_port(),
            metrics_port: free_port(),
            max_emitted: Arc::new(AtomicU64::new(0)),
        })
    }

    fn start_operator(&mut self) {
        assert!(self.operator.is_none());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.operator_log())
            .expect("operator log");
        self.operator_starts += 1;
        let child = Command::new(env!("CARGO_BIN_EXE_streamscale-operator"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("WATCH_NAMESPACE", &self.ns)
            .env("METRICS_ADDR", format!("127.0.0.1:{}", self.metrics_port))
            .env("LEADER_ELECTION", self.leader_election.to_string())
            .env("POD_NAMESPACE", RELEASE_NS)
            .env("POD_NAME", &self.identity)
            .env("RUST_LOG", "info,kube=warn")
            .env("NO_COLOR", "1")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn streamscale-operator");
        self.operator = Some(child);
    }

    /// SIGKILL, as a node failure or OOM kill would.
    fn kill_operator(&mut self) {
        if let Some(mut c) = self.operator.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn operator_log(&self) -> PathBuf {
        self.dir.path().join("operator.log")
    }

    fn logs(&self) -> String {
        let mut out = format!(
            "--- operator log (tail) ---\n{}\n",
            tail(&self.operator_log(), 40)
        );
        let mut engines: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        engines.retain(|p| p.to_string_lossy().ends_with(".log") && !p.ends_with("operator.log"));
        engines.sort();
        for p in engines.iter().rev().take(2) {
            out.push_str(&format!(
                "--- {} (tail) ---\n{}\n",
                p.display(),
                tail(p, 10)
            ));
        }
        out
    }

    fn engine_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn jobs(&self) -> Api<StreamJob> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// A job whose source steps from 200 to 1500 records/s after 4 s; `work` (1 ms of I/O
    /// per record, so about 1000 records/s per subtask) must scale up from 1.
    async fn create_job(&self, mode: &str) -> StreamJob {
        let job: StreamJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "streamscale.dev/v1alpha1",
            "kind": "StreamJob",
            "metadata": {
                "name": JOB,
                "namespace": self.ns,
                "annotations": {
                    "streamscale.dev/engine-url": self.engine_url(),
                    "streamscale.dev/savepoint-dir": self.dir.path().join("savepoints"),
                },
            },
            "spec": {
                "job": {
                    "name": JOB,
                    "maxParallelism": 32,
                    "operators": [
                        {"name": "source", "kind": "source", "keys": 200,
                         "rate": {"steps": [
                             {"atSeconds": 0, "recordsPerSecond": 200},
                             {"atSeconds": 4, "recordsPerSecond": 1500},
                         ]}},
                        {"name": "work", "kind": "map", "io": 1000, "scaling": {"min": 1, "max": 4}},
                        {"name": "sink", "kind": "sink"},
                    ],
                    "edges": [{"from": "source", "to": "work"}, {"from": "work", "to": "sink"}],
                },
                "storage": {"size": "64Mi"},
                "autoscaler": {
                    "mode": mode,
                    "metricsIntervalSeconds": 1,
                    "metricsWindowSeconds": 4,
                    "stabilizationSeconds": 2,
                    "scaleDownDelaySeconds": 600,
                    "catchUpSeconds": 30,
                },
            },
        }))
        .expect("StreamJob");
        let created = self
            .jobs()
            .create(&PostParams::default(), &job)
            .await
            .expect("create StreamJob");
        // Sample the engine's counters: a restore must never go back behind them.
        let (max, api) = (
            self.max_emitted.clone(),
            EngineApi::new(reqwest::Client::new(), &self.engine_url()),
        );
        let stop = Arc::downgrade(&self.max_emitted);
        tokio::spawn(async move {
            while stop.strong_count() > 1 {
                if let Ok(j) = api.job().await {
                    max.fetch_max(j.records_emitted, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        created
    }

    async fn status(&self) -> Option<(StreamJob, StreamJobStatus)> {
        let job = self.jobs().get_opt(JOB).await.ok().flatten()?;
        let status = job.status.clone()?;
        Some((job, status))
    }

    /// Polls the StreamJob until `done` holds, failing with the logs after `timeout`.
    async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&StreamJob, &StreamJobStatus) -> bool,
    ) -> (StreamJob, StreamJobStatus) {
        let start = Instant::now();
        let mut last = None;
        loop {
            if let Some((job, status)) = self.status().await {
                if done(&job, &status) {
                    return (job, status);
                }
                last = Some(status);
            }
            assert!(
                start.elapsed() < timeout,
                "timed out after {:?} waiting for {what}; last status {last:#?}\n{}",
                timeout,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the operator and the kubelet, then drains the engine with a final
    /// stop-with-savepoint and returns its last counters. With `resumed`, the job must not
    /// have gone back behind any count seen while it ran (a roll back restores an older
    /// savepoint and replays from there).
    async fn final_drain(&mut self, kubelet: &Kubelet, resumed: bool) -> JobStatus {
        self.kill_operator();
        kubelet.detach().await;
        let api = EngineApi::new(reqwest::Client::new(), &self.engine_url());
        let mut waited = 0;
        while api
            .job()
            .await
            .map(|j| j.state != "running")
            .unwrap_or(true)
        {
            waited += 1;
            assert!(
                waited < 200,
                "engine not running before the final drain\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let out = api
            .stop_with_savepoint(true, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("final drain: {e}\n{}", self.logs()));
        let last = out.final_job.expect("final job status");
        let seen = self.max_emitted.load(Ordering::SeqCst);
        assert!(
            !resumed || last.records_emitted >= seen,
            "the job went back: {} records emitted at the end, {seen} seen before\n{}",
            last.records_emitted,
            self.logs()
        );
        last
    }

    async fn cleanup(mut self) {
        self.kill_operator();
        let _ = self.jobs().delete(JOB, &DeleteParams::default()).await;
        // Nothing removes the finalizer once the operator is gone.
        let _ = self
            .jobs()
            .patch(
                JOB,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
            )
            .await;
        let nss: Api<Namespace> = Api::all(self.admin.clone());
        let _ = nss.delete(&self.ns, &DeleteParams::default()).await;
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.kill_operator();
    }
}

fn condition(status: &StreamJobStatus, type_: &str) -> Option<String> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

fn assert_no_loss(job: &JobStatus) {
    assert!(job.records_emitted > 0, "{job:#?}");
    assert_eq!(
        job.records_emitted,
        job.records_accounted + job.records_filtered,
        "records lost or duplicated: {job:#?}"
    );
}

fn owned_by(meta: &kube::api::ObjectMeta, job: &StreamJob) -> bool {
    meta.owner_references.as_ref().is_some_and(|refs| {
        refs.iter().any(|r| {
            r.kind == "StreamJob" && r.name == JOB && Some(&r.uid) == job.metadata.uid.as_ref()
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_as_chart_service_account_deploys_and_rescales_a_job() {
    let Some(mut w) = World::new("e2e", true).await else {
        return;
    };
    let kubelet = Kubelet::start(w.admin.clone(), &w.ns, w.dir.path(), w.port);
    w.start_operator();
    let created = w.create_job("auto").await;

    // Owned objects and status, as written by the operator process.
    let (job, status) = w
        .wait_for("phase Running", Duration::from_secs(60), |j, s| {
            s.phase == Phase::Running && s.observed_generation == j.metadata.generation
        })
        .await;
    assert_eq!(job.metadata.uid, created.metadata.uid);
    assert_eq!(status.current_parallelism.get("work"), Some(&1));
    assert_eq!(status.total_parallelism, 3);
    assert_eq!(condition(&status, "Ready").as_deref(), Some("True"));
    assert_eq!(condition(&status, "Degraded").as_deref(), Some("False"));
    assert!(condition(&status, "Scaling").is_some(), "{status:#?}");
    assert!(
        job.finalizers()
            .iter()
            .any(|f| f == streamscale_operator::crd::FINALIZER),
        "no finalizer: {:?}",
        job.finalizers()
    );
    let ns = w.ns.clone();
    let cm = Api::<ConfigMap>::namespaced(w.admin.clone(), &ns)
        .get(&format!("{JOB}-job"))
        .await
        .expect("ConfigMap");
    assert!(owned_by(&cm.metadata, &job));
    assert!(cm.data.unwrap_or_default()["job.yaml"].contains("work"));
    let d = Api::<Deployment>::namespaced(w.admin.clone(), &ns)
        .get(&format!("{JOB}-engine"))
        .await
        .expect("Deployment");
    assert!(owned_by(&d.metadata, &job));
    let args =
        args_of(&serde_json::to_string(&d.spec.as_ref().expect("spec").template).expect("json"));
    assert!(
        args.join(" ")
            .contains("--parallelism sink=1,source=1,work=1"),
        "{args:?}"
    );
    let svc = Api::<Service>::namespaced(w.admin.clone(), &ns)
        .get(&format!("{JOB}-engine"))
        .await
        .expect("Service");
    assert!(owned_by(&svc.metadata, &job));
    let pvc = Api::<PersistentVolumeClaim>::namespaced(w.admin.clone(), &ns)
        .get(&format!("{JOB}-savepoints"))
        .await
        .expect("PVC");
    assert!(owned_by(&pvc.metadata, &job));

    // The step in the source rate makes the planner scale `work` up.
    let mut steps: Vec<RescaleStep> = Vec::new();
    let (_, status) = w
        .wait_for("a completed rescale", Duration::from_secs(90), |_, s| {
            if let Some(r) = &s.rescale
                && steps.last() != Some(&r.step)
            {
                steps.push(r.step);
            }
            s.rescales >= 1 && s.rescale.is_none() && s.phase == Phase::Running
        })
        .await;
    eprintln!("rescale steps seen: {steps:?}");
    assert!(steps.contains(&RescaleStep::Savepointing), "{steps:?}");
    assert!(
        steps.contains(&RescaleStep::Redeploying) || steps.contains(&RescaleStep::Restoring),
        "{steps:?}"
    );
    let work = status.current_parallelism["work"];
    assert!(work > 1, "{status:#?}");
    assert_eq!(status.total_parallelism, work + 2);
    let decision = status.last_decision.as_ref().expect("last decision");
    assert!(decision.applied && decision.to["work"] > 1, "{decision:#?}");
    assert!(status.restored_from.is_some(), "{status:#?}");
    assert_eq!(condition(&status, "Scaling").as_deref(), Some("False"));
    assert_eq!(condition(&status, "Degraded").as_deref(), Some("False"));

    assert!(
        kubelet.starts.load(Ordering::SeqCst) >= 2,
        "the engine was not redeployed"
    );
    // Every decision and step is an Event (created by the operator's ServiceAccount; the
    // event of a step follows its status write).
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(w.admin.clone(), &ns);
    let wanted = ["RescaleStarted", "Savepointing", "Rescaled"];
    let mut reasons: Vec<String> = Vec::new();
    for _ in 0..100 {
        reasons = events
            .list(&Default::default())
            .await
            .expect("list events")
            .items
            .iter()
            .filter_map(|e| e.reason.clone())
            .collect();
        if wanted.iter().all(|w| reasons.iter().any(|r| r == w)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for wanted in wanted {
        assert!(
            reasons.iter().any(|r| r == wanted),
            "no {wanted} event in {reasons:?}\n{}",
            w.logs()
        );
    }
    // Leader election through the chart's Lease Role.
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(w.admin.clone(), RELEASE_NS)
            .get("streamscale-operator")
            .await
            .expect("the leader-election Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("it-e2e")
    );
    // The operator's own metrics.
    let metrics = reqwest::get(format!("http://127.0.0.1:{}/metrics", w.metrics_port))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body");
    for name in [
        "streamscale_operator_reconciles_total",
        "streamscale_operator_decisions_total{verdict=\"rescale\"}",
        "streamscale_operator_rescale_step_seconds_count",
    ] {
        assert!(metrics.contains(name), "no {name} in\n{metrics}");
    }
    // The chart's RBAC let the operator do everything it tried.
    let log = std::fs::read_to_string(w.operator_log()).unwrap_or_default();
    assert!(
        !log.contains("forbidden") && !log.contains("cannot publish event"),
        "{}",
        w.logs()
    );
    let engine = w.final_drain(&kubelet, true).await;
    let running = engine
        .operators
        .iter()
        .find(|o| o.name == "work")
        .map(|o| o.parallelism);
    assert_eq!(running, Some(work), "{engine:#?}");
    assert_no_loss(&engine);
    drop(kubelet);
    w.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_killed_between_rescale_steps_resumes_without_losing_records() {
    let Some(mut w) = World::new("kill", false).await else {
        return;
    };
    let kubelet = Kubelet::start(w.admin.clone(), &w.ns, w.dir.path(), w.port);
    w.start_operator();
    w.create_job("auto").await;
    w.wait_for("phase Running", Duration::from_secs(60), |_, s| {
        s.phase == Phase::Running
    })
    .await;

    // SIGKILL the operator as soon as status shows each step, then restart it.
    let mut killed_at: Vec<RescaleStep> = Vec::new();
    let start = Instant::now();
    let status = loop {
        let status = w.status().await.map(|(_, s)| s);
        if let Some(s) = &status {
            if let Some(r) = &s.rescale
                && !killed_at.contains(&r.step)
            {
                killed_at.push(r.step);
                w.kill_operator();
                // Down long enough at Savepointing for the engine to finish its savepoint and
                // exit, and for the (test's) kubelet to restart its container.
                let down = if r.step == RescaleStep::Savepointing {
                    3000
                } else {
                    300
                };
                tokio::time::sleep(Duration::from_millis(down)).await;
                w.start_operator();
            } else if s.rescale.is_none() && (s.rescales >= 1 || !killed_at.is_empty()) {
                break s.clone();
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no finished rescale after 120 s (killed at {killed_at:?}); status {status:#?}\n{}",
            w.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "killed the operator at {killed_at:?} ({} starts); rescales {}, parallelism {:?}",
        w.operator_starts, status.rescales, status.current_parallelism
    );
    let log = std::fs::read_to_string(w.operator_log()).unwrap_or_default();
    for line in log.lines().filter(|l| l.contains("reason=")) {
        eprintln!("operator: {}", line.chars().take(300).collect::<String>());
    }
    assert!(
        killed_at.contains(&RescaleStep::Savepointing),
        "{killed_at:?}"
    );
    assert!(killed_at.len() >= 2, "{killed_at:?}");
    assert_eq!(status.phase, Phase::Running, "{status:#?}");
    // Resumed (rescaled) or rolled back (when the operator died between the engine's
    // answer to the savepoint request and recording its id): either way the job runs at what
    // status says, and every record emitted is accounted for.
    let resumed = status.rescales >= 1;
    if !resumed {
        assert_eq!(
            condition(&status, "Degraded").as_deref(),
            Some("True"),
            "{status:#?}"
        );
    }
    let engine = w.final_drain(&kubelet, resumed).await;
    let running: BTreeMap<String, u32> = engine
        .operators
        .iter()
        .map(|o| (o.name.clone(), o.parallelism))
        .collect();
    assert_eq!(running, status.current_parallelism, "{engine:#?}");
    assert_no_loss(&engine);
    drop(kubelet);
    w.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_that_lost_the_savepoint_id_rolls_back_and_replaces_the_stopped_engine() {
    let Some(mut w) = World::new("lost", false).await else {
        return;
    };
    let kubelet = Kubelet::start(w.admin.clone(), &w.ns, w.dir.path(), w.port);
    w.start_operator();
    w.create_job("off").await;
    let (_, before) = w
        .wait_for("phase Running", Duration::from_secs(60), |_, s| {
            s.phase == Phase::Running
        })
        .await;
    // The operator dies between the engine's answer to its stop-with-savepoint request and the
    // status write that records the id: status says Savepointing without an id, and the engine
    // is stopped (nobody reads the savepoint's status, so it does not exit).
    w.kill_operator();
    let api = EngineApi::new(reqwest::Client::new(), &w.engine_url());
    tokio::time::sleep(Duration::from_secs(1)).await;
    api.request_stop_with_savepoint(false)
        .await
        .expect("stop-with-savepoint");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let mut to = before.current_parallelism.clone();
    to.insert("work".into(), 2);
    let rescale = RescaleStatus {
        step: RescaleStep::Savepointing,
        from: before.current_parallelism.clone(),
        to,
        reason: "test".into(),
        savepoint_id: None,
        savepoint_path: None,
        rolling_back: false,
        started_at: now.clone(),
        step_started_at: now,
    };
    w.jobs()
        .patch_status(
            JOB,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"status": {"rescale": rescale, "phase": "Rescaling"}}),
            ),
        )
        .await
        .expect("patch status");
    for _ in 0..100 {
        if api.job().await.is_ok_and(|j| j.state == "stopped") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The restarted operator rolls back to the old parallelism and replaces the stopped engine.
    w.start_operator();
    let (_, status) = w
        .wait_for("the roll back", Duration::from_secs(60), |_, s| {
            s.rescale.is_none() && s.phase == Phase::Running
        })
        .await;
    assert_eq!(status.rescales, 0, "{status:#?}");
    assert!(status.restarts >= 1, "{status:#?}");
    assert_eq!(status.current_parallelism, before.current_parallelism);
    assert_eq!(condition(&status, "Degraded").as_deref(), Some("True"));
    let scaling = status.conditions.iter().find(|c| c.type_ == "Scaling");
    assert_eq!(
        scaling.map(|c| c.reason.as_str()),
        Some("RolledBack"),
        "{status:#?}"
    );
    let engine = w.final_drain(&kubelet, false).await;
    assert_eq!(engine.state, "stopped", "{engine:#?}");
    let running: BTreeMap<String, u32> = engine
        .operators
        .iter()
        .map(|o| (o.name.clone(), o.parallelism))
        .collect();
    assert_eq!(running, before.current_parallelism, "{engine:#?}");
    assert_no_loss(&engine);
    drop(kubelet);
    w.cleanup().await;
}
