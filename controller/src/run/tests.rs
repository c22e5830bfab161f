//! Unit tests of `streamscale run`'s options, job preparation and report directory.

use super::*;

const JOB: &str = "name: t\noperators:\n  - name: src\n    kind: source\n    rate:\n      trace:\n        file: trace.csv\n        speedup: 10\n        startSeconds: 100\n        endSeconds: 700\n  - { name: work, kind: map, cpu: 10 }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: work }\n  - { from: work, to: sink }\n";

fn setup(job: &str) -> (tempfile::TempDir, RunOptions) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("trace.csv"),
        "t_seconds,rate\n0,1\n300,2\n600,3\n900,4\n",
    )
    .expect("trace");
    std::fs::write(dir.path().join("other.csv"), "t_seconds,rate\n0,5\n60,6\n").expect("trace");
    std::fs::write(dir.path().join("job.yaml"), job).expect("job");
    let opts = RunOptions {
        job: dir.path().join("job.yaml"),
        report_dir: dir.path().join("report"),
        ..RunOptions::default()
    };
    (dir, opts)
}

const PLAN_CHAIN: &str = "name: chain\noperators:\n  - { name: src, kind: source, rate: { constant: 100 } }\n  - { name: map, kind: map, parallelism: 8 }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: map }\n  - { from: map, to: sink }\n";

/// `plan`'s two samples, 2 s apart: map (μ = 100 rec/s per subtask) at p = `map_p` taking
/// `input` rec/s, the source at γ = 200 with `backlog` records.
fn plan_window(map_p: u32, input: f64, backlog: f64) -> Vec<MetricSample> {
    use crate::model::testutil::{Synth, window};
    window(
        &[
            Synth::source("src", 1, 200.0, backlog),
            Synth::op("map", map_p, input, 100.0, 1.0),
            Synth::op("sink", 1, input, 10_000.0, 0.0),
        ],
        &[0.0, 2.0],
    )
}

/// Issue 22, case 10: `plan` during a catch-up (1000 records due at the source, 5 s of
/// arrivals) recommended scaling map down 8 → 4, which `run`'s guards never do while a source has a
/// backlog. It applies the guards now and says what they held back.
#[test]
fn plan_applies_the_guards_during_a_catch_up() {
    let spec = crate::model::testutil::job(PLAN_CHAIN);
    let spec = spec.with_parallelism(&[("map".to_string(), 8)].into_iter().collect());
    let out = guarded_plan(&spec, &plan_window(8, 200.0, 1000.0)).expect("plans");
    let d = &out.decision;
    assert_eq!(d.parallelism["map"], 8, "{:?}", d.reasons);
    let said = out.notes.join("\n");
    for what in ["guards", "backlog", "map 8→"] {
        assert!(said.contains(what), "{what}: {said}");
    }
    assert!(
        d.reasons.iter().any(|r| r.contains("guards")),
        "{:?}",
        d.reasons
    );
    // Without a backlog the scale-down is shown (no delay in one look), guards named.
    let out = guarded_plan(&spec, &plan_window(8, 200.0, 0.0)).expect("plans");
    assert!(
        out.decision.parallelism["map"] < 8,
        "{:?}",
        out.decision.reasons
    );
    assert!(
        out.notes.iter().any(|n| n.contains("guards applied")),
        "{:?}",
        out.notes
    );
}

/// Issue 22, case 2: a busy share of 1.25 (map's subtasks busy 2.5 s in the 2 s measured
/// between the scrapes) was clamped to 1 without a word.
#[test]
fn plan_names_a_busy_share_above_one() {
    let spec = crate::model::testutil::job(PLAN_CHAIN);
    let spec = spec.with_parallelism(&[("map".to_string(), 2)].into_iter().collect());
    let out = guarded_plan(&spec, &plan_window(2, 250.0, 0.0)).expect("plans");
    let said = out.notes.join("\n");
    for what in ["map", "1.25", "2.00 s", "1.00"] {
        assert!(said.contains(what), "{what}: {said}");
    }
    assert!(!said.contains("sink was busy"), "{said}");
    // A consistent window says nothing of the kind.
    let out = guarded_plan(&spec, &plan_window(2, 150.0, 0.0)).expect("plans");
    assert!(
        !out.notes.iter().any(|n| n.contains("busy")),
        "{:?}",
        out.notes
    );
}

#[test]
fn effective_job_keeps_the_trace_absolute_and_takes_the_duration_from_it() {
    let (dir, opts) = setup(JOB);
    let job = prepare_job(&opts).expect("prepares");
    assert_eq!(job.path, dir.path().join("report").join("job.yaml"));
    // Nothing is written before the engine has started.
    assert!(!dir.path().join("report").exists());
    assert_eq!(
        JobSpec::from_yaml(&job.yaml).expect("effective job"),
        job.spec
    );
    // (700 - 100) / 10
    assert!((job.duration_s - 60.0).abs() < 1e-9, "{}", job.duration_s);
    assert_eq!(job.trace_start(), 100.0);
    assert_eq!(job.trace_time(6.0), Some(160.0));
    let OperatorKind::Source {
        rate: RateSpec::Trace(t),
        ..
    } = &job.spec.operators[0].kind
    else {
        panic!("trace source expected");
    };
    assert!(t.file.is_absolute(), "{}", t.file.display());
    assert_eq!(job.order(), vec!["src", "work", "sink"]);
    assert_eq!(job.sources(), vec!["src"]);
}

#[test]
fn overrides_apply_to_the_first_source() {
    let (dir, mut opts) = setup(JOB);
    opts.trace = Some(dir.path().join("other.csv"));
    opts.speedup = Some(20.0);
    opts.scale = Some(3.0);
    opts.slo_s = Some(0.5);
    opts.duration_s = Some(12.0);
    let job = prepare_job(&opts).expect("prepares");
    let OperatorKind::Source {
        rate: RateSpec::Trace(t),
        ..
    } = &job.spec.operators[0].kind
    else {
        panic!("trace source expected");
    };
    assert_eq!(t.file, dir.path().join("other.csv"));
    assert_eq!(t.speedup, 20.0);
    assert_eq!(t.scale, 3.0);
    assert_eq!(job.spec.autoscaler.latency_slo_seconds, 0.5);
    assert_eq!(job.duration_s, 12.0);
}

#[test]
fn a_constant_source_gets_a_trace_only_with_trace() {
    let constant = "name: c\noperators:\n  - { name: src, kind: source, rate: { constant: 5 } }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: sink }\n";
    let (dir, mut opts) = setup(constant);
    let job = prepare_job(&opts).expect("prepares");
    assert_eq!(job.duration_s, DEFAULT_DURATION_S);
    assert_eq!(job.trace_time(1.0), None);
    opts.scale = Some(2.0);
    let err = prepare_job(&opts).expect_err("no trace to scale");
    assert!(err.to_string().starts_with("--scale:"), "{err}");
    opts.trace = Some(dir.path().join("other.csv"));
    let job = prepare_job(&opts).expect("trace given");
    // Trace rows 0 and 60 with resolution 60: ends at 120 trace-seconds, speedup 1.
    assert!((job.duration_s - 120.0).abs() < 1e-9, "{}", job.duration_s);
}

#[test]
fn bad_options_name_the_flag() {
    let (dir, mut opts) = setup(JOB);
    opts.scale = Some(0.0);
    let err = prepare_job(&opts).expect_err("scale 0");
    assert!(err.to_string().starts_with("--scale: must be > 0"), "{err}");
    opts.scale = Some(-1.0);
    assert!(prepare_job(&opts).is_err());
    opts.scale = None;
    opts.interval_s = 0.0;
    assert!(
        prepare_job(&opts)
            .expect_err("interval")
            .to_string()
            .starts_with("--interval")
    );
    opts.interval_s = 0.05;
    let err = prepare_job(&opts).expect_err("interval under two flushes");
    assert!(
        err.to_string()
            .starts_with("--interval: must be at least 0.2 s"),
        "{err}"
    );
    opts.interval_s = MIN_INTERVAL_S;
    assert!(check_options(&opts).is_ok());
    opts.speedup = Some(f64::INFINITY);
    let err = prepare_job(&opts).expect_err("infinite speedup");
    assert!(
        err.to_string().contains("must be > 0 and finite (got inf)"),
        "{err}"
    );
    opts.speedup = None;
    opts.interval_s = 1.0;
    opts.trace = Some(dir.path().join("missing.csv"));
    let err = prepare_job(&opts).expect_err("missing trace");
    let msg = err.to_string();
    assert!(
        msg.starts_with("--trace:") && msg.contains("missing.csv"),
        "{msg}"
    );
    assert!(msg.contains("does not exist"), "{msg}");
    opts.trace = Some(dir.path().to_path_buf());
    let msg = prepare_job(&opts).expect_err("a directory").to_string();
    assert!(
        msg.starts_with("--trace:") && msg.contains("is a directory"),
        "{msg}"
    );
}

#[test]
fn another_trace_replaces_the_jobs_window() {
    let (dir, mut opts) = setup(JOB);
    opts.trace = Some(dir.path().join("other.csv"));
    let job = prepare_job(&opts).expect("prepares");
    // The job's window (100 .. 700) belongs to its own trace: other.csv is replayed whole,
    // 0 .. 120 trace-seconds at the job's speedup 10.
    assert_eq!(job.trace_start(), 0.0);
    assert!((job.duration_s - 12.0).abs() < 1e-9, "{}", job.duration_s);
    assert!(job.rate.as_ref().is_some_and(|r| r.rate(0.0) == 5.0));
}

#[test]
fn a_window_outside_the_trace_is_an_error() {
    // The trace covers 1000 .. 1120 trace-seconds; the job's window is 100 .. 700.
    let (dir, opts) = setup(JOB);
    std::fs::write(
        dir.path().join("trace.csv"),
        "t_seconds,rate\n1000,5\n1060,6\n",
    )
    .expect("trace");
    let err = prepare_job(&opts).expect_err("window before the trace starts");
    let msg = err.to_string();
    assert!(
        msg.contains("startSeconds 100") && msg.contains("outside the trace"),
        "{msg}"
    );
    assert!(matches!(err, RunError::Option(_)), "{err:?}");
    // Past the trace's end: the job file's own validation names the field.
    let (_dir, opts) = setup(
        &JOB.replace("startSeconds: 100", "startSeconds: 5000")
            .replace("endSeconds: 700", "endSeconds: 6000"),
    );
    let err = prepare_job(&opts).expect_err("window after the trace's end");
    assert!(err.to_string().contains("startSeconds: 5000"), "{err}");
}

#[test]
fn negative_delays_and_bad_percentiles_are_rejected() {
    let (_dir, mut opts) = setup(JOB);
    opts.stabilization_s = -5.0;
    let err = prepare_job(&opts).expect_err("negative stabilization");
    assert!(err.to_string().starts_with("--stabilization:"), "{err}");
    opts.stabilization_s = 0.0;
    opts.scale_down_delay_s = -1.0;
    let err = prepare_job(&opts).expect_err("negative delay");
    assert!(err.to_string().starts_with("--scale-down-delay:"), "{err}");
    opts.scale_down_delay_s = 0.0;
    prepare_job(&opts).expect("zero delays are fine");
    for p in [0.0, 1.0, 99.0, f64::NAN] {
        opts.latency_percentile = Some(p);
        let err = prepare_job(&opts).expect_err("bad percentile");
        assert!(
            err.to_string().starts_with("--latency-percentile:"),
            "{err}"
        );
    }
    opts.latency_percentile = Some(0.95);
    prepare_job(&opts).expect("p95");
}

#[test]
fn a_bad_metrics_url_names_the_url_and_the_reason() {
    let err = check_metrics_url("notaurl").expect_err("not a URL");
    let msg = err.to_string();
    assert!(
        msg.contains("`notaurl`") && msg.contains("relative URL without a base"),
        "{msg}"
    );
    let err = check_metrics_url("ftp://host/metrics").expect_err("scheme");
    assert!(err.to_string().contains("scheme `ftp`"), "{err}");
    check_metrics_url("http://127.0.0.1:40123/metrics").expect("fine");
    // Another option's check names that option alone, with its own example.
    let err = check_http_url("--rest-url", "127.0.0.1:9", "http://127.0.0.1:8081")
        .expect_err("no scheme")
        .to_string();
    assert!(
        err.starts_with("--rest-url: `127.0.0.1:9`")
            && err.ends_with("(expected e.g. http://127.0.0.1:8081)")
            && !err.contains("metrics"),
        "{err}"
    );
}

#[test]
fn interrupts_exit_like_a_shell() {
    assert_eq!(Interrupt::Int.exit_code(), 130);
    assert_eq!(Interrupt::Term.exit_code(), 143);
    assert_eq!(Interrupt::Hup.exit_code(), 129);
}

#[test]
fn relative_paths_are_relative_to_the_job_file() {
    // The sink's output, like the trace, is relative to the job file, not to the working
    // directory nor to the report directory the effective job.yaml is written to.
    let job = JOB.replace(
        "{ name: sink, kind: sink }",
        "{ name: sink, kind: sink, output: out/results.csv, delivery: at-least-once }",
    );
    let (dir, opts) = setup(&job);
    let prepared = prepare_job(&opts).expect("prepares");
    let output = prepared.spec.operators.iter().find_map(|o| match &o.kind {
        OperatorKind::Sink { output, .. } => output.clone(),
        _ => None,
    });
    assert_eq!(output, Some(dir.path().join("out/results.csv")));
    let trace = prepared.spec.operators.iter().find_map(|o| match &o.kind {
        OperatorKind::Source {
            rate: RateSpec::Trace(t),
            ..
        } => Some(t.file.clone()),
        _ => None,
    });
    assert_eq!(trace, Some(dir.path().join("trace.csv")));
}

#[test]
fn a_trace_with_a_byte_order_mark_reads_like_one_without() {
    let (dir, opts) = setup(JOB);
    std::fs::write(
        dir.path().join("trace.csv"),
        "\u{feff}t_seconds,rate\n0,1\n300,2\n600,3\n900,4\n",
    )
    .expect("trace");
    let job = prepare_job(&opts).expect("a BOM is not part of the header");
    assert!((job.duration_s - 60.0).abs() < 1e-9, "{}", job.duration_s);
}

#[test]
fn a_duplicate_key_is_named_without_parser_internals() {
    let (_dir, opts) = setup(&format!("name: u\n{JOB}"));
    let e = prepare_job(&opts).expect_err("duplicate key").to_string();
    assert!(e.contains("duplicate mapping key: name"), "{e}");
    assert!(e.contains("line 2"), "{e}");
    assert!(e.contains("each key may appear only once"), "{e}");
    assert!(!e.contains("DuplicateKeyPolicy"), "{e}");
}

#[test]
fn operators_are_listed_in_file_order_where_the_edges_allow() {
    let (_dir, opts) = setup(
        "name: two
operators:
  - { name: sink, kind: sink }
  - { name: a, kind: source, rate: { constant: 10 } }
  - { name: b, kind: source, rate: { constant: 10 } }
  - { name: u, kind: map }
edges:
  - { from: a, to: u }
  - { from: b, to: u }
  - { from: u, to: sink }
",
    );
    let job = prepare_job(&opts).expect("job");
    assert_eq!(job.order(), ["a", "b", "u", "sink"]);
}

#[test]
fn a_rescale_reason_names_every_source_rate() {
    let decision = |sources: usize| -> crate::model::Decision {
        let mut reasons: Vec<String> = (0..sources)
            .map(|k| format!("source s{k}: arrival rate γ={k}00 rec/s"))
            .collect();
        reasons.push("latency: p99 bound 0.2 s".into());
        serde_json::from_value(serde_json::json!({
            "parallelism": { "m": 2 }, "current": { "m": 1 }, "operators": {},
            "sources": {}, "predictedLatencySeconds": 0.1, "criticalPath": [],
            "latencySloSeconds": 1.0, "targetUtilization": 0.7, "reasons": reasons,
        }))
        .expect("decision")
    };
    let two = rescale_reason(&decision(2));
    assert!(two.contains("source s0: arrival rate γ=000"), "{two}");
    assert!(two.contains("source s1: arrival rate γ=100"), "{two}");
    assert!(!two.contains("latency"), "{two}");
    let five = rescale_reason(&decision(5));
    assert!(five.contains("source s2"), "{five}");
    assert!(!five.contains("source s3"), "{five}");
    assert!(five.ends_with("and 2 more sources"), "{five}");
    assert_eq!(rescale_reason(&decision(0)), "latency: p99 bound 0.2 s");
}

#[test]
fn a_report_entry_of_the_wrong_kind_is_refused_before_anything_starts() {
    let (_dir, opts) = setup(JOB);
    let report = &opts.report_dir;
    std::fs::create_dir_all(report.join("logs")).expect("logs");
    std::fs::write(report.join("summary.json"), "{}").expect("summary");
    check_report_dir(report).expect("an earlier report is replaced");
    std::fs::remove_file(report.join("summary.json")).expect("rm summary");
    std::fs::create_dir(report.join("summary.json")).expect("summary dir");
    let e = check_report_dir(report).expect_err("summary.json a directory");
    let e = e.to_string();
    assert!(e.contains("--report"), "{e}");
    assert!(
        e.contains(&report.join("summary.json").display().to_string()),
        "{e}"
    );
    assert!(e.contains("is a directory"), "{e}");
    std::fs::remove_dir(report.join("summary.json")).expect("rm summary dir");
    std::fs::remove_dir(report.join("logs")).expect("rm logs");
    std::fs::write(report.join("logs"), "").expect("logs file");
    let e = check_report_dir(report)
        .expect_err("logs a file")
        .to_string();
    assert!(e.contains("logs is not a directory"), "{e}");
}

#[test]
fn a_report_directory_that_is_a_link_to_nothing_is_refused_before_anything_starts() {
    // The old code let it pass: the run printed its banner, staged its first engine and
    // failed with exit 1 `…/savepoints: File exists`, leaving DIR.starting-… behind.
    let (dir, opts) = setup(JOB);
    let report = &opts.report_dir;
    std::os::unix::fs::symlink(dir.path().join("gone"), report).expect("symlink");
    let e = check_report_dir(report)
        .expect_err("a dangling link")
        .to_string();
    assert!(e.starts_with("--report: "), "{e}");
    assert!(e.contains(&report.display().to_string()), "{e}");
    assert!(e.contains("symbolic link to nothing"), "{e}");
    let e = check_report_dir(&report.join("sub"))
        .expect_err("under a dangling link")
        .to_string();
    assert!(e.contains(&report.join("sub").display().to_string()), "{e}");
    assert!(
        e.contains(&format!(
            "cannot be created: {} is a symbolic link to nothing",
            report.display()
        )),
        "{e}"
    );
    assert!(!dir.path().join("gone").exists(), "nothing created");
    // A link to a directory is a report directory like any other.
    std::fs::remove_file(report).expect("rm link");
    std::fs::create_dir(dir.path().join("gone")).expect("target");
    std::os::unix::fs::symlink(dir.path().join("gone"), report).expect("symlink");
    check_report_dir(report).expect("a link to a directory");
}

#[test]
fn a_job_file_the_run_would_replace_is_refused() {
    // The old code ran `DIR/job.yaml --report DIR`, warned that DIR held an earlier
    // report (job.yaml) and replaced the user's job file with the effective copy.
    let (dir, mut opts) = setup(JOB);
    let report = dir.path().to_path_buf();
    opts.report_dir = report.clone();
    let e = check_options(&opts).expect_err("DIR/job.yaml").to_string();
    assert!(e.starts_with("--report: "), "{e}");
    assert!(
        e.contains(&report.join("job.yaml").display().to_string()),
        "{e}"
    );
    assert!(e.contains("is the job file itself"), "{e}");
    assert_eq!(std::fs::read_to_string(&opts.job).expect("job"), JOB);
    // Named another way (a relative `.` component) it is the same file.
    opts.report_dir = report.join(".");
    check_options(&opts).expect_err("DIR/./job.yaml");
    // Any other report directory is fine.
    opts.report_dir = report.join("report");
    check_options(&opts).expect("a report beside the job file");
}

#[test]
fn a_reused_report_directory_is_named_in_a_warning() {
    let (dir, opts) = setup(JOB);
    assert_eq!(earlier_report(&opts.report_dir), None, "no directory yet");
    std::fs::create_dir_all(&opts.report_dir).expect("report dir");
    std::fs::write(opts.report_dir.join(STATE_FILE), "{}").expect("history");
    assert_eq!(
        earlier_report(&opts.report_dir),
        None,
        "only the learned state"
    );
    std::fs::write(opts.report_dir.join("summary.json"), "{}").expect("summary");
    let w = earlier_report(&opts.report_dir).expect("warning");
    assert!(w.starts_with("warning: "), "{w}");
    assert!(
        w.contains(&dir.path().join("report").display().to_string()),
        "{w}"
    );
    assert!(w.contains("summary.json"), "{w}");
}

#[tokio::test]
async fn the_first_engines_files_replace_the_earlier_report_only_when_committed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("report");
    for (f, text) in [
        ("summary.json", "old"),
        ("timeline.csv", "old"),
        ("job.yaml", "old"),
        ("logs/engine-1.log", "old"),
        ("logs/engine-2.log", "old"),
        ("savepoints/sp-a/_metadata.json", "kept"),
        (STATE_FILE, "kept"),
    ] {
        let path = report.join(f);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
        std::fs::write(&path, text).expect("write");
    }
    // A failed start: removed when the engine never ran, else kept; the report unchanged.
    let spawn = RuntimeError::Spawn {
        binary: "x".into(),
        source: std::io::Error::other("no"),
    };
    let staging = Staging::create(&report, "new job").expect("staging");
    assert!(staging.dir.starts_with(dir.path()) && !staging.dir.starts_with(&report));
    let kept = staging.dir.clone();
    assert_eq!(staging.abandon(&spawn), None);
    assert!(!kept.exists());
    let staging = Staging::create(&report, "new job").expect("staging");
    let exited = RuntimeError::Exited {
        status: "exit code 2".into(),
        last_error: "error: bad".into(),
    };
    let kept = staging.abandon(&exited).expect("kept");
    assert_eq!(
        std::fs::read_to_string(kept.join("job.yaml")).expect("job"),
        "new job"
    );
    assert_eq!(
        std::fs::read_to_string(report.join("summary.json")).expect("old"),
        "old"
    );
    // A started engine: its job file and logs replace the earlier report's.
    let staging = Staging::create(&report, "new job").expect("staging");
    let runtime = LocalRuntime::new(
        PathBuf::from("streamscale-engine"),
        report.join("savepoints"),
        staging.dir.join("logs"),
        http_client().expect("client"),
    );
    std::fs::create_dir_all(staging.dir.join("logs")).expect("logs");
    std::fs::write(staging.dir.join("logs/engine-1.log"), "new").expect("log");
    let staged = staging.dir.clone();
    staging.commit(&report, &runtime).await.expect("commit");
    assert!(!staged.exists());
    assert_eq!(runtime.log_dir(), report.join("logs"));
    let hidden: Vec<_> = std::fs::read_dir(&report)
        .expect("report")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "temporary names left: {hidden:?}");
    let read = |f: &str| std::fs::read_to_string(report.join(f)).ok();
    assert_eq!(read("job.yaml").as_deref(), Some("new job"));
    assert_eq!(read("logs/engine-1.log").as_deref(), Some("new"));
    for gone in ["summary.json", "timeline.csv", "logs/engine-2.log"] {
        assert_eq!(read(gone), None, "{gone}");
    }
    assert_eq!(
        read("savepoints/sp-a/_metadata.json").as_deref(),
        Some("kept")
    );
    assert_eq!(read(STATE_FILE).as_deref(), Some("kept"));
}

#[test]
fn a_missing_job_file_is_named() {
    let opts = RunOptions {
        job: PathBuf::from("/nonexistent/job.yaml"),
        ..RunOptions::default()
    };
    let err = prepare_job(&opts).expect_err("missing");
    assert!(err.to_string().contains("/nonexistent/job.yaml"), "{err}");
}

#[test]
fn the_default_job_resolves_from_the_workspace_root() {
    let p = resolve_job_path(Path::new(DEFAULT_JOB));
    // Exists once the example is in the tree; the fallback path is under the workspace.
    assert!(p.ends_with(DEFAULT_JOB));
}

#[test]
fn a_run_killed_in_its_final_savepoint_names_the_newest_earlier_one() {
    let newest_first = [
        PathBuf::from("r/savepoints/sp-j-2"),
        PathBuf::from("r/savepoints/sp-j-1"),
    ];
    assert_eq!(
        restore_hint(Some(&newest_first)),
        "; restore from the newest earlier savepoint r/savepoints/sp-j-2"
    );
    assert_eq!(restore_hint(Some(&[])), "");
    assert_eq!(restore_hint(None), "");
}
