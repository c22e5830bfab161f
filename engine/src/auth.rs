//! Bearer-token authentication of the engine's state-changing endpoints.
//!
//! With a token configured (`--auth-token-file`, or the file named by
//! [`TOKEN_FILE_ENV`]), every request other than `GET`/`HEAD` (stop-with-savepoint, savepoint
//! disposal, shed share) must carry `Authorization: Bearer <token>`; others get 401 with one
//! line that never echoes what was sent. `GET /metrics`, `GET /v1/job` and the other reads stay
//! open for scrapers. Tokens are compared in constant time.
//!
//! Rotation without a restart ([`TokenSource`]): the token file is read again at every
//! state-changing request; a new valid token is accepted from then on, and the one it replaced
//! for [`PREVIOUS_TOKEN_GRACE`] more (so a client holding the old token, such as an operator
//! whose Secret volume has not caught up, is not locked out mid-rescale). A file that became
//! unreadable or invalid keeps the current token and logs a warning naming the file.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// Environment variable naming the token file (when `--auth-token-file` is not given).
pub const TOKEN_FILE_ENV: &str = "STREAMSCALE_ENGINE_AUTH_TOKEN_FILE";

/// Fewest characters a token may have (16 hex digits are 64 bits).
pub const MIN_TOKEN_LEN: usize = 16;

/// A bearer token the engine requires on state-changing requests.
#[derive(Clone)]
pub struct AuthToken(Arc<[u8]>);

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(<redacted>)")
    }
}

/// Why a token file cannot be used. Messages name the file, never its content.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The file cannot be read.
    #[error("--auth-token-file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The token is empty, too short, or holds characters a header cannot carry.
    #[error(
        "--auth-token-file {path}: the token must be one line of at least {MIN_TOKEN_LEN} visible ASCII characters"
    )]
    Invalid {
        /// The file.
        path: PathBuf,
    },
}

impl AuthToken {
    /// Reads the token from `path`: its content without surrounding whitespace.
    ///
    /// # Errors
    /// [`AuthError`] naming the file.
    pub fn from_file(path: &Path) -> Result<AuthToken, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        AuthToken::new(text.trim()).ok_or_else(|| AuthError::Invalid {
            path: path.to_path_buf(),
        })
    }

    /// A token from its text; `None` unless it is at least [`MIN_TOKEN_LEN`] visible ASCII
    /// characters.
    pub fn new(text: &str) -> Option<AuthToken> {
        (text.len() >= MIN_TOKEN_LEN && text.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| AuthToken(Arc::from(text.as_bytes())))
    }

    /// Whether an `Authorization` header value is `Bearer <this token>` (constant time in the
    /// token's content).
    pub fn accepts(&self, authorization: Option<&[u8]>) -> bool {
        let Some(given) = authorization.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return false;
        };
        bool::from(given.ct_eq(&self.0))
    }
}

/// How long the token a rotation replaced is still accepted.
pub const PREVIOUS_TOKEN_GRACE: Duration = Duration::from_secs(600);

#[derive(Debug)]
struct Tokens {
    current: AuthToken,
    /// The token the last rotation replaced, and until when it is accepted.
    previous: Option<(AuthToken, Instant)>,
}

/// The engine's token, from a file read again at each check (see the module docs).
#[derive(Debug, Clone)]
pub struct TokenSource {
    file: Option<PathBuf>,
    tokens: Arc<Mutex<Tokens>>,
}

impl TokenSource {
    /// A token read from `path` now, and again at each check.
    ///
    /// # Errors
    /// [`AuthError`] naming the file.
    pub fn from_file(path: &Path) -> Result<TokenSource, AuthError> {
        let current = AuthToken::from_file(path)?;
        Ok(TokenSource {
            file: Some(path.to_path_buf()),
            tokens: Arc::new(Mutex::new(Tokens {
                current,
                previous: None,
            })),
        })
    }

    /// A fixed token (never re-read).
    pub fn fixed(token: AuthToken) -> TokenSource {
        TokenSource {
            file: None,
            tokens: Arc::new(Mutex::new(Tokens {
                current: token,
                previous: None,
            })),
        }
    }

    /// Whether `authorization` carries the current token, or the previous one within its grace
    /// period; the file is read again first.
    pub fn accepts(&self, authorization: Option<&[u8]>) -> bool {
        let mut t = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(path) = &self.file {
            match AuthToken::from_file(path) {
                Ok(new) if !bool::from(new.0.ct_eq(&t.current.0)) => {
                    let old = std::mem::replace(&mut t.current, new);
                    t.previous = Some((old, Instant::now() + PREVIOUS_TOKEN_GRACE));
                    tracing::info!(file = %path.display(), "auth token file changed: the new token is accepted, the previous one for {} s more", PREVIOUS_TOKEN_GRACE.as_secs());
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("{e}; keeping the token read before"),
            }
        }
        if t.previous
            .as_ref()
            .is_some_and(|(_, until)| Instant::now() >= *until)
        {
            t.previous = None;
        }
        // Both compared, so the time taken does not say which one matched.
        let current = t.current.accepts(authorization);
        let previous = t
            .previous
            .as_ref()
            .is_some_and(|(p, _)| p.accepts(authorization));
        current | previous
    }
}

/// Middleware: lets reads through, and state-changing requests only with the token.
pub async fn require_token(
    State(token): State<TokenSource>,
    request: Request,
    next: Next,
) -> Response {
    let read = matches!(*request.method(), Method::GET | Method::HEAD);
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    if read || token.accepts(given) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(serde_json::json!({
            "error": "this endpoint needs the engine's bearer token (Authorization: Bearer ...)"
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_is_accepted() {
        let t = AuthToken::new("0123456789abcdef").expect("token");
        assert!(t.accepts(Some(b"Bearer 0123456789abcdef")));
        for wrong in [
            &b"Bearer 0123456789abcdeX"[..],
            b"Bearer 0123456789abcde",
            b"Bearer 0123456789abcdef0",
            b"bearer 0123456789abcdef",
            b"0123456789abcdef",
            b"",
        ] {
            assert!(
                !t.accepts(Some(wrong)),
                "{}",
                String::from_utf8_lossy(wrong)
            );
        }
        assert!(!t.accepts(None));
    }

    #[test]
    fn a_rotated_file_is_accepted_at_once_and_the_old_token_for_the_grace_period() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("token");
        std::fs::write(&f, "first-token-0123456\n").expect("write");
        let s = TokenSource::from_file(&f).expect("source");
        assert!(s.accepts(Some(b"Bearer first-token-0123456")));
        std::fs::write(&f, "second-token-012345\n").expect("write");
        assert!(s.accepts(Some(b"Bearer second-token-012345")));
        assert!(s.accepts(Some(b"Bearer first-token-0123456")), "in grace");
        // A broken write keeps the tokens.
        std::fs::write(&f, "x").expect("write");
        assert!(s.accepts(Some(b"Bearer second-token-012345")));
        // The grace period over: the old token is refused.
        s.tokens
            .lock()
            .expect("lock")
            .previous
            .as_mut()
            .expect("previous")
            .1 = Instant::now();
        assert!(!s.accepts(Some(b"Bearer first-token-0123456")));
        assert!(s.accepts(Some(b"Bearer second-token-012345")));
        assert!(!s.accepts(None));
    }

    #[test]
    fn short_or_odd_tokens_are_refused_without_echoing_them() {
        assert!(AuthToken::new("short").is_none());
        assert!(AuthToken::new("has a space in it!!").is_none());
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("token");
        std::fs::write(&f, "secret-but-short\n\n").expect("write");
        let t = AuthToken::from_file(&f).expect("16 characters");
        assert_eq!(format!("{t:?}"), "AuthToken(<redacted>)");
        std::fs::write(&f, "tiny").expect("write");
        let e = AuthToken::from_file(&f).expect_err("too short").to_string();
        assert!(
            e.contains(&f.display().to_string()) && !e.contains("tiny"),
            "{e}"
        );
    }
}
