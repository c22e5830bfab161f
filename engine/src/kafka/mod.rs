//! Apache Kafka as a source and a sink of the engine: the job file's `kafka:` settings,
//! the assignment of partitions to source subtasks, and the client configuration shared by
//! the source, the sink and `streamscale load`.
//!
//! The client is `rdkafka` (librdkafka, bundled and built from source).

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::{Deserialize, Serialize};

use crate::json_extract::{FieldPaths, Leaf};

pub mod batch_read;
pub mod security;
pub mod sink;
pub mod transactional;
pub mod transactional_writer;

/// A Kafka source (`kafka:` on a `source` operator).
///
/// ```yaml
/// - { name: src, kind: source, parallelism: 2,
///     kafka: { topic: events, bootstrapServers: "127.0.0.1:9092", valueField: value } }
/// ```
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaSourceSpec {
    /// The topic to read (must exist; all of its partitions are read, new ones as they appear).
    pub topic: String,
    /// Comma-separated `host:port` list of brokers to bootstrap from.
    pub bootstrap_servers: String,
    /// Consumer group the source commits its offsets to after each completed checkpoint, for
    /// monitoring only (positions are restored from checkpoints and savepoints, never from
    /// the group). Default `streamscale-<job>-<operator>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// A field (dotted path) of the JSON value whose integer becomes the record's value
    /// (aggregated by `window`; a float is truncated). Without `schema` and `keyBy` a value
    /// that is not a JSON object with that integer field gives 0; with either, such a record
    /// is a dead letter (`streamscale_records_invalid_total`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_field: Option<String>,
    /// Authentication to the brokers ([`security::KafkaSecurity`]); default plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<security::KafkaSecurity>,
    /// What records are keyed by (what `window` groups by): `kafkaKey` (the default: the
    /// Kafka record's key) or a field (dotted path) of the JSON value. A record without that
    /// field, or whose value is not JSON, is a dead letter: counted in
    /// `streamscale_records_invalid_total{operator, subtask}` and as filtered, never emitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_by: Option<String>,
    /// The named schema of the topic's JSON values: `keyBy`, `valueField` and the `where` of
    /// `filter` operators downstream are checked against it when the job is loaded (and
    /// records not matching it at those fields are dead letters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Box<crate::json_field::Schema>>,
    /// Event time from the records' Kafka timestamps, with per-partition watermarks (as
    /// Flink's KafkaSource), so that `eventWindow`s downstream fire on Kafka time. Without it
    /// the source emits no watermarks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<KafkaEventTime>,
}

/// `eventTime:` of a Kafka source: the bounded out-of-orderness of the watermarks and when a
/// partition counts as idle (Flink's `forBoundedOutOfOrderness(...).withIdleness(...)`).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaEventTime {
    /// How far (ms) a record's timestamp may lag behind the largest one of its partition
    /// and still be on time: a partition's watermark is its largest timestamp minus this
    /// minus 1 ms (the Nexmark source's setting of the same name). Default 0.
    #[serde(default)]
    pub max_out_of_orderness_ms: u64,
    /// A partition without records for this long (ms of wall-clock time) no longer holds the
    /// subtask's watermark back, until its next record. Absent: partitions never idle (an
    /// empty partition then stops the event-time windows). A subtask that owns no partition
    /// is always idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
}

/// `keyBy` for the Kafka record's key.
pub const KEY_BY_KAFKA_KEY: &str = "kafkaKey";

impl KafkaSourceSpec {
    /// The JSON field records are keyed by (`None`: the Kafka key).
    pub fn key_field(&self) -> Option<&str> {
        self.key_by.as_deref().filter(|k| *k != KEY_BY_KAFKA_KEY)
    }

    /// Whether records are read strictly: with a schema or a key field, a value that is not
    /// JSON or lacks a field used is a dead letter rather than value 0.
    pub fn strict(&self) -> bool {
        self.schema.is_some() || self.key_field().is_some()
    }
}

/// A Kafka sink (`kafka:` on a `sink` operator).
///
/// ```yaml
/// - { name: out, kind: sink, delivery: at-least-once,
///     kafka: { topic: results, bootstrapServers: "127.0.0.1:9092" } }
/// ```
///
/// The sink's `delivery` applies: `exactly-once` (the default) writes one Kafka transaction
/// per subtask and checkpoint, committed when the checkpoint completes
/// ([`transactional`]); `at-least-once` sends records as they arrive and flushes them at every
/// barrier ([`sink::AtLeastOnceWriter`]).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaSinkSpec {
    /// The topic to write (must exist).
    pub topic: String,
    /// Comma-separated `host:port` list of brokers to bootstrap from.
    pub bootstrap_servers: String,
    /// Prefix of the sink's transactional ids (`<prefix>-<subtask>`). Default
    /// `streamscale-<job>-<operator>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transactional_id_prefix: Option<String>,
    /// `transaction.timeout.ms` of the exactly-once sink's producers, ms: the brokers abort a
    /// transaction open longer than this (it must not exceed their
    /// `transaction.max.timeout.ms`). Each transactional call waits at most this long too.
    /// 1000 to 900000; default [`transactional::TRANSACTION_TIMEOUT_MS`] (30 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction_timeout_ms: Option<u32>,
    /// Authentication to the brokers ([`security::KafkaSecurity`]); default plaintext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<security::KafkaSecurity>,
}

/// [`base_config`] with `security` applied (the password read now).
pub fn client_config(
    bootstrap_servers: &str,
    security: Option<&security::KafkaSecurity>,
) -> ClientConfig {
    let mut c = base_config(bootstrap_servers);
    if let Some(s) = security {
        s.apply(&mut c);
    }
    c
}

impl KafkaSourceSpec {
    /// The client configuration of this source: brokers and security.
    pub fn client_config(&self) -> ClientConfig {
        client_config(&self.bootstrap_servers, self.security.as_ref())
    }
}

impl KafkaSinkSpec {
    /// The client configuration of this sink: brokers and security.
    pub fn client_config(&self) -> ClientConfig {
        client_config(&self.bootstrap_servers, self.security.as_ref())
    }
}

/// Errors talking to Kafka.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// The brokers could not be reached or answered with an error.
    #[error("kafka brokers {brokers}: {reason}")]
    Brokers {
        /// The bootstrap servers as configured.
        brokers: String,
        /// What went wrong.
        reason: String,
    },
    /// The topic does not exist.
    #[error("kafka topic `{topic}` does not exist on {brokers}")]
    NoTopic {
        /// The topic.
        topic: String,
        /// The bootstrap servers.
        brokers: String,
    },
    /// The `security` settings cannot be used (the password cannot be read, ...).
    #[error(transparent)]
    Security(#[from] security::SecurityError),
    /// A client call failed.
    #[error("kafka {what}: {source}")]
    Client {
        /// Which call.
        what: String,
        /// rdkafka's error.
        source: rdkafka::error::KafkaError,
    },
}

/// How long metadata requests wait for the brokers before the topic check fails.
pub const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// The client configuration every streamscale Kafka client starts from: `bootstrap.servers`
/// and a short reconnect backoff.
pub fn base_config(bootstrap_servers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap_servers)
        .set("reconnect.backoff.max.ms", "1000")
        .set("log_level", "3");
    c
}

/// The partition count of `topic`, asking the brokers (waits at most [`METADATA_TIMEOUT`]).
///
/// # Errors
/// [`KafkaError::Brokers`] when no broker answers (or the address is malformed),
/// [`KafkaError::NoTopic`] when the topic does not exist.
pub fn partition_count(bootstrap_servers: &str, topic: &str) -> Result<i32, KafkaError> {
    partition_count_as(bootstrap_servers, None, topic)
}

/// [`partition_count`] with `security` settings.
///
/// # Errors
/// As [`partition_count`].
pub fn partition_count_as(
    bootstrap_servers: &str,
    security: Option<&security::KafkaSecurity>,
    topic: &str,
) -> Result<i32, KafkaError> {
    let brokers_err = |reason: String| KafkaError::Brokers {
        brokers: bootstrap_servers.to_string(),
        reason,
    };
    if bootstrap_servers.trim().is_empty() {
        return Err(brokers_err("no bootstrap servers given".into()));
    }
    if let Some(s) = security {
        // One clear error naming the field when the password cannot be read.
        s.password("kafka.security")?;
    }
    let consumer: BaseConsumer<LastError> = client_config(bootstrap_servers, security)
        .create_with_context(LastError::default())
        .map_err(|e| brokers_err(e.to_string()))?;
    partition_count_with(&consumer, bootstrap_servers, topic).map_err(|e| match e {
        // The metadata request's error is only "transport failure"; librdkafka's own error
        // says why (e.g. "SASL authentication error: Authentication failed ...").
        KafkaError::Brokers { brokers, reason } => {
            // Serves the queued error events (the context's callback runs in poll).
            for _ in 0..5 {
                let _ = consumer.poll(Duration::from_millis(20));
            }
            let reason = match consumer.context().last() {
                Some(why) => format!("{reason}; client errors: {why}"),
                None => reason,
            };
            KafkaError::Brokers { brokers, reason }
        }
        other => other,
    })
}

/// A client context keeping librdkafka's errors (authentication failures are reported only
/// there): the first few distinct ones, in order.
#[derive(Default)]
pub struct LastError(std::sync::Mutex<Vec<String>>);

impl LastError {
    /// The errors librdkafka reported, joined with `; `; `None` when there were none.
    pub fn last(&self) -> Option<String> {
        let g = self.0.lock().ok()?;
        (!g.is_empty()).then(|| g.join("; "))
    }
}

impl rdkafka::ClientContext for LastError {
    /// Silent: what matters reaches [`LastError::last`] and the one-line error built from it.
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, _fac: &str, _message: &str) {}

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        let line = format!("{error}: {reason}")
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        if let Ok(mut g) = self.0.lock()
            && g.len() < 3
            && !g.contains(&line)
        {
            g.push(line);
        }
    }
}

impl rdkafka::consumer::ConsumerContext for LastError {}

/// [`partition_count`] through an existing consumer.
///
/// # Errors
/// As [`partition_count`].
pub fn partition_count_with<X: rdkafka::consumer::ConsumerContext, C: Consumer<X>>(
    consumer: &C,
    bootstrap_servers: &str,
    topic: &str,
) -> Result<i32, KafkaError> {
    let md = consumer
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|e| KafkaError::Brokers {
            brokers: bootstrap_servers.to_string(),
            reason: format!("no answer within {} s ({e})", METADATA_TIMEOUT.as_secs()),
        })?;
    let t = md.topics().iter().find(|t| t.name() == topic);
    match t {
        Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
            Ok(t.partitions().len() as i32)
        }
        _ => Err(KafkaError::NoTopic {
            topic: topic.to_string(),
            brokers: bootstrap_servers.to_string(),
        }),
    }
}

/// Creates `topic` with `partitions` partitions (replication factor 1) unless it exists;
/// returns whether it created it.
///
/// # Errors
/// [`KafkaError::Brokers`] when the brokers cannot be reached, [`KafkaError::Client`] when
/// they refuse the topic.
pub fn ensure_topic(
    bootstrap_servers: &str,
    topic: &str,
    partitions: i32,
) -> Result<bool, KafkaError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    match partition_count(bootstrap_servers, topic) {
        Ok(_) => return Ok(false),
        Err(KafkaError::NoTopic { .. }) => {}
        Err(e) => return Err(e),
    }
    let admin: AdminClient<DefaultClientContext> = base_config(bootstrap_servers)
        .create()
        .map_err(|source| KafkaError::Client {
            what: "admin client".into(),
            source,
        })?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(METADATA_TIMEOUT));
    let results =
        futures::executor::block_on(admin.create_topics([&new], &opts)).map_err(|source| {
            KafkaError::Client {
                what: format!("create topic {topic}"),
                source,
            }
        })?;
    for r in results {
        if let Err((_, code)) = r
            && code != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists
        {
            return Err(KafkaError::Client {
                what: format!("create topic {topic}"),
                source: rdkafka::error::KafkaError::AdminOp(code),
            });
        }
    }
    Ok(true)
}

/// Java's `String.hashCode` (over UTF-16 code units, wrapping 32-bit arithmetic).
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The source subtask (of `parallelism`) that reads `partition` of `topic`: Flink's
/// `KafkaSourceEnumerator.getSplitOwner`, `(((javaHash(topic) * 31) & 0x7FFFFFFF) %
/// parallelism + partition) % parallelism`, so consecutive partitions go to consecutive
/// subtasks from a topic-dependent start.
pub fn split_owner(topic: &str, partition: i32, parallelism: u32) -> u32 {
    let p = i64::from(parallelism.max(1));
    let start = i64::from(java_string_hash(topic).wrapping_mul(31) & 0x7FFF_FFFF) % p;
    ((start + i64::from(partition.max(0))) % p) as u32
}

/// The partitions (of `partitions`) subtask `index` of `parallelism` reads.
pub fn owned_partitions(topic: &str, partitions: i32, index: u32, parallelism: u32) -> Vec<i32> {
    (0..partitions)
        .filter(|&p| split_owner(topic, p, parallelism) == index)
        .collect()
}

/// The engine's 64-bit record key for a Kafka key: FNV-1a over the bytes, then murmur3's
/// finalizer (a record without a key gets key 0). Key groups are computed from it as from
/// any other key.
pub fn key_hash(key: Option<&[u8]>) -> u64 {
    let Some(bytes) = key else { return 0 };
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    crate::keygroup::murmur_fmix64(h)
}

/// A strict source's ([`KafkaSourceSpec::strict`]) key and value of a record with Kafka key
/// `key` and value bytes `value`: the key hash of the `keyBy` field's bytes
/// ([`crate::json_field::key_bytes`]) or of the Kafka key, and the integer at `valueField`
/// (0 without one).
///
/// # Errors
/// Why the record is a dead letter: the value is not a JSON object, or a field is missing
/// or (`valueField`) not a number.
pub fn read_fields(
    spec: &KafkaSourceSpec,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> Result<(u64, i64), crate::json_field::Invalid> {
    FieldReader::new(spec).read(key, value)
}

/// [`read_fields`] over a `serde_json::Value` tree: for paths a [`FieldPaths`] cannot read
/// together.
fn read_fields_tree(
    key_field: Option<&str>,
    value_field: Option<&str>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> Result<(u64, i64), crate::json_field::Invalid> {
    let json = crate::json_field::parse_object(value)?;
    let k = match key_field {
        Some(f) => key_hash(Some(&crate::json_field::key_bytes(&json, f)?)),
        None => key_hash(key),
    };
    let v = match value_field {
        Some(f) => crate::json_field::int_at(&json, f)?,
        None => 0,
    };
    Ok((k, v))
}

/// A strict source's reader of record keys and values ([`read_fields`]), made once per
/// source subtask: reads the `keyBy` and `valueField` fields in one pass over the value.
#[derive(Debug, Clone)]
pub struct FieldReader {
    key_field: Option<String>,
    value_field: Option<String>,
    /// The fields' paths and the slots of `keyBy` and `valueField` in them (`None` when
    /// there are no fields, or when one path starts the other: then a `Value` tree).
    paths: Option<(FieldPaths, Option<usize>, Option<usize>)>,
}

impl FieldReader {
    /// The reader of `spec`'s `keyBy` and `valueField`.
    pub fn new(spec: &KafkaSourceSpec) -> FieldReader {
        let key_field = spec.key_field().map(str::to_string);
        let value_field = spec.value_field.clone();
        let paths = match (&key_field, &value_field) {
            (None, None) => None,
            (Some(k), None) => FieldPaths::dotted(&[k]).ok().map(|p| (p, Some(0), None)),
            (None, Some(v)) => FieldPaths::dotted(&[v]).ok().map(|p| (p, None, Some(0))),
            (Some(k), Some(v)) if k == v => {
                FieldPaths::dotted(&[k]).ok().map(|p| (p, Some(0), Some(0)))
            }
            (Some(k), Some(v)) => FieldPaths::dotted(&[k, v])
                .ok()
                .map(|p| (p, Some(0), Some(1))),
        };
        FieldReader {
            key_field,
            value_field,
            paths,
        }
    }

    /// The key hash and value of a record, as [`read_fields`].
    ///
    /// # Errors
    /// As [`read_fields`].
    pub fn read(
        &self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<(u64, i64), crate::json_field::Invalid> {
        use crate::json_field::Invalid;
        let Some((paths, key_slot, value_slot)) = &self.paths else {
            return read_fields_tree(
                self.key_field.as_deref(),
                self.value_field.as_deref(),
                key,
                value,
            );
        };
        let mut out: [Option<Leaf<'_>>; 2] = [None, None];
        let out = &mut out[..paths.len()];
        paths.read(value.ok_or(Invalid::NotJson)?, out)?;
        let k = match (key_slot, &self.key_field) {
            (Some(i), Some(f)) => key_hash(Some(
                &out[*i]
                    .as_ref()
                    .ok_or_else(|| Invalid::Missing(f.clone()))?
                    .key_bytes(),
            )),
            _ => key_hash(key),
        };
        let v = match (value_slot, &self.value_field) {
            (Some(i), Some(f)) => out[*i]
                .as_ref()
                .ok_or_else(|| Invalid::Missing(f.clone()))?
                .int()
                .ok_or_else(|| Invalid::WrongType(f.clone()))?,
            _ => 0,
        };
        Ok((k, v))
    }
}

/// The `valueField` of a source that is not strict ([`KafkaSourceSpec::strict`]): the integer
/// at a top-level field of JSON object values (the name as written, dots included), read
/// leniently: 0 when the value is not one JSON object, lacks the field, or holds anything but
/// an integer in the range of `i64` there.
#[derive(Debug, Clone)]
pub struct LenientValueField {
    paths: FieldPaths,
}

impl LenientValueField {
    /// The reader of top-level field `field` (`None` for an empty name).
    pub fn new(field: &str) -> Option<LenientValueField> {
        FieldPaths::new(vec![vec![field.to_string()]])
            .ok()
            .map(|paths| LenientValueField { paths })
    }

    /// The field's integer in `value`, or 0.
    pub fn read(&self, value: &[u8]) -> i64 {
        let mut out = [None];
        match self.paths.read(value, &mut out) {
            Ok(()) => match &out[0] {
                Some(Leaf::Number(n)) => n.as_i64().unwrap_or(0),
                _ => 0,
            },
            Err(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The integer at top-level field `field` of a JSON object `value`, or 0.
    fn json_int_field(value: &[u8], field: &str) -> i64 {
        LenientValueField::new(field).map_or(0, |f| f.read(value))
    }

    #[test]
    fn strict_sources_key_by_a_json_field_and_name_dead_letters() {
        use crate::json_field::Invalid;
        let spec: KafkaSourceSpec = serde_json::from_str(
            r#"{"topic": "t", "bootstrapServers": "b:1", "keyBy": "user.id", "valueField": "n"}"#,
        )
        .unwrap();
        assert!(spec.strict());
        let v = br#"{"user": {"id": "ann"}, "n": 7}"#;
        assert_eq!(
            read_fields(&spec, Some(b"other"), Some(v)),
            Ok((key_hash(Some(b"ann")), 7))
        );
        assert_eq!(
            read_fields(&spec, None, Some(br#"{"n": 7}"#)),
            Err(Invalid::Missing("user.id".into()))
        );
        assert_eq!(
            read_fields(&spec, None, Some(br#"{"user": {"id": 1}, "n": "x"}"#)),
            Err(Invalid::WrongType("n".into()))
        );
        assert_eq!(
            read_fields(&spec, None, Some(b"n=7")),
            Err(Invalid::NotJson)
        );
        // keyBy kafkaKey: the Kafka key, as without keyBy.
        let spec = KafkaSourceSpec {
            key_by: Some(KEY_BY_KAFKA_KEY.into()),
            ..spec
        };
        assert!(!spec.strict());
        assert_eq!(
            read_fields(&spec, Some(b"k1"), Some(br#"{"n": 2}"#)),
            Ok((key_hash(Some(b"k1")), 2))
        );
    }

    proptest::proptest! {
        /// The one-pass reader and the `Value` tree agree on every record: keys by nested
        /// fields, values of every type, escapes, duplicates, not JSON.
        #[test]
        fn field_reader_agrees_with_the_value_tree(
            user in proptest::sample::select(vec![
                r#""ann""#, r#""a\u006en""#, "7", "7.0", "-0", "true", "null", r#"{"b":1,"a":2}"#, "[1]",
            ]),
            n in proptest::sample::select(vec![
                "7", r#""7""#, "1.9", "-1.9", "1e19", "18446744073709551615", "null", "[]", "true",
                "1e400",
            ]),
            shape in 0..6usize,
            key_by in proptest::sample::select(vec!["user.id", "user", "n", "kafkaKey"]),
        ) {
            let text = match shape {
                0 => format!(r#"{{"user": {{"id": {user}}}, "n": {n}}}"#),
                1 => format!(r#"{{"n": 0, "user": {{"id": 1, "id": {user}}}, "n": {n}}}"#),
                2 => format!(r#"{{"user": {{"id": {user}}}, "user": 5, "n": {n}}}"#),
                3 => format!(r#"{{"u\u0073er": {{"id": {user}, "x": [{n}]}}, "\u006e": {n}}}"#),
                4 => format!(r#"{{"n": {n}}}"#),
                _ => format!(r#"{{"user": {{"id": {user}}}, "n": {n}"#),
            };
            let spec = KafkaSourceSpec {
                key_by: Some(key_by.to_string()),
                value_field: Some("n".into()),
                ..serde_json::from_str(r#"{"topic": "t", "bootstrapServers": "b:1"}"#).unwrap()
            };
            let tree = read_fields_tree(
                spec.key_field(),
                spec.value_field.as_deref(),
                Some(b"k"),
                Some(text.as_bytes()),
            );
            proptest::prop_assert_eq!(
                read_fields(&spec, Some(b"k"), Some(text.as_bytes())),
                tree,
                "{}",
                text
            );
        }
    }

    #[test]
    fn java_hash_matches_java() {
        // "hello".hashCode() == 99162322, "".hashCode() == 0, "events".hashCode() == -1291329255
        assert_eq!(java_string_hash("hello"), 99_162_322);
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("events"), -1_291_329_255);
    }

    #[test]
    fn every_partition_has_one_owner_and_owners_are_balanced() {
        for parallelism in 1..=8u32 {
            for partitions in 1..=12i32 {
                let mut seen = vec![0u32; partitions as usize];
                let mut per = vec![0usize; parallelism as usize];
                for i in 0..parallelism {
                    for p in owned_partitions("t", partitions, i, parallelism) {
                        seen[p as usize] += 1;
                        per[i as usize] += 1;
                    }
                }
                assert!(seen.iter().all(|&n| n == 1));
                let (lo, hi) = (per.iter().min(), per.iter().max());
                assert!(hi.zip(lo).is_some_and(|(h, l)| h - l <= 1), "{per:?}");
            }
        }
    }

    fn problem(yaml: &str) -> String {
        match crate::spec::JobSpec::from_yaml(yaml) {
            Err(e) => e,
            Ok(spec) => spec.validate().err().unwrap_or_default(),
        }
    }

    #[test]
    fn kafka_settings_are_validated_naming_the_field() {
        let job = |src: &str, sink: &str| {
            format!(
                "name: j\noperators:\n  - {src}\n  - {sink}\nedges:\n  - {{ from: s, to: o }}\n"
            )
        };
        let ok_sink = "{ name: o, kind: sink }";
        let kafka = r#"kafka: { topic: t, bootstrapServers: "127.0.0.1:9092" }"#;
        assert_eq!(
            problem(&job(
                &format!("{{ name: s, kind: source, {kafka} }}"),
                ok_sink
            )),
            ""
        );
        let e = problem(&job("{ name: s, kind: source }", ok_sink));
        assert!(e.contains("operators[0] (s): missing field `rate`"), "{e}");
        let e = problem(&job(
            &format!("{{ name: s, kind: source, rate: {{ constant: 5 }}, {kafka} }}"),
            ok_sink,
        ));
        assert!(
            e.contains("operators[0] (s).kafka: a Kafka source takes no `rate`"),
            "{e}"
        );
        let e = problem(&job(
            r#"{ name: s, kind: source, kafka: { topic: t, bootstrapServers: "localhost" } }"#,
            ok_sink,
        ));
        assert!(
            e.contains("operators[0] (s).kafka.bootstrapServers: `localhost` is not host:port"),
            "{e}"
        );
        let e = problem(&job(
            r#"{ name: s, kind: source, kafka: { topic: "a b", bootstrapServers: "h:1" } }"#,
            ok_sink,
        ));
        assert!(
            e.contains("operators[0] (s).kafka.topic: `a b` is not a Kafka topic name"),
            "{e}"
        );
        let e = problem(&job(
            "{ name: s, kind: source, rate: { constant: 5 } }",
            r#"{ name: o, kind: sink, output: x, kafka: { topic: t, bootstrapServers: "h:1" } }"#,
        ));
        assert!(
            e.contains("operators[1] (o): a sink writes either to `output` or to `kafka`"),
            "{e}"
        );
    }

    #[test]
    fn value_field_is_read_from_json_objects_only() {
        assert_eq!(json_int_field(br#"{"value": 7, "k": "a"}"#, "value"), 7);
        assert_eq!(json_int_field(br#"{"value": "7"}"#, "value"), 0);
        assert_eq!(json_int_field(b"not json", "value"), 0);
        // Whatever the reader's path (its plain scan or serde), the answer of a `Map` parse:
        // the last of duplicates, escapes, integers only, a dotted name taken as written.
        let lenient = |v: &[u8], f: &str| {
            serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(v)
                .ok()
                .and_then(|m| m.get(f).and_then(serde_json::Value::as_i64))
                .unwrap_or(0)
        };
        for (v, f) in [
            (&br#"{"value": 1, "value": 2}"#[..], "value"),
            (br#"{"va\u006cue": 3}"#, "value"),
            (br#"{"value": 7.9}"#, "value"),
            (br#"{"value": -9223372036854775808}"#, "value"),
            (br#"{"value": 18446744073709551615}"#, "value"),
            (br#"{"value": [1]}"#, "value"),
            (br#"{"a.b": 4, "a": {"b": 5}}"#, "a.b"),
            (br#"{"value": 7} x"#, "value"),
            (br#"[{"value": 7}]"#, "value"),
            (br#" {"value" : 12 , "n": {"value": 1}} "#, "value"),
        ] {
            assert_eq!(
                json_int_field(v, f),
                lenient(v, f),
                "{}",
                String::from_utf8_lossy(v)
            );
        }
        assert_ne!(key_hash(Some(b"a")), key_hash(Some(b"b")));
        assert_eq!(key_hash(None), 0);
    }
}
