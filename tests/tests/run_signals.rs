//! `streamscale run` end to end with the real engine over loopback, for how a run ends: a
//! terminal's Ctrl-C (SIGINT to the whole process group) stops it with a draining savepoint
//! and every record accounted, also when it comes as a rescale starts or ends; a controller
//! killed outright takes its engine with it; a second Ctrl-C during the final drain still
//! reports a final savepoint that had completed; a job
//! whose sources have a record count stops once it has finished instead of running out the
//! duration.
#![cfg(target_os = "linux")]
#![allow(missing_docs)]

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::Value;
use streamscale_tests::fixtures::{self, summary};

/// Starts `streamscale run JOB --report REPORT ARGS` as the leader of a new process group (as
/// a shell does for a foreground job), stdout piped.
fn start(job: &Path, report: &Path, args: &[&str]) -> Child {
    fixtures::streamscale_run_fast(job, report, args)
        .process_group(0)
        .spawn()
        .expect("start streamscale run")
}

/// Reads stdout until `n` progress lines have been printed; returns what was read.
fn wait_for_progress(
    child: &mut Child,
    n: usize,
) -> (String, BufReader<std::process::ChildStdout>) {
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let seen = fixtures::read_progress(&mut out, n);
    (seen, out)
}

/// Pids of live engine processes started for this report directory (their `--savepoint-dir`
/// lies under it).
fn engines_of(report: &Path) -> Vec<u32> {
    let needle = report.display().to_string();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        // A zombie has an empty command line; it is no longer running.
        if cmdline.contains("streamscale-engine") && cmdline.contains(&needle) {
            pids.push(pid);
        }
    }
    pids
}

fn wait_until_no_engine(report: &Path) -> Vec<u32> {
    // A deadline for an engine that stays only (a loaded machine can delay a prompt exit).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = engines_of(report);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends a terminal's Ctrl-C (SIGINT to every process of the foreground group) to the run
/// `child` whose stdout so far is `seen` (rest in `out`), and checks that it stopped with a
/// draining savepoint: exit 130, every record accounted, no engine left. Returns the summary.
fn ctrl_c_drains(
    child: std::process::Child,
    mut out: BufReader<std::process::ChildStdout>,
    mut seen: String,
    report: &Path,
) -> Value {
    fixtures::kill("-INT", &format!("-{}", child.id()));
    std::io::Read::read_to_string(&mut out, &mut seen).expect("rest of stdout");
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(130),
        "exit like a shell after SIGINT\n{seen}\n{stderr}"
    );
    assert!(seen.contains("interrupted (SIGINT)"), "{seen}");
    let s = summary(report);
    assert_eq!(s["interrupted"], Value::Bool(true), "{s}");
    assert_eq!(s["failure"], Value::Null, "{s}");
    let emitted = s["records_emitted"].as_u64().expect("records_emitted");
    assert!(emitted > 0, "{s}");
    assert_eq!(s["records_accounted"].as_u64(), Some(emitted), "{s}");
    assert_eq!(s["records_lost"].as_i64(), Some(0), "{s}");
    assert!(s["final_savepoint"].is_string(), "{s}");
    assert_eq!(
        wait_until_no_engine(report),
        Vec::<u32>::new(),
        "engine left running"
    );
    s
}

#[test]
fn ctrl_c_to_the_process_group_drains_and_leaves_no_engine() {
    let (_dir, job, report) = fixtures::job_dir(&fixtures::unbounded_job(None));
    let mut child = start(&job, &report, &["--duration", "120"]);
    let (seen, out) = wait_for_progress(&mut child, 4);
    assert_eq!(engines_of(&report).len(), 1, "one engine running");
    ctrl_c_drains(child, out, seen, &report);
}

#[test]
fn a_killed_controller_takes_its_engine_with_it() {
    let (_dir, job, report) = fixtures::job_dir(&fixtures::unbounded_job(None));
    let mut child = start(&job, &report, &["--duration", "120"]);
    let _ = wait_for_progress(&mut child, 2);
    assert_eq!(engines_of(&report).len(), 1, "one engine running");
    // SIGKILL cannot be handled: the engine must notice on its own (its stdin closes).
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    assert_eq!(
        wait_until_no_engine(&report),
        Vec::<u32>::new(),
        "orphaned engine"
    );
}

#[test]
fn a_bounded_job_stops_when_it_has_finished() {
    let (_dir, job, report) = fixtures::job_dir(&fixtures::bounded_job());
    let child = start(&job, &report, &["--duration", "120"]);
    let output = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("job finished"), "{stdout}");
    let s = summary(&report);
    assert_eq!(s["interrupted"], Value::Bool(false), "{s}");
    assert_eq!(s["records_emitted"].as_u64(), Some(1500), "{s}");
    assert_eq!(s["records_accounted"].as_u64(), Some(1500), "{s}");
    // 1500 records at 500 rec/s take about 3 s; the run stops then, not at --duration 120.
    let duration = s["duration_s"].as_f64().expect("duration_s");
    assert!(duration < 120.0, "ran out the duration: {s}");
    assert_eq!(
        wait_until_no_engine(&report),
        Vec::<u32>::new(),
        "engine left running"
    );
}

/// A job that must scale up at once: 300 records/s into a `map` that waits 10 ms per record
/// (about 100 records/s per subtask), so a rescale comes within the first seconds.
fn rescaling_job() -> String {
    fixtures::pipeline("rescaling", "keys: 100, rate: { constant: 300 }", 0, "")
        .replace("kind: map, cpu: 0", "kind: map, io: 10000")
}

/// Reads stdout until a line containing `marker` has been printed; returns what was read.
fn read_until(out: &mut impl BufRead, marker: &str) -> String {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).expect("read stdout") == 0 {
            panic!("streamscale run ended before {marker:?}:\n{seen}");
        }
        seen.push_str(&line);
        if line.contains(marker) {
            return seen;
        }
    }
}

/// Ctrl-C the moment the line `marker` prints: the run must still stop with a draining
/// savepoint, exit 130, account for every record and leave no engine.
fn ctrl_c_at(marker: &str) {
    let (_dir, job, report) = fixtures::job_dir(&rescaling_job());
    let mut child = start(&job, &report, &["--duration", "120"]);
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let seen = read_until(&mut out, marker);
    let s = ctrl_c_drains(child, out, seen, &report);
    // Stopped by the signal, not by running out the 120 s.
    let duration = s["duration_s"].as_f64().expect("duration_s");
    assert!(duration < 60.0, "ran on after SIGINT: {s}");
}

#[test]
fn ctrl_c_as_a_rescale_starts_still_drains() {
    ctrl_c_at(" RESCALE ");
}

#[test]
fn ctrl_c_as_a_rescale_ends_still_drains() {
    ctrl_c_at(" RESCALED ");
}

/// The `sp-*` directories of the run's savepoint directory with a `_metadata.json` (the
/// engine writes it last and renames the directory into place only when complete).
fn completed_savepoints(report: &Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(report.join("savepoints"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("sp-"))
                        && p.join("_metadata.json").is_file()
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// A second Ctrl-C during the final drain kills the engine; a final savepoint that had
/// completed by then is still the run's `final_savepoint` (as Flink's stop-with-savepoint: a
/// completed savepoint is a savepoint), and `failure` says the engine was killed after it
/// completed. The second signal is sent as soon as the savepoint's metadata appears, while the
/// controller is still waiting for the engine's answer (it polls every 100 ms); if the race
/// lands the other way (the run ended first, or the savepoint was not complete) the report
/// must say so honestly.
#[test]
fn a_second_ctrl_c_after_the_final_savepoint_completed_still_reports_it() {
    let (_dir, job, report) = fixtures::job_dir(&fixtures::unbounded_job(None));
    let mut child = start(&job, &report, &["--duration", "120"]);
    let (mut seen, mut out) = wait_for_progress(&mut child, 4);
    let before = completed_savepoints(&report);
    let group = format!("-{}", child.id());
    fixtures::kill("-INT", &group);
    // Send the second SIGINT the moment a new savepoint is complete (or after 30 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut second_sent = false;
    while Instant::now() < deadline {
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        if completed_savepoints(&report).len() > before.len() {
            // The group may be gone by now if the run just ended: that is the other outcome.
            second_sent = std::process::Command::new("kill")
                .args(["-INT", "--", &group])
                .status()
                .is_ok_and(|s| s.success());
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::io::Read::read_to_string(&mut out, &mut seen).expect("rest of stdout");
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let s = summary(&report);
    assert_eq!(s["interrupted"], Value::Bool(true), "{s}");
    let new: Vec<_> = completed_savepoints(&report)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert!(new.len() <= 1, "one final savepoint at most: {new:?}");
    if seen.contains("interrupted again") {
        // The engine was killed: exit 1 as the README says, `failure` names what happened.
        assert!(second_sent, "{seen}");
        assert_eq!(output.status.code(), Some(1), "{seen}\n{stderr}");
        let failure = s["failure"].as_str().expect("failure");
        match new.first() {
            Some(sp) => {
                let path = sp.display().to_string();
                assert_eq!(s["final_savepoint"].as_str(), Some(path.as_str()), "{s}");
                assert!(
                    failure.contains("after its final savepoint") && failure.contains(&path),
                    "{failure}"
                );
                assert!(seen.contains(&format!("final savepoint {path}")), "{seen}");
            }
            None => {
                assert_eq!(s["final_savepoint"], Value::Null, "{s}");
                assert!(
                    failure.contains("killed during the final savepoint"),
                    "{failure}"
                );
            }
        }
    } else {
        // The controller had its answer first: an ordinary drained stop.
        assert_eq!(output.status.code(), Some(130), "{seen}\n{stderr}");
        assert_eq!(s["failure"], Value::Null, "{s}");
        let path = new
            .first()
            .expect("the final savepoint")
            .display()
            .to_string();
        assert_eq!(s["final_savepoint"].as_str(), Some(path.as_str()), "{s}");
    }
    assert_eq!(
        seen.matches("stopping with a draining savepoint").count(),
        1,
        "said once\n{seen}"
    );
    assert_eq!(
        wait_until_no_engine(&report),
        Vec::<u32>::new(),
        "engine left running"
    );
}
