//! [`LocalRuntime`]: engines as child processes on loopback.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::{EngineHandle, EngineRuntime, RuntimeError, Savepoint, StopOutcome, parallelism_arg};
use crate::api::{EngineApi, JobStatus};

/// Environment variable naming the engine binary explicitly.
pub const ENGINE_BIN_ENV: &str = "STREAMSCALE_ENGINE_BIN";
/// Environment variable asking the engine to exit when its stdin closes (set for every engine
/// this runtime starts; see `streamscale-engine --exit-on-stdin-eof`).
pub const EXIT_ON_STDIN_EOF_ENV: &str = "STREAMSCALE_ENGINE_EXIT_ON_STDIN_EOF";
/// File name of the engine binary.
pub const ENGINE_BIN_NAME: &str = "streamscale-engine";

pub use super::engine_binary::{engine_binary_problem, locate_engine_binary};

/// Timeouts of the local runtime.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalTimeouts {
    /// How long to wait for the `listening` line after spawning.
    pub start: Duration,
    /// How long a stop-with-savepoint may take.
    pub savepoint: Duration,
    /// How long to wait for an engine to exit on its own before killing it.
    pub exit: Duration,
}

impl Default for LocalTimeouts {
    fn default() -> Self {
        LocalTimeouts {
            start: Duration::from_secs(30),
            savepoint: Duration::from_secs(60),
            exit: Duration::from_secs(5),
        }
    }
}

struct LocalEngine {
    child: Child,
    /// The engine's stdin, held open for its lifetime: the engine (started with
    /// [`EXIT_ON_STDIN_EOF_ENV`]) exits when it closes, so it never outlives the controller, even
    /// when the controller is killed by a signal it cannot handle.
    stdin: Option<tokio::process::ChildStdin>,
    last_stderr: Arc<StdMutex<LastLines>>,
    log_tasks: Vec<JoinHandle<()>>,
    log_path: PathBuf,
}

/// Runs each engine as a child process bound to `127.0.0.1:0`, writing savepoints under one
/// directory and each engine's stderr to `engine-<id>.log` in a log directory. Children are
/// killed when the runtime is dropped.
pub struct LocalRuntime {
    binary: PathBuf,
    savepoint_dir: PathBuf,
    log_dir: StdMutex<PathBuf>,
    timeouts: LocalTimeouts,
    client: reqwest::Client,
    engines: Mutex<HashMap<u64, LocalEngine>>,
    next_id: AtomicU64,
    /// The run's engine token (`None` only when it could not be made; the engines then bind
    /// loopback without one).
    token: Option<super::token::RunToken>,
}

#[derive(Deserialize)]
struct Listening {
    event: String,
    address: String,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn describe_status(status: std::process::ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit code {code}"),
        None => format!("{status}"),
    }
}

impl LocalRuntime {
    /// A runtime launching `binary`, with savepoints under `savepoint_dir` and logs in `log_dir`
    /// (both created on first start).
    pub fn new(
        binary: PathBuf,
        savepoint_dir: PathBuf,
        log_dir: PathBuf,
        client: reqwest::Client,
    ) -> LocalRuntime {
        LocalRuntime {
            binary,
            savepoint_dir,
            log_dir: StdMutex::new(log_dir),
            timeouts: LocalTimeouts::default(),
            client,
            engines: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            token: match super::token::RunToken::generate(None) {
                Ok(t) => Some(t),
                Err((path, e)) => {
                    tracing::warn!(
                        "cannot make the engines' auth token ({}: {e}); they run without one, on loopback",
                        path.display()
                    );
                    None
                }
            },
        }
    }

    /// Replaces the default timeouts.
    pub fn with_timeouts(mut self, timeouts: LocalTimeouts) -> LocalRuntime {
        self.timeouts = timeouts;
        self
    }

    /// The engine binary this runtime launches.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Path of the log file of the engine with handle id `id`.
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.log_dir().join(format!("engine-{id}.log"))
    }

    /// The directory the engines' logs are written to.
    pub fn log_dir(&self) -> PathBuf {
        self.log_dir
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Moves the log directory (with the logs of running engines, which keep writing to
    /// them) to `to`, which must not exist and must be on the same file system; later engines
    /// log there too.
    ///
    /// # Errors
    /// [`RuntimeError::Io`] naming `to` when the rename fails (nothing moved).
    pub async fn move_logs(&self, to: &Path) -> Result<(), RuntimeError> {
        let from = self.log_dir();
        std::fs::rename(&from, to).map_err(io_err(to))?;
        *self
            .log_dir
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = to.to_path_buf();
        for engine in self.engines.lock().await.values_mut() {
            if let Ok(rest) = engine.log_path.strip_prefix(&from) {
                engine.log_path = to.join(rest);
            }
        }
        Ok(())
    }

    async fn exit_error(&self, mut engine: LocalEngine, status: Option<String>) -> RuntimeError {
        let status = match status {
            Some(s) => s,
            None => match tokio::time::timeout(self.timeouts.exit, engine.child.wait()).await {
                Ok(Ok(s)) => describe_status(s),
                Ok(Err(e)) => format!("unknown status: {e}"),
                Err(_) => {
                    let _ = engine.child.kill().await;
                    "killed after closing stdout".to_string()
                }
            },
        };
        for task in engine.log_tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
        let last = engine
            .last_stderr
            .lock()
            .ok()
            .and_then(|s| s.best().map(str::to_string));
        RuntimeError::Exited {
            status,
            last_error: match last {
                Some(line) => format!("{line} (log: {})", engine.log_path.display()),
                None => format!(
                    "no warning or error in its output (log: {})",
                    engine.log_path.display()
                ),
            },
        }
    }
}

/// Removes ANSI escape sequences (`ESC [ ... letter`) from a log line.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The most telling stderr line seen so far: the last one at level `WARN` or `ERROR`, an
/// `error: ...` line (the engine's bad-input exit) or a panic message. Plain `INFO` lines are
/// never quoted as the reason an engine died: without a warning, the exit status speaks.
#[derive(Debug, Default)]
struct LastLines {
    last_problem: String,
}

/// Whether a log line reports a problem: a `WARN`/`ERROR` level among its first tokens
/// (tracing's format is `TIME LEVEL target: message`), a line starting with `error`, or a panic.
fn is_problem_line(line: &str) -> bool {
    let trimmed = line.trim_start();
    if trimmed.to_ascii_lowercase().starts_with("error") || line.contains("panicked") {
        return true;
    }
    line.split_whitespace()
        .take(3)
        .any(|t| t == "WARN" || t == "ERROR")
}

impl LastLines {
    fn push(&mut self, line: &str) {
        if !line.trim().is_empty() && is_problem_line(line) {
            self.last_problem = line.trim().to_string();
        }
    }

    /// The last problem line, if there was one.
    fn best(&self) -> Option<&str> {
        (!self.last_problem.is_empty()).then_some(self.last_problem.as_str())
    }
}

fn spawn_log_forwarder<R>(
    reader: R,
    log: Arc<StdMutex<std::fs::File>>,
    last: Option<Arc<StdMutex<LastLines>>>,
) -> JoinHandle<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut lines = BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let line = strip_ansi(&line);
            if let Ok(mut f) = log.lock() {
                let _ = writeln!(f, "{line}");
            }
            if let Some(last) = &last
                && let Ok(mut l) = last.lock()
            {
                l.push(&line);
            }
        }
    })
}

impl EngineRuntime for LocalRuntime {
    async fn start(
        &self,
        job: &Path,
        parallelism: &BTreeMap<String, u32>,
        restore: Option<&Savepoint>,
    ) -> Result<EngineHandle, RuntimeError> {
        std::fs::create_dir_all(&self.savepoint_dir).map_err(io_err(&self.savepoint_dir))?;
        let log_dir = self.log_dir();
        std::fs::create_dir_all(&log_dir).map_err(io_err(&log_dir))?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let log_path = self.log_path(id);
        let mut log = std::fs::File::create(&log_path).map_err(io_err(&log_path))?;

        let mut cmd = Command::new(&self.binary);
        cmd.arg("--job")
            .arg(job)
            .arg("--savepoint-dir")
            .arg(&self.savepoint_dir)
            .arg("--bind")
            .arg("127.0.0.1:0");
        if let Some(t) = &self.token {
            cmd.arg("--auth-token-file").arg(t.file());
        }
        if !parallelism.is_empty() {
            cmd.arg("--parallelism").arg(parallelism_arg(parallelism));
        }
        if let Some(sp) = restore {
            cmd.arg("--restore").arg(&sp.path);
        }
        let _ = writeln!(log, "# {:?}", cmd.as_std());
        // Exit when our end of its stdin closes (an environment variable, not an argument,
        // so an older engine binary still starts).
        cmd.env(EXIT_ON_STDIN_EOF_ENV, "1")
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Its own process group: a terminal's Ctrl-C (SIGINT to the foreground process group)
        // reaches only the controller, which then stops the engine with a draining savepoint.
        // The engine still dies with the controller: killed on drop, and it exits when its
        // stdin (held by the controller) closes.
        #[cfg(unix)]
        cmd.process_group(0);
        let mut child = cmd.spawn().map_err(|source| RuntimeError::Spawn {
            binary: self.binary.display().to_string(),
            source,
        })?;

        let stdin = child.stdin.take();
        let log = Arc::new(StdMutex::new(log));
        let last_stderr = Arc::new(StdMutex::new(LastLines::default()));
        let mut log_tasks = Vec::new();
        if let Some(stderr) = child.stderr.take() {
            log_tasks.push(spawn_log_forwarder(
                stderr,
                Arc::clone(&log),
                Some(Arc::clone(&last_stderr)),
            ));
        }
        let Some(stdout) = child.stdout.take() else {
            let engine = LocalEngine {
                child,
                stdin,
                last_stderr,
                log_tasks,
                log_path,
            };
            return Err(self.exit_error(engine, None).await);
        };
        let mut stdout = BufReader::new(stdout);
        let mut first = String::new();
        let read = tokio::time::timeout(self.timeouts.start, stdout.read_line(&mut first)).await;
        let mut engine = LocalEngine {
            child,
            stdin,
            last_stderr,
            log_tasks,
            log_path,
        };
        match read {
            Err(_) => {
                let _ = engine.child.kill().await;
                return Err(RuntimeError::StartTimeout {
                    seconds: self.timeouts.start.as_secs_f64(),
                });
            }
            Ok(Err(_)) | Ok(Ok(0)) => return Err(self.exit_error(engine, None).await),
            Ok(Ok(_)) => {}
        }
        let line = first.trim().to_string();
        let address = match serde_json::from_str::<Listening>(&line) {
            Ok(l) if l.event == "listening" => l.address,
            _ => {
                let _ = engine.child.kill().await;
                return Err(RuntimeError::BadListeningLine { line });
            }
        };
        engine
            .log_tasks
            .push(spawn_log_forwarder(stdout, Arc::clone(&log), None));
        let base_url = if address.starts_with("http://") {
            address
        } else {
            format!("http://{address}")
        };
        self.engines.lock().await.insert(id, engine);
        Ok(EngineHandle {
            id,
            base_url,
            parallelism: parallelism.clone(),
            restored_from: restore.cloned(),
        })
    }

    async fn stop_with_savepoint(
        &self,
        handle: &EngineHandle,
        drain: bool,
    ) -> Result<StopOutcome, RuntimeError> {
        let api =
            EngineApi::new(self.client.clone(), &handle.base_url).with_token(self.auth_token());
        match api
            .stop_with_savepoint(drain, self.timeouts.savepoint)
            .await
        {
            Ok(outcome) => Ok(StopOutcome {
                savepoint: Savepoint { path: outcome.path },
                final_job: Some(outcome.final_job),
            }),
            Err(e) => match self.exited(handle).await {
                Some(exit) => Err(exit),
                None => Err(e.into()),
            },
        }
    }

    async fn job_status(&self, handle: &EngineHandle) -> Result<JobStatus, RuntimeError> {
        Ok(EngineApi::new(self.client.clone(), &handle.base_url)
            .with_token(self.auth_token())
            .job()
            .await?)
    }

    async fn shutdown(&self, handle: &EngineHandle) -> Result<(), RuntimeError> {
        let Some(mut engine) = self.engines.lock().await.remove(&handle.id) else {
            return Err(RuntimeError::UnknownHandle { id: handle.id });
        };
        // Stopped engines exit on their own; closing stdin also ends one that lingers.
        drop(engine.stdin.take());
        if tokio::time::timeout(self.timeouts.exit, engine.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                id = handle.id,
                "engine did not exit within {:?}; killing it",
                self.timeouts.exit
            );
            let _ = engine.child.kill().await;
        }
        for task in engine.log_tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
        Ok(())
    }

    async fn kill(&self, handle: &EngineHandle) -> Result<(), RuntimeError> {
        let Some(mut engine) = self.engines.lock().await.remove(&handle.id) else {
            return Err(RuntimeError::UnknownHandle { id: handle.id });
        };
        let _ = engine.child.kill().await;
        for task in engine.log_tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
        }
        Ok(())
    }

    fn auth_token(&self) -> Option<&str> {
        self.token.as_ref().map(super::token::RunToken::token)
    }

    async fn exited(&self, handle: &EngineHandle) -> Option<RuntimeError> {
        let mut engines = self.engines.lock().await;
        let engine = engines.get_mut(&handle.id)?;
        let status = match engine.child.try_wait() {
            Ok(Some(status)) => describe_status(status),
            Ok(None) => return None,
            Err(e) => format!("unknown status: {e}"),
        };
        let engine = engines.remove(&handle.id)?;
        drop(engines);
        Some(self.exit_error(engine, Some(status)).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(binary: &str, dir: &Path) -> LocalRuntime {
        LocalRuntime::new(
            PathBuf::from(binary),
            dir.join("savepoints"),
            dir.join("logs"),
            reqwest::Client::new(),
        )
        .with_timeouts(LocalTimeouts {
            start: Duration::from_secs(5),
            savepoint: Duration::from_secs(5),
            exit: Duration::from_secs(1),
        })
    }

    #[tokio::test]
    async fn missing_binary_is_a_spawn_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = runtime("/nonexistent/streamscale-engine", dir.path());
        let err = rt
            .start(Path::new("job.yaml"), &BTreeMap::new(), None)
            .await
            .expect_err("no binary");
        assert!(matches!(err, RuntimeError::Spawn { .. }), "{err}");
    }

    #[cfg(unix)]
    fn script(dir: &Path, body: &str) -> String {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("fake-engine.sh");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path.display().to_string()
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn early_exit_surfaces_the_last_stderr_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = script(
            dir.path(),
            "echo 'starting' >&2\necho 'error: job.yaml: operators[1].cpu: bad' >&2\necho '2026-11-30T16:00:00Z  INFO engine: stopped' >&2\nexit 2",
        );
        let rt = runtime(&bin, dir.path());
        let err = rt
            .start(Path::new("job.yaml"), &BTreeMap::new(), None)
            .await
            .expect_err("exits");
        let msg = err.to_string();
        assert!(msg.contains("exit code 2"), "{msg}");
        assert!(msg.contains("operators[1].cpu: bad"), "{msg}");
        assert!(!msg.contains("INFO"), "{msg}");
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn an_exit_without_warnings_quotes_the_status_not_an_info_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = script(
            dir.path(),
            "echo '2026-11-30T16:00:00Z  INFO engine: job started' >&2\nexit 3",
        );
        let rt = runtime(&bin, dir.path());
        let err = rt
            .start(Path::new("job.yaml"), &BTreeMap::new(), None)
            .await
            .expect_err("exits");
        let msg = err.to_string();
        assert!(msg.contains("exit code 3"), "{msg}");
        assert!(msg.contains("no warning or error"), "{msg}");
        assert!(!msg.contains("job started"), "{msg}");
    }

    /// Field 5 (`pgrp`) of `/proc/PID/stat` (after the parenthesised command name).
    #[cfg(target_os = "linux")]
    fn process_group_of(stat: &str) -> String {
        let after = stat.rsplit_once(')').map_or(stat, |(_, rest)| rest);
        after
            .split_whitespace()
            .nth(2)
            .unwrap_or_default()
            .to_string()
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_engine_gets_its_own_process_group_and_an_open_stdin() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("pgid.txt");
        let bin = script(
            dir.path(),
            &format!(
                "cat /proc/$$/stat > {out}.tmp && mv {out}.tmp {out}\necho '{{\"event\":\"listening\",\"address\":\"127.0.0.1:4567\"}}'\n# exits when the runtime closes its stdin\ncat > /dev/null\necho closed >> {out}",
                out = out.display()
            ),
        );
        let rt = runtime(&bin, dir.path());
        let h = rt
            .start(Path::new("job.yaml"), &BTreeMap::new(), None)
            .await
            .expect("starts");
        let stat = std::fs::read_to_string(&out).expect("stat written");
        let own = std::fs::read_to_string("/proc/self/stat").expect("own stat");
        let (child_pgid, own_pgid) = (process_group_of(&stat), process_group_of(&own));
        assert!(
            !child_pgid.is_empty() && !own_pgid.is_empty(),
            "{stat} / {own}"
        );
        assert_ne!(
            child_pgid, own_pgid,
            "the engine must not share our process group"
        );
        // The child is its group's leader (process_group(0)): pgid == its pid.
        let child_pid = stat.split_whitespace().next().unwrap_or_default();
        assert_eq!(child_pgid, child_pid, "{stat}");
        // Shutting down waits for the exit; closing stdin is what ends the script here.
        rt.shutdown(&h).await.expect("shutdown");
        let text = std::fs::read_to_string(&out).expect("read");
        assert!(
            text.ends_with("closed\n"),
            "the engine saw its stdin close: {text}"
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn reads_the_listening_line_and_passes_arguments() {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = dir.path().join("args.txt");
        let bin = script(
            dir.path(),
            &format!(
                "echo \"$@\" > {0}\necho \"eof=$STREAMSCALE_ENGINE_EXIT_ON_STDIN_EOF\" >> {0}\necho '{{\"event\":\"listening\",\"address\":\"127.0.0.1:4567\"}}'\necho 'log line' >&2\nexit 0",
                args.display()
            ),
        );
        let rt = runtime(&bin, dir.path());
        let p: BTreeMap<String, u32> = [("a".to_string(), 2)].into_iter().collect();
        let sp = Savepoint {
            path: "/tmp/sp-1".into(),
        };
        let h = rt
            .start(Path::new("job.yaml"), &p, Some(&sp))
            .await
            .expect("starts");
        assert_eq!(h.base_url, "http://127.0.0.1:4567");
        rt.shutdown(&h).await.expect("shutdown");
        let seen = std::fs::read_to_string(&args).expect("args written");
        assert!(seen.contains("--job job.yaml"), "{seen}");
        assert!(seen.contains("--parallelism a=2"), "{seen}");
        assert!(seen.contains("--restore /tmp/sp-1"), "{seen}");
        assert!(seen.contains("--bind 127.0.0.1:0"), "{seen}");
        assert!(
            seen.contains("eof=1"),
            "asked to exit when stdin closes: {seen}"
        );
        let log = std::fs::read_to_string(rt.log_path(h.id)).expect("log");
        assert!(log.contains("log line"), "{log}");
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn garbage_first_line_is_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = script(dir.path(), "echo hello\nsleep 5");
        let rt = runtime(&bin, dir.path());
        let err = rt
            .start(Path::new("job.yaml"), &BTreeMap::new(), None)
            .await
            .expect_err("bad line");
        assert!(
            matches!(err, RuntimeError::BadListeningLine { .. }),
            "{err}"
        );
    }

    #[test]
    fn ansi_sequences_are_stripped_and_errors_preferred() {
        assert_eq!(
            strip_ansi("\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m started"),
            "2026  INFO started"
        );
        let mut l = LastLines::default();
        l.push("2026-11-30T16:00:00Z  INFO streamscale_engine: starting");
        assert_eq!(l.best(), None, "an INFO line is not a reason");
        l.push("error: job.yaml: bad");
        l.push("2026-11-30T16:00:01Z  INFO streamscale_engine: shutting down (errors=0)");
        l.push("   ");
        assert_eq!(l.best(), Some("error: job.yaml: bad"));
        l.push("2026-11-30T16:00:02Z  WARN streamscale_engine::server: subtask work#1 failed");
        l.push("2026-11-30T16:00:03Z  INFO streamscale_engine: bye");
        assert_eq!(
            l.best(),
            Some("2026-11-30T16:00:02Z  WARN streamscale_engine::server: subtask work#1 failed")
        );
        l.push("thread 'work#0' panicked at engine/src/runtime.rs:1:1:");
        assert_eq!(
            l.best(),
            Some("thread 'work#0' panicked at engine/src/runtime.rs:1:1:")
        );
    }
}
