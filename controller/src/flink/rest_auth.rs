//! Credentials and trust for Flink's REST endpoint: a bearer token or basic auth sent on every
//! request, and an optional CA certificate (PEM) that the endpoint's TLS certificate must chain
//! to (without one, the system's trusted roots).
//!
//! Flink's REST API has no authentication of its own; these are for the proxy or gateway in
//! front of it (an ingress with basic auth, an OAuth proxy taking bearer tokens). Secrets never
//! appear in `Debug` output or error messages: errors name the file or field, never its content.

use std::path::{Path, PathBuf};

/// What is sent in the `Authorization` header.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum RestCredentials {
    /// Nothing.
    #[default]
    None,
    /// `Authorization: Bearer TOKEN`.
    Bearer(String),
    /// `Authorization: Basic base64(username:password)` (RFC 7617).
    Basic {
        /// The user name (no `:`).
        username: String,
        /// The password.
        password: String,
    },
}

impl std::fmt::Debug for RestCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestCredentials::None => f.write_str("None"),
            RestCredentials::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            RestCredentials::Basic { username, .. } => {
                write!(
                    f,
                    "Basic {{ username: {username:?}, password: <redacted> }}"
                )
            }
        }
    }
}

/// Credentials plus the CA to trust for one Flink REST endpoint.
#[derive(Clone, Default, Debug)]
pub struct RestAuth {
    /// What each request carries.
    pub credentials: RestCredentials,
    /// PEM certificates the server's certificate must chain to; `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
}

/// Why the REST credentials or CA cannot be used. Names the file or field, never a secret.
#[derive(Debug, thiserror::Error)]
pub enum RestAuthError {
    /// A file cannot be read.
    #[error("{flag} {path}: {source}")]
    Read {
        /// The option that named it.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A credential is empty, not one line, or holds characters a header cannot carry.
    #[error("{what}: {problem}")]
    Invalid {
        /// The option and file, or the Secret and key.
        what: String,
        /// What is wrong (never the value).
        problem: &'static str,
    },
    /// Both a token and basic auth were given.
    #[error("give a bearer token or basic auth for the Flink REST endpoint, not both")]
    Both,
    /// The CA file holds no usable certificate.
    #[error("{what}: not a PEM certificate: {message}")]
    Ca {
        /// The option and file, or the Secret and key.
        what: String,
        /// The parser's message.
        message: String,
    },
    /// A CA was given for a plain `http` URL.
    #[error("a CA certificate was given but the REST URL {url} is not https")]
    CaWithoutTls {
        /// The URL.
        url: String,
    },
    /// The HTTP client cannot be built with this configuration.
    #[error("the Flink REST client: {0}")]
    Client(String),
}

/// Checks one credential value: one line of visible characters (spaces allowed inside a
/// password), not empty.
fn check_value(value: &str, what: &str, allow_space: bool) -> Result<(), RestAuthError> {
    let bad = |problem| RestAuthError::Invalid {
        what: what.to_string(),
        problem,
    };
    if value.is_empty() {
        return Err(bad("empty"));
    }
    let ok = value
        .chars()
        .all(|c| !c.is_control() && (allow_space || c != ' '));
    if !ok {
        return Err(bad(
            "must be one line without control characters (and, for a token or user name, without spaces)",
        ));
    }
    Ok(())
}

impl RestCredentials {
    /// A bearer token; surrounding whitespace is dropped.
    ///
    /// # Errors
    /// [`RestAuthError::Invalid`] naming `what` when it is empty or not one line.
    pub fn bearer(token: &str, what: &str) -> Result<RestCredentials, RestAuthError> {
        let token = token.trim();
        check_value(token, what, false)?;
        Ok(RestCredentials::Bearer(token.to_string()))
    }

    /// Basic auth from a user name and a password; a trailing newline of either is dropped.
    ///
    /// # Errors
    /// [`RestAuthError::Invalid`] naming `what` when either is empty, not one line, or the
    /// user name holds a `:`.
    pub fn basic(
        username: &str,
        password: &str,
        what: &str,
    ) -> Result<RestCredentials, RestAuthError> {
        let username = username.trim();
        let password = password.trim_end_matches(['\r', '\n']);
        check_value(username, &format!("{what} (user name)"), false)?;
        check_value(password, &format!("{what} (password)"), true)?;
        if username.contains(':') {
            return Err(RestAuthError::Invalid {
                what: format!("{what} (user name)"),
                problem: "must not contain ':'",
            });
        }
        Ok(RestCredentials::Basic {
            username: username.to_string(),
            password: password.to_string(),
        })
    }

    /// Adds the `Authorization` header to a request.
    pub fn apply(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self {
            RestCredentials::None => req,
            RestCredentials::Bearer(t) => req.bearer_auth(t),
            RestCredentials::Basic { username, password } => {
                req.basic_auth(username, Some(password))
            }
        }
    }
}

fn read(flag: &'static str, path: &Path) -> Result<String, RestAuthError> {
    std::fs::read_to_string(path).map_err(|source| RestAuthError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

impl RestAuth {
    /// Reads the options of `streamscale flink`: `token_file` (the token, one line),
    /// `basic_auth_file` (one line `username:password`, as `curl -u` takes it) and `ca_file`
    /// (PEM certificates).
    ///
    /// # Errors
    /// [`RestAuthError`] naming the option and file: unreadable, empty, malformed, both
    /// credentials given, or no certificate in the CA file.
    pub fn from_files(
        token_file: Option<&Path>,
        basic_auth_file: Option<&Path>,
        ca_file: Option<&Path>,
    ) -> Result<RestAuth, RestAuthError> {
        let credentials = match (token_file, basic_auth_file) {
            (Some(_), Some(_)) => return Err(RestAuthError::Both),
            (Some(p), None) => RestCredentials::bearer(
                &read("--rest-token-file", p)?,
                &format!("--rest-token-file {}", p.display()),
            )?,
            (None, Some(p)) => {
                let what = format!("--rest-basic-auth-file {}", p.display());
                let text = read("--rest-basic-auth-file", p)?;
                let line = text.trim_end_matches(['\r', '\n']);
                let Some((user, password)) = line.split_once(':') else {
                    return Err(RestAuthError::Invalid {
                        what,
                        problem: "must be one line `username:password`",
                    });
                };
                RestCredentials::basic(user, password, &what)?
            }
            (None, None) => RestCredentials::None,
        };
        let ca_pem = match ca_file {
            Some(p) => {
                let pem = std::fs::read(p).map_err(|source| RestAuthError::Read {
                    flag: "--rest-ca-file",
                    path: p.to_path_buf(),
                    source,
                })?;
                check_ca(&pem, &format!("--rest-ca-file {}", p.display()))?;
                Some(pem)
            }
            None => None,
        };
        Ok(RestAuth {
            credentials,
            ca_pem,
        })
    }

    /// A client for `url` from `builder` (timeouts and such already set): with the CA, when one
    /// is given, as the only trusted root.
    ///
    /// # Errors
    /// [`RestAuthError::CaWithoutTls`] for a CA with an `http` URL; [`RestAuthError::Ca`] or
    /// [`RestAuthError::Client`] when the client cannot be built.
    pub fn client(
        &self,
        url: &str,
        builder: reqwest::ClientBuilder,
    ) -> Result<reqwest::Client, RestAuthError> {
        let mut builder = builder.https_only(url.starts_with("https:"));
        if let Some(pem) = &self.ca_pem {
            if !url.starts_with("https:") {
                return Err(RestAuthError::CaWithoutTls {
                    url: url.to_string(),
                });
            }
            let certs =
                reqwest::Certificate::from_pem_bundle(pem).map_err(|e| RestAuthError::Ca {
                    what: "the CA certificate".into(),
                    message: e.to_string(),
                })?;
            builder = builder.tls_certs_only(certs);
        }
        builder
            .build()
            .map_err(|e| RestAuthError::Client(crate::causes::with_causes(&e)))
    }
}

/// Checks that `pem` holds at least one certificate.
///
/// # Errors
/// [`RestAuthError::Ca`] naming `what`.
pub fn check_ca(pem: &[u8], what: &str) -> Result<(), RestAuthError> {
    match reqwest::Certificate::from_pem_bundle(pem) {
        Ok(c) if !c.is_empty() => Ok(()),
        Ok(_) => Err(RestAuthError::Ca {
            what: what.to_string(),
            message: "no certificate found".into(),
        }),
        Err(e) => Err(RestAuthError::Ca {
            what: what.to_string(),
            message: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_and_secrets_stay_out_of_debug_and_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cr3t-token\n").expect("write");
        let a = RestAuth::from_files(Some(&token), None, None).expect("token");
        assert_eq!(
            a.credentials,
            RestCredentials::Bearer("s3cr3t-token".into())
        );
        assert!(!format!("{a:?}").contains("s3cr3t"));

        let basic = dir.path().join("basic");
        std::fs::write(&basic, "flink:pa ss:word\n").expect("write");
        let a = RestAuth::from_files(None, Some(&basic), None).expect("basic");
        assert_eq!(
            a.credentials,
            RestCredentials::Basic {
                username: "flink".into(),
                password: "pa ss:word".into()
            }
        );
        assert!(!format!("{a:?}").contains("pa ss"));

        std::fs::write(&basic, "no-colon-secret\n").expect("write");
        let e = RestAuth::from_files(None, Some(&basic), None)
            .expect_err("no colon")
            .to_string();
        assert!(
            e.contains("username:password") && !e.contains("no-colon-secret"),
            "{e}"
        );
        assert!(matches!(
            RestAuth::from_files(Some(&token), Some(&basic), None),
            Err(RestAuthError::Both)
        ));
        std::fs::write(&token, "two\nlines-secret").expect("write");
        let e = RestAuth::from_files(Some(&token), None, None)
            .expect_err("two lines")
            .to_string();
        assert!(
            e.contains("--rest-token-file") && !e.contains("lines-secret"),
            "{e}"
        );
        let e = RestAuth::from_files(None, None, Some(&token))
            .expect_err("not a certificate")
            .to_string();
        assert!(e.starts_with("--rest-ca-file"), "{e}");
    }

    #[test]
    fn a_ca_needs_an_https_url() {
        let a = RestAuth {
            credentials: RestCredentials::None,
            ca_pem: Some(b"x".to_vec()),
        };
        assert!(matches!(
            a.client("http://127.0.0.1:8081", reqwest::Client::builder()),
            Err(RestAuthError::CaWithoutTls { .. })
        ));
    }
}
