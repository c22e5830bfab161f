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
