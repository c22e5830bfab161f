//! Kafka `security:` against a REAL Apache Kafka broker (4.1, KRaft) started by
//! `scripts/kafka-testenv.sh`, whose second listener takes SASL_PLAINTEXT with mechanism PLAIN
//! (the script's test-only user): a job reads a topic and writes another through that listener
//! with the password from a file; a wrong password, SASL_SSL
//! and SCRAM are refused at start with one line naming the field, never the password.
//!
//! Needs `scripts/kafka-testenv.sh install` (the README's test command runs it). Without it the
//! test is skipped locally and fails under `CI=true`.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::EngineProcess;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use streamscale_engine::kafka::ensure_topic;

fn testenv(arg: &str) -> std::process::Output {
    Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka-testenv.sh"))
        .arg(arg)
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/kafka-testenv.sh")
}

/// Stops the broker when the test ends.
struct Broker;

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = testenv("stop");
    }
}

fn sasl_client(env: &BTreeMap<String, String>) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &env["KAFKA_SASL_BROKERS"])
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", "PLAIN")
        .set("sasl.username", &env["KAFKA_SASL_USER"])
        .set("sasl.password", &env["KAFKA_SASL_PASSWORD"]);
    c
}

fn job(dir: &Path, env: &BTreeMap<String, String>, security: &str, out_topic: &str) -> PathBuf {
    let path = dir.join("sasl.yaml");
    let servers = &env["KAFKA_SASL_BROKERS"];
    std::fs::write(
        &path,
        format!(
            r#"name: kafka-sasl
operators:
  - {{ name: src, kind: source, parallelism: 2,
      kafka: {{ topic: sasl-in, bootstrapServers: "{servers}", valueField: value,
               security: {security} }} }}
  - {{ name: out, kind: sink, delivery: at-least-once,
      kafka: {{ topic: {out_topic}, bootstrapServers: "{servers}", security: {security} }} }}
edges:
  - {{ from: src, to: out }}
"#
        ),
    )
    .unwrap();
    path
}

/// Records in `topic` (partition 0..parts), read through the SASL listener.
fn count(env: &BTreeMap<String, String>, topic: &str, parts: i32) -> usize {
    let c: BaseConsumer = sasl_client(env)
        .set("group.id", "sasl-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..parts {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let (mut n, mut eof) = (0, 0);
    let until = Instant::now() + Duration::from_secs(30);
    while eof < parts && Instant::now() < until {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(_)) => n += 1,
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => eof += 1,
            _ => {}
        }
    }
    n
}

fn refused(job: &Path, dir: &Path) -> String {
    let o = Command::new(common::engine_bin())
        .arg("--job")
        .arg(job)
        .arg("--savepoint-dir")
        .arg(dir.join("sp"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{err}");
    err
}

#[test]
fn sasl_plain_source_and_sink_against_a_real_broker() {
    let env: BTreeMap<String, String> = String::from_utf8_lossy(&testenv("env").stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if !env
        .get("KAFKA_LIBS")
        .is_some_and(|d| Path::new(d).join(".complete").exists())
    {
        assert!(
            std::env::var("CI").is_err(),
            "Kafka is not installed (run scripts/kafka-testenv.sh install)"
        );
        eprintln!("SKIP: Kafka is not installed (run scripts/kafka-testenv.sh install)");
        return;
    }
    let _ = testenv("stop");
    let out = testenv("start");
    assert!(
        out.status.success(),
        "kafka-testenv.sh start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _broker = Broker;
    let password = env["KAFKA_SASL_PASSWORD"].clone();
    let user = env["KAFKA_SASL_USER"].clone();
    let plain = &env["KAFKA_BROKERS"];
    for (t, p) in [("sasl-in", 2), ("sasl-out", 3)] {
        ensure_topic(plain, t, p).unwrap();
    }
    // Records produced through the SASL listener.
    let p: ThreadedProducer<DefaultProducerContext> = sasl_client(&env).create().unwrap();
    for i in 0..500u64 {
        let v = format!(r#"{{"value": {i}}}"#);
        let k = format!("k{i}");
        p.send(BaseRecord::to("sasl-in").key(&k).payload(&v))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    p.flush(Duration::from_secs(30)).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let pw_file = dir.path().join("kafka-password");
    std::fs::write(&pw_file, format!("{password}\n")).unwrap();

    // 1. The password from a file: every record through.
    let sec = format!(
        "{{ protocol: SASL_PLAINTEXT, mechanism: PLAIN, username: {user}, passwordFile: \"{}\" }}",
        pw_file.display()
    );
    let j = job(dir.path(), &env, &sec, "sasl-out");
    let mut e = EngineProcess::start(&j, &dir.path().join("sp"), &[]);
    let until = Instant::now() + Duration::from_secs(60);
    while e.job()["recordsAccounted"].as_u64().unwrap() < 500 {
        assert!(Instant::now() < until, "not 500 records: {}", e.job());
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = e.stop_with_savepoint(false);
    assert_eq!(count(&env, "sasl-out", 3), 500);

    // 2. The password from an environment variable that is not set: named.
    let sec_env = format!(
        "{{ protocol: SASL_PLAINTEXT, username: {user}, passwordEnv: TEST_KAFKA_PASSWORD_UNSET }}"
    );
    let o = Command::new(common::engine_bin())
        .arg("--job")
        .arg(job(dir.path(), &env, &sec_env, "sasl-out"))
        .arg("--savepoint-dir")
        .arg(dir.path().join("sp"))
        .env_remove("TEST_KAFKA_PASSWORD_UNSET")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("kafka.security.passwordEnv") && err.contains("TEST_KAFKA_PASSWORD_UNSET"),
        "{err}"
    );

    // 3. A wrong password: refused at start, the password not repeated.
    std::fs::write(&pw_file, "not-the-password-7f3\n").unwrap();
    let j = job(dir.path(), &env, &sec, "sasl-out");
    let err = refused(&j, dir.path());
    assert!(err.contains("src"), "{err}");
    assert!(err.contains("Authentication failed"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!err.contains("not-the-password-7f3"), "{err}");
    // A missing password file: named.
    let missing = sec.replace("kafka-password", "no-such-file");
    let err = refused(&job(dir.path(), &env, &missing, "sasl-out"), dir.path());
    assert!(
        err.contains("kafka.security.passwordFile") && err.contains("no-such-file"),
        "{err}"
    );

    // 4. What this build lacks (no OpenSSL in its librdkafka): one line naming the field.
    for (security, field) in [
        (
            format!("{{ protocol: SASL_SSL, username: {user}, passwordEnv: P }}"),
            "kafka.security.protocol",
        ),
        (
            format!(
                "{{ protocol: SASL_PLAINTEXT, mechanism: SCRAM-SHA-256, username: {user}, passwordEnv: P }}"
            ),
            "kafka.security.mechanism",
        ),
    ] {
        let err = refused(&job(dir.path(), &env, &security, "sasl-out"), dir.path());
        assert!(
            err.contains(field) && err.contains("OpenSSL"),
            "{field}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}
