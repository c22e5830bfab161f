//! The pure model and planner (no I/O): metric windows in, parallelism decisions out.
//!
//! Nothing in this module reads a clock, a file or the network: time enters as arguments in
//! seconds, so the simulator can reuse the model unchanged.
//!
//! * [`sample`]: the metric window, one [`MetricSample`] per scrape of cumulative counters.
//! * [`estimate`](mod@estimate): rates from a window (DS2's useful time and true processing rate).
//! * [`service_cv`]: the per-record service time's coefficient of variation from the
//!   engine's batch sums.
//! * [`queueing`]: Erlang B/C, M/M/1, M/M/c, Allen-Cunneen and Kingman sojourn times.
//! * [`network`]: the open Jackson network of the job graph (traffic equations, path latency).
//! * [`planner`]: DS2 sizing at a target utilization plus greedy marginal allocation for the
//!   latency SLO; every operator is decided at once.
//! * [`learn`]: per-operator scalability factors learned from past rescales, and
//!   ineffective-scaling flags.
//! * [`flaps`]: spiky traffic recognised from scale-ups that soon follow scale-downs.
//! * [`forecast`]: Holt-Winters forecast of the job's input rate, to scale ahead of ramps.
//! * [`shed`]: limits (max parallelism, subtask quota) and load shedding (capacity C, headroom H).
//! * [`quota`]: one subtask quota split across several jobs by marginal benefit.
//! * [`guards`]: stabilization, backlog, threshold and scale-down-delay guards around the planner.
//!
//! Units everywhere: rates in records/s, times in seconds, backlogs in records.

pub mod autoscaler;
pub mod estimate;
pub mod flaps;
mod float_text;
pub mod forecast;
pub mod guards;
pub mod learn;
pub mod network;
pub mod planner;
pub mod queueing;
pub mod quota;
pub mod sample;
mod serde_inf;
pub mod service_cv;
pub mod shed;

pub use autoscaler::{Autoscaler, DOWNTIMES_KEPT, Verdict, expected_downtime};
pub use estimate::{Estimates, MIN_BUSY_SECONDS, OperatorEstimate, SourceEstimate, estimate};
pub use guards::{GuardSettings, GuardState, PendingScaleDown};
pub use network::{PathLatency, Topology, end_to_end_latency, traffic_equations};
pub use planner::{Decision, OperatorPlan, PlannerSettings, SourcePlan, plan};
pub use queueing::{
    QueueKind, TailNode, allen_cunneen_waiting_time, erlang_b, erlang_c, ggc_waiting_quantile,
    ggc_waiting_tail, kingman_waiting_time, mm1_sojourn_time, mm1_waiting_time, mmc_sojourn_time,
    mmc_waiting_time, operator_sojourn_time, path_latency_quantile_bound,
};
pub use sample::{MetricSample, ServiceMoments, SubtaskSample};

/// Everything that can go wrong while turning a metric window into a decision.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// Rates are counter deltas, so the window needs at least two samples.
    #[error("need at least 2 metric samples in the window, got {got}")]
    TooFewSamples {
        /// Number of samples given.
        got: usize,
    },
    /// The first and last samples are not separated by a positive, finite time.
    #[error(
        "the metric window spans {seconds} s (first to last sample); rates need a positive elapsed time"
    )]
    ZeroElapsed {
        /// Elapsed seconds between the first and last sample.
        seconds: f64,
    },
    /// A sample's timestamp is not a finite number of seconds.
    #[error("metric sample {sample} has a non-finite timestamp {value}")]
    InvalidTimestamp {
        /// Index of the sample in the window.
        sample: usize,
        /// The timestamp.
        value: f64,
    },
    /// An operator of the job graph is absent from a sample.
    #[error("operator `{operator}` is missing from metric sample {sample}")]
    MissingOperator {
        /// Operator name.
        operator: String,
        /// Index of the sample in the window.
        sample: usize,
    },
    /// An operator reports no subtasks at all.
    #[error("operator `{operator}` reports no subtasks in metric sample {sample}")]
    NoSubtasks {
        /// Operator name.
        operator: String,
        /// Index of the sample in the window.
        sample: usize,
    },
    /// The subtask count of an operator differs inside the window (a rescale happened).
    #[error(
        "operator `{operator}` changed parallelism inside the window: {first} subtasks in the first sample, {other} in sample {sample}"
    )]
    ParallelismChanged {
        /// Operator name.
        operator: String,
        /// Subtasks in the first sample.
        first: usize,
        /// Subtasks in the later sample.
        other: usize,
        /// Index of the later sample.
        sample: usize,
    },
    /// A subtask the operator runs is missing from a scrape ([`SubtaskSample::absent`]): the
    /// sample is incomplete (neither a smaller operator nor a counter reset).
    #[error(
        "subtask {subtask} of `{operator}` is missing from metric sample {sample} (the operator runs {parallelism})"
    )]
    MissingSubtask {
        /// Operator name.
        operator: String,
        /// Index of the missing subtask.
        subtask: usize,
        /// The operator's parallelism in that sample (missing subtasks included).
        parallelism: usize,
        /// Index of the sample in the window.
        sample: usize,
    },
    /// A cumulative counter decreased between two consecutive samples (a restart reset it).
    #[error(
        "counter {counter} of `{operator}` subtask {subtask} went backwards from {from} to {to} at sample {sample} (counter reset?)"
    )]
    CounterReset {
        /// Operator name.
        operator: String,
        /// Subtask index.
        subtask: usize,
        /// Counter name, e.g. `records_in`.
        counter: &'static str,
        /// Index of the sample where the counter is lower than in the previous one.
        sample: usize,
        /// Value in the previous sample.
        from: f64,
        /// Value in this sample.
        to: f64,
    },
    /// A counter or gauge is negative, NaN or infinite.
    #[error(
        "{field} of `{operator}` subtask {subtask} in sample {sample} is {value}; it must be a finite, non-negative number"
    )]
    InvalidValue {
        /// Operator name.
        operator: String,
        /// Subtask index.
        subtask: usize,
        /// Field name, e.g. `busy_seconds`.
        field: &'static str,
        /// Index of the sample in the window.
        sample: usize,
        /// The offending value.
        value: f64,
    },
    /// A source subtask lacks `source_backlog` or `source_arrivals`.
    #[error(
        "source `{operator}` subtask {subtask} reports no {missing} in sample {sample}; sources must report both source_backlog and source_arrivals"
    )]
    SourceWithoutBacklog {
        /// Source operator name.
        operator: String,
        /// Subtask index.
        subtask: usize,
        /// `source_backlog` or `source_arrivals`.
        missing: &'static str,
        /// Index of the sample in the window.
        sample: usize,
    },
    /// The job graph has a cycle (the message names the operators on it).
    #[error("{0}")]
    Cycle(String),
    /// A name does not denote an operator of the job.
    #[error("unknown operator `{0}`")]
    UnknownOperator(String),
    /// Two operators share a name.
    #[error("duplicate operator name `{0}`")]
    DuplicateOperator(String),
    /// A planner or guard setting is out of range.
    #[error("invalid planner settings: {0}")]
    InvalidSettings(String),
}

#[cfg(test)]
pub(crate) mod testutil;
