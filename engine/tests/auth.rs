//! The engine's bearer token on a real engine process: every state-changing endpoint refuses a
//! request without the token or with a wrong one (401, one line, the token never echoed) and
//! takes the right one; reads stay open; the token never reaches the engine's log; and an
//! engine without a token refuses a non-loopback address unless told `--insecure-bind`.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};

use common::{EngineProcess, bounded_job, engine_bin};
use serde_json::json;

const TOKEN: &str = "f00dfeedcafe0123456789abcdef4242";

#[test]
fn state_changing_endpoints_need_the_token_and_reads_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let job = bounded_job(dir.path(), 2_000_000, 500.0);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let log = dir.path().join("engine.log");
    let engine = EngineProcess::start_with_stderr(
        &job,
        &dir.path().join("savepoints"),
        &["--auth-token-file", token_file.to_str().unwrap()],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let client = reqwest::blocking::Client::new();
    let base = &engine.base;
    // Reads are open.
    for path in ["/metrics", "/v1/job", "/v1/shed"] {
        let r = client.get(format!("{base}{path}")).send().unwrap();
        assert_eq!(r.status().as_u16(), 200, "GET {path}");
    }
    let requests = |auth: Option<&str>| {
        let with = |r: reqwest::blocking::RequestBuilder| match auth {
            Some(a) => r.header("Authorization", a),
            None => r,
        };
        vec![
            (
                "POST /v1/shed",
                with(client.post(format!("{base}/v1/shed"))).json(&json!({"share": 0.0})),
            ),
            (
                "DELETE /v1/savepoints/none",
                with(client.delete(format!("{base}/v1/savepoints/none"))),
            ),
            (
                "POST /v1/savepoints",
                with(client.post(format!("{base}/v1/savepoints"))).json(&json!({"stop": false})),
            ),
        ]
    };
    let wrong = format!("Bearer {}", TOKEN.replace('f', "e"));
    for auth in [
        None,
        Some(wrong.as_str()),
        Some(TOKEN),
        Some("Basic Zm9vOmJhcg=="),
    ] {
        for (what, r) in requests(auth) {
            let resp = r.send().unwrap();
            assert_eq!(resp.status().as_u16(), 401, "{what} with {auth:?}");
            let body = resp.text().unwrap();
            assert_eq!(body.lines().count(), 1, "{body}");
            assert!(
                body.contains("bearer token") && !body.contains(TOKEN),
                "{body}"
            );
        }
    }
    let right = format!("Bearer {TOKEN}");
    let codes: Vec<(&str, u16)> = requests(Some(&right))
        .into_iter()
        .map(|(what, r)| (what, r.send().unwrap().status().as_u16()))
        .collect();
    // Past authentication: shed set, no such savepoint, a savepoint triggered.
    assert_eq!(
        codes,
        vec![
            ("POST /v1/shed", 200),
            ("DELETE /v1/savepoints/none", 404),
            ("POST /v1/savepoints", 202)
        ]
    );
    drop(engine);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains(TOKEN), "the token is in the engine's log");
}

#[test]
fn a_non_loopback_address_needs_a_token_or_insecure_bind() {
    let dir = tempfile::tempdir().unwrap();
    let job = bounded_job(dir.path(), 10, 100.0);
    let out = Command::new(engine_bin())
        .args(["--job", job.to_str().unwrap(), "--bind", "0.0.0.0:0"])
        .arg("--savepoint-dir")
        .arg(dir.path().join("sp"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--bind 0.0.0.0:0") && err.contains("--insecure-bind"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "never announced a listening address");
    // A bad token file is named, its content never shown.
    let token = dir.path().join("token");
    std::fs::write(&token, "tiny").unwrap();
    let out = Command::new(engine_bin())
        .args(["--job", job.to_str().unwrap(), "--auth-token-file"])
        .arg(&token)
        .arg("--savepoint-dir")
        .arg(dir.path().join("sp"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&token.display().to_string()) && !err.contains("tiny"),
        "{err}"
    );
}

/// The engine process of the TLS test; killed when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `--tls-cert`/`--tls-key` (the test certificate of `tests/data/tls`, for localhost): an
/// HTTPS request with the token works, without it gets 401, and plain HTTP gets no answer; the
/// token file rewritten while the engine runs is taken at once, the previous token still
/// accepted (grace period), any other refused.
#[test]
fn https_with_the_token_and_a_token_file_rotated_while_running() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let job = bounded_job(dir.path(), 2_000_000, 500.0);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let tls = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tls");
    let mut child = Child(
        Command::new(engine_bin())
            .args(["--job", job.to_str().unwrap(), "--auth-token-file"])
            .arg(&token_file)
            .arg("--tls-cert")
            .arg(tls.join("server.crt"))
            .arg("--tls-key")
            .arg(tls.join("server.key"))
            .arg("--savepoint-dir")
            .arg(dir.path().join("sp"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let announced: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(announced["scheme"], "https", "{line}");
    let port = announced["address"]
        .as_str()
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1
        .to_string();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(tls.join("ca.crt")).unwrap()).unwrap();
    let client = reqwest::blocking::Client::builder()
        .tls_certs_only([ca])
        .build()
        .unwrap();
    let shed = |auth: Option<&str>| {
        let r = client
            .post(format!("https://localhost:{port}/v1/shed"))
            .json(&json!({"share": 0.0}));
        let r = match auth {
            Some(a) => r.bearer_auth(a),
            None => r,
        };
        r.send().unwrap().status().as_u16()
    };
    assert_eq!(shed(Some(TOKEN)), 200, "HTTPS with the token");
    assert_eq!(shed(None), 401);
    let job_over_https = client
        .get(format!("https://localhost:{port}/v1/job"))
        .send()
        .unwrap();
    assert_eq!(job_over_https.status().as_u16(), 200);
    // Plain HTTP to the TLS port: no HTTP answer.
    assert!(
        reqwest::blocking::Client::new()
            .get(format!("http://127.0.0.1:{port}/v1/job"))
            .send()
            .is_err(),
        "plain HTTP must be refused"
    );
    // Rotation without a restart.
    let new = "0123456789abcdef0123456789abcdef";
    std::fs::write(&token_file, format!("{new}\n")).unwrap();
    assert_eq!(shed(Some(new)), 200, "the new token at once");
    assert_eq!(
        shed(Some(TOKEN)),
        200,
        "the previous one in its grace period"
    );
    assert_eq!(shed(Some("ffffffffffffffffffffffffffffffff")), 401);
}
