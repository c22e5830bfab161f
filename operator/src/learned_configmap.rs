//! What the autoscaler learns about a job, kept in the cluster across operator restarts: the
//! forecast's input-rate history ([`RateHistory`], times in Unix seconds), the per-operator
//! scalability factors and ineffective-scaling flags ([`ScalabilityTracker`]) and the mean
//! measured rescale downtime. One ConfigMap `NAME-autoscaler` per StreamJob or FlinkScaler, owned by it (so
//! deleted with it), key `state.json`, at most [`MAX_STATE_BYTES`] (the oldest history bins are
//! dropped to fit; a ConfigMap holds at most 1 MiB).

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use streamscale_controller::model::forecast::RateHistory;
use streamscale_controller::model::learn::ScalabilityTracker;

use crate::crd::StreamJob;
use crate::flink_scaler_crd::FlinkScaler;
use crate::resources::{self, ResourceError};

/// Key of the state in the ConfigMap.
pub const STATE_KEY: &str = "state.json";
/// Largest encoded state, bytes (half of a ConfigMap's 1 MiB, leaving room for metadata).
pub const MAX_STATE_BYTES: usize = 512 * 1024;
/// Version of the encoding.
pub const VERSION: u32 = 1;

/// Errors reading the persisted state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The text is not the expected JSON.
    #[error("ConfigMap {name} key {STATE_KEY}: {problem}")]
    Invalid {
        /// ConfigMap name.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

/// The persisted state.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedState {
    /// Encoding version ([`VERSION`]).
    pub version: u32,
    /// StreamJob name (a state of another job is ignored).
    pub job: String,
    /// Input-rate history of the forecast, times in Unix seconds (absent without forecasting).
    #[serde(default)]
    pub history: Option<RateHistory>,
    /// Scalability factors and ineffective-scaling flags learned from past rescales.
    #[serde(default)]
    pub scalability: ScalabilityTracker,
    /// Mean measured rescale downtime, seconds (EWMA; absent before the first rescale).
    #[serde(default)]
    pub rescale_downtime_seconds: Option<f64>,
}

/// Name of the state ConfigMap of the StreamJob or FlinkScaler `name`.
pub fn configmap_name(name: &str) -> String {
    format!("{name}-autoscaler")
}

/// Encodes `state` as JSON of at most [`MAX_STATE_BYTES`], dropping the oldest history bins
/// (and, if still too large, the history) to fit.
pub fn encode(state: &SavedState) -> String {
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
                    // Only an absurd number of operators gets here: keep nothing.
                    s.scalability = ScalabilityTracker::default();
                }
            }
        }
    }
}

/// Decodes the ConfigMap text of job `job`: `Ok(None)` for another job's state.
///
/// # Errors
/// [`StateError::Invalid`] for text that does not parse, another version, or an invalid
/// history.
pub fn decode(name: &str, text: &str, job: &str) -> Result<Option<SavedState>, StateError> {
    let bad = |problem: String| StateError::Invalid {
        name: name.to_string(),
        problem,
    };
    let s: SavedState = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    if s.version != VERSION {
        return Err(bad(format!("version {} is not {VERSION}", s.version)));
    }
    if let Some(h) = &s.history {
        h.validate().map_err(|e| bad(e.to_string()))?;
    }
    if s.rescale_downtime_seconds
        .is_some_and(|d| !(d.is_finite() && d >= 0.0))
    {
        return Err(bad(
            "rescaleDowntimeSeconds is not a finite number >= 0".into()
        ));
    }
    Ok((s.job == job).then_some(s))
}

/// The state ConfigMap of `job` holding `text`, owned by the StreamJob.
///
/// # Errors
/// [`ResourceError`] when the StreamJob has no uid yet.
pub fn configmap(job: &StreamJob, text: String) -> Result<ConfigMap, ResourceError> {
    Ok(ConfigMap {
        metadata: resources::owned_meta(job, configmap_name(&job.name_any()))?,
        data: Some([(STATE_KEY.to_string(), text)].into()),
        ..ConfigMap::default()
    })
}

/// The state ConfigMap of FlinkScaler `scaler` holding `text`, owned by it.
///
/// # Errors
/// [`ResourceError`] when the FlinkScaler has no uid yet.
pub fn flink_scaler_configmap(
    scaler: &FlinkScaler,
    text: String,
) -> Result<ConfigMap, ResourceError> {
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
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(configmap_name(&scaler.name_any())),
            namespace: scaler.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some([(STATE_KEY.to_string(), text)].into()),
        ..ConfigMap::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(bins: usize) -> SavedState {
        SavedState {
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
