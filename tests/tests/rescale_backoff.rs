//! Issue 22, case 8: a parallelism the engine can never start. `streamscale run` retried it
//! every few seconds (11 failures a minute); it now backs off exponentially after each failure
//! in a row and says so, naming the parallelism that failed.
#![allow(missing_docs)]

use std::path::{Path, PathBuf};

use streamscale_tests::{fixtures, workspace_bin};

/// One source at 200 rec/s into a map that sleeps 10 ms a record: p = 1 takes 100 rec/s, so
/// the planner wants work at 3 or more at once.
const JOB: &str = "name: backoff
maxParallelism: 16
operators:
  - { name: source, kind: source, keys: 100, rate: { constant: 200 } }
  - { name: work, kind: map, io: 10000 }
  - { name: sink, kind: sink }
edges:
  - { from: source, to: work }
  - { from: work, to: sink }
autoscaler: { targetUtilization: 0.7, latencySloSeconds: 1.0 }
";

/// An executable wrapper of the real engine that fails to start (exit 1, an `ERROR` line)
/// whenever it is asked to restore at a parallelism other than the job's first one
/// (`source=1,sink=1,work=1`); the rollback to that one starts.
fn engine_failing_new_parallelisms(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let real = workspace_bin("streamscale-engine");
    let script = format!(
        "#!/bin/sh\ncase \"$*\" in\n  *--restore*)\n    case \"$*\" in\n      *'--parallelism sink=1,source=1,work=1 '*) ;;\n      *) echo 'ERROR wrapper: cannot start at this parallelism' >&2; exit 1 ;;\n    esac ;;\nesac\nexec '{}' \"$@\"\n",
        real.display()
    );
    let path = fixtures::write(dir, "engine.sh", &script);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

#[test]
fn a_parallelism_that_never_starts_is_retried_with_exponential_backoff() {
    let (dir, job, report) = fixtures::job_dir(JOB);
    let engine = engine_failing_new_parallelisms(dir.path());
    let out = fixtures::streamscale_run_fast(
        &job,
        &report,
        &[
            "--engine",
            engine.to_str().expect("UTF-8 path"),
            "--duration",
            "36",
        ],
    )
    .output()
    .expect("run streamscale");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let summary = fixtures::summary(&report);
    let failed: Vec<f64> = summary["failed_rescales"]
        .as_array()
        .expect("failed_rescales")
        .iter()
        .map(|r| r["at_s"].as_f64().expect("at_s"))
        .collect();
    assert!(
        failed.len() >= 2,
        "two failures at least: {failed:?}\n{stdout}"
    );
    // The n-th failure in a row holds the next attempt back 10·2^(n−1) s (from when the
    // failed attempt ended, after its start).
    for (n, pair) in failed.windows(2).enumerate() {
        let wait = 10.0 * 2f64.powi(n as i32);
        assert!(
            pair[1] - pair[0] >= wait,
            "attempt {} came {:.1} s after the one before, backoff {wait} s: {failed:?}\n{stdout}",
            n + 2,
            pair[1] - pair[0]
        );
    }
    assert!(stdout.contains("BACKOFF work 1→"), "{stdout}");
    assert!(
        stdout.contains("failed (2 in a row): no rescale for 20.0s"),
        "{stdout}"
    );
    assert!(
        stdout.contains("RESCALE HELD work 1→") && stdout.contains("this parallelism failed"),
        "{stdout}"
    );
}
