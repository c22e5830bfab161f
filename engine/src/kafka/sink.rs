//! Writing a sink's records to a Kafka topic, on the engine's two-phase-commit seam
//! ([`crate::sink::two_phase`]).
//!
//! [`AtLeastOnceWriter`] (`delivery: atLeastOnce`) sends records as they arrive and, at every
//! barrier, flushes and waits for the brokers' acknowledgements (its pre-commit), so that a
//! checkpoint never covers a record the brokers do not have; records written after the
//! restored checkpoint are written again after a restore.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::config::{FromClientConfig, FromClientConfigAndContext};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};

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
                .then(|| TransactionalSink::new(job, operator, spec, None)),
        }
    }

    /// The prefix of its transactional ids; `None` for an at-least-once sink.
    pub fn transactional_id_prefix(&self) -> Option<&str> {
        self.transactions.as_ref().map(TransactionalSink::prefix)
    }

    /// With `Some(scope)`, an exactly-once sink without a `transactionalIdPrefix` names its
    /// transactional ids `streamscale-SCOPE-<job>-<operator>-…` ([`TransactionalSink::new`]).
    #[must_use]
    pub fn with_transactional_id_scope(mut self, scope: Option<&str>) -> KafkaSink {
        if self.transactions.is_some() {
            self.transactions = Some(TransactionalSink::new(
                &self.job,
                &self.operator,
                &self.spec,
                scope,
            ));
        }
        self
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

/// A producer's delivery reports as they are served: how many came back and which failed
/// (librdkafka gave up on the message: it is not in the topic).
#[derive(Debug, Default)]
pub struct DeliveryReports {
    /// Reports served, failed or not.
    reported: AtomicU64,
    /// Reports of failed deliveries.
    failed: AtomicU64,
    /// The first failure: partition and librdkafka's error.
    first_failure: Mutex<Option<String>>,
}

impl DeliveryReports {
    /// Reports served so far, failed or not.
    pub fn reported(&self) -> u64 {
        self.reported.load(Ordering::Acquire)
    }

    /// Failed deliveries so far, and the first one's partition and error.
    pub fn failures(&self) -> Option<(u64, String)> {
        let n = self.failed.load(Ordering::Acquire);
        (n > 0).then(|| {
            let first = self
                .first_failure
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_default();
            (n, first)
        })
    }
}

impl ClientContext for DeliveryReports {}

impl ProducerContext for DeliveryReports {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            let mut first = self.first_failure.lock().unwrap_or_else(|p| p.into_inner());
            if first.is_none() {
                *first = Some(format!("partition {}: {e}", m.partition()));
            }
            self.failed.fetch_add(1, Ordering::Release);
        }
        // Counted last: a report counted here has its failure recorded.
        self.reported.fetch_add(1, Ordering::Release);
    }
}

/// A producer whose delivery reports and client errors are served by a thread of its own (as
/// rdkafka's `ThreadedProducer`): every [`POLL_PERIOD`] it serves queued events one at a time
/// (at most [`POLL_BURST`]) while that shrinks the producer's queue (`rd_kafka_outq_len`:
/// messages not yet reported and events not yet served), and sleeps in between; `flush` serves
/// the rest itself, and [`send_blocking`] when the queue is full. Derefs to the
/// [`BaseProducer`], whose context counts the [`DeliveryReports`]; stops its thread when
/// dropped.
pub struct PolledProducer {
    producer: Arc<BaseProducer<DeliveryReports>>,
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
        let producer = Arc::new(BaseProducer::from_config_and_context(
            config,
            DeliveryReports::default(),
        )?);
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
    type Target = BaseProducer<DeliveryReports>;

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
    /// Records handed to the producer (each gets one delivery report).
    sent: u64,
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
            sent: 0,
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
        })?;
        self.sent += 1;
        Ok(())
    }

    /// Flushes, waits for every record's delivery report and fails when any record this
    /// writer sent failed delivery (the checkpoint then fails and the job restarts from the
    /// previous one, sending those records again). Failures are not forgotten: once one is
    /// seen, every later pre-commit of this writer fails too.
    fn pre_commit(&mut self, _checkpoint: Option<u64>) -> Result<Vec<Committable>, SinkError> {
        let err = |action, reason: String| SinkError::External {
            sink: self.sink.clone(),
            action,
            reason,
        };
        let start = std::time::Instant::now();
        self.producer
            .flush(FLUSH_TIMEOUT)
            .map_err(|e| err("flush at the barrier", e.to_string()))?;
        // The flush returns once every report left librdkafka's queue; the polling thread may
        // still be serving the last one.
        let reports = self.producer.context();
        while reports.reported() < self.sent {
            if start.elapsed() > FLUSH_TIMEOUT {
                return Err(err(
                    "flush at the barrier",
                    format!(
                        "{} of {} delivery reports after {FLUSH_TIMEOUT:?}",
                        reports.reported(),
                        self.sent
                    ),
                ));
            }
            self.producer.poll(Duration::ZERO);
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some((n, first)) = reports.failures() {
            return Err(err(
                "deliver",
                format!(
                    "{n} record(s) failed delivery to topic {} (first: {first})",
                    self.topic
                ),
            ));
        }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    /// A record of key `key` (and sequence number), value 1.
    pub(crate) fn rec(key: u64) -> Record {
        Record {
            seq: key,
            key,
            value: 1,
            count: 1,
            created_us: 0,
            payload: Payload::None,
        }
    }

    /// A sink to topic `out` at `servers`, every option at its default.
    pub(crate) fn spec(servers: &str) -> KafkaSinkSpec {
        KafkaSinkSpec {
            topic: "out".into(),
            bootstrap_servers: servers.into(),
            transactional_id_prefix: None,
            transaction_timeout_ms: None,
            security: None,
        }
    }

    /// A scope goes into the default transactional id prefix (two jobs of one name under two
    /// scopes never share ids); an explicit `transactionalIdPrefix` is kept as written; an
    /// at-least-once sink has none.
    #[test]
    fn a_transactional_id_scope_names_the_default_prefix_only() {
        let exactly = |spec: &KafkaSinkSpec, scope: Option<&str>| {
            KafkaSink::new("job", "out", spec, SinkDelivery::ExactlyOnce)
                .with_transactional_id_scope(scope)
                .transactional_id_prefix()
                .map(str::to_string)
        };
        let plain = spec("127.0.0.1:1");
        assert_eq!(
            exactly(&plain, None).as_deref(),
            Some("streamscale-job-out")
        );
        assert_eq!(
            exactly(&plain, Some("team-a.orders")).as_deref(),
            Some("streamscale-team-a.orders-job-out")
        );
        assert_ne!(exactly(&plain, Some("a.x")), exactly(&plain, Some("b.x")));
        let named = KafkaSinkSpec {
            transactional_id_prefix: Some("mine".into()),
            ..plain.clone()
        };
        assert_eq!(exactly(&named, Some("a.x")).as_deref(), Some("mine"));
        let at_least_once = KafkaSink::new("job", "out", &plain, SinkDelivery::AtLeastOnce)
            .with_transactional_id_scope(Some("a.x"));
        assert_eq!(at_least_once.transactional_id_prefix(), None);
    }

    /// librdkafka's mock cluster (in-process mock brokers) refusing produce requests: the
    /// barrier's pre-commit fails naming the sink, topic and librdkafka's error, and keeps
    /// failing; without the refusal the same writer's pre-commit succeeds.
    #[test]
    fn pre_commit_fails_when_a_record_failed_delivery_on_a_mock_cluster() {
        let mock = MockCluster::new(1).expect("mock cluster");
        mock.create_topic("out", 1, 1).expect("mock topic");
        let mut w =
            AtLeastOnceWriter::new(&spec(&mock.bootstrap_servers()), "sink", "c").expect("writer");
        w.write(&rec(1)).expect("write");
        assert!(w.pre_commit(Some(1)).expect("delivered").is_empty());

        mock.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
        );
        w.write(&rec(2)).expect("write");
        let e = w
            .pre_commit(Some(2))
            .expect_err("a lost record fails the barrier");
        let e = e.to_string();
        assert!(e.contains("sink (kafka topic out)"), "{e}");
        assert!(e.contains("failed delivery to topic out"), "{e}");
        assert!(e.to_lowercase().contains("too large"), "{e}");
        assert!(
            w.pre_commit(Some(3)).is_err(),
            "the failure is not forgotten"
        );
    }
}
