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

/// The names of the entries of `dir`, sorted.
fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    names
}

/// Reads a job file; the error message.
fn file_problem(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.yaml");
    std::fs::write(&path, text).unwrap();
    JobSpec::from_file_to_run(&path)
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
    assert!(!e.contains("default"), "{e}");
    // Without `parallelism` the error says where the 1 comes from.
    let e = file_problem(&job(
        &format!("  - {{ name: m, kind: map, scaling: {{ min: 3 }} }}\n{SINK}"),
        TO_SINK,
        "",
    ));
    assert!(
        e.contains("(m).parallelism: 1 is outside its scaling bounds min 3")
            && e.contains("1 is the default when `parallelism` is not given"),
        "{e}"
    );
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
fn a_scale_down_lookback_beyond_a_week_or_negative_is_rejected() {
    for bad in ["1e9", "-1", "604801"] {
        let e = problem(&job(
            &format!("  - {{ name: m, kind: map }}\n{SINK}"),
            TO_SINK,
            &format!("autoscaler: {{ scaleDownLookbackSeconds: {bad} }}\n"),
        ));
        assert!(
            e.contains("autoscaler.scaleDownLookbackSeconds"),
            "{bad}: {e}"
        );
        assert!(e.contains("scaling.min"), "{bad}: {e}");
    }
    for good in ["0", "3600", "604800"] {
        let spec = JobSpec::from_yaml(&job(
            &format!("  - {{ name: m, kind: map }}\n{SINK}"),
            TO_SINK,
            &format!("autoscaler: {{ scaleDownLookbackSeconds: {good} }}\n"),
        ))
        .unwrap();
        spec.validate().unwrap();
    }
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

/// The same operators (each a list of `key: value` entries) as a job in flow style
/// (`- { k: v, ... }`) and in block style (one key per line).
fn both_styles(ops: &[&[&str]]) -> [String; 2] {
    let flow: String = ops
        .iter()
        .map(|o| format!("  - {{ {} }}\n", o.join(", ")))
        .collect();
    let block: String = ops
        .iter()
        .flat_map(|o| {
            o.iter()
                .enumerate()
                .map(|(i, kv)| format!("{}{kv}\n", if i == 0 { "  - " } else { "    " }))
        })
        .collect();
    [flow, block].map(|ops| format!("name: j\noperators:\n{ops}edges: []\n"))
}

/// `line L column C` of the first `needle` in `text` (1-based, columns in characters).
fn where_is(text: &str, needle: &str) -> String {
    let at = text.find(needle).expect("needle in text");
    let line = text[..at].matches('\n').count() + 1;
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let column = text[line_start..at].chars().count() + 1;
    format!("line {line} column {column}")
}

/// Parses `text` (which must fail) and checks that the error starts at the line and column of
/// `at` (the first occurrence in the text) and then says `want`.
fn assert_error_at(text: &str, at: &str, want: &str) {
    let e = problem(text);
    let pos = where_is(text, at);
    assert!(
        e.starts_with(&format!("{pos}: {want}")),
        "want `{pos}: {want}...`, got `{e}` for:\n{text}"
    );
}

#[test]
fn a_misspelled_kind_is_blamed_on_kind_not_on_the_next_field() {
    for text in both_styles(&[
        &["name: src", "kind: source", "rate: { constant: 1 }"],
        &["name: m", "kind: map"],
        &["name: win", "kind: windw", "sizeMs: 500", "cpu: 10"],
    ]) {
        assert_error_at(
            &text,
            "windw",
            "operators[2] (win).kind: unknown variant `windw`, expected one of source, map,",
        );
    }
    for text in both_styles(&[&["name: src", "kind: sourc", "rate: { constant: 1 }"]]) {
        assert_error_at(
            &text,
            "sourc",
            "operators[0] (src).kind: unknown variant `sourc`",
        );
    }
    // An operator named like the bad kind: the field whose type takes the listed variants.
    for text in both_styles(&[&["kind: windw", "name: windw"]]) {
        assert_error_at(&text, "windw", "operators[0] (windw).kind: unknown variant");
    }
}

#[test]
fn a_misspelled_variant_of_a_nested_enum_names_its_field() {
    for text in both_styles(&[&[
        "name: src",
        "kind: source",
        "rate: { trace: { file: t.csv, gaps: holdd } }",
        "keys: 5",
    ]]) {
        assert_error_at(
            &text,
            "holdd",
            "operators[0] (src).rate.trace.gaps: unknown variant `holdd`, expected one of hold, zero",
        );
    }
    for text in both_styles(&[&[
        "name: src",
        "kind: source",
        "rate: { constnt: 1 }",
        "keys: 5",
    ]]) {
        assert_error_at(
            &text,
            "constnt",
            "operators[0] (src).rate: unknown variant `constnt`, expected one of constant, steps, trace",
        );
    }
}

#[test]
fn a_misspelled_field_points_at_its_own_key() {
    for text in both_styles(&[
        &["name: src", "kind: source", "rate: { constant: 1 }"],
        &["name: m", "kind: window", "sizMs: 5", "cpu: 1"],
    ]) {
        assert_error_at(
            &text,
            "sizMs",
            "operators[1] (m): unknown field `sizMs`, expected one of sizeMs, aggregates; every operator also takes name,",
        );
    }
    for text in both_styles(&[&["name: m", "kind: map", "cpux: 4", "io: 1"]]) {
        assert_error_at(
            &text,
            "cpux",
            "operators[0] (m): unknown field `cpux` for kind `map`",
        );
    }
    let text = "name: j\noperators: []\nedges:\n  - { from: a, t: b }\n";
    assert_error_at(
        text,
        "t: b",
        "edges[0]: unknown field `t`, expected one of from, to",
    );
}

#[test]
fn a_negative_count_names_the_operator_and_the_field() {
    for text in both_styles(&[
        &["name: m", "kind: map"],
        &[
            "name: src",
            "kind: source",
            "keys: -5",
            "rate: { constant: 1 }",
        ],
    ]) {
        assert_error_at(
            &text,
            "-5",
            "operators[1] (src).keys: expected a whole number >= 0, got \"-5\"",
        );
    }
    for text in both_styles(&[&["name: w", "kind: window", "sizeMs: -3", "io: 1"]]) {
        assert_error_at(
            &text,
            "-3",
            "operators[0] (w).sizeMs: expected a whole number >= 0, got \"-3\"",
        );
    }
    // The whole path of a nested field.
    for text in both_styles(&[&["name: k", "kind: map", "scaling: { min: -3 }"]]) {
        assert_error_at(
            &text,
            "-3",
            "operators[0] (k).scaling.min: expected a whole number >= 0, got \"-3\"",
        );
    }
}

#[test]
fn two_rates_at_once_are_named_as_such() {
    let [flow, _] = both_styles(&[&[
        "name: src",
        "kind: source",
        "rate: { constant: 1, steps: [] }",
    ]]);
    let block = "name: j\noperators:\n  - name: src\n    kind: source\n    rate:\n      constant: 1\n      steps: []\nedges: []\n";
    for (text, at) in [(flow.as_str(), "{ constant"), (block, "constant")] {
        assert_error_at(
            text,
            at,
            "operators[0] (src).rate: give exactly one of constant, steps, trace (found constant and steps)",
        );
    }
    for text in both_styles(&[&["name: src", "kind: source", "rate: {}"]]) {
        assert_error_at(
            &text,
            "{}",
            "operators[0] (src).rate: give exactly one of constant, steps, trace (found none)",
        );
    }
}

#[test]
fn a_missing_field_names_the_operator_that_lacks_it() {
    for text in both_styles(&[&["name: src", "kind: source", "keys: 4"]]) {
        let start = if text.contains("- {") {
            "{ name"
        } else {
            "name: src"
        };
        assert_error_at(
            &text,
            start,
            "operators[0] (src): missing field `rate` (a source needs `rate`: one of constant, steps, trace)",
        );
    }
    for text in both_styles(&[
        &["name: m", "kind: map"],
        &["name: w", "kind: window", "cpu: 1"],
    ]) {
        let start = if text.contains("- {") {
            "{ name: w"
        } else {
            "name: w"
        };
        assert_error_at(
            &text,
            start,
            "operators[1] (w): missing field `sizeMs` (a window needs `sizeMs`)",
        );
    }
}

#[test]
fn a_non_finite_rate_names_the_whole_path() {
    for text in both_styles(&[&["name: src", "kind: source", "rate: { constant: .nan }"]]) {
        assert_error_at(
            &text,
            ".nan",
            "operators[0] (src).rate.constant: .nan is not allowed, it must be a finite number",
        );
    }
}

#[test]
fn a_sink_output_of_the_wrong_kind_is_rejected() {
    // Relative to the job file's directory, which exists: `.` is a directory, which an
    // at-least-once sink cannot append to.
    let e = file_problem(&job(
        "  - { name: sink, kind: sink, output: ., delivery: at-least-once }\n",
        "  - { from: src, to: sink }\n",
        "",
    ));
    assert!(
        e.contains("operators[1] (sink).output:") && e.contains("is a directory; name a file"),
        "{e}"
    );
    // An exactly-once sink (the default) publishes part files into a directory: a file is
    // refused.
    let e = file_problem(&job(
        "  - { name: sink, kind: sink, output: job.yaml }\n",
        "  - { from: src, to: sink }\n",
        "checkpoint: { intervalSeconds: 1 }\n",
    ));
    assert!(
        e.contains("operators[1] (sink).output:")
            && e.contains("is not a directory; an exactly-once sink publishes part files"),
        "{e}"
    );
    // A file that does not exist yet is fine.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.yaml");
    std::fs::write(
        &path,
        job(
            "  - { name: sink, kind: sink, output: out.csv }\n",
            "  - { from: src, to: sink }\n",
            "checkpoint: { intervalSeconds: 1 }\n",
        ),
    )
    .unwrap();
    JobSpec::from_file_to_run(&path).expect("a new output file is fine");
}

#[test]
fn a_disk_state_dir_that_cannot_be_created_is_rejected_and_nothing_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, "x").unwrap();
    // Paths that fail even for root: nothing can be created under /proc, nor under a file.
    let cases = [
        (
            "/proc/streamscale-nope".to_string(),
            "state.dir: /proc/streamscale-nope cannot be created: cannot create a directory in /proc: ",
        ),
        ("a-file/state".to_string(), "cannot be created: "),
    ];
    for (state_dir, want) in cases {
        let path = dir.path().join("job.yaml");
        std::fs::write(
            &path,
            job(
                SINK,
                "  - { from: src, to: sink }\n",
                &format!("state: {{ backend: disk, dir: {state_dir} }}\n"),
            ),
        )
        .unwrap();
        let e = JobSpec::from_file_to_run(&path)
            .expect_err("job should be rejected")
            .to_string();
        assert!(e.contains("job.yaml") && e.contains(want), "{e}");
        // Planning or simulating the job does not need its paths on this machine.
        JobSpec::from_file(&path).expect("the job file itself is valid");
        if state_dir.starts_with("a-file") {
            assert!(
                e.contains(&format!("{} is not a directory", blocker.display())),
                "{e}"
            );
        }
    }
    // A state directory that does not exist yet is fine, and checking it creates nothing.
    let path = dir.path().join("job.yaml");
    std::fs::write(
        &path,
        job(
            SINK,
            "  - { from: src, to: sink }\n",
            "state: { backend: disk, dir: new/state }\n",
        ),
    )
    .unwrap();
    JobSpec::from_file_to_run(&path).expect("a new state directory is fine");
    assert_eq!(names_in(dir.path()), ["a-file", "job.yaml"]);
}

#[test]
fn a_sink_output_that_cannot_be_created_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a-file"), "x").unwrap();
    let sink = |output: &str| {
        job(
            &format!("  - {{ name: sink, kind: sink, output: {output} }}\n"),
            "  - { from: src, to: sink }\n",
            "checkpoint: { intervalSeconds: 1 }\n",
        )
    };
    // Paths that fail even for root: nothing can be created under /proc, nor under a file.
    let cases = [
        (
            sink("/proc/streamscale-nope/out.csv"),
            "operators[1] (sink).output: /proc/streamscale-nope/out.csv cannot be created: cannot create a directory in /proc: ",
        ),
        (sink("a-file/out.csv"), "operators[1] (sink).output: "),
    ];
    for (text, want) in cases {
        let path = dir.path().join("job.yaml");
        std::fs::write(&path, text).unwrap();
        let e = JobSpec::from_file_to_run(&path)
            .expect_err("job should be rejected")
            .to_string();
        assert!(e.contains(want), "{e}");
        if !want.contains("/proc") {
            assert!(
                e.contains("a-file") && e.contains("is not a directory"),
                "{e}"
            );
        }
    }
    // A new file in new directories is fine, and checking it creates nothing.
    let path = dir.path().join("job.yaml");
    std::fs::write(&path, sink("out/records.csv")).unwrap();
    JobSpec::from_file_to_run(&path).expect("a new output path is fine");
    assert_eq!(names_in(dir.path()), ["a-file", "job.yaml"]);
}

#[test]
fn names_longer_than_a_label_value_are_rejected_before_they_name_files() {
    let ok = "j".repeat(streamscale_engine::spec::MAX_NAME_LEN);
    let long = "j".repeat(streamscale_engine::spec::MAX_NAME_LEN + 1);
    let with_name = |name: &str| {
        job(SINK, "  - { from: src, to: m }\n", "")
            .replacen("name: j\n", &format!("name: {name}\n"), 1)
            .replace("to: m }", "to: sink }")
    };
    JobSpec::from_yaml(&with_name(&ok))
        .and_then(|s| s.validate())
        .expect("63 characters are fine");
    let e = problem(&with_name(&long));
    assert!(
        e.starts_with("name: `jjj") && e.contains("use 1 to 63 letters"),
        "{e}"
    );
    let e = problem(&job(
        &format!("  - {{ name: {long}, kind: sink }}\n"),
        &format!("  - {{ from: src, to: {long} }}\n"),
        "",
    ));
    assert!(
        e.contains("operators[1].name:") && e.contains("use 1 to 63"),
        "{e}"
    );
}
