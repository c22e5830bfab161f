//! Job-file validation found by a fresh user: each bad job gives one clear error naming the
//! operator and field.
#![allow(missing_docs, clippy::unwrap_used)]

use streamscale_engine::spec::JobSpec;

fn job(ops: &str, edges: &str, top: &str) -> String {
    format!(
        "name: j\n{top}operators:\n  - {{ name: src, kind: source, rate: {{ constant: 1 }} }}\n{ops}edges:\n{edges}"
    )
}

/// Parses and validates; the error message.
fn problem(text: &str) -> String {
    match JobSpec::from_yaml(text) {
        Err(e) => e,
        Ok(spec) => spec.validate().expect_err("job should be rejected"),
    }
}

/// Reads a job file; the error message.
fn file_problem(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.yaml");
    std::fs::write(&path, text).unwrap();
    JobSpec::from_file(&path)
        .expect_err("job should be rejected")
        .to_string()
}

const TO_SINK: &str = "  - { from: src, to: m }\n  - { from: m, to: sink }\n";
const SINK: &str = "  - { name: sink, kind: sink }\n";

#[test]
fn unknown_field_on_a_map_is_an_error() {
    let e = problem(&job(
        &format!("  - {{ name: m, kind: map, paralellism: 4 }}\n{SINK}"),
        TO_SINK,
        "",
    ));
    assert!(e.contains("unknown field `paralellism`"), "{e}");
    assert!(
        e.contains("operators[1] (m)") && e.contains("parallelism"),
        "{e}"
    );
    let e = problem(&job(
        &format!("  - {{ name: m, kind: map, keep: 0.3 }}\n{SINK}"),
        TO_SINK,
        "",
    ));
    assert!(e.contains("unknown field `keep`"), "{e}");
}

#[test]
fn unknown_field_message_lists_the_common_fields() {
    let e = problem(&job(
        &format!("  - {{ name: m, kind: window, sizeMs: 5, paralelism: 3 }}\n{SINK}"),
        TO_SINK,
        "",
    ));
    assert!(e.contains("unknown field `paralelism`"), "{e}");
    for f in ["sizeMs", "parallelism", "cpu", "io", "scaling"] {
        assert!(e.contains(f), "missing {f}: {e}");
    }
}

#[test]
fn huge_channel_capacity_is_rejected() {
    for cap in ["1000000000000", "100000000"] {
        let e = problem(&job(
            &format!("  - {{ name: m, kind: map }}\n{SINK}"),
            TO_SINK,
            &format!("channelCapacity: {cap}\n"),
        ));
        assert!(e.starts_with("channelCapacity:") && e.contains(cap), "{e}");
    }
    // A large capacity on a small job still validates ...
    let ok = job(
        &format!("  - {{ name: m, kind: map }}\n{SINK}"),
        TO_SINK,
        "channelCapacity: 1000000\n",
    );
    JobSpec::from_yaml(&ok).unwrap().validate().unwrap();
    // ... but not times many subtasks.
    let e = problem(&job(
        &format!("  - {{ name: m, kind: map, parallelism: 100 }}\n{SINK}"),
        TO_SINK,
        "channelCapacity: 1000000\n",
    ));
    assert!(
        e.contains("channelCapacity") && e.contains("101 non-source subtasks"),
        "{e}"
    );
}

#[test]
fn sliding_window_with_too_many_windows_per_record_is_rejected() {
    let text = "name: j\noperators:\n  - { name: src, kind: source, rate: { constant: 1 }, nexmark: {} }\n  - { name: bids, kind: select, query: bids }\n  - { name: w, kind: eventWindow, key: auction, window: { sliding: { sizeMs: 100000000, slideMs: 1 } } }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: bids }\n  - { from: bids, to: w }\n  - { from: w, to: sink }\n";
    let e = problem(text);
    assert!(e.contains("operators[2] (w).window.sliding"), "{e}");
}

#[test]
fn operator_without_output_is_rejected() {
    let e = file_problem(&job(
        "  - { name: a, kind: map }\n",
        "  - { from: src, to: a }\n",
        "",
    ));
    assert!(e.contains("`a` has no output"), "{e}");
}

#[test]
fn parallelism_outside_scaling_bounds_is_rejected() {
    let e = file_problem(&job(
        &format!("  - {{ name: m, kind: map, parallelism: 5, scaling: {{ max: 2 }} }}\n{SINK}"),
        TO_SINK,
        "",
    ));
    assert!(e.contains("operators[1] (m).parallelism: 5"), "{e}");
}

#[test]
fn cycle_error_names_only_the_cycle() {
    let e = problem(&job(
        &format!("  - {{ name: a, kind: map }}\n  - {{ name: b, kind: map }}\n{SINK}"),
        "  - { from: src, to: a }\n  - { from: a, to: b }\n  - { from: b, to: a }\n  - { from: b, to: sink }\n",
        "",
    ));
    assert!(e.contains("cycle through operators a, b;"), "{e}");
}

#[test]
fn trace_start_outside_the_trace_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    std::fs::write(&trace, "t_seconds,rate\n0,10\n1,20\n2,30\n").unwrap();
    for (start, want) in [
        ("-5", "must be a finite, non-negative"),
        ("100", "past the end of trace"),
    ] {
        let text = format!(
            "name: j\noperators:\n  - {{ name: src, kind: source, rate: {{ trace: {{ file: {}, startSeconds: {start} }} }} }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: src, to: sink }}\n",
            trace.display()
        );
        let e = problem(&text);
        assert!(
            e.contains("rate.trace.startSeconds") && e.contains(want),
            "{e}"
        );
    }
}

#[test]
fn latency_percentile_outside_zero_one_is_rejected() {
    for bad in ["1.5", "0", "1"] {
        let e = problem(&job(
            &format!("  - {{ name: m, kind: map }}\n{SINK}"),
            TO_SINK,
            &format!("autoscaler: {{ latencyPercentile: {bad} }}\n"),
        ));
        assert!(e.contains("autoscaler.latencyPercentile"), "{bad}: {e}");
    }
    let ok = job(
        &format!("  - {{ name: m, kind: map }}\n{SINK}"),
        TO_SINK,
        "autoscaler: { latencyPercentile: 0.95 }\n",
    );
    let spec = JobSpec::from_yaml(&ok).unwrap();
    spec.validate().unwrap();
    assert_eq!(spec.autoscaler.latency_percentile, 0.95);
}

#[test]
fn an_unknown_kind_names_the_operator_and_the_kinds() {
    let e = problem(&job(
        &format!("  - {{ name: m, kind: mapp }}\n{SINK}"),
        TO_SINK,
        "",
    ));
    assert!(
        e.contains("operators[1] (m).kind: unknown variant `mapp`, expected one of"),
        "{e}"
    );
    assert!(e.contains("map") && e.contains("window"), "{e}");
}

#[test]
fn an_infinite_rate_is_refused_as_not_finite() {
    for (rate, field) in [
        ("{ constant: .inf }", "constant"),
        ("{ constant: 1e999 }", "constant"),
        (
            "{ steps: [ { atSeconds: 0, recordsPerSecond: .inf } ] }",
            "recordsPerSecond",
        ),
    ] {
        let text = job(
            &format!("  - {{ name: m, kind: map }}\n{SINK}"),
            TO_SINK,
            "",
        )
        .replace("rate: { constant: 1 }", &format!("rate: {rate}"));
        let e = problem(&text);
        assert!(e.contains(field) && e.contains("finite"), "{rate}: {e}");
    }
}
