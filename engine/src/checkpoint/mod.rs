//! Checkpoints and savepoints by aligned barriers (asynchronous barrier snapshotting, the
//! Chandy-Lamport variant Flink uses).
//!
//! # Barrier flow
//!
//! - **Channels.** Every non-source subtask has one bounded input queue of [`Message`]s; each
//!   message carries the index of the *input channel* it came on: one channel per upstream
//!   subtask (upstream operators in edge order, then subtask index). Keyed inputs route a
//!   record to the subtask owning its key group; other inputs rebalance (a sender puts the
//!   record in the first downstream queue with room, starting round-robin, and blocks on all
//!   of them when every one is full: join-the-shortest-queue, close to the shared queue of a
//!   c-server). A barrier is sent on *every* channel (broadcast), so every subtask sees
//!   barrier `n` from every upstream subtask.
//! - **Injection.** The [`coordinator`] sets barrier `n` on every source's [`gate`] at once
//!   and records each source's position (the next sequence number) under the gate's lock;
//!   source subtasks inject the barrier before claiming more records, so exactly the records
//!   below the position precede it.
//! - **Alignment.** A subtask that received barrier `n` on a channel holds back that channel's
//!   later messages (stashes them in arrival order) until every live channel delivered `n`
//!   ([`barrier::Aligner`]); channels whose sender ended count as aligned. The stash is
//!   replayed before the queue afterwards. Holding back by stashing (rather than by not
//!   reading the channel, which a merged queue cannot do) is Flink's original `BarrierBuffer`;
//!   its size is bounded by what upstream sends during one alignment.
//! - **Snapshot.** On alignment a subtask snapshots its keyed state per key group without
//!   copying it ([`crate::state`]: the heap backend shares its key groups copy-on-write in
//!   O(key groups); the disk backend commits its write-back cache and hands over a read
//!   transaction), acknowledges it with its counters to the coordinator, forwards the barrier
//!   and goes on processing. The coordinator merges, encodes (key groups in parallel, one
//!   thread per core) and writes on its own thread: [`storage`] for checkpoints, the savepoint
//!   directory for savepoints (same format, [`crate::savepoint`]).
//! - **Finished subtasks (FLIP-147).** A bounded source that reached its record count sends
//!   the end of input on every channel; an operator whose channels have all ended does the
//!   same after firing its open panes. Each reports its final state to the coordinator as it
//!   exits. Later barriers go only into the sources still running; the finished sources'
//!   positions are their counts, the ended channels count as aligned, and a finished
//!   subtask's final state stands in for its snapshot ([`coordinator`]). So a job mixing
//!   bounded and unbounded sources keeps checkpointing, and can be stopped with a savepoint
//!   and restored at another parallelism, after some sources finished; a restore emits none
//!   of a finished source's records again. Only once every source finished is no barrier
//!   injected (the job's final state is then its savepoint).
//! - **Stop.** A stop-with-savepoint is the same barrier with a stop flag: sources exit after
//!   injecting it, every subtask exits after forwarding it (with `drain`, open window panes
//!   fire before the snapshot), so nothing is drained by hand.
//!
//! # Guarantees after recovery from a checkpoint
//!
//! - Keyed state and every operator counter (including the sink's accounted count): exactly
//!   once. They are part of the snapshot at the barrier; sources replay from the checkpointed
//!   position, regenerating the same records.
//! - The discarding sink: exactly once (its only effect is the accounted counter).
//! - Transactional sinks, such as the file sink with `delivery: exactly-once` (the default):
//!   exactly once for a reader of the committed output. They pre-commit at the barrier and
//!   the coordinator commits once the snapshot is written ([`crate::sink::two_phase`]).
//! - The file sink with `delivery: at-least-once`: at least once. Lines written after the last
//!   completed checkpoint are written again after a restart from it.

pub mod barrier;
pub mod coordinator;
pub mod gate;
pub mod retire;
pub mod storage;

pub use barrier::{Barrier, BarrierKind, Event, Message};
