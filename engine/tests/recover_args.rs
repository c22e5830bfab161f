//! `--recover-from` and `--checkpoint-dir` misuse: a missing directory, a single checkpoint
//! instead of the checkpoint directory, and a checkpoint directory for a job that takes no
//! checkpoints are errors (exit 2, one clear line, nothing written); an existing empty
//! directory starts fresh and says so; a directory of savepoints is refused with the savepoint to
//! `--restore`; the default checkpoint directory is one per job name; `--recover` starts fresh
//! and then recovers with the same arguments.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{EngineProcess, bounded_job, checkpointed_job};

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(common::engine_bin())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn missing_recover_dir_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("checkpoints");
    let job = checkpointed_job(dir.path(), 1000, 1000.0, 0.2, 3, &chk);
    let missing = dir.path().join("nope");
    let (code, err) = run(&["--job", &s(&job), "--recover-from", &s(&missing)]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--recover-from") && err.contains("no such directory"),
        "{err}"
    );
    assert!(!missing.exists(), "nothing may be written");
    // A job without a `checkpoint:` block: the same one line, no warning about the block
    // before it.
    let plain = bounded_job(dir.path(), 100, 1000.0);
    let (code, err) = run(&["--job", &s(&plain), "--recover-from", &s(&missing)]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("no such directory"), "{err}");
}

#[test]
fn single_checkpoint_instead_of_its_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("checkpoints");
    let job = checkpointed_job(dir.path(), 200_000, 2000.0, 0.2, 3, &chk);
    let sps = dir.path().join("sp");
    {
        let _engine = EngineProcess::start(&job, &sps, &["--checkpoint-dir", &s(&chk)]);
        // A deadline for a stuck coordinator only (a loaded machine stretches the interval).
        let until = std::time::Instant::now() + Duration::from_secs(120);
        while !std::fs::read_dir(&chk)
            .is_ok_and(|mut d| d.any(|e| e.unwrap().path().join("_metadata.json").is_file()))
        {
            assert!(
                std::time::Instant::now() < until,
                "no checkpoint completed in 120 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    } // killed on drop
    let one = std::fs::read_dir(&chk)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("_metadata.json").is_file())
        .unwrap();
    let before: Vec<_> = std::fs::read_dir(&one).unwrap().collect();
    let (code, err) = run(&["--job", &s(&job), "--recover-from", &s(&one)]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("single checkpoint") && err.contains(&s(&chk)),
        "names the parent to pass: {err}"
    );
    let after: Vec<_> = std::fs::read_dir(&one).unwrap().collect();
    assert_eq!(
        before.len(),
        after.len(),
        "nothing written into the checkpoint"
    );
}

#[test]
fn empty_recover_dir_starts_fresh_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("checkpoints");
    std::fs::create_dir_all(&chk).unwrap();
    let job = checkpointed_job(dir.path(), 500, 5000.0, 0.2, 3, &chk);
    let out = Command::new(common::engine_bin())
        .args(["--job", &s(&job), "--recover-from", &s(&chk)])
        .args(["--savepoint-dir", &s(&dir.path().join("sp"))])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The warning is logged before the engine announces its address on stdout: once that line
    // is read the warning is on stderr, however slowly the engine started.
    let mut out = out;
    let mut line = String::new();
    BufReader::new(out.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    out.kill().unwrap();
    let o = out.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("WARN") && err.contains("no completed checkpoint") && err.contains("fresh"),
        "{err}"
    );
}

#[test]
fn checkpoint_dir_without_checkpoint_block_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let job = bounded_job(dir.path(), 100, 1000.0);
    let chk = dir.path().join("chk");
    let (code, err) = run(&["--job", &s(&job), "--checkpoint-dir", &s(&chk)]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--checkpoint-dir") && err.contains("no `checkpoint:` block"),
        "{err}"
    );
    assert!(!chk.exists(), "nothing may be written");
}

#[test]
fn savepoint_directory_is_not_a_checkpoint_directory() {
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("checkpoints");
    let job = checkpointed_job(dir.path(), 200_000, 2000.0, 5.0, 3, &chk);
    let sps = dir.path().join("sp");
    let sp = {
        let mut engine = EngineProcess::start(&job, &sps, &[]);
        engine.wait_state("running", Duration::from_secs(30));
        engine.stop_with_savepoint(false).0
    };
    // The directory of savepoints: refused, naming the savepoint to restore instead.
    let (code, err) = run(&["--job", &s(&job), "--recover-from", &s(&sps)]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("holds savepoints") && err.contains(&format!("--restore {}", s(&sp))),
        "names the savepoint to pass to --restore: {err}"
    );
    // One savepoint: refused with the --restore hint, not the checkpoint-directory one.
    let (code, err) = run(&["--job", &s(&job), "--recover-from", &s(&sp)]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("is a savepoint") && err.contains(&format!("--restore {}", s(&sp))),
        "{err}"
    );
}

#[test]
fn default_checkpoint_directory_is_one_per_job() {
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("unused");
    let job = checkpointed_job(dir.path(), 100, 1000.0, 1.0, 3, &chk);
    let text = std::fs::read_to_string(&job).unwrap();
    let without_dir = text.replace(&format!("dir: \"{}\", ", s(&chk)), "");
    assert_ne!(text, without_dir, "the job file names its directory");
    let first = dir.path().join("first.yaml");
    let second = dir.path().join("second.yaml");
    std::fs::write(&first, &without_dir).unwrap();
    std::fs::write(&second, without_dir.replace("name: bounded", "name: other")).unwrap();
    let dir_of = |p: &Path| {
        streamscale_engine::spec::JobSpec::from_file(p)
            .unwrap()
            .checkpoint
            .unwrap()
            .dir
            .unwrap()
    };
    assert_eq!(dir_of(&first), s(&dir.path().join("checkpoints/bounded")));
    assert_eq!(dir_of(&second), s(&dir.path().join("checkpoints/other")));
}

/// The newest completed checkpoint id in `chk`, 0 when none.
fn newest_checkpoint(chk: &Path) -> u64 {
    std::fs::read_dir(chk)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("_metadata.json").is_file())
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// `--recover` is one command line for the first start and every restart (what a Kubernetes
/// container restart reruns): with no checkpoint yet (the directory not even created) the
/// job starts fresh; after a SIGKILL the same arguments recover from the latest completed
/// checkpoint. Without a `checkpoint:` block it is one clear error.
#[test]
fn recover_starts_fresh_then_recovers_with_the_same_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("volume").join("checkpoints");
    let job = checkpointed_job(dir.path(), 1_000_000, 2000.0, 0.2, 3, &dir.path().join("x"));
    let sp = dir.path().join("sp");
    let args = ["--checkpoint-dir", &s(&chk), "--recover"];
    let mut first = EngineProcess::start(&job, &sp, &args);
    assert!(first.job()["restoredFrom"].is_null(), "{}", first.job());
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while newest_checkpoint(&chk) < 2 {
        assert!(
            std::time::Instant::now() < until,
            "no checkpoint in {}",
            chk.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    first.child.kill().unwrap();
    let _ = first.child.wait();
    let newest = newest_checkpoint(&chk);
    let mut again = EngineProcess::start(&job, &sp, &args);
    let from = again.job()["restoredFrom"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        Path::new(&from).starts_with(&chk)
            && from
                .rsplit("chk-")
                .next()
                .and_then(|id| id.parse::<u64>().ok())
                .is_some_and(|id| id >= newest),
        "recovered from {from}, the newest was chk-{newest}"
    );
    again.child.kill().unwrap();
    let _ = again.child.wait();

    let plain = bounded_job(dir.path(), 100, 1000.0);
    let (code, err) = run(&["--job", &s(&plain), "--recover"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("--recover") && err.contains("no `checkpoint:` block"),
        "{err}"
    );
}
