//! `streamscale load` against a REAL Apache Kafka broker started by
//! `scripts/kafka-testenv.sh` (skipped locally without the install, fails under `CI=true`):
//! the topic is created, receives the trace's records at its rate as JSON keyed by `key`, and
//! unreachable brokers are one error line with exit status 1.
#![allow(missing_docs, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use streamscale_tests::kafka_broker::Broker;
use streamscale_tests::workspace_bin;

/// Every record's value in `topic` (3 partitions).
fn values(servers: &str, topic: &str) -> Vec<serde_json::Value> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", "load-test")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let (mut out, mut ended) = (Vec::new(), BTreeSet::new());
    let until = Instant::now() + Duration::from_secs(30);
    while ended.len() < 3 && Instant::now() < until {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
                assert_eq!(v["key"].as_str().unwrap().as_bytes(), m.key().unwrap());
                out.push(v);
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            _ => {}
        }
    }
    out
}

#[test]
fn load_produces_a_trace_at_its_rate() {
    let Some(broker) = Broker::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // 200 records/s for 10 trace-seconds, then 600/s: at speedup 5, 2 s at 200/s then 600/s.
    let trace = dir.path().join("trace.csv");
    std::fs::write(&trace, "t_seconds,rate\n0,200\n10,600\n20,600\n").unwrap();
    let t0 = Instant::now();
    let out = Command::new(workspace_bin("streamscale"))
        .args([
            "load",
            "--brokers",
            &broker.servers,
            "--topic",
            "load-test",
            "--partitions",
            "3",
        ])
        .args(["--keys", "7", "--speedup", "5", "--duration", "3"])
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("created topic load-test with 3 partitions"),
        "{stdout}"
    );
    // ∫ rate over 3 s = 2 s × 200 + 1 s × 600 = 1000 records.
    let vs = values(&broker.servers, "load-test");
    assert!(
        (990..=1000).contains(&vs.len()),
        "{} records in {took:?}",
        vs.len()
    );
    let seqs: BTreeSet<u64> = vs.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs.len(), vs.len(), "no record twice");
    let keys: BTreeSet<&str> = vs.iter().map(|v| v["key"].as_str().unwrap()).collect();
    assert!(keys.len() <= 7 && keys.len() >= 5, "{keys:?}");
    assert!(
        stdout.contains(&format!("sent {} records", vs.len())),
        "{stdout}"
    );

    let out = Command::new(workspace_bin("streamscale"))
        .args([
            "load",
            "--brokers",
            "127.0.0.1:1",
            "--topic",
            "t",
            "--duration",
            "1",
        ])
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("streamscale: kafka brokers 127.0.0.1:1: no answer"),
        "{err}"
    );
}
