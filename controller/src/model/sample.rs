//! Metric samples: cumulative counters of every subtask at one scrape.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Cumulative counters of one subtask at one scrape (as the engine's Prometheus endpoint
/// reports them). Counters only grow while the subtask runs; rates are their deltas over a
/// window divided by the elapsed seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubtaskSample {
    /// Counter, records taken from the input queue.
    pub records_in: f64,
    /// Counter, records emitted.
    pub records_out: f64,
    /// Counter, seconds spent processing (excludes waiting for input and blocked output);
    /// DS2's "useful time".
    pub busy_seconds: f64,
    /// Counter, seconds spent waiting for input.
    pub idle_seconds: f64,
    /// Counter, seconds blocked on a full output channel (backpressure).
    pub backpressured_seconds: f64,
    /// Gauge, records waiting in this subtask's input queue.
    pub queue_length: f64,
    /// Gauge, sources only: records that should have been emitted but were not (lag).
    pub source_backlog: Option<f64>,
    /// Counter, sources only: records that should have been emitted by now (the external
    /// arrival count; Δ/Δt is the arrival rate γ even under backpressure).
    pub source_arrivals: Option<f64>,
    /// Gauge, Kafka sources only: the topic's partition count (`streamscale_source_partitions`),
    /// the most subtasks the source can use. `None` for other sources and operators, the
    /// simulator and older stored windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_partitions: Option<f64>,
    /// Gauge, keyed operators only: the share of the subtask's recent records (the engine's
    /// counts per key group, decayed with a 5 s half-life) that its busiest key group took, in
    /// (0, 1] (`streamscale_hottest_key_group_share`). `None` where the engine does not report
    /// it (other operators, before the first record, the simulator, older stored windows).
    #[serde(default)]
    pub hottest_key_group_share: Option<f64>,
    /// Gauges, keyed operators only: the subtask's busiest key groups (at most 8, the engine's
    /// `streamscale_key_group_share{key_group}`) as (key group index among the job's
    /// `maxParallelism`, share of the subtask's recent records in (0, 1]), busiest first (the
    /// lower index first on a tie). Empty where the engine does not report them (other
    /// operators, before the first record, the simulator, older stored windows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_group_shares: Vec<(u32, f64)>,
    /// Counters, non-source operators: the sums of the subtask's timed batches of records
    /// (the engine's `streamscale_service_*` families), from which
    /// [`super::service_cv`] estimates the per-record service time's coefficient of
    /// variation. `None` where the engine does not report them (sources, the simulator, older
    /// engines and stored windows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceMoments>,
}

impl SubtaskSample {
    /// The place of a subtask that is missing from a scrape (the operator still runs it):
    /// every counter NaN, so that no figure of it can be read as a value (zeros would read as a
    /// counter reset, a shorter list as a smaller operator). See [`Self::is_absent`].
    pub fn absent() -> SubtaskSample {
        SubtaskSample {
            records_in: f64::NAN,
            records_out: f64::NAN,
            busy_seconds: f64::NAN,
            idle_seconds: f64::NAN,
            backpressured_seconds: f64::NAN,
            queue_length: f64::NAN,
            ..SubtaskSample::default()
        }
    }

    /// Whether this is the place of a subtask missing from its scrape ([`Self::absent`]).
    pub fn is_absent(&self) -> bool {
        self.records_in.is_nan()
            && self.records_out.is_nan()
            && self.busy_seconds.is_nan()
            && self.idle_seconds.is_nan()
    }
}

/// Cumulative sums over a subtask's timed batches of records (batch i: n_i records in T_i
/// seconds of processing), as the engine exports them (`streamscale_engine::service_time`).
/// Counters: a window's deltas are the sums over the batches closed in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceMoments {
    /// Σ n_i, records (`streamscale_service_records_total`).
    pub records: f64,
    /// Σ T_i, seconds (`streamscale_service_time_seconds_total`).
    pub seconds: f64,
    /// Σ T_i², seconds² (`streamscale_service_time_sq_seconds_total`).
    pub seconds_sq: f64,
    /// Σ n_i·T_i, record-seconds (`streamscale_service_time_records_seconds_total`).
    pub record_seconds: f64,
    /// Σ n_i², records² (`streamscale_service_records_sq_total`).
    pub records_sq: f64,
}

impl ServiceMoments {
    /// `self − earlier`, field by field: the sums over the batches between two scrapes.
    pub fn since(&self, earlier: &ServiceMoments) -> ServiceMoments {
        ServiceMoments {
            records: self.records - earlier.records,
            seconds: self.seconds - earlier.seconds,
            seconds_sq: self.seconds_sq - earlier.seconds_sq,
            record_seconds: self.record_seconds - earlier.record_seconds,
            records_sq: self.records_sq - earlier.records_sq,
        }
    }
}

/// One scrape of the whole job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricSample {
    /// Time of the scrape, seconds on any monotonic clock.
    pub at_seconds: f64,
    /// Operator name -> its subtasks' counters, in subtask index order.
    pub operators: BTreeMap<String, Vec<SubtaskSample>>,
}

impl MetricSample {
    /// Marks the subtasks missing from this scrape against the parallelism each operator is
    /// known to run (`known`, e.g. what the controller started the engine with): an operator
    /// listing fewer subtasks gets [`SubtaskSample::absent`] places up to its known count.
    /// Returns, per operator with a missing subtask (in name order), the missing indices
    /// (places already absent, e.g. holes in the subtask labels, included). Operators absent
    /// altogether are left out (that is a missing operator, not a missing subtask).
    pub fn mark_missing(&mut self, known: &BTreeMap<String, u32>) -> Vec<(String, Vec<usize>)> {
        let mut missing = Vec::new();
        for (op, subtasks) in &mut self.operators {
            if let Some(&p) = known.get(op) {
                let p = p as usize;
                if subtasks.len() < p {
                    subtasks.resize(p, SubtaskSample::absent());
                }
            }
            let gone: Vec<usize> = subtasks
                .iter()
                .enumerate()
                .filter(|(_, s)| s.is_absent())
                .map(|(k, _)| k)
                .collect();
            if !gone.is_empty() {
                missing.push((op.clone(), gone));
            }
        }
        missing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_subtasks_are_marked_up_to_the_known_parallelism() {
        let mut s = MetricSample {
            at_seconds: 1.0,
            operators: [
                ("a".to_string(), vec![SubtaskSample::default()]),
                (
                    "b".to_string(),
                    vec![SubtaskSample::absent(), SubtaskSample::default()],
                ),
                ("c".to_string(), vec![SubtaskSample::default(); 2]),
            ]
            .into_iter()
            .collect(),
        };
        let known = [("a".to_string(), 3), ("c".to_string(), 2)]
            .into_iter()
            .collect();
        assert_eq!(
            s.mark_missing(&known),
            vec![("a".to_string(), vec![1, 2]), ("b".to_string(), vec![0])]
        );
        assert_eq!(s.operators["a"].len(), 3);
        assert!(s.operators["a"][2].is_absent() && !s.operators["a"][0].is_absent());
    }
}
