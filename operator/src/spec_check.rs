//! The check a StreamJob's `spec.job` must pass before it is planned or deployed: the same
//! one the engine applies to a job file ([`JobSpec::validate`] and
//! [`JobSpec::validate_job_file`], as [`JobSpec::from_file`] does), so that a job the engine
//! would refuse (exit 2 in its pod, seen only in the pod's log) is refused by the operator with
//! the engine's message. The file-system checks ([`JobSpec::check_file_paths`]) are not made:
//! those paths live in the engine's pod.

use streamscale_engine::spec::JobSpec;

/// A `spec.job` the engine would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.job.{problem}")]
pub struct InvalidJob {
    /// The engine's validation message, naming the field within the job (e.g.
    /// `operators[2] (enrich).parallelism: ...`, `edges[0].to: ...`).
    pub problem: String,
}

/// Checks `job` (a StreamJob's `spec.job`) as the engine checks a job file.
///
/// # Errors
/// [`InvalidJob`] with the first problem found; its message starts with `spec.job.` and the
/// field.
pub fn check(job: &JobSpec) -> Result<(), InvalidJob> {
    job.validate()
        .and_then(|()| job.validate_job_file())
        .map_err(|problem| InvalidJob { problem })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(operators: &str, edges: &str) -> JobSpec {
        JobSpec::from_yaml(&format!(
            "name: demo\noperators:\n{operators}\nedges:\n{edges}\n"
        ))
        .expect("parses")
    }

    const OPS: &str =
        "  - {name: source, kind: source, rate: {constant: 100}}\n  - {name: sink, kind: sink}";

    #[test]
    fn a_valid_job_passes() {
        assert_eq!(check(&job(OPS, "  - {from: source, to: sink}")), Ok(()));
    }

    #[test]
    fn an_edge_to_a_missing_operator_is_refused_naming_the_field() {
        let e = check(&job(
            OPS,
            "  - {from: source, to: sink}\n  - {from: source, to: nowhere}",
        ))
        .expect_err("refused");
        let msg = e.to_string();
        assert!(msg.starts_with("spec.job.edges"), "{msg}");
        assert!(msg.contains("nowhere"), "{msg}");
    }

    #[test]
    fn the_job_file_checks_apply_too() {
        // validate() accepts a source without an output; a job file may not have one.
        let e = check(&job(
            "  - {name: source, kind: source, rate: {constant: 100}}\n  - {name: lone, kind: source, rate: {constant: 1}}\n  - {name: sink, kind: sink}",
            "  - {from: source, to: sink}",
        ))
        .expect_err("refused");
        assert!(e.to_string().contains("`lone` has no output"), "{e}");
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        let bad_rate = job(
            "  - {name: source, kind: source, rate: {constant: -5}}\n  - {name: sink, kind: sink}",
            "  - {from: source, to: sink}",
        );
        let e = check(&bad_rate).expect_err("refused");
        assert!(e.to_string().contains("operators[0] (source).rate"), "{e}");
        let mut bad_name = job(OPS, "  - {from: source, to: sink}");
        bad_name.name = "bad name/x".into();
        let e = check(&bad_name).expect_err("refused");
        assert!(e.to_string().starts_with("spec.job.name:"), "{e}");
    }
}
