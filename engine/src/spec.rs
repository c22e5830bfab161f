//! Job specification: the YAML a user writes to describe a streaming job.
//!
//! A job is a directed acyclic graph of named operators joined by edges. The same
//! schema is read by the engine (which runs it), the controller (which scales it)
//! and the simulator (which replays traces through a model of it).
//!
//! ```yaml
//! name: tweets
//! maxParallelism: 128
//! operators:
//!   - { name: source, kind: source, rate: { constant: 100 } }
//!   - { name: parse,  kind: map, cpu: 200 }
//!   - { name: counts, kind: window, sizeMs: 1000, io: 500 }
//!   - { name: sink,   kind: sink }
//! edges:
//!   - { from: source, to: parse }
//!   - { from: parse, to: counts }
//!   - { from: counts, to: sink }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::kafka::{KafkaSinkSpec, KafkaSourceSpec};
use crate::nexmark::NexmarkSourceSpec;
use crate::nexmark::queries::{BidKey, SelectQuery};
use crate::time::window::WindowSpec;

mod parse_error;
mod validate;
mod yaml_tree;

pub use parse_error::first_line as yaml_error_line;

/// Default number of key groups (Flink's default lower bound for max parallelism).
pub const DEFAULT_MAX_PARALLELISM: u32 = 128;
/// Largest number of key groups a job may declare (Flink's upper bound, 2^15).
pub const MAX_KEY_GROUPS: u32 = 32_768;
/// Largest `channelCapacity`, in records (2^20). Each non-source subtask's input channel is
/// allocated up front (about 80 bytes per record slot), so a larger value could exhaust
/// memory before the job starts.
pub const MAX_CHANNEL_CAPACITY: usize = 1 << 20;
/// Largest number of record slots over all input channels, `channelCapacity` × Σ parallelism
/// of the non-source operators (2^24 slots, about 1.3 GB).
pub const MAX_CHANNEL_SLOTS: u64 = 1 << 24;
/// Largest number of sliding windows one record may fall into (`sizeMs / slideMs`); each
/// record updates that many open windows.
pub const MAX_WINDOWS_PER_RECORD: u64 = 1_000;
/// Fields every operator takes, whatever its kind.
pub const COMMON_OPERATOR_FIELDS: [&str; 6] =
    ["name", "kind", "parallelism", "cpu", "io", "scaling"];

/// A whole job: operators, edges and job-wide settings.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobSpec {
    /// Job name; also names savepoint directories. Letters, digits, `-` and `_`.
    pub name: String,
    /// Number of key groups (the largest parallelism any keyed operator can reach). Default 128.
    #[serde(default = "default_max_parallelism")]
    pub max_parallelism: u32,
    /// Capacity of each channel between operators, in records. A full channel blocks the
    /// sender (backpressure). 1 to 1048576 (2^20, `MAX_CHANNEL_CAPACITY`); default 1024.
    #[serde(default = "default_channel_capacity")]
    pub channel_capacity: usize,
    /// The operators, in any order.
    pub operators: Vec<OperatorSpec>,
    /// Directed edges `from -> to` between operator names.
    pub edges: Vec<EdgeSpec>,
    /// Autoscaler settings. The engine ignores them; the controller reads them.
    #[serde(default)]
    pub autoscaler: AutoscalerSpec,
    /// Periodic checkpoints by aligned barriers, their storage, retention and the restart
    /// strategy after a subtask failure. Absent: no periodic checkpoints and no restart (a
    /// failed subtask fails the job); savepoints work either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSpec>,
    /// Where keyed state lives: the heap (default) or disk. Not part of the job fingerprint, so
    /// a savepoint taken with one backend restores into the other.
    #[serde(default, skip_serializing_if = "StateSpec::is_default")]
    pub state: StateSpec,
}

/// The keyed-state backend of a job (`state:` in the job file; the engine's `state` module).
///
/// ```yaml
/// state: { backend: disk, dir: state, cacheEntries: 65536 }
/// ```
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateSpec {
    /// `heap` (in memory; default) or `disk` (an embedded on-disk B-tree, for state larger
    /// than memory).
    #[serde(default)]
    pub backend: StateBackendKind,
    /// Disk backend: directory of the working database files (one per keyed subtask, deleted
    /// when the subtask ends), relative to the job file's directory. Default `state` beside the
    /// job file. Not allowed with `heap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// Disk backend: keys kept in each subtask's write-back cache before they are committed to
    /// disk. At least 1. Default 65536.
    #[serde(default = "default_cache_entries")]
    pub cache_entries: usize,
}

/// Which keyed-state backend a job uses.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StateBackendKind {
    /// In memory, copy-on-write snapshots.
    #[default]
    Heap,
    /// On disk through redb with a write-back cache.
    Disk,
}

impl Default for StateSpec {
    fn default() -> Self {
        StateSpec {
            backend: StateBackendKind::Heap,
            dir: None,
            cache_entries: default_cache_entries(),
        }
    }
}

fn default_cache_entries() -> usize {
    crate::state::disk::DEFAULT_CACHE_ENTRIES
}

impl StateSpec {
    /// Whether this is the default (heap) setting, left out when serializing.
    pub fn is_default(&self) -> bool {
        *self == StateSpec::default()
    }

    /// The disk backend's directory: `dir`, or `state` in the working directory when the
    /// spec did not come from a file.
    pub fn dir_or_default(&self) -> PathBuf {
        PathBuf::from(self.dir.as_deref().unwrap_or("state"))
    }

    fn validate(&self) -> Result<(), String> {
        match self.backend {
            StateBackendKind::Heap => {
                if let Some(dir) = &self.dir {
                    return Err(format!(
                        "state.dir: `{dir}` is only used by the disk backend; remove it or set `backend: disk`"
                    ));
                }
                if self.cache_entries != default_cache_entries() {
                    return Err(
                        "state.cacheEntries: only used by the disk backend; remove it or set `backend: disk`"
                            .into(),
                    );
                }
            }
            StateBackendKind::Disk => {
                if self.cache_entries == 0 {
                    return Err("state.cacheEntries: must be at least 1".into());
                }
                let dir = self.dir_or_default();
                if dir.as_os_str().is_empty() {
                    return Err("state.dir: must not be empty".into());
                }
                if dir.exists() && !dir.is_dir() {
                    return Err(format!(
                        "state.dir: {} exists and is not a directory",
                        dir.display()
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Periodic checkpoints (`checkpoint:` in the job file).
///
/// ```yaml
/// checkpoint: { intervalSeconds: 1, retain: 3, dir: checkpoints, restart: { attempts: 3, delaySeconds: 1 } }
/// ```
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Seconds between checkpoint triggers (wall clock). Must be > 0.
    pub interval_seconds: f64,
    /// Completed checkpoints kept; older ones are deleted after a newer one completes. At
    /// least 1. Default 3.
    #[serde(default = "default_retain")]
    pub retain: u32,
    /// Where checkpoints are written: a directory (relative to the job file's directory) or
    /// an object-store URL (`file:///abs/path`, `s3://bucket/prefix`). Default
    /// `checkpoints/<job name>` beside the job file, so that two jobs started from one directory
    /// never write into each other's checkpoints (Flink likewise nests them under the job id).
    /// The engine's `--checkpoint-dir` overrides it.
    #[serde(default)]
    pub dir: Option<String>,
    /// Seconds after which a checkpoint that has not completed is declared failed. Must be
    /// > 0. Default 60.
    #[serde(default = "default_checkpoint_timeout")]
    pub timeout_seconds: f64,
    /// What to do when a subtask fails: restart in-process from the latest completed
    /// checkpoint.
    #[serde(default)]
    pub restart: RestartSpec,
}

/// Fixed-delay restart strategy after a subtask failure (Flink's `fixed-delay`).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestartSpec {
    /// Restarts allowed in one engine process before the job is declared failed; 0 never
    /// restarts. Default 3.
    #[serde(default = "default_restart_attempts")]
    pub attempts: u32,
    /// Seconds to wait before each restart. Must be >= 0. Default 1.
    #[serde(default = "one_f64")]
    pub delay_seconds: f64,
}

impl Default for RestartSpec {
    fn default() -> Self {
        RestartSpec {
            attempts: default_restart_attempts(),
            delay_seconds: 1.0,
        }
    }
}

/// Delivery guarantee of a sink's output across crashes and restores.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SinkDelivery {
    /// Two-phase commit tied to checkpoints ([`crate::sink::two_phase`]): a reader of the
    /// published output sees every result once, never a torn line.
    #[default]
    ExactlyOnce,
    /// Records are written as they arrive: after a crash the results written since the
    /// restored checkpoint are written again, and a line being written may be torn.
    AtLeastOnce,
}

/// Default number of completed checkpoints kept.
pub const DEFAULT_CHECKPOINT_RETAIN: u32 = 3;

fn default_retain() -> u32 {
    DEFAULT_CHECKPOINT_RETAIN
}
fn default_checkpoint_timeout() -> f64 {
    60.0
}
fn default_restart_attempts() -> u32 {
    3
}

/// One operator of the job graph.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorSpec {
    /// Unique operator name; used as the `operator` label of every metric.
    pub name: String,
    /// Number of subtasks (parallel instances). At least 1, at most `maxParallelism`. Default 1.
    #[serde(default = "one")]
    pub parallelism: u32,
    /// Real computation per record, in microseconds of CPU time (not on generated sources; a
    /// Kafka source spends it per record read).
    #[serde(default)]
    pub cpu: f64,
    /// Blocking wait per record, in microseconds, standing for an external call such as a
    /// database lookup (not on generated sources; a Kafka source waits per record read). It
    /// costs no CPU, so more subtasks add
    /// capacity even on a small machine.
    #[serde(default)]
    pub io: f64,
    /// Bounds on the parallelism the autoscaler may choose for this operator.
    #[serde(default)]
    pub scaling: ScalingBounds,
    /// What the operator does.
    #[serde(flatten)]
    pub kind: OperatorKind,
}

/// Operator kinds, selected by the `kind` field.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum OperatorKind {
    /// Emits synthetic keyed events at a rate given by `rate`, or reads a Kafka topic
    /// (`kafka:`).
    #[serde(rename_all = "camelCase")]
    Source {
        /// Emission rate over time (required unless `kafka` is set; a Kafka source takes none).
        #[serde(default = "kafka_source_rate")]
        rate: RateSpec,
        /// Number of distinct keys; key of the n-th record is a hash of n modulo `keys`. Default 1000.
        #[serde(default = "default_keys")]
        keys: u64,
        /// Stop after this many records in total (across restores). Unbounded when absent.
        #[serde(default)]
        count: Option<u64>,
        /// Emit Nexmark events (Person, Auction, Bid) with event time and watermarks instead
        /// of synthetic keyed records (the Nexmark benchmark's generator). `keys` is then unused.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nexmark: Option<NexmarkSourceSpec>,
        /// Read the records of a Kafka topic (key, value bytes, Kafka timestamp) instead of
        /// generating them; `rate`, `keys`, `count` and `nexmark` are then not allowed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kafka: Option<KafkaSourceSpec>,
    },
    /// Passes each record on unchanged after spending its cost.
    Map,
    /// Keeps the records of a Kafka source whose JSON value satisfies `where`
    /// (`field op value`, e.g. `likes >= 50`), and of those a deterministic share `keep`
    /// (0..=1, default 1) chosen by a hash of the record's sequence number. A record `where`
    /// cannot be evaluated on (not JSON, the field missing or of another type) is a dead letter
    /// (`streamscale_records_invalid_total`).
    Filter {
        /// Fraction of records kept, between 0 and 1. Default 1.
        #[serde(default = "one_f64")]
        keep: f64,
        /// A condition on a field of the JSON value of records read from Kafka.
        #[serde(default, rename = "where", skip_serializing_if = "Option::is_none")]
        condition: Option<crate::json_field::Condition>,
    },
    /// Keyed tumbling processing-time window: per key, the count and sum of values in each
    /// window of `sizeMs` milliseconds, emitted when the window closes. Its input is
    /// partitioned by key group. It also keeps the running total count and sum per key.
    #[serde(rename_all = "camelCase")]
    Window {
        /// Window length in milliseconds.
        size_ms: u64,
        /// What each result holds besides the key: any of `count`, `sum`, `min`, `max` of the
        /// values (a Kafka source's `valueField`). With it every result is one JSON object
        /// `{"key": K, "count": C, ...}`; without it a result is `key,count,sum` (`{"key",
        /// "count", "sum"}` to Kafka).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        aggregates: Option<Vec<crate::aggregates::Aggregate>>,
    },
    /// Consumes records: discards them, or writes one line per record under `output`.
    Sink {
        /// Where records go: `key,count,sum` per line, or for Nexmark events and query rows
        /// one JSON object per line (a relative path is relative to the job file's
        /// directory; missing parent directories are created when the job starts). Discards
        /// when absent. With `delivery: exactly-once` (the default) a directory of part files
        /// published when the checkpoint covering them completes ([`crate::sink::file`]); with
        /// `delivery: at-least-once` a file the records are appended to as they arrive (after
        /// a crash, results written since the restored checkpoint are written again).
        #[serde(default)]
        output: Option<PathBuf>,
        /// Delivery guarantee of `output` across crashes and restores. Default exactly-once.
        #[serde(default)]
        delivery: SinkDelivery,
        /// Write to a Kafka topic instead (one JSON object per record; the Kafka key is the
        /// record's key). Not together with `output`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kafka: Option<KafkaSinkSpec>,
    },
    /// A stateless stage over Nexmark events (Q1's projection, Q2's filter, per-type
    /// selections); forwards watermarks.
    Select {
        /// Which stage.
        query: SelectQuery,
    },
    /// Keyed event-time window counting Nexmark bids per key and window (tumbling, sliding
    /// or session). Fires when the watermark passes a window's end; drops late bids.
    EventWindow {
        /// The bid field the input is partitioned by (`auction` or `bidder`).
        key: BidKey,
        /// The window assigner.
        window: WindowSpec,
    },
    /// Keyed by window: per window, the keys whose count is the largest (Nexmark Q5). Its
    /// input must be an `eventWindow`.
    WindowTop {
        /// The key field of the incoming window results (`auction` or `bidder`).
        key: BidKey,
    },
    /// Keyed two-input join of persons and auctions on `person.id = auction.seller`: a
    /// regular join without `window` (Q3), a tumbling-window join with one (Q8).
    Join {
        /// Tumbling event-time window of the join (only `tumbling` is supported).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<WindowSpec>,
    },
}

/// Short name of an operator kind, as written in YAML.
impl OperatorKind {
    /// The `kind` string: `source`, `map`, `filter`, `window`, `sink`, `select`,
    /// `eventWindow`, `windowTop` or `join`.
    pub fn name(&self) -> &'static str {
        match self {
            OperatorKind::Source { .. } => "source",
            OperatorKind::Map => "map",
            OperatorKind::Filter { .. } => "filter",
            OperatorKind::Window { .. } => "window",
            OperatorKind::Sink { .. } => "sink",
            OperatorKind::Select { .. } => "select",
            OperatorKind::EventWindow { .. } => "eventWindow",
            OperatorKind::WindowTop { .. } => "windowTop",
            OperatorKind::Join { .. } => "join",
        }
    }

    /// Whether the operator's input is partitioned by key group (each subtask has its own queue).
    /// Other operators share one input queue among their subtasks (rebalance).
    pub fn is_keyed(&self) -> bool {
        matches!(
            self,
            OperatorKind::Window { .. }
                | OperatorKind::EventWindow { .. }
                | OperatorKind::WindowTop { .. }
                | OperatorKind::Join { .. }
        )
    }

    /// Whether the operator's outputs carry event time and watermarks.
    pub fn emits_event_time(&self) -> bool {
        match self {
            OperatorKind::Source { nexmark, kafka, .. } => {
                nexmark.is_some() || kafka.as_ref().is_some_and(|k| k.event_time.is_some())
            }
            OperatorKind::Select { .. }
            | OperatorKind::EventWindow { .. }
            | OperatorKind::WindowTop { .. }
            | OperatorKind::Join { .. } => true,
            _ => false,
        }
    }
}

/// How a source's emission rate (records/s of wall-clock time) varies over time.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum RateSpec {
    /// A constant rate in records/s.
    Constant(f64),
    /// Piecewise-constant rate: each step holds from `atSeconds` (wall-clock seconds since job
    /// start) until the next step.
    Steps(Vec<RateStep>),
    /// A rate trace file (`t_seconds,rate`, the shared trace format).
    Trace(TraceRate),
}

/// One step of a stepped rate.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateStep {
    /// Wall-clock seconds since the job started at which this rate begins.
    pub at_seconds: f64,
    /// Rate in records/s.
    pub records_per_second: f64,
}

/// A source rate that follows a recorded workload trace.
///
/// Largest factor on a trace's rates (`rate.trace.scale`, `--scale`): beyond it no engine keeps
/// up and counts of records would overflow.
pub const MAX_TRACE_SCALE: f64 = 1e9;
/// Largest replay speed of a trace (`rate.trace.speedup`, `--speedup`), trace-seconds per
/// second: a year of trace in 32 s.
pub const MAX_TRACE_SPEEDUP: f64 = 1e6;

/// Trace time advances `speedup` trace-seconds per wall-clock second from `startSeconds`;
/// the emitted rate in records/s is the trace's rate at that trace time times `scale`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TraceRate {
    /// Path of the CSV trace, relative to the job file's directory.
    pub file: PathBuf,
    /// Trace-seconds per wall-clock second (time compression). Must be > 0. Default 1.
    #[serde(default = "one_f64")]
    pub speedup: f64,
    /// Factor applied to every rate of the trace. Must be > 0. Default 1.
    #[serde(default = "one_f64")]
    pub scale: f64,
    /// Trace time (seconds) at which replay starts. Default 0.
    #[serde(default)]
    pub start_seconds: f64,
    /// Trace time (seconds) at which replay ends; the rate is 0 afterwards. Default: end of trace.
    #[serde(default)]
    pub end_seconds: Option<f64>,
    /// What a gap in the trace (a missing row) means: `hold` the last rate (default) or `zero`.
    #[serde(default)]
    pub gaps: GapPolicy,
}

/// Interpretation of missing rows in a trace.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GapPolicy {
    /// The last rate before the gap holds through it.
    #[default]
    Hold,
    /// The rate is zero during the gap.
    Zero,
}

/// A directed edge between two operators.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EdgeSpec {
    /// Upstream operator name.
    pub from: String,
    /// Downstream operator name.
    pub to: String,
}

/// Parallelism bounds for the autoscaler.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schema",
    schemars(extend("x-kubernetes-validations" = [{
        "rule": "!has(self.min) || !has(self.max) || self.min <= self.max",
        "message": "scaling.min must be less than or equal to scaling.max"
    }]))
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScalingBounds {
    /// Smallest parallelism the autoscaler may choose. Default 1.
    #[serde(default)]
    pub min: Option<u32>,
    /// Largest parallelism the autoscaler may choose. Default: the job's `maxParallelism`.
    #[serde(default)]
    pub max: Option<u32>,
}

/// Autoscaler settings carried in the job file (read by the controller, ignored by the engine).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AutoscalerSpec {
    /// Utilization ρ = λ / (p μ) every operator must stay at or under. Default 0.7.
    #[serde(default = "default_target_utilization")]
    pub target_utilization: f64,
    /// End-to-end latency SLO in seconds, on the `latencyPercentile` quantile of
    /// every source-to-sink path's latency. Default 1.0.
    #[serde(default = "default_latency_slo")]
    pub latency_slo_seconds: f64,
    /// Percentile of end-to-end latency the SLO is on, in (0, 1). Default 0.99 (p99).
    #[serde(default = "default_latency_percentile")]
    pub latency_percentile: f64,
    /// Time within which a backlog must be drained, in seconds. Default 30.
    #[serde(default = "default_catch_up")]
    pub catch_up_seconds: f64,
    /// Forecast-driven scaling ahead of predictable ramps (`forecast:`). Absent: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast: Option<ForecastSpec>,
    /// What to do when the needed capacity exceeds the limits (`limits:`). Absent: hold at
    /// the limit and report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsSpec>,
    /// What the latency allocation does when the latency SLO is unattainable even at every
    /// operator's maximum parallelism: `utilizationOnly` (the default) or `bestEffort`.
    #[serde(default, skip_serializing_if = "UnattainableSlo::is_default")]
    pub on_unattainable_slo: UnattainableSlo,
    /// Seconds of the planner's recommendations a scale-down looks back over: an operator is
    /// scaled down no lower than the highest parallelism recommended for it in that time (the
    /// Flink autoscaler's scale-down interval as a sliding window), so a load that came back
    /// within it costs no new pair of rescales. 0: off. Unset (the default): tied to what a
    /// rescale costs, [`LOOKBACK_PER_DOWNTIME_SECOND`] seconds per second of the job's expected
    /// rescale downtime (measured), at most [`MAX_AUTO_LOOKBACK_SECONDS`]: about 1 min on the
    /// bundled engine, 20 min for a Flink job whose rescales take 10 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down_lookback_seconds: Option<f64>,
    /// Rescale budget: at most this many rescales in any hour; a further one is held back (the
    /// decision says so) unless the current parallelism cannot keep up (ρ ≥ 1 at the target
    /// rate, or the latency bound over the SLO). 0: no budget (the default).
    #[serde(
        default = "default_max_rescales_per_hour",
        skip_serializing_if = "is_default_max_rescales_per_hour"
    )]
    pub max_rescales_per_hour: u32,
    /// Utilization band, upper end: a scale-up happens only when an operator's busiest subtask
    /// would run above this utilization ρ at its current parallelism and the target rate
    /// (catch-up included), or the latency bound exceeds the SLO; it is then sized for
    /// `targetUtilization`. In [targetUtilization, 1]. Default: targetUtilization + 0.1,
    /// at most 1 (the Flink autoscaler's `job.autoscaler.utilization.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_utilization: Option<f64>,
    /// Utilization band, lower end: a scale-down happens only when an operator's busiest
    /// subtask runs below this ρ at its current parallelism. In (0, targetUtilization].
    /// Default: targetUtilization − 0.4, at least 0.4 × targetUtilization (the Flink
    /// autoscaler's `job.autoscaler.utilization.min`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_utilization: Option<f64>,
}

impl AutoscalerSpec {
    /// The scale-down lookback, seconds: `scaleDownLookbackSeconds`, or when unset
    /// [`LOOKBACK_PER_DOWNTIME_SECOND`] × `downtime_seconds` (the expected rescale downtime;
    /// `None` before any is known: 0) capped at [`MAX_AUTO_LOOKBACK_SECONDS`].
    pub fn scale_down_lookback(&self, downtime_seconds: Option<f64>) -> f64 {
        self.scale_down_lookback_seconds.unwrap_or_else(|| {
            (downtime_seconds.unwrap_or(0.0).max(0.0) * LOOKBACK_PER_DOWNTIME_SECOND)
                .min(MAX_AUTO_LOOKBACK_SECONDS)
        })
    }

    /// The utilization band (lower, upper) that a change of parallelism must leave before it is
    /// made: `minUtilization` and `maxUtilization`, or their defaults around
    /// `targetUtilization` ([`DEFAULT_UTILIZATION_BAND_BELOW`], [`DEFAULT_UTILIZATION_BAND_ABOVE`]).
    pub fn utilization_band(&self) -> (f64, f64) {
        let t = self.target_utilization;
        (
            self.min_utilization
                .unwrap_or((t - DEFAULT_UTILIZATION_BAND_BELOW).max(0.4 * t)),
            self.max_utilization
                .unwrap_or((t + DEFAULT_UTILIZATION_BAND_ABOVE).min(1.0)),
        )
    }
}

/// What the planner does when the latency SLO cannot be met even with every operator at its
/// maximum parallelism (`autoscaler.onUnattainableSlo` in the job file).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UnattainableSlo {
    /// Size for the target utilization only and add no subtasks for latency (DS2's and the
    /// Flink autoscaler's sizing); the decision reports the SLO unattainable. The default.
    #[default]
    UtilizationOnly,
    /// Add subtasks for latency anyway, up to the point where the slowest path's percentile
    /// bound is within 10 % of the lowest bound the maximum parallelism allows (beyond it,
    /// subtasks buy little latency); the decision still reports the SLO unattainable.
    BestEffort,
}

impl UnattainableSlo {
    /// Whether this is the default (`utilizationOnly`): then the job file leaves it out.
    pub fn is_default(&self) -> bool {
        *self == UnattainableSlo::default()
    }
}

impl Default for AutoscalerSpec {
    fn default() -> Self {
        AutoscalerSpec {
            target_utilization: default_target_utilization(),
            latency_slo_seconds: default_latency_slo(),
            latency_percentile: default_latency_percentile(),
            catch_up_seconds: default_catch_up(),
            forecast: None,
            limits: None,
            on_unattainable_slo: UnattainableSlo::UtilizationOnly,
            scale_down_lookback_seconds: None,
            max_rescales_per_hour: DEFAULT_MAX_RESCALES_PER_HOUR,
            max_utilization: None,
            min_utilization: None,
        }
    }
}

/// Whether the controller scales ahead of the forecast input rate.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForecastMode {
    /// No forecast (reactive decisions only). The default.
    #[default]
    Off,
    /// Plan for the larger of the measured and the forecast input rate over the horizon.
    On,
    /// Forecast and report it in the decision's reasons; decide reactively.
    Recommend,
}

/// Forecast settings (`autoscaler.forecast` in the job file), read by the controller's
/// `model::forecast` (additive Holt-Winters with a damped trend on the job's binned input rate).
///
/// ```yaml
/// autoscaler: { forecast: { mode: on, seasonSeconds: 86400, horizonSeconds: 600 } }
/// ```
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForecastSpec {
    /// `off`, `on` or `recommend`. Default `off`.
    #[serde(default)]
    pub mode: ForecastMode,
    /// Length of the seasonal cycle, seconds of the controller's clock. Default 86 400 (a day).
    #[serde(default = "default_season")]
    pub season_seconds: f64,
    /// Width of one history bin, seconds. Default: season / 288 (5 min for a day).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bin_seconds: Option<f64>,
    /// How far ahead to plan, seconds (the expected rescale downtime is added). Default: two bins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizon_seconds: Option<f64>,
    /// Largest recent forecast error (weighted absolute percentage error, 0.3 = 30%) at which
    /// the forecast is still used. Default 0.3.
    #[serde(default = "default_max_forecast_error")]
    pub max_error: f64,
}

impl Default for ForecastSpec {
    fn default() -> Self {
        ForecastSpec {
            mode: ForecastMode::Off,
            season_seconds: default_season(),
            bin_seconds: None,
            horizon_seconds: None,
            max_error: default_max_forecast_error(),
        }
    }
}

fn default_season() -> f64 {
    86_400.0
}
fn default_max_forecast_error() -> f64 {
    0.3
}

/// What the controller does when the needed capacity exceeds an operator's max parallelism or
/// the subtask quota.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnLimit {
    /// Run at the limit and report the shortfall (the backlog grows). The default.
    #[default]
    Hold,
    /// Drop a share of the records at the sources (counted as shed records) so that the
    /// remaining load fits the capacity at the target utilization.
    Shed,
}

/// Limits (`autoscaler.limits` in the job file).
///
/// ```yaml
/// autoscaler: { limits: { onLimit: shed, maxShedShare: 0.5, quotaSubtasks: 16 } }
/// ```
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitsSpec {
    /// `hold` or `shed`. Default `hold`.
    #[serde(default)]
    pub on_limit: OnLimit,
    /// Largest share of source records that may be shed, in [0, 1]. Default 0.5.
    #[serde(default = "default_max_shed_share")]
    pub max_shed_share: f64,
    /// CPU quota: most subtasks of all non-source operators together. Absent: no quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_subtasks: Option<u32>,
}

impl Default for LimitsSpec {
    fn default() -> Self {
        LimitsSpec {
            on_limit: OnLimit::Hold,
            max_shed_share: default_max_shed_share(),
            quota_subtasks: None,
        }
    }
}

fn default_max_shed_share() -> f64 {
    0.5
}

fn default_max_parallelism() -> u32 {
    DEFAULT_MAX_PARALLELISM
}
fn default_channel_capacity() -> usize {
    1024
}
fn default_keys() -> u64 {
    1000
}
/// Default utilization target ρ of every operator.
pub const DEFAULT_TARGET_UTILIZATION: f64 = 0.7;
/// Default end-to-end latency SLO, seconds.
pub const DEFAULT_LATENCY_SLO_SECONDS: f64 = 1.0;
/// Default time within which a backlog must drain, seconds.
pub const DEFAULT_CATCH_UP_SECONDS: f64 = 30.0;

fn default_target_utilization() -> f64 {
    DEFAULT_TARGET_UTILIZATION
}
fn default_latency_slo() -> f64 {
    DEFAULT_LATENCY_SLO_SECONDS
}
fn default_catch_up() -> f64 {
    DEFAULT_CATCH_UP_SECONDS
}
/// Seconds of scale-down lookback per second of expected rescale downtime when
/// `autoscaler.scaleDownLookbackSeconds` is unset (chosen from the simulator's rescale
/// discipline tables, `docs/planner.md`).
pub const LOOKBACK_PER_DOWNTIME_SECOND: f64 = 120.0;
/// Longest scale-down lookback chosen from the rescale downtime, seconds.
pub const MAX_AUTO_LOOKBACK_SECONDS: f64 = 3600.0;
/// Default width of the utilization band above `targetUtilization` (`maxUtilization`).
pub const DEFAULT_UTILIZATION_BAND_ABOVE: f64 = 0.1;
/// Default width of the utilization band below `targetUtilization` (`minUtilization`).
pub const DEFAULT_UTILIZATION_BAND_BELOW: f64 = 0.4;
/// Default rescale budget per hour (`autoscaler.maxRescalesPerHour`).
pub const DEFAULT_MAX_RESCALES_PER_HOUR: u32 = 0;
fn default_max_rescales_per_hour() -> u32 {
    DEFAULT_MAX_RESCALES_PER_HOUR
}
fn is_default_max_rescales_per_hour(v: &u32) -> bool {
    *v == DEFAULT_MAX_RESCALES_PER_HOUR
}
/// Default percentile of end-to-end latency the SLO is on (p99).
pub const DEFAULT_LATENCY_PERCENTILE: f64 = 0.99;
fn default_latency_percentile() -> f64 {
    DEFAULT_LATENCY_PERCENTILE
}
/// The `rate` of a source that names none: what a Kafka source has (validation requires a
/// `rate` of every other source).
fn kafka_source_rate() -> RateSpec {
    RateSpec::Constant(0.0)
}
fn one() -> u32 {
    1
}
fn one_f64() -> f64 {
    1.0
}

/// Errors from reading or validating a job file.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The file could not be read.
    #[error("{path}: cannot read job file: {source}")]
    Read {
        /// The job file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The YAML does not match the schema.
    #[error("{path}: invalid job file: {message}")]
    Parse {
        /// The job file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The YAML parsed but describes an invalid job.
    #[error("{path}: {problem}")]
    Invalid {
        /// The job file.
        path: PathBuf,
        /// What is wrong, naming the field.
        problem: String,
    },
}

/// Longest job or operator name, bytes: a Kubernetes label value's limit, and short enough
/// that every file name built from it (savepoints, learned state set aside per job) stays
/// within a file system's 255 bytes.
pub const MAX_NAME_LEN: usize = 63;

/// Whether `name` is a valid job (or operator) name: 1 to [`MAX_NAME_LEN`] ASCII letters,
/// digits, `-` and `_`, so that it can name files and directories (checkpoints, learned state).
pub fn valid_job_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}
