//! For unit tests: serves an axum router as a mock of a JobManager's REST API on a loopback
//! port and gives a client of it.

use super::rest::FlinkRest;

/// Serves `app` on a free loopback port (for the life of the test's runtime); a client of it.
pub(crate) async fn serve(app: axum::Router) -> FlinkRest {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let port = listener.local_addr().expect("port").port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    FlinkRest::new(reqwest::Client::new(), &format!("http://127.0.0.1:{port}"))
}
