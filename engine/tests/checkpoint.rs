//! Aligned-barrier checkpoints of a running engine: periodic, retained, consistent cuts, and
//! savepoints of a running job by the same mechanism.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{EngineProcess, checkpointed_job, metric_sum};
use streamscale_engine::checkpoint::storage::CheckpointStorage;
use streamscale_engine::savepoint::Savepoint;
use streamscale_engine::spec::JobSpec;

/// Checks that a snapshot is a consistent cut of the chain source → work → counts → sink:
/// nothing is in flight across a barrier, so each operator received exactly what its upstream
/// sent before the barrier, and the window's state holds exactly what it received.
fn assert_consistent_cut(sp: &Savepoint) {
    let m = &sp.metadata;
    let c = |op: &str| m.counters[op];
    let position = m.sources["source"].emitted;
    assert_eq!(c("source").records_out, position, "{m:?}");
    assert_eq!(c("work").records_in, c("source").records_out, "{m:?}");
    assert_eq!(c("counts").records_in, c("work").records_out, "{m:?}");
    let state = &sp.state["counts"];
    let total: u64 = state.totals().values().map(|(n, _)| n).sum();
    assert_eq!(
        total,
        c("counts").records_in,
        "window state vs its input: {m:?}"
    );
    let open: u64 = state
        .groups
        .iter()
        .flat_map(|(kg, g)| g.entries(*kg).unwrap())
        .map(|(_, s)| s.pane_count)
        .sum();
    assert_eq!(
        c("sink").accounted + open,
        total,
        "fired panes reached the sink: {m:?}"
    );
    assert_eq!(c("sink").records_in, c("counts").records_out, "{m:?}");
}

#[test]
fn periodic_checkpoints_are_consistent_cuts_and_retained() {
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("checkpoints");
    let job = checkpointed_job(dir.path(), 1_000_000, 3000.0, 0.2, 2, &chk);
    let spec = JobSpec::from_file(&job).unwrap();
    let sps = dir.path().join("savepoints");
    let engine = EngineProcess::start(
        &job,
        &sps,
        &["--parallelism", "source=2,work=3,counts=2,sink=2"],
    );
    let storage = CheckpointStorage::new(&chk, 2);
    // A deadline for a stuck coordinator only: under a heavily loaded machine 5 checkpoints at a
    // 0.2 s interval have taken longer than 30 s.
    let until = Instant::now() + Duration::from_secs(180);
    while storage
        .completed_ids()
        .unwrap()
        .last()
        .copied()
        .unwrap_or(0)
        < 5
    {
        assert!(Instant::now() < until, "fewer than 5 checkpoints in 180 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let ids = storage.completed_ids().unwrap();
    assert!(
        ids.len() <= 3,
        "retain 2 (one may be mid-deletion): {ids:?}"
    );
    let mut last_position = 0;
    for id in &ids {
        let sp = Savepoint::read(&storage.path_of(*id), &spec).unwrap();
        assert_eq!(sp.metadata.checkpoint_id, Some(*id));
        assert_eq!(sp.metadata.parallelism["counts"], 2);
        assert_eq!(
            sp.metadata.key_groups["counts"],
            vec![[0, 32], [32, 64]],
            "key-group ranges in the manifest"
        );
        let position = sp.metadata.sources["source"].emitted;
        assert!(position > last_position, "positions advance: {position}");
        last_position = position;
        assert_consistent_cut(&sp);
    }
    // The coordinator counts a checkpoint after its files are written, so the storage can show
    // checkpoint 5 a moment before the counter reads 5 (a CI run caught it at 4).
    let mut text = engine.metrics();
    while metric_sum(&text, "streamscale_checkpoints_completed_total") < 5.0 {
        assert!(
            Instant::now() < until,
            "checkpoint 5 is in storage but the counter stayed below 5: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
        text = engine.metrics();
    }
    assert_eq!(
        metric_sum(&text, "streamscale_checkpoints_failed_total"),
        0.0
    );
    assert_eq!(engine.job()["state"], "running");
}

#[test]
fn savepoint_of_a_running_job_then_stop_with_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("checkpoints");
    let job = checkpointed_job(dir.path(), 1_000_000, 3000.0, 30.0, 2, &chk);
    let spec = JobSpec::from_file(&job).unwrap();
    let sps = dir.path().join("savepoints");
    let mut engine = EngineProcess::start(&job, &sps, &["--parallelism", "work=2,counts=3"]);
    std::thread::sleep(Duration::from_millis(800));
    engine.wait_source_records_above(0);
    engine.savepoint("live", Duration::from_secs(120));
    let live = Savepoint::read(&sps.join("live"), &spec).unwrap();
    assert!(live.metadata.sources["source"].emitted > 0);
    assert_consistent_cut(&live);
    assert_eq!(
        engine.job()["state"],
        "running",
        "a savepoint does not stop the job"
    );
    std::thread::sleep(Duration::from_millis(300));
    engine.wait_source_records_above(live.metadata.sources["source"].emitted);
    let (stopped, job_view) = engine.stop_with_savepoint(false);
    let sp = Savepoint::read(&stopped, &spec).unwrap();
    assert_consistent_cut(&sp);
    assert!(sp.metadata.sources["source"].emitted > live.metadata.sources["source"].emitted);
    // After a stop barrier nothing is in flight: the job's final counters are the savepoint's.
    assert_eq!(
        job_view["recordsEmitted"].as_u64().unwrap(),
        sp.metadata.sources["source"].emitted
    );
    // A drained stop fires every pane before the snapshot: nothing left open.
    let sp_arg = stopped.display().to_string();
    let mut again = EngineProcess::start(&job, &sps, &["--restore", &sp_arg]);
    std::thread::sleep(Duration::from_millis(300));
    let (drained, _) = again.stop_with_savepoint(true);
    let sp = Savepoint::read(&drained, &spec).unwrap();
    assert_consistent_cut(&sp);
    let open: u64 = sp.state["counts"]
        .groups
        .iter()
        .flat_map(|(kg, g)| g.entries(*kg).unwrap())
        .map(|(_, s)| s.pane_count)
        .sum();
    assert_eq!(open, 0);
    let total: u64 = sp.state["counts"].totals().values().map(|(n, _)| n).sum();
    assert_eq!(sp.metadata.counters["sink"].accounted, total);
}
