//! The operator's [`StateStore`]: what the autoscaler learns about a job ([`LearnedState`]: the
//! forecast's input-rate history, times in Unix seconds, the per-operator scalability factors
//! and ineffective-scaling flags, and the mean measured rescale downtime), kept in the cluster
//! across operator restarts. One ConfigMap `NAME-autoscaler` per StreamJob or FlinkScaler, owned
//! by it (so deleted with it), key `state.json`, at most [`MAX_STATE_BYTES`] (the oldest history
//! bins are dropped to fit; a ConfigMap holds at most 1 MiB). The JSON is the one `streamscale
//! run` keeps in its report directory.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use streamscale_controller::model::learn::ScalabilityTracker;
use streamscale_controller::state_store::{LearnedState, StateStore, StateStoreError};

use crate::crd::StreamJob;
use crate::flink_scaler_crd::FlinkScaler;
use crate::resources::{self, FIELD_MANAGER, ResourceError};

pub use streamscale_controller::state_store::STATE_VERSION as VERSION;

/// Key of the state in the ConfigMap.
pub const STATE_KEY: &str = "state.json";
/// Largest encoded state, bytes (half of a ConfigMap's 1 MiB, leaving room for metadata).
pub const MAX_STATE_BYTES: usize = 512 * 1024;

/// The learned state of one StreamJob or FlinkScaler in its ConfigMap.
#[derive(Clone)]
pub struct ConfigMapStateStore {
    api: Api<ConfigMap>,
    job: String,
    /// The ConfigMap's metadata (name, owner, labels), or why it cannot be written yet.
    meta: Result<ObjectMeta, String>,
}

impl ConfigMapStateStore {
    /// The store of StreamJob `job`.
    pub fn for_stream_job(client: Client, job: &StreamJob) -> ConfigMapStateStore {
        let meta =
            resources::owned_meta(job, configmap_name(&job.name_any())).map_err(|e| e.to_string());
        ConfigMapStateStore::new(client, job, meta)
    }

    /// The store of FlinkScaler `scaler`.
    pub fn for_flink_scaler(client: Client, scaler: &FlinkScaler) -> ConfigMapStateStore {
        let meta = flink_scaler_meta(scaler).map_err(|e| e.to_string());
        ConfigMapStateStore::new(client, scaler, meta)
    }

    fn new<K: ResourceExt>(
        client: Client,
        owner: &K,
        meta: Result<ObjectMeta, String>,
    ) -> ConfigMapStateStore {
        let namespace = owner.namespace().unwrap_or_else(|| "default".into());
        ConfigMapStateStore {
            api: Api::namespaced(client, &namespace),
            job: owner.name_any(),
            meta,
        }
    }

    fn name(&self) -> String {
        configmap_name(&self.job)
    }
}

impl StateStore for ConfigMapStateStore {
    /// `ConfigMap NAME key state.json` (in the job's namespace).
    fn location(&self) -> String {
        format!("ConfigMap {} key {STATE_KEY}", self.name())
    }

    async fn load(&mut self) -> Result<Option<LearnedState>, StateStoreError> {
        let cm = self
            .api
            .get_opt(&self.name())
            .await
            .map_err(|e| StateStoreError::Read {
                location: self.location(),
                problem: e.to_string(),
            })?;
        let Some(text) = cm
            .and_then(|cm| cm.data)
            .and_then(|mut d| d.remove(STATE_KEY))
        else {
            return Ok(None);
        };
        LearnedState::decode(&text, &self.job).map_err(|problem| StateStoreError::Invalid {
            location: self.location(),
            problem,
        })
    }

    /// Server-side apply of the ConfigMap holding [`encode`]`(state)`.
    async fn save(&mut self, state: &LearnedState) -> Result<(), StateStoreError> {
        let write = |problem: String| StateStoreError::Write {
            location: self.location(),
            problem,
        };
        let cm = ConfigMap {
            metadata: self.meta.clone().map_err(write)?,
            data: Some([(STATE_KEY.to_string(), encode(state))].into()),
            ..ConfigMap::default()
        };
        self.api
            .patch(
                &self.name(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&cm),
            )
            .await
            .map(|_| ())
            .map_err(|e| write(e.to_string()))
    }
}

/// Name of the state ConfigMap of the StreamJob or FlinkScaler `name`.
pub fn configmap_name(name: &str) -> String {
    format!("{name}-autoscaler")
}

/// Encodes `state` as JSON of at most [`MAX_STATE_BYTES`], dropping the oldest history bins
/// (and, if still too large, the history, then the per-operator figures and flaps) to fit;
/// empty when even that does not fit.
pub fn encode(state: &LearnedState) -> String {
    let mut s = state.clone();
    loop {
        let text = serde_json::to_string(&s).unwrap_or_default();
        if text.len() <= MAX_STATE_BYTES {
            return text;
        }
        match &mut s.history {
            Some(h) if h.bins.len() > 1 => {
                let cut = (h.bins.len() / 10).max(1);
                h.bins.drain(..cut);
            }
            Some(_) => s.history = None,
            None => {
                s.scalability.last.clear();
                if serde_json::to_string(&s).map_or(0, |t| t.len()) > MAX_STATE_BYTES {
                    // Only an absurd number of operators gets here: keep nothing of them.
                    s.scalability = ScalabilityTracker::default();
                    s.flaps = Default::default();
                    s.rescale_downtimes_seconds.clear();
                    let text = serde_json::to_string(&s).unwrap_or_default();
                    return if text.len() <= MAX_STATE_BYTES {
                        text
                    } else {
                        String::new()
                    };
                }
            }
        }
    }
}

/// Decodes the ConfigMap text of job `job`: `Ok(None)` for another job's state.
///
/// # Errors
/// [`StateStoreError::Invalid`] naming ConfigMap `name` for text that does not parse or that
/// [`LearnedState::check`] rejects.
pub fn decode(name: &str, text: &str, job: &str) -> Result<Option<LearnedState>, StateStoreError> {
    LearnedState::decode(text, job).map_err(|problem| StateStoreError::Invalid {
        location: format!("ConfigMap {name} key {STATE_KEY}"),
        problem,
    })
}

/// The metadata of FlinkScaler `scaler`'s state ConfigMap, owned by it.
///
/// # Errors
/// [`ResourceError`] when the FlinkScaler has no uid yet.
fn flink_scaler_meta(scaler: &FlinkScaler) -> Result<ObjectMeta, ResourceError> {
    let owner = scaler
        .controller_owner_ref(&())
        .ok_or_else(|| ResourceError::Incomplete(scaler.name_any()))?;
    let labels = [
        (
            "app.kubernetes.io/name",
            "streamscale-flinkscaler".to_string(),
        ),
        ("app.kubernetes.io/instance", scaler.name_any()),
        (
            "app.kubernetes.io/managed-by",
            "streamscale-operator".to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Ok(ObjectMeta {
        name: Some(configmap_name(&scaler.name_any())),
        namespace: scaler.namespace(),
        labels: Some(labels),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use streamscale_controller::model::forecast::RateHistory;

    fn state(bins: usize) -> LearnedState {
        LearnedState {
            version: VERSION,
            job: "j".into(),
            history: Some(RateHistory {
                bin_seconds: 1.0,
                season_seconds: 1e9,
                bins: (0..bins as i64).map(|i| (i, 1234.5678)).collect(),
                ..RateHistory::default()
            }),
            scalability: ScalabilityTracker {
                factors: [("work".to_string(), 0.8)].into(),
                ..ScalabilityTracker::default()
            },
            rescale_downtime_seconds: Some(1.5),
            rescale_downtimes_seconds: vec![1.5; 5],
            flaps: Default::default(),
        }
    }

    #[test]
    fn round_trip_and_bounded_size() {
        let small = state(10);
        let text = encode(&small);
        assert_eq!(decode("cm", &text, "j").expect("decodes"), Some(small));
        assert_eq!(decode("cm", &text, "other").expect("decodes"), None);
        // 100 000 bins (about 1.7 MB) are cut to fit, keeping the newest.
        let big = state(100_000);
        let text = encode(&big);
        assert!(text.len() <= MAX_STATE_BYTES, "{}", text.len());
        let back = decode("cm", &text, "j")
            .expect("decodes")
            .expect("same job");
        let h = back.history.expect("history kept");
        assert!(h.bins.len() > 10_000, "{}", h.bins.len());
        assert_eq!(h.bins.last().map(|b| b.0), Some(99_999));
        assert_eq!(back.scalability.factor("work"), 0.8);
    }

    #[test]
    fn bad_text_is_an_error_naming_the_configmap() {
        let e = decode("demo-autoscaler", "{", "j").expect_err("not json");
        assert!(
            e.to_string()
                .starts_with("ConfigMap demo-autoscaler key state.json"),
            "{e}"
        );
        let mut s = state(2);
        s.version = 7;
        let e = decode("cm", &serde_json::to_string(&s).expect("json"), "j").expect_err("v7");
        assert!(e.to_string().contains("version 7"), "{e}");
        let mut s = state(2);
        if let Some(h) = &mut s.history {
            h.bins = vec![(2, 1.0), (1, 1.0)];
        }
        let e = decode("cm", &serde_json::to_string(&s).expect("json"), "j").expect_err("order");
        assert!(e.to_string().contains("not ascending"), "{e}");
    }
}
