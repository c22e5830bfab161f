//! `streamscale run` and `streamscale plan` refusing bad input as a user meets it, with the
//! real binaries: exit status 2, one message naming the option, file or field and the reason,
//! and nothing written.
#![allow(missing_docs)]

use std::path::Path;
use std::process::{Command, Output};

use streamscale_tests::fixtures;
use streamscale_tests::workspace_bin;

fn streamscale(dir: &Path, args: &[&str]) -> Output {
    Command::new(workspace_bin("streamscale"))
        .current_dir(dir)
        .args(args)
        .env(
            "STREAMSCALE_ENGINE_BIN",
            workspace_bin("streamscale-engine"),
        )
        .output()
        .expect("run streamscale")
}

/// Exit status 2 and a stderr holding every one of `needles`.
fn assert_refused(out: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "`{n}` missing in: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn a_bad_number_in_the_job_names_the_field_and_the_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = fixtures::unbounded_job(None);
    let cases = [
        (
            job.replace("cpu: 100", "cpu: \"ten\""),
            "operators[1] (work).cpu: expected a number, got \"ten\"",
        ),
        (
            job.replace("cpu: 100", "cpu: ten"),
            "operators[1] (work).cpu: expected a number, got \"ten\"",
        ),
        (
            job.replace("cpu: 100", "cpu: .nan"),
            "operators[1] (work).cpu: NaN is not allowed, it must be a finite number",
        ),
        (
            job.replace("constant: 300", "constant: .nan"),
            "operators[0].constant: .nan is not allowed, it must be a finite number",
        ),
        (
            job.replace("maxParallelism: 16", "maxParallelism: lots"),
            "maxParallelism: expected a whole number >= 0, got \"lots\"",
        ),
    ];
    for (text, want) in cases {
        fixtures::write(dir.path(), "job.yaml", &text);
        let out = streamscale(dir.path(), &["run", "job.yaml", "--report", "report"]);
        let stderr = assert_refused(&out, &["job.yaml", want]);
        assert!(!stderr.contains("configured policy"), "{stderr}");
        assert!(!dir.path().join("report").exists(), "{stderr}");
    }
}
