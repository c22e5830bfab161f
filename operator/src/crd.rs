//! The `StreamJob` custom resource (`streamscale.dev/v1alpha1`).
//!
//! The doc comments of the spec and status fields below become the descriptions of the CRD's
//! OpenAPI schema (`kubectl explain streamjob.spec`), so they are written for users.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use streamscale_engine::spec::JobSpec;

pub use crate::backoff_status::BackoffStatus;

/// Annotation that points the operator at a given engine URL instead of the engine Service
/// (`http://NAME-engine.NAMESPACE.svc:8081`). For tests and development, where the engine runs
/// outside the cluster (for example on loopback beside a local operator).
pub const ENGINE_URL_ANNOTATION: &str = "streamscale.dev/engine-url";

/// Annotation that overrides where the engine writes savepoints inside its container
/// (default `/var/lib/streamscale/savepoints`, the mount path of the savepoint volume). For
/// tests and development, together with [`ENGINE_URL_ANNOTATION`], when the engine runs outside
/// the cluster and the pod's paths must be the host's.
pub const SAVEPOINT_DIR_ANNOTATION: &str = "streamscale.dev/savepoint-dir";

/// Finalizer the operator puts on every StreamJob (takes the final savepoint on delete).
pub const FINALIZER: &str = "streamscale.dev/final-savepoint";

/// A streaming job run by the bundled streamscale engine and autoscaled by the operator.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "streamscale.dev",
    version = "v1alpha1",
    kind = "StreamJob",
    plural = "streamjobs",
    shortname = "sj",
    category = "streamscale",
    namespaced,
    status = "StreamJobStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Parallelism","type":"integer","description":"Total subtasks running","jsonPath":".status.totalParallelism"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.autoscaler.mode"}"#,
    printcolumn = r#"{"name":"Bottleneck","type":"string","jsonPath":".status.lastDecision.bottleneck"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct StreamJobSpec {
    /// The job graph: operators, edges and job-wide settings, in exactly the schema of the
    /// engine's job YAML (`name`, `maxParallelism`, `operators`, `edges`, ...). Each operator's
    /// `parallelism` is the initial parallelism; `scaling.min`/`scaling.max` bound what the
    /// autoscaler may choose. Of the job's own `autoscaler:` block, `targetUtilization`,
    /// `latencySloSeconds` and `catchUpSeconds` are overridden by `spec.autoscaler`;
    /// `latencyPercentile`, `forecast`, `limits` and `onUnattainableSlo` are read from here.
    #[schemars(schema_with = "job_graph_schema")]
    pub job: JobSpec,
    /// The engine container: image and resources per subtask.
    #[serde(default)]
    pub engine: EngineSettings,
    /// Where checkpoints and savepoints are kept.
    #[serde(default)]
    pub storage: StorageSettings,
    /// How the operator scales the job.
    #[serde(default)]
    pub autoscaler: AutoscalerSettings,
    /// Take a final savepoint (stop-with-savepoint) before the job is deleted. Default false.
    #[serde(default)]
    pub savepoint_on_delete: bool,
    /// Rescale savepoints kept on the savepoint volume (the Flink Kubernetes Operator's
    /// `kubernetes.operator.savepoint.history.max.count`). Each savepoint a rescale leaves the
    /// job running from is recorded in `status.savepointHistory`; while the history is longer
    /// than this, the oldest are disposed of through the running engine's
    /// `DELETE /v1/savepoints/{id}`, never the one the job runs from. Default 10, 1 to 1000.
    #[serde(default = "default_savepoint_history_max_count")]
    #[schemars(range(min = 1, max = 1000))]
    pub savepoint_history_max_count: u32,
    /// A Secret in this namespace mounted read-only into the engine pod at
    /// `/var/run/streamscale/kafka/`, one file per key, for the Kafka password of the job's
    /// sources and sinks: `security: {protocol: SASL_PLAINTEXT, username: app, passwordFile:
    /// /var/run/streamscale/kafka/password}` reads the key `password`. Never put the password
    /// in `spec.job`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka_secret: Option<KafkaSecretRef>,
}

/// The Secret holding a StreamJob's Kafka credentials.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KafkaSecretRef {
    /// The Secret's name, in the StreamJob's namespace.
    #[schemars(length(min = 1))]
    pub secret_name: String,
}

/// The engine container.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineSettings {
    /// Engine image (runs `streamscale-engine`). Default `ghcr.io/streamscale/streamscale-engine:0.1.0`.
    #[serde(default = "default_image")]
    #[schemars(length(min = 1))]
    pub image: String,
    /// Image pull policy: `Always`, `IfNotPresent` or `Never`. Default `IfNotPresent`.
    #[serde(default = "default_pull_policy")]
    #[schemars(regex(pattern = r"^(Always|IfNotPresent|Never)$"))]
    pub image_pull_policy: String,
    /// CPU per subtask in millicores; the engine's request is this times the total
    /// parallelism (all operators). Default 250, at least 10.
    #[serde(default = "default_cpu_millis")]
    #[schemars(range(min = 10, max = 64000))]
    pub cpu_millis_per_subtask: u32,
    /// Memory per subtask in MiB; the engine's request and limit are this times the total
    /// parallelism plus 64 MiB. Default 128, at least 16.
    #[serde(default = "default_memory_mib")]
    #[schemars(range(min = 16, max = 65536))]
    pub memory_mib_per_subtask: u32,
}

impl Default for EngineSettings {
    fn default() -> Self {
        EngineSettings {
            image: default_image(),
            image_pull_policy: default_pull_policy(),
            cpu_millis_per_subtask: default_cpu_millis(),
            memory_mib_per_subtask: default_memory_mib(),
        }
    }
}

/// Checkpoint and savepoint storage.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSettings {
    /// `persistentVolumeClaim` (default: a PVC named `NAME-savepoints` owned by the job, so
    /// savepoints survive engine restarts) or `emptyDir` (lost with the pod: tests only).
    #[serde(default)]
    pub kind: StorageKind,
    /// Size of the PersistentVolumeClaim, as a Kubernetes quantity. Default `1Gi`.
    #[serde(default = "default_storage_size")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"))]
    pub size: String,
    /// StorageClass of the PersistentVolumeClaim; the cluster default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

impl Default for StorageSettings {
    fn default() -> Self {
        StorageSettings {
            kind: StorageKind::default(),
            size: default_storage_size(),
            storage_class_name: None,
        }
    }
}

/// Kind of savepoint storage.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum StorageKind {
    /// A PersistentVolumeClaim owned by the job.
    #[default]
    PersistentVolumeClaim,
    /// An emptyDir volume (savepoints are lost when the pod goes).
    EmptyDir,
}

/// What the autoscaler does with its decisions.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum AutoscalerMode {
    /// Plan and apply: rescale by savepoint and redeploy.
    #[default]
    Auto,
    /// Plan and write the recommendation to `status.recommendedParallelism` only.
    Recommend,
    /// Neither scrape nor plan: the job runs at its current parallelism.
    Off,
}

/// Autoscaler settings (the same planner and guards as `streamscale run`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.metricsWindowSeconds >= 2 * self.metricsIntervalSeconds",
    "message": "autoscaler.metricsWindowSeconds must be at least twice autoscaler.metricsIntervalSeconds"
}]))]
pub struct AutoscalerSettings {
    /// `auto` (plan and rescale), `recommend` (plan, write the recommendation to status only)
    /// or `off`. Default `auto`.
    #[serde(default)]
    pub mode: AutoscalerMode,
    /// Utilization ρ every operator is sized for, in (0, 1]. Default 0.7.
    #[serde(default = "default_target_utilization")]
    #[schemars(range(min = 0.05, max = 1.0))]
    pub target_utilization: f64,
    /// End-to-end latency SLO in seconds, on the `job.autoscaler.latencyPercentile` quantile
    /// (p99 by default) of every source-to-sink path's latency. Default 1.
    #[serde(default = "default_latency_slo")]
    #[schemars(range(min = 0.001, max = 3600.0))]
    pub latency_slo_seconds: f64,
    /// Seconds within which a source backlog must be drained. Default 30.
    #[serde(default = "default_catch_up")]
    #[schemars(range(min = 1.0, max = 86400.0))]
    pub catch_up_seconds: f64,
    /// No decision within this many seconds after a (re)start. Default 10.
    #[serde(default = "default_stabilization")]
    #[schemars(range(min = 0.0, max = 3600.0))]
    pub stabilization_seconds: f64,
    /// Seconds a scale-down must be wanted continuously before it applies. Default 30.
    #[serde(default = "default_scale_down_delay")]
    #[schemars(range(min = 0.0, max = 86400.0))]
    pub scale_down_delay_seconds: f64,
    /// Seconds between two scrapes of the engine's metrics. Default 5.
    #[serde(default = "default_metrics_interval")]
    #[schemars(range(min = 1, max = 600))]
    pub metrics_interval_seconds: u32,
    /// Seconds of metrics the planner looks at (at least twice the interval). Default 30.
    #[serde(default = "default_metrics_window")]
    #[schemars(range(min = 2, max = 3600))]
    pub metrics_window_seconds: u32,
    /// Bounds on the parallelism per operator name, on top of each operator's own
    /// `scaling` bounds and the job's `maxParallelism`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parallelism: BTreeMap<String, ParallelismBounds>,
    /// Seconds a rescale's stop-with-savepoint may stay pending (or the engine unreachable)
    /// before the rescale is abandoned and the job redeployed at the old parallelism.
    /// Default 120.
    #[serde(default = "default_step_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub savepoint_timeout_seconds: u32,
    /// Seconds the engine redeployed at the new parallelism may take to run the restored job
    /// (pod scheduled, image pulled, state loaded) before the restore counts as failed and the
    /// old parallelism is redeployed from the same savepoint; also how long the Deployment at
    /// the new parallelism may stay refused by the API server. Default 120.
    #[serde(default = "default_step_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    pub restore_timeout_seconds: u32,
    /// Read the engine's metrics from a Prometheus server's HTTP API instead of scraping the
    /// engine's `/metrics` (absent: scrape the engine through its Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusSource>,
    /// Name of a `StreamQuota` in this namespace whose subtasks this job shares with every
    /// other StreamJob and FlinkScaler naming it (a Flink job counts in task slots). Each reconcile the operator splits the quota across those
    /// jobs by marginal benefit (each job is first guaranteed what it needs up to an equal
    /// share) and plans this job within its share; beyond it the job holds at the limit or
    /// sheds load as `job.autoscaler.limits.onLimit` says. Absent: no shared quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub quota: Option<String>,
}

/// A Prometheus server that scrapes the engine.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusSource {
    /// Base URL of the Prometheus server, e.g. `http://prometheus.monitoring.svc:9090`; the
    /// operator sends instant queries to `URL/api/v1/query`.
    #[schemars(regex(pattern = r"^https?://[^\s]+$"))]
    pub url: String,
    /// PromQL label matchers (without braces) that select this job's engine series, e.g.
    /// `namespace="prod",job="tweets-engine"`. Default
    /// `namespace="<namespace>",job="<name>-engine"` (the labels a ServiceMonitor on the
    /// engine Service gives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

impl Default for AutoscalerSettings {
    fn default() -> Self {
        AutoscalerSettings {
            mode: AutoscalerMode::default(),
            target_utilization: default_target_utilization(),
            latency_slo_seconds: default_latency_slo(),
            catch_up_seconds: default_catch_up(),
            stabilization_seconds: default_stabilization(),
            scale_down_delay_seconds: default_scale_down_delay(),
            metrics_interval_seconds: default_metrics_interval(),
            metrics_window_seconds: default_metrics_window(),
            parallelism: BTreeMap::new(),
            savepoint_timeout_seconds: default_step_timeout(),
            restore_timeout_seconds: default_step_timeout(),
            prometheus: None,
            quota: None,
        }
    }
}

/// Minimum and maximum parallelism of one operator.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.min <= self.max",
    "message": "parallelism min must be less than or equal to max"
}]))]
pub struct ParallelismBounds {
    /// Smallest parallelism the autoscaler may choose (at least 1).
    #[schemars(range(min = 1, max = 32768))]
    pub min: u32,
    /// Largest parallelism the autoscaler may choose (at most the job's `maxParallelism`).
    #[schemars(range(min = 1, max = 32768))]
    pub max: u32,
}

/// Lifecycle phase of a StreamJob.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum Phase {
    /// Owned objects are being created; the engine is not reachable yet.
    #[default]
    Deploying,
    /// The engine runs the job.
    Running,
    /// A rescale is in progress (see `status.rescale`).
    Rescaling,
    /// The engine failed or a rescale could not be rolled back; see the conditions.
    Failed,
}

/// A rescale in progress (`status.rescale`): the state of the controller crate's rescale
/// machine, persisted as is.
pub use streamscale_controller::rescale::machine::{RescaleState as RescaleStatus, RescaleStep};

/// What the autoscaler's last decision did.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DecisionAction {
    /// A rescale was started (mode `auto`).
    #[default]
    Rescale,
    /// A change was recommended, not applied (mode `recommend`).
    Recommend,
    /// The parallelism is kept: waiting for data, stabilizing, a guard, a backoff or a limit
    /// (the reason says which).
    Hold,
}

/// The autoscaler's last decision. It is rewritten only when a decision says something new
/// (another action, another planned parallelism, or a reason that differs apart from its
/// figures), so `time` and the figures in `reason` are from when it was first made.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecisionStatus {
    /// When it was made (RFC 3339).
    pub time: String,
    /// `Rescale`, `Recommend` or `Hold` (absent in decisions recorded before it existed:
    /// `Rescale` or, with `applied: false`, `Recommend`).
    #[serde(default)]
    pub action: DecisionAction,
    /// Parallelism per operator at the time.
    pub from: BTreeMap<String, u32>,
    /// Planned parallelism per operator (for a hold: the planner's recommendation before the
    /// guards, or `from` when it made none).
    pub to: BTreeMap<String, u32>,
    /// Why, in words (for a hold: why the parallelism is kept).
    pub reason: String,
    /// Highest predicted utilization of any operator at the planned parallelism.
    #[serde(default)]
    pub predicted_utilization: Option<f64>,
    /// Predicted end-to-end latency in seconds at the planned parallelism (absent when
    /// unbounded).
    #[serde(default)]
    pub predicted_latency_seconds: Option<f64>,
    /// The operator limiting throughput at the current parallelism.
    #[serde(default)]
    pub bottleneck: Option<String>,
    /// Whether the decision was applied (mode `auto`) or only recommended.
    pub applied: bool,
}

/// Observed state of a StreamJob, written by the operator.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamJobStatus {
    /// `Deploying`, `Running`, `Rescaling` or `Failed`.
    #[serde(default)]
    pub phase: Phase,
    /// The `metadata.generation` this status describes.
    #[serde(default)]
    pub observed_generation: Option<i64>,
    /// Parallelism per operator the engine is deployed with.
    #[serde(default)]
    pub current_parallelism: BTreeMap<String, u32>,
    /// Sum of `currentParallelism`.
    #[serde(default)]
    pub total_parallelism: u32,
    /// The autoscaler's latest recommendation per operator.
    #[serde(default)]
    pub recommended_parallelism: BTreeMap<String, u32>,
    /// Savepoint the deployed engine restores from (absent on a fresh start).
    #[serde(default)]
    pub restored_from: Option<String>,
    /// The autoscaler's last decision: a rescale, a recommendation or a hold, with why.
    #[serde(default)]
    pub last_decision: Option<DecisionStatus>,
    /// The rescale in progress, if any.
    #[serde(default)]
    pub rescale: Option<RescaleStatus>,
    /// Number of completed rescales.
    #[serde(default)]
    pub rescales: u32,
    /// Times the operator replaced an engine pod that had stopped (for example after a
    /// stop-with-savepoint whose rescale was rolled back); the engine pod template carries it
    /// as the annotation `streamscale.dev/restart`.
    #[serde(default)]
    pub restarts: u32,
    /// Times the running engine was found recovered from one of its own checkpoints: its pod
    /// or process died (a crash, an OOM kill, a node failure), was restarted with the same
    /// arguments and went on from its latest completed checkpoint (Warning Event
    /// `EngineRecovered`). A restart before the engine's first checkpoint starts again from
    /// `restoredFrom` and is not counted.
    #[serde(default)]
    pub recoveries: u32,
    /// The checkpoint the running engine recovered from, while it runs from one (cleared when
    /// an engine deployed from `restoredFrom` runs, e.g. after a rescale).
    // Serialized as `null` when cleared (see `backoff`).
    #[serde(default)]
    pub recovered_from: Option<String>,
    /// `Ready`, `Scaling` and `Degraded`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// This job's share of its `StreamQuota` (with `spec.autoscaler.quota`).
    #[serde(default)]
    pub quota: Option<QuotaShareStatus>,
    /// The limit the last plan ran into (max parallelism or the quota share), and whether the
    /// job holds at it or sheds load; absent when the last plan fit.
    #[serde(default)]
    pub limit: Option<LimitStatus>,
    /// Savepoints taken by rescales that the job ran from (and those of rescales rolled back
    /// to an older savepoint, which may have completed late), oldest first, at most
    /// `spec.savepointHistoryMaxCount` once the older ones are disposed of (one whose disposal
    /// failed stays listed until a later reconcile disposes of it). Savepoints taken before
    /// the operator kept a history are not listed and never disposed of.
    #[serde(default)]
    pub savepoint_history: Vec<SavepointHistoryEntry>,
    /// After a rescale that did not complete (its savepoint failed, or it was rolled back): no
    /// rescale is started before `retryAfter`, 10 s after the first failure in a row, doubling
    /// up to 5 minutes; the parallelisms that failed are listed. A completed rescale clears it.
    // Serialized as `null` when cleared: the status is written as a merge patch, which keeps
    // a field it leaves out.
    #[serde(default)]
    pub backoff: Option<BackoffStatus>,
}

/// One savepoint in `status.savepointHistory`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SavepointHistoryEntry {
    /// Savepoint id (its directory name in the engine's savepoint directory).
    pub id: String,
    /// Its path, as the engine reported it.
    pub path: String,
    /// When the stop-with-savepoint was requested (the rescale's start; RFC 3339), as Flink's
    /// savepoint `timeStamp` is the trigger time.
    pub time: String,
}

/// One operator's demand on a shared quota.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperatorDemandStatus {
    /// Operator name.
    pub name: String,
    /// Subtasks needed for the job's whole target load at the target utilization, λ / (ρ μ)
    /// before rounding (the current parallelism while μ is unknown).
    pub need: f64,
    /// Fewest subtasks.
    pub min: u32,
    /// Most subtasks.
    pub max: u32,
}

/// This job's share of a `StreamQuota`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaShareStatus {
    /// The StreamQuota.
    pub name: String,
    /// Its size in subtasks (0 when it was not found).
    pub quota_subtasks: u32,
    /// Subtasks (of non-source operators) this job may run: its share by marginal benefit.
    pub allocated_subtasks: u32,
    /// Subtasks of this job's non-source operators running now.
    pub running_subtasks: u32,
    /// Share of this job's load its allocation takes at the target utilization, in [0, 1].
    pub admitted_share: f64,
    /// This job's demand as of its last plan (what the allocation used).
    #[serde(default)]
    pub demand: Vec<OperatorDemandStatus>,
    /// The allocation in words, or why there is none.
    pub message: String,
}

/// A limit the plan ran into.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitStatus {
    /// `Hold` (run at the limit; the backlog grows) or `Shed` (drop `shedShare` at the sources).
    pub action: String,
    /// Share of source records dropped, in [0, 1] (0 when holding).
    pub shed_share: f64,
    /// Offered load at the sources, records/s.
    pub load_records_per_second: f64,
    /// Load the allowed parallelism takes at the target utilization, records/s.
    pub capacity_records_per_second: f64,
    /// Operators whose limit binds.
    #[serde(default)]
    pub limited_by: Vec<String>,
    /// In words.
    pub reason: String,
}

/// A subtask quota shared by the StreamJobs and FlinkScalers of its namespace whose
/// `spec.autoscaler.quota` names it (like a `ResourceQuota`, but split by the autoscaler by
/// marginal benefit). A Flink job counts in task slots (its largest vertex's parallelism).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "streamscale.dev",
    version = "v1alpha1",
    kind = "StreamQuota",
    plural = "streamquotas",
    shortname = "sq",
    category = "streamscale",
    namespaced,
    printcolumn = r#"{"name":"Subtasks","type":"integer","jsonPath":".spec.subtasks"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct StreamQuotaSpec {
    /// Most subtasks of all non-source operators of the member jobs together (a CPU quota
    /// counted in subtasks; each subtask gets `engine.cpuMillisPerSubtask`). It must cover
    /// every member operator's lower bound.
    #[schemars(range(min = 1, max = 1000000))]
    pub subtasks: u32,
}

fn default_image() -> String {
    "ghcr.io/streamscale/streamscale-engine:0.1.0".to_string()
}
fn default_pull_policy() -> String {
    "IfNotPresent".to_string()
}
fn default_cpu_millis() -> u32 {
    250
}
fn default_memory_mib() -> u32 {
    128
}
fn default_storage_size() -> String {
    "1Gi".to_string()
}
fn default_target_utilization() -> f64 {
    streamscale_engine::spec::DEFAULT_TARGET_UTILIZATION
}
fn default_latency_slo() -> f64 {
    streamscale_engine::spec::DEFAULT_LATENCY_SLO_SECONDS
}
fn default_catch_up() -> f64 {
    streamscale_engine::spec::DEFAULT_CATCH_UP_SECONDS
}
fn default_stabilization() -> f64 {
    10.0
}
fn default_scale_down_delay() -> f64 {
    30.0
}
fn default_metrics_interval() -> u32 {
    5
}
fn default_metrics_window() -> u32 {
    30
}
fn default_step_timeout() -> u32 {
    120
}
fn default_savepoint_history_max_count() -> u32 {
    crate::savepoint_history::DEFAULT_MAX_COUNT
}

/// The schema of the engine's [`JobSpec`] (generated from the engine's own types), with its
/// internally tagged unions (operator `kind`) merged into one object schema: Kubernetes'
/// structural schemas cannot express `oneOf` alternatives that give one property different
/// schemas. Variant-specific fields become optional, and a field several kinds declare (a
/// source's and a sink's `kafka`) gets one schema allowing what each of them allows
/// ([`merge_property_schemas`]); the engine validates them.
fn job_graph_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let schema = <JobSpec as JsonSchema>::json_schema(generator);
    let mut value = schema.to_value();
    merge_tagged_unions(&mut value);
    schemars::Schema::try_from(value).unwrap_or_else(|_| schemars::Schema::default())
}

fn tag_value(variant: &serde_json::Value) -> Option<serde_json::Value> {
    let kind = variant.get("properties")?.get("kind")?;
    if let Some(c) = kind.get("const") {
        return Some(c.clone());
    }
    match kind.get("enum")?.as_array()?.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

fn merge_tagged_unions(value: &mut serde_json::Value) {
    use serde_json::{Map, Value};
    match value {
        Value::Object(map) => {
            for v in map.values_mut() {
                merge_tagged_unions(v);
            }
            // Defaults such as `{min: null, max: null}` would put nulls into stored objects.
            if let Some(Value::Object(d)) = map.get_mut("default") {
                d.retain(|_, v| !v.is_null());
                if d.is_empty() {
                    map.remove("default");
                }
            }
            let Some(Value::Array(variants)) = map.get("oneOf").cloned() else {
                return;
            };
            let tags: Option<Vec<Value>> = variants.iter().map(tag_value).collect();
            let Some(tags) = tags else { return };
            map.remove("oneOf");
            let mut props = match map.remove("properties") {
                Some(Value::Object(p)) => p,
                _ => Map::new(),
            };
            let descriptions: Vec<String> = variants
                .iter()
                .zip(&tags)
                .map(|(v, t)| {
                    let d = v
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    format!("`{}`: {d}", t.as_str().unwrap_or_default())
                })
                .collect();
            props.insert(
                "kind".to_string(),
                serde_json::json!({
                    "type": "string",
                    "enum": tags,
                    "description": format!("What the operator does. {}", descriptions.join(" ")),
                }),
            );
            // Each variant-specific property with the schemas the kinds that have it give it
            // (in variant order), so that two kinds' `kafka` blocks (source and sink) become
            // one schema holding the fields of both.
            let mut by_property: Vec<(String, Vec<(String, Value)>)> = Vec::new();
            for (v, tag) in variants.iter().zip(&tags) {
                if let Some(Value::Object(p)) = v.get("properties") {
                    for (k, s) in p {
                        if k == "kind" || props.contains_key(k) {
                            continue;
                        }
                        // A default of one kind's field would be applied by the API server
                        // to operators of every kind (and fail to deserialize there).
                        let mut s = s.clone();
                        if let Value::Object(m) = &mut s {
                            m.remove("default");
                        }
                        let tag = tag.as_str().unwrap_or_default().to_string();
                        match by_property.iter_mut().find(|(name, _)| name == k) {
                            Some((_, schemas)) => schemas.push((tag, s)),
                            None => by_property.push((k.clone(), vec![(tag, s)])),
                        }
                    }
                }
            }
            for (k, schemas) in by_property {
                props.insert(k, merge_property_schemas(&schemas));
            }
            map.insert("properties".to_string(), Value::Object(props));
            let mut required: Vec<Value> = match map.remove("required") {
                Some(Value::Array(r)) => r,
                _ => Vec::new(),
            };
            required.push(Value::String("kind".to_string()));
            map.insert("required".to_string(), Value::Array(required));
            map.remove("additionalProperties");
        }
        Value::Array(items) => items.iter_mut().for_each(merge_tagged_unions),
        _ => {}
    }
}

/// One schema for a property that several operator kinds declare, from `(kind, schema)` pairs:
/// a structural schema accepts (and the API server keeps) every field any of them allows.
/// Object schemas are merged field by field (a field is required only if every kind requires
/// it; a field some kinds lack loses its default, which the API server would otherwise apply
/// to all kinds); schemas that differ only in description or `nullable` are kept with both;
/// other differing schemas keep the whole value (`x-kubernetes-preserve-unknown-fields`).
/// Differing descriptions are joined as "`kind`: description". The engine validates the
/// fields of each kind.
fn merge_property_schemas(schemas: &[(String, serde_json::Value)]) -> serde_json::Value {
    use serde_json::{Map, Value};
    if let [(_, only)] = schemas {
        return only.clone();
    }
    let normalized: Vec<(String, Value, bool)> = schemas
        .iter()
        .map(|(t, s)| {
            let (s, nullable) = split_nullable(s);
            (t.clone(), s, nullable)
        })
        .collect();
    let nullable = normalized.iter().any(|(_, _, n)| *n);
    let schemas: Vec<(String, Value)> = normalized.into_iter().map(|(t, s, _)| (t, s)).collect();
    let schemas = schemas.as_slice();
    let Some((_, first)) = schemas.first() else {
        return Value::Object(Map::new());
    };
    let description = {
        let ds: Vec<(&str, &str)> = schemas
            .iter()
            .filter_map(|(t, s)| Some((t.as_str(), s.get("description")?.as_str()?)))
            .collect();
        match ds.as_slice() {
            [] => None,
            [(_, one), rest @ ..] if rest.iter().all(|(_, d)| d == one) => Some(one.to_string()),
            _ => Some(
                ds.iter()
                    .map(|(t, d)| format!("`{t}`: {d}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        }
    };
    let without = |s: &Value, keys: &[&str]| -> Value {
        let mut s = s.clone();
        if let Value::Object(m) = &mut s {
            for k in keys {
                m.remove(*k);
            }
        }
        s
    };
    let finish = |mut m: Map<String, Value>| -> Value {
        match &description {
            Some(d) => m.insert("description".to_string(), Value::String(d.clone())),
            None => m.remove("description"),
        };
        if nullable {
            m.insert("nullable".to_string(), Value::Bool(true));
        }
        Value::Object(m)
    };
    let shape = |s: &Value| without(s, &["description"]);
    if schemas.iter().all(|(_, s)| shape(s) == shape(first)) {
        let Value::Object(m) = first.clone() else {
            return first.clone();
        };
        return finish(m);
    }
    let objects: Option<Vec<(&String, &Map<String, Value>)>> = schemas
        .iter()
        .map(|(t, s)| {
            let is_object = s.get("type") == Some(&Value::String("object".to_string()));
            let rest = without(s, &["description", "properties", "required"]);
            let rest_first = without(first, &["description", "properties", "required"]);
            match s.get("properties") {
                Some(Value::Object(p)) if is_object && rest == rest_first => Some((t, p)),
                _ => None,
            }
        })
        .collect();
    let Some(objects) = objects else {
        let mut m = Map::new();
        m.insert(
            "x-kubernetes-preserve-unknown-fields".to_string(),
            Value::Bool(true),
        );
        return finish(m);
    };
    let mut fields: Vec<(String, Vec<(String, Value)>)> = Vec::new();
    for (tag, p) in &objects {
        for (k, s) in *p {
            let entry = (tag.to_string(), s.clone());
            match fields.iter_mut().find(|(name, _)| name == k) {
                Some((_, v)) => v.push(entry),
                None => fields.push((k.clone(), vec![entry])),
            }
        }
    }
    let mut properties = Map::new();
    for (k, mut v) in fields {
        if v.len() < objects.len() {
            for (_, s) in &mut v {
                if let Value::Object(m) = s {
                    m.remove("default");
                }
            }
        }
        properties.insert(k, merge_property_schemas(&v));
    }
    let required_by = |s: &Value| -> Vec<Value> {
        match s.get("required") {
            Some(Value::Array(r)) => r.clone(),
            _ => Vec::new(),
        }
    };
    let required: Vec<Value> = required_by(first)
        .into_iter()
        .filter(|r| schemas.iter().all(|(_, s)| required_by(s).contains(r)))
        .collect();
    let Value::Object(mut m) = without(first, &["properties", "required"]) else {
        return first.clone();
    };
    m.insert("properties".to_string(), Value::Object(properties));
    if !required.is_empty() {
        m.insert("required".to_string(), Value::Array(required));
    }
    finish(m)
}

/// A schema without its "may be null" (schemars' `type: [T, "null"]`, `anyOf: [S, {type:
/// null}]` or OpenAPI's `nullable`), and whether it had one.
fn split_nullable(schema: &serde_json::Value) -> (serde_json::Value, bool) {
    use serde_json::Value;
    let mut s = schema.clone();
    let Value::Object(m) = &mut s else {
        return (s, false);
    };
    let mut nullable = m.remove("nullable") == Some(Value::Bool(true));
    if let Some(Value::Array(types)) = m.get("type") {
        let rest: Vec<Value> = types
            .iter()
            .filter(|t| t.as_str() != Some("null"))
            .cloned()
            .collect();
        if rest.len() < types.len() {
            nullable = true;
            let t = match <[Value; 1]>::try_from(rest) {
                Ok([one]) => one,
                Err(rest) => Value::Array(rest),
            };
            m.insert("type".to_string(), t);
        }
    }
    if let Some(Value::Array(any)) = m.get("anyOf") {
        let null = serde_json::json!({"type": "null"});
        if let [a, b] = any.as_slice()
            && (a == &null || b == &null)
        {
            let inner = if a == &null { b } else { a };
            if let Value::Object(inner) = inner.clone() {
                m.remove("anyOf");
                for (k, v) in inner {
                    m.entry(k).or_insert(v);
                }
                nullable = true;
            }
        }
    }
    (s, nullable)
}

/// The CRDs (StreamJob, then StreamQuota) as one multi-document YAML, as checked in at
/// `crds/streamjob.yaml`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    fn doc<T: Serialize>(v: &T) -> String {
        serde_saphyr::to_string(v).unwrap_or_else(|e| format!("# cannot serialize: {e}\n"))
    }
    let jobs = doc(&StreamJob::crd());
    let quotas = doc(&StreamQuota::crd());
    format!(
        "# Generated by `cargo run -p streamscale-operator --bin crdgen`; do not edit.\n{jobs}---\n{quotas}"
    )
}

#[cfg(test)]
mod tests {
    use super::merge_property_schemas;
    use serde_json::json;

    /// The status is written as a JSON merge patch, which keeps a field the patch leaves out:
    /// a field the operator clears must be written as `null` (`recoveredFrom` stayed set for
    /// ever, and so would `backoff` and a FlinkScaler's `quota`).
    #[test]
    fn cleared_status_fields_are_written_as_null() {
        let job = serde_json::to_value(super::StreamJobStatus::default()).expect("json");
        for field in [
            "recoveredFrom",
            "backoff",
            "rescale",
            "lastDecision",
            "quota",
            "limit",
        ] {
            assert_eq!(job.get(field), Some(&serde_json::Value::Null), "{field}");
        }
        let scaler = serde_json::to_value(crate::flink_scaler_crd::FlinkScalerStatus::default())
            .expect("json");
        for field in ["backoff", "quota", "rescale", "lastDecision"] {
            assert_eq!(scaler.get(field), Some(&serde_json::Value::Null), "{field}");
        }
    }

    #[test]
    fn object_schemas_merge_fields_required_by_all_and_drop_partial_defaults() {
        let a = json!({"type": ["object", "null"], "description": "A.", "properties": {
            "topic": {"type": "string", "description": "read"},
            "group": {"type": "string", "default": "g"}},
            "required": ["topic"]});
        let b = json!({"type": "object", "description": "B.", "properties": {
            "topic": {"type": "string", "description": "write"},
            "prefix": {"type": "string"}},
            "required": ["topic", "prefix"]});
        let m = merge_property_schemas(&[("source".into(), a), ("sink".into(), b)]);
        assert_eq!(m["type"], "object");
        assert_eq!(m["nullable"], true);
        assert_eq!(m["required"], json!(["topic"]));
        assert_eq!(m["description"], "`source`: A. `sink`: B.");
        assert_eq!(
            m["properties"]["topic"]["description"],
            "`source`: read `sink`: write"
        );
        assert_eq!(m["properties"]["prefix"], json!({"type": "string"}));
        assert_eq!(m["properties"]["group"], json!({"type": "string"}));
    }

    #[test]
    fn incompatible_schemas_keep_the_whole_value() {
        let m = merge_property_schemas(&[
            ("a".into(), json!({"type": "string"})),
            ("b".into(), json!({"type": "integer"})),
        ]);
        assert_eq!(m, json!({"x-kubernetes-preserve-unknown-fields": true}));
    }
}
