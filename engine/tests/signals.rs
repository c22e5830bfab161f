//! SIGINT and SIGTERM stop the real `streamscale-engine` binary whatever disposition it
//! inherited: a script's background job (`engine &` in `sh`) starts with SIGINT ignored, which
//! these tests reproduce with `sh -c 'trap "" INT; exec engine …'`.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Starts the engine with `args` through `sh`, with SIGINT ignored (as `trap "" INT` leaves it
/// for the program `exec` runs); stdout piped, stderr into `log`.
fn start_with_sigint_ignored(args: &[&str], log: &Path) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(r#"trap "" INT; exec "$0" "$@""#)
        .arg(common::engine_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Waits for the `listening` line and returns the engine's address.
fn listening(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("engine did not announce its address ({e}): {line:?}"));
    v["address"].as_str().unwrap().to_string()
}

fn kill(sig: &str, child: &Child) {
    let ok = Command::new("kill")
        .arg(sig)
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {}", child.id());
}

/// The engine's exit status, or `None` (after killing it) when it still runs after `within`.
fn exit_within(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Waits up to 60 s for the engine to exit, checks that it exited with status 0 and returns
/// its log (`log`, its stderr).
fn exits_with_0(child: &mut Child, log: &Path) -> String {
    let status = exit_within(child, Duration::from_secs(60));
    let logged = std::fs::read_to_string(log).unwrap();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{status:?}\n{logged}"
    );
    logged
}

/// A job that runs far longer than any test: 10 records/s, a million records.
fn long_job(dir: &Path) -> String {
    common::bounded_job(dir, 1_000_000, 10.0)
        .display()
        .to_string()
}

/// SIGINT ignored at exec: `kill -INT` still stops a serving engine the way Ctrl-C does (the
/// server stops, exit status 0).
#[test]
fn sigint_stops_a_serving_engine_that_started_with_sigint_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let job = long_job(dir.path());
    let savepoints = dir.path().join("sp").display().to_string();
    let log = dir.path().join("engine.log");
    let mut child =
        start_with_sigint_ignored(&["--job", &job, "--savepoint-dir", &savepoints], &log);
    let address = listening(&mut child);
    let job_url = format!("http://{address}/v1/job");
    let view: serde_json::Value = reqwest::blocking::get(&job_url).unwrap().json().unwrap();
    assert_eq!(view["state"], "running", "{view}");
    kill("-INT", &child);
    let logged = exits_with_0(&mut child, &log);
    assert!(logged.contains("SIGINT"), "{logged}");
    assert!(reqwest::blocking::get(&job_url).is_err(), "still serving");
}

/// A SIGINT that arrives while the engine is still starting (here: blocked reading its job
/// file, a FIFO nobody writes) is not lost or ignored: the engine exits with status 0.
#[test]
fn sigint_while_starting_with_sigint_ignored_exits() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("job.yaml");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo");
    let log = dir.path().join("engine.log");
    let savepoints = dir.path().join("sp").display().to_string();
    let mut child = start_with_sigint_ignored(
        &[
            "--job",
            &fifo.display().to_string(),
            "--savepoint-dir",
            &savepoints,
        ],
        &log,
    );
    // Opening the FIFO for writing returns once the engine opened it to read its job: it has
    // started and waits for the text, which never comes while the writer stays open.
    let writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    kill("-INT", &child);
    exits_with_0(&mut child, &log);
    drop(writer);
}

/// SIGTERM stops a serving engine as SIGINT does (exit status 0), rather than killing it.
#[test]
fn sigterm_stops_a_serving_engine_like_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let job = long_job(dir.path());
    let savepoints = dir.path().join("sp").display().to_string();
    let log = dir.path().join("engine.log");
    let mut child = Command::new(common::engine_bin())
        .args(["--job", &job, "--savepoint-dir", &savepoints])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let address = listening(&mut child);
    kill("-TERM", &child);
    let logged = exits_with_0(&mut child, &log);
    assert!(logged.contains("SIGTERM"), "{logged}");
    assert!(
        reqwest::blocking::get(format!("http://{address}/v1/job")).is_err(),
        "still serving"
    );
}
