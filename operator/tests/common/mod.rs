//! Shared by the tests against a REAL kube-apiserver + etcd started by
//! `scripts/k8s-testenv.sh` (no kubelet).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Starts (or reuses) the environment; returns its variables, or `None` to skip (never under
/// CI=true, where a missing environment fails the test).
pub fn env() -> Option<&'static Vec<(String, String)>> {
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

/// One variable of the environment file.
pub fn var(env: &[(String, String)], key: &str) -> String {
    env.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

/// Runs `program` with the admin KUBECONFIG; returns success and stdout+stderr.
pub fn run(
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
pub mod cluster;
