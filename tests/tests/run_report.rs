//! `streamscale run`'s report directory with the real engine over loopback: a run that fails
//! before its engine runs leaves an earlier report exactly as it was (nothing lost, nothing
//! mixed), and the run's totals cover the whole run, the last partial interval and the final
//! draining stop included.
#![cfg(target_os = "linux")]
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Duration;

use streamscale_tests::fixtures::{self, summary};

/// Every file below `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).expect("below dir").to_path_buf();
                files.insert(rel, std::fs::read(&path).expect("read"));
            }
        }
    }
    files
}

/// Directories `NAME.starting-*` beside the report directory `NAME`.
fn staging_dirs(report: &Path) -> Vec<PathBuf> {
    let name = report
        .file_name()
        .expect("name")
        .to_string_lossy()
        .to_string();
    let parent = report.parent().expect("parent");
    std::fs::read_dir(parent)
        .expect("read_dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy()
                    .starts_with(&format!("{name}.starting-"))
            })
        })
        .collect()
}

/// A two-second run of `job` into `report` (`extra` arguments after the others); checks its
/// exit status and returns its stderr.
fn run_2s_with(job: &Path, report: &Path, extra: &[&str], code: i32) -> String {
    let out = fixtures::streamscale_run_fast(job, report, &[&["--duration", "2"], extra].concat())
        .output()
        .expect("streamscale run");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(code), "{out:?}");
    stderr
}

/// A two-second run of `job` into `report`; checks its exit status and returns its stderr.
fn run_2s(job: &Path, report: &Path, code: i32) -> String {
    run_2s_with(job, report, &[], code)
}

/// An executable script `dir/NAME` that answers `--version` as the engine does and otherwise
/// exits at once with status 1 after an `ERROR` line on stderr: an engine that fails on
/// start-up, after the run has checked everything it can check up front.
fn engine_that_exits_at_once(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = fixtures::write(
        dir,
        "failing-engine.sh",
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'streamscale-engine 0.0.0'; exit 0; fi\necho 'ERROR failing-engine: cannot start' >&2\nexit 1\n",
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

#[test]
fn a_run_that_cannot_start_leaves_the_earlier_report_as_it_was() {
    let (dir, job, report) = fixtures::job_dir(&fixtures::unbounded_job(None));
    run_2s(&job, &report, 0);
    let before = snapshot(&report);
    for f in [
        "summary.json",
        "timeline.csv",
        "job.yaml",
        "logs/engine-1.log",
    ] {
        assert!(before.contains_key(Path::new(f)), "{f} missing: {before:?}");
    }

    // A run that cannot start once its staging began: its engine exits at once (bad job
    // files, options and report directories are refused before anything is staged). One
    // line says so, with the engine's exit status and its last error line.
    let engine = engine_that_exits_at_once(dir.path());
    let engine = engine.to_str().expect("UTF-8 path");
    let before = snapshot(&report);
    let stderr = run_2s_with(&job, &report, &["--engine", engine], 1);
    // (Beside the warning that the directory holds an earlier report.)
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("warning: "))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].starts_with(
            "streamscale: the engine exited before serving metrics (exit code 1): ERROR failing-engine: cannot start"
        ),
        "{stderr}"
    );
    assert!(errors[0].contains("was left as it was"), "{stderr}");
    assert!(
        snapshot(&report) == before,
        "the earlier report changed: {stderr}"
    );
    // This attempt's job file is kept beside it, and named.
    let kept = staging_dirs(&report);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(stderr.contains(&kept[0].display().to_string()), "{stderr}");
    assert!(kept[0].join("job.yaml").is_file());

    // A job that fails validation after its overrides (its trace window lies outside the
    // trace): exit 2, nothing written at all.
    fixtures::write(dir.path(), "trace.csv", "t_seconds,rate\n1000,5\n1060,6\n");
    let outside = fixtures::write(
        dir.path(),
        "outside.yaml",
        &fixtures::unbounded_job(None).replace(
            "rate: { constant: 300 }",
            "rate: { trace: { file: trace.csv, startSeconds: 100, endSeconds: 700 } }",
        ),
    );
    let stderr = run_2s(&outside, &report, 2);
    assert!(stderr.contains("outside the trace"), "{stderr}");
    assert!(snapshot(&report) == before, "the earlier report changed");
    assert_eq!(staging_dirs(&report).len(), 1, "nothing new beside it");

    // A run that starts replaces the report as a whole.
    run_2s(&job, &report, 0);
    let after = snapshot(&report);
    assert_ne!(
        after[Path::new("summary.json")],
        before[Path::new("summary.json")]
    );
    assert_ne!(
        after[Path::new("logs/engine-1.log")],
        before[Path::new("logs/engine-1.log")]
    );
    assert_eq!(
        staging_dirs(&report).len(),
        1,
        "the started run left nothing beside it"
    );
}

#[test]
fn a_run_into_a_new_report_directory_that_cannot_start_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixtures::write(dir.path(), "afile", "not a directory");
    let bad = fixtures::write(
        dir.path(),
        "bad.yaml",
        &fixtures::with_checkpoints(&fixtures::unbounded_job(Some("afile/results.csv"))),
    );
    let report = dir.path().join("report");
    // Refused when the job file is read (its sink's output lies under a regular file).
    let stderr = run_2s(&bad, &report, 2);
    assert!(stderr.contains("(sink).output"), "{stderr}");
    assert!(!report.exists(), "{stderr}");
    assert!(staging_dirs(&report).is_empty(), "{stderr}");
}

#[test]
fn a_run_into_an_empty_report_directory_that_cannot_start_leaves_it_empty() {
    // The old code said "report was left as it was" and left a `savepoints` directory in it.
    let (dir, job, report) = fixtures::job_dir(&fixtures::unbounded_job(None));
    std::fs::create_dir(&report).expect("mkdir report");
    let engine = engine_that_exits_at_once(dir.path());
    let engine = engine.to_str().expect("UTF-8 path");
    let stderr = run_2s_with(&job, &report, &["--engine", engine], 1);
    assert!(stderr.contains("was left as it was"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(&report)
        .expect("list report")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}: {stderr}");
}

#[test]
fn a_run_into_a_new_report_directory_whose_engine_exits_leaves_no_lock_file() {
    // The old code left `.report.lock` beside a `report` it never created.
    let (dir, job, report) = fixtures::job_dir(&fixtures::unbounded_job(None));
    let engine = engine_that_exits_at_once(dir.path());
    let before = names_in(dir.path());
    let engine = engine.to_str().expect("UTF-8 path");
    let stderr = run_2s_with(&job, &report, &["--engine", engine], 1);
    assert!(!report.exists(), "{stderr}");
    // Besides what was there, only the attempt's kept job file and engine log.
    let added: Vec<_> = names_in(dir.path())
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    let kept: Vec<_> = staging_dirs(&report)
        .iter()
        .filter_map(|p| p.file_name().map(std::ffi::OsStr::to_os_string))
        .collect();
    assert_eq!(added, kept, "{stderr}");
    assert_eq!(added.len(), 1, "{stderr}");
}

/// The names of the entries of `dir`, sorted.
fn names_in(dir: &Path) -> Vec<std::ffi::OsString> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .expect("list dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    names
}

#[test]
fn the_totals_cover_the_last_partial_interval_and_the_final_stop() {
    let (_dir, job, report) = fixtures::job_dir(&fixtures::unbounded_job(None));
    // Long intervals, interrupted in the middle of the second one.
    let mut child = fixtures::streamscale_run(
        &job,
        &report,
        &[
            "--interval",
            "3",
            "--window",
            "6",
            "--duration",
            "120",
            "--no-autoscale",
        ],
    )
    .spawn()
    .expect("start streamscale run");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    fixtures::read_progress(&mut out, 1);
    // A second run into the same report directory is refused while this one runs.
    let stderr = run_2s(&job, &report, 2);
    assert!(
        stderr.contains("is in use by another streamscale run"),
        "{stderr}"
    );
    std::thread::sleep(Duration::from_millis(1500));
    fixtures::kill("-INT", &child.id().to_string());
    let output = child.wait_with_output().expect("wait");
    assert_eq!(output.status.code(), Some(130), "{output:?}");
    let s = summary(&report);
    let duration = s["duration_s"].as_f64().expect("duration_s");
    let cost = s["parallelism_seconds"]
        .as_f64()
        .expect("parallelism_seconds");
    // Three subtasks (source, work, sink) throughout: the cost is 3 × the run's length, but
    // for the moment between the engine's start and the first scrape.
    assert!(
        (cost - 3.0 * duration).abs() < 3.0 * 0.5,
        "{cost} subtask·s over {duration} s: {s}"
    );
    assert!(
        (s["mean_parallelism"].as_f64().expect("mean") - 3.0).abs() < 1e-9,
        "{s}"
    );
}

#[test]
fn an_operator_overloaded_at_its_max_is_reported_and_the_unemitted_backlog_is_counted() {
    // `work` takes at most ~500 records/s (2 ms of CPU each) and may not scale past 1; the
    // source offers 1500 records/s, a constant rate with no end to drain towards.
    let job = "name: capped
operators:
  - { name: source, kind: source, keys: 100, rate: { constant: 1500 } }
  - { name: work, kind: map, cpu: 2000, scaling: { max: 1 } }
  - { name: sink, kind: sink }
edges:
  - { from: source, to: work }
  - { from: work, to: sink }
";
    let (_dir, job, report) = fixtures::job_dir(job);
    let out = fixtures::streamscale_run_fast(&job, &report, &["--duration", "6"])
        .output()
        .expect("streamscale run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let at_limit: Vec<&str> = stdout.lines().filter(|l| l.contains("AT LIMIT")).collect();
    assert_eq!(at_limit.len(), 1, "said once, when it starts:\n{stdout}");
    assert!(at_limit[0].contains("work=1 (its max)"), "{stdout}");
    assert!(at_limit[0].contains("scaling.max"), "{stdout}");
    let s = summary(&report);
    let backlog = s["source_backlog_at_end"]
        .as_f64()
        .expect("source_backlog_at_end");
    // ~1000 records/s more than `work` takes for most of 6 s.
    assert!(backlog > 1000.0, "{s}");
    assert!(
        stdout.contains(&format!(
            "sources' backlog at the end: {backlog:.0} records were due but not emitted"
        )),
        "{stdout}"
    );
}

#[test]
fn a_bounded_job_whose_sources_reach_their_count_at_the_end_finishes_without_a_savepoint() {
    // 3000 records at 1000 records/s: the source reaches its count as the 3 s run ends. Once
    // it has, the engine injects no barrier, so the final stop-with-savepoint failed (exit 1,
    // `a source already reached its record count; no barrier can be injected`, 3 of 3 runs
    // of the old code) with the records in flight unaccounted; now the run waits for the
    // job to finish and reads its totals (4 of 4).
    let job = "name: counted
operators:
  - { name: source, kind: source, keys: 10, count: 3000, rate: { constant: 1000 } }
  - { name: work, kind: map }
  - { name: sink, kind: sink }
edges:
  - { from: source, to: work }
  - { from: work, to: sink }
";
    let (_dir, job, report) = fixtures::job_dir(job);
    let out = fixtures::streamscale_run(&job, &report, &["--duration", "3s"])
        .output()
        .expect("streamscale run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout.contains("job finished"), "{stdout}");
    let s = summary(&report);
    assert_eq!(s["records_emitted"], 3000, "{s}");
    assert_eq!(s["records_accounted"], 3000, "{s}");
    assert!(s["failure"].is_null(), "{s}");
}

/// The savepoint directories (`sp-*`) in `REPORT/savepoints`, sorted.
fn savepoint_dirs(report: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(report.join("savepoints"))
        .expect("read savepoints")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("sp-"))
        })
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn only_the_newest_savepoints_are_kept_and_never_the_final_one_removed() {
    let (_dir, job, report) = fixtures::job_dir(&fixtures::unbounded_job(None));
    let run = |extra: &[&str]| {
        let out =
            fixtures::streamscale_run_fast(&job, &report, &[&["--duration", "2"], extra].concat())
                .output()
                .expect("streamscale run");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{out:?}");
        stdout
    };
    // Each run ends with a draining savepoint: three runs leave three with the default.
    for _ in 0..3 {
        let stdout = run(&[]);
        assert!(!stdout.contains("savepoints: "), "{stdout}");
    }
    assert_eq!(savepoint_dirs(&report).len(), 3);
    // A user's file among them is not a savepoint and stays.
    std::fs::write(report.join("savepoints").join("notes.txt"), "mine").expect("write");
    // Nor is another job's savepoint (older than all of this job's): one report directory may
    // serve several jobs.
    let other = report.join("savepoints").join("sp-other-1");
    std::fs::create_dir(&other).expect("mkdir");
    std::fs::write(
        other.join("_metadata.json"),
        r#"{"format_version": 1, "job_name": "other", "created_unix_ms": 1}"#,
    )
    .expect("write");
    let stdout = run(&["--keep-savepoints", "2"]);
    assert!(
        stdout.contains("savepoints: 2 older one(s) of job `forever` removed from ")
            && stdout.contains("the newest 2 kept (--keep-savepoints)"),
        "{stdout}"
    );
    // The closing line names the final savepoint (in the report directory as given).
    let done = stdout
        .lines()
        .find(|l| l.starts_with("done in "))
        .unwrap_or_else(|| panic!("no done line:\n{stdout}"));
    assert!(other.join("_metadata.json").is_file());
    let kept: Vec<PathBuf> = savepoint_dirs(&report)
        .into_iter()
        .filter(|d| *d != other)
        .collect();
    assert_eq!(kept.len(), 2, "{kept:?}");
    let final_savepoint = summary(&report)["final_savepoint"]
        .as_str()
        .expect("final_savepoint")
        .to_string();
    let final_savepoint = Path::new(&final_savepoint)
        .canonicalize()
        .expect("the final savepoint exists");
    assert!(
        kept.iter()
            .any(|k| k.canonicalize().is_ok_and(|k| k == final_savepoint)),
        "{final_savepoint:?} not in {kept:?}"
    );
    let (_, named) = done
        .split_once(", final savepoint ")
        .unwrap_or_else(|| panic!("no final savepoint named: {done}"));
    assert!(
        named.starts_with(&report.join("savepoints").display().to_string()),
        "{done}"
    );
    assert_eq!(
        Path::new(named).canonicalize().ok(),
        Some(final_savepoint.clone()),
        "{done}"
    );
    assert!(report.join("savepoints").join("notes.txt").is_file());
    // Zero would remove the savepoint the job runs from: refused before anything starts.
    let out = fixtures::streamscale_run_fast(
        &job,
        &report,
        &["--duration", "2", "--keep-savepoints", "0"],
    )
    .output()
    .expect("streamscale run");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--keep-savepoints: must be at least 1"),
        "{out:?}"
    );
    assert_eq!(savepoint_dirs(&report).len(), 3);
}
