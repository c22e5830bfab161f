//! The job runtime: one OS thread per subtask, bounded channels between operators.
//!
//! Channels: an operator whose input is keyed (a window) has one bounded input queue per
//! subtask, and upstream subtasks route each record to the subtask owning its key group. Every
//! other operator has one bounded queue shared by all its subtasks (any idle subtask takes the
//! next record: a c-server queue). A full queue blocks the sender; that time is counted as the
//! sender's backpressured time.
//!
//! Stop: sources stop emitting and exit, which closes their output channels; each operator
//! drains its input, then exits and closes its own outputs, so when every thread has returned
//! no record is in flight (a drained stop; aligned barriers come later). Each subtask hands back
//! its keyed state, and the job assembles a [`Savepoint`].

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, TrySendError, bounded};

use crate::keygroup::{key_group, key_group_range, murmur_fmix64, subtask_for_key_group};
use crate::metrics::EngineMetrics;
use crate::nexmark::source::NexmarkGenerator;
use crate::payload::Payload;
use crate::savepoint::{OperatorCounters, Savepoint, SavepointMetadata, SourcePosition};
use crate::spec::{JobSpec, OperatorKind};
use crate::state::KeyedState;
use crate::time::{EventTimeStage, StageOutput};
use crate::trace::{RateFunction, TraceError};
use prometheus::local::{LocalHistogram, LocalIntCounter};

/// A record flowing between operators.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Sequence number at the source (window outputs: the key).
    pub seq: u64,
    /// Key.
    pub key: u64,
    /// Value (window outputs: the pane's sum).
    pub value: i64,
    /// Source records this record stands for (1, or a window pane's count).
    pub count: u64,
    /// Arrival time at the source, µs since the Unix epoch, from which the sink measures
    /// end-to-end latency. Window outputs carry the firing time minus the largest delay any
    /// of their records had on reaching the window, so latency excludes window buffering.
    pub created_us: u64,
    /// A Nexmark event, a query row or a watermark ([`Payload::None`] for plain sources).
    pub payload: Payload,
}

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
    /// The job graph is invalid.
    #[error("{0}")]
    Graph(String),
    /// A thread could not be spawned.
    #[error("cannot spawn subtask thread: {0}")]
    Spawn(std::io::Error),
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
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            metrics_enabled: true,
            flush_interval: Duration::from_millis(100),
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
    stop: AtomicBool,
    drain: AtomicBool,
    failed: AtomicBool,
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
    handles: Vec<JoinHandle<SubtaskResult>>,
    counters: BTreeMap<String, Arc<LiveCounters>>,
    source_emitted: BTreeMap<String, Arc<AtomicU64>>,
    job_started_unix_ms: u64,
}

/// The outcome of a job whose threads have all returned.
#[derive(Debug)]
pub struct Finished {
    /// A savepoint of the final state (sources' positions, counters, keyed state).
    pub savepoint: Savepoint,
    /// Subtask failures (empty when the job ended cleanly).
    pub errors: Vec<String>,
}

fn now_unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Output of one subtask: one router per downstream operator.
struct Outputs {
    routes: Vec<Route>,
    max_parallelism: u32,
}

enum Route {
    Shared(Sender<Record>),
    /// One queue per downstream subtask; the function gives the key that picks the subtask.
    Keyed(Vec<Sender<Record>>, fn(&Record) -> u64),
}

/// Time and count accumulators of a subtask, flushed to the registry periodically.
struct Meter {
    enabled: bool,
    records_in: u64,
    records_out: u64,
    idle: Duration,
    backpressured: Duration,
    last_flush: Instant,
    ops_since_check: u32,
    flush_interval: Duration,
    labels: [String; 2],
    metrics: EngineMetrics,
    live: Arc<LiveCounters>,
    /// Sinks: thread-local latency histogram and accounted counter, merged at each flush.
    sink: Option<(LocalHistogram, LocalIntCounter)>,
}

impl Meter {
    /// Publishes the accumulated counts. Busy time is derived as Flink does: the wall time
    /// since the last flush minus the measured idle and backpressured time, so the hot path
    /// reads the clock only when it blocks.
    fn flush(&mut self, queue_len: usize) {
        let now = Instant::now();
        let wall = now - self.last_flush;
        let busy = wall
            .saturating_sub(self.idle)
            .saturating_sub(self.backpressured);
        let l = [self.labels[0].as_str(), self.labels[1].as_str()];
        self.live
            .records_in
            .fetch_add(self.records_in, Ordering::Relaxed);
        self.live
            .records_out
            .fetch_add(self.records_out, Ordering::Relaxed);
        if self.enabled {
            let m = &self.metrics;
            m.records_in.with_label_values(&l).inc_by(self.records_in);
            m.records_out.with_label_values(&l).inc_by(self.records_out);
            m.busy_seconds
                .with_label_values(&l)
                .inc_by(busy.as_secs_f64());
            m.idle_seconds
                .with_label_values(&l)
                .inc_by(self.idle.min(wall).as_secs_f64());
            m.backpressured_seconds
                .with_label_values(&l)
                .inc_by(self.backpressured.min(wall).as_secs_f64());
            m.input_queue_length
                .with_label_values(&l)
                .set(queue_len as f64);
            if let Some((latency, accounted)) = &mut self.sink {
                latency.flush();
                accounted.flush();
            }
        }
        self.records_in = 0;
        self.records_out = 0;
        self.idle = Duration::ZERO;
        self.backpressured = Duration::ZERO;
        self.last_flush = now;
    }

    /// Flushes if the flush interval has passed; reads the clock only every 128 calls.
    fn tick(&mut self, queue_len: impl FnOnce() -> usize) {
        self.ops_since_check += 1;
        if self.ops_since_check >= 128 {
            self.check(queue_len);
        }
    }

    /// Flushes if the flush interval has passed.
    fn check(&mut self, queue_len: impl FnOnce() -> usize) {
        self.ops_since_check = 0;
        if self.last_flush.elapsed() >= self.flush_interval {
            self.flush(queue_len());
        }
    }

    /// The clock, when time is measured.
    fn now(&self) -> Option<Instant> {
        self.enabled.then(Instant::now)
    }
}

impl Outputs {
    /// Sends `rec` to every downstream operator; returns false if a receiver is gone.
    fn send(&self, rec: Record, meter: &mut Meter) -> bool {
        if rec.payload.is_watermark() {
            return self.broadcast(&rec, meter);
        }
        for route in &self.routes {
            let tx = match route {
                Route::Shared(tx) => tx,
                Route::Keyed(txs, key_of) => {
                    let kg = key_group(key_of(&rec), self.max_parallelism);
                    let i = subtask_for_key_group(kg, txs.len() as u32, self.max_parallelism);
                    &txs[i]
                }
            };
            match tx.try_send(rec.clone()) {
                Ok(()) => {}
                Err(TrySendError::Full(rec)) => {
                    let t = Instant::now();
                    let ok = tx.send(rec).is_ok();
                    meter.backpressured += t.elapsed();
                    if !ok {
                        return false;
                    }
                }
                Err(TrySendError::Disconnected(_)) => return false,
            }
            meter.records_out += 1;
        }
        true
    }

    /// Sends a watermark to every downstream subtask (not counted as a record).
    fn broadcast(&self, rec: &Record, meter: &mut Meter) -> bool {
        for route in &self.routes {
            let txs = match route {
                Route::Shared(tx) => std::slice::from_ref(tx),
                Route::Keyed(txs, _) => txs.as_slice(),
            };
            for tx in txs {
                if tx.try_send(rec.clone()).is_err() {
                    let t = Instant::now();
                    let ok = tx.send(rec.clone()).is_ok();
                    meter.backpressured += t.elapsed();
                    if !ok {
                        return false;
                    }
                }
            }
        }
        true
    }
}

/// Spends `cpu_us` of real computation; returns a value so the work is not optimized away.
fn burn_cpu(cpu_us: f64, seed: u64) -> u64 {
    if cpu_us <= 0.0 {
        return seed;
    }
    let until = Instant::now() + Duration::from_secs_f64(cpu_us / 1e6);
    let mut x = seed | 1;
    loop {
        for _ in 0..64 {
            x = murmur_fmix64(x);
        }
        if Instant::now() >= until {
            return std::hint::black_box(x);
        }
    }
}

fn spend(cpu_us: f64, io_us: f64, seed: u64) {
    std::hint::black_box(burn_cpu(cpu_us, seed));
    if io_us > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(io_us / 1e6));
    }
}

impl Job {
    /// Starts every subtask of `spec`, restoring from `restore` when given.
    ///
    /// `restore` must already have been verified against `spec` ([`Savepoint::read`]); each
    /// keyed subtask takes the key groups it owns at its new parallelism.
    ///
    /// # Errors
    /// [`RuntimeError`] when a trace or sink file cannot be opened; no thread is left running.
    pub fn start(
        spec: JobSpec,
        restore: Option<&Savepoint>,
        metrics: EngineMetrics,
        options: RuntimeOptions,
    ) -> Result<Job, RuntimeError> {
        let order = spec.topological_order().map_err(RuntimeError::Graph)?;
        let control = Arc::new(Control::default());
        let k = spec.max_parallelism;
        let job_started_unix_ms = restore
            .map(|s| s.metadata.job_started_unix_ms)
            .unwrap_or_else(|| now_unix_us() / 1000);

        // Rate functions and sink files first: fail before any thread starts.
        let mut rates = BTreeMap::new();
        let mut sink_files = BTreeMap::new();
        for op in &spec.operators {
            match &op.kind {
                OperatorKind::Source { rate, .. } => {
                    rates.insert(op.name.clone(), Arc::new(RateFunction::from_spec(rate)?));
                }
                OperatorKind::Sink { output: Some(path) } => {
                    let file = OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .map_err(|source| RuntimeError::SinkOutput {
                            path: path.clone(),
                            source,
                        })?;
                    sink_files.insert(op.name.clone(), file);
                }
                _ => {}
            }
        }

        // Input channels of every non-source operator.
        enum Inputs {
            Shared(Sender<Record>, Receiver<Record>),
            Keyed(Vec<(Sender<Record>, Receiver<Record>)>),
        }
        let mut inputs: BTreeMap<String, Inputs> = BTreeMap::new();
        for op in &spec.operators {
            if matches!(op.kind, OperatorKind::Source { .. }) {
                continue;
            }
            let cap = spec.channel_capacity;
            let inp = if op.kind.partitioned_input() {
                Inputs::Keyed((0..op.parallelism).map(|_| bounded(cap)).collect())
            } else {
                let (tx, rx) = bounded(cap);
                Inputs::Shared(tx, rx)
            };
            inputs.insert(op.name.clone(), inp);
        }
        let outputs_of = |name: &str| -> Outputs {
            let routes = spec
                .outputs_of(name)
                .into_iter()
                .filter_map(|to| match inputs.get(to) {
                    Some(Inputs::Shared(tx, _)) => Some(Route::Shared(tx.clone())),
                    Some(Inputs::Keyed(chs)) => Some(Route::Keyed(
                        chs.iter().map(|(tx, _)| tx.clone()).collect(),
                        spec.operator(to)
                            .map_or(crate::nexmark::queries::key_record, |o| {
                                key_selector(&o.kind)
                            }),
                    )),
                    None => None,
                })
                .collect();
            Outputs {
                routes,
                max_parallelism: k,
            }
        };

        // Job-wide channel number of each operator's first subtask (watermark senders).
        let mut channel_base = BTreeMap::new();
        let mut next_channel = 0u32;
        for op in &spec.operators {
            channel_base.insert(op.name.clone(), next_channel);
            next_channel += op.parallelism;
        }
        let mut counters = BTreeMap::new();
        let mut source_emitted = BTreeMap::new();
        let mut handles = Vec::new();
        let mut spawn_failed = None;
        // Start downstream first so receivers are ready; order does not matter for correctness.
        for name in order.iter().rev() {
            let Some(op) = spec.operator(name) else {
                continue;
            };
            let live = Arc::new(LiveCounters::default());
            let restored = restore
                .and_then(|s| s.metadata.counters.get(name).copied())
                .unwrap_or_default();
            live.records_in
                .store(restored.records_in, Ordering::Relaxed);
            live.records_out
                .store(restored.records_out, Ordering::Relaxed);
            live.accounted.store(restored.accounted, Ordering::Relaxed);
            live.filtered.store(restored.filtered, Ordering::Relaxed);
            if options.metrics_enabled {
                let l = [name.as_str(), "0"];
                metrics
                    .records_in
                    .with_label_values(&l)
                    .inc_by(restored.records_in);
                metrics
                    .records_out
                    .with_label_values(&l)
                    .inc_by(restored.records_out);
                if matches!(op.kind, OperatorKind::Sink { .. }) {
                    metrics
                        .sink_accounted
                        .with_label_values(&l)
                        .inc_by(restored.accounted);
                }
            }
            counters.insert(name.clone(), live.clone());
            let emitted = Arc::new(AtomicU64::new(
                restore
                    .and_then(|s| s.metadata.sources.get(name))
                    .map_or(0, |p| p.emitted),
            ));
            if matches!(op.kind, OperatorKind::Source { .. }) {
                source_emitted.insert(name.clone(), emitted.clone());
            }
            let sink_file = sink_files.remove(name);
            let shared_sink: Option<SinkWriter> =
                sink_file.map(|f| Arc::new(std::sync::Mutex::new(BufWriter::new(f))));
            for index in 0..op.parallelism {
                let meter = Meter {
                    enabled: options.metrics_enabled,
                    records_in: 0,
                    records_out: 0,
                    idle: Duration::ZERO,
                    ops_since_check: 0,
                    backpressured: Duration::ZERO,
                    last_flush: Instant::now(),
                    flush_interval: options.flush_interval,
                    labels: [name.clone(), index.to_string()],
                    metrics: metrics.clone(),
                    live: live.clone(),
                    sink: (options.metrics_enabled && matches!(op.kind, OperatorKind::Sink { .. }))
                        .then(|| {
                            let l = [name.as_str(), &index.to_string()];
                            (
                                metrics.sink_latency.with_label_values(&l).local(),
                                metrics.sink_accounted.with_label_values(&l).local(),
                            )
                        }),
                };
                let ctx = SubtaskContext {
                    operator: name.clone(),
                    index,
                    parallelism: op.parallelism,
                    max_parallelism: k,
                    cpu_us: op.cpu,
                    io_us: op.io,
                    control: control.clone(),
                    meter,
                    outputs: outputs_of(name),
                    channel: channel_base.get(name).copied().unwrap_or(0) + index,
                };
                let body: Box<dyn FnOnce() -> SubtaskResult + Send> = match &op.kind {
                    OperatorKind::Source {
                        keys,
                        count,
                        nexmark,
                        ..
                    } => {
                        let source = SourceTask {
                            nexmark: nexmark
                                .as_ref()
                                .map(|n| NexmarkGenerator::new(n, ctx.channel)),
                            rate: rates[name].clone(),
                            emitted: emitted.clone(),
                            keys: *keys,
                            limit: *count,
                            job_started_unix_ms,
                            salt: murmur_fmix64(name.len() as u64 ^ 0x5eed),
                        };
                        Box::new(move || source.run(ctx))
                    }
                    kind => {
                        let rx = match inputs.get(name) {
                            Some(Inputs::Shared(_, rx)) => rx.clone(),
                            Some(Inputs::Keyed(chs)) => chs[index as usize].1.clone(),
                            None => {
                                return Err(RuntimeError::Graph(format!("no input for {name}")));
                            }
                        };
                        let restored_state = || {
                            let range = key_group_range(index, op.parallelism, k);
                            restore
                                .and_then(|s| s.state.get(name))
                                .map(|s| s.slice(range))
                                .unwrap_or_default()
                        };
                        let upstream: u32 = spec
                            .inputs_of(name)
                            .iter()
                            .filter_map(|i| spec.operator(i))
                            .map(|o| o.parallelism)
                            .sum();
                        let stage = EventTimeStage::for_kind(
                            kind,
                            upstream as usize,
                            ctx.channel,
                            k,
                            restored_state(),
                        )
                        .map_err(|source| {
                            control.stop.store(true, Ordering::SeqCst);
                            RuntimeError::State {
                                operator: name.clone(),
                                source,
                            }
                        })?;
                        let behaviour = match stage {
                            Some(stage) => Behaviour::EventTime {
                                stage: Box::new(stage),
                                out: StageOutput::default(),
                            },
                            None => Behaviour::for_kind(kind, restored_state, shared_sink.clone()),
                        };
                        let task = OperatorTask { rx, behaviour };
                        Box::new(move || task.run(ctx))
                    }
                };
                match std::thread::Builder::new()
                    .name(format!("{name}-{index}"))
                    .spawn(body)
                {
                    Ok(h) => handles.push(h),
                    Err(e) => {
                        spawn_failed = Some(e);
                        break;
                    }
                }
            }
            if spawn_failed.is_some() {
                break;
            }
        }
        // Drop the runtime's own senders so channels close when upstream subtasks exit.
        drop(inputs);
        let job = Job {
            spec,
            control,
            handles,
            counters,
            source_emitted,
            job_started_unix_ms,
        };
        if let Some(e) = spawn_failed {
            job.control.stop.store(true, Ordering::SeqCst);
            job.control.failed.store(true, Ordering::SeqCst);
            let _ = job.join();
            return Err(RuntimeError::Spawn(e));
        }
        Ok(job)
    }

    /// The job's spec (with the parallelism it runs at).
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// Live counters per operator.
    pub fn counters(&self) -> BTreeMap<String, OperatorCounters> {
        self.counters
            .iter()
            .map(|(k, v)| (k.clone(), v.snapshot()))
            .collect()
    }

    /// When the job first started (ms since the Unix epoch; carried across restores).
    pub fn job_started_unix_ms(&self) -> u64 {
        self.job_started_unix_ms
    }

    /// Asks sources to stop; operators drain and exit. `Drain` also fires open windows.
    pub fn request_stop(&self, kind: StopKind) {
        self.control
            .drain
            .store(kind == StopKind::Drain, Ordering::SeqCst);
        self.control.stop.store(true, Ordering::SeqCst);
    }

    /// Whether every subtask thread has returned.
    pub fn is_finished(&self) -> bool {
        self.handles.iter().all(JoinHandle::is_finished)
    }

    /// Whether a subtask failed.
    pub fn has_failed(&self) -> bool {
        self.control.failed.load(Ordering::SeqCst)
    }

    /// Waits for every subtask and assembles the final savepoint contents (not yet written).
    pub fn join(self) -> Finished {
        let mut state: BTreeMap<String, KeyedState> = BTreeMap::new();
        let mut errors = Vec::new();
        for h in self.handles {
            match h.join() {
                Ok(r) => {
                    if let Some(e) = r.error {
                        errors.push(e);
                    }
                    if let Some(s) = r.state {
                        state.entry(r.operator).or_default().merge(s);
                    }
                }
                Err(_) => errors.push("a subtask thread panicked".into()),
            }
        }
        for op in self.spec.operators.iter().filter(|o| o.kind.is_keyed()) {
            state.entry(op.name.clone()).or_default();
        }
        let counters = self
            .counters
            .iter()
            .map(|(k, v)| (k.clone(), v.snapshot()))
            .collect();
        let sources = self
            .source_emitted
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    SourcePosition {
                        emitted: v.load(Ordering::SeqCst),
                    },
                )
            })
            .collect();
        let metadata = SavepointMetadata {
            format_version: crate::savepoint::FORMAT_VERSION,
            job_name: self.spec.name.clone(),
            fingerprint: self.spec.fingerprint(),
            max_parallelism: self.spec.max_parallelism,
            parallelism: self.spec.parallelism(),
            job_started_unix_ms: self.job_started_unix_ms,
            created_unix_ms: now_unix_us() / 1000,
            sources,
            counters,
            files: Vec::new(),
        };
        Finished {
            savepoint: Savepoint { metadata, state },
            errors,
        }
    }
}

struct SubtaskContext {
    operator: String,
    index: u32,
    parallelism: u32,
    max_parallelism: u32,
    cpu_us: f64,
    io_us: f64,
    control: Arc<Control>,
    meter: Meter,
    outputs: Outputs,
    /// Job-wide channel number of this subtask (identifies its watermarks downstream).
    channel: u32,
}

impl SubtaskContext {
    fn result(self, state: Option<KeyedState>, error: Option<String>) -> SubtaskResult {
        if error.is_some() {
            self.control.failed.store(true, Ordering::SeqCst);
            self.control.stop.store(true, Ordering::SeqCst);
        }
        SubtaskResult {
            operator: self.operator,
            state,
            error,
        }
    }
}

struct SourceTask {
    /// Nexmark sources: the event generator (else synthetic keyed records).
    nexmark: Option<NexmarkGenerator>,
    rate: Arc<RateFunction>,
    emitted: Arc<AtomicU64>,
    keys: u64,
    limit: Option<u64>,
    job_started_unix_ms: u64,
    salt: u64,
}

const SOURCE_BATCH: u64 = 64;

impl SourceTask {
    /// Wall-clock seconds since the job first started.
    fn wall(&self) -> f64 {
        (now_unix_us() as f64 / 1e6) - (self.job_started_unix_ms as f64 / 1e3)
    }

    /// Wall-clock second (since job start) at which record `seq` arrived: the inverse of the
    /// cumulative arrival function, by bisection.
    fn arrival_wall(&self, seq: u64, now: f64) -> f64 {
        let target = seq as f64 + 1.0;
        let (mut lo, mut hi) = (0.0_f64, now);
        if self.rate.cumulative(hi) < target {
            return now;
        }
        for _ in 0..40 {
            let mid = 0.5 * (lo + hi);
            if self.rate.cumulative(mid) >= target {
                hi = mid;
            } else {
                lo = mid;
            }
            if hi - lo < 1e-4 {
                break;
            }
        }
        hi
    }

    fn run(mut self, mut ctx: SubtaskContext) -> SubtaskResult {
        let labels = [ctx.operator.clone(), ctx.index.to_string()];
        let l = [labels[0].as_str(), labels[1].as_str()];
        let metrics = ctx.meter.metrics.clone();
        let p = f64::from(ctx.parallelism);
        let mut arrivals_reported = 0.0;
        let mut last_gauges = Instant::now() - Duration::from_secs(1);
        let limit = self.limit.unwrap_or(u64::MAX);
        loop {
            if ctx.control.stop.load(Ordering::Relaxed) {
                break;
            }
            let now = self.wall();
            let due = self.rate.cumulative(now).floor().min(limit as f64) as u64;
            // Metrics: arrivals share and backlog share of this subtask.
            if ctx.meter.enabled && last_gauges.elapsed() >= Duration::from_millis(50) {
                let share = due as f64 / p;
                if share > arrivals_reported {
                    metrics
                        .source_arrivals
                        .with_label_values(&l)
                        .inc_by(share - arrivals_reported);
                    arrivals_reported = share;
                }
                let backlog = due.saturating_sub(self.emitted.load(Ordering::Relaxed)) as f64;
                metrics
                    .source_backlog
                    .with_label_values(&l)
                    .set(backlog / p);
                metrics
                    .source_rate
                    .with_label_values(&l)
                    .set(self.rate.rate(now) / p);
                last_gauges = Instant::now();
            }
            // Claim a batch of sequence numbers that are due.
            let mut start = self.emitted.load(Ordering::SeqCst);
            let claimed = loop {
                if start >= due {
                    break 0;
                }
                let n = (due - start).min(SOURCE_BATCH);
                match self.emitted.compare_exchange(
                    start,
                    start + n,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => break n,
                    Err(actual) => start = actual,
                }
            };
            if claimed == 0 {
                let watermark = self.nexmark.as_mut().and_then(|g| {
                    if start >= limit {
                        g.end()
                    } else {
                        g.idle(start)
                    }
                });
                if let Some(wm) = watermark
                    && !ctx.outputs.send(wm, &mut ctx.meter)
                {
                    let err = format!("{}-{}: downstream closed", ctx.operator, ctx.index);
                    ctx.meter.flush(0);
                    return ctx.result(None, Some(err));
                }
                if start >= limit {
                    break;
                }
                ctx.meter.check(|| 0);
                let t = ctx.meter.now();
                std::thread::sleep(Duration::from_micros(500));
                if let Some(t) = t {
                    ctx.meter.idle += t.elapsed();
                }
                continue;
            }
            // Records in a backlog arrived earlier than now: stamp their true arrival time.
            let behind = due - start;
            let created_us = if behind > SOURCE_BATCH {
                ((self.arrival_wall(start, now) * 1e6) as u64)
                    .saturating_add(self.job_started_unix_ms * 1000)
            } else {
                now_unix_us()
            };
            let mut events = self
                .nexmark
                .as_mut()
                .map(|g| g.batch(start, claimed).into_iter());
            for seq in start..start + claimed {
                let rec = match (&mut self.nexmark, events.as_mut().and_then(Iterator::next)) {
                    (Some(g), Some(event)) => g.record(seq, event, created_us),
                    _ => Record {
                        seq,
                        key: murmur_fmix64(seq ^ self.salt) % self.keys,
                        value: (seq % 100) as i64,
                        count: 1,
                        created_us,
                        payload: Payload::None,
                    },
                };
                if !ctx.outputs.send(rec, &mut ctx.meter) {
                    let err = format!("{}-{}: downstream closed", ctx.operator, ctx.index);
                    ctx.meter.flush(0);
                    return ctx.result(None, Some(err));
                }
            }
            if let Some(wm) = self
                .nexmark
                .as_mut()
                .and_then(NexmarkGenerator::after_batch)
                && !ctx.outputs.send(wm, &mut ctx.meter)
            {
                let err = format!("{}-{}: downstream closed", ctx.operator, ctx.index);
                ctx.meter.flush(0);
                return ctx.result(None, Some(err));
            }
            ctx.meter.tick(|| 0);
        }
        ctx.meter.flush(0);
        if ctx.meter.enabled {
            let backlog = self.rate.cumulative(self.wall()).floor().min(limit as f64) as u64;
            let backlog = backlog.saturating_sub(self.emitted.load(Ordering::Relaxed)) as f64;
            metrics
                .source_backlog
                .with_label_values(&l)
                .set(backlog / p);
        }
        ctx.result(None, None)
    }
}

enum Behaviour {
    Map,
    Filter {
        keep: f64,
    },
    Window {
        size_us: u64,
        state: KeyedState,
        pane_end_us: u64,
        checks: u32,
    },
    Sink {
        file: Option<SinkWriter>,
        /// Cached wall clock (µs since the epoch) and records until it is read again.
        clock_us: u64,
        clock_uses: u32,
    },
    /// Event-time operators (Nexmark stages, windows, joins): see [`crate::time`].
    EventTime {
        stage: Box<EventTimeStage>,
        /// Reused output buffer.
        out: StageOutput,
    },
}

type SinkWriter = Arc<std::sync::Mutex<BufWriter<std::fs::File>>>;

impl Behaviour {
    /// The behaviour of a non-source operator kind (sources run as [`SourceTask`]).
    fn for_kind(
        kind: &OperatorKind,
        restored_state: impl FnOnce() -> KeyedState,
        sink: Option<SinkWriter>,
    ) -> Behaviour {
        match kind {
            OperatorKind::Filter { keep } => Behaviour::Filter { keep: *keep },
            OperatorKind::Window { size_ms } => Behaviour::Window {
                size_us: size_ms * 1000,
                state: restored_state(),
                pane_end_us: 0,
                checks: 0,
            },
            OperatorKind::Sink { .. } => Behaviour::Sink {
                file: sink,
                clock_us: 0,
                clock_uses: 0,
            },
            OperatorKind::Map
            | OperatorKind::Source { .. }
            | OperatorKind::Select { .. }
            | OperatorKind::EventWindow { .. }
            | OperatorKind::WindowTop { .. }
            | OperatorKind::Join { .. } => Behaviour::Map,
        }
    }
}

struct OperatorTask {
    rx: Receiver<Record>,
    behaviour: Behaviour,
}

impl OperatorTask {
    fn run(mut self, mut ctx: SubtaskContext) -> SubtaskResult {
        let tick = Duration::from_millis(10);
        let mut error = None;
        loop {
            let received = match self.rx.try_recv() {
                Ok(rec) => Ok(rec),
                Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {
                    // About to wait for input: flush, then time the wait as idle.
                    ctx.meter.check(|| 0);
                    if let Behaviour::Sink { clock_uses, .. } = &mut self.behaviour {
                        *clock_uses = 0; // the cached clock goes stale while waiting
                    }
                    let t = ctx.meter.now();
                    let r = self.rx.recv_timeout(tick);
                    if let Some(t) = t {
                        ctx.meter.idle += t.elapsed();
                    }
                    r
                }
            };
            match received {
                Ok(rec) => {
                    if !rec.payload.is_watermark() {
                        ctx.meter.records_in += 1;
                    }
                    if !self.process(rec, &mut ctx) {
                        error = Some(format!("{}-{}: downstream closed", ctx.operator, ctx.index));
                        break;
                    }
                    let rx = &self.rx;
                    ctx.meter.tick(|| rx.len());
                }
                Err(RecvTimeoutError::Timeout) => {
                    if !self.fire_due_windows(&mut ctx, false) {
                        error = Some(format!("{}-{}: downstream closed", ctx.operator, ctx.index));
                        break;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if self.window_due() && !self.fire_due_windows(&mut ctx, false) {
                error = Some(format!("{}-{}: downstream closed", ctx.operator, ctx.index));
                break;
            }
        }
        // Fire every open pane before closing the outputs when draining, or when the inputs
        // ended on their own (bounded sources finished): the job is complete.
        let natural_end = !ctx.control.stop.load(Ordering::SeqCst);
        if error.is_none()
            && (natural_end || ctx.control.drain.load(Ordering::SeqCst))
            && !self.fire_due_windows(&mut ctx, true)
        {
            error = Some(format!("{}-{}: downstream closed", ctx.operator, ctx.index));
        }
        if let Behaviour::Sink { file: Some(f), .. } = &self.behaviour
            && let Ok(mut w) = f.lock()
            && let Err(e) = w.flush()
        {
            error = Some(format!(
                "{}-{}: cannot write sink output: {e}",
                ctx.operator, ctx.index
            ));
        }
        ctx.meter.flush(0);
        let state = match self.behaviour {
            Behaviour::Window { state, .. } => Some(state),
            Behaviour::EventTime { stage, .. } => match stage.snapshot() {
                Ok(state) => state,
                Err(e) => {
                    error = Some(format!("{}-{}: {e}", ctx.operator, ctx.index));
                    None
                }
            },
            _ => None,
        };
        ctx.result(state, error)
    }

    /// Applies the operator to one record. Returns false if a downstream receiver is gone.
    fn process(&mut self, rec: Record, ctx: &mut SubtaskContext) -> bool {
        if rec.payload.is_watermark() {
            return match &mut self.behaviour {
                Behaviour::EventTime { stage, out } => {
                    stage.on_record(rec, out);
                    emit_stage_output(out, ctx)
                }
                Behaviour::Map | Behaviour::Filter { .. } => ctx.outputs.send(rec, &mut ctx.meter),
                Behaviour::Window { .. } | Behaviour::Sink { .. } => true,
            };
        }
        spend(ctx.cpu_us, ctx.io_us, rec.seq);
        match &mut self.behaviour {
            Behaviour::EventTime { stage, out } => {
                stage.on_record(rec, out);
                emit_stage_output(out, ctx)
            }
            Behaviour::Map => ctx.outputs.send(rec, &mut ctx.meter),
            Behaviour::Filter { keep } => {
                let draw = (murmur_fmix64(rec.seq ^ 0xf1_17e5) >> 11) as f64 / (1u64 << 53) as f64;
                if draw < *keep {
                    ctx.outputs.send(rec, &mut ctx.meter)
                } else {
                    ctx.meter
                        .live
                        .filtered
                        .fetch_add(rec.count, Ordering::Relaxed);
                    true
                }
            }
            Behaviour::Window {
                size_us,
                state,
                pane_end_us,
                ..
            } => {
                let now = now_unix_us();
                if *pane_end_us == 0 {
                    *pane_end_us = (now / *size_us + 1) * *size_us;
                }
                let kg = key_group(rec.key, ctx.max_parallelism);
                let s = state.entry(kg, rec.key);
                s.total_count += rec.count;
                s.total_sum += rec.value;
                s.pane_count += rec.count;
                s.pane_sum += rec.value;
                s.pane_max_delay_us = s.pane_max_delay_us.max(now.saturating_sub(rec.created_us));
                true
            }
            Behaviour::Sink {
                file,
                clock_us,
                clock_uses,
            } => {
                if let Some((latency, accounted)) = &ctx.meter.sink {
                    // Read the clock every 16 records: latency is in ms, a record takes ns.
                    if *clock_uses == 0 {
                        *clock_us = now_unix_us();
                        *clock_uses = 16;
                    }
                    *clock_uses -= 1;
                    let lat = clock_us.saturating_sub(rec.created_us) as f64 / 1e6;
                    latency.observe(lat);
                    accounted.inc_by(rec.count);
                }
                ctx.meter
                    .live
                    .accounted
                    .fetch_add(rec.count, Ordering::Relaxed);
                if let Some(f) = file
                    && let Ok(mut w) = f.lock()
                {
                    let _ = match rec.payload.to_json() {
                        Some(json) => writeln!(w, "{json}"),
                        None => writeln!(w, "{},{},{}", rec.key, rec.count, rec.value),
                    };
                }
                true
            }
        }
    }

    /// Whether this is a window operator whose open pane may have ended (checks the clock
    /// at most every 64 records).
    fn window_due(&mut self) -> bool {
        match &mut self.behaviour {
            Behaviour::Window { checks, .. } => {
                *checks += 1;
                if *checks >= 64 {
                    *checks = 0;
                    return true;
                }
                false
            }
            _ => false,
        }
    }

    /// Fires the open pane of a window operator if its end has passed (or unconditionally
    /// when `all`). Returns false if a downstream receiver is gone.
    fn fire_due_windows(&mut self, ctx: &mut SubtaskContext, all: bool) -> bool {
        if let Behaviour::EventTime { stage, out } = &mut self.behaviour {
            if all {
                stage.finish(out);
                return emit_stage_output(out, ctx);
            }
            return true;
        }
        let Behaviour::Window {
            size_us,
            state,
            pane_end_us,
            ..
        } = &mut self.behaviour
        else {
            return true;
        };
        let now = now_unix_us();
        if !all && (*pane_end_us == 0 || now < *pane_end_us) {
            return true;
        }
        *pane_end_us = (now / *size_us + 1) * *size_us;
        let mut out = Vec::new();
        for keys in state.groups.values_mut() {
            for (key, s) in keys.iter_mut() {
                if s.pane_count > 0 {
                    // The result is stamped so that the sink measures the pane's largest
                    // upstream delay plus the time after the window fired: latency without
                    // the buffering a window does on purpose.
                    out.push(Record {
                        seq: *key,
                        key: *key,
                        value: s.pane_sum,
                        count: s.pane_count,
                        created_us: now.saturating_sub(s.pane_max_delay_us),
                        payload: Payload::None,
                    });
                    s.pane_count = 0;
                    s.pane_sum = 0;
                    s.pane_max_delay_us = 0;
                }
            }
        }
        for rec in out {
            if !ctx.outputs.send(rec, &mut ctx.meter) {
                return false;
            }
        }
        true
    }
}

/// Sends what an event-time stage produced and counts its filtered and late records.
/// Returns false if a downstream receiver is gone.
fn emit_stage_output(out: &mut StageOutput, ctx: &mut SubtaskContext) -> bool {
    if out.filtered > 0 {
        ctx.meter
            .live
            .filtered
            .fetch_add(out.filtered, Ordering::Relaxed);
        out.filtered = 0;
    }
    if out.late > 0 {
        if ctx.meter.enabled {
            let l = [ctx.meter.labels[0].as_str(), ctx.meter.labels[1].as_str()];
            ctx.meter
                .metrics
                .late_records_dropped
                .with_label_values(&l)
                .inc_by(out.late);
        }
        out.late = 0;
    }
    let mut ok = true;
    for rec in out.records.drain(..) {
        if ok && !ctx.outputs.send(rec, &mut ctx.meter) {
            ok = false;
        }
    }
    ok
}

/// The key that partitions the input of an operator of kind `kind` among its subtasks.
fn key_selector(kind: &OperatorKind) -> fn(&Record) -> u64 {
    use crate::nexmark::queries::{self as q, BidKey};
    match kind {
        OperatorKind::EventWindow {
            key: BidKey::Auction,
            ..
        } => q::key_bid_auction,
        OperatorKind::EventWindow {
            key: BidKey::Bidder,
            ..
        } => q::key_bid_bidder,
        OperatorKind::WindowTop { .. } => q::key_window,
        OperatorKind::Join { .. } => q::key_person,
        OperatorKind::Select { .. } => q::key_rebalance,
        _ => q::key_record,
    }
}
