//! A Kafka StreamJob end to end, with real parts: the operator binary against a REAL
//! kube-apiserver + etcd (`scripts/k8s-testenv.sh`), a REAL Apache Kafka broker
//! (`scripts/kafka-testenv.sh`) and the engine Deployment's pod run as a local
//! `streamscale-engine` process by the test's kubelet (`common/cluster.rs`: it reruns the
//! container with the same arguments when it exits, as restartPolicy `Always` does).
//!
//! * `a_kafka_job_is_scaled_partition_aligned_and_heals_after_its_pod_dies`: Kafka (6
//!   partitions) -> keyed window (count and sum per key) -> Kafka exactly-once, produced to at
//!   1200 records/s while one source subtask reads about 900 (1 ms of `io` per record). The
//!   operator scales the source to a divisor of its partitions; then the engine process is
//!   SIGKILLed (the pod dies) and restarted with the same arguments: it recovers from the
//!   latest completed checkpoint in the checkpoint directory the operator put on the savepoint
//!   volume (`--checkpoint-dir ... --recover`), the StreamJob counts the recovery
//!   (`status.recoveries`, `status.recoveredFrom`, Warning Event `EngineRecovered`) and is
//!   Ready again, and a `read_committed` reader of the output sees every key's count and sum
//!   exactly once.
//!
//! Skipped locally without the control-plane binaries or the Kafka install; fails under
//! CI=true.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::cluster::*;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use streamscale_operator::crd::Phase;
use streamscale_tests::kafka_broker::Broker;

const RATE: u64 = 1200;
const KEYS: u64 = 40;

/// (count, sum) per key hash: what the window results must add up to.
type Totals = BTreeMap<u64, (u64, i64)>;

fn record(i: u64) -> (String, String) {
    (
        format!("k{}", i % KEYS),
        format!(r#"{{"n": {i}, "value": {}}}"#, i % 100),
    )
}

fn expected(n: u64) -> Totals {
    let mut t = Totals::new();
    for i in 0..n {
        let (key, _) = record(i);
        let e = t
            .entry(streamscale_engine::kafka::key_hash(Some(key.as_bytes())))
            .or_insert((0, 0));
        e.0 += 1;
        e.1 += (i % 100) as i64;
    }
    t
}

fn committed_totals(broker: &Broker, topic: &str) -> Totals {
    let mut t = Totals::new();
    for (_, v) in broker.read_committed(topic, 2) {
        let v: serde_json::Value = serde_json::from_str(&v).expect("JSON window result");
        let e = t.entry(v["key"].as_u64().expect("key")).or_insert((0, 0));
        e.0 += v["count"].as_u64().expect("count");
        e.1 += v["sum"].as_i64().expect("sum");
    }
    t
}

/// Produces `record(0..)` at [`RATE`] records/s until `stop`; returns how many.
fn produce_until(
    broker: &Broker,
    topic: String,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let producer = broker.producer();
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut n = 0;
        while !stop.load(Ordering::SeqCst) {
            let due = (start.elapsed().as_secs_f64() * RATE as f64) as u64;
            while n < due {
                let (k, v) = record(n);
                producer.send(&topic, &k, &v);
                n += 1;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        producer.flush();
        n
    })
}

/// The newest completed checkpoint (`chk-<id>/` with its manifest) in `dir`.
fn latest_checkpoint(dir: &Path) -> Option<(u64, PathBuf)> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.path().join("_metadata.json").is_file())
        .filter_map(|e| {
            let id = e
                .file_name()
                .to_string_lossy()
                .strip_prefix("chk-")?
                .parse()
                .ok()?;
            Some((id, e.path()))
        })
        .max()
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_job_is_scaled_partition_aligned_and_heals_after_its_pod_dies() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let Some(broker) = tokio::task::spawn_blocking(Broker::start)
        .await
        .expect("broker")
    else {
        return;
    };
    let Some(mut w) = World::new("kafka", false).await else {
        return;
    };
    let (input, output) = (
        format!("sj-in-{}", std::process::id()),
        format!("sj-out-{}", std::process::id()),
    );
    streamscale_engine::kafka::ensure_topic(&broker.servers, &input, 6).expect("input topic");
    streamscale_engine::kafka::ensure_topic(&broker.servers, &output, 2).expect("output topic");

    let stop = Arc::new(AtomicBool::new(false));
    let producing = produce_until(&broker, input.clone(), stop.clone());
    let kubelet = Kubelet::start(w.admin.clone(), &w.ns, w.dir.path(), w.port);
    w.start_operator();
    // As examples/jobs/kafka-tweets.yaml: Kafka in, a keyed window, Kafka out exactly once.
    let job = serde_json::json!({
        "name": JOB,
        "maxParallelism": 12,
        "channelCapacity": 64,
        "operators": [
            {"name": "source", "kind": "source", "io": 1000, "scaling": {"min": 1, "max": 6},
             "kafka": {"topic": input, "bootstrapServers": broker.servers, "valueField": "value"}},
            {"name": "counts", "kind": "window", "sizeMs": 500, "scaling": {"min": 1, "max": 2}},
            {"name": "sink", "kind": "sink", "delivery": "exactly-once",
             "kafka": {"topic": output, "bootstrapServers": broker.servers}},
        ],
        "edges": [{"from": "source", "to": "counts"}, {"from": "counts", "to": "sink"}],
        "checkpoint": {"intervalSeconds": 1},
    });
    w.create_job_with_spec(
        "auto",
        serde_json::json!({"catchUpSeconds": 20}),
        serde_json::json!({"job": job}),
    )
    .await;

    // The source falls behind at 1 and is scaled to a divisor of its 6 partitions.
    let (_, status) = w
        .wait_for("the source scaled up", Duration::from_secs(90), |_, s| {
            s.rescales >= 1
                && s.rescale.is_none()
                && s.phase == Phase::Running
                && s.current_parallelism.get("source").is_some_and(|p| *p >= 2)
        })
        .await;
    let source = status.current_parallelism["source"];
    assert!(
        [2, 3, 6].contains(&source),
        "source at {source}: {status:#?}"
    );
    eprintln!(
        "[{:?}] scaled: {:?}",
        started.elapsed(),
        status.current_parallelism
    );

    // The pod the operator rendered keeps its checkpoints on the savepoint volume and
    // recovers from them on every start.
    let deployments: Api<Deployment> = Api::namespaced(w.admin.clone(), &w.ns);
    let d = deployments
        .get(&format!("{JOB}-engine"))
        .await
        .expect("Deployment");
    let args = args_of(&serde_json::to_string(&d.spec.expect("spec").template).expect("json"));
    assert!(args.iter().any(|a| a == "--recover"), "{args:?}");
    let chk = PathBuf::from(flag(&args, "--checkpoint-dir").expect("--checkpoint-dir"));
    assert!(
        chk.starts_with(w.dir.path().join("savepoints")),
        "checkpoints off the savepoint volume: {}",
        chk.display()
    );

    // Two completed checkpoints of this engine, then the pod dies.
    let until = Instant::now() + Duration::from_secs(30);
    while latest_checkpoint(&chk).is_none_or(|(id, _)| id < 2) {
        assert!(
            Instant::now() < until,
            "no checkpoints in {}\n{}",
            chk.display(),
            w.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let restarts_before = status.restarts;
    let starts = kubelet.starts.load(Ordering::SeqCst);
    {
        let mut pod = kubelet.pod.lock().unwrap_or_else(|p| p.into_inner());
        let pod = pod.as_mut().expect("a running pod");
        pod.child.kill().expect("SIGKILL the engine");
    }
    eprintln!("[{:?}] engine SIGKILLed", started.elapsed());
    let (_, status) = w
        .wait_for("the recovery in status", Duration::from_secs(40), |_, s| {
            s.recoveries == 1
                && s.phase == Phase::Running
                && condition(s, "Ready").as_deref() == Some("True")
        })
        .await;
    assert!(
        kubelet.starts.load(Ordering::SeqCst) > starts,
        "the kubelet restarted it"
    );
    assert_eq!(
        status.restarts, restarts_before,
        "the operator replaced no pod"
    );
    let recovered = status.recovered_from.clone().expect("recoveredFrom");
    assert!(
        Path::new(&recovered).starts_with(&chk) && recovered.contains("chk-"),
        "{recovered} is not one of {}",
        chk.display()
    );
    let events = event_reasons(&w.admin, &w.ns).await;
    assert!(
        events
            .iter()
            .any(|(r, note)| r == "EngineRecovered" && note.contains(&recovered)),
        "{events:#?}"
    );
    eprintln!("[{:?}] recovered from {recovered}", started.elapsed());

    // The producer stops (it went on while the pod was down); once every record is through,
    // a final drain commits the rest.
    stop.store(true, Ordering::SeqCst);
    let n = tokio::task::spawn_blocking(move || producing.join().expect("producer"))
        .await
        .expect("join");
    let api = w.engine_api().await;
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let accounted = api.job().await.map(|j| j.records_accounted).unwrap_or(0);
        if accounted >= n {
            break;
        }
        assert!(
            Instant::now() < until,
            "{accounted} of {n} records through\n{}",
            w.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let last = w.final_drain(&kubelet, false).await;
    assert_eq!(last.records_emitted, n, "{last:#?}");
    let got = tokio::task::spawn_blocking({
        let output = output.clone();
        move || (committed_totals(&broker, &output), broker)
    })
    .await
    .expect("read");
    let (got, broker) = got;
    assert_eq!(got, expected(n), "read_committed totals of {n} records");
    eprintln!(
        "[{:?}] {n} records, every key's total exactly once",
        started.elapsed()
    );
    drop(kubelet);
    w.cleanup().await;
    drop(broker);
}
