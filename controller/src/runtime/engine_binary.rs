//! Which file is the engine binary: found beside `streamscale`, or named by the user
//! (`--engine`, `$STREAMSCALE_ENGINE_BIN`) and checked before a run starts (an executable file
//! that answers `--version` as the engine does).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::local::{ENGINE_BIN_ENV, ENGINE_BIN_NAME};

/// Finds the engine binary: `$STREAMSCALE_ENGINE_BIN`, else `streamscale-engine` next to the
/// current executable (or one directory up, for test binaries in `target/*/deps`), else the bare
/// name (looked up on `PATH` when started).
pub fn locate_engine_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os(ENGINE_BIN_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(bin);
    }
    let name = format!("{ENGINE_BIN_NAME}{}", std::env::consts::EXE_SUFFIX);
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        for candidate in [Some(dir), dir.parent()].into_iter().flatten() {
            let path = candidate.join(&name);
            if path.is_file() {
                return path;
            }
        }
    }
    PathBuf::from(name)
}

/// Why `path` cannot be started as the engine binary, if it visibly cannot: it does not exist,
/// is a directory, or (on Unix) is a file without an execute permission bit (`/etc/passwd`),
/// which even root cannot run. The phrase follows the path in a message:
/// `--engine: PATH is not executable (mode 644); give the streamscale-engine binary`.
/// `None` when it is an executable file (whether it is really the engine shows when it starts).
pub fn engine_binary_problem(path: &Path) -> Option<String> {
    let what = format!("the {ENGINE_BIN_NAME} binary");
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Some("does not exist".to_string());
        }
        Err(e) => return Some(format!("cannot be read: {e}")),
    };
    if meta.is_dir() {
        return Some(format!("is a directory, not {what}"));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode();
        if mode & 0o111 == 0 {
            return Some(format!(
                "is not executable (mode {:o}); give {what}",
                mode & 0o7777
            ));
        }
    }
    None
}

/// How long the engine binary may take to answer `--version`.
pub const ENGINE_VERSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the executable `path` is not the engine, asked as `PATH --version` (the engine's
/// command line answers `streamscale-engine VERSION` and exits at once): it cannot be run,
/// does not answer within [`ENGINE_VERSION_TIMEOUT`] (killed then), or its first line of
/// output does not start with the engine's name (GNU `/bin/true` prints `true (GNU coreutils) …`). The phrase
/// follows the path in a message. `None` when it answers as the engine does.
pub fn engine_identity_problem(path: &Path) -> Option<String> {
    use std::io::Read as _;
    let name = ENGINE_BIN_NAME;
    let mut command = std::process::Command::new(path);
    command
        .arg("--version")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    // Its own process group, so that a script which hangs is stopped with everything it
    // started (a `sleep` it runs would otherwise outlive the check, holding its output).
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return Some(format!("cannot be run ({e}); give the {name} binary")),
    };
    // Read on a thread: a child that never closes its output must not hold the check.
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = stdout.take(4096).read_to_end(&mut text);
            let _ = tx.send(text);
        });
    }
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < ENGINE_VERSION_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(None) | Err(_) => {
                kill_process_group(&mut child);
                let _ = child.wait();
                return Some(format!(
                    "did not answer `--version` within {} s; give the {name} binary",
                    ENGINE_VERSION_TIMEOUT.as_secs()
                ));
            }
        }
    };
    let text = rx.recv_timeout(Duration::from_secs(1)).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let first = text.lines().next().unwrap_or_default().trim();
    let is_engine = first
        .strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '));
    if status.success() && is_engine {
        return None;
    }
    let printed = if first.is_empty() {
        "printed nothing".to_string()
    } else {
        let shown: String = first.chars().take(80).collect();
        format!("printed `{shown}`")
    };
    let status = match status.code() {
        Some(code) => format!("exit code {code}"),
        None => status.to_string(),
    };
    Some(format!(
        "is not the {name} binary: asked for `--version` it {printed} ({status}), where the engine prints `{name} VERSION`"
    ))
}

/// Kills `child` and every process in its process group (it was started as the group's
/// leader, `process_group(0)`, so the group id is its pid); falls back to killing the child
/// alone where the group cannot be signalled.
fn kill_process_group(child: &mut std::process::Child) {
    #[cfg(unix)]
    if let Ok(pid) = i32::try_from(child.id()) {
        use nix::sys::signal::{Signal, killpg};
        if killpg(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
            return;
        }
    }
    let _ = child.kill();
}
