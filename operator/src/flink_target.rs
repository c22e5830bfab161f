//! What a FlinkScaler reads from and writes to its target, a `FlinkDeployment` or
//! `FlinkSessionJob` of the Apache Flink Kubernetes Operator (`flink.apache.org/v1beta1`).
//! Pure: the target comes in as JSON, the write goes out as the body of a server-side apply.
//!
//! Fields read (Flink Kubernetes Operator 1.15 CRDs): `metadata.generation`,
//! `spec.flinkConfiguration` (flat `a.b.c` keys, or the same keys nested), `spec.deploymentName`
//! (FlinkSessionJob), `spec.mode` (FlinkDeployment), `spec.job.upgradeMode`, `status.observedGeneration`,
//! `status.jobStatus.{jobId,state}`, `status.reconciliationStatus.lastReconciledSpec` (the spec
//! the Flink operator last acted on, as a JSON string).

use kube::api::ApiResource;
use serde_json::{Value, json};

use crate::flink_scaler_crd::{FLINK_AUTOSCALER_KEY, OVERRIDES_KEY, TargetKind};

/// The group/version/kind of a target kind, for a dynamic API.
pub fn api_resource(kind: TargetKind) -> ApiResource {
    ApiResource {
        group: "flink.apache.org".into(),
        version: "v1beta1".into(),
        api_version: "flink.apache.org/v1beta1".into(),
        kind: kind.name().into(),
        plural: kind.plural().into(),
    }
}

/// A target as the FlinkScaler sees it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TargetView {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `spec.flinkConfiguration` (an object; `Null` when absent).
    pub flink_configuration: Value,
    /// `spec.deploymentName` (FlinkSessionJob: the session cluster).
    pub deployment_name: Option<String>,
    /// `spec.job.upgradeMode`.
    pub upgrade_mode: Option<String>,
    /// `spec.mode` of a FlinkDeployment: `native` (the default) or `standalone`.
    pub mode: Option<String>,
    /// `status.observedGeneration`.
    pub observed_generation: Option<i64>,
    /// `status.jobStatus.jobId`.
    pub job_id: Option<String>,
    /// `status.jobStatus.state`.
    pub job_state: Option<String>,
    /// The overrides of `status.reconciliationStatus.lastReconciledSpec`: `None` when there is
    /// no such spec, `Some(None)` when it has no overrides.
    pub reconciled_overrides: Option<Option<String>>,
}

impl TargetView {
    /// Reads a target object (as JSON).
    pub fn from_json(obj: &Value) -> TargetView {
        let spec = &obj["spec"];
        let status = &obj["status"];
        let text = |v: &Value| v.as_str().map(str::to_string);
        let reconciled_overrides = status["reconciliationStatus"]["lastReconciledSpec"]
            .as_str()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .map(|last| {
                // The Flink operator writes `{"spec": {...}, "resource_metadata": {...}}`.
                let spec = if last["spec"].is_object() {
                    &last["spec"]
                } else {
                    &last
                };
                config_value(&spec["flinkConfiguration"], OVERRIDES_KEY)
            });
        TargetView {
            generation: obj["metadata"]["generation"].as_i64(),
            flink_configuration: spec["flinkConfiguration"].clone(),
            deployment_name: text(&spec["deploymentName"]),
            upgrade_mode: text(&spec["job"]["upgradeMode"]),
            mode: text(&spec["mode"]),
            observed_generation: status["observedGeneration"].as_i64(),
            job_id: text(&status["jobStatus"]["jobId"]).filter(|s| !s.is_empty()),
            job_state: text(&status["jobStatus"]["state"]),
            reconciled_overrides,
        }
    }

    /// The overrides the target's spec holds now.
    pub fn overrides(&self) -> Option<String> {
        config_value(&self.flink_configuration, OVERRIDES_KEY)
    }

    /// Whether the cluster starts TaskManagers for the slots its jobs ask (Flink's active
    /// resource manager, `spec.mode: native`, the default); a `standalone` cluster has the
    /// TaskManagers its spec gives.
    pub fn task_managers_on_demand(&self) -> bool {
        !self
            .mode
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case("standalone"))
    }

    /// The cluster's cap on its slots, `slotmanager.number-of-slots.max`, when set.
    pub fn slots_max(&self) -> Option<u32> {
        config_value(&self.flink_configuration, "slotmanager.number-of-slots.max")
            .and_then(|v| v.trim().parse().ok())
    }

    /// Why writing overrides on this target would drop its job's state, when it would: the
    /// job's `spec.job.upgradeMode` is `stateless` (the Flink operator's default when unset)
    /// and the Flink operator would not apply the overrides in place, so it applies them by a
    /// stateless upgrade (a fresh start). It applies them in place when the configuration of
    /// the cluster (`cluster`: this target, or a FlinkSessionJob's FlinkDeployment) sets
    /// `jobmanager.scheduler: adaptive`; `job_adaptive` (the job's `schedulerType` from
    /// `GET /jobs/:jid`) saying otherwise holds too.
    pub fn stateless_upgrade(
        &self,
        cluster: &TargetView,
        job_adaptive: Option<bool>,
    ) -> Option<String> {
        let mode = self.upgrade_mode.as_deref().unwrap_or("stateless");
        if !mode.eq_ignore_ascii_case("stateless") {
            return None;
        }
        let adaptive = job_adaptive != Some(false)
            && config_value(&cluster.flink_configuration, "jobmanager.scheduler")
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("adaptive"));
        (!adaptive).then(|| {
            format!(
                "spec.job.upgradeMode is {} and the job does not run the adaptive scheduler, so the Flink operator would apply new parallelism by a stateless upgrade, which drops the job's state: set upgradeMode to savepoint or last-state, or jobmanager.scheduler: adaptive (in place), or use mode recommend",
                self.upgrade_mode.as_deref().unwrap_or("stateless (the default)")
            )
        })
    }

    /// Whether Flink's own autoscaler is on (`job.autoscaler.enabled: "true"`).
    pub fn flink_autoscaler_enabled(&self) -> bool {
        config_value(&self.flink_configuration, FLINK_AUTOSCALER_KEY)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    }

    /// Whether the Flink operator has acted on a spec with `overrides`, written in generation
    /// `written` (the target's generation after the write): its `status.observedGeneration`
    /// has reached `written`; only a status without `observedGeneration` is judged by its last
    /// reconciled spec holding the overrides (which an earlier attempt at the same overrides
    /// may have left there).
    pub fn observed(&self, overrides: &str, written: Option<i64>) -> bool {
        match (self.observed_generation, written) {
            (Some(seen), Some(w)) => seen >= w,
            (Some(_), None) => false,
            (None, _) => matches!(&self.reconciled_overrides, Some(Some(o)) if o == overrides),
        }
    }
}

/// A flinkConfiguration value by its dotted key: the flat key (`"a.b.c": v`), else the same
/// path nested (`a: {b: {c: v}}`); numbers and booleans as text.
pub fn config_value(config: &Value, key: &str) -> Option<String> {
    let as_text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    if let Some(v) = config.get(key) {
        return as_text(v);
    }
    let mut v = config;
    for part in key.split('.') {
        v = v.get(part)?;
    }
    as_text(v)
}

/// The default REST URL of the target's JobManager: the Flink operator's Service
/// `<deployment>-rest` in the target's namespace, port 8081.
pub fn default_rest_url(kind: TargetKind, name: &str, view: &TargetView, ns: &str) -> String {
    let deployment = match kind {
        TargetKind::FlinkDeployment => name,
        TargetKind::FlinkSessionJob => view.deployment_name.as_deref().unwrap_or(name),
    };
    format!("http://{deployment}-rest.{ns}.svc:8081")
}

/// The server-side apply body that sets only `spec.flinkConfiguration[OVERRIDES_KEY]` of the
/// target to `overrides`.
pub fn overrides_patch(kind: TargetKind, name: &str, overrides: &str) -> Value {
    json!({
        "apiVersion": "flink.apache.org/v1beta1",
        "kind": kind.name(),
        "metadata": {"name": name},
        "spec": {"flinkConfiguration": {OVERRIDES_KEY: overrides}},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(config: Value, status: Value) -> TargetView {
        TargetView::from_json(&json!({
            "metadata": {"name": "t", "generation": 4},
            "spec": {"flinkConfiguration": config, "job": {"upgradeMode": "savepoint"}},
            "status": status,
        }))
    }

    #[test]
    fn reads_overrides_autoscaler_flag_and_job_from_flat_or_nested_keys() {
        let t = target(
            json!({OVERRIDES_KEY: "a:2,b:3", "job.autoscaler.enabled": "true"}),
            json!({"jobStatus": {"jobId": "j1", "state": "RUNNING"}, "observedGeneration": 3}),
        );
        assert_eq!(t.overrides().as_deref(), Some("a:2,b:3"));
        assert!(t.flink_autoscaler_enabled());
        assert_eq!(t.job_id.as_deref(), Some("j1"));
        assert_eq!(t.upgrade_mode.as_deref(), Some("savepoint"));
        assert_eq!(t.stateless_upgrade(&t, Some(false)), None);
        let nested = target(json!({"job": {"autoscaler": {"enabled": true}}}), json!({}));
        assert!(nested.flink_autoscaler_enabled());
        assert_eq!(nested.overrides(), None);
        let off = target(json!({"job.autoscaler.enabled": "false"}), json!({}));
        assert!(!off.flink_autoscaler_enabled());
        assert!(!target(Value::Null, json!({})).flink_autoscaler_enabled());
    }

    #[test]
    fn reads_the_mode_and_the_slot_cap() {
        let native = target(json!({}), json!({}));
        assert!(native.task_managers_on_demand());
        assert_eq!(native.slots_max(), None);
        let standalone = TargetView::from_json(&json!({
            "spec": {"mode": "standalone",
                     "flinkConfiguration": {"slotmanager.number-of-slots.max": "6"}},
        }));
        assert!(!standalone.task_managers_on_demand());
        assert_eq!(standalone.slots_max(), Some(6));
    }

    #[test]
    fn observed_by_last_reconciled_spec_or_generation() {
        let spec = json!({"spec": {"flinkConfiguration": {OVERRIDES_KEY: "a:4"}}}).to_string();
        let t = target(
            json!({OVERRIDES_KEY: "a:4"}),
            json!({"observedGeneration": 3, "reconciliationStatus": {"lastReconciledSpec": spec}}),
        );
        assert_eq!(t.reconciled_overrides, Some(Some("a:4".into())));
        // By generation: a last reconciled spec from an earlier attempt does not count.
        assert!(!t.observed("a:4", Some(9)));
        assert!(!t.observed("a:5", Some(4)));
        assert!(t.observed("a:5", Some(3)));
        assert!(!t.observed("a:5", None));
        // Without observedGeneration: by the last reconciled spec.
        let old = target(
            json!({OVERRIDES_KEY: "a:4"}),
            json!({"reconciliationStatus": {"lastReconciledSpec": json!({"spec": {"flinkConfiguration": {OVERRIDES_KEY: "a:4"}}}).to_string()}}),
        );
        assert!(old.observed("a:4", Some(9)));
        assert!(!old.observed("a:5", Some(1)));
    }

    #[test]
    fn rest_url_defaults_to_the_deployments_rest_service() {
        let t = TargetView {
            deployment_name: Some("session".into()),
            ..TargetView::default()
        };
        assert_eq!(
            default_rest_url(TargetKind::FlinkDeployment, "app", &t, "ns"),
            "http://app-rest.ns.svc:8081"
        );
        assert_eq!(
            default_rest_url(TargetKind::FlinkSessionJob, "job", &t, "ns"),
            "http://session-rest.ns.svc:8081"
        );
    }

    #[test]
    fn the_patch_names_only_the_overrides_key() {
        let p = overrides_patch(TargetKind::FlinkSessionJob, "j", "a:1");
        assert_eq!(p["kind"], "FlinkSessionJob");
        assert_eq!(
            p["spec"]["flinkConfiguration"].as_object().map(|o| o.len()),
            Some(1)
        );
        assert_eq!(p["spec"].as_object().map(|o| o.len()), Some(1));
    }

    #[test]
    fn overrides_on_a_stateless_target_without_the_adaptive_scheduler_would_drop_its_state() {
        let target = |upgrade: Option<&str>, scheduler: Option<&str>| {
            let mut spec = json!({"flinkConfiguration": {}, "job": {}});
            if let Some(u) = upgrade {
                spec["job"]["upgradeMode"] = json!(u);
            }
            if let Some(s) = scheduler {
                spec["flinkConfiguration"]["jobmanager.scheduler"] = json!(s);
            }
            TargetView::from_json(&json!({ "spec": spec }))
        };
        // Unset is the Flink operator's default, stateless.
        let unset = target(None, None);
        let note = unset.stateless_upgrade(&unset, None).expect("held");
        assert!(note.contains("stateless (the default)"), "{note}");
        assert!(
            target(Some("stateless"), None)
                .stateless_upgrade(&unset, Some(false))
                .is_some()
        );
        // In place with the adaptive scheduler, which the Flink operator reads from the
        // cluster's configuration: a job reporting it without the setting is held.
        let adaptive = target(Some("stateless"), Some("adaptive"));
        assert_eq!(adaptive.stateless_upgrade(&adaptive, None), None);
        assert_eq!(adaptive.stateless_upgrade(&adaptive, Some(true)), None);
        assert!(unset.stateless_upgrade(&unset, Some(true)).is_some());
        // A job saying it runs another scheduler is held whatever the configuration.
        assert!(adaptive.stateless_upgrade(&adaptive, Some(false)).is_some());
        for mode in ["savepoint", "last-state"] {
            let t = target(Some(mode), None);
            assert_eq!(t.stateless_upgrade(&t, None), None, "{mode}");
        }
    }
}
