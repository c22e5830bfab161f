//! A source's arrival figures stay current while the source is backpressured.
//!
//! The controller reads the arrival rate γ as Δ`streamscale_source_arrivals_total` / Δt and
//! the README promises it is unbiased by backpressure. A source whose output channels are full
//! spends its time blocked in `send`; if its figures were only published by its own thread,
//! two scrapes a second apart would read the same counter and the next one a jump (the
//! tester saw `in=` swing from 422 to 1162 records/s at a constant 800).
//!
//! The test runs the real engine on a job whose only key goes to one window subtask that
//! waits 20 ms a record (50 records/s) behind a constant 800 records/s source of
//! parallelism 2, so the source is backpressured for the whole run: a source subtask's batch
//! of 64 records takes it over a second to send. It scrapes `/metrics` in pairs about a
//! second apart and requires, on every pair and for every source subtask, the arrivals
//! counter to grow by about its share of rate × Δt and the backlog gauge to grow.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{EngineProcess, metric_sample, parse_metrics};
use streamscale_engine::savepoint::Savepoint;
use streamscale_engine::spec::JobSpec;

/// The source's target rate, records/s.
const RATE: f64 = 800.0;
/// The source's parallelism: each subtask reports a 1/`SOURCE_P` share.
const SOURCE_P: u32 = 2;
/// Records/s the window subtask that holds the only key takes (20 ms of blocking wait each).
const WINDOW_RATE: f64 = 50.0;
/// Time between the two scrapes of a pair.
const GAP: Duration = Duration::from_secs(1);
/// Pairs of scrapes.
const PAIRS: usize = 3;

/// Source subtask `subtask`'s sample of `streamscale_FAMILY`.
fn sample(m: &BTreeMap<String, f64>, family: &str, subtask: u32) -> f64 {
    metric_sample(m, family, "source", subtask)
}

/// Seconds the source subtasks spent blocked on full output channels, summed.
fn bp(m: &BTreeMap<String, f64>) -> f64 {
    (0..SOURCE_P)
        .map(|i| sample(m, "backpressured_time_seconds_total", i))
        .sum()
}

/// One scrape and the time half-way through the request (the figures' time, within the
/// request's duration).
fn scrape(engine: &EngineProcess) -> (Instant, BTreeMap<String, f64>) {
    let before = Instant::now();
    let text = engine.metrics();
    let after = Instant::now();
    (before + (after - before) / 2, parse_metrics(&text))
}

/// The backpressured job (YAML).
fn job_yaml() -> String {
    format!(
        r#"name: backpressured
operators:
  - {{ name: source, kind: source, keys: 1, parallelism: {SOURCE_P}, rate: {{ constant: {RATE} }} }}
  - {{ name: counts, kind: window, sizeMs: 1000, io: 20000, parallelism: 4 }}
  - {{ name: sink, kind: sink }}
edges:
  - {{ from: source, to: counts }}
  - {{ from: counts, to: sink }}
"#
    )
}

/// Seconds since the Unix epoch.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// After a restore from a savepoint, at another source parallelism, each source subtask
/// counts its 1/p share of every record due since the job first started (the start time the
/// savepoint carries), as before the restore: the counter is rate × (now − first start) / p,
/// read at scrape time, and the backlog is the rest of what is due beyond the savepoint's
/// position.
#[test]
fn after_a_restore_arrivals_count_from_the_jobs_first_start() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, job_yaml()).unwrap();
    let spec = JobSpec::from_file(&job).unwrap();
    let sps = dir.path().join("savepoints");
    let mut first = EngineProcess::start(&job, &sps, &[]);
    std::thread::sleep(Duration::from_millis(1000));
    let (sp, _) = first.stop_with_savepoint(false);
    drop(first);
    let meta = Savepoint::read(&sp, &spec).unwrap().metadata;
    let started = meta.job_started_unix_ms as f64 / 1e3;
    let emitted = meta.sources["source"].emitted as f64;
    let sp_arg = sp.display().to_string();
    let restored = EngineProcess::start(
        &job,
        &sps,
        &["--restore", &sp_arg, "--parallelism", "source=3"],
    );
    std::thread::sleep(Duration::from_millis(500));
    // Each source subtask's series appear when its thread starts, which a loaded machine can
    // delay past the pause.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let m = parse_metrics(&restored.metrics());
        let series = |i: u32| {
            format!("streamscale_source_arrivals_total{{operator=\"source\",subtask=\"{i}\"}}")
        };
        if (0..3).all(|i| m.contains_key(&series(i))) {
            break;
        }
        assert!(
            Instant::now() < until,
            "the 3 restored source subtasks did not all publish in 60 s: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = unix_now();
    let m = parse_metrics(&restored.metrics());
    let after = unix_now();
    // `due` is floored to whole records, then shared by 3.
    let lo = ((RATE * (before - started)).floor() / 3.0) - 1.0;
    let hi = RATE * (after - started) / 3.0;
    for i in 0..3 {
        let arrivals = sample(&m, "source_arrivals_total", i);
        assert!(
            (lo..=hi).contains(&arrivals),
            "source-{i}: arrivals {arrivals}, expected between {lo:.1} and {hi:.1} \
             (rate × seconds since the job first started / 3)"
        );
        let backlog = sample(&m, "source_backlog_records", i);
        assert!(
            backlog <= arrivals - emitted / 3.0 + 1e-9,
            "source-{i}: backlog {backlog} exceeds the records due beyond the savepoint's \
             position ({arrivals} - {emitted} / 3)"
        );
        assert!(backlog > 0.0, "source-{i}: backlog {backlog}");
    }
}

#[test]
fn source_arrivals_and_backlog_advance_between_scrapes_while_backpressured() {
    let yaml = job_yaml();
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, yaml).unwrap();
    let engine = EngineProcess::start(&job, &dir.path().join("savepoints"), &[]);
    // Long enough for the channel to fill (64 records, 1.3 s of the window subtask's work).
    std::thread::sleep(Duration::from_millis(2000));
    let share = RATE / f64::from(SOURCE_P);
    let mut log = Vec::new();
    for pair in 0..PAIRS {
        let (t0, a) = scrape(&engine);
        std::thread::sleep(GAP);
        let (t1, b) = scrape(&engine);
        let dt = (t1 - t0).as_secs_f64();
        for i in 0..SOURCE_P {
            let arrived =
                sample(&b, "source_arrivals_total", i) - sample(&a, "source_arrivals_total", i);
            let backlog = (
                sample(&a, "source_backlog_records", i),
                sample(&b, "source_backlog_records", i),
            );
            log.push(format!(
                "pair {pair} source-{i}: Δt {dt:.3} s, Δarrivals {arrived:.1}, backlog {:.1} → {:.1}, \
                 backpressured time {:.2} → {:.2} s",
                backlog.0,
                backlog.1,
                bp(&a),
                bp(&b)
            ));
            let want = share * dt;
            assert!(
                (0.5 * want..=1.5 * want).contains(&arrived),
                "source-{i}: the arrivals counter grew by {arrived:.1} in {dt:.3} s, expected about \
                 {want:.0} ({share} records/s × Δt)\n{}",
                log.join("\n")
            );
            assert!(
                backlog.1 > backlog.0,
                "source-{i}: the backlog gauge did not grow ({:.1} → {:.1}) although the source \
                 is {:.0} records/s ahead of the window\n{}",
                backlog.0,
                backlog.1,
                RATE - WINDOW_RATE,
                log.join("\n")
            );
            let rate = sample(&b, "source_rate_records_per_second", i);
            assert!(
                (rate - share).abs() < 1e-9,
                "source-{i}: rate gauge {rate}, expected {share}"
            );
        }
    }
    // The run was backpressured: the sources spent a good part of it blocked.
    let (_, end) = scrape(&engine);
    assert!(
        bp(&end) > 1.0,
        "the sources were hardly backpressured ({:.2} s): the test does not test what it \
         should\n{}",
        bp(&end),
        log.join("\n")
    );
    eprintln!("{}", log.join("\n"));
}
