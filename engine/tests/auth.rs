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
