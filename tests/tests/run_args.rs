//! `streamscale run` and `streamscale plan` refusing bad input as a user meets it, with the
//! real binaries: exit status 2, one message naming the option, file or field and the reason,
//! and nothing written.
#![allow(missing_docs)]

use std::path::Path;
use std::process::{Command, Output};

use streamscale_tests::fixtures;
use streamscale_tests::workspace_bin;

fn streamscale(dir: &Path, args: &[&str]) -> Output {
    Command::new(workspace_bin("streamscale"))
        .current_dir(dir)
        .args(args)
        .env(
            "STREAMSCALE_ENGINE_BIN",
            workspace_bin("streamscale-engine"),
        )
        .output()
        .expect("run streamscale")
}

/// Exit status 2 and a stderr holding every one of `needles`.
fn assert_refused(out: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "`{n}` missing in: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn a_bad_number_in_the_job_names_the_field_and_the_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = fixtures::unbounded_job(None);
    let cases = [
        (
            job.replace("cpu: 100", "cpu: \"ten\""),
            "operators[1] (work).cpu: expected a number, got \"ten\"",
        ),
        (
            job.replace("cpu: 100", "cpu: ten"),
            "operators[1] (work).cpu: expected a number, got \"ten\"",
        ),
        (
            job.replace("cpu: 100", "cpu: .nan"),
            "operators[1] (work).cpu: NaN is not allowed, it must be a finite number",
        ),
        (
            job.replace("constant: 300", "constant: .nan"),
            "operators[0] (source).rate.constant: .nan is not allowed, it must be a finite number",
        ),
        (
            job.replace("maxParallelism: 16", "maxParallelism: lots"),
            "maxParallelism: expected a whole number >= 0, got \"lots\"",
        ),
    ];
    for (text, want) in cases {
        fixtures::write(dir.path(), "job.yaml", &text);
        let out = streamscale(dir.path(), &["run", "job.yaml", "--report", "report"]);
        let stderr = assert_refused(&out, &["job.yaml", want]);
        assert!(!stderr.contains("configured policy"), "{stderr}");
        assert!(!dir.path().join("report").exists(), "{stderr}");
    }
}

/// `streamscale run job.yaml ARGS` in a new directory holding the unbounded job; returns the
/// directory and what the run wrote to stderr, after checking that it was refused (exit 2)
/// with every one of `needles` and created no report.
fn refused_run(args: &[&str], needles: &[&str]) -> (tempfile::TempDir, String) {
    let (dir, _, report) = fixtures::job_dir(&fixtures::unbounded_job(None));
    let out = streamscale(dir.path(), &[&["run", "job.yaml"][..], args].concat());
    let stderr = assert_refused(&out, needles);
    assert!(!report.exists(), "{stderr}");
    (dir, stderr)
}

#[test]
fn a_report_path_that_is_a_file_is_refused_and_left_alone() {
    let (dir, _) = refused_run(
        &["--report", "job.yaml"],
        &["--report", "job.yaml", "is not a directory"],
    );
    refused_run(
        &["--report", "job.yaml/sub"],
        &["--report", "job.yaml/sub", "job.yaml is not a directory"],
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("job.yaml")).expect("still there"),
        fixtures::unbounded_job(None)
    );
}

#[test]
fn an_absurd_duration_is_refused() {
    for d in ["1e300h", "8761h"] {
        refused_run(
            &["--report", "report", "--duration", d],
            &["--duration", d, "longer than a year"],
        );
    }
    refused_run(
        &["--report", "report", "--duration", "400d"],
        &["--duration", "not a duration"],
    );
    // One `streamscale: --duration:` line like the other options (was clap's three-line
    // usage error).
    let (_, stderr) = refused_run(
        &["--report", "report", "--duration", "0s"],
        &["streamscale: --duration: must be > 0 (got 0s)"],
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // A negative value with a unit is the option's value, not another option (clap took
    // `-5s` for a flag: `unexpected argument '-5'`, without naming --duration).
    let (_, stderr) = refused_run(
        &["--report", "report", "--duration", "-5s"],
        &["streamscale: --duration: must be > 0 (got -5s)"],
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // A trace replayed absurdly fast or scaled absurdly high (a backlog of 18446744073709545472
    // records, a trace position of 307445734561825860 h were printed).
    for (flag, v) in [("--scale", "1e300"), ("--speedup", "1e300")] {
        let (_, stderr) = refused_run(
            &["--report", "report", flag, v],
            &[&format!("streamscale: {flag}: 1e300 is above the limit")],
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
    // Other seconds options too (a timer cannot even hold 1e300 s).
    refused_run(
        &[
            "--report",
            "report",
            "--interval",
            "1e300",
            "--window",
            "1e301",
        ],
        &["--interval", "longer than a year"],
    );
}

#[test]
fn a_missing_engine_binary_is_refused() {
    refused_run(
        &["--report", "report", "--engine", "no-such-engine"],
        &["--engine", "no-such-engine", "does not exist"],
    );
}

#[test]
fn a_missing_engine_binary_in_the_environment_is_refused_like_the_flag() {
    let (dir, _, report) = fixtures::job_dir(&fixtures::unbounded_job(None));
    let out = Command::new(workspace_bin("streamscale"))
        .current_dir(dir.path())
        .args(["run", "job.yaml", "--report", "report"])
        .env("STREAMSCALE_ENGINE_BIN", "no-such-engine")
        .output()
        .expect("run streamscale");
    assert_refused(
        &out,
        &["STREAMSCALE_ENGINE_BIN", "no-such-engine", "does not exist"],
    );
    assert!(!report.exists());
}

/// The names in `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    names
}

/// Refused before anything started: exit 2 with every one of `needles`, no start banner
/// (nothing on stdout), and `dir` holding exactly `left` (no report, lock file or staging
/// directory).
fn refused_up_front(dir: &Path, out: &Output, needles: &[&str], left: &[&str]) {
    let stderr = assert_refused(out, needles);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{stderr}");
    assert_eq!(entries(dir), left, "{stderr}");
}

#[test]
fn a_state_dir_or_sink_output_that_cannot_be_created_is_refused_before_the_engine_starts() {
    let with_state = |state_dir: &str| {
        fixtures::unbounded_job(None).replace(
            "maxParallelism: 16",
            &format!("maxParallelism: 16\nstate: {{ backend: disk, dir: {state_dir} }}"),
        )
    };
    // Paths that fail even for root: nothing can be created under /proc, nor under a file.
    let cases = [
        (
            with_state("/proc/streamscale-nope"),
            vec![
                "job.yaml",
                "state.dir: /proc/streamscale-nope cannot be created",
                "cannot create a directory in /proc",
            ],
        ),
        (
            with_state("blocker/state"),
            vec!["job.yaml", "state.dir:", "blocker is not a directory"],
        ),
        (
            fixtures::with_checkpoints(&fixtures::unbounded_job(Some(
                "/proc/streamscale-nope/out.csv",
            ))),
            vec![
                "job.yaml",
                "operators[2] (sink).output: /proc/streamscale-nope/out.csv",
                "cannot create a directory in /proc",
            ],
        ),
    ];
    for (job, needles) in cases {
        let (dir, _, _) = fixtures::job_dir(&job);
        fixtures::write(dir.path(), "blocker", "a file");
        let out = streamscale(dir.path(), &["run", "job.yaml", "--report", "report"]);
        refused_up_front(dir.path(), &out, &needles, &["blocker", "job.yaml"]);
    }
}

#[test]
fn a_report_dir_nothing_can_be_created_in_is_refused_before_the_engine_starts() {
    // /proc exists, and not even root can create an entry in it (the old code took the lock
    // `/.proc.lock`, printed the banner and failed once the engine could not create
    // /proc/savepoints, exit 1).
    let (dir, _, _) = fixtures::job_dir(&fixtures::unbounded_job(None));
    let out = streamscale(dir.path(), &["run", "job.yaml", "--report", "/proc"]);
    refused_up_front(
        dir.path(),
        &out,
        &[
            "--report: /proc is not writable",
            "No such file or directory",
        ],
        &["job.yaml"],
    );
    // Under /proc nothing can be created at any depth.
    let out = streamscale(
        dir.path(),
        &[
            "run",
            "job.yaml",
            "--report",
            "/proc/streamscale-nope/report",
        ],
    );
    refused_up_front(
        dir.path(),
        &out,
        &[
            "--report: /proc/streamscale-nope/report cannot be created",
            "cannot create a directory in /proc",
        ],
        &["job.yaml"],
    );
}

#[test]
fn an_engine_binary_that_is_not_executable_is_refused_before_the_banner() {
    let (dir, _, _) = fixtures::job_dir(&fixtures::unbounded_job(None));
    // A plain file (mode 644), like /etc/passwd: not even root can run it.
    fixtures::write(dir.path(), "engine.txt", "not an engine");
    let out = streamscale(
        dir.path(),
        &[
            "run",
            "job.yaml",
            "--report",
            "report",
            "--engine",
            "engine.txt",
        ],
    );
    refused_up_front(
        dir.path(),
        &out,
        &["--engine: engine.txt is not executable (mode 6"],
        &["engine.txt", "job.yaml"],
    );
    let out = Command::new(workspace_bin("streamscale"))
        .current_dir(dir.path())
        .args(["run", "job.yaml", "--report", "report"])
        .env("STREAMSCALE_ENGINE_BIN", "engine.txt")
        .output()
        .expect("run streamscale");
    refused_up_front(
        dir.path(),
        &out,
        &["STREAMSCALE_ENGINE_BIN: engine.txt is not executable"],
        &["engine.txt", "job.yaml"],
    );
}

#[test]
fn an_executable_that_is_not_the_engine_is_refused_before_the_banner() {
    // /bin/true runs, but is not the engine (the old code printed the banner, then failed
    // with exit 1 once it had exited without announcing an address).
    let (dir, _, _) = fixtures::job_dir(&fixtures::unbounded_job(None));
    let out = streamscale(
        dir.path(),
        &[
            "run",
            "job.yaml",
            "--report",
            "report",
            "--engine",
            "/bin/true",
        ],
    );
    refused_up_front(
        dir.path(),
        &out,
        &[
            "--engine: /bin/true is not the streamscale-engine binary",
            "`--version`",
        ],
        &["job.yaml"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    let out = Command::new(workspace_bin("streamscale"))
        .current_dir(dir.path())
        .args(["run", "job.yaml", "--report", "report"])
        .env("STREAMSCALE_ENGINE_BIN", "/bin/true")
        .output()
        .expect("run streamscale");
    refused_up_front(
        dir.path(),
        &out,
        &["STREAMSCALE_ENGINE_BIN: /bin/true is not the streamscale-engine binary"],
        &["job.yaml"],
    );
}

/// True while process `pid` runs (a zombie waiting for its parent counts as ended).
fn process_runs(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            // The state follows the parenthesised command name.
            let state = stat.rsplit(')').next().unwrap_or_default().trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
        .unwrap_or(false)
}

#[test]
fn an_engine_that_hangs_on_version_is_stopped_with_what_it_started() {
    // A script that never answers `--version` is refused after the timeout; the old code
    // killed the shell alone and left its `sleep` running, adopted by init.
    let (dir, _, _) = fixtures::job_dir(&fixtures::unbounded_job(None));
    fixtures::write(
        dir.path(),
        "hang.sh",
        "#!/bin/sh\nsleep 600 &\necho $! > sleeper.pid\nwait\n",
    );
    {
        use std::os::unix::fs::PermissionsExt as _;
        let script = dir.path().join("hang.sh");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .expect("chmod hang.sh");
    }
    let out = streamscale(
        dir.path(),
        &[
            "run",
            "job.yaml",
            "--report",
            "report",
            "--engine",
            "./hang.sh",
        ],
    );
    refused_up_front(
        dir.path(),
        &out,
        &["--engine: ./hang.sh did not answer `--version` within 10 s"],
        &["hang.sh", "job.yaml", "sleeper.pid"],
    );
    let pid = std::fs::read_to_string(dir.path().join("sleeper.pid")).expect("sleeper.pid");
    let pid = pid.trim();
    // A deadline for a sleep that was never killed only (a loaded machine delays its end).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while process_runs(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        !process_runs(pid),
        "the script's sleep (pid {pid}) outlived the check"
    );
}

#[test]
fn a_report_whose_savepoints_entry_is_a_file_is_refused_and_left_as_it_was() {
    // The old code staged the run, printed the banner and failed with exit 1 ("engine: …:
    // File exists") when the engine could not create its savepoint directory.
    let (dir, _, report) = fixtures::job_dir(&fixtures::unbounded_job(None));
    std::fs::create_dir(&report).expect("report");
    fixtures::write(&report, "summary.json", "{}");
    fixtures::write(&report, "savepoints", "not a directory");
    let out = streamscale(dir.path(), &["run", "job.yaml", "--report", "report"]);
    refused_up_front(
        dir.path(),
        &out,
        &[
            "--report: report/savepoints exists and is not a directory",
            "savepoints",
        ],
        &["job.yaml", "report"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    assert_eq!(entries(&report), ["savepoints", "summary.json"]);
    assert_eq!(
        std::fs::read_to_string(report.join("savepoints")).expect("still a file"),
        "not a directory"
    );
}

#[test]
fn plan_with_a_negative_interval_names_the_flag() {
    let (dir, _, _) = fixtures::job_dir(&fixtures::unbounded_job(None));
    let out = streamscale(
        dir.path(),
        &[
            "plan",
            "job.yaml",
            "--metrics-url",
            "http://127.0.0.1:9/metrics",
            "--interval",
            "-1",
        ],
    );
    let stderr = assert_refused(&out, &["--interval", "must be > 0", "-1"]);
    assert!(!stderr.contains("unexpected argument"), "{stderr}");
}

#[test]
fn plan_against_the_engine_of_another_job_names_the_operators_it_lacks() {
    let (dir, _, _) = fixtures::job_dir(&fixtures::unbounded_job(None));
    let other = fixtures::pipeline("other", "rate: { constant: 100 }", 50, "");
    let other = other.replace("work", "score");
    fixtures::write(dir.path(), "other.yaml", &other);
    let engine = fixtures::Engine::start(dir.path(), "job.yaml");
    let plan = |job: &str| {
        streamscale(
            dir.path(),
            &[
                "plan",
                job,
                "--metrics-url",
                &engine.metrics_url,
                "--interval",
                "0.5",
            ],
        )
    };
    // Its own job plans: a decision as JSON.
    let out = plan("job.yaml");
    assert!(out.status.success(), "{out:?}");
    let decision: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("decision as JSON");
    assert!(decision.is_object(), "{decision}");
    // Another job: refused, naming the URL, the job file and the operator the engine lacks.
    let stderr = assert_refused(
        &plan("other.yaml"),
        &[&engine.metrics_url, "other.yaml", "does not run", "score"],
    );
    assert!(!stderr.contains("missing from metric sample"), "{stderr}");
}

#[test]
fn plan_before_the_first_record_is_due_decides_on_no_arrivals() {
    // The source emits nothing for an hour: a scrape right after the engine starts has no
    // record yet, and `plan` must still read the source's arrivals (0), not refuse them as
    // missing.
    let job = fixtures::pipeline(
        "idle",
        "keys: 100, rate: { steps: [ { atSeconds: 0, recordsPerSecond: 0 }, { atSeconds: 3600, recordsPerSecond: 100 } ] }",
        100,
        "",
    );
    let (dir, _, _) = fixtures::job_dir(&job);
    let engine = fixtures::Engine::start(dir.path(), "job.yaml");
    let out = streamscale(
        dir.path(),
        &[
            "plan",
            "job.yaml",
            "--metrics-url",
            &engine.metrics_url,
            "--interval",
            "0.5",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let decision: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("decision as JSON");
    assert!(decision.is_object(), "{decision}");
}

#[test]
fn plan_against_no_engine_or_the_wrong_path_says_why() {
    let (dir, _, _) = fixtures::job_dir(&fixtures::unbounded_job(None));
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let closed = format!("http://127.0.0.1:{port}/metrics");
    let out = streamscale(dir.path(), &["plan", "job.yaml", "--metrics-url", &closed]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("Connection refused"), "{stderr}");
    // The engine's address without the /metrics path.
    let engine = fixtures::Engine::start(dir.path(), "job.yaml");
    let base = engine.metrics_url.trim_end_matches("/metrics").to_string();
    let out = streamscale(dir.path(), &["plan", "job.yaml", "--metrics-url", &base]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("HTTP 404"), "{stderr}");
    assert!(stderr.contains("/metrics"), "{stderr}");
}
