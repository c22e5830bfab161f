//! The exactly-once file sink and the checkpoint manifest's checksum, with the real engine
//! binary on loopback.
//!
//! - SIGKILL at seeded random moments, several times in one run of a keyed job, restarting
//!   with `--recover-from` each time and at another parallelism once: the published part files
//!   hold every result exactly once (per-key totals equal an undisturbed run's), never a torn
//!   line, at every moment between the kills too.
//! - A checkpoint whose `_metadata.json` has one bit flipped is refused, naming the file.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{EngineProcess, read_sink_output};
use streamscale_engine::checkpoint::storage::CheckpointStorage;
use streamscale_engine::savepoint::{METADATA_FILE, Savepoint};
use streamscale_engine::spec::JobSpec;

const COUNT: u64 = 6000;
const RATE: f64 = 1500.0;

/// A keyed job (source → map → 200 ms window → exactly-once file sink into `out`) with
/// checkpoints every 0.2 s into `chk`, written as `dir/job.yaml`.
fn job(dir: &Path, out: &Path, chk: &Path) -> PathBuf {
    let path = dir.join("job.yaml");
    std::fs::write(
        &path,
        format!(
            "name: eo\nmaxParallelism: 64\noperators:\n  - {{ name: source, kind: source, keys: 300, count: {COUNT}, rate: {{ constant: {RATE} }} }}\n  - {{ name: work, kind: map, cpu: 20, io: 100 }}\n  - {{ name: counts, kind: window, sizeMs: 200 }}\n  - {{ name: sink, kind: sink, output: \"{}\" }}\nedges:\n  - {{ from: source, to: work }}\n  - {{ from: work, to: counts }}\n  - {{ from: counts, to: sink }}\ncheckpoint: {{ intervalSeconds: 0.2, retain: 3, dir: \"{}\" }}\n",
            out.display(),
            chk.display()
        ),
    )
    .unwrap();
    path
}

/// Per-key (records, sum of values) of the published output; panics on a torn or malformed
/// line.
fn published_totals(out: &Path) -> BTreeMap<u64, (u64, i64)> {
    let mut totals: BTreeMap<u64, (u64, i64)> = BTreeMap::new();
    for line in read_sink_output(out).lines() {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), 3, "torn or malformed line {line:?}");
        let (key, count, value) = (
            f[0].parse::<u64>()
                .unwrap_or_else(|e| panic!("{line:?}: {e}")),
            f[1].parse::<u64>()
                .unwrap_or_else(|e| panic!("{line:?}: {e}")),
            f[2].parse::<i64>()
                .unwrap_or_else(|e| panic!("{line:?}: {e}")),
        );
        let t = totals.entry(key).or_default();
        t.0 += count;
        t.1 += value;
    }
    totals
}

fn in_progress_files(out: &Path) -> Vec<String> {
    std::fs::read_dir(out)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".inprogress"))
                .collect()
        })
        .unwrap_or_default()
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

/// Waits until `chk` holds a completed checkpoint; a deadline for a stuck coordinator only.
fn wait_for_a_checkpoint(chk: &Path) {
    let storage = CheckpointStorage::new(chk, 3);
    let until = Instant::now() + Duration::from_secs(120);
    while storage.completed_ids().unwrap().is_empty() {
        assert!(Instant::now() < until, "no checkpoint completed in 120 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigkill_at_random_moments_publishes_every_result_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let sps = dir.path().join("savepoints");

    // The undisturbed run.
    let plain = dir.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let plain_out = plain.join("out");
    let plain_job = job(&plain, &plain_out, &plain.join("chk"));
    let mut engine = EngineProcess::start(&plain_job, &sps, &["--parallelism", "counts=2"]);
    engine.wait_state("finished", Duration::from_secs(90));
    let (_, view) = engine.stop_with_savepoint(false);
    assert_eq!(view["recordsAccounted"], COUNT, "{view}");
    let expected = published_totals(&plain_out);
    assert_eq!(expected.values().map(|t| t.0).sum::<u64>(), COUNT);
    assert!(in_progress_files(&plain_out).is_empty());

    // The same job killed at random moments, at another parallelism after the second kill.
    let killed = dir.path().join("killed");
    std::fs::create_dir_all(&killed).unwrap();
    let out = killed.join("out");
    let chk = killed.join("chk");
    std::fs::create_dir_all(&chk).unwrap();
    let job = job(&killed, &out, &chk);
    let spec = JobSpec::from_file(&job).unwrap();
    let chk_arg = chk.display().to_string();
    let parallelism = |kill: u32| {
        if kill < 2 {
            "source=2,work=2,counts=3,sink=1"
        } else {
            "source=1,work=2,counts=2,sink=2"
        }
    };
    let mut rng = Rng(0x5eed_0021);
    let mut positions = Vec::new();
    let mut restored = Vec::new();
    for kill in 0..4 {
        let mut engine = EngineProcess::start(
            &job,
            &sps,
            &[
                "--parallelism",
                parallelism(kill),
                "--recover-from",
                &chk_arg,
            ],
        );
        if kill > 0 {
            restored.push(engine.job()["restoredFrom"].clone());
        }
        std::thread::sleep(Duration::from_millis(300 + rng.next() % 900));
        if kill == 0 {
            wait_for_a_checkpoint(&chk);
        }
        engine.child.kill().unwrap(); // SIGKILL
        engine.child.wait().unwrap();
        // Between kills a reader sees whole lines, and never more than once.
        let so_far = published_totals(&out);
        for (key, (n, _)) in &so_far {
            assert!(
                *n <= expected.get(key).map_or(0, |t| t.0),
                "key {key}: {n} records published after kill {kill}, the whole run has {:?}",
                expected.get(key)
            );
        }
        let storage = CheckpointStorage::new(&chk, 3);
        if let Some(id) = storage.completed_ids().unwrap().last() {
            let sp = Savepoint::read(&storage.path_of(*id), &spec).unwrap();
            positions.push(sp.metadata.sources["source"].emitted);
        }
    }
    assert!(
        restored.iter().any(|r| r.is_string()),
        "some restart recovered from a checkpoint: {restored:?}"
    );
    assert!(
        positions.iter().any(|p| *p > 0 && *p < COUNT),
        "a checkpoint landed mid-stream: {positions:?}"
    );
    let mut last = EngineProcess::start(
        &job,
        &sps,
        &["--parallelism", parallelism(4), "--recover-from", &chk_arg],
    );
    assert!(last.job()["restoredFrom"].is_string());
    last.wait_state("finished", Duration::from_secs(90));
    let (_, view) = last.stop_with_savepoint(false);
    assert_eq!(view["recordsAccounted"], COUNT, "{view}");
    assert_eq!(published_totals(&out), expected, "published output");
    assert!(
        in_progress_files(&out).is_empty(),
        "{:?}",
        in_progress_files(&out)
    );
}

#[test]
fn a_manifest_with_one_bit_flipped_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let chk = dir.path().join("chk");
    let job = job(dir.path(), &out, &chk);
    let sps = dir.path().join("savepoints");
    {
        let _engine = EngineProcess::start(&job, &sps, &[]);
        wait_for_a_checkpoint(&chk);
    } // SIGKILL on drop
    let storage = CheckpointStorage::new(&chk, 3);
    let id = *storage.completed_ids().unwrap().last().unwrap();
    let manifest = storage.path_of(id).join(METADATA_FILE);
    let mut bytes = std::fs::read(&manifest).unwrap();
    // The lowest bit of the last digit of the source's position: `"emitted": 1234` becomes
    // 1235, another valid number (flipping the first digit could make `0234`, which is no
    // JSON number: the parse fails before the checksum is looked at).
    let start = String::from_utf8_lossy(&bytes)
        .find("\"emitted\": ")
        .unwrap()
        + 11;
    let digits = bytes[start..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    assert!(digits > 0, "{}", String::from_utf8_lossy(&bytes));
    bytes[start + digits - 1] ^= 0x01;
    std::fs::write(&manifest, &bytes).unwrap();
    let run = std::process::Command::new(common::engine_bin())
        .args(["--job", &job.display().to_string(), "--restore"])
        .arg(storage.path_of(id))
        .arg("--savepoint-dir")
        .arg(&sps)
        .output()
        .unwrap();
    assert_ne!(run.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains(&manifest.display().to_string())
            && stderr.contains("manifest checksum mismatch"),
        "{stderr}"
    );
}

/// A stop-with-savepoint whose savepoint cannot be written (its directory replaced by a file):
/// the job resumes from the stop's snapshot, which lists the sink's pre-commits and which
/// resuming commits, only once it is written as a checkpoint, so that a later restart starts
/// after those results (not from the checkpoint before, publishing them again). The job then
/// finishes with every result published once.
#[test]
fn a_failed_stop_resumes_only_from_its_snapshot_made_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let chk = dir.path().join("chk");
    std::fs::create_dir_all(&chk).unwrap();
    let sps = dir.path().join("savepoints");
    let job = job(dir.path(), &out, &chk);
    let log = dir.path().join("engine.log");
    let engine = EngineProcess::start_with_stderr(
        &job,
        &sps,
        &[],
        std::fs::File::create(&log).unwrap().into(),
    );
    wait_for_a_checkpoint(&chk);
    let storage = CheckpointStorage::new(&chk, 3);
    std::fs::remove_dir_all(&sps).ok();
    std::fs::write(&sps, "not a directory").unwrap();
    let client = reqwest::blocking::Client::new();
    let resp = client
        .post(format!("{}/v1/savepoints", engine.base))
        .json(&serde_json::json!({"stop": true, "drain": true}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let id = resp.json::<serde_json::Value>().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The newest checkpoint before the stop's snapshot could be one.
    let before = storage.completed_ids().unwrap().into_iter().max();
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let st: serde_json::Value = client
            .get(format!("{}/v1/savepoints/{id}", engine.base))
            .send()
            .unwrap()
            .json()
            .unwrap();
        if st["status"] != "pending" {
            break st;
        }
        assert!(Instant::now() < until, "the stop never ended: {st}");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(status["status"], "failed", "{status}");
    // Said failed only once the job resumed: from the snapshot written as a checkpoint.
    let after = storage.completed_ids().unwrap().into_iter().max();
    assert!(
        after > before,
        "checkpoints {before:?} then {after:?}; {status}; {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let view = engine.wait_state("finished", Duration::from_secs(120));
    assert_eq!(view["recordsAccounted"], COUNT, "{view}");
    let totals = published_totals(&out);
    assert_eq!(
        totals.values().map(|t| t.0).sum::<u64>(),
        COUNT,
        "each result once"
    );
}

/// An engine run with `--recover` (by a supervisor that reruns it) stays up for
/// `EXIT_GRACE_UNREAD` after the read of its completed stop, so that the deployer replaces it
/// before it is rerun; rerun all the same, it goes on from the stop, which was also written as
/// a checkpoint, not from the checkpoint before it: the results the stop published are not
/// published again, and the job finishes with every result published once.
#[test]
fn an_engine_rerun_with_recover_after_a_stop_goes_on_from_the_stop() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let chk = dir.path().join("chk");
    let sps = dir.path().join("savepoints");
    // Windows firing 20 times per checkpoint interval: the stop publishes results that no
    // checkpoint before it lists.
    let job = job(dir.path(), &out, &chk);
    let text = std::fs::read_to_string(&job).unwrap();
    std::fs::write(
        &job,
        text.replace("sizeMs: 200", "sizeMs: 50")
            .replace("intervalSeconds: 0.2", "intervalSeconds: 1"),
    )
    .unwrap();
    let args = ["--parallelism", "counts=2", "--recover"];
    let mut engine = EngineProcess::start(&job, &sps, &args);
    wait_for_a_checkpoint(&chk);
    engine.wait_source_records_above(COUNT / 3);
    let asked = Instant::now();
    let (savepoint, _) = engine.stop_with_savepoint(false);
    assert!(
        asked.elapsed() >= streamscale_engine::server::EXIT_GRACE_UNREAD,
        "exited {:?} after the stop was asked for",
        asked.elapsed()
    );
    let spec = JobSpec::from_file(&job).unwrap();
    let stopped = Savepoint::read(&savepoint, &spec).unwrap().metadata;
    assert!(
        stopped.sinks.values().any(|c| !c.is_empty()),
        "the stop publishes results: {:?}",
        stopped.sinks
    );
    let stop_id = stopped.checkpoint_id.unwrap();
    let storage = CheckpointStorage::new(&chk, 3);
    assert_eq!(
        storage.completed_ids().unwrap().into_iter().max(),
        Some(stop_id),
        "the stop is the newest checkpoint"
    );
    let again = EngineProcess::start(&job, &sps, &args);
    let view = again.wait_state("finished", Duration::from_secs(120));
    assert!(
        view["restoredFrom"]
            .as_str()
            .is_some_and(|p| p.ends_with(&format!("chk-{stop_id}"))),
        "{view}"
    );
    let totals = published_totals(&out);
    assert_eq!(
        totals.values().map(|t| t.0).sum::<u64>(),
        COUNT,
        "each result once"
    );
}
