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
    /// The job did not get there within the timeout; the previous requirements were put back.
    TimedOut {
        /// The parallelism by vertex id seen last.
        seen: BTreeMap<String, u32>,
        /// Seconds waited.
        seconds: f64,
    },
}

/// Requests `target` (parallelism by vertex id) for job `jid` and waits up to `timeout` for
/// every vertex to run at it. On a timeout the requirements of `previous` are requested again.
///
/// # Errors
/// [`FlinkError`] when the request is refused (a job without the adaptive scheduler, see
/// [`super::rest::JobDetails::adaptive_scheduler`]) or the job is gone.
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
    while started.elapsed() < timeout {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let job = rest.job(jid).await?;
        if matches!(job.state.as_str(), "FAILED" | "CANCELED" | "FINISHED") {
            return Err(FlinkError::Status {
                method: "GET",
                url: format!("{}/jobs/{jid}", rest.base_url()),
                status: 200,
                message: format!("job ended ({}) during the rescale", job.state),
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
    rest.set_parallelism(jid, previous).await?;
    Ok(InPlaceOutcome::TimedOut {
        seen,
        seconds: started.elapsed().as_secs_f64(),
    })
}
