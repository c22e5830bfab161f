//! The real Apache Kafka broker of `scripts/kafka-testenv.sh` for tests in any crate of the
//! workspace: started for a test (and stopped when it ends), a producer, and what a
//! `read_committed` consumer sees of a topic.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

fn testenv_args(args: &[&str]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka-testenv.sh");
    Command::new(script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run scripts/kafka-testenv.sh {args:?}: {e}"))
}

fn testenv(arg: &str) -> std::process::Output {
    testenv_args(&[arg])
}

/// A broker started by [`Broker::start`]; stopped (and its data removed) when dropped.
pub struct Broker {
    /// `bootstrap.servers` of its PLAINTEXT listener (`127.0.0.1:39092` by default).
    pub servers: String,
}

impl Broker {
    /// Starts a fresh broker (stopping one left running); `None` (the test is skipped, with a
    /// printed reason) when Kafka is not installed, except under `CI=true`, where that panics.
    ///
    /// # Panics
    /// When the script fails to start the broker, or under `CI=true` without the install.
    pub fn start() -> Option<Broker> {
        let env = String::from_utf8_lossy(&testenv("env").stdout).to_string();
        let var = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")).map(str::to_string))
        };
        if !var("KAFKA_LIBS").is_some_and(|d| PathBuf::from(d).join(".complete").exists()) {
            assert!(
                std::env::var("CI").is_err(),
                "Kafka is not installed (run scripts/kafka-testenv.sh install)"
            );
            eprintln!("SKIP: Kafka is not installed (run scripts/kafka-testenv.sh install)");
            return None;
        }
        let _ = testenv("stop");
        let out = testenv("start");
        assert!(
            out.status.success(),
            "kafka-testenv.sh start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Broker {
            servers: var("KAFKA_BROKERS").unwrap_or_else(|| "127.0.0.1:39092".into()),
        })
    }

    /// Creates `topic` with `partitions` partitions (topics are not created automatically on
    /// the test broker).
    ///
    /// # Panics
    /// When the script fails.
    pub fn create_topic(&self, topic: &str, partitions: u32) {
        let made = testenv_args(&["create-topic", topic, &partitions.to_string()]);
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
    }

    /// `streamscale load --brokers … --topic topic ARGS --trace trace` started, once its first
    /// line (which names the topic: it exists from then on) is out; the rest of its output is
    /// read and dropped. Kill it when done.
    ///
    /// # Panics
    /// When it cannot be started or its first line does not name the topic.
    pub fn start_load(&self, topic: &str, args: &[&str], trace: &Path) -> std::process::Child {
        use std::io::BufRead;
        let mut load = Command::new(crate::workspace_bin("streamscale"))
            .args(["load", "--brokers", &self.servers, "--topic", topic])
            .args(args)
            .arg("--trace")
            .arg(trace)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("streamscale load: {e}"));
        let mut out = std::io::BufReader::new(load.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        out.read_line(&mut line)
            .unwrap_or_else(|e| panic!("streamscale load's first line: {e}"));
        assert!(line.contains(topic), "{line}");
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        load
    }

    /// A producer (librdkafka's own thread sends; `linger.ms` 5).
    ///
    /// # Panics
    /// When the client cannot be created.
    pub fn producer(&self) -> KeyedProducer {
        KeyedProducer(
            ClientConfig::new()
                .set("bootstrap.servers", &self.servers)
                .set("linger.ms", "5")
                .create()
                .unwrap_or_else(|e| panic!("Kafka producer: {e}")),
        )
    }

    /// Every record of `topic`'s `partitions` partitions that a `read_committed` consumer sees,
    /// as (key, value) text, read from the beginning to each partition's end (30 s at most).
    ///
    /// # Panics
    /// When the consumer cannot be created or assigned.
    pub fn read_committed(&self, topic: &str, partitions: i32) -> Vec<(String, String)> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.servers)
            .set("group.id", "streamscale-test-reader")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .create()
            .unwrap_or_else(|e| panic!("Kafka consumer: {e}"));
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .unwrap_or_else(|e| panic!("{topic}/{p}: {e}"));
        }
        c.assign(&tpl)
            .unwrap_or_else(|e| panic!("assign {topic}: {e}"));
        let mut out = Vec::new();
        let mut at_end = BTreeSet::new();
        let until = Instant::now() + Duration::from_secs(30);
        while at_end.len() < partitions as usize && Instant::now() < until {
            match c.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    let text = |b: Option<&[u8]>| {
                        String::from_utf8_lossy(b.unwrap_or_default()).into_owned()
                    };
                    out.push((text(m.key()), text(m.payload())));
                }
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                    at_end.insert(p);
                }
                _ => {}
            }
        }
        out
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = testenv("stop");
    }
}

/// A producer of keyed text records.
pub struct KeyedProducer(ThreadedProducer<DefaultProducerContext>);

impl KeyedProducer {
    /// Queues `value` with `key` to `topic`, waiting while the local queue is full.
    pub fn send(&self, topic: &str, key: &str, value: &str) {
        let mut rec = BaseRecord::to(topic).key(key).payload(value);
        loop {
            match self.0.send(rec) {
                Ok(()) => return,
                Err((_, r)) => {
                    rec = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    /// Waits until every queued record is acknowledged (30 s at most).
    ///
    /// # Panics
    /// When they are not acknowledged in time.
    pub fn flush(&self) {
        self.0
            .flush(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("Kafka producer flush: {e}"));
    }
}
