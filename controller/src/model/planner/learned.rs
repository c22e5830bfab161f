//! What the scalability tracker ([`crate::model::learn`]) learns from a model, and what it
//! gives back: scalability factors and ineffective-scaling flags.

use super::*;

impl Model {
    /// The observed state of every non-source operator, by name: what the
    /// [`ScalabilityTracker`](super::learn::ScalabilityTracker) learns from.
    pub(crate) fn observed(&self) -> impl Iterator<Item = (&str, Observed)> {
        (0..self.graph.topo.len())
            .filter(|&i| !self.graph.topo.is_source[i])
            .map(|i| {
                let e = &self.est[i];
                (
                    self.name(i),
                    Observed {
                        parallelism: e.parallelism,
                        true_processing_rate: e.true_processing_rate,
                        input_rate: e.input_rate,
                        busiest_share: self
                            .figures
                            .input_shares(i)
                            .iter()
                            .copied()
                            .reduce(f64::max),
                    },
                )
            })
    }

    /// [`Model::observed`] collected, with the positions of its entries in operator-name
    /// order (for [`ScalabilityTracker::observe_ordered`]).
    pub(crate) fn observed_ordered(&self) -> (Vec<(&str, Observed)>, Vec<usize>) {
        let topo = &self.graph.topo;
        // (Sized up front: a filtered collection would grow them step by step.)
        let mut now: Vec<(&str, Observed)> = Vec::with_capacity(topo.len());
        now.extend(self.observed());
        let mut pos = vec![usize::MAX; topo.len()];
        for (k, i) in (0..topo.len()).filter(|&i| !topo.is_source[i]).enumerate() {
            pos[i] = k;
        }
        let mut by_name = Vec::with_capacity(now.len());
        by_name.extend(
            self.graph
                .by_name
                .iter()
                .map(|&i| pos[i])
                .filter(|&k| k != usize::MAX),
        );
        (now, by_name)
    }

    /// Applies what the tracker learned: each operator's scalability factor (non-finite or
    /// non-positive factors are ignored) and its ineffective-scaling flag.
    pub(crate) fn apply_learned(&mut self, learned: &ScalabilityTracker) {
        // The tracker's maps and the graph's `by_name` are both in name order: one merge
        // finds every operator's entries (what `factor` and `is_ineffective` look up).
        let graph = Arc::clone(&self.graph);
        let mut factors = learned.factors.iter().peekable();
        let mut flagged = learned.ineffective.iter().peekable();
        for &i in &graph.by_name {
            let name = graph.topo.names[i].as_str();
            while factors.next_if(|(k, _)| k.as_str() < name).is_some() {}
            while flagged.next_if(|(k, _)| k.as_str() < name).is_some() {}
            let f = factors
                .next_if(|(k, _)| k.as_str() == name)
                .map_or(1.0, |(_, &f)| f);
            self.factor[i] = if f.is_finite() && f > 0.0 { f } else { 1.0 };
            let flag = flagged.next_if(|(k, _)| k.as_str() == name).map(|(_, f)| f);
            self.frozen[i] = flag.is_some();
            self.flat_from[i] = flag.map_or(0, |f| f.from);
        }
        let memo = self.tail_memo.get_mut();
        if memo.is_used() {
            memo.clear();
        }
    }
}
