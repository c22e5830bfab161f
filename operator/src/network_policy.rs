//! The NetworkPolicy `NAME-engine` a StreamJob owns: ingress to its engine pod only on the
//! engine port ([`crate::resources::ENGINE_PORT`], REST API and `/metrics` share it), only from
//! the operator's pods (by label, in the operator's namespace) and, when configured, from pods
//! in the namespaces a Prometheus namespace selector picks (for scraping; state changes still
//! need the engine token).

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::json;

use crate::crd::StreamJob;
use crate::resources::{self, ENGINE_PORT, ResourceError};

/// Who may reach engine pods (from the operator's settings, the chart's `networkPolicy`
/// values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPolicySettings {
    /// Namespace of the operator's pods.
    pub operator_namespace: String,
    /// Labels of the operator's pods (all must match).
    pub operator_pod_labels: BTreeMap<String, String>,
    /// Namespace labels of the Prometheus that scrapes engines; `None`: no scraper admitted.
    pub prometheus_namespace_labels: Option<BTreeMap<String, String>>,
}

/// Why a label list does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: `{item}` is not KEY=VALUE (labels are a comma-separated list of KEY=VALUE)")]
pub struct LabelsError {
    /// The setting (flag or variable) read.
    pub setting: &'static str,
    /// The offending item.
    pub item: String,
}

/// Parses `k=v,k2=v2` (blank: empty) for `setting`.
///
/// # Errors
/// [`LabelsError`] naming the setting and the item.
pub fn parse_labels(
    setting: &'static str,
    text: &str,
) -> Result<BTreeMap<String, String>, LabelsError> {
    text.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(|item| match item.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(LabelsError {
                setting,
                item: item.to_string(),
            }),
        })
        .collect()
}

/// The NetworkPolicy for `job`'s engine pod, owned by `job`.
///
/// # Errors
/// [`ResourceError`] when the StreamJob has no uid yet.
pub fn network_policy(
    job: &StreamJob,
    settings: &NetworkPolicySettings,
) -> Result<NetworkPolicy, ResourceError> {
    let port = json!([{"protocol": "TCP", "port": ENGINE_PORT}]);
    let mut ingress = vec![json!({
        "from": [{
            "namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": settings.operator_namespace,
            }},
            "podSelector": {"matchLabels": settings.operator_pod_labels},
        }],
        "ports": port,
    })];
    if let Some(labels) = &settings.prometheus_namespace_labels {
        ingress.push(json!({
            "from": [{"namespaceSelector": {"matchLabels": labels}}],
            "ports": port,
        }));
    }
    let value = json!({
        "spec": {
            "podSelector": {"matchLabels": resources::engine_pod_selector(job)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        }
    });
    let mut p: NetworkPolicy =
        serde_json::from_value(value).map_err(|source| ResourceError::Build {
            what: "NetworkPolicy",
            source,
        })?;
    p.metadata = resources::owned_meta(job, resources::engine_name(job))?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_and_bad_items_are_named() {
        let l = parse_labels("X", " a=b, c = d ,").expect("labels");
        assert_eq!(l.len(), 2);
        assert_eq!(l["c"], "d");
        assert!(parse_labels("X", "").expect("empty").is_empty());
        let e = parse_labels("OPERATOR_POD_LABELS", "a=b,oops").expect_err("bad");
        assert!(e.to_string().contains("OPERATOR_POD_LABELS: `oops`"), "{e}");
    }

    #[test]
    fn only_the_operator_and_the_configured_scraper_reach_the_engine_port() {
        let job: StreamJob = serde_saphyr::from_str(
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
        let mut settings = NetworkPolicySettings {
            operator_namespace: "streamscale".into(),
            operator_pod_labels: [("app".to_string(), "op".to_string())].into(),
            prometheus_namespace_labels: None,
        };
        let p =
            serde_json::to_value(network_policy(&job, &settings).expect("policy")).expect("json");
        assert_eq!(p["metadata"]["name"], "demo-engine");
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "StreamJob");
        assert_eq!(
            p["spec"]["podSelector"]["matchLabels"]["streamscale.dev/job"],
            "demo"
        );
        let ingress = p["spec"]["ingress"].as_array().expect("ingress");
        assert_eq!(ingress.len(), 1, "{p}");
        assert_eq!(ingress[0]["ports"][0]["port"], 8081);
        let from = &ingress[0]["from"][0];
        assert_eq!(
            from["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "streamscale"
        );
        assert_eq!(from["podSelector"]["matchLabels"]["app"], "op");

        settings.prometheus_namespace_labels =
            Some([("team".to_string(), "monitoring".to_string())].into());
        let p =
            serde_json::to_value(network_policy(&job, &settings).expect("policy")).expect("json");
        let scrape = &p["spec"]["ingress"][1];
        assert_eq!(
            scrape["from"][0]["namespaceSelector"]["matchLabels"]["team"],
            "monitoring"
        );
        assert!(scrape["from"][0].get("podSelector").is_none(), "{p}");
    }
}
