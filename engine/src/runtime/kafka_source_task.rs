//! Kafka source subtasks: each reads the partitions [`crate::kafka::split_owner`] gives it,
//! from the offsets of the restored checkpoint or savepoint (else the earliest), and records
//! its positions in the source's gate so that a barrier's snapshot holds the next offset of
//! every partition ([`SourceGate::claim_offsets`]).
//!
//! Metrics: the source's backlog is its lag (Σ over partitions of the log end offset minus the
//! position) and its arrivals are the log end offsets, so the controller's arrival rate is the
//! producers' rate, not what the source managed to read.

use std::sync::Mutex;
use std::sync::atomic::AtomicU32;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::*;
use crate::json_field::Invalid;
use crate::kafka::batch_read::{BatchReader, Fetched};
use crate::kafka::{FieldReader, KafkaSourceSpec, LenientValueField, key_hash, owned_partitions};
use crate::payload::KafkaRecord;
use crate::time::partition_watermarks::{PartitionWatermarks, WatermarkUpdate};

/// Wall-clock ms since the Unix epoch (the idle timeout's clock).
fn now_ms() -> u64 {
    now_unix_us() / 1000
}

/// Sends what the subtask's per-partition watermarks say now (a watermark that advanced, or
/// that it is idle), if anything. Returns false if a downstream receiver is gone.
fn send_watermark(event_time: &mut Option<PartitionWatermarks>, ctx: &mut SubtaskContext) -> bool {
    let Some(update) = event_time.as_mut().and_then(|w| w.poll(now_ms())) else {
        return true;
    };
    let rec = match update {
        WatermarkUpdate::Watermark(ms) => crate::nexmark::source::watermark_record(ctx.channel, ms),
        WatermarkUpdate::Idle => crate::nexmark::source::idle_record(ctx.channel),
    };
    ctx.outputs.send(rec, &mut ctx.meter)
}

/// How often a subtask looks for new partitions of its topic.
const PARTITION_CHECK: Duration = Duration::from_secs(5);
/// The least time between two queries of the log end offsets: the subtasks of one scrape
/// share one query. Half the shortest scrape interval (`--interval` 0.2 s), so that every scrape
/// reads fresh offsets (at 0.5 s, one scrape in two read the previous scrape's offsets, and a
/// backlogged source's arrivals alternated between 0 and twice the producers' rate).
const WATERMARK_REFRESH: Duration = Duration::from_millis(100);
/// How long a log end offset query may take.
const WATERMARK_TIMEOUT: Duration = Duration::from_millis(500);
/// How long one poll waits for a record before the subtask checks barriers and stops.
const POLL_WAIT: Duration = Duration::from_millis(20);
/// The most records a subtask polls before it claims them and sends them downstream as one
/// batch (a barrier waits for at most one batch).
const KAFKA_SOURCE_BATCH: usize = 256;

/// What a Kafka source's metrics are computed from at scrape time, shared by its subtasks:
/// the gate (positions) and the log end offsets, queried by the scrape itself (at most every
/// [`WATERMARK_REFRESH`]) so that they stay current while the source threads are blocked
/// under backpressure.
pub(super) struct KafkaFigures {
    pub(super) gate: Arc<SourceGate>,
    topic: String,
    /// A client for the log end offset queries (`None` when librdkafka refused to create it).
    client: Option<BaseConsumer>,
    /// When the log end offsets were last queried.
    refreshed: Mutex<Option<Instant>>,
    /// Log end offset (the high watermark; for `read_committed` the last stable offset) per
    /// partition.
    log_end: Mutex<BTreeMap<i32, i64>>,
    /// (when, Σ log end offsets then, records/s since the previous reading).
    growth: Mutex<(Instant, u64, f64)>,
    /// The topic's partition count as the subtasks last read it (0: not yet known).
    partitions: AtomicU32,
}

impl KafkaFigures {
    /// The figures of a source reading `spec` through `gate` (restored positions included),
    /// whose topic has `partitions` partitions now: their log end offsets are read before
    /// any subtask attaches, so that a fresh start on a topic holding records counts them
    /// as backlog, not as a burst of arrivals.
    pub(super) fn new(
        gate: Arc<SourceGate>,
        spec: &KafkaSourceSpec,
        partitions: i32,
    ) -> KafkaFigures {
        let figures = KafkaFigures {
            gate,
            topic: spec.topic.clone(),
            client: spec.client_config().create().ok(),
            refreshed: Mutex::new(None),
            log_end: Mutex::new(BTreeMap::new()),
            growth: Mutex::new((Instant::now(), 0, 0.0)),
            partitions: AtomicU32::new(0),
        };
        // Every partition's log end offset before any subtask attaches: the arrivals series
        // continues from them, not from the restored positions (nor from 0 on a fresh start).
        for p in 0..partitions {
            figures.set_log_end(p, 0);
        }
        figures.set_partitions(partitions);
        figures.refresh();
        figures
    }

    /// Queries the log end offsets of every partition the source reads, unless that was done
    /// less than [`WATERMARK_REFRESH`] ago.
    fn refresh(&self) {
        let (Some(client), Ok(mut at)) = (&self.client, self.refreshed.lock()) else {
            return;
        };
        if at.is_some_and(|t| t.elapsed() < WATERMARK_REFRESH) {
            return;
        }
        *at = Some(Instant::now());
        let mut parts: std::collections::BTreeSet<i32> =
            self.gate.offsets().keys().copied().collect();
        if let Ok(m) = self.log_end.lock() {
            parts.extend(m.keys().copied());
        }
        for p in parts {
            if let Ok((_, high)) = client.fetch_watermarks(&self.topic, p, WATERMARK_TIMEOUT)
                && high >= 0
            {
                self.set_log_end(p, high);
            }
        }
    }

    /// Records the topic's partition count `n` as a subtask read it (the largest seen).
    fn set_partitions(&self, n: i32) {
        let n = u32::try_from(n).unwrap_or(0);
        self.partitions.fetch_max(n, Ordering::Relaxed);
    }

    fn set_log_end(&self, partition: i32, offset: i64) {
        if let Ok(mut m) = self.log_end.lock() {
            let e = m.entry(partition).or_insert(offset);
            *e = (*e).max(offset);
        }
    }
}

impl SourceProbe for KafkaFigures {
    fn read(&self) -> SourceReading {
        self.refresh();
        let positions = self.gate.offsets();
        let ends = self.log_end.lock().map(|m| m.clone()).unwrap_or_default();
        let mut due = 0u64;
        let mut emitted = 0u64;
        let parts: std::collections::BTreeSet<i32> =
            positions.keys().chain(ends.keys()).copied().collect();
        for p in parts {
            let pos = positions.get(&p).copied().unwrap_or(0).max(0) as u64;
            let end = ends.get(&p).copied().unwrap_or(0).max(0) as u64;
            due += end.max(pos);
            emitted += pos;
        }
        let rate = match self.growth.lock() {
            Ok(mut g) => {
                let dt = g.0.elapsed().as_secs_f64();
                if g.1 == 0 {
                    *g = (Instant::now(), due, 0.0);
                } else if dt >= 1.0 {
                    let r = due.saturating_sub(g.1) as f64 / dt;
                    *g = (Instant::now(), due, r);
                }
                g.2
            }
            Err(_) => 0.0,
        };
        let partitions = Some(self.partitions.load(Ordering::Relaxed)).filter(|&n| n > 0);
        SourceReading {
            due,
            emitted,
            rate,
            partitions,
        }
    }
}

pub(super) struct KafkaSourceTask {
    pub(super) spec: KafkaSourceSpec,
    /// The reader of `spec`'s `keyBy` and `valueField` when the source is strict
    /// ([`KafkaSourceSpec::strict`]).
    pub(super) reader: Option<FieldReader>,
    /// The `valueField` of a source that is not strict.
    pub(super) lenient_value: Option<LenientValueField>,
    pub(super) gate: Arc<SourceGate>,
    /// The consumer group offsets are committed to (for monitoring).
    pub(super) group: String,
    pub(super) figures: Arc<KafkaFigures>,
    /// The operator's synthetic per-record costs (`cpu`, `io`, µs), spent per record read.
    pub(super) cpu_us: f64,
    pub(super) io_us: f64,
    /// Whether records carry the Kafka record ([`Payload::Kafka`]): false when every
    /// downstream operator reads only the records' key, value and counters
    /// ([`kafka_payload_unused`]), so that the key and value bytes are not copied.
    pub(super) payload: bool,
    /// Its metric series ([`SubtaskContext::attach_source`]), held while it runs.
    pub(super) attached: Option<crate::metrics::AttachedSource>,
}

/// Records polled but not yet claimed (a barrier came first) and the offsets they advance.
struct Polled {
    records: Vec<Record>,
    /// With event time, per record (same order): its partition and Kafka timestamp (ms since
    /// the Unix epoch); empty without.
    stamps: Vec<(i32, Option<i64>)>,
    /// The next offset of each partition read, a run of records of one partition in one
    /// entry.
    advanced: Vec<(i32, i64)>,
    /// How long the first poll waited for a record (idle time, not work: with records at
    /// hand it returns at once).
    waited: Duration,
    /// The dead letters among the records, in order: a record's index in `records` and why
    /// it is one (a strict source's value without its `keyBy`/`valueField`,
    /// [`crate::kafka::read_fields`]).
    invalid: Vec<(usize, Invalid)>,
}

impl KafkaSourceTask {
    fn consumer(&self, ctx: &SubtaskContext) -> Result<BaseConsumer, String> {
        self.spec
            .client_config()
            .set("group.id", &self.group)
            .set(
                "client.id",
                format!("streamscale-{}-{}", ctx.operator, ctx.index),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "50")
            // librdkafka postpones a partition's next fetch by fetch.queue.backoff.ms (default
            // 1 s) once its local queue holds queued.min.messages; a source that drains the
            // queue faster then waits for the rest of that second.
            .set("fetch.queue.backoff.ms", "10")
            // No client telemetry (KIP-714) to the brokers: with it on, every poll also adds
            // the poll idle ratio to a locked histogram.
            .set("enable.metrics.push", "false")
            .create()
            .map_err(|e| format!("kafka consumer for topic {}: {e}", self.spec.topic))
    }

    /// Assigns the partitions in `owned` that are not yet in `assigned`, each from its
    /// restored (or recorded) offset, else the earliest, routed to `reader` first.
    fn assign_new(
        &self,
        consumer: &BaseConsumer,
        reader: &mut BatchReader<'_>,
        owned: &[i32],
        assigned: &mut Vec<i32>,
    ) -> Result<(), String> {
        let offsets = self.gate.offsets();
        let mut tpl = TopicPartitionList::new();
        let new: Vec<i32> = owned
            .iter()
            .copied()
            .filter(|p| !assigned.contains(p))
            .collect();
        for p in new {
            let from = offsets
                .get(&p)
                .map_or(Offset::Beginning, |&o| Offset::Offset(o));
            tpl.add_partition_offset(&self.spec.topic, p, from)
                .map_err(|e| format!("partition {p}: {e}"))?;
            reader.route(&self.spec.topic, p)?;
            // Known to the metrics from now on (its log end offset is queried at scrapes).
            self.figures.set_log_end(p, 0);
            assigned.push(p);
        }
        if tpl.count() > 0 {
            consumer
                .incremental_assign(&tpl)
                .map_err(|e| format!("assign partitions of {}: {e}", self.spec.topic))?;
        }
        Ok(())
    }

    /// Reads the next batch: up to [`KAFKA_SOURCE_BATCH`] records of the routed partitions
    /// (waiting up to [`POLL_WAIT`] for the first), after the consumer's own events (an error
    /// is logged).
    fn poll(
        &self,
        consumer: &BaseConsumer,
        reader: &mut BatchReader<'_>,
        ctx: &SubtaskContext,
    ) -> Polled {
        let mut polled = Polled {
            records: Vec::with_capacity(KAFKA_SOURCE_BATCH),
            stamps: Vec::new(),
            advanced: Vec::new(),
            waited: Duration::ZERO,
            invalid: Vec::new(),
        };
        // The last clock reading of this batch (µs since the epoch).
        let mut clock: Option<u64> = None;
        let warn = |e: &dyn std::fmt::Display| {
            tracing::warn!(operator = %ctx.operator, subtask = ctx.index, error = %e, "kafka poll");
        };
        // The consumer's queue holds its events; a message of a partition comes there only
        // if it was fetched before the partition was routed (never, as routing precedes the
        // assignment), and is taken all the same.
        match consumer.poll(Duration::ZERO) {
            Some(Ok(m)) => self.take(Fetched::of(&m), &mut clock, &mut polled),
            Some(Err(e)) => warn(&e),
            None => {}
        }
        let room = KAFKA_SOURCE_BATCH - polled.records.len();
        polled.waited = reader.read(POLL_WAIT, room, |m| match m {
            Ok(f) => self.take(f, &mut clock, &mut polled),
            Err(e) => warn(&e),
        });
        polled
    }

    /// Turns fetched message `m` into a record of `polled` (a dead letter when a strict
    /// source cannot read its fields); `clock` is the batch's last clock reading.
    fn take(&self, m: Fetched<'_>, clock: &mut Option<u64>, polled: &mut Polled) {
        let event_time = self.spec.event_time.is_some();
        let (key, value, timestamp_ms) = (m.key, m.value, m.timestamp_ms);
        // The clock is read again only for a record stamped after the last reading (a
        // record stamped before it is stamped before now too).
        let stamp = timestamp_ms
            .and_then(|t| u64::try_from(t).ok())
            .map(|t| t.saturating_mul(1000));
        let now = match (*clock, stamp) {
            (Some(now), Some(t)) if t <= now => now,
            _ => now_unix_us(),
        };
        let now = *clock.insert(now);
        let created_us = stamp.filter(|&t| t <= now).unwrap_or(now);
        let (key_num, value_num, invalid) = if let Some(reader) = &self.reader {
            match reader.read(key, value) {
                Ok((k, v)) => (k, v, None),
                Err(why) => (0, 0, Some(why)),
            }
        } else {
            let v = match (&self.lenient_value, value) {
                (Some(f), Some(v)) => f.read(v),
                _ => 0,
            };
            (key_hash(key), v, None)
        };
        let (partition, offset) = (m.partition, m.offset);
        match polled.advanced.last_mut() {
            Some((p, next)) if *p == partition => *next = (*next).max(offset + 1),
            _ => polled.advanced.push((partition, offset + 1)),
        }
        // A dead letter keeps its record (for the log line naming it).
        let payload = if self.payload || invalid.is_some() {
            Payload::Kafka(Arc::new(KafkaRecord {
                key: key.map(<[u8]>::to_vec),
                value: value.map(<[u8]>::to_vec),
                timestamp_ms,
                partition,
                offset,
            }))
        } else {
            Payload::None
        };
        if let Some(why) = invalid {
            polled.invalid.push((polled.records.len(), why));
        }
        if event_time {
            polled.stamps.push((partition, timestamp_ms));
        }
        polled.records.push(Record {
            seq: 0,
            key: key_num,
            value: value_num,
            count: 1,
            created_us,
            payload,
        });
    }

    /// Commits this subtask's positions to the consumer group (monitoring only).
    fn commit_positions(&self, consumer: &BaseConsumer, assigned: &[i32]) {
        let offsets = self.gate.offsets();
        let mut tpl = TopicPartitionList::new();
        for p in assigned {
            if let Some(&o) = offsets.get(p) {
                let _ = tpl.add_partition_offset(&self.spec.topic, *p, Offset::Offset(o));
            }
        }
        if tpl.count() > 0 {
            let _ = consumer.commit(&tpl, CommitMode::Async);
        }
    }

    pub(super) fn run(mut self, mut ctx: SubtaskContext) -> Vec<SubtaskResult> {
        let labels = [ctx.operator.clone(), ctx.index.to_string()];
        let l = [labels[0].as_str(), labels[1].as_str()];
        // Attached before the thread started ([`SubtaskContext::attach_source`]).
        let _figures = self.attached.take();
        // Setting up the consumer (metadata, assignment) waits on the brokers: idle time, not
        // reading, or the first metric window would understate the source's μ.
        let setup = ctx.meter.now();
        // Fails the subtask with `reason`, prefixed with its name.
        let fail = |mut ctx: SubtaskContext, reason: String| {
            ctx.meter.flush(0);
            let err = format!("{}-{}: {reason}", ctx.operator, ctx.index);
            ctx.finish(None, Some(err))
        };
        let consumer = match self.consumer(&ctx) {
            Ok(c) => c,
            Err(e) => return fail(ctx, e),
        };
        let topic = self.spec.topic.clone();
        let servers = self.spec.bootstrap_servers.clone();
        let mut partitions = match crate::kafka::partition_count_with(&consumer, &servers, &topic) {
            Ok(n) => n,
            Err(e) => return fail(ctx, e.to_string()),
        };
        self.figures.set_partitions(partitions);
        let mut reader = match BatchReader::new(&consumer) {
            Ok(r) => r,
            Err(e) => return fail(ctx, e),
        };
        let mut assigned = Vec::new();
        let owned = owned_partitions(&topic, partitions, ctx.index, ctx.parallelism);
        if let Err(e) = self.assign_new(&consumer, &mut reader, &owned, &mut assigned) {
            return fail(ctx, e.to_string());
        }
        // Event time: per-partition watermarks of the partitions this subtask reads now (none
        // are restored: a restore at other parallelism keeps no other subtask's watermark).
        let mut event_time = self
            .spec
            .event_time
            .map(|e| PartitionWatermarks::new(e.max_out_of_orderness_ms, e.idle_timeout_ms));
        if let Some(w) = &mut event_time {
            for p in &assigned {
                w.assign(*p, now_ms());
            }
        }
        if let Some(t) = setup {
            let took = t.elapsed();
            ctx.meter.idle += took;
            ctx.meter.waited(took);
        }
        let mut last_injected = 0;
        let mut pending: Option<Polled> = None;
        let mut last_partition_check = Instant::now();
        loop {
            if ctx.control.stop.load(Ordering::Relaxed) {
                ctx.outputs.flush(&mut ctx.meter);
                break;
            }
            if last_partition_check.elapsed() >= PARTITION_CHECK {
                last_partition_check = Instant::now();
                // Waiting for the brokers' metadata is idle time: with the brokers stalled it
                // takes up to the metadata timeout, which counted as busy made the source look
                // saturated (ρ 0.98 at 21 rec/s) and scaled it up for an outage.
                let t = ctx.meter.now();
                let counted = crate::kafka::partition_count_with(&consumer, &servers, &topic);
                if let Some(t) = t {
                    let took = t.elapsed();
                    ctx.meter.idle += took;
                    ctx.meter.waited(took);
                }
                if let Ok(n) = counted
                    && n > partitions
                {
                    partitions = n;
                    self.figures.set_partitions(n);
                    let owned = owned_partitions(&topic, partitions, ctx.index, ctx.parallelism);
                    if let Err(e) = self.assign_new(&consumer, &mut reader, &owned, &mut assigned) {
                        return fail(ctx, e.to_string());
                    }
                    if let Some(w) = &mut event_time {
                        for p in &assigned {
                            w.assign(*p, now_ms());
                        }
                    }
                    tracing::info!(operator = %ctx.operator, subtask = ctx.index, partitions, "new partitions picked up");
                }
            }
            let batch = match pending.take() {
                Some(p) => p,
                None => {
                    let t = ctx.meter.now();
                    let polled = self.poll(&consumer, &mut reader, &ctx);
                    // A poll that found nothing waited for records: idle time; one that found
                    // some waited for the first of them (its busy time is reading them).
                    if let Some(t) = t {
                        let took = if polled.records.is_empty() {
                            t.elapsed()
                        } else {
                            polled.waited
                        };
                        ctx.meter.idle += took;
                        ctx.meter.waited(took);
                    }
                    polled
                }
            };
            let n = batch.records.len() as u64;
            match self.gate.claim_offsets(last_injected, &batch.advanced, n) {
                Claim::Inject(b) => {
                    pending = Some(batch);
                    last_injected = b.id;
                    if !ctx.outputs.broadcast(Event::Barrier(b), &mut ctx.meter) {
                        return fail(ctx, "downstream closed".into());
                    }
                    ctx.ack(b, None);
                    self.commit_positions(&consumer, &assigned);
                    if b.stops() {
                        break;
                    }
                }
                Claim::Batch { start, .. } => {
                    let shed_share = crate::shed::share();
                    let mut shed = 0u64;
                    let mut invalid = batch.invalid.into_iter().peekable();
                    let mut stamps = batch.stamps.into_iter();
                    let now = now_ms();
                    // What is sent, in order, as one batch per downstream subtask.
                    let mut out = Vec::with_capacity(batch.records.len());
                    for (i, mut rec) in batch.records.into_iter().enumerate() {
                        rec.seq = start + i as u64;
                        let stamp = stamps.next();
                        if let (Some(w), Some((partition, Some(ts)))) = (&mut event_time, stamp)
                            && let Ok(ts) = u64::try_from(ts)
                        {
                            w.on_record(partition, ts, now);
                        }
                        if let Some((_, why)) = invalid.next_if(|(at, _)| *at == i) {
                            ctx.dead_letter(&rec, &why);
                            continue;
                        }
                        if shed_share > 0.0 && crate::shed::drops(rec.seq, shed_share) {
                            shed += 1;
                            continue;
                        }
                        // The synthetic per-record cost (`cpu`/`io`), for experiments.
                        if self.cpu_us > 0.0 || self.io_us > 0.0 {
                            super::cost::spend(self.cpu_us, self.io_us, rec.key);
                        }
                        out.push(rec);
                    }
                    crate::shed::count_shed(&l, shed);
                    if !ctx.outputs.send_batch(&mut out, &mut ctx.meter) {
                        return fail(ctx, "downstream closed".into());
                    }
                    if ctx.meter.tick(|| 0) == Check::Flushed {
                        ctx.outputs.check_chain();
                    }
                    if !send_watermark(&mut event_time, &mut ctx)
                        || !ctx.outputs.flush(&mut ctx.meter)
                    {
                        return fail(ctx, "downstream closed".into());
                    }
                }
                Claim::Idle | Claim::Finished => {
                    if !send_watermark(&mut event_time, &mut ctx)
                        || !ctx.outputs.flush(&mut ctx.meter)
                    {
                        return fail(ctx, "downstream closed".into());
                    }
                    ctx.meter.check(|| 0);
                    ctx.outputs.check_chain();
                }
            }
        }
        ctx.meter.flush(0);
        ctx.finish(None, None)
    }
}
