//! Rescale downtime of a keyed job: from the stop-with-savepoint request at parallelism 2 to
//! the first record processed by the keyed operator after the restore at parallelism 3, for
//! keyed state of given sizes and both state backends.
//!
//! Set-up (not measured): a savepoint holding `keys = size / 48 bytes` keys of the `counts`
//! window operator is written, the job starts from it at `counts=2` and runs until every key
//! group has been used (the heap backend then holds its state in decoded maps) and, with
//! `--setup loaded` (the default), until the disk backend has written every restored key
//! group out as its own segment files (its `streamscale_state_restored_unloaded_bytes` gauges
//! are 0: the state of a job that has run for a while, keys written since in its database),
//! plus one second (`--settle-seconds`: longer runs let the disk backend's delta grow to its
//! compacted steady state). `--setup restored` skips that wait. (Since the bounded-memory restore the disk
//! backend reads restored key groups in place from the savepoint file as segments, so its
//! gauges read 0 at once and both set-ups are the same.) Measured: `Job::stop_with_savepoint` → completed and
//! written (fsynced) → `Job::join` → `Savepoint::read` (verified) → `Job::start` at
//! `counts=3` → the keyed operator's first record (its live records-in counter, flushed every
//! millisecond, passes the savepoint's). This is the engine's own path inside one process;
//! a rescale by the controller also restarts the engine process, whose start-up (`exec` until
//! the REST port listens) is measured separately and reported beside it.
//!
//! ```text
//! cargo bench -p streamscale-engine --bench rescale_downtime -- [--sizes-mb 1,100,1000]
//!     [--backends heap,disk] [--repeat 3] [--dir target/bench-rescale-downtime]
//!     [--setup loaded|restored] [--settle-seconds 1]
//! ```
//! Prints one JSON object per measurement on stdout, with the process's resident memory just
//! before the restore (the stopped job's state dropped) and its peak from there to the first
//! record (`rss_before_restore_bytes`, `restore_peak_rss_bytes`: `VmRSS` and `VmHWM` after
//! resetting the peak through `/proc/self/clear_refs`; Linux only, else null). `RUST_LOG`
//! (e.g. `streamscale_engine::savepoint=debug,rescale_downtime=debug`) logs the phases.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use streamscale_engine::keygroup::key_group;
use streamscale_engine::metrics::EngineMetrics;
use streamscale_engine::runtime::{Job, RuntimeOptions, StopKind};
use streamscale_engine::savepoint::{Savepoint, SavepointMetadata, SourcePosition};
use streamscale_engine::spec::JobSpec;
use streamscale_engine::state::chunk::ENTRY_BYTES;
use streamscale_engine::state::{KeyGroupData, KeyState, KeyedState};

const MAX_PARALLELISM: u32 = 128;
const RATE: f64 = 50_000.0;

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("rescale_downtime: {what}: {e}");
    std::process::exit(2)
}

fn spec(keys: u64, backend: &str, state_dir: &Path) -> JobSpec {
    let state = match backend {
        "heap" => String::new(),
        _ => format!(
            "state: {{ backend: disk, dir: \"{}\" }}\n",
            state_dir.display()
        ),
    };
    let yaml = format!(
        "name: downtime\nmaxParallelism: {MAX_PARALLELISM}\nchannelCapacity: 1024\noperators:\n  - {{ name: source, kind: source, keys: {keys}, rate: {{ constant: {RATE} }} }}\n  - {{ name: counts, kind: window, sizeMs: 1000, parallelism: 2 }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: source, to: counts }}\n  - {{ from: counts, to: sink }}\n{state}"
    );
    let spec = JobSpec::from_yaml(&yaml).unwrap_or_else(|e| fail("job spec", e));
    spec.validate().unwrap_or_else(|e| fail("job spec", e));
    spec
}

/// A savepoint of `spec` whose `counts` operator holds keys `0..keys`.
fn initial_savepoint(spec: &JobSpec, keys: u64) -> Savepoint {
    let mut per_group: Vec<Vec<(u64, KeyState)>> = vec![Vec::new(); MAX_PARALLELISM as usize];
    for key in 0..keys {
        per_group[key_group(key, MAX_PARALLELISM) as usize].push((
            key,
            KeyState {
                total_count: 1 + key % 7,
                total_sum: (key % 1000) as i64,
                ..KeyState::default()
            },
        ));
    }
    let groups = per_group
        .into_iter()
        .enumerate()
        .map(|(kg, entries)| {
            let map: BTreeMap<u64, KeyState> = entries.into_iter().collect();
            (kg as u32, KeyGroupData::Map(Arc::new(map)))
        })
        .collect();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Savepoint {
        metadata: SavepointMetadata {
            max_parallelism: MAX_PARALLELISM,
            sources: BTreeMap::from([(
                "source".into(),
                SourcePosition {
                    emitted: 0,
                    ..Default::default()
                },
            )]),
            ..SavepointMetadata::for_job(spec, now_ms)
        },
        state: BTreeMap::from([(
            "counts".into(),
            KeyedState {
                groups,
                blobs: BTreeMap::new(),
            },
        )]),
    }
}

fn options() -> RuntimeOptions {
    RuntimeOptions {
        flush_interval: Duration::from_millis(1),
        ..RuntimeOptions::default()
    }
}

fn records_in(job: &Job) -> u64 {
    job.counters().get("counts").map_or(0, |c| c.records_in)
}

struct Measured {
    downtime: f64,
    savepoint: f64,
    read: f64,
    start: f64,
    savepoint_bytes: u64,
    /// Resident bytes before the restore and the peak from there to the first record.
    rss_before_restore: Option<u64>,
    restore_peak_rss: Option<u64>,
}

/// A field of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`); Linux only.
fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line
        .trim_start_matches(field)
        .trim_start_matches(':')
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Resets the process's peak resident set size to its current one (`5` to
/// `/proc/self/clear_refs`, Linux 4.0+) and returns the current one.
fn reset_peak_rss() -> Option<u64> {
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    proc_status_bytes("VmRSS")
}

/// Peak resident set size since the last [`reset_peak_rss`].
fn peak_rss() -> Option<u64> {
    proc_status_bytes("VmHWM")
}

/// Bytes of restored state the disk backend's `counts` subtasks have not written out yet.
fn unloaded_bytes(metrics: &EngineMetrics) -> f64 {
    (0..2)
        .map(|i| {
            metrics
                .state_restored_unloaded_bytes
                .with_label_values(&["counts", &i.to_string()])
                .get()
        })
        .sum()
}

/// One rescale 2 → 3 of a job holding `keys` keys in `backend`; `wait_loaded`: first wait
/// until the disk backend has written its restored state out as segment files.
fn measure(dir: &Path, backend: &str, keys: u64, wait_loaded: bool, settle: f64) -> Measured {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap_or_else(|e| fail("bench dir", e));
    let state_dir = dir.join("state");
    let spec2 = spec(keys, backend, &state_dir);
    let spec3 = spec2.with_parallelism(&BTreeMap::from([("counts".into(), 3)]));
    let initial = dir.join("initial");
    initial_savepoint(&spec2, keys)
        .write(&initial)
        .unwrap_or_else(|e| fail("initial savepoint", e));
    let sp0 = Savepoint::read(&initial, &spec2).unwrap_or_else(|e| fail("initial savepoint", e));
    let metrics = EngineMetrics::new().unwrap_or_else(|e| fail("metrics", e));
    let job = Job::start(spec2, Some(&sp0), metrics.clone(), options())
        .unwrap_or_else(|e| fail("start", e));
    drop(sp0);
    // Every key group used (and so loaded) at least once, then one more second.
    let until = Instant::now() + Duration::from_secs(600);
    while records_in(&job) < 20_000 {
        if Instant::now() > until || job.has_failed() {
            fail("set-up", "the job did not process 20 000 records");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if wait_loaded && backend == "disk" {
        let until = Instant::now() + Duration::from_secs(3600);
        while unloaded_bytes(&metrics) > 0.0 {
            if Instant::now() > until || job.has_failed() {
                fail(
                    "set-up",
                    "the disk backend did not write out its restored state",
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    std::thread::sleep(Duration::from_secs_f64(settle));

    let sp_dir = dir.join("sp-rescale");
    tracing::debug!("stop-with-savepoint requested");
    let t0 = Instant::now();
    let outcome = job
        .stop_with_savepoint(StopKind::Stop, sp_dir.clone())
        .recv()
        .unwrap_or_else(|e| fail("stop-with-savepoint", e));
    let written = outcome.unwrap_or_else(|f| fail("stop-with-savepoint", f.reason));
    let finished = job.join();
    if !finished.errors.is_empty() {
        fail("stop", finished.errors.join("; "));
    }
    let t_saved = t0.elapsed().as_secs_f64();
    // The stopped job's state is gone in a real rescale (the engine process restarts); it is
    // freed here outside the measured time (the clock is moved on by the time it takes).
    let freeing = Instant::now();
    drop(finished);
    let t0 = t0 + freeing.elapsed();
    let rss_before = reset_peak_rss();
    tracing::debug!("stopped, savepoint written");
    let sp = Savepoint::read(&sp_dir, &spec3).unwrap_or_else(|e| fail("read savepoint", e));
    let t_read = t0.elapsed().as_secs_f64();
    let base = sp
        .metadata
        .counters
        .get("counts")
        .map_or(0, |c| c.records_in);
    let metrics = EngineMetrics::new().unwrap_or_else(|e| fail("metrics", e));
    let job =
        Job::start(spec3, Some(&sp), metrics, options()).unwrap_or_else(|e| fail("restore", e));
    let t_started = t0.elapsed().as_secs_f64();
    while records_in(&job) <= base {
        if job.has_failed() || t0.elapsed() > Duration::from_secs(600) {
            fail("restore", "no record processed after the restore");
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    let downtime = t0.elapsed().as_secs_f64();
    let restore_peak = peak_rss();
    tracing::debug!("first record after the restore");
    job.cancel();
    let done = job.join();
    if !done.errors.is_empty() {
        fail("restored job", done.errors.join("; "));
    }
    drop(sp);
    let _ = std::fs::remove_dir_all(dir);
    Measured {
        downtime,
        savepoint: t_saved,
        read: t_read - t_saved,
        start: t_started - t_read,
        savepoint_bytes: written.metadata.files.iter().map(|f| f.bytes).sum(),
        rss_before_restore: rss_before,
        restore_peak_rss: restore_peak,
    }
}

/// Seconds from spawning the engine binary until it serves REST (process start-up of a
/// restart), with a job without keyed state.
fn process_start(dir: &Path) -> f64 {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| fail("bench dir", e));
    let job = dir.join("tiny.yaml");
    std::fs::write(
        &job,
        "name: tiny\noperators:\n  - { name: source, kind: source, rate: { constant: 1 } }\n  - { name: sink, kind: sink }\nedges:\n  - { from: source, to: sink }\n",
    )
    .unwrap_or_else(|e| fail("tiny job", e));
    let t0 = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_streamscale-engine"))
        .arg("--job")
        .arg(&job)
        .arg("--savepoint-dir")
        .arg(dir.join("sps"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| fail("spawn engine", e));
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    let secs = t0.elapsed().as_secs_f64();
    let _ = child.kill();
    let _ = child.wait();
    secs
}

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    let args: Vec<String> = std::env::args().collect();
    let sizes: Vec<u64> = arg(&args, "--sizes-mb", "1,100")
        .split(',')
        .map(|s| s.trim().parse().unwrap_or_else(|e| fail("--sizes-mb", e)))
        .collect();
    let backends: Vec<String> = arg(&args, "--backends", "heap,disk")
        .split(',')
        .map(str::to_string)
        .collect();
    for b in &backends {
        if b != "heap" && b != "disk" {
            fail("--backends", format!("`{b}` is not heap or disk"));
        }
    }
    let repeat: usize = arg(&args, "--repeat", "3")
        .parse()
        .unwrap_or_else(|e| fail("--repeat", e));
    let root = PathBuf::from(arg(&args, "--dir", "target/bench-rescale-downtime"));
    let setup = arg(&args, "--setup", "loaded");
    if setup != "loaded" && setup != "restored" {
        fail("--setup", format!("`{setup}` is not loaded or restored"));
    }
    let settle: f64 = arg(&args, "--settle-seconds", "1")
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s >= 0.0)
        .unwrap_or_else(|| fail("--settle-seconds", "not a number of seconds >= 0"));
    let starts: Vec<f64> = (0..5).map(|_| process_start(&root.join("start"))).collect();
    let mut sorted = starts.clone();
    sorted.sort_by(f64::total_cmp);
    let process_start_s = sorted[sorted.len() / 2];
    println!(
        "{}",
        serde_json::json!({"system": "streamscale", "measure": "process_start", "seconds": process_start_s})
    );
    for size in &sizes {
        let keys = size * 1_000_000 / ENTRY_BYTES as u64;
        for backend in &backends {
            for run in 0..repeat {
                let m = measure(
                    &root.join(format!("{backend}-{size}")),
                    backend,
                    keys,
                    setup == "loaded",
                    settle,
                );
                println!(
                    "{}",
                    serde_json::json!({
                        "system": "streamscale",
                        "backend": backend,
                        "setup": setup,
                        "settle_s": settle,
                        "state_mb": size,
                        "keys": keys,
                        "run": run,
                        "savepoint_bytes": m.savepoint_bytes,
                        "downtime_s": m.downtime,
                        "stop_with_savepoint_s": m.savepoint,
                        "read_savepoint_s": m.read,
                        "start_job_s": m.start,
                        "downtime_with_process_start_s": m.downtime + process_start_s,
                        "rss_before_restore_bytes": m.rss_before_restore,
                        "restore_peak_rss_bytes": m.restore_peak_rss,
                    })
                );
            }
        }
    }
}
