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

/// One member of a quota: its name, demand and the non-source subtasks it holds now.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// StreamJob name.
    pub name: String,
    /// Its demand (non-source operators).
    pub demand: Vec<OperatorDemandStatus>,
    /// Non-source subtasks it holds now (see [`held`]).
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
