//! `streamscale flink` against a REAL Apache Flink 2.3 session cluster (one JobManager, one
//! TaskManager with 4 slots, adaptive scheduler) started by `scripts/flink-testenv.sh`, running
//! the project's trace-driven demo job (`flink-jobs/trace-job`: source -> HASH -> keyed count
//! burning CPU per record -> discarding sink).
//!
//! One test, the scenarios in sequence on one cluster (a cluster takes 1.2 GB and the fixed
//! ports of the script): the collector reads the job; an overloaded job is scaled up in place
//! and keeps its keyed state; a rescale by savepoint + resubmit keeps the state under a new job
//! id; a savepoint that cannot be written leaves the job running; a resubmission that cannot
//! reach the new parallelism is rolled back from the same savepoint; an unreachable cluster,
//! an unknown job and a job cancelled under the controller each end with one clear line; a
//! PyFlink job's graph and metrics are read like any other job's.
//!
//! Needs `scripts/flink-testenv.sh install` (the README's test command runs it). Without it
//! the test is skipped locally and fails with CI=true.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use streamscale_tests::flink_cluster::{
    Cluster, flink_env, get_json, job_parallelism, root, testenv, wait_running,
};
use streamscale_tests::workspace_bin;

struct Flink {
    rest: String,
    jar_path: String,
}

impl Flink {
    fn job(&self, jid: &str) -> serde_json::Value {
        get_json(&format!("{}/jobs/{jid}", self.rest))
    }

    /// Parallelism per vertex name and the job state.
    fn parallelism(&self, jid: &str) -> (String, BTreeMap<String, u64>) {
        job_parallelism(&self.job(jid))
    }

    fn running_jobs(&self) -> Vec<String> {
        get_json(&format!("{}/jobs/overview", self.rest))["jobs"]
            .as_array()
            .map(|js| {
                js.iter()
                    .filter(|j| j["state"] == "RUNNING")
                    .filter_map(|j| j["jid"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The id of the keyed vertex (`count -> ...`).
    fn keyed_vertex(&self, jid: &str) -> String {
        self.job(jid)["vertices"]
            .as_array()
            .and_then(|vs| {
                vs.iter()
                    .find(|v| v["name"].as_str().is_some_and(|n| n.starts_with("count")))
            })
            .and_then(|v| v["id"].as_str())
            .expect("a keyed vertex")
            .to_string()
    }

    /// The largest per-key count the keyed vertex emitted (its `maxKeyCount` gauge, max over
    /// subtasks), once every subtask reports it.
    fn max_key_count(&self, jid: &str) -> f64 {
        let vid = self.keyed_vertex(jid);
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let ids = get_json(&format!("{}/jobs/{jid}/vertices/{vid}/metrics", self.rest));
            let wanted: Vec<String> = ids
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|m| m["id"].as_str())
                        .filter(|id| id.ends_with(".maxKeyCount"))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            if !wanted.is_empty() {
                let vals = get_json(&format!(
                    "{}/jobs/{jid}/vertices/{vid}/metrics?get={}",
                    self.rest,
                    wanted.join(",")
                ));
                let v: Vec<f64> = vals
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|m| m["value"].as_str()?.parse().ok())
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(m) = v.iter().copied().reduce(f64::max).filter(|&m| m > 0.0) {
                    return m;
                }
            }
            assert!(Instant::now() < deadline, "no maxKeyCount from job {jid}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn submit(&self, args: &[&str]) -> String {
        let out = testenv(&[&["submit"], args].concat());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "submit failed: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let jid = text
            .split_whitespace()
            .rev()
            .find(|t| t.len() == 32 && t.chars().all(|c| c.is_ascii_hexdigit()))
            .expect("a job id")
            .to_string();
        self.wait_running(&jid);
        jid
    }

    fn wait_running(&self, jid: &str) {
        wait_running(&self.rest, jid);
    }

    /// The id of the uploaded demo jar (`GET /jars`).
    fn jar_id(&self) -> String {
        let name = Path::new(&self.jar_path)
            .file_name()
            .and_then(|n| n.to_str())
            .expect("jar name")
            .to_string();
        get_json(&format!("{}/jars", self.rest))["files"]
            .as_array()
            .and_then(|fs| {
                fs.iter()
                    .find(|f| f["name"].as_str() == Some(name.as_str()))
                    .and_then(|f| f["id"].as_str())
            })
            .expect("the demo jar uploaded")
            .to_string()
    }

    fn cancel_all(&self) {
        for jid in self.running_jobs() {
            let _ = Command::new("curl")
                .args([
                    "-s",
                    "-X",
                    "PATCH",
                    &format!("{}/jobs/{jid}?mode=cancel", self.rest),
                ])
                .output();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.running_jobs().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// Runs `streamscale flink ARGS` to the end; (exit code, stdout, stderr).
fn streamscale_flink(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(workspace_bin("streamscale"))
        .arg("flink")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run streamscale flink");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    eprintln!("--- streamscale flink {}\n{o}{e}", args.join(" "));
    (out.status.code(), o, e)
}

fn summary(report: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(report.join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("summary json")
}

fn outcomes(s: &serde_json::Value) -> Vec<(String, String)> {
    s["jobs"][0]["rescales"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| {
                    (
                        r["path"].as_str().unwrap_or("").to_string(),
                        r["outcome"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `streamscale flink` on job `jid` of the test cluster for `duration`, with the fast loop
/// settings ([`FAST`]), `extra` options and its report in `report`.
fn autoscale(
    rest: &str,
    jid: &str,
    duration: &str,
    extra: &[&str],
    report: &Path,
) -> (Option<i32>, String, String) {
    let report = report.to_str().expect("utf-8");
    let head = ["--rest-url", rest, "--job", jid, "--duration", duration];
    streamscale_flink(&[&head[..], &FAST, extra, &["--report", report]].concat())
}

/// Fast loop settings: the test cluster refreshes its metrics every second.
const FAST: [&str; 8] = [
    "--interval",
    "2",
    "--window",
    "10",
    "--stabilization",
    "4",
    "--scale-down-delay",
    "600",
];

#[test]
fn streamscale_autoscales_a_real_flink_job() {
    let Some(env) = flink_env(&["FLINK_DEMO_JAR"]) else {
        return;
    };
    // Flink refreshes the metrics its REST API serves every 10 s by default; every second here,
    // so that the test's short windows hold several samples.
    let _cluster = Cluster::start("metrics.fetcher.update-interval: 1000", &[]);
    let flink = Flink {
        rest: env
            .get("FLINK_REST_URL")
            .cloned()
            .unwrap_or_else(|| "http://127.0.0.1:8081".into()),
        jar_path: env["FLINK_DEMO_JAR"].clone(),
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let epoch = format!(
        "{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis()
    );
    // 300 µs per record: one keyed subtask serves ~3,300 records/s; 5,000/s overloads it.
    let job_args = [
        "--rate",
        "5000",
        "--cost-us",
        "300",
        "--keys",
        "500",
        "--epoch-ms",
        &epoch,
    ];

    // 1. An overloaded job at parallelism 1 is scaled up in place; the keyed state survives.
    let jid = flink.submit(&job_args);
    let (_, p0) = flink.parallelism(&jid);
    assert!(p0.values().all(|&p| p == 1), "{p0:?}");
    // The keyed vertex may grow to 2 of the 4 slots: the later steps need room above it.
    let settings = tmp.path().join("settings.yaml");
    let settings_arg = settings.to_str().expect("utf-8").to_string();
    let bound = |min: u64, max: u64| {
        std::fs::write(
            &settings,
            format!("vertices:\n  \"count -> discard: Writer\": {{ min: {min}, max: {max} }}\n"),
        )
        .expect("settings");
    };
    bound(1, 2);
    let report = tmp.path().join("inplace");
    let (code, out, _) = autoscale(
        &flink.rest,
        &jid,
        "75s",
        &["--settings", &settings_arg],
        &report,
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("Source: trace p=1"),
        "live lines name the vertices: {out}"
    );
    assert!(out.contains("lag "), "the source's backlog is shown: {out}");
    assert!(out.contains("RESCALE count"), "{out}");
    assert!(out.contains("rescaled by inPlace"), "{out}");
    let (state, p1) = flink.parallelism(&jid);
    assert_eq!(state, "RUNNING");
    let keyed = p1
        .iter()
        .find(|(n, _)| n.starts_with("count"))
        .map(|(_, p)| *p)
        .expect("keyed vertex");
    assert_eq!(keyed, 2, "scaled up to its bound: {p1:?}");
    let s = summary(&report);
    assert!(
        outcomes(&s).contains(&("inPlace".into(), "rescaled".into())),
        "{s}"
    );
    assert!(
        s["jobs"][0]["rescales"][0]["downtimeSeconds"]
            .as_f64()
            .is_some_and(|d| d > 0.0)
    );
    let timeline = std::fs::read_to_string(report.join("timeline.csv")).expect("timeline");
    assert!(timeline.lines().count() > 5, "{timeline}");
    let before = flink.max_key_count(&jid);

    // 2. Savepoint + resubmit (forced by a lower bound above the current parallelism): a new
    // job id at the new parallelism, one running copy, the keyed counts go on.
    let want = keyed + 1;
    bound(want, want);
    let jar = flink.jar_id();
    let sp_dir = format!("file://{}", tmp.path().join("savepoints").display());
    let mut resubmit: Vec<&str> = vec![
        "--rescale",
        "savepoint",
        "--resubmit-jar",
        &jar,
        "--entry-class",
        "streamscale.tracejob.TraceJob",
    ];
    for a in &job_args {
        resubmit.push("--arg");
        resubmit.push(a);
    }
    let report = tmp.path().join("savepoint");
    let (code, out, _) = autoscale(
        &flink.rest,
        &jid,
        "45s",
        &[
            &resubmit[..],
            &["--savepoint-dir", &sp_dir, "--settings", &settings_arg],
        ]
        .concat(),
        &report,
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("rescaled by savepoint"), "{out}");
    let s = summary(&report);
    let new_jid = s["jobs"][0]["jobId"].as_str().expect("job id").to_string();
    assert_ne!(new_jid, jid, "a resubmitted job has a new id");
    assert_eq!(
        flink.running_jobs(),
        vec![new_jid.clone()],
        "one running copy"
    );
    let (_, p2) = flink.parallelism(&new_jid);
    assert_eq!(p2.get("count -> discard: Writer"), Some(&want), "{p2:?}");
    let after = flink.max_key_count(&new_jid);
    assert!(
        after >= before,
        "keyed counts went on from the savepoint: {before} before, {after} after"
    );

    // 3. A savepoint that cannot be written: the job keeps running, same id, same parallelism.
    bound(want + 1, want + 1);
    let report = tmp.path().join("sp-failed");
    let (code, out, _) = autoscale(
        &flink.rest,
        &new_jid,
        "30s",
        &[
            &resubmit[..],
            &[
                "--savepoint-dir",
                "file:///proc/streamscale-cannot-write-here",
            ],
            &["--settings", &settings_arg],
        ]
        .concat(),
        &report,
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("savepointFailed"), "{out}");
    assert!(out.contains("BACKOFF"), "{out}");
    let (state, p3) = flink.parallelism(&new_jid);
    assert_eq!((state.as_str(), &p3), ("RUNNING", &p2));
    assert_eq!(flink.running_jobs(), vec![new_jid.clone()]);

    // 3b. A jar the cluster does not have: refused at the start (exit 2), the job untouched.
    let (code, _, err) = autoscale(
        &flink.rest,
        &new_jid,
        "10s",
        &["--rescale", "savepoint", "--resubmit-jar", "no-such.jar"],
        &tmp.path().join("no-jar"),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--resubmit-jar no-such.jar: no such jar on the cluster"),
        "{err}"
    );
    assert_eq!(flink.running_jobs(), vec![new_jid.clone()]);

    // 4. A resubmission that cannot reach the new parallelism (more subtasks than the 4 slots):
    // cancelled and rolled back to the old parallelism from the same savepoint.
    bound(6, 6);
    let report = tmp.path().join("restore-failed");
    let (code, out, _) = autoscale(
        &flink.rest,
        &new_jid,
        "60s",
        &[
            &resubmit[..],
            &["--savepoint-dir", &sp_dir, "--rescale-timeout", "20"],
            &["--settings", &settings_arg],
        ]
        .concat(),
        &report,
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("restoreFailed"), "{out}");
    let s = summary(&report);
    let rolled = s["jobs"][0]["jobId"].as_str().expect("job id").to_string();
    assert_eq!(
        flink.running_jobs(),
        vec![rolled.clone()],
        "one running copy"
    );
    let (_, p4) = flink.parallelism(&rolled);
    assert_eq!(p4, p2, "back at the old parallelism");

    // 5. A job cancelled under the controller: one line, the session ends.
    let rest = flink.rest.clone();
    let victim = rolled.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(8));
        let _ = Command::new("curl")
            .args([
                "-s",
                "-X",
                "PATCH",
                &format!("{rest}/jobs/{victim}?mode=cancel"),
            ])
            .output();
    });
    let report = tmp.path().join("cancelled");
    let (code, out, _) = autoscale(
        &flink.rest,
        &rolled,
        "60s",
        &["--mode", "recommend"],
        &report,
    );
    canceller.join().expect("canceller");
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("ended (CANCELED); no longer autoscaled"),
        "{out}"
    );
    flink.cancel_all();

    // 6. A PyFlink job (Table API: datagen, which reports no pendingRecords, GROUP BY a key,
    // blackhole) is as opaque to the controller as any: its graph and metrics are read.
    let python = env.get("FLINK_PYTHON").cloned().expect("FLINK_PYTHON");
    let host = flink.rest.trim_start_matches("http://").to_string();
    let out = Command::new(&python)
        .arg(root().join("flink-jobs/pyflink/keyed_count.py"))
        .args([host.as_str(), "2000"])
        .output()
        .expect("run the PyFlink job");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let py_jid = text
        .split_whitespace()
        .skip_while(|t| *t != "JobID")
        .nth(1)
        .unwrap_or_else(|| {
            panic!(
                "no JobID from the PyFlink job: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_string();
    flink.wait_running(&py_jid);
    let report = tmp.path().join("pyflink");
    let (code, out, _) = autoscale(
        &flink.rest,
        &py_jid,
        "25s",
        &["--mode", "recommend"],
        &report,
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("(keyed, p=1"),
        "the GROUP BY vertex is keyed: {out}"
    );
    assert!(out.contains("no pendingRecords metric"), "{out}");
    assert!(out.contains(" busy "), "live lines with rates: {out}");
    assert!(
        report.join("timeline.png").is_file(),
        "a job's chart beside its summary"
    );
    // Bounds for a vertex the named job does not have: refused (exit 2), nothing written.
    let typo = tmp.path().join("typo-settings.yaml");
    std::fs::write(&typo, "vertices:\n  \"no such vertex\": { max: 2 }\n").expect("settings");
    let typo_report = tmp.path().join("typo-report");
    let (code, _, err) = autoscale(
        &flink.rest,
        &py_jid,
        "10s",
        &["--settings", &typo.display().to_string()],
        &typo_report,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--settings: vertices: no vertex named `no such vertex` in job")
            && err.contains("(its vertices: `"),
        "{err}"
    );
    assert!(!typo_report.exists());
    flink.cancel_all();

    // 7. An unknown job and an unreachable cluster: exit 1 and one line naming it, and no
    // report directory left behind; a job id that is no Flink id: exit 2 before any request.
    let unknown_report = tmp.path().join("report-unknown-job");
    let (code, _, err) = streamscale_flink(&[
        "--rest-url",
        &flink.rest,
        "--job",
        "0123456789abcdef0123456789abcdef",
        "--report",
        &unknown_report.display().to_string(),
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("job 0123456789abcdef0123456789abcdef is not known"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        !unknown_report.exists(),
        "nothing written for an unknown job"
    );
    let (code, _, err) = streamscale_flink(&["--rest-url", &flink.rest, "--job", "x"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--job x: a Flink job id is 32 hexadecimal digits"),
        "{err}"
    );
    let (code, _, err) = streamscale_flink(&[
        "--rest-url",
        "http://127.0.0.1:9",
        "--job",
        "0123456789abcdef0123456789abcdef",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("127.0.0.1:9") && err.contains("refused"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
