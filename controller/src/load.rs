//! `streamscale load`: produces JSON records to a Kafka topic at the rate of a workload trace,
//! so that a Kafka job can be autoscaled through a real trace.
//!
//! Record `i` (from 0) is `{"seq": i, "key": "k<j>", "value": i % 100, "ts": <ms>}` with Kafka
//! key `k<j>`, where `j` is a hash of `i` modulo `--keys`; records are sent when the trace's
//! cumulative arrivals ∫ rate reach them (checked every 5 ms), so the topic's log end offsets
//! grow at the trace's rate.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::producer::Producer;
use streamscale_engine::kafka::sink::{FLUSH_TIMEOUT, PolledProducer, send_blocking};
use streamscale_engine::kafka::{KafkaError, base_config, ensure_topic};
use streamscale_engine::keygroup::murmur_fmix64;
use streamscale_engine::spec::{GapPolicy, RateSpec, TraceRate};
use streamscale_engine::trace::{RateFunction, TraceError};

/// Records sent between two looks at the stop flag, the end and the progress line while a
/// deficit is caught up.
const CHECK_EVERY: u64 = 1024;

/// What `streamscale load` does.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topic (created with `partitions` partitions when missing).
    pub topic: String,
    /// Partitions of the topic if it has to be created.
    pub partitions: i32,
    /// The trace (`t_seconds,rate`).
    pub trace: PathBuf,
    /// Trace-seconds per wall-clock second (> 0).
    pub speedup: f64,
    /// Factor on the trace's rates (> 0).
    pub scale: f64,
    /// Trace time (seconds) at which the replay starts (≥ 0).
    pub start_seconds: f64,
    /// Distinct keys (≥ 1).
    pub keys: u64,
    /// Stop after this many wall-clock seconds (default: the end of the trace).
    pub duration: Option<f64>,
}

/// Errors of `streamscale load`.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A bad option value.
    #[error("{0}")]
    Option(String),
    /// The trace cannot be read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// Kafka refused (brokers unreachable, topic not creatable, send failed).
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A send failed.
    #[error("{0}")]
    Send(String),
}

/// What a finished load sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadSummary {
    /// Records sent (all acknowledged by the brokers).
    pub records: u64,
    /// Wall-clock seconds it ran.
    pub seconds: f64,
}

/// The Kafka key of record `seq` among `keys` keys.
pub fn key_of(seq: u64, keys: u64) -> String {
    format!("k{}", murmur_fmix64(seq ^ 0x10ad) % keys.max(1))
}

/// The JSON value of record `seq` sent at `ts_ms`.
pub fn value_of(seq: u64, key: &str, ts_ms: u64) -> String {
    format!(
        r#"{{"seq":{seq},"key":"{key}","value":{},"ts":{ts_ms}}}"#,
        seq % 100
    )
}

/// Produces the trace's records until its end, `duration`, or `stop`; `progress` receives a
/// line every 5 s.
///
/// # Errors
/// [`LoadError`] for bad options, an unreadable trace, unreachable brokers or a failed send.
pub fn run(
    opts: &LoadOptions,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&str),
) -> Result<LoadSummary, LoadError> {
    for (name, v) in [("--speedup", opts.speedup), ("--scale", opts.scale)] {
        if !(v > 0.0 && v.is_finite()) {
            return Err(LoadError::Option(format!(
                "{name}: {v} must be a number > 0"
            )));
        }
    }
    if !(opts.start_seconds >= 0.0 && opts.start_seconds.is_finite()) {
        return Err(LoadError::Option(format!(
            "--start-seconds: {} must be a number >= 0",
            opts.start_seconds
        )));
    }
    if opts.keys == 0 {
        return Err(LoadError::Option("--keys: must be at least 1".into()));
    }
    if opts.partitions < 1 {
        return Err(LoadError::Option("--partitions: must be at least 1".into()));
    }
    if let Some(d) = opts.duration
        && !(d > 0.0 && d.is_finite())
    {
        return Err(LoadError::Option(format!("--duration: {d} must be > 0")));
    }
    let rate = RateFunction::from_spec(&RateSpec::Trace(TraceRate {
        file: opts.trace.clone(),
        speedup: opts.speedup,
        scale: opts.scale,
        start_seconds: opts.start_seconds,
        end_seconds: None,
        gaps: GapPolicy::Hold,
    }))?;
    if rate.wall_end().is_some_and(|e| e <= 0.0) {
        return Err(LoadError::Option(format!(
            "--start-seconds: {} is at or past the end of {}: nothing to send",
            opts.start_seconds,
            opts.trace.display()
        )));
    }
    let end = match (opts.duration, rate.wall_end()) {
        (Some(d), _) => d,
        (None, Some(e)) => e,
        (None, None) => f64::INFINITY,
    };
    if ensure_topic(&opts.brokers, &opts.topic, opts.partitions)? {
        progress(&format!(
            "load: created topic {} with {} partitions",
            opts.topic, opts.partitions
        ));
    }
    let producer: PolledProducer = base_config(&opts.brokers)
        .set("client.id", "streamscale-load")
        .set("linger.ms", "5")
        .set("enable.idempotence", "true")
        .create()
        .map_err(|source| KafkaError::Client {
            what: "producer".into(),
            source,
        })?;
    let started = Instant::now();
    let mut sent = 0u64;
    let mut last_line = Instant::now();
    let mut sent_at_line = 0u64;
    loop {
        let t = started.elapsed().as_secs_f64();
        if stop.load(Ordering::Relaxed) || t >= end {
            break;
        }
        let due = rate.cumulative(t).floor() as u64;
        let ts_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        while sent < due {
            // A deficit can be millions of records (a high --scale, a stalled broker): a signal,
            // the end and the 5 s line are not held back until it is sent.
            if sent.is_multiple_of(CHECK_EVERY)
                && sent > 0
                && (stop.load(Ordering::Relaxed)
                    || started.elapsed().as_secs_f64() >= end
                    || last_line.elapsed() >= Duration::from_secs(5))
            {
                break;
            }
            let key = key_of(sent, opts.keys);
            let value = value_of(sent, &key, ts_ms);
            send_blocking(&producer, &opts.topic, key.as_bytes(), value.as_bytes())
                .map_err(LoadError::Send)?;
            sent += 1;
        }
        if last_line.elapsed() >= Duration::from_secs(5) {
            let dt = last_line.elapsed().as_secs_f64();
            progress(&format!(
                "load: t={t:.0} s  trace rate {:.0}/s  sent {:.0}/s  total {sent}",
                rate.rate(t),
                (sent - sent_at_line) as f64 / dt
            ));
            last_line = Instant::now();
            sent_at_line = sent;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    producer
        .flush(FLUSH_TIMEOUT)
        .map_err(|source| KafkaError::Client {
            what: "flush".into(),
            source,
        })?;
    // The flush returns once every report left librdkafka's queue; the polling thread may
    // still be serving the last ones. A record whose delivery failed (the topic deleted, the
    // brokers refusing it) was not written: that is an error, not a count of records sent.
    let reports = producer.context();
    let waited = Instant::now();
    while reports.reported() < sent && waited.elapsed() < FLUSH_TIMEOUT {
        producer.poll(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(1));
    }
    if let Some((n, first)) = reports.failures() {
        return Err(LoadError::Send(format!(
            "{n} of {sent} records failed delivery to topic {} (first: {first})",
            opts.topic
        )));
    }
    if reports.reported() < sent {
        return Err(LoadError::Send(format!(
            "{} of {sent} records have no delivery report after {FLUSH_TIMEOUT:?}",
            sent - reports.reported()
        )));
    }
    Ok(LoadSummary {
        records: sent,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_json_with_their_key() {
        let k = key_of(7, 10);
        assert!(k.starts_with('k') && k[1..].parse::<u64>().is_ok_and(|j| j < 10));
        let v: serde_json::Value = serde_json::from_str(&value_of(7, &k, 5)).expect("json");
        assert_eq!(v["seq"], 7);
        assert_eq!(v["key"], k.as_str());
        assert_eq!(v["value"], 7);
    }

    #[test]
    fn bad_options_are_refused_before_any_connection() {
        let opts = LoadOptions {
            brokers: "127.0.0.1:1".into(),
            topic: "t".into(),
            partitions: 1,
            trace: PathBuf::from("/nonexistent.csv"),
            speedup: 0.0,
            scale: 1.0,
            start_seconds: 0.0,
            keys: 1,
            duration: None,
        };
        let stop = AtomicBool::new(false);
        let e = run(&opts, &stop, &mut |_| {}).expect_err("refused");
        assert_eq!(e.to_string(), "--speedup: 0 must be a number > 0");
        let e = run(
            &LoadOptions {
                speedup: 1.0,
                keys: 0,
                ..opts
            },
            &stop,
            &mut |_| {},
        )
        .expect_err("refused");
        assert_eq!(e.to_string(), "--keys: must be at least 1");
    }

    #[test]
    fn a_start_past_the_traces_end_is_refused() {
        let dir = std::env::temp_dir().join(format!("ss-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let trace = dir.join("t.rate.csv");
        std::fs::write(&trace, "t_seconds,rate\n0,10\n100,10\n").expect("trace");
        let opts = LoadOptions {
            brokers: "127.0.0.1:1".into(),
            topic: "t".into(),
            partitions: 1,
            trace: trace.clone(),
            speedup: 1.0,
            scale: 1.0,
            start_seconds: 500.0,
            keys: 1,
            duration: None,
        };
        let e = run(&opts, &AtomicBool::new(false), &mut |_| {}).expect_err("refused");
        assert!(
            e.to_string()
                .starts_with("--start-seconds: 500 is at or past the end of"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn trace_file(name: &str, rate: f64) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ss-load-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let trace = dir.join("t.rate.csv");
        std::fs::write(&trace, format!("t_seconds,rate\n0,{rate}\n100000,{rate}\n"))
            .expect("trace");
        trace
    }

    /// Records the brokers refuse are not counted as sent: `run` fails naming how many and
    /// why (before, it answered `sent N records` and `streamscale load` exited 0).
    #[test]
    fn records_that_fail_delivery_are_an_error() {
        use rdkafka::mocking::MockCluster;
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
        let mock = MockCluster::new(1).expect("mock cluster");
        mock.create_topic("t", 1, 1).expect("mock topic");
        mock.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE; 64],
        );
        let opts = LoadOptions {
            brokers: mock.bootstrap_servers(),
            topic: "t".into(),
            partitions: 1,
            trace: trace_file("refused", 200.0),
            speedup: 1.0,
            scale: 1.0,
            start_seconds: 0.0,
            keys: 10,
            duration: Some(0.5),
        };
        let e = run(&opts, &AtomicBool::new(false), &mut |_| {}).expect_err("refused records");
        let e = e.to_string();
        assert!(e.contains("failed delivery to topic t"), "{e}");
        assert!(e.to_lowercase().contains("too large"), "{e}");
    }

    /// A deficit of millions of records (here 10^11 records/s due) does not hold back a stop:
    /// `run` returns soon after the flag is set (before, SIGINT and SIGTERM went unheard until
    /// the whole deficit was sent).
    #[test]
    fn a_stop_ends_a_large_deficit() {
        use rdkafka::mocking::MockCluster;
        use std::sync::Arc;
        let mock = MockCluster::new(1).expect("mock cluster");
        mock.create_topic("t", 1, 1).expect("mock topic");
        let opts = LoadOptions {
            brokers: mock.bootstrap_servers(),
            topic: "t".into(),
            partitions: 1,
            trace: trace_file("deficit", 1e11),
            speedup: 1.0,
            scale: 1.0,
            start_seconds: 0.0,
            keys: 10,
            duration: Some(600.0),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let s = Arc::clone(&stop);
        std::thread::spawn(move || {
            let _ = tx.send(run(&opts, &s, &mut |_| {}).map(|r| r.records));
        });
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::SeqCst);
        let sent = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("stopped within 10 s of the flag")
            .expect("load");
        assert!(sent > 0);
    }
}
