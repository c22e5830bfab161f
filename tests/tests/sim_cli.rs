//! `streamscale-sim` as a user meets it: bad arguments are refused before anything is
//! replayed (exit 2, a message naming the option or file and why), and the comparison table
//! lines up whatever policy names it holds.
#![allow(missing_docs)]

use std::path::Path;
use std::process::{Command, Output};

use streamscale_tests::fixtures::{self, SIM_TRACE};
use streamscale_tests::workspace_bin;

fn sim(dir: &Path, args: &[&str]) -> Output {
    Command::new(workspace_bin("streamscale-sim"))
        .current_dir(dir)
        .arg("job.yaml")
        .arg("--quiet")
        .args(args)
        .output()
        .expect("run streamscale-sim")
}

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    fixtures::write(dir.path(), "job.yaml", &fixtures::sim_job());
    fixtures::write(dir.path(), "trace.csv", SIM_TRACE);
    dir
}

/// Exit status 2, nothing on stdout (no table printed before the error), and stderr holding
/// every one of `needles`.
fn assert_refused(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    for n in needles {
        assert!(stderr.contains(n), "`{n}` missing in: {stderr}");
    }
}

#[test]
fn zero_threads_is_refused() {
    let dir = setup();
    let out = sim(dir.path(), &["--threads", "0"]);
    assert_refused(&out, &["--threads", "at least 1"]);
}

#[test]
fn an_empty_sim_config_is_refused() {
    let dir = setup();
    // Nothing, or only comments.
    for (file, text) in [("empty.yaml", ""), ("comments.yaml", "# nothing yet\n\n")] {
        fixtures::write(dir.path(), file, text);
        assert_refused(
            &sim(dir.path(), &["--sim-config", file]),
            &["--sim-config", file, "is empty"],
        );
    }
}

#[test]
fn a_report_path_that_is_a_file_is_refused_before_the_replay() {
    let dir = setup();
    fixtures::write(dir.path(), "afile", "keep me");
    assert_refused(
        &sim(dir.path(), &["--report", "afile"]),
        &["--report", "afile", "not a directory"],
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("afile")).expect("still there"),
        "keep me"
    );
}

#[test]
fn the_table_lines_up_with_the_longest_policy_name() {
    let dir = setup();
    let out = sim(
        dir.path(),
        &["--policy", "streamscale,streamscale-forecast,ds2"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("policy"))
        .take(4)
        .collect();
    assert_eq!(table.len(), 4, "{stdout}");
    // Every column is right-aligned at the same place as its header: each header word ends
    // where the row's value in that column ends.
    let ends = |line: &str| -> Vec<usize> {
        let b = line.as_bytes();
        (0..b.len())
            .filter(|&i| b[i] != b' ' && (i + 1 == b.len() || b[i + 1] == b' '))
            .map(|i| i + 1)
            .collect()
    };
    // The header's words, with the two-word titles (`vs oracle`, `SLO viol.`, `max backlog`,
    // ...) as one column each: the column ends are those of the rows' values.
    let header_width = table[0].len();
    for row in &table[1..] {
        assert_eq!(row.len(), header_width, "\n{}", table.join("\n"));
        let e = ends(row);
        // Policy name, then 8 numeric columns, each ending where the header's column ends.
        assert_eq!(e.len(), 9, "{row}");
        for end in &e[1..] {
            assert!(
                ends(table[0]).contains(end),
                "a value ends at column {end}, under no header end:\n{}",
                table.join("\n")
            );
        }
    }
}

#[test]
fn a_latency_percentile_out_of_range_is_refused() {
    let dir = setup();
    for bad in ["1", "0", "1.5", "-0.5", "NaN"] {
        assert_refused(
            &sim(dir.path(), &["--latency-percentile", bad]),
            &["--latency-percentile", "not in (0, 1)"],
        );
    }
    // The job's own percentile is checked as the engine checks it.
    let job = fixtures::sim_job() + "autoscaler: { latencyPercentile: 1.2 }\n";
    fixtures::write(dir.path(), "job.yaml", &job);
    assert_refused(&sim(dir.path(), &[]), &["latencyPercentile", "(0, 1)"]);
}

/// Reads `DIR/timeseries.csv`'s header and `DIR/summary.json`'s `latency_percentile`.
fn report_of(dir: &Path) -> (String, f64) {
    let csv = std::fs::read_to_string(dir.join("timeseries.csv")).expect("timeseries.csv");
    let header = csv.lines().next().unwrap_or_default().to_string();
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("summary.json")).expect("summary.json"),
    )
    .expect("summary.json is JSON");
    let q = summary["latency_percentile"]
        .as_f64()
        .expect("latency_percentile");
    (header, q)
}

/// With the SLO on p95 (`--latency-percentile`, or the job's `autoscaler.latencyPercentile`),
/// `timeseries.csv` keeps `p99_s` and gains a last column `p95_s` (as `streamscale run`'s
/// `timeline.csv`), `summary.json` states the percentile, the figure's latency panel is the
/// p95's, and every row's p95 is at most its p99. At the default p99: no extra column.
#[test]
fn the_report_names_the_slo_percentile() {
    let dir = setup();
    let run = |args: &[&str]| {
        let out = sim(dir.path(), args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let args = [
        "--policy",
        "streamscale,static",
        "--step",
        "5",
        "--plot",
        "svg",
    ];
    run(&[&args[..], &["--report", "p99"]].concat());
    let (header, q) = report_of(&dir.path().join("p99"));
    assert_eq!(q, 0.99);
    assert!(header.ends_with(",p_source,p_work,p_sink"), "{header}");
    assert!(header.contains(",p99_s,"), "{header}");
    let stdout = run(&[
        &args[..],
        &["--report", "p95", "--latency-percentile", "0.95"],
    ]
    .concat());
    assert!(stdout.contains("SLO 1 s on p95"), "{stdout}");
    let (header, q) = report_of(&dir.path().join("p95"));
    assert_eq!(q, 0.95);
    assert!(
        header.ends_with(",p_source,p_work,p_sink,p95_s"),
        "{header}"
    );
    let cols: Vec<&str> = header.split(',').collect();
    let at = |name: &str| cols.iter().position(|c| *c == name).expect(name);
    let (p99, p95) = (at("p99_s"), at("p95_s"));
    let csv = std::fs::read_to_string(dir.path().join("p95/timeseries.csv")).expect("csv");
    let mut rows = 0;
    for line in csv.lines().skip(1) {
        let v: Vec<f64> = line
            .split(',')
            .skip(1)
            .map(|x| x.parse().unwrap_or(f64::NAN))
            .collect();
        // `policy` is skipped: indices shift by one.
        let (a, b) = (v[p95 - 1], v[p99 - 1]);
        assert!(a <= b + 1e-9 && a > 0.0, "{line}");
        rows += 1;
    }
    assert!(rows > 10, "{csv}");
    let svg = std::fs::read_to_string(dir.path().join("p95/comparison.svg")).expect("svg");
    assert!(
        svg.contains("on p95), % of the time per point"),
        "the panel of time over the SLO"
    );
    assert!(svg.contains("p95 latency, worst interval"), "zoomed panel");
    assert!(svg.contains("time over the SLO (%, p95)"), "violation bars");
    assert!(!svg.contains("p99"), "no p99 anywhere in the figure");
    // The job's own percentile, without the flag: the same.
    let job = fixtures::sim_job() + "autoscaler: { latencyPercentile: 0.95 }\n";
    fixtures::write(dir.path(), "job.yaml", &job);
    run(&[&args[..], &["--report", "job95"]].concat());
    let (header, q) = report_of(&dir.path().join("job95"));
    assert_eq!(q, 0.95);
    assert!(header.ends_with(",p95_s"), "{header}");
}

/// A reader that goes away (`streamscale-sim … | head -1`) does not end the replay: no panic,
/// exit 0, one line on stderr, and the report written.
#[test]
fn a_closed_standard_output_still_writes_the_report() {
    let dir = setup();
    let mut child = Command::new(workspace_bin("streamscale-sim"))
        .current_dir(dir.path())
        .args(["job.yaml", "--quiet", "--report", "rep"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run streamscale-sim");
    // The read end closes before the first line is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("standard output closed") && stderr.contains("the report is still written"),
        "{stderr}"
    );
    assert!(dir.path().join("rep/summary.json").is_file());
}
