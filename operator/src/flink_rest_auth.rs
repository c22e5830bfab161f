//! A FlinkScaler's `spec.restAuth`: the Secret holding the credentials (a bearer token, or a
//! user name and password) and the CA certificate for the Flink REST endpoint, read at every
//! reconcile (so a changed Secret takes effect without a restart).
//!
//! Secret keys: `token`, or `username` and `password`; optional `ca.crt` (PEM). Errors name the
//! Secret and the key, never a value.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use streamscale_controller::flink::FlinkRest;
use streamscale_controller::flink::rest_auth::{RestAuth, RestCredentials, check_ca};

use crate::flink_scaler_crd::RestAuthRef;

/// The key holding a bearer token.
pub const TOKEN_KEY: &str = "token";
/// The key holding the basic-auth user name.
pub const USERNAME_KEY: &str = "username";
/// The key holding the basic-auth password.
pub const PASSWORD_KEY: &str = "password";
/// The key holding PEM CA certificates.
pub const CA_KEY: &str = "ca.crt";

/// Seconds a REST request to Flink may take (as the operator's shared client).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn text<'a>(
    data: &'a BTreeMap<String, ByteString>,
    key: &str,
    what: &str,
) -> Result<Option<&'a str>, String> {
    data.get(key)
        .map(|v| {
            std::str::from_utf8(&v.0).map_err(|_| format!("{what} key `{key}` is not UTF-8 text"))
        })
        .transpose()
}

/// The credentials and CA in a Secret's `data` (`what` names the Secret in messages).
///
/// # Errors
/// A message naming the Secret and key: a token together with a user name, a user name without
/// a password (or the reverse), a value that is empty or not one line, a `ca.crt` without a
/// certificate, or none of the keys.
pub fn from_secret_data(
    data: &BTreeMap<String, ByteString>,
    what: &str,
) -> Result<RestAuth, String> {
    let token = text(data, TOKEN_KEY, what)?;
    let user = text(data, USERNAME_KEY, what)?;
    let password = text(data, PASSWORD_KEY, what)?;
    let credentials = match (token, user, password) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err(format!(
                "{what} has both `{TOKEN_KEY}` and `{USERNAME_KEY}`/`{PASSWORD_KEY}`: keep one"
            ));
        }
        (Some(t), None, None) => RestCredentials::bearer(t, &format!("{what} key `{TOKEN_KEY}`"))
            .map_err(|e| e.to_string())?,
        (None, Some(u), Some(p)) => RestCredentials::basic(
            u,
            p,
            &format!("{what} keys `{USERNAME_KEY}`/`{PASSWORD_KEY}`"),
        )
        .map_err(|e| e.to_string())?,
        (None, Some(_), None) | (None, None, Some(_)) => {
            return Err(format!(
                "{what} needs both `{USERNAME_KEY}` and `{PASSWORD_KEY}` for basic auth"
            ));
        }
        (None, None, None) => RestCredentials::None,
    };
    let ca_pem = data.get(CA_KEY).map(|v| v.0.clone());
    if let Some(pem) = &ca_pem {
        check_ca(pem, &format!("{what} key `{CA_KEY}`")).map_err(|e| e.to_string())?;
    }
    if credentials == RestCredentials::None && ca_pem.is_none() {
        return Err(format!(
            "{what} has none of the keys `{TOKEN_KEY}`, `{USERNAME_KEY}`/`{PASSWORD_KEY}`, `{CA_KEY}`"
        ));
    }
    Ok(RestAuth {
        credentials,
        ca_pem,
    })
}

/// The REST client for a FlinkScaler's endpoint `url`: `shared` as is without `restAuth`; with
/// it, the Secret's credentials on every request, and a client trusting only its `ca.crt` when
/// it has one.
///
/// # Errors
/// A message for the FlinkScaler's status naming the Secret (missing, unreadable, malformed)
/// and never a value.
pub async fn flink_rest(
    client: &Client,
    shared: &reqwest::Client,
    ns: &str,
    auth: Option<&RestAuthRef>,
    url: &str,
) -> Result<FlinkRest, String> {
    let Some(auth) = auth else {
        return Ok(FlinkRest::new(shared.clone(), url));
    };
    let what = format!(
        "Secret {ns}/{} (spec.restAuth.secretName)",
        auth.secret_name
    );
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(&auth.secret_name)
        .await
        .map_err(|e| format!("{what}: cannot read it: {e}"))?
        .ok_or_else(|| format!("{what} does not exist"))?;
    let rest_auth = from_secret_data(&secret.data.unwrap_or_default(), &what)?;
    let http = match rest_auth.ca_pem {
        None => shared.clone(),
        Some(_) => rest_auth
            .client(url, reqwest::Client::builder().timeout(REQUEST_TIMEOUT))
            .map_err(|e| format!("{what}: {e}"))?,
    };
    Ok(FlinkRest::new(http, url).with_credentials(rest_auth.credentials))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
            .collect()
    }

    #[test]
    fn token_or_basic_auth_and_errors_without_values() {
        let a = from_secret_data(&data(&[("token", "t0ken-value\n")]), "S").expect("token");
        assert_eq!(a.credentials, RestCredentials::Bearer("t0ken-value".into()));
        let a = from_secret_data(
            &data(&[("username", "flink"), ("password", "pw-value")]),
            "S",
        )
        .expect("basic");
        assert!(matches!(a.credentials, RestCredentials::Basic { .. }));
        for (bad, needle) in [
            (data(&[("token", "t0ken-value"), ("username", "u")]), "both"),
            (data(&[("password", "pw-value")]), "needs both"),
            (data(&[("other", "x")]), "none of the keys"),
            (data(&[("token", "two\nlines-value")]), "`token`"),
            (data(&[("ca.crt", "not-a-pem-value")]), "`ca.crt`"),
        ] {
            let e = from_secret_data(&bad, "Secret ns/s").expect_err(needle);
            assert!(e.contains("Secret ns/s") && e.contains(needle), "{e}");
            assert!(!e.contains("-value"), "a value leaked: {e}");
        }
    }
}
