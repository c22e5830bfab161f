//! Supervising the run's engine: when it dies (a crash, SIGKILL), it is restarted from the
//! latest completed checkpoint under the job's restart strategy, as Flink's JobManager
//! restarts a job after a TaskManager is lost.
//!
//! The strategy is the job file's `checkpoint.restart` (Flink's `fixed-delay`: `attempts`
//! restarts in the whole run, `delaySeconds` before each; default 3 and 1 s, also without a
//! `checkpoint:` block). The restore point is the newer (by checkpoint id) of the latest
//! completed checkpoint that verifies and the savepoint the dead engine was restored from (after
//! a rescale, the checkpoints in storage may predate it); with neither, the job starts from the
//! beginning. Keyed state, source positions and the record counters come back with it, so the
//! run's record balance holds across restarts.

use std::time::Duration;

use streamscale_engine::checkpoint::storage::CheckpointStorage;
use streamscale_engine::spec::{JobSpec, RestartSpec};

use tokio::time::Instant;

use super::run_loop::Loop;
use crate::report::RestartRecord;
use crate::runtime::{EngineHandle, EngineRuntime, RuntimeError, Savepoint};

pub use crate::rescale::restore_point::restore_point;

/// The run's restart strategy: the job's `checkpoint.restart`, else its defaults.
pub fn restart_policy(spec: &JobSpec) -> RestartSpec {
    spec.checkpoint
        .as_ref()
        .map(|c| c.restart)
        .unwrap_or_default()
}

/// The id the job's next checkpoint takes ([`CheckpointStorage::next_id`]; 0 without
/// checkpoints or when the directory cannot be listed): checkpoints numbered below it in the
/// job's directory are an earlier run's, which a restart of this run never resumes from.
pub fn first_checkpoint_id(spec: &JobSpec) -> u64 {
    spec.checkpoint
        .as_ref()
        .and_then(|c| Some((c, c.dir.as_ref()?)))
        .and_then(|(c, dir)| CheckpointStorage::open(dir, c.retain).ok())
        .map_or(0, |s| s.next_id())
}

/// The line when the engine died and is restarted.
pub fn died_line(t_s: f64, reason: &str, restart: u32, policy: &RestartSpec) -> String {
    format!(
        "t={t_s:>4.0}s ENGINE DIED ({reason}): restarting from the latest completed checkpoint or savepoint in {:.1} s (restart {restart} of {})",
        policy.delay_seconds, policy.attempts
    )
}

/// The line when the restarted engine runs.
pub fn restarted_line(t_s: f64, from: Option<&Savepoint>, recovery_s: f64) -> String {
    format!(
        "t={t_s:>4.0}s RESTARTED from {}: recovery {recovery_s:.1} s",
        from.map_or("the beginning (nothing completed yet)", |s| s.path.as_str())
    )
}

impl<R: EngineRuntime> Loop<'_, R> {
    /// The engine `dead` died (`exit`) at `now_s`: restarts it from the latest completed
    /// checkpoint under the job's restart strategy (see the module docs), printing a line before and
    /// after, and records the restart. A failed start counts as an attempt too.
    ///
    /// # Errors
    /// The run's failure when no restart is left or the restore point cannot be found.
    pub(super) async fn restart_engine(
        &mut self,
        dead: &EngineHandle,
        exit: &RuntimeError,
        now_s: f64,
        started: Instant,
        print: &mut (dyn FnMut(&str) + Send),
        warn: &mut (dyn FnMut(&str) + Send),
    ) -> Result<EngineHandle, String> {
        let policy = restart_policy(&self.job.spec);
        let mut reason = exit.to_string();
        let mut restored_from = dead.restored_from.clone();
        loop {
            let n = self.restarts.len() as u32 + 1;
            if n > policy.attempts {
                return Err(format!(
                    "engine failed at t={now_s:.0}s: {reason}; no restart left ({} allowed by the job's checkpoint.restart.attempts)",
                    policy.attempts
                ));
            }
            let died_s = started.elapsed().as_secs_f64();
            print(&died_line(died_s, &reason, n, &policy));
            tokio::time::sleep(Duration::from_secs_f64(policy.delay_seconds)).await;
            let spec = self.job.spec.clone();
            let first_id = self.job.first_checkpoint_id;
            let from = restored_from.clone();
            let found = tokio::task::spawn_blocking(move || {
                let mut warnings = Vec::new();
                let point =
                    restore_point(&spec, first_id, from.as_ref(), &mut |w| warnings.push(w));
                (point, warnings)
            })
            .await
            .map_err(|e| format!("engine failed at t={now_s:.0}s: {reason}; {e}"))?;
            let (point, warnings) = found;
            warnings.iter().for_each(|w| warn(w));
            let point = point.map_err(|e| {
                format!(
                    "engine failed at t={now_s:.0}s: {reason}; cannot restart from a checkpoint: {e}"
                )
            })?;
            let launched = self
                .executor
                .launch(&dead.parallelism, point.as_ref())
                .await;
            let recovery_s = started.elapsed().as_secs_f64() - died_s;
            self.restarts.push(RestartRecord {
                at_s: died_s,
                reason: reason.clone(),
                restored_from: point.as_ref().map(|p| p.path.clone()),
                recovery_s,
            });
            match launched {
                Ok((engine, _)) => {
                    if point.is_none() {
                        self.trace_origin_s = started.elapsed().as_secs_f64();
                    }
                    print(&restarted_line(
                        started.elapsed().as_secs_f64(),
                        point.as_ref(),
                        recovery_s,
                    ));
                    return Ok(engine);
                }
                Err(e) => {
                    reason = format!("restart failed: {e}");
                    restored_from = point.or(restored_from);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_newer_of_checkpoint_and_savepoint_is_restored() {
        let dir = tempfile::tempdir().unwrap();
        let chk = dir.path().join("chk");
        let yaml = format!(
            "name: j\noperators:\n  - {{ name: s, kind: source, rate: {{ constant: 1 }} }}\n  - {{ name: k, kind: sink }}\nedges:\n  - {{ from: s, to: k }}\ncheckpoint: {{ intervalSeconds: 1, dir: \"{}\", restart: {{ attempts: 5, delaySeconds: 0.5 }} }}\n",
            chk.display()
        );
        let spec = JobSpec::from_yaml(&yaml).unwrap();
        assert_eq!(restart_policy(&spec).attempts, 5);
        let mut warned = Vec::new();
        let mut warn = |l: String| warned.push(l);
        // Nothing completed: from the beginning.
        assert_eq!(restore_point(&spec, 0, None, &mut warn).unwrap(), None);
        let snapshot = |id| streamscale_engine::savepoint::Savepoint {
            metadata: streamscale_engine::savepoint::SavepointMetadata {
                checkpoint_id: Some(id),
                ..streamscale_engine::savepoint::SavepointMetadata::for_job(&spec, 0)
            },
            state: Default::default(),
        };
        let storage = CheckpointStorage::new(&chk, 3);
        storage.write_checkpoint(7, &snapshot(7)).unwrap();
        let sp_dir = dir.path().join("sp-9");
        snapshot(9).write(&sp_dir).unwrap();
        let sp = Savepoint {
            path: sp_dir.display().to_string(),
        };
        // The savepoint (id 9) is newer than checkpoint 7, then checkpoint 10 is newer.
        assert_eq!(
            restore_point(&spec, 0, Some(&sp), &mut warn).unwrap(),
            Some(sp.clone())
        );
        storage.write_checkpoint(10, &snapshot(10)).unwrap();
        let got = restore_point(&spec, 0, Some(&sp), &mut warn)
            .unwrap()
            .unwrap();
        assert!(got.path.ends_with("chk-10"), "{got:?}");
        assert!(warned.is_empty());
        // A run that began at checkpoint 11 never resumes from 7 or 10 (an earlier run's):
        // from its savepoint, or from the beginning without one.
        assert_eq!(first_checkpoint_id(&spec), 11);
        assert_eq!(
            restore_point(&spec, 11, Some(&sp), &mut |_| {}).unwrap(),
            Some(sp.clone())
        );
        assert_eq!(restore_point(&spec, 11, None, &mut |_| {}).unwrap(), None);
        storage.write_checkpoint(11, &snapshot(11)).unwrap();
        let got = restore_point(&spec, 11, None, &mut |_| {})
            .unwrap()
            .unwrap();
        assert!(got.path.ends_with("chk-11"), "{got:?}");
        // Without a checkpoint block: the default strategy, the savepoint.
        let plain = JobSpec::from_yaml(yaml.split("checkpoint:").next().unwrap()).unwrap();
        assert_eq!(restart_policy(&plain), RestartSpec::default());
        assert_eq!(
            restore_point(&plain, 0, Some(&sp), &mut |_| {}).unwrap(),
            Some(sp)
        );
    }
}
