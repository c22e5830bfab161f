//! The `flink` baseline: the Flink Kubernetes Operator's autoscaler with its defaults.

use super::*;

/// The Flink Kubernetes Operator autoscaler with its defaults (see `baseline-policies.md`):
/// 60 s loop, 15 min metric window collected after a 5 min stabilization, utilization 0.7 ±
/// 0.3, catch-up 30 min, restart time 5 min, scale-down at most 60 % per step, key-group
/// alignment, backlog mode (lag > 5 min of input) forbids scale-down, 1 h scale-down delay
/// applying the highest recommendation seen.
#[derive(Debug, Default)]
pub struct Flink {
    pending: BTreeMap<usize, (f64, u32)>,
    /// Reused buffer of the window's deltas.
    deltas: Vec<Delta>,
}

const FLINK_INTERVAL_S: f64 = 60.0;
const FLINK_WINDOW_S: f64 = 900.0;
const FLINK_STABILIZATION_S: f64 = 300.0;
const FLINK_CATCH_UP_S: f64 = 1800.0;
const FLINK_RESTART_S: f64 = 300.0;
const FLINK_SCALE_DOWN_DELAY_S: f64 = 3600.0;
const FLINK_MAX_P: u32 = 200;

impl Policy for Flink {
    fn name(&self) -> &'static str {
        "flink"
    }
    fn interval_s(&self) -> f64 {
        FLINK_INTERVAL_S
    }
    fn window_s(&self) -> f64 {
        FLINK_WINDOW_S
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let m = obs.model;
        let collect_from = obs.started_s + FLINK_STABILIZATION_S;
        let from = obs.window.partition_point(|s| s.at_s < collect_from);
        let w = &obs.window[from..];
        if w.len() < 2 {
            return None;
        }
        let d = deltas(w, &mut self.deltas)?;
        let n = m.ops.len();
        let (mut target, mut catch) = (vec![0.0; n], vec![0.0; n]);
        let mut backlog_mode = false;
        let mut ratio = vec![1.0; n];
        let mut tpr = vec![f64::INFINITY; n];
        for i in 0..n {
            let op = &m.ops[i];
            let di = &d[i];
            if op.kind == OpKind::Source {
                let rate = di.records_out / di.dt;
                target[i] = rate + (di.backlog_last - di.backlog_first) / di.dt;
                catch[i] = di.backlog_last / FLINK_CATCH_UP_S;
                backlog_mode |= di.backlog_last > 300.0 * rate.max(1e-9);
                continue;
            }
            for &u in &op.inputs {
                target[i] += target[u] * ratio[u];
                catch[i] += catch[u] * ratio[u];
            }
            let p = obs.parallelism[i];
            if di.records_in > 0.0 {
                ratio[i] = di.records_out / di.records_in;
                // busyTimeMsPerSecond: the maximum over subtasks (the hottest key-group share
                // times p: p / effective servers, which are 1 / hottest share for a keyed
                // operator and p otherwise).
                let hot = f64::from(p) / m.effective_servers(i, p);
                let busy_max_per_s = di.busy / di.dt / f64::from(p) * hot;
                if busy_max_per_s > 1e-9 {
                    tpr[i] = di.records_in / di.dt / busy_max_per_s;
                }
            }
        }
        let c = |i: usize, u: f64, restart: bool| {
            catch[i]
                + if restart {
                    target[i] * FLINK_RESTART_S / FLINK_CATCH_UP_S
                } else {
                    0.0
                }
                + target[i] / u
        };
        let out_of_band = (0..n).any(|i| {
            m.ops[i].kind != OpKind::Source
                && tpr[i].is_finite()
                && (tpr[i] < c(i, 1.0, false) || (!backlog_mode && tpr[i] > c(i, 0.4, true)))
        });
        if !out_of_band {
            self.pending.clear();
            return None;
        }
        let mut p = obs.parallelism.to_vec();
        for i in 0..n {
            if m.ops[i].kind == OpKind::Source || !tpr[i].is_finite() {
                continue;
            }
            let cur = obs.parallelism[i];
            let factor = (c(i, 0.7, true) / tpr[i]).clamp(0.4, 1e5);
            let (lo, hi) = m.ops[i].bounds;
            let hi = hi.min(FLINK_MAX_P).max(lo);
            let mut new = (ceil(factor * f64::from(cur)) as u32).clamp(lo, hi);
            if m.ops[i].keyed {
                new = align(new, lo, hi, m.key_groups);
            }
            if new < cur && backlog_mode {
                new = cur;
            }
            if new < cur {
                let e = self.pending.entry(i).or_insert((obs.now_s, new));
                e.1 = e.1.max(new);
                if obs.now_s - e.0 >= FLINK_SCALE_DOWN_DELAY_S {
                    new = e.1;
                    self.pending.remove(&i);
                } else {
                    new = cur;
                }
            } else {
                self.pending.remove(&i);
            }
            p[i] = new;
        }
        (p != obs.parallelism).then_some(p)
    }
}

/// Key-group alignment: the smallest p' ≥ p within bounds that divides `groups` evenly, else the
/// largest such p' < p, else p.
fn align(p: u32, lo: u32, hi: u32, groups: u32) -> u32 {
    (p..=hi.min(groups))
        .find(|q| groups.is_multiple_of(*q))
        .or_else(|| (lo..p).rev().find(|q| groups.is_multiple_of(*q)))
        .unwrap_or(p)
}
