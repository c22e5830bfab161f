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
use crate::checkpoint::barrier::{Aligner, Barrier, BarrierKind, Event, Message};
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
use crate::spec::{JobSpec, OperatorKind};
use crate::state::backend::KeyedStateBackend;
use crate::state::{KeyedState, StateBackend, StateError, StateOwner};
use crate::time::{EventTimeStage, StageOutput};
use crate::trace::{RateFunction, TraceError};
use prometheus::IntCounter;

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

/// One subtask's input queue (both ends).
type Queue = (Sender<Message>, Receiver<Message>);

/// The input queues of one downstream operator's subtasks, as seen by one upstream subtask.
struct Route {
    txs: Vec<Sender<Message>>,
    /// This subtask's input-channel index at every downstream subtask.
    channel: u32,
    /// Route by key group (else rebalance).
    keyed: bool,
    /// The key that picks the key group of a record (keyed routes).
    key_of: fn(&Record) -> u64,
    /// Rebalance: where the next search for room starts.
    next: usize,
}

/// Most [`Meter::tick`] calls between two clock reads (fast operators: one read per this many
/// records).
const MAX_TICKS_PER_CHECK: u32 = 128;
/// A subtask reads the clock at least this many times per flush interval, however slow its
/// records (or batches) are, so its metrics are at most 1/this of the interval late.
const CHECKS_PER_FLUSH: u32 = 8;

/// What [`Meter::tick`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// The clock was not read.
    Skipped,
    /// The clock was read; no flush was due.
    Checked,
    /// The counters were flushed.
    Flushed,
}

/// Time and count accumulators of a subtask, flushed to the registry periodically.
struct Meter {
    /// Exact counts since this run started, reported with each barrier.
    totals: OperatorCounters,
    enabled: bool,
    records_in: u64,
    records_out: u64,
    idle: Duration,
    backpressured: Duration,
    /// Chain members (not heads) measure their busy time directly ([`crate::chain`]); their
    /// idle time is the rest of the wall time.
    chained: bool,
    /// Busy time measured since the last flush (chain members only).
    busy: Duration,
    last_flush: Instant,
    /// `last_flush + flush_interval`: when the next flush is due.
    next_flush: Instant,
    /// [`Meter::tick`] calls since the clock was last read.
    ticks: u32,
    /// Ticks between clock reads, adapted to how long a tick takes ([`Meter::check`]).
    check_every: u32,
    /// Ticks until the next clock read: `check_every`, or 0 after a long wait so that the
    /// next tick reads the clock.
    check_at: u32,
    /// When the clock was last read by [`Meter::check`].
    last_check: Instant,
    flush_interval: Duration,
    /// Longest time between two clock reads: a flush is at most this late.
    check_budget: Duration,
    labels: [String; 2],
    metrics: EngineMetrics,
    live: Arc<LiveCounters>,
    /// Sinks with metrics on: the latency histogram and accounted counter.
    sink: Option<SinkMeter>,
    /// Keyed operators with metrics on: records per owned key group, decayed, for
    /// `streamscale_hottest_key_group_share` and `streamscale_key_group_share` (counted in
    /// [`Operator::process`] on the key group the operator computes for its state), with the
    /// subtask's series of the latter.
    key_groups: Option<(KeyGroupLoad, KeyGroupShareSeries)>,
    /// Non-source operators with metrics on: the service-time batches
    /// ([`crate::service_time`]).
    service: Option<ServiceMeter>,
    /// A clock reading and the wall clock (µs since the Unix epoch) at that moment, renewed
    /// at every flush: converts the monotonic readings a chain run takes anyway into wall
    /// time for a sink's latency ([`Meter::unix_us_at`]).
    anchor: (Instant, u64),
}

/// A subtask's service-time batches ([`crate::service_time`]): where the current batch
/// started, and the sums of the closed ones since the last flush.
struct ServiceMeter {
    series: ServiceTimeSeries,
    moments: ServiceMoments,
    /// `totals.records_in` when the current batch started.
    mark_records: u64,
    /// The clock reading the current batch started at (subtasks reading their own queue).
    mark_at: Instant,
    /// [`Meter::service_clock`] when the current batch started.
    mark_clock: Duration,
    /// What [`Meter::service_clock`] counts, up to the last flush (the meter's own counts
    /// restart from zero at every flush).
    flushed: Duration,
}

/// A sink subtask's metrics: the latency histogram, counted per record in the thread, and
/// the accounted counter, published from [`OperatorCounters::accounted`] at each flush.
struct SinkMeter {
    latency: LocalLatencyHistogram,
    accounted: IntCounter,
    /// `totals.accounted` when the counter was last published.
    accounted_published: u64,
    /// Records until a sink reading its own input queue reads the clock again. Latency is
    /// measured against a chained sink's batch start ([`ChainMember::run_pending`]), else
    /// against the clock read every [`SINK_CLOCK_USES`] records ([`SinkMeter::tick_clock`]).
    clock_uses: u32,
}

/// A sink that reads its own input queue reads the clock once per this many records (and
/// after every wait for input): latency is in ms, a record takes ns.
const SINK_CLOCK_USES: u32 = 16;

impl SinkMeter {
    /// Before a record of a sink reading its own input queue: reads the clock every
    /// [`SINK_CLOCK_USES`] records.
    #[inline]
    fn tick_clock(&mut self) {
        if self.clock_uses == 0 {
            self.latency.set_clock(now_unix_us());
            self.clock_uses = SINK_CLOCK_USES;
        }
        self.clock_uses -= 1;
    }
}

impl Meter {
    /// Publishes the accumulated counts. Busy time is derived as Flink does: the wall time
    /// since the last flush minus the measured idle and backpressured time, so the hot path
    /// reads the clock only when it blocks. A chain member measures its busy time around the
    /// batches it processes instead, and its idle time is the rest ([`crate::chain`]).
    fn flush(&mut self, queue_len: usize) {
        self.flush_at(Instant::now(), queue_len);
    }

    /// [`Meter::flush`] with the clock read at `now`.
    fn flush_at(&mut self, now: Instant, queue_len: usize) {
        let wall = now.saturating_duration_since(self.last_flush);
        let clock = self.service_clock_since_flush();
        if let Some(svc) = &mut self.service {
            // The counts below restart from zero: keep the batch clock running.
            svc.flushed += clock;
            svc.series.publish(&svc.moments);
            svc.moments = ServiceMoments::default();
        }
        if self.chained {
            let busy = self.busy.min(wall);
            self.backpressured = self.backpressured.min(wall - busy);
            self.idle = wall - busy - self.backpressured;
            self.busy = Duration::ZERO;
        }
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
            if let Some((load, top)) = self.key_groups.as_mut()
                && let Some(share) = load.flush(wall)
            {
                m.hottest_key_group_share.with_label_values(&l).set(share);
                top.set(load.top());
            }
            if let Some(sink) = &mut self.sink {
                sink.latency.flush();
                sink.accounted
                    .inc_by(self.totals.accounted - sink.accounted_published);
                sink.accounted_published = self.totals.accounted;
            }
        }
        self.records_in = 0;
        self.records_out = 0;
        self.idle = Duration::ZERO;
        self.backpressured = Duration::ZERO;
        self.last_flush = now;
        self.next_flush = now + self.flush_interval;
        if self.sink.is_some() {
            self.anchor = (now, now_unix_us());
        }
    }

    /// The wall clock (µs since the Unix epoch) at the clock reading `t`, from the anchor
    /// taken at the last flush: exact up to the wall clock's adjustment since then (NTP
    /// slews it by at most 0.05 %, so < 50 µs over a 100 ms flush interval).
    #[inline]
    fn unix_us_at(&self, t: Instant) -> u64 {
        let (at, unix_us) = self.anchor;
        let since = t.saturating_duration_since(at);
        let since_us = since
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(since.subsec_micros()));
        unix_us.saturating_add(since_us)
    }

    /// Time that does not count towards a service batch, since the last flush: for a chain
    /// member its busy time (measured directly; the batch time is its growth), for any other
    /// subtask its idle and backpressured time (the batch time is the wall time less its
    /// growth).
    #[inline]
    fn service_clock_since_flush(&self) -> Duration {
        if self.chained {
            self.busy
        } else {
            self.idle + self.backpressured
        }
    }

    /// Closes the current service batch at the clock reading `now` (a reading taken anyway)
    /// ([`crate::service_time`]): its records are those received since it started, its time
    /// what the subtask spent since then; a batch without records (the subtask's start, a
    /// timer, a barrier) is dropped. The next batch starts at `now`. A few arithmetic
    /// operations, no allocation.
    #[inline]
    fn close_service_batch(&mut self, now: Instant) {
        let clock = self.service_clock_since_flush();
        let records = self.totals.records_in;
        let chained = self.chained;
        let Some(svc) = &mut self.service else { return };
        let n = records.saturating_sub(svc.mark_records);
        let clock = svc.flushed + clock;
        if n > 0 {
            let counted = clock.saturating_sub(svc.mark_clock);
            let took = if chained {
                counted
            } else {
                now.saturating_duration_since(svc.mark_at)
                    .saturating_sub(counted)
            };
            svc.moments.add(n, took);
            svc.mark_records = records;
        }
        svc.mark_clock = clock;
        svc.mark_at = now;
    }

    /// Called once per record (or source batch): flushes if the flush interval has passed,
    /// reading the clock only every `check_every` calls: [`MAX_TICKS_PER_CHECK`] for
    /// fast operators, fewer for slow ones so that the clock is read at least
    /// [`CHECKS_PER_FLUSH`] times per flush interval.
    #[inline]
    fn tick(&mut self, queue_len: impl FnOnce() -> usize) -> Check {
        self.ticks += 1;
        if self.ticks >= self.check_at {
            return self.check(queue_len);
        }
        Check::Skipped
    }

    /// Reads the clock and flushes if the flush interval has passed. Sets the number of ticks
    /// until the next check from the time the ticks since the last check took: as many as fit
    /// in `check_budget` at that pace, between 1 and [`MAX_TICKS_PER_CHECK`], and at most
    /// twice as many as before.
    #[inline(never)]
    fn check(&mut self, queue_len: impl FnOnce() -> usize) -> Check {
        self.check_with(Instant::now(), queue_len)
    }

    /// [`Meter::check`] with the clock read at `now`.
    fn check_with(&mut self, now: Instant, queue_len: impl FnOnce() -> usize) -> Check {
        self.close_service_batch(now);
        self.adapt(now);
        if now >= self.next_flush {
            self.flush_at(now, queue_len());
            return Check::Flushed;
        }
        Check::Checked
    }

    /// Notes a clock reading `now` taken for another purpose (the end of a chain run) as a
    /// check, so that the ticks need not read the clock themselves; a flush that is due then
    /// happens at the next tick (which knows the input queue's length).
    #[inline]
    fn saw_clock(&mut self, now: Instant) {
        self.close_service_batch(now);
        self.adapt(now);
        if now >= self.next_flush {
            self.check_at = 0;
        }
    }

    /// Sets the number of ticks until the next check from the time the ticks since the last
    /// check took (see [`Meter::check`]), the clock being read at `now`.
    #[inline]
    fn adapt(&mut self, now: Instant) {
        if self.ticks > 0 {
            let since = now.saturating_duration_since(self.last_check);
            // Down at once, up at most twofold per check: one stretch of quick ticks (a
            // record that ran no chain) must not stretch the next check over slow ones.
            let most = self.check_every.saturating_mul(2).min(MAX_TICKS_PER_CHECK);
            let fit = fit_in_budget(
                u64::from(self.ticks),
                since,
                self.check_budget,
                u64::from(most),
            );
            self.check_every = fit as u32;
            self.ticks = 0;
        }
        self.check_at = self.check_every;
        self.last_check = now;
    }

    /// Notes a wait of `d` (measured by the caller): after a wait longer than the check budget
    /// the next tick reads the clock, so that a subtask blocked for long (a full channel, a
    /// slow chain downstream) still flushes on time.
    #[inline]
    fn waited(&mut self, d: Duration) {
        if d >= self.check_budget {
            self.check_at = 0;
        }
    }

    /// The clock, when time is measured.
    fn now(&self) -> Option<Instant> {
        self.enabled.then(Instant::now)
    }
}

impl Outputs {
    /// Sends `rec` to every downstream operator; returns false if a receiver is gone.
    fn send(&mut self, rec: Record, meter: &mut Meter) -> bool {
        if let Some(next) = &mut self.chain {
            // Chained: queue for the next member (watermarks too, in order), which runs when
            // its batch is full or the head flushes.
            if !rec.payload.is_watermark() {
                meter.records_out += 1;
                meter.totals.records_out += 1;
            }
            next.pending.push(rec);
            if next.pending.len() >= next.batch {
                return self.flush(meter);
            }
            return true;
        }
        if rec.payload.is_watermark() {
            // Watermarks go to every downstream subtask and are not counted as records.
            return self.broadcast(Event::Data(rec), meter);
        }
        for route in &mut self.routes {
            let key = (route.key_of)(&rec);
            let msg = Message {
                channel: route.channel,
                event: Event::Data(rec.clone()),
            };
            let ok = if route.keyed {
                let kg = key_group(key, self.max_parallelism);
                let i = subtask_for_key_group(kg, route.txs.len() as u32, self.max_parallelism);
                send_one(&route.txs[i], msg, meter)
            } else {
                rebalance(route, msg, meter)
            };
            if !ok {
                return false;
            }
        }
        // Once per record, however many downstream operators it goes to (Flink's
        // numRecordsOut): the planner's traffic equations send an operator's output along each
        // of its edges, so counting per edge would double a fan-out's selectivity.
        if !self.routes.is_empty() {
            meter.records_out += 1;
            meter.totals.records_out += 1;
        }
        true
    }

    /// Sends `event` (a barrier or the end) on every output channel, in order after every
    /// record sent before; returns false if a receiver is gone.
    fn broadcast(&mut self, event: Event, meter: &mut Meter) -> bool {
        if self.chain.is_some() {
            if !self.flush(meter) {
                return false;
            }
            let t = meter.now();
            let ok = self.chain.as_mut().is_none_or(|next| next.on_event(event));
            if let Some(t) = t {
                let took = t.elapsed();
                meter.backpressured += took;
                meter.waited(took);
            }
            return ok;
        }
        for route in &self.routes {
            for tx in &route.txs {
                let msg = Message {
                    channel: route.channel,
                    event: event.clone(),
                };
                if !send_one(tx, msg, meter) {
                    return false;
                }
            }
        }
        true
    }
}

impl Outputs {
    /// Runs the records queued for the rest of the chain (all of it, to the tail), timing
    /// that as this subtask's backpressured time: its output is not accepted until the chain
    /// downstream is done. Returns false if a receiver downstream of the chain is gone.
    ///
    /// The time the run took sets the next member's batch size ([`chain_batch`]), so that a
    /// slow chain runs in batches short enough for every member (and this subtask) to flush
    /// its metrics on time and for records not to wait behind a long batch.
    ///
    /// The clock is read once where one member hands over to the next (the next member's
    /// start) and once when the tail is done; each reading serves both sides of the hand-over
    /// (see [`ChainMember::run_pending`]).
    #[inline(never)]
    fn flush(&mut self, meter: &mut Meter) -> bool {
        let Some(next) = &mut self.chain else {
            return true;
        };
        if next.pending.is_empty() {
            return true;
        }
        let n = next.pending.len();
        let start = meter.now();
        let (ok, end) = next.run_pending(start);
        if let (Some(start), Some(end)) = (start, end) {
            let took = end.saturating_duration_since(start);
            meter.backpressured += took;
            meter.waited(took);
            if !meter.chained {
                // A head ticks (a member checks after each of its runs instead).
                meter.saw_clock(end);
            }
            next.batch = chain_batch(n, took, meter.check_budget);
        }
        self.ran_until = end;
        ok
    }

    /// Publishes the chain members' metrics if their flush interval has passed (the head
    /// calls this when it is about to wait and whenever it flushed its own, so members'
    /// metrics stay fresh while idle or while the head is slow).
    fn check_chain(&mut self) {
        let mut next = self.chain.as_deref_mut();
        while let Some(m) = next {
            m.ctx.meter.check(|| 0);
            next = m.ctx.outputs.chain.as_deref_mut();
        }
    }

    /// Ends every chain member after the head's thread stopped: flushes sinks and metrics and
    /// returns each member's result (its state for the final savepoint), in chain order.
    fn finish_chain(&mut self) -> Vec<SubtaskResult> {
        let mut results = Vec::new();
        let mut next = self.chain.take();
        while let Some(mut m) = next {
            next = m.ctx.outputs.chain.take();
            m.ctx.meter.flush(0);
            let (state, error) = m.op.finish(&m.ctx);
            results.push(m.ctx.result(state, error));
        }
        results
    }
}

/// A chain member: an operator subtask running in its upstream subtask's thread
/// ([`crate::chain`]).
struct ChainMember {
    op: Operator,
    ctx: SubtaskContext,
    /// Records (and watermarks) from the upstream member not processed yet, in order.
    pending: Vec<Record>,
    /// Pending records that make the upstream member run this member: [`CHAIN_BATCH`] for a
    /// fast chain, fewer for a slow one ([`chain_batch`]); 1 until the first run is timed.
    batch: usize,
}

/// The batch size for a chain member whose last run of `n` records (and what it ran
/// downstream) took `took`: as many records as fit in `budget` at that pace, between 1 and
/// [`CHAIN_BATCH`].
fn chain_batch(n: usize, took: Duration, budget: Duration) -> usize {
    let fit = fit_in_budget(n as u64, took, budget, CHAIN_BATCH as u64);
    fit as usize
}

/// How many of `n` steps that took `took` together fit in `budget`, between 1 and `most`.
/// Integer arithmetic on nanoseconds, with no division when all `most` fit (fast operators).
#[inline]
fn fit_in_budget(n: u64, took: Duration, budget: Duration, most: u64) -> u64 {
    let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
    let room = u64::try_from(budget.as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_mul(n);
    if took.saturating_mul(most) <= room {
        return most;
    }
    (room / took).clamp(1, most)
}

impl ChainMember {
    /// Runs `f` and adds its duration, minus the time the chain downstream took (counted as
    /// backpressured by then), to this member's busy time.
    fn timed(&mut self, f: impl FnOnce(&mut Self) -> bool) -> bool {
        let t = self.ctx.meter.now();
        let waited = self.ctx.meter.backpressured;
        let ok = f(self);
        if let Some(t) = t {
            let downstream = self.ctx.meter.backpressured.saturating_sub(waited);
            self.ctx.meter.busy += t.elapsed().saturating_sub(downstream);
        }
        ok
    }

    /// Processes the pending batch and then flushes the rest of the chain. `start` is the
    /// clock read by the caller just before (`None` without metrics). Returns false if a
    /// receiver downstream is gone, and the clock read when this member and the chain after
    /// it were done (`None` without metrics).
    ///
    /// The run's duration minus the time the chain downstream took is this member's busy
    /// time. The end is the reading the downstream run ended with when that run came last
    /// (the usual case: the batch that filled the next member's batch was this one's last
    /// record), so that a chain of `n` members reads the clock `n` times per batch.
    fn run_pending(&mut self, start: Option<Instant>) -> (bool, Option<Instant>) {
        let waited = self.ctx.meter.backpressured;
        if let Some(start) = start
            && self.ctx.meter.sink.is_some()
        {
            // Every record of the batch reaches the sink at or after the batch's start (and a
            // batch is short: [`chain_batch`]): measure latency there.
            let clock_us = self.ctx.meter.unix_us_at(start);
            if let Some(sink) = &mut self.ctx.meter.sink {
                sink.latency.set_clock(clock_us);
            }
        }
        let mut ok = true;
        for rec in self.pending.drain(..) {
            if !ok {
                continue;
            }
            if !rec.payload.is_watermark() {
                self.ctx.meter.records_in += 1;
                self.ctx.meter.totals.records_in += 1;
            }
            self.ctx.outputs.ran_until = None;
            ok = self.op.process(rec, &mut self.ctx);
        }
        ok = ok && self.ctx.outputs.flush(&mut self.ctx.meter);
        let Some(start) = start else {
            return (ok, None);
        };
        let end = self
            .ctx
            .outputs
            .ran_until
            .take()
            .unwrap_or_else(Instant::now);
        let downstream = self.ctx.meter.backpressured.saturating_sub(waited);
        self.ctx.meter.busy += end
            .saturating_duration_since(start)
            .saturating_sub(downstream);
        if self.ctx.meter.check_with(end, || 0) == Check::Flushed {
            self.ctx.outputs.check_chain();
        }
        (ok, Some(end))
    }

    /// A barrier, the end of input or a watermark from the upstream member (its only input,
    /// so a barrier is aligned at once). Returns false if a receiver downstream is gone.
    fn on_event(&mut self, event: Event) -> bool {
        match event {
            Event::Data(rec) => {
                self.pending.push(rec);
                let start = self.ctx.meter.now();
                self.run_pending(start).0
            }
            Event::Barrier(b) => self.timed(|m| m.op.on_aligned(b, &mut m.ctx)),
            Event::End => self.timed(|m| {
                let ok = m.op.fire_due_windows(&mut m.ctx, true)
                    && m.ctx.outputs.broadcast(Event::End, &mut m.ctx.meter);
                m.ctx.ended = ok;
                ok
            }),
        }
    }
}

/// Sends on one queue, timing a wait for room as backpressure.
fn send_one(tx: &Sender<Message>, msg: Message, meter: &mut Meter) -> bool {
    match tx.try_send(msg) {
        Ok(()) => true,
        Err(TrySendError::Full(msg)) => {
            let t = Instant::now();
            let ok = tx.send(msg).is_ok();
            let took = t.elapsed();
            meter.backpressured += took;
            meter.waited(took);
            ok
        }
        Err(TrySendError::Disconnected(_)) => false,
    }
}

/// Puts `msg` in the first downstream queue with room (round-robin start); when all are
/// full, waits for the first to have room.
fn rebalance(route: &mut Route, mut msg: Message, meter: &mut Meter) -> bool {
    let n = route.txs.len();
    if n == 1 {
        return send_one(&route.txs[0], msg, meter);
    }
    for k in 0..n {
        let i = (route.next + k) % n;
        match route.txs[i].try_send(msg) {
            Ok(()) => {
                route.next = (i + 1) % n;
                return true;
            }
            Err(TrySendError::Full(m)) => msg = m,
            Err(TrySendError::Disconnected(_)) => return false,
        }
    }
    let t = Instant::now();
    let mut sel = Select::new();
    for tx in &route.txs {
        sel.send(tx);
    }
    let oper = sel.select();
    let i = oper.index();
    let ok = oper.send(&route.txs[i], msg).is_ok();
    route.next = (i + 1) % n;
    let took = t.elapsed();
    meter.backpressured += took;
    meter.waited(took);
    ok
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
                    // Like a file sink's base path: missing parent directories are created.
                    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
                    let file = parent
                        .map_or(Ok(()), std::fs::create_dir_all)
                        .and_then(|()| OpenOptions::new().create(true).append(true).open(path))
                        .map_err(|source| RuntimeError::SinkOutput {
                            path: path.clone(),
                            source,
                        })?;
                    sink_files.insert(op.name.clone(), file);
                }
                _ => {}
            }
        }

        // One input queue per non-source subtask that heads a chain; input channels are
        // numbered per upstream subtask (upstream operators in edge order). A chain member's
        // only input channel is its upstream member.
        let chaining = options.chaining;
        let member = |name: &str| chain::is_chained_member(&spec, name, chaining);
        let mut inputs: BTreeMap<String, Vec<Queue>> = BTreeMap::new();
        let mut channels: BTreeMap<String, usize> = BTreeMap::new();
        for op in &spec.operators {
            if matches!(op.kind, OperatorKind::Source { .. }) {
                continue;
            }
            if member(&op.name) {
                channels.insert(op.name.clone(), 1);
                continue;
            }
            let cap = spec.channel_capacity;
            inputs.insert(
                op.name.clone(),
                (0..op.parallelism).map(|_| bounded(cap)).collect(),
            );
            let n: u32 = spec
                .inputs_of(&op.name)
                .iter()
                .filter_map(|u| spec.operator(u))
                .map(|u| u.parallelism)
                .sum();
            channels.insert(op.name.clone(), n as usize);
        }
        let outputs_of = |name: &str, index: u32| -> Outputs {
            let routes = spec
                .outputs_of(name)
                .into_iter()
                .filter_map(|to| {
                    let queues = inputs.get(to)?;
                    let down = spec.operator(to)?;
                    let offset: u32 = spec
                        .inputs_of(to)
                        .iter()
                        .take_while(|u| **u != name)
                        .filter_map(|u| spec.operator(u))
                        .map(|u| u.parallelism)
                        .sum();
                    Some(Route {
                        txs: queues.iter().map(|(tx, _)| tx.clone()).collect(),
                        channel: offset + index,
                        keyed: down.kind.is_keyed(),
                        key_of: key_selector(&down.kind),
                        next: index as usize,
                    })
                })
                .collect();
            Outputs {
                routes,
                max_parallelism: k,
                chain: None,
                ran_until: None,
            }
        };
        let (ack_tx, ack_rx) = crossbeam_channel::unbounded::<Ack>();
        // Job-wide channel number of each operator's first subtask (watermark senders).
        let mut channel_base = BTreeMap::new();
        let mut next_channel = 0u32;
        for op in &spec.operators {
            channel_base.insert(op.name.clone(), next_channel);
            next_channel += op.parallelism;
        }

        // Per operator: live counters, source gates, sink writers.
        let mut counters = BTreeMap::new();
        let mut gates = BTreeMap::new();
        let mut sinks: BTreeMap<String, SinkWriter> = BTreeMap::new();
        for op in &spec.operators {
            let name = &op.name;
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
            counters.insert(name.clone(), live);
            if matches!(op.kind, OperatorKind::Source { .. }) {
                let gate = Arc::new(SourceGate::new(
                    restore
                        .and_then(|s| s.metadata.sources.get(name))
                        .map_or(0, |p| p.emitted),
                ));
                gates.insert(name.clone(), gate);
            }
            if let Some(f) = sink_files.remove(name) {
                sinks.insert(
                    name.clone(),
                    Arc::new(std::sync::Mutex::new(BufWriter::new(f))),
                );
            }
        }
        // The context of subtask `index` of operator `op` sending into `outputs`.
        let context = |op: &crate::spec::OperatorSpec,
                       index: u32,
                       outputs: Outputs,
                       chained: bool|
         -> SubtaskContext {
            let name = &op.name;
            let mut meter = Meter {
                totals: OperatorCounters::default(),
                enabled: options.metrics_enabled,
                records_in: 0,
                records_out: 0,
                idle: Duration::ZERO,
                ticks: 0,
                check_every: 1,
                check_at: 1,
                last_check: Instant::now(),
                check_budget: options.flush_interval / CHECKS_PER_FLUSH,
                backpressured: Duration::ZERO,
                chained,
                busy: Duration::ZERO,
                last_flush: Instant::now(),
                next_flush: Instant::now(),
                flush_interval: options.flush_interval,
                labels: [name.clone(), index.to_string()],
                metrics: metrics.clone(),
                live: counters[name].clone(),
                sink: (options.metrics_enabled && matches!(op.kind, OperatorKind::Sink { .. }))
                    .then(|| {
                        let l = [name.as_str(), &index.to_string()];
                        SinkMeter {
                            latency: metrics.sink_latency.local(l),
                            accounted: metrics.sink_accounted.with_label_values(&l),
                            accounted_published: 0,
                            clock_uses: 0,
                        }
                    }),
                anchor: (Instant::now(), now_unix_us()),
                service: (options.metrics_enabled
                    && !matches!(op.kind, OperatorKind::Source { .. }))
                .then(|| ServiceMeter {
                    series: metrics
                        .service_time
                        .series([name.as_str(), &index.to_string()]),
                    moments: ServiceMoments::default(),
                    mark_records: 0,
                    mark_at: Instant::now(),
                    mark_clock: Duration::ZERO,
                    flushed: Duration::ZERO,
                }),
                key_groups: (options.metrics_enabled && op.kind.is_keyed()).then(|| {
                    (
                        KeyGroupLoad::new(key_group_range(index, op.parallelism, k)),
                        metrics
                            .key_group_shares
                            .series([name.as_str(), &index.to_string()]),
                    )
                }),
            };
            // Every series of the subtask exists from its start, at 0, so that a scrape before
            // its first record reads "nothing yet" rather than "no such subtask".
            meter.flush(0);
            SubtaskContext {
                operator: name.clone(),
                index,
                parallelism: op.parallelism,
                max_parallelism: k,
                cpu_us: op.cpu,
                io_us: op.io,
                control: control.clone(),
                meter,
                outputs,
                acks: ack_tx.clone(),
                panic_at: options.panic_at.clone().filter(|p| p.operator == *name),
                channel: channel_base.get(name).copied().unwrap_or(0) + index,
                ended: false,
            }
        };
        // What subtask `index` of non-source operator `op` does, with its restored state.
        let operator = |op: &crate::spec::OperatorSpec,
                        index: u32,
                        channel: u32|
         -> Result<Operator, RuntimeError> {
            let name = &op.name;
            let restored_state = || {
                let range = key_group_range(index, op.parallelism, k);
                restore
                    .and_then(|s| s.state.get(name))
                    .map(|s| s.slice(range))
                    .unwrap_or_default()
            };
            // Job-wide channel (watermark sender) of each input channel, by input index: a
            // chain member's only input is its upstream member, others are numbered per
            // upstream subtask, upstream operators in edge order (as `outputs_of` tags them).
            let base = |u: &str| channel_base.get(u).copied().unwrap_or(0);
            let ups = spec.inputs_of(name);
            let input_channels: Vec<u32> = if member(name) {
                ups.first().map(|u| base(u) + index).into_iter().collect()
            } else {
                ups.iter()
                    .filter_map(|u| spec.operator(u))
                    .flat_map(|u| (0..u.parallelism).map(move |i| (&u.name, i)))
                    .map(|(u, i)| base(u) + i)
                    .collect()
            };
            let stage =
                EventTimeStage::for_kind(&op.kind, &input_channels, channel, k, restored_state())
                    .map_err(|source| RuntimeError::State {
                    operator: name.clone(),
                    source,
                })?;
            let behaviour = match stage {
                Some(stage) => Behaviour::EventTime {
                    stage: Box::new(stage),
                    out: StageOutput::default(),
                },
                None => {
                    let owner = StateOwner {
                        job: spec.name.clone(),
                        operator: name.clone(),
                        subtask: index,
                        unloaded_gauge: Some(
                            metrics
                                .state_restored_unloaded_bytes
                                .with_label_values(&[name.as_str(), &index.to_string()]),
                        ),
                    };
                    let open = || StateBackend::open(&spec.state, &owner, k, restored_state());
                    Behaviour::for_kind(&op.kind, open, sinks.get(name).cloned()).map_err(
                        |source| RuntimeError::Backend {
                            operator: name.clone(),
                            source,
                        },
                    )?
                }
            };
            Ok(Operator { behaviour })
        };

        let mut handles = Vec::new();
        let mut spawn_failed = None;
        let mut subtasks = 0;
        // Start downstream first so receivers are ready; order does not matter for correctness.
        for name in order.iter().rev() {
            let Some(op) = spec.operator(name) else {
                continue;
            };
            if member(name) {
                continue; // runs in the thread of its chain's head
            }
            // The chain this operator heads (itself only, when nothing is chained to it).
            let mut chain_ops = vec![op];
            while let Some(next) =
                chained_successor_of(&spec, chain_ops[chain_ops.len() - 1], chaining)
            {
                chain_ops.push(next);
            }
            for index in 0..op.parallelism {
                // Build the chain from its tail: the tail sends into channels, every other
                // member into the next member.
                let mut outputs = outputs_of(&chain_ops[chain_ops.len() - 1].name, index);
                for m in chain_ops[1..].iter().rev() {
                    let ctx = context(m, index, outputs, true);
                    let op = match operator(m, index, ctx.channel) {
                        Ok(op) => op,
                        Err(e) => {
                            control.stop.store(true, Ordering::SeqCst);
                            return Err(e);
                        }
                    };
                    outputs = Outputs {
                        routes: Vec::new(),
                        max_parallelism: k,
                        ran_until: None,
                        chain: Some(Box::new(ChainMember {
                            op,
                            ctx,
                            pending: Vec::with_capacity(CHAIN_BATCH),
                            // Untimed without metrics: full batches, as before adaptation.
                            batch: if options.metrics_enabled {
                                1
                            } else {
                                CHAIN_BATCH
                            },
                        })),
                    };
                }
                let ctx = context(op, index, outputs, false);
                let body: Box<dyn FnOnce() -> Vec<SubtaskResult> + Send> = match &op.kind {
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
                            gate: gates[name].clone(),
                            keys: *keys,
                            limit: *count,
                            job_started_unix_ms,
                            salt: murmur_fmix64(name.len() as u64 ^ 0x5eed),
                        };
                        Box::new(move || source.run(ctx))
                    }
                    _ => {
                        let Some(rx) = inputs
                            .get(name)
                            .and_then(|q| q.get(index as usize))
                            .map(|(_, rx)| rx.clone())
                        else {
                            control.stop.store(true, Ordering::SeqCst);
                            return Err(RuntimeError::Graph(format!("no input for {name}")));
                        };
                        let op_task = match operator(op, index, ctx.channel) {
                            Ok(op) => op,
                            Err(e) => {
                                control.stop.store(true, Ordering::SeqCst);
                                return Err(e);
                            }
                        };
                        let task = OperatorTask {
                            rx,
                            op: op_task,
                            aligner: Aligner::new(channels.get(name).copied().unwrap_or(0)),
                        };
                        Box::new(move || task.run(ctx))
                    }
                };
                let guard_control = control.clone();
                let (op_name, label) = (name.clone(), format!("{name}-{index}"));
                let guarded =
                    move || match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
                        Ok(r) => r,
                        Err(panic) => {
                            let what = panic
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            guard_control.failed.store(true, Ordering::SeqCst);
                            guard_control.stop.store(true, Ordering::SeqCst);
                            vec![SubtaskResult {
                                operator: op_name,
                                state: None,
                                error: Some(format!("{label} panicked: {what}")),
                            }]
                        }
                    };
                match std::thread::Builder::new()
                    .name(format!("{name}-{index}"))
                    .spawn(guarded)
                {
                    Ok(h) => {
                        handles.push(h);
                        subtasks += chain_ops.len();
                    }
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
        drop(ack_tx);
        let storage = options.checkpoint_storage.clone();
        let first_id = storage.as_ref().map_or(1, |s| s.next_id()).max(
            restore
                .and_then(|s| s.metadata.checkpoint_id)
                .map_or(1, |c| c + 1),
        );
        let base_counters = spec
            .operators
            .iter()
            .map(|o| {
                (
                    o.name.clone(),
                    restore
                        .and_then(|s| s.metadata.counters.get(&o.name).copied())
                        .unwrap_or_default(),
                )
            })
            .collect();
        let coordinator = if spawn_failed.is_none() {
            let context = JobContext {
                spec: spec.clone(),
                gates: gates.iter().map(|(n, g)| (n.clone(), g.clone())).collect(),
                subtasks,
                base_counters,
                job_started_unix_ms,
                failed: control.failed.clone(),
                metrics: metrics.clone(),
                interval: spec
                    .checkpoint
                    .as_ref()
                    .filter(|_| storage.is_some())
                    .map(|c| Duration::from_secs_f64(c.interval_seconds)),
                timeout: spec
                    .checkpoint
                    .as_ref()
                    .map_or(Duration::from_secs(60), |c| {
                        Duration::from_secs_f64(c.timeout_seconds)
                    }),
                storage,
                first_id,
            };
            match Coordinator::start(context, ack_rx) {
                Ok(c) => Some(c),
                Err(e) => {
                    spawn_failed = Some(e);
                    None
                }
            }
        } else {
            None
        };
        let job = Job {
            spec,
            control,
            handles,
            counters,
            gates,
            job_started_unix_ms,
            coordinator,
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

    /// Triggers a checkpoint barrier of `kind` whose snapshot is written to `target`; the
    /// outcome (location and manifest, or the reason with the file) arrives on the returned
    /// channel once every subtask acknowledged the barrier and the snapshot is written.
    /// [`BarrierKind::Stop`] makes every subtask exit after the barrier; [`Job::join`] then.
    pub fn trigger(&self, kind: BarrierKind, target: Target) -> Receiver<Outcome> {
        match &self.coordinator {
            Some(c) => c.trigger(kind, target),
            None => {
                let (tx, rx) = bounded(1);
                let _ = tx.send(Err(Failed {
                    id: None,
                    reason: "the job has no checkpoint coordinator".into(),
                    snapshot: None,
                }));
                rx
            }
        }
    }

    /// Stop-with-savepoint into `dir` (a barrier with the stop flag), as [`Job::trigger`].
    pub fn stop_with_savepoint(
        &self,
        kind: StopKind,
        dir: std::path::PathBuf,
    ) -> Receiver<Outcome> {
        self.trigger(
            BarrierKind::Stop {
                drain: kind == StopKind::Drain,
            },
            Target::Savepoint(dir),
        )
    }

    /// Stops the sources at once without a snapshot (on failure or shutdown); operators exit
    /// as their inputs close.
    pub fn cancel(&self) {
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
    pub fn join(mut self) -> Finished {
        if let Some(mut c) = self.coordinator.take() {
            c.shutdown();
        }
        let mut state: BTreeMap<String, KeyedState> = BTreeMap::new();
        let mut errors = Vec::new();
        for h in self.handles {
            match h.join() {
                Ok(results) => {
                    for r in results {
                        if let Some(e) = r.error {
                            errors.push(e);
                        }
                        if let Some(s) = r.state {
                            state.entry(r.operator).or_default().merge(s);
                        }
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
            .gates
            .iter()
            .map(|(k, g)| {
                (
                    k.clone(),
                    SourcePosition {
                        emitted: g.emitted(),
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
            checkpoint_id: None,
            key_groups: BTreeMap::new(),
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
    acks: Sender<Ack>,
    panic_at: Option<PanicAt>,
    /// Job-wide channel number of this subtask (identifies its watermarks downstream).
    channel: u32,
    /// The subtask ended by itself (its source reached its record count, or every input
    /// channel ended) and passed the end on: its final state is reported to the checkpoint
    /// coordinator when it exits ([`AckOf::End`]).
    ended: bool,
}

impl SubtaskContext {
    /// Acknowledges barrier `b` to the coordinator with this subtask's snapshot.
    fn ack(&self, b: Barrier, state: Option<KeyedState>) {
        let _ = self.acks.send(Ack {
            of: AckOf::Barrier(b.id),
            operator: self.operator.clone(),
            subtask: self.index,
            state,
            counters: self.meter.totals,
        });
    }

    /// This subtask's result followed by its chain members' (the thread's results).
    fn finish(mut self, state: Option<KeyedState>, error: Option<String>) -> Vec<SubtaskResult> {
        let members = self.outputs.finish_chain();
        let mut results = vec![self.result(state, error)];
        results.extend(members);
        results
    }

    fn result(self, state: Option<KeyedState>, error: Option<String>) -> SubtaskResult {
        if error.is_some() {
            self.control.failed.store(true, Ordering::SeqCst);
            self.control.stop.store(true, Ordering::SeqCst);
        } else if self.ended {
            // Its final state stands in for its snapshot at every later barrier (FLIP-147).
            let _ = self.acks.send(Ack {
                of: AckOf::End,
                operator: self.operator.clone(),
                subtask: self.index,
                state: state.clone(),
                counters: self.meter.totals,
            });
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
    gate: Arc<SourceGate>,
    keys: u64,
    limit: Option<u64>,
    job_started_unix_ms: u64,
    salt: u64,
}

const SOURCE_BATCH: u64 = 64;

impl SourceTask {
    /// Wall-clock seconds since the job first started.
    fn wall(&self) -> f64 {
        wall_since(self.job_started_unix_ms)
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

    fn run(mut self, mut ctx: SubtaskContext) -> Vec<SubtaskResult> {
        let labels = [ctx.operator.clone(), ctx.index.to_string()];
        let l = [labels[0].as_str(), labels[1].as_str()];
        let limit = self.limit.unwrap_or(u64::MAX);
        let mut last_injected = 0;
        // Arrivals, backlog and rate are computed at every scrape from what this loop uses
        // (the thread may be blocked in `send` for seconds under backpressure); they exist
        // from the start and stay as they were last read once this subtask returns.
        let _figures = ctx.meter.enabled.then(|| {
            let probe = SourceFigures {
                rate: self.rate.clone(),
                gate: self.gate.clone(),
                limit,
                job_started_unix_ms: self.job_started_unix_ms,
            };
            ctx.meter
                .metrics
                .sources
                .attach(l, ctx.parallelism, Arc::new(probe))
        });
        loop {
            if ctx.control.stop.load(Ordering::Relaxed) {
                ctx.outputs.flush(&mut ctx.meter);
                break;
            }
            let now = self.wall();
            let due = due_at(&self.rate, now, limit);
            // Inject a pending barrier, or claim a batch of sequence numbers that are due.
            let (start, claimed) = match self.gate.claim(last_injected, due, limit, SOURCE_BATCH) {
                Claim::Inject(b) => {
                    last_injected = b.id;
                    if !ctx.outputs.broadcast(Event::Barrier(b), &mut ctx.meter) {
                        let err = format!("{}-{}: downstream closed", ctx.operator, ctx.index);
                        ctx.meter.flush(0);
                        return ctx.finish(None, Some(err));
                    }
                    ctx.ack(b, None);
                    if b.stops() {
                        break;
                    }
                    continue;
                }
                Claim::Finished => {
                    let last = self.nexmark.as_mut().and_then(NexmarkGenerator::end);
                    if let Some(wm) = last
                        && !ctx.outputs.send(wm, &mut ctx.meter)
                    {
                        let err = format!("{}-{}: downstream closed", ctx.operator, ctx.index);
                        ctx.meter.flush(0);
                        return ctx.finish(None, Some(err));
                    }
                    if !ctx.outputs.broadcast(Event::End, &mut ctx.meter) {
                        let err = format!("{}-{}: downstream closed", ctx.operator, ctx.index);
                        ctx.meter.flush(0);
                        return ctx.finish(None, Some(err));
                    }
                    ctx.ended = true;
                    break;
                }
                Claim::Idle => {
                    let next = self.gate.emitted();
                    if let Some(wm) = self.nexmark.as_mut().and_then(|g| g.idle(next))
                        && !ctx.outputs.send(wm, &mut ctx.meter)
                    {
                        let err = format!("{}-{}: downstream closed", ctx.operator, ctx.index);
                        ctx.meter.flush(0);
                        return ctx.finish(None, Some(err));
                    }
                    if !ctx.outputs.flush(&mut ctx.meter) {
                        let err = format!("{}-{}: downstream closed", ctx.operator, ctx.index);
                        ctx.meter.flush(0);
                        return ctx.finish(None, Some(err));
                    }
                    ctx.meter.check(|| 0);
                    ctx.outputs.check_chain();
                    let t = ctx.meter.now();
                    std::thread::sleep(Duration::from_micros(500));
                    if let Some(t) = t {
                        let took = t.elapsed();
                        ctx.meter.idle += took;
                        ctx.meter.waited(took);
                    }
                    continue;
                }
                Claim::Batch { start, n } => (start, n),
            };
            // Records in a backlog arrived earlier than now: stamp their true arrival time.
            let behind = due.saturating_sub(start);
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
            // Read once per batch: a share changed mid-batch applies from the next batch.
            let shed_share = crate::shed::share();
            let mut shed = 0u64;
            for seq in start..start + claimed {
                if shed_share > 0.0 && crate::shed::drops(seq, shed_share) {
                    shed += 1;
                    continue;
                }
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
                    crate::shed::count_shed(&l, shed);
                    let err = format!("{}-{}: downstream closed", ctx.operator, ctx.index);
                    ctx.meter.flush(0);
                    return ctx.finish(None, Some(err));
                }
                // Per record, not per batch: a send may run a slow chain or wait on a full
                // channel, and the batch then takes long.
                if ctx.meter.tick(|| 0) == Check::Flushed {
                    ctx.outputs.check_chain();
                }
            }
            crate::shed::count_shed(&l, shed);
            let wm = self
                .nexmark
                .as_mut()
                .and_then(NexmarkGenerator::after_batch);
            // More records are due already: claim them first and let the chain run when its
            // batch is full (or before a wait, a barrier or the end); else run it now, so that
            // no record waits for the next claim.
            let more_due = start + claimed < due;
            if wm.is_some_and(|wm| !ctx.outputs.send(wm, &mut ctx.meter))
                || (!more_due && !ctx.outputs.flush(&mut ctx.meter))
            {
                let err = format!("{}-{}: downstream closed", ctx.operator, ctx.index);
                ctx.meter.flush(0);
                return ctx.finish(None, Some(err));
            }
            if ctx.meter.tick(|| 0) == Check::Flushed {
                ctx.outputs.check_chain();
            }
        }
        ctx.meter.flush(0);
        ctx.finish(None, None)
    }
}

/// Wall-clock seconds since `job_started_unix_ms` (ms since the Unix epoch).
fn wall_since(job_started_unix_ms: u64) -> f64 {
    (now_unix_us() as f64 / 1e6) - (job_started_unix_ms as f64 / 1e3)
}

/// Records of a source that should have been emitted by wall second `wall_s` since the job
/// first started: the rate function's cumulative arrivals, floored, capped by `limit`.
fn due_at(rate: &RateFunction, wall_s: f64, limit: u64) -> u64 {
    rate.cumulative(wall_s).floor().min(limit as f64) as u64
}

/// What a source's metrics are computed from at scrape time ([`SourceProbe`]): the same
/// rate function, job start, `count` and gate as its subtasks' loop, shared with them.
struct SourceFigures {
    rate: Arc<RateFunction>,
    gate: Arc<SourceGate>,
    limit: u64,
    job_started_unix_ms: u64,
}

impl SourceProbe for SourceFigures {
    fn read(&self) -> SourceReading {
        let now = wall_since(self.job_started_unix_ms);
        SourceReading {
            due: due_at(&self.rate, now, self.limit),
            emitted: self.gate.emitted(),
            rate: self.rate.rate(now),
        }
    }
}

enum Behaviour {
    Map,
    Filter {
        keep: f64,
    },
    Window {
        size_us: u64,
        state: StateBackend,
        pane_end_us: u64,
        checks: u32,
    },
    Sink {
        file: Option<SinkWriter>,
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
        state: impl FnOnce() -> Result<StateBackend, StateError>,
        sink: Option<SinkWriter>,
    ) -> Result<Behaviour, StateError> {
        Ok(match kind {
            OperatorKind::Filter { keep } => Behaviour::Filter { keep: *keep },
            OperatorKind::Window { size_ms } => Behaviour::Window {
                size_us: size_ms * 1000,
                state: state()?,
                pane_end_us: 0,
                checks: 0,
            },
            OperatorKind::Sink { .. } => Behaviour::Sink { file: sink },
            OperatorKind::Map
            | OperatorKind::Source { .. }
            | OperatorKind::Select { .. }
            | OperatorKind::EventWindow { .. }
            | OperatorKind::WindowTop { .. }
            | OperatorKind::Join { .. } => Behaviour::Map,
        })
    }
}

/// Fails the subtask on a state backend error (a read or write of keyed state, or a snapshot):
/// the guard around the subtask marks the job failed, and a configured restart strategy
/// restarts it from the latest completed checkpoint, as Flink does on a state access failure.
#[cold]
fn state_failure(operator: &str, index: u32, e: &StateError) -> ! {
    panic!("{operator}-{index}: keyed state backend failed: {e}")
}

/// A non-source operator subtask: what it does with records, barriers and the end of input,
/// whether it reads its own input queue ([`OperatorTask`]) or runs in a chain
/// ([`ChainMember`]).
struct Operator {
    behaviour: Behaviour,
}

/// A non-source subtask that reads its own input queue (alone or as the head of a chain).
struct OperatorTask {
    rx: Receiver<Message>,
    op: Operator,
    aligner: Aligner,
}

impl OperatorTask {
    fn run(mut self, mut ctx: SubtaskContext) -> Vec<SubtaskResult> {
        let tick = Duration::from_millis(10);
        let mut error = None;
        // Messages of channels held back during an alignment, and those to process again
        // (before the queue) once it completed.
        let mut stash: VecDeque<Message> = VecDeque::new();
        let mut replay: VecDeque<Message> = VecDeque::new();
        let mut natural_end = false;
        // Input messages since the chain was last run (bounds how long a record waits in a
        // chain batch while the input queue never empties).
        let mut since_flush = 0usize;
        let closed =
            |ctx: &SubtaskContext| format!("{}-{}: downstream closed", ctx.operator, ctx.index);
        loop {
            let received = if let Some(m) = replay.pop_front() {
                Ok(m)
            } else {
                match self.rx.try_recv() {
                    Ok(m) => Ok(m),
                    Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
                    Err(TryRecvError::Empty) => {
                        // About to wait for input: run the rest of the chain, flush
                        // metrics, then time the wait as idle.
                        if !ctx.outputs.flush(&mut ctx.meter) {
                            error = Some(closed(&ctx));
                            break;
                        }
                        since_flush = 0;
                        ctx.meter.check(|| 0);
                        ctx.outputs.check_chain();
                        if let Some(sink) = &mut ctx.meter.sink {
                            sink.clock_uses = 0; // the clock goes stale while waiting
                        }
                        let t = ctx.meter.now();
                        let r = self.rx.recv_timeout(tick);
                        if let Some(t) = t {
                            let took = t.elapsed();
                            ctx.meter.idle += took;
                            ctx.meter.waited(took);
                        }
                        r
                    }
                }
            };
            let msg = match received {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    if !self.op.fire_due_windows(&mut ctx, false) {
                        error = Some(closed(&ctx));
                        break;
                    }
                    continue;
                }
                // Every sender is gone without `End`: an upstream failure or cancellation.
                Err(RecvTimeoutError::Disconnected) => break,
            };
            if self.aligner.is_blocked(msg.channel) {
                stash.push_back(msg);
                continue;
            }
            let aligned = match msg.event {
                Event::Data(rec) => {
                    if !rec.payload.is_watermark() {
                        ctx.meter.records_in += 1;
                        ctx.meter.totals.records_in += 1;
                    }
                    if let Some(sink) = &mut ctx.meter.sink {
                        sink.tick_clock();
                    }
                    if !self.op.process(rec, &mut ctx) {
                        error = Some(closed(&ctx));
                        break;
                    }
                    let rx = &self.rx;
                    let check = ctx.meter.tick(|| rx.len());
                    if check == Check::Flushed {
                        ctx.outputs.check_chain();
                    }
                    since_flush += 1;
                    // A slow head reads the clock every few records: run the chain then too,
                    // so that its records do not wait for a full batch of slow records.
                    if since_flush >= CHAIN_BATCH || check != Check::Skipped {
                        since_flush = 0;
                        if !ctx.outputs.flush(&mut ctx.meter) {
                            error = Some(closed(&ctx));
                            break;
                        }
                    }
                    None
                }
                Event::Barrier(b) => self.aligner.on_barrier(msg.channel, b),
                Event::End => {
                    // Nothing follows on the channel: its watermark is +∞ from now on.
                    if !self.op.end_input(msg.channel, &mut ctx) {
                        error = Some(closed(&ctx));
                        break;
                    }
                    let aligned = self.aligner.on_end(msg.channel);
                    natural_end = self.aligner.all_ended();
                    aligned
                }
            };
            if let Some(b) = aligned {
                if !self.op.on_aligned(b, &mut ctx) {
                    error = Some(closed(&ctx));
                    break;
                }
                stash.append(&mut replay);
                std::mem::swap(&mut stash, &mut replay);
                if b.stops() {
                    // Stopped at the barrier, also when the last end of input completed its
                    // alignment: nothing may be sent after it (downstream exits on it).
                    natural_end = false;
                    break;
                }
            }
            if natural_end {
                break;
            }
            if self.op.window_due() && !self.op.fire_due_windows(&mut ctx, false) {
                error = Some(closed(&ctx));
                break;
            }
        }
        // The inputs ended on their own (bounded sources finished): fire every open pane and
        // pass the end on; the job is complete.
        if error.is_none()
            && natural_end
            && (!self.op.fire_due_windows(&mut ctx, true)
                || !ctx.outputs.broadcast(Event::End, &mut ctx.meter))
        {
            error = Some(closed(&ctx));
        }
        ctx.ended = error.is_none() && natural_end;
        ctx.meter.flush(0);
        let (state, finish_error) = self.op.finish(&ctx);
        let error = error.or(finish_error);
        ctx.finish(state, error)
    }
}

impl Operator {
    /// Flushes a sink's output and hands back the subtask's final state; the error names the
    /// subtask when the sink cannot be written or the state cannot be encoded.
    fn finish(mut self, ctx: &SubtaskContext) -> (Option<KeyedState>, Option<String>) {
        let mut error = None;
        if let Err(e) = self.flush_sink() {
            error = Some(format!(
                "{}-{}: cannot write sink output: {e}",
                ctx.operator, ctx.index
            ));
        }
        let state = match &mut self.behaviour {
            Behaviour::Window { state, .. } => match state.snapshot() {
                Ok(s) => Some(s),
                Err(e) => {
                    error = Some(format!("{}-{}: {e}", ctx.operator, ctx.index));
                    None
                }
            },
            Behaviour::EventTime { stage, .. } => match stage.snapshot() {
                Ok(state) => state,
                Err(e) => {
                    error = Some(format!("{}-{}: {e}", ctx.operator, ctx.index));
                    None
                }
            },
            _ => None,
        };
        (state, error)
    }

    /// Flushes the sink's output file, if any.
    fn flush_sink(&self) -> std::io::Result<()> {
        if let Behaviour::Sink { file: Some(f), .. } = &self.behaviour
            && let Ok(mut w) = f.lock()
        {
            w.flush()?;
        }
        Ok(())
    }

    /// Input channel `input` ended: an event-time stage counts its watermark as `+∞` from now
    /// on (whatever it sent last) and fires what that completes. Returns false if a
    /// downstream receiver is gone.
    fn end_input(&mut self, input: u32, ctx: &mut SubtaskContext) -> bool {
        match &mut self.behaviour {
            Behaviour::EventTime { stage, out } => {
                stage.end_input(input, out);
                emit_stage_output(out, ctx)
            }
            _ => true,
        }
    }

    /// Every live input delivered barrier `b`: (drain: fire open panes,) snapshot, acknowledge,
    /// forward. Returns false if a downstream receiver is gone.
    fn on_aligned(&mut self, b: Barrier, ctx: &mut SubtaskContext) -> bool {
        if matches!(b.kind, BarrierKind::Stop { drain: true }) && !self.fire_due_windows(ctx, true)
        {
            return false;
        }
        if let Err(e) = self.flush_sink() {
            tracing::warn!(operator = %ctx.operator, subtask = ctx.index, error = %e, "cannot flush sink output at a barrier");
        }
        let state = match &mut self.behaviour {
            // A checkpoint without this subtask's key groups must not complete: a state error
            // fails the subtask (and so the checkpoint; the job restarts from the last one).
            Behaviour::Window { state, .. } => Some(
                state
                    .snapshot()
                    .unwrap_or_else(|e| state_failure(&ctx.operator, ctx.index, &e)),
            ),
            Behaviour::EventTime { stage, .. } => stage.snapshot().unwrap_or_else(|e| {
                tracing::error!(operator = %ctx.operator, subtask = ctx.index, error = %e, "cannot snapshot event-time state");
                None
            }),
            _ => None,
        };
        ctx.ack(b, state);
        ctx.outputs.broadcast(Event::Barrier(b), &mut ctx.meter)
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
        if let Some(p) = &ctx.panic_at
            && p.seq == rec.seq
            && !p.fired.swap(true, Ordering::SeqCst)
        {
            panic!("injected fault at record {}", rec.seq);
        }
        spend(ctx.cpu_us, ctx.io_us, rec.seq);
        match &mut self.behaviour {
            Behaviour::EventTime { stage, out } => {
                // A keyed stage's key group, computed once for its state and these counts.
                if let Some(kg) = stage.on_record(rec, out)
                    && let Some((load, _)) = &mut ctx.meter.key_groups
                {
                    load.count(kg);
                }
                emit_stage_output(out, ctx)
            }
            Behaviour::Map => ctx.outputs.send(rec, &mut ctx.meter),
            Behaviour::Filter { keep } => {
                let draw = (murmur_fmix64(rec.seq ^ 0xf1_17e5) >> 11) as f64 / (1u64 << 53) as f64;
                if draw < *keep {
                    ctx.outputs.send(rec, &mut ctx.meter)
                } else {
                    ctx.meter.totals.filtered += rec.count;
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
                if let Some((load, _)) = &mut ctx.meter.key_groups {
                    load.count(kg);
                }
                let s = state
                    .entry(kg, rec.key)
                    .unwrap_or_else(|e| state_failure(&ctx.operator, ctx.index, &e));
                s.total_count += rec.count;
                s.total_sum += rec.value;
                s.pane_count += rec.count;
                s.pane_sum += rec.value;
                s.pane_max_delay_us = s.pane_max_delay_us.max(now.saturating_sub(rec.created_us));
                true
            }
            Behaviour::Sink { file } => {
                if let Some(sink) = &mut ctx.meter.sink {
                    // Against the clock of the batch (a chained sink) or of the last
                    // `SINK_CLOCK_USES` records (`SinkMeter::tick_clock`).
                    sink.latency.observe(rec.created_us);
                }
                ctx.meter.totals.accounted += rec.count;
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
        // The result is stamped so that the sink measures the pane's largest upstream delay
        // plus the time after the window fired: latency without the buffering a window does
        // on purpose.
        let fired = state.fire_panes(&mut |key, s| {
            out.push(Record {
                seq: key,
                key,
                value: s.pane_sum,
                count: s.pane_count,
                created_us: now.saturating_sub(s.pane_max_delay_us),
                payload: Payload::None,
            });
        });
        if let Err(e) = fired {
            state_failure(&ctx.operator, ctx.index, &e);
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
        ctx.meter.totals.filtered += out.filtered;
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

/// The operator `op` chains into (see [`chain::chained_successor`]).
fn chained_successor_of<'a>(
    spec: &'a JobSpec,
    op: &crate::spec::OperatorSpec,
    enabled: bool,
) -> Option<&'a crate::spec::OperatorSpec> {
    chain::chained_successor(spec, &op.name, enabled).and_then(|n| spec.operator(n))
}
