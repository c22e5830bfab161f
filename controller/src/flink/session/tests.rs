use super::*;
use report::csv_field;

#[test]
fn changes_name_only_the_vertices_that_change() {
    let from: BTreeMap<String, u32> = [("a".to_string(), 1), ("b".to_string(), 2)]
        .into_iter()
        .collect();
    let to: BTreeMap<String, u32> = [("a".to_string(), 1), ("b".to_string(), 4)]
        .into_iter()
        .collect();
    assert_eq!(describe(&from, &to), "b 2→4");
}

fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// The demo job as a real Flink 2.3 cluster described it (`tests/data/flink/job.json`).
fn recorded_job() -> JobDetails {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/flink/job.json");
    let text = std::fs::read_to_string(&path).expect("recorded job");
    serde_json::from_str(&text).expect("job details")
}

#[test]
fn a_second_session_starts_from_what_the_first_learned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = FlinkOptions {
        report_dir: dir.path().join("report"),
        state_dir: Some(dir.path().join("state")),
        ..FlinkOptions::default()
    };
    std::fs::create_dir_all(opts.state_dir()).expect("state dir");
    let job = recorded_job();
    // No request is sent while a session is set up and its state kept: nothing listens here.
    let rest = FlinkRest::new(reqwest::Client::new(), "http://127.0.0.1:9");
    let mut lines: Vec<String> = Vec::new();
    block(async {
        let unix0 = 1.0e9;
        let mut first = JobSession::new(&rest, &job, &opts, unix0, &mut |l| {
            lines.push(l.to_string())
        })
        .await
        .expect("first session");
        assert!(lines.is_empty(), "nothing learned yet: {lines:?}");
        let vertex = first.report.vertices[1].name.clone();
        let mut learned = first.session.autoscaler().scalability().clone();
        learned.factors.insert(vertex.clone(), 0.8);
        first.session.autoscaler_mut().set_scalability(learned);
        first.session.autoscaler_mut().observe_rescale_downtime(3.0);
        // Bin 10 of 300 s on the first session's clock: Unix second 1e9 + 3000.
        first
            .session
            .autoscaler_mut()
            .set_rate_history(crate::model::forecast::RateHistory {
                bin_seconds: 300.0,
                season_seconds: 86_400.0,
                bins: vec![(10, 5.0)],
                ..Default::default()
            });
        first.save_state().await;
        let file = opts.state_dir().join(flink_state_file(&job.jid));
        assert!(file.is_file(), "{} written", file.display());
        assert!(!opts.report_dir.join("learned-state.json").exists());

        // A session started 600 s later (by the Unix clock) reads it back.
        let mut second = JobSession::new(&rest, &job, &opts, unix0 + 600.0, &mut |l| {
            lines.push(l.to_string())
        })
        .await
        .expect("second session");
        let a = second.session.autoscaler();
        assert_eq!(a.scalability().factor(&vertex), 0.8);
        assert_eq!(a.settings().planner.rescale_downtime_seconds, Some(3.0));
        assert_eq!(a.rate_history().bins, vec![(8, 5.0)], "moved to its clock");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("scalability factors of 1 vertex")
                && lines[0].contains(&file.display().to_string()),
            "{lines:?}"
        );
        // Unchanged: not written again.
        assert_eq!(second.session.save_if_changed().await, Ok(false));

        // Another job id has a file of its own, and starts with nothing learned.
        let other = JobDetails {
            jid: "0123456789abcdef0123456789abcdef".into(),
            ..job.clone()
        };
        let third = JobSession::new(&rest, &other, &opts, unix0, &mut |_| {})
            .await
            .expect("other job");
        assert!(third.session.autoscaler().scalability().factors.is_empty());
    });
}

#[test]
fn csv_fields_with_commas_are_quoted() {
    assert_eq!(csv_field("a, b"), "\"a, b\"");
    assert_eq!(csv_field("Source: x"), "Source: x");
}

#[test]
fn a_job_that_cannot_be_rescaled_gets_recommendations_not_attempts() {
    let mut job = recorded_job();
    let opts = FlinkOptions::default();
    // The adaptive scheduler (the recorded job's): in place.
    assert_eq!(tick::cannot_apply(&opts, &job), None);
    job.scheduler_type = Some("Default".into());
    let why = tick::cannot_apply(&opts, &job).expect("no way to apply");
    assert!(why.contains("the Default scheduler"), "{why}");
    // A resubmission, or in place forced: attempted.
    let resubmit = FlinkOptions {
        resubmit: Some(Resubmit::Command("true".into())),
        ..FlinkOptions::default()
    };
    assert_eq!(tick::cannot_apply(&resubmit, &job), None);
    let forced = FlinkOptions {
        rescale: RescalePath::InPlace,
        ..FlinkOptions::default()
    };
    assert_eq!(tick::cannot_apply(&forced, &job), None);
}

#[test]
fn an_unwritable_report_directory_is_refused_before_the_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("afile");
    std::fs::write(&file, "x").expect("file");
    let err = writable_dir("--report", &file).expect_err("a file");
    assert!(
        err.to_string().contains("is a file, not a directory"),
        "{err}"
    );
    writable_dir("--report", &dir.path().join("new")).expect("created");
    assert!(!dir.path().join("new/.streamscale-write-check").exists());
}

#[test]
fn charts_an_earlier_session_left_in_the_report_directory_go() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = FlinkOptions {
        report_dir: dir.path().to_path_buf(),
        ..FlinkOptions::default()
    };
    let rest = FlinkRest::new(reqwest::Client::new(), "http://127.0.0.1:9");
    for stale in ["timeline.png", "timeline-0badf00d.png"] {
        std::fs::write(dir.path().join(stale), "old").expect("stale chart");
    }
    for mine in ["notes.png", "timeline-notes.png"] {
        std::fs::write(dir.path().join(mine), "mine").expect("another file");
    }
    let session = block(JobSession::new(
        &rest,
        &recorded_job(),
        &opts,
        1.0e9,
        &mut |_| {},
    ))
    .expect("session");
    let summary = FlinkSummary {
        rest_url: opts.rest_url.clone(),
        mode: opts.mode,
        duration_seconds: 1.0,
        jobs: vec![session.report.clone()],
    };
    write_report(dir.path(), &summary, &[session], 0.7).expect("report");
    assert!(!dir.path().join("timeline.png").exists());
    assert!(!dir.path().join("timeline-0badf00d.png").exists());
    assert!(dir.path().join("notes.png").exists());
    assert!(dir.path().join("timeline-notes.png").exists());
    assert!(dir.path().join("summary.json").exists());
}
