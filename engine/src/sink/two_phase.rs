//! The two-phase-commit seam between transactional sinks and aligned-barrier checkpoints
//! (Flink's `TwoPhaseCommittingSink`: a writer per subtask, a committer per sink).
//!
//! # Protocol
//!
//! 1. **Write.** Each sink subtask owns one [`TransactionalWriter`] (from
//!    [`TwoPhaseCommitSink::create_writer`]) and hands it every record
//!    ([`TransactionalWriter::write`]); what it writes stays invisible to readers.
//! 2. **Pre-commit at the barrier.** When the subtask is aligned on barrier `n` it calls
//!    [`TransactionalWriter::pre_commit`]`(n)`: everything written since the previous
//!    pre-commit is made durable but still invisible (a file flushed and synced, a Kafka
//!    transaction flushed), and described by [`Committable`]s. They travel with the
//!    subtask's acknowledgement into checkpoint `n`'s manifest (`_metadata.json`, field
//!    `sinks`); the writer starts a new transaction for what follows. A writer may finish the
//!    pre-commit in the background ([`TransactionalWriter::pre_commit_then`]): the subtask
//!    goes on with the next records at once, in a new transaction, and its acknowledgement
//!    leaves when the pre-commit finished, so a manifest lists only durable transactions and
//!    the checkpoint completes only after them. A background pre-commit that fails fails the
//!    subtask, as one at the barrier does.
//! 3. **Commit when the checkpoint completes.** Once checkpoint (or stop-with-savepoint, or a
//!    savepoint also written as a checkpoint) `n` is written,
//!    the checkpoint coordinator calls [`TwoPhaseCommitSink::commit`] with every committable
//!    the manifest lists, on its own thread (the notification of Flink's
//!    `notifyCheckpointComplete`). Committables of a checkpoint that failed are carried into
//!    the next one and committed with it; a failed commit is retried at the next completed
//!    checkpoint. When every subtask ended by itself (bounded sources finished), the
//!    coordinator writes a final checkpoint (with checkpoint storage) and commits the final
//!    pre-commits (FLIP-147).
//! 4. **Recover on restore.** Before any subtask of a (re)started job runs,
//!    [`TwoPhaseCommitSink::recover`] receives the committables the restored checkpoint lists
//!    for this sink (empty for a fresh start): it commits them (the previous run may have died
//!    between writing the manifest and committing) and aborts every other transaction this sink
//!    left behind (in-progress files, open Kafka transactions): their records come again from
//!    the sources' restored positions.
//!
//! So a reader of the committed output sees every record exactly once, provided `commit` and
//! `recover` are idempotent (they may run again for the same committables after a crash).
//!
//! Errors: a failed `write` or `pre_commit` fails the subtask (the job restarts from its
//! latest completed checkpoint when a restart strategy allows); a failed `recover` refuses to
//! start the job; a failed `commit` is logged and retried at the next completed checkpoint (the
//! checkpoint stays complete), unless the error [fails the job](SinkError::fails_job): then the
//! job fails and restarts from its latest completed checkpoint, whose `recover` commits it.

use std::path::PathBuf;

use crate::record::Record;

/// One pre-committed transaction, as stored in the checkpoint manifest: opaque to the engine
/// (for example `{"inProgress": ".part-…", "published": "part-…"}` for a file, a
/// transactional id and epoch for Kafka). Only the sink that produced it interprets it.
pub type Committable = serde_json::Value;

/// Errors of a transactional sink, naming the file, topic or transaction.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// A file operation failed.
    #[error("{path}: {action}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done (`cannot write part file`, `cannot publish part file`).
        action: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A committable from a checkpoint cannot be understood by this sink.
    #[error("{sink}: invalid committable {committable}: {reason}")]
    Committable {
        /// The sink (operator name and where it writes).
        sink: String,
        /// The committable as stored.
        committable: String,
        /// Why it is refused.
        reason: String,
    },
    /// The external system refused or failed an operation (a broker error, a transaction
    /// fenced off), with its message.
    #[error("{sink}: {action}: {reason}")]
    External {
        /// The sink (operator name and where it writes).
        sink: String,
        /// What was being done.
        action: &'static str,
        /// The system's message.
        reason: String,
    },
    /// A pre-committed transaction of a completed checkpoint could be neither committed nor
    /// written again from its committable: the job must fail, and its restart from the
    /// latest checkpoint recovers the transaction ([`TwoPhaseCommitSink::recover`]).
    #[error(transparent)]
    Uncommittable(Box<Uncommittable>),
}

/// The details of [`SinkError::Uncommittable`].
#[derive(Debug, thiserror::Error)]
#[error(
    "{sink}: transaction {transaction} of checkpoint {checkpoint} could not be committed ({commit}) nor written again ({recover}); failing the job so that it recovers from its latest checkpoint"
)]
pub struct Uncommittable {
    /// The sink (operator name and where it writes).
    pub sink: String,
    /// The transaction (a Kafka transactional id).
    pub transaction: String,
    /// The checkpoint whose pre-commit it is (`at the end of input` for the final one).
    pub checkpoint: String,
    /// Why the commit failed.
    pub commit: String,
    /// Why writing it again failed.
    pub recover: String,
}

impl SinkError {
    /// Whether this error must fail the job when a commit returns it (others are retried at
    /// the next completed checkpoint).
    pub fn fails_job(&self) -> bool {
        matches!(self, SinkError::Uncommittable(_))
    }
}

/// Receives the outcome of a pre-commit a writer finishes in the background
/// ([`TransactionalWriter::pre_commit_then`]), on the thread that finished it.
pub type PreCommitted = Box<dyn FnOnce(Result<Vec<Committable>, SinkError>) + Send>;

/// A sink subtask's side of the protocol: writes records into an open transaction and
/// pre-commits it at each barrier. Owned by the subtask's thread.
pub trait TransactionalWriter: Send {
    /// Writes one record into the open transaction (invisible until committed).
    ///
    /// # Errors
    /// [`SinkError`] when the record cannot be written; the subtask fails.
    fn write(&mut self, record: &Record) -> Result<(), SinkError>;

    /// Makes everything written since the previous pre-commit durable (still invisible) and
    /// describes it; the next record goes into a new transaction. `checkpoint` is the barrier's
    /// id (`None` at the end of input, FLIP-147's final pre-commit). Returns nothing when
    /// nothing was written.
    ///
    /// # Errors
    /// [`SinkError`] when the data cannot be made durable; the subtask fails, so the checkpoint
    /// does not complete.
    fn pre_commit(&mut self, checkpoint: Option<u64>) -> Result<Vec<Committable>, SinkError>;

    /// Pre-commits at barrier `checkpoint` like [`Self::pre_commit`], but may finish in the
    /// background: the next record goes into a new transaction at once, and `done` receives
    /// the committables (or the error) once everything written before the barrier is durable.
    /// Outcomes arrive in barrier order, and a later [`Self::pre_commit`] returns only after
    /// every earlier `done` was called. The default pre-commits at once, then calls `done`.
    ///
    /// # Errors
    /// [`SinkError`] when the pre-commit fails before it is handed over (`done` is then not
    /// called); the subtask fails.
    fn pre_commit_then(&mut self, checkpoint: u64, done: PreCommitted) -> Result<(), SinkError> {
        let committables = self.pre_commit(Some(checkpoint))?;
        done(Ok(committables));
        Ok(())
    }
}

/// A transactional sink operator: creates its subtasks' writers and commits or recovers their
/// transactions. Shared by the subtasks' threads and the checkpoint coordinator.
pub trait TwoPhaseCommitSink: Send + Sync + std::fmt::Debug {
    /// The writer of subtask `subtask` of `parallelism`. `attempt` is unique per start of the
    /// job in this process and across restarts (names of new transactions or files include it,
    /// so that they never collide with a previous attempt's).
    ///
    /// # Errors
    /// [`SinkError`] when the writer cannot be set up; the job does not start.
    fn create_writer(
        &self,
        subtask: u32,
        parallelism: u32,
        attempt: &str,
    ) -> Result<Box<dyn TransactionalWriter>, SinkError>;

    /// Makes the pre-committed transactions `committables` visible. Idempotent: a committable
    /// already committed is skipped.
    ///
    /// # Errors
    /// [`SinkError`] naming what could not be committed.
    fn commit(&self, committables: &[Committable]) -> Result<(), SinkError>;

    /// On (re)start, before any writer exists: commits `restored` (the committables the
    /// restored checkpoint lists for this sink; empty for a fresh start), then aborts every
    /// other transaction this sink left behind.
    ///
    /// # Errors
    /// [`SinkError`]; the job does not start.
    fn recover(&self, restored: &[Committable]) -> Result<(), SinkError>;
}
