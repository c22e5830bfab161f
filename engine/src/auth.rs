//! Bearer-token authentication of the engine's state-changing endpoints.
//!
//! With a token configured (`--auth-token-file`, or the file named by
//! [`TOKEN_FILE_ENV`]), every request other than `GET`/`HEAD` (stop-with-savepoint, savepoint
//! disposal, shed share) must carry `Authorization: Bearer <token>`; others get 401 with one
//! line that never echoes what was sent. `GET /metrics`, `GET /v1/job` and the other reads stay
//! open for scrapers. Tokens are compared in constant time.

use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// Middleware: lets reads through, and state-changing requests only with the token.
pub async fn require_token(
    State(token): State<AuthToken>,
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
