//! The check a StreamJob's `spec.job` must pass before it is planned or deployed: the same
//! one the engine applies to a job file ([`JobSpec::validate`] and
//! [`JobSpec::validate_job_file`], as [`JobSpec::from_file`] does), so that a job the engine
//! would refuse (exit 2 in its pod, seen only in the pod's log) is refused by the operator with
//! the engine's message. The file-system checks ([`JobSpec::check_file_paths`]) are not made:
//! those paths live in the engine's pod.

use streamscale_engine::spec::JobSpec;

/// A `spec.job` the engine would refuse, or settings in `spec` that name what `spec.job` lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}.{problem}")]
pub struct InvalidJob {
    /// The part of the StreamJob at fault: `spec.job`, or `spec.autoscaler.parallelism`.
    pub at: &'static str,
    /// The problem, naming the field within `at` (e.g. the engine's
    /// `operators[2] (enrich).parallelism: ...`, `edges[0].to: ...`).
    pub problem: String,
}

/// Where [`check`] and [`check_kafka_secret`] find their problems.
pub const SPEC_JOB: &str = "spec.job";
/// Where [`check_bounds`] finds its problems.
pub const SPEC_BOUNDS: &str = "spec.autoscaler.parallelism";

/// Checks `job` (a StreamJob's `spec.job`) as the engine checks a job file.
///
/// # Errors
/// [`InvalidJob`] with the first problem found; its message starts with `spec.job.` and the
/// field.
pub fn check(job: &JobSpec) -> Result<(), InvalidJob> {
    job.validate()
        .and_then(|()| job.validate_job_file())
        .map_err(|problem| InvalidJob {
            at: SPEC_JOB,
            problem,
        })
}

/// Checks that every `spec.autoscaler.parallelism` bound names an operator of `job` (a bound
/// for a misspelt name would otherwise be ignored without a word).
///
/// # Errors
/// [`InvalidJob`] naming the first such bound and the job's operators.
pub fn check_bounds<B>(
    job: &JobSpec,
    bounds: &std::collections::BTreeMap<String, B>,
) -> Result<(), InvalidJob> {
    for name in bounds.keys() {
        if !job.operators.iter().any(|o| &o.name == name) {
            let names: Vec<&str> = job.operators.iter().map(|o| o.name.as_str()).collect();
            return Err(InvalidJob {
                at: SPEC_BOUNDS,
                problem: format!(
                    "{name}: no operator named `{name}` in spec.job (its operators: {})",
                    names.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// Checks that the Kafka passwords of `job` can reach the engine pod: a `passwordFile` must be
/// in the mounted `spec.kafkaSecret` ([`crate::resources::KAFKA_SECRET_DIR`]), and
/// `passwordEnv` is refused (the engine pod's environment is not configurable).
///
/// # Errors
/// [`InvalidJob`] naming the field.
pub fn check_kafka_secret(job: &JobSpec, has_secret: bool) -> Result<(), InvalidJob> {
    use streamscale_engine::spec::OperatorKind;
    let dir = crate::resources::KAFKA_SECRET_DIR;
    for (i, op) in job.operators.iter().enumerate() {
        let security = match &op.kind {
            OperatorKind::Source { kafka: Some(k), .. } => k.security.as_ref(),
            OperatorKind::Sink { kafka: Some(k), .. } => k.security.as_ref(),
            _ => None,
        };
        let Some(s) = security else { continue };
        let at = format!("operators[{i}] ({}).kafka.security", op.name);
        if s.password_env.is_some() {
            return Err(InvalidJob {
                at: SPEC_JOB,
                problem: format!(
                    "{at}.passwordEnv: not available on Kubernetes (the engine pod's environment is the operator's); use `passwordFile: {dir}/KEY` with spec.kafkaSecret"
                ),
            });
        }
        if let Some(f) = &s.password_file {
            if !f.starts_with(dir) {
                return Err(InvalidJob {
                    at: SPEC_JOB,
                    problem: format!(
                        "{at}.passwordFile: {} is not in the engine pod; name a key of spec.kafkaSecret as {dir}/KEY",
                        f.display()
                    ),
                });
            }
            if !has_secret {
                return Err(InvalidJob {
                    at: SPEC_JOB,
                    problem: format!(
                        "{at}.passwordFile: {} needs spec.kafkaSecret (the Secret mounted at {dir})",
                        f.display()
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_passwords_come_from_the_mounted_secret_only() {
        let job = |security: &str| {
            JobSpec::from_yaml(&format!(
                "name: demo\noperators:\n  - {{name: src, kind: source, kafka: {{topic: t, bootstrapServers: \"b:9092\", security: {security}}}}}\n  - {{name: out, kind: sink}}\nedges:\n  - {{from: src, to: out}}\n"
            ))
            .expect("parses")
        };
        let ok = job(
            "{protocol: SASL_PLAINTEXT, username: u, passwordFile: /var/run/streamscale/kafka/password}",
        );
        assert_eq!(check_kafka_secret(&ok, true), Ok(()));
        let e = check_kafka_secret(&ok, false)
            .expect_err("no secret")
            .to_string();
        assert!(
            e.contains("passwordFile") && e.contains("spec.kafkaSecret"),
            "{e}"
        );
        let e = check_kafka_secret(
            &job("{protocol: SASL_PLAINTEXT, username: u, passwordFile: /etc/pw}"),
            true,
        )
        .expect_err("outside")
        .to_string();
        assert!(
            e.starts_with("spec.job.operators[0] (src).kafka.security.passwordFile"),
            "{e}"
        );
        let e = check_kafka_secret(
            &job("{protocol: SASL_PLAINTEXT, username: u, passwordEnv: P}"),
            true,
        )
        .expect_err("env")
        .to_string();
        assert!(e.contains("passwordEnv"), "{e}");
    }

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
