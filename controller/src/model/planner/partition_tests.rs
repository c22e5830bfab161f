//! Partition alignment of Kafka sources: the planner's sizing of a source from its partition
//! count and its μ (records read per busy second).

use super::*;
use crate::model::sample::SubtaskSample;
use crate::model::testutil::job;

const KAFKA_JOB: &str = r#"
name: kafka
operators:
  - { name: src, kind: source, kafka: { topic: t, bootstrapServers: "127.0.0.1:39092" } }
  - { name: sink, kind: sink }
edges:
  - { from: src, to: sink }
"#;

/// A 10 s window of one source subtask reading μ = 1000 records per busy second, fully busy,
/// while γ records/s arrive (`partitions`: the `streamscale_source_partitions` gauge).
fn window(gamma: f64, partitions: Option<f64>) -> Vec<MetricSample> {
    let sample = |t: f64| {
        let src = SubtaskSample {
            records_out: 1000.0 * t,
            busy_seconds: t,
            source_arrivals: Some(gamma * t),
            source_backlog: Some(0.0),
            source_partitions: partitions,
            ..SubtaskSample::default()
        };
        let sink = SubtaskSample {
            records_in: 1000.0 * t,
            busy_seconds: 0.01 * t,
            ..SubtaskSample::default()
        };
        MetricSample {
            at_seconds: t,
            operators: [
                ("src".to_string(), vec![src]),
                ("sink".to_string(), vec![sink]),
            ]
            .into_iter()
            .collect(),
        }
    };
    vec![sample(10.0), sample(20.0)]
}

fn plan_src(spec: &JobSpec, gamma: f64, partitions: Option<f64>) -> (Decision, OperatorPlan) {
    let d = plan(
        spec,
        &window(gamma, partitions),
        &PlannerSettings::default(),
    )
    .expect("plans");
    let src = d.operators["src"].clone();
    (d, src)
}

#[test]
fn a_source_with_six_partitions_is_sized_to_a_divisor_never_above_six() {
    let spec = job(KAFKA_JOB);
    // ρ_target 0.7 × μ 1000 = 700 rec/s per subtask. γ 1800: p=2 reads 3 partitions
    // (900 rec/s), p=3 reads 2 (600): 3. p=4 and p=5 leave a subtask with 2 partitions as well.
    let (_, src) = plan_src(&spec, 1800.0, Some(6.0));
    assert_eq!(src.parallelism, 3, "{}", src.reason);
    assert_eq!(src.max_parallelism, 6);
    assert!(!src.clamped_at_max);
    assert!(src.reason.contains("6 partitions"), "{}", src.reason);
    // γ 2200: 2 partitions per subtask is 733 rec/s > 700; 4 or 5 subtasks still give one of
    // them 2 partitions, so only 6 serves.
    let (_, src) = plan_src(&spec, 2200.0, Some(6.0));
    assert_eq!(src.parallelism, 6, "{}", src.reason);
    // 500 rec/s: one subtask.
    let (_, src) = plan_src(&spec, 500.0, Some(6.0));
    assert_eq!(src.parallelism, 1, "{}", src.reason);
    // Every rate from 100 to 9000 rec/s: never 4 or 5, never above 6.
    for gamma in (1..=90).map(|k| f64::from(k) * 100.0) {
        let (_, src) = plan_src(&spec, gamma, Some(6.0));
        assert!(
            [1, 2, 3, 6].contains(&src.parallelism),
            "γ {gamma}: p={} ({})",
            src.parallelism,
            src.reason
        );
    }
}

#[test]
fn a_source_past_its_partitions_is_at_its_limit() {
    let spec = job(KAFKA_JOB);
    // 7000 rec/s over 6 partitions: each subtask would read 1167 rec/s > μ 1000.
    let (d, src) = plan_src(&spec, 7000.0, Some(6.0));
    assert_eq!(src.parallelism, 6);
    assert!(src.clamped_at_max);
    assert!(src.predicted_utilization.expect("ρ") > 1.0);
    assert!(
        d.reasons
            .iter()
            .any(|r| r.starts_with("src: needs p=7") && r.contains("its topic has 6 partitions")),
        "{:?}",
        d.reasons
    );
    let learned = crate::model::learn::ScalabilityTracker::default();
    assert_eq!(
        crate::progress::overloaded_held(&d, &learned),
        vec!["src".to_string()],
        "reported AT LIMIT"
    );
}

#[test]
fn a_lower_max_is_aligned_too_and_other_sources_keep_their_parallelism() {
    let spec = job(&KAFKA_JOB.replace(
        "bootstrapServers: \"127.0.0.1:39092\" } }",
        "bootstrapServers: \"127.0.0.1:39092\" }, scaling: { max: 4 } }",
    ));
    // Needs 6; a max of 4 gives what 3 gives (one subtask reads 2 partitions either way).
    let (_, src) = plan_src(&spec, 2200.0, Some(6.0));
    assert_eq!(src.parallelism, 3, "{}", src.reason);
    assert!(src.clamped_at_max);
    // Without a partition count (not a Kafka source, an older engine) a source is not sized.
    let (_, src) = plan_src(&job(KAFKA_JOB), 2200.0, None);
    assert_eq!(src.parallelism, 1, "{}", src.reason);
    assert!(src.reason.contains("not rescaled"), "{}", src.reason);
}

#[test]
fn alignment_is_the_smallest_parallelism_with_the_same_busiest_share() {
    for n in 1..=64u32 {
        for p in 1..=n + 3 {
            let a = align_to_partitions(n, p);
            assert!(a >= 1 && a <= p.min(n), "n={n} p={p}: {a}");
            assert_eq!(partition_share(n, a), partition_share(n, p), "n={n} p={p}");
            if a > 1 {
                assert!(
                    partition_share(n, a - 1) > partition_share(n, a),
                    "n={n} p={p}"
                );
            }
        }
    }
    let six: Vec<u32> = (1..=8).map(|p| align_to_partitions(6, p)).collect();
    assert_eq!(six, [1, 2, 3, 3, 3, 6, 6, 6]);
}

#[test]
fn a_saturated_kafka_source_counts_in_the_assessment_of_a_parallelism() {
    // One subtask reading μ = 1000 records per busy second while 1800 arrive: at p=1 it runs
    // at ρ 1.8, at p=3 (2 partitions each) at 0.6. The rescale's cost guard weighs these
    // figures; without the source's own μ they said ρ 0 (the sink's) and held a needed
    // scale-up as "not worth its cost".
    let spec = job(KAFKA_JOB);
    let model = Model::new(
        &spec,
        &window(1800.0, Some(6.0)),
        &PlannerSettings::default(),
    )
    .expect("model");
    let at = |p: u32| {
        let par: BTreeMap<&str, u32> = [("src", p), ("sink", 1)].into_iter().collect();
        model.assess(&par)
    };
    let (target_now, steady_now, _) = at(1);
    assert!((steady_now - 1.8).abs() < 1e-6, "{steady_now}");
    assert!(target_now >= steady_now, "{target_now}");
    let (_, steady_three, _) = at(3);
    assert!((steady_three - 0.6).abs() < 1e-6, "{steady_three}");
    // The cost guard's figure for the new parallelism (operators not named keep theirs).
    let three: BTreeMap<&str, u32> = [("src", 3)].into_iter().collect();
    let drain_rho = model.assess_steady_rho(&three);
    assert!((drain_rho - 0.6).abs() < 1e-6, "{drain_rho}");
}
