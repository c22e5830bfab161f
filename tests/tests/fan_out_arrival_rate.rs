//! An operator fed by a fan-out (one upstream operator with two outgoing edges) must be planned
//! for the records it actually receives.
//!
//! The engine counts `streamscale_records_out_total` once per outgoing edge (so an operator with
//! two outputs shows selectivity 2), and the planner's traffic equations send every output
//! record along every edge again: each branch's arrival rate λ comes out as twice what it
//! receives, and the planner scales each branch up for load it never gets (found by running
//! `streamscale run` on such a job with `--no-autoscale`: `WOULD RESCALE a 4→6, b 4→6` at ρ 0.50,
//! below the 0.7 target; p = 3 carries the measured load at the target).

use std::process::Command;

use streamscale_tests::{fixtures, workspace_bin};

/// `split` sends each of its records to both `a` and `b` (100 rec/s each); `a` and `b` take
/// 20 ms of blocking wait a record (μ ≈ 50 rec/s per subtask) at parallelism 4 (ρ ≈ 0.5).
const FAN_OUT_JOB: &str = "\
name: fan
operators:
  - { name: source, kind: source, keys: 100, rate: { constant: 100 } }
  - { name: split, kind: map, cpu: 10 }
  - { name: a, kind: map, io: 20000, parallelism: 4 }
  - { name: b, kind: map, io: 20000, parallelism: 4 }
  - { name: sinkA, kind: sink }
  - { name: sinkB, kind: sink }
edges:
  - { from: source, to: split }
  - { from: split, to: a }
  - { from: split, to: b }
  - { from: a, to: sinkA }
  - { from: b, to: sinkB }
autoscaler: { targetUtilization: 0.7, latencySloSeconds: 5.0 }
";

#[test]
fn a_branch_of_a_fan_out_is_planned_for_the_records_it_receives() {
    let (dir, _, _) = fixtures::job_dir(FAN_OUT_JOB);
    let engine = fixtures::Engine::start(dir.path(), "job.yaml");
    // Let the branches measure their true processing rate before the plan's two scrapes.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let out = Command::new(workspace_bin("streamscale"))
        .current_dir(dir.path())
        .args([
            "plan",
            "job.yaml",
            "--metrics-url",
            &engine.metrics_url,
            "--interval",
            "3",
        ])
        .output()
        .expect("run streamscale plan");
    assert!(out.status.success(), "{out:?}");
    let decision: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("decision as JSON");
    for branch in ["a", "b"] {
        let op = &decision["operators"][branch];
        let observed = op["observedInputRate"].as_f64().expect("observedInputRate");
        let lambda = op["arrivalRate"].as_f64().expect("arrivalRate");
        assert!(
            (70.0..=130.0).contains(&observed),
            "{branch} receives about 100 rec/s: {op}"
        );
        assert!(
            (lambda - observed).abs() <= 0.25 * observed,
            "{branch}: planned arrival rate {lambda:.1} rec/s, but it receives {observed:.1} rec/s: {op}"
        );
        let p = decision["parallelism"][branch]
            .as_u64()
            .expect("parallelism");
        assert!(
            p <= 4,
            "{branch} runs at ρ ≈ 0.5 < target 0.7 at p=4, yet the plan scales it to {p}: {op}"
        );
    }
}
