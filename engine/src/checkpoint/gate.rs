//! The barrier injection point of one source operator: its position (the next sequence
//! number) shared by its subtasks, and the barrier they must inject.
//!
//! Subtasks claim batches of sequence numbers under the gate's lock; the coordinator sets a
//! barrier under the same lock and reads the position. A subtask therefore emits every record
//! below the position before it injects the barrier (it sends its last batch before claiming
//! again) and none at or above it before the barrier (any later claim first sees the barrier).
//! Records are a pure function of the sequence number, so a restored source regenerates
//! exactly the records after the checkpointed position.

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
        SourceGate {
            state: Mutex::new(GateState {
                next,
                barrier: None,
                finished: false,
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

    /// Sets `barrier` on every gate whose source is still running, at once, and returns every
    /// gate's position (in `gates` order), or `None` (nothing set) when every source already
    /// finished (the job's final state is then its last snapshot).
    ///
    /// A finished gate (a subtask claimed [`Claim::Finished`]: the position reached the
    /// record count) gets no barrier: its subtasks end without claiming again, and its
    /// position, the record count, is its final state (FLIP-147, "checkpoints after tasks
    /// finished"). Its remaining subtasks send the end of input instead of the barrier, which
    /// downstream alignment counts as aligned ([`super::barrier::Aligner`]).
    pub fn inject_all(gates: &[&SourceGate], barrier: Barrier) -> Option<Vec<u64>> {
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
                    g.next
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
        assert_eq!(SourceGate::inject_all(&[&g], b), Some(vec![74]));
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
            SourceGate::inject_all(&[&done, &running], b),
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
