//! The effective job of a run: the job file with the command line's trace overrides.

use super::*;

/// Reads the job file, applies the trace/SLO overrides to the first source and validates the
/// result exactly as the engine will read it. Writes nothing: [`run`] puts the effective job
/// file into the report directory only once its engine has started.
///
/// # Errors
/// [`RunError::Option`] for out-of-range options (a `--report` that is not a directory
/// included) or trace overrides without a source, [`RunError::Spec`] when the job (or the
/// overridden one) is invalid.
pub fn prepare_job(opts: &RunOptions) -> Result<PreparedJob, RunError> {
    check_options(opts)?;
    let job_path = absolute(&resolve_job_path(&opts.job))?;
    let mut spec = JobSpec::from_file_to_run(&job_path)?;

    if let Some(trace) = &opts.trace {
        existing_file("--trace: trace file", trace, "a trace CSV")?;
    }
    let wants_trace = opts.trace.is_some() || opts.speedup.is_some() || opts.scale.is_some();
    if wants_trace {
        let Some(source) = spec
            .operators
            .iter_mut()
            .find(|o| matches!(o.kind, OperatorKind::Source { .. }))
        else {
            return Err(RunError::Option(format!(
                "--trace/--speedup/--scale: {} has no source operator",
                job_path.display()
            )));
        };
        let name = source.name.clone();
        let OperatorKind::Source { rate, .. } = &mut source.kind else {
            return Err(RunError::Option("internal: source without a rate".into()));
        };
        if !matches!(rate, RateSpec::Trace(_)) {
            let Some(file) = &opts.trace else {
                let flag = if opts.speedup.is_some() {
                    "--speedup"
                } else {
                    "--scale"
                };
                return Err(RunError::Option(format!(
                    "{flag}: source `{name}` does not follow a trace; give --trace FILE too"
                )));
            };
            *rate = RateSpec::Trace(TraceRate {
                file: file.clone(),
                speedup: 1.0,
                scale: 1.0,
                start_seconds: 0.0,
                end_seconds: None,
                gaps: GapPolicy::Hold,
            });
        }
        if let RateSpec::Trace(t) = rate {
            if let Some(file) = &opts.trace {
                t.file = absolute(file)?;
                // A different trace: replay all of it (the job's window belongs to its own
                // trace), as `streamscale-sim --trace` does.
                t.start_seconds = 0.0;
                t.end_seconds = None;
            }
            if let Some(s) = opts.speedup {
                t.speedup = s;
            }
            if let Some(s) = opts.scale {
                t.scale = s;
            }
        }
    }
    // Make every trace path absolute so the effective file works from the report directory.
    for op in &mut spec.operators {
        if let OperatorKind::Source {
            rate: RateSpec::Trace(t),
            ..
        } = &mut op.kind
        {
            t.file = absolute(&t.file)?;
        }
    }
    if let Some(slo) = opts.slo_s {
        spec.autoscaler.latency_slo_seconds = slo;
    }

    spec.validate().map_err(|problem| SpecError::Invalid {
        path: job_path.clone(),
        problem,
    })?;

    let path = absolute(&opts.report_dir.join("job.yaml"))?;
    // Validate exactly what the engine will read (this also checks the trace file exists);
    // every path in it is absolute, so where the file will lie does not matter.
    let yaml = spec.to_yaml();
    let spec = JobSpec::from_yaml(&yaml).map_err(|message| SpecError::Parse {
        path: job_path.clone(),
        message,
    })?;
    spec.validate()
        .and_then(|()| spec.validate_job_file())
        .map_err(|problem| SpecError::Invalid {
            path: job_path.clone(),
            problem,
        })?;

    let rate = spec.operators.iter().find_map(|o| match &o.kind {
        OperatorKind::Source { rate, .. } => Some(rate.clone()),
        _ => None,
    });
    let rate = match rate {
        Some(r) => Some(
            RateFunction::from_spec(&r)
                .map_err(|e| RunError::Option(format!("{}: {e}", job_path.display())))?,
        ),
        None => None,
    };
    if let Some(RateFunction::Trace {
        trace, settings, ..
    }) = &rate
    {
        check_trace_window(trace, settings, &job_path)?;
    }
    let duration_s = opts
        .duration_s
        .or_else(|| rate.as_ref().and_then(RateFunction::wall_end))
        .filter(|d| *d > 0.0)
        .unwrap_or(DEFAULT_DURATION_S);
    let first_checkpoint_id = supervise::first_checkpoint_id(&spec);
    Ok(PreparedJob {
        file: job_path,
        spec,
        path,
        yaml,
        duration_s,
        rate,
        first_checkpoint_id,
    })
}

/// Checks that a source's replay window `[startSeconds, endSeconds)` overlaps its trace: a
/// window outside the trace would replay nothing (0 records/s throughout).
pub(super) fn check_trace_window(
    trace: &streamscale_engine::trace::Trace,
    t: &TraceRate,
    job_path: &Path,
) -> Result<(), RunError> {
    let first = trace.times.first().copied().unwrap_or(0.0);
    let end = trace.end();
    let window_end = t.end_seconds.unwrap_or(end);
    if t.start_seconds >= end || window_end <= first || window_end <= t.start_seconds {
        return Err(RunError::Option(format!(
            "{}: first source's trace window startSeconds {} .. endSeconds {} lies outside the trace {} (which covers {first} .. {end} s)",
            job_path.display(),
            t.start_seconds,
            t.end_seconds
                .map_or_else(|| "(end)".to_string(), |e| e.to_string()),
            t.file.display()
        )));
    }
    Ok(())
}
