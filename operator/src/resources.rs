//! The objects a StreamJob owns, built as plain values for server-side apply.
//!
//! * ConfigMap `NAME-job`: `job.yaml`, the job graph at the current parallelism.
//! * PersistentVolumeClaim `NAME-savepoints` (unless `storage.kind: emptyDir`).
//! * Deployment `NAME-engine`: one pod running `streamscale-engine` (strategy `Recreate`, so
//!   two engines never run one job), resources sized from the total parallelism.
//! * Service `NAME-engine`: the engine's REST API and `/metrics` on port 8081.
//! * Secret `NAME-engine-token` ([`crate::engine_token`]): the engine's bearer token, mounted
//!   at [`TOKEN_DIR`] and passed as `--auth-token-file`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::crd::{StorageKind, StreamJob};

/// Port of the engine's REST API and metrics.
pub const ENGINE_PORT: u16 = 8081;
/// Where the job file is mounted in the engine container.
pub const JOB_FILE: &str = "/etc/streamscale/job.yaml";
/// Where savepoints are written in the engine container.
pub const SAVEPOINT_DIR: &str = "/var/lib/streamscale/savepoints";
/// Where a StreamJob's `spec.kafkaSecret` is mounted in the engine container (one file per key).
pub const KAFKA_SECRET_DIR: &str = "/var/run/streamscale/kafka";

/// Where the engine token Secret is mounted in the engine container.
pub const TOKEN_DIR: &str = "/var/run/streamscale/engine-token";
/// The engine's `--auth-token-file`: the Secret's key `token` under [`TOKEN_DIR`].
pub const TOKEN_FILE: &str = "/var/run/streamscale/engine-token/token";
/// Field manager of the operator's server-side applies.
pub const FIELD_MANAGER: &str = "streamscale-operator";

/// Errors building owned objects.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    /// The StreamJob has no namespace or uid yet.
    #[error("StreamJob {0} has no namespace or uid")]
    Incomplete(String),
    /// A generated object did not deserialize (a bug).
    #[error("cannot build {what}: {source}")]
    Build {
        /// The object.
        what: &'static str,
        /// The error.
        source: serde_json::Error,
    },
}

/// Name of the ConfigMap holding the job graph.
pub fn configmap_name(job: &StreamJob) -> String {
    format!("{}-job", job.name_any())
}
/// Name of the engine Deployment and Service.
pub fn engine_name(job: &StreamJob) -> String {
    format!("{}-engine", job.name_any())
}
/// Name of the savepoint PVC.
pub fn pvc_name(job: &StreamJob) -> String {
    format!("{}-savepoints", job.name_any())
}

/// Where the engine writes savepoints: [`SAVEPOINT_DIR`], or the
/// `streamscale.dev/savepoint-dir` annotation's directory.
pub fn savepoint_dir(job: &StreamJob) -> String {
    job.annotations()
        .get(crate::crd::SAVEPOINT_DIR_ANNOTATION)
        .map(|d| d.trim_end_matches('/').to_string())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| SAVEPOINT_DIR.to_string())
}

/// The engine's in-cluster URL, or the `streamscale.dev/engine-url` annotation's.
pub fn engine_url(job: &StreamJob) -> String {
    if let Some(url) = job.annotations().get(crate::crd::ENGINE_URL_ANNOTATION) {
        return url.trim_end_matches('/').to_string();
    }
    format!(
        "http://{}.{}.svc:{ENGINE_PORT}",
        engine_name(job),
        job.namespace().unwrap_or_else(|| "default".into())
    )
}

/// Metadata of an object `name` owned by `job` (namespace, labels, controller owner
/// reference).
///
/// # Errors
/// [`ResourceError::Incomplete`] when the StreamJob has no uid yet.
pub fn owned_meta(job: &StreamJob, name: String) -> Result<ObjectMeta, ResourceError> {
    meta(job, name)
}

fn meta(job: &StreamJob, name: String) -> Result<ObjectMeta, ResourceError> {
    let owner = job
        .controller_owner_ref(&())
        .ok_or_else(|| ResourceError::Incomplete(job.name_any()))?;
    Ok(ObjectMeta {
        name: Some(name),
        namespace: job.namespace(),
        labels: Some(labels(job)),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    })
}

/// Labels on every owned object (and the engine pod).
pub fn labels(job: &StreamJob) -> BTreeMap<String, String> {
    [
        ("app.kubernetes.io/name", "streamscale-engine".to_string()),
        ("app.kubernetes.io/instance", job.name_any()),
        (
            "app.kubernetes.io/managed-by",
            "streamscale-operator".to_string(),
        ),
        ("streamscale.dev/job", job.name_any()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The labels that select `job`'s engine pod (the Service's and NetworkPolicy's selector).
pub fn engine_pod_selector(job: &StreamJob) -> BTreeMap<String, String> {
    [
        ("streamscale.dev/job".to_string(), job.name_any()),
        (
            "app.kubernetes.io/name".to_string(),
            "streamscale-engine".to_string(),
        ),
    ]
    .into()
}

/// The job file at `parallelism`.
pub fn job_yaml(job: &StreamJob, parallelism: &BTreeMap<String, u32>) -> String {
    job.spec.job.with_parallelism(parallelism).to_yaml()
}

/// The ConfigMap with `job.yaml` at `parallelism`.
pub fn configmap(
    job: &StreamJob,
    parallelism: &BTreeMap<String, u32>,
) -> Result<ConfigMap, ResourceError> {
    Ok(ConfigMap {
        metadata: meta(job, configmap_name(job))?,
        data: Some([("job.yaml".to_string(), job_yaml(job, parallelism))].into()),
        ..ConfigMap::default()
    })
}

/// The savepoint PVC, `None` for `emptyDir` storage.
pub fn pvc(job: &StreamJob) -> Result<Option<PersistentVolumeClaim>, ResourceError> {
    if job.spec.storage.kind == StorageKind::EmptyDir {
        return Ok(None);
    }
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": job.spec.storage.size}},
    });
    if let Some(class) = &job.spec.storage.storage_class_name {
        spec["storageClassName"] = json!(class);
    }
    let mut pvc: PersistentVolumeClaim =
        serde_json::from_value(json!({ "spec": spec })).map_err(|source| ResourceError::Build {
            what: "PersistentVolumeClaim",
            source,
        })?;
    pvc.metadata = meta(job, pvc_name(job))?;
    Ok(Some(pvc))
}

/// Where the engine deployed from `restore` (at any parallelism) writes its periodic
/// checkpoints: `checkpoints/<lineage>` under the savepoint volume ([`savepoint_dir`]), so that
/// they outlive a container restart, or `<namespace>/<name>/<lineage>` under the job's
/// `checkpoint.dir` when that is absolute or a URL (a directory other StreamJobs may share).
/// `<lineage>` is 16 hex digits of a SHA-256 over the job file (every operator at
/// parallelism one), the savepoint restored from and, under a shared directory, the
/// StreamJob's uid: a pod restarted with the same template finds its own checkpoints; a
/// rescale's roll back (the old parallelism from the same savepoint) finds those of the failed
/// attempt at the new parallelism and, with `--recover`, resumes from the newest of them rather
/// than from the older savepoint, whose later records the attempt's exactly-once sinks may have
/// committed; an engine deployed from a newer savepoint (a rescale), with another job graph or
/// for another StreamJob (or one deleted and created again) never recovers from another
/// engine's. `None` when the job has no `checkpoint:` block (it takes no checkpoints).
pub fn checkpoint_dir(job: &StreamJob, restore: Option<&str>) -> Option<String> {
    let (base, _) = checkpoint_base(job)?;
    Some(match checkpoint_prefix(job) {
        Some(prefix) => {
            let uid = job.metadata.uid.as_deref().unwrap_or_default();
            format!("{prefix}{}", lineage(job, restore, Some(uid)))
        }
        None => format!("{base}/{}", lineage(job, restore, None)),
    })
}

/// The directory [`checkpoint_dir`] named under a shared `checkpoint.dir` before it held the
/// StreamJob's namespace and name (`<checkpoint.dir>/<lineage>`); `None` when the base is the
/// job's own volume (named as before) or the job takes no checkpoints.
pub fn checkpoint_dir_before_namespaces(job: &StreamJob, restore: Option<&str>) -> Option<String> {
    match checkpoint_base(job)? {
        (base, true) => Some(format!("{base}/{}", lineage(job, restore, None))),
        (_, false) => None,
    }
}

/// The checkpoint directory of the engine deployed from `restore` in place of `previous` (the
/// Deployment there now): [`checkpoint_dir`], except that an engine an older operator deployed
/// from the same savepoint under [`checkpoint_dir_before_namespaces`] keeps that directory, so
/// that an operator upgrade neither replaces its pod nor makes a restarted pod restore the
/// older savepoint and replay what its exactly-once sinks already committed.
pub fn deployed_checkpoint_dir(
    job: &StreamJob,
    restore: Option<&str>,
    previous: Option<&Deployment>,
) -> Option<String> {
    let own = checkpoint_dir(job, restore)?;
    let before = checkpoint_dir_before_namespaces(job, restore);
    let kept = deployed_from(previous, restore);
    match (kept.and_then(|d| arg_value(d, "--checkpoint-dir")), before) {
        (Some(dir), Some(before)) if dir == before => Some(dir),
        _ => Some(own),
    }
}

/// `previous` when it runs an engine deployed from `restore` (the same savepoint: a pod the
/// operator would keep rather than a rescale's new one).
fn deployed_from<'a>(
    previous: Option<&'a Deployment>,
    restore: Option<&str>,
) -> Option<&'a Deployment> {
    previous.filter(|d| workload_of(d).is_some_and(|w| w.restore.as_deref() == restore))
}

/// The prefix every checkpoint directory of this StreamJob under a shared `checkpoint.dir`
/// starts with (`<dir>/<namespace>/<name>/`); `None` when its directories are on its own volume.
fn checkpoint_prefix(job: &StreamJob) -> Option<String> {
    match checkpoint_base(job)? {
        (base, true) => {
            let ns = job.namespace().unwrap_or_else(|| "default".into());
            Some(format!("{base}/{ns}/{}/", job.name_any()))
        }
        (_, false) => None,
    }
}

/// The base of a job's checkpoint directories and whether other StreamJobs may share it (an
/// absolute or URL `checkpoint.dir`); `None` without checkpoints.
fn checkpoint_base(job: &StreamJob) -> Option<(String, bool)> {
    let checkpoint = job.spec.job.checkpoint.as_ref()?;
    Some(
        match checkpoint.dir.as_deref().map(|d| d.trim_end_matches('/')) {
            Some(d) if d.starts_with('/') || d.contains("://") => (d.to_string(), true),
            _ => (format!("{}/checkpoints", savepoint_dir(job)), false),
        },
    )
}

/// 16 hex digits of a SHA-256 over the job file at parallelism 1, `restore` and, when given,
/// the StreamJob's `uid` (a StreamJob deleted and created again under the same name is another
/// job).
fn lineage(job: &StreamJob, restore: Option<&str>, uid: Option<&str>) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let ones: BTreeMap<String, u32> = job
        .spec
        .job
        .operators
        .iter()
        .map(|o| (o.name.clone(), 1))
        .collect();
    hasher.update(job_yaml(job, &ones).as_bytes());
    hasher.update([0u8]);
    hasher.update(restore.unwrap_or_default().as_bytes());
    if let Some(uid) = uid {
        hasher.update([0u8]);
        hasher.update(uid.as_bytes());
    }
    hasher
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `<namespace>.<name>` of `job` when one of its Kafka sinks takes the engine's default
/// transactional ids (exactly-once, no `transactionalIdPrefix`), for the engine's
/// `--transactional-id-scope`: two StreamJobs whose job graphs share a name (one job file
/// deployed in two namespaces) never share ids on one Kafka cluster, where the producers of
/// one would fence the other's. `None` otherwise (the arguments, hence the pod template,
/// of every other job are left as they were).
pub fn transactional_id_scope(job: &StreamJob) -> Option<String> {
    use streamscale_engine::spec::{OperatorKind, SinkDelivery};
    let takes_default = job.spec.job.operators.iter().any(|o| {
        matches!(&o.kind, OperatorKind::Sink {
            kafka: Some(k),
            delivery: SinkDelivery::ExactlyOnce,
            ..
        } if k.transactional_id_prefix.is_none())
    });
    takes_default.then(|| {
        format!(
            "{}.{}",
            job.metadata.namespace.as_deref().unwrap_or("default"),
            job.name_any()
        )
    })
}

/// The `--transactional-id-scope` of the engine deployed from `restore` in place of `previous`
/// (the Deployment there now): [`transactional_id_scope`], except that an engine an older
/// operator deployed from the same savepoint (no [`TRANSACTIONAL_ID_SCOPE_ANNOTATION`]) keeps
/// its ids until the next rescale, so that an operator upgrade does not replace its pod.
pub fn deployed_transactional_id_scope(
    job: &StreamJob,
    restore: Option<&str>,
    previous: Option<&Deployment>,
) -> Option<String> {
    let scope = transactional_id_scope(job)?;
    match deployed_from(previous, restore) {
        Some(d)
            if annotation(&d.metadata, TRANSACTIONAL_ID_SCOPE_ANNOTATION).is_none()
                && arg_value(d, "--transactional-id-scope").is_none() =>
        {
            None
        }
        _ => Some(scope),
    }
}

/// The Deployment annotation with the engine's `--transactional-id-scope` (empty without one):
/// it tells a Deployment of this operator from one of an operator that never passed a scope.
pub const TRANSACTIONAL_ID_SCOPE_ANNOTATION: &str = "streamscale.dev/transactional-id-scope";

/// The engine's command-line arguments (savepoints under `savepoint_dir`; with
/// `checkpoint_dir`, checkpoints there and `--recover` from the latest of them on every start,
/// so that a restarted container goes on from its last completed checkpoint rather than from
/// `restore`).
pub fn engine_args(
    savepoint_dir: &str,
    parallelism: &BTreeMap<String, u32>,
    restore: Option<&str>,
    checkpoint_dir: Option<&str>,
    retire: &[String],
    transactional_id_scope: Option<&str>,
) -> Vec<String> {
    let mut args = vec![
        "--job".to_string(),
        JOB_FILE.to_string(),
        "--savepoint-dir".to_string(),
        savepoint_dir.to_string(),
        "--bind".to_string(),
        format!("0.0.0.0:{ENGINE_PORT}"),
        // State changes need the per-job token (the Secret `NAME-engine-token`).
        "--auth-token-file".to_string(),
        TOKEN_FILE.to_string(),
        "--parallelism".to_string(),
        streamscale_controller::runtime::parallelism_arg(parallelism),
    ];
    if let Some(path) = restore {
        args.push("--restore".to_string());
        args.push(path.to_string());
    }
    if let Some(dir) = checkpoint_dir {
        args.push("--checkpoint-dir".to_string());
        args.push(dir.to_string());
        args.push("--recover".to_string());
        for dir in retire {
            args.push("--retire-checkpoints".to_string());
            args.push(dir.clone());
        }
    }
    if let Some(scope) = transactional_id_scope {
        args.push("--transactional-id-scope".to_string());
        args.push(scope.to_string());
    }
    args
}

/// Most superseded checkpoint directories an engine is told to retire (the newest ones).
const MAX_RETIRED: usize = 8;

/// The checkpoint directories ([`checkpoint_dir`]) an engine deployed from `restore` supersedes
/// (`--retire-checkpoints`: removed once it completed a checkpoint of its own). When the
/// Deployment it replaces (`previous`) ran from another savepoint: that engine's directory and
/// what that engine still had to retire (it may have died before its first checkpoint). From
/// the same savepoint (a restarted pod, a rescale's roll back, a re-applied template): what
/// `previous` had to retire, unchanged, so that the pod template does not change. Never the
/// new engine's own directory; at most the newest 8.
pub fn superseded_checkpoints(
    job: &StreamJob,
    restore: Option<&str>,
    previous: Option<&Deployment>,
) -> Vec<String> {
    let Some(own) = deployed_checkpoint_dir(job, restore, previous) else {
        return Vec::new();
    };
    let Some(previous) = previous else {
        return Vec::new();
    };
    let args = deployment_args(previous).unwrap_or_default();
    let mut retire: Vec<String> = args
        .iter()
        .zip(args.iter().skip(1))
        .filter(|(flag, _)| *flag == "--retire-checkpoints")
        .map(|(_, v)| v.clone())
        .collect();
    let previous_restore = workload_of(previous).and_then(|w| w.restore);
    if previous_restore.as_deref() != restore
        && let Some(dir) = arg_value(previous, "--checkpoint-dir")
    {
        retire.push(dir);
    }
    // Only this StreamJob's own directories: under a shared `checkpoint.dir` an earlier
    // operator's `<dir>/<lineage>` may be another StreamJob's live lineage too.
    let mine = checkpoint_prefix(job);
    retire.retain(|d| *d != own && mine.as_deref().is_none_or(|m| d.starts_with(m)));
    let mut seen = std::collections::BTreeSet::new();
    retire.retain(|d| seen.insert(d.clone()));
    let skip = retire.len().saturating_sub(MAX_RETIRED);
    retire.drain(..skip);
    retire
}

/// The engine container's arguments of a Deployment (its first container's).
fn deployment_args(deployment: &Deployment) -> Option<&[String]> {
    deployment
        .spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .args
        .as_deref()
}

/// The value after `flag` in a Deployment's engine arguments.
fn arg_value(deployment: &Deployment, flag: &str) -> Option<String> {
    let args = deployment_args(deployment)?;
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).cloned()
}

/// The `streamscale.dev/config-hash` pod annotation of the engine Deployment of `job` at
/// `parallelism`: 16 hex digits of a SHA-256 over the job file the engine runs.
pub fn config_hash(job: &StreamJob, parallelism: &BTreeMap<String, u32>) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(job_yaml(job, parallelism).as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A Deployment's `streamscale.dev/config-hash` pod annotation ([`config_hash`]), `None`
/// without one.
pub fn deployed_config_hash(deployment: &Deployment) -> Option<&str> {
    template_annotation(deployment, "streamscale.dev/config-hash")
}

/// The `status.restarts` a Deployment's pod template was applied with (its
/// `streamscale.dev/restart` annotation); `None` when it has none or it is not a number.
pub fn deployed_restart(deployment: &Deployment) -> Option<u32> {
    template_annotation(deployment, "streamscale.dev/restart")?
        .parse()
        .ok()
}

fn template_annotation<'a>(deployment: &'a Deployment, key: &str) -> Option<&'a str> {
    annotation(deployment.spec.as_ref()?.template.metadata.as_ref()?, key)
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Whether a Deployment's engine runs without `--auth-token-file` (deployed by an operator
/// from before the engine token).
pub fn runs_without_token(deployment: &Deployment) -> bool {
    deployment_args(deployment).is_some_and(|args| !args.iter().any(|a| a == "--auth-token-file"))
}

/// Reads `--parallelism` and `--restore` back from a Deployment's first container.
pub fn workload_of(deployment: &Deployment) -> Option<crate::rescale::WorkloadObs> {
    let parallelism = arg_value(deployment, "--parallelism")?
        .split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect();
    Some(crate::rescale::WorkloadObs {
        parallelism,
        restore: arg_value(deployment, "--restore"),
    })
}

/// The engine Deployment at `parallelism`, restored from `restore`, in place of `previous` (the
/// Deployment there now, if any); `restart` (from `status.restarts`) is a pod-template
/// annotation, so that raising it replaces the pod. The engine checkpoints under
/// [`deployed_checkpoint_dir`] and removes the directories [`superseded_checkpoints`] names once
/// it has completed a checkpoint.
pub fn deployment(
    job: &StreamJob,
    parallelism: &BTreeMap<String, u32>,
    restore: Option<&str>,
    restart: u32,
    previous: Option<&Deployment>,
) -> Result<Deployment, ResourceError> {
    let retire = superseded_checkpoints(job, restore, previous);
    let checkpoints = deployed_checkpoint_dir(job, restore, previous);
    let scope = deployed_transactional_id_scope(job, restore, previous);
    let total: u32 = parallelism.values().sum::<u32>().max(1);
    let cpu = format!(
        "{}m",
        job.spec.engine.cpu_millis_per_subtask.saturating_mul(total)
    );
    let memory = format!(
        "{}Mi",
        job.spec
            .engine
            .memory_mib_per_subtask
            .saturating_mul(total)
            .saturating_add(64)
    );
    let config_hash = config_hash(job, parallelism);
    let savepoints = match job.spec.storage.kind {
        StorageKind::PersistentVolumeClaim => {
            json!({"name": "savepoints", "persistentVolumeClaim": {"claimName": pvc_name(job)}})
        }
        StorageKind::EmptyDir => json!({"name": "savepoints", "emptyDir": {}}),
    };
    let labels = labels(job);
    let selector: BTreeMap<&str, &String> = labels
        .iter()
        .filter(|(k, _)| {
            k.as_str() == "streamscale.dev/job" || k.as_str() == "app.kubernetes.io/name"
        })
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let value = json!({
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "streamscale.dev/config-hash": config_hash,
                        "streamscale.dev/restart": restart.to_string(),
                    },
                },
                "spec": {
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "fsGroup": 65532},
                    "containers": [{
                        "name": "engine",
                        "image": job.spec.engine.image,
                        "imagePullPolicy": job.spec.engine.image_pull_policy,
                        "args": engine_args(
                            &savepoint_dir(job),
                            parallelism,
                            restore,
                            checkpoints.as_deref(),
                            &retire,
                            scope.as_deref(),
                        ),
                        "ports": [{"name": "http", "containerPort": ENGINE_PORT}],
                        "resources": {
                            "requests": {"cpu": cpu, "memory": memory},
                            "limits": {"memory": memory},
                        },
                        "readinessProbe": {"httpGet": {"path": "/v1/job", "port": "http"}},
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": [
                            {"name": "job", "mountPath": "/etc/streamscale", "readOnly": true},
                            {"name": "savepoints", "mountPath": savepoint_dir(job)},
                            {"name": "engine-token", "mountPath": TOKEN_DIR, "readOnly": true},
                        ],
                    }],
                    "volumes": [
                        {"name": "job", "configMap": {"name": configmap_name(job)}},
                        savepoints,
                        {"name": "engine-token", "secret": {
                            "secretName": crate::engine_token::secret_name(job),
                            "items": [{"key": crate::engine_token::TOKEN_KEY, "path": "token"}],
                            "defaultMode": 0o440,
                        }},
                    ],
                },
            },
        },
    });
    let mut value = value;
    if let Some(k) = &job.spec.kafka_secret {
        let pod = &mut value["spec"]["template"]["spec"];
        if let Some(mounts) = pod["containers"][0]["volumeMounts"].as_array_mut() {
            mounts.push(json!({"name": "kafka", "mountPath": KAFKA_SECRET_DIR, "readOnly": true}));
        }
        if let Some(volumes) = pod["volumes"].as_array_mut() {
            volumes.push(json!({"name": "kafka", "secret": {
                "secretName": k.secret_name,
                "defaultMode": 0o440,
            }}));
        }
    }
    let mut d: Deployment =
        serde_json::from_value(value).map_err(|source| ResourceError::Build {
            what: "Deployment",
            source,
        })?;
    d.metadata = meta(job, engine_name(job))?;
    // On the Deployment, not its pod template: an operator upgrade that adds it replaces no pod.
    let annotations = d.metadata.annotations.get_or_insert_default();
    annotations.insert(
        JOB_FINGERPRINT_ANNOTATION.to_string(),
        job.spec.job.fingerprint(),
    );
    annotations.insert(
        TRANSACTIONAL_ID_SCOPE_ANNOTATION.to_string(),
        scope.unwrap_or_default(),
    );
    Ok(d)
}

/// The Deployment annotation holding the fingerprint of the job its engine runs (operators,
/// kinds, edges, name, maxParallelism: what a savepoint must match to be restored).
pub const JOB_FINGERPRINT_ANNOTATION: &str = "streamscale.dev/job-fingerprint";

/// The fingerprint of the job a Deployment's engine runs ([`JOB_FINGERPRINT_ANNOTATION`]),
/// `None` for one an operator deployed before it was kept.
pub fn deployed_fingerprint(deployment: &Deployment) -> Option<&str> {
    annotation(&deployment.metadata, JOB_FINGERPRINT_ANNOTATION)
}

/// The engine Service (REST and metrics).
pub fn service(job: &StreamJob) -> Result<Service, ResourceError> {
    let value = json!({
        "spec": {
            "selector": {"streamscale.dev/job": job.name_any(), "app.kubernetes.io/name": "streamscale-engine"},
            "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http"}],
        }
    });
    let mut s: Service = serde_json::from_value(value).map_err(|source| ResourceError::Build {
        what: "Service",
        source,
    })?;
    s.metadata = meta(job, engine_name(job))?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn job() -> StreamJob {
        let yaml = r#"
apiVersion: streamscale.dev/v1alpha1
kind: StreamJob
metadata: {name: demo, namespace: ns, uid: "1234", generation: 1}
spec:
  job:
    name: demo
    operators:
      - {name: source, kind: source, rate: {constant: 100}}
      - {name: map, kind: map, cpu: 10, parallelism: 2}
      - {name: sink, kind: sink}
    edges:
      - {from: source, to: map}
      - {from: map, to: sink}
"#;
        serde_saphyr::from_str(yaml).expect("valid StreamJob")
    }

    #[test]
    fn the_job_fingerprint_is_on_the_deployment_not_its_pod_template() {
        let j = job();
        let d = deployment(&j, &j.spec.job.parallelism(), None, 0, None).expect("deployment");
        let fingerprint = j.spec.job.fingerprint();
        assert_eq!(deployed_fingerprint(&d), Some(fingerprint.as_str()));
        let template = serde_json::to_string(&d.spec.expect("spec").template).expect("json");
        assert!(!template.contains(&fingerprint), "{template}");
    }

    #[test]
    fn the_restart_count_is_read_back_from_the_pod_template() {
        let j = job();
        let d = deployment(&j, &j.spec.job.parallelism(), None, 7, None).expect("deployment");
        assert_eq!(deployed_restart(&d), Some(7));
        assert_eq!(deployed_restart(&Deployment::default()), None);
    }

    #[test]
    fn the_kafka_secret_is_mounted_read_only_when_named() {
        let mut j = job();
        let d = deployment(&j, &j.spec.job.parallelism(), None, 0, None).expect("deployment");
        assert!(
            !serde_json::to_string(&d)
                .expect("json")
                .contains(KAFKA_SECRET_DIR)
        );
        j.spec.kafka_secret = Some(crate::crd::KafkaSecretRef {
            secret_name: "kafka-creds".into(),
        });
        let d = deployment(&j, &j.spec.job.parallelism(), None, 0, None).expect("deployment");
        let pod = d.spec.and_then(|s| s.template.spec).expect("pod");
        let mount = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "kafka")
            .expect("mount");
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            (KAFKA_SECRET_DIR, Some(true))
        );
        let vol = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "kafka")
            .and_then(|v| v.secret.clone())
            .expect("secret volume");
        assert_eq!(vol.secret_name.as_deref(), Some("kafka-creds"));
    }

    #[test]
    fn deployment_round_trips_parallelism_and_restore() {
        let j = job();
        let p = j.spec.job.parallelism();
        let d = deployment(&j, &p, Some("/sp/x"), 0, None).expect("deployment");
        let w = workload_of(&d).expect("workload");
        assert_eq!(w.parallelism, p);
        assert_eq!(w.restore.as_deref(), Some("/sp/x"));
        assert!(!runs_without_token(&d));
        let mut old = d.clone();
        if let Some(args) = old
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .and_then(|s| s.containers[0].args.as_mut())
        {
            args.retain(|a| a != "--auth-token-file" && a != TOKEN_FILE);
            args.push("--insecure-bind".into());
        }
        assert!(runs_without_token(&old));
        let c = &d
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0];
        let req = c.resources.as_ref().unwrap().requests.as_ref().unwrap();
        assert_eq!(req["cpu"].0, "1000m");
        assert_eq!(
            d.metadata.owner_references.as_ref().unwrap()[0].kind,
            "StreamJob"
        );
    }

    /// The engine pod restarts with the same arguments; they must name a checkpoint directory
    /// on the savepoint volume (not beside the read-only job file) and `--recover`, and the
    /// directory must change with the savepoint restored from and the job graph (not with the
    /// parallelism).
    #[test]
    fn a_checkpointed_job_recovers_from_its_own_checkpoints_on_the_savepoint_volume() {
        let args_of = |d: &Deployment| {
            d.spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .args
                .clone()
                .unwrap()
        };
        let value = |args: &[String], flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .map(|i| args[i + 1].clone())
        };
        let j = job();
        let p = j.spec.job.parallelism();
        let plain = args_of(&deployment(&j, &p, None, 0, None).expect("deployment"));
        assert!(
            !plain
                .iter()
                .any(|a| a == "--recover" || a == "--checkpoint-dir")
        );

        let mut j = job();
        j.spec.job.checkpoint = serde_saphyr::from_str("intervalSeconds: 1").expect("checkpoint");
        let d = deployment(&j, &p, Some("/sp/sp-1"), 0, None).expect("deployment");
        let args = args_of(&d);
        assert!(args.iter().any(|a| a == "--recover"), "{args:?}");
        let chk = value(&args, "--checkpoint-dir").expect("--checkpoint-dir");
        assert!(
            chk.starts_with(&format!("{SAVEPOINT_DIR}/checkpoints/")),
            "{chk}"
        );
        let pod = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let on_volume = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "savepoints" && chk.starts_with(&format!("{}/", m.mount_path)));
        assert!(on_volume, "the checkpoints must be on the savepoint volume");
        // The same template, the same directory (a restarted container finds its checkpoints).
        let again = args_of(&deployment(&j, &p, Some("/sp/sp-1"), 1, None).expect("deployment"));
        assert_eq!(
            value(&again, "--checkpoint-dir").as_deref(),
            Some(chk.as_str())
        );
        // Another savepoint or another job graph: another directory.
        let newer = args_of(&deployment(&j, &p, Some("/sp/sp-2"), 0, None).expect("deployment"));
        assert_ne!(
            value(&newer, "--checkpoint-dir").as_deref(),
            Some(chk.as_str())
        );
        let mut other = j.clone();
        other.spec.job.operators[0].name = "renamed".into();
        let other =
            args_of(&deployment(&other, &p, Some("/sp/sp-1"), 0, None).expect("deployment"));
        assert_ne!(
            value(&other, "--checkpoint-dir").as_deref(),
            Some(chk.as_str())
        );
        // The same savepoint at another parallelism (a rescale and its roll back): the same
        // directory, so the roll back recovers from the failed attempt's newest checkpoint.
        let wider: BTreeMap<String, u32> = [("map".to_string(), 3)].into();
        let wider =
            args_of(&deployment(&j, &wider, Some("/sp/sp-1"), 0, None).expect("deployment"));
        assert_eq!(
            value(&wider, "--checkpoint-dir").as_deref(),
            Some(chk.as_str())
        );
        // An absolute `checkpoint.dir` of the job is kept as the base.
        j.spec.job.checkpoint = serde_saphyr::from_str("{intervalSeconds: 1, dir: \"s3://b/chk\"}")
            .expect("checkpoint");
        let s3 = args_of(&deployment(&j, &p, None, 0, None).expect("deployment"));
        assert!(
            value(&s3, "--checkpoint-dir").is_some_and(|d| d.starts_with("s3://b/chk/ns/demo/")),
            "{s3:?}"
        );
    }

    #[test]
    fn streamjobs_sharing_a_checkpoint_dir_never_share_a_lineage() {
        let mut a = job();
        a.spec.job.checkpoint =
            serde_saphyr::from_str("{intervalSeconds: 1, dir: \"s3://b/chk/\"}")
                .expect("checkpoint");
        let mut b = a.clone();
        b.metadata.namespace = Some("staging".into());
        let mut c = a.clone();
        c.metadata.name = Some("demo-2".into());
        let dirs: Vec<String> = [&a, &b, &c]
            .iter()
            .map(|j| checkpoint_dir(j, Some("/sp/sp-1")).expect("dir"))
            .collect();
        assert!(dirs[0].starts_with("s3://b/chk/ns/demo/"), "{dirs:?}");
        assert!(dirs[1].starts_with("s3://b/chk/staging/demo/"), "{dirs:?}");
        assert!(dirs[2].starts_with("s3://b/chk/ns/demo-2/"), "{dirs:?}");
        // Deleted and created again under the same name: another uid, another lineage.
        let mut again = a.clone();
        again.metadata.uid = Some("5678".into());
        let recreated = checkpoint_dir(&again, Some("/sp/sp-1")).expect("dir");
        assert!(recreated.starts_with("s3://b/chk/ns/demo/"), "{recreated}");
        assert_ne!(recreated, dirs[0]);
        // Under the job's own volume nothing else is shared and the directory is as before.
        let own = checkpoint_dir(&job_with_checkpoints(), None).expect("dir");
        assert!(
            own.starts_with(&format!("{}/checkpoints/", savepoint_dir(&a))),
            "{own}"
        );
        assert_eq!(
            checkpoint_dir_before_namespaces(&job_with_checkpoints(), None),
            None
        );
    }

    #[test]
    fn an_engine_an_older_operator_deployed_keeps_its_checkpoint_dir_until_it_is_rescaled() {
        let mut j = job();
        j.spec.job.checkpoint =
            serde_saphyr::from_str("{intervalSeconds: 1, dir: /shared/chk}").expect("checkpoint");
        let p = j.spec.job.parallelism();
        let before = checkpoint_dir_before_namespaces(&j, Some("/sp/sp-1")).expect("shared");
        // As an operator before namespaced lineages rendered it.
        let mut old = deployment(&j, &p, Some("/sp/sp-1"), 0, None).expect("deployment");
        let args = old
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .expect("pod spec");
        let args = args.containers[0].args.as_mut().expect("args");
        let at = args
            .iter()
            .position(|a| a == "--checkpoint-dir")
            .expect("flag")
            + 1;
        args[at] = before.clone();
        // Re-applied from the same savepoint (every reconcile, a restart): unchanged.
        let again = deployment(&j, &p, Some("/sp/sp-1"), 0, Some(&old)).expect("deployment");
        assert_eq!(arg_value(&again, "--checkpoint-dir"), Some(before.clone()));
        assert_eq!(again, old);
        // A rescale (a newer savepoint) moves to the namespaced directory. The old one is not
        // retired: another StreamJob of the same spec.job may have shared it.
        let rescaled = deployment(&j, &p, Some("/sp/sp-2"), 0, Some(&old)).expect("deployment");
        assert_eq!(
            arg_value(&rescaled, "--checkpoint-dir"),
            checkpoint_dir(&j, Some("/sp/sp-2"))
        );
        assert_eq!(arg_value(&rescaled, "--retire-checkpoints"), None);
        // The next rescale retires the namespaced directory it supersedes.
        let next = deployment(&j, &p, Some("/sp/sp-3"), 0, Some(&rescaled)).expect("deployment");
        assert_eq!(
            arg_value(&next, "--retire-checkpoints"),
            checkpoint_dir(&j, Some("/sp/sp-2"))
        );
        assert_ne!(checkpoint_dir(&j, Some("/sp/sp-2")), Some(before));
        // Another job's directory of the old naming is not taken for this one's.
        let mut other = j.clone();
        other.spec.job.operators[1].name = "other".into();
        let theirs = deployment(&other, &p, Some("/sp/sp-1"), 0, Some(&old)).expect("deployment");
        assert_eq!(
            arg_value(&theirs, "--checkpoint-dir"),
            checkpoint_dir(&other, Some("/sp/sp-1"))
        );
    }

    /// An exactly-once Kafka sink taking the engine's default transactional ids gets the
    /// StreamJob's `<namespace>.<name>` as their scope; a sink naming its prefix, an
    /// at-least-once one, or a job without Kafka sinks leaves the arguments as they were.
    #[test]
    fn a_kafka_sink_with_default_transactional_ids_gets_the_streamjobs_scope() {
        let scope_of = |sink: &str| {
            let mut j = job_with_checkpoints();
            j.spec.job.operators[2] = serde_saphyr::from_str(sink).expect("sink");
            let d = deployment(&j, &j.spec.job.parallelism(), None, 0, None).expect("deployment");
            let args = deployment_args(&d).unwrap_or_default();
            args.iter()
                .position(|a| a == "--transactional-id-scope")
                .map(|i| args[i + 1].clone())
        };
        let kafka = r#"{name: sink, kind: sink, kafka: {topic: out, bootstrapServers: "k:9092"}"#;
        assert_eq!(scope_of(&format!("{kafka}}}")).as_deref(), Some("ns.demo"));
        assert_eq!(
            scope_of(
                r#"{name: sink, kind: sink, kafka: {topic: out, bootstrapServers: "k:9092", transactionalIdPrefix: mine}}"#
            ),
            None
        );
        assert_eq!(
            scope_of(&format!("{kafka}, delivery: at-least-once}}")),
            None
        );
        assert_eq!(scope_of("{name: sink, kind: sink}"), None);
    }

    /// An engine an older operator deployed without a scope keeps its transactional ids (and
    /// its pod) until the next rescale, which deploys the scoped ones.
    #[test]
    fn an_engine_deployed_without_a_scope_keeps_its_ids_until_a_rescale() {
        let mut j = job_with_checkpoints();
        j.spec.job.operators[2] = serde_saphyr::from_str(
            r#"{name: sink, kind: sink, kafka: {topic: out, bootstrapServers: "k:9092"}}"#,
        )
        .expect("sink");
        let p = j.spec.job.parallelism();
        let mut older = deployment(&j, &p, Some("/sp/sp-1"), 0, None).expect("deployment");
        let args = older
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .and_then(|s| s.containers[0].args.as_mut())
            .expect("args");
        let at = args
            .iter()
            .position(|a| a == "--transactional-id-scope")
            .expect("scoped");
        args.drain(at..at + 2);
        older
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .remove(TRANSACTIONAL_ID_SCOPE_ANNOTATION);
        assert_eq!(
            deployed_transactional_id_scope(&j, Some("/sp/sp-1"), Some(&older)),
            None
        );
        let again = deployment(&j, &p, Some("/sp/sp-1"), 0, Some(&older)).expect("deployment");
        assert_eq!(
            serde_json::to_value(&again.spec.as_ref().expect("spec").template).expect("json"),
            serde_json::to_value(&older.spec.as_ref().expect("spec").template).expect("json"),
            "the same pod template"
        );
        assert_eq!(
            deployed_transactional_id_scope(&j, Some("/sp/sp-2"), Some(&older)).as_deref(),
            Some("ns.demo")
        );
        // This operator's own Deployment without a scope (the sink named its prefix, since
        // removed while the engine was stopped) gets one at once.
        let mut named = j.clone();
        named.spec.job.operators[2] = serde_saphyr::from_str(
            r#"{name: sink, kind: sink, kafka: {topic: out, bootstrapServers: "k:9092", transactionalIdPrefix: mine}}"#,
        )
        .expect("sink");
        let own = deployment(&named, &p, Some("/sp/sp-1"), 0, None).expect("deployment");
        assert_eq!(arg_value(&own, "--transactional-id-scope"), None);
        assert_eq!(
            deployed_transactional_id_scope(&j, Some("/sp/sp-1"), Some(&own)).as_deref(),
            Some("ns.demo")
        );
    }

    fn job_with_checkpoints() -> StreamJob {
        let mut j = job();
        j.spec.job.checkpoint = serde_saphyr::from_str("intervalSeconds: 1").expect("checkpoint");
        j
    }

    #[test]
    fn a_deployment_from_a_newer_savepoint_retires_the_lineages_it_supersedes() {
        let retired = |d: &Deployment| -> Vec<String> {
            let args = deployment_args(d).unwrap_or_default();
            args.iter()
                .zip(args.iter().skip(1))
                .filter(|(f, _)| *f == "--retire-checkpoints")
                .map(|(_, v)| v.clone())
                .collect()
        };
        let mut j = job();
        let p = j.spec.job.parallelism();
        // No checkpoints, nothing to retire.
        let d0 = deployment(&j, &p, None, 0, None).expect("deployment");
        assert!(superseded_checkpoints(&j, Some("/sp/sp-1"), Some(&d0)).is_empty());
        j.spec.job.checkpoint = serde_saphyr::from_str("intervalSeconds: 1").expect("checkpoint");
        let dir = |restore: Option<&str>| checkpoint_dir(&j, restore).expect("dir");
        let render = |restore: Option<&str>, previous: Option<&Deployment>| {
            deployment(&j, &p, restore, 0, previous).expect("deployment")
        };
        let first = render(None, None);
        assert!(retired(&first).is_empty());
        // A rescale from sp-1 supersedes the first engine's lineage.
        let second = render(Some("/sp/sp-1"), Some(&first));
        assert_eq!(retired(&second), vec![dir(None)]);
        // A restart or roll back from the same savepoint keeps the template's list.
        assert_eq!(
            retired(&render(Some("/sp/sp-1"), Some(&second))),
            vec![dir(None)]
        );
        // The next rescale adds sp-1's lineage (its engine may not have retired its own yet).
        let third = render(Some("/sp/sp-2"), Some(&second));
        assert_eq!(retired(&third), vec![dir(None), dir(Some("/sp/sp-1"))]);
        // A return to an older savepoint never retires its own lineage.
        let back = render(Some("/sp/sp-1"), Some(&third));
        assert_eq!(retired(&back), vec![dir(None), dir(Some("/sp/sp-2"))]);
        // At most the newest 8.
        let mut d = back;
        for k in 3..20 {
            d = render(Some(&format!("/sp/sp-{k}")), Some(&d));
        }
        let list = retired(&d);
        assert_eq!(list.len(), 8);
        assert_eq!(list.last(), Some(&dir(Some("/sp/sp-18"))));
    }

    #[test]
    fn engine_url_honours_the_annotation() {
        let mut j = job();
        assert_eq!(engine_url(&j), "http://demo-engine.ns.svc:8081");
        j.metadata.annotations = Some(
            [(
                crate::crd::ENGINE_URL_ANNOTATION.to_string(),
                "http://127.0.0.1:9/".to_string(),
            )]
            .into(),
        );
        assert_eq!(engine_url(&j), "http://127.0.0.1:9");
    }

    #[test]
    fn configmap_has_job_at_parallelism() {
        let j = job();
        let p: BTreeMap<String, u32> = [("map".to_string(), 5)].into();
        let cm = configmap(&j, &p).expect("cm");
        let text = &cm.data.unwrap()["job.yaml"];
        let spec = streamscale_engine::spec::JobSpec::from_yaml(text).expect("parses");
        assert_eq!(spec.operator("map").unwrap().parallelism, 5);
    }
}
