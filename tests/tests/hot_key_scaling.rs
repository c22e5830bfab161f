//! A keyed operator whose input has a single key (one hot key group) cannot go faster at a
//! higher parallelism: every record goes to the one subtask that owns that key group. The
//! planner estimated each key group's load by spreading a subtask's input share evenly over
//! the key groups it owns (`key_group_load`), so it expected a scale-up to split the load. Found
//! with `streamscale run` on this job: counts 1→3→10→32→128 within 20 s (2.3 s downtime each,
//! the backlog growing throughout), then `AT LIMIT counts=128`; later the learned
//! "ineffective scaling" flag stopped it after one scale-up. Now the engine reports each keyed
//! subtask's busiest key group's share (`streamscale_hottest_key_group_share`, 1 here) and the
//! planner gives that share to one key group: a hot-key bottleneck from the first decision, no
//! scale-up at all.

use streamscale_tests::fixtures;

/// One key, 800 records/s into a window that takes 2 ms of blocking wait a record
/// (μ ≈ 480 records/s on the one subtask that gets them all, whatever the parallelism).
const HOT_KEY_JOB: &str = "\
name: hotkey
operators:
  - { name: source, kind: source, keys: 1, rate: { constant: 800 } }
  - { name: counts, kind: window, sizeMs: 1000, io: 2000 }
  - { name: sink, kind: sink }
edges:
  - { from: source, to: counts }
  - { from: counts, to: sink }
";

#[test]
fn a_single_hot_key_does_not_drive_its_operator_to_max_parallelism() {
    let (_dir, job, report) = fixtures::job_dir(HOT_KEY_JOB);
    let out = fixtures::streamscale_run(&job, &report, &["--duration", "25s"])
        .output()
        .expect("run streamscale");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = fixtures::summary(&report);
    let rescales = summary["rescales"].as_array().expect("rescales");
    let reached: Vec<u64> = rescales
        .iter()
        .filter_map(|r| r["to"]["counts"].as_u64())
        .collect();
    // All of the input stays on one key group: no parallelism splits it, so the operator is
    // not scaled up at all (the engine's hottest-key-group share says so before any scale-up).
    assert!(
        reached.iter().all(|&p| p <= 1),
        "counts was scaled up (steps {reached:?}) for a single key:\n{stdout}"
    );
    // The backlog grows with no rescale to explain it: the run says why, once.
    let at_limit: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("AT LIMIT counts=1 (hot-key bottleneck: one key group takes"))
        .collect();
    assert!(
        !at_limit.is_empty()
            && at_limit[0].ends_with("(spread the hot keys or speed up the operator)"),
        "{stdout}"
    );
    // The single subtask is overloaded (800 rec/s > μ ≈ 480) and the backlog grows; the run
    // still measures capacity as what that subtask carries, under the input rate.
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("t=") && l.contains(" cap="))
        .unwrap_or_else(|| panic!("no progress line with cap=:\n{stdout}"));
    let field = |name: &str| -> f64 {
        let after = last.split(&format!(" {name}=")).nth(1).unwrap_or("");
        after
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}= in {last}"))
    };
    assert!(field("cap") < field("in"), "{last}\n{stdout}");
}
