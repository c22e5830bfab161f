//! The engine against a REAL Apache Kafka broker (4.1, KRaft, one node) started by
//! `scripts/kafka-testenv.sh` on loopback: Kafka sources with fewer and more partitions than
//! subtasks, savepoint and restore at another parallelism (no record lost or repeated),
//! Kafka-to-Kafka through a keyed window with the engine SIGKILLed and recovered from its
//! checkpoint, and the errors for a missing topic or unreachable brokers.
//!
//! Needs `scripts/kafka-testenv.sh install` (the README's test command runs it). Without it
//! the tests are skipped locally and fail under `CI=true`. The scenarios run in sequence
//! against the script's broker, each on its own topics; those that pause a broker (SIGSTOP) run
//! against a broker of their own (other ports, its own run directory, the same jars), so that
//! no other test using the script's broker at the time is disturbed.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::EngineProcess;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use streamscale_engine::kafka::ensure_topic;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `kafka-testenv.sh arg` with the environment variables `vars` (ports, run directory).
fn testenv(arg: &str, vars: &[(String, String)]) -> std::process::Output {
    Command::new(root().join("scripts/kafka-testenv.sh"))
        .arg(arg)
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/kafka-testenv.sh")
}

/// `KEY=value` lines of `kafka-testenv.sh env` under `vars`.
fn env(vars: &[(String, String)]) -> BTreeMap<String, String> {
    String::from_utf8_lossy(&testenv("env", vars).stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A broker started by `kafka-testenv.sh`; stopped when dropped, however the test ends.
struct Broker {
    servers: String,
    /// Its directory of config, log, pid and data.
    run: PathBuf,
    /// The script's environment for this broker (empty: the script's own broker).
    vars: Vec<(String, String)>,
    /// Holds the run directory of a broker of its own (removed after the broker stopped).
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        // A broker a failed test left paused (SIGSTOP) stops at once rather than after the
        // script's grace period.
        if let Ok(pid) = std::fs::read_to_string(self.run.join("kafka.pid")) {
            let _ = Command::new("kill")
                .args(["-CONT", pid.trim()])
                .stderr(Stdio::null())
                .status();
        }
        let _ = testenv("stop", &self.vars);
    }
}

/// Whether the broker's jars are installed; panics under `CI=true` when they are not.
fn installed() -> bool {
    let installed = env(&[])
        .get("KAFKA_LIBS")
        .is_some_and(|d| Path::new(d).join(".complete").exists());
    if !installed {
        assert!(
            std::env::var("CI").is_err(),
            "Kafka is not installed (run scripts/kafka-testenv.sh install)"
        );
        eprintln!("SKIP: Kafka is not installed (run scripts/kafka-testenv.sh install)");
    }
    installed
}

/// Starts a broker under `vars` (stopping one the script left running there first).
fn start_with(vars: Vec<(String, String)>, dir: Option<tempfile::TempDir>) -> Broker {
    let env = env(&vars);
    let broker = Broker {
        servers: env["KAFKA_BROKERS"].clone(),
        run: PathBuf::from(&env["KAFKA_RUN"]),
        vars,
        _dir: dir,
    };
    let _ = testenv("stop", &broker.vars);
    let out = testenv("start", &broker.vars);
    assert!(
        out.status.success(),
        "kafka-testenv.sh start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    broker
}

/// The script's broker (ports 39092-39094 unless the environment says otherwise).
fn start_broker() -> Option<Broker> {
    installed().then(|| start_with(Vec::new(), None))
}

/// A broker of its own, on free ports and in a temporary run directory, on the script's jars.
fn start_own_broker() -> Option<Broker> {
    if !installed() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    // Three ports free now (all held until each is known, so they differ).
    let held: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let port = |i: usize| held[i].local_addr().unwrap().port().to_string();
    let vars = vec![
        ("KAFKA_PORT".to_string(), port(0)),
        ("KAFKA_CONTROLLER_PORT".to_string(), port(1)),
        ("KAFKA_SASL_PORT".to_string(), port(2)),
        (
            "KAFKA_RUN_DIR".to_string(),
            dir.path().join("run").display().to_string(),
        ),
    ];
    drop(held);
    // Checked before the script stops or starts anything there: the script's own broker
    // (which other tests may be using) is left alone.
    let run = PathBuf::from(&env(&vars)["KAFKA_RUN"]);
    assert!(
        run.starts_with(dir.path()),
        "kafka-testenv.sh does not take KAFKA_RUN_DIR: its broker would run in {}",
        run.display()
    );
    Some(start_with(vars, Some(dir)))
}

/// One broker scenario at a time in this binary: two brokers and their engines at once would
/// crowd a small machine, and the paused-broker scenarios wait for the broker's timeouts.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn producer(servers: &str) -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("linger.ms", "5")
        .create()
        .unwrap()
}

/// Produces records `from..to` as `{"n": i, "value": i % 100}` with key `k<i % keys>`.
fn produce(servers: &str, topic: &str, from: u64, to: u64, keys: u64) {
    produce_values(servers, topic, from, to, keys, |i| (i % 100) as i64);
}

/// Produces records `from..to` as `{"n": i, "value": value(i)}` with key `k<i % keys>`.
fn produce_values(
    servers: &str,
    topic: &str,
    from: u64,
    to: u64,
    keys: u64,
    value: impl Fn(u64) -> i64,
) {
    let p = producer(servers);
    for i in from..to {
        let key = format!("k{}", i % keys);
        let value = format!(r#"{{"n": {i}, "value": {}}}"#, value(i));
        let mut rec = BaseRecord::to(topic).key(&key).payload(&value);
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    rec = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

/// Every record of `topic` as a `read_committed` consumer sees it: (key, value) pairs.
fn read_committed(servers: &str, topic: &str, partitions: i32) -> Vec<(String, String)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .set("group.id", "streamscale-test-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let mut at_end = BTreeSet::new();
    let until = Instant::now() + Duration::from_secs(30);
    while at_end.len() < partitions as usize && Instant::now() < until {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let text =
                    |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
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

/// The sink file's lines as JSON.
fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits until the sink accounted `n` records (the file is flushed at barriers and at the
/// stop, so its lines are counted after the stop).
fn wait_accounted(engine: &EngineProcess, n: u64) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let job = engine.job();
        if job["recordsAccounted"].as_u64().unwrap() >= n {
            return;
        }
        assert!(
            Instant::now() < until,
            "fewer than {n} records after 60 s: {job}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn source_job(dir: &Path, servers: &str, topic: &str, parallelism: u32, out: &Path) -> PathBuf {
    let path = dir.join("kafka-source.yaml");
    std::fs::write(
        &path,
        format!(
            r#"name: kafka-source
operators:
  - {{ name: src, kind: source, parallelism: {parallelism},
      kafka: {{ topic: {topic}, bootstrapServers: "{servers}", valueField: value }} }}
  - {{ name: out, kind: sink, delivery: at-least-once, output: "{}" }}
edges:
  - {{ from: src, to: out }}
"#,
            out.display()
        ),
    )
    .unwrap();
    path
}

/// (partition, offset) of every record in the sink file; panics on a duplicate.
fn positions(out: &Path) -> BTreeSet<(i64, i64)> {
    let mut seen = BTreeSet::new();
    for l in lines(out) {
        let at = (
            l["partition"].as_i64().unwrap(),
            l["offset"].as_i64().unwrap(),
        );
        assert!(seen.insert(at), "record {at:?} written twice");
    }
    seen
}

/// Source with 4 subtasks over 3 partitions, savepoint, more records, restore with 2
/// subtasks: every record once.
fn savepoint_and_restore_at_other_parallelism(servers: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (topic, partitions) = ("in-restore", 3);
    assert!(ensure_topic(servers, topic, partitions).unwrap());
    produce(servers, topic, 0, 3000, 50);
    let out = dir.path().join("out.jsonl");
    let sps = dir.path().join("savepoints");
    let job = source_job(dir.path(), servers, topic, 4, &out);
    let mut e = EngineProcess::start(&job, &sps, &[]);
    wait_accounted(&e, 3000);
    // The backlog drains to 0 and the arrivals count the log end offsets.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let m = e.metrics();
        let backlog = common::metric_sum(&m, "streamscale_source_backlog{operator=\"src\"");
        let arrivals = common::metric_sum(&m, "streamscale_source_arrivals_total{operator=\"src\"");
        if backlog == 0.0 && arrivals >= 3000.0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "backlog {backlog}, arrivals {arrivals}:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (sp, _) = e.stop_with_savepoint(false);
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sp.join("_metadata.json")).unwrap()).unwrap();
    let offsets = &meta["sources"]["src"]["kafka_offsets"];
    let total: i64 = (0..partitions)
        .map(|p| offsets[p.to_string()].as_i64().unwrap())
        .sum();
    assert_eq!(total, 3000, "{meta}");
    assert_eq!(positions(&out).len(), 3000);

    produce(servers, topic, 3000, 5000, 50);
    let mut e = EngineProcess::start(
        &job,
        &sps,
        &["--restore", sp.to_str().unwrap(), "--parallelism", "src=2"],
    );
    wait_accounted(&e, 5000);
    let _ = e.stop_with_savepoint(false);
    let seen = positions(&out);
    assert_eq!(seen.len(), 5000);
    let ns: BTreeSet<i64> = lines(&out)
        .iter()
        .map(|l| l["value"]["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, (0..5000).collect(), "every record once");
}

/// A source with more subtasks than partitions (2 partitions, 3 subtasks) and with fewer
/// (6 partitions, 2 subtasks) reads every record once.
fn partitions_fewer_and_more_than_subtasks(servers: &str) {
    for (topic, partitions, parallelism) in [("in-few", 2, 3), ("in-many", 6, 2)] {
        let dir = tempfile::tempdir().unwrap();
        ensure_topic(servers, topic, partitions).unwrap();
        produce(servers, topic, 0, 1200, 10);
        let out = dir.path().join("out.jsonl");
        let job = source_job(dir.path(), servers, topic, parallelism, &out);
        let mut e = EngineProcess::start(&job, &dir.path().join("sp"), &[]);
        wait_accounted(&e, 1200);
        let _ = e.stop_with_savepoint(false);
        let seen = positions(&out);
        assert_eq!(seen.len(), 1200, "{topic}");
        let parts: BTreeSet<i64> = seen.iter().map(|(p, _)| *p).collect();
        assert_eq!(
            parts.len(),
            partitions as usize,
            "{topic}: every partition read"
        );
    }
}

/// Partitions added to the topic while the job runs are picked up (within the source's 5 s
/// check) and read from their start.
fn new_partitions_are_picked_up(servers: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
    use rdkafka::client::DefaultClientContext;
    let dir = tempfile::tempdir().unwrap();
    let topic = "in-growing";
    ensure_topic(servers, topic, 1).unwrap();
    produce(servers, topic, 0, 100, 5);
    let out = dir.path().join("out.jsonl");
    let job = source_job(dir.path(), servers, topic, 2, &out);
    let mut e = EngineProcess::start(&job, &dir.path().join("sp"), &[]);
    wait_accounted(&e, 100);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", servers)
        .create()
        .unwrap();
    let grow = NewPartitions::new(topic, 3);
    let r = futures::executor::block_on(admin.create_partitions([&grow], &AdminOptions::new()))
        .unwrap();
    assert!(r.iter().all(Result::is_ok), "{r:?}");
    // Keyed records spread over the 3 partitions now.
    produce(servers, topic, 100, 400, 50);
    wait_accounted(&e, 400);
    let _ = e.stop_with_savepoint(false);
    let seen = positions(&out);
    assert_eq!(seen.len(), 400);
    let parts: BTreeSet<i64> = seen.iter().map(|(p, _)| *p).collect();
    assert_eq!(parts.len(), 3, "the new partitions were read: {parts:?}");
}

/// A missing topic and unreachable brokers: the engine exits with status 1 and one line
/// naming the operator and the topic or the brokers.
fn bad_topic_and_brokers(servers: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    for (servers, topic, expect) in [
        (
            servers,
            "no-such-topic",
            "kafka topic `no-such-topic` does not exist",
        ),
        ("127.0.0.1:1", "t", "kafka brokers 127.0.0.1:1: no answer"),
    ] {
        let job = source_job(dir.path(), servers, topic, 1, &out);
        let o = Command::new(common::engine_bin())
            .arg("--job")
            .arg(&job)
            .arg("--savepoint-dir")
            .arg(dir.path().join("sp"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{err}");
        assert!(err.contains(expect) && err.contains("src"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}

/// Per key: (Σ count, Σ sum) over the window results in `topic` (read_committed).
fn totals(servers: &str, topic: &str, partitions: i32) -> BTreeMap<u64, (u64, i64)> {
    let mut t = BTreeMap::new();
    for (_, v) in read_committed(servers, topic, partitions) {
        let v: serde_json::Value = serde_json::from_str(&v).unwrap();
        let e = t.entry(v["key"].as_u64().unwrap()).or_insert((0, 0));
        e.0 += v["count"].as_u64().unwrap();
        e.1 += v["sum"].as_i64().unwrap();
    }
    t
}

fn keyed_job(dir: &Path, servers: &str, input: &str, output: &str, delivery: &str) -> PathBuf {
    keyed_job_with(dir, servers, input, output, delivery, "")
}

/// [`keyed_job`] with `window_extra` appended to the window's settings (e.g.
/// `, aggregates: [count, min]`).
fn keyed_job_with(
    dir: &Path,
    servers: &str,
    input: &str,
    output: &str,
    delivery: &str,
    window_extra: &str,
) -> PathBuf {
    let path = dir.join("kafka-keyed.yaml");
    std::fs::write(
        &path,
        format!(
            r#"name: kafka-keyed
operators:
  - {{ name: src, kind: source, parallelism: 2,
      kafka: {{ topic: {input}, bootstrapServers: "{servers}", valueField: value }} }}
  - {{ name: win, kind: window, parallelism: 2, sizeMs: 200{window_extra} }}
  - {{ name: out, kind: sink, delivery: {delivery},
      kafka: {{ topic: {output}, bootstrapServers: "{servers}" }} }}
edges:
  - {{ from: src, to: win }}
  - {{ from: win, to: out }}
checkpoint: {{ intervalSeconds: 0.3, dir: "{}" }}
"#,
            dir.join("checkpoints").display()
        ),
    )
    .unwrap();
    path
}

/// The newest completed checkpoint id in `chk` (a `chk-<id>` directory with its manifest).
fn latest_checkpoint(chk: &Path) -> u64 {
    std::fs::read_dir(chk)
        .map(|d| {
            d.flatten()
                .filter(|f| f.path().join("_metadata.json").exists())
                .filter_map(|f| {
                    f.file_name()
                        .to_string_lossy()
                        .strip_prefix("chk-")
                        .and_then(|id| id.parse().ok())
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Waits until the sink accounted `records` and a checkpoint newer than the one then
/// present completed, then SIGKILLs the engine.
fn kill_after_checkpoint(mut e: EngineProcess, records: u64, chk: &Path) {
    wait_accounted(&e, records);
    let before = latest_checkpoint(chk);
    let until = Instant::now() + Duration::from_secs(60);
    while latest_checkpoint(chk) <= before {
        assert!(Instant::now() < until, "no checkpoint in 60 s: {}", e.job());
        std::thread::sleep(Duration::from_millis(20));
    }
    e.child.kill().unwrap();
    let _ = e.child.wait();
}

/// Kafka -> keyed window -> Kafka with `delivery`, the engine SIGKILLed twice after a
/// checkpoint (input produced while it is down) and recovered from its latest checkpoint,
/// the second time at other parallelism; returns the per-key totals a `read_committed`
/// reader sees.
fn killed_run(servers: &str, delivery: &str, n: u64, keys: u64) -> BTreeMap<u64, (u64, i64)> {
    let input = format!("in-killed-{delivery}");
    let output = format!("out-killed-{delivery}");
    ensure_topic(servers, &input, 4).unwrap();
    ensure_topic(servers, &output, 2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let job = keyed_job(dir.path(), servers, &input, &output, delivery);
    let (sp, chk) = (dir.path().join("sp"), dir.path().join("checkpoints"));
    produce(servers, &input, 0, n / 2, keys);
    kill_after_checkpoint(EngineProcess::start(&job, &sp, &[]), n / 4, &chk);
    produce(servers, &input, n / 2, 3 * n / 4, keys);
    let recover = ["--recover-from", chk.to_str().unwrap()];
    kill_after_checkpoint(EngineProcess::start(&job, &sp, &recover), n / 2, &chk);
    produce(servers, &input, 3 * n / 4, n, keys);
    let rescaled = [&recover[..], &["--parallelism", "src=3,win=3"]].concat();
    let mut e = EngineProcess::start(&job, &sp, &rescaled);
    wait_accounted(&e, n);
    let _ = e.stop_with_savepoint(true);
    totals(servers, &output, 2)
}

/// Keys of [`keyed_input`].
const KEYED_INPUT_KEYS: u64 = 20;

/// Creates topic `in-keyed` (4 partitions) on `servers` and produces 4000 records over 20 keys
/// into it; returns the topic, the record count and the per-key (count, sum of values) a keyed
/// window's results must add up to.
fn keyed_input(servers: &str) -> (&'static str, u64, BTreeMap<u64, (u64, i64)>) {
    let (input, n, keys) = ("in-keyed", 4000u64, KEYED_INPUT_KEYS);
    ensure_topic(servers, input, 4).unwrap();
    produce(servers, input, 0, n, keys);
    let mut expected: BTreeMap<u64, (u64, i64)> = BTreeMap::new();
    for i in 0..n {
        let k = streamscale_engine::kafka::key_hash(Some(format!("k{}", i % keys).as_bytes()));
        let e = expected.entry(k).or_insert((0, 0));
        e.0 += 1;
        e.1 += (i % 100) as i64;
    }
    (input, n, expected)
}

/// Kafka -> keyed window -> Kafka: an undisturbed exactly-once run's per-key totals equal the
/// input's; so do those of an exactly-once run SIGKILLed twice (and rescaled at the second
/// recovery); an at-least-once run so disturbed loses no result.
fn kafka_to_kafka_keyed_with_sigkill(servers: &str) {
    let (input, n, expected) = keyed_input(servers);
    let keys = KEYED_INPUT_KEYS;
    let dir = tempfile::tempdir().unwrap();
    ensure_topic(servers, "out-calm", 2).unwrap();
    let job = keyed_job(dir.path(), servers, input, "out-calm", "exactly-once");
    let mut e = EngineProcess::start(&job, &dir.path().join("sp"), &[]);
    wait_accounted(&e, n);
    let _ = e.stop_with_savepoint(true);
    assert_eq!(totals(servers, "out-calm", 2), expected, "undisturbed run");

    assert_eq!(
        killed_run(servers, "exactly-once", n, keys),
        expected,
        "exactly-once, SIGKILLed twice: the same totals as the undisturbed run"
    );
    let got = killed_run(servers, "at-least-once", n, keys);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (k, (count, _)) in &got {
        assert!(
            *count >= expected[k].0,
            "key {k}: {count} < {:?} (a result lost)",
            expected[k]
        );
    }
}

/// The exactly-once sink's recovery on its own: a transaction pre-committed by a writer whose
/// process then "died" (the writer and its sink dropped before the commit) is written by
/// `recover` from its committable, once, also when `recover` runs twice; a committed
/// transaction is not written again.
fn transactional_sink_recovers_a_pre_committed_transaction(servers: &str) {
    use streamscale_engine::kafka::KafkaSinkSpec;
    use streamscale_engine::kafka::sink::KafkaSink;
    use streamscale_engine::record::Record;
    use streamscale_engine::sink::TwoPhaseCommitSink;
    use streamscale_engine::spec::SinkDelivery;
    let topic = "out-recover";
    ensure_topic(servers, topic, 1).unwrap();
    let spec = KafkaSinkSpec {
        topic: topic.into(),
        bootstrap_servers: servers.into(),
        transactional_id_prefix: Some("recover-test".into()),
        transaction_timeout_ms: None,
        security: None,
    };
    let rec = |key: u64| Record {
        seq: key,
        key,
        value: 1,
        count: 1,
        created_us: 0,
        payload: Default::default(),
    };
    // Transaction 1 committed, transaction 2 only pre-committed when the process died.
    let (committed, pending) = {
        let sink = KafkaSink::new("j", "out", &spec, SinkDelivery::ExactlyOnce);
        sink.recover(&[]).unwrap();
        let mut w = sink.create_writer(0, 1, "a").unwrap();
        w.write(&rec(1)).unwrap();
        let c1 = w.pre_commit(Some(1)).unwrap();
        sink.commit(&c1).unwrap();
        w.write(&rec(2)).unwrap();
        w.write(&rec(3)).unwrap();
        let c2 = w.pre_commit(Some(2)).unwrap();
        (c1, c2)
    };
    let restored: Vec<_> = committed.into_iter().chain(pending).collect();
    let sink = KafkaSink::new("j", "out", &spec, SinkDelivery::ExactlyOnce);
    sink.recover(&restored).unwrap();
    sink.recover(&restored).unwrap();
    let keys: Vec<String> = read_committed(servers, topic, 1)
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, ["1", "2", "3"], "each result once");
}

/// Sends `sig` (`-STOP`, `-CONT`) to `broker`.
fn signal_broker(broker: &Broker, sig: &str) {
    let pid = std::fs::read_to_string(broker.run.join("kafka.pid")).unwrap();
    let ok = Command::new("kill")
        .args([sig, pid.trim()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Waits until `broker`'s log says it aborted transaction `tid` because it timed out.
fn wait_timed_out_abort(broker: &Broker, tid: &str) {
    let log = broker.run.join("server.log");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text
            .lines()
            .any(|l| l.contains(tid) && l.contains("due to timeout"))
        {
            return;
        }
        assert!(
            Instant::now() < until,
            "the broker did not abort {tid} for its timeout within 30 s ({})",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A pre-committed transaction the broker aborted before its commit (the broker paused,
/// SIGSTOP, longer than the sink's `transactionTimeoutMs`): `commit` writes it again from its
/// committable under a new producer of its id, so a `read_committed` reader sees each result
/// once, and the writer goes on with its whole pool (more transactions than it has producers).
/// Then a commit while the broker stays paused fails with one error naming the transaction and
/// the checkpoint, the writer refuses to begin at once (no wait for a producer), and the
/// recovery of a restarted sink commits that transaction once.
fn commit_after_the_broker_aborted_the_transaction(broker: &Broker) {
    let servers = broker.servers.as_str();
    use streamscale_engine::kafka::KafkaSinkSpec;
    use streamscale_engine::kafka::sink::KafkaSink;
    use streamscale_engine::record::Record;
    use streamscale_engine::sink::TwoPhaseCommitSink;
    use streamscale_engine::spec::SinkDelivery;
    let topic = "out-aborted";
    ensure_topic(servers, topic, 1).unwrap();
    let spec = KafkaSinkSpec {
        topic: topic.into(),
        bootstrap_servers: servers.into(),
        transactional_id_prefix: Some("aborted-test".into()),
        transaction_timeout_ms: Some(2000),
        security: None,
    };
    let rec = |key: u64| Record {
        seq: key,
        key,
        value: 1,
        count: 1,
        created_us: 0,
        payload: Default::default(),
    };
    let keys = || -> Vec<String> {
        read_committed(servers, topic, 1)
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    let sink = KafkaSink::new("j", "out", &spec, SinkDelivery::ExactlyOnce);
    sink.recover(&[]).unwrap();
    let mut w = sink.create_writer(0, 1, "a").unwrap();
    w.write(&rec(1)).unwrap();
    w.write(&rec(2)).unwrap();
    let c1 = w.pre_commit(Some(1)).unwrap();
    let tid = c1[0]["transactionalId"].as_str().unwrap().to_string();
    signal_broker(broker, "-STOP");
    std::thread::sleep(Duration::from_secs(3));
    signal_broker(broker, "-CONT");
    wait_timed_out_abort(broker, &tid);
    sink.commit(&c1)
        .expect("a transaction the broker aborted is written again and committed");
    for (i, key) in (10..15).enumerate() {
        w.write(&rec(key)).unwrap();
        let c = w.pre_commit(Some(2 + i as u64)).unwrap();
        sink.commit(&c).unwrap();
    }
    assert_eq!(
        keys(),
        ["1", "2", "10", "11", "12", "13", "14"],
        "each result once"
    );

    w.write(&rec(20)).unwrap();
    let c7 = w.pre_commit(Some(7)).unwrap();
    let tid7 = c7[0]["transactionalId"].as_str().unwrap().to_string();
    signal_broker(broker, "-STOP");
    let failed = sink.commit(&c7);
    let refused = Instant::now();
    let begin = w.write(&rec(21));
    let refused = refused.elapsed();
    signal_broker(broker, "-CONT");
    let e = failed.expect_err("the broker is paused").to_string();
    assert!(
        e.contains(&format!(
            "transaction {tid7} of checkpoint 7 could not be committed"
        )),
        "{e}"
    );
    let begin = begin.expect_err("no producer").to_string();
    assert!(
        begin.contains(&tid7) && begin.contains("the job fails"),
        "{begin}"
    );
    assert!(
        refused < Duration::from_secs(5),
        "refused after {refused:?}"
    );
    drop(w);
    drop(sink);
    // The job's restart recovers checkpoint 7's transaction.
    let sink = KafkaSink::new("j", "out", &spec, SinkDelivery::ExactlyOnce);
    sink.recover(&c7).unwrap();
    assert_eq!(
        keys(),
        ["1", "2", "10", "11", "12", "13", "14", "20"],
        "each result once"
    );
}

/// The broker paused (SIGSTOP) for 8 s while an exactly-once Kafka -> window -> Kafka job
/// runs: the job waits and recovers by itself, and the totals equal the input's.
fn broker_paused_for_a_while(broker: &Broker) {
    let servers = broker.servers.as_str();
    let (input, n, expected) = keyed_input(servers);
    let output = "out-paused";
    ensure_topic(servers, output, 2).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let job = keyed_job(dir.path(), servers, input, output, "exactly-once");
    let mut e = EngineProcess::start(&job, &dir.path().join("sp"), &[]);
    wait_accounted(&e, n / 4);
    let busy = |e: &EngineProcess| {
        common::metric_sum(
            &e.metrics(),
            "streamscale_busy_time_seconds_total{operator=\"src\"",
        )
    };
    let before = busy(&e);
    signal_broker(broker, "-STOP");
    std::thread::sleep(Duration::from_secs(8));
    signal_broker(broker, "-CONT");
    std::thread::sleep(Duration::from_millis(500));
    // Waiting for a stalled broker is not work: the source does not look saturated (it
    // counted the 10 s metadata wait of its partition check as busy, about 8 s a subtask).
    let during = busy(&e) - before;
    assert!(
        during < 4.0,
        "the sources were busy {during:.1} s of the 8 s the broker was paused"
    );
    wait_accounted(&e, n);
    let _ = e.stop_with_savepoint(true);
    assert_eq!(
        totals(servers, output, 2),
        expected,
        "broker paused for 8 s"
    );
}

/// Kafka -> key by a JSON field (`user`, not the Kafka key) -> filter `likes >= 10` -> window
/// sum of `likes` -> Kafka exactly-once: a `read_committed` reader's per-key totals equal those
/// computed from the input; records that are not JSON or lack `user` are dead letters, counted
/// on `/metrics` and in the record balance, none emitted.
fn json_fields_keyed_filtered_window(servers: &str) {
    let (input, output, n) = ("in-json", "out-json", 3000u64);
    ensure_topic(servers, input, 3).unwrap();
    ensure_topic(servers, output, 2).unwrap();
    let p = producer(servers);
    let mut expected: BTreeMap<u64, (u64, i64)> = BTreeMap::new();
    let (mut dead, mut filtered) = (0u64, 0u64);
    for i in 0..n {
        let likes = (i * 7) % 100;
        let value = if i % 100 == 0 {
            format!("not json {i}")
        } else if i % 150 == 1 {
            format!(r#"{{"likes": {likes}, "seq": {i}}}"#)
        } else {
            format!(r#"{{"user": "u{}", "likes": {likes}, "seq": {i}}}"#, i % 7)
        };
        if i % 100 == 0 || i % 150 == 1 {
            dead += 1;
        } else if likes < 10 {
            filtered += 1;
        } else {
            let k = streamscale_engine::kafka::key_hash(Some(format!("u{}", i % 7).as_bytes()));
            let e = expected.entry(k).or_insert((0, 0));
            e.0 += 1;
            e.1 += likes as i64;
        }
        let key = format!("k{}", i % 5);
        let mut rec = BaseRecord::to(input).key(&key).payload(&value);
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    rec = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    p.flush(Duration::from_secs(30)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("kafka-json.yaml");
    std::fs::write(
        &job,
        format!(
            r#"name: kafka-json
operators:
  - name: src
    kind: source
    parallelism: 2
    kafka:
      topic: {input}
      bootstrapServers: "{servers}"
      keyBy: user
      valueField: likes
      schema: {{ name: post, fields: {{ user: string, likes: int, seq: int }} }}
  - {{ name: popular, kind: filter, where: "likes >= 10" }}
  - {{ name: win, kind: window, parallelism: 2, sizeMs: 200 }}
  - {{ name: out, kind: sink, kafka: {{ topic: {output}, bootstrapServers: "{servers}" }} }}
edges:
  - {{ from: src, to: popular }}
  - {{ from: popular, to: win }}
  - {{ from: win, to: out }}
checkpoint: {{ intervalSeconds: 0.3, dir: "{}" }}
"#,
            dir.path().join("checkpoints").display()
        ),
    )
    .unwrap();
    let mut e = EngineProcess::start(&job, &dir.path().join("sp"), &[]);
    let good: u64 = expected.values().map(|v| v.0).sum();
    wait_accounted(&e, good);
    // The dead letters of a partition may come after its last good record.
    let until = Instant::now() + Duration::from_secs(20);
    let invalid = loop {
        let got = common::metric_sum(&e.metrics(), "streamscale_records_invalid_total");
        if got >= dead as f64 || Instant::now() > until {
            break got;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = e.stop_with_savepoint(true);
    assert_eq!(
        totals(servers, output, 2),
        expected,
        "keyed by user, filtered, summed"
    );
    assert_eq!(invalid, dead as f64, "every dead letter counted");
    assert_eq!(good + filtered + dead, n);
}

/// Kafka -> window `aggregates: [count, sum, min, max]` -> Kafka exactly-once, SIGKILLed once
/// after a checkpoint (more input produced while it is down) and recovered at other
/// parallelism: every result is `{"key", "count", "sum", "min", "max"}`; per key, the counts
/// and sums add up to the input's (no result lost or repeated), the smallest `min` and the
/// largest `max` are the input's, and each result's min and max are values of its key with
/// `min · count <= sum <= max · count`. (The windows are processing-time windows, so which
/// records share a window is not known outside; the restored panes carry their extrema.)
fn window_min_max_exactly_once_across_sigkill(servers: &str) {
    let (input, output, n, keys) = ("in-minmax", "out-minmax", 3000u64, 12u64);
    ensure_topic(servers, input, 3).unwrap();
    ensure_topic(servers, output, 2).unwrap();
    // Values spread over -500..500, per key a different set.
    let value = |i: u64| ((i * 7919 + (i % keys) * 131) % 1000) as i64 - 500;
    // Per key: count, sum, min, max, and the set of its values.
    let mut expected: BTreeMap<u64, (u64, i64, i64, i64)> = BTreeMap::new();
    let mut values: BTreeMap<u64, BTreeSet<i64>> = BTreeMap::new();
    for i in 0..n {
        let k = streamscale_engine::kafka::key_hash(Some(format!("k{}", i % keys).as_bytes()));
        let v = value(i);
        let e = expected.entry(k).or_insert((0, 0, i64::MAX, i64::MIN));
        *e = (e.0 + 1, e.1 + v, e.2.min(v), e.3.max(v));
        values.entry(k).or_default().insert(v);
    }
    let dir = tempfile::tempdir().unwrap();
    let job = keyed_job_with(
        dir.path(),
        servers,
        input,
        output,
        "exactly-once",
        ", aggregates: [count, sum, min, max]",
    );
    let (sp, chk) = (dir.path().join("sp"), dir.path().join("checkpoints"));
    produce_values(servers, input, 0, n / 2, keys, value);
    kill_after_checkpoint(EngineProcess::start(&job, &sp, &[]), n / 4, &chk);
    produce_values(servers, input, n / 2, n, keys, value);
    let recover = [
        "--recover-from",
        chk.to_str().unwrap(),
        "--parallelism",
        "src=3,win=3",
    ];
    let mut e = EngineProcess::start(&job, &sp, &recover);
    wait_accounted(&e, n);
    let _ = e.stop_with_savepoint(true);
    let mut got: BTreeMap<u64, (u64, i64, i64, i64)> = BTreeMap::new();
    for (_, v) in read_committed(servers, output, 2) {
        let r: serde_json::Value = serde_json::from_str(&v).unwrap();
        let fields: BTreeSet<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            fields,
            BTreeSet::from(["key", "count", "sum", "min", "max"]),
            "{r}"
        );
        let k = r["key"].as_u64().unwrap();
        let (count, sum) = (r["count"].as_u64().unwrap(), r["sum"].as_i64().unwrap());
        let (min, max) = (r["min"].as_i64(), r["max"].as_i64());
        let (Some(min), Some(max)) = (min, max) else {
            panic!("a restored pane lost its min/max: {r}")
        };
        assert!(
            values[&k].contains(&min) && values[&k].contains(&max),
            "{r}"
        );
        let c = count as i64;
        assert!(min <= max && min * c <= sum && sum <= max * c, "{r}");
        let e = got.entry(k).or_insert((0, 0, i64::MAX, i64::MIN));
        *e = (e.0 + count, e.1 + sum, e.2.min(min), e.3.max(max));
    }
    assert_eq!(got, expected, "per key: count, sum, min, max");
}

/// Event time from Kafka timestamps: records with chosen timestamps in 3 partitions (out of
/// order within each partition by less than the bound) -> `eventWindow` (tumbling 1 s, keyed
/// by the Kafka key) on 2 source subtasks. Partitions 0 and 1 then get one record each far
/// ahead; partition 2 gets none and goes idle, so it stops holding the watermark back: every
/// window of the data fires, each with exactly the input's count per key, and the window of
/// the far records does not (no watermark passed it).
fn event_time_windows_on_kafka_timestamps(servers: &str) {
    // An hour ago, on a whole second (the broker refuses timestamps more than an hour ahead).
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let (input, keys) = ("in-event-time", 4u64);
    let base = now_ms / 1000 * 1000 - 3_600_000;
    ensure_topic(servers, input, 3).unwrap();
    let p = producer(servers);
    let send = |partition: i32, key: &str, ts: i64| {
        let mut rec = BaseRecord::to(input)
            .partition(partition)
            .key(key)
            .payload("{}")
            .timestamp(ts);
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    rec = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    };
    // Per (key hash, window start): the count the window must report.
    let mut expected: BTreeMap<(u64, i64), u64> = BTreeMap::new();
    for i in 0..600u64 {
        let partition = (i % 3) as i32;
        // 0..6 s of event time, each partition's records up to 900 ms out of order.
        let ts = base + (i * 10) as i64 - if i % 4 == 1 { 900 } else { 0 };
        let ts = ts.max(base);
        let key = format!("k{}", (i / 3) % keys);
        send(partition, &key, ts);
        let k = streamscale_engine::kafka::key_hash(Some(key.as_bytes()));
        *expected.entry((k, ts - ts % 1000)).or_insert(0) += 1;
    }
    p.flush(Duration::from_secs(30)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("windows.jsonl");
    let job = dir.path().join("kafka-event-time.yaml");
    std::fs::write(
        &job,
        format!(
            r#"name: kafka-event-time
operators:
  - {{ name: src, kind: source, parallelism: 2,
      kafka: {{ topic: {input}, bootstrapServers: "{servers}",
               eventTime: {{ maxOutOfOrdernessMs: 1000, idleTimeoutMs: 1500 }} }} }}
  - {{ name: win, kind: eventWindow, parallelism: 2, key: key, window: {{ tumbling: {{ sizeMs: 1000 }} }} }}
  - {{ name: out, kind: sink, delivery: at-least-once, output: "{}" }}
edges:
  - {{ from: src, to: win }}
  - {{ from: win, to: out }}
"#,
            out.display()
        ),
    )
    .unwrap();
    let mut e = EngineProcess::start(&job, &dir.path().join("sp"), &[]);
    // Far ahead in partitions 0 and 1 only, once the data has been read.
    std::thread::sleep(Duration::from_millis(500));
    send(0, "k0", base + 60_000);
    send(1, "k1", base + 60_000);
    p.flush(Duration::from_secs(30)).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while e.job()["recordsAccounted"].as_u64().unwrap() < expected.len() as u64 {
        assert!(
            Instant::now() < until,
            "windows did not fire on Kafka time within 60 s: {}",
            e.job()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let late = common::metric_sum(&e.metrics(), "streamscale_late_records_dropped_total");
    let _ = e.stop_with_savepoint(false);
    let mut got: BTreeMap<(u64, i64), u64> = BTreeMap::new();
    for r in lines(&out) {
        let (k, start, end) = (
            r["key"].as_u64().unwrap(),
            r["windowStart"].as_i64().unwrap(),
            r["windowEnd"].as_i64().unwrap(),
        );
        assert_eq!(end - start, 1000, "{r}");
        let before = got.insert((k, start), r["count"].as_u64().unwrap());
        assert!(before.is_none(), "window fired twice: {r}");
    }
    assert_eq!(got, expected, "per key and event-time window");
    assert_eq!(late, 0.0, "no record was late");
}

#[test]
fn kafka_against_a_real_broker() {
    let _turn = one_at_a_time();
    let Some(broker) = start_broker() else { return };
    let t0 = Instant::now();
    bad_topic_and_brokers(&broker.servers);
    partitions_fewer_and_more_than_subtasks(&broker.servers);
    new_partitions_are_picked_up(&broker.servers);
    savepoint_and_restore_at_other_parallelism(&broker.servers);
    transactional_sink_recovers_a_pre_committed_transaction(&broker.servers);
    kafka_to_kafka_keyed_with_sigkill(&broker.servers);
    json_fields_keyed_filtered_window(&broker.servers);
    window_min_max_exactly_once_across_sigkill(&broker.servers);
    event_time_windows_on_kafka_timestamps(&broker.servers);
    eprintln!("kafka scenarios took {:?}", t0.elapsed());
}

/// The scenarios that pause their broker (SIGSTOP), on a broker of their own.
#[test]
fn kafka_with_the_broker_paused() {
    let _turn = one_at_a_time();
    let Some(broker) = start_own_broker() else {
        return;
    };
    let t0 = Instant::now();
    commit_after_the_broker_aborted_the_transaction(&broker);
    broker_paused_for_a_while(&broker);
    eprintln!("paused-broker scenarios took {:?}", t0.elapsed());
}
