//! The settings file of `streamscale flink --settings FILE`: the job file's `autoscaler`
//! schema, plus parallelism bounds per vertex name.
//!
//! ```yaml
//! autoscaler: { targetUtilization: 0.7, latencySloSeconds: 2, maxRescalesPerHour: 4 }
//! vertices:
//!   "keyed-count -> Sink: discard": { min: 1, max: 4 }
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use streamscale_engine::spec::{
    AutoscalerSpec, JobSpec, OperatorKind, OperatorSpec, RateSpec, ScalingBounds,
};

/// The parsed settings file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlinkSettings {
    /// Autoscaler settings, as in a job file.
    #[serde(default)]
    pub autoscaler: AutoscalerSpec,
    /// Parallelism bounds by Flink vertex name.
    #[serde(default)]
    pub vertices: BTreeMap<String, ScalingBounds>,
}

/// Reads and checks a settings file.
///
/// # Errors
/// One line naming the file and what is wrong in it (the field, and the line for a parse
/// error).
pub fn load(path: &Path) -> Result<FlinkSettings, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses and checks settings text.
///
/// # Errors
/// What is wrong, naming the field.
pub fn parse(text: &str) -> Result<FlinkSettings, String> {
    let s: FlinkSettings = serde_saphyr::from_str(text).map_err(|e| {
        let line = streamscale_engine::spec::yaml_error_line(&e);
        if line.is_empty() {
            "not a settings file".to_string()
        } else {
            line
        }
    })?;
    check_autoscaler(&s.autoscaler)?;
    for (name, b) in &s.vertices {
        if b.min == Some(0) || matches!((b.min, b.max), (Some(lo), Some(hi)) if lo > hi) {
            return Err(format!(
                "vertices.\"{name}\": min must be at least 1 and at most max"
            ));
        }
    }
    Ok(s)
}

/// Checks autoscaler settings with the job file's rules (`JobSpec::validate` on a one-source
/// job carrying them), so that a setting means the same for Flink as in a job file.
///
/// # Errors
/// The `autoscaler.<field>: ...` message.
pub fn check_autoscaler(a: &AutoscalerSpec) -> Result<(), String> {
    let probe = JobSpec {
        name: "settings".into(),
        max_parallelism: 128,
        channel_capacity: 1024,
        operators: vec![OperatorSpec {
            name: "source".into(),
            parallelism: 1,
            cpu: 0.0,
            io: 0.0,
            scaling: ScalingBounds::default(),
            kind: OperatorKind::Source {
                rate: RateSpec::Constant(1.0),
                keys: 1,
                count: None,
                nexmark: None,
                kafka: None,
            },
        }],
        edges: Vec::new(),
        autoscaler: a.clone(),
        checkpoint: None,
        state: Default::default(),
    };
    match probe.validate() {
        Err(e) if e.starts_with("autoscaler") => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_read_the_job_files_autoscaler_schema_and_vertex_bounds() {
        let s = parse(
            "autoscaler: { targetUtilization: 0.6, maxRescalesPerHour: 4 }\nvertices:\n  \"count -> Sink\": { max: 4 }\n",
        )
        .expect("settings");
        assert_eq!(s.autoscaler.target_utilization, 0.6);
        assert_eq!(s.autoscaler.max_rescales_per_hour, 4);
        assert_eq!(s.vertices["count -> Sink"].max, Some(4));
    }

    #[test]
    fn bad_settings_name_the_field() {
        let e = parse("autoscaler: { targetUtilization: 1.5 }").expect_err("bad");
        assert!(e.starts_with("autoscaler.targetUtilization"), "{e}");
        let e = parse("vertices: { a: { min: 3, max: 2 } }").expect_err("bad");
        assert!(e.contains("vertices.\"a\""), "{e}");
        let e = parse("autoscalr: {}").expect_err("unknown field");
        assert!(e.contains("autoscalr") && !e.starts_with("error"), "{e}");
    }
}
