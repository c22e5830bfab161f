//! Limits and load shedding: what to do when the capacity a plan needs exceeds what the job may
//! have (an operator's max parallelism, or a CPU quota on the job's subtasks).
//!
//! The view is the capacity-and-headroom one of Tatbul et al., *Load Shedding in a Data Stream
//! Manager* (VLDB 2003, §3): the system has capacity C, of which a headroom share H may be used
//! for query processing; when the offered load L (here, records/s at the sources) needs more than
//! H·C, the excess is shed at the inputs so that the rest is processed within its QoS. Here
//! H is the target utilization ρ_target (the share of each subtask's time the planner sizes for,
//! which keeps queueing delay — and so the latency SLO — in bounds), and C is the source rate the
//! allowed parallelism can take at that utilization: with operator i planned at p_i subtasks of
//! true processing rate μ_i and arrival rate λ_i at the target source rate L,
//!
//! ```text
//! x = min_i ρ_target · p_i · μ_i / λ_i      (the admissible share of L)
//! C = x · L,   shed share s = 1 − x   (capped at `maxShedShare`)
//! ```
//!
//! Under a quota Q on Σ p_i (non-source operators), x is the largest share whose DS2 sizing
//! Σ_i max(min_i, ⌈x λ_i / (ρ_target μ_i)⌉) fits in Q (bisection; operators with unknown μ keep
//! their parallelism), and those p_i are the plan. With `onLimit: hold` nothing is shed: the
//! job runs at the limit and the reason reports C, L and the rate at which the backlog grows.
//! With `onLimit: shed`, the sources drop the share s (counted as shed records, never silently).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use streamscale_engine::spec::{LimitsSpec, OnLimit};

use super::float_text::Fixed;
use super::planner::Decision;

/// The limit decision for one job. Rates in records/s at the sources.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitPlan {
    /// `hold` or `shed`.
    pub action: OnLimit,
    /// Share of source records to drop, in [0, maxShedShare]; 0 when holding.
    pub shed_share: f64,
    /// Offered load L: the sources' target rate (arrivals plus catch-up), records/s.
    pub load: f64,
    /// Capacity C = x · L the allowed parallelism takes at the headroom, records/s.
    pub capacity: f64,
    /// Headroom H: the utilization the capacity is taken at (ρ_target).
    pub headroom: f64,
    /// Operators whose limit binds (at max parallelism, or all sized under the quota).
    pub limited_by: Vec<String>,
    /// Parallelism per operator after the quota (the decision's when no quota binds).
    pub parallelism: BTreeMap<String, u32>,
    /// In words, for the decision's reasons.
    pub reason: String,
}

/// The admissible share of the load at parallelism `p` for one operator: ρ·p·μ/λ.
fn share_at(rho: f64, p: u32, mu: f64, lambda: f64) -> f64 {
    if lambda <= 0.0 {
        f64::INFINITY
    } else {
        rho * f64::from(p) * mu / lambda
    }
}

/// Subtasks operator needs to take share `x` of its load at utilization `rho`.
fn need(x: f64, rho: f64, mu: f64, lambda: f64, lo: u32) -> u32 {
    let v = (x * lambda / (rho * mu) * (1.0 - 1e-12)).ceil();
    (v.clamp(0.0, f64::from(u32::MAX)) as u32).max(lo).max(1)
}

/// Checks the planned `decision` against the limits: `None` when the plan fits (no operator
/// clamped at its max, and Σ planned subtasks within `quotaSubtasks`), otherwise the capacity,
/// the load, the shed share (for `onLimit: shed`) and the parallelism within the quota.
/// `min_parallelism` gives each operator's lower bound (default 1).
pub fn limit_plan(
    decision: &Decision,
    limits: &LimitsSpec,
    min_parallelism: &BTreeMap<String, u32>,
) -> Option<LimitPlan> {
    let rho = decision.target_utilization;
    let load: f64 = decision.sources.values().map(|s| s.target_rate).sum();
    // Operators with a known μ and input; the others keep their planned parallelism.
    let ops: Vec<(&str, f64, f64, u32)> = decision
        .operators
        .iter()
        .filter(|(_, o)| o.kind != "source")
        .filter_map(|(n, o)| {
            let mu = o.true_processing_rate.filter(|m| *m > 0.0)?;
            (o.arrival_rate > 0.0).then(|| {
                let p = decision
                    .parallelism
                    .get(&**n)
                    .copied()
                    .unwrap_or(o.parallelism);
                (&**n, mu, o.arrival_rate, p)
            })
        })
        .collect();
    let mut x = 1.0f64;
    let mut limited_by: Vec<String> = Vec::new();
    for &(n, mu, lambda, p) in &ops {
        let s = share_at(rho, p, mu, lambda);
        if decision.operators[n].clamped_at_max && s < 1.0 - 1e-9 {
            limited_by.push(n.to_string());
            x = x.min(s);
        }
    }
    let mut parallelism = decision.parallelism.clone();
    let non_source_total: u64 = decision
        .operators
        .iter()
        .filter(|(_, o)| o.kind != "source")
        .map(|(n, o)| u64::from(parallelism.get(&**n).copied().unwrap_or(o.parallelism)))
        .sum();
    let mut quota_note = String::new();
    if let Some(q) = limits
        .quota_subtasks
        .filter(|q| non_source_total > u64::from(*q))
    {
        let fixed: u64 = non_source_total
            - ops
                .iter()
                .map(|&(n, ..)| u64::from(parallelism[n]))
                .sum::<u64>();
        let lo = |n: &str| min_parallelism.get(n).copied().unwrap_or(1);
        let total_at = |share: f64| -> u64 {
            fixed
                + ops
                    .iter()
                    .map(|&(n, mu, l, p)| u64::from(need(share, rho, mu, l, lo(n)).min(p)))
                    .sum::<u64>()
        };
        // Largest share x' ≤ x whose sizing fits the quota (bisection on a monotone total).
        let (mut a, mut b) = (0.0f64, x);
        if total_at(b) > u64::from(q) {
            for _ in 0..60 {
                let m = 0.5 * (a + b);
                if total_at(m) <= u64::from(q) {
                    a = m;
                } else {
                    b = m;
                }
            }
            x = a;
        }
        for &(n, mu, l, p) in &ops {
            parallelism.insert(n.to_string(), need(x, rho, mu, l, lo(n)).min(p));
        }
        // The rounding up leaves some shares above x: the binding share is the smallest.
        x = ops
            .iter()
            .map(|&(n, mu, l, _)| share_at(rho, parallelism[n], mu, l))
            .fold(x.max(0.0), f64::min)
            .max(0.0);
        limited_by = ops.iter().map(|&(n, ..)| n.to_string()).collect();
        quota_note = format!(
            "quota {q} subtasks < {non_source_total} planned: sized for {}% of the load; ",
            Fixed(100.0 * x.min(1.0), 1)
        );
        if x >= 1.0 - 1e-9 {
            // The quota binds only through rounding headroom: the load still fits.
            return Some(LimitPlan {
                action: limits.on_limit,
                shed_share: 0.0,
                load,
                capacity: load,
                headroom: rho,
                limited_by,
                parallelism,
                reason: format!("{quota_note}the whole load fits"),
            });
        }
    }
    if x >= 1.0 - 1e-9 {
        return None;
    }
    let capacity = x * load;
    let excess = (1.0 - x).max(0.0);
    let names = limited_by.join(", ");
    let (shed_share, what) = match limits.on_limit {
        OnLimit::Hold => (
            0.0,
            format!(
                "holding at the limit: the backlog grows by about {} rec/s",
                Fixed(load - capacity, 1)
            ),
        ),
        OnLimit::Shed => {
            let s = excess.min(limits.max_shed_share);
            let mut w = format!(
                "shedding {}% of source records ({} rec/s, counted as shed records)",
                Fixed(100.0 * s, 1),
                Fixed(s * load, 1)
            );
            if s < excess {
                w.push_str(&format!(
                    "; capped at maxShedShare {}%, the backlog still grows",
                    Fixed(100.0 * limits.max_shed_share, 0)
                ));
            }
            (s, w)
        }
    };
    let reason = format!(
        "limits: {quota_note}capacity C {} rec/s at headroom H = ρ {} (limited by {names}) < load L {} rec/s; {what}",
        Fixed(capacity, 1),
        Fixed(rho, 2),
        Fixed(load, 1)
    );
    Some(LimitPlan {
        action: limits.on_limit,
        shed_share,
        load,
        capacity,
        headroom: rho,
        limited_by,
        parallelism,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::autoscaler::{Autoscaler, Verdict};
    use crate::model::testutil::{Synth, job, window};
    use proptest::prelude::*;

    fn spec(map: &str, limits: &str) -> streamscale_engine::spec::JobSpec {
        job(&format!(
            r"
name: chain
operators:
  - {{ name: src, kind: source, rate: {{ constant: 100 }} }}
  - {{ name: map, kind: map, parallelism: 1{map} }}
  - {{ name: sink, kind: sink }}
edges:
  - {{ from: src, to: map }}
  - {{ from: map, to: sink }}
autoscaler: {{ limits: {limits} }}
"
        ))
    }

    /// map: μ = `mu` rec/s per subtask at p = 1; sink μ = 10 000.
    fn win(gamma: f64, mu: f64) -> Vec<crate::model::MetricSample> {
        window(
            &[
                Synth::source("src", 1, gamma, 0.0),
                Synth::op("map", 1, gamma, mu, 1.0),
                Synth::op("sink", 1, gamma, 10_000.0, 0.0),
            ],
            &[0.0, 5.0, 10.0, 15.0, 20.0],
        )
    }

    fn decide(
        spec: &streamscale_engine::spec::JobSpec,
        gamma: f64,
        mu: f64,
    ) -> (Verdict, Option<LimitPlan>) {
        let mut a = Autoscaler::default();
        let v = a.decide(0.0, &win(gamma, mu), spec);
        (v, a.limit_plan().cloned())
    }

    #[test]
    fn beyond_max_parallelism_sheds_the_excess_up_to_the_cap() {
        // map needs ⌈600 / (0.7 · 100)⌉ = 9 but may have 4: x = 0.7 · 4 · 100 / 600 = 0.467.
        let (v, lp) = decide(
            &spec(
                ", scaling: { max: 4 }",
                "{ onLimit: shed, maxShedShare: 0.6 }",
            ),
            600.0,
            100.0,
        );
        let lp = lp.expect("limit binds");
        assert!((lp.capacity - 280.0).abs() < 1e-9, "{lp:?}");
        assert!((lp.load - 600.0).abs() < 1e-9);
        assert!((lp.shed_share - (1.0 - 280.0 / 600.0)).abs() < 1e-9);
        assert_eq!(lp.limited_by, vec!["map".to_string()]);
        let Verdict::Rescale(d) = v else {
            panic!("{v:?}")
        };
        assert_eq!(d.parallelism["map"], 4);
        assert!(
            d.reasons
                .iter()
                .any(|r| r.contains("shedding 53.3% of source records")),
            "{:?}",
            d.reasons
        );
        // The cap: at most maxShedShare is shed, and the reason says the backlog still grows.
        let (_, lp) = decide(
            &spec(
                ", scaling: { max: 4 }",
                "{ onLimit: shed, maxShedShare: 0.25 }",
            ),
            600.0,
            100.0,
        );
        let lp = lp.expect("limit binds");
        assert_eq!(lp.shed_share, 0.25);
        assert!(
            lp.reason.contains("capped at maxShedShare 25%"),
            "{}",
            lp.reason
        );
    }

    #[test]
    fn hold_reports_without_shedding_and_no_limit_means_no_plan() {
        let (_, lp) = decide(
            &spec(", scaling: { max: 4 }", "{ onLimit: hold }"),
            600.0,
            100.0,
        );
        let lp = lp.expect("limit binds");
        assert_eq!(lp.shed_share, 0.0);
        assert!(
            lp.reason.contains("holding at the limit") && lp.reason.contains("320.0 rec/s"),
            "{}",
            lp.reason
        );
        // Within the limits: nothing to report.
        let (_, lp) = decide(
            &spec(", scaling: { max: 16 }", "{ onLimit: shed }"),
            600.0,
            100.0,
        );
        assert!(lp.is_none(), "{lp:?}");
    }

    #[test]
    fn a_quota_caps_the_plan_and_sheds_the_rest() {
        // map 9 + sink 1 planned, quota 5: map gets 4, sink keeps 1.
        let (v, lp) = decide(
            &spec("", "{ onLimit: shed, maxShedShare: 1, quotaSubtasks: 5 }"),
            600.0,
            100.0,
        );
        let lp = lp.expect("quota binds");
        assert_eq!(lp.parallelism["map"], 4);
        assert_eq!(lp.parallelism["sink"], 1);
        assert!((lp.capacity - 280.0).abs() < 1e-6, "{lp:?}");
        assert!(
            lp.reason.contains("quota 5 subtasks < 10 planned"),
            "{}",
            lp.reason
        );
        let Verdict::Rescale(d) = v else {
            panic!("{v:?}")
        };
        assert_eq!(
            d.parallelism.values().sum::<u32>() - d.parallelism["src"],
            5
        );
    }

    #[test]
    fn limits_are_validated_by_field() {
        let bad = |l: &str| {
            let yaml = format!(
                "name: j\noperators:\n  - {{ name: s, kind: source, rate: {{ constant: 1 }} }}\nedges: []\nautoscaler: {{ limits: {l} }}\n"
            );
            match streamscale_engine::spec::JobSpec::from_yaml(&yaml) {
                Ok(s) => s.validate().expect_err("invalid"),
                Err(e) => e.to_string(),
            }
        };
        assert!(bad("{ maxShedShare: 1.5 }").contains("autoscaler.limits.maxShedShare"));
        assert!(bad("{ quotaSubtasks: 0 }").contains("autoscaler.limits.quotaSubtasks"));
        assert!(bad("{ onLimit: drop }").contains("drop"));
    }

    proptest! {
        /// Under any quota the plan fits it, the admitted load keeps every sized operator at or
        /// under the target utilization, and more quota never admits less.
        #[test]
        fn quota_plans_fit_and_keep_the_headroom(gamma in 10.0f64..5000.0, mu in 5.0f64..500.0, quota in 2u32..40) {
            let mut prev_x = 0.0;
            for q in [quota, quota + 3] {
                let s = spec("", &format!("{{ onLimit: shed, maxShedShare: 1, quotaSubtasks: {q} }}"));
                let (v, lp) = decide(&s, gamma, mu);
                let d = match &v {
                    Verdict::Rescale(d) => d.clone(),
                    Verdict::Hold { recommendation: Some(d), .. } => d.clone(),
                    Verdict::Hold { .. } => panic!("{v:?}"),
                };
                let total: u32 = d.parallelism.iter().filter(|(n, _)| *n != "src").map(|(_, p)| *p).sum();
                let x = match &lp {
                    Some(lp) => {
                        prop_assert!(total <= q, "total {} > quota {}", total, q);
                        lp.capacity / lp.load
                    }
                    None => 1.0,
                };
                for (name, m) in [("map", mu), ("sink", 10_000.0)] {
                    let rho = x * gamma / (f64::from(d.parallelism[name]) * m);
                    // An operator kept at its current parallelism may sit inside the planner's
                    // scale-up tolerance band above the target.
                    let bound = if d.parallelism[name] == d.current[name] {
                        0.7 * (1.0 + crate::model::planner::SCALE_UP_TOLERANCE)
                    } else {
                        0.7
                    };
                    prop_assert!(rho <= bound + 1e-9, "{} at ρ {} (x {})", name, rho, x);
                }
                prop_assert!(x + 1e-9 >= prev_x, "more quota admitted less: {} < {}", x, prev_x);
                prev_x = x;
            }
        }
    }
}
