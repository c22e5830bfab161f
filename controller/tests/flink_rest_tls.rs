//! The Flink REST client over TLS with credentials, against a stand-in for an authenticating
//! proxy in front of Flink: a local HTTPS server (rustls, the test certificate of
//! `engine/tests/data/tls`) that serves answers recorded from a real Flink 2.3 cluster
//! (`tests/data/flink`) and checks the `Authorization` header of every request.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use streamscale_controller::flink::rest_auth::{RestAuth, RestCredentials};
use streamscale_controller::flink::{FlinkError, FlinkRest};

const TOKEN: &str = "flink-proxy-token-5f1e";
/// `Basic base64("flink:s3cret pass")`.
const BASIC: &str = "Basic Zmxpbms6czNjcmV0IHBhc3M=";

fn tls_data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/data/tls")
        .join(name)
}

fn flink_data(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/flink")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// What the stand-in saw: the `Authorization` header of each request (`None`: absent).
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Option<String>>>>);

/// The stand-in proxy's check: `expected` or 401.
async fn check_auth(
    State((expected, seen)): State<(&'static str, Seen)>,
    request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let ok = given.as_deref() == Some(expected);
    seen.0.lock().expect("lock").push(given);
    if ok {
        next.run(request).await
    } else {
        (StatusCode::UNAUTHORIZED, "{\"errors\":[\"unauthorized\"]}").into_response()
    }
}

fn json(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Starts the stand-in on a loopback port; returns its port and what it saw.
async fn stand_in(expected: &'static str) -> (u16, Seen) {
    let known = "26a5696f51d939081ea0bd3885f89d04";
    let seen = Seen::default();
    let app = axum::Router::new()
        .route(
            "/overview",
            get(|| async { json(flink_data("overview.json")) }),
        )
        .route(
            "/jobs/overview",
            get(|| async { json(flink_data("jobs-overview.json")) }),
        )
        .route(
            "/jobs/{jid}",
            get(move |UrlPath(jid): UrlPath<String>| async move {
                if jid == known {
                    json(flink_data("job.json"))
                } else {
                    (StatusCode::NOT_FOUND, flink_data("job-not-found.json")).into_response()
                }
            }),
        )
        .layer(axum::middleware::from_fn_with_state(
            (expected, seen.clone()),
            check_auth,
        ));
    let cert = Arc::new(
        streamscale_engine::tls::ReloadingCert::new(
            &tls_data("server.crt"),
            &tls_data("server.key"),
        )
        .expect("test certificate"),
    );
    let config = streamscale_engine::tls::server_config(cert).expect("config");
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let listener = streamscale_engine::tls::TlsListener::new(tcp, config).expect("listener");
    let port = axum::serve::Listener::local_addr(&listener)
        .expect("address")
        .port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (port, seen)
}

fn rest(url: &str, credentials: RestCredentials, ca: Option<&str>) -> FlinkRest {
    let auth = RestAuth {
        credentials: credentials.clone(),
        ca_pem: ca.map(|c| std::fs::read(tls_data(c)).expect("ca")),
    };
    let client = auth
        .client(url, reqwest::Client::builder().no_proxy())
        .expect("client");
    FlinkRest::new(client, url).with_credentials(credentials)
}

#[tokio::test]
async fn a_bearer_token_over_tls_reaches_the_proxy_and_a_wrong_one_gets_401() {
    let (port, seen) = stand_in("Bearer flink-proxy-token-5f1e").await;
    let url = format!("https://localhost:{port}");
    let ok = rest(&url, RestCredentials::Bearer(TOKEN.into()), Some("ca.crt"));
    let o = ok
        .overview()
        .await
        .expect("overview over TLS with the token");
    assert_eq!(o.flink_version, "2.3.0");
    let job = ok
        .job("26a5696f51d939081ea0bd3885f89d04")
        .await
        .expect("job");
    assert_eq!(job.vertices.len(), 2);

    let wrong = rest(
        &url,
        RestCredentials::Bearer("not-the-token".into()),
        Some("ca.crt"),
    );
    let e = wrong.overview().await.expect_err("wrong token");
    assert!(matches!(e, FlinkError::Status { status: 401, .. }), "{e}");
    assert!(!e.to_string().contains("not-the-token"), "{e}");
    let none = rest(&url, RestCredentials::None, Some("ca.crt"));
    assert!(matches!(
        none.overview().await,
        Err(FlinkError::Status { status: 401, .. })
    ));
    let seen = seen.0.lock().expect("lock").clone();
    assert_eq!(
        seen,
        vec![
            Some(format!("Bearer {TOKEN}")),
            Some(format!("Bearer {TOKEN}")),
            Some("Bearer not-the-token".into()),
            None
        ]
    );
}

#[tokio::test]
async fn basic_auth_is_sent_as_rfc_7617_says() {
    let (port, seen) = stand_in(BASIC).await;
    let url = format!("https://127.0.0.1:{port}");
    let creds = RestCredentials::basic("flink", "s3cret pass", "test").expect("basic");
    let o = rest(&url, creds, Some("ca.crt"))
        .overview()
        .await
        .expect("overview with basic auth");
    assert_eq!(o.slots_total, 4);
    assert_eq!(seen.0.lock().expect("lock").len(), 1);
}

#[tokio::test]
async fn an_untrusted_certificate_and_plain_http_are_refused() {
    let (port, seen) = stand_in("Bearer flink-proxy-token-5f1e").await;
    let creds = RestCredentials::Bearer(TOKEN.into());
    // A CA that did not sign the server's certificate.
    let e = rest(
        &format!("https://localhost:{port}"),
        creds.clone(),
        Some("other-ca.crt"),
    )
    .overview()
    .await
    .expect_err("untrusted");
    assert!(matches!(e, FlinkError::Http { .. }), "{e}");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    // The system's roots do not hold the test CA either.
    assert!(
        rest(&format!("https://localhost:{port}"), creds.clone(), None)
            .overview()
            .await
            .is_err()
    );
    // Plain HTTP to the TLS port: the handshake fails, no answer.
    assert!(
        rest(&format!("http://127.0.0.1:{port}"), creds, None)
            .overview()
            .await
            .is_err()
    );
    assert!(
        seen.0.lock().expect("lock").is_empty(),
        "no request got through"
    );
}

/// `streamscale flink` with the options: the right token reaches the cluster (the job id is
/// then unknown: exit 1 naming it), a wrong one gets the proxy's 401, and neither token is
/// printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamscale_flink_reads_the_token_and_ca_files() {
    let (port, _seen) = stand_in("Bearer flink-proxy-token-5f1e").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    let run = |token_text: &str| {
        std::fs::write(&token, format!("{token_text}\n")).expect("write");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_streamscale"))
            .args(["flink", "--rest-url"])
            .arg(format!("https://localhost:{port}"))
            .arg("--rest-token-file")
            .arg(&token)
            .arg("--rest-ca-file")
            .arg(tls_data("ca.crt"))
            .args(["--job", "00000000000000000000000000000000", "--report"])
            .arg(dir.path().join("report"))
            .output()
            .expect("run streamscale");
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, text) = tokio::task::block_in_place(|| run(TOKEN));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("Flink 2.3.0 at https://localhost"), "{text}");
    assert!(
        text.contains("00000000000000000000000000000000 is not known"),
        "{text}"
    );
    assert!(!text.contains(TOKEN), "{text}");
    let (code, text) = tokio::task::block_in_place(|| run("a-wrong-token-123"));
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("HTTP 401"), "{text}");
    assert!(!text.contains("a-wrong-token-123"), "{text}");
}
