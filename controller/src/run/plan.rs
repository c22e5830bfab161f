//! `streamscale plan`: one guarded decision from two scrapes of a running engine.

use super::*;

/// Checks that `url`, the value of `--metrics-url`, is an absolute `http`/`https` URL.
///
/// # Errors
/// [`RunError::Option`] naming the option, the URL and the reason.
pub fn check_metrics_url(url: &str) -> Result<(), RunError> {
    check_http_url("--metrics-url", url, "http://127.0.0.1:40123/metrics")
}

/// Checks that `url`, the value of the command-line option `option`, is an absolute
/// `http`/`https` URL; `example` is a valid value, quoted in the error.
///
/// # Errors
/// [`RunError::Option`] naming the option, the URL and the reason.
pub fn check_http_url(option: &str, url: &str, example: &str) -> Result<(), RunError> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => Ok(()),
        Ok(u) => Err(RunError::Option(format!(
            "{option}: `{url}` is not an http(s) URL with a host (scheme `{}`; expected e.g. {example})",
            u.scheme()
        ))),
        Err(e) => Err(RunError::Option(format!(
            "{option}: `{url}` is not a URL: {e} (expected e.g. {example})"
        ))),
    }
}

/// Checks that the engine at `metrics_url` runs the job of `job`: every operator of the job
/// must appear in its metrics.
///
/// # Errors
/// [`RunError::Option`] naming the URL, the job file and the operators missing from the
/// engine's metrics, with the operators it does report.
pub(super) fn check_same_job(
    spec: &JobSpec,
    job: &Path,
    metrics_url: &str,
    running: &BTreeMap<String, u32>,
) -> Result<(), RunError> {
    let missing: Vec<&str> = spec
        .operators
        .iter()
        .map(|o| o.name.as_str())
        .filter(|name| !running.contains_key(*name))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let reported: Vec<&str> = running.keys().map(String::as_str).collect();
    Err(RunError::Option(format!(
        "--metrics-url {metrics_url}: the engine there does not run the job of {}: its operators {} are not in the engine's metrics (it reports {})",
        job.display(),
        missing.join(", "),
        if reported.is_empty() {
            "no operators".to_string()
        } else {
            reported.join(", ")
        }
    )))
}

/// What `streamscale plan` shows: the guarded decision (printed as JSON) and notes for the
/// user (printed on stderr; each is also one of the decision's reasons).
#[derive(Debug, Clone)]
pub struct PlanOutcome {
    /// The decision after the guards (see [`guarded_plan`]).
    pub decision: crate::model::Decision,
    /// Lines for the user: what the guards did, figures the plan had to correct.
    pub notes: Vec<String>,
}

/// `streamscale plan`: scrapes `metrics_url` twice, about `gap_s` seconds apart (each sample
/// stamped with the time its page arrived, so the measured gap is what the rates divide by),
/// and plans the job from those two samples through the guards ([`guarded_plan`]).
///
/// # Errors
/// [`RunError`] when the job is invalid, a scrape fails or the planner rejects the window.
pub async fn plan_once(job: &Path, metrics_url: &str, gap_s: f64) -> Result<PlanOutcome, RunError> {
    scrape_interval(gap_s)?;
    let spec = JobSpec::from_file(&resolve_job_path(job))?;
    check_metrics_url(metrics_url)?;
    let client = http_client()?;
    let started = Instant::now();
    let clock = || started.elapsed().as_secs_f64();
    // The engine's page is always there to read: never `Ok(None)`.
    let mut source = EngineScrape::new(&client, metrics_url);
    let first = source.collect(&clock).await?.unwrap_or_default();
    tokio::time::sleep(Duration::from_secs_f64(gap_s)).await;
    let mut second = source.collect(&clock).await?.unwrap_or_default();
    // An operator runs the most subtasks either scrape shows: one missing from a scrape makes
    // that sample incomplete (the planner refuses it), never a smaller operator.
    let mut running = first.parallelism();
    for (op, p) in second.parallelism() {
        let known = running.entry(op).or_insert(p);
        *known = (*known).max(p);
    }
    let mut first = first;
    first.sample.mark_missing(&running);
    second.sample.mark_missing(&running);
    check_same_job(&spec, job, metrics_url, &running)?;
    let spec = spec.with_parallelism(&running);
    guarded_plan(&spec, &[first.sample, second.sample])
}

/// Largest busy share (Δbusy seconds per subtask over the measured Δt) read as measurement
/// noise; above it the counters and the measured time disagree, and `plan` says so.
pub(super) const BUSY_SHARE_TOLERANCE: f64 = 1.02;

/// Plans `spec` from the two samples of `streamscale plan` and applies the guards of
/// `streamscale run` ([`Autoscaler::decide`]: no scale-down while a source has a backlog or
/// the metrics are incomplete, change thresholds, the rescale's cost) to this one look: no
/// stabilization wait (the engine has been running) and no scale-down delay (one look cannot
/// wait; `run` would want the scale-down for its delay first). A hold keeps the current
/// parallelism and names the unguarded plan. Operators whose busy share exceeds 1 (the plan
/// reads it as 1) are named.
///
/// # Errors
/// [`RunError::Model`] when the planner rejects the window.
pub fn guarded_plan(spec: &JobSpec, window: &[MetricSample]) -> Result<PlanOutcome, RunError> {
    // The unguarded plan first: a window the planner rejects is an error, as it always was.
    let unguarded = crate::model::plan(spec, window, &crate::model::PlannerSettings::default())?;
    let mut notes = busy_share_notes(window);
    let mut autoscaler = Autoscaler::new(GuardSettings {
        min_samples: 2,
        window_seconds: 0.0,
        stabilization_seconds: 0.0,
        scale_down_delay_seconds: 0.0,
        ..GuardSettings::default()
    });
    let now_s = window.last().map_or(0.0, |s| s.at_seconds);
    let mut decision = match autoscaler.decide(now_s, window, spec) {
        Verdict::Rescale(d) => {
            notes.push(
                "guards applied as in `streamscale run` (backlog, change thresholds, rescale cost); a scale-down is shown without run's scale-down delay".to_string(),
            );
            d
        }
        Verdict::Hold {
            reason,
            recommendation,
        } => {
            let mut d = recommendation.unwrap_or_else(|| unguarded.clone());
            let wanted = progress::format_change(
                &current_map(&d),
                &unguarded.parallelism,
                &spec
                    .operators
                    .iter()
                    .map(|o| o.name.clone())
                    .collect::<Vec<_>>(),
            );
            d.parallelism = current_map(&d);
            notes.push(if unguarded.parallelism == d.parallelism {
                format!("guards applied: the plan keeps the current parallelism ({reason})")
            } else {
                format!(
                    "guards hold the current parallelism: {reason}; the unguarded plan was {wanted}"
                )
            });
            d
        }
    };
    decision.reasons.extend(notes.iter().cloned());
    Ok(PlanOutcome { decision, notes })
}

/// The running parallelism of a decision, keyed by plain strings like its plan.
pub(super) fn current_map(d: &crate::model::Decision) -> BTreeMap<String, u32> {
    d.current.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// A note per operator whose subtasks were busy more than the measured time between the
/// window's first and last samples allows (busy share above [`BUSY_SHARE_TOLERANCE`]): the
/// planner reads the share as 1.
pub(super) fn busy_share_notes(window: &[MetricSample]) -> Vec<String> {
    let (Some(first), Some(last)) = (window.first(), window.last()) else {
        return Vec::new();
    };
    let dt = last.at_seconds - first.at_seconds;
    if dt.is_nan() || dt <= 0.0 {
        return Vec::new();
    }
    let mut notes = Vec::new();
    for (op, subs) in &last.operators {
        let Some(before) = first.operators.get(op).filter(|b| b.len() == subs.len()) else {
            continue;
        };
        let busy: f64 = before
            .iter()
            .zip(subs)
            .map(|(a, b)| b.busy_seconds - a.busy_seconds)
            .sum();
        let share = busy / (subs.len() as f64 * dt);
        if share > BUSY_SHARE_TOLERANCE {
            notes.push(format!(
                "warning: {op} was busy {share:.2} of the {dt:.2} s measured between the scrapes (more than all of it): its counters and the measured time disagree; planned as fully busy (1.00)"
            ));
        }
    }
    notes
}
