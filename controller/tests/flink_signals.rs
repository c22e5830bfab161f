//! `streamscale flink` ends its session with a report on SIGINT or SIGTERM, also when it started
//! with SIGINT ignored (a script's background job: here `sh -c 'trap "" INT; exec …'`). The
//! cluster is a stand-in serving a recorded `/overview` and no job, so the session (`--all`)
//! waits for one until the signal. The signal is sent while the stand-in holds its answer to the
//! session's first look for jobs in its loop: before the session first waits for its stop.
#![allow(missing_docs, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

fn overview() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/flink/overview.json");
    std::fs::read_to_string(p).unwrap()
}

/// The stand-in's hold on its answer to the second `GET /jobs/overview` (the session's first
/// in its loop; the first comes before): `held` receives once the request is there, and the
/// answer goes out once `release` is sent to.
struct Hold {
    held: mpsc::Receiver<()>,
    release: mpsc::Sender<()>,
}

/// Serves the stand-in on a loopback port from its own thread (for the life of the test
/// process); returns the port and its [`Hold`].
fn stand_in() -> (u16, Hold) {
    let json = |body: String| ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    let (held_tx, held) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let gate = Arc::new(Mutex::new((held_tx, release_rx)));
    let seen = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route("/overview", get(move || async move { json(overview()) }))
        .route(
            "/jobs/overview",
            get(move || async move {
                if seen.fetch_add(1, Ordering::SeqCst) == 1 {
                    let _ = tokio::task::spawn_blocking(move || {
                        let gate = gate.lock().unwrap();
                        let _ = gate.0.send(());
                        let _ = gate.1.recv();
                    })
                    .await;
                }
                json(r#"{"jobs": []}"#.to_string())
            }),
        );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let _ = axum::serve(listener, app).await;
        });
    });
    (port, Hold { held, release })
}

/// Starts `streamscale flink --all` against the stand-in through `sh` with SIGINT ignored, its
/// stdout into `out` and stderr into `DIR/stderr`; returns once the stand-in holds the session's
/// first look for jobs in its loop.
fn start_session(dir: &Path, out: &Path) -> (Child, Hold) {
    let (port, hold) = stand_in();
    let child = Command::new("sh")
        .arg("-c")
        .arg(r#"trap "" INT; exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_streamscale"))
        .args(["flink", "--all", "--interval", "1", "--rest-url"])
        .arg(format!("http://127.0.0.1:{port}"))
        .arg("--report")
        .arg(dir.join("report"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let held = hold.held.recv_timeout(Duration::from_secs(60));
    assert!(
        held.is_ok(),
        "the session did not look for jobs in its loop: {}",
        std::fs::read_to_string(dir.join("stderr")).unwrap()
    );
    (child, hold)
}

/// The exit status, or `None` (after killing it) when it still runs after `within`.
fn exit_within(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Sends `sig` to the session and checks that it wrote its report and exited with status 0.
fn signal_ends_the_session(sig: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("stdout");
    let (mut child, hold) = start_session(dir.path(), &out);
    let sent = Command::new("kill")
        .arg(sig)
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(sent.success(), "kill {sig}");
    hold.release.send(()).unwrap();
    let status = exit_within(&mut child, Duration::from_secs(60));
    let printed = std::fs::read_to_string(&out).unwrap()
        + &std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{status:?}\n{printed}"
    );
    assert!(
        printed.contains("interrupted: writing the report"),
        "{printed}"
    );
    assert!(dir.path().join("report/summary.json").exists(), "{printed}");
}

#[test]
fn sigint_ends_a_session_that_started_with_sigint_ignored() {
    signal_ends_the_session("-INT");
}

#[test]
fn sigterm_ends_a_session_with_its_report() {
    signal_ends_the_session("-TERM");
}
