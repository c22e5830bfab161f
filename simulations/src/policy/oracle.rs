//! The `oracle` baseline: free rescaling with the load known in advance.

use super::*;

/// Offline lower bound: knows the whole trace and the true service rates; at every step, the
/// least parallelism that carries the next step's rates (ρ ≤ 1) and whose predicted latency at
/// the SLO's percentile ([`JobModel::slo_quantile`], p99 by default) meets the SLO (greedy
/// marginal allocation, optimal for convex latency), with free rescales.
#[derive(Debug, Default)]
pub struct Oracle {
    /// Last sizing: (source rates, service times, parallelism), reused while they are
    /// unchanged.
    last: Option<(Vec<f64>, Vec<f64>, Vec<u32>)>,
    /// The step's source rates (reused buffer).
    gamma: Vec<f64>,
    /// The step's mean service times (reused buffer; [`JobModel::service_s_over`]).
    service: Vec<f64>,
}

impl Oracle {
    /// The oracle's parallelism for source rates `gamma` (records/s, indexed by operator) and
    /// mean service times `service` (seconds, indexed by operator; [`JobModel::service_s_over`]).
    pub fn size(model: &JobModel, gamma: &[f64], service: &[f64], current: &[u32]) -> Vec<u32> {
        let lambda = model.traffic(gamma);
        let n = model.ops.len();
        let mut p: Vec<u32> = (0..n)
            .map(|i| {
                if model.ops[i].kind == OpKind::Source {
                    current[i]
                } else {
                    smallest_servers(model, i, lambda[i], 1.0, service[i])
                }
            })
            .collect();
        let soj = |p: &[u32], i: usize| {
            model.sojourn(
                i,
                lambda[i],
                p[i],
                model.effective_servers(i, p[i]),
                service[i],
                // Sized for Poisson arrivals, as the planner assumes.
                1.0,
            )
        };
        let zero = vec![0.0; n];
        let mut s: Vec<f64> = (0..n).map(|i| soj(&p, i)).collect();
        let mut var = vec![0.0; n];
        for _ in 0..10_000 {
            for i in 0..n {
                var[i] = model.sojourn_variance(i, s[i], service[i]);
            }
            let (at_q, _) = model.path_latency(&zero, &s, &var);
            if at_q <= model.slo_s {
                break;
            }
            let mut best: Option<(usize, f64)> = None;
            for i in 0..n {
                if model.ops[i].kind == OpKind::Source || p[i] >= model.ops[i].bounds.1 {
                    continue;
                }
                p[i] += 1;
                let gain = s[i] - soj(&p, i);
                p[i] -= 1;
                if best.is_none_or(|(_, g)| gain > g) {
                    best = Some((i, gain));
                }
            }
            let Some((i, gain)) = best else { break };
            if gain <= 0.0 {
                break;
            }
            p[i] += 1;
            s[i] = soj(&p, i);
        }
        p
    }
}

impl Policy for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }
    fn interval_s(&self) -> f64 {
        0.0
    }
    fn window_s(&self) -> f64 {
        0.0
    }
    fn free_rescales(&self) -> bool {
        true
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let m = obs.model;
        self.gamma.clear();
        self.gamma.resize(m.ops.len(), 0.0);
        for ((s, _), a) in m.sources.iter().zip(obs.next_arrivals) {
            self.gamma[*s] += a / obs.step_s;
        }
        if m.has_service_series() || self.service.len() != m.ops.len() {
            m.service_times_over(obs.now_s, obs.now_s + obs.step_s, &mut self.service);
        }
        // Most steps repeat the last step's rates: no sizing and no allocation then.
        if let Some((g, sv, p)) = &self.last
            && *g == self.gamma
            && *sv == self.service
        {
            return (p.as_slice() != obs.parallelism).then(|| p.clone());
        }
        let p = Oracle::size(m, &self.gamma, &self.service, obs.parallelism);
        let changed = p.as_slice() != obs.parallelism;
        let out = changed.then(|| p.clone());
        self.last = Some((self.gamma.clone(), self.service.clone(), p));
        out
    }
}
