//! The options of `streamscale flink`: what it applies, how it rescales, where it reports.

use super::*;

/// Whether decisions are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Mode {
    /// Apply every rescale the guards let through.
    Auto,
    /// Print and record decisions; never change a job.
    Recommend,
}

/// How a rescale is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RescalePath {
    /// In place when the cluster runs the adaptive scheduler, else savepoint + resubmit.
    Auto,
    /// Only in place (`PUT /jobs/:jid/resource-requirements`).
    InPlace,
    /// Only stop-with-savepoint and resubmit.
    Savepoint,
}

/// Options of `streamscale flink`.
#[derive(Debug, Clone)]
pub struct FlinkOptions {
    /// The cluster's REST URL, e.g. `http://127.0.0.1:8081`.
    pub rest_url: String,
    /// The job ids to autoscale; empty with `all`: every running job.
    pub jobs: Vec<String>,
    /// Autoscale every running job (also those submitted later).
    pub all: bool,
    /// Apply or only recommend.
    pub mode: Mode,
    /// In place, savepoint + resubmit, or whichever the cluster supports.
    pub rescale: RescalePath,
    /// How to resubmit a job from a savepoint (the savepoint path needs it).
    pub resubmit: Option<Resubmit>,
    /// Where savepoints go (`None`: the cluster's default savepoint directory).
    pub savepoint_dir: Option<String>,
    /// The autoscaler settings (the job file's `autoscaler` schema).
    pub settings: AutoscalerSpec,
    /// Per-vertex parallelism bounds by vertex name.
    pub bounds: VertexBounds,
    /// Seconds between scrapes.
    pub interval_s: f64,
    /// Seconds of metrics the planner reads.
    pub window_s: f64,
    /// Seconds after a (re)start before a decision.
    pub stabilization_s: f64,
    /// Seconds a scale-down must be wanted before it applies.
    pub scale_down_delay_s: f64,
    /// Stop after this many seconds (`None`: until interrupted).
    pub duration_s: Option<f64>,
    /// Report directory.
    pub report_dir: PathBuf,
    /// Where the learned state is kept, one file per job id ([`flink_state_file`]; `None`:
    /// the report directory).
    pub state_dir: Option<PathBuf>,
    /// Seconds a rescale may take before it is given up (in place) or rolled back.
    pub rescale_timeout_s: f64,
    /// What every REST request carries (`--rest-token-file`, `--rest-basic-auth-file`).
    pub credentials: crate::flink::rest_auth::RestCredentials,
}

impl Default for FlinkOptions {
    fn default() -> Self {
        FlinkOptions {
            rest_url: "http://127.0.0.1:8081".into(),
            jobs: Vec::new(),
            all: false,
            mode: Mode::Auto,
            rescale: RescalePath::Auto,
            resubmit: None,
            savepoint_dir: None,
            settings: AutoscalerSpec::default(),
            bounds: VertexBounds::new(),
            interval_s: 10.0,
            window_s: 60.0,
            stabilization_s: 30.0,
            scale_down_delay_s: 60.0,
            duration_s: None,
            report_dir: PathBuf::from("report-flink"),
            state_dir: None,
            rescale_timeout_s: 120.0,
            credentials: Default::default(),
        }
    }
}

impl FlinkOptions {
    /// The directory of the learned-state files (`--state-dir`, else the report directory).
    pub fn state_dir(&self) -> &Path {
        self.state_dir.as_deref().unwrap_or(&self.report_dir)
    }
}
