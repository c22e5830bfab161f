//! Writing a sink's records to a Kafka topic.
//!
//! [`CheckpointedWriter`] is the seam between a sink subtask and its output system at the
//! checkpoint boundaries (Flink's two-phase-committing sink: write, pre-commit at the
//! barrier, commit when the checkpoint completes, abort what no checkpoint covers).
//! [`AtLeastOnceWriter`] implements it for Kafka without transactions: pre-commit flushes
//! every record sent so far and waits for the brokers' acknowledgements, so that a
//! checkpoint never covers a record the brokers do not have; records written after the
//! restored checkpoint are written again after a restore.

use std::time::Duration;

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use super::{KafkaError, KafkaSinkSpec, base_config};

/// How long a pre-commit waits for the brokers to acknowledge every record sent.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// A sink's output at the checkpoint boundaries (two-phase commit).
pub trait CheckpointedWriter: Send {
    /// Sends one record (`key`, `value` bytes).
    ///
    /// # Errors
    /// [`KafkaError::Client`] when the producer refuses it (its queue stays full).
    fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), KafkaError>;

    /// At the barrier of checkpoint `checkpoint`: makes everything written so far durable
    /// (but, for a transactional writer, not yet visible).
    ///
    /// # Errors
    /// [`KafkaError::Client`] when the brokers did not acknowledge it in time; the checkpoint
    /// must then not complete.
    fn pre_commit(&mut self, checkpoint: u64) -> Result<(), KafkaError>;

    /// Checkpoint `checkpoint` completed: makes what its pre-commit prepared visible.
    ///
    /// # Errors
    /// [`KafkaError::Client`] when the commit failed.
    fn commit(&mut self, checkpoint: u64) -> Result<(), KafkaError>;
}

/// Kafka without transactions: records are sent as they arrive (keyed by the record's key,
/// so one key's results stay in order in one partition) and flushed at every barrier.
pub struct AtLeastOnceWriter {
    producer: ThreadedProducer<DefaultProducerContext>,
    topic: String,
}

impl AtLeastOnceWriter {
    /// An idempotent producer (`acks=all`) for `spec`'s topic, named `client_id`.
    ///
    /// # Errors
    /// [`KafkaError::Client`] when librdkafka refuses the configuration.
    pub fn new(spec: &KafkaSinkSpec, client_id: &str) -> Result<AtLeastOnceWriter, KafkaError> {
        let producer = base_config(&spec.bootstrap_servers)
            .set("client.id", client_id)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .create()
            .map_err(|source| KafkaError::Client {
                what: format!("producer for topic {}", spec.topic),
                source,
            })?;
        Ok(AtLeastOnceWriter {
            producer,
            topic: spec.topic.clone(),
        })
    }
}

impl CheckpointedWriter for AtLeastOnceWriter {
    fn write(&mut self, key: &[u8], value: &[u8]) -> Result<(), KafkaError> {
        send_blocking(&self.producer, &self.topic, key, value)
    }

    fn pre_commit(&mut self, checkpoint: u64) -> Result<(), KafkaError> {
        self.producer
            .flush(FLUSH_TIMEOUT)
            .map_err(|source| KafkaError::Client {
                what: format!("flush at checkpoint {checkpoint}"),
                source,
            })
    }

    fn commit(&mut self, _checkpoint: u64) -> Result<(), KafkaError> {
        Ok(())
    }
}

/// Sends one record, waiting while the producer's local queue is full (backpressure).
///
/// # Errors
/// [`KafkaError::Client`] for any other refusal, or a queue still full after 60 s.
pub fn send_blocking(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    key: &[u8],
    value: &[u8],
) -> Result<(), KafkaError> {
    let mut record = BaseRecord::to(topic).key(key).payload(value);
    let start = std::time::Instant::now();
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                r,
            )) if start.elapsed() < FLUSH_TIMEOUT => {
                record = r;
                std::thread::sleep(Duration::from_millis(2));
            }
            Err((source, _)) => {
                return Err(KafkaError::Client {
                    what: format!("send to topic {topic}"),
                    source,
                });
            }
        }
    }
}
