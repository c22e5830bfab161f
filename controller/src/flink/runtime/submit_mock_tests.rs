//! [`FlinkRuntime::start`] against a mock of the JobManager's REST API (loopback, the recorded
//! demo job's graph): a submission whose answer fails but whose job starts is taken as the
//! submitted job, never submitted a second time; one that started nothing fails.

use std::sync::Mutex as StdMutex;

use axum::Json;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::*;
use crate::flink::rest::JobDetails;

const OLD: &str = "0000000000000000000000000000000a";
const NEW: &str = "0000000000000000000000000000000b";

/// The recorded demo job (`tests/data/flink/job.json`) as job `jid` in `state`, every vertex
/// at `p`.
fn job_json(jid: &str, state: &str, p: u32) -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/flink/job.json");
    let text = std::fs::read_to_string(path).expect("recorded job");
    let mut job: Value = serde_json::from_str(&text).expect("json");
    job["jid"] = json!(jid);
    job["state"] = json!(state);
    for v in job["vertices"].as_array_mut().expect("vertices") {
        v["parallelism"] = json!(p);
        v["status"] = json!(state);
    }
    job
}

/// The mock's cluster: its jobs (id, state) and the submissions it was sent.
struct Cluster {
    jobs: Vec<(String, String)>,
    /// The name the job a submission starts gets (`trace-job`: the submitted job's own).
    started_name: &'static str,
    /// What the started job says it was restored from (`GET /jobs/NEW/checkpoints`).
    restored_from: Option<&'static str>,
    submissions: usize,
    /// Whether a submission starts job `NEW` (its answer fails either way).
    starts_anyway: bool,
}

type Shared = Arc<StdMutex<Cluster>>;

async fn overview(State(c): State<Shared>) -> Json<Value> {
    let c = c.lock().expect("cluster");
    let jobs: Vec<Value> = c
        .jobs
        .iter()
        .map(|(jid, state)| {
            let name = if jid == NEW {
                c.started_name
            } else {
                "trace-job"
            };
            json!({"jid": jid, "name": name, "state": state})
        })
        .collect();
    Json(json!({ "jobs": jobs }))
}

async fn job(
    State(c): State<Shared>,
    UrlPath(jid): UrlPath<String>,
) -> Result<Json<Value>, StatusCode> {
    let c = c.lock().expect("cluster");
    let (_, state) = c
        .jobs
        .iter()
        .find(|(j, _)| *j == jid)
        .ok_or(StatusCode::NOT_FOUND)?;
    Ok(Json(job_json(&jid, state, 2)))
}

async fn checkpoints(
    State(c): State<Shared>,
    UrlPath(jid): UrlPath<String>,
) -> Result<Json<Value>, StatusCode> {
    let c = c.lock().expect("cluster");
    match c.restored_from {
        Some(path) if jid == NEW => Ok(Json(
            json!({"latest": {"restored": {"external_path": path}}}),
        )),
        _ => Err(StatusCode::NOT_FOUND),
    }
}

async fn run(State(c): State<Shared>) -> StatusCode {
    let mut c = c.lock().expect("cluster");
    c.submissions += 1;
    if c.starts_anyway {
        c.jobs.push((NEW.into(), "RUNNING".into()));
    }
    // A proxy's timeout in front of the JobManager, the job started or not.
    StatusCode::GATEWAY_TIMEOUT
}

async fn runtime_on(cluster: Cluster, resubmit: Resubmit) -> (FlinkRuntime, Shared) {
    let shared = Arc::new(StdMutex::new(cluster));
    let app = axum::Router::new()
        .route("/jobs/overview", get(overview))
        .route("/jobs/{jid}", get(job))
        .route("/jobs/{jid}/checkpoints", get(checkpoints))
        .route("/jars/{jar}/run", post(run))
        .with_state(Arc::clone(&shared));
    let rest = crate::flink::mock_rest::serve(app).await;
    let details: JobDetails = serde_json::from_value(job_json(OLD, "RUNNING", 1)).expect("job");
    let topology = FlinkTopology::from_job(&details, &Default::default(), &Default::default())
        .expect("topology");
    let runtime = FlinkRuntime::new(
        rest,
        Arc::new(Mutex::new(topology)),
        Some(resubmit),
        None,
        FlinkTimeouts {
            savepoint: Duration::from_secs(5),
            running: Duration::from_secs(2),
        },
    );
    (runtime, shared)
}

fn jar() -> Resubmit {
    Resubmit::Jar(JarSubmission {
        jar_id: "demo.jar".into(),
        entry_class: None,
        args: Vec::new(),
    })
}

fn at(p: u32) -> BTreeMap<String, u32> {
    [
        ("Source: trace".to_string(), p),
        ("count -> discard: Writer".to_string(), p),
    ]
    .into_iter()
    .collect()
}

/// The cluster after the job (`OLD`) stopped with its savepoint: a submission starts job
/// `NEW` named `started_name` when `starts_anyway`, restored from `restored_from`.
fn stopped(
    starts_anyway: bool,
    started_name: &'static str,
    restored_from: Option<&'static str>,
) -> Cluster {
    Cluster {
        jobs: vec![(OLD.into(), "FINISHED".into())],
        submissions: 0,
        starts_anyway,
        started_name,
        restored_from,
    }
}

/// Starts the job at parallelism 2 from savepoint `file:/sp/1` on `cluster` by `resubmit`:
/// the id of the job taken as started, or the error; and the submissions the cluster got.
async fn start_on(cluster: Cluster, resubmit: Resubmit) -> (Result<String, String>, usize) {
    let (runtime, shared) = runtime_on(cluster, resubmit).await;
    let sp = Savepoint {
        path: "file:/sp/1".into(),
    };
    let started = match runtime.start(Path::new("job"), &at(2), Some(&sp)).await {
        Ok(handle) => runtime.job_id(&handle).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let submissions = shared.lock().expect("cluster").submissions;
    (started, submissions)
}

#[tokio::test]
async fn a_submission_whose_answer_failed_but_whose_job_started_is_not_submitted_again() {
    let (started, submissions) = start_on(stopped(true, "trace-job", None), jar()).await;
    assert_eq!(started.expect("the started job is taken"), NEW);
    assert_eq!(submissions, 1);
}

#[tokio::test]
async fn a_submission_that_failed_and_started_nothing_fails() {
    let (started, submissions) = start_on(stopped(false, "trace-job", None), jar()).await;
    let err = started.expect_err("nothing started");
    assert!(err.contains("504"), "{err}");
    assert_eq!(submissions, 1);
}

#[tokio::test]
async fn a_resubmit_command_that_does_not_return_is_stopped() {
    // A `flink run` without `-d` waits for the job to end.
    let t = std::time::Instant::now();
    let (started, _) = start_on(
        stopped(false, "trace-job", None),
        Resubmit::Command("sleep 60".into()),
    )
    .await;
    let err = started.expect_err("stopped");
    assert!(err.contains("did not return within 2 s"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

#[tokio::test]
async fn a_job_started_under_another_name_is_known_by_its_vertices() {
    // A wrapper that names each submission anew (`--name job-$(date +%s)`).
    let (started, submissions) = start_on(stopped(true, "trace-job-1796544095", None), jar()).await;
    assert_eq!(started.expect("the started job is taken"), NEW);
    assert_eq!(submissions, 1);
}

#[tokio::test]
async fn a_command_that_printed_its_job_id_and_failed_is_taken_at_its_word() {
    let mut cluster = stopped(false, "trace-job", None);
    cluster.jobs.push((NEW.into(), "RUNNING".into()));
    let (started, _) = start_on(
        cluster,
        Resubmit::Command(format!(
            "echo 'Job has been submitted with JobID {NEW}'; exit 1"
        )),
    )
    .await;
    assert_eq!(started.expect("the printed job is taken"), NEW);
}

#[tokio::test]
async fn a_job_of_the_same_program_restored_from_elsewhere_is_not_taken() {
    // Someone else's copy of the program, started meanwhile from another savepoint.
    let (started, _) = start_on(
        stopped(true, "trace-job", Some("file:/elsewhere/sp-9")),
        jar(),
    )
    .await;
    let err = started.expect_err("not ours");
    assert!(err.contains("504"), "{err}");
}
