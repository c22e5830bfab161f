//! Keyed state with the disk backend (redb) and across backends, with the real engine binary
//! on loopback: rescale through savepoints (p=2 → p=3 and p=2 → p=1), SIGKILL recovery from
//! checkpoints, a heap savepoint restored into the disk backend, and the `state:` section's
//! validation.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{EngineProcess, bounded_job, checkpointed_job};
use streamscale_engine::checkpoint::storage::CheckpointStorage;
use streamscale_engine::savepoint::Savepoint;
use streamscale_engine::spec::{JobSpec, StateBackendKind};

const COUNT: u64 = 9000;
const RATE: f64 = 2000.0;

/// Appends a disk-backend `state:` section (working files in `state_dir`) to the job file.
fn with_disk_state(job: &Path, state_dir: &Path, cache: usize) {
    let mut text = std::fs::read_to_string(job).unwrap();
    text.push_str(&format!(
        "state: {{ backend: disk, dir: \"{}\", cacheEntries: {cache} }}\n",
        state_dir.display()
    ));
    std::fs::write(job, text).unwrap();
}

fn totals(sp: &Path, spec: &JobSpec) -> BTreeMap<u64, (u64, i64)> {
    Savepoint::read(sp, spec).unwrap().state["counts"]
        .try_totals()
        .unwrap()
}

/// Runs `job` (restoring from `restore` when given) at `parallelism` to the end of its input
/// and returns the final savepoint.
fn run_to_end(job: &Path, sps: &Path, parallelism: &str, restore: Option<&Path>) -> PathBuf {
    let restore_arg = restore.map(|p| p.display().to_string());
    let mut args = vec!["--parallelism", parallelism];
    if let Some(r) = &restore_arg {
        args.extend(["--restore", r.as_str()]);
    }
    let mut engine = EngineProcess::start(job, sps, &args);
    engine.wait_state("finished", Duration::from_secs(90));
    let (sp, view) = engine.stop_with_savepoint(false);
    assert_eq!(view["recordsEmitted"], COUNT, "{view}");
    assert_eq!(view["recordsAccounted"], COUNT, "{view}");
    sp
}

fn redb_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".redb"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn disk_backend_savepoint_at_p2_restores_at_p3_and_p1_with_the_same_keyed_state() {
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let job = bounded_job(dir.path(), COUNT, RATE);
    // A small cache, so that keys go through the database, not only the cache.
    with_disk_state(&job, &state_dir, 50);
    let spec = JobSpec::from_file(&job).unwrap();
    assert_eq!(spec.state.backend, StateBackendKind::Disk);
    let sps = dir.path().join("savepoints");

    let plain = run_to_end(&job, &sps, "work=2,counts=2", None);
    let expected = totals(&plain, &spec);
    assert_eq!(expected.values().map(|(c, _)| c).sum::<u64>(), COUNT);

    let mut first = EngineProcess::start(&job, &sps, &["--parallelism", "work=2,counts=2"]);
    std::thread::sleep(Duration::from_millis(1500));
    // The stop must land after some progress (a loaded machine can delay it past the pause).
    first.wait_source_records_above(0);
    assert!(
        !redb_files(&state_dir).is_empty(),
        "the disk backend keeps its working files in state.dir"
    );
    let (sp1, view1) = first.stop_with_savepoint(false);
    let emitted = view1["recordsEmitted"].as_u64().unwrap();
    assert!(emitted > 0 && emitted < COUNT, "stop mid-stream: {view1}");
    let at_stop = totals(&sp1, &spec);
    assert_eq!(
        at_stop.values().map(|(c, _)| c).sum::<u64>(),
        view1["recordsEmitted"].as_u64().unwrap()
    );

    for p in ["work=3,counts=3", "work=1,counts=1"] {
        // Right after the restore (stopped again at once), the keyed state is the savepoint's
        // plus what arrived since: no key lost, none counted twice.
        let sp1_arg = sp1.display().to_string();
        let mut again =
            EngineProcess::start(&job, &sps, &["--parallelism", p, "--restore", &sp1_arg]);
        let (sp2, view2) = again.stop_with_savepoint(false);
        let after = totals(&sp2, &spec);
        let emitted2 = view2["recordsEmitted"].as_u64().unwrap();
        assert_eq!(after.values().map(|(c, _)| c).sum::<u64>(), emitted2, "{p}");
        for (key, (c, s)) in &at_stop {
            let (c2, s2) = after[key];
            assert!(c2 >= *c && (c2 > *c || s2 == *s), "{p}: key {key}");
        }
        // And run to the end from the mid-stream savepoint: the uninterrupted run's state.
        let end = run_to_end(&job, &sps, p, Some(&sp1));
        assert_eq!(totals(&end, &spec), expected, "{p}");
    }
    assert!(
        redb_files(&state_dir).is_empty(),
        "stopped engines leave no working files: {:?}",
        redb_files(&state_dir)
    );
}

#[test]
fn heap_savepoint_restores_into_the_disk_backend_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let heap_job = bounded_job(dir.path(), COUNT, RATE);
    let spec = JobSpec::from_file(&heap_job).unwrap();
    let sps = dir.path().join("savepoints");
    let expected = totals(&run_to_end(&heap_job, &sps, "work=2,counts=2", None), &spec);

    let mut heap = EngineProcess::start(&heap_job, &sps, &["--parallelism", "work=2,counts=2"]);
    std::thread::sleep(Duration::from_millis(1200));
    let (sp1, _) = heap.stop_with_savepoint(false);

    let disk_dir = dir.path().join("disk");
    std::fs::create_dir_all(&disk_dir).unwrap();
    let disk_job = bounded_job(&disk_dir, COUNT, RATE);
    with_disk_state(&disk_job, &disk_dir.join("state"), 1000);
    let disk_spec = JobSpec::from_file(&disk_job).unwrap();
    assert_eq!(
        disk_spec.fingerprint(),
        spec.fingerprint(),
        "the backend is not part of the job's identity"
    );
    let sp1_arg = sp1.display().to_string();
    let mut disk = EngineProcess::start(
        &disk_job,
        &sps,
        &["--parallelism", "work=2,counts=3", "--restore", &sp1_arg],
    );
    std::thread::sleep(Duration::from_millis(1200));
    let (sp2, _) = disk.stop_with_savepoint(false);
    let end = run_to_end(&heap_job, &sps, "work=1,counts=1", Some(&sp2));
    assert_eq!(totals(&end, &spec), expected);
}

/// xorshift64*: a seeded generator for the kill moments.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn disk_backend_sigkill_at_random_moments_then_recover_gives_exactly_once_state() {
    const PARALLELISM: &str = "source=2,work=2,counts=3";
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let plain_chk = dir.path().join("plain-checkpoints");
    let plain_job = checkpointed_job(dir.path(), COUNT, 1500.0, 0.2, 3, &plain_chk);
    with_disk_state(&plain_job, &state_dir, 64);
    let spec = JobSpec::from_file(&plain_job).unwrap();
    let sps = dir.path().join("savepoints");
    let mut plain = EngineProcess::start(&plain_job, &sps, &["--parallelism", PARALLELISM]);
    plain.wait_state("finished", Duration::from_secs(90));
    let (sp, view) = plain.stop_with_savepoint(false);
    assert_eq!(view["recordsAccounted"], COUNT, "{view}");
    let expected = totals(&sp, &spec);

    let sub = dir.path().join("killed");
    std::fs::create_dir_all(&sub).unwrap();
    let chk = dir.path().join("checkpoints");
    std::fs::create_dir_all(&chk).unwrap();
    let job = checkpointed_job(&sub, COUNT, 1500.0, 0.2, 3, &chk);
    with_disk_state(&job, &state_dir, 64);
    let chk_arg = chk.display().to_string();
    let mut rng = Rng(0xd15c_2026);
    let mut restored = Vec::new();
    let mut positions = Vec::new();
    for kill in 0..4 {
        let mut engine = EngineProcess::start(
            &job,
            &sps,
            &["--parallelism", PARALLELISM, "--recover-from", &chk_arg],
        );
        if kill > 0 {
            restored.push(engine.job()["restoredFrom"].clone());
        }
        std::thread::sleep(Duration::from_millis(400 + rng.next() % 900));
        if kill == 0 {
            // The later runs must have a checkpoint to recover from: on a loaded machine the
            // first one (0.2 s interval) can come after the drawn moment, so wait for it.
            let until = Instant::now() + Duration::from_secs(120);
            while CheckpointStorage::new(&chk, 3)
                .completed_ids()
                .unwrap()
                .is_empty()
            {
                assert!(Instant::now() < until, "no checkpoint completed in 120 s");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        engine.child.kill().unwrap(); // SIGKILL: no cleanup runs
        engine.child.wait().unwrap();
        let storage = CheckpointStorage::new(&chk, 3);
        if let Some(id) = storage.completed_ids().unwrap().last() {
            let sp = Savepoint::read(&storage.path_of(*id), &spec).unwrap();
            positions.push(sp.metadata.sources["source"].emitted);
        }
    }
    assert!(restored.iter().any(|r| r.is_string()), "{restored:?}");
    assert!(
        positions.iter().any(|p| *p > 0 && *p < COUNT),
        "{positions:?}"
    );
    let mut last = EngineProcess::start(
        &job,
        &sps,
        &["--parallelism", PARALLELISM, "--recover-from", &chk_arg],
    );
    assert!(last.job()["restoredFrom"].is_string());
    last.wait_state("finished", Duration::from_secs(90));
    let (sp, view) = last.stop_with_savepoint(false);
    assert_eq!(view["recordsEmitted"], COUNT, "{view}");
    assert_eq!(view["recordsAccounted"], COUNT, "{view}");
    assert_eq!(totals(&sp, &spec), expected);
    // Working files of the killed processes were removed when the next engine opened its
    // backend; the last one removed its own on exit.
    assert!(
        redb_files(&state_dir).is_empty(),
        "{:?}",
        redb_files(&state_dir)
    );
}

#[test]
fn bad_state_sections_are_refused_naming_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let occupied = dir.path().join("occupied");
    std::fs::write(&occupied, b"not a directory").unwrap();
    for (section, needle) in [
        ("state: { backend: rocks }".to_string(), "rocks"),
        (
            "state: { backend: heap, dir: x }".to_string(),
            "state.dir: `x` is only used by the disk backend",
        ),
        (
            "state: { backend: disk, cacheEntries: 0 }".to_string(),
            "state.cacheEntries: must be at least 1",
        ),
        (
            format!(
                "state: {{ backend: disk, dir: \"{}\" }}",
                occupied.display()
            ),
            "exists and is not a directory",
        ),
        ("state: { backend: disk, size: 3 }".to_string(), "size"),
    ] {
        let job = bounded_job(dir.path(), 10, 10.0);
        let mut text = std::fs::read_to_string(&job).unwrap();
        text.push_str(&section);
        text.push('\n');
        std::fs::write(&job, text).unwrap();
        let out = std::process::Command::new(common::engine_bin())
            .arg("--job")
            .arg(&job)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{section}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&job.display().to_string()) && stderr.contains(needle),
            "{section}: {stderr}"
        );
    }
}
