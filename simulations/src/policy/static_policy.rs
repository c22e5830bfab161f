//! The `static` baseline: one parallelism for the whole run, sized for the trace's p99.

use super::*;

/// Fixed parallelism sized for the trace's 99th-percentile source rate at the job's target
/// utilization: the smallest p_i with λ_i(p99) ≤ ρ_target · servers_i(p) · μ_i.
#[derive(Debug)]
pub struct Static {
    p: Vec<u32>,
}

impl Static {
    /// Sizes from the sources' mean rates over each step of `schedule` (the replay's own steps;
    /// the 99th percentile by nearest rank per source), for [`Static::sized_for`].
    pub fn from_schedule(model: &JobModel, schedule: &crate::runner::Schedule) -> Static {
        let mut gamma = vec![0.0; model.ops.len()];
        let n = schedule.steps();
        let mut rates = vec![0.0; n];
        for (k, (s, _)) in model.sources.iter().enumerate() {
            for (j, r) in rates.iter_mut().enumerate() {
                let (_, dt, arrivals) = schedule.step(j);
                *r = arrivals[k] / dt;
            }
            let idx = ((0.99 * n as f64).ceil() as usize).clamp(1, n) - 1;
            let (_, p99, _) = rates.select_nth_unstable_by(idx, f64::total_cmp);
            gamma[*s] += *p99;
        }
        Static::sized_for(model, &gamma)
    }

    /// Sizes from the sources' rates sampled every simulated second over the replay (at most
    /// 10⁶ samples, evenly spaced).
    pub fn new(model: &JobModel) -> Static {
        let n = (model.duration_s.ceil() as usize).clamp(1, 1_000_000);
        let mut gamma = vec![0.0; model.ops.len()];
        for (j, (s, _)) in model.sources.iter().enumerate() {
            let dt = model.duration_s / n as f64;
            let mut before = model.source_cumulative(j, 0.0);
            let mut rates: Vec<f64> = (0..n)
                .map(|k| {
                    let after = model.source_cumulative(j, (k + 1) as f64 * dt);
                    let r = (after - before) / dt;
                    before = after;
                    r
                })
                .collect();
            let idx = ((0.99 * n as f64).ceil() as usize).clamp(1, n) - 1;
            let (_, p99, _) = rates.select_nth_unstable_by(idx, f64::total_cmp);
            gamma[*s] += *p99;
        }
        Static::sized_for(model, &gamma)
    }

    /// The least parallelism per operator (within bounds) that keeps every operator at or
    /// under the job's target utilization ρ when the sources emit `gamma` records/s (indexed
    /// by operator; traffic equations for the operators' rates). Sources keep the job's.
    pub fn sized_for(model: &JobModel, gamma: &[f64]) -> Static {
        let rho = model.spec.autoscaler.target_utilization;
        let lambda = model.traffic(gamma);
        let p = (0..model.ops.len())
            .map(|i| {
                if model.ops[i].kind == OpKind::Source {
                    return model.ops[i].initial;
                }
                smallest_servers(model, i, lambda[i], rho, model.ops[i].service_s)
            })
            .collect();
        Static { p }
    }
}

impl Policy for Static {
    fn name(&self) -> &'static str {
        "static"
    }
    fn interval_s(&self) -> f64 {
        f64::INFINITY
    }
    fn window_s(&self) -> f64 {
        0.0
    }
    fn initial(&self) -> Option<Vec<u32>> {
        Some(self.p.clone())
    }
    fn decide(&mut self, _obs: &Observation) -> Option<Vec<u32>> {
        None
    }
}
