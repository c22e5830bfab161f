//! A keyed operator whose input has a single key (one hot key group) cannot go faster at a
//! higher parallelism: every record goes to the one subtask that owns that key group. The
//! planner estimated each key group's load by spreading a subtask's input share evenly over
//! the key groups it owns (`key_group_load`), so it expected a scale-up to split the load. Found
//! with `streamscale run` on this job: counts 1→3→10→32→128 within 20 s (2.3 s downtime each,
//! the backlog growing throughout), then `AT LIMIT counts=128`; later the learned
//! "ineffective scaling" flag stopped it after one scale-up. Then the engine reported each keyed
//! subtask's busiest key group's share (`streamscale_hottest_key_group_share`) and the planner
//! kept an operator with a group too hot for one subtask where it was, which also kept a job
//! with a few keys at p=1 (a user test: 10 keys, the hottest group 18.5 % of 4281 rec/s, μ ≈ 885
//! rec/s, held at p=1 though p=8 ran at ≈ 3200 rec/s). Now the engine lists each keyed subtask's
//! busiest key groups with their indices (`streamscale_key_group_share{key_group}`) and the
//! planner sizes such an operator to the parallelism that gives the hot group a subtask of its
//! own with every other subtask within the target, then holds: one key stays at p=1 (nothing
//! to split off), a few keys are scaled up once (or twice, as the lists at the new parallelism
//! show where the rest lies) and held there. Once isolated, the hot group read low (14.4 % for
//! 21.75 % on the kzipf job below): its subtask, saturated, processed only its μ while the
//! others caught up the rescale's backlog, so its share of the processed input fell, and the
//! run said WITHIN LIMITS with p99 over the SLO. Now a saturated subtask is read at no less than
//! what it processed of the rate the planner sizes for, and a held operator is released only
//! 10 % under the claim threshold.

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

/// Runs `job` with `streamscale run --duration DURATION` (which must succeed) and returns its
/// directory (kept alive), report directory, stdout, `summary.json` and the parallelism of
/// `counts` after each of its rescales.
fn run_counting_steps(
    job: &str,
    duration: &str,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    String,
    serde_json::Value,
    Vec<u64>,
) {
    let (dir, job, report) = fixtures::job_dir(job);
    let out = fixtures::streamscale_run(&job, &report, &["--duration", duration])
        .output()
        .expect("run streamscale");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = fixtures::summary(&report);
    let steps = summary["rescales"]
        .as_array()
        .expect("rescales")
        .iter()
        .filter_map(|r| r["to"]["counts"].as_u64())
        .collect();
    (dir, report, stdout, summary, steps)
}

#[test]
fn a_single_hot_key_does_not_drive_its_operator_to_max_parallelism() {
    let (_dir, _report, stdout, _summary, reached) = run_counting_steps(HOT_KEY_JOB, "25s");
    // All of the input stays on one key group: no parallelism splits it, so the operator is
    // not scaled up at all (the engine's hottest-key-group share says so before any scale-up).
    assert!(
        reached.iter().all(|&p| p <= 1),
        "counts was scaled up (steps {reached:?}) for a single key:\n{stdout}"
    );
    // The backlog grows with no rescale to explain it: the run says why, once.
    let at_limit: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("AT LIMIT counts=1 (hot-key bottleneck: key group "))
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

/// Ten keys, 2000 records/s into a window that takes 2 ms of blocking wait a record (μ ≈ 480
/// records/s per subtask, 336 at the target utilization 0.7). The engine's hash puts two of
/// the keys in one key group (117 of 128): 400 records/s, more than a subtask takes at the
/// target but less than its μ; each other key (200 records/s) fits a subtask alone, two do
/// not. At p=1 the one subtask carries everything (≈ 480 records/s get through).
const FEW_KEYS_JOB: &str = "\
name: fewkeys
operators:
  - { name: source, kind: source, keys: 10, rate: { constant: 2000 } }
  - { name: counts, kind: window, sizeMs: 1000, io: 2000 }
  - { name: sink, kind: sink }
edges:
  - { from: source, to: counts }
  - { from: counts, to: sink }
";

#[test]
fn a_few_keys_are_scaled_up_to_isolate_the_hot_group_and_held_there() {
    let (_dir, report, stdout, summary, steps) = run_counting_steps(FEW_KEYS_JOB, "30s");
    // Scaled up, not held at p=1: the first step already separates the hot group from the
    // other keys (at least one subtask per loaded group, 9 of them), at most one correction
    // follows, and it stays far from the 128 key groups.
    assert!(
        !steps.is_empty() && steps[0] >= 9,
        "counts was not scaled up to isolate its hot key group (steps {steps:?}):\n{stdout}"
    );
    assert!(
        steps.len() <= 2 && steps.iter().all(|&p| p <= 32),
        "counts was not held once isolated (steps {steps:?}):\n{stdout}"
    );
    // The plan says why it holds there: the hot key group, named by its index.
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("hot-key bottleneck: key group 117 takes")
                && l.contains(" isolates it")),
        "{stdout}"
    );
    // Throughput rises: the run's sources emitted more than twice what one subtask carries
    // (the capacity measured at p=1, its last reading, from the most records), on average over
    // the whole run, the p=1 part and the rescale's downtime included.
    let timeline = std::fs::read_to_string(report.join("timeline.csv")).expect("timeline.csv");
    let mut rows = timeline.lines();
    let header: Vec<&str> = rows.next().expect("header").split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no {name} column in {timeline}"))
    };
    let (cap, p) = (col("capacity"), col("p_counts"));
    let cap_at_1 = rows
        .map(|r| r.split(',').collect::<Vec<_>>())
        .filter(|r| r[p] == "1")
        .filter_map(|r| r[cap].parse::<f64>().ok().filter(|c| *c > 0.0))
        .next_back()
        .unwrap_or_else(|| panic!("no capacity measured at p=1:\n{timeline}"));
    let emitted = summary["records_emitted"]
        .as_f64()
        .expect("records_emitted");
    let duration = summary["duration_s"].as_f64().expect("duration_s");
    assert!(
        emitted / duration > 2.0 * cap_at_1,
        "{emitted} records in {duration} s, capacity at p=1 {cap_at_1} rec/s:\n{stdout}"
    );
}

/// The kzipf job: three sources of 20 %, 30 % and 50 % of 2000 records/s (one key, 20 keys,
/// 1000 keys) into a keyed window that takes 2 ms of blocking wait a record (μ ≈ 470
/// records/s per subtask, 329 at the target utilization 0.7). Key group 0 (the hot source's
/// key, one of the warm keys and 5 of the cold ones) takes 435 records/s, 21.75 %
/// ([`kzipf_hot_share`]): more than a subtask takes at the target, under its μ, so its
/// subtask runs near saturation once isolated.
const KZIPF_JOB: &str = "\
name: kzipf
operators:
  - { name: hot, kind: source, keys: 1, rate: { constant: 400 } }
  - { name: warm, kind: source, keys: 20, rate: { constant: 600 } }
  - { name: cold, kind: source, keys: 1000, rate: { constant: 1000 } }
  - { name: counts, kind: window, sizeMs: 1000, io: 2000 }
  - { name: sink, kind: sink }
edges:
  - { from: hot, to: counts }
  - { from: warm, to: counts }
  - { from: cold, to: counts }
  - { from: counts, to: sink }
";

/// How far the hot group's share the planner reads once the group is isolated may lie above
/// the true one (absolute): the saturated subtask's floor counts the backlog it drains itself
/// too (+0.75 points at most in the runs measured, 21.5–22.5 % for 21.75 %).
const SHARE_TOLERANCE: f64 = 0.02;

/// How far it may lie below: the reading is a lower bound on the offered share (what the
/// saturated subtask processed, lifted by the catch-up deficit), and a machine that also
/// starves the hot subtask of CPU lowers it further: with two builds beside the test suite
/// (load ≈ 6 on 2 cores) the first window read 18.9 % for 21.75 %, and the operator was still
/// held as a hot-key bottleneck, which is what the reading is for.
const SHARE_TOLERANCE_BELOW: f64 = 0.04;

/// The same for the claim at p=1, where the one subtask is saturated and every source blocks
/// on its channel: the mix it processes is how the blocked sources' emissions interleave, not
/// their arrival rates, and the claim takes the lower bound 2·√(h·n) records off (read 19.5,
/// 20.1, 23.8 and 24.0 % in four runs).
const CLAIM_TOLERANCE: f64 = 0.04;

/// The true share of [`KZIPF_JOB`]'s hot key group: each source's rate times the share of its
/// keys that hash to that group (the engine's `key_group` of 128), over the total.
fn kzipf_hot_share() -> (u32, f64) {
    use streamscale_engine::keygroup::key_group;
    let g = key_group(0, 128);
    let load: f64 = [(400.0, 1), (600.0, 20), (1000.0, 1000)]
        .iter()
        .map(|&(rate, keys)| {
            let n = (0..keys).filter(|&k| key_group(k, 128) == g).count();
            rate * n as f64 / keys as f64
        })
        .sum();
    (g, load / 2000.0)
}

/// The share in a hot-key reason (`… key group G takes X% of …`), as a fraction.
fn reason_share(reason: &str, group: u32) -> Option<f64> {
    let after = reason.split(&format!("key group {group} takes ")).nth(1)?;
    after
        .split('%')
        .next()?
        .parse::<f64>()
        .ok()
        .map(|x| x / 100.0)
}

#[test]
fn an_isolated_hot_key_group_stays_at_limit_while_its_subtask_is_saturated() {
    let (group, truth) = kzipf_hot_share();
    assert!((truth - 0.2175).abs() < 1e-9, "{truth}");
    let (_dir, _report, stdout, _summary, steps) = run_counting_steps(KZIPF_JOB, "40s");
    let lines: Vec<&str> = stdout.lines().collect();
    let first = lines
        .iter()
        .position(|l| l.contains(" AT LIMIT counts=") && l.contains("hot-key bottleneck"))
        .unwrap_or_else(|| panic!("no hot-key AT LIMIT line:\n{stdout}"));
    // The claim reads the group's share within the tolerance.
    let share = reason_share(lines[first], group)
        .unwrap_or_else(|| panic!("no share of key group {group}: {}", lines[first]));
    assert!(
        (share - truth).abs() <= CLAIM_TOLERANCE,
        "read {share}, true {truth}:\n{stdout}"
    );
    assert!(
        !steps.is_empty() && steps.iter().all(|&p| p <= 64),
        "{steps:?}:\n{stdout}"
    );
    // Once held, it is not released while the hot subtask is saturated: a WITHIN LIMITS line
    // may only follow a progress line whose busiest counts subtask runs under 0.9 (the
    // planner's SATURATED), e.g. `counts=64(ρ0.07 max1.00)` forbids it. (The old reading gave
    // WITHIN LIMITS right after the restore at p=64, with `max1.00` and p99 over the SLO.)
    for (k, l) in lines.iter().enumerate().skip(first) {
        if !l.contains("WITHIN LIMITS again") {
            continue;
        }
        let before = lines[..k]
            .iter()
            .rev()
            .find(|l| l.contains(" counts="))
            .unwrap_or_else(|| panic!("no progress line before {l}"));
        let busiest = before
            .split(" counts=")
            .nth(1)
            .and_then(|rest| rest.split(" max").nth(1))
            .and_then(|m| m.split(')').next())
            .and_then(|m| m.parse::<f64>().ok());
        assert!(
            busiest.is_none_or(|m| m < 0.9),
            "released while the hot subtask was saturated ({before}):\n{stdout}"
        );
    }
}

/// Starts `streamscale-engine` in `dir` with `args`; returns it and its REST base URL.
fn start_engine(dir: &std::path::Path, args: &[&str]) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child =
        std::process::Command::new(streamscale_tests::workspace_bin("streamscale-engine"))
            .current_dir(dir)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start streamscale-engine");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("listening line");
    let v: serde_json::Value = serde_json::from_str(&line).expect("listening JSON");
    let address = v["address"].as_str().expect("address").to_string();
    (child, format!("http://{address}"))
}

/// The bug's cause, on the real engine: restored at p=64 after a few seconds at p=1 (as
/// `streamscale run` rescales it), the other subtasks catch up the backlog while the hot
/// subtask, saturated, processes only its μ, so the hot subtask's share of what the operator
/// processed reads far under its group's share (the old reading, checked here to be off, so
/// that the test covers the case). The planner reads the group at its true share within the
/// tolerances, and holds the operator as a hot-key bottleneck, in every window from the
/// stabilization on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hot_share_reads_true_while_the_other_subtasks_catch_up() {
    use streamscale_controller::api::EngineApi;
    use streamscale_controller::model::{MetricSample, PlannerSettings, estimate, plan};
    use streamscale_engine::spec::JobSpec;

    let (group, truth) = kzipf_hot_share();
    let (dir, job, _report) = fixtures::job_dir(KZIPF_JOB);
    let job = job.to_str().expect("utf-8 path").to_string();
    let client = reqwest::Client::new();
    let (mut first, url) = start_engine(dir.path(), &["--job", &job]);
    let api = EngineApi::new(client.clone(), &url);
    api.wait_running(std::time::Duration::from_secs(30))
        .await
        .expect("running");
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let savepoint = api
        .stop_with_savepoint(false, std::time::Duration::from_secs(60))
        .await
        .expect("stop with savepoint")
        .path;
    let _ = first.wait();
    // The rescale's downtime: the sources' backlog grows meanwhile.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let (mut second, url) = start_engine(
        dir.path(),
        &[
            "--job",
            &job,
            "--restore",
            &savepoint,
            "--parallelism",
            "counts=64",
        ],
    );
    let api = EngineApi::new(client.clone(), &url);
    api.wait_running(std::time::Duration::from_secs(30))
        .await
        .expect("restored");
    let start = std::time::Instant::now();
    let mut samples: Vec<MetricSample> = Vec::new();
    for k in 0..9 {
        let at = start + std::time::Duration::from_secs(k);
        tokio::time::sleep_until(at.into()).await;
        let m = streamscale_controller::scrape::scrape(
            &client,
            &api.metrics_url(),
            start.elapsed().as_secs_f64(),
        )
        .await
        .expect("scrape");
        samples.push(m.sample);
    }
    let _ = second.kill();
    let _ = second.wait();
    let spec = JobSpec::from_yaml(KZIPF_JOB)
        .expect("job")
        .with_parallelism(&[("counts".to_string(), 64)].into_iter().collect());
    let mut old_low = false;
    let mut table = String::new();
    // Windows from the restore on, as the run plans after its 3 s stabilization.
    for end in 3..samples.len() {
        let window = &samples[..=end];
        let est = estimate(&spec, window).expect("estimates");
        let counts = &est.operators["counts"];
        let hot = (0..counts.subtask_key_group_shares.len())
            .find(|&j| {
                counts.subtask_key_group_shares[j]
                    .first()
                    .is_some_and(|&(g, _)| g == group)
            })
            .unwrap_or_else(|| panic!("no subtask lists key group {group}: {counts:?}"));
        // What the planner used to read: the subtask's share of the processed input times
        // the group's conservative share of the subtask.
        let old = counts.subtask_input_shares[hot] * counts.subtask_key_group_shares[hot][0].1;
        old_low |= old < truth - SHARE_TOLERANCE;
        let d = plan(&spec, window, &PlannerSettings::default()).expect("plans");
        let reason = d
            .reasons
            .iter()
            .find(|r| r.starts_with("counts: hot-key bottleneck"))
            .unwrap_or_else(|| panic!("window to {end} s: not held: {:?}\n{table}", d.reasons));
        let share = reason_share(reason, group).unwrap_or_else(|| panic!("{reason}"));
        table.push_str(&format!(
            "window 0..{end} s: old {old:.4}, read {share:.4}, true {truth:.4}, saturation {:.2}\n",
            counts.subtask_saturation[hot]
        ));
        assert!(
            share <= truth + SHARE_TOLERANCE && share >= truth - SHARE_TOLERANCE_BELOW,
            "window to {end} s: read {share}, true {truth}: {reason}\n{table}"
        );
    }
    eprintln!("{table}");
    assert!(
        old_low,
        "the catch-up did not bias the old reading: the test does not cover the case\n{table}"
    );
}
