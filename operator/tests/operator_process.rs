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
//!   finalizer, Events, an autoscaler rescale, a second one after a spec change whose savepoint
//!   replaces the first in the savepoint history (`savepointHistoryMaxCount: 1`: the first
//!   one's directory is disposed of through the engine), and no record lost (the engine's
//!   counters after a final drain);
//! * `operator_killed_between_rescale_steps_resumes_without_losing_records`: SIGKILL at each
//!   rescale step and right after the stop-with-savepoint request, restart, resume (the
//!   savepoint id is persisted before the request, so nothing rolls back);
//! * `operator_that_lost_the_savepoint_id_rolls_back_and_replaces_the_stopped_engine`: a
//!   rescale in status without a savepoint id (as an operator before ids were persisted first
//!   left it) while the engine has stopped rolls back;
//! * `modes_recommend_and_off_never_rescale`: `recommend` (metrics read from a real
//!   Prometheus server) writes the recommendation and an Event, `off` neither, and no engine
//!   is redeployed;
//! * `two_replicas_one_leader_and_a_takeover`: two operator processes, one Lease: only the
//!   holder reconciles; SIGKILL it and the other takes over once the lease has expired;
//! * `failed_restore_rolls_back_to_the_old_parallelism_from_the_same_savepoint`: the engine
//!   pod at the new parallelism does not fit the node (stays Pending); after
//!   `restoreTimeoutSeconds` the old parallelism is redeployed from the same savepoint.
//!
//! * `a_rescale_whose_deployment_is_refused_rolls_back_and_backs_off`: an admission policy
//!   refuses the Deployment at the new parallelism; the rescale rolls back after
//!   `restoreTimeoutSeconds`, `status.backoff` holds the next attempts, and once the policy is
//!   gone a rescale completes;
//!
//! * `jobs_sharing_a_quota_keep_their_needed_share_when_one_spikes`: two StreamJobs share a
//!   StreamQuota; one spikes far past its share, the other still gets (and runs) what it needs,
//!   and the spiking one holds at its share, reported in status and Events; the two never hold
//!   more subtasks than the quota; `a_job_over_its_quota_share_sheds_load_at_its_sources`: the
//!   same with `onLimit: shed` on the spiking job, whose engine then drops the excess;
//! * `operator_restart_keeps_the_rate_history_and_what_it_learned`: the forecast's rate
//!   history, the learned scalability factor and the rescale downtime go to the job's
//!   `NAME-autoscaler` ConfigMap; a restarted operator loads them and goes on from there.
//!
//! * `engine_token_secret_guards_the_engine_and_rotates_without_losing_the_job`: the engine
//!   token Secret (owner reference, mounted as `--auth-token-file`) and the engine
//!   NetworkPolicy (owner reference, the operator's pods and the Prometheus namespace only),
//!   401 without the token, two rotations by annotation (the engine keeps its token), the
//!   final savepoint on delete still taken with the oldest token the operator keeps, no token
//!   in status, Events or the log.
//! * `an_engine_deployed_without_a_token_moves_onto_it_through_a_savepoint`: an engine an
//!   older operator deployed (`--insecure-bind`, no token) is redeployed with its token through
//!   a savepoint at the same parallelism, losing no record.
//!
//! Without the control-plane binaries the tests are skipped with a printed reason, except under
//! CI=true, where they fail.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{env, var};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use streamscale_controller::api::EngineApi;
use streamscale_operator::crd::{
    DecisionAction, Phase, RescaleStatus, RescaleStep, StreamJob, StreamQuota,
};

use common::cluster::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_as_chart_service_account_deploys_and_rescales_a_job() {
    let _serial = SERIAL.lock().await;
    let Some(mut w) = World::new("e2e", true).await else {
        return;
    };
    let kubelet = Kubelet::start(w.admin.clone(), &w.ns, w.dir.path(), w.port);
    w.start_operator();
    // `work` may first grow to 2 only (1500 records/s need 3), so that lifting the bound later
    // makes a second rescale; a history of one savepoint disposes of the first one then.
    let created = w
        .create_job_with_spec(
            "auto",
            serde_json::json!({"parallelism": {"work": {"min": 1, "max": 2}}}),
            serde_json::json!({"savepointHistoryMaxCount": 1}),
        )
        .await;

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
    // The rescale's decision, or the hold that follows it at the new parallelism.
    let decision = status.last_decision.as_ref().expect("last decision");
    assert!(
        decision.to["work"] > 1 && (decision.applied || decision.action == DecisionAction::Hold),
        "{decision:#?}"
    );
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
    // Events are written after the status that the wait above saw: up to 60 s on a loaded
    // machine (100 ms apart).
    for _ in 0..600 {
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
    // Savepoint history: the first rescale's savepoint is listed; after a second rescale (the
    // bound lifted) only the second one is, and the first one's directory is gone.
    assert_eq!(status.savepoint_history.len(), 1, "{status:#?}");
    let first = status.savepoint_history[0].clone();
    assert_eq!(
        Some(&first.path),
        status.restored_from.as_ref(),
        "{status:#?}"
    );
    assert!(
        first.time.parse::<k8s_openapi::jiff::Timestamp>().is_ok(),
        "{first:?}"
    );
    let first_dir = PathBuf::from(&first.path);
    assert!(first_dir.join("_metadata.json").is_file(), "{first:?}");
    w.jobs()
        .patch(
            JOB,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!(
                {"spec": {"autoscaler": {"parallelism": {"work": {"min": 1, "max": 4}}}}}
            )),
        )
        .await
        .expect("lift the bound");
    let (_, status) = w
        .wait_for(
            "a second rescale and the first savepoint disposed of",
            Duration::from_secs(90),
            |_, s| {
                s.rescales >= 2
                    && s.rescale.is_none()
                    && s.phase == Phase::Running
                    && s.savepoint_history.len() == 1
            },
        )
        .await;
    let second = &status.savepoint_history[0];
    assert_ne!(second.id, first.id, "{status:#?}");
    assert_eq!(
        Some(&second.path),
        status.restored_from.as_ref(),
        "{status:#?}"
    );
    assert!(
        !first_dir.exists(),
        "{} is still there\n{}",
        first_dir.display(),
        w.logs()
    );
    assert!(PathBuf::from(&second.path).join("_metadata.json").is_file());
    // The disposal's Event follows the status write.
    let mut disposed = Vec::new();
    // Up to 60 s (100 ms apart) on a loaded machine.
    for _ in 0..600 {
        disposed = event_reasons(&w.admin, &ns)
            .await
            .into_iter()
            .filter(|(r, _)| r == "SavepointDisposed")
            .collect();
        if !disposed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        disposed.len() == 1 && disposed[0].1.contains(&first.path),
        "{disposed:?}"
    );
    let work = status.current_parallelism["work"];
    assert!(work > 2, "{status:#?}");
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
    let _serial = SERIAL.lock().await;
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

    // SIGKILL the operator as soon as status shows each step, then restart it. At
    // Savepointing also right after the stop-with-savepoint request (the engine knows the id
    // persisted in status), and stay down long enough for the engine to complete the
    // savepoint, exit unread (5 s) and be restarted by the kubelet: the restarted engine no
    // longer knows the id, the savepoint is on disk.
    let api = EngineApi::new(reqwest::Client::new(), &w.engine_url());
    const AFTER: &str = "Savepointing, after the request";
    let mut killed_at: Vec<String> = Vec::new();
    let mut savepoint_id = None;
    let start = Instant::now();
    let status = loop {
        let status = w.status().await.map(|(_, s)| s);
        if let Some(s) = &status {
            if let Some(r) = &s.rescale {
                let step = format!("{:?}", r.step);
                if r.step == RescaleStep::Savepointing {
                    let id = r
                        .savepoint_id
                        .clone()
                        .expect("the savepoint id is persisted with the Savepointing step");
                    savepoint_id = Some(id.clone());
                    if !killed_at.iter().any(|k| k.starts_with("Savepointing")) {
                        w.kill_operator();
                        let requested = api.savepoint(&id).await.is_ok();
                        killed_at.push(if requested {
                            AFTER.to_string()
                        } else {
                            "Savepointing, before the request".to_string()
                        });
                        let down = if requested { 7000 } else { 300 };
                        tokio::time::sleep(Duration::from_millis(down)).await;
                        w.start_operator();
                    } else if !killed_at.iter().any(|k| k == AFTER)
                        && api.savepoint(&id).await.is_ok()
                    {
                        w.kill_operator();
                        killed_at.push(AFTER.to_string());
                        tokio::time::sleep(Duration::from_millis(7000)).await;
                        w.start_operator();
                    }
                } else if !killed_at.contains(&step) {
                    killed_at.push(step);
                    w.kill_operator();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    w.start_operator();
                }
            } else if s.rescale.is_none() && (s.rescales >= 1 || !killed_at.is_empty()) {
                break s.clone();
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(150),
            "no finished rescale after 150 s (killed at {killed_at:?}); status {status:#?}\n{}",
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
    assert!(killed_at.iter().any(|k| k == AFTER), "{killed_at:?}");
    // And at a step after the savepoint: Restoring can pass between two polls when the engine
    // restored while the operator was down after its Redeploying kill (17 ms once).
    assert!(
        killed_at
            .iter()
            .any(|k| k == "Redeploying" || k == "Restoring"),
        "{killed_at:?}"
    );
    assert_eq!(status.phase, Phase::Running, "{status:#?}");
    // The id was persisted before the request: every kill resumes, none rolls back, and the
    // job runs from the savepoint that was requested under that id.
    assert_eq!(
        status.rescales, 1,
        "rolled back instead of resuming: {status:#?}"
    );
    assert_eq!(
        condition(&status, "Degraded").as_deref(),
        Some("False"),
        "{status:#?}"
    );
    let id = savepoint_id.expect("a savepoint id");
    assert_eq!(
        status.restored_from,
        Some(
            w.dir
                .path()
                .join("savepoints")
                .join(&id)
                .display()
                .to_string()
        ),
        "{status:#?}"
    );
    assert!(status.current_parallelism["work"] > 1, "{status:#?}");
    let resumed = true;
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
    let _serial = SERIAL.lock().await;
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
    let api = w.engine_api().await;
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
    // The scenario needs the engine stopped (a loaded machine can take seconds to stop it; it
    // exits 5 s after the unread stop, so poll often).
    let start = Instant::now();
    while !api.job().await.is_ok_and(|j| j.state == "stopped") {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the engine did not stop in 60 s\n{}",
            w.logs()
        );
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

/// Kills a child process when dropped (a second operator replica).
struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A REAL Prometheus server (Debian's `prometheus`, installed by `scripts/k8s-testenv.sh
/// build`) on loopback, scraping one engine every second as job `JOB-engine` with the label
/// `namespace`, so the operator's default selector finds it.
struct PrometheusServer {
    child: Child,
    url: String,
}

impl PrometheusServer {
    async fn start(env: &[(String, String)], dir: &Path, target: &str, ns: &str) -> Self {
        let mut bin = var(env, "PROMETHEUS");
        if bin.is_empty() {
            bin = "prometheus".into();
        }
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 scrape_configs:\n  - job_name: {JOB}-engine\n    static_configs:\n      \
                 - targets: [\"{target}\"]\n        labels: {{namespace: \"{ns}\"}}\n"
            ),
        )
        .expect("prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("prometheus log");
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("prom").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {bin} (scripts/k8s-testenv.sh build installs it): {e}")
            });
        let server = PrometheusServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..300 {
            if reqwest::get(format!("{}/-/ready", server.url))
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "prometheus not ready: {}",
            tail(&dir.join("prometheus.log"), 20)
        );
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the sample named exactly `name` (with labels) in a metrics page, 0 if absent.
fn metric_value(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn metrics_page(port: u16) -> String {
    reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body")
}

fn deployed_args(d: &Deployment) -> String {
    args_of(&serde_json::to_string(&d.spec.as_ref().expect("spec").template).expect("json"))
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modes_recommend_and_off_never_rescale() {
    let _serial = SERIAL.lock().await;
    let Some(env) = env() else { return };
    let Some(mut rec) = World::new("rec", false).await else {
        return;
    };
    let Some(mut off) = World::new("off", false).await else {
        return;
    };
    let prom = PrometheusServer::start(
        env,
        rec.dir.path(),
        &format!("127.0.0.1:{}", rec.port),
        &rec.ns,
    )
    .await;
    let k_rec = Kubelet::start(rec.admin.clone(), &rec.ns, rec.dir.path(), rec.port);
    let k_off = Kubelet::start(off.admin.clone(), &off.ns, off.dir.path(), off.port);
    rec.start_operator();
    off.start_operator();
    rec.create_job_with(
        "recommend",
        serde_json::json!({"prometheus": {"url": prom.url}}),
    )
    .await;
    off.create_job("off").await;

    // `recommend`: the planner's recommendation (from Prometheus' copy of the engine's
    // metrics) reaches status, unapplied.
    let (_, status) = rec
        .wait_for("a recommendation", Duration::from_secs(90), |_, s| {
            s.recommended_parallelism
                .get("work")
                .is_some_and(|w| *w > 1)
                && s.last_decision.is_some()
        })
        .await;
    let decision = status.last_decision.clone().expect("decision");
    assert!(!decision.applied, "{decision:#?}");
    assert!(decision.to["work"] > 1, "{decision:#?}");
    // Both jobs keep running for a while past the point where `auto` would have rescaled.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (w, k, mode) in [(&rec, &k_rec, "recommend"), (&off, &k_off, "off")] {
        let (_, s) = w.status().await.expect("status");
        assert_eq!(s.rescales, 0, "{mode}: {s:#?}");
        assert!(s.rescale.is_none(), "{mode}: {s:#?}");
        assert_eq!(s.phase, Phase::Running, "{mode}: {s:#?}");
        assert_eq!(s.current_parallelism["work"], 1, "{mode}: {s:#?}");
        assert_eq!(
            k.starts.load(Ordering::SeqCst),
            1,
            "{mode}: engine redeployed"
        );
        let d = Api::<Deployment>::namespaced(w.admin.clone(), &w.ns)
            .get(&format!("{JOB}-engine"))
            .await
            .expect("Deployment");
        assert!(
            deployed_args(&d).contains("--parallelism sink=1,source=1,work=1"),
            "{mode}: {}",
            deployed_args(&d)
        );
        let reasons = event_reasons(&w.admin, &w.ns).await;
        assert!(
            !reasons.iter().any(|(r, _)| r == "RescaleStarted"),
            "{mode}: {reasons:?}"
        );
    }
    let reasons = event_reasons(&rec.admin, &rec.ns).await;
    assert!(
        reasons
            .iter()
            .any(|(r, n)| r == "Recommendation" && n.contains("work=")),
        "{reasons:?}"
    );
    let page = metrics_page(rec.metrics_port).await;
    assert!(
        metric_value(
            &page,
            "streamscale_operator_metric_reads_total{source=\"prometheus\"}"
        ) >= 2.0,
        "{page}"
    );
    assert_eq!(
        metric_value(
            &page,
            "streamscale_operator_metric_reads_total{source=\"engine\"}"
        ),
        0.0,
        "{page}"
    );
    // `off`: no recommendation, no decision, no metrics read.
    let (_, s) = off.status().await.expect("status");
    assert!(s.recommended_parallelism.is_empty(), "{s:#?}");
    assert!(s.last_decision.is_none(), "{s:#?}");
    let reasons = event_reasons(&off.admin, &off.ns).await;
    assert!(
        !reasons.iter().any(|(r, _)| r == "Recommendation"),
        "{reasons:?}"
    );
    let page = metrics_page(off.metrics_port).await;
    assert!(
        !page.contains("streamscale_operator_metric_reads_total{"),
        "{page}"
    );
    assert!(
        metric_value(&page, "streamscale_operator_reconciles_total") > 0.0,
        "{page}"
    );
    for (w, k) in [(&mut rec, &k_rec), (&mut off, &k_off)] {
        let engine = w.final_drain(k, true).await;
        assert_no_loss(&engine);
    }
    drop(prom);
    drop((k_rec, k_off));
    rec.cleanup().await;
    off.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_leader_and_a_takeover() {
    let _serial = SERIAL.lock().await;
    let Some(mut w) = World::new("lease", true).await else {
        return;
    };
    // The leader renews a third of the lease before it expires (2 s here): slack for an
    // apiserver and etcd on a loaded machine (with 4 s the renewal had 1 s).
    const LEASE_S: u32 = 6;
    // A takeover comes when the lease has expired, after the follower's forced release and a
    // random wait of up to 1 s (kube-lease-manager), a few apiserver calls and this poll; the
    // bound allows 5 s for those on a loaded machine. A follower that waits for more than the
    // lease (or never takes over) still fails.
    const TAKEOVER_S: u64 = LEASE_S as u64 + 6;
    w.lease = (
        format!("streamscale-operator-it-{}", std::process::id()),
        LEASE_S,
    );
    let leases =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(w.admin.clone(), RELEASE_NS);
    let lease_name = w.lease.0.clone();
    let holder = || async {
        leases
            .get_opt(&lease_name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
    };
    let kubelet = Kubelet::start(w.admin.clone(), &w.ns, w.dir.path(), w.port);
    w.start_operator();
    let start = Instant::now();
    while holder().await.as_deref() != Some(w.identity.as_str()) {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the first replica never held the lease (90 s)\n{}",
            w.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (b_id, b_port, b_log) = (
        "it-lease-b",
        free_port(),
        w.dir.path().join("operator-b.log"),
    );
    let _b = Replica(w.spawn_operator(b_id, b_port, &b_log));
    w.create_job("off").await;
    w.wait_for("phase Running", Duration::from_secs(60), |_, s| {
        s.phase == Phase::Running
    })
    .await;
    // A few renewals later: the first replica still leads, the second has not reconciled.
    tokio::time::sleep(Duration::from_secs(u64::from(LEASE_S) + 1)).await;
    assert_eq!(holder().await.as_deref(), Some(w.identity.as_str()));
    let reconciles = |port| async move {
        metric_value(
            &metrics_page(port).await,
            "streamscale_operator_reconciles_total",
        )
    };
    assert!(reconciles(w.metrics_port).await > 0.0);
    assert_eq!(reconciles(b_port).await, 0.0, "{}", tail(&b_log, 20));
    let b_text = std::fs::read_to_string(&b_log).unwrap_or_default();
    assert!(b_text.contains("waiting for leadership"), "{b_text}");
    assert!(!b_text.contains("leading"), "{b_text}");

    // SIGKILL the leader (its Lease is not released): the other takes over once the lease has
    // expired and acts on the job (a spec change is applied to the Deployment).
    w.kill_operator();
    let killed = Instant::now();
    while holder().await.as_deref() != Some(b_id) {
        assert!(
            killed.elapsed() < Duration::from_secs(TAKEOVER_S),
            "no takeover within {TAKEOVER_S} s of the {LEASE_S} s lease: holder {:?}\n{}",
            holder().await,
            tail(&b_log, 20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("takeover after {:?}", killed.elapsed());
    let patched = w
        .jobs()
        .patch(
            JOB,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"engine": {"cpuMillisPerSubtask": 300}}})),
        )
        .await
        .expect("patch spec");
    let generation = patched.metadata.generation;
    w.wait_for(
        "the new leader's reconcile",
        Duration::from_secs(90),
        |_, s| s.observed_generation == generation,
    )
    .await;
    assert!(reconciles(b_port).await > 0.0);
    let d = Api::<Deployment>::namespaced(w.admin.clone(), &w.ns)
        .get(&format!("{JOB}-engine"))
        .await
        .expect("Deployment");
    let cpu = d
        .spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod")
        .containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref()?.get("cpu").cloned());
    assert_eq!(cpu.map(|q| q.0).as_deref(), Some("900m"));
    drop(_b);
    let engine = w.final_drain(&kubelet, false).await;
    assert_no_loss(&engine);
    drop(kubelet);
    w.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_restore_rolls_back_to_the_old_parallelism_from_the_same_savepoint() {
    let _serial = SERIAL.lock().await;
    let Some(mut w) = World::new("restore", false).await else {
        return;
    };
    // The node fits the engine at 3 subtasks (3 x 250m) but not at 4 or more: the pod of the
    // rescaled engine stays Pending and its restore times out.
    let kubelet = Kubelet::start_on_node(w.admin.clone(), &w.ns, w.dir.path(), w.port, Some(900));
    w.start_operator();
    w.create_job_with("auto", serde_json::json!({"restoreTimeoutSeconds": 4}))
        .await;
    w.wait_for("phase Running", Duration::from_secs(60), |_, s| {
        s.phase == Phase::Running
    })
    .await;
    let (mut taken, mut rolled_back_from) = (None, None);
    let (_, status) = w
        .wait_for(
            "the rolled back rescale",
            Duration::from_secs(90),
            |_, s| {
                if let Some(r) = &s.rescale {
                    if r.rolling_back {
                        rolled_back_from = r.savepoint_path.clone();
                    } else if r.savepoint_path.is_some() {
                        taken = r.savepoint_path.clone();
                    }
                }
                s.rescale.is_none()
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Scaling" && c.reason == "RolledBack")
            },
        )
        .await;
    // Before the autoscaler tries again.
    w.kill_operator();
    let taken = taken.expect("the rescale's savepoint");
    assert_eq!(rolled_back_from.as_ref(), Some(&taken), "{status:#?}");
    assert_eq!(status.restored_from.as_ref(), Some(&taken), "{status:#?}");
    assert_eq!(status.rescales, 0, "{status:#?}");
    assert_eq!(status.current_parallelism["work"], 1, "{status:#?}");
    assert_eq!(status.phase, Phase::Running, "{status:#?}");
    // The next attempt is held (10 s after a first failure).
    assert_eq!(
        status.backoff.as_ref().map(|b| b.failures),
        Some(1),
        "{status:#?}"
    );
    // The rescale's decision, or a hold after the rollback (at the old parallelism).
    assert!(
        status
            .last_decision
            .as_ref()
            .is_some_and(|d| d.to["work"] > 1 || d.action == DecisionAction::Hold),
        "{status:#?}"
    );
    let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded");
    assert_eq!(
        degraded.map(|c| (c.status.as_str(), c.reason.as_str())),
        Some(("True", "RescaleRolledBack")),
        "{status:#?}"
    );
    let events = event_reasons(&w.admin, &w.ns).await;
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "RollingBack" && n.contains("failed; rolling back")),
        "{events:?}"
    );
    // The engine runs the old parallelism restored from that savepoint, nothing lost and
    // nothing behind what ran before the rescale.
    let engine = w.final_drain(&kubelet, true).await;
    assert_eq!(engine.restored_from.as_ref(), Some(&taken), "{engine:#?}");
    let work = engine
        .operators
        .iter()
        .find(|o| o.name == "work")
        .map(|o| o.parallelism);
    assert_eq!(work, Some(1), "{engine:#?}");
    assert_no_loss(&engine);
    drop(kubelet);
    w.cleanup().await;
}

/// A rescale whose Deployment the API server refuses (a ValidatingAdmissionPolicy that allows
/// one `work` subtask only, as a cluster's policy or quota would): the engine has stopped with
/// its savepoint, so after `restoreTimeoutSeconds` the old parallelism is redeployed from that
/// savepoint (before, the rescale waited in Redeploying with the engine stopped, for ever).
/// `status.backoff` then holds the next attempts (10 s, doubling), said in `lastDecision`;
/// once the policy is gone, a rescale completes and clears it. No record lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescale_whose_deployment_is_refused_rolls_back_and_backs_off() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let _serial = SERIAL.lock().await;
    let Some(mut w) = World::new("refusedrescale", false).await else {
        return;
    };
    let name = format!("streamscale-test-{}", w.ns);
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["apps"], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["deployments"],
            }]},
            "validations": [{
                "expression": "!object.spec.template.spec.containers.exists(c, has(c.args) && \
                               c.args.exists(a, a.matches('(^|,)work=([2-9]|[1-9][0-9])')))",
                "message": "one work subtask at most in this namespace",
            }],
        },
    }))
    .expect("policy");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": w.ns},
            }},
        },
    }))
    .expect("binding");
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(w.admin.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(w.admin.clone());
    policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the binding");
    // Enforced once the API server has loaded it (and only by one started with the admission
    // plugin on: `scripts/k8s-testenv.sh` reuses a running one).
    let probe: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "policy-probe"},
        "spec": {
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {"containers": [{"name": "engine", "image": "probe",
                                         "args": ["--parallelism", "sink=1,source=1,work=2"]}]},
            },
        },
    }))
    .expect("probe");
    let deployments: Api<Deployment> = Api::namespaced(w.admin.clone(), &w.ns);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while deployments.create(&dry_run, &probe).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "the API server does not enforce the ValidatingAdmissionPolicy: restart it with \
             `scripts/k8s-testenv.sh stop` (the tests start it again)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let kubelet = Kubelet::start(w.admin.clone(), &w.ns, w.dir.path(), w.port);
    w.start_operator();
    w.create_job_with("auto", serde_json::json!({"restoreTimeoutSeconds": 15}))
        .await;
    w.wait_for("phase Running", Duration::from_secs(60), |_, s| {
        s.phase == Phase::Running
    })
    .await;
    // The policy is enforced once the API server has loaded it: a rescale's refusal is said
    // while it waits in Redeploying, then it rolls back.
    let (mut refused_while_redeploying, mut taken) = (false, None);
    let (_, status) = w
        .wait_for(
            "a rescale refused, then rolled back",
            Duration::from_secs(120),
            |_, s| {
                if let Some(r) = &s.rescale
                    && !r.rolling_back
                {
                    taken = r.savepoint_path.clone().or(taken.take());
                    refused_while_redeploying |= r.step == RescaleStep::Redeploying
                        && s.conditions.iter().any(|c| {
                            c.reason == "ApplyRefused"
                                && c.message.contains("one work subtask at most")
                        });
                }
                s.rescale.is_none()
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Scaling" && c.reason == "RolledBack")
            },
        )
        .await;
    assert!(refused_while_redeploying, "{status:#?}");
    let taken = taken.expect("the rescale's savepoint");
    assert_eq!(status.restored_from.as_ref(), Some(&taken), "{status:#?}");
    assert_eq!(
        (
            status.current_parallelism["work"],
            status.rescales,
            status.phase
        ),
        (1, 0, Phase::Running),
        "{status:#?}"
    );
    let backoff = status.backoff.clone().expect("status.backoff");
    assert!(backoff.failures >= 1, "{backoff:#?}");
    assert!(
        backoff.failed.iter().any(|f| f.parallelism["work"] > 1),
        "{backoff:#?}"
    );
    let degraded = status.conditions.iter().find(|c| c.type_ == "Degraded");
    assert!(
        degraded.is_some_and(|c| c.reason == "RescaleRolledBack" && c.message.contains("held")),
        "{status:#?}"
    );
    let events = event_reasons(&w.admin, &w.ns).await;
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "RollingBack" && n.contains("was not applied within 15 s")),
        "{events:?}"
    );
    // The planner still wants more: held by the backoff rather than stopping the job again at
    // once (the window is 4 s, the stabilization 2 s, the first hold 10 s).
    w.wait_for("a hold by the backoff", Duration::from_secs(120), |_, s| {
        s.last_decision.as_ref().is_some_and(|d| {
            d.action == DecisionAction::Hold && d.reason.contains("backing off until")
        })
    })
    .await;
    // The policy gone, the next attempt completes and clears the backoff.
    bindings
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the binding");
    policies
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the policy");
    let (_, status) = w
        .wait_for("a completed rescale", Duration::from_secs(420), |_, s| {
            s.rescales >= 1 && s.rescale.is_none()
        })
        .await;
    assert!(status.current_parallelism["work"] > 1, "{status:#?}");
    assert!(status.backoff.is_none(), "{status:#?}");
    let engine = w.final_drain(&kubelet, true).await;
    assert_no_loss(&engine);
    drop(kubelet);
    w.cleanup().await;
}

/// `prometheus` on PATH (installed by `scripts/k8s-testenv.sh build`); `None` skips the test
/// locally, CI=true fails it.
fn prometheus_on_path() -> Option<Vec<(String, String)>> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("prometheus"))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => Some(vec![("PROMETHEUS".into(), p.display().to_string())]),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("no prometheus on PATH (scripts/k8s-testenv.sh build installs it)")
        }
        None => {
            eprintln!("SKIP: no prometheus on PATH (run scripts/k8s-testenv.sh build)");
            None
        }
    }
}

/// The operator's Prometheus client against a REAL Prometheus server scraping a real engine:
/// the planner's sample has the same operators, subtasks and counters as a direct scrape of
/// the engine's `/metrics` (up to the records processed between the two), stamped at the
/// scrape's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_api_gives_the_planner_what_the_engine_exports() {
    let _serial = SERIAL.lock().await;
    let Some(env) = prometheus_on_path() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let job = dir.path().join("job.yaml");
    std::fs::write(
        &job,
        "name: prom\noperators:\n  - {name: source, kind: source, keys: 50, rate: {constant: 400}}\n  \
         - {name: work, kind: map, io: 500, parallelism: 2}\n  - {name: sink, kind: sink}\n\
         edges:\n  - {from: source, to: work}\n  - {from: work, to: sink}\n",
    )
    .expect("job file");
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("engine.log")).expect("engine log");
    let engine = Replica(
        Command::new(engine_bin())
            .arg("--job")
            .arg(&job)
            .arg("--bind")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--savepoint-dir")
            .arg(dir.path().join("savepoints"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn streamscale-engine"),
    );
    let prom =
        PrometheusServer::start(&env, dir.path(), &format!("127.0.0.1:{port}"), "prom-ns").await;
    let http = reqwest::Client::new();
    let clock = Instant::now();
    let selector = format!("namespace=\"prom-ns\",job=\"{JOB}-engine\"");
    let fetch = || async {
        let now_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        streamscale_operator::prometheus::fetch(
            &http,
            &prom.url,
            &selector,
            clock.elapsed().as_secs_f64(),
            now_unix,
        )
        .await
    };
    // Two distinct scrapes.
    let mut first = None;
    let second = loop {
        assert!(
            clock.elapsed() < Duration::from_secs(120),
            "no two scrapes in Prometheus in 120 s: {:?}\n{}",
            fetch().await.err(),
            tail(&dir.path().join("prometheus.log"), 20)
        );
        if let Ok(s) = fetch().await {
            match &first {
                None => first = Some(s),
                Some(f) if s.scraped_at_unix_s > f.scraped_at_unix_s => break s,
                Some(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let now_s = clock.elapsed().as_secs_f64();
    let direct = streamscale_controller::scrape::scrape(
        &http,
        &format!("http://127.0.0.1:{port}/metrics"),
        now_s,
    )
    .await
    .expect("direct scrape");
    let first = first.expect("first");
    let p = &second.metrics;
    assert_eq!(p.parallelism(), direct.parallelism());
    assert_eq!(p.parallelism()["work"], 2);
    // Stamped with the scrape's time (Prometheus scrapes every second).
    assert!(
        p.sample.at_seconds <= now_s && p.sample.at_seconds > now_s - 3.0,
        "{} vs {now_s}",
        p.sample.at_seconds
    );
    assert!(
        (second.scraped_at_unix_s - first.scraped_at_unix_s) >= 0.5,
        "{} {}",
        first.scraped_at_unix_s,
        second.scraped_at_unix_s
    );
    for (op, subtasks) in &direct.sample.operators {
        for (i, d) in subtasks.iter().enumerate() {
            let s = &p.sample.operators[op][i];
            let f = &first.metrics.sample.operators[op][i];
            // Counters: the direct scrape is later, by at most a few seconds of 400 records/s.
            for (what, pv, dv, fv) in [
                ("records_in", s.records_in, d.records_in, f.records_in),
                ("records_out", s.records_out, d.records_out, f.records_out),
                ("busy", s.busy_seconds, d.busy_seconds, f.busy_seconds),
                ("idle", s.idle_seconds, d.idle_seconds, f.idle_seconds),
            ] {
                assert!(
                    fv <= pv && pv <= dv && dv - pv <= 3.0 * 400.0,
                    "{op}[{i}].{what}: first {fv}, prometheus {pv}, direct {dv}"
                );
            }
            assert_eq!(s.source_arrivals.is_some(), d.source_arrivals.is_some());
            assert_eq!(s.source_backlog.is_some(), d.source_backlog.is_some());
        }
    }
    let work_in: f64 = p.sample.operators["work"]
        .iter()
        .map(|s| s.records_in)
        .sum();
    assert!(work_in > 0.0, "{p:#?}");
    drop(prom);
    drop(engine);
}

/// A StreamJob `name` in `world`'s namespace whose engine the test's kubelet runs on `port`,
/// with savepoints under `dir`: `source` at the given rate steps `(at s, records/s)`, `work`
/// (1 ms of I/O per record: about 1000 records/s per subtask, at most 8) and `sink`.
fn named_job(
    world: &World,
    name: &str,
    port: u16,
    dir: &Path,
    steps: &[(u32, u32)],
    autoscaler: serde_json::Value,
) -> StreamJob {
    let steps: Vec<serde_json::Value> = steps
        .iter()
        .map(|(at, r)| serde_json::json!({"atSeconds": at, "recordsPerSecond": r}))
        .collect();
    let mut job = serde_json::json!({
        "apiVersion": "streamscale.dev/v1alpha1",
        "kind": "StreamJob",
        "metadata": {
            "name": name,
            "namespace": world.ns,
            "annotations": {
                "streamscale.dev/engine-url": format!("http://127.0.0.1:{port}"),
                "streamscale.dev/savepoint-dir": dir.join("savepoints"),
            },
        },
        "spec": {
            "job": {
                "name": name,
                "maxParallelism": 32,
                "operators": [
                    {"name": "source", "kind": "source", "keys": 200, "rate": {"steps": steps}},
                    {"name": "work", "kind": "map", "io": 1000, "scaling": {"min": 1, "max": 8}},
                    {"name": "sink", "kind": "sink"},
                ],
                "edges": [{"from": "source", "to": "work"}, {"from": "work", "to": "sink"}],
            },
            "storage": {"size": "64Mi"},
            "autoscaler": {
                "mode": "auto",
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
    serde_json::from_value(job).expect("StreamJob")
}

/// Non-source subtasks a job holds (the larger of from/to during a rescale).
fn held_subtasks(job: &StreamJob) -> u32 {
    streamscale_operator::quota::non_source_total(
        &job.spec.job,
        &streamscale_operator::quota::held(job),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_sharing_a_quota_keep_their_needed_share_when_one_spikes() {
    quota_scenario("quota", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_its_quota_share_sheds_load_at_its_sources() {
    quota_scenario("quota-shed", Some(0.9)).await;
}

/// Two jobs under a StreamQuota of 6 subtasks, `spiky` spiking far past its share; with
/// `shed = Some(max share)` spiky has `onLimit: shed` and must drop the excess at its sources.
async fn quota_scenario(tag: &str, shed: Option<f64>) {
    let _serial = SERIAL.lock().await;
    let Some(mut world) = World::new(tag, false).await else {
        return;
    };
    // Quota 6 (an equal share is 3): `steady` at 800 records/s needs work 2 + sink 1 = 3;
    // `spiky` steps to 4000 records/s and would need about 6 + 1.
    let quotas: Api<StreamQuota> = Api::namespaced(world.admin.clone(), &world.ns);
    let quota: StreamQuota = serde_json::from_value(serde_json::json!({
        "apiVersion": "streamscale.dev/v1alpha1",
        "kind": "StreamQuota",
        "metadata": {"name": "team", "namespace": world.ns},
        "spec": {"subtasks": 6},
    }))
    .expect("StreamQuota");
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .expect("create StreamQuota");
    let mut kubelets = Vec::new();
    let mut ports = Vec::new();
    let names = ["steady", "spiky"];
    for (name, steps) in [
        ("steady", vec![(0, 800)]),
        ("spiky", vec![(0, 200), (4, 4000)]),
    ] {
        let port = free_port();
        let dir = world.dir.path().join(name);
        std::fs::create_dir_all(dir.join("savepoints")).expect("job dir");
        kubelets.push(Kubelet::start_for(
            world.admin.clone(),
            &world.ns,
            &dir,
            port,
            None,
            name,
        ));
        let mut job = named_job(
            &world,
            name,
            port,
            &dir,
            &steps,
            serde_json::json!({"quota": "team"}),
        );
        if let (Some(max), "spiky") = (shed, name) {
            job.spec.job.autoscaler.limits = Some(
                serde_json::from_value(serde_json::json!({"onLimit": "shed", "maxShedShare": max}))
                    .expect("limits"),
            );
        }
        ports.push(port);
        world
            .jobs()
            .create(&PostParams::default(), &job)
            .await
            .expect("create StreamJob");
    }
    world.start_operator();

    let start = Instant::now();
    let mut most_held = 0;
    let (steady, spiky) = loop {
        let steady = world.jobs().get("steady").await.expect("steady");
        let spiky = world.jobs().get("spiky").await.expect("spiky");
        most_held = most_held.max(held_subtasks(&steady) + held_subtasks(&spiky));
        let (a, b) = (
            steady.status.clone().unwrap_or_default(),
            spiky.status.clone().unwrap_or_default(),
        );
        let settled = a.rescale.is_none()
            && b.rescale.is_none()
            && a.current_parallelism.get("work") == Some(&2)
            && a.limit.is_none()
            && a.quota.as_ref().is_some_and(|q| {
                q.allocated_subtasks == 3 && q.running_subtasks == 3 && q.admitted_share == 1.0
            })
            && b.limit
                .as_ref()
                .is_some_and(|l| l.reason.contains("quota 3 subtasks"))
            // The status is level-triggered: a reconcile reports the share computed from the
            // demand of the previous plan beside the new plan's demand; the next one agrees.
            && b.quota.as_ref().is_some_and(|q| {
                q.allocated_subtasks == 3 && q.running_subtasks <= 3 && q.admitted_share < 0.6
            });
        if settled {
            break (steady, spiky);
        }
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "timed out: steady {a:#?}\nspiky {b:#?}\n{}",
            world.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        most_held <= 6,
        "the two jobs held {most_held} subtasks under a quota of 6\n{}",
        world.logs()
    );
    let (a, b) = (
        steady.status.clone().unwrap_or_default(),
        spiky.status.clone().unwrap_or_default(),
    );
    // The spiking job got the rest of the quota, admits under half its load and holds at its
    // share (no `onLimit: shed` configured), saying so.
    let bq = b.quota.clone().expect("spiky quota status");
    assert!(bq.admitted_share < 0.6, "{bq:#?}");
    assert!(
        bq.demand.iter().any(|d| d.name == "work" && d.need > 4.0),
        "spiky's demand should show its spike: {bq:#?}"
    );
    let limit = b.limit.clone().expect("spiky limit");
    if shed.is_some() {
        // The excess is dropped at spiky's sources: the engine sheds the share status shows.
        assert_eq!(limit.action, "Shed", "{limit:#?}");
        assert!(limit.shed_share > 0.3, "{limit:#?}");
        let url = format!("http://127.0.0.1:{}/v1/shed", ports[1]);
        let start = Instant::now();
        loop {
            let engine: serde_json::Value = reqwest::get(&url)
                .await
                .expect("GET /v1/shed")
                .json()
                .await
                .expect("shed JSON");
            let share = engine["share"].as_f64().unwrap_or(0.0);
            let shed_records = engine["recordsShed"].as_u64().unwrap_or(0);
            if share > 0.3 && shed_records > 0 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "the engine does not shed (120 s): {engine}\n{}",
                world.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    } else {
        assert_eq!(limit.action, "Hold", "{limit:#?}");
        assert_eq!(limit.shed_share, 0.0);
    }
    assert!(limit.capacity_records_per_second < limit.load_records_per_second);
    assert!(
        limit.reason.contains("quota 3 subtasks"),
        "the reason names the share: {limit:#?}"
    );
    assert!(a.limit.is_none(), "steady is within its share: {a:#?}");
    let events = event_reasons(&world.admin, &world.ns).await;
    let limit_event = if shed.is_some() {
        "LoadShed"
    } else {
        "LimitHold"
    };
    for want in ["QuotaShare", limit_event, "RescaleStarted"] {
        assert!(
            events.iter().any(|(r, _)| r == want),
            "no {want} event: {events:?}"
        );
    }
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "QuotaShare" && n.contains("StreamQuota team")),
        "{events:?}"
    );
    world.kill_operator();
    drop(kubelets);
    for name in names {
        let _ = world.jobs().delete(name, &DeleteParams::default()).await;
        let _ = world
            .jobs()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    world.cleanup().await;
}

/// The job's `NAME-autoscaler` ConfigMap, decoded.
async fn saved_state(world: &World) -> Option<streamscale_controller::state_store::LearnedState> {
    Some(saved_state_version(world).await?.1)
}

/// The job's `NAME-autoscaler` ConfigMap's resourceVersion and its state, decoded.
async fn saved_state_version(
    world: &World,
) -> Option<(String, streamscale_controller::state_store::LearnedState)> {
    let cm = Api::<ConfigMap>::namespaced(world.admin.clone(), &world.ns)
        .get_opt(&format!("{JOB}-autoscaler"))
        .await
        .ok()??;
    let version = cm.metadata.resource_version.clone()?;
    let text = cm
        .data?
        .remove(streamscale_operator::learned_configmap::STATE_KEY)?;
    Some((
        version,
        streamscale_operator::learned_configmap::decode("cm", &text, JOB).ok()??,
    ))
}

/// Polls the state ConfigMap until `done` holds, failing with the logs after 180 s.
async fn wait_state(
    world: &World,
    what: &str,
    done: impl Fn(&streamscale_controller::state_store::LearnedState) -> bool,
) -> streamscale_controller::state_store::LearnedState {
    let start = Instant::now();
    loop {
        let s = saved_state(world).await;
        if let Some(s) = s.as_ref().filter(|s| done(s)) {
            return s.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "timed out waiting for {what}: {s:#?}\n{}",
            world.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_restart_keeps_the_rate_history_and_what_it_learned() {
    let _serial = SERIAL.lock().await;
    let Some(mut world) = World::new("state", false).await else {
        return;
    };
    let kubelet = Kubelet::start(world.admin.clone(), &world.ns, world.dir.path(), world.port);
    // Forecasting in mode `recommend` keeps a rate history (1 s bins) without changing the
    // decisions; the step to 1500 records/s makes a rescale to learn a scalability factor from.
    let mut job = named_job(
        &world,
        JOB,
        world.port,
        world.dir.path(),
        &[(0, 200), (4, 1500)],
        serde_json::json!({}),
    );
    job.spec.job.autoscaler.forecast = Some(
        serde_json::from_value(serde_json::json!({
            "mode": "recommend", "seasonSeconds": 600, "binSeconds": 1,
        }))
        .expect("forecast"),
    );
    world
        .jobs()
        .create(&PostParams::default(), &job)
        .await
        .expect("create StreamJob");
    world.start_operator();
    wait_state(
        &world,
        "8 history bins and a learned factor for work",
        |s| {
            s.history.as_ref().is_some_and(|h| h.bins.len() >= 8)
                && s.scalability.factors.contains_key("work")
                && s.rescale_downtime_seconds.is_some()
        },
    )
    .await;
    world.kill_operator();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // What the killed operator left (read after its death: it may have saved again, or learned
    // from another rescale, between the wait above and the kill).
    let (version, before) = saved_state_version(&world)
        .await
        .expect("the state the killed operator saved");
    let first = before
        .history
        .as_ref()
        .and_then(|h| h.bins.first().copied());
    let bins = before.history.as_ref().map_or(0, |h| h.bins.len());
    world.start_operator();
    // The restarted operator's first save comes from its first reconciles, before it has the
    // metric window a decision (and so a rescale to relearn from) needs: it carries the
    // factor and downtime it loaded.
    let start = Instant::now();
    let first_save = loop {
        if let Some((v, s)) = saved_state_version(&world).await
            && v != version
        {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "the restarted operator never saved its state\n{}",
            world.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        first_save.scalability.factors.get("work"),
        before.scalability.factors.get("work"),
        "{first_save:#?}"
    );
    assert_eq!(
        first_save.rescale_downtime_seconds,
        before.rescale_downtime_seconds
    );
    // It adds bins to the history it loaded (a fresh one would start later and shorter).
    let after = wait_state(&world, "the restarted operator's bins", |s| {
        s.history.as_ref().is_some_and(|h| h.bins.len() >= bins + 4)
    })
    .await;
    let h = after.history.as_ref().expect("history");
    assert_eq!(
        h.bins.first().copied(),
        first,
        "the history restarted: {h:?}"
    );
    let log = std::fs::read_to_string(world.operator_log()).unwrap_or_default();
    assert!(
        log.contains("autoscaler state loaded from ConfigMap demo-autoscaler"),
        "{}",
        world.logs()
    );
    // The ConfigMap goes with the job (owner reference).
    let cm = Api::<ConfigMap>::namespaced(world.admin.clone(), &world.ns)
        .get(&format!("{JOB}-autoscaler"))
        .await
        .expect("state ConfigMap");
    let (job, _) = world.status().await.expect("job");
    assert!(owned_by(&cm.metadata, &job), "{:?}", cm.metadata);
    drop(kubelet);
    world.cleanup().await;
}

/// Engine token Secret as the chart's ServiceAccount keeps it: created with an owner
/// reference and a fresh 128-bit token, mounted as the engine's `--auth-token-file` (no
/// `--insecure-bind`); the real engine refuses a state change without it or with a wrong one
/// (401, the token never echoed); the rotation annotation writes a new token (the old one kept
/// as `previous`), and the operator's final stop-with-savepoint on delete still reaches the
/// engine that started with the old token; no token ever appears in status, Events or the
/// operator's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_token_secret_guards_the_engine_and_rotates_without_losing_the_job() {
    let _serial = SERIAL.lock().await;
    let Some(mut w) = World::new("token", false).await else {
        return;
    };
    let kubelet = Kubelet::start(w.admin.clone(), &w.ns, w.dir.path(), w.port);
    w.start_operator();
    w.create_job_with_spec(
        "off",
        serde_json::json!({}),
        serde_json::json!({"savepointOnDelete": true}),
    )
    .await;
    let (job, _) = w
        .wait_for("phase Running", Duration::from_secs(60), |_, s| {
            s.phase == Phase::Running
        })
        .await;

    // The Secret: owned by the job, 32 hex digits; the engine pod mounts it.
    let secrets: Api<Secret> = Api::namespaced(w.admin.clone(), &w.ns);
    let secret = secrets
        .get("demo-engine-token")
        .await
        .expect("token Secret");
    assert!(owned_by(&secret.metadata, &job), "{:?}", secret.metadata);
    let old = w.engine_token().await;
    assert!(
        old.len() == 32 && old.bytes().all(|b| b.is_ascii_hexdigit()),
        "128 bits as hex, got {} characters",
        old.len()
    );
    let d = Api::<Deployment>::namespaced(w.admin.clone(), &w.ns)
        .get("demo-engine")
        .await
        .expect("engine Deployment");
    let args = deployed_args(&d);
    assert!(
        args.contains("--auth-token-file /var/run/streamscale/engine-token/token")
            && !args.contains("--insecure-bind"),
        "{args}"
    );
    let pod = serde_json::to_value(&d.spec.as_ref().expect("spec").template).expect("json");
    assert_eq!(
        pod["spec"]["volumes"][2]["secret"]["secretName"], "demo-engine-token",
        "{pod}"
    );

    // The NetworkPolicy: owned, the engine pod only, port 8081 from the operator's pods (in
    // the release namespace) and from the Prometheus namespace.
    let policy =
        Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(w.admin.clone(), &w.ns)
            .get("demo-engine")
            .await
            .expect("engine NetworkPolicy");
    assert!(owned_by(&policy.metadata, &job), "{:?}", policy.metadata);
    let p = serde_json::to_value(&policy.spec).expect("json");
    assert_eq!(
        p["podSelector"]["matchLabels"]["streamscale.dev/job"], JOB,
        "{p}"
    );
    assert_eq!(p["policyTypes"], serde_json::json!(["Ingress"]), "{p}");
    let operator = &p["ingress"][0];
    assert_eq!(operator["ports"][0]["port"], 8081, "{p}");
    assert_eq!(
        operator["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        RELEASE_NS,
        "{p}"
    );
    assert_eq!(
        operator["from"][0]["podSelector"]["matchLabels"],
        serde_json::json!({"app.kubernetes.io/instance": "op", "app.kubernetes.io/name": "streamscale"}),
        "{p}"
    );
    assert_eq!(
        p["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring",
        "{p}"
    );
    assert_eq!(p["ingress"].as_array().map(Vec::len), Some(2), "{p}");

    // The real engine: no token or a wrong one gets 401 and never the token; reads stay open.
    let http = reqwest::Client::new();
    let shed = format!("{}/v1/shed", w.engine_url());
    for auth in [None, Some("Bearer 0123456789abcdef0123456789abcdef")] {
        let mut req = http.post(&shed).json(&serde_json::json!({"share": 0.5}));
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        let resp = req.send().await.expect("POST /v1/shed");
        assert_eq!(resp.status().as_u16(), 401, "{auth:?}");
        let body = resp.text().await.unwrap_or_default();
        assert!(!body.contains(&old), "the 401 echoes the token: {body}");
    }
    assert!(
        w.engine_api().await.job().await.is_ok(),
        "GET /v1/job stays open"
    );
    let shed_now = w.engine_api().await.set_shed(0.0).await;
    assert!(
        shed_now.is_ok(),
        "the right token is accepted: {shed_now:?}"
    );

    // Rotation, twice (the engine does not restart in between): a new token each time, the
    // older ones kept as `previous` (newest first), an Event without any of them.
    let mut tokens = vec![old.clone()];
    for value in ["2026-12-04", "2026-12-05"] {
        w.jobs()
            .patch(
                JOB,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({
                    "metadata": {"annotations": {"streamscale.dev/rotate-token": value}}
                })),
            )
            .await
            .expect("annotate");
        let start = Instant::now();
        let before = tokens.last().cloned().unwrap_or_default();
        let next = loop {
            let t = w.engine_token().await;
            if t != before {
                break t;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "token not rotated for {value}\n{}",
                w.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        tokens.push(next);
    }
    let new = tokens.last().cloned().unwrap_or_default();
    let secret = secrets
        .get("demo-engine-token")
        .await
        .expect("token Secret");
    let data = secret.data.clone().expect("data");
    assert_eq!(
        String::from_utf8_lossy(&data["previous"].0),
        format!("{}\n{old}", tokens[1]),
        "the older tokens kept as previous, newest first"
    );
    assert_eq!(new.len(), 32);
    // The running engine started with the old token and still requires it.
    let stale = EngineApi::new(http.clone(), &w.engine_url())
        .with_token(Some(&new))
        .set_shed(0.0)
        .await;
    assert!(
        matches!(
            stale,
            Err(streamscale_controller::api::ApiError::Status { status: 401, .. })
        ),
        "{stale:?}"
    );
    let (job, status) = w
        .wait_for(
            "still running after the rotation",
            Duration::from_secs(10),
            |_, s| s.phase == Phase::Running,
        )
        .await;

    // Delete: the final stop-with-savepoint reaches the engine (with the previous token).
    w.jobs()
        .delete(JOB, &DeleteParams::default())
        .await
        .expect("delete StreamJob");
    let start = Instant::now();
    let events = loop {
        let events = event_reasons(&w.admin, &w.ns).await;
        if events.iter().any(|(r, _)| r.starts_with("FinalSavepoint")) {
            break events;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no final savepoint Event: {events:?}\n{}",
            w.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        events.iter().any(|(r, _)| r == "FinalSavepoint"),
        "{events:?}\n{}",
        w.logs()
    );
    assert!(
        events.iter().any(|(r, _)| r == "EngineTokenRotated"),
        "{events:?}"
    );
    let engine = EngineApi::new(http, &w.engine_url())
        .job()
        .await
        .expect("engine");
    assert_eq!(engine.state, "stopped", "{engine:#?}");

    // Never a token in status, Events or the operator's log.
    let status_text = serde_json::to_string(&status).expect("json")
        + &serde_json::to_string(&job.metadata).expect("json");
    let events_text = format!("{events:?}");
    let log = std::fs::read_to_string(w.operator_log()).unwrap_or_default();
    for token in &tokens {
        assert!(!status_text.contains(token.as_str()), "token in status");
        assert!(!events_text.contains(token.as_str()), "token in Events");
        assert!(!log.contains(token.as_str()), "token in the operator's log");
    }
    drop(kubelet);
    w.cleanup().await;
}

/// An engine deployed by an operator from before the engine token (`--insecure-bind`, no token
/// file) is moved onto its token through a stop-with-savepoint and a restore at the same
/// parallelism (Event `EngineTokenMigration`), not replaced from an older state: no record is
/// lost or counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_deployed_without_a_token_moves_onto_it_through_a_savepoint() {
    let _serial = SERIAL.lock().await;
    let Some(mut w) = World::new("legacy", false).await else {
        return;
    };
    let kubelet = Kubelet::start(w.admin.clone(), &w.ns, w.dir.path(), w.port);
    w.start_operator();
    w.create_job("off").await;
    w.wait_for("phase Running", Duration::from_secs(60), |_, s| {
        s.phase == Phase::Running
    })
    .await;
    w.kill_operator();
    // What an older operator deployed: the engine without a token file, `--insecure-bind`.
    let deployments: Api<Deployment> = Api::namespaced(w.admin.clone(), &w.ns);
    let mut d = deployments.get("demo-engine").await.expect("Deployment");
    let c = d
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
        .map(|s| &mut s.containers[0])
        .expect("container");
    let args = c.args.as_mut().expect("args");
    let i = args
        .iter()
        .position(|a| a == "--auth-token-file")
        .expect("--auth-token-file");
    args.drain(i..i + 2);
    args.push("--insecure-bind".into());
    deployments
        .replace("demo-engine", &PostParams::default(), &d)
        .await
        .expect("replace Deployment");
    // The old engine accepts a state change without any token.
    let open = EngineApi::new(reqwest::Client::new(), &w.engine_url());
    let start = Instant::now();
    while open.set_shed(0.0).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no token-less engine\n{}",
            w.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Counts from here on (the swap above started the engine afresh).
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.max_emitted.store(0, Ordering::SeqCst);

    w.start_operator();
    let (_, status) = w
        .wait_for(
            "the engine redeployed from a savepoint",
            Duration::from_secs(60),
            |_, s| s.phase == Phase::Running && s.rescale.is_none() && s.restored_from.is_some(),
        )
        .await;
    let d = deployments.get("demo-engine").await.expect("Deployment");
    let args = deployed_args(&d);
    assert!(
        args.contains("--auth-token-file") && !args.contains("--insecure-bind"),
        "{args}"
    );
    assert_eq!(status.current_parallelism["work"], 1, "{status:#?}");
    let events = event_reasons(&w.admin, &w.ns).await;
    assert!(
        events.iter().any(|(r, _)| r == "EngineTokenMigration"),
        "{events:?}"
    );
    let refused = open.set_shed(0.0).await;
    assert!(
        matches!(
            refused,
            Err(streamscale_controller::api::ApiError::Status { status: 401, .. })
        ),
        "the new engine requires its token: {refused:?}"
    );
    let engine = w.final_drain(&kubelet, true).await;
    assert_no_loss(&engine);
    drop(kubelet);
    w.cleanup().await;
}

/// Applies the JSON patch (RFC 6902) `patch` to StreamJob `name`.
async fn json_patch(jobs: &Api<StreamJob>, name: &str, patch: serde_json::Value) {
    jobs.patch(
        name,
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(patch).expect("json patch")),
    )
    .await
    .expect("patch spec.job");
}

/// An edited `spec.job` reaches the running engine through a stop-with-savepoint and a restore
/// of the edited job at the same parallelism (Event `JobSpecChanged`), not by replacing its
/// pod: the edited job continues from the old one's state and positions, no record is lost or
/// counted twice. An edit that changes the job's graph, which no savepoint of it restores
/// into, is said (`JobGraphChanged`) and not deployed; the engine goes on with the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_job_continues_from_a_savepoint_of_the_running_one() {
    let _serial = SERIAL.lock().await;
    let Some(mut w) = World::new("edit", false).await else {
        return;
    };
    let kubelet = Kubelet::start(w.admin.clone(), &w.ns, w.dir.path(), w.port);
    w.start_operator();
    w.create_job("off").await;
    let (job, _) = w
        .wait_for("phase Running", Duration::from_secs(60), |_, s| {
            s.phase == Phase::Running
        })
        .await;
    let deployments: Api<Deployment> = Api::namespaced(w.admin.clone(), &w.ns);
    let hash = |d: &Deployment| {
        streamscale_operator::resources::deployed_config_hash(d)
            .expect("config hash")
            .to_string()
    };
    let before = hash(&deployments.get("demo-engine").await.expect("Deployment"));
    // `work` costs 800 µs of io per record instead of 1000.
    let jobs: Api<StreamJob> = Api::namespaced(w.admin.clone(), &w.ns);
    let patch = serde_json::json!([
        {"op": "test", "path": "/spec/job/operators/1/name", "value": "work"},
        {"op": "replace", "path": "/spec/job/operators/1/io", "value": 800},
    ]);
    json_patch(&jobs, &job.name_any(), patch).await;
    let (_, status) = w
        .wait_for(
            "the edited job restored from a savepoint",
            Duration::from_secs(60),
            |_, s| s.phase == Phase::Running && s.rescale.is_none() && s.restored_from.is_some(),
        )
        .await;
    let d = deployments.get("demo-engine").await.expect("Deployment");
    assert_ne!(hash(&d), before, "the edited job is deployed");
    let args = deployed_args(&d);
    assert!(args.contains("--restore"), "{args}");
    assert_eq!(status.current_parallelism["work"], 1, "{status:#?}");
    let events = event_reasons(&w.admin, &w.ns).await;
    assert!(
        events.iter().any(|(r, _)| r == "JobSpecChanged"),
        "{events:?}"
    );
    // An edit that changes the graph (an operator `tag` added between `work` and `sink`): no
    // savepoint of the running job restores into it, so it is said and nothing is deployed;
    // undone, the conditions go.
    let edited = hash(&d);
    let graph_edit = serde_json::json!([
        {"op": "test", "path": "/spec/job/operators/2/name", "value": "sink"},
        {"op": "add", "path": "/spec/job/operators/2", "value": {"name": "tag", "kind": "map"}},
        {"op": "replace", "path": "/spec/job/edges", "value": [
            {"from": "source", "to": "work"}, {"from": "work", "to": "tag"},
            {"from": "tag", "to": "sink"},
        ]},
    ]);
    let undo = serde_json::json!([
        {"op": "test", "path": "/spec/job/operators/2/name", "value": "tag"},
        {"op": "remove", "path": "/spec/job/operators/2"},
        {"op": "replace", "path": "/spec/job/edges", "value": [
            {"from": "source", "to": "work"}, {"from": "work", "to": "sink"},
        ]},
    ]);
    let graph_changed = |s: &streamscale_operator::crd::StreamJobStatus| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.reason == "JobGraphChanged")
    };
    json_patch(&jobs, &job.name_any(), graph_edit).await;
    let (_, status) = w
        .wait_for("the graph change said", Duration::from_secs(30), |_, s| {
            graph_changed(s)
        })
        .await;
    assert!(status.rescale.is_none(), "{status:#?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let d = deployments.get("demo-engine").await.expect("Deployment");
    assert_eq!(hash(&d), edited, "nothing deployed for the new graph");
    let running = EngineApi::new(reqwest::Client::new(), &w.engine_url())
        .job()
        .await
        .expect("the engine answers");
    assert_eq!(running.state, "running", "{running:#?}");
    assert!(
        event_reasons(&w.admin, &w.ns)
            .await
            .iter()
            .any(|(r, _)| r == "JobGraphChanged")
    );
    json_patch(&jobs, &job.name_any(), undo).await;
    w.wait_for(
        "the graph change undone",
        Duration::from_secs(30),
        |_, s| !graph_changed(s) && s.phase == Phase::Running,
    )
    .await;
    let engine = w.final_drain(&kubelet, true).await;
    assert_no_loss(&engine);
    drop(kubelet);
    w.cleanup().await;
}

/// An owned object the API server refuses (a PVC of `storage.size: "0"`; helper-41 found the job
/// stuck with the error only in the operator's log): the status says so in `Ready` and
/// `Degraded` (reason `ApplyRefused`, naming the object and the API server's message), one
/// Warning Event says it, and once the spec is fixed the job deploys and the conditions go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_the_api_server_refuses_is_said_in_the_status_until_fixed() {
    let _serial = SERIAL.lock().await;
    let Some(mut w) = World::new("refused", false).await else {
        return;
    };
    w.start_operator();
    w.create_job_with_spec(
        "off",
        serde_json::json!({}),
        serde_json::json!({"storage": {"size": "0"}}),
    )
    .await;
    let refused = |s: &streamscale_operator::crd::StreamJobStatus| {
        s.conditions.iter().any(|c| c.reason == "ApplyRefused")
    };
    let (_, status) = w
        .wait_for(
            "the refusal in the status",
            Duration::from_secs(60),
            |_, s| refused(s),
        )
        .await;
    for (type_, value) in [("Ready", "False"), ("Degraded", "True")] {
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_} in {status:#?}"));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (value, "ApplyRefused")
        );
        assert!(
            c.message
                .starts_with("the API server refused PersistentVolumeClaim demo-savepoints:")
                && c.message.contains("storage"),
            "{}",
            c.message
        );
    }
    let deployments: Api<Deployment> = Api::namespaced(w.admin.clone(), &w.ns);
    assert!(
        deployments
            .get_opt("demo-engine")
            .await
            .expect("get")
            .is_none(),
        "nothing deployed past the refused object"
    );
    // Said once, not at every reconcile: another reconcile (an annotation edit) neither moves
    // the conditions' transition time nor publishes the Event again (the recorder would count
    // a repeat in the Event's series).
    let jobs: Api<StreamJob> = Api::namespaced(w.admin.clone(), &w.ns);
    let since = |s: &streamscale_operator::crd::StreamJobStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.last_transition_time.clone())
    };
    let poke = serde_json::json!({"metadata": {"annotations": {"test/poke": "1"}}});
    jobs.patch("demo", &PatchParams::default(), &Patch::Merge(&poke))
        .await
        .expect("poke");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, again) = w.status().await.expect("status");
    assert!(refused(&again), "{again:#?}");
    assert_eq!(since(&again), since(&status));
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(w.admin.clone(), &w.ns)
        .list(&Default::default())
        .await
        .expect("events");
    let said: Vec<_> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ApplyRefused"))
        .collect();
    assert_eq!(said.len(), 1, "{said:#?}");
    assert!(said[0].series.is_none(), "said again: {:#?}", said[0]);
    // Fixed: deployed, and the conditions no longer say it.
    let fix = serde_json::json!({"spec": {"storage": {"size": "64Mi"}}});
    jobs.patch("demo", &PatchParams::default(), &Patch::Merge(&fix))
        .await
        .expect("patch");
    w.wait_for("the refusal gone", Duration::from_secs(60), |_, s| {
        !refused(s)
    })
    .await;
    assert!(
        deployments
            .get_opt("demo-engine")
            .await
            .expect("get")
            .is_some()
    );
}
