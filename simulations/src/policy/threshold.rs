//! The `threshold` baseline: HPA-style utilization thresholds.

use super::*;

/// Kubernetes HPA style: desired = ⌈p × busy / target⌉ per operator, 10 % tolerance,
/// scale-up immediate, scale-down to the highest recommendation of the last 5 minutes.
#[derive(Debug)]
pub struct Threshold {
    interval_s: f64,
    target: f64,
    history: VecDeque<(f64, Vec<u32>)>,
    /// Recommendation vectors dropped from `history`, for reuse.
    spare: Vec<Vec<u32>>,
    /// Reused buffer of the window's deltas.
    deltas: Vec<Delta>,
}

const HPA_TOLERANCE: f64 = 0.1;
/// Kubernetes HPA's sync period (`--horizontal-pod-autoscaler-sync-period`), seconds.
pub(super) const HPA_SYNC_S: f64 = 15.0;
const HPA_STABILIZATION_S: f64 = 300.0;

impl Threshold {
    /// Targets the job's `autoscaler.targetUtilization`.
    pub fn new(model: &JobModel, interval_s: f64) -> Threshold {
        Threshold {
            interval_s,
            target: model.spec.autoscaler.target_utilization,
            history: VecDeque::new(),
            spare: Vec::new(),
            deltas: Vec::new(),
        }
    }
}

impl Policy for Threshold {
    fn name(&self) -> &'static str {
        "threshold"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn window_s(&self) -> f64 {
        self.interval_s
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let m = obs.model;
        let d = deltas(obs.window, &mut self.deltas)?;
        // The recommendation goes into a vector the history dropped (no allocation).
        let mut rec = self.spare.pop().unwrap_or_default();
        rec.clear();
        rec.extend_from_slice(obs.parallelism);
        for i in 0..m.ops.len() {
            if m.ops[i].kind == OpKind::Source {
                continue;
            }
            let p = f64::from(obs.parallelism[i]);
            let util = d[i].busy / (p * d[i].dt);
            let ratio = util / self.target;
            if (ratio - 1.0).abs() > HPA_TOLERANCE {
                rec[i] = bound(m, i, ceil(p * ratio));
            }
        }
        self.history.push_back((obs.now_s, rec));
        while self
            .history
            .front()
            .is_some_and(|(t, _)| obs.now_s - t > HPA_STABILIZATION_S)
        {
            if let Some((_, old)) = self.history.pop_front() {
                self.spare.push(old);
            }
        }
        let rec = &self.history.back()?.1;
        let pick = |i: usize| {
            if rec[i] >= obs.parallelism[i] {
                rec[i]
            } else {
                let high = self
                    .history
                    .iter()
                    .map(|(_, r)| r[i])
                    .max()
                    .unwrap_or(rec[i]);
                high.min(obs.parallelism[i])
            }
        };
        // Allocate only for a change.
        (0..m.ops.len())
            .any(|i| pick(i) != obs.parallelism[i])
            .then(|| (0..m.ops.len()).map(pick).collect())
    }
}
