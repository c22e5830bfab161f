//! Sinks with effects outside the engine, written exactly once through checkpoints.
//!
//! - [`two_phase`]: the two-phase-commit seam every transactional sink implements (write,
//!   pre-commit at the barrier, commit when the checkpoint completes, recover on restore).
//! - [`file`](mod@file): the exactly-once file sink on that seam (in-progress part files renamed into
//!   place when the checkpoint covering them completes).

pub mod file;
pub mod two_phase;

pub use two_phase::{
    Committable, SinkError, TransactionalWriter, TwoPhaseCommitSink, Uncommittable,
};
