//! Writing a sink's records to a Kafka topic, on the engine's two-phase-commit seam
//! ([`crate::sink::two_phase`]).
//!
//! [`AtLeastOnceWriter`] (`delivery: atLeastOnce`) sends records as they arrive and, at every
//! barrier, flushes and waits for the brokers' acknowledgements (its pre-commit), so that a
//! checkpoint never covers a record the brokers do not have; records written after the
//! restored checkpoint are written again after a restore.

use std::time::Duration;

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use super::KafkaSinkSpec;
use crate::payload::Payload;
use crate::record::Record;
use crate::sink::{Committable, SinkError, TransactionalWriter, TwoPhaseCommitSink};
use crate::spec::SinkDelivery;

use super::transactional::TransactionalSink;

/// How long a pre-commit waits for the brokers to acknowledge every record sent.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// The Kafka key and value a sink writes for `rec`: a record read from Kafka keeps its key
/// and value bytes; a query row or event is its JSON; any other record (a `window`'s result)
/// is `{"key": K, "count": C, "sum": S}` keyed by the decimal key.
pub fn key_value(rec: &Record) -> (Vec<u8>, Vec<u8>) {
    match &rec.payload {
        Payload::Kafka(k) => (
            k.key.clone().unwrap_or_default(),
            k.value.clone().unwrap_or_default(),
        ),
        p => {
            let value = p.to_json().unwrap_or_else(
                || serde_json::json!({"key": rec.key, "count": rec.count, "sum": rec.value}),
            );
            (
                rec.key.to_string().into_bytes(),
                value.to_string().into_bytes(),
            )
        }
    }
}

/// A Kafka sink operator: its subtasks' writers by delivery guarantee.
#[derive(Debug)]
pub struct KafkaSink {
    spec: KafkaSinkSpec,
    /// Job and operator names (client ids).
    job: String,
    operator: String,
    /// The exactly-once sink (`None`: at-least-once).
    transactions: Option<TransactionalSink>,
}

impl KafkaSink {
    /// The sink `operator` of job `job` writing to `spec`'s topic with `delivery`.
    pub fn new(
        job: &str,
        operator: &str,
        spec: &KafkaSinkSpec,
        delivery: SinkDelivery,
    ) -> KafkaSink {
        KafkaSink {
            spec: spec.clone(),
            job: job.to_string(),
            operator: operator.to_string(),
            transactions: (delivery == SinkDelivery::ExactlyOnce)
                .then(|| TransactionalSink::new(job, operator, spec)),
        }
    }
}

impl TwoPhaseCommitSink for KafkaSink {
    fn create_writer(
        &self,
        subtask: u32,
        _parallelism: u32,
        _attempt: &str,
    ) -> Result<Box<dyn TransactionalWriter>, SinkError> {
        let client = format!("streamscale-{}-{}-{subtask}", self.job, self.operator);
        match &self.transactions {
            None => Ok(Box::new(AtLeastOnceWriter::new(
                &self.spec,
                &self.operator,
                &client,
            )?)),
            Some(t) => Ok(Box::new(t.writer(subtask)?)),
        }
    }

    fn commit(&self, committables: &[Committable]) -> Result<(), SinkError> {
        self.transactions
            .as_ref()
            .map_or(Ok(()), |t| t.commit(committables))
    }

    fn recover(&self, restored: &[Committable]) -> Result<(), SinkError> {
        self.transactions
            .as_ref()
            .map_or(Ok(()), |t| t.recover(restored))
    }
}

/// Kafka without transactions: an idempotent producer (`acks=all`) per subtask; records
/// are keyed, so one key's results stay in order in one partition.
pub struct AtLeastOnceWriter {
    producer: ThreadedProducer<DefaultProducerContext>,
    topic: String,
    sink: String,
}

impl AtLeastOnceWriter {
    /// The writer of sink `sink` (operator name) for `spec`'s topic, named `client_id`.
    ///
    /// # Errors
    /// [`SinkError::External`] when librdkafka refuses the configuration.
    pub fn new(
        spec: &KafkaSinkSpec,
        sink: &str,
        client_id: &str,
    ) -> Result<AtLeastOnceWriter, SinkError> {
        let producer = spec
            .client_config()
            .set("client.id", client_id)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .create()
            .map_err(|e| SinkError::External {
                sink: format!("{sink} (kafka topic {})", spec.topic),
                action: "create producer",
                reason: e.to_string(),
            })?;
        Ok(AtLeastOnceWriter {
            producer,
            topic: spec.topic.clone(),
            sink: format!("{sink} (kafka topic {})", spec.topic),
        })
    }
}

impl TransactionalWriter for AtLeastOnceWriter {
    fn write(&mut self, record: &Record) -> Result<(), SinkError> {
        let (key, value) = key_value(record);
        send_blocking(&self.producer, &self.topic, &key, &value).map_err(|reason| {
            SinkError::External {
                sink: self.sink.clone(),
                action: "send",
                reason,
            }
        })
    }

    fn pre_commit(&mut self, _checkpoint: Option<u64>) -> Result<Vec<Committable>, SinkError> {
        self.producer
            .flush(FLUSH_TIMEOUT)
            .map_err(|e| SinkError::External {
                sink: self.sink.clone(),
                action: "flush at the barrier",
                reason: e.to_string(),
            })?;
        Ok(Vec::new())
    }
}

/// Sends one record, waiting while the producer's local queue is full (backpressure).
///
/// # Errors
/// librdkafka's message for any other refusal, or a queue still full after [`FLUSH_TIMEOUT`].
pub fn send_blocking(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    key: &[u8],
    value: &[u8],
) -> Result<(), String> {
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
            Err((e, _)) => return Err(format!("send to topic {topic}: {e}")),
        }
    }
}
