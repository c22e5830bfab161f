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
