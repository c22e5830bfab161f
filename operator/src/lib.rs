//! streamscale's Kubernetes operator: the `StreamJob` custom resource, its reconciler, and a
//! Kubernetes implementation of the controller's engine runtime.
//!
//! * [`crd`]: the resource types (the CRD is generated from them by `crdgen`).
//! * [`backoff_status`]: the backoff after failed rescales as `status.backoff` keeps it (pure).
//! * [`flink_scaler_crd`]: the `FlinkScaler` resource, which autoscales a Flink job run by the
//!   Flink Kubernetes Operator; [`flink_target`] what it reads and writes on its target;
//!   [`flink_rescale`] its rescale steps (pure).
//! * [`rescale`]: the rescale state machine, a pure function of status and observations.
//! * [`resources`]: the owned objects (ConfigMap, PVC, Deployment, Service).
//! * [`runtime`]: [`runtime::KubeRuntime`], a StreamJob's engine in a pod (the rescale machine's pod backend drives it).
//! * [`reconciler`]: the kube-runtime `Controller`.
//! * [`metrics`]: the operator's own Prometheus metrics.
//! * [`prometheus`]: the engine's metrics read from a Prometheus server's HTTP API.
//! * [`quota`]: one `StreamQuota` split across its StreamJobs and FlinkScalers by marginal
//!   benefit.
//! * [`last_decision`]: the last decision (rescale, recommendation or hold) in status, written
//!   only when it says something new (pure).
//! * [`engine_recovery`]: whether the engine recovered from its own checkpoint after its
//!   container restarted (`status.recoveries`, Event `EngineRecovered`; pure).
//! * [`savepoint_history`]: which rescale savepoints `status.savepointHistory` records and
//!   which old ones are disposed of (pure).
//! * [`spec_check`]: the engine's job-file validation applied to `spec.job` before it is
//!   planned or deployed.
//! * [`status_patch`]: the status as a merge patch that writes what was cleared as `null`.
//! * [`learned_configmap`]: the autoscaler's learned state (rate history, scalability factors) in a
//!   ConfigMap, kept across operator restarts.

pub mod backoff_status;
pub mod crd;
pub mod engine_recovery;
pub mod engine_token;
pub mod flink_rescale;
pub mod flink_rest_auth;
pub mod flink_scaler_crd;
pub mod flink_target;
pub mod last_decision;
pub mod learned_configmap;
pub mod metrics;
pub mod network_policy;
pub mod prometheus;
pub mod quota;
pub mod reconciler;
pub mod rescale;
pub mod resources;
pub mod runtime;
pub mod savepoint_history;
pub mod spec_check;
pub mod status_patch;
