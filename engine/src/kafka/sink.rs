//! Writing a sink's records to a Kafka topic, on the engine's two-phase-commit seam
//! ([`crate::sink::two_phase`]).
//!
//! [`AtLeastOnceWriter`] (`delivery: atLeastOnce`) sends records as they arrive and, at every
//! barrier, flushes and waits for the brokers' acknowledgements (its pre-commit), so that a
//! checkpoint never covers a record the brokers do not have; records written after the
//! restored checkpoint are written again after a restore.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::config::FromClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};

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

/// A producer whose delivery reports and client errors are served by a thread of its own (as
/// rdkafka's `ThreadedProducer`): every [`POLL_PERIOD`] it serves queued events one at a time
/// (at most [`POLL_BURST`]) while that shrinks the producer's queue (`rd_kafka_outq_len`:
/// messages not yet reported and events not yet served), and sleeps in between; `flush` serves
/// the rest itself, and [`send_blocking`] when the queue is full. Derefs to the
/// [`BaseProducer`]; stops its thread when dropped.
pub struct PolledProducer {
    producer: Arc<BaseProducer<DefaultProducerContext>>,
    stop: Arc<AtomicBool>,
    poller: Option<JoinHandle<()>>,
}

/// How often a [`PolledProducer`]'s thread serves its producer's events.
pub const POLL_PERIOD: Duration = Duration::from_millis(10);
/// Most events a [`PolledProducer`]'s thread serves per [`POLL_PERIOD`] (a delivery report
/// covers a batch of messages).
pub const POLL_BURST: u32 = 64;

impl FromClientConfig for PolledProducer {
    fn from_config(config: &rdkafka::ClientConfig) -> rdkafka::error::KafkaResult<Self> {
        let producer = Arc::new(BaseProducer::from_config(config)?);
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (producer.clone(), stop.clone());
        let poller = std::thread::Builder::new()
            .name("producer poller".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    let mut queued = p.in_flight_count();
                    for _ in 0..POLL_BURST {
                        if queued == 0 {
                            break;
                        }
                        p.poll(Duration::ZERO);
                        let left = p.in_flight_count();
                        if left >= queued {
                            break; // nothing was served: what is queued awaits the brokers
                        }
                        queued = left;
                    }
                    std::thread::park_timeout(POLL_PERIOD);
                }
            })
            .map_err(|e| {
                rdkafka::error::KafkaError::ClientCreation(format!("producer poller thread: {e}"))
            })?;
        Ok(PolledProducer {
            producer,
            stop,
            poller: Some(poller),
        })
    }
}

impl std::ops::Deref for PolledProducer {
    type Target = BaseProducer<DefaultProducerContext>;

    fn deref(&self) -> &Self::Target {
        &self.producer
    }
}

impl Drop for PolledProducer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.poller.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Kafka without transactions: an idempotent producer (`acks=all`) per subtask; records
/// are keyed, so one key's results stay in order in one partition.
pub struct AtLeastOnceWriter {
    producer: PolledProducer,
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
    producer: &PolledProducer,
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
                // Delivery reports waiting to be served hold queue room too.
                producer.poll(Duration::ZERO);
                std::thread::sleep(Duration::from_millis(2));
            }
            Err((e, _)) => return Err(format!("send to topic {topic}: {e}")),
        }
    }
}
