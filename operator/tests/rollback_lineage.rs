//! Issue 21 ("never drop or duplicate a record silently"), a StreamJob's rescale roll-back,
//! with the pods the operator renders run as local `streamscale-engine` processes (their
//! arguments exactly as in the Deployment's template; only `--job`, `--bind` and the token
//! file are mapped to the host, as the kubelet of `common/cluster.rs` does). No API server is
//! needed: the test plays the rescale's steps itself, as the operator takes them.
//!
//! The engine at the new parallelism runs from the rescale's savepoint, completes checkpoints
//! and publishes output through its exactly-once file sink, then is replaced by the roll back
//! (it was never seen running within `restoreTimeoutSeconds`). The roll back's pod (the old
//! parallelism from the same savepoint, `--recover`) must resume from the failed pod's newest
//! checkpoint: from the savepoint, every record published after it would be published twice.
#![allow(missing_docs)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::Child;
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

use common::cluster::{PodFiles, args_of, spawn_engine};
use k8s_openapi::api::apps::v1::Deployment;
use streamscale_controller::api::{EngineApi, JobStatus};
use streamscale_operator::crd::StreamJob;
use streamscale_operator::resources;
use streamscale_tests::{fixtures, workspace_bin};

/// Records the source emits (300 a second: about 10 s).
const RECORDS: usize = 3000;

fn p(work: u32) -> BTreeMap<String, u32> {
    [("source", 1), ("work", work), ("sink", 1)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The Deployment the operator renders when it replaces `previous` (as `deploy` does).
fn render(
    job: &StreamJob,
    parallelism: &BTreeMap<String, u32>,
    restore: Option<&str>,
    previous: Option<&Deployment>,
) -> Deployment {
    resources::deployment(job, parallelism, restore, 0, previous).expect("deployment")
}

/// The engine container's arguments of a Deployment.
fn pod_args(d: &Deployment) -> Vec<String> {
    let template = &d.spec.as_ref().expect("spec").template;
    args_of(&serde_json::to_string(template).expect("json"))
}

struct Pod {
    child: Child,
    api: EngineApi,
}

impl Pod {
    fn start(
        dir: &Path,
        job: &StreamJob,
        parallelism: &BTreeMap<String, u32>,
        deployment: &Deployment,
        token: &str,
        starts: &AtomicU32,
    ) -> Pod {
        let port = free_port();
        let job_yaml = resources::job_yaml(job, parallelism);
        let files = PodFiles {
            job_yaml: Some(&job_yaml),
            token: Some(token),
        };
        let args = pod_args(deployment);
        let child = spawn_engine(
            &workspace_bin("streamscale-engine"),
            dir,
            port,
            &args,
            &files,
            starts,
        );
        let api = EngineApi::new(reqwest::Client::new(), &format!("http://127.0.0.1:{port}"))
            .with_token(Some(token));
        Pod { child, api }
    }

    async fn job(&self, what: &str, until: impl Fn(&JobStatus) -> bool) -> JobStatus {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(job) = self.api.job().await
                && until(&job)
            {
                return job;
            }
            assert!(Instant::now() < deadline, "{what}: not within 120 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The pod is deleted (Recreate: gone before the next one starts).
    fn delete(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Completed checkpoints (`chk-<id>/` with a manifest) in `dir`.
fn checkpoints(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("_metadata.json").is_file())
                .count()
        })
        .unwrap_or(0)
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_pod_recovers_from_the_failed_pods_newest_checkpoint_without_duplicates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let savepoints = dir.path().join("savepoints");
    // Keys from a 10^9 range: each record's line `key,1,seq%100` is (almost surely) its own.
    let job_text = fixtures::pipeline(
        "lineage",
        &format!("keys: 1000000000, count: {RECORDS}, rate: {{ constant: 300 }}"),
        50,
        &format!(", output: \"{}\"", out.display()),
    ) + "checkpoint: { intervalSeconds: 0.3, retain: 3 }\n";
    let job_json: serde_json::Value = serde_saphyr::from_str(&job_text).expect("job yaml");
    let job: StreamJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "streamscale.dev/v1alpha1",
        "kind": "StreamJob",
        "metadata": {
            "name": "lineage", "namespace": "ns", "uid": "1234",
            "annotations": {"streamscale.dev/savepoint-dir": savepoints.display().to_string()},
        },
        "spec": {"job": job_json},
    }))
    .expect("StreamJob");
    let token = streamscale_operator::engine_token::fresh_token().expect("token");
    let starts = AtomicU32::new(0);

    // The job runs at work=1; the rescale to work=2 takes its stop-with-savepoint.
    let first_d = render(&job, &p(1), None, None);
    let first_chk = flag(&pod_args(&first_d), "--checkpoint-dir").expect("--checkpoint-dir");
    let first = Pod::start(dir.path(), &job, &p(1), &first_d, &token, &starts);
    first.job("running", |j| j.state == "running").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id = first
        .api
        .request_stop_with_savepoint_as(false, "rescale-1")
        .await
        .expect("stop-with-savepoint");
    let deadline = Instant::now() + Duration::from_secs(60);
    let savepoint = loop {
        match first.api.savepoint(&id).await {
            Ok(s) if s.status == "completed" => break s.path.expect("path"),
            Ok(s) => assert_eq!(s.status, "pending", "{s:?}"),
            Err(e) => panic!("savepoint status: {e}"),
        }
        assert!(Instant::now() < deadline, "savepoint not completed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    first.delete();
    let at_savepoint = fixtures::published_parts(&out);
    assert!(checkpoints(Path::new(&first_chk)) > 0, "{first_chk}");

    // Redeployed at work=2 from the savepoint: it runs, completes checkpoints and publishes
    // output, but is not seen running in time; the roll back replaces its pod.
    // It supersedes the first pod's checkpoints (the savepoint is newer than all of them).
    let attempt_d = render(&job, &p(2), Some(&savepoint), Some(&first_d));
    let attempt_args = pod_args(&attempt_d);
    let attempt_chk = flag(&attempt_args, "--checkpoint-dir").expect("--checkpoint-dir");
    assert_eq!(
        flag(&attempt_args, "--retire-checkpoints"),
        Some(first_chk.clone())
    );
    let attempt = Pod::start(dir.path(), &job, &p(2), &attempt_d, &token, &starts);
    let deadline = Instant::now() + Duration::from_secs(60);
    while checkpoints(Path::new(&attempt_chk)) < 3
        || fixtures::published_parts(&out).len() < at_savepoint.len() + 3
    {
        assert!(Instant::now() < deadline, "the attempt published nothing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Once it has checkpoints of its own, the first pod's are removed.
    while checkpoints(Path::new(&first_chk)) > 0 {
        assert!(
            Instant::now() < deadline,
            "{first_chk} still holds checkpoints"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    attempt.delete();
    let at_kill = fixtures::published_parts(&out);
    assert!(at_kill.is_superset(&at_savepoint) && at_kill.len() > at_savepoint.len());

    // The roll back: the old parallelism from the same savepoint, as `Action::Deploy` says.
    // Its template retires what the attempt's did, never the attempt's own checkpoints.
    let back_d = render(&job, &p(1), Some(&savepoint), Some(&attempt_d));
    let back_args = pod_args(&back_d);
    assert_eq!(
        flag(&back_args, "--checkpoint-dir"),
        Some(attempt_chk.clone())
    );
    assert_eq!(flag(&back_args, "--retire-checkpoints"), Some(first_chk));
    let back = Pod::start(dir.path(), &job, &p(1), &back_d, &token, &starts);
    let done = back.job("finished", |j| j.state == "finished").await;
    back.delete();

    // Every record published exactly once: no duplicate, no gap.
    let published = fixtures::published_output(&out);
    let lines: Vec<&str> = published.lines().collect();
    let distinct: HashSet<&str> = lines.iter().copied().collect();
    assert_eq!(
        lines.len() - distinct.len(),
        0,
        "{} records published twice",
        lines.len() - distinct.len()
    );
    assert_eq!(lines.len(), RECORDS, "published lines");
    let from = done.restored_from.unwrap_or_default();
    assert!(
        Path::new(&from).starts_with(&attempt_chk) && from.contains("chk-"),
        "the roll back ran from {from}, not from a checkpoint in {attempt_chk}"
    );
}
