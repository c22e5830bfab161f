//! What flows on a channel (data records, barriers, end of input) and the alignment of
//! barriers at a subtask with several input channels.

use crate::record::Record;

/// What a checkpoint barrier asks of the subtasks it passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierKind {
    /// A periodic checkpoint: snapshot and keep running.
    Checkpoint,
    /// A savepoint of a running job: snapshot and keep running.
    Savepoint,
    /// A stop-with-savepoint: snapshot, forward the barrier, then exit. With `drain`, open
    /// window panes fire before the snapshot (Flink's `--drain`).
    Stop {
        /// Fire every open window pane before the snapshot.
        drain: bool,
    },
}

/// A numbered checkpoint barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barrier {
    /// Checkpoint id, increasing within a run.
    pub id: u64,
    /// What to do on alignment.
    pub kind: BarrierKind,
}

impl Barrier {
    /// Whether subtasks exit after forwarding this barrier.
    pub fn stops(&self) -> bool {
        matches!(self.kind, BarrierKind::Stop { .. })
    }
}

/// The payload of one channel message.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A data record.
    Data(Record),
    /// Data records in order, as that many `Data` events (a source's poll batch for one
    /// downstream subtask).
    Batch(Vec<Record>),
    /// A checkpoint barrier: every record sent on this channel before it belongs to the
    /// checkpoint, none after it.
    Barrier(Barrier),
    /// The sender finished (a bounded source reached its count); nothing follows on this channel.
    End,
}

/// One message on a subtask's input queue, tagged with the input channel it came on.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Index of the input channel (one per upstream subtask) at the receiver.
    pub channel: u32,
    /// The payload.
    pub event: Event,
}

/// What a barrier did to the alignment ([`Aligner::on_barrier`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alignment {
    /// Waiting for more channels (or the barrier was older than the one being aligned, or than
    /// the last one aligned, and was dropped).
    Pending,
    /// Every live channel delivered this barrier; every channel is unblocked.
    Aligned(Barrier),
    /// A newer barrier came before the one being aligned (`abandoned`) completed: some
    /// upstream subtask skipped `abandoned` (its checkpoint timed out while the subtask could
    /// not inject it). That checkpoint is given up here, every channel was unblocked (the
    /// caller processes what it held back, in order, now) and the newer barrier's alignment
    /// started with its channel.
    Superseded {
        /// The barrier whose alignment was given up.
        abandoned: Barrier,
    },
}

/// Barrier alignment at one subtask with `channels` input channels.
///
/// After a channel delivers barrier `n` it is blocked: its later messages must be held back
/// (the caller stashes them) until every channel that has not ended delivered `n`. Ended
/// channels count as aligned. Barriers are matched by id: a newer one supersedes the alignment
/// in progress (Flink's aligner does the same), an older one is dropped, so that one skipped
/// barrier cannot leave a channel one checkpoint behind the others for good.
#[derive(Debug)]
pub struct Aligner {
    blocked: Vec<bool>,
    ended: Vec<bool>,
    current: Option<Barrier>,
    /// The id of the last barrier aligned or given up: anything up to it is stale.
    last_id: Option<u64>,
}

impl Aligner {
    /// An aligner for `channels` input channels.
    pub fn new(channels: usize) -> Aligner {
        Aligner {
            blocked: vec![false; channels],
            ended: vec![false; channels],
            current: None,
            last_id: None,
        }
    }

    /// Whether messages from `channel` must be held back (it already delivered the barrier
    /// being aligned).
    pub fn is_blocked(&self, channel: u32) -> bool {
        self.blocked.get(channel as usize).copied().unwrap_or(false)
    }

    /// Records barrier `b` from `channel` (see [`Alignment`]).
    pub fn on_barrier(&mut self, channel: u32, b: Barrier) -> Alignment {
        if self.last_id.is_some_and(|last| b.id <= last) {
            return Alignment::Pending;
        }
        let mut superseded = None;
        match self.current {
            Some(c) if b.id < c.id => return Alignment::Pending,
            Some(c) if b.id > c.id => {
                self.blocked.iter_mut().for_each(|x| *x = false);
                self.last_id = Some(c.id);
                self.current = Some(b);
                superseded = Some(c);
            }
            Some(_) => {}
            None => self.current = Some(b),
        }
        if let Some(slot) = self.blocked.get_mut(channel as usize) {
            *slot = true;
        }
        match (self.complete(b), superseded) {
            (Some(aligned), _) => Alignment::Aligned(aligned),
            (None, Some(abandoned)) => Alignment::Superseded { abandoned },
            (None, None) => Alignment::Pending,
        }
    }

    /// Records the end of `channel`; returns a barrier whose alignment this completes.
    pub fn on_end(&mut self, channel: u32) -> Option<Barrier> {
        if let Some(slot) = self.ended.get_mut(channel as usize) {
            *slot = true;
        }
        let current = self.current?;
        self.complete(current)
    }

    /// Whether every channel has ended.
    pub fn all_ended(&self) -> bool {
        self.ended.iter().all(|e| *e)
    }

    fn complete(&mut self, b: Barrier) -> Option<Barrier> {
        let aligned = self.blocked.iter().zip(&self.ended).all(|(b, e)| *b || *e);
        if !aligned {
            return None;
        }
        self.blocked.iter_mut().for_each(|b| *b = false);
        self.current = None;
        self.last_id = Some(b.id);
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(id: u64) -> Barrier {
        Barrier {
            id,
            kind: BarrierKind::Checkpoint,
        }
    }

    #[test]
    fn aligns_when_every_live_channel_delivered_the_barrier() {
        let mut a = Aligner::new(3);
        assert_eq!(a.on_barrier(0, b(1)), Alignment::Pending);
        assert!(a.is_blocked(0) && !a.is_blocked(1));
        assert_eq!(a.on_barrier(2, b(1)), Alignment::Pending);
        assert_eq!(a.on_barrier(1, b(1)), Alignment::Aligned(b(1)));
        assert!(!a.is_blocked(0) && !a.is_blocked(1) && !a.is_blocked(2));
        // An ended channel counts as aligned, also when it ends mid-alignment.
        assert_eq!(a.on_barrier(1, b(2)), Alignment::Pending);
        assert_eq!(a.on_end(0), None);
        assert_eq!(a.on_barrier(2, b(2)), Alignment::Aligned(b(2)));
        assert_eq!(a.on_barrier(1, b(3)), Alignment::Pending);
        assert_eq!(a.on_end(2), Some(b(3)));
        assert!(!a.all_ended());
        assert_eq!(a.on_end(1), None);
        assert!(a.all_ended());
    }

    #[test]
    fn a_skipped_barrier_does_not_leave_a_channel_behind_for_good() {
        // Channel 0 delivers 5; channel 1's sender skipped 5 (its checkpoint timed out while
        // it could not inject it) and delivers 6.
        let mut a = Aligner::new(2);
        assert_eq!(a.on_barrier(0, b(5)), Alignment::Pending);
        assert_eq!(
            a.on_barrier(1, b(6)),
            Alignment::Superseded { abandoned: b(5) }
        );
        // Channel 0 is released (what it held back is processed), channel 1 waits for 6.
        assert!(!a.is_blocked(0) && a.is_blocked(1));
        assert_eq!(a.on_barrier(0, b(6)), Alignment::Aligned(b(6)));
        // Both in step again: 7 aligns as usual; a late 5 or 6 is dropped.
        assert_eq!(a.on_barrier(1, b(5)), Alignment::Pending);
        assert!(!a.is_blocked(1));
        assert_eq!(a.on_barrier(0, b(7)), Alignment::Pending);
        assert_eq!(a.on_barrier(1, b(6)), Alignment::Pending);
        assert!(!a.is_blocked(1));
        assert_eq!(a.on_barrier(1, b(7)), Alignment::Aligned(b(7)));
    }
}
