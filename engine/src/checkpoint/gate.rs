//! The barrier injection point of one source operator: its position (the next sequence
//! number) shared by its subtasks, and the barrier they must inject.
//!
//! Subtasks claim batches of sequence numbers under the gate's lock; the coordinator sets a
//! barrier under the same lock and reads the position. A subtask therefore emits every record
//! below the position before it injects the barrier (it sends its last batch before claiming
//! again) and none at or above it before the barrier (any later claim first sees the barrier).
//! Records are a pure function of the sequence number, so a restored source regenerates
//! exactly the records after the checkpointed position.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::barrier::Barrier;

/// Shared position and pending barrier of one source operator.
#[derive(Debug)]
pub struct SourceGate {
    state: Mutex<GateState>,
    /// Mirror of the position for metrics and the live view (records claimed so far).
    emitted: AtomicU64,
}

#[derive(Debug)]
struct GateState {
    next: u64,
    barrier: Option<Barrier>,
    finished: bool,
    /// Kafka sources: the next offset to read of every partition read so far.
    offsets: BTreeMap<i32, i64>,
}

/// A source's position at a barrier: records emitted, and for a Kafka source the next
/// offset of every partition.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GatePosition {
    /// Records emitted in total.
    pub emitted: u64,
    /// Kafka: next offset per partition.
    pub offsets: BTreeMap<i32, i64>,
}

/// What a source subtask does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// Inject this barrier on every output before anything else.
    Inject(Barrier),
    /// Emit sequence numbers `start..start + n`.
    Batch {
        /// First sequence number.
        start: u64,
        /// How many.
        n: u64,
    },
    /// Nothing is due yet.
    Idle,
    /// The source reached its record count.
    Finished,
}

impl SourceGate {
    /// A gate at position `next` (0, or the restored position).
    pub fn new(next: u64) -> SourceGate {
        SourceGate::with_offsets(next, BTreeMap::new())
    }

    /// A Kafka source's gate: `next` records emitted so far, `offsets` the next offset to
    /// read per partition (empty, or the restored positions).
    pub fn with_offsets(next: u64, offsets: BTreeMap<i32, i64>) -> SourceGate {
        SourceGate {
            state: Mutex::new(GateState {
                next,
                barrier: None,
                finished: false,
                offsets,
            }),
            emitted: AtomicU64::new(next),
        }
    }

    /// Records claimed so far (the position).
    pub fn emitted(&self) -> u64 {
        self.emitted.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A subtask's next step: a barrier newer than `last_injected` first, else a batch of at
    /// most `batch` of the `due` records (capped by `limit`).
    pub fn claim(&self, last_injected: u64, due: u64, limit: u64, batch: u64) -> Claim {
        let mut st = self.lock();
        if let Some(b) = st.barrier
            && b.id > last_injected
        {
            return Claim::Inject(b);
        }
        if st.next >= limit {
            st.finished = true;
            return Claim::Finished;
        }
        let due = due.min(limit);
        if st.next >= due {
            return Claim::Idle;
        }
        let start = st.next;
        let n = (due - start).min(batch);
        st.next += n;
        self.emitted.store(st.next, Ordering::SeqCst);
        Claim::Batch { start, n }
    }

    /// A Kafka source subtask's next step: a barrier newer than `last_injected` first
    /// ([`Claim::Inject`]; nothing is recorded), else it records `advanced` (partition, next
    /// offset after the records it is about to emit) and `n` more records emitted, and
    /// returns [`Claim::Batch`] (or [`Claim::Idle`] when `n` is 0). The subtask emits the
    /// batch before it claims again, so a barrier's offsets cover exactly the records sent
    /// before it.
    pub fn claim_offsets(&self, last_injected: u64, advanced: &[(i32, i64)], n: u64) -> Claim {
        let mut st = self.lock();
        if let Some(b) = st.barrier
            && b.id > last_injected
        {
            return Claim::Inject(b);
        }
        for &(p, next) in advanced {
            let e = st.offsets.entry(p).or_insert(next);
            *e = (*e).max(next);
        }
        if n == 0 {
            return Claim::Idle;
        }
        let start = st.next;
        st.next += n;
        self.emitted.store(st.next, Ordering::SeqCst);
        Claim::Batch { start, n }
    }

    /// The next offset to read per partition (Kafka sources; empty for others).
    pub fn offsets(&self) -> BTreeMap<i32, i64> {
        self.lock().offsets.clone()
    }

    /// Sets `barrier` on every gate whose source is still running, at once, and returns every
    /// gate's position (in `gates` order), or `None` (nothing set) when every source already
    /// finished (the job's final state is then its last snapshot).
    ///
    /// A finished gate (a subtask claimed [`Claim::Finished`]: the position reached the
    /// record count) gets no barrier: its subtasks end without claiming again, and its
    /// position, the record count, is its final state (FLIP-147, "checkpoints after tasks
    /// finished"). Its remaining subtasks send the end of input instead of the barrier, which
    /// downstream alignment counts as aligned ([`super::barrier::Aligner`]).
    pub fn inject_all(gates: &[&SourceGate], barrier: Barrier) -> Option<Vec<GatePosition>> {
        let mut guards: Vec<_> = gates.iter().map(|g| g.lock()).collect();
        if !guards.is_empty() && guards.iter().all(|g| g.finished) {
            return None;
        }
        Some(
            guards
                .iter_mut()
                .map(|g| {
                    if !g.finished {
                        g.barrier = Some(barrier);
                    }
                    GatePosition {
                        emitted: g.next,
                        offsets: g.offsets.clone(),
                    }
                })
                .collect(),
        )
    }

    /// Whether a subtask found the source at its record count.
    pub fn is_finished(&self) -> bool {
        self.lock().finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::barrier::BarrierKind;

    fn emitted(p: Option<Vec<GatePosition>>) -> Option<Vec<u64>> {
        p.map(|v| v.into_iter().map(|g| g.emitted).collect())
    }

    #[test]
    fn kafka_offsets_split_at_the_barrier() {
        let g = SourceGate::with_offsets(5, BTreeMap::from([(0, 5)]));
        assert_eq!(
            g.claim_offsets(0, &[(0, 8), (1, 2)], 5),
            Claim::Batch { start: 5, n: 5 }
        );
        let b = Barrier {
            id: 1,
            kind: BarrierKind::Checkpoint,
        };
        let at = SourceGate::inject_all(&[&g], b).expect("running");
        assert_eq!(at[0].offsets, BTreeMap::from([(0, 8), (1, 2)]));
        assert_eq!(at[0].emitted, 10);
        // The next batch waits until the barrier went out, and is not recorded before.
        assert_eq!(g.claim_offsets(0, &[(1, 9)], 7), Claim::Inject(b));
        assert_eq!(g.offsets()[&1], 2);
        assert_eq!(
            g.claim_offsets(1, &[(1, 9)], 7),
            Claim::Batch { start: 10, n: 7 }
        );
        assert_eq!(g.claim_offsets(1, &[], 0), Claim::Idle);
    }

    #[test]
    fn barrier_splits_the_sequence_at_the_position() {
        let g = SourceGate::new(10);
        assert_eq!(
            g.claim(0, 100, u64::MAX, 64),
            Claim::Batch { start: 10, n: 64 }
        );
        let b = Barrier {
            id: 1,
            kind: BarrierKind::Checkpoint,
        };
        assert_eq!(emitted(SourceGate::inject_all(&[&g], b)), Some(vec![74]));
        // Every subtask injects before claiming more, once.
        assert_eq!(g.claim(0, 100, u64::MAX, 64), Claim::Inject(b));
        assert_eq!(
            g.claim(1, 100, u64::MAX, 64),
            Claim::Batch { start: 74, n: 26 }
        );
        assert_eq!(g.claim(1, 100, u64::MAX, 64), Claim::Idle);
        assert_eq!(g.claim(1, 200, 120, 64), Claim::Batch { start: 100, n: 20 });
        assert_eq!(g.claim(1, 200, 120, 64), Claim::Finished);
        let b2 = Barrier { id: 2, ..b };
        assert_eq!(SourceGate::inject_all(&[&g], b2), None);
        assert_eq!(g.emitted(), 120);
    }

    #[test]
    fn a_finished_gate_keeps_its_final_position_and_gets_no_barrier() {
        let done = SourceGate::new(0);
        assert_eq!(done.claim(0, 100, 50, 64), Claim::Batch { start: 0, n: 50 });
        assert_eq!(done.claim(0, 100, 50, 64), Claim::Finished);
        assert!(done.is_finished());
        let running = SourceGate::new(7);
        let b = Barrier {
            id: 3,
            kind: BarrierKind::Savepoint,
        };
        // The running source gets the barrier; the finished one reports its count.
        assert_eq!(
            emitted(SourceGate::inject_all(&[&done, &running], b)),
            Some(vec![50, 7])
        );
        assert_eq!(running.claim(0, 100, u64::MAX, 64), Claim::Inject(b));
        // A subtask of the finished source that was still sending its last batch ends
        // instead of injecting.
        assert_eq!(done.claim(0, 100, 50, 64), Claim::Finished);
        // Once every source finished, nothing is injected.
        assert_eq!(running.claim(3, 100, 7, 64), Claim::Finished);
        let b4 = Barrier { id: 4, ..b };
        assert_eq!(SourceGate::inject_all(&[&done, &running], b4), None);
    }
}
