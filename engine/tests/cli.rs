//! Bad input to the engine binary: one clear error line, exit code 2, nothing written.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(common::engine_bin())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn bad_jobs_fail_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let base = |op: &str, edges: &str| {
        format!(
            "name: j\noperators:\n  - {{ name: src, kind: source, rate: {{ constant: 1 }} }}\n{op}edges:\n{edges}"
        )
    };
    let cases = [
        (
            base("  - { name: m, kind: teleport }\n", "  - { from: src, to: m }\n"),
            "unknown variant `teleport`",
        ),
        (
            base("  - { name: m, kind: map }\n", "  - { from: src, to: nowhere }\n"),
            "edges[0].to: no operator named `nowhere`",
        ),
        (
            base(
                "  - { name: a, kind: map }\n  - { name: b, kind: map }\n",
                "  - { from: src, to: a }\n  - { from: a, to: b }\n  - { from: b, to: a }\n",
            ),
            "cycle through operators a, b",
        ),
        (
            base("  - { name: m, kind: map, parallelism: 200 }\n", "  - { from: src, to: m }\n"),
            "parallelism: 200 exceeds maxParallelism 128",
        ),
        (
            "name: j\noperators:\n  - { name: src, kind: source, rate: { trace: { file: t.csv, scale: 0 } } }\nedges: []\n".to_string(),
            "rate.trace.scale: 0 must be a finite, positive number",
        ),
        (
            "name: j\noperators:\n  - { name: src, kind: source, rate: { trace: { file: t.csv, scale: -2 } } }\nedges: []\n".to_string(),
            "rate.trace.scale: -2 must be a finite, positive number",
        ),
        (
            "name: j\noperators:\n  - { name: src, kind: source, rate: { trace: { file: t.csv, speedup: 1e300 } } }\nedges: []\n".to_string(),
            "rate.trace.speedup: 1e300 is above the limit 1e6",
        ),
        (
            "name: j\noperators:\n  - { name: src, kind: source, rate: { trace: { file: missing.csv } } }\nedges: []\n".to_string(),
            "missing.csv does not exist",
        ),
        (
            base(
                "  - { name: w, kind: window, sizeMs: 10 }\n  - { name: k, kind: sink }\n",
                "  - { from: src, to: w }\n  - { from: w, to: k }\n",
            )
            .replace("name: j\n", "name: j\nstate: { backend: disk, dir: blocker/state }\n"),
            "state.dir: ",
        ),
    ];
    std::fs::write(dir.path().join("blocker"), b"a file, not a directory").unwrap();
    for (i, (yaml, expected)) in cases.iter().enumerate() {
        let job = write(dir.path(), &format!("job{i}.yaml"), yaml);
        let (code, stdout, stderr) = run(&["--job", &job]);
        assert_eq!(code, 2, "case {i}: {stderr}");
        assert!(stdout.is_empty(), "case {i} printed {stdout}");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "case {i}: one line, got {stderr}"
        );
        assert!(
            stderr.contains(expected),
            "case {i}: expected `{expected}` in {stderr}"
        );
        if expected.starts_with("state.dir") {
            // Refused when the job file is read (before: once the engine could not create it).
            assert!(
                stderr.contains("blocker/state cannot be created")
                    && stderr.contains("blocker is not a directory"),
                "{stderr}"
            );
        }
        assert!(
            stderr.contains(&job),
            "case {i}: the error names the file: {stderr}"
        );
    }
}

#[test]
fn corrupted_savepoint_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let job = common::bounded_job(dir.path(), 3000, 3000.0);
    let sps = dir.path().join("savepoints");
    let mut engine = common::EngineProcess::start(&job, &sps, &[]);
    engine.wait_state("finished", std::time::Duration::from_secs(120));
    let (sp, _) = engine.stop_with_savepoint(false);
    let state = sp.join("state-counts.bin");
    let mut bytes = std::fs::read(&state).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&state, &bytes).unwrap();
    let listing_before: Vec<_> = std::fs::read_dir(&sps)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let sp_arg = sp.display().to_string();
    let sps_arg = sps.display().to_string();
    let job_arg = job.display().to_string();
    let (code, stdout, stderr) = run(&[
        "--job",
        &job_arg,
        "--restore",
        &sp_arg,
        "--savepoint-dir",
        &sps_arg,
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("state-counts.bin") && stderr.contains("checksum mismatch"),
        "{stderr}"
    );
    let listing_after: Vec<_> = std::fs::read_dir(&sps)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(listing_before, listing_after);
    assert_eq!(
        std::fs::read(&state).unwrap(),
        bytes,
        "the savepoint was not touched"
    );
}
