//! The `FlinkScaler` custom resource (`streamscale.dev/v1alpha1`): autoscaling of a Flink job
//! run by the Apache Flink Kubernetes Operator (a `FlinkDeployment` or `FlinkSessionJob` of
//! group `flink.apache.org`), as KEDA's ScaledObject scales a Deployment it does not own.
//!
//! The doc comments of the spec and status fields below become the descriptions of the CRD's
//! OpenAPI schema (`kubectl explain flinkscaler.spec`), so they are written for users.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::backoff_status::{BackoffStatus, FailedParallelism};
use crate::crd::{AutoscalerSettings, DecisionStatus, QuotaShareStatus};

/// The Flink operator's configuration key the FlinkScaler writes on its target: per-vertex
/// parallelism as `<vertex id>:<parallelism>,...`.
pub const OVERRIDES_KEY: &str = "pipeline.jobvertex-parallelism-overrides";

/// The key of Flink's own autoscaler; a target with it `"true"` is refused.
pub const FLINK_AUTOSCALER_KEY: &str = "job.autoscaler.enabled";

/// Autoscales the Flink job of a `FlinkDeployment` or `FlinkSessionJob` (Apache Flink
/// Kubernetes Operator) by writing per-vertex parallelism overrides on it.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "streamscale.dev",
    version = "v1alpha1",
    kind = "FlinkScaler",
    plural = "flinkscalers",
    shortname = "fsc",
    category = "streamscale",
    namespaced,
    status = "FlinkScalerStatus",
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.targetRef.name"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Parallelism","type":"integer","description":"Total subtasks running","jsonPath":".status.totalParallelism"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.autoscaler.mode"}"#,
    printcolumn = r#"{"name":"Bottleneck","type":"string","jsonPath":".status.lastDecision.bottleneck"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct FlinkScalerSpec {
    /// The Flink resource whose job is autoscaled, in this namespace.
    pub target_ref: TargetRef,
    /// How the job is scaled: the same settings as a StreamJob's `spec.autoscaler`. Bounds in
    /// `parallelism` are by Flink vertex name (as `status.vertices` lists them);
    /// `restoreTimeoutSeconds` is how long a rescale may take from writing the overrides to
    /// every vertex running at the new parallelism before the previous overrides are put back;
    /// `savepointTimeoutSeconds` and `prometheus` are not used (metrics come from the
    /// JobManager's REST API).
    #[serde(default)]
    pub autoscaler: AutoscalerSettings,
    /// The JobManager's REST URL. Default `http://<deployment>-rest.<namespace>.svc:8081`,
    /// the REST Service the Flink operator creates (`<deployment>` is the FlinkDeployment, or a
    /// FlinkSessionJob's `spec.deploymentName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://[^\s]+$"))]
    pub rest_url: Option<String>,
    /// Credentials and TLS trust for the REST endpoint (for a proxy or gateway in front of the
    /// JobManager), from a Secret in this namespace; none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rest_auth: Option<RestAuthRef>,
}

/// Where the Flink REST endpoint's credentials are: a Secret with the key `token` (sent as
/// `Authorization: Bearer`) or the keys `username` and `password` (basic auth), and optionally
/// `ca.crt` (PEM; the endpoint's https certificate must chain to it instead of the system's
/// roots). Read at every reconcile; never copied into status, Events or logs.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestAuthRef {
    /// The Secret's name, in the FlinkScaler's namespace.
    #[schemars(length(min = 1))]
    pub secret_name: String,
}

/// A reference to the Flink resource to scale.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// `FlinkDeployment` (application or session cluster with a job) or `FlinkSessionJob`.
    pub kind: TargetKind,
    /// Its name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Kinds of Flink resources a FlinkScaler can scale (group `flink.apache.org`, version
/// `v1beta1`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum TargetKind {
    /// `flinkdeployments.flink.apache.org`.
    FlinkDeployment,
    /// `flinksessionjobs.flink.apache.org`.
    FlinkSessionJob,
}

impl TargetKind {
    /// The resource's plural name.
    pub fn plural(self) -> &'static str {
        match self {
            TargetKind::FlinkDeployment => "flinkdeployments",
            TargetKind::FlinkSessionJob => "flinksessionjobs",
        }
    }

    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::FlinkDeployment => "FlinkDeployment",
            TargetKind::FlinkSessionJob => "FlinkSessionJob",
        }
    }
}

/// Lifecycle phase of a FlinkScaler.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum FlinkScalerPhase {
    /// The target or its job is not there or not running yet.
    #[default]
    Pending,
    /// The job runs; the autoscaler reads it and decides.
    Running,
    /// Overrides were written to the target; waiting for the job to run at them.
    Rescaling,
    /// The scaler refuses to act (the target has Flink's own autoscaler enabled); see the
    /// `Degraded` condition.
    Refused,
    /// The target resource does not exist.
    TargetMissing,
}

/// Step of a rescale in progress; each step is written to status before it acts, so that an
/// operator restart at any point resumes it.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum FlinkRescaleStep {
    /// The overrides are (being) written to the target; waiting for the Flink operator to
    /// observe them (its `status.observedGeneration` reaching the generation written; without
    /// one, its `lastReconciledSpec` holding them).
    Requested,
    /// The Flink operator has observed them; waiting for every vertex of the job to run at the
    /// new parallelism.
    Observed,
}

/// A rescale in progress.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlinkRescaleStatus {
    /// Current step.
    pub step: FlinkRescaleStep,
    /// Parallelism per vertex name before the rescale.
    pub from: BTreeMap<String, u32>,
    /// Parallelism per vertex name asked for (`from` while rolling back).
    pub to: BTreeMap<String, u32>,
    /// The overrides value written to the target (`<vertex id>:<p>,...`).
    pub overrides: String,
    /// The overrides put back when the rescale fails: the target's before the rescale, or
    /// those of `from` when it had none.
    pub previous_overrides: String,
    /// The target's `metadata.generation` after the write (absent until written).
    #[serde(default)]
    pub target_generation: Option<i64>,
    /// Why the rescale was decided.
    pub reason: String,
    /// True when the rescale failed or timed out and the previous overrides are being put back.
    #[serde(default)]
    pub rolling_back: bool,
    /// When the rescale started (RFC 3339).
    pub started_at: String,
    /// When the current step was entered (RFC 3339).
    pub step_started_at: String,
    /// The Flink job id when the rescale (or its rollback) started: an upgrade by the Flink
    /// operator stops that job (`FINISHED` after a savepoint, `CANCELED` for `last-state`)
    /// before the job at the new parallelism starts under another id, so its end is not the
    /// rescale's failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
}

/// How the last rescale ended.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RescaleResultStatus {
    /// `Rescaled`, `RolledBack` (timed out or failed; previous overrides back) or
    /// `RollbackTimedOut`.
    pub outcome: String,
    /// Parallelism per vertex name asked for.
    pub to: BTreeMap<String, u32>,
    /// Seconds from writing the overrides until every vertex ran at the new parallelism (the
    /// measured downtime; it feeds the planner's rescale cost).
    #[serde(default)]
    pub downtime_seconds: Option<f64>,
    /// When it ended (RFC 3339).
    pub finished_at: String,
    /// What went wrong, when something did.
    #[serde(default)]
    pub message: Option<String>,
}

/// One vertex of the job.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VertexStatus {
    /// Vertex name as streamscale names it (Flink's, with ` #2`, ... added to repeated names).
    pub name: String,
    /// Flink's vertex id.
    pub id: String,
    /// Its parallelism now.
    pub current: u32,
    /// The autoscaler's latest recommendation (absent before the first).
    #[serde(default)]
    pub recommended: Option<u32>,
    /// Its max parallelism (key groups).
    pub max_parallelism: u32,
}

/// Observed state of a FlinkScaler, written by the operator.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlinkScalerStatus {
    /// `Pending`, `Running`, `Rescaling`, `Refused` or `TargetMissing`.
    #[serde(default)]
    pub phase: FlinkScalerPhase,
    /// The `metadata.generation` this status describes.
    #[serde(default)]
    pub observed_generation: Option<i64>,
    /// The Flink job id (from the target's `status.jobStatus.jobId`).
    #[serde(default)]
    pub job_id: Option<String>,
    /// The REST URL the job's metrics are read from.
    #[serde(default)]
    pub rest_url: Option<String>,
    /// The job's vertices: name, id, current and recommended parallelism.
    #[serde(default)]
    pub vertices: Vec<VertexStatus>,
    /// Parallelism per vertex name now.
    #[serde(default)]
    pub current_parallelism: BTreeMap<String, u32>,
    /// Sum of `currentParallelism`.
    #[serde(default)]
    pub total_parallelism: u32,
    /// The autoscaler's latest recommendation per vertex name.
    #[serde(default)]
    pub recommended_parallelism: BTreeMap<String, u32>,
    /// The autoscaler's last decision: a rescale, a recommendation or a hold, with why.
    #[serde(default)]
    pub last_decision: Option<DecisionStatus>,
    /// The rescale in progress, if any.
    #[serde(default)]
    pub rescale: Option<FlinkRescaleStatus>,
    /// How the last rescale ended, with its measured downtime.
    #[serde(default)]
    pub last_rescale: Option<RescaleResultStatus>,
    /// Number of completed rescales.
    #[serde(default)]
    pub rescales: u32,
    /// Backoff after failed rescales, absent when the last rescale completed.
    #[serde(default)]
    pub backoff: Option<BackoffStatus>,
    /// `Ready`, `Scaling` and `Degraded`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// This job's share of its `StreamQuota` (with `spec.autoscaler.quota`), counted in task
    /// slots: with one slot-sharing group the job holds as many slots as its largest vertex
    /// has subtasks, and a slot counts as one subtask of the quota.
    // Serialized as `null` when cleared: the status is written as a merge patch, which keeps
    // a field it leaves out.
    #[serde(default)]
    pub quota: Option<QuotaShareStatus>,
}

/// The FlinkScaler CRD as YAML, as checked in at `crds/flinkscaler.yaml`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let doc = serde_saphyr::to_string(&FlinkScaler::crd())
        .unwrap_or_else(|e| format!("# cannot serialize: {e}\n"));
    format!("# Generated by `cargo run -p streamscale-operator --bin crdgen`; do not edit.\n{doc}")
}
