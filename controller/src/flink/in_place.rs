//! Rescaling a Flink job in place: the adaptive scheduler's resource requirements (FLIP-291,
//! `PUT /jobs/:jid/resource-requirements`), then waiting until every vertex runs at its new
//! parallelism. Same job id, state kept, no savepoint; Flink restarts the tasks from their
//! latest checkpoint.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::rest::{FlinkError, FlinkRest};

/// How an in-place rescale ended.
#[derive(Debug, Clone, PartialEq)]
pub enum InPlaceOutcome {
    /// Every vertex runs at the requested parallelism.
    Rescaled {
        /// Seconds from the request until every vertex was `RUNNING` at it.
        seconds: f64,
    },
    /// The job did not get there within the timeout; the previous requirements were put back
    /// (unless `put_back_error` says otherwise).
    TimedOut {
        /// The parallelism by vertex id seen last (empty when the job could not be read).
        seen: BTreeMap<String, u32>,
        /// Seconds waited.
        seconds: f64,
        /// The last failed read of the job while waiting, if the last read failed.
        last_error: Option<String>,
        /// Why the previous requirements could not be put back (three tries), if they could not.
        put_back_error: Option<String>,
    },
    /// The job ended (`FAILED`, `CANCELED` or `FINISHED`) while it was being rescaled.
    JobEnded {
        /// Its state.
        state: String,
        /// Seconds from the request.
        seconds: f64,
    },
}

/// Requests `target` (parallelism by vertex id) for job `jid` and waits up to `timeout` for
/// every vertex to run at it; a read of the job that fails meanwhile is tried again until then.
/// On a timeout the requirements of `previous` are requested again.
///
/// # Errors
/// [`FlinkError`] when the request itself is refused (a job without the adaptive scheduler,
/// see [`super::rest::JobDetails::adaptive_scheduler`], or the job is gone): nothing changed.
pub async fn rescale(
    rest: &FlinkRest,
    jid: &str,
    target: &BTreeMap<String, u32>,
    previous: &BTreeMap<String, u32>,
    timeout: Duration,
) -> Result<InPlaceOutcome, FlinkError> {
    let started = Instant::now();
    rest.set_parallelism(jid, target).await?;
    let mut seen = BTreeMap::new();
    let mut last_error = None;
    while started.elapsed() < timeout {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let job = match rest.job(jid).await {
            Ok(job) => job,
            Err(e) => {
                last_error = Some(e.to_string());
                continue;
            }
        };
        last_error = None;
        if matches!(job.state.as_str(), "FAILED" | "CANCELED" | "FINISHED") {
            return Ok(InPlaceOutcome::JobEnded {
                state: job.state,
                seconds: started.elapsed().as_secs_f64(),
            });
        }
        seen = job.parallelism_by_id();
        let at_target = target.iter().all(|(vid, p)| seen.get(vid) == Some(p));
        if at_target && job.all_running() {
            return Ok(InPlaceOutcome::Rescaled {
                seconds: started.elapsed().as_secs_f64(),
            });
        }
    }
    let mut put_back_error = None;
    for attempt in 0..3 {
        match rest.set_parallelism(jid, previous).await {
            Ok(()) => {
                put_back_error = None;
                break;
            }
            Err(e) => put_back_error = Some(e.to_string()),
        }
        if attempt < 2 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    Ok(InPlaceOutcome::TimedOut {
        seen,
        seconds: started.elapsed().as_secs_f64(),
        last_error,
        put_back_error,
    })
}

#[cfg(test)]
mod mock_tests;
