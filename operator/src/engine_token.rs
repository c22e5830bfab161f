//! The engine's bearer token per StreamJob, kept in the Secret `NAME-engine-token` (owned by
//! the StreamJob, so deleted with it).
//!
//! The Secret holds `token` (mounted into the engine pod and passed as `--auth-token-file`)
//! and, after rotations, `previous`: the tokens before it, newest first, one a line (at most
//! [`MAX_PREVIOUS`]); an engine started before a rotation still requires the token it read at
//! start. The operator sends `token` and, on a 401, each previous one
//! ([`crate::runtime::KubeRuntime::authorized`]); the next engine start (a rescale or a
//! replaced pod) reads the new file.
//!
//! Rotation: setting the StreamJob's annotation [`ROTATE_ANNOTATION`] to a value the Secret
//! has not seen yet (the Secret's [`ROTATED_FOR_ANNOTATION`]) makes the operator write a fresh
//! token. Tokens are 128 random bits from `/dev/urandom` as 32 hex digits; they never appear
//! in status, Events, logs or error messages ([`EngineTokens`]'s `Debug` is redacted).

use std::collections::BTreeMap;
use std::io::Read as _;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

use crate::crd::StreamJob;
use crate::resources::{self, ResourceError};

/// StreamJob annotation: a new value asks for a new engine token.
pub const ROTATE_ANNOTATION: &str = "streamscale.dev/rotate-token";
/// Secret annotation: the [`ROTATE_ANNOTATION`] value the current token was made for.
pub const ROTATED_FOR_ANNOTATION: &str = "streamscale.dev/rotated-for";
/// Secret key of the current token (the file the engine pod mounts).
pub const TOKEN_KEY: &str = "token";
/// Secret key of the tokens before the last rotations (newest first, one a line).
pub const PREVIOUS_KEY: &str = "previous";
/// Most previous tokens kept: an engine that has not restarted through more rotations than
/// this is no longer reachable with a token the operator has.
pub const MAX_PREVIOUS: usize = 4;

/// Errors keeping the token Secret. Messages name the Secret, never a token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The API server refused or failed.
    #[error("engine token Secret {secret}: {source}")]
    Kube {
        /// `NAMESPACE/NAME` of the Secret.
        secret: String,
        /// The error.
        source: kube::Error,
    },
    /// No random bytes for a new token.
    #[error("cannot read /dev/urandom for a new engine token: {0}")]
    Random(std::io::Error),
    /// The Secret could not be built.
    #[error(transparent)]
    Resource(#[from] ResourceError),
}

/// The tokens of one StreamJob's engine.
#[derive(Clone, PartialEq, Eq)]
pub struct EngineTokens {
    /// What engines started from now on require.
    pub current: String,
    /// What an engine started before one of the last rotations requires, newest first.
    pub previous: Vec<String>,
}

impl std::fmt::Debug for EngineTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineTokens(<redacted>)")
    }
}

/// What [`ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenChange {
    /// The Secret was there and stays.
    Unchanged,
    /// The Secret was created with a fresh token.
    Created,
    /// A fresh token replaced the current one (asked for by the annotation, or the stored one
    /// was unusable).
    Rotated,
}

/// Name of the Secret holding the engine token.
pub fn secret_name(job: &StreamJob) -> String {
    format!("{}-engine-token", job.name_any())
}

/// 128 random bits from `/dev/urandom` as 32 hex digits.
///
/// # Errors
/// [`TokenError::Random`].
pub fn fresh_token() -> Result<String, TokenError> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(TokenError::Random)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A usable token (what the engine accepts in a token file).
fn usable(text: &str) -> Option<String> {
    let t = text.trim();
    streamscale_engine::auth::AuthToken::new(t).map(|_| t.to_string())
}

fn key_of(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    usable(std::str::from_utf8(&bytes.0).ok()?)
}

fn previous_of(secret: &Secret) -> Vec<String> {
    let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(PREVIOUS_KEY)) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&bytes.0)
        .lines()
        .filter_map(usable)
        .take(MAX_PREVIOUS)
        .collect()
}

/// The tokens stored in `secret`, `None` without a usable current one.
pub fn stored(secret: &Secret) -> Option<EngineTokens> {
    Some(EngineTokens {
        current: key_of(secret, TOKEN_KEY)?,
        previous: previous_of(secret),
    })
}

/// What `job` asks for next, given the Secret as found: the tokens to keep and whether they
/// change. `new` is called only when a new token is needed.
pub fn decide(
    job: &StreamJob,
    found: Option<&Secret>,
    new: impl FnOnce() -> Result<String, TokenError>,
) -> Result<(EngineTokens, TokenChange), TokenError> {
    let Some(secret) = found else {
        let tokens = EngineTokens {
            current: new()?,
            previous: Vec::new(),
        };
        return Ok((tokens, TokenChange::Created));
    };
    let wanted = job.annotations().get(ROTATE_ANNOTATION);
    let done = secret.annotations().get(ROTATED_FOR_ANNOTATION);
    let current = key_of(secret, TOKEN_KEY);
    let mut previous = previous_of(secret);
    match current {
        Some(current) if wanted.is_none() || wanted == done => {
            Ok((EngineTokens { current, previous }, TokenChange::Unchanged))
        }
        // Asked to rotate: the old token stays accepted by the running engine.
        Some(old) => {
            previous.insert(0, old);
            previous.truncate(MAX_PREVIOUS);
            Ok((
                EngineTokens {
                    current: new()?,
                    previous,
                },
                TokenChange::Rotated,
            ))
        }
        // Unusable (edited by hand): a fresh one; the running engine still has what it read.
        None => Ok((
            EngineTokens {
                current: new()?,
                previous,
            },
            TokenChange::Rotated,
        )),
    }
}

/// The token Secret for `tokens`, owned by `job`.
///
/// # Errors
/// [`ResourceError::Incomplete`] when the StreamJob has no uid yet.
pub fn secret(job: &StreamJob, tokens: &EngineTokens) -> Result<Secret, ResourceError> {
    let mut meta = resources::owned_meta(job, secret_name(job))?;
    if let Some(v) = job.annotations().get(ROTATE_ANNOTATION) {
        meta.annotations = Some([(ROTATED_FOR_ANNOTATION.to_string(), v.clone())].into());
    }
    let mut data = BTreeMap::from([(
        TOKEN_KEY.to_string(),
        ByteString(tokens.current.clone().into_bytes()),
    )]);
    if !tokens.previous.is_empty() {
        data.insert(
            PREVIOUS_KEY.to_string(),
            ByteString(tokens.previous.join("\n").into_bytes()),
        );
    }
    Ok(Secret {
        metadata: meta,
        type_: Some("Opaque".to_string()),
        data: Some(data),
        ..Secret::default()
    })
}

/// Reads `job`'s token Secret, creating it with a fresh token when missing and writing a new
/// token when the rotation annotation asks for one.
///
/// # Errors
/// [`TokenError`] naming the Secret.
pub async fn ensure(
    client: &Client,
    job: &StreamJob,
) -> Result<(EngineTokens, TokenChange), TokenError> {
    let ns = job.namespace().unwrap_or_else(|| "default".into());
    let name = secret_name(job);
    let kube_err = |source| TokenError::Kube {
        secret: format!("{ns}/{name}"),
        source,
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let found = api.get_opt(&name).await.map_err(kube_err)?;
    let (tokens, change) = decide(job, found.as_ref(), fresh_token)?;
    match change {
        TokenChange::Unchanged => {}
        TokenChange::Created => {
            match api
                .create(&PostParams::default(), &secret(job, &tokens)?)
                .await
            {
                Ok(_) => {}
                // Created meanwhile (another replica before a takeover): use that one.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let found = api.get(&name).await.map_err(kube_err)?;
                    return decide(job, Some(&found), fresh_token)
                        .map(|(t, _)| (t, TokenChange::Unchanged));
                }
                Err(e) => return Err(kube_err(e)),
            }
        }
        TokenChange::Rotated => {
            let mut s = secret(job, &tokens)?;
            // Only when nobody changed it since it was read.
            s.metadata.resource_version = found.and_then(|f| f.metadata.resource_version);
            api.replace(&name, &PostParams::default(), &s)
                .await
                .map_err(kube_err)?;
        }
    }
    Ok((tokens, change))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(rotate: Option<&str>) -> StreamJob {
        let mut j: StreamJob = serde_saphyr::from_str(
            r#"
apiVersion: streamscale.dev/v1alpha1
kind: StreamJob
metadata: {name: demo, namespace: ns, uid: "1234"}
spec:
  job:
    name: demo
    operators: [{name: source, kind: source, rate: {constant: 1}}, {name: sink, kind: sink}]
    edges: [{from: source, to: sink}]
"#,
        )
        .expect("StreamJob");
        if let Some(v) = rotate {
            j.metadata.annotations = Some([(ROTATE_ANNOTATION.to_string(), v.to_string())].into());
        }
        j
    }

    fn tokens(current: &str, previous: Option<&str>) -> EngineTokens {
        EngineTokens {
            current: current.into(),
            previous: previous.map(str::to_string).into_iter().collect(),
        }
    }

    #[test]
    fn rotations_keep_the_newest_previous_tokens_first() {
        let mut t = tokens(&"0".repeat(32), None);
        for (i, c) in ["1", "2", "3", "4", "5", "6"].iter().enumerate() {
            let s = secret(&job(Some(&i.to_string())), &t).expect("secret");
            let next = c.repeat(32);
            let (n, change) = decide(&job(Some(&(i + 1).to_string())), Some(&s), || {
                Ok(next.clone())
            })
            .expect("rotate");
            assert_eq!(change, TokenChange::Rotated);
            assert_eq!(n.previous[0], t.current);
            t = n;
        }
        let s = secret(&job(Some("6")), &t).expect("secret");
        let stored = stored(&s).expect("stored");
        assert_eq!(stored.current, "6".repeat(32));
        let firsts: String = stored.previous.iter().map(|p| &p[..1]).collect();
        assert_eq!(firsts, "5432", "newest first, at most {MAX_PREVIOUS}");
    }

    #[test]
    fn fresh_tokens_are_128_bits_of_hex_and_differ() {
        let (a, b) = (fresh_token().expect("a"), fresh_token().expect("b"));
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(usable(&a).is_some());
    }

    #[test]
    fn missing_secret_is_created_and_a_new_annotation_value_rotates_once() {
        let new = || Ok("n".repeat(32));
        let (t, c) = decide(&job(None), None, new).expect("create");
        assert_eq!(
            (t.current.as_str(), c),
            ("n".repeat(32).as_str(), TokenChange::Created)
        );

        let old = "o".repeat(32);
        let s = secret(&job(None), &tokens(&old, None)).expect("secret");
        let (t, c) = decide(&job(None), Some(&s), || panic!("no new token")).expect("keep");
        assert_eq!((t, c), (tokens(&old, None), TokenChange::Unchanged));

        let (t, c) = decide(&job(Some("1")), Some(&s), new).expect("rotate");
        assert_eq!(
            (t.clone(), c),
            (tokens(&"n".repeat(32), Some(&old)), TokenChange::Rotated)
        );
        // Written for value "1": the same value does not rotate again.
        let s = secret(&job(Some("1")), &t).expect("secret");
        let (_, c) = decide(&job(Some("1")), Some(&s), || panic!("no new token")).expect("keep");
        assert_eq!(c, TokenChange::Unchanged);
    }

    #[test]
    fn an_unusable_stored_token_is_replaced_and_debug_never_shows_tokens() {
        let mut s = secret(&job(None), &tokens(&"o".repeat(32), None)).expect("secret");
        s.data
            .as_mut()
            .expect("data")
            .insert(TOKEN_KEY.into(), ByteString(b"short".to_vec()));
        let (t, c) = decide(&job(None), Some(&s), || Ok("n".repeat(32))).expect("replace");
        assert_eq!(c, TokenChange::Rotated);
        assert_eq!(format!("{t:?}"), "EngineTokens(<redacted>)");
        assert_eq!(
            s.metadata.owner_references.expect("owner")[0].kind,
            "StreamJob"
        );
    }
}
