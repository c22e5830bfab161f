//! Where a job resumes: the newest completed restore point of its lineage, as Flink resumes
//! a job from its latest completed checkpoint or savepoint and never from an older one once a
//! newer one exists (its exactly-once sinks may have committed the output after the older one).
//!
//! The newer (by checkpoint id) of the latest completed checkpoint of the job's checkpoint
//! directory that verifies ([`CheckpointStorage::latest_since`], the picker of the engine's
//! `--recover`; a damaged newest checkpoint falls back to an older one) and the savepoint or
//! checkpoint the job was last restored from. Used when an engine died (the run's supervision)
//! and when a rescale rolls back ([`super::runtime_backend`]).

use std::path::Path;
use std::sync::Arc;

use streamscale_engine::checkpoint::storage::CheckpointStorage;
use streamscale_engine::savepoint::METADATA_FILE;
use streamscale_engine::spec::JobSpec;

use super::runtime_backend::RestorePointFn;
use crate::runtime::Savepoint;

/// Checkpoint id recorded in the manifest of the savepoint or checkpoint at `dir`, if readable.
fn checkpoint_id_of(dir: &Path) -> Option<u64> {
    let text = std::fs::read(dir.join(METADATA_FILE)).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v.get("checkpoint_id")?.as_u64()
}

/// Where a job last restored from `restored_from` (`None`: started fresh) resumes (see the
/// module documentation): `Ok(None)` from the beginning. Only checkpoints numbered
/// `first_checkpoint_id` or higher are this run's (its [`CheckpointStorage::next_id`] when it
/// started). Reads and verifies the latest checkpoints (blocking I/O); a damaged newest one
/// falls back to an older one. `warn` receives a line when no checkpoint verifies but a
/// savepoint is used instead.
///
/// # Errors
/// When checkpoints exist but none verifies and there is no savepoint to fall back to, or the
/// storage cannot be listed: the reason, naming the files.
pub fn restore_point(
    spec: &JobSpec,
    first_checkpoint_id: u64,
    restored_from: Option<&Savepoint>,
    warn: &mut dyn FnMut(String),
) -> Result<Option<Savepoint>, String> {
    let savepoint = restored_from.map(|s| (s.clone(), checkpoint_id_of(Path::new(&s.path))));
    let checkpoint = match spec
        .checkpoint
        .as_ref()
        .and_then(|c| Some((c, c.dir.as_ref()?)))
    {
        None => None,
        Some((c, dir)) => {
            let latest = CheckpointStorage::open(dir, c.retain)
                .map_err(|e| e.to_string())
                .and_then(|s| {
                    s.latest_since(spec, first_checkpoint_id)
                        .map_err(|e| e.to_string())
                });
            match latest {
                Ok(found) => found.map(|(path, sp)| {
                    (
                        Savepoint {
                            path: path.display().to_string(),
                        },
                        sp.metadata.checkpoint_id,
                    )
                }),
                Err(e) if savepoint.is_some() => {
                    warn(format!(
                        "warning: no usable checkpoint ({e}); restarting from the savepoint instead"
                    ));
                    None
                }
                Err(e) => return Err(e),
            }
        }
    };
    Ok(match (checkpoint, savepoint) {
        (Some((c, cid)), Some((s, sid))) => Some(if cid >= sid { c } else { s }),
        (Some((c, _)), None) => Some(c),
        (None, s) => s.map(|(s, _)| s),
    })
}

/// [`restore_point`] of the job `spec` (whose run's first checkpoint id is
/// `first_checkpoint_id`) as the rescale backend asks it, warnings logged.
pub fn finder(spec: JobSpec, first_checkpoint_id: u64) -> RestorePointFn {
    Arc::new(move |from: Option<&Savepoint>| {
        restore_point(&spec, first_checkpoint_id, from, &mut |w| {
            tracing::warn!("{w}")
        })
    })
}
