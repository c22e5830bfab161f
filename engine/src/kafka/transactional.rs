//! The exactly-once Kafka sink (`delivery: exactly-once`): one Kafka transaction per sink
//! subtask and checkpoint, on the engine's two-phase-commit seam ([`crate::sink::two_phase`]).
//!
//! - **Write**: a subtask's records of one checkpoint interval go into one open transaction of
//!   one of its producers (transactional ids `<prefix>-<subtask>-<k>`, `k` < [`POOL`]; each is
//!   initialised when the writer starts, which fences and aborts whatever a previous run left
//!   open under that id).
//! - **Pre-commit at barrier n** ([`crate::kafka::transactional_writer`]): the writer hands the
//!   open transaction to its pre-committing thread and goes on at once with a new transaction
//!   on another producer of the pool. There the transaction also commits a *marker* (the
//!   offset `marker` of partition 0 of the topic for consumer group `<transactional
//!   id>-marker`, through `send_offsets_to_transaction`), is flushed, and its producer is
//!   parked in the sink; then the committable (naming the transactional id and the marker and
//!   carrying the transaction's records) goes with the subtask's acknowledgement.
//! - **Commit** (checkpoint n completed, on the coordinator's thread): the parked producer
//!   commits the transaction and becomes free again. A retriable error (a timeout, a moving
//!   transaction coordinator) is retried on the same producer ([`COMMIT_ATTEMPTS`]); any other
//!   (the transaction was aborted, for example by the brokers after `transaction.timeout.ms`,
//!   or the producer was fenced) means that transaction is lost, so the committable is
//!   recovered as on a restore (below) by a new producer of the same id, which then joins the
//!   free producers. If that fails too, the commit fails with
//!   [`SinkError::Uncommittable`] naming the transactional id and checkpoint: the job fails
//!   and recovers from its latest checkpoint, and the writers of this sink refuse to begin new
//!   transactions (they would otherwise wait for a producer that never comes back).
//! - **Recover** (restart from checkpoint n): librdkafka cannot resume another process's
//!   transaction, so for each committable the id is initialised (which aborts the transaction
//!   if it is still open) and the marker tells whether it was committed (the group's committed
//!   offset is at least the marker); if not, its records are written again in a new
//!   transaction under the same id, with the marker, and committed.
//!
//! A `read_committed` reader therefore sees every result once. Limits: a transaction's records
//! are kept in the checkpoint manifest (fine for aggregates, heavy for a pass-through of a busy
//! topic); a transaction left open by a subtask that no longer exists after a scale-down is
//! aborted by the brokers after `transaction.timeout.ms` ([`TRANSACTION_TIMEOUT_MS`]), and
//! `read_committed` readers of its partitions wait until then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

use super::KafkaSinkSpec;
use super::sink::send_blocking;
use super::transactional_writer::TransactionalKafkaWriter;
use crate::sink::{Committable, SinkError, Uncommittable};

/// Transactional producers per sink subtask (a transaction being pre-committed or waiting for
/// its checkpoint to complete holds one; the next interval's records use another).
pub const POOL: u32 = 3;
/// Default `transaction.timeout.ms` of the producers (the sink's `transactionTimeoutMs`
/// overrides it); a transactional call waits at most this long too.
pub const TRANSACTION_TIMEOUT_MS: u32 = 30_000;
/// Tries of a commit whose errors are retriable, on the same producer.
pub const COMMIT_ATTEMPTS: u32 = 3;
/// Pause between two tries of a commit.
const COMMIT_RETRY_PAUSE: Duration = Duration::from_millis(200);

pub(super) type TxProducer = super::sink::PolledProducer;

/// What the writers and the committer of one exactly-once Kafka sink share.
#[derive(Default)]
pub struct Transactions {
    /// Pre-committed transactions waiting for their checkpoint, by transactional id.
    pub(super) parked: Mutex<HashMap<String, TxProducer>>,
    /// Producers without an open transaction, by transactional id.
    pub(super) free: Mutex<HashMap<String, TxProducer>>,
    /// Why a transaction could be neither committed nor recovered; once set, writers begin
    /// no new transaction (the job is failing).
    pub(super) broken: Mutex<Option<String>>,
    /// The marker group's metadata by transactional id (group `<id>-marker`, never joined:
    /// no member id, no generation), made once per id.
    marker_groups: Mutex<HashMap<String, Arc<ConsumerGroupMetadata>>>,
}

/// Whether a failed `commit_transaction` may be called again on the same producer: librdkafka
/// marks such errors retriable; one that requires an abort or is fatal never succeeds again.
pub fn commit_retriable(e: &KafkaError) -> bool {
    matches!(e, KafkaError::Transaction(t)
        if t.is_retriable() && !t.txn_requires_abort() && !t.is_fatal())
}

impl std::fmt::Debug for Transactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Transactions")
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The largest marker this process has made or seen (see [`new_marker`]).
static LAST_MARKER: AtomicI64 = AtomicI64::new(0);

/// The marker of a transaction pre-committed now: µs since the Unix epoch, and larger than any
/// marker this process made or saw before ([`saw_marker`]), so that later transactions under
/// the same id have larger markers also when the wall clock steps back (a transaction with a
/// smaller marker than its id's last committed one would be taken as committed on recovery,
/// and its records lost).
pub(super) fn new_marker() -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let step = |last: i64| Some(now.max(last.saturating_add(1)));
    let last = LAST_MARKER
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, step)
        .unwrap_or(0);
    now.max(last.saturating_add(1))
}

/// Records a marker read from a restored snapshot or committed on the brokers: later markers
/// of this process are larger.
pub(super) fn saw_marker(marker: i64) {
    LAST_MARKER.fetch_max(marker, Ordering::SeqCst);
}

/// `b` as lowercase hexadecimal, two digits per byte.
pub(super) fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * b.len());
    for x in b {
        s.push(char::from(DIGITS[usize::from(x >> 4)]));
        s.push(char::from(DIGITS[usize::from(x & 0xf)]));
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

/// The exactly-once sink of one operator: its name (for errors), spec and shared state.
#[derive(Debug, Clone)]
pub struct TransactionalSink {
    pub(super) spec: KafkaSinkSpec,
    /// `<operator> (kafka topic <topic>)`.
    pub(super) name: String,
    prefix: String,
    pub(super) shared: Arc<Transactions>,
}

impl TransactionalSink {
    /// The sink of operator `operator` in job `job`. Without a `transactionalIdPrefix` its
    /// transactional ids start `streamscale-<job>-<operator>`, or with `Some(scope)`
    /// `streamscale-<scope>-<job>-<operator>`.
    pub fn new(
        job: &str,
        operator: &str,
        spec: &KafkaSinkSpec,
        scope: Option<&str>,
    ) -> TransactionalSink {
        let prefix = match (&spec.transactional_id_prefix, scope) {
            (Some(prefix), _) => prefix.clone(),
            (None, Some(scope)) => format!("streamscale-{scope}-{job}-{operator}"),
            (None, None) => format!("streamscale-{job}-{operator}"),
        };
        TransactionalSink {
            spec: spec.clone(),
            name: format!("{operator} (kafka topic {})", spec.topic),
            prefix,
            shared: Arc::new(Transactions::default()),
        }
    }

    /// The prefix of its transactional ids (`<prefix>-<subtask>-<k>`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(super) fn err(&self, action: &'static str, reason: impl std::fmt::Display) -> SinkError {
        SinkError::External {
            sink: self.name.clone(),
            action,
            reason: reason.to_string(),
        }
    }

    /// How long a transactional call may take: the transaction timeout.
    fn call_timeout(&self) -> Duration {
        Duration::from_millis(u64::from(
            self.spec
                .transaction_timeout_ms
                .unwrap_or(TRANSACTION_TIMEOUT_MS),
        ))
    }

    fn producer(&self, tid: &str) -> Result<TxProducer, SinkError> {
        let timeout_ms = self
            .spec
            .transaction_timeout_ms
            .unwrap_or(TRANSACTION_TIMEOUT_MS);
        let p: TxProducer = self
            .spec
            .client_config()
            .set("transactional.id", tid)
            .set("transaction.timeout.ms", timeout_ms.to_string())
            .set("linger.ms", "5")
            .create()
            .map_err(|e| self.err("create transactional producer", e))?;
        p.init_transactions(self.call_timeout())
            .map_err(|e| self.err("init transactions", format!("{tid}: {e}")))?;
        Ok(p)
    }

    /// The metadata of `tid`'s marker group for `send_offsets_to_transaction`: that of a
    /// consumer of group `<tid>-marker` that never joins it (group id only), made by such a
    /// consumer on first use and kept for the sink's life.
    fn marker_group(&self, tid: &str) -> Result<Arc<ConsumerGroupMetadata>, SinkError> {
        if let Some(g) = lock(&self.shared.marker_groups).get(tid) {
            return Ok(g.clone());
        }
        let group: BaseConsumer = self
            .spec
            .client_config()
            .set("group.id", format!("{tid}-marker"))
            .create()
            .map_err(|e| self.err("marker group", e))?;
        let cgm = Arc::new(
            group
                .group_metadata()
                .ok_or_else(|| self.err("marker group", "no group metadata"))?,
        );
        lock(&self.shared.marker_groups).insert(tid.to_string(), cgm.clone());
        Ok(cgm)
    }

    /// Adds the marker of `tid` to `p`'s open transaction.
    pub(super) fn add_marker(
        &self,
        p: &TxProducer,
        tid: &str,
        marker: i64,
    ) -> Result<(), SinkError> {
        let cgm = self.marker_group(tid)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.spec.topic, 0, Offset::Offset(marker))
            .map_err(|e| self.err("marker", e))?;
        p.send_offsets_to_transaction(&tpl, &cgm, self.call_timeout())
            .map_err(|e| self.err("marker", format!("{tid}: {e}")))
    }

    /// The marker committed for `tid` (0 when none).
    fn committed_marker(&self, tid: &str) -> Result<i64, SinkError> {
        let group: BaseConsumer = self
            .spec
            .client_config()
            .set("group.id", format!("{tid}-marker"))
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| self.err("marker group", e))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.spec.topic, 0);
        let got = group
            .committed_offsets(tpl, self.call_timeout())
            .map_err(|e| self.err("read marker", format!("{tid}: {e}")))?;
        Ok(got
            .elements()
            .first()
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
            .unwrap_or(0))
    }

    /// The writer of subtask `subtask`: initialises its [`POOL`] producers (fencing what a
    /// previous run left open under their ids).
    ///
    /// # Errors
    /// [`SinkError::External`] when a producer cannot be initialised or the writer's
    /// pre-committing thread cannot be spawned.
    pub fn writer(&self, subtask: u32) -> Result<TransactionalKafkaWriter, SinkError> {
        let mut tids = Vec::new();
        for k in 0..POOL {
            let tid = format!("{}-{subtask}-{k}", self.prefix);
            let p = self.producer(&tid)?;
            // The id's last committed marker, perhaps made on a node whose clock ran ahead of
            // this one's: this run's markers come after it (see `new_marker`). Best effort: a
            // marker that cannot be read leaves the clock to order them.
            match self.committed_marker(&tid) {
                Ok(m) => saw_marker(m),
                Err(e) => {
                    tracing::warn!(sink = %self.name, transaction = %tid, error = %e, "cannot read the last committed marker")
                }
            }
            lock(&self.shared.free).insert(tid.clone(), p);
            tids.push(tid);
        }
        TransactionalKafkaWriter::new(self.clone(), subtask, tids)
    }

    /// Commits the parked transactions of `committables`; ids not parked here were committed
    /// already or belong to a previous run ([`Self::recover`] handles those). A transaction
    /// that cannot be committed (after [`COMMIT_ATTEMPTS`] tries of a retriable error, or at
    /// once for any other error) is recovered from its committable as on a restore, by a new
    /// producer of its id that then becomes free.
    ///
    /// # Errors
    /// [`SinkError::Uncommittable`] naming the transactional id and checkpoint when neither
    /// worked (writers of this sink then refuse to begin); [`SinkError::Committable`] for a
    /// committable without a transactional id.
    pub fn commit(&self, committables: &[Committable]) -> Result<(), SinkError> {
        for c in committables {
            let Some(tid) = c["transactionalId"].as_str() else {
                return Err(self.bad(c, "no transactionalId"));
            };
            let Some(p) = lock(&self.shared.parked).remove(tid) else {
                continue;
            };
            let p = match self.commit_with_retries(tid, &p) {
                Ok(()) => p,
                Err(commit) => {
                    tracing::warn!(sink = %self.name, transaction = tid, error = %commit, "cannot commit a pre-committed transaction; writing it again from its committable");
                    // The producer is fenced or its transaction lost: a new one of the same id
                    // replaces it (initialising it aborts whatever the old one left open).
                    drop(p);
                    match self.recover_one(c) {
                        Ok(p) => p,
                        Err(recover) => {
                            let checkpoint = c["checkpoint"]
                                .as_u64()
                                .map_or_else(|| "at the end of input".into(), |n| n.to_string());
                            *lock(&self.shared.broken) = Some(format!(
                                "transaction {tid} of checkpoint {checkpoint} could be neither committed nor written again; the job fails"
                            ));
                            return Err(SinkError::Uncommittable(Box::new(Uncommittable {
                                sink: self.name.clone(),
                                transaction: tid.to_string(),
                                checkpoint,
                                commit: commit.to_string(),
                                recover: recover.to_string(),
                            })));
                        }
                    }
                }
            };
            lock(&self.shared.free).insert(tid.to_string(), p);
        }
        Ok(())
    }

    /// Commits `p`'s open transaction, trying a retriable error again ([`COMMIT_ATTEMPTS`]
    /// tries in all).
    fn commit_with_retries(&self, tid: &str, p: &TxProducer) -> Result<(), KafkaError> {
        let mut attempt = 1;
        loop {
            match p.commit_transaction(self.call_timeout()) {
                Ok(()) => return Ok(()),
                Err(e) if attempt < COMMIT_ATTEMPTS && commit_retriable(&e) => {
                    tracing::warn!(sink = %self.name, transaction = tid, attempt, error = %e, "commit failed (retriable); trying again");
                    attempt += 1;
                    std::thread::sleep(COMMIT_RETRY_PAUSE);
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn bad(&self, c: &Committable, reason: &str) -> SinkError {
        SinkError::Committable {
            sink: self.name.clone(),
            committable: c.to_string(),
            reason: reason.into(),
        }
    }

    /// Makes sure every transaction `restored` lists is committed: one whose marker is not
    /// committed is written again under its id and committed.
    ///
    /// # Errors
    /// [`SinkError`] naming the committable or the broker's error.
    pub fn recover(&self, restored: &[Committable]) -> Result<(), SinkError> {
        for c in restored {
            drop(self.recover_one(c)?);
        }
        Ok(())
    }

    /// Makes sure the transaction of committable `c` is committed (written again under its id
    /// when its marker is not committed); returns the producer of its id, initialised and
    /// without an open transaction.
    fn recover_one(&self, c: &Committable) -> Result<TxProducer, SinkError> {
        let (Some(tid), Some(marker), Some(records)) = (
            c["transactionalId"].as_str(),
            c["marker"].as_i64(),
            c["records"].as_array(),
        ) else {
            return Err(self.bad(c, "needs transactionalId, marker and records"));
        };
        // Initialising the id first fences the previous producer of the id and aborts its open
        // transaction, so that the marker's offset is stable to read.
        saw_marker(marker);
        let p = self.producer(tid)?;
        let committed = self.committed_marker(tid)?;
        saw_marker(committed);
        if committed >= marker {
            return Ok(p);
        }
        p.begin_transaction()
            .map_err(|e| self.err("begin", format!("{tid}: {e}")))?;
        for r in records {
            let kv = r
                .as_array()
                .and_then(|kv| Some((unhex(kv.first()?.as_str()?)?, unhex(kv.get(1)?.as_str()?)?)));
            let Some((k, v)) = kv else {
                return Err(self.bad(c, "a record is not [hex key, hex value]"));
            };
            send_blocking(&p, &self.spec.topic, &k, &v).map_err(|e| self.err("send", e))?;
        }
        self.add_marker(&p, tid, marker)?;
        self.commit_with_retries(tid, &p)
            .map_err(|e| self.err("commit", format!("{tid}: {e}")))?;
        tracing::info!(sink = %self.name, transaction = tid, records = records.len(), "recovered a pre-committed transaction");
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let b = b"\x00key\xff".to_vec();
        assert_eq!(unhex(&hex(&b)), Some(b));
        assert_eq!(hex(b"\x00\x0f\xa5\xff"), "000fa5ff");
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("abc"), None);
    }

    #[test]
    fn markers_only_grow_also_after_one_from_a_clock_ahead() {
        let a = new_marker();
        let b = new_marker();
        assert!(b > a);
        // A committed marker from a node whose clock was an hour ahead.
        let ahead = b + 3_600_000_000;
        saw_marker(ahead);
        assert!(new_marker() > ahead);
    }
}
