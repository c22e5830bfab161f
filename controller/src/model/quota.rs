//! Several jobs under one subtask quota: how many subtasks each job's operators get when the
//! jobs together need more than the quota.
//!
//! Each job's demand is, per non-source operator, the subtasks it needs for the job's whole
//! target load at the target utilization (DS2 sizing before rounding, `need = λ / (ρ μ)`), with
//! its bounds. With p_i subtasks the job admits the share x = min(1, min_i p_i / need_i) of its
//! load (the rest is held back as backlog or shed, see [`super::shed`]). The allocation:
//!
//! 1. every operator gets its lower bound (the quota must cover them all);
//! 2. **reservation**: each of the J jobs may grow to ⌊Q / J⌋ subtasks, so a job whose whole
//!    demand fits in that fair share is fully served whatever the others need — one job's
//!    spike cannot starve the rest;
//! 3. **marginal benefit**: the remaining subtasks go, one step at a time, to the job whose next
//!    step raises its admitted share the most per subtask (a step adds one subtask to each of
//!    the job's bottleneck operators). Admitted *share* rather than records/s is the benefit, so
//!    a spiking job, which needs more subtasks per share, does not absorb the quota. Ties go to
//!    the job named first.
//!
//! Greedy by marginal benefit per unit of resource is the allocation rule of DRS (Fu et al.,
//! ICDCS 2015, §IV) and of Lohrmann et al. (ICDCS 2015), here across jobs instead of across
//! operators.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One operator's demand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorDemand {
    /// Operator name.
    pub name: String,
    /// Subtasks needed for the job's whole target load at the target utilization (real, ≥ 0).
    pub need: f64,
    /// Fewest subtasks.
    pub min: u32,
    /// Most subtasks.
    pub max: u32,
}

/// One job's demand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobDemand {
    /// Job name.
    pub name: String,
    /// Its non-source operators.
    pub operators: Vec<OperatorDemand>,
}

/// What one job gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobAllocation {
    /// Subtasks per operator.
    pub parallelism: BTreeMap<String, u32>,
    /// Share of the job's load the allocation admits at the target utilization, in [0, 1].
    pub admitted_share: f64,
}

/// Errors of [`allocate`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuotaError {
    /// The operators' lower bounds alone exceed the quota.
    #[error("quota {quota} subtasks is below the {mins} subtasks the jobs' lower bounds need")]
    BelowMinimum {
        /// The quota.
        quota: u64,
        /// Σ lower bounds.
        mins: u64,
    },
    /// A demand is not a finite number ≥ 0, or min > max.
    #[error("job `{job}` operator `{operator}`: {problem}")]
    InvalidDemand {
        /// Job name.
        job: String,
        /// Operator name.
        operator: String,
        /// What is wrong.
        problem: String,
    },
}

/// Admitted share min(1, min_i p_i / need_i) (1 when nothing is needed).
fn share(ops: &[OperatorDemand], p: &[u32]) -> f64 {
    ops.iter()
        .zip(p)
        .filter(|(o, _)| o.need > 0.0)
        .map(|(o, &p)| f64::from(p) / o.need)
        .fold(1.0, f64::min)
}

/// The job's next step from `p`: the operators to raise by one and the share gained; `None`
/// when the job is fully admitted or a bottleneck operator is at its max.
fn next_step(ops: &[OperatorDemand], p: &[u32]) -> Option<(Vec<usize>, f64)> {
    let x = share(ops, p);
    if x >= 1.0 {
        return None;
    }
    let tol = 1e-12;
    let raise: Vec<usize> = ops
        .iter()
        .zip(p)
        .enumerate()
        .filter(|(_, (o, p))| o.need > 0.0 && f64::from(**p) / o.need <= x + tol)
        .map(|(i, _)| i)
        .collect();
    if raise.iter().any(|&i| p[i] >= ops[i].max) {
        return None;
    }
    let mut q = p.to_vec();
    for &i in &raise {
        q[i] += 1;
    }
    Some((raise, share(ops, &q) - x))
}

/// Splits `quota` subtasks across `jobs` (see the module docs). Returns one allocation per job,
/// by name.
///
/// # Errors
/// [`QuotaError::BelowMinimum`] when the lower bounds exceed the quota;
/// [`QuotaError::InvalidDemand`] for a negative or non-finite need, or min > max.
pub fn allocate(
    jobs: &[JobDemand],
    quota: u32,
) -> Result<BTreeMap<String, JobAllocation>, QuotaError> {
    for j in jobs {
        for o in &j.operators {
            let bad = |problem: String| QuotaError::InvalidDemand {
                job: j.name.clone(),
                operator: o.name.clone(),
                problem,
            };
            if !(o.need.is_finite() && o.need >= 0.0) {
                return Err(bad(format!("need {} is not a finite number >= 0", o.need)));
            }
            if o.min > o.max {
                return Err(bad(format!("min {} > max {}", o.min, o.max)));
            }
        }
    }
    let mut p: Vec<Vec<u32>> = jobs
        .iter()
        .map(|j| j.operators.iter().map(|o| o.min).collect())
        .collect();
    let mins: u64 = p.iter().flatten().map(|&v| u64::from(v)).sum();
    if mins > u64::from(quota) {
        return Err(QuotaError::BelowMinimum {
            quota: u64::from(quota),
            mins,
        });
    }
    let mut left = u64::from(quota) - mins;
    // 2. Reservation: each job up to its fair share ⌊Q / J⌋.
    let fair = u64::from(quota) / (jobs.len().max(1) as u64);
    for (j, job) in jobs.iter().enumerate() {
        loop {
            let used: u64 = p[j].iter().map(|&v| u64::from(v)).sum();
            let Some((raise, _)) = next_step(&job.operators, &p[j]) else {
                break;
            };
            let cost = raise.len() as u64;
            if used + cost > fair || cost > left {
                break;
            }
            for i in raise {
                p[j][i] += 1;
            }
            left -= cost;
        }
    }
    // 3. The rest by marginal benefit (admitted share per subtask).
    loop {
        let best = jobs
            .iter()
            .enumerate()
            .filter_map(|(j, job)| {
                let (raise, gain) = next_step(&job.operators, &p[j])?;
                let cost = raise.len() as u64;
                (cost <= left && gain > 0.0).then(|| (j, raise, gain / cost as f64))
            })
            .fold(None::<(usize, Vec<usize>, f64)>, |acc, c| match acc {
                Some(a) if a.2 >= c.2 => Some(a),
                _ => Some(c),
            });
        let Some((j, raise, _)) = best else {
            break;
        };
        left -= raise.len() as u64;
        for i in raise {
            p[j][i] += 1;
        }
    }
    Ok(jobs
        .iter()
        .zip(&p)
        .map(|(job, p)| {
            (
                job.name.clone(),
                JobAllocation {
                    parallelism: job
                        .operators
                        .iter()
                        .zip(p)
                        .map(|(o, &v)| (o.name.clone(), v))
                        .collect(),
                    admitted_share: share(&job.operators, p),
                },
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn job(name: &str, needs: &[f64]) -> JobDemand {
        JobDemand {
            name: name.into(),
            operators: needs
                .iter()
                .enumerate()
                .map(|(i, &need)| OperatorDemand {
                    name: format!("op{i}"),
                    need,
                    min: 1,
                    max: 64,
                })
                .collect(),
        }
    }

    fn total(a: &JobAllocation) -> u32 {
        a.parallelism.values().sum()
    }

    #[test]
    fn a_spike_does_not_starve_the_other_job() {
        // a needs 3 + 2 subtasks, b spikes to 40 + 10; quota 20 (fair share 10 each).
        let jobs = [job("a", &[3.0, 2.0]), job("b", &[40.0, 10.0])];
        let alloc = allocate(&jobs, 20).expect("fits");
        assert_eq!(alloc["a"].admitted_share, 1.0);
        assert_eq!(total(&alloc["a"]), 5);
        assert_eq!(total(&alloc["b"]), 15);
        // b's bottleneck op0 gets the subtasks that raise its share: 12/40 = 0.3 (op1 needs 3).
        assert_eq!(alloc["b"].parallelism["op0"], 12);
        assert!((alloc["b"].admitted_share - 0.3).abs() < 1e-12);
    }

    #[test]
    fn errors_name_the_problem() {
        let e = allocate(&[job("a", &[1.0, 1.0]), job("b", &[1.0])], 2).expect_err("too small");
        assert_eq!(e, QuotaError::BelowMinimum { quota: 2, mins: 3 });
        let e = allocate(&[job("a", &[f64::NAN])], 8).expect_err("nan");
        assert!(e.to_string().contains("job `a` operator `op0`"), "{e}");
    }

    fn jobs_strategy() -> impl Strategy<Value = Vec<JobDemand>> {
        prop::collection::vec(prop::collection::vec(0.0f64..30.0, 1..4), 1..4).prop_map(|js| {
            js.iter()
                .enumerate()
                .map(|(k, needs)| job(&format!("j{k}"), needs))
                .collect()
        })
    }

    proptest! {
        /// The allocation respects the quota and the bounds; with enough quota every job gets
        /// exactly its full demand ⌈need⌉ (no more).
        #[test]
        fn within_quota_and_exact_when_it_suffices(jobs in jobs_strategy(), quota in 1u32..200) {
            let mins: u32 = jobs.iter().map(|j| j.operators.len() as u32).sum();
            match allocate(&jobs, quota) {
                Err(QuotaError::BelowMinimum { .. }) => prop_assert!(quota < mins),
                Err(e) => prop_assert!(false, "{e}"),
                Ok(alloc) => {
                    let used: u32 = alloc.values().map(total).sum();
                    prop_assert!(used <= quota);
                    let full: u32 = jobs.iter().flat_map(|j| &j.operators)
                        .map(|o| (o.need.ceil() as u32).max(o.min)).sum();
                    for j in &jobs {
                        for o in &j.operators {
                            let p = alloc[&j.name].parallelism[&o.name];
                            prop_assert!(p >= o.min && p <= o.max);
                            if quota >= full {
                                prop_assert_eq!(p, (o.need.ceil() as u32).max(o.min));
                            }
                        }
                    }
                }
            }
        }

        /// A job whose full demand fits in its fair share ⌊Q/J⌋ is fully admitted however much
        /// another job's load grows.
        #[test]
        fn fair_share_is_isolated_from_spikes(needs in prop::collection::vec(0.0f64..6.0, 1..3), other in prop::collection::vec(0.1f64..10.0, 1..3), spike in 1.0f64..50.0, quota in 16u32..60) {
            let a = job("a", &needs);
            let b = job("b", &other.iter().map(|n| n * spike).collect::<Vec<_>>());
            let alloc = allocate(&[a.clone(), b], quota).expect("mins fit");
            let full: u32 = a.operators.iter().map(|o| (o.need.ceil() as u32).max(1)).sum();
            if full <= quota / 2 {
                prop_assert_eq!(alloc["a"].admitted_share, 1.0);
            }
        }
    }
}
