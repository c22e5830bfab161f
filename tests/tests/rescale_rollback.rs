//! Issue 21 ("never drop or duplicate a record silently"), rescale roll-back: a restore at the
//! new parallelism that ran, completed checkpoints and published output through its
//! exactly-once file sink, then crashed before it was seen running, is rolled back. The
//! roll-back must resume from that attempt's latest completed checkpoint, not from the older
//! savepoint (which would publish the attempt's records a second time).
#![allow(missing_docs)]

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use streamscale_controller::api::{ApiError, JobStatus};
use streamscale_controller::executor::{Executor, RescaleOutcome};
use streamscale_controller::rescale::restore_point;
use streamscale_controller::runtime::{
    EngineHandle, EngineRuntime, LocalRuntime, RuntimeError, Savepoint, StopOutcome,
};
use streamscale_engine::spec::JobSpec;
use streamscale_tests::{fixtures, workspace_bin};

/// Records the source emits (300 a second: about 10 s).
const RECORDS: usize = 3000;

/// The real local runtime, except that status requests to an engine at a parallelism other
/// than the first one get no answer (as through a network partition; the engine itself runs,
/// takes checkpoints and publishes output) until it has published output after the rescale's
/// savepoint; then it crashes (SIGKILL) and is reported exited. Notes the published part files
/// when the savepoint completed and at the crash.
struct CrashingRuntime {
    inner: LocalRuntime,
    reachable: BTreeMap<String, u32>,
    output: PathBuf,
    parts_at_savepoint: Mutex<HashSet<String>>,
    parts_at_kill: Mutex<HashSet<String>>,
    crashed: Mutex<HashSet<u64>>,
}

impl CrashingRuntime {
    fn hidden(&self, handle: &EngineHandle) -> bool {
        handle.parallelism != self.reachable
    }
}

impl EngineRuntime for CrashingRuntime {
    async fn start(
        &self,
        job: &Path,
        parallelism: &BTreeMap<String, u32>,
        restore: Option<&Savepoint>,
    ) -> Result<EngineHandle, RuntimeError> {
        self.inner.start(job, parallelism, restore).await
    }

    async fn stop_with_savepoint(
        &self,
        handle: &EngineHandle,
        drain: bool,
    ) -> Result<StopOutcome, RuntimeError> {
        let outcome = self.inner.stop_with_savepoint(handle, drain).await;
        *self.parts_at_savepoint.lock().expect("lock") = fixtures::published_parts(&self.output);
        outcome
    }

    async fn job_status(&self, handle: &EngineHandle) -> Result<JobStatus, RuntimeError> {
        if self.hidden(handle) {
            // Three part files past the savepoint: three checkpoints of this engine completed
            // and committed.
            let before = self.parts_at_savepoint.lock().expect("lock").clone();
            let now = fixtures::published_parts(&self.output);
            if now.difference(&before).count() >= 3
                && self.crashed.lock().expect("lock").insert(handle.id)
            {
                *self.parts_at_kill.lock().expect("lock") = now;
                self.inner.kill(handle).await?;
            }
            return Err(RuntimeError::Api(ApiError::NotRunning {
                url: format!("{}/v1/job", handle.base_url),
                waited_s: 0.0,
                last: "no answer (partitioned)".into(),
            }));
        }
        self.inner.job_status(handle).await
    }

    async fn shutdown(&self, handle: &EngineHandle) -> Result<(), RuntimeError> {
        self.inner.shutdown(handle).await
    }

    async fn kill(&self, handle: &EngineHandle) -> Result<(), RuntimeError> {
        if self.crashed.lock().expect("lock").contains(&handle.id) {
            return Ok(());
        }
        self.inner.kill(handle).await
    }

    fn auth_token(&self) -> Option<&str> {
        self.inner.auth_token()
    }

    async fn exited(&self, handle: &EngineHandle) -> Option<RuntimeError> {
        if self.crashed.lock().expect("lock").contains(&handle.id) {
            return Some(RuntimeError::Exited {
                status: "signal: 9 (SIGKILL)".into(),
                last_error: "killed by the test after it published output".into(),
            });
        }
        self.inner.exited(handle).await
    }
}

fn p(work: u32) -> BTreeMap<String, u32> {
    [("source", 1), ("work", work), ("sink", 1)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_rescale_resumes_from_the_failed_attempts_checkpoint_without_duplicates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let chk = dir.path().join("chk");
    // Keys from a 10^9 range: each record's line `key,1,seq%100` is (almost surely) its own.
    let text = fixtures::pipeline(
        "rollback",
        &format!("keys: 1000000000, count: {RECORDS}, rate: {{ constant: 300 }}"),
        50,
        &format!(", output: \"{}\"", out.display()),
    ) + &format!(
        "checkpoint: {{ intervalSeconds: 0.3, retain: 3, dir: \"{}\" }}\n",
        chk.display()
    );
    let job = fixtures::write(dir.path(), "job.yaml", &text);
    let spec = JobSpec::from_file(&job).expect("job parses");
    let client = reqwest::Client::new();
    let runtime = CrashingRuntime {
        inner: LocalRuntime::new(
            workspace_bin("streamscale-engine"),
            dir.path().join("savepoints"),
            dir.path().join("logs"),
            client,
        ),
        reachable: p(1),
        output: out.clone(),
        parts_at_savepoint: Mutex::default(),
        parts_at_kill: Mutex::default(),
        crashed: Mutex::default(),
    };
    // As `streamscale run` wires it (the run's first checkpoint id: 0, the directory is new).
    // The running timeout only bounds a stuck test: the attempt crashes first.
    let executor = Executor::new(&runtime, &job)
        .with_running_timeout(Duration::from_secs(90))
        .with_restore_point(restore_point::finder(spec, 0));
    let (engine, _) = executor.launch(&p(1), None).await.expect("engine runs");
    tokio::time::sleep(Duration::from_secs(2)).await;

    let outcome = executor
        .rescale(engine, &p(2))
        .await
        .expect("an engine runs");
    let RescaleOutcome::RestoreFailed {
        engine,
        savepoint,
        error,
        ..
    } = &outcome
    else {
        panic!("expected a rolled back rescale: {outcome:?}");
    };
    assert!(error.contains("killed by the test"), "{error}");
    assert_eq!(engine.parallelism, p(1));
    let (at_savepoint, at_kill) = (
        runtime.parts_at_savepoint.lock().expect("lock").clone(),
        runtime.parts_at_kill.lock().expect("lock").clone(),
    );
    assert!(
        at_kill.len() >= at_savepoint.len() + 3 && at_kill.is_superset(&at_savepoint),
        "the failed attempt published output before it crashed: {at_savepoint:?} then {at_kill:?}"
    );

    // The rolled back engine runs the bounded source to its end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        match runtime.job_status(engine).await {
            Ok(job) if job.state == "finished" => break,
            Ok(job) => assert!(
                matches!(job.state.as_str(), "running" | "stopping"),
                "{job:?}"
            ),
            Err(e) => assert!(
                runtime.exited(engine).await.is_none(),
                "engine exited before finishing: {e}"
            ),
        }
        assert!(tokio::time::Instant::now() < deadline, "not finished");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = runtime.shutdown(engine).await;

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
    // It resumed from the failed attempt's newest checkpoint, newer than the savepoint.
    let from = engine
        .restored_from
        .as_ref()
        .map(|s| s.path.clone())
        .unwrap_or_default();
    assert!(
        from.contains("chk-") && from != savepoint.path,
        "restored from {from}"
    );
}
