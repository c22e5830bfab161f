//! Tests against a REAL kube-apiserver + etcd started by `scripts/k8s-testenv.sh` (no kubelet).
//!
//! Needs the binaries built by `scripts/k8s-testenv.sh build` (cached in
//! ~/.cache/streamscale/k8s). Without them the tests are skipped with a printed reason, except
//! under CI=true, where they fail.

mod common;

use common::{env, root, run, var};

#[test]
fn helm_installs_the_chart_and_the_api_server_validates_streamjobs() {
    let Some(env) = env() else { return };
    let helm = var(env, "HELM");
    let kubectl = var(env, "KUBECTL");
    let chart = root().join("charts/streamscale");
    let _ = run(
        env,
        &helm,
        &["uninstall", "it", "-n", "streamscale-it"],
        None,
    );
    let (ok, out) = run(
        env,
        &helm,
        &[
            "install",
            "it",
            chart.to_str().unwrap_or_default(),
            "-n",
            "streamscale-it",
            "--create-namespace",
            "--wait=false",
        ],
        None,
    );
    assert!(ok, "helm install: {out}");
    for (kind, name, ns) in [
        ("crd", "streamjobs.streamscale.dev", None),
        ("crd", "streamquotas.streamscale.dev", None),
        ("serviceaccount", "it-streamscale", Some("streamscale-it")),
        ("deployment", "it-streamscale", Some("streamscale-it")),
        ("clusterrole", "it-streamscale", None),
        ("clusterrolebinding", "it-streamscale", None),
        (
            "role",
            "it-streamscale-leader-election",
            Some("streamscale-it"),
        ),
    ] {
        let mut args = vec!["get", kind, name, "-o", "name"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let (ok, out) = run(env, &kubectl, &args, None);
        assert!(ok, "{kind}/{name} not created by the chart: {out}");
    }
    // Least privilege: no wildcard anywhere in the ClusterRole, and Secrets and
    // NetworkPolicies only with the verbs the operator uses.
    let (ok, role) = run(
        env,
        &kubectl,
        &["get", "clusterrole", "it-streamscale", "-o", "json"],
        None,
    );
    assert!(ok, "{role}");
    let role: serde_json::Value = serde_json::from_str(&role).expect("clusterrole json");
    let rules = role["rules"].as_array().expect("rules");
    let verbs_of = |resource: &str| -> Vec<String> {
        rules
            .iter()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().any(|x| x == resource))
            })
            .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    for rule in rules {
        for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
            let wild = rule[field].as_array().is_some_and(|xs| {
                xs.iter()
                    .any(|x| x.as_str().is_some_and(|x| x.contains('*')))
            });
            assert!(!wild, "wildcard in {field}: {rule}");
        }
    }
    assert_eq!(verbs_of("secrets"), ["get", "create", "update"], "{role}");
    assert_eq!(verbs_of("networkpolicies"), ["create", "patch"], "{role}");
    // The Deployment is non-root with a read-only root filesystem.
    let (_, spec) = run(
        env,
        &kubectl,
        &[
            "get",
            "deployment",
            "it-streamscale",
            "-n",
            "streamscale-it",
            "-o",
            "json",
        ],
        None,
    );
    assert!(spec.contains("\"readOnlyRootFilesystem\": true"), "{spec}");
    assert!(spec.contains("\"runAsNonRoot\": true"), "{spec}");
    // Leader election with the chart's lease duration.
    let compact: String = spec.split_whitespace().collect();
    // The engine NetworkPolicy admits the operator's pods by exactly the labels they carry.
    let d: serde_json::Value = serde_json::from_str(&spec).expect("deployment json");
    let env_of = |name: &str| {
        d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == name))
            .and_then(|v| v["value"].as_str())
            .map(str::to_string)
    };
    assert_eq!(env_of("NETWORK_POLICY").as_deref(), Some("true"), "{spec}");
    let pod_labels: Vec<String> = d["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .expect("pod labels")
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    assert_eq!(
        env_of("OPERATOR_POD_LABELS"),
        Some(pod_labels.join(",")),
        "{spec}"
    );
    assert!(
        compact.contains("{\"name\":\"LEADER_ELECTION\",\"value\":\"true\"}"),
        "{spec}"
    );
    assert!(
        compact.contains("{\"name\":\"LEASE_DURATION_SECONDS\",\"value\":\"15\"}"),
        "{spec}"
    );

    // Invalid StreamJobs are rejected with readable messages (schema and CEL rules).
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        r#"apiVersion: streamscale.dev/v1alpha1
kind: StreamJob
metadata: {name: bad, namespace: default}
spec:
  job:
    name: bad
    operators:
      - {name: source, kind: source, rate: {constant: 100}}
      - {name: m, kind: mapp}
    edges: [{from: source, to: m}]
  autoscaler: {targetUtilization: 1.5, mode: sometimes, restoreTimeoutSeconds: 0,
               prometheus: {url: "prometheus:9090"}}
  savepointHistoryMaxCount: 0
"#,
    )
    .expect("write");
    let (ok, out) = run(env, &kubectl, &["create", "-f", "-"], Some(&bad));
    assert!(!ok, "invalid StreamJob accepted: {out}");
    assert!(out.contains("Unsupported value: \"sometimes\""), "{out}");
    assert!(
        out.contains("spec.job.operators[1].kind: Unsupported value: \"mapp\""),
        "{out}"
    );
    assert!(out.contains("spec.autoscaler.targetUtilization"), "{out}");
    assert!(
        out.contains("spec.autoscaler.restoreTimeoutSeconds"),
        "{out}"
    );
    assert!(out.contains("spec.autoscaler.prometheus.url"), "{out}");
    assert!(out.contains("spec.savepointHistoryMaxCount"), "{out}");
    std::fs::write(
        &bad,
        r#"apiVersion: streamscale.dev/v1alpha1
kind: StreamJob
metadata: {name: bad, namespace: default}
spec:
  job:
    name: bad
    operators:
      - {name: source, kind: source, rate: {constant: 100}}
      - {name: m, kind: map, scaling: {min: 5, max: 2}}
    edges: [{from: source, to: m}]
  autoscaler: {parallelism: {m: {min: 4, max: 1}}}
"#,
    )
    .expect("write");
    let (ok, out) = run(env, &kubectl, &["create", "-f", "-"], Some(&bad));
    assert!(!ok, "invalid StreamJob accepted: {out}");
    assert!(
        out.contains("scaling.min must be less than or equal to scaling.max"),
        "{out}"
    );
    assert!(
        out.contains("parallelism min must be less than or equal to max"),
        "{out}"
    );

    // A valid one is accepted, with its defaults applied.
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        r#"apiVersion: streamscale.dev/v1alpha1
kind: StreamJob
metadata: {name: good, namespace: default}
spec:
  job:
    name: good
    operators:
      - {name: source, kind: source, rate: {constant: 100}}
      - {name: m, kind: map, scaling: {min: 1, max: 4}}
      - {name: sink, kind: sink}
    edges: [{from: source, to: m}, {from: m, to: sink}]
"#,
    )
    .expect("write");
    let _ = run(
        env,
        &kubectl,
        &["delete", "streamjob", "good", "--ignore-not-found"],
        None,
    );
    let (ok, out) = run(env, &kubectl, &["create", "-f", "-"], Some(&good));
    assert!(ok, "valid StreamJob rejected: {out}");
    let (_, out) = run(
        env,
        &kubectl,
        &[
            "get",
            "sj",
            "good",
            "-o",
            "jsonpath={.spec.autoscaler.mode} {.spec.savepointHistoryMaxCount}",
        ],
        None,
    );
    assert_eq!(out.trim(), "auto 10");
    let _ = run(
        env,
        &kubectl,
        &["delete", "streamjob", "good", "--ignore-not-found"],
        None,
    );
}

#[test]
fn helm_refuses_chart_values_that_cannot_work() {
    let Some(env) = env() else { return };
    let helm = var(env, "HELM");
    let chart = root().join("charts/streamscale");
    let chart = chart.to_str().unwrap_or_default();
    let template = |sets: &[&str]| {
        let mut args = vec!["template", "it", chart, "--kube-version", "1.30.0"];
        for s in sets {
            args.extend(["--set", s]);
        }
        run(env, &helm, &args, None)
    };
    // The defaults, and two replicas with leader election, render.
    let (ok, out) = template(&[]);
    assert!(ok, "defaults refused: {out}");
    let (ok, out) = template(&["replicaCount=2"]);
    assert!(ok, "two replicas with leader election refused: {out}");
    // Two replicas without leader election would both reconcile every StreamJob.
    let (ok, out) = template(&["replicaCount=2", "leaderElection.enabled=false"]);
    assert!(!ok, "two replicas without leader election accepted: {out}");
    assert!(out.contains("leaderElection"), "{out}");
    for (set, field) in [
        ("logFormat=yaml", "logFormat"),
        (
            "leaderElection.leaseDurationSeconds=1",
            "leaseDurationSeconds",
        ),
        ("metrics.port=70000", "port"),
        ("replicaCount=-1", "replicaCount"),
    ] {
        let (ok, out) = template(&[set]);
        assert!(!ok, "{set} accepted: {out}");
        assert!(out.contains(field), "{set}: {out}");
    }
}
