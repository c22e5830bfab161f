//! `streamscale run` end to end with the real engine over loopback, for the limits and
//! forecast settings: an operator held at its max parallelism under a load it cannot take sheds
//! the excess at the sources (counted in `records_shed`, no record lost), and the forecast's
//! rate history is written to the report directory and read back by the next run.
#![allow(missing_docs)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use streamscale_tests::workspace_bin;

/// 300 rec/s for 12 s into a map of μ ≈ 250 rec/s (4 ms blocking I/O per record) that may not
/// exceed one subtask: capacity at ρ 0.7 is about 175 rec/s, so about 40% must be shed.
const JOB: &str = r#"name: limited
maxParallelism: 16
channelCapacity: 32
operators:
  - name: source
    kind: source
    keys: 100
    rate: { steps: [{ atSeconds: 0, recordsPerSecond: 300 }, { atSeconds: 12, recordsPerSecond: 0 }] }
  - { name: lookup, kind: map, io: 4000, scaling: { max: 1 } }
  - { name: sink, kind: sink }
edges:
  - { from: source, to: lookup }
  - { from: lookup, to: sink }
autoscaler:
  targetUtilization: 0.7
  latencySloSeconds: 1.0
  catchUpSeconds: 10
  limits: { onLimit: shed, maxShedShare: 0.8 }
  forecast: { mode: recommend, seasonSeconds: 8, binSeconds: 1 }
"#;

fn run(job: &Path, report: &Path) -> (Value, String, String) {
    let out = Command::new(workspace_bin("streamscale"))
        .arg("run")
        .arg(job)
        .arg("--report")
        .arg(report)
        .args(["--interval", "0.5", "--window", "3", "--stabilization", "1"])
        .args(["--duration", "14"])
        .env(
            "STREAMSCALE_ENGINE_BIN",
            workspace_bin("streamscale-engine"),
        )
        .output()
        .expect("run streamscale");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "streamscale run failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(report.join("summary.json")).expect("summary.json");
    (
        serde_json::from_str(&text).expect("summary is JSON"),
        stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn sheds_beyond_the_limit_and_keeps_the_rate_history() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, JOB).expect("write job");
    let report = dir.path().join("report");

    let (summary, stdout, _) = run(&job, &report);
    assert!(stdout.contains("SHED"), "{stdout}");
    let shed = summary["records_shed"].as_u64().expect("records_shed");
    let emitted = summary["records_emitted"]
        .as_u64()
        .expect("records_emitted");
    assert!(shed > 200, "shed {shed}: {summary}");
    assert_eq!(summary["records_lost"].as_i64(), Some(0), "{summary}");
    // Every due record (300 rec/s for 12 s) was emitted or shed.
    assert_eq!(emitted + shed, 3600, "{summary}");

    let history = report.join("learned-state.json");
    let h: Value =
        serde_json::from_str(&std::fs::read_to_string(&history).expect("history written"))
            .expect("history is JSON");
    assert_eq!(h["job"], "limited");
    assert!(
        h["history"]["bins"]
            .as_array()
            .is_some_and(|b| b.len() >= 5),
        "{h}"
    );

    // The next run reads it back; a corrupt file is set aside with a warning, never a crash.
    let (_, stdout, _) = run(&job, &report);
    assert!(stdout.contains("bins of rate history from"), "{stdout}");
    std::fs::write(&history, "{ not json").expect("corrupt");
    // The warning goes to stderr, not among the run's lines on stdout.
    let (_, stdout, stderr) = run(&job, &report);
    assert!(
        stderr.contains("warning:") && stderr.contains("learned state ignored"),
        "{stderr}"
    );
    assert!(!stdout.contains("warning"), "{stdout}");
    assert!(report.join("learned-state.json.corrupt").exists());
}
