//! A Flink job's vertices and edges as the planner's job graph. Pure.
//!
//! Each Flink vertex (a chain of operators run by one thread per subtask) is one queue of the
//! model. A vertex without inputs is a source; a vertex with a `HASH` input is keyed (its key
//! groups are its max parallelism); the others share their input (forward, rebalance).

use std::collections::BTreeMap;

use streamscale_engine::spec::{
    AutoscalerSpec, EdgeSpec, JobSpec, OperatorKind, OperatorSpec, RateSpec, ScalingBounds,
};

use super::rest::JobDetails;

/// What a vertex is to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum VertexRole {
    /// No inputs: reads the outside world.
    Source,
    /// A `HASH` input: partitioned by key group.
    Keyed,
    /// Any other vertex.
    Operator,
}

impl VertexRole {
    /// `source`, `keyed` or `operator`.
    pub fn name(self) -> &'static str {
        match self {
            VertexRole::Source => "source",
            VertexRole::Keyed => "keyed",
            VertexRole::Operator => "operator",
        }
    }
}

/// One vertex of the job, as the controller names it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlinkVertex {
    /// Flink's vertex id (32 hex digits).
    pub id: String,
    /// The operator name in the model and in every line the controller prints: Flink's vertex
    /// name, with ` #2`, ` #3`, ... added to repeated names.
    pub name: String,
    /// Source, keyed or other.
    pub role: VertexRole,
    /// Flink's max parallelism of the vertex (its key groups when keyed).
    pub max_parallelism: u32,
    /// Its parallelism when the job was read.
    pub parallelism: u32,
}

/// A Flink job mapped onto the planner's job graph.
#[derive(Debug, Clone, PartialEq)]
pub struct FlinkTopology {
    /// The job id it was read from.
    pub job_id: String,
    /// The job's name.
    pub job_name: String,
    /// The vertices in Flink's order.
    pub vertices: Vec<FlinkVertex>,
    /// The planner's graph: one operator per vertex (named as [`FlinkVertex::name`]), edges
    /// as the plan's inputs, the given autoscaler settings.
    pub spec: JobSpec,
}

/// Errors reading a job graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TopologyError {
    /// A plan input names a vertex the job does not have.
    #[error("job {job}: vertex {vertex} has an input from unknown vertex {input}")]
    UnknownInput {
        /// The job id.
        job: String,
        /// The vertex's name.
        vertex: String,
        /// The unknown id.
        input: String,
    },
    /// The job has no vertices.
    #[error("job {job} has no vertices")]
    Empty {
        /// The job id.
        job: String,
    },
    /// Flink lists no plan for the job yet (it is being created): its graph cannot be read.
    #[error("job {job} ({state}) lists no plan yet: its graph cannot be read until it runs")]
    PlanNotListed {
        /// The job id.
        job: String,
        /// The job's state.
        state: String,
    },
}

/// Flink's default max parallelism for a vertex that reports none (`-1`):
/// `min(max(roundUpToPowerOfTwo(1.5·p), 128), 32768)` (Flink's
/// `KeyGroupRangeAssignment.computeDefaultMaxParallelism`).
fn default_max_parallelism(p: u32) -> u32 {
    let x = (u64::from(p) * 3).div_ceil(2).next_power_of_two();
    x.clamp(128, 32_768) as u32
}

/// Per-vertex parallelism bounds by vertex name (the user's `--min`/`--max` or settings file).
pub type VertexBounds = BTreeMap<String, ScalingBounds>;

impl FlinkTopology {
    /// Maps `job` onto the planner's graph with these autoscaler settings and per-vertex
    /// bounds (by vertex name; a name that matches no vertex is ignored, see
    /// [`FlinkTopology::unknown_bounds`]).
    ///
    /// # Errors
    /// [`TopologyError`] on a plan whose inputs name unknown vertices, no vertices, or no plan
    /// listed yet ([`graph_known`]).
    pub fn from_job(
        job: &JobDetails,
        autoscaler: &AutoscalerSpec,
        bounds: &VertexBounds,
    ) -> Result<FlinkTopology, TopologyError> {
        if job.vertices.is_empty() {
            return Err(TopologyError::Empty {
                job: job.jid.clone(),
            });
        }
        if !graph_known(job) {
            return Err(TopologyError::PlanNotListed {
                job: job.jid.clone(),
                state: job.state.clone(),
            });
        }
        let inputs: BTreeMap<&str, &[super::rest::PlanInput]> = job
            .plan
            .nodes
            .iter()
            .map(|n| (n.id.as_str(), n.inputs.as_slice()))
            .collect();
        let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
        let mut vertices = Vec::with_capacity(job.vertices.len());
        for v in &job.vertices {
            let count = seen.entry(v.name.as_str()).or_insert(0);
            *count += 1;
            let name = if *count == 1 {
                v.name.clone()
            } else {
                format!("{} #{count}", v.name)
            };
            let ins = inputs.get(v.id.as_str()).copied().unwrap_or(&[]);
            let role = if ins.is_empty() {
                VertexRole::Source
            } else if ins
                .iter()
                .any(|i| i.ship_strategy.eq_ignore_ascii_case("HASH"))
            {
                VertexRole::Keyed
            } else {
                VertexRole::Operator
            };
            let max_parallelism = u32::try_from(v.max_parallelism)
                .ok()
                .filter(|&m| m > 0)
                .unwrap_or_else(|| default_max_parallelism(v.parallelism));
            vertices.push(FlinkVertex {
                id: v.id.clone(),
                name,
                role,
                max_parallelism,
                parallelism: v.parallelism,
            });
        }
        let by_id: BTreeMap<&str, &FlinkVertex> =
            vertices.iter().map(|v| (v.id.as_str(), v)).collect();
        let mut edges = Vec::new();
        for v in &vertices {
            for i in inputs.get(v.id.as_str()).copied().unwrap_or(&[]) {
                let from = by_id
                    .get(i.id.as_str())
                    .ok_or_else(|| TopologyError::UnknownInput {
                        job: job.jid.clone(),
                        vertex: v.name.clone(),
                        input: i.id.clone(),
                    })?;
                edges.push(EdgeSpec {
                    from: from.name.clone(),
                    to: v.name.clone(),
                });
            }
        }
        let max_parallelism = vertices
            .iter()
            .filter(|v| v.role == VertexRole::Keyed)
            .map(|v| v.max_parallelism)
            .max()
            .unwrap_or_else(|| {
                vertices
                    .iter()
                    .map(|v| v.max_parallelism)
                    .max()
                    .unwrap_or(128)
            });
        let operators = vertices
            .iter()
            .map(|v| {
                let b = bounds.get(&v.name).copied().unwrap_or_default();
                OperatorSpec {
                    name: v.name.clone(),
                    parallelism: v.parallelism,
                    cpu: 0.0,
                    io: 0.0,
                    scaling: ScalingBounds {
                        min: b.min,
                        max: Some(b.max.unwrap_or(v.max_parallelism).min(v.max_parallelism)),
                    },
                    kind: match v.role {
                        VertexRole::Source => OperatorKind::Source {
                            rate: RateSpec::Constant(0.0),
                            keys: 1,
                            count: None,
                            nexmark: None,
                            kafka: None,
                        },
                        // The model's keyed queue without a window: a regular (non-windowed)
                        // keyed operator.
                        VertexRole::Keyed => OperatorKind::Join { window: None },
                        VertexRole::Operator => OperatorKind::Map,
                    },
                }
            })
            .collect();
        let spec = JobSpec {
            name: job_name_for_spec(&job.name),
            max_parallelism,
            channel_capacity: 1024,
            operators,
            edges,
            autoscaler: autoscaler.clone(),
            checkpoint: None,
            state: Default::default(),
        };
        Ok(FlinkTopology {
            job_id: job.jid.clone(),
            job_name: job.name.clone(),
            vertices,
            spec,
        })
    }

    /// The names in `bounds` that match no vertex (to warn about a typo).
    pub fn unknown_bounds<'a>(&self, bounds: &'a VertexBounds) -> Vec<&'a str> {
        bounds
            .keys()
            .filter(|n| !self.vertices.iter().any(|v| &v.name == *n))
            .map(String::as_str)
            .collect()
    }

    /// The vertex of a model operator name.
    pub fn vertex(&self, name: &str) -> Option<&FlinkVertex> {
        self.vertices.iter().find(|v| v.name == name)
    }

    /// A parallelism map by operator name as one by vertex id (names without a vertex left out).
    pub fn by_id(&self, by_name: &BTreeMap<String, u32>) -> BTreeMap<String, u32> {
        by_name
            .iter()
            .filter_map(|(n, &p)| self.vertex(n).map(|v| (v.id.clone(), p)))
            .collect()
    }

    /// A parallelism map by vertex id as one by operator name (unknown ids left out).
    pub fn by_name(&self, by_id: &BTreeMap<String, u32>) -> BTreeMap<String, u32> {
        self.vertices
            .iter()
            .filter_map(|v| by_id.get(&v.id).map(|&p| (v.name.clone(), p)))
            .collect()
    }

    /// Whether `job` still has this graph: the same vertex ids in the same order, with the same
    /// roles and edges. A job whose plan Flink does not list yet ([`graph_known`] false: a
    /// starting job) has nothing to compare and counts as the same.
    pub fn same_graph(&self, job: &JobDetails) -> bool {
        if !graph_known(job) {
            return true;
        }
        match FlinkTopology::from_job(job, &self.spec.autoscaler, &VertexBounds::new()) {
            Ok(t) => {
                t.vertices
                    .iter()
                    .map(|v| (&v.id, v.role))
                    .eq(self.vertices.iter().map(|v| (&v.id, v.role)))
                    && t.spec.edges == self.spec.edges
            }
            Err(_) => false,
        }
    }

    /// One line naming the job and its vertices in Flink's order: name, role, parallelism, max
    /// parallelism (`job ID \`name\`: Source: trace (source, p=1, max 128) -> …`).
    pub fn describe(&self) -> String {
        format!(
            "job {} `{}`: {}",
            self.job_id,
            self.job_name,
            self.vertices
                .iter()
                .map(|v| format!(
                    "{} ({}, p={}, max {})",
                    v.name,
                    v.role.name(),
                    v.parallelism,
                    v.max_parallelism
                ))
                .collect::<Vec<_>>()
                .join(" -> ")
        )
    }

    /// `pipeline.jobvertex-parallelism-overrides` for a parallelism map by operator name:
    /// `vid:p,vid:p` in vertex order.
    pub fn overrides(&self, by_name: &BTreeMap<String, u32>) -> String {
        self.vertices
            .iter()
            .filter_map(|v| by_name.get(&v.name).map(|p| format!("{}:{p}", v.id)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Whether Flink lists `job`'s plan: a job still being created (`CREATED`, also after a
/// restart) answers its vertices, in another order, with an empty plan, from which no vertex's
/// inputs (so no role and no edge) can be read.
pub fn graph_known(job: &JobDetails) -> bool {
    !job.plan.nodes.is_empty()
}

/// A job name as the planner's spec names jobs (letters, digits, `-`, `_`).
fn job_name_for_spec(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // At most the engine spec's 63 characters (MAX_NAME_LEN).
    let s: String = s
        .chars()
        .take(streamscale_engine::spec::MAX_NAME_LEN)
        .collect();
    if s.is_empty() { "flink-job".into() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flink::rest::{Plan, PlanInput, PlanNode, VertexSummary};

    fn vertex(id: &str, name: &str, p: u32, max: i64) -> VertexSummary {
        VertexSummary {
            id: id.into(),
            name: name.into(),
            parallelism: p,
            max_parallelism: max,
            status: "RUNNING".into(),
        }
    }

    fn job() -> JobDetails {
        JobDetails {
            jid: "j".into(),
            name: "demo job".into(),
            state: "RUNNING".into(),
            now: 0,
            scheduler_type: None,
            vertices: vec![
                vertex("a", "Source: trace", 1, 128),
                vertex("b", "count -> Sink: discard", 2, 64),
                vertex("c", "count -> Sink: discard", 1, -1),
            ],
            plan: Plan {
                nodes: vec![
                    PlanNode {
                        id: "a".into(),
                        inputs: vec![],
                    },
                    PlanNode {
                        id: "b".into(),
                        inputs: vec![PlanInput {
                            id: "a".into(),
                            ship_strategy: "HASH".into(),
                        }],
                    },
                    PlanNode {
                        id: "c".into(),
                        inputs: vec![PlanInput {
                            id: "b".into(),
                            ship_strategy: "REBALANCE".into(),
                        }],
                    },
                ],
            },
        }
    }

    #[test]
    fn vertices_become_sources_keyed_and_plain_queues() {
        let bounds: VertexBounds = [(
            "Source: trace".to_string(),
            ScalingBounds {
                min: Some(1),
                max: Some(4),
            },
        )]
        .into_iter()
        .collect();
        let t =
            FlinkTopology::from_job(&job(), &AutoscalerSpec::default(), &bounds).expect("topology");
        let roles: Vec<_> = t
            .vertices
            .iter()
            .map(|v| (v.name.as_str(), v.role))
            .collect();
        assert_eq!(
            roles,
            vec![
                ("Source: trace", VertexRole::Source),
                ("count -> Sink: discard", VertexRole::Keyed),
                ("count -> Sink: discard #2", VertexRole::Operator),
            ]
        );
        assert!(t.spec.operators[1].kind.is_keyed() && !t.spec.operators[2].kind.is_keyed());
        assert_eq!(t.spec.max_parallelism, 64, "the keyed vertex's key groups");
        assert_eq!(t.spec.operators[0].scaling.max, Some(4));
        assert_eq!(
            t.spec.operators[2].scaling.max,
            Some(128),
            "Flink's default"
        );
        assert_eq!(t.spec.name, "demo_job");
        assert_eq!(t.spec.edges.len(), 2);
        let p: BTreeMap<String, u32> = [
            ("Source: trace".to_string(), 1),
            ("count -> Sink: discard".to_string(), 3),
        ]
        .into_iter()
        .collect();
        assert_eq!(t.overrides(&p), "a:1,b:3");
        assert_eq!(t.by_name(&t.by_id(&p)), p);
        crate::model::network::Topology::from_spec(&t.spec).expect("a valid graph");
    }

    #[test]
    fn an_input_from_nowhere_is_named() {
        let mut j = job();
        j.plan.nodes[1].inputs[0].id = "zz".into();
        let e = FlinkTopology::from_job(&j, &AutoscalerSpec::default(), &VertexBounds::new())
            .expect_err("unknown input");
        assert_eq!(
            e.to_string(),
            "job j: vertex count -> Sink: discard has an input from unknown vertex zz"
        );
    }

    #[test]
    fn default_max_parallelism_follows_flink() {
        assert_eq!(default_max_parallelism(1), 128);
        assert_eq!(default_max_parallelism(100), 256);
        assert_eq!(default_max_parallelism(100_000), 32_768);
    }
}
