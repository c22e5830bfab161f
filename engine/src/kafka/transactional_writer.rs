//! One subtask's writer of the exactly-once Kafka sink ([`super::transactional`]): records go
//! into the open transaction of one of the subtask's producers; at a barrier the transaction
//! is handed to the writer's pre-committing thread ([`PreCommitter`]), which adds the marker,
//! flushes, parks the producer and then hands over the committable, while the next records go
//! into a new transaction on another producer.

use std::time::{Duration, Instant};

use rdkafka::producer::Producer;

use super::sink::{FLUSH_TIMEOUT, key_value, send_blocking};
use super::transactional::{TransactionalSink, TxProducer, hex, lock, new_marker};
use crate::record::Record;
use crate::sink::pre_committer::{PreCommitWork, PreCommitter};
use crate::sink::{Committable, PreCommitted, SinkError, TransactionalWriter};

/// One subtask's writer: its open transaction, that transaction's records, and the thread
/// that pre-commits its transactions.
pub struct TransactionalKafkaWriter {
    sink: TransactionalSink,
    tids: Vec<String>,
    open: Option<(String, TxProducer)>,
    records: Vec<serde_json::Value>,
    pre_committer: PreCommitter,
}

impl TransactionalKafkaWriter {
    /// The writer of subtask `subtask` of `sink` over the producers `tids` (initialised and
    /// free in the sink).
    ///
    /// # Errors
    /// [`SinkError::External`] when the pre-committing thread cannot be spawned.
    pub(super) fn new(
        sink: TransactionalSink,
        subtask: u32,
        tids: Vec<String>,
    ) -> Result<TransactionalKafkaWriter, SinkError> {
        let pre_committer = PreCommitter::start(&sink.name, format!("pre-commit-{subtask}"))?;
        Ok(TransactionalKafkaWriter {
            sink,
            tids,
            open: None,
            records: Vec::new(),
            pre_committer,
        })
    }

    /// A free producer of this subtask with a new transaction begun; waits while all are
    /// being pre-committed or parked (their checkpoints not yet complete).
    fn begin(&mut self) -> Result<(), SinkError> {
        let started = Instant::now();
        loop {
            if let Some(why) = lock(&self.sink.shared.broken).clone() {
                return Err(self.sink.err("begin", why));
            }
            let found = {
                let mut free = lock(&self.sink.shared.free);
                let tid = self.tids.iter().find(|t| free.contains_key(*t)).cloned();
                tid.and_then(|t| free.remove(&t).map(|p| (t, p)))
            };
            if let Some((tid, p)) = found {
                p.begin_transaction()
                    .map_err(|e| self.sink.err("begin", format!("{tid}: {e}")))?;
                self.open = Some((tid, p));
                return Ok(());
            }
            if started.elapsed() > FLUSH_TIMEOUT {
                return Err(self.sink.err(
                    "begin",
                    "every transactional producer still waits for its checkpoint to complete",
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Takes the open transaction and its records out of the writer, as the work that
    /// pre-commits it: adds its marker, flushes it, parks its producer in the sink and
    /// describes it. Nothing to do (no committable) when no transaction is open.
    fn hand_over(&mut self, checkpoint: Option<u64>) -> PreCommitWork {
        let Some((tid, p)) = self.open.take() else {
            return Box::new(|| Ok(Vec::new()));
        };
        let records = std::mem::take(&mut self.records);
        let sink = self.sink.clone();
        Box::new(move || {
            let marker = new_marker();
            sink.add_marker(&p, &tid, marker)?;
            p.flush(FLUSH_TIMEOUT)
                .map_err(|e| sink.err("flush at the barrier", format!("{tid}: {e}")))?;
            lock(&sink.shared.parked).insert(tid.clone(), p);
            Ok(vec![serde_json::json!({
                "transactionalId": tid,
                "marker": marker,
                "checkpoint": checkpoint,
                "records": records,
            })])
        })
    }
}

impl TransactionalWriter for TransactionalKafkaWriter {
    fn write(&mut self, record: &Record) -> Result<(), SinkError> {
        if self.open.is_none() {
            self.begin()?;
        }
        let (key, value) = key_value(record);
        if let Some((_, p)) = &self.open {
            send_blocking(p, &self.sink.spec.topic, &key, &value)
                .map_err(|e| self.sink.err("send", e))?;
        }
        self.records
            .push(serde_json::json!([hex(&key), hex(&value)]));
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint: Option<u64>) -> Result<Vec<Committable>, SinkError> {
        let work = self.hand_over(checkpoint);
        self.pre_committer.run(work)
    }

    fn pre_commit_then(&mut self, checkpoint: u64, done: PreCommitted) -> Result<(), SinkError> {
        let work = self.hand_over(Some(checkpoint));
        self.pre_committer.submit(work, done);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::kafka::KafkaSinkSpec;
    use crate::kafka::sink::tests::{rec, spec};
    use rdkafka::mocking::MockCluster;

    /// On librdkafka's mock cluster (in-process mock brokers): while the pre-commit of barrier
    /// 1 cannot finish (the test holds the sink's parking lot, its last step), the writer takes
    /// the next record into a new transaction; then the pre-commit finishes and its
    /// committable lists only the record written before the barrier.
    #[test]
    fn records_go_on_while_a_pre_commit_is_in_flight_on_a_mock_cluster() {
        let mock = MockCluster::new(1).unwrap();
        mock.create_topic("out", 1, 1).unwrap();
        let spec = KafkaSinkSpec {
            transactional_id_prefix: Some("mock".into()),
            ..spec(&mock.bootstrap_servers())
        };
        let sink = TransactionalSink::new("job", "sink", &spec, None);
        let mut w = sink.writer(0).unwrap();
        w.write(&rec(1)).unwrap();
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let parked = lock(&sink.shared.parked);
        w.pre_commit_then(
            1,
            Box::new(move |r| done_tx.send(r.map_err(|e| e.to_string())).unwrap()),
        )
        .unwrap();
        w.write(&rec(2)).unwrap();
        assert!(done.is_empty(), "the pre-commit cannot have finished yet");
        drop(parked);
        let first = done.recv().unwrap().unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0]["records"].as_array().unwrap().len(), 1);
        assert_eq!(first[0]["checkpoint"], 1);
        let second = w.pre_commit(Some(2)).unwrap();
        assert_eq!(second[0]["records"].as_array().unwrap().len(), 1);
        assert_ne!(
            first[0]["transactionalId"], second[0]["transactionalId"],
            "the next records went into another producer's transaction"
        );
        sink.commit(&[first, second].concat()).unwrap();
    }
}
