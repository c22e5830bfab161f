//! Sinks with effects outside the engine, written exactly once through checkpoints.
//!
//! - [`two_phase`]: the two-phase-commit seam every transactional sink implements (write,
//!   pre-commit at the barrier, commit when the checkpoint completes, recover on restore).
//! - [`pre_committer`]: the thread on which a writer finishes its pre-commits in the
//!   background, in barrier order.
//! - [`file`](mod@file): the exactly-once file sink on that seam (in-progress part files renamed into
//!   place when the checkpoint covering them completes).

pub mod file;
pub mod pre_committer;
pub mod two_phase;

pub use two_phase::{
    Committable, PreCommitted, SinkError, TransactionalWriter, TwoPhaseCommitSink, Uncommittable,
};
