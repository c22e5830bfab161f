//! The job graph as an open Jackson network of queues.
//!
//! Traffic equations (open Jackson network): λ = γ + Sᵀλ, where γ is the external arrival rate
//! (non-zero at sources only) and S the matrix of edge gains. In a dataflow an operator sends
//! every output record along every outgoing edge, so each edge's gain is the upstream
//! operator's selectivity (records out per record in; 1 for a source). On a DAG the equations
//! are solved exactly, without inverting (I − Sᵀ), by one pass in topological order.
//!
//! The mean end-to-end latency of a record along a path is the sum of the mean sojourn times of
//! the operators on it; the job's predicted latency is the maximum over source-to-sink paths
//! (sources contribute 0: their records enter the network when emitted).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use streamscale_engine::spec::{JobSpec, OperatorKind};

use super::ModelError;
use super::queueing::QueueKind;

/// The job graph indexed in topological order (every edge goes from a lower to a higher index).
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
        if order.len() < n {
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
    /// upstream of i) in topological order. `gamma` (external arrival rate, records/s) and
    /// `gain` (each operator's selectivity, the gain of all its outgoing edges) are indexed like
    /// `names`. Returns the total arrival rate λ of every operator, records/s.
    pub fn traffic(&self, gamma: &[f64], gain: &[f64]) -> Vec<f64> {
        let mut lambda = vec![0.0; self.len()];
        for i in 0..self.len() {
            let inflow: f64 = self.inputs[i].iter().map(|&j| gain[j] * lambda[j]).sum();
            lambda[i] = gamma.get(i).copied().unwrap_or(0.0) + inflow;
        }
        lambda
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
            for &j in &self.inputs[i] {
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

/// Solves the traffic equations λ = γ + Sᵀλ of the job's open Jackson network by name.
/// `gamma`: external arrival rate per source (records/s; missing = 0). `selectivity`: records
/// out per record in per operator (the gain of all its outgoing edges; missing = 1).
/// Returns the arrival rate λ of every operator, records/s.
///
/// # Errors
/// [`ModelError::Cycle`] naming the operators on a cycle; [`ModelError::UnknownOperator`] for
/// a name in `gamma` or `selectivity` that is not an operator.
pub fn traffic_equations(
    spec: &JobSpec,
    gamma: &BTreeMap<String, f64>,
    selectivity: &BTreeMap<String, f64>,
) -> Result<BTreeMap<String, f64>, ModelError> {
    let topo = Topology::from_spec(spec)?;
    let g = topo.by_index(gamma, 0.0)?;
    let s = topo.by_index(selectivity, 1.0)?;
    let lambda = topo.traffic(&g, &s);
    Ok(topo.names.iter().cloned().zip(lambda).collect())
}

/// Expected end-to-end latency of the job (seconds): the maximum over source-to-sink paths of
/// the sum of per-operator mean sojourn times (`sojourn`, seconds; missing = 0; sources always
/// contribute 0), with the slowest path.
///
/// # Errors
/// [`ModelError::Cycle`]; [`ModelError::UnknownOperator`] for a name that is not an operator.
pub fn end_to_end_latency(
    spec: &JobSpec,
    sojourn: &BTreeMap<String, f64>,
) -> Result<PathLatency, ModelError> {
    let topo = Topology::from_spec(spec)?;
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
}
