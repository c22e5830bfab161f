//! `streamscale run` supervises its engine, with the real engine over loopback: an engine
//! SIGKILLed twice during a run is restarted from the latest completed checkpoint each time;
//! the run completes (exit 0) with both restarts and their recovery time in `summary.json`,
//! every record accounted, and the exactly-once sink's published lines exactly the records
//! accounted (none twice, none torn). With no restart left the run fails and says so.
#![cfg(target_os = "linux")]
#![allow(missing_docs)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout};
use std::time::{Duration, Instant};

use serde_json::Value;
use streamscale_tests::fixtures::{self, summary};

/// An unbounded job with an exactly-once file sink into `out` and checkpoints every 0.3 s,
/// restarted at most `attempts` times with 0.2 s between.
fn job(attempts: u32) -> String {
    fixtures::unbounded_job(Some("out"))
        + &format!(
            "checkpoint: {{ intervalSeconds: 0.3, restart: {{ attempts: {attempts}, delaySeconds: 0.2 }} }}\n"
        )
}

/// Pid of the live engine started for this report directory (its `--savepoint-dir` lies under
/// it), waiting up to 60 s for one.
fn engine_of(report: &Path) -> u32 {
    let needle = report.display().to_string();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains("streamscale-engine") && cmdline.contains(&needle) {
                return pid;
            }
        }
        assert!(Instant::now() < until, "no engine running for {needle}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Reads stdout until a line starting with `t=` contains `what` (after `progress` more
/// progress lines when `what` is empty); returns what was read.
fn read_until(out: &mut BufReader<ChildStdout>, what: &str, seen: &mut String) {
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).expect("read stdout") == 0 {
            panic!("streamscale run ended before `{what}`:\n{seen}");
        }
        seen.push_str(&line);
        if line.starts_with("t=") && line.contains(what) {
            return;
        }
    }
}

fn start(job: &Path, report: &Path) -> (Child, BufReader<ChildStdout>) {
    let mut child = fixtures::streamscale_run_fast(job, report, &["--duration", "14"])
        .spawn()
        .expect("start streamscale run");
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    (child, out)
}

#[test]
fn an_engine_killed_twice_is_restarted_and_the_run_completes_with_every_record_once() {
    let (dir, job, report) = fixtures::job_dir(&job(3));
    let (child, mut out) = start(&job, &report);
    let mut seen = String::new();
    for kill in 0..2 {
        // Some progress (and checkpoints every 0.3 s) before each kill.
        for _ in 0..3 {
            read_until(&mut out, "in=", &mut seen);
        }
        let pid = engine_of(&report);
        fixtures::kill("-KILL", &pid.to_string());
        read_until(&mut out, "ENGINE DIED", &mut seen);
        read_until(&mut out, "RESTARTED from", &mut seen);
        assert!(
            seen.contains(&format!("(restart {} of 3)", kill + 1)),
            "{seen}"
        );
    }
    std::io::Read::read_to_string(&mut out, &mut seen).expect("rest of stdout");
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{seen}\n{stderr}");
    assert!(seen.contains("2 engine restart(s)"), "{seen}");
    let s = summary(&report);
    assert_eq!(s["failure"], Value::Null, "{s}");
    let restarts = s["restarts"].as_array().expect("restarts");
    assert_eq!(restarts.len(), 2, "{s}");
    for r in restarts {
        assert!(r["recovery_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["reason"].as_str().unwrap().contains("SIGKILL"), "{r}");
    }
    assert!(
        restarts.iter().any(|r| r["restored_from"]
            .as_str()
            .is_some_and(|p| p.contains("chk-"))),
        "a restart recovered from a checkpoint: {s}"
    );
    let recovery: f64 = restarts
        .iter()
        .map(|r| r["recovery_s"].as_f64().unwrap())
        .sum();
    assert!(
        (s["recovery_s"].as_f64().unwrap() - recovery).abs() < 1e-9,
        "{s}"
    );
    let emitted = s["records_emitted"].as_u64().expect("records_emitted");
    assert!(emitted > 0, "{s}");
    assert_eq!(s["records_accounted"].as_u64(), Some(emitted), "{s}");
    assert_eq!(s["records_lost"].as_i64(), Some(0), "{s}");
    // One published line per record accounted: none twice, none lost, none torn.
    let published = fixtures::published_output(&dir.path().join("out"));
    for line in published.lines() {
        let f: Vec<&str> = line.split(',').collect();
        assert!(
            f.len() == 3 && f.iter().all(|v| v.parse::<i64>().is_ok()),
            "torn line {line:?}"
        );
    }
    assert_eq!(published.lines().count() as u64, emitted, "{s}");
}

/// A trace-following job without checkpoints, killed before any savepoint: the engine is
/// restarted from the beginning and replays its trace from the start, and the report's trace
/// time starts over with it instead of running on with the wall clock.
#[test]
fn a_restart_from_the_beginning_starts_the_trace_time_over() {
    let text = fixtures::unbounded_job(None).replace(
        "rate: { constant: 300 }",
        "rate: { trace: { file: trace.csv, speedup: 10 } }",
    );
    assert!(text.contains("trace.csv"), "{text}");
    let (dir, job, report) = fixtures::job_dir(&text);
    std::fs::write(
        dir.path().join("trace.csv"),
        "t_seconds,rate\n0,200\n10000,200\n",
    )
    .expect("trace");
    let (child, mut out) = start(&job, &report);
    let mut seen = String::new();
    for _ in 0..4 {
        read_until(&mut out, "in=", &mut seen);
    }
    let pid = engine_of(&report);
    fixtures::kill("-KILL", &pid.to_string());
    read_until(&mut out, "RESTARTED from the beginning", &mut seen);
    std::io::Read::read_to_string(&mut out, &mut seen).expect("rest of stdout");
    let output = child.wait_with_output().expect("wait");
    assert_eq!(output.status.code(), Some(0), "{seen}");
    let s = summary(&report);
    let died_s = s["restarts"][0]["at_s"].as_f64().expect("a restart");
    let timeline = std::fs::read_to_string(report.join("timeline.csv")).expect("timeline.csv");
    let rows: Vec<(f64, f64)> = timeline
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split(',');
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect();
    let last = rows.last().expect("rows");
    // 10 trace-seconds per second: the last row's trace time is what the restarted engine
    // replayed (its wall seconds since the restart × 10), not the whole run's wall time × 10.
    assert!(
        last.1 < (last.0 - died_s) * 10.0 + 15.0 && last.1 < last.0 * 10.0 - 15.0,
        "last row t={} trace={} after a restart at {died_s} s:\n{timeline}",
        last.0,
        last.1
    );
}

#[test]
fn with_no_restart_left_the_run_fails_and_says_why() {
    let (_dir, job, report) = fixtures::job_dir(&job(0));
    let (child, mut out) = start(&job, &report);
    let mut seen = String::new();
    read_until(&mut out, "in=", &mut seen);
    fixtures::kill("-KILL", &engine_of(&report).to_string());
    std::io::Read::read_to_string(&mut out, &mut seen).expect("rest of stdout");
    let output = child.wait_with_output().expect("wait");
    assert_eq!(output.status.code(), Some(1), "{seen}");
    let s = summary(&report);
    let failure = s["failure"].as_str().expect("failure");
    assert!(
        failure.contains("SIGKILL") && failure.contains("no restart left"),
        "{failure}"
    );
    assert_eq!(s["restarts"].as_array().map(Vec::len), Some(0), "{s}");
}
