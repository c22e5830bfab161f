//! The job runtime: one OS thread per subtask of each operator chain, bounded channels
//! between chains.
//!
//! Chaining ([`crate::chain`]): an operator whose only input is a forward edge from an
//! operator of the same parallelism (and not keyed) runs in its upstream subtask's thread,
//! receiving records in small batches instead of through a channel; its metrics stay its own.
//!
//! Channels: every other non-source subtask has one bounded input queue of [`Message`]s tagged with
//! their input channel (one per upstream subtask). A keyed input (a window) receives the
//! records of the key groups its subtask owns; other inputs are rebalanced over the
//! downstream subtasks' queues (first with room, round-robin start). A full queue blocks the
//! sender; that time is counted as the sender's backpressured time. Checkpoint barriers and
//! their alignment are described in [`crate::checkpoint`].
//!
//! Stop: a stop-with-savepoint is a barrier with a stop flag ([`Job::trigger`]). A bounded
//! source that reached its count sends `End` on every channel; a subtask whose channels have
//! all ended fires its open windows, sends `End` and exits, and the job [`Job::join`]s into a
//! final [`Savepoint`]. Each subtask that ends so reports its final state to the checkpoint
//! coordinator, which uses it for the checkpoints taken while other sources still run
//! ([`crate::checkpoint::coordinator`], FLIP-147). A failed subtask (an error or a panic) stops the sources; the rest
//! exit as their inputs close.

use std::collections::{BTreeMap, VecDeque};
use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{
    Receiver, RecvTimeoutError, Select, Sender, TryRecvError, TrySendError, bounded,
};

use crate::chain::{self, CHAIN_BATCH};
use crate::checkpoint::barrier::{Aligner, Alignment, Barrier, BarrierKind, Event, Message};
use crate::checkpoint::coordinator::{
    Ack, AckOf, Coordinator, Failed, JobContext, Outcome, Target,
};
use crate::checkpoint::gate::{Claim, SourceGate};
use crate::checkpoint::storage::CheckpointStorage;
use crate::clock::now_unix_us;
use crate::keygroup::load::KeyGroupLoad;
use crate::keygroup::{key_group, key_group_range, murmur_fmix64, subtask_for_key_group};
use crate::metrics::{
    EngineMetrics, KeyGroupShareSeries, LocalLatencyHistogram, SourceProbe, SourceReading,
};
use crate::nexmark::queries::key_selector;
use crate::nexmark::source::NexmarkGenerator;
use crate::payload::Payload;
pub use crate::record::Record;
use crate::savepoint::{OperatorCounters, Savepoint, SavepointMetadata, SourcePosition};
use crate::service_time::{ServiceMoments, ServiceTimeSeries};
use crate::sink::file::FileSink;
use crate::sink::{Committable, SinkError, TransactionalWriter, TwoPhaseCommitSink};
use crate::spec::{JobSpec, OperatorKind, SinkDelivery};
use crate::state::backend::KeyedStateBackend;
use crate::state::{KeyedState, StateBackend, StateError, StateOwner};
use crate::time::{EventTimeStage, StageOutput};
use crate::trace::{RateFunction, TraceError};
use prometheus::IntCounter;

mod chains;
mod cost;
mod held_ack;
mod job;
mod kafka_source_task;
mod meters;
mod operator_task;
mod routing;
mod sending;
mod source_task;
use chains::*;
use cost::*;
use held_ack::*;
use kafka_source_task::*;
use meters::*;
use operator_task::*;
use sending::*;
use source_task::*;

/// Errors starting a job.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A source's trace could not be loaded.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The sink's output file could not be opened.
    #[error("{path}: cannot open sink output: {source}")]
    SinkOutput {
        /// The output file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A transactional sink could not recover what the restored checkpoint lists, or could not
    /// set up a subtask's writer.
    #[error("{operator}: {source}")]
    Sink {
        /// The sink operator.
        operator: String,
        /// The sink's error.
        source: SinkError,
    },
    /// The job graph is invalid.
    #[error("{0}")]
    Graph(String),
    /// A Kafka source's or sink's brokers or topic cannot be used.
    #[error("{operator}: {source}")]
    Kafka {
        /// The operator.
        operator: String,
        /// What Kafka answered.
        source: Box<crate::kafka::KafkaError>,
    },
    /// A thread could not be spawned.
    #[error("cannot spawn subtask thread: {0}")]
    Spawn(std::io::Error),
    /// A keyed subtask's state backend could not be opened.
    #[error("{operator}: {source}")]
    Backend {
        /// The operator.
        operator: String,
        /// The backend's error.
        source: StateError,
    },
    /// Restored event-time operator state could not be decoded.
    #[error("{operator}: {source}")]
    State {
        /// The operator.
        operator: String,
        /// The decoding error.
        source: crate::time::StateCodecError,
    },
}

/// Options of a running job.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Measure busy/idle/backpressured time and publish metrics (the overhead benchmark turns it off).
    pub metrics_enabled: bool,
    /// How often a subtask flushes its local counters to the metric registry.
    pub flush_interval: Duration,
    /// Where periodic checkpoints go. `None`: no periodic checkpoints (savepoints still work).
    /// The interval, timeout and retention come from the spec's `checkpoint` section.
    pub checkpoint_storage: Option<Arc<CheckpointStorage>>,
    /// Fault injection for recovery tests: panic once per process in this operator on the
    /// record with this sequence number.
    pub panic_at: Option<PanicAt>,
    /// Chain forward-connected operators of equal parallelism into one thread per subtask
    /// ([`crate::chain`]); `false` runs every subtask in its own thread.
    pub chaining: bool,
    /// Kafka sinks without a `transactionalIdPrefix` name their transactional ids
    /// `streamscale-SCOPE-<job>-<operator>-…` with `Some(SCOPE)`, else
    /// `streamscale-<job>-<operator>-…`.
    pub transactional_id_scope: Option<String>,
}

/// A one-time injected panic (for recovery tests).
#[derive(Debug, Clone)]
pub struct PanicAt {
    /// Operator whose subtask panics.
    pub operator: String,
    /// Sequence number of the record on which it panics.
    pub seq: u64,
    /// Set when the panic happened; it happens at most once.
    pub fired: Arc<AtomicBool>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            metrics_enabled: true,
            flush_interval: Duration::from_millis(100),
            checkpoint_storage: None,
            panic_at: None,
            chaining: true,
            transactional_id_scope: None,
        }
    }
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// Stop requested; open window panes stay in state (stop-with-savepoint).
    Stop,
    /// Stop requested with drain: open window panes fire before the end (Flink's `--drain`).
    Drain,
}

/// Shared control flags of one job.
#[derive(Debug, Default)]
struct Control {
    /// Sources stop at once (failure, or an abandoned job); nothing is snapshotted.
    stop: AtomicBool,
    failed: Arc<AtomicBool>,
}

/// Per-operator live counters, for `/v1/job`.
#[derive(Debug, Default)]
pub struct LiveCounters {
    /// Records received.
    pub records_in: AtomicU64,
    /// Records sent.
    pub records_out: AtomicU64,
    /// Records accounted at a sink.
    pub accounted: AtomicU64,
    /// Records filtered out.
    pub filtered: AtomicU64,
}

impl LiveCounters {
    /// A snapshot as [`OperatorCounters`].
    pub fn snapshot(&self) -> OperatorCounters {
        OperatorCounters {
            records_in: self.records_in.load(Ordering::Relaxed),
            records_out: self.records_out.load(Ordering::Relaxed),
            accounted: self.accounted.load(Ordering::Relaxed),
            filtered: self.filtered.load(Ordering::Relaxed),
        }
    }
}

/// What a subtask thread hands back when it exits.
struct SubtaskResult {
    operator: String,
    state: Option<KeyedState>,
    error: Option<String>,
}

/// A running job.
pub struct Job {
    spec: JobSpec,
    control: Arc<Control>,
    handles: Vec<JoinHandle<Vec<SubtaskResult>>>,
    counters: BTreeMap<String, Arc<LiveCounters>>,
    gates: BTreeMap<String, Arc<SourceGate>>,
    job_started_unix_ms: u64,
    coordinator: Option<Coordinator>,
    /// Commit errors of transactional sinks that fail the job ([`JobContext::sink_failures`]).
    sink_failures: Arc<std::sync::Mutex<Vec<String>>>,
}

/// The outcome of a job whose threads have all returned.
#[derive(Debug)]
pub struct Finished {
    /// A savepoint of the final state (sources' positions, counters, keyed state).
    pub savepoint: Savepoint,
    /// Subtask failures (empty when the job ended cleanly).
    pub errors: Vec<String>,
}

/// Output of one subtask: one route per downstream operator, or the next member of its chain.
struct Outputs {
    routes: Vec<Route>,
    max_parallelism: u32,
    /// The next chain member, which runs in this thread (then `routes` is empty).
    chain: Option<Box<ChainMember>>,
    /// The clock reading at the end of the last chain run ([`Outputs::flush`]) while nothing
    /// ran since; the member owning these outputs clears it before each record.
    ran_until: Option<Instant>,
}

/// One subtask's input queue (both ends) and its [`Batched`] count.
type Queue = (Sender<Message>, Receiver<Message>, Batched);

/// Records a queue holds in [`Event::Batch`] messages beyond one per message: the queue's
/// length in records is its length in messages plus this. A sender adds before it sends a
/// batch, the receiver subtracts when it takes one out.
type Batched = Arc<std::sync::atomic::AtomicUsize>;

/// The input queues of one downstream operator's subtasks, as seen by one upstream subtask.
struct Route {
    txs: Vec<Sender<Message>>,
    /// Per downstream subtask (same order as `txs`): its queue's [`Batched`] count.
    batched: Vec<Batched>,
    /// This subtask's input-channel index at every downstream subtask.
    channel: u32,
    /// Route by key group (else rebalance).
    keyed: bool,
    /// The key that picks the key group of a record (keyed routes).
    key_of: fn(&Record) -> u64,
    /// Rebalance: where the next search for room starts.
    next: usize,
}

/// The operator `op` chains into (see [`chain::chained_successor`]).
fn chained_successor_of<'a>(
    spec: &'a JobSpec,
    op: &crate::spec::OperatorSpec,
    enabled: bool,
) -> Option<&'a crate::spec::OperatorSpec> {
    chain::chained_successor(spec, &op.name, enabled).and_then(|n| spec.operator(n))
}
