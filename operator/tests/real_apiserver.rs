//! Tests against a REAL kube-apiserver + etcd started by `scripts/k8s-testenv.sh` (no kubelet).
//!
//! Needs the binaries built by `scripts/k8s-testenv.sh build` (cached in
//! ~/.cache/streamscale/k8s). Without them the tests are skipped with a printed reason, except
//! under CI=true, where they fail.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Starts (or reuses) the environment; returns its variables, or `None` to skip.
fn env() -> Option<&'static Vec<(String, String)>> {
    static ENV: OnceLock<Option<Vec<(String, String)>>> = OnceLock::new();
    ENV.get_or_init(|| {
        let cache = std::env::var("STREAMSCALE_K8S_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|_| {
                PathBuf::from(std::env::var("HOME").unwrap_or_default())
                    .join(".cache/streamscale/k8s")
            });
        let built = std::fs::read_dir(cache.join("bin"))
            .map(|d| {
                d.filter_map(Result::ok).any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("kube-apiserver")
                })
            })
            .unwrap_or(false);
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        if !built && !ci {
            eprintln!(
                "SKIP: no kube-apiserver in {} (run scripts/k8s-testenv.sh build)",
                cache.display()
            );
            return None;
        }
        let out = Command::new(root().join("scripts/k8s-testenv.sh"))
            .arg("start")
            .output()
            .expect("run scripts/k8s-testenv.sh");
        assert!(
            out.status.success(),
            "k8s-testenv.sh start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env_file = String::from_utf8_lossy(&out.stdout)
            .trim()
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        let text = std::fs::read_to_string(&env_file).expect("env file");
        Some(
            text.lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    })
    .as_ref()
}

fn var(env: &[(String, String)], key: &str) -> String {
    env.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

fn run(
    env: &[(String, String)],
    program: &str,
    args: &[&str],
    stdin: Option<&Path>,
) -> (bool, String) {
    let mut cmd = Command::new(program);
    cmd.args(args).env("KUBECONFIG", var(env, "KUBECONFIG"));
    if let Some(path) = stdin {
        cmd.stdin(std::fs::File::open(path).expect("stdin file"));
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("{program}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

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
  autoscaler: {targetUtilization: 1.5, mode: sometimes}
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
            "jsonpath={.spec.autoscaler.mode}",
        ],
        None,
    );
    assert_eq!(out.trim(), "auto");
    let _ = run(
        env,
        &kubectl,
        &["delete", "streamjob", "good", "--ignore-not-found"],
        None,
    );
}
