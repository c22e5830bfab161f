//! A Kafka source's or sink's `security:` settings: the protocol (`PLAINTEXT`,
//! `SASL_PLAINTEXT`, `SASL_SSL`, `SSL`), the SASL mechanism and user, where the password is
//! (a file or an environment variable, never the job file) and a CA file.
//!
//! ```yaml
//! kafka: { topic: events, bootstrapServers: "broker:9093",
//!          security: { protocol: SASL_PLAINTEXT, mechanism: PLAIN, username: app,
//!                      passwordFile: /var/run/streamscale/kafka/password } }
//! ```
//!
//! What a build supports is what its librdkafka reports in `builtin.features`: the bundled
//! build has no OpenSSL (the project's one TLS backend is rustls), so it offers SASL/PLAIN over
//! plaintext only; TLS protocols and SCRAM are refused when the job file is read, naming the
//! field. The password is read when each client is made (so a rotated file is picked up by new
//! clients) and never logged.

use std::path::PathBuf;

use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};

/// `security.protocol`.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SecurityProtocol {
    /// No authentication, no encryption (the default).
    #[default]
    #[serde(rename = "PLAINTEXT")]
    Plaintext,
    /// SASL authentication without encryption.
    #[serde(rename = "SASL_PLAINTEXT")]
    SaslPlaintext,
    /// SASL authentication over TLS.
    #[serde(rename = "SASL_SSL")]
    SaslSsl,
    /// TLS without SASL.
    #[serde(rename = "SSL")]
    Ssl,
}

impl SecurityProtocol {
    /// librdkafka's name.
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
            SecurityProtocol::Ssl => "SSL",
        }
    }

    fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    fn tls(self) -> bool {
        matches!(self, SecurityProtocol::SaslSsl | SecurityProtocol::Ssl)
    }
}

/// `security.mechanism` (SASL).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SaslMechanism {
    /// User name and password as they are (the default; use it over TLS, or on a trusted
    /// network).
    #[default]
    #[serde(rename = "PLAIN")]
    Plain,
    /// SCRAM with SHA-256 (RFC 5802, 7677).
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    /// SCRAM with SHA-512.
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// librdkafka's name.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// A Kafka client's `security:` settings.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaSecurity {
    /// `PLAINTEXT` (default), `SASL_PLAINTEXT`, `SASL_SSL` or `SSL`.
    #[serde(default)]
    pub protocol: SecurityProtocol,
    /// SASL mechanism: `PLAIN` (default), `SCRAM-SHA-256`, `SCRAM-SHA-512`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<SaslMechanism>,
    /// SASL user name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// A file holding the SASL password (its first line). On Kubernetes: a Secret mounted
    /// into the engine pod (the StreamJob's `spec.kafkaSecret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// An environment variable of the engine holding the SASL password (instead of
    /// `passwordFile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
    /// PEM CA certificates the brokers' TLS certificates must chain to (TLS protocols only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
}

/// Why the settings cannot be used; names the job-file field, never the password.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SecurityError {
    /// The job-file field, e.g. `operators[0] (src).kafka.security.protocol`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// librdkafka's `builtin.features` of this build (e.g. `gzip,snappy,sasl,regex,lz4,...,sasl_plain,...`).
pub fn builtin_features() -> String {
    ClientConfig::new()
        .create_native_config()
        .and_then(|c| c.get("builtin.features"))
        .unwrap_or_default()
}

fn has(features: &str, feature: &str) -> bool {
    features.split(',').any(|f| f.trim() == feature)
}

impl KafkaSecurity {
    /// Checks the settings against each other and against `features` (librdkafka's
    /// `builtin.features`); `at` is the job-file path of `security`.
    ///
    /// # Errors
    /// [`SecurityError`] naming the field: a protocol or mechanism the build lacks, SASL without
    /// a user or password source (or with both sources), a user or password without SASL, a
    /// CA without TLS.
    pub fn validate(&self, at: &str, features: &str) -> Result<(), SecurityError> {
        let err = |field: &str, message: String| SecurityError {
            field: format!("{at}.{field}"),
            message,
        };
        let p = self.protocol;
        if p.tls() && !has(features, "ssl") {
            return Err(err(
                "protocol",
                format!(
                    "{} needs TLS, and this build's librdkafka has none (bundled without OpenSSL; builtin features: {features}); use SASL_PLAINTEXT on a trusted network, or a TLS-terminating proxy to the brokers",
                    p.name()
                ),
            ));
        }
        if p.sasl() {
            let m = self.mechanism.unwrap_or_default();
            let needed = match m {
                SaslMechanism::Plain => "sasl_plain",
                SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512 => "sasl_scram",
            };
            if !has(features, needed) {
                return Err(err(
                    "mechanism",
                    format!(
                        "{} needs librdkafka's {needed}, which this build lacks (bundled without OpenSSL; builtin features: {features}); use PLAIN",
                        m.name()
                    ),
                ));
            }
            if self.username.as_deref().is_none_or(|u| u.trim().is_empty()) {
                return Err(err("username", format!("{} needs a user name", p.name())));
            }
            match (&self.password_file, &self.password_env) {
                (None, None) => {
                    return Err(err(
                        "passwordFile",
                        format!(
                            "{} needs a password: `passwordFile` (a file) or `passwordEnv` (an environment variable); never the password itself",
                            p.name()
                        ),
                    ));
                }
                (Some(_), Some(_)) => {
                    return Err(err(
                        "passwordEnv",
                        "give `passwordFile` or `passwordEnv`, not both".into(),
                    ));
                }
                _ => {}
            }
        } else {
            for (field, set) in [
                ("mechanism", self.mechanism.is_some()),
                ("username", self.username.is_some()),
                ("passwordFile", self.password_file.is_some()),
                ("passwordEnv", self.password_env.is_some()),
            ] {
                if set {
                    return Err(err(
                        field,
                        format!(
                            "only used with protocol SASL_PLAINTEXT or SASL_SSL (protocol is {})",
                            p.name()
                        ),
                    ));
                }
            }
        }
        if self.ca_file.is_some() && !p.tls() {
            return Err(err(
                "caFile",
                format!(
                    "only used with protocol SSL or SASL_SSL (protocol is {})",
                    p.name()
                ),
            ));
        }
        Ok(())
    }

    /// The SASL password (`None` without SASL): the first line of `passwordFile`, or the
    /// value of `passwordEnv`.
    ///
    /// # Errors
    /// [`SecurityError`] naming the field and the file or variable (not the value): unreadable,
    /// unset or empty.
    pub fn password(&self, at: &str) -> Result<Option<String>, SecurityError> {
        if !self.protocol.sasl() {
            return Ok(None);
        }
        let (field, value) = match (&self.password_file, &self.password_env) {
            (Some(path), _) => (
                "passwordFile",
                std::fs::read_to_string(path)
                    .map(|t| t.lines().next().unwrap_or_default().to_string())
                    .map_err(|e| SecurityError {
                        field: format!("{at}.passwordFile"),
                        message: format!("{}: {e}", path.display()),
                    })?,
            ),
            (None, Some(var)) => (
                "passwordEnv",
                std::env::var(var).map_err(|_| SecurityError {
                    field: format!("{at}.passwordEnv"),
                    message: format!("the environment variable {var} is not set"),
                })?,
            ),
            (None, None) => {
                return Err(SecurityError {
                    field: format!("{at}.passwordFile"),
                    message: "no password source".into(),
                });
            }
        };
        if value.is_empty() {
            return Err(SecurityError {
                field: format!("{at}.{field}"),
                message: "the password is empty".into(),
            });
        }
        Ok(Some(value))
    }

    /// Sets librdkafka's `security.protocol`, `sasl.*` and `ssl.ca.location` on `config`,
    /// reading the password now. A password that cannot be read is left unset (the brokers then
    /// refuse the client) and logged as a warning naming the field.
    pub fn apply(&self, config: &mut ClientConfig) {
        config.set("security.protocol", self.protocol.name());
        if self.protocol.sasl() {
            config.set("sasl.mechanism", self.mechanism.unwrap_or_default().name());
            if let Some(u) = &self.username {
                config.set("sasl.username", u);
            }
            match self.password("kafka.security") {
                Ok(Some(p)) => {
                    config.set("sasl.password", p);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("{e}"),
            }
        }
        if let Some(ca) = &self.ca_file {
            config.set("ssl.ca.location", ca.display().to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUNDLED: &str = "gzip,snappy,sasl,regex,lz4,sasl_plain,plugins,http";
    const WITH_SSL: &str = "gzip,snappy,ssl,sasl,regex,lz4,sasl_plain,sasl_scram,plugins";

    fn sec(yaml: &str) -> KafkaSecurity {
        serde_saphyr::from_str(yaml).expect("security")
    }

    #[test]
    fn the_bundled_build_takes_sasl_plain_and_refuses_tls_and_scram_naming_the_field() {
        let at = "operators[0] (src).kafka.security";
        let plain = sec("{protocol: SASL_PLAINTEXT, username: app, passwordFile: /p}");
        plain.validate(at, BUNDLED).expect("PLAIN");
        let e = sec("{protocol: SASL_SSL, username: app, passwordFile: /p}")
            .validate(at, BUNDLED)
            .expect_err("no TLS");
        assert_eq!(e.field, format!("{at}.protocol"));
        assert!(e.message.contains("without OpenSSL"), "{e}");
        let e = sec(
            "{protocol: SASL_PLAINTEXT, mechanism: SCRAM-SHA-512, username: a, passwordEnv: P}",
        )
        .validate(at, BUNDLED)
        .expect_err("no SCRAM");
        assert_eq!(e.field, format!("{at}.mechanism"));
        assert!(e.message.contains("sasl_scram"), "{e}");
        // A build with OpenSSL takes both.
        sec("{protocol: SASL_SSL, mechanism: SCRAM-SHA-256, username: a, passwordEnv: P, caFile: /ca}")
            .validate(at, WITH_SSL)
            .expect("SCRAM over TLS");
    }

    #[test]
    fn sasl_needs_a_user_and_one_password_source() {
        let at = "s";
        for (yaml, field) in [
            ("{protocol: SASL_PLAINTEXT, passwordFile: /p}", "s.username"),
            ("{protocol: SASL_PLAINTEXT, username: a}", "s.passwordFile"),
            (
                "{protocol: SASL_PLAINTEXT, username: a, passwordFile: /p, passwordEnv: P}",
                "s.passwordEnv",
            ),
            ("{username: a}", "s.username"),
            ("{caFile: /ca}", "s.caFile"),
        ] {
            let e = sec(yaml).validate(at, BUNDLED).expect_err(yaml);
            assert_eq!(e.field, field, "{yaml}: {e}");
        }
        assert!(serde_saphyr::from_str::<KafkaSecurity>("{password: hunter2}").is_err());
    }

    #[test]
    fn the_password_comes_from_its_file_and_is_never_in_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("pw");
        std::fs::write(&f, "s3cret-pw\n").expect("write");
        let s = KafkaSecurity {
            protocol: SecurityProtocol::SaslPlaintext,
            username: Some("app".into()),
            password_file: Some(f.clone()),
            ..KafkaSecurity::default()
        };
        assert_eq!(s.password("x").expect("read"), Some("s3cret-pw".into()));
        let mut c = ClientConfig::new();
        s.apply(&mut c);
        assert_eq!(c.get("sasl.password"), Some("s3cret-pw"));
        assert_eq!(c.get("sasl.mechanism"), Some("PLAIN"));
        assert!(!format!("{s:?}").contains("s3cret"));
        std::fs::write(&f, "\n").expect("write");
        let e = s.password("x").expect_err("empty").to_string();
        assert_eq!(e, "x.passwordFile: the password is empty");
        let e = KafkaSecurity {
            password_file: Some(dir.path().join("missing")),
            ..s
        }
        .password("x")
        .expect_err("missing")
        .to_string();
        assert!(
            e.starts_with("x.passwordFile: ") && e.contains("missing"),
            "{e}"
        );
    }

    #[test]
    fn this_build_has_sasl_plain() {
        let f = builtin_features();
        assert!(has(&f, "sasl_plain"), "{f}");
    }
}
