//! Job files and commands shared by the end-to-end tests, so that each test file does not
//! carry its own copy.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::workspace_bin;

/// A three-operator job `name`: `source` (its fields after `name` and `kind`) → `work` (a
/// `map` costing `cpu_us` µs of CPU per record) → `sink` (its fields after `name` and `kind`,
/// empty for none).
pub fn pipeline(name: &str, source: &str, cpu_us: u32, sink: &str) -> String {
    format!(
        "name: {name}
maxParallelism: 16
operators:
  - {{ name: source, kind: source, {source} }}
  - {{ name: work, kind: map, cpu: {cpu_us} }}
  - {{ name: sink, kind: sink{sink} }}
edges:
  - {{ from: source, to: work }}
  - {{ from: work, to: sink }}
"
    )
}

/// An unbounded job: one source at a constant 300 records/s over 100 keys, a `map` costing
/// 100 µs of CPU per record, a sink (`output: DIR` when `sink_output` is given, relative to
/// the job file: an exactly-once sink's directory of part files). Never finishes on its own.
/// An exactly-once sink needs a `checkpoint:` block: [`with_checkpoints`] adds one.
pub fn unbounded_job(sink_output: Option<&str>) -> String {
    let sink = sink_output.map_or_else(String::new, |f| format!(", output: {f}"));
    pipeline("forever", "keys: 100, rate: { constant: 300 }", 100, &sink)
}

/// `job` with a checkpoint every second (what an exactly-once sink in an unbounded job needs).
pub fn with_checkpoints(job: &str) -> String {
    format!("{job}checkpoint: {{ intervalSeconds: 1 }}\n")
}

/// A bounded job: the source stops after 1500 records (500 records/s), then the job
/// finishes by itself.
pub fn bounded_job() -> String {
    pipeline(
        "bounded",
        "keys: 100, count: 1500, rate: { constant: 500 }",
        100,
        "",
    )
}

/// A small job for the simulator, following `trace.csv` ([`SIM_TRACE`]) next to it.
pub fn sim_job() -> String {
    pipeline(
        "small",
        "keys: 100, rate: { trace: { file: trace.csv } }",
        1000,
        "",
    )
}

/// 30 minutes of trace (`t_seconds,rate`) with a step up and back down.
pub const SIM_TRACE: &str = "t_seconds,rate\n0,100\n600,2000\n1200,300\n1800,300\n";

/// Writes `text` to `dir/name` and returns the path.
///
/// # Panics
/// When the file cannot be written.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// A fast control loop for short runs: scrape every 0.5 s, a 3 s metric window.
pub const FAST_LOOP: [&str; 4] = ["--interval", "0.5", "--window", "3"];

/// `streamscale run JOB --report REPORT ARGS` with the workspace's engine
/// (`STREAMSCALE_ENGINE_BIN`), stdout and stderr piped.
pub fn streamscale_run(job: &Path, report: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(workspace_bin("streamscale"));
    cmd.arg("run")
        .arg(job)
        .arg("--report")
        .arg(report)
        .args(args)
        .env(
            "STREAMSCALE_ENGINE_BIN",
            workspace_bin("streamscale-engine"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// [`streamscale_run`] with [`FAST_LOOP`] before `args`.
pub fn streamscale_run_fast(job: &Path, report: &Path, args: &[&str]) -> Command {
    streamscale_run(job, report, &[&FAST_LOOP[..], args].concat())
}

/// Reads `out` until `n` progress lines (`t=...`) have been printed; returns what was read.
///
/// # Panics
/// When the output ends first (the run ended early), with what it printed.
pub fn read_progress(out: &mut impl BufRead, n: usize) -> String {
    let mut seen = String::new();
    let mut progress = 0;
    while progress < n {
        let mut line = String::new();
        if out.read_line(&mut line).expect("read stdout") == 0 {
            panic!("streamscale run ended early:\n{seen}");
        }
        progress += usize::from(line.starts_with("t="));
        seen.push_str(&line);
    }
    seen
}

/// The run's `REPORT/summary.json`.
///
/// # Panics
/// When it is missing or not JSON.
pub fn summary(report: &Path) -> serde_json::Value {
    let path = report.join("summary.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A new temporary directory holding `text` as `job.yaml`; returns it, the job file and the
/// report directory `report` in it (not created).
///
/// # Panics
/// When the directory or the file cannot be created.
pub fn job_dir(text: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = write(dir.path(), "job.yaml", text);
    let report = dir.path().join("report");
    (dir, job, report)
}

/// Sends `signal` (e.g. `-INT`) to `target`: a pid, or `-PGID` for a whole process group.
///
/// # Panics
/// When `kill` fails.
pub fn kill(signal: &str, target: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, "--", target])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {target}: {status}");
}

/// The real engine (`streamscale-engine --job JOB --savepoint-dir savepoints`) started in
/// `dir`, running once its sources report their backlog; killed on drop.
pub struct Engine {
    child: std::process::Child,
    /// Its Prometheus endpoint, `http://ADDRESS/metrics`.
    pub metrics_url: String,
}

impl Engine {
    /// Starts the engine on `job` (relative to `dir`) and waits until it runs.
    ///
    /// # Panics
    /// When it does not start, print its address, or report a source backlog within 120 s.
    pub fn start(dir: &Path, job: &str) -> Engine {
        let mut child = Command::new(workspace_bin("streamscale-engine"))
            .current_dir(dir)
            .args(["--job", job, "--savepoint-dir", "savepoints"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start streamscale-engine");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("listening line");
        let v: serde_json::Value = serde_json::from_str(&line).expect("listening JSON");
        let address = v["address"].as_str().expect("address").to_string();
        let metrics_url = format!("http://{address}/metrics");
        // Running: its sources report their backlog (set from the first loop of a source
        // subtask, whether or not a record is due yet).
        // A deadline for a stuck engine only (a loaded machine delays the sources' threads).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let metrics = || {
            use std::io::{Read, Write};
            let mut conn = std::net::TcpStream::connect(&address)?;
            write!(conn, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
            let mut text = String::new();
            conn.read_to_string(&mut text)?;
            std::io::Result::Ok(text)
        };
        while !metrics().is_ok_and(|t| t.contains("streamscale_source_backlog_records")) {
            assert!(
                std::time::Instant::now() < deadline,
                "no source backlog in 120 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Engine { child, metrics_url }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The names of the published part files (`part-*`) in an exactly-once sink's `output`
/// directory; empty when it does not exist.
pub fn published_parts(dir: &Path) -> std::collections::HashSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .filter(|n| n.starts_with("part-"))
                .collect()
        })
        .unwrap_or_default()
}

/// What a reader of an exactly-once sink's `output` directory sees: its published part files
/// (`part-*`, in name order; in-progress files are hidden and skipped), concatenated. Empty
/// when nothing was published.
pub fn published_output(dir: &Path) -> String {
    let mut parts: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    parts.retain(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("part-"))
    });
    parts.sort();
    parts
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect()
}
