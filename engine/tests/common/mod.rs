//! Starts the real `streamscale-engine` binary on loopback and talks to it over HTTP.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running engine process, killed on drop.
pub struct EngineProcess {
    pub child: Child,
    pub base: String,
    client: reqwest::blocking::Client,
}

pub fn engine_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_streamscale-engine"))
}

impl EngineProcess {
    pub fn start(job: &Path, savepoints: &Path, extra: &[&str]) -> EngineProcess {
        Self::start_with_stderr(job, savepoints, extra, Stdio::null())
    }

    /// As [`EngineProcess::start`], with the engine's stderr going to `stderr`; a pipe's read
    /// end is dropped (closed) at once, as when the reader of the engine's log exited.
    pub fn start_with_stderr(
        job: &Path,
        savepoints: &Path,
        extra: &[&str],
        stderr: Stdio,
    ) -> EngineProcess {
        let mut child = Command::new(engine_bin())
            .arg("--job")
            .arg(job)
            .arg("--savepoint-dir")
            .arg(savepoints)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn engine");
        drop(child.stderr.take());
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("engine did not announce its address ({e}): {line:?}"));
        let base = format!("http://{}", v["address"].as_str().unwrap());
        EngineProcess {
            child,
            base,
            client: reqwest::blocking::Client::new(),
        }
    }

    pub fn job(&self) -> Value {
        self.client
            .get(format!("{}/v1/job", self.base))
            .send()
            .unwrap()
            .json()
            .unwrap()
    }

    pub fn metrics(&self) -> String {
        self.client
            .get(format!("{}/metrics", self.base))
            .send()
            .unwrap()
            .text()
            .unwrap()
    }

    pub fn wait_state(&self, state: &str, timeout: Duration) -> Value {
        let until = Instant::now() + timeout;
        loop {
            let job = self.job();
            if job["state"] == state {
                return job;
            }
            assert!(
                Instant::now() < until,
                "engine never reached {state}: {job}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the job view counts more than `records` source records (`sourceRecords`,
    /// published at the subtasks' flushes, so at most the sources' position) and returns the
    /// view: a stop or savepoint after a fixed pause must still land after some progress when
    /// a loaded machine delays the sources. Panics after 60 s.
    pub fn wait_source_records_above(&self, records: u64) -> Value {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let job = self.job();
            if job["sourceRecords"].as_u64().unwrap() > records {
                return job;
            }
            assert!(
                Instant::now() < until,
                "no more than {records} source records in 60 s: {job}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stop-with-savepoint; returns the savepoint path and the job view taken once the job left
    /// `stopping` (its final counters).
    ///
    /// The engine publishes the stopped state, the final counters and the `completed` status
    /// under one lock, but it exits shortly after its terminal status is read, so the view is
    /// taken first: the job view is polled until it is no longer `stopping`, and only then is
    /// the status read. (A view taken before each status poll could predate the completion
    /// that the status poll then saw, leaving the live, unbalanced counters of a draining job.)
    pub fn stop_with_savepoint(&mut self, drain: bool) -> (PathBuf, Value) {
        let request = serde_json::json!({"stop": true, "drain": drain});
        let within = Duration::from_secs(120);
        let until = Instant::now() + within;
        let mut job = Value::Null;
        let st = request_savepoint(&self.client, &self.base, &request, within, || {
            job = self.job();
            while job["state"] == "stopping" {
                assert!(
                    Instant::now() < until,
                    "the job was still stopping after {within:?}: {job}"
                );
                std::thread::sleep(Duration::from_millis(50));
                job = self.job();
            }
        });
        let _ = self.child.wait();
        (PathBuf::from(st["path"].as_str().unwrap()), job)
    }

    /// A savepoint of the running job with id `id` (not stopping it); returns its completed
    /// status, panicking when it fails or does not complete within `within`.
    pub fn savepoint(&self, id: &str, within: Duration) -> Value {
        let request = serde_json::json!({"stop": false, "id": id});
        request_savepoint(&self.client, &self.base, &request, within, || {})
    }
}

/// Posts savepoint request `request` to the engine at `base` (`POST /v1/savepoints`, answered
/// 202) and polls its status every 50 ms until `completed`, which it returns; `before_poll`
/// runs before each poll. Panics when the request is refused, the savepoint fails, or it does
/// not complete within `within`.
pub fn request_savepoint(
    client: &reqwest::blocking::Client,
    base: &str,
    request: &Value,
    within: Duration,
    mut before_poll: impl FnMut(),
) -> Value {
    let resp = client
        .post(format!("{base}/v1/savepoints"))
        .json(request)
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202, "{}", resp.text().unwrap());
    let id = resp.json::<Value>().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let until = Instant::now() + within;
    loop {
        before_poll();
        let st: Value = client
            .get(format!("{base}/v1/savepoints/{id}"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        match st["status"].as_str().unwrap() {
            "completed" => return st,
            "failed" => panic!("savepoint {id} failed: {st}"),
            _ => {}
        }
        assert!(Instant::now() < until, "savepoint {id} never completed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The job graph shared by [`bounded_job`] and [`checkpointed_job`]: a bounded constant-rate
/// source of `count` records at `rate` records/s, a map, a 200 ms window and a sink (YAML).
fn bounded_graph(count: u64, rate: f64) -> String {
    format!(
        r#"name: bounded
maxParallelism: 64
operators:
  - {{ name: source, kind: source, keys: 300, count: {count}, rate: {{ constant: {rate} }} }}
  - {{ name: work, kind: map, cpu: 20, io: 100 }}
  - {{ name: counts, kind: window, sizeMs: 200 }}
  - {{ name: sink, kind: sink }}
edges:
  - {{ from: source, to: work }}
  - {{ from: work, to: counts }}
  - {{ from: counts, to: sink }}
"#
    )
}

/// Writes a job with a bounded constant-rate source into `dir` and returns its path.
pub fn bounded_job(dir: &Path, count: u64, rate: f64) -> PathBuf {
    let path = dir.join("job.yaml");
    std::fs::write(&path, bounded_graph(count, rate)).unwrap();
    path
}

/// Writes a job like [`bounded_job`] with periodic checkpoints into `checkpoints`, two source
/// subtasks' worth of input channels and a sink, and returns its path.
pub fn checkpointed_job(
    dir: &Path,
    count: u64,
    rate: f64,
    interval_s: f64,
    retain: u32,
    checkpoints: &Path,
) -> PathBuf {
    let path = dir.join("job-chk.yaml");
    let checkpoint = format!(
        "checkpoint: {{ intervalSeconds: {interval_s}, retain: {retain}, dir: \"{}\", restart: {{ attempts: 2, delaySeconds: 0.2 }} }}\n",
        checkpoints.display()
    );
    std::fs::write(&path, bounded_graph(count, rate) + &checkpoint).unwrap();
    path
}

/// Sum of a metric's samples whose line starts with `prefix`.
pub fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The samples of a `/metrics` text by series (`family{operator="…",subtask="…"}`).
pub fn parse_metrics(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The sample `streamscale_FAMILY{operator="OPERATOR",subtask="SUBTASK"}` of `m`.
///
/// # Panics
/// When `m` has no such series.
pub fn metric_sample(
    m: &std::collections::BTreeMap<String, f64>,
    family: &str,
    operator: &str,
    subtask: u32,
) -> f64 {
    let key = format!("streamscale_{family}{{operator=\"{operator}\",subtask=\"{subtask}\"}}");
    *m.get(&key)
        .unwrap_or_else(|| panic!("no {key} in /metrics: {m:?}"))
}

/// Runs the in-process job source → map → sink to its end (`Job::start`, metrics flushed every
/// 20 ms, chained or not): the source emits `records` records over 10 keys as fast as it can,
/// the map costs `map_cost` per record (a job-file fragment, e.g. `cpu: 200` µs of CPU or
/// `io: 10000` µs of sleep). Returns the finished job (errors already checked empty) and the
/// metrics text.
pub fn run_source_map_sink(
    records: u64,
    map_cost: &str,
    chaining: bool,
) -> (streamscale_engine::runtime::Finished, String) {
    use streamscale_engine::metrics::EngineMetrics;
    use streamscale_engine::runtime::{Job, RuntimeOptions};
    use streamscale_engine::spec::JobSpec;
    let yaml = format!(
        "name: chain\noperators:\n  - {{ name: source, kind: source, keys: 10, count: {records}, rate: {{ constant: 1.0e9 }} }}\n  - {{ name: map, kind: map, {map_cost} }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: source, to: map }}\n  - {{ from: map, to: sink }}\n"
    );
    let spec = JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    let metrics = EngineMetrics::new().unwrap();
    let options = RuntimeOptions {
        chaining,
        ..fast_flush_options()
    };
    let job = Job::start(spec, None, metrics.clone(), options).unwrap();
    while !job.is_finished() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let done = job.join();
    assert!(done.errors.is_empty(), "{:?}", done.errors);
    (done, metrics.render())
}

/// In-process runtime options with a 20 ms metrics flush (tests read the counters soon after
/// the records pass), the rest the defaults.
pub fn fast_flush_options() -> streamscale_engine::runtime::RuntimeOptions {
    streamscale_engine::runtime::RuntimeOptions {
        flush_interval: Duration::from_millis(20),
        ..streamscale_engine::runtime::RuntimeOptions::default()
    }
}

/// Counter `field` (`recordsIn`, `recordsOut`) of operator `name` in a `GET /v1/job` view;
/// panics when the view has no such operator or field.
pub fn operator_count(view: &Value, name: &str, field: &str) -> u64 {
    view["operators"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == name)
        .unwrap_or_else(|| panic!("no operator {name} in {view}"))[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} of {name} in {view}"))
}

/// What a reader of a sink's `output` sees: the file (`delivery: at-least-once`), or the
/// published part files of an exactly-once sink's directory (`part-*`, by name; in-progress
/// files are hidden and skipped). Empty when nothing was written.
#[allow(dead_code)]
pub fn read_sink_output(path: &Path) -> String {
    if !path.is_dir() {
        return std::fs::read_to_string(path).unwrap_or_default();
    }
    let mut parts: Vec<PathBuf> = std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("part-"))
        })
        .collect();
    parts.sort();
    parts
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}
