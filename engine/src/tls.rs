//! TLS for the engine's HTTP server (rustls): a certificate chain and private key in PEM files
//! (`--tls-cert`, `--tls-key`), re-read when either file changes, and a listener that hands
//! axum only connections whose TLS handshake succeeded (a plain-HTTP client gets its connection
//! closed).
//!
//! Reload: before each handshake the files' modification times are compared with those last
//! loaded (at most once a second); when they changed and both parse, new connections get the new
//! certificate. A pair that does not parse (a half-written file, a key that does not match)
//! keeps the previous certificate and logs one warning naming the files.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Why the certificate or key cannot be used; names the file, never the key's content.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read or holds no PEM item of the kind needed.
    #[error("{flag} {path}: {message}")]
    File {
        /// `--tls-cert` or `--tls-key`.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The key does not fit the certificate, or rustls refuses the pair.
    #[error("--tls-cert {cert} / --tls-key {key}: {message}")]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's message.
        message: String,
    },
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Reads a certificate chain and its private key from PEM files.
///
/// # Errors
/// [`TlsError`] naming the file: unreadable, no certificate, no private key, or a key that does
/// not match the certificate.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let file_err = |flag, path: &Path, message: String| TlsError::File {
        flag,
        path: path.to_path_buf(),
        message,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_err("--tls-cert", cert, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err("--tls-cert", cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(file_err(
            "--tls-cert",
            cert,
            "no CERTIFICATE in the file".into(),
        ));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        file_err(
            "--tls-key",
            key,
            format!("no private key read ({e}; PKCS#8, PKCS#1 or SEC1 PEM expected)"),
        )
    })?;
    let pair_err = |message: String| TlsError::Pair {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        message,
    };
    let signing = provider()
        .key_provider
        .load_private_key(private)
        .map_err(|e| pair_err(e.to_string()))?;
    let ck = CertifiedKey::new(chain, signing);
    ck.keys_match().map_err(|e| pair_err(e.to_string()))?;
    Ok(ck)
}

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    stamps: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

/// The server's certificate, re-read from its files when they change.
#[derive(Debug)]
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<Loaded>,
}

impl ReloadingCert {
    /// Loads the pair once.
    ///
    /// # Errors
    /// [`TlsError`] as [`load_certified_key`].
    pub fn new(cert: &Path, key: &Path) -> Result<ReloadingCert, TlsError> {
        let stamps = (mtime(cert), mtime(key));
        let ck = load_certified_key(cert, key)?;
        Ok(ReloadingCert {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            loaded: Mutex::new(Loaded {
                key: Arc::new(ck),
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The current certificate, re-read first when the files changed (checked at most once a
    /// second).
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut l = match self.loaded.lock() {
            Ok(l) => l,
            Err(poisoned) => poisoned.into_inner(),
        };
        if l.checked.elapsed() >= Duration::from_secs(1) {
            l.checked = Instant::now();
            let stamps = (mtime(&self.cert), mtime(&self.key));
            if stamps != l.stamps {
                match load_certified_key(&self.cert, &self.key) {
                    Ok(ck) => {
                        l.key = Arc::new(ck);
                        l.stamps = stamps;
                        tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
                    }
                    Err(e) => {
                        // Keep serving the old pair; try again when the files change again.
                        l.stamps = stamps;
                        tracing::warn!(
                            "TLS certificate not reloaded, keeping the previous one: {e}"
                        );
                    }
                }
            }
        }
        l.key.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A rustls server configuration (HTTP/1.1, no client certificates) serving `cert`.
///
/// # Errors
/// [`TlsError::Pair`] when rustls refuses the protocol versions (not expected).
pub fn server_config(cert: Arc<ReloadingCert>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Pair {
            cert: cert.cert.clone(),
            key: cert.key.clone(),
            message: e.to_string(),
        })?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Seconds a client has to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// An [`axum::serve::Listener`] yielding TLS connections: TCP connections are accepted and
/// their handshakes run concurrently in the background; failed handshakes (plain HTTP,
/// untrusted clients, timeouts) are dropped.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Starts accepting on `tcp` (needs a Tokio runtime).
    ///
    /// # Errors
    /// The listener's `local_addr` error.
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { local, ready })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept task ended (its listener failed for good): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/tls")
            .join(name)
    }

    #[test]
    fn the_test_pair_loads_and_a_wrong_key_or_file_is_named() {
        load_certified_key(&data("server.crt"), &data("server.key")).expect("pair");
        let e = load_certified_key(&data("server.crt"), &data("ca.crt"))
            .expect_err("a certificate is no key")
            .to_string();
        assert!(e.starts_with("--tls-key ") && e.contains("ca.crt"), "{e}");
        let e = load_certified_key(&data("server.key"), &data("server.key"))
            .expect_err("a key is no certificate")
            .to_string();
        assert!(e.starts_with("--tls-cert "), "{e}");
        assert!(!e.contains("PRIVATE KEY-----\n"), "{e}");
    }

    #[test]
    fn a_changed_pair_is_reloaded_and_a_broken_one_keeps_the_old() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (c, k) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::copy(data("server.crt"), &c).expect("copy");
        std::fs::copy(data("server.key"), &k).expect("copy");
        let r = ReloadingCert::new(&c, &k).expect("load");
        let first = r.current();
        // A broken write: the old certificate stays.
        std::fs::write(&c, "garbage").expect("write");
        r.loaded.lock().expect("lock").checked = Instant::now() - Duration::from_secs(2);
        r.loaded.lock().expect("lock").stamps.0 = None;
        assert!(Arc::ptr_eq(&first, &r.current()));
        // A good pair again: reloaded (a new Arc).
        std::fs::copy(data("server.crt"), &c).expect("copy");
        {
            let mut l = r.loaded.lock().expect("lock");
            l.checked = Instant::now() - Duration::from_secs(2);
            l.stamps.0 = None;
        }
        let again = r.current();
        assert!(!Arc::ptr_eq(&first, &again));
        assert_eq!(first.cert, again.cert);
    }
}
