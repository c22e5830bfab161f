//! Checkpoints after tasks finished (Flink's FLIP-147): a job with a bounded source of a few
//! hundred records and a longer one, both feeding a keyed window and a sink. Once the short
//! source finished (and the operators fed only by it ended, one of them keyed), a savepoint of the running job
//! and a stop-with-savepoint still complete as consistent cuts, a restore at another
//! parallelism emits none of the finished source's records again, and at the end the sink
//! accounted exactly what both sources emitted, each record once.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::EngineProcess;
use streamscale_engine::checkpoint::BarrierKind;
use streamscale_engine::checkpoint::coordinator::{Outcome, Target};
use streamscale_engine::metrics::EngineMetrics;
use streamscale_engine::runtime::{Job, RuntimeOptions, StopKind};
use streamscale_engine::savepoint::Savepoint;
use streamscale_engine::spec::JobSpec;

/// Records of the short source: it finishes at once.
const SHORT: u64 = 400;
/// Records of the long source, at [`LONG_RATE`]: it runs for several seconds.
const LONG: u64 = 16_000;
const LONG_RATE: f64 = 2000.0;

/// short (1) → tag (2) → tag2 (2, chained to tag) → counts (window, keyed, 2) → sink (1),
/// long (2) → work (2, chained to long) → counts, and short → early (window, keyed, 2) → sink.
/// `tag` reads its own queue and `tag2` runs in its thread, so both ways a subtask ends by
/// itself are covered; `early` ends with keyed state. The short source has two paths to the
/// sink, so the sink accounts its records twice. `state` is a job-file `state:` line or empty.
fn mixed_yaml(long_rate: f64, state: &str) -> String {
    format!(
        r#"name: mixed
maxParallelism: 64
operators:
  - {{ name: short, kind: source, keys: 50, count: {SHORT}, rate: {{ constant: 1.0e6 }} }}
  - {{ name: tag, kind: map, parallelism: 2 }}
  - {{ name: tag2, kind: map, parallelism: 2 }}
  - {{ name: long, kind: source, keys: 300, count: {LONG}, rate: {{ constant: {long_rate} }}, parallelism: 2 }}
  - {{ name: work, kind: map, parallelism: 2 }}
  - {{ name: counts, kind: window, sizeMs: 100, parallelism: 2 }}
  - {{ name: early, kind: window, sizeMs: 50, parallelism: 2 }}
  - {{ name: sink, kind: sink }}
edges:
  - {{ from: short, to: tag }}
  - {{ from: tag, to: tag2 }}
  - {{ from: tag2, to: counts }}
  - {{ from: long, to: work }}
  - {{ from: work, to: counts }}
  - {{ from: counts, to: sink }}
  - {{ from: short, to: early }}
  - {{ from: early, to: sink }}
{state}"#
    )
}

/// Source records the sink accounts: the short source's twice (two paths).
const ACCOUNTED: u64 = 2 * SHORT + LONG;

fn mixed_spec(long_rate: f64, state: &str) -> JobSpec {
    let spec = JobSpec::from_yaml(&mixed_yaml(long_rate, state)).unwrap();
    spec.validate().unwrap();
    spec
}

fn options() -> RuntimeOptions {
    common::fast_flush_options()
}

fn outcome(
    rx: &crossbeam_channel::Receiver<Outcome>,
) -> streamscale_engine::checkpoint::coordinator::Completed {
    match rx.recv_timeout(Duration::from_secs(90)).unwrap() {
        Ok(c) => c,
        Err(f) => panic!("savepoint failed: {}", f.reason),
    }
}

/// Waits until the short source emitted all its records and `tag2` passed them all on.
fn wait_short_finished(job: &Job) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let c = job.counters();
        if c["short"].records_out == SHORT
            && c["tag2"].records_out == SHORT
            && c["early"].records_in == SHORT
        {
            break;
        }
        assert!(Instant::now() < until, "short source never finished: {c:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Let the end of input reach `tag2` and `counts` (not needed for correctness: a barrier
    // waits for it), so that the finished subtasks have exited before the barrier.
    std::thread::sleep(Duration::from_millis(200));
}

/// Checks that `sp` is a consistent cut with the short source and the operators fed only by
/// it at their final state: nothing is in flight across the barrier, and the window's state
/// holds exactly what it received.
fn assert_consistent_cut_with_short_finished(sp: &Savepoint) {
    let m = &sp.metadata;
    let c = |op: &str| m.counters[op];
    assert_eq!(m.sources["short"].emitted, SHORT, "{m:?}");
    assert_eq!(c("short").records_out, SHORT, "{m:?}");
    assert_eq!(c("tag").records_in, SHORT, "{m:?}");
    assert_eq!(c("tag2").records_in, c("tag").records_out, "{m:?}");
    assert_eq!(c("tag2").records_out, SHORT, "{m:?}");
    // `early` ended: every pane fired, its state holds every short record.
    assert_eq!(c("early").records_in, SHORT, "{m:?}");
    let early = &sp.state["early"];
    assert_eq!(
        early.totals().values().map(|(n, _)| n).sum::<u64>(),
        SHORT,
        "{m:?}"
    );
    assert_eq!(open_panes(early), 0, "{m:?}");
    let long = m.sources["long"].emitted;
    assert!(long > 0 && long < LONG, "the long source still runs: {m:?}");
    assert_eq!(c("long").records_out, long, "{m:?}");
    assert_eq!(c("work").records_in, c("long").records_out, "{m:?}");
    assert_eq!(
        c("counts").records_in,
        c("tag2").records_out + c("work").records_out,
        "{m:?}"
    );
    let state = &sp.state["counts"];
    let total: u64 = state.totals().values().map(|(n, _)| n).sum();
    assert_eq!(
        total,
        c("counts").records_in,
        "window state vs its input: {m:?}"
    );
    assert_eq!(
        c("sink").accounted + open_panes(state),
        total + SHORT,
        "{m:?}"
    );
    assert_eq!(
        c("sink").records_in,
        c("counts").records_out + c("early").records_out,
        "{m:?}"
    );
}

/// Records in open window panes.
fn open_panes(state: &streamscale_engine::state::KeyedState) -> u64 {
    state
        .groups
        .iter()
        .flat_map(|(kg, g)| g.entries(*kg).unwrap())
        .map(|(_, s)| s.pane_count)
        .sum()
}

/// Per-key (count, sum) of the windows `counts` and `early` after an uninterrupted run of the
/// same records.
fn uninterrupted_totals() -> [BTreeMap<u64, (u64, i64)>; 2] {
    let job = Job::start(
        mixed_spec(1.0e9, ""),
        None,
        EngineMetrics::new().unwrap(),
        options(),
    )
    .unwrap();
    let until = Instant::now() + Duration::from_secs(120);
    while !job.is_finished() {
        assert!(Instant::now() < until, "uninterrupted run never finished");
        std::thread::sleep(Duration::from_millis(10));
    }
    let done = job.join();
    assert!(done.errors.is_empty(), "{:?}", done.errors);
    let c = &done.savepoint.metadata.counters;
    assert_eq!(c["sink"].accounted, ACCOUNTED, "{c:?}");
    let s = &done.savepoint.state;
    [s["counts"].totals(), s["early"].totals()]
}

fn read(dir: &Path, spec: &JobSpec) -> Savepoint {
    Savepoint::read(dir, spec).unwrap()
}

/// The scenario of the module documentation in-process, with keyed state in `state` (a
/// job-file `state:` line, empty for the heap backend).
fn savepoint_stop_restore_run_to_end(dir: &Path, state: &str) {
    let [expected_counts, expected_early] = uninterrupted_totals();
    assert_eq!(
        expected_counts.values().map(|(n, _)| n).sum::<u64>(),
        SHORT + LONG
    );
    assert_eq!(expected_early.values().map(|(n, _)| n).sum::<u64>(), SHORT);
    let spec = mixed_spec(LONG_RATE, state);
    let job = Job::start(spec.clone(), None, EngineMetrics::new().unwrap(), options()).unwrap();
    wait_short_finished(&job);

    // A savepoint of the running job after the short source finished.
    let sp1 = dir.join("sp1");
    let done = outcome(&job.trigger(BarrierKind::Savepoint, Target::Savepoint(sp1.clone())));
    assert_eq!(done.location, sp1.display().to_string());
    assert_consistent_cut_with_short_finished(&read(&sp1, &spec));

    // The job keeps running; then a stop-with-savepoint (what a rescale starts with).
    std::thread::sleep(Duration::from_millis(300));
    let sp2 = dir.join("sp2");
    outcome(&job.stop_with_savepoint(StopKind::Stop, sp2.clone()));
    let stopped = job.join();
    assert!(stopped.errors.is_empty(), "{:?}", stopped.errors);
    let snapshot = read(&sp2, &spec);
    assert_consistent_cut_with_short_finished(&snapshot);
    assert!(
        snapshot.metadata.sources["long"].emitted
            > read(&sp1, &spec).metadata.sources["long"].emitted
    );

    // Restore at another parallelism of every operator; run to the end.
    let rescaled = spec.with_parallelism(&BTreeMap::from([
        ("short".to_string(), 2),
        ("tag".to_string(), 3),
        ("tag2".to_string(), 3),
        ("long".to_string(), 1),
        ("work".to_string(), 1),
        ("counts".to_string(), 3),
        ("early".to_string(), 1),
        ("sink".to_string(), 2),
    ]));
    let restored = read(&sp2, &rescaled);
    let job = Job::start(
        rescaled,
        Some(&restored),
        EngineMetrics::new().unwrap(),
        options(),
    )
    .unwrap();
    let until = Instant::now() + Duration::from_secs(120);
    while !job.is_finished() {
        assert!(
            Instant::now() < until,
            "restored job never finished: {:?}",
            job.counters()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let done = job.join();
    assert!(done.errors.is_empty(), "{:?}", done.errors);
    let c = &done.savepoint.metadata.counters;
    // The finished source emitted nothing again, and nothing went missing.
    assert_eq!(done.savepoint.metadata.sources["short"].emitted, SHORT);
    assert_eq!(c["short"].records_out, SHORT, "{c:?}");
    assert_eq!(c["tag"].records_in, SHORT, "{c:?}");
    assert_eq!(c["long"].records_out, LONG, "{c:?}");
    assert_eq!(c["early"].records_in, SHORT, "{c:?}");
    assert_eq!(c["counts"].records_in, SHORT + LONG, "{c:?}");
    assert_eq!(c["sink"].accounted, ACCOUNTED, "{c:?}");
    assert_eq!(done.savepoint.state["counts"].totals(), expected_counts);
    assert_eq!(done.savepoint.state["early"].totals(), expected_early);
}

#[test]
fn savepoints_after_a_bounded_source_finished_restore_exactly_once_at_another_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    savepoint_stop_restore_run_to_end(dir.path(), "");
}

/// The same with keyed state on disk: a finished subtask's final snapshot (segment files and a
/// read transaction) goes into two savepoints and the job's final state.
#[test]
fn finished_subtasks_disk_state_goes_into_every_later_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let state = format!(
        "state: {{ backend: disk, dir: \"{}\", cacheEntries: 64 }}\n",
        dir.path().join("state").display()
    );
    savepoint_stop_restore_run_to_end(dir.path(), &state);
}

#[test]
fn periodic_checkpoints_go_on_after_a_bounded_source_finished() {
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("checkpoints");
    let storage = std::sync::Arc::new(
        streamscale_engine::checkpoint::storage::CheckpointStorage::new(&chk, 3),
    );
    let spec = JobSpec::from_yaml(&format!(
        "{}checkpoint: {{ intervalSeconds: 0.1, retain: 3, dir: \"{}\" }}\n",
        mixed_yaml(LONG_RATE, ""),
        chk.display()
    ))
    .unwrap();
    spec.validate().unwrap();
    let job = Job::start(
        spec.clone(),
        None,
        EngineMetrics::new().unwrap(),
        RuntimeOptions {
            checkpoint_storage: Some(storage.clone()),
            ..options()
        },
    )
    .unwrap();
    wait_short_finished(&job);
    let after = storage
        .completed_ids()
        .unwrap()
        .last()
        .copied()
        .unwrap_or(0);
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        let last = storage
            .completed_ids()
            .unwrap()
            .last()
            .copied()
            .unwrap_or(0);
        if last >= after + 3 {
            let sp = read(&storage.path_of(last), &spec);
            assert_consistent_cut_with_short_finished(&sp);
            break;
        }
        assert!(
            Instant::now() < until,
            "no checkpoint after the short source finished (last {last}, {after} before)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    job.cancel();
    let _ = job.join();
}

/// The same over the engine's REST API, as the controller rescales: a savepoint of the
/// running job and a stop-with-savepoint after the short source finished, a restore at
/// another parallelism, and exact totals once the job finished.
#[test]
fn engine_rescales_after_a_bounded_source_finished() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, mixed_yaml(LONG_RATE, "")).unwrap();
    let spec = JobSpec::from_file(&job).unwrap();
    let sps = dir.path().join("savepoints");
    let mut first = EngineProcess::start(&job, &sps, &[]);
    let operator = common::operator_count;
    let until = Instant::now() + Duration::from_secs(60);
    while operator(&first.job(), "tag2", "recordsOut") < SHORT {
        assert!(Instant::now() < until, "short source never finished");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));

    first.savepoint("running", Duration::from_secs(90));
    assert_consistent_cut_with_short_finished(&read(&sps.join("running"), &spec));
    assert_eq!(first.job()["state"], "running");

    let (sp, view) = first.stop_with_savepoint(false);
    assert_eq!(operator(&view, "short", "recordsOut"), SHORT);
    assert_consistent_cut_with_short_finished(&read(&sp, &spec));
    let sp_arg = sp.display().to_string();
    let mut second = EngineProcess::start(
        &job,
        &sps,
        &[
            "--parallelism",
            "short=2,tag=1,tag2=1,long=3,work=3,counts=4,early=3,sink=2",
            "--restore",
            &sp_arg,
        ],
    );
    let end = second.wait_state("finished", Duration::from_secs(120));
    assert_eq!(operator(&end, "short", "recordsOut"), SHORT, "{end}");
    assert_eq!(operator(&end, "long", "recordsOut"), LONG, "{end}");
    assert_eq!(end["sourceRecords"], SHORT + LONG, "{end}");
    assert_eq!(end["recordsEmitted"], ACCOUNTED, "{end}");
    assert_eq!(end["recordsAccounted"], ACCOUNTED, "{end}");
    // A finished job's savepoint is served from its final state, as before.
    let (last, _) = second.stop_with_savepoint(false);
    let totals = read(&last, &spec).state["counts"].totals();
    assert_eq!(totals.values().map(|(n, _)| n).sum::<u64>(), SHORT + LONG);
}
