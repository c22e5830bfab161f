//! Source subtasks: records due by the rate function, emitted in batches, with their backlog and arrival counters.

use super::*;

pub(super) struct SubtaskContext {
    pub(super) operator: String,
    pub(super) index: u32,
    pub(super) parallelism: u32,
    pub(super) max_parallelism: u32,
    pub(super) cpu_us: f64,
    pub(super) io_us: f64,
    pub(super) control: Arc<Control>,
    pub(super) meter: Meter,
    pub(super) outputs: Outputs,
    pub(super) acks: Sender<Ack>,
    pub(super) panic_at: Option<PanicAt>,
    /// Job-wide channel number of this subtask (identifies its watermarks downstream).
    pub(super) channel: u32,
    /// The subtask ended by itself (its source reached its record count, or every input
    /// channel ended) and passed the end on: its final state is reported to the checkpoint
    /// coordinator when it exits ([`AckOf::End`]).
    pub(super) ended: bool,
    /// A transactional sink's pre-commits, sent with the next acknowledgement (of a barrier,
    /// or of the end).
    pub(super) committables: Vec<Committable>,
    /// Why a pre-commit this subtask's sink finished in the background failed.
    pub(super) background_failure: BackgroundFailure,
}

impl SubtaskContext {
    /// Attaches this source subtask's series (`streamscale_source_*`) to `probe` when metrics
    /// are on. Called where the job is built, before the subtask's thread runs, so that every
    /// source's series exists once the job reports running: a scrape right after a start or a
    /// restore found none for a source whose thread had not run yet, and the controller read
    /// the sample as a source without a backlog. The series stay attached until the handle is
    /// dropped (when the subtask's run ends).
    pub(super) fn attach_source(
        &self,
        probe: Arc<dyn crate::metrics::SourceProbe>,
    ) -> Option<crate::metrics::AttachedSource> {
        let index = self.index.to_string();
        self.meter.enabled.then(|| {
            self.meter.metrics.sources.attach(
                [self.operator.as_str(), index.as_str()],
                self.parallelism,
                probe,
            )
        })
    }

    /// Acknowledges barrier `b` to the coordinator with this subtask's snapshot (and a
    /// transactional sink's pre-commits, [`SubtaskContext::committables`]).
    pub(super) fn ack(&mut self, b: Barrier, state: Option<KeyedState>) {
        let _ = self.acks.send(Ack {
            of: AckOf::Barrier(b.id),
            operator: self.operator.clone(),
            subtask: self.index,
            state,
            counters: self.meter.totals,
            committables: std::mem::take(&mut self.committables),
        });
    }

    /// Barrier `b`'s acknowledgement (with snapshot `state`), to be sent once this subtask's
    /// sink finished its pre-commit ([`HeldAck::release`]).
    pub(super) fn hold_ack(&mut self, b: Barrier, state: Option<KeyedState>) -> HeldAck {
        HeldAck {
            ack: Ack {
                of: AckOf::Barrier(b.id),
                operator: self.operator.clone(),
                subtask: self.index,
                state,
                counters: self.meter.totals,
                committables: Vec::new(),
            },
            acks: self.acks.clone(),
            control: self.control.clone(),
            failure: self.background_failure.clone(),
        }
    }

    /// A dead letter: `rec` could not be read (`why`). Not emitted; counted in
    /// `streamscale_records_invalid_total` and as filtered (so the record balance holds), and
    /// logged for the 1st, 2nd, 4th, 8th, ... of the subtask.
    pub(super) fn dead_letter(&mut self, rec: &Record, why: &crate::json_field::Invalid) {
        self.meter.totals.filtered += rec.count;
        self.meter
            .live
            .filtered
            .fetch_add(rec.count, Ordering::Relaxed);
        let l = [self.meter.labels[0].as_str(), self.meter.labels[1].as_str()];
        let counter = self.meter.metrics.records_invalid.with_label_values(&l);
        counter.inc();
        let n = counter.get();
        if n.is_power_of_two() {
            let at = match &rec.payload {
                Payload::Kafka(k) => format!("partition {} offset {}", k.partition, k.offset),
                _ => format!("record {}", rec.seq),
            };
            tracing::warn!(operator = %self.operator, subtask = self.index, dead_letters = n, "dead letter ({at}): {why}");
        }
    }

    /// This subtask's result followed by its chain members' (the thread's results).
    pub(super) fn finish(
        mut self,
        state: Option<KeyedState>,
        error: Option<String>,
    ) -> Vec<SubtaskResult> {
        let members = self.outputs.finish_chain();
        let mut results = vec![self.result(state, error)];
        results.extend(members);
        results
    }

    pub(super) fn result(
        mut self,
        state: Option<KeyedState>,
        error: Option<String>,
    ) -> SubtaskResult {
        let background = self
            .background_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let error = error.or(background);
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
                committables: std::mem::take(&mut self.committables),
            });
        }
        SubtaskResult {
            operator: self.operator,
            state,
            error,
        }
    }
}

pub(super) struct SourceTask {
    /// Nexmark sources: the event generator (else synthetic keyed records).
    pub(super) nexmark: Option<NexmarkGenerator>,
    pub(super) rate: Arc<RateFunction>,
    pub(super) gate: Arc<SourceGate>,
    pub(super) keys: u64,
    pub(super) limit: Option<u64>,
    pub(super) job_started_unix_ms: u64,
    pub(super) salt: u64,
    /// Its metric series ([`SubtaskContext::attach_source`]), held while it runs.
    pub(super) attached: Option<crate::metrics::AttachedSource>,
}

pub(super) const SOURCE_BATCH: u64 = 64;

impl SourceTask {
    /// Wall-clock seconds since the job first started.
    pub(super) fn wall(&self) -> f64 {
        wall_since(self.job_started_unix_ms)
    }

    /// Wall-clock second (since job start) at which record `seq` arrived: the inverse of the
    /// cumulative arrival function, by bisection.
    pub(super) fn arrival_wall(&self, seq: u64, now: f64) -> f64 {
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

    pub(super) fn run(mut self, mut ctx: SubtaskContext) -> Vec<SubtaskResult> {
        let labels = [ctx.operator.clone(), ctx.index.to_string()];
        let l = [labels[0].as_str(), labels[1].as_str()];
        let limit = self.limit.unwrap_or(u64::MAX);
        let mut last_injected = 0;
        // Arrivals, backlog and rate are computed at every scrape from what this loop uses
        // (the thread may be blocked in `send` for seconds under backpressure, see
        // `SourceFigures`); they exist from before the thread started and stay as they were
        // last read once this subtask returns.
        let _figures = self.attached.take();
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
pub(super) fn wall_since(job_started_unix_ms: u64) -> f64 {
    (now_unix_us() as f64 / 1e6) - (job_started_unix_ms as f64 / 1e3)
}

/// Records of a source that should have been emitted by wall second `wall_s` since the job
/// first started: the rate function's cumulative arrivals, floored, capped by `limit`.
pub(super) fn due_at(rate: &RateFunction, wall_s: f64, limit: u64) -> u64 {
    rate.cumulative(wall_s).floor().min(limit as f64) as u64
}

/// What a source's metrics are computed from at scrape time ([`SourceProbe`]): the same
/// rate function, job start, `count` and gate as its subtasks' loop, shared with them.
pub(super) struct SourceFigures {
    pub(super) rate: Arc<RateFunction>,
    pub(super) gate: Arc<SourceGate>,
    pub(super) limit: u64,
    pub(super) job_started_unix_ms: u64,
}

impl SourceProbe for SourceFigures {
    fn read(&self) -> SourceReading {
        let now = wall_since(self.job_started_unix_ms);
        SourceReading {
            due: due_at(&self.rate, now, self.limit),
            emitted: self.gate.emitted(),
            rate: self.rate.rate(now),
            partitions: None,
        }
    }
}
