//! The `ds2` baseline: DS2's true-processing-rate sizing (OSDI'18).

use super::*;

/// DS2 (Kalavri et al., OSDI 2018): π_i = ⌈R_i / μ_i⌉ with R_i propagated from the sources'
/// rates through observed selectivities in topological order, no headroom (f = 0), sources
/// not rescaled, decisions only on a full window after a (re)start (warm-up).
#[derive(Debug)]
pub struct Ds2 {
    interval_s: f64,
    window_s: f64,
    /// Reused buffers: the window's deltas, target output rates, the new parallelism.
    deltas: Vec<Delta>,
    target_out: Vec<f64>,
    p: Vec<u32>,
}

impl Ds2 {
    /// DS2 deciding every `interval_s` on a window of `window_s` seconds.
    pub(super) fn new(interval_s: f64, window_s: f64) -> Ds2 {
        Ds2 {
            interval_s,
            window_s,
            deltas: Vec::new(),
            target_out: Vec::new(),
            p: Vec::new(),
        }
    }
}

impl Policy for Ds2 {
    fn name(&self) -> &'static str {
        "ds2"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn window_s(&self) -> f64 {
        self.window_s
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let m = obs.model;
        if obs.now_s - obs.started_s < self.window_s {
            return None;
        }
        let d = deltas(obs.window, &mut self.deltas)?;
        let n = m.ops.len();
        let target_out = &mut self.target_out;
        target_out.clear();
        target_out.resize(n, 0.0);
        let p = &mut self.p;
        p.clear();
        p.extend_from_slice(obs.parallelism);
        for i in 0..n {
            let op = &m.ops[i];
            if op.kind == OpKind::Source {
                target_out[i] = d[i].arrivals / d[i].dt;
                continue;
            }
            let r: f64 = op.inputs.iter().map(|&u| target_out[u]).sum();
            let sel = if d[i].records_in > 0.0 {
                d[i].records_out / d[i].records_in
            } else {
                1.0
            };
            target_out[i] = r * sel;
            if d[i].busy > 1e-9 && d[i].records_in > 0.0 {
                let mu = d[i].records_in / d[i].busy;
                p[i] = bound(m, i, ceil(r / mu));
            }
        }
        (p.as_slice() != obs.parallelism).then(|| p.clone())
    }
}
