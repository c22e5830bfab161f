//! Task slots: how many a Flink job holds, how many it may use, and the plan held within them.
//!
//! With one slot-sharing group (Flink's default: every vertex in group `default`), a slot
//! holds one subtask of every vertex, so a job holds as many slots as its largest vertex has
//! subtasks (Flink docs, "Task Slots and Resources"). A limit on slots is therefore a limit
//! on every vertex's parallelism.

use std::collections::BTreeMap;

use streamscale_engine::spec::JobSpec;

use super::rest::JobDetails;
use crate::model::Decision;

/// The slots a job with parallelism `p` (per vertex) holds: its largest vertex's parallelism.
pub fn held(p: &BTreeMap<String, u32>) -> u32 {
    p.values().copied().max().unwrap_or(0)
}

/// The slots `job` may use: the cluster's `available` slots plus those it holds.
pub fn limit(available: u32, job: &JobDetails) -> u32 {
    available.saturating_add(
        job.vertices
            .iter()
            .map(|v| v.parallelism)
            .max()
            .unwrap_or(0),
    )
}

/// The slots a job holding `held` slots may use in a cluster with `total` slots of which
/// `available` are free (`GET /overview`), or `None` when no limit applies.
///
/// * `grows`: the cluster starts TaskManagers for the slots asked (Flink's active resource
///   manager: a native Kubernetes deployment); otherwise its TaskManagers are fixed
///   (standalone) and the job may use the free slots plus those it holds;
/// * `max_total`: the cluster's cap on its slots (`slotmanager.number-of-slots.max`): the job
///   may use it minus the slots other jobs hold, `total − available − held`.
pub fn job_limit(
    total: u32,
    available: u32,
    held: u32,
    grows: bool,
    max_total: Option<u32>,
) -> Option<u32> {
    let fixed = (!grows).then(|| available.saturating_add(held));
    let others = total.saturating_sub(available).saturating_sub(held);
    let capped = max_total.map(|m| m.saturating_sub(others));
    match (fixed, capped) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Caps every operator's `scaling.max` of a planning `spec` at `limit` slots (never below its
/// `scaling.min`).
pub fn cap(spec: &mut JobSpec, limit: u32) {
    for op in &mut spec.operators {
        let max = op.scaling.max.unwrap_or(limit).min(limit);
        op.scaling.max = Some(max.max(op.scaling.min.unwrap_or(1)));
    }
}

/// The note for a plan held at `limit` slots (`what` says where the limit comes from): `None`
/// unless some vertex is planned at `limit` and needed more (clamped at its maximum).
pub fn held_note(decision: &Decision, limit: u32, what: &str) -> Option<String> {
    let held: Vec<&str> = decision
        .operators
        .iter()
        .filter(|(n, o)| o.clamped_at_max && decision.parallelism.get(&***n) == Some(&limit))
        .map(|(n, _)| &**n)
        .collect();
    (!held.is_empty()).then(|| {
        format!(
            "held at {limit} slots ({what}): {} would need more",
            held.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_holds_its_largest_vertex_in_slots() {
        let p: BTreeMap<String, u32> = [("a".to_string(), 2), ("b".to_string(), 5)].into();
        assert_eq!(held(&p), 5);
        assert_eq!(held(&BTreeMap::new()), 0);
    }

    #[test]
    fn the_limit_is_the_free_slots_of_a_fixed_cluster_or_its_max() {
        // 8 slots, 3 free, the job holds 2 (3 held by another job).
        assert_eq!(job_limit(8, 3, 2, false, None), Some(5));
        // TaskManagers come on demand: no limit, unless the cluster caps its slots.
        assert_eq!(job_limit(8, 3, 2, true, None), None);
        assert_eq!(job_limit(8, 3, 2, true, Some(10)), Some(7));
        assert_eq!(job_limit(8, 3, 2, false, Some(4)), Some(1));
        assert_eq!(job_limit(8, 3, 2, true, Some(2)), Some(0));
    }

    #[test]
    fn a_plan_capped_at_the_slots_is_held_there_and_says_so() {
        use crate::model::testutil::{Synth, job, window};
        use crate::model::{PlannerSettings, plan};
        // 1,000 records/s into a map serving 100/s per subtask: it needs about 15 subtasks.
        let mut spec = job(
            "name: j\noperators:\n  - {name: src, kind: source, rate: {constant: 1000}}\n  \
             - {name: map, kind: map, parallelism: 2}\n  - {name: sink, kind: sink}\nedges:\n  \
             - {from: src, to: map}\n  - {from: map, to: sink}\n",
        );
        let w = window(
            &[
                Synth::source("src", 1, 1000.0, 0.0),
                Synth::op("map", 2, 1000.0, 100.0, 1.0),
                Synth::op("sink", 1, 1000.0, 1e6, 1.0),
            ],
            &[0.0, 10.0, 20.0],
        );
        cap(&mut spec, 4);
        let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
        assert_eq!(d.parallelism["map"], 4);
        let note = held_note(&d, 4, "the Flink cluster has 4 slots, 2 free").expect("held");
        assert_eq!(
            note,
            "held at 4 slots (the Flink cluster has 4 slots, 2 free): map would need more"
        );
        assert_eq!(held_note(&d, 5, "x"), None, "nothing is planned at 5");
    }

    #[test]
    fn cap_lowers_every_max_but_not_below_the_min() {
        let mut spec = JobSpec::from_yaml(
            "name: j\noperators:\n  - {name: s, kind: source, rate: {constant: 1}}\n  \
             - {name: m, kind: map, scaling: {min: 3, max: 8}}\nedges:\n  - {from: s, to: m}\n",
        )
        .expect("spec");
        cap(&mut spec, 2);
        assert_eq!(spec.operators[0].scaling.max, Some(2));
        assert_eq!(spec.operators[1].scaling.max, Some(3), "the min wins");
    }
}
