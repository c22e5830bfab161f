//! What the planner derives from the job graph alone: the topology, kinds, bounds, window
//! periods and longest paths, and the decision templates reused between decisions.

use super::*;

/// What the planner derives from the job graph alone (not from a window), indexed in
/// topological order. The [`Autoscaler`](super::autoscaler::Autoscaler) keeps it between calls
/// while the graph does not change.
#[derive(Debug, PartialEq)]
pub(crate) struct JobGraph {
    pub(super) topo: Topology,
    pub(super) kind: Vec<&'static str>,
    pub(super) bounds: Vec<(u32, u32)>,
    /// Windowed operators: (period in seconds, emits in bursts at the window boundary).
    pub(super) window: Vec<Option<(f64, bool)>>,
    /// Most non-source operators on any source-to-sink path (feedback edges not followed), ≥ 1:
    /// the K of the union bound's per-operator budget ε / K.
    pub(super) depth: u32,
    /// Number of key groups (the job's maxParallelism).
    pub(super) key_groups: u32,
    /// Operators without outputs (sinks), in increasing index order.
    pub(super) sinks: Vec<usize>,
    /// Forward edges (lower to higher index; feedback edges left out) in compressed rows:
    /// the inputs of operator i are `fwd_in[fwd_in_at[i]..fwd_in_at[i + 1]]` in the order of
    /// `topo.inputs[i]`, its outputs likewise in `fwd_out`.
    pub(super) fwd_in_at: Vec<u32>,
    pub(super) fwd_in: Vec<u32>,
    pub(super) fwd_out_at: Vec<u32>,
    pub(super) fwd_out: Vec<u32>,
    /// Per operator, the longest sum of terms after it before its forward outputs count: 0
    /// for an operator without outputs (a sink), −∞ otherwise (see `longest_after`).
    pub(super) after_init: Vec<f64>,
    /// Operator indices in name order (the order of a [`Decision`]'s maps).
    pub(super) by_name: Vec<usize>,
    /// Each operator's name (indexed like the topology), shared by every decision's name-keyed
    /// maps: a decision takes a reference to it instead of a copy.
    pub(super) shared_names: Vec<Arc<str>>,
    /// The index of each of the spec's operators, in the spec's order (the same for every spec
    /// the graph [matches](JobGraph::matches)).
    pub(super) spec_order: Vec<Option<usize>>,
    /// What the graph was built from: per operator (name, kind, keyed, scaling min, max) in
    /// spec order, the edges, and maxParallelism.
    pub(super) key: GraphKey,
    /// Where each operator's row of the tail memo starts ([`Model::tail`]; n + 1 entries, the
    /// last the memo's length): operator i's row has min(its max parallelism + 1,
    /// [`TAIL_ROW_MAX`]) entries.
    pub(super) tail_at: Vec<usize>,
    /// For a graph reused across decisions ([`JobGraph::with_templates`]): the name-keyed maps
    /// a [`Decision`] is cloned from; `None` builds them by collecting.
    pub(super) templates: Option<DecisionTemplates>,
    /// The largest arrays of the models made from this graph, between models.
    pub(super) buffers: BufferPool,
}

/// Every operator's name (in name order) mapped to a placeholder: a [`Decision`]'s
/// name-keyed maps are clones of these with the values written in place, in the maps' own
/// (name) order; the maps are the same as collected ones.
#[derive(Debug, PartialEq)]
pub(super) struct DecisionTemplates {
    /// Name → 0 (for [`Decision::parallelism`]).
    pub(super) names: BTreeMap<String, u32>,
    /// Shared name → 0 (for [`Decision::current`]).
    pub(super) shared: BTreeMap<Arc<str>, u32>,
    /// Shared name → an empty plan.
    pub(super) plans: BTreeMap<Arc<str>, OperatorPlan>,
}

/// The key type of one of a [`Decision`]'s name-keyed maps: a copy of the operator's name, or
/// the graph's shared one.
pub(super) trait NameKey: Clone + Ord {
    /// Operator `i`'s name in `graph`.
    fn of(graph: &JobGraph, i: usize) -> Self;
}

impl NameKey for String {
    fn of(graph: &JobGraph, i: usize) -> String {
        graph.topo.names[i].clone()
    }
}

impl NameKey for Arc<str> {
    fn of(graph: &JobGraph, i: usize) -> Arc<str> {
        graph.shared_name(i)
    }
}

pub(super) type GraphKey = (
    Vec<(
        String,
        &'static str,
        bool,
        Option<u32>,
        Option<u32>,
        Option<(f64, bool)>,
    )>,
    Vec<(String, String)>,
    u32,
);

impl JobGraph {
    pub(crate) fn new(spec: &JobSpec) -> Result<JobGraph, ModelError> {
        let topo = Topology::from_spec_with_loops(spec)?;
        let n = topo.len();
        let mut kind = vec![""; n];
        let mut bounds = vec![(1, 1); n];
        let mut window = vec![None; n];
        let max_p = spec.max_parallelism.max(1);
        for op in &spec.operators {
            if let Some(&i) = topo.index.get(&op.name) {
                kind[i] = op.kind.name();
                let lo = op.scaling.min.unwrap_or(1).clamp(1, max_p);
                let hi = op.scaling.max.unwrap_or(max_p).clamp(lo, max_p);
                bounds[i] = (lo, hi);
                window[i] = window_period(&op.kind);
            }
        }
        let mut on_path = vec![0u32; n];
        for i in 0..n {
            let up = topo.inputs[i]
                .iter()
                .filter(|&&j| j < i)
                .map(|&j| on_path[j])
                .max()
                .unwrap_or(0);
            on_path[i] = up + u32::from(!topo.is_source[i]);
        }
        let depth = on_path.iter().copied().max().unwrap_or(0).max(1);
        let key = (
            spec.operators
                .iter()
                .map(|o| {
                    (
                        o.name.clone(),
                        o.kind.name(),
                        o.kind.is_keyed(),
                        o.scaling.min,
                        o.scaling.max,
                        window_period(&o.kind),
                    )
                })
                .collect(),
            spec.edges
                .iter()
                .map(|e| (e.from.clone(), e.to.clone()))
                .collect(),
            spec.max_parallelism,
        );
        let sinks = (0..n).filter(|&i| topo.outputs[i].is_empty()).collect();
        let csr = |rows: &[Vec<usize>], keep: fn(usize, usize) -> bool| {
            let mut at = vec![0u32];
            let mut list = Vec::new();
            for (i, row) in rows.iter().enumerate() {
                list.extend(row.iter().filter(|&&j| keep(i, j)).map(|&j| j as u32));
                at.push(list.len() as u32);
            }
            (at, list)
        };
        let (fwd_in_at, fwd_in) = csr(&topo.inputs, |i, j| j < i);
        let (fwd_out_at, fwd_out) = csr(&topo.outputs, |i, k| k > i);
        let after_init = topo
            .outputs
            .iter()
            .map(|o| if o.is_empty() { 0.0 } else { f64::NEG_INFINITY })
            .collect();
        let mut tail_at = Vec::with_capacity(n + 1);
        tail_at.push(0);
        for &(_, hi) in &bounds {
            let row = (hi as usize + 1).min(TAIL_ROW_MAX);
            tail_at.push(tail_at.last().copied().unwrap_or(0) + row);
        }
        let mut by_name: Vec<usize> = (0..n).collect();
        by_name.sort_by(|&a, &b| topo.names[a].cmp(&topo.names[b]));
        let shared_names = topo.names.iter().map(|s| Arc::from(s.as_str())).collect();
        let spec_order = spec
            .operators
            .iter()
            .map(|o| topo.index.get(&o.name).copied())
            .collect();
        Ok(JobGraph {
            topo,
            kind,
            bounds,
            window,
            depth,
            key_groups: max_p,
            sinks,
            fwd_in_at,
            fwd_in,
            fwd_out_at,
            fwd_out,
            after_init,
            by_name,
            shared_names,
            spec_order,
            key,
            tail_at,
            templates: None,
            buffers: BufferPool::default(),
        })
    }

    /// This graph with the [`DecisionTemplates`] its decisions' maps are cloned from: for a
    /// graph that plans more than once (building them costs about what collecting one
    /// decision's maps does).
    pub(crate) fn with_templates(mut self) -> JobGraph {
        let names: BTreeMap<String, u32> = self
            .by_name
            .iter()
            .map(|&i| (self.topo.names[i].clone(), 0))
            .collect();
        let empty = OperatorPlan {
            kind: Cow::Borrowed(""),
            current_parallelism: 0,
            parallelism: 0,
            max_parallelism: 0,
            observed_input_rate: 0.0,
            arrival_rate: 0.0,
            steady_arrival_rate: 0.0,
            true_processing_rate: None,
            selectivity: 0.0,
            selectivity_is_prior: false,
            observed_utilization: 0.0,
            backpressured_share: 0.0,
            predicted_utilization: None,
            predicted_sojourn_seconds: 0.0,
            predicted_sojourn_percentile_seconds: 0.0,
            clamped_at_max: false,
            reason: String::new(),
        };
        let shared: BTreeMap<Arc<str>, u32> = self
            .by_name
            .iter()
            .map(|&i| (Arc::clone(&self.shared_names[i]), 0))
            .collect();
        let plans = shared
            .keys()
            .map(|k| (Arc::clone(k), empty.clone()))
            .collect();
        self.templates = Some(DecisionTemplates {
            names,
            shared,
            plans,
        });
        self
    }

    /// A map from every operator's name (`key(i)`, i its index) to `value(i)`, in name order.
    pub(super) fn name_map<K, V>(
        &self,
        template: Option<&BTreeMap<K, V>>,
        mut value: impl FnMut(usize) -> V,
    ) -> BTreeMap<K, V>
    where
        K: NameKey,
        V: Clone,
    {
        match template {
            Some(t) => {
                let mut m = t.clone();
                for (v, &i) in m.values_mut().zip(&self.by_name) {
                    *v = value(i);
                }
                m
            }
            None => self
                .by_name
                .iter()
                .map(|&i| (K::of(self, i), value(i)))
                .collect(),
        }
    }

    /// Operator `i`'s name as the key of a [`Decision`]'s map of shared names.
    pub(super) fn shared_name(&self, i: usize) -> Arc<str> {
        Arc::clone(&self.shared_names[i])
    }

    /// [`Topology::longest_path_update`](super::network::Topology) after only operator
    /// `changed` changed its term `w[changed]`, visiting only the operators whose distance can
    /// change (`changed` and, transitively, the downstream operators of any operator whose
    /// distance changed) over the graph's compressed forward edges. Every distance and
    /// predecessor is computed as the full update computes it (same inputs in the same
    /// order), so the result is the same bit for bit. `dirty`: all `false`, left all `false`.
    pub(super) fn propagate(
        &self,
        w: &[f64],
        dist: &mut [f64],
        via: &mut [usize],
        changed: usize,
        dirty: &mut [bool],
    ) -> (f64, usize) {
        let g = self;
        let n = dist.len();
        dirty[changed] = true;
        for i in changed..n {
            if !std::mem::take(&mut dirty[i]) {
                continue;
            }
            let (d, arg) = g.farthest_input(i, dist);
            let own = if g.topo.is_source[i] { 0.0 } else { w[i] };
            let new = d + own;
            via[i] = arg;
            if new.to_bits() != dist[i].to_bits() {
                dist[i] = new;
                for &k in &g.fwd_out[g.fwd_out_at[i] as usize..g.fwd_out_at[i + 1] as usize] {
                    dirty[k as usize] = true;
                }
            }
        }
        g.slowest_sink(dist)
    }

    /// The largest distance among operator `i`'s inputs and that input (the first on a tie);
    /// (0, `usize::MAX`) for an operator without inputs.
    #[inline]
    pub(super) fn farthest_input(&self, i: usize, dist: &[f64]) -> (f64, usize) {
        farthest_of(
            &self.fwd_in[self.fwd_in_at[i] as usize..self.fwd_in_at[i + 1] as usize],
            dist,
        )
    }

    /// [`Topology::longest_path_into`](super::network::Topology) over the graph's compressed
    /// forward edges and its list of sinks: the same inputs in the same order, so the same
    /// distances, predecessors, latency and end bit for bit (proptest
    /// `incremental_longest_path_equals_the_full_update`).
    pub(super) fn longest_path_into(
        &self,
        w: &[f64],
        dist: &mut Vec<f64>,
        via: &mut Vec<usize>,
    ) -> (f64, usize) {
        let n = self.topo.len();
        // Every entry is written before it is read (an operator's forward inputs come before
        // it): no clearing needed.
        dist.resize(n, 0.0);
        via.resize(n, usize::MAX);
        self.longest_path_from(w, dist, via, 0)
    }

    /// [`JobGraph::longest_path_into`] when only the terms of operators at index `from` or
    /// later changed since `dist` and `via` (n entries each) were last made for `w`: the
    /// entries below `from` are kept (no forward edge goes back, so their inputs are
    /// unchanged) and every entry from `from` on is made afresh, as the full pass makes it,
    /// so the result is the full pass's bit for bit. Entries from `from` on may hold
    /// anything before the call.
    pub(super) fn longest_path_from(
        &self,
        w: &[f64],
        dist: &mut [f64],
        via: &mut [usize],
        from: usize,
    ) -> (f64, usize) {
        let n = self.topo.len();
        let (dist, via) = (&mut dist[..n], &mut via[..n]);
        // (Slices of length n up front, so that only the edge sources are bounds-checked.)
        let (at, src, w) = (&self.fwd_in_at[..=n], &self.topo.is_source[..n], &w[..n]);
        let mut lo = at[from.min(n)] as usize;
        for i in from..n {
            let hi = at[i + 1] as usize;
            let (d, arg) = farthest_of(&self.fwd_in[lo..hi], dist);
            dist[i] = d + if src[i] { 0.0 } else { w[i] };
            via[i] = arg;
            lo = hi;
        }
        self.slowest_sink(dist)
    }

    /// The sink with the largest distance (the first on a tie) and that distance; (0, none)
    /// without sinks.
    pub(super) fn slowest_sink(&self, dist: &[f64]) -> (f64, usize) {
        let mut best = (f64::NEG_INFINITY, usize::MAX);
        for &i in &self.sinks {
            if best.1 == usize::MAX || dist[i] > best.0 {
                best = (dist[i], i);
            }
        }
        if best.1 == usize::MAX {
            (0.0, usize::MAX)
        } else {
            best
        }
    }

    /// The operator index of each entry of `map` (keyed by operator name, in its order) when
    /// its keys are exactly this graph's operators, else `None`: one string comparison per
    /// entry instead of a lookup.
    pub(super) fn indices_of<'a, K: Borrow<str>, V>(
        &'a self,
        map: &'a BTreeMap<K, V>,
    ) -> Option<impl Iterator<Item = (usize, &'a V)> + 'a> {
        self.keys_match(map)
            .then(|| self.by_name.iter().copied().zip(map.values()))
    }

    /// Whether the keys of `map` are exactly this graph's operator names (a key that is the
    /// graph's shared name itself, as in the decisions it made, without comparing the text).
    pub(super) fn keys_match<K: Borrow<str>, V>(&self, map: &BTreeMap<K, V>) -> bool {
        map.len() == self.by_name.len()
            && map.keys().zip(&self.by_name).all(|(k, &i)| {
                let k: &str = k.borrow();
                std::ptr::eq(k, &*self.shared_names[i]) || k == self.topo.names[i]
            })
    }

    /// Whether this graph was built from a spec with the same operators (names, kinds,
    /// scaling bounds), edges and maxParallelism as `spec` (parallelism may differ).
    pub(crate) fn matches(&self, spec: &JobSpec) -> bool {
        let (ops, edges, max_p) = &self.key;
        *max_p == spec.max_parallelism
            && ops.len() == spec.operators.len()
            && edges.len() == spec.edges.len()
            && ops
                .iter()
                .zip(&spec.operators)
                .all(|((name, kind, keyed, lo, hi, win), o)| {
                    name == &o.name
                        && *kind == o.kind.name()
                        && *keyed == o.kind.is_keyed()
                        && *lo == o.scaling.min
                        && *hi == o.scaling.max
                        && *win == window_period(&o.kind)
                })
            && edges
                .iter()
                .zip(&spec.edges)
                .all(|((from, to), e)| from == &e.from && to == &e.to)
    }
}
