//! `streamscale run` as a user meets it, with the real engine over loopback: a terminal that
//! goes away (stdout closed, then SIGHUP) still gets the draining savepoint and the full
//! report instead of a panic, and a second run into the same report directory says that it
//! replaces the earlier report.
#![cfg(target_os = "linux")]
#![allow(missing_docs)]

use std::io::BufReader;
use std::time::{Duration, Instant};

use streamscale_tests::fixtures;

#[test]
fn sighup_after_stdout_closed_drains_and_writes_the_report() {
    let (dir, job, report) = fixtures::job_dir(&fixtures::with_checkpoints(
        &fixtures::unbounded_job(Some("out/results")),
    ));
    // Run from another directory: the sink's relative output is next to the job file, in a
    // directory the engine creates.
    let mut child = fixtures::streamscale_run_fast(&job, &report, &["--duration", "120"])
        .current_dir(std::env::temp_dir())
        .spawn()
        .expect("start streamscale run");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    fixtures::read_progress(&mut out, 2);
    // The terminal goes away: its end of stdout closes, then the hangup arrives.
    drop(out);
    std::thread::sleep(Duration::from_millis(1200));
    fixtures::kill("-HUP", &child.id().to_string());
    let deadline = Instant::now() + Duration::from_secs(90);
    let code = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s.code();
        }
        assert!(Instant::now() < deadline, "streamscale run did not stop");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(code, Some(129), "exit like a shell after SIGHUP: {stderr}");
    assert!(
        stderr.contains("standard output closed"),
        "the closed stdout is reported once on stderr: {stderr}"
    );
    let summary = fixtures::summary(&report);
    assert_eq!(summary["interrupted"], true, "{summary}");
    assert_eq!(summary["records_lost"], 0, "{summary}");
    // The final savepoint published the sink's part files next to the job file.
    let results = fixtures::published_output(&dir.path().join("out/results"));
    assert!(!results.is_empty());
    assert!(
        results.lines().all(|l| l.split(',').count() == 3),
        "{results}"
    );
}

#[test]
fn a_second_run_into_the_same_report_directory_warns_that_it_replaces_it() {
    let (_dir, job, report) = fixtures::job_dir(&fixtures::with_checkpoints(
        &fixtures::unbounded_job(Some("results")),
    ));
    let first = fixtures::streamscale_run_fast(&job, &report, &["--duration", "2"])
        .output()
        .expect("first run");
    assert!(first.status.success(), "{first:?}");
    let text = String::from_utf8_lossy(&first.stderr);
    assert!(!text.contains("warning:"), "{text}");
    let second = fixtures::streamscale_run_fast(&job, &report, &["--duration", "2"])
        .output()
        .expect("second run");
    assert!(second.status.success(), "{second:?}");
    // Warnings go to stderr; stdout holds the run's lines and results only.
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert!(!stdout.contains("warning"), "{stdout}");
    let text = String::from_utf8_lossy(&second.stderr);
    let first_line = text.lines().next().unwrap_or_default();
    assert!(
        first_line.starts_with(&format!(
            "warning: {} holds the report of an earlier run (summary.json",
            report.display()
        )),
        "{text}"
    );
}
