//! `streamscale run` end to end with the real engine over loopback: a step in the input rate
//! makes the controller scale up during the step (never below what the step needs) and back
//! down after it; no record is lost across the rescales; and the final keyed state equals that
//! of a run without rescaling.
#![allow(missing_docs)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use streamscale_engine::savepoint::Savepoint;
use streamscale_engine::spec::JobSpec;
use streamscale_tests::workspace_bin;

/// 41 s at 1 trace-second per second: 20 rec/s, a 12 s step to 500 rec/s, then 20 rec/s for
/// 23 s: time for a scale-down that trims the step's scale-up just after the step (its delay
/// counted from during the step) and then the scale-down to what 20 rec/s needs (stabilization
/// after that rescale, a fresh window, the scale-down delay), on a loaded CI machine too (31 s
/// were not always enough).
const TRACE: &str = "t_seconds,rate\n0,20\n6,500\n18,20\n40,20\n";

fn write_job(dir: &Path) -> std::path::PathBuf {
    std::fs::write(dir.join("step.rate.csv"), TRACE).expect("write trace");
    let job = dir.join("job.yaml");
    std::fs::write(
        &job,
        r#"name: step
maxParallelism: 64
channelCapacity: 32
operators:
  - name: source
    kind: source
    keys: 200
    rate: { trace: { file: step.rate.csv, endSeconds: 41 } }
  - { name: lookup, kind: map, io: 4000 }
  - { name: counts, kind: window, sizeMs: 500 }
  - { name: sink, kind: sink }
edges:
  - { from: source, to: lookup }
  - { from: lookup, to: counts }
  - { from: counts, to: sink }
autoscaler: { targetUtilization: 0.7, latencySloSeconds: 1.0, catchUpSeconds: 10, scaleDownLookbackSeconds: 0 }
"#,
    )
    .expect("write job");
    job
}

fn run(job: &Path, report: &Path, extra: &[&str]) -> Value {
    let out = Command::new(workspace_bin("streamscale"))
        .arg("run")
        .arg(job)
        .arg("--report")
        .arg(report)
        .args([
            "--interval",
            "0.5",
            "--window",
            "4",
            "--stabilization",
            "1.5",
        ])
        .args(["--scale-down-delay", "3"])
        .args(extra)
        .env(
            "STREAMSCALE_ENGINE_BIN",
            workspace_bin("streamscale-engine"),
        )
        .output()
        .expect("run streamscale");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "streamscale run failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(report.join("summary.json")).expect("summary.json");
    let summary: Value = serde_json::from_str(&text).expect("summary is JSON");
    assert!(
        report
            .join("timeline.png")
            .metadata()
            .expect("timeline.png")
            .len()
            > 1000,
        "timeline.png is written"
    );
    eprintln!("{stdout}");
    summary
}

fn final_totals(summary: &Value, spec: &JobSpec) -> std::collections::BTreeMap<u64, (u64, i64)> {
    let path = summary["final_savepoint"]
        .as_str()
        .expect("final savepoint path");
    Savepoint::read(Path::new(path), spec)
        .expect("final savepoint reads")
        .state["counts"]
        .totals()
}

#[test]
fn scales_up_on_the_step_and_down_after_it_without_losing_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = write_job(dir.path());
    let spec = JobSpec::from_file(&job).expect("job is valid");

    let auto = run(&job, &dir.path().join("auto"), &[]);
    let emitted = auto["records_emitted"].as_u64().expect("records_emitted");
    // ∫ rate over the 41 s window: 6·20 + 12·500 + 23·20 = 6580 records.
    assert_eq!(emitted, 6580, "{auto}");
    assert_eq!(auto["records_accounted"].as_u64(), Some(emitted), "{auto}");

    let rescales = auto["rescales"].as_array().expect("rescales");
    let lookup = |r: &Value, side: &str| r[side]["lookup"].as_u64().expect("lookup parallelism");
    let up = rescales
        .iter()
        .find(|r| lookup(r, "to") > lookup(r, "from"))
        .unwrap_or_else(|| panic!("no scale-up: {auto}"));
    let up_at = up["at_s"].as_f64().expect("at_s");
    assert!(
        (6.0..18.0).contains(&up_at),
        "scale-up during the step: {up}"
    );
    // 500 rec/s at ~250 rec/s per subtask and ρ ≤ 0.7 needs at least 3 subtasks.
    let peak = rescales.iter().map(|r| lookup(r, "to")).max().unwrap_or(0);
    assert!(peak >= 3, "{auto}");
    // While the step lasts, a scale-down may trim a scale-up that overshot (the catch-up of
    // the backlog built before it sized it), but never below what 500 rec/s needs.
    for r in rescales {
        let at = r["at_s"].as_f64().expect("at_s");
        if (up_at..18.0).contains(&at) && lookup(r, "to") < lookup(r, "from") {
            assert!(lookup(r, "to") >= 3, "step-time scale-down below 3: {r}");
        }
    }
    // After the step the input is back at 20 rec/s: one subtask carries it.
    assert!(
        rescales
            .iter()
            .any(|r| r["at_s"].as_f64() > Some(18.0) && lookup(r, "to") < 3),
        "no scale-down below 3 after the step: {auto}"
    );
    for r in rescales {
        assert!(
            r["downtime_s"]
                .as_f64()
                .is_some_and(|d| d > 0.0 && d < 10.0),
            "{r}"
        );
    }

    // The same input without rescaling ends in the same keyed state.
    let fixed = run(&job, &dir.path().join("fixed"), &["--no-autoscale"]);
    assert_eq!(
        fixed["rescales"].as_array().map(Vec::len),
        Some(0),
        "{fixed}"
    );
    // It still reports what it would have done: the scale-up the step needs.
    let recommended = fixed["recommendations"]
        .as_array()
        .unwrap_or_else(|| panic!("no recommendations: {fixed}"));
    assert!(
        recommended
            .iter()
            .any(|r| r["outcome"] == "recommended" && lookup(r, "to") >= 3),
        "{fixed}"
    );
    assert_eq!(fixed["records_emitted"].as_u64(), Some(emitted));
    assert_eq!(fixed["records_accounted"].as_u64(), Some(emitted));
    assert_eq!(final_totals(&auto, &spec), final_totals(&fixed, &spec));
}
