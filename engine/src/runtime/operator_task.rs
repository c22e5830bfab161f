//! Operator subtasks: what each kind does to a record, keyed state, event-time stages, sinks.

use super::*;

pub(super) enum Behaviour {
    Map,
    Filter {
        keep: f64,
        condition: Option<crate::json_field::ConditionReader>,
    },
    Window {
        size_us: u64,
        /// `aggregates:` of the job file (`None`: results as `key,count,sum`).
        aggregates: Option<Vec<crate::aggregates::Aggregate>>,
        state: StateBackend,
        pane_end_us: u64,
        checks: u32,
        /// The wall clock (µs since the Unix epoch) records are timed against, read again
        /// every [`WINDOW_CLOCK_USES`] records, after every wait for input and whenever the
        /// window checks whether its pane ended.
        clock_us: u64,
        /// Records until the clock is read again.
        clock_uses: u32,
    },
    Sink {
        /// An at-least-once output file, shared by the operator's subtasks.
        file: Option<SinkWriter>,
        /// An exactly-once sink's writer ([`crate::sink::two_phase`]).
        writer: Option<Box<dyn TransactionalWriter>>,
    },
    /// Event-time operators (Nexmark stages, windows, joins): see [`crate::time`].
    EventTime {
        stage: Box<EventTimeStage>,
        /// Reused output buffer.
        out: StageOutput,
    },
}

pub(super) type SinkWriter = Arc<std::sync::Mutex<BufWriter<std::fs::File>>>;

/// A `window` reads the wall clock once per this many records (and after every wait for
/// input): the clock times a pane's start and its records' delay on reaching the window
/// (a latency in ms), and a record takes well under a µs.
pub(super) const WINDOW_CLOCK_USES: u32 = 16;

impl Behaviour {
    /// The behaviour of a non-source operator kind (sources run as [`SourceTask`]).
    pub(super) fn for_kind(
        kind: &OperatorKind,
        state: impl FnOnce() -> Result<StateBackend, StateError>,
        sink: Option<SinkWriter>,
        writer: Option<Box<dyn TransactionalWriter>>,
    ) -> Result<Behaviour, StateError> {
        Ok(match kind {
            OperatorKind::Filter { keep, condition } => Behaviour::Filter {
                keep: *keep,
                condition: condition
                    .clone()
                    .map(crate::json_field::ConditionReader::new),
            },
            OperatorKind::Window {
                size_ms,
                aggregates,
            } => Behaviour::Window {
                size_us: size_ms * 1000,
                aggregates: aggregates.clone(),
                state: state()?,
                pane_end_us: 0,
                checks: 0,
                clock_us: 0,
                clock_uses: 0,
            },
            OperatorKind::Sink { .. } => Behaviour::Sink { file: sink, writer },
            OperatorKind::Map
            | OperatorKind::Source { .. }
            | OperatorKind::Select { .. }
            | OperatorKind::EventWindow { .. }
            | OperatorKind::WindowTop { .. }
            | OperatorKind::Join { .. } => Behaviour::Map,
        })
    }
}

/// Whether `rec`'s JSON value (a Kafka record's) satisfies `c`.
///
/// # Errors
/// Why it cannot be evaluated: no JSON value, the field missing or of another type.
fn filter_condition(
    c: &crate::json_field::ConditionReader,
    rec: &Record,
) -> Result<bool, crate::json_field::Invalid> {
    let Payload::Kafka(k) = &rec.payload else {
        return Err(crate::json_field::Invalid::NotJson);
    };
    c.eval(k.value.as_deref())
}

/// Fails the subtask on a state backend error (a read or write of keyed state, or a snapshot):
/// the guard around the subtask marks the job failed, and a configured restart strategy
/// restarts it from the latest completed checkpoint, as Flink does on a state access failure.
#[cold]
pub(super) fn state_failure(operator: &str, index: u32, e: &StateError) -> ! {
    panic!("{operator}-{index}: keyed state backend failed: {e}")
}

/// Fails the subtask when the at-least-once file sink cannot write its file: a line dropped
/// while a checkpoint moves the sources past it would be lost for good; the job restarts from
/// its latest completed checkpoint (when a restart strategy allows) and writes it again.
#[cold]
pub(super) fn file_sink_failure(operator: &str, index: u32, e: &std::io::Error) -> ! {
    panic!("{operator}-{index}: cannot write the sink's file: {e}")
}

/// Fails the subtask when a transactional sink cannot write or pre-commit: nothing may be
/// dropped, so the job restarts from its latest completed checkpoint (when a restart strategy
/// allows) and the sink recovers what it lists.
#[cold]
pub(super) fn sink_failure(operator: &str, index: u32, e: &SinkError) -> ! {
    panic!("{operator}-{index}: sink failed: {e}")
}

/// A non-source operator subtask: what it does with records, barriers and the end of input,
/// whether it reads its own input queue ([`OperatorTask`]) or runs in a chain
/// ([`ChainMember`]).
pub(super) struct Operator {
    pub(super) behaviour: Behaviour,
}

/// A non-source subtask that reads its own input queue (alone or as the head of a chain).
pub(super) struct OperatorTask {
    pub(super) rx: Receiver<Message>,
    /// The input queue's [`Batched`] count.
    pub(super) batched: Batched,
    pub(super) op: Operator,
    pub(super) aligner: Aligner,
}

/// A queue's length in records: `rx`'s messages plus the records its batches hold beyond one
/// each.
pub(super) fn queue_len(rx: &Receiver<Message>, batched: &Batched) -> usize {
    rx.len() + batched.load(Ordering::Relaxed)
}

/// Takes `msg`, just received from a queue, off the queue's [`Batched`] count.
pub(super) fn took(batched: &Batched, msg: &Message) {
    if let Event::Batch(recs) = &msg.event {
        batched.fetch_sub(recs.len().saturating_sub(1), Ordering::Relaxed);
    }
}

impl OperatorTask {
    /// One data record (or watermark) from the input: processes it, ticks the meter and runs
    /// the chain after [`CHAIN_BATCH`] records or a clock reading. Returns false if a
    /// downstream receiver is gone.
    fn on_record(
        &mut self,
        rec: Record,
        ctx: &mut SubtaskContext,
        since_flush: &mut usize,
    ) -> bool {
        if !rec.payload.is_watermark() {
            ctx.meter.records_in += 1;
            ctx.meter.totals.records_in += 1;
        }
        if let Some(sink) = &mut ctx.meter.sink {
            sink.tick_clock();
        }
        if !self.op.process(rec, ctx) {
            return false;
        }
        let (rx, batched) = (&self.rx, &self.batched);
        let check = ctx.meter.tick(|| queue_len(rx, batched));
        if check == Check::Flushed {
            ctx.outputs.check_chain();
        }
        *since_flush += 1;
        // A slow head reads the clock every few records: run the chain then too, so that
        // its records do not wait for a full batch of slow records.
        if *since_flush >= CHAIN_BATCH || check != Check::Skipped {
            *since_flush = 0;
            if !ctx.outputs.flush(&mut ctx.meter) {
                return false;
            }
        }
        true
    }

    pub(super) fn run(mut self, mut ctx: SubtaskContext) -> Vec<SubtaskResult> {
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
                    Ok(m) => {
                        took(&self.batched, &m);
                        Ok(m)
                    }
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
                        self.op.clock_stale();
                        let t = ctx.meter.now();
                        let r = self.rx.recv_timeout(tick);
                        if let Ok(m) = &r {
                            took(&self.batched, m);
                        }
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
                    if !self.on_record(rec, &mut ctx, &mut since_flush) {
                        error = Some(closed(&ctx));
                        break;
                    }
                    None
                }
                Event::Batch(recs) => {
                    let mut ok = true;
                    for rec in recs {
                        // As if each record were its own message (the window check below
                        // runs once per message).
                        ok = self.on_record(rec, &mut ctx, &mut since_flush)
                            && (!self.op.window_due() || self.op.fire_due_windows(&mut ctx, false));
                        if !ok {
                            break;
                        }
                    }
                    if !ok {
                        error = Some(closed(&ctx));
                        break;
                    }
                    None
                }
                Event::Barrier(b) => match self.aligner.on_barrier(msg.channel, b) {
                    Alignment::Aligned(b) => Some(b),
                    Alignment::Pending => None,
                    Alignment::Superseded { abandoned } => {
                        // Checkpoint `abandoned` is given up here (it timed out upstream):
                        // the channels it held back go on, in order, before the queue.
                        tracing::warn!(
                            "{}-{}: barrier {} superseded by {} before it aligned (an upstream subtask skipped it); its checkpoint is not taken here",
                            ctx.operator,
                            ctx.index,
                            abandoned.id,
                            b.id
                        );
                        stash.append(&mut replay);
                        std::mem::swap(&mut stash, &mut replay);
                        None
                    }
                },
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
        let (state, finish_error) = self.op.finish(&mut ctx);
        let error = error.or(finish_error);
        ctx.finish(state, error)
    }
}

impl Operator {
    /// Flushes a sink's output and hands back the subtask's final state; the error names the
    /// subtask when the sink cannot be written or the state cannot be encoded.
    ///
    /// A transactional sink whose input ended by itself pre-commits what it wrote since the
    /// last barrier; the coordinator commits it once the job ended (FLIP-147). Stopped or failed,
    /// it pre-commits nothing: what it wrote since the last barrier is aborted on restore.
    pub(super) fn finish(
        mut self,
        ctx: &mut SubtaskContext,
    ) -> (Option<KeyedState>, Option<String>) {
        let mut error = None;
        if let Err(e) = self.flush_sink() {
            error = Some(format!(
                "{}-{}: cannot write sink output: {e}",
                ctx.operator, ctx.index
            ));
        }
        if let Behaviour::Sink {
            writer: Some(w), ..
        } = &mut self.behaviour
            && ctx.ended
        {
            match w.pre_commit(None) {
                Ok(c) => ctx.committables = c,
                Err(e) => error = Some(format!("{}-{}: sink failed: {e}", ctx.operator, ctx.index)),
            }
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
    pub(super) fn flush_sink(&self) -> std::io::Result<()> {
        if let Behaviour::Sink { file: Some(f), .. } = &self.behaviour {
            let mut w = f
                .lock()
                .map_err(|_| std::io::Error::other("another subtask failed while writing it"))?;
            w.flush()?;
            // On disk before the checkpoint moves the sources past these lines (a regular file:
            // /dev/null, /dev/stdout or a pipe cannot be synced, and need not be).
            let file = w.get_ref();
            if file.metadata()?.is_file() {
                file.sync_data()?;
            }
        }
        Ok(())
    }

    /// Input channel `input` ended: an event-time stage counts its watermark as `+∞` from now
    /// on (whatever it sent last) and fires what that completes. Returns false if a
    /// downstream receiver is gone.
    pub(super) fn end_input(&mut self, input: u32, ctx: &mut SubtaskContext) -> bool {
        match &mut self.behaviour {
            Behaviour::EventTime { stage, out } => {
                stage.end_input(input, out);
                emit_stage_output(out, ctx)
            }
            _ => true,
        }
    }

    /// Every live input delivered barrier `b`: (drain: fire open panes,) snapshot (a
    /// transactional sink: pre-commit), acknowledge, forward. Returns false if a downstream
    /// receiver is gone.
    pub(super) fn on_aligned(&mut self, b: Barrier, ctx: &mut SubtaskContext) -> bool {
        // A processing-time pane that has ended fires before the snapshot, even when no record
        // came after its end: its results go with this checkpoint (with the transactional
        // sink, are committed by it) rather than the next. A draining stop fires every pane.
        let drain = matches!(b.kind, BarrierKind::Stop { drain: true });
        if !self.fire_due_windows(ctx, drain) {
            return false;
        }
        // The checkpoint moves the sources past what was written: lines not on disk would be
        // lost, so the subtask (and the checkpoint) fails instead.
        if let Err(e) = self.flush_sink() {
            file_sink_failure(&ctx.operator, ctx.index, &e);
        }
        if let Behaviour::Sink {
            writer: Some(w), ..
        } = &mut self.behaviour
        {
            // The acknowledgement leaves once the pre-commit finished, possibly in the
            // background while the next records go into a new transaction.
            let held = ctx.hold_ack(b, None);
            w.pre_commit_then(b.id, Box::new(move |outcome| held.release(outcome)))
                .unwrap_or_else(|e| sink_failure(&ctx.operator, ctx.index, &e));
            return ctx.outputs.broadcast(Event::Barrier(b), &mut ctx.meter);
        }
        let state = match &mut self.behaviour {
            // A checkpoint without this subtask's key groups must not complete: a state error
            // fails the subtask (and so the checkpoint; the job restarts from the last one).
            Behaviour::Window { state, .. } => Some(
                state
                    .snapshot()
                    .unwrap_or_else(|e| state_failure(&ctx.operator, ctx.index, &e)),
            ),
            // As a window's: an acknowledgement without this subtask's state must not complete
            // the checkpoint (a restore from it would start the stage empty).
            Behaviour::EventTime { stage, .. } => stage.snapshot().unwrap_or_else(|e| {
                panic!(
                    "{}-{}: cannot snapshot event-time state: {e}",
                    ctx.operator, ctx.index
                )
            }),
            _ => None,
        };
        ctx.ack(b, state);
        ctx.outputs.broadcast(Event::Barrier(b), &mut ctx.meter)
    }

    /// Applies the operator to one record. Returns false if a downstream receiver is gone.
    pub(super) fn process(&mut self, rec: Record, ctx: &mut SubtaskContext) -> bool {
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
            Behaviour::Filter { keep, condition } => {
                let passes = match condition {
                    None => true,
                    Some(c) => match filter_condition(c, &rec) {
                        Ok(holds) => holds,
                        Err(why) => {
                            ctx.dead_letter(&rec, &why);
                            false
                        }
                    },
                };
                let draw = (murmur_fmix64(rec.seq ^ 0xf1_17e5) >> 11) as f64 / (1u64 << 53) as f64;
                if passes && draw < *keep {
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
                clock_us,
                clock_uses,
                ..
            } => {
                if *clock_uses == 0 {
                    *clock_us = now_unix_us();
                    *clock_uses = WINDOW_CLOCK_USES;
                }
                *clock_uses -= 1;
                let now = *clock_us;
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
                s.add(rec.count, rec.value, now.saturating_sub(rec.created_us));
                true
            }
            Behaviour::Sink { file, writer } => {
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
                if let Some(w) = writer {
                    w.write(&rec)
                        .unwrap_or_else(|e| sink_failure(&ctx.operator, ctx.index, &e));
                } else if let Some(f) = file {
                    let written = match f.lock() {
                        Ok(mut w) => crate::sink::file::write_line(&mut *w, &rec),
                        Err(_) => Err(std::io::Error::other(
                            "another subtask failed while writing it",
                        )),
                    };
                    if let Err(e) = written {
                        file_sink_failure(&ctx.operator, ctx.index, &e);
                    }
                }
                true
            }
        }
    }

    /// The wall clock went stale (the subtask waited for input): a `window` reads it again
    /// at its next record.
    pub(super) fn clock_stale(&mut self) {
        if let Behaviour::Window { clock_uses, .. } = &mut self.behaviour {
            *clock_uses = 0;
        }
    }

    /// Whether this is a window operator whose open pane may have ended (checks the clock
    /// at most every 64 records).
    pub(super) fn window_due(&mut self) -> bool {
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
    pub(super) fn fire_due_windows(&mut self, ctx: &mut SubtaskContext, all: bool) -> bool {
        if let Behaviour::EventTime { stage, out } = &mut self.behaviour {
            if all {
                stage.finish(out);
                return emit_stage_output(out, ctx);
            }
            return true;
        }
        let Behaviour::Window {
            size_us,
            aggregates,
            state,
            pane_end_us,
            clock_us,
            clock_uses,
            ..
        } = &mut self.behaviour
        else {
            return true;
        };
        let now = now_unix_us();
        (*clock_us, *clock_uses) = (now, WINDOW_CLOCK_USES);
        if !all && (*pane_end_us == 0 || now < *pane_end_us) {
            return true;
        }
        // The pane's end (now at the end of input, before it ended), ms: the results' event time.
        let window_end_ms = match *pane_end_us {
            0 => now,
            end => end.min(now),
        } / 1000;
        *pane_end_us = (now / *size_us + 1) * *size_us;
        let mut out = Vec::new();
        // The result is stamped so that the sink measures the pane's largest upstream delay
        // plus the time after the window fired: latency without the buffering a window does
        // on purpose.
        let fired = state.fire_panes(&mut |key, s| {
            let created_us = now.saturating_sub(s.pane_max_delay_us);
            if let Some(list) = aggregates {
                out.push(crate::aggregates::result_record(
                    list,
                    key,
                    s,
                    window_end_ms,
                    created_us,
                ));
                return;
            }
            out.push(Record {
                seq: key,
                key,
                value: s.pane_sum,
                count: s.pane_count,
                created_us,
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
pub(super) fn emit_stage_output(out: &mut StageOutput, ctx: &mut SubtaskContext) -> bool {
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
