//! Several StreamJobs under one `StreamQuota`: each job's share of the quota, from the jobs'
//! demands, by the controller's [`allocate`] (every operator its lower bound, each job what it
//! needs up to an equal share ⌊Q/J⌋, the rest by marginal benefit: admitted share of the load
//! per subtask, as in DRS, Fu et al. ICDCS 2015 §IV).
//!
//! A job's demand is, per non-source operator, the subtasks it needs for its whole target load
//! at the target utilization, `need = λ / (ρ_target μ)` (DS2 sizing before rounding), taken
//! from its last plan and kept in its `status.quota.demand`, so that every reconcile (of any
//! member, by any operator replica, after a restart) sees every member's latest demand. A job
//! that has not planned yet demands what it runs.
//!
//! A FlinkScaler naming the quota is a member too, counted in task slots: with one
//! slot-sharing group (Flink's default) a Flink job holds as many slots as its largest vertex
//! has subtasks, and a slot runs one subtask of every vertex, so a slot is the unit that
//! takes a CPU share like one engine subtask ([`slots_demand`]).
//!
//! The quota bounds what runs, not only what is planned: a job may grow only into subtasks the
//! other members do not hold (during a rescale a job holds the larger of its old and new
//! parallelism), and a job holding more than its share is rescaled down to it (see
//! [`Share::cap`]).

use std::collections::BTreeMap;

use streamscale_controller::model::Decision;
use streamscale_controller::model::quota::{
    JobAllocation, JobDemand, OperatorDemand, QuotaError, allocate,
};
use streamscale_engine::spec::{JobSpec, OperatorKind};

use crate::crd::{OperatorDemandStatus, QuotaShareStatus, StreamJob};
use crate::flink_scaler_crd::FlinkScaler;

/// Whether `name` is a source of `spec` (sources do not count against a quota).
fn is_source(spec: &JobSpec, name: &str) -> bool {
    spec.operators
        .iter()
        .any(|o| o.name == name && matches!(o.kind, OperatorKind::Source { .. }))
}

/// Σ subtasks of the non-source operators of `spec` in `p`.
pub fn non_source_total(spec: &JobSpec, p: &BTreeMap<String, u32>) -> u32 {
    p.iter()
        .filter(|(n, _)| !is_source(spec, n))
        .map(|(_, v)| *v)
        .sum()
}

/// The parallelism a job that runs more non-source subtasks than its quota share
/// (`q.running_subtasks > q.allocated_subtasks`) must be rescaled down to now, or `None` when
/// no forced rescale is needed.
///
/// * `planned`: the planner's decision or recommendation; used when it already fits the share
///   and differs from `current` but the planner held it back (`rescaling == false`, e.g. a
///   scale-down guard or its rescale-cost check);
/// * `limit`: the limit plan sized to the share; used when `planned` does not fit.
///
/// `None` when the job is within its share, when neither plan fits, when the fitting plan is the
/// current parallelism, or when the planner already rescales to a plan that fits.
pub fn forced_scale_down(
    spec: &JobSpec,
    q: &QuotaShareStatus,
    current: &BTreeMap<String, u32>,
    planned: &BTreeMap<String, u32>,
    rescaling: bool,
    limit: Option<&BTreeMap<String, u32>>,
) -> Option<BTreeMap<String, u32>> {
    if q.running_subtasks <= q.allocated_subtasks {
        return None;
    }
    let fits = |p: &BTreeMap<String, u32>| {
        non_source_total(spec, p) <= q.allocated_subtasks && p != current
    };
    if fits(planned) {
        return (!rescaling).then(|| planned.clone());
    }
    limit.filter(|lp| fits(lp)).cloned()
}

/// The parallelism `job` holds now: its current one, or during a rescale the larger of the
/// old and new parallelism per operator (both may run while it restores).
pub fn held(job: &StreamJob) -> BTreeMap<String, u32> {
    let status = job.status.clone().unwrap_or_default();
    let mut p = if status.current_parallelism.is_empty() {
        job.spec.job.parallelism()
    } else {
        status.current_parallelism
    };
    if let Some(r) = &status.rescale {
        for (n, v) in r.from.iter().chain(&r.to) {
            let e = p.entry(n.clone()).or_insert(*v);
            *e = (*e).max(*v);
        }
    }
    p
}

/// The slots a FlinkScaler's job holds now: its largest vertex's parallelism, or during a
/// rescale the larger of the old and new parallelism (see [`held`]).
pub fn flink_held(scaler: &FlinkScaler) -> u32 {
    let Some(status) = &scaler.status else {
        return 0;
    };
    let mut most = slots_held(&status.current_parallelism);
    if let Some(r) = &status.rescale {
        most = most.max(slots_held(&r.from)).max(slots_held(&r.to));
    }
    most
}

/// (min, max) parallelism of operator `op` of a planning spec (scaling bounds folded in,
/// capped by `maxParallelism`).
fn bounds(spec: &JobSpec, op: &str) -> (u32, u32) {
    let o = spec.operators.iter().find(|o| o.name == op);
    let max = o
        .and_then(|o| o.scaling.max)
        .unwrap_or(spec.max_parallelism)
        .min(spec.max_parallelism)
        .max(1);
    let min = o.and_then(|o| o.scaling.min).unwrap_or(1).clamp(1, max);
    (min, max)
}

/// The demand of a job that has not planned yet: what it runs (`p`, non-source operators of
/// the planning `spec`), within its bounds.
pub fn demand_from_parallelism(
    spec: &JobSpec,
    p: &BTreeMap<String, u32>,
) -> Vec<OperatorDemandStatus> {
    p.iter()
        .filter(|(n, _)| !is_source(spec, n))
        .map(|(n, &v)| {
            let (min, max) = bounds(spec, n);
            OperatorDemandStatus {
                name: n.clone(),
                need: f64::from(v.clamp(min, max)),
                min,
                max,
            }
        })
        .collect()
}

/// The demand from a plan: `λ / (ρ_target μ)` per non-source operator with a known true
/// processing rate μ (records/s per subtask) and target arrival rate λ (records/s, catch-up
/// included); the current parallelism where μ is unknown. Bounds from the planning `spec`.
pub fn demand_from_decision(d: &Decision, spec: &JobSpec) -> Vec<OperatorDemandStatus> {
    let rho = d.target_utilization;
    d.operators
        .iter()
        .filter(|(n, o)| o.kind != "source" && !is_source(spec, n))
        .map(|(n, o)| {
            let (min, max) = bounds(spec, n);
            let need = match o.true_processing_rate {
                Some(mu) if mu > 0.0 && rho > 0.0 && o.arrival_rate.is_finite() => {
                    (o.arrival_rate.max(0.0) / (rho * mu)).min(f64::from(max))
                }
                _ => f64::from(o.current_parallelism.clamp(min, max)),
            };
            OperatorDemandStatus {
                name: n.to_string(),
                need,
                min,
                max,
            }
        })
        .collect()
}

/// The name of a Flink job's single quota demand: its task slots.
pub const SLOTS: &str = "slots";

/// The name a FlinkScaler has among a quota's members (`FlinkScaler/NAME`; StreamJobs go by
/// their bare name, so the two kinds never clash).
pub fn flink_member_name(name: &str) -> String {
    format!("FlinkScaler/{name}")
}

/// A Flink job's demand on a quota, in task slots, from its per-vertex demand `per_vertex`
/// (non-source vertices, as [`demand_from_decision`] or [`demand_from_parallelism`] give
/// it) and the parallelism `p` it runs: one demand named [`SLOTS`]. With one slot-sharing
/// group a job holds as many slots as its largest vertex has subtasks, so it needs the
/// largest need of any vertex, at least the largest source parallelism (sources are not
/// rescaled but hold their slots) and every vertex's lower bound.
pub fn slots_demand(
    spec: &JobSpec,
    per_vertex: &[OperatorDemandStatus],
    p: &BTreeMap<String, u32>,
) -> Vec<OperatorDemandStatus> {
    let sources = p
        .iter()
        .filter(|(n, _)| is_source(spec, n))
        .map(|(_, v)| *v)
        .max()
        .unwrap_or(0);
    let min = per_vertex
        .iter()
        .map(|o| o.min)
        .max()
        .unwrap_or(1)
        .max(sources)
        .max(1);
    let max = per_vertex
        .iter()
        .map(|o| o.max)
        .max()
        .unwrap_or(min)
        .max(min);
    let need = per_vertex
        .iter()
        .map(|o| o.need)
        .fold(f64::from(sources), f64::max)
        .clamp(f64::from(min), f64::from(max));
    vec![OperatorDemandStatus {
        name: SLOTS.to_string(),
        need,
        min,
        max,
    }]
}

/// The parallelism a Flink job holding more slots than its quota share
/// (`q.running_subtasks > q.allocated_subtasks`, both in slots) must be rescaled down to now:
/// `planned` when it fits the share, differs from `current` and the planner held it back
/// (`rescaling == false`); else `current` with every vertex capped at the share; `None` when
/// the job is within its share, the planner already rescales to a plan that fits, or nothing
/// would change.
pub fn forced_slots_scale_down(
    q: &QuotaShareStatus,
    current: &BTreeMap<String, u32>,
    planned: &BTreeMap<String, u32>,
    rescaling: bool,
) -> Option<BTreeMap<String, u32>> {
    if q.running_subtasks <= q.allocated_subtasks {
        return None;
    }
    let share = q.allocated_subtasks.max(1);
    if slots_held(planned) <= share && planned != current {
        return (!rescaling).then(|| planned.clone());
    }
    let capped: BTreeMap<String, u32> = current
        .iter()
        .map(|(n, v)| (n.clone(), (*v).min(share)))
        .collect();
    (capped != *current).then_some(capped)
}

/// The slots a Flink job with parallelism `p` (per vertex) holds: its largest vertex's.
pub fn slots_held(p: &BTreeMap<String, u32>) -> u32 {
    streamscale_controller::flink::slots::held(p)
}

/// One member of a quota: its name, demand and the non-source subtasks it holds now.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// StreamJob name, or [`flink_member_name`] of a FlinkScaler.
    pub name: String,
    /// Its demand (non-source operators; a Flink job's [`slots_demand`]).
    pub demand: Vec<OperatorDemandStatus>,
    /// Non-source subtasks it holds now (see [`held`]; a Flink job's slots, [`slots_held`]).
    pub held: u32,
}

/// One job's share of a quota.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// The job's allocation by marginal benefit (parallelism per non-source operator and the
    /// admitted share of its load).
    pub allocation: JobAllocation,
    /// Σ of the allocation's parallelism: the subtasks the job may run.
    pub allocated: u32,
    /// Subtasks the job may plan for now: its allocation, but no more than the quota minus
    /// what the other members hold, unless it already holds more (it then keeps what it
    /// holds until it is rescaled down to its allocation).
    pub cap: u32,
    /// Subtasks the job holds now.
    pub held: u32,
    /// The allocation in words (every member's share).
    pub message: String,
}

/// The share of member `own` of a quota of `quota` subtasks split across `members` (`own`
/// among them; members are ordered by name, ties go to the first).
///
/// # Errors
/// [`QuotaError`] when the members' lower bounds exceed the quota or a demand is invalid.
pub fn share(own: &str, members: &[Member], quota: u32) -> Result<Share, QuotaError> {
    let mut members: Vec<&Member> = members.iter().collect();
    members.sort_by(|a, b| a.name.cmp(&b.name));
    let demands: Vec<JobDemand> = members
        .iter()
        .map(|m| JobDemand {
            name: m.name.clone(),
            operators: m
                .demand
                .iter()
                .map(|o| OperatorDemand {
                    name: o.name.clone(),
                    need: o.need,
                    min: o.min,
                    max: o.max,
                })
                .collect(),
        })
        .collect();
    let alloc = allocate(&demands, quota)?;
    let allocation = alloc.get(own).cloned().unwrap_or(JobAllocation {
        parallelism: BTreeMap::new(),
        admitted_share: 1.0,
    });
    let allocated: u32 = allocation.parallelism.values().sum();
    let held = members.iter().find(|m| m.name == own).map_or(0, |m| m.held);
    let others: u32 = members
        .iter()
        .filter(|m| m.name != own)
        .map(|m| m.held)
        .sum();
    let free = quota.saturating_sub(others);
    let cap = allocated.min(free.max(held));
    let message = members
        .iter()
        .map(|m| {
            let a = &alloc[&m.name];
            format!(
                "{} {} subtasks ({:.0}% of its load)",
                m.name,
                a.parallelism.values().sum::<u32>(),
                100.0 * a.admitted_share
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    Ok(Share {
        allocation,
        allocated,
        cap,
        held,
        message: format!("quota {quota} subtasks: {message}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(needs: &[(&str, f64)]) -> Vec<OperatorDemandStatus> {
        needs
            .iter()
            .map(|(n, need)| OperatorDemandStatus {
                name: (*n).to_string(),
                need: *need,
                min: 1,
                max: 8,
            })
            .collect()
    }

    fn member(name: &str, needs: &[(&str, f64)], held: u32) -> Member {
        Member {
            name: name.into(),
            demand: demand(needs),
            held,
        }
    }

    #[test]
    fn the_steady_job_keeps_its_need_when_the_other_spikes() {
        // Quota 6 (fair share 3): steady needs work 1.7 + sink 0.1 = 3 subtasks, spiky 5.7 + 1.
        let members = [
            member("steady", &[("work", 1.7), ("sink", 0.1)], 2),
            member("spiky", &[("work", 5.7), ("sink", 0.2)], 2),
        ];
        let s = share("steady", &members, 6).expect("fits");
        assert_eq!((s.allocated, s.cap), (3, 3));
        assert_eq!(s.allocation.admitted_share, 1.0);
        let p = share("spiky", &members, 6).expect("fits");
        assert_eq!((p.allocated, p.cap), (3, 3));
        assert!((p.allocation.admitted_share - 2.0 / 5.7).abs() < 1e-9);
        assert!(
            p.message.contains("steady 3 subtasks (100% of its load)"),
            "{}",
            p.message
        );
    }

    #[test]
    fn a_job_grows_only_into_subtasks_the_others_do_not_hold() {
        // spiky still holds 5 of 6 subtasks: steady, allocated its need 2, holds 1 and may not
        // grow past the 1 that is free until spiky has shrunk.
        let members = [
            member("steady", &[("work", 1.7)], 1),
            member("spiky", &[("work", 5.7)], 5),
        ];
        let s = share("steady", &members, 6).expect("fits");
        assert_eq!(s.allocated, 2);
        assert_eq!(s.cap, 1, "only 6 - 5 = 1 subtask is free");
        // spiky holds more than its allocation: its cap is the allocation (it is rescaled down).
        let p = share("spiky", &members, 6).expect("fits");
        assert_eq!((p.allocated, p.cap, p.held), (4, 4, 5));
    }

    #[test]
    fn lower_bounds_above_the_quota_are_an_error() {
        let members = [
            member("a", &[("x", 1.0), ("y", 1.0)], 2),
            member("b", &[("x", 1.0)], 1),
        ];
        let e = share("a", &members, 2).expect_err("mins exceed");
        assert!(e.to_string().contains("quota 2 subtasks"), "{e}");
    }

    #[test]
    fn demand_from_parallelism_skips_sources_and_respects_bounds() {
        let spec: JobSpec = serde_saphyr::from_str(
            "name: j\nmaxParallelism: 4\noperators:\n  - {name: s, kind: source, rate: {constant: 1}}\n  - {name: m, kind: map, parallelism: 6, scaling: {min: 2, max: 3}}\nedges:\n  - {from: s, to: m}\n",
        )
        .expect("spec");
        let p: BTreeMap<String, u32> = [("s".to_string(), 2), ("m".to_string(), 6)].into();
        let d = demand_from_parallelism(&spec, &p);
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].need, d[0].min, d[0].max), (3.0, 2, 3));
        assert_eq!(non_source_total(&spec, &p), 6);
    }

    fn three_operator_spec() -> JobSpec {
        JobSpec::from_yaml(
            "name: q\noperators:\n  - {name: source, kind: source, rate: {constant: 100}}\n  \
             - {name: work, kind: map}\n  - {name: sink, kind: sink}\nedges:\n  \
             - {from: source, to: work}\n  - {from: work, to: sink}\n",
        )
        .expect("spec")
    }

    fn quota_status(allocated: u32, running: u32) -> QuotaShareStatus {
        QuotaShareStatus {
            name: "team".into(),
            quota_subtasks: 6,
            allocated_subtasks: allocated,
            running_subtasks: running,
            admitted_share: 0.5,
            demand: Vec::new(),
            message: String::new(),
        }
    }

    fn par(work: u32) -> BTreeMap<String, u32> {
        [("source", 1), ("work", work), ("sink", 1)]
            .into_iter()
            .map(|(n, p)| (n.to_string(), p))
            .collect()
    }

    #[test]
    fn a_held_back_recommendation_within_the_share_is_forced() {
        // The CI failure of 2026-12-01: spiky ran work 3 + sink 1 = 4 of a share of 3, its
        // planner recommended work 2 (fits) but held (a scale-down guard), and the other job
        // waited for the subtask forever.
        let spec = three_operator_spec();
        let q = quota_status(3, 4);
        assert_eq!(
            forced_scale_down(&spec, &q, &par(3), &par(2), false, Some(&par(2))),
            Some(par(2))
        );
        // Already rescaling to a plan that fits: nothing to force.
        assert_eq!(
            forced_scale_down(&spec, &q, &par(3), &par(2), true, Some(&par(2))),
            None
        );
    }

    #[test]
    fn a_plan_over_the_share_falls_back_to_the_limit_plan() {
        let spec = three_operator_spec();
        let q = quota_status(3, 4);
        assert_eq!(
            forced_scale_down(&spec, &q, &par(3), &par(6), true, Some(&par(2))),
            Some(par(2))
        );
        // No limit plan, or one over the share or equal to what runs: no forced rescale.
        assert_eq!(
            forced_scale_down(&spec, &q, &par(3), &par(6), true, None),
            None
        );
        assert_eq!(
            forced_scale_down(&spec, &q, &par(3), &par(6), true, Some(&par(3))),
            None
        );
    }

    fn flink_spec() -> JobSpec {
        JobSpec::from_yaml(
            "name: f\noperators:\n  - {name: src, kind: source, rate: {constant: 1}}\n  \
             - {name: count, kind: map, scaling: {min: 1, max: 8}}\n  \
             - {name: sink, kind: sink, scaling: {min: 1, max: 8}}\nedges:\n  \
             - {from: src, to: count}\n  - {from: count, to: sink}\n",
        )
        .expect("spec")
    }

    #[test]
    fn a_flink_job_demands_the_slots_of_its_largest_vertex() {
        let spec = flink_spec();
        let p: BTreeMap<String, u32> = [("src", 2), ("count", 3), ("sink", 1)]
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        let d = slots_demand(&spec, &demand(&[("count", 5.7), ("sink", 0.4)]), &p);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].name, SLOTS);
        // The largest need; at least the sources' 2 slots, which is also the lower bound.
        assert_eq!((d[0].need, d[0].min, d[0].max), (5.7, 2, 8));
        let low = slots_demand(&spec, &demand(&[("count", 0.5), ("sink", 0.4)]), &p);
        assert_eq!(low[0].need, 2.0, "the sources hold 2 slots");
        assert_eq!(slots_held(&p), 3);
    }

    #[test]
    fn stream_jobs_and_flink_jobs_share_one_quota() {
        // Quota 6: the StreamJob `steady` needs 2 + 1 = 3 subtasks, the Flink job 5.7 slots.
        let spec = flink_spec();
        let p: BTreeMap<String, u32> = [("src", 1), ("count", 2), ("sink", 2)]
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        let flink = Member {
            name: flink_member_name("wordcount"),
            demand: slots_demand(&spec, &demand(&[("count", 5.7), ("sink", 1.0)]), &p),
            held: slots_held(&p),
        };
        let members = [member("steady", &[("work", 1.7), ("sink", 0.1)], 2), flink];
        let s = share("steady", &members, 6).expect("fits");
        assert_eq!((s.allocated, s.cap), (3, 3));
        let f = share("FlinkScaler/wordcount", &members, 6).expect("fits");
        assert_eq!((f.allocated, f.cap, f.held), (3, 3, 2));
        assert_eq!(f.allocation.parallelism[SLOTS], 3);
        assert!((f.allocation.admitted_share - 3.0 / 5.7).abs() < 1e-9);
        assert!(
            f.message
                .contains("FlinkScaler/wordcount 3 subtasks (53% of its load)"),
            "{}",
            f.message
        );
        // While the StreamJob holds 5 of the 6, the Flink job may not grow past the 1 free.
        let members = [
            member("steady", &[("work", 1.7), ("sink", 0.1)], 5),
            members[1].clone(),
        ];
        let f = share("FlinkScaler/wordcount", &members, 6).expect("fits");
        assert_eq!(f.cap, 2, "it keeps the 2 slots it holds");
    }

    #[test]
    fn a_flink_job_over_its_share_is_capped_at_it() {
        let q = quota_status(3, 4);
        let cur: BTreeMap<String, u32> = [("src", 1), ("count", 4), ("sink", 2)]
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        let mut planned = cur.clone();
        planned.insert("count".into(), 3);
        // A held-back plan within the share is forced ...
        assert_eq!(
            forced_slots_scale_down(&q, &cur, &planned, false),
            Some(planned.clone())
        );
        // ... one already rescaling is left alone ...
        assert_eq!(forced_slots_scale_down(&q, &cur, &planned, true), None);
        // ... and a plan over the share gives way to every vertex capped at it.
        let mut over = cur.clone();
        over.insert("count".into(), 6);
        assert_eq!(
            forced_slots_scale_down(&q, &cur, &over, true),
            Some(planned.clone())
        );
        assert_eq!(
            forced_slots_scale_down(&quota_status(4, 4), &cur, &over, true),
            None
        );
    }

    #[test]
    fn a_job_within_its_share_is_never_forced() {
        let spec = three_operator_spec();
        let q = quota_status(3, 3);
        assert_eq!(
            forced_scale_down(&spec, &q, &par(2), &par(1), false, Some(&par(1))),
            None
        );
    }
}
