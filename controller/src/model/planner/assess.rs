//! What the guards ask of a model: a parallelism's utilization and latency bound, the
//! sources' arrival rate, whether a scale-back keeps capacity.

use super::*;

impl Model {
    /// Operator `op`'s parallelism bounds (lowest, highest): its `scaling` bounds within
    /// 1..=maxParallelism, as the plan keeps them.
    pub(crate) fn bounds_of(&self, op: &str) -> Option<(u32, u32)> {
        let &i = self.graph.topo.index.get(op)?;
        Some(self.graph.bounds[i])
    }

    /// Utilization ρ of operator `op`'s busiest subtask at parallelism `p` and the target rate
    /// with the current backlog's catch-up but without the backlog of a rescale's own downtime:
    /// how `p` runs when the job is not rescaled, which is what the utilization band judges
    /// (with that backlog, a job near the band's upper end would leave the band only because
    /// of the rescale that leaving it asks for). `None` for sources, an unknown μ or an
    /// unknown operator.
    pub(crate) fn utilization_at(&self, op: &str, p: u32) -> Option<f64> {
        let &i = self.graph.topo.index.get(op)?;
        self.staying_rho(i, p)
    }

    /// How parallelism `p` (by operator name; missing = current) runs: (highest predicted
    /// utilization ρ at the target rate with the current backlog's catch-up, as
    /// [`Model::utilization_at`], without the backlog of a rescale's own downtime; highest ρ at
    /// the steady rate; the percentile bound of the slowest path, seconds). The guards' view of
    /// the current parallelism (whether it falls behind, whether a rescale is worth its cost).
    pub(crate) fn assess<K: Borrow<str> + Ord>(&self, p: &BTreeMap<K, u32>) -> (f64, f64, f64) {
        let n = self.graph.topo.len();
        let pv = self.parallelism_by_index(p);
        let (mut rho_target, mut rho_steady) = (0.0f64, 0.0f64);
        for (i, &pi) in pv.iter().enumerate() {
            if let Some(rho) = self.steady_rho(i, pi) {
                rho_steady = rho_steady.max(rho);
                rho_target = rho_target.max(self.staying_rho(i, pi).unwrap_or(0.0));
            }
        }
        let tail: Vec<f64> = (0..n).map(|i| self.tail(i, pv[i])).collect();
        let (seconds, _) = self
            .graph
            .longest_path_into(&tail, &mut Vec::new(), &mut Vec::new());
        (rho_target, rho_steady, seconds)
    }

    /// The second of [`Model::assess`]'s figures alone (the highest ρ at the steady rate),
    /// without the others' utilizations and tails.
    pub(crate) fn assess_steady_rho<K: Borrow<str> + Ord>(&self, p: &BTreeMap<K, u32>) -> f64 {
        let pv = self.parallelism_by_index(p);
        let mut rho_steady = 0.0f64;
        for (i, &pi) in pv.iter().enumerate() {
            if let Some(rho) = self.steady_rho(i, pi) {
                rho_steady = rho_steady.max(rho);
            }
        }
        rho_steady
    }

    /// Parallelism `p` (by operator name; missing = current) indexed like the topology.
    pub(super) fn parallelism_by_index<K: Borrow<str> + Ord>(
        &self,
        p: &BTreeMap<K, u32>,
    ) -> Vec<u32> {
        let n = self.graph.topo.len();
        if let Some(ps) = self.graph.indices_of(p) {
            let mut pv = vec![0; n];
            for (i, &x) in ps {
                pv[i] = x;
            }
            pv
        } else {
            (0..n)
                .map(|i| {
                    p.get(self.name(i))
                        .copied()
                        .unwrap_or(self.est[i].parallelism)
                })
                .collect()
        }
    }

    /// Whether `new` subtasks for operator `op` is a scale-back to the smallest parallelism
    /// measured to give the capacity more subtasks did not raise (an operator flagged for
    /// ineffective scaling, [`super::learn::Ineffective::from`]): a scale-down that removes
    /// no capacity, so a source backlog is no reason to hold it.
    pub(crate) fn scale_back_keeps_capacity(&self, op: &str, new: u32) -> bool {
        self.graph
            .topo
            .index
            .get(op)
            .is_some_and(|&i| self.frozen[i] && self.flat_from[i] > 0 && new >= self.flat_from[i])
    }

    /// Sources' total steady arrival rate γ, records/s.
    pub(crate) fn arrival_rate(&self) -> f64 {
        self.gamma.iter().sum()
    }
}
