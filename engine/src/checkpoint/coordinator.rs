//! The checkpoint coordinator: one thread per running job that triggers checkpoints
//! (periodically and on demand), collects the subtasks' acknowledgements and writes each
//! completed checkpoint or savepoint.
//!
//! At most one checkpoint is in flight; a request arriving meanwhile waits for it. A
//! checkpoint is complete when every subtask acknowledged its barrier; it then fails on a
//! timeout, a job failure, or a storage error (counted in
//! `streamscale_checkpoints_failed_total` and logged; the job keeps running and earlier
//! checkpoints stay).
//!
//! # Checkpoints after subtasks finished (FLIP-147)
//!
//! A subtask that ends by itself (a bounded source at its record count, or an operator whose
//! input channels have all ended) reports its final state once ([`AckOf::End`]). It receives
//! no later barrier, so that report stands in for its acknowledgement of every later
//! checkpoint: the barrier is injected only into the sources still running
//! ([`SourceGate::inject_all`]), downstream alignment counts ended channels as aligned, and
//! everything a finished subtask sent precedes its end of input on each channel, hence the
//! snapshot of every subtask downstream of it. The snapshot is therefore a consistent cut in
//! which the finished subtask is at its final state: a finished source at its record count
//! (a restore emits none of its records again), a finished operator with its final keyed state
//! and counters. When every source finished, no barrier is injected and the request fails;
//! the job's final state is saved once it ended.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, select};

use super::barrier::{Barrier, BarrierKind};
use super::gate::{GatePosition, SourceGate};
use super::storage::CheckpointStorage;
use crate::clock::now_unix_us;
use crate::keygroup::key_group_range;
use crate::metrics::EngineMetrics;
use crate::savepoint::{
    FORMAT_VERSION, OperatorCounters, Savepoint, SavepointMetadata, SourcePosition,
};
use crate::sink::{Committable, TwoPhaseCommitSink};
use crate::spec::JobSpec;
use crate::state::KeyedState;

/// What an [`Ack`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOf {
    /// The snapshot at barrier `n` (the checkpoint id).
    Barrier(u64),
    /// The final state of a subtask that ended by itself (its source reached its record
    /// count, or all its input channels ended); it stands in for the subtask's snapshot at
    /// every barrier it did not acknowledge.
    End,
}

/// A subtask's acknowledgement of a barrier (its snapshot at the barrier) or its final state.
#[derive(Debug, Clone)]
pub struct Ack {
    /// What this reports.
    pub of: AckOf,
    /// Operator name.
    pub operator: String,
    /// Subtask index.
    pub subtask: u32,
    /// Keyed state at the barrier or at the end (keyed operators), shared copy-on-write with
    /// the subtask.
    pub state: Option<KeyedState>,
    /// Records this subtask received, sent, accounted and filtered since the job (re)started,
    /// up to the barrier (or the end).
    pub counters: OperatorCounters,
    /// A transactional sink's pre-commits at the barrier (or at the end of input)
    /// ([`crate::sink::two_phase`]); empty for other subtasks.
    pub committables: Vec<Committable>,
}

/// Where a completed snapshot goes.
#[derive(Debug, Clone)]
pub enum Target {
    /// A retained checkpoint in the job's checkpoint storage.
    Checkpoint,
    /// A savepoint directory (must not exist).
    Savepoint(PathBuf),
}

/// A completed and written checkpoint or savepoint.
#[derive(Debug, Clone)]
pub struct Completed {
    /// Checkpoint id.
    pub id: u64,
    /// Where it was written.
    pub location: String,
    /// Its manifest.
    pub metadata: SavepointMetadata,
}

/// Why a checkpoint or savepoint did not complete. When the snapshot was taken but could not
/// be written, it is handed back so that a stopped job can resume from it.
#[derive(Debug)]
pub struct Failed {
    /// Checkpoint id, when one was assigned.
    pub id: Option<u64>,
    /// The reason, naming the file for storage errors.
    pub reason: String,
    /// The complete snapshot, when the failure came after alignment.
    pub snapshot: Option<Box<Savepoint>>,
}

/// The answer to a trigger.
pub type Outcome = Result<Completed, Failed>;

/// A request to the coordinator.
pub(crate) struct Request {
    pub kind: BarrierKind,
    pub target: Target,
    pub reply: Option<Sender<Outcome>>,
}

/// What the coordinator needs to know about the job.
pub(crate) struct JobContext {
    pub spec: JobSpec,
    pub gates: Vec<(String, Arc<SourceGate>)>,
    pub subtasks: usize,
    pub base_counters: BTreeMap<String, OperatorCounters>,
    pub job_started_unix_ms: u64,
    pub failed: Arc<AtomicBool>,
    pub metrics: EngineMetrics,
    pub storage: Option<Arc<CheckpointStorage>>,
    pub interval: Option<Duration>,
    pub timeout: Duration,
    pub first_id: u64,
    /// Transactional sinks by operator, committed when a snapshot covering them is written.
    pub sinks: BTreeMap<String, Arc<dyn TwoPhaseCommitSink>>,
    /// Commit errors that fail the job, one line each naming the sink and the checkpoint
    /// (the job reports them when it is joined).
    pub sink_failures: Arc<Mutex<Vec<String>>>,
}

/// Handle of the coordinator thread.
pub(crate) struct Coordinator {
    requests: Option<Sender<Request>>,
    thread: Option<JoinHandle<()>>,
}

impl Coordinator {
    /// Starts the coordinator thread.
    pub fn start(ctx: JobContext, acks: Receiver<Ack>) -> std::io::Result<Coordinator> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("checkpoint-coordinator".into())
            .spawn(move || run(ctx, rx, acks))?;
        Ok(Coordinator {
            requests: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queues a request; the outcome arrives on the returned channel.
    pub fn trigger(&self, kind: BarrierKind, target: Target) -> Receiver<Outcome> {
        let (reply, rx) = crossbeam_channel::bounded(1);
        if let Some(tx) = &self.requests {
            let _ = tx.send(Request {
                kind,
                target,
                reply: Some(reply),
            });
        }
        rx
    }

    /// Stops the thread (pending requests fail) and waits for it.
    pub fn shutdown(&mut self) {
        self.requests = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Pending {
    id: u64,
    kind: BarrierKind,
    target: Target,
    reply: Option<Sender<Outcome>>,
    started: Instant,
    positions: BTreeMap<String, GatePosition>,
    /// Acknowledgements of this barrier by subtask (operator, index).
    acks: BTreeMap<(String, u32), Ack>,
}

/// Final states of the subtasks that ended by themselves, by subtask (operator, index).
type Ended = BTreeMap<(String, u32), Ack>;

/// Pre-commits of transactional sinks not committed yet, by sink operator: from subtasks that
/// ended, from checkpoints that failed after the sinks acknowledged, and from commits that
/// failed. The next snapshot written covers them and commits them.
type Uncommitted = BTreeMap<String, Vec<Committable>>;

/// Moves the pre-commits out of `acks` into `uncommitted`.
fn carry<'a>(uncommitted: &mut Uncommitted, acks: impl IntoIterator<Item = &'a mut Ack>) {
    for a in acks {
        if !a.committables.is_empty() {
            uncommitted
                .entry(a.operator.clone())
                .or_default()
                .append(&mut a.committables);
        }
    }
}

/// Commits every sink's pre-commits in `sinks` (snapshot `id`, just written, covers them);
/// returns those whose commit failed (logged), to be retried. An error that
/// [fails the job](crate::sink::SinkError::fails_job) is not retried: it is added to
/// [`JobContext::sink_failures`] and the job is marked failed (it restarts from its latest
/// checkpoint, whose recovery commits what this could not).
fn commit(ctx: &JobContext, id: u64, sinks: &Uncommitted) -> Uncommitted {
    let mut failed = Uncommitted::new();
    for (op, committables) in sinks {
        let Some(sink) = ctx.sinks.get(op) else {
            continue;
        };
        match sink.commit(committables) {
            Ok(()) => {}
            Err(e) if e.fails_job() => {
                tracing::error!(operator = %op, checkpoint = id, error = %e, "cannot commit the sink's pre-committed output; the job fails");
                ctx.sink_failures
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("{op}: after checkpoint {id} completed: {e}"));
                ctx.failed.store(true, Ordering::SeqCst);
            }
            Err(e) => {
                tracing::error!(operator = %op, checkpoint = id, error = %e, "cannot commit the sink's pre-committed output; retried at the next completed checkpoint");
                failed.insert(op.clone(), committables.clone());
            }
        }
    }
    failed
}

impl Pending {
    /// Subtasks accounted for: those that acknowledged the barrier, and those that ended
    /// without acknowledging it.
    fn covered(&self, ended: &Ended) -> usize {
        self.acks.len() + ended.keys().filter(|k| !self.acks.contains_key(*k)).count()
    }
}

fn fail(ctx: &JobContext, reply: Option<Sender<Outcome>>, failed: Failed) {
    ctx.metrics.checkpoints_failed.inc();
    tracing::warn!(checkpoint = ?failed.id, reason = %failed.reason, "checkpoint failed");
    if let Some(r) = reply {
        let _ = r.send(Err(failed));
    }
}

/// Longest wait of the coordinator's loop between looking at its timers.
const TICK: Duration = Duration::from_millis(20);

/// When the next periodic checkpoint starts, given the monotonic clock `now` and the wall clock
/// `now_unix_us` (µs since the Unix epoch) read together: at the next multiple of `interval` on
/// the wall clock, strictly after now. Processing-time windows end on the same multiples of their
/// size (`time::window`), so with an interval that is a multiple or a divisor of the window size a
/// checkpoint starts just as panes close, and their results (fired at the barrier at the latest)
/// are committed by that checkpoint instead of waiting up to a whole interval for the next one.
fn next_aligned_trigger(now: Instant, now_unix_us: u64, interval: Duration) -> Instant {
    let i = u64::try_from(interval.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    let next = (now_unix_us / i).saturating_add(1).saturating_mul(i);
    now + Duration::from_micros(next - now_unix_us)
}

fn run(ctx: JobContext, requests: Receiver<Request>, acks: Receiver<Ack>) {
    let mut next_id = ctx.first_id;
    let mut pending: Option<Pending> = None;
    let mut queued: VecDeque<Request> = VecDeque::new();
    // The periodic trigger after now, on both clocks read together.
    let next_trigger = || {
        ctx.interval
            .map(|i| next_aligned_trigger(Instant::now(), now_unix_us(), i))
    };
    let mut next_periodic = next_trigger();
    let mut open = true;
    let mut ended: Ended = BTreeMap::new();
    let mut uncommitted = Uncommitted::new();
    // The final pre-commits of a job whose subtasks all ended by themselves were committed.
    let mut final_done = false;
    // Once every subtask has exited the channel is disconnected: stop selecting on it (it
    // would be ready at once, forever).
    let mut acks = acks;
    loop {
        // At most 20 ms, and no later than the next periodic trigger.
        let wait = next_periodic.map_or(TICK, |t| {
            t.saturating_duration_since(Instant::now()).min(TICK)
        });
        let tick = crossbeam_channel::after(wait);
        select! {
            recv(requests) -> r => match r {
                Ok(req) => queued.push_back(req),
                Err(_) => open = false,
            },
            recv(acks) -> a => match a {
                Ok(ack) => on_ack(ack, &mut pending, &mut ended, &mut uncommitted),
                Err(_) => acks = crossbeam_channel::never(),
            },
            recv(tick) -> _ => {},
        }
        if !open {
            // Acknowledgements sent before the job ended are still handled.
            while let Ok(ack) = acks.try_recv() {
                on_ack(ack, &mut pending, &mut ended, &mut uncommitted);
            }
        }
        if let Some(mut p) = pending.take() {
            if p.covered(&ended) >= ctx.subtasks {
                complete(&ctx, p, &ended, &mut uncommitted);
            } else if !open || ctx.failed.load(Ordering::SeqCst) {
                carry(&mut uncommitted, p.acks.values_mut());
                let reason = if open {
                    "a subtask failed"
                } else {
                    "the job ended"
                };
                fail(
                    &ctx,
                    p.reply,
                    Failed {
                        id: Some(p.id),
                        reason: format!("checkpoint {} aborted: {reason}", p.id),
                        snapshot: None,
                    },
                );
            } else if p.started.elapsed() > ctx.timeout {
                carry(&mut uncommitted, p.acks.values_mut());
                let covered = p.covered(&ended);
                fail(
                    &ctx,
                    p.reply,
                    Failed {
                        id: Some(p.id),
                        reason: format!(
                            "checkpoint {} timed out after {:.1} s ({} of {} subtasks acknowledged or finished)",
                            p.id,
                            ctx.timeout.as_secs_f64(),
                            covered,
                            ctx.subtasks
                        ),
                        snapshot: None,
                    },
                );
            } else {
                pending = Some(p);
            }
        }
        if pending.is_none()
            && !final_done
            && ended.len() >= ctx.subtasks
            && !ctx.failed.load(Ordering::SeqCst)
        {
            // Every subtask ended by itself: the final pre-commits are committed, after a final
            // checkpoint (when there is checkpoint storage) so that a restart never replays what
            // they hold (FLIP-147).
            final_done = true;
            if !uncommitted.is_empty() {
                final_commit(&ctx, next_id, &ended, &mut uncommitted);
                next_id += 1;
            }
        }
        if !open && pending.is_none() {
            for req in queued.drain(..) {
                fail(
                    &ctx,
                    req.reply,
                    Failed {
                        id: None,
                        reason: "the job ended before the savepoint started".into(),
                        snapshot: None,
                    },
                );
            }
            return;
        }
        if pending.is_some() || !open {
            continue;
        }
        let req = match queued.pop_front() {
            Some(r) => Some(r),
            None => match next_periodic {
                Some(t) if Instant::now() >= t => {
                    next_periodic = next_trigger();
                    ctx.storage.as_ref().map(|_| Request {
                        kind: BarrierKind::Checkpoint,
                        target: Target::Checkpoint,
                        reply: None,
                    })
                }
                _ => None,
            },
        };
        let Some(req) = req else { continue };
        if ctx.failed.load(Ordering::SeqCst) {
            fail(
                &ctx,
                req.reply,
                Failed {
                    id: None,
                    reason: "a subtask failed".into(),
                    snapshot: None,
                },
            );
            continue;
        }
        let barrier = Barrier {
            id: next_id,
            kind: req.kind,
        };
        let gates: Vec<&SourceGate> = ctx.gates.iter().map(|(_, g)| g.as_ref()).collect();
        match SourceGate::inject_all(&gates, barrier) {
            Some(positions) => {
                next_id += 1;
                if barrier.stops() {
                    next_periodic = None;
                }
                tracing::debug!(checkpoint = barrier.id, kind = ?barrier.kind, "barrier injected");
                pending = Some(Pending {
                    id: barrier.id,
                    kind: req.kind,
                    target: req.target,
                    reply: req.reply,
                    started: Instant::now(),
                    positions: ctx
                        .gates
                        .iter()
                        .map(|(n, _)| n.clone())
                        .zip(positions)
                        .collect(),
                    acks: BTreeMap::new(),
                });
            }
            None => {
                if req.reply.is_some() {
                    fail(
                        &ctx,
                        req.reply,
                        Failed {
                            id: None,
                            reason: "every source already reached its record count; no barrier can be injected (the job's final state is saved once it ended)".into(),
                            snapshot: None,
                        },
                    );
                } else {
                    // Periodic checkpoints end when every source finished.
                    next_periodic = None;
                }
            }
        }
    }
}

/// Records an acknowledgement: a final state (its pre-commits wait for the next snapshot), a
/// snapshot of the pending barrier, or one that came too late (its pre-commits wait too).
fn on_ack(
    mut ack: Ack,
    pending: &mut Option<Pending>,
    ended: &mut Ended,
    uncommitted: &mut Uncommitted,
) {
    let who = (ack.operator.clone(), ack.subtask);
    match (ack.of, pending.as_mut()) {
        (AckOf::End, _) => {
            carry(uncommitted, [&mut ack]);
            ended.insert(who, ack);
        }
        (AckOf::Barrier(id), Some(p)) if id == p.id => {
            p.acks.insert(who, ack);
        }
        // Late for a checkpoint that failed meanwhile (a sink's pre-commit can finish after
        // the timeout): its pre-commits wait for the next snapshot.
        _ => carry(uncommitted, [&mut ack]),
    }
}

/// Every subtask ended by itself: writes the final state as checkpoint `id` (with checkpoint
/// storage), then commits the final pre-commits.
fn final_commit(ctx: &JobContext, id: u64, ended: &Ended, uncommitted: &mut Uncommitted) {
    if ctx.storage.is_none() {
        *uncommitted = commit(ctx, id, uncommitted);
        return;
    }
    let p = Pending {
        id,
        kind: BarrierKind::Checkpoint,
        target: Target::Checkpoint,
        reply: None,
        started: Instant::now(),
        positions: ctx
            .gates
            .iter()
            .map(|(n, g)| {
                (
                    n.clone(),
                    GatePosition {
                        emitted: g.emitted(),
                        offsets: g.offsets(),
                    },
                )
            })
            .collect(),
        acks: BTreeMap::new(),
    };
    complete(ctx, p, ended, uncommitted);
}

/// Assembles the snapshot from the acknowledgements, with the final state of each subtask
/// that ended without acknowledging the barrier.
fn assemble(
    ctx: &JobContext,
    p: &mut Pending,
    ended: &Ended,
    uncommitted: &Uncommitted,
) -> Savepoint {
    let spec = &ctx.spec;
    let mut state: BTreeMap<String, KeyedState> = BTreeMap::new();
    let mut counters = ctx.base_counters.clone();
    let finals: Vec<Ack> = ended
        .iter()
        .filter(|(k, _)| !p.acks.contains_key(*k))
        .map(|(_, a)| a.clone())
        .collect();
    let acks = std::mem::take(&mut p.acks).into_values().chain(finals);
    let mut sinks = uncommitted.clone();
    for mut ack in acks {
        carry(&mut sinks, [&mut ack]);
        let c = counters.entry(ack.operator.clone()).or_default();
        c.records_in += ack.counters.records_in;
        c.records_out += ack.counters.records_out;
        c.accounted += ack.counters.accounted;
        c.filtered += ack.counters.filtered;
        if let Some(s) = ack.state {
            state.entry(ack.operator).or_default().merge(s);
        }
    }
    let mut key_groups = BTreeMap::new();
    for op in spec.operators.iter().filter(|o| o.kind.is_keyed()) {
        state.entry(op.name.clone()).or_default();
        key_groups.insert(
            op.name.clone(),
            (0..op.parallelism)
                .map(|i| {
                    let r = key_group_range(i, op.parallelism, spec.max_parallelism);
                    [r.start, r.end]
                })
                .collect(),
        );
    }
    let metadata = SavepointMetadata {
        format_version: FORMAT_VERSION,
        job_name: spec.name.clone(),
        fingerprint: spec.fingerprint(),
        max_parallelism: spec.max_parallelism,
        parallelism: spec.parallelism(),
        job_started_unix_ms: ctx.job_started_unix_ms,
        created_unix_ms: crate::clock::now_unix_ms(),
        sources: p
            .positions
            .iter()
            .map(|(n, e)| {
                (
                    n.clone(),
                    SourcePosition {
                        emitted: e.emitted,
                        kafka_offsets: e.offsets.clone(),
                    },
                )
            })
            .collect(),
        counters,
        files: Vec::new(),
        checkpoint_id: Some(p.id),
        key_groups,
        sinks,
        manifest_crc32: None,
    };
    Savepoint { metadata, state }
}

/// Writes the snapshot of `p`, then commits the sinks' pre-commits it covers (those of
/// `uncommitted` and of the acknowledgements), then answers. When it cannot be written, its
/// pre-commits stay in `uncommitted`; so they do for a savepoint of a running job that cannot
/// also be written as a checkpoint (see the body).
fn complete(ctx: &JobContext, mut p: Pending, ended: &Ended, uncommitted: &mut Uncommitted) {
    tracing::debug!(
        acked_s = p.started.elapsed().as_secs_f64(),
        acked = p.acks.len(),
        "every subtask acknowledged the barrier or finished"
    );
    let snapshot = assemble(ctx, &mut p, ended, uncommitted);
    let covered = snapshot.metadata.sinks.clone();
    let transactions = !covered.values().all(Vec::is_empty);
    let stop = matches!(p.kind, BarrierKind::Stop { .. });
    // A savepoint with sink transactions is also written as a checkpoint before they are
    // committed: recovery restarts from the checkpoints, and one from the checkpoint before it
    // would publish again what it committed (for a stop: a process rerun with `--recover`
    // after it, as a supervisor reruns the exited engine). `None`: nothing to write.
    let as_checkpoint =
        (matches!(p.target, Target::Savepoint(_)) && transactions).then(|| match &ctx.storage {
            Some(storage) => storage
                .write_checkpoint(p.id, &snapshot)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            None => Err("no checkpoint storage configured".to_string()),
        });
    let written = match (&as_checkpoint, &ctx.storage) {
        // A stop whose checkpoint cannot be written fails before its savepoint exists, and
        // commits nothing.
        (Some(Err(e)), Some(_)) if stop => Err(format!(
            "the stop's snapshot could not be written as checkpoint {} first: {e}",
            p.id
        )),
        _ => match &p.target {
            Target::Savepoint(dir) => snapshot
                .write(dir)
                .map(|m| (dir.display().to_string(), m))
                .map_err(|e| e.to_string()),
            Target::Checkpoint => match &ctx.storage {
                Some(storage) => storage
                    .write_checkpoint(p.id, &snapshot)
                    .map_err(|e| e.to_string()),
                None => Err("no checkpoint storage configured".into()),
            },
        },
    };
    // A savepoint of a running job that could not be written as a checkpoint (or without
    // checkpoint storage) commits nothing: its pre-commits go on to the next snapshot written,
    // which commits them (a restore from the savepoint itself commits them too). Flink (since
    // 1.15) never commits on such a savepoint; here that would hold a sink subtask's producers
    // until the next checkpoint, and a few savepoints in a row would exhaust them.
    let unrecoverable = !stop
        && match &as_checkpoint {
            Some(Err(e)) => {
                if ctx.storage.is_some() {
                    tracing::warn!(checkpoint = p.id, error = %e, "the savepoint could not be written as a checkpoint too: its sinks' transactions wait for the next checkpoint");
                }
                true
            }
            _ => false,
        };
    match written {
        Ok((location, metadata)) if unrecoverable => {
            *uncommitted = covered;
            let secs = p.started.elapsed().as_secs_f64();
            ctx.metrics.checkpoints_completed.inc();
            tracing::info!(checkpoint = p.id, kind = ?p.kind, %location, seconds = secs, "savepoint completed (its sinks' transactions are committed by the next checkpoint)");
            if let Some(r) = p.reply {
                let _ = r.send(Ok(Completed {
                    id: p.id,
                    location,
                    metadata,
                }));
            }
        }
        Ok((location, metadata)) => {
            *uncommitted = commit(ctx, p.id, &covered);
            let secs = p.started.elapsed().as_secs_f64();
            let bytes: u64 = metadata.files.iter().map(|f| f.bytes).sum();
            ctx.metrics.checkpoints_completed.inc();
            ctx.metrics.checkpoint_duration.set(secs);
            ctx.metrics.checkpoint_size.set(bytes as f64);
            tracing::info!(checkpoint = p.id, kind = ?p.kind, %location, seconds = secs, bytes, "checkpoint completed");
            if let Some(r) = p.reply {
                let _ = r.send(Ok(Completed {
                    id: p.id,
                    location,
                    metadata,
                }));
            }
        }
        Err(reason) => {
            *uncommitted = covered;
            fail(
                ctx,
                p.reply,
                Failed {
                    id: Some(p.id),
                    reason,
                    snapshot: Some(Box::new(snapshot)),
                },
            )
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::checkpoint::gate::Claim;

    const YAML: &str = "name: c
operators:
  - { name: s, kind: source, keys: 4, count: 10, rate: { constant: 1.0 } }
  - { name: t, kind: source, keys: 4, count: 10, rate: { constant: 1.0 } }
  - { name: m, kind: map }
  - { name: k, kind: sink }
edges:
  - { from: s, to: m }
  - { from: t, to: m }
  - { from: m, to: k }
";

    #[test]
    fn periodic_checkpoints_start_on_multiples_of_the_interval_on_the_wall_clock() {
        let now = Instant::now();
        let second = Duration::from_secs(1);
        // 5.25 s past the epoch: the next whole second.
        assert_eq!(
            next_aligned_trigger(now, 5_250_000, second),
            now + Duration::from_millis(750)
        );
        // On a multiple: the next one, not now.
        assert_eq!(next_aligned_trigger(now, 5_000_000, second), now + second);
        let half = Duration::from_millis(500);
        assert_eq!(
            next_aligned_trigger(now, 7_999_999, half),
            now + Duration::from_micros(1)
        );
        assert_eq!(
            next_aligned_trigger(now, 8_000_001, half),
            now + Duration::from_micros(499_999)
        );
    }

    fn ack(of: AckOf, operator: &str, records_in: u64, records_out: u64) -> Ack {
        Ack {
            of,
            operator: operator.into(),
            subtask: 0,
            state: None,
            counters: OperatorCounters {
                records_in,
                records_out,
                ..OperatorCounters::default()
            },
            committables: Vec::new(),
        }
    }

    /// The context of a job of [`YAML`] (4 subtasks) with gates `s` and `t`: no storage, no
    /// sinks, a 30 s timeout.
    fn context(s: Arc<SourceGate>, t: Arc<SourceGate>) -> JobContext {
        JobContext {
            spec: JobSpec::from_yaml(YAML).unwrap(),
            gates: vec![("s".into(), s), ("t".into(), t)],
            subtasks: 4,
            base_counters: BTreeMap::new(),
            job_started_unix_ms: 0,
            failed: Arc::new(AtomicBool::new(false)),
            metrics: EngineMetrics::new().unwrap(),
            storage: None,
            interval: None,
            timeout: Duration::from_secs(30),
            first_id: 1,
            sinks: BTreeMap::new(),
            sink_failures: Arc::default(),
        }
    }

    /// A coordinator for [`context`]`(s, t)`, and its ack sender.
    fn start(s: Arc<SourceGate>, t: Arc<SourceGate>) -> (Coordinator, Sender<Ack>) {
        let ctx = context(s, t);
        let (tx, rx) = crossbeam_channel::unbounded();
        (Coordinator::start(ctx, rx).unwrap(), tx)
    }

    fn finished_gate(count: u64) -> Arc<SourceGate> {
        let g = SourceGate::new(count);
        assert_eq!(g.claim(0, count, count, 64), Claim::Finished);
        Arc::new(g)
    }

    #[test]
    fn finished_subtasks_final_state_completes_a_checkpoint_and_an_ack_wins_over_it() {
        let dir = tempfile::tempdir().unwrap();
        let (s, t) = (Arc::new(SourceGate::new(4)), finished_gate(10));
        let (c, acks) = start(s.clone(), t.clone());
        // `t` reached its count and ended; so did `m`, but it also acknowledges the barrier
        // (its inputs ended after it), and that snapshot is the one taken.
        acks.send(ack(AckOf::End, "t", 0, 10)).unwrap();
        acks.send(ack(AckOf::End, "m", 3, 3)).unwrap();
        let out = c.trigger(
            BarrierKind::Savepoint,
            Target::Savepoint(dir.path().join("sp")),
        );
        // Only the running source gets the barrier (the coordinator injects asynchronously).
        let b = Barrier {
            id: 1,
            kind: BarrierKind::Savepoint,
        };
        let until = Instant::now() + Duration::from_secs(10);
        while s.claim(0, 4, 10, 64) != Claim::Inject(b) {
            assert!(Instant::now() < until, "no barrier on the running source");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(t.claim(0, 10, 10, 64), Claim::Finished);
        acks.send(ack(AckOf::Barrier(1), "s", 0, 4)).unwrap();
        acks.send(ack(AckOf::Barrier(1), "m", 14, 14)).unwrap();
        // Not complete yet: the sink neither acknowledged nor ended.
        assert!(out.recv_timeout(Duration::from_millis(200)).is_err());
        acks.send(ack(AckOf::End, "k", 14, 0)).unwrap();
        let done = out.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        let m = &done.metadata;
        assert_eq!(m.checkpoint_id, Some(1));
        assert_eq!(m.sources["s"].emitted, 4);
        assert_eq!(m.sources["t"].emitted, 10);
        assert_eq!(m.counters["s"].records_out, 4);
        assert_eq!(m.counters["t"].records_out, 10);
        assert_eq!(
            m.counters["m"].records_in, 14,
            "the ack, not the final state"
        );
        assert_eq!(m.counters["k"].records_in, 14);
    }

    /// A mock two-phase sink whose commit fails with `error` (`fails_job` or not).
    #[derive(Debug)]
    struct MockFailingSink {
        job_failing: bool,
        commits: std::sync::atomic::AtomicU64,
    }

    impl TwoPhaseCommitSink for MockFailingSink {
        fn create_writer(
            &self,
            _: u32,
            _: u32,
            _: &str,
        ) -> Result<Box<dyn crate::sink::TransactionalWriter>, crate::sink::SinkError> {
            unreachable!("the coordinator creates no writer")
        }
        fn commit(&self, _: &[Committable]) -> Result<(), crate::sink::SinkError> {
            self.commits.fetch_add(1, Ordering::SeqCst);
            Err(if self.job_failing {
                crate::sink::SinkError::Uncommittable(Box::new(crate::sink::Uncommittable {
                    sink: "k (kafka topic t)".into(),
                    transaction: "p-0-1".into(),
                    checkpoint: "4".into(),
                    commit: "fenced".into(),
                    recover: "timed out".into(),
                }))
            } else {
                crate::sink::SinkError::External {
                    sink: "k".into(),
                    action: "commit",
                    reason: "busy".into(),
                }
            })
        }
        fn recover(&self, _: &[Committable]) -> Result<(), crate::sink::SinkError> {
            Ok(())
        }
    }

    /// Every subtask ends with a pre-commit on sink `k`, whose commit fails: an error that
    /// fails the job marks it failed with one line naming the sink, the transaction and the
    /// checkpoint; another error does neither (it is retried).
    #[test]
    fn a_commit_error_that_fails_the_job_fails_it() {
        for job_failing in [true, false] {
            let failed = Arc::new(AtomicBool::new(false));
            let sink_failures: Arc<Mutex<Vec<String>>> = Arc::default();
            let sink = Arc::new(MockFailingSink {
                job_failing,
                commits: Default::default(),
            });
            let ctx = JobContext {
                failed: failed.clone(),
                sinks: BTreeMap::from([(
                    "k".to_string(),
                    sink.clone() as Arc<dyn TwoPhaseCommitSink>,
                )]),
                sink_failures: sink_failures.clone(),
                ..context(finished_gate(10), finished_gate(10))
            };
            let (tx, rx) = crossbeam_channel::unbounded();
            let mut c = Coordinator::start(ctx, rx).unwrap();
            for op in ["s", "t", "m"] {
                tx.send(ack(AckOf::End, op, 0, 0)).unwrap();
            }
            let mut k = ack(AckOf::End, "k", 0, 0);
            k.committables = vec![serde_json::json!({"transactionalId": "p-0-1"})];
            tx.send(k).unwrap();
            let until = Instant::now() + Duration::from_secs(10);
            while sink.commits.load(Ordering::SeqCst) == 0 {
                assert!(Instant::now() < until, "no commit");
                std::thread::sleep(Duration::from_millis(5));
            }
            c.shutdown();
            let lines = sink_failures.lock().unwrap().clone();
            if job_failing {
                assert_eq!(lines.len(), 1, "{lines:?}");
                assert!(
                    lines[0].starts_with("k: after checkpoint 1 completed: k (kafka topic t): transaction p-0-1 of checkpoint 4 could not be committed (fenced) nor written again (timed out)"),
                    "{}",
                    lines[0]
                );
            } else {
                assert!(lines.is_empty(), "{lines:?}");
                assert!(!failed.load(Ordering::SeqCst));
            }
        }
    }

    /// Sink `k` acknowledges savepoint 1 only after it timed out (its pre-commit finished
    /// late): the committable is not dropped but goes into savepoint 2's manifest.
    #[test]
    fn a_late_acknowledgement_s_pre_commits_go_into_the_next_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let (s, t) = (Arc::new(SourceGate::new(0)), finished_gate(10));
        let ctx = JobContext {
            timeout: Duration::from_millis(100),
            ..context(s.clone(), t)
        };
        let (acks, rx) = crossbeam_channel::unbounded();
        let c = Coordinator::start(ctx, rx).unwrap();
        acks.send(ack(AckOf::End, "t", 0, 10)).unwrap();
        let savepoint = |id: u64| {
            let out = c.trigger(
                BarrierKind::Savepoint,
                Target::Savepoint(dir.path().join(format!("sp-{id}"))),
            );
            let b = Barrier {
                id,
                kind: BarrierKind::Savepoint,
            };
            let until = Instant::now() + Duration::from_secs(10);
            while s.claim(id - 1, 0, 100, 64) != Claim::Inject(b) {
                assert!(Instant::now() < until, "no barrier {id}");
                std::thread::sleep(Duration::from_millis(5));
            }
            for op in ["s", "m"] {
                acks.send(ack(AckOf::Barrier(id), op, 0, 0)).unwrap();
            }
            out
        };
        let first = savepoint(1);
        let failed = first.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(failed.unwrap_err().reason.contains("timed out"));
        let mut late = ack(AckOf::Barrier(1), "k", 0, 0);
        late.committables = vec![serde_json::json!({"transactionalId": "p-0-0"})];
        acks.send(late).unwrap();
        let second = savepoint(2);
        acks.send(ack(AckOf::Barrier(2), "k", 0, 0)).unwrap();
        let done = second
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap();
        assert_eq!(done.metadata.checkpoint_id, Some(2));
        assert_eq!(
            done.metadata.sinks.get("k"),
            Some(&vec![serde_json::json!({"transactionalId": "p-0-0"})])
        );
    }

    /// A two-phase sink that records what it commits.
    #[derive(Debug, Default)]
    struct MockRecordingSink {
        committed: Mutex<Vec<Committable>>,
    }

    impl TwoPhaseCommitSink for MockRecordingSink {
        fn create_writer(
            &self,
            _: u32,
            _: u32,
            _: &str,
        ) -> Result<Box<dyn crate::sink::TransactionalWriter>, crate::sink::SinkError> {
            unreachable!("the coordinator creates no writer")
        }
        fn commit(&self, c: &[Committable]) -> Result<(), crate::sink::SinkError> {
            self.committed.lock().unwrap().extend_from_slice(c);
            Ok(())
        }
        fn recover(&self, _: &[Committable]) -> Result<(), crate::sink::SinkError> {
            Ok(())
        }
    }

    /// A coordinator of [`context`] with a running source `s`, a finished `t` (acknowledged),
    /// sink `k` recording its commits, and checkpoint storage `storage`.
    struct SinkJob {
        c: Coordinator,
        s: Arc<SourceGate>,
        acks: Sender<Ack>,
        sink: Arc<MockRecordingSink>,
        dir: tempfile::TempDir,
    }

    impl SinkJob {
        fn start(storage: Option<Arc<CheckpointStorage>>) -> SinkJob {
            let sink = Arc::new(MockRecordingSink::default());
            let (s, t) = (Arc::new(SourceGate::new(0)), finished_gate(10));
            let ctx = JobContext {
                sinks: BTreeMap::from([(
                    "k".to_string(),
                    sink.clone() as Arc<dyn TwoPhaseCommitSink>,
                )]),
                storage,
                ..context(s.clone(), t)
            };
            let (acks, rx) = crossbeam_channel::unbounded();
            let c = Coordinator::start(ctx, rx).unwrap();
            acks.send(ack(AckOf::End, "t", 0, 10)).unwrap();
            SinkJob {
                c,
                s,
                acks,
                sink,
                dir: tempfile::tempdir().unwrap(),
            }
        }

        /// Snapshot `id` of `kind` into `sp-ID`, acknowledged by every subtask, the sink's
        /// with a pre-commit of transaction `tx`.
        fn snapshot(&self, id: u64, kind: BarrierKind, tx: &str) -> Completed {
            self.try_snapshot(id, kind, tx).unwrap()
        }

        /// [`SinkJob::snapshot`]'s outcome, which may be a failure.
        fn try_snapshot(&self, id: u64, kind: BarrierKind, tx: &str) -> Outcome {
            let target = Target::Savepoint(self.dir.path().join(format!("sp-{id}")));
            let out = self.c.trigger(kind, target);
            let b = Barrier { id, kind };
            let until = Instant::now() + Duration::from_secs(10);
            while self.s.claim(id - 1, 0, 100, 64) != Claim::Inject(b) {
                assert!(Instant::now() < until, "no barrier {id}");
                std::thread::sleep(Duration::from_millis(5));
            }
            for op in ["s", "m"] {
                self.acks.send(ack(AckOf::Barrier(id), op, 0, 0)).unwrap();
            }
            let mut k = ack(AckOf::Barrier(id), "k", 0, 0);
            k.committables = vec![serde_json::json!({ "transactionalId": tx })];
            self.acks.send(k).unwrap();
            out.recv_timeout(Duration::from_secs(10)).unwrap()
        }

        fn committed(&self) -> Vec<Committable> {
            self.sink.committed.lock().unwrap().clone()
        }
    }

    /// Without checkpoint storage a savepoint of a running job commits nothing (recovery would
    /// publish its results again); the next snapshot that commits (here a stop-with-savepoint)
    /// covers its pre-commits and commits them.
    #[test]
    fn a_savepoint_of_a_running_job_commits_nothing_and_the_next_snapshot_does() {
        let job = SinkJob::start(None);
        let first = job.snapshot(1, BarrierKind::Savepoint, "p-0-1");
        assert_eq!(
            first.metadata.sinks.get("k"),
            Some(&vec![serde_json::json!({"transactionalId": "p-0-1"})]),
            "restoring the savepoint itself commits its pre-commits"
        );
        assert!(job.committed().is_empty());
        let _ = job.snapshot(2, BarrierKind::Stop { drain: false }, "p-0-2");
        assert_eq!(
            job.committed(),
            vec![
                serde_json::json!({"transactionalId": "p-0-1"}),
                serde_json::json!({"transactionalId": "p-0-2"})
            ]
        );
    }

    /// With checkpoint storage, a savepoint of a running job is also written as a checkpoint,
    /// then commits: a restart from the checkpoints starts after it.
    #[test]
    fn a_savepoint_written_as_a_checkpoint_too_commits_at_once() {
        let chk = tempfile::tempdir().unwrap();
        let storage = Arc::new(CheckpointStorage::new(chk.path(), 3));
        let job = SinkJob::start(Some(storage.clone()));
        let _ = job.snapshot(1, BarrierKind::Savepoint, "p-0-1");
        assert_eq!(storage.completed_ids().unwrap(), vec![1]);
        assert_eq!(
            job.committed(),
            vec![serde_json::json!({"transactionalId": "p-0-1"})]
        );
    }

    /// A stop-with-savepoint is written as a checkpoint before it commits: an engine restarted
    /// with `--recover` after the stop goes on from it, not from the checkpoint before, whose
    /// later results the stop committed.
    #[test]
    fn a_stop_with_savepoint_is_written_as_a_checkpoint_before_it_commits() {
        let chk = tempfile::tempdir().unwrap();
        let storage = Arc::new(CheckpointStorage::new(chk.path(), 3));
        let job = SinkJob::start(Some(storage.clone()));
        let done = job.snapshot(1, BarrierKind::Stop { drain: false }, "p-0-1");
        assert_eq!(storage.completed_ids().unwrap(), vec![1]);
        assert_eq!(
            job.committed(),
            vec![serde_json::json!({"transactionalId": "p-0-1"})]
        );
        assert!(
            std::path::Path::new(&done.location).exists(),
            "{}",
            done.location
        );
    }

    /// A stop whose snapshot cannot be written as a checkpoint fails before its savepoint is
    /// written and commits nothing (its records come again after the job resumes).
    #[test]
    fn a_stop_that_cannot_be_written_as_a_checkpoint_fails_and_commits_nothing() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let storage = Arc::new(CheckpointStorage::new(file.path().join("chk"), 3));
        let job = SinkJob::start(Some(storage));
        let failed = job
            .try_snapshot(1, BarrierKind::Stop { drain: false }, "p-0-1")
            .unwrap_err();
        assert!(
            failed.reason.contains("written as checkpoint 1 first"),
            "{}",
            failed.reason
        );
        assert!(job.committed().is_empty());
        assert!(!job.dir.path().join("sp-1").exists());
    }

    #[test]
    fn no_barrier_once_every_source_finished() {
        let dir = tempfile::tempdir().unwrap();
        let (c, _acks) = start(finished_gate(10), finished_gate(10));
        let out = c.trigger(
            BarrierKind::Savepoint,
            Target::Savepoint(dir.path().join("sp")),
        );
        let failed = out
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .unwrap_err();
        assert!(
            failed
                .reason
                .contains("every source already reached its record count"),
            "{}",
            failed.reason
        );
        assert!(!dir.path().join("sp").exists());
    }
}
