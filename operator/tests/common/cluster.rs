//! The operator against a real API server with the test playing the kubelet: the chart
//! installed once, the operator process as the chart's ServiceAccount ([`World`]), and the
//! engine Deployment's pod run as a local `streamscale-engine` process ([`Kubelet`]: restarts
//! it when its template changes, strategy `Recreate`, or when it exits, restartPolicy
//! `Always`, with the same arguments). Shared by `operator_process.rs` and
//! `operator_kafka.rs`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{env, root, run, var};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use streamscale_controller::api::{EngineApi, JobStatus};
use streamscale_operator::crd::{StreamJob, StreamJobStatus, StreamQuota};

pub const RELEASE: &str = "op";
pub const RELEASE_NS: &str = "streamscale-op";
/// The chart's ServiceAccount (the release's full name).
pub const SERVICE_ACCOUNT: &str = "op-streamscale";
pub const JOB: &str = "demo";

/// The tests of this file run one at a time: each runs engines, operators and sometimes a
/// Prometheus server, and their timing (a lease takeover, step timeouts) must not depend on
/// how many others share the cores.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Installs the chart once (CRD, ServiceAccount, RBAC) for every test of this file, as
/// release [`RELEASE`] in [`RELEASE_NS`].
pub fn chart_installed(env: &[(String, String)]) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| install_chart(env, RELEASE, RELEASE_NS));
}

/// Installs (or upgrades) the chart as release `release` in namespace `ns` with helm.
///
/// # Panics
/// When helm fails.
pub fn install_chart(env: &[(String, String)], release: &str, ns: &str) {
    let chart = root().join("charts/streamscale");
    let (ok, out) = run(
        env,
        &var(env, "HELM"),
        &[
            "upgrade",
            "--install",
            release,
            chart.to_str().unwrap_or_default(),
            "-n",
            ns,
            "--create-namespace",
            "--wait=false",
        ],
        None,
    );
    assert!(ok, "helm install: {out}");
}

/// The `streamscale-engine` binary next to this test's target directory, built if missing.
pub fn engine_bin() -> PathBuf {
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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| l.chars().take(400).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A running engine "pod".
pub struct Pod {
    pub child: Child,
    pub template: String,
    pub exited_at: Option<Instant>,
}

/// A pod's engine ends with it, however the pod is dropped (a Recreate, the kubelet's drop, or
/// its watch task cancelled at the end of a test with an engine it had just started).
impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test's stand-in for the kubelet of the engine Deployment.
pub struct Kubelet {
    pub stop: Arc<AtomicBool>,
    pub pod: Arc<Mutex<Option<Pod>>>,
    pub starts: Arc<AtomicU32>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Kubelet {
    pub fn start(admin: Client, ns: &str, dir: &Path, port: u16) -> Kubelet {
        Self::start_on_node(admin, ns, dir, port, None)
    }

    /// Like [`Kubelet::start`] on a node with `cpu_millis` allocatable CPU: a pod whose engine
    /// container requests more stays Pending (no engine runs), as the scheduler would leave it.
    pub fn start_on_node(
        admin: Client,
        ns: &str,
        dir: &Path,
        port: u16,
        cpu_millis: Option<u32>,
    ) -> Kubelet {
        Self::start_for(admin, ns, dir, port, cpu_millis, JOB)
    }

    /// [`Kubelet::start_on_node`] for the StreamJob named `job`.
    pub fn start_for(
        admin: Client,
        ns: &str,
        dir: &Path,
        port: u16,
        cpu_millis: Option<u32>,
        job: &str,
    ) -> Kubelet {
        let job = job.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let pod: Arc<Mutex<Option<Pod>>> = Arc::new(Mutex::new(None));
        let starts = Arc::new(AtomicU32::new(0));
        let (s, p, n) = (stop.clone(), pod.clone(), starts.clone());
        let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
        let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
        let secrets: Api<Secret> = Api::namespaced(admin, ns);
        let dir = dir.to_path_buf();
        let bin = engine_bin();
        let task = tokio::spawn(async move {
            while !s.load(Ordering::SeqCst) {
                tick(
                    &job,
                    &deployments,
                    &configmaps,
                    &secrets,
                    &dir,
                    &bin,
                    port,
                    cpu_millis,
                    &p,
                    &n,
                )
                .await;
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
    pub async fn detach(&self) {
        self.stop.store(true, Ordering::SeqCst);
        while !self.task.is_finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // No tick may start another engine after this one is gone.
        self.task.abort();
        // Dropping the pod kills its engine (see `impl Drop for Pod`).
        drop(self.pod.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

#[allow(clippy::too_many_arguments)]
pub async fn tick(
    job: &str,
    deployments: &Api<Deployment>,
    configmaps: &Api<ConfigMap>,
    secrets: &Api<Secret>,
    dir: &Path,
    bin: &Path,
    port: u16,
    cpu_millis: Option<u32>,
    pod: &Mutex<Option<Pod>>,
    starts: &AtomicU32,
) {
    let Ok(d) = deployments.get_opt(&format!("{job}-engine")).await else {
        return;
    };
    let template = d.as_ref().and_then(|d| {
        let spec = d.spec.as_ref()?;
        (spec.replicas != Some(0)).then(|| serde_json::to_string(&spec.template).ok())?
    });
    let job_yaml = match &template {
        Some(_) => match configmaps.get_opt(&format!("{job}-job")).await {
            Ok(Some(cm)) => cm.data.and_then(|mut d| d.remove("job.yaml")),
            _ => return,
        },
        None => None,
    };
    // The engine token Secret's `token`, as the pod's secret volume holds it (a pod whose
    // Secret is missing does not start, as with a real kubelet).
    let token = match &template {
        Some(_) => match secrets.get_opt(&format!("{job}-engine-token")).await {
            Ok(Some(s)) => s
                .data
                .and_then(|mut d| d.remove("token"))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned()),
            _ => return,
        },
        None => None,
    };
    let pod_files = PodFiles {
        job_yaml: job_yaml.as_deref(),
        token: token.as_deref(),
    };
    let mut guard = pod.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = guard.as_mut() {
        if Some(&p.template) == template.as_ref() {
            // Same pod: restart its container when it exited (restartPolicy Always, 1 s backoff).
            match (p.exited_at, p.child.try_wait()) {
                (None, Ok(Some(_))) => p.exited_at = Some(Instant::now()),
                (Some(at), _) if at.elapsed() > Duration::from_secs(1) => {
                    let args = args_of(&p.template);
                    p.child = spawn_engine(bin, dir, port, &args, &pod_files, starts);
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
        // Unschedulable on this node: Pending, no container.
        if let (Some(capacity), Some(request)) = (cpu_millis, cpu_request_millis(&template))
            && request > capacity
        {
            return;
        }
        let args = args_of(&template);
        let child = spawn_engine(bin, dir, port, &args, &pod_files, starts);
        *guard = Some(Pod {
            child,
            template,
            exited_at: None,
        });
    }
}

/// The engine container's CPU request in millicores (`750m` or `2`).
pub fn cpu_request_millis(template: &str) -> Option<u32> {
    let t: serde_json::Value = serde_json::from_str(template).ok()?;
    let cpu = t["spec"]["containers"][0]["resources"]["requests"]["cpu"].as_str()?;
    match cpu.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => cpu.parse::<f64>().ok().map(|c| (c * 1000.0).round() as u32),
    }
}

pub fn args_of(template: &str) -> Vec<String> {
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

/// The files a pod's volumes hold: the job ConfigMap's `job.yaml` and the token Secret's
/// `token`.
pub struct PodFiles<'a> {
    pub job_yaml: Option<&'a str>,
    pub token: Option<&'a str>,
}

pub fn spawn_engine(
    bin: &Path,
    dir: &Path,
    port: u16,
    args: &[String],
    files: &PodFiles<'_>,
    starts: &AtomicU32,
) -> Child {
    let n = starts.fetch_add(1, Ordering::SeqCst);
    let job = dir.join(format!("job-{n}.yaml"));
    std::fs::write(&job, files.job_yaml.unwrap_or_default()).expect("write job file");
    let token = dir.join(format!("token-{n}"));
    std::fs::write(&token, files.token.unwrap_or_default()).expect("write token file");
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
            "--auth-token-file" => {
                it.next();
                mapped.push(token.display().to_string());
            }
            _ => {}
        }
    }
    let log = std::fs::File::create(dir.join(format!("engine-{n}.log"))).expect("engine log");
    // The engine's stdin is a pipe this process holds: should the test process die without
    // dropping the pod, the pipe closes and the engine exits by itself.
    Command::new(bin)
        .args(&mapped)
        .env("STREAMSCALE_ENGINE_EXIT_ON_STDIN_EOF", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn streamscale-engine")
}

/// One test's world: a namespace, the operator process and the kubelet.
pub struct World {
    pub admin: Client,
    pub dir: tempfile::TempDir,
    pub ns: String,
    pub kubeconfig: PathBuf,
    pub identity: String,
    pub leader_election: bool,
    /// `LEASE_NAME` and `LEASE_DURATION_SECONDS` of the operators.
    pub lease: (String, u32),
    pub operator: Option<Child>,
    pub operator_starts: u32,
    pub port: u16,
    pub metrics_port: u16,
    /// Largest `recordsEmitted` the engine reported (a sampler runs while the job exists).
    pub max_emitted: Arc<AtomicU64>,
}

impl World {
    pub async fn new(tag: &str, leader_election: bool) -> Option<World> {
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
        crds.patch(
            "streamquotas.streamscale.dev",
            &PatchParams::apply("streamscale-tests").force(),
            &Patch::Apply(StreamQuota::crd()),
        )
        .await
        .expect("apply the StreamQuota CRD");

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
            lease: ("streamscale-operator".into(), 15),
            operator: None,
            operator_starts: 0,
            port: free_port(),
            metrics_port: free_port(),
            max_emitted: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn start_operator(&mut self) {
        assert!(self.operator.is_none());
        self.operator_starts += 1;
        let child = self.spawn_operator(&self.identity, self.metrics_port, &self.operator_log());
        self.operator = Some(child);
    }

    /// An operator process as `identity` (POD_NAME), serving its metrics on `metrics_port`,
    /// logging to `log`.
    pub fn spawn_operator(&self, identity: &str, metrics_port: u16, log: &Path) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("operator log");
        Command::new(env!("CARGO_BIN_EXE_streamscale-operator"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("WATCH_NAMESPACE", &self.ns)
            .env("METRICS_ADDR", format!("127.0.0.1:{metrics_port}"))
            .env("LEADER_ELECTION", self.leader_election.to_string())
            .env("LEASE_NAME", &self.lease.0)
            .env("LEASE_DURATION_SECONDS", self.lease.1.to_string())
            .env("POD_NAMESPACE", RELEASE_NS)
            .env("POD_NAME", identity)
            // As the chart sets them (`networkPolicy` values).
            .env("NETWORK_POLICY", "true")
            .env(
                "OPERATOR_POD_LABELS",
                "app.kubernetes.io/instance=op,app.kubernetes.io/name=streamscale",
            )
            .env(
                "PROMETHEUS_NAMESPACE_SELECTOR",
                "kubernetes.io/metadata.name=monitoring",
            )
            .env("RUST_LOG", "info,kube=warn")
            .env("NO_COLOR", "1")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn streamscale-operator")
    }

    /// SIGKILL, as a node failure or OOM kill would.
    pub fn kill_operator(&mut self) {
        if let Some(mut c) = self.operator.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn operator_log(&self) -> PathBuf {
        self.dir.path().join("operator.log")
    }

    pub fn logs(&self) -> String {
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

    pub fn engine_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The current token of the job's engine token Secret (as the operator wrote it).
    pub async fn engine_token(&self) -> String {
        let secret = Api::<Secret>::namespaced(self.admin.clone(), &self.ns)
            .get(&format!("{JOB}-engine-token"))
            .await
            .unwrap_or_else(|e| panic!("engine token Secret: {e}\n{}", self.logs()));
        let bytes = secret
            .data
            .and_then(|mut d| d.remove("token"))
            .expect("token key");
        String::from_utf8(bytes.0).expect("utf-8 token")
    }

    /// The engine's REST client with the job's token.
    pub async fn engine_api(&self) -> EngineApi {
        let token = self.engine_token().await;
        EngineApi::new(reqwest::Client::new(), &self.engine_url()).with_token(Some(&token))
    }

    pub fn jobs(&self) -> Api<StreamJob> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// A job whose source steps from 200 to 1500 records/s after 4 s; `work` (1 ms of I/O
    /// per record, so about 1000 records/s per subtask) must scale up from 1.
    pub async fn create_job(&self, mode: &str) -> StreamJob {
        self.create_job_with(mode, serde_json::json!({})).await
    }

    /// [`World::create_job`] with more `spec.autoscaler` settings (merged over the defaults).
    pub async fn create_job_with(&self, mode: &str, autoscaler: serde_json::Value) -> StreamJob {
        self.create_job_with_spec(mode, autoscaler, serde_json::json!({}))
            .await
    }

    /// [`World::create_job_with`] with more top-level `spec` fields.
    pub async fn create_job_with_spec(
        &self,
        mode: &str,
        autoscaler: serde_json::Value,
        spec: serde_json::Value,
    ) -> StreamJob {
        let mut job = serde_json::json!({
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
        });
        if let Some(extra) = autoscaler.as_object() {
            for (k, v) in extra {
                job["spec"]["autoscaler"][k] = v.clone();
            }
        }
        if let Some(extra) = spec.as_object() {
            for (k, v) in extra {
                job["spec"][k] = v.clone();
            }
        }
        let job: StreamJob = serde_json::from_value(job).expect("StreamJob");
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

    pub async fn status(&self) -> Option<(StreamJob, StreamJobStatus)> {
        let job = self.jobs().get_opt(JOB).await.ok().flatten()?;
        let status = job.status.clone()?;
        Some((job, status))
    }

    /// Polls the StreamJob until `done` holds, failing with the logs after `timeout`.
    pub async fn wait_for(
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
    pub async fn final_drain(&mut self, kubelet: &Kubelet, resumed: bool) -> JobStatus {
        self.kill_operator();
        kubelet.detach().await;
        let api = self.engine_api().await;
        let mut waited = 0;
        while api
            .job()
            .await
            .map(|j| j.state != "running")
            .unwrap_or(true)
        {
            waited += 1;
            // 60 s at 50 ms: a deadline for an engine that never runs again only.
            assert!(
                waited < 1200,
                "engine not running before the final drain\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let out = api
            .stop_with_savepoint(true, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("final drain: {e}\n{}", self.logs()));
        let last = out.final_job;
        let seen = self.max_emitted.load(Ordering::SeqCst);
        assert!(
            !resumed || last.records_emitted >= seen,
            "the job went back: {} records emitted at the end, {seen} seen before\n{}",
            last.records_emitted,
            self.logs()
        );
        last
    }

    pub async fn cleanup(mut self) {
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

pub fn condition(status: &StreamJobStatus, type_: &str) -> Option<String> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

pub fn assert_no_loss(job: &JobStatus) {
    assert!(job.records_emitted > 0, "{job:#?}");
    assert_eq!(
        job.records_emitted,
        job.records_accounted + job.records_filtered,
        "records lost or duplicated: {job:#?}"
    );
}

pub fn owned_by(meta: &kube::api::ObjectMeta, job: &StreamJob) -> bool {
    meta.owner_references.as_ref().is_some_and(|refs| {
        refs.iter().any(|r| {
            r.kind == "StreamJob" && r.name == JOB && Some(&r.uid) == job.metadata.uid.as_ref()
        })
    })
}

/// The Events of namespace `ns`: (reason, note) each.
pub async fn event_reasons(admin: &Client, ns: &str) -> Vec<(String, String)> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}
