//! The job graph as an open Jackson network of queues.
//!
//! Traffic equations (open Jackson network): λ = γ + Sᵀλ, where γ is the external arrival rate
//! (non-zero at sources only) and S the matrix of edge gains. In a dataflow an operator sends
//! every output record along every outgoing edge, so each edge's gain is the upstream
//! operator's selectivity (records out per record in; 1 for a source). On a DAG the equations
//! are solved exactly, without inverting (I − Sᵀ), by one pass in topological order.
//!
//! Cyclic graphs (feedback loops; [`Topology::from_spec_with_loops`]) are solved as
//! λ = (I − Sᵀ)⁻¹ γ (Jackson 1957, "Networks of waiting lines", Oper. Res. 5(4), the traffic
//! equations; the solution exists and is non-negative exactly when the spectral radius of S is
//! below 1). Operators are ordered by strongly connected component, so the DAG part still takes
//! the topological pass and only each loop is solved as a small dense system. A loop whose gain
//! (spectral radius of S restricted to the loop) is 1 or more makes the arrival rates grow
//! without bound: it is rejected with [`UnstableLoop`], naming the operators on it.
//!
//! The mean end-to-end latency of a record along a path is the sum of the mean sojourn times of
//! the operators on it; the job's predicted latency is the maximum over source-to-sink paths
//! (sources contribute 0: their records enter the network when emitted).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use streamscale_engine::spec::{JobSpec, OperatorKind};

use super::ModelError;
use super::queueing::QueueKind;

/// A feedback loop whose gain makes the open network unstable: the traffic equations
/// λ = γ + Sᵀλ have no finite, non-negative solution (Jackson 1957), since records going round
/// the loop multiply at least as fast as they leave it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "unstable feedback loop through operators {}: loop gain (spectral radius of the selectivity matrix on the loop) is {spectral_radius:.4}{}, it must be below 1 for the arrival rates to stay finite",
    operators.join(", "),
    round_trip_gain.map_or_else(String::new, |g| format!(" (round-trip gain {g:.4})"))
)]
pub struct UnstableLoop {
    /// Operators on the loop (its strongly connected component), in [`Topology`] order.
    pub operators: Vec<String>,
    /// Spectral radius ρ(S_loop) of the edge gains inside the loop (dimensionless; NaN when a
    /// gain on the loop is not a finite, non-negative number). Stable iff ρ < 1.
    pub spectral_radius: f64,
    /// Product of the gains around the loop when it is a simple cycle (every operator on it
    /// has exactly one successor on it); `None` for a loop with several inner cycles.
    pub round_trip_gain: Option<f64>,
}

impl From<UnstableLoop> for ModelError {
    fn from(e: UnstableLoop) -> ModelError {
        ModelError::Cycle(e.to_string())
    }
}

/// The job graph indexed in topological order (every edge goes from a lower to a higher index),
/// except for edges inside a feedback loop (only with [`Topology::from_spec_with_loops`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    /// Operator names in topological order.
    pub names: Vec<String>,
    /// Name -> index into `names`.
    pub index: BTreeMap<String, usize>,
    /// Upstream operators of each operator (indices).
    pub inputs: Vec<Vec<usize>>,
    /// Downstream operators of each operator (indices).
    pub outputs: Vec<Vec<usize>>,
    /// Whether each operator is a source.
    pub is_source: Vec<bool>,
    /// Queue layout of each operator: keyed operators have one queue per subtask.
    pub queue: Vec<QueueKind>,
    /// Feedback loops: index ranges (contiguous in this order) of the strongly connected
    /// components that contain a cycle. Empty for a DAG. Every edge not inside one of these
    /// ranges goes from a lower to a higher index.
    pub loops: Vec<std::ops::Range<usize>>,
}

/// The longest (slowest) source-to-sink path for given per-operator sojourn times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathLatency {
    /// Sum of mean sojourn times along the path, seconds (`inf` when an operator is unstable).
    #[serde(with = "super::serde_inf")]
    pub seconds: f64,
    /// Operator names along the path, source first.
    pub path: Vec<String>,
}

impl Topology {
    /// Indexes a job graph in a topological order (Kahn's algorithm); a cycle is reported with
    /// the message of [`JobSpec::topological_order`].
    ///
    /// # Errors
    /// [`ModelError::Cycle`] naming the operators on a cycle; [`ModelError::UnknownOperator`]
    /// when an edge names an operator that does not exist; [`ModelError::DuplicateOperator`].
    pub fn from_spec(spec: &JobSpec) -> Result<Topology, ModelError> {
        Self::build(spec, false)
    }

    /// Like [`Topology::from_spec`], but a graph with feedback loops is accepted: operators are
    /// ordered by strongly connected component (components in topological order; inside a
    /// loop, breadth-first from the operators fed from outside it), and the loops are listed
    /// in [`Topology::loops`]. On a DAG the result is identical to [`Topology::from_spec`].
    /// Whether a loop is stable depends on the gains, so it is checked by
    /// [`Topology::try_traffic`].
    ///
    /// # Errors
    /// [`ModelError::UnknownOperator`]; [`ModelError::DuplicateOperator`].
    pub fn from_spec_with_loops(spec: &JobSpec) -> Result<Topology, ModelError> {
        Self::build(spec, true)
    }

    fn build(spec: &JobSpec, allow_loops: bool) -> Result<Topology, ModelError> {
        // Kahn's algorithm on indices (JobSpec::topological_order compares names per edge and
        // is quadratic); on a cycle, JobSpec::topological_order supplies the message naming
        // the operators on it.
        let n = spec.operators.len();
        let by_name: BTreeMap<&str, usize> = spec
            .operators
            .iter()
            .enumerate()
            .map(|(i, o)| (o.name.as_str(), i))
            .collect();
        if by_name.len() < n {
            let mut seen = std::collections::BTreeSet::new();
            let dup = spec
                .operators
                .iter()
                .find(|o| !seen.insert(o.name.as_str()))
                .map_or_else(String::new, |o| o.name.clone());
            return Err(ModelError::DuplicateOperator(dup));
        }
        let lookup = |name: &str| {
            by_name
                .get(name)
                .copied()
                .ok_or_else(|| ModelError::UnknownOperator(name.to_string()))
        };
        let mut out_spec: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut indegree = vec![0usize; n];
        for e in &spec.edges {
            let (from, to) = (lookup(&e.from)?, lookup(&e.to)?);
            out_spec[from].push(to);
            indegree[to] += 1;
        }
        let mut ready: Vec<usize> = (0..n).rev().filter(|&i| indegree[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = ready.pop() {
            order.push(i);
            for &j in out_spec[i].iter().rev() {
                indegree[j] -= 1;
                if indegree[j] == 0 {
                    ready.push(j);
                }
            }
        }
        let mut loops = Vec::new();
        if order.len() < n && allow_loops {
            (order, loops) = order_with_loops(&out_spec);
        } else if order.len() < n {
            return Err(ModelError::Cycle(
                spec.topological_order().err().unwrap_or_else(|| {
                    "edges: the graph has a cycle; job graphs must be acyclic".to_string()
                }),
            ));
        }
        // rank[spec index] = topological index
        let mut rank = vec![0usize; n];
        for (k, &i) in order.iter().enumerate() {
            rank[i] = k;
        }
        let names: Vec<String> = order
            .iter()
            .map(|&i| spec.operators[i].name.clone())
            .collect();
        let index: BTreeMap<String, usize> = names
            .iter()
            .enumerate()
            .map(|(k, name)| (name.clone(), k))
            .collect();
        let mut is_source = vec![false; n];
        let mut queue = vec![QueueKind::Shared; n];
        let mut inputs = vec![Vec::new(); n];
        let mut outputs = vec![Vec::new(); n];
        for (i, op) in spec.operators.iter().enumerate() {
            let k = rank[i];
            is_source[k] = matches!(op.kind, OperatorKind::Source { .. });
            if op.kind.is_keyed() {
                queue[k] = QueueKind::Keyed;
            }
            for &j in &out_spec[i] {
                outputs[k].push(rank[j]);
                inputs[rank[j]].push(k);
            }
        }
        Ok(Topology {
            names,
            index,
            inputs,
            outputs,
            is_source,
            queue,
            loops,
        })
    }

    /// Number of operators.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when the graph has no operator.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Solves the open Jackson network's traffic equations λ_i = γ_i + Σ_j gain_j · λ_j (j
    /// upstream of i; Jackson 1957) in topological order. `gamma` (external arrival rate,
    /// records/s) and `gain` (each operator's selectivity, the gain of all its outgoing edges,
    /// records out per record in) are indexed like `names`. Returns the total arrival rate λ of
    /// every operator, records/s. On a DAG this is one pass; feedback loops are solved as in
    /// [`Topology::try_traffic`], and an unstable loop (and everything downstream of it) gets
    /// `f64::INFINITY`.
    pub fn traffic(&self, gamma: &[f64], gain: &[f64]) -> Vec<f64> {
        self.solve_traffic(gamma, gain).0
    }

    /// [`Topology::traffic`], reporting an unstable feedback loop as an error:
    /// λ = (I − Sᵀ)⁻¹ γ with S\[j\]\[i\] = gain_j for every edge j → i (Jackson 1957). Operators
    /// outside loops take the topological pass (identical results on a DAG); each loop L is
    /// solved as (I − S_Lᵀ) λ_L = γ_L + inflow from upstream, by Gaussian elimination without
    /// pivoting. I − S_Lᵀ is a Z-matrix, and it is a non-singular M-matrix (equivalently
    /// ρ(S_L) < 1, the stability condition) exactly when every pivot of that elimination is
    /// positive (Berman & Plemmons, "Nonnegative Matrices in the Mathematical Sciences",
    /// 1994, ch. 6, conditions on leading principal minors); no pivoting is then needed.
    ///
    /// # Errors
    /// [`UnstableLoop`] for the first loop (in this order) whose gain ρ(S_L) is ≥ 1, or
    /// whose gains are not finite and non-negative.
    pub fn try_traffic(&self, gamma: &[f64], gain: &[f64]) -> Result<Vec<f64>, UnstableLoop> {
        let (lambda, err) = self.solve_traffic(gamma, gain);
        err.map_or(Ok(lambda), Err)
    }

    fn solve_traffic(&self, gamma: &[f64], gain: &[f64]) -> (Vec<f64>, Option<UnstableLoop>) {
        let n = self.len();
        let g = |j: usize| gain.get(j).copied().unwrap_or(1.0);
        let mut lambda = vec![0.0; n];
        let mut first_err = None;
        let mut loops = self.loops.iter().peekable();
        let mut i = 0;
        while i < n {
            let Some(range) = loops.next_if(|r| r.start == i) else {
                let inflow: f64 = self.inputs[i].iter().map(|&j| g(j) * lambda[j]).sum();
                lambda[i] = gamma.get(i).copied().unwrap_or(0.0) + inflow;
                i += 1;
                continue;
            };
            // Dense block (I − S_Lᵀ) λ_L = b, row a = equation of operator range.start + a.
            let (lo, m) = (range.start, range.len());
            let mut a = vec![0.0; m * m];
            let mut b = vec![0.0; m];
            for r in 0..m {
                a[r * m + r] = 1.0;
                b[r] = gamma.get(lo + r).copied().unwrap_or(0.0);
                for &j in &self.inputs[lo + r] {
                    if range.contains(&j) {
                        a[r * m + (j - lo)] -= g(j);
                    } else {
                        b[r] += g(j) * lambda[j];
                    }
                }
            }
            let gains_ok = range.clone().all(|j| g(j).is_finite() && g(j) >= 0.0);
            match solve_m_matrix(&mut a, &mut b).filter(|_| gains_ok) {
                Some(()) => lambda[range.clone()].copy_from_slice(&b),
                None => {
                    lambda[range.clone()].fill(f64::INFINITY);
                    if first_err.is_none() {
                        first_err = Some(self.unstable_loop(range.clone(), &g));
                    }
                }
            }
            i = range.end;
        }
        (lambda, first_err)
    }

    /// The error for loop `range`: its operators, ρ(S_L) and, for a simple cycle, the
    /// product of its gains.
    fn unstable_loop(
        &self,
        range: std::ops::Range<usize>,
        g: &impl Fn(usize) -> f64,
    ) -> UnstableLoop {
        let simple = range
            .clone()
            .all(|i| self.outputs[i].iter().filter(|j| range.contains(j)).count() == 1);
        UnstableLoop {
            operators: self.names[range.clone()].to_vec(),
            spectral_radius: self.loop_spectral_radius(range.clone(), g),
            round_trip_gain: simple.then(|| range.map(g).product()),
        }
    }

    /// Spectral radius of S restricted to loop `range` (S[j][i] = gain_j for an edge j → i),
    /// by power iteration on the primitive matrix I + S (a loop is irreducible, but may be
    /// periodic, where plain power iteration oscillates) with Collatz–Wielandt bounds
    /// min_i (Mx)_i/x_i ≤ ρ(M) ≤ max_i (Mx)_i/x_i for x > 0; ρ(S) = ρ(I + S) − 1.
    /// NaN when a gain is not finite and non-negative.
    fn loop_spectral_radius(
        &self,
        range: std::ops::Range<usize>,
        g: &impl Fn(usize) -> f64,
    ) -> f64 {
        if range.clone().any(|j| !(g(j).is_finite() && g(j) >= 0.0)) {
            return f64::NAN;
        }
        let (lo, m) = (range.start, range.len());
        let mut x = vec![1.0; m];
        let mut y = vec![0.0; m];
        let mut estimate = f64::NAN;
        for _ in 0..10_000 {
            // y = (I + Sᵀ) x: y_i = x_i + Σ_{j → i on the loop} gain_j x_j (same spectrum as I + S).
            for r in 0..m {
                y[r] = x[r]
                    + self.inputs[lo + r]
                        .iter()
                        .filter(|j| range.contains(j))
                        .map(|&j| g(j) * x[j - lo])
                        .sum::<f64>();
            }
            let ratios = y.iter().zip(&x).map(|(a, b)| a / b);
            let (min, max) = ratios.fold((f64::INFINITY, 0.0f64), |(lo, hi), q| {
                (lo.min(q), hi.max(q))
            });
            estimate = 0.5 * (min + max) - 1.0;
            let norm = y.iter().copied().fold(0.0f64, f64::max);
            if !(norm.is_finite() && norm > 0.0) || max - min <= 1e-12 * max {
                break;
            }
            for (xi, yi) in x.iter_mut().zip(&y) {
                *xi = yi / norm;
            }
        }
        estimate
    }

    /// Longest path by dynamic programming in topological order: `dist[i]` = sojourn of i plus
    /// the largest `dist` of its inputs (sources count 0); `via[i]` = that input (or `usize::MAX`).
    /// Returns the end (an operator with no outputs) of the slowest path and its latency, seconds.
    pub(crate) fn longest_path_into(
        &self,
        sojourn: &[f64],
        dist: &mut Vec<f64>,
        via: &mut Vec<usize>,
    ) -> (f64, usize) {
        let n = self.len();
        dist.clear();
        dist.resize(n, 0.0);
        via.clear();
        via.resize(n, usize::MAX);
        self.longest_path_update(sojourn, dist, via, 0)
    }

    /// [`Topology::longest_path_into`] after only operators at index `from` or later changed
    /// their sojourn: `dist`/`via` below `from` are still valid (no edge goes backwards).
    pub(crate) fn longest_path_update(
        &self,
        sojourn: &[f64],
        dist: &mut [f64],
        via: &mut [usize],
        from: usize,
    ) -> (f64, usize) {
        let n = self.len();
        for i in from..n {
            let mut d = 0.0;
            let mut arg = usize::MAX;
            // Edges into i from i or later close a feedback loop: the path takes each loop
            // once (the slowest acyclic path), not its expected number of passes.
            for &j in self.inputs[i].iter().filter(|&&j| j < i) {
                if arg == usize::MAX || dist[j] > d {
                    d = dist[j];
                    arg = j;
                }
            }
            let own = if self.is_source[i] { 0.0 } else { sojourn[i] };
            dist[i] = d + own;
            via[i] = arg;
        }
        let mut best = (f64::NEG_INFINITY, usize::MAX);
        for (i, (&d, outs)) in dist.iter().zip(&self.outputs).enumerate() {
            if outs.is_empty() && (best.1 == usize::MAX || d > best.0) {
                best = (d, i);
            }
        }
        if best.1 == usize::MAX {
            (0.0, usize::MAX)
        } else {
            best
        }
    }

    /// Indices along the path ending at `end`, source first (from `via` of
    /// [`Topology::longest_path_into`]).
    pub(crate) fn path_to(&self, end: usize, via: &[usize]) -> Vec<usize> {
        let mut path = Vec::new();
        let mut at = end;
        while at != usize::MAX {
            path.push(at);
            at = via[at];
        }
        path.reverse();
        path
    }

    /// Expected end-to-end latency: the maximum over source-to-sink paths of the sum of
    /// per-operator mean sojourn times (seconds; sources contribute 0), with that path.
    /// `sojourn` is indexed like `names`.
    pub fn longest_path(&self, sojourn: &[f64]) -> PathLatency {
        let (mut dist, mut via) = (Vec::new(), Vec::new());
        let (seconds, end) = self.longest_path_into(sojourn, &mut dist, &mut via);
        PathLatency {
            seconds,
            path: if end == usize::MAX {
                Vec::new()
            } else {
                self.path_to(end, &via)
                    .into_iter()
                    .map(|i| self.names[i].clone())
                    .collect()
            },
        }
    }

    fn by_index(
        &self,
        values: &BTreeMap<String, f64>,
        default: f64,
    ) -> Result<Vec<f64>, ModelError> {
        let mut v = vec![default; self.len()];
        for (name, x) in values {
            let i = *self
                .index
                .get(name)
                .ok_or_else(|| ModelError::UnknownOperator(name.clone()))?;
            v[i] = *x;
        }
        Ok(v)
    }
}

/// Solves A x = b in place (`a` row-major m×m, `b` becomes x) by Gaussian elimination without
/// pivoting, requiring every pivot to be positive and finite. For a Z-matrix A (off-diagonal
/// entries ≤ 0) that holds exactly when A is a non-singular M-matrix, whose inverse is
/// non-negative (Berman & Plemmons 1994, ch. 6). `None` otherwise.
fn solve_m_matrix(a: &mut [f64], b: &mut [f64]) -> Option<()> {
    let m = b.len();
    for k in 0..m {
        let pivot = a[k * m + k];
        if !(pivot.is_finite() && pivot > 1e-12) {
            return None;
        }
        for r in k + 1..m {
            let f = a[r * m + k] / pivot;
            if f == 0.0 {
                continue;
            }
            for c in k..m {
                a[r * m + c] -= f * a[k * m + c];
            }
            b[r] -= f * b[k];
        }
    }
    for k in (0..m).rev() {
        let tail: f64 = (k + 1..m).map(|c| a[k * m + c] * b[c]).sum();
        b[k] = (b[k] - tail) / a[k * m + k];
    }
    b.iter().all(|x| x.is_finite()).then_some(())
}

/// An operator order for a graph with cycles (`out[i]`: successors of operator i, spec
/// indices): strongly connected components in topological order (Kahn's algorithm on the
/// condensation, lowest spec index first among ready ones), each component's operators
/// contiguous, breadth-first from those fed from outside the component. Returns the order
/// (spec indices) and the ranges of the order that are feedback loops (components with more
/// than one operator, or one with an edge to itself). O(n·(n + e)): run once per job graph.
fn order_with_loops(out: &[Vec<usize>]) -> (Vec<usize>, Vec<std::ops::Range<usize>>) {
    let n = out.len();
    let reach_from = |s: usize| {
        let mut seen = vec![false; n];
        seen[s] = true;
        let mut stack = vec![s];
        while let Some(i) = stack.pop() {
            for &j in &out[i] {
                if !seen[j] {
                    seen[j] = true;
                    stack.push(j);
                }
            }
        }
        seen
    };
    let reach: Vec<Vec<bool>> = (0..n).map(reach_from).collect();
    // comp[i] = lowest spec index in i's strongly connected component.
    let comp: Vec<usize> = (0..n)
        .map(|i| (0..n).find(|&j| reach[i][j] && reach[j][i]).unwrap_or(i))
        .collect();
    let mut members: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, &c) in comp.iter().enumerate() {
        members.entry(c).or_default().push(i);
    }
    let mut indegree: BTreeMap<usize, usize> = members.keys().map(|&c| (c, 0)).collect();
    for (i, outs) in out.iter().enumerate() {
        for &j in outs {
            if comp[i] != comp[j] {
                *indegree.entry(comp[j]).or_default() += 1;
            }
        }
    }
    let mut ready: Vec<usize> = indegree
        .iter()
        .rev()
        .filter(|(_, d)| **d == 0)
        .map(|(c, _)| *c)
        .collect();
    let (mut order, mut loops) = (Vec::with_capacity(n), Vec::new());
    while let Some(c) = ready.pop() {
        let ms = members.get(&c).map_or(&[][..], Vec::as_slice);
        let start = order.len();
        let mut fed = vec![false; n];
        for (i, outs) in out.iter().enumerate() {
            for &j in outs {
                if comp[j] == c && comp[i] != c {
                    fed[j] = true;
                }
            }
        }
        let mut placed = vec![false; n];
        let mut queue = std::collections::VecDeque::new();
        let entries = ms.iter().filter(|&&i| fed[i]).chain(ms.iter());
        for &s in entries {
            if placed[s] {
                continue;
            }
            placed[s] = true;
            queue.push_back(s);
            while let Some(i) = queue.pop_front() {
                order.push(i);
                for &j in &out[i] {
                    if comp[j] == c && !placed[j] {
                        placed[j] = true;
                        queue.push_back(j);
                    }
                }
            }
        }
        if ms.len() > 1 || ms.iter().any(|&i| out[i].contains(&i)) {
            loops.push(start..order.len());
        }
        let mut next: Vec<usize> = Vec::new();
        for &i in ms {
            for &j in &out[i] {
                let d = comp[j];
                if d != c
                    && let Some(k) = indegree.get_mut(&d)
                {
                    *k -= 1;
                    if *k == 0 {
                        next.push(d);
                    }
                }
            }
        }
        next.sort_unstable_by(|a, b| b.cmp(a));
        ready.extend(next);
    }
    (order, loops)
}

/// Solves the traffic equations λ = γ + Sᵀλ of the job's open Jackson network by name.
/// `gamma`: external arrival rate per source (records/s; missing = 0). `selectivity`: records
/// out per record in per operator (the gain of all its outgoing edges; missing = 1).
/// Returns the arrival rate λ of every operator, records/s.
///
/// Feedback loops are allowed: λ = (I − Sᵀ)⁻¹ γ (Jackson 1957; see [`Topology::try_traffic`]).
///
/// # Errors
/// [`ModelError::Cycle`] with the message of [`UnstableLoop`] (operators on the loop and its
/// gain) when a loop's gain is ≥ 1; [`ModelError::UnknownOperator`] for a name in `gamma` or
/// `selectivity` that is not an operator.
pub fn traffic_equations(
    spec: &JobSpec,
    gamma: &BTreeMap<String, f64>,
    selectivity: &BTreeMap<String, f64>,
) -> Result<BTreeMap<String, f64>, ModelError> {
    let topo = Topology::from_spec_with_loops(spec)?;
    let g = topo.by_index(gamma, 0.0)?;
    let s = topo.by_index(selectivity, 1.0)?;
    let lambda = topo.try_traffic(&g, &s)?;
    Ok(topo.names.iter().cloned().zip(lambda).collect())
}

/// Expected end-to-end latency of the job (seconds): the maximum over source-to-sink paths of
/// the sum of per-operator mean sojourn times (`sojourn`, seconds; missing = 0; sources always
/// contribute 0), with the slowest path. A feedback loop is taken once (the slowest acyclic
/// path), not its expected number of passes.
///
/// # Errors
/// [`ModelError::UnknownOperator`] for a name that is not an operator;
/// [`ModelError::DuplicateOperator`].
pub fn end_to_end_latency(
    spec: &JobSpec,
    sojourn: &BTreeMap<String, f64>,
) -> Result<PathLatency, ModelError> {
    let topo = Topology::from_spec_with_loops(spec)?;
    let w = topo.by_index(sojourn, 0.0)?;
    Ok(topo.longest_path(&w))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diamond() -> JobSpec {
        let spec = JobSpec::from_yaml(
            r"
name: diamond
operators:
  - { name: src, kind: source, rate: { constant: 100 } }
  - { name: split, kind: map }
  - { name: left, kind: filter, keep: 0.5 }
  - { name: right, kind: window, sizeMs: 1000 }
  - { name: join, kind: map }
  - { name: sink, kind: sink }
edges:
  - { from: src, to: split }
  - { from: split, to: left }
  - { from: split, to: right }
  - { from: left, to: join }
  - { from: right, to: join }
  - { from: join, to: sink }
",
        )
        .expect("parses");
        spec.validate().expect("valid");
        spec
    }

    #[test]
    fn traffic_on_a_diamond() {
        let spec = diamond();
        let gamma = BTreeMap::from([("src".to_string(), 100.0)]);
        let sel: BTreeMap<String, f64> =
            [("split", 2.0), ("left", 0.5), ("right", 0.1), ("join", 3.0)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
        let l = traffic_equations(&spec, &gamma, &sel).expect("solves");
        // split: 100. split sends 2·100 = 200 to BOTH left and right (every edge gets the full output).
        assert_eq!(l["src"], 100.0);
        assert_eq!(l["split"], 100.0);
        assert_eq!(l["left"], 200.0);
        assert_eq!(l["right"], 200.0);
        // join: 0.5·200 + 0.1·200 = 100 + 20 = 120; sink: 3·120 = 360.
        assert!((l["join"] - 120.0).abs() < 1e-9);
        assert!((l["sink"] - 360.0).abs() < 1e-9);
    }

    #[test]
    fn latency_is_the_slowest_path() {
        let spec = diamond();
        let w: BTreeMap<String, f64> = [
            ("src", 5.0), // ignored: sources contribute 0
            ("split", 0.1),
            ("left", 0.3),
            ("right", 0.2),
            ("join", 0.05),
            ("sink", 0.01),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let p = end_to_end_latency(&spec, &w).expect("ok");
        assert!((p.seconds - (0.1 + 0.3 + 0.05 + 0.01)).abs() < 1e-12);
        assert_eq!(p.path, ["src", "split", "left", "join", "sink"]);
    }

    #[test]
    fn unknown_names_rejected() {
        let spec = diamond();
        let gamma = BTreeMap::from([("nope".to_string(), 1.0)]);
        assert_eq!(
            traffic_equations(&spec, &gamma, &BTreeMap::new()),
            Err(ModelError::UnknownOperator("nope".into()))
        );
    }

    #[test]
    fn cycle_rejected_naming_operators() {
        let mut spec = diamond();
        spec.edges.push(streamscale_engine::spec::EdgeSpec {
            from: "join".into(),
            to: "split".into(),
        });
        let err = Topology::from_spec(&spec).expect_err("cycle");
        let msg = err.to_string();
        assert!(matches!(err, ModelError::Cycle(_)));
        for op in ["split", "left", "right", "join"] {
            assert!(msg.contains(op), "{msg} should name {op}");
        }
        assert!(!msg.contains("src"), "{msg}");
    }

    fn looped(extra: &str) -> JobSpec {
        JobSpec::from_yaml(&format!(
            r"
name: looped
operators:
  - {{ name: src, kind: source, rate: {{ constant: 100 }} }}
  - {{ name: a, kind: map }}
  - {{ name: b, kind: map }}
  - {{ name: sink, kind: sink }}
edges:
  - {{ from: src, to: a }}
  - {{ from: a, to: sink }}
{extra}"
        ))
        .expect("parses")
    }

    fn sel(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn loop_with_gain_half_doubles_the_rate() {
        let gamma = sel(&[("src", 100.0)]);
        // Self-loop a → a with gain 0.5: λ_a = γ + 0.5 λ_a = γ / (1 − 0.5).
        let spec = looped("  - { from: a, to: a }\n  - { from: b, to: sink }\n");
        let l = traffic_equations(&spec, &gamma, &sel(&[("a", 0.5), ("b", 1.0)])).expect("stable");
        assert!((l["a"] - 100.0 / (1.0 - 0.5)).abs() < 1e-9, "{l:?}");
        assert!((l["sink"] - 0.5 * 200.0).abs() < 1e-9, "{l:?}");
        assert_eq!(l["b"], 0.0);
        // Two-operator loop a → b → a, round-trip gain 0.5 · 1: λ_a = γ/(1 − 0.5), λ_b = 0.5 λ_a.
        let spec = looped("  - { from: a, to: b }\n  - { from: b, to: a }\n");
        let topo = Topology::from_spec_with_loops(&spec).expect("loops allowed");
        assert_eq!(topo.names, ["src", "a", "b", "sink"]);
        assert_eq!(topo.loops, vec![std::ops::Range { start: 1, end: 3 }]);
        let l = traffic_equations(&spec, &gamma, &sel(&[("a", 0.5), ("b", 1.0)])).expect("stable");
        assert!((l["a"] - 200.0).abs() < 1e-9, "{l:?}");
        assert!((l["b"] - 100.0).abs() < 1e-9, "{l:?}");
        assert!((l["sink"] - 100.0).abs() < 1e-9, "{l:?}");
        // The plain constructor still rejects it (the engine cannot run cycles).
        assert!(matches!(
            Topology::from_spec(&spec),
            Err(ModelError::Cycle(_))
        ));
        // Latency takes the loop once.
        let p =
            end_to_end_latency(&spec, &sel(&[("a", 0.1), ("b", 0.2), ("sink", 0.01)])).expect("ok");
        assert!((p.seconds - 0.11).abs() < 1e-12, "{p:?}");
        assert_eq!(p.path, ["src", "a", "sink"]);
    }

    #[test]
    fn unstable_loop_rejected_naming_operators_and_gain() {
        let spec = looped("  - { from: a, to: b }\n  - { from: b, to: a }\n");
        let topo = Topology::from_spec_with_loops(&spec).expect("loops allowed");
        for (ga, gb) in [(1.0, 1.0), (2.0, 0.75), (3.0, 1.0)] {
            let gain = [1.0, ga, gb, 0.0];
            let err = topo
                .try_traffic(&[100.0, 0.0, 0.0, 0.0], &gain)
                .expect_err("unstable");
            assert_eq!(err.operators, ["a", "b"]);
            let rt = ga * gb;
            assert!((err.round_trip_gain.expect("simple cycle") - rt).abs() < 1e-12);
            // A 2-cycle: ρ(S) = √(round-trip gain).
            assert!((err.spectral_radius - rt.sqrt()).abs() < 1e-6, "{err:?}");
            let msg = ModelError::from(err).to_string();
            assert!(msg.contains("a, b") && msg.contains("loop gain"), "{msg}");
            assert!(!msg.contains("src") && !msg.contains("sink"), "{msg}");
            let l = topo.traffic(&[100.0, 0.0, 0.0, 0.0], &gain);
            assert!(
                l[1].is_infinite() && l[3].is_infinite() && l[0] == 100.0,
                "{l:?}"
            );
        }
        let err = traffic_equations(&spec, &sel(&[("src", 1.0)]), &sel(&[("a", 1.5)]))
            .expect_err("unstable");
        assert!(err.to_string().contains("round-trip gain 1.5000"), "{err}");
        // NaN gains on a loop are rejected, not propagated.
        let err = topo
            .try_traffic(&[1.0, 0.0, 0.0, 0.0], &[1.0, f64::NAN, 0.5, 0.0])
            .expect_err("NaN");
        assert!(err.spectral_radius.is_nan());
    }

    #[test]
    fn nested_loops_match_the_dense_solution() {
        // a ⇄ b and b → b: not a simple cycle.
        let spec =
            looped("  - { from: a, to: b }\n  - { from: b, to: a }\n  - { from: b, to: b }\n");
        let topo = Topology::from_spec_with_loops(&spec).expect("loops allowed");
        let gain = [1.0, 0.6, 0.3, 0.0];
        let l = topo
            .try_traffic(&[10.0, 0.0, 0.0, 0.0], &gain)
            .expect("stable");
        // λ_a = 10 + 0.3 λ_b, λ_b = 0.6 λ_a + 0.3 λ_b → λ_b = 6/7 λ_a, λ_a = 10/(1 − 1.8/7).
        let la = 10.0 / (1.0 - 1.8 / 7.0);
        assert!(
            (l[1] - la).abs() < 1e-9 && (l[2] - 6.0 / 7.0 * la).abs() < 1e-9,
            "{l:?}"
        );
        let err = topo
            .try_traffic(&[10.0, 0.0, 0.0, 0.0], &[1.0, 2.0, 0.5, 0.0])
            .expect_err("ρ>1");
        assert_eq!(err.round_trip_gain, None);
        // ρ of [[0, 2], [0.5, 0.5]]: (0.5 + √(0.25 + 4)) / 2.
        assert!(
            (err.spectral_radius - (0.5 + 4.25f64.sqrt()) / 2.0).abs() < 1e-6,
            "{err:?}"
        );
    }

    /// A random DAG with edges i → j (i < j) and gains, as a job spec.
    fn random_dag(n: usize, edges: &[(usize, usize)]) -> JobSpec {
        let mut ops = String::from("  - { name: op0, kind: source, rate: { constant: 1 } }\n");
        for i in 1..n {
            ops.push_str(&format!("  - {{ name: op{i}, kind: map }}\n"));
        }
        let mut es = String::new();
        for &(a, b) in edges {
            es.push_str(&format!("  - {{ from: op{a}, to: op{b} }}\n"));
        }
        if es.is_empty() {
            es.push_str("  []\n");
        }
        JobSpec::from_yaml(&format!("name: r\noperators:\n{ops}edges:\n{es}")).expect("parses")
    }

    proptest::proptest! {
        #[test]
        fn dag_results_unchanged_and_match_the_dense_solve(
            n in 2usize..9,
            raw in proptest::collection::vec((0usize..9, 0usize..9), 0..20),
            gains in proptest::collection::vec(0.0f64..3.0, 9),
            gammas in proptest::collection::vec(0.0f64..1000.0, 9),
        ) {
            let mut edges: Vec<(usize, usize)> = raw
                .into_iter()
                .map(|(a, b)| (a % n, b % n))
                .filter(|(a, b)| a < b)
                .collect();
            edges.sort_unstable();
            edges.dedup();
            let spec = random_dag(n, &edges);
            let topo = Topology::from_spec(&spec).expect("DAG");
            let with_loops = Topology::from_spec_with_loops(&spec).expect("DAG");
            proptest::prop_assert_eq!(&topo, &with_loops);
            let (g, s) = (&gammas[..n], &gains[..n]);
            let fast = topo.traffic(g, s);
            proptest::prop_assert_eq!(&fast, &with_loops.try_traffic(g, s).expect("DAG"));
            // The dense solve of (I − Sᵀ) λ = γ over the whole graph agrees.
            let mut a = vec![0.0; n * n];
            let mut b = g.to_vec();
            for r in 0..n {
                a[r * n + r] = 1.0;
                for &j in &topo.inputs[r] {
                    a[r * n + j] -= s[j];
                }
            }
            solve_m_matrix(&mut a, &mut b).expect("DAG: I − Sᵀ is unit triangular");
            for (x, y) in fast.iter().zip(&b) {
                proptest::prop_assert!((x - y).abs() <= 1e-9 * (1.0 + x.abs()), "{x} vs {y}");
            }
        }

        #[test]
        fn stable_loops_satisfy_the_traffic_equations(
            n in 2usize..8,
            raw in proptest::collection::vec((0usize..8, 0usize..8), 1..16),
            gains in proptest::collection::vec(0.0f64..1.0, 8),
            gammas in proptest::collection::vec(0.0f64..1000.0, 8),
        ) {
            let mut edges: Vec<(usize, usize)> = raw
                .into_iter()
                .map(|(a, b)| (a % n, 1 + b % (n - 1)))
                .collect();
            edges.sort_unstable();
            edges.dedup();
            let spec = random_dag(n, &edges);
            let topo = Topology::from_spec_with_loops(&spec).expect("loops allowed");
            // Gains ≤ 0.99 / (max in-degree) keep every row sum of Sᵀ < 1, so ρ(S) ≤ ‖Sᵀ‖∞ < 1.
            let indeg = topo.inputs.iter().map(Vec::len).max().unwrap_or(1).max(1) as f64;
            let s: Vec<f64> = gains[..n].iter().map(|x| x * 0.99 / indeg).collect();
            let g = &gammas[..n];
            let l = topo.try_traffic(g, &s).expect("ρ < 1");
            for i in 0..n {
                let rhs = g[i] + topo.inputs[i].iter().map(|&j| s[j] * l[j]).sum::<f64>();
                proptest::prop_assert!(l[i] >= 0.0);
                proptest::prop_assert!((l[i] - rhs).abs() <= 1e-7 * (1.0 + rhs), "{i}: {} vs {rhs}", l[i]);
            }
        }
    }
}
