//! `streamscale-engine`: runs one job, serving metrics and REST on loopback.
//!
//! Prints one line `{"event":"listening","address":"HOST:PORT"}` on stdout once it serves;
//! logs go to stderr. Bad input (job file, savepoint, flags) prints one error line and exits 2.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::Parser;
use streamscale_engine::checkpoint::storage::CheckpointStorage;
use streamscale_engine::metrics::EngineMetrics;
use streamscale_engine::runtime::{Job, PanicAt, RuntimeOptions};
use streamscale_engine::savepoint::Savepoint;
use streamscale_engine::server::{Coordinator, RestartPolicy};
use streamscale_engine::spec::JobSpec;

/// Runs a streamscale job graph.
#[derive(Debug, Parser)]
#[command(name = "streamscale-engine", version)]
struct Args {
    /// Job spec (YAML).
    #[arg(long)]
    job: PathBuf,
    /// Restore keyed state, source positions and counters from this savepoint directory.
    #[arg(long)]
    restore: Option<PathBuf>,
    /// Directory under which savepoints are written.
    #[arg(long, default_value = "savepoints")]
    savepoint_dir: PathBuf,
    /// Address to serve REST and metrics on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: String,
    /// Per-operator parallelism overrides: `op=N,op=N`.
    #[arg(long, value_delimiter = ',')]
    parallelism: Vec<String>,
    /// Turn off time measurement and metric publication (for the overhead benchmark).
    #[arg(long)]
    no_metrics: bool,
    /// Directory of periodic checkpoints (overrides the job's `checkpoint.dir`).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Recover from the latest completed checkpoint in this directory (falling back to older
    /// ones when the latest is damaged; starting fresh when there is none). Checkpoints keep
    /// going to this directory unless `--checkpoint-dir` says otherwise.
    #[arg(long, conflicts_with = "restore")]
    recover_from: Option<PathBuf>,
    /// Fault injection for recovery tests: `operator:seq` panics that operator's subtask once
    /// on the record with sequence number `seq`.
    #[arg(long, hide = true)]
    fault_panic_at: Option<String>,
}

fn parse_overrides(items: &[String]) -> Result<BTreeMap<String, u32>, String> {
    let mut map = BTreeMap::new();
    for item in items {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| format!("--parallelism: `{item}` is not `operator=N`"))?;
        let p: u32 = value.parse().map_err(|_| {
            format!("--parallelism: `{value}` for `{name}` is not a positive integer")
        })?;
        map.insert(name.to_string(), p);
    }
    Ok(map)
}

fn main() {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    if let Err(e) = run(args) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let spec = JobSpec::from_file(&args.job)?;
    let overrides = parse_overrides(&args.parallelism).map_err(anyhow::Error::msg)?;
    for name in overrides.keys() {
        if spec.operator(name).is_none() {
            anyhow::bail!(
                "--parallelism: no operator named `{name}` in {}",
                args.job.display()
            );
        }
    }
    let spec = spec.with_parallelism(&overrides);
    spec.validate()
        .map_err(|p| anyhow::anyhow!("{} (after --parallelism): {p}", args.job.display()))?;
    let checkpoint_dir = args
        .checkpoint_dir
        .as_ref()
        .or(args.recover_from.as_ref())
        .map(|p| p.display().to_string())
        .or_else(|| spec.checkpoint.as_ref().and_then(|c| c.dir.clone()));
    let retain = spec
        .checkpoint
        .as_ref()
        .map_or(streamscale_engine::spec::DEFAULT_CHECKPOINT_RETAIN, |c| {
            c.retain
        });
    let storage = match checkpoint_dir {
        Some(d) => Some(Arc::new(CheckpointStorage::open(&d, retain)?)),
        None => None,
    };
    let (restore, restored_from) = match (&args.restore, &args.recover_from) {
        (Some(dir), _) => (
            Some(Savepoint::read(dir, &spec)?),
            Some(dir.display().to_string()),
        ),
        (None, Some(dir)) => {
            match CheckpointStorage::open(&dir.display().to_string(), retain)?.latest(&spec)? {
                Some((path, sp)) => {
                    tracing::info!(checkpoint = %path.display(), "recovering from the latest completed checkpoint");
                    (Some(sp), Some(path.display().to_string()))
                }
                None => {
                    tracing::info!(dir = %dir.display(), "no completed checkpoint yet; starting fresh");
                    (None, None)
                }
            }
        }
        (None, None) => (None, None),
    };
    let panic_at = match &args.fault_panic_at {
        Some(v) => {
            let (operator, seq) = v
                .split_once(':')
                .and_then(|(o, s)| Some((o.to_string(), s.parse::<u64>().ok()?)))
                .ok_or_else(|| anyhow::anyhow!("--fault-panic-at: `{v}` is not `operator:seq`"))?;
            Some(PanicAt {
                operator,
                seq,
                fired: Arc::new(AtomicBool::new(false)),
            })
        }
        None => None,
    };
    let metrics = EngineMetrics::new()?;
    let options = RuntimeOptions {
        metrics_enabled: !args.no_metrics,
        checkpoint_storage: storage.clone(),
        panic_at,
        ..RuntimeOptions::default()
    };
    let restart = match (&spec.checkpoint, &storage) {
        (Some(c), Some(storage)) => Some(RestartPolicy {
            storage: storage.clone(),
            attempts: c.restart.attempts,
            delay: Duration::from_secs_f64(c.restart.delay_seconds),
            options: options.clone(),
        }),
        _ => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&args.bind))
        .map_err(|e| anyhow::anyhow!("--bind {}: {e}", args.bind))?;
    let address = listener.local_addr()?;
    let job = Job::start(spec, restore.as_ref(), metrics.clone(), options)?;
    let mut coordinator = Coordinator::new(
        job,
        metrics,
        args.savepoint_dir.clone(),
        restored_from.clone(),
    );
    if let Some(policy) = restart {
        coordinator = coordinator.with_restart(policy);
    }
    tracing::info!(%address, restored_from = ?restored_from, "job started");
    println!(
        "{}",
        serde_json::json!({"event": "listening", "address": address.to_string()})
    );
    let router = coordinator.router();
    rt.block_on(async move {
        let c = coordinator.clone();
        let shutdown = async move {
            loop {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {
                        let c2 = c.clone();
                        let _ = tokio::task::spawn_blocking(move || c2.poll_job()).await;
                        if c.exit_requested() { break; }
                    }
                }
            }
        };
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
    })?;
    Ok(())
}
