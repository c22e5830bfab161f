//! The session's report: `summary.json` (per job: its rescales, subtask-seconds, how it ended)
//! `timeline.csv` and `timeline.png`, and the short descriptions of parallelism its lines use.

use super::*;

/// One rescale (or rescale attempt) in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RescaleRecord {
    /// Seconds since the session started.
    pub at_seconds: f64,
    /// Parallelism by vertex name before.
    pub from: BTreeMap<String, u32>,
    /// Parallelism by vertex name asked for.
    pub to: BTreeMap<String, u32>,
    /// `inPlace` or `savepoint`.
    pub path: String,
    /// `rescaled`, `timedOut`, `refused`, `notApplied`, `jobEnded`, `savepointFailed`,
    /// `restoreFailed`, `failed` or `recommended`.
    pub outcome: String,
    /// Seconds from the request until every vertex ran at the new parallelism.
    pub downtime_seconds: Option<f64>,
    /// The planner's reason.
    pub reason: String,
    /// The savepoint (savepoint path only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub savepoint: Option<String>,
    /// What went wrong, when something did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One job's part of the report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobReport {
    /// The job id at the start.
    pub first_job_id: String,
    /// The job id at the end (a resubmission gives a new one).
    pub job_id: String,
    /// Job name.
    pub name: String,
    /// The vertices (ids, names as printed, roles).
    pub vertices: Vec<crate::flink::topology::FlinkVertex>,
    /// Parallelism by vertex name at the end.
    pub final_parallelism: BTreeMap<String, u32>,
    /// Rescales and attempts (and, in recommend mode, recommendations).
    pub rescales: Vec<RescaleRecord>,
    /// Subtask-seconds used (Σ parallelism × interval), a proxy for slot-seconds.
    pub subtask_seconds: f64,
    /// Seconds of the session with some source's backlog growing.
    pub lag_growing_seconds: f64,
    /// Seconds of the session in which the job could not be read (the cluster unreachable, or
    /// answering errors): no metrics, no decision.
    pub unreadable_seconds: f64,
    /// How the session ended for this job, when it ended before the session did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
}

/// The session's `summary.json`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlinkSummary {
    /// The cluster's REST URL.
    pub rest_url: String,
    /// Apply or recommend.
    pub mode: Mode,
    /// Seconds the session ran.
    pub duration_seconds: f64,
    /// One entry per job.
    pub jobs: Vec<JobReport>,
}

/// One vertex in one interval of a job, as `timeline.csv` and `timeline.png` show it.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineRow {
    /// Session seconds at the interval's end.
    pub t_s: f64,
    /// The job id then.
    pub job_id: String,
    /// The vertex's name as printed.
    pub vertex: String,
    /// Flink's vertex id.
    pub vertex_id: String,
    /// Source, keyed or other.
    pub role: VertexRole,
    /// Subtasks reporting.
    pub parallelism: usize,
    /// Mean busy share of its subtasks over the interval, 0–1.
    pub busy: f64,
    /// Records in per second.
    pub records_in: f64,
    /// Records out per second.
    pub records_out: f64,
    /// A source's `pendingRecords` at the interval's end (records), when it reports it.
    pub backlog: Option<f64>,
}

impl TimelineRow {
    /// The row's `timeline.csv` line (no newline).
    fn csv(&self) -> String {
        format!(
            "{:.1},{},{},{},{},{:.4},{:.2},{:.2},{}",
            self.t_s,
            self.job_id,
            csv_field(&self.vertex),
            self.vertex_id,
            self.parallelism,
            self.busy,
            self.records_in,
            self.records_out,
            self.backlog.map_or(String::new(), |l| format!("{l:.0}"))
        )
    }
}

pub(super) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub(super) fn describe_map(p: &BTreeMap<String, u32>) -> String {
    p.iter()
        .map(|(n, p)| format!("{n}={p}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `name p→q` for every vertex whose parallelism changes.
pub(super) fn describe(from: &BTreeMap<String, u32>, to: &BTreeMap<String, u32>) -> String {
    to.iter()
        .filter(|(n, p)| from.get(*n) != Some(*p))
        .map(|(n, p)| format!("{n} {}→{p}", from.get(n).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn write_report(
    dir: &Path,
    summary: &FlinkSummary,
    sessions: &[JobSession],
    target_utilization: f64,
) -> Result<(), SessionError> {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|source| SessionError::Report {
                path: path.display().to_string(),
                source,
            })
    };
    let json = serde_json::to_string_pretty(summary).map_err(|e| SessionError::Report {
        path: dir.join("summary.json").display().to_string(),
        source: std::io::Error::other(e),
    })?;
    write("summary.json", json + "\n")?;
    let mut csv = String::from(
        "t_seconds,job_id,vertex,vertex_id,parallelism,busy_share,records_in_per_s,records_out_per_s,backlog\n",
    );
    for s in sessions {
        for row in &s.timeline {
            csv.push_str(&row.csv());
            csv.push('\n');
        }
    }
    write("timeline.csv", csv)?;
    // One chart per job: `timeline.png` for a session of one job, else `timeline-JOB.png`
    // (the job's first id, 8 digits). Charts an earlier session left in the directory go: a
    // reader would take them for this session's.
    let names: Vec<String> = sessions
        .iter()
        .map(|s| {
            if sessions.len() == 1 {
                "timeline.png".to_string()
            } else {
                format!("timeline-{}.png", short(&s.report.first_job_id))
            }
        })
        .collect();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            // `timeline.png` and `timeline-JOB.png` (8 hex digits): a chart this command
            // writes; a user's own `timeline-notes.png` stays.
            let chart = name == "timeline.png"
                || name
                    .strip_prefix("timeline-")
                    .and_then(|n| n.strip_suffix(".png"))
                    .is_some_and(|id| id.len() == 8 && id.bytes().all(|b| b.is_ascii_hexdigit()));
            let written = sessions
                .iter()
                .zip(&names)
                .any(|(s, n)| *n == name && !s.timeline.is_empty());
            if chart && !written {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    for (s, name) in sessions.iter().zip(&names) {
        if s.timeline.is_empty() {
            continue;
        }
        crate::flink::plot::plot_job_timeline(
            &dir.join(name),
            &s.report.name,
            &s.timeline,
            target_utilization,
        )
        .map_err(|e| SessionError::Report {
            path: dir.join(name).display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })?;
    }
    Ok(())
}
