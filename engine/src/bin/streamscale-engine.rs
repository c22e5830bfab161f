//! `streamscale-engine`: runs one job, serving metrics and REST on loopback.
//!
//! Prints one line `{"event":"listening","address":"HOST:PORT"}` on stdout once it serves;
//! logs go to stderr. Bad input (job file, savepoint, flags) prints one error line and exits 2.
//! SIGINT or SIGTERM stops it with status 0, whatever disposition it inherited ([`StopSignals`]).

/// mimalloc: per-thread heaps, where glibc's malloc made the subtask threads wait on its arena
/// locks (BENCHMARKS.md, Nexmark).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Parser;
use streamscale_engine::checkpoint::retire::Retirement;
use streamscale_engine::checkpoint::storage::CheckpointStorage;
use streamscale_engine::metrics::EngineMetrics;
use streamscale_engine::runtime::{Job, PanicAt, RuntimeOptions};
use streamscale_engine::savepoint::{METADATA_FILE, Savepoint};
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
    /// File holding a bearer token that every state-changing request (stop-with-savepoint,
    /// savepoint disposal, shed share) must carry (`Authorization: Bearer TOKEN`); reads
    /// (`/metrics`, `/v1/job`) stay open. Default: the file named by
    /// `STREAMSCALE_ENGINE_AUTH_TOKEN_FILE`, else none.
    #[arg(long)]
    auth_token_file: Option<PathBuf>,
    /// Bind a non-loopback `--bind` address without an auth token (anyone who can reach the
    /// port can then stop the job or delete its savepoints).
    #[arg(long)]
    insecure_bind: bool,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key); both files are read again
    /// when they change, for new connections. Plain HTTP is then refused.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Per-operator parallelism overrides: `op=N,op=N`.
    #[arg(long, value_delimiter = ',')]
    parallelism: Vec<String>,
    /// Turn off time measurement and metric publication (for the overhead benchmark).
    #[arg(long)]
    no_metrics: bool,
    /// Directory of periodic checkpoints (overrides the job's `checkpoint.dir`). The job
    /// must have a `checkpoint:` block (which sets the interval); without one this is an
    /// error, since no checkpoint would ever be taken.
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Recover from the latest completed checkpoint in this checkpoint directory (the one
    /// holding `chk-<id>/`), falling back to older ones when the latest is damaged. The
    /// directory must exist; when it holds no completed checkpoint the job starts fresh with
    /// a warning. A single checkpoint (`chk-<id>/`, with a manifest) is refused: pass its
    /// parent, or `--restore` it. Checkpoints keep going to this directory unless
    /// `--checkpoint-dir` says otherwise.
    #[arg(long, conflicts_with = "restore")]
    recover_from: Option<PathBuf>,
    /// On start, recover from the latest completed checkpoint in the checkpoint directory
    /// (`--checkpoint-dir`, else the job's `checkpoint.dir`) when it holds one; otherwise
    /// start from `--restore`, or fresh. One command line for the first start and every
    /// restart, as a supervisor that reruns it unchanged needs (a Kubernetes Deployment's
    /// container restart); a missing directory is created. The job must have a `checkpoint:`
    /// block.
    #[arg(long, conflicts_with = "recover_from")]
    recover: bool,
    /// A checkpoint location (directory or URL, repeatable) this engine supersedes: every
    /// checkpoint there is removed once this engine has completed a checkpoint of its own.
    /// For a deployer that keeps one checkpoint directory per savepoint (the Kubernetes
    /// operator): the directories of the lineages the restored savepoint is newer than. Needs
    /// checkpoints of its own, elsewhere.
    #[arg(long)]
    retire_checkpoints: Vec<String>,
    /// Kafka sinks without a `transactionalIdPrefix` use `streamscale-SCOPE-<job>-<operator>`
    /// instead of `streamscale-<job>-<operator>`: for a deployer that runs several jobs of one
    /// name against one Kafka cluster (the Kubernetes operator passes `<namespace>.<name>`).
    #[arg(long)]
    transactional_id_scope: Option<String>,
    /// Fault injection for recovery tests: `operator:seq` panics that operator's subtask once
    /// on the record with sequence number `seq`.
    #[arg(long, hide = true)]
    fault_panic_at: Option<String>,
    /// Exit when stdin reaches end of file: a controller that starts the engine with a pipe
    /// on stdin (and the engine in its own process group) thereby never leaves it orphaned.
    /// Also on with `STREAMSCALE_ENGINE_EXIT_ON_STDIN_EOF=1`.
    #[arg(long, hide = true)]
    exit_on_stdin_eof: bool,
}

fn parse_overrides(items: &[String]) -> Result<BTreeMap<String, u32>, String> {
    let mut map = BTreeMap::new();
    for item in items.iter().map(|i| i.trim()).filter(|i| !i.is_empty()) {
        let (name, value) = item
            .split_once('=')
            .ok_or_else(|| format!("--parallelism: `{item}` is not `operator=N`"))?;
        let (name, value) = (name.trim(), value.trim());
        let p: u32 = value.parse().map_err(|_| {
            format!("--parallelism: `{value}` for `{name}` is not a positive integer")
        })?;
        if map.insert(name.to_string(), p).is_some() {
            return Err(format!("--parallelism: `{name}` is given more than once"));
        }
    }
    Ok(map)
}

/// Checks a local `--recover-from` directory: it must exist and be a checkpoint directory,
/// not a single checkpoint. Object-store URLs are left to the storage.
fn check_recover_dir(dir: &Path) -> anyhow::Result<()> {
    let shown = dir.display().to_string();
    if shown.contains("://") {
        return Ok(());
    }
    if !dir.exists() {
        anyhow::bail!(
            "--recover-from {shown}: no such directory; pass the checkpoint directory that holds chk-<id>/ (create it to start fresh)"
        );
    }
    if !dir.is_dir() {
        anyhow::bail!("--recover-from {shown}: not a directory");
    }
    let is_savepoint = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("sp-"))
    };
    if dir.join(METADATA_FILE).is_file() && is_savepoint(dir) {
        anyhow::bail!(
            "--recover-from {shown}: this is a savepoint, not a checkpoint directory; pass --restore {shown} to start from it"
        );
    }
    if dir.join(METADATA_FILE).is_file() {
        let parent = dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| ".".to_string(), |p| p.display().to_string());
        anyhow::bail!(
            "--recover-from {shown}: this is a single checkpoint (it has {METADATA_FILE}); pass the checkpoint directory {parent} to recover from its latest checkpoint, or --restore {shown} to restore exactly this one"
        );
    }
    let mut checkpoints = 0usize;
    let mut savepoints = Vec::new();
    for entry in std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("--recover-from {shown}: cannot list it: {e}"))?
        .flatten()
    {
        let path = entry.path();
        if !path.join(METADATA_FILE).is_file() {
            continue;
        }
        if is_savepoint(&path) {
            savepoints.push(path);
        } else {
            checkpoints += 1;
        }
    }
    if checkpoints == 0 && !savepoints.is_empty() {
        savepoints.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
        let newest = savepoints
            .last()
            .map_or_else(String::new, |p| p.display().to_string());
        anyhow::bail!(
            "--recover-from {shown}: this directory holds savepoints (sp-<id>/), not checkpoints (chk-<id>/); recovering from it would start the job without its state. Pass --restore with one savepoint, e.g. --restore {newest} (the newest)"
        );
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    // A log line that cannot be written (stderr closed by a reader such as `head` that
    // exited) is dropped: tracing-subscriber's own report of that error would `eprintln!`,
    // which panics on the same closed stderr and kills the logging thread (a savepoint then
    // never completes). Colours only on a terminal.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    if let Err(e) = run(args) {
        // Ignore a closed stderr here too: the exit status still says it failed.
        let _ = writeln!(std::io::stderr(), "error: {e}");
        std::process::exit(2);
    }
}

/// Exits the process once stdin reaches end of file (or fails): the parent that held the pipe
/// has closed it or died.
fn exit_on_stdin_eof() {
    std::thread::spawn(|| {
        let mut sink = [0u8; 256];
        let mut stdin = std::io::stdin().lock();
        loop {
            match std::io::Read::read(&mut stdin, &mut sink) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        // stderr may be a broken pipe now (a killed controller): logging must not stop the exit.
        let _ = std::panic::catch_unwind(|| {
            // Also the normal end: the controller closes it when it is done with this engine.
            tracing::info!(
                "stdin closed (the controller is done with this engine or has gone): exiting"
            );
        });
        std::process::exit(1);
    });
}

/// SIGINT and SIGTERM stop the engine whatever disposition it inherited (a script's background
/// job starts with SIGINT ignored; a container's PID 1 is not ended by SIGTERM's default): both
/// are caught from the start of [`run`]. Before the server serves, a signal exits at once with
/// status 0 (nothing is served yet); while it serves, the first signal shuts the server down
/// gracefully (exit status 0, as on Ctrl-C before); a second exits at once with the shell's
/// 128 + signal number (130, 143).
struct StopSignals {
    /// The first signal's name, once one arrived.
    received: tokio::sync::watch::Receiver<Option<&'static str>>,
    /// Whether the server serves (a signal then stops it instead of exiting).
    serving: Arc<AtomicBool>,
}

impl StopSignals {
    /// Installs the handlers and the task that answers them on `rt`.
    ///
    /// # Errors
    /// When a handler cannot be installed.
    fn catch(rt: &tokio::runtime::Runtime) -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        let _enter = rt.enter();
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let (tx, received) = tokio::sync::watch::channel(None);
        let serving = Arc::new(AtomicBool::new(false));
        let serves = serving.clone();
        rt.spawn(async move {
            loop {
                let (name, status) = tokio::select! {
                    Some(()) = int.recv() => ("SIGINT", 130),
                    Some(()) = term.recv() => ("SIGTERM", 143),
                    else => return,
                };
                if tx.borrow().is_some() {
                    tracing::warn!(signal = name, "a second signal while stopping: exiting now");
                    std::process::exit(status);
                }
                if !serves.load(Ordering::SeqCst) {
                    tracing::info!(signal = name, "stopped before serving: exiting");
                    std::process::exit(0);
                }
                tracing::info!(signal = name, "stopping: no new requests, then exiting");
                tx.send_replace(Some(name));
            }
        });
        Ok(StopSignals { received, serving })
    }

    /// Marks the server as serving; returns the receiver whose value becomes the first
    /// signal's name.
    fn serving(&self) -> tokio::sync::watch::Receiver<Option<&'static str>> {
        self.serving.store(true, Ordering::SeqCst);
        self.received.clone()
    }
}

/// Returns once `stopped` holds a signal's name (at once if it already does).
async fn stop_signalled(stopped: &mut tokio::sync::watch::Receiver<Option<&'static str>>) {
    if stopped.wait_for(Option::is_some).await.is_err() {
        // The signal task has ended: no signal will come.
        std::future::pending::<()>().await;
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // First, so that no signal is lost (or ignored, as inherited) while the job starts.
    let stop = StopSignals::catch(&rt)?;
    // The environment variable lets a controller ask for this without an argument an older
    // engine would reject.
    if args.exit_on_stdin_eof
        || std::env::var_os("STREAMSCALE_ENGINE_EXIT_ON_STDIN_EOF").is_some_and(|v| v == "1")
    {
        exit_on_stdin_eof();
    }
    let spec = JobSpec::from_file_to_run(&args.job)?;
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
    if spec.state.backend == streamscale_engine::spec::StateBackendKind::Disk {
        streamscale_engine::state::disk::prepare_dir(&spec.state)
            .map_err(|e| anyhow::anyhow!("{}: state.dir: {e}", args.job.display()))?;
    }
    if let Some(dir) = &args.recover_from {
        check_recover_dir(dir)?;
    }
    if spec.checkpoint.is_none() {
        if args.recover {
            anyhow::bail!(
                "--recover: {} has no `checkpoint:` block, so there is no checkpoint to recover from; add e.g. `checkpoint: {{ intervalSeconds: 10 }}` to the job file",
                args.job.display()
            );
        }
        if let Some(dir) = &args.checkpoint_dir {
            anyhow::bail!(
                "--checkpoint-dir {}: {} has no `checkpoint:` block, so no checkpoint would ever be taken; add e.g. `checkpoint: {{ intervalSeconds: 10 }}` to the job file",
                dir.display(),
                args.job.display()
            );
        }
        if let Some(dir) = &args.recover_from {
            tracing::warn!(dir = %dir.display(), "the job has no `checkpoint:` block: it recovers from this directory but takes no new checkpoints");
        }
    }
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
    // Checkpoints numbered below this were written before this process started.
    let first_checkpoint_id = storage.as_ref().map_or(0, |s| s.next_id());
    if !args.retire_checkpoints.is_empty() {
        let Some(own) = &storage else {
            anyhow::bail!(
                "--retire-checkpoints needs checkpoints of this engine's own (--checkpoint-dir or the job's checkpoint.dir)"
            );
        };
        let mut retired = Vec::with_capacity(args.retire_checkpoints.len());
        for location in &args.retire_checkpoints {
            let r = CheckpointStorage::open(location, retain)?;
            if r.location() == own.location() {
                anyhow::bail!(
                    "--retire-checkpoints {location}: this is the engine's own checkpoint location"
                );
            }
            retired.push(r);
        }
        Retirement::new(own.clone(), first_checkpoint_id, retired)
            .spawn(std::time::Duration::from_secs(2))?;
    }
    // With --recover, the latest completed checkpoint of this job's directory comes first.
    let recovered = match (&storage, args.recover) {
        (Some(storage), true) => storage.latest(&spec)?,
        _ => None,
    };
    if args.recover && recovered.is_none() {
        tracing::info!(
            restore = ?args.restore,
            "--recover: no completed checkpoint yet; starting from --restore or fresh"
        );
    }
    let (restore, restored_from) = match (recovered, &args.restore, &args.recover_from) {
        (Some((path, sp)), _, _) => {
            tracing::info!(checkpoint = %path.display(), "recovering from the latest completed checkpoint");
            (Some(sp), Some(path.display().to_string()))
        }
        (None, Some(dir), _) => (
            Some(Savepoint::read(dir, &spec)?),
            Some(dir.display().to_string()),
        ),
        (None, None, Some(dir)) => {
            match CheckpointStorage::open(&dir.display().to_string(), retain)?.latest(&spec)? {
                Some((path, sp)) => {
                    tracing::info!(checkpoint = %path.display(), "recovering from the latest completed checkpoint");
                    (Some(sp), Some(path.display().to_string()))
                }
                None => {
                    tracing::warn!(dir = %dir.display(), "--recover-from: no completed checkpoint in this directory; starting the job fresh");
                    (None, None)
                }
            }
        }
        (None, None, None) => (None, None),
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
        transactional_id_scope: args.transactional_id_scope.clone(),
        ..RuntimeOptions::default()
    };
    let restart = match (&spec.checkpoint, &storage) {
        (Some(c), Some(storage)) => Some(RestartPolicy {
            storage: storage.clone(),
            first_checkpoint_id,
            started_from: restored_from.as_ref().map(PathBuf::from),
            attempts: c.restart.attempts,
            delay: Duration::from_secs_f64(c.restart.delay_seconds),
            options: options.clone(),
        }),
        _ => None,
    };
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&args.bind))
        .map_err(|e| anyhow::anyhow!("--bind {}: {e}", args.bind))?;
    let address = listener.local_addr()?;
    // The certificate is checked before the job starts: a bad file fails at once.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(streamscale_engine::tls::server_config(
            std::sync::Arc::new(streamscale_engine::tls::ReloadingCert::new(cert, key)?),
        )?),
        _ => None,
    };
    let token_file = args.auth_token_file.clone().or_else(|| {
        std::env::var_os(streamscale_engine::auth::TOKEN_FILE_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let token = token_file
        .as_deref()
        .map(streamscale_engine::auth::TokenSource::from_file)
        .transpose()?;
    if token.is_none() && !address.ip().is_loopback() {
        if !args.insecure_bind {
            anyhow::bail!(
                "--bind {}: refusing a non-loopback address without --auth-token-file (anyone who can reach it could stop the job or delete its savepoints); pass --insecure-bind to do it anyway",
                args.bind
            );
        }
        tracing::warn!(%address, "serving without an auth token on a non-loopback address (--insecure-bind): anyone who can reach it can stop the job");
    }
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
    if args.recover {
        coordinator = coordinator.supervised();
    }
    tracing::info!(%address, restored_from = ?restored_from, "job started");
    let mut listening = serde_json::json!({"event": "listening", "address": address.to_string()});
    if tls.is_some() {
        listening["scheme"] = "https".into();
    }
    println!("{listening}");
    let router = coordinator.router_with_auth(token);
    let mut stopped = stop.serving();
    rt.block_on(async move {
        let c = coordinator.clone();
        let shutdown = async move {
            loop {
                tokio::select! {
                    // Level-triggered: a signal that arrived while the job was polled still counts.
                    () = stop_signalled(&mut stopped) => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {
                        let c2 = c.clone();
                        let _ = tokio::task::spawn_blocking(move || c2.poll_job()).await;
                        if c.exit_requested() { break; }
                    }
                }
            }
        };
        match tls {
            Some(config) => {
                let listener = streamscale_engine::tls::TlsListener::new(listener, config)?;
                axum::serve(listener, router)
                    .with_graceful_shutdown(shutdown)
                    .await
            }
            None => {
                axum::serve(listener, router)
                    .with_graceful_shutdown(shutdown)
                    .await
            }
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_overrides;

    #[test]
    fn parallelism_overrides_are_trimmed_and_names_unique() {
        let items = vec!["counts=2".to_string(), " m = 3".to_string()];
        let map = parse_overrides(&items).expect("parses");
        assert_eq!(map.get("m"), Some(&3));
        assert_eq!(map.get("counts"), Some(&2));
        let dup = vec!["m=2".to_string(), "m=3".to_string()];
        let err = parse_overrides(&dup).expect_err("repeated name");
        assert!(err.contains("`m` is given more than once"), "{err}");
    }
}
