//! Event time after a bounded source finished (Flink's FLIP-147 with event time): a short
//! bounded Nexmark source and a long one both feed a keyed event-time window. A finished
//! source's last watermark is `+∞` (`u64::MAX`, Flink's `Long.MAX_VALUE`), so the window's
//! input watermark (the minimum over its input channels) follows the long source alone once
//! the short one ended, and windows keep firing while the long source runs. The same holds
//! after a stop-with-savepoint taken once the short source finished and a restore at another
//! parallelism: the restored finished source emits no record again and does not hold the
//! watermark back.
//!
//! Stall detection without wall-clock assertions: the long source emits its first
//! [`PHASE1`] events at once and then nothing (rate 0, never reaching its count), so the job
//! cannot end by itself and the only way a window fires is the watermark. The long source's
//! idle watermark then covers every event it emitted, so every window of every emitted event
//! must fire; the tests poll for exactly that many window rows (a generous deadline for a
//! stuck job) and compare the sink's rows with a reference computed from the Nexmark
//! generator directly (per key and window, the count of bids from both sources).
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::EngineProcess;
use nexmark::EventGenerator;
use nexmark::config::NexmarkConfig;
use nexmark::event::Event;
use streamscale_engine::metrics::EngineMetrics;
use streamscale_engine::runtime::{Job, RuntimeOptions, StopKind};
use streamscale_engine::savepoint::Savepoint;
use streamscale_engine::spec::JobSpec;
use streamscale_engine::time::decode_groups;
use streamscale_engine::time::window::Pane;

/// Events of the short source: it finishes at once.
const SHORT: u64 = 300;
/// Events the long source emits at once in the first run (then its rate is 0).
const PHASE1: u64 = 10_000;
/// Events the long source has emitted after the restore's burst (then its rate is 0).
const PHASE2: u64 = 20_000;
/// The long source's record count: never reached, so it never finishes.
const LONG: u64 = 1_000_000;
/// Nexmark events per second of event time: event `n` is at `BASE + n` ms.
const EVENT_RATE: u64 = 1000;
const BASE: u64 = 1_600_000_000_000;
/// Tumbling window size, ms of event time.
const WINDOW_MS: u64 = 1000;

/// short → sbids (select bids) → win (tumbling event-time window by auction) → sink,
/// long → lbids (select bids) → win. The long source emits `long_events` events within its
/// first second and nothing after. `parallelism` gives short, sbids, long, lbids, win, sink.
fn yaml(long_events: u64, parallelism: [u32; 6], output: &Path) -> String {
    let [ps, psb, pl, plb, pw, pk] = parallelism;
    format!(
        r#"name: event-time-finished
maxParallelism: 64
operators:
  - {{ name: short, kind: source, count: {SHORT}, rate: {{ constant: 1.0e6 }}, parallelism: {ps}, nexmark: {{ baseTimeMs: {BASE}, eventRate: {EVENT_RATE} }} }}
  - {{ name: sbids, kind: select, query: bids, parallelism: {psb} }}
  - {{ name: long, kind: source, count: {LONG}, rate: {{ steps: [ {{ atSeconds: 0, recordsPerSecond: {long_events} }}, {{ atSeconds: 1, recordsPerSecond: 0 }} ] }}, parallelism: {pl}, nexmark: {{ baseTimeMs: {BASE}, eventRate: {EVENT_RATE} }} }}
  - {{ name: lbids, kind: select, query: bids, parallelism: {plb} }}
  - {{ name: win, kind: eventWindow, key: auction, window: {{ tumbling: {{ sizeMs: {WINDOW_MS} }} }}, parallelism: {pw} }}
  - {{ name: sink, kind: sink, output: "{}", parallelism: {pk} }}
edges:
  - {{ from: short, to: sbids }}
  - {{ from: long, to: lbids }}
  - {{ from: sbids, to: win }}
  - {{ from: lbids, to: win }}
  - {{ from: win, to: sink }}
"#,
        output.display()
    )
}

fn spec(long_events: u64, parallelism: [u32; 6], output: &Path) -> JobSpec {
    let spec = JobSpec::from_yaml(&yaml(long_events, parallelism, output)).unwrap();
    spec.validate().unwrap();
    spec
}

const FIRST: [u32; 6] = [1, 1, 2, 2, 2, 1];
const RESCALED: [u32; 6] = [2, 3, 1, 3, 3, 2];

/// A window row: (auction, window start, window end, count).
type Row = (u64, u64, u64, u64);

/// The first `n` events of the sources' generator timeline.
fn events(n: u64) -> Vec<Event> {
    let config = NexmarkConfig {
        base_time: BASE,
        first_rate: EVENT_RATE as usize,
        next_rate: EVENT_RATE as usize,
        ..Default::default()
    };
    EventGenerator::new(config).take(n as usize).collect()
}

/// Every window row of an uninterrupted run in which the short source emitted its [`SHORT`]
/// events and the long one its first `long` events, all windows fired, sorted.
fn reference(long: u64) -> Vec<Row> {
    let mut counts: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for e in events(SHORT).into_iter().chain(events(long)) {
        if let Event::Bid(b) = e {
            let ts = b.date_time;
            let start = ts - ts % WINDOW_MS;
            *counts.entry((b.auction as u64, start)).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .map(|((a, s), n)| (a, s, s + WINDOW_MS, n))
        .collect()
}

/// The rows of `reference(long)` the window must have fired once the long source, having
/// emitted its first `long` events, is idle: its idle watermark is the event time of event
/// `long` minus 1 ms, and the short source's is `+∞`, so every window ending at or before
/// that event time fires (here: every window of every emitted event).
fn due_rows(long: u64) -> Vec<Row> {
    let next = events(long + 1).pop().unwrap().timestamp();
    let rows: Vec<Row> = reference(long)
        .into_iter()
        .filter(|r| r.2 <= next)
        .collect();
    assert_eq!(
        rows.len(),
        reference(long).len(),
        "the test expects every window of the emitted events to be due"
    );
    rows
}

/// The sink's rows, sorted.
fn sink_rows(path: &Path) -> Vec<Row> {
    let int = |v: &serde_json::Value, f: &str| v[f].as_u64().unwrap();
    let mut rows: Vec<Row> = common::read_sink_output(path)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                int(&v, "auction"),
                int(&v, "windowStart"),
                int(&v, "windowEnd"),
                int(&v, "count"),
            )
        })
        .collect();
    rows.sort_unstable();
    rows
}

fn options() -> RuntimeOptions {
    common::fast_flush_options()
}

/// Polls `counters` until the short source emitted everything, the long one `long` events
/// and the window fired `rows` rows (all of them accounted by the sink); panics after a
/// generous deadline (a stuck watermark never fires them) or when the window fires more.
fn wait_windows_fired(
    what: &str,
    long: u64,
    rows: u64,
    mut counters: impl FnMut() -> BTreeMap<&'static str, u64>,
) {
    let until = Instant::now() + Duration::from_secs(90);
    loop {
        let c = counters();
        assert!(
            c["win_out"] <= rows,
            "{what}: more rows than windows: {c:?}"
        );
        if c["short"] == SHORT && c["long"] == long && c["win_out"] == rows && c["sink"] == rows {
            return;
        }
        assert!(
            Instant::now() < until,
            "{what}: windows stalled after the short source finished \
             (the window fired {} of {rows} rows; the job cannot end by itself): {c:?}",
            c["win_out"]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn in_process_counters(job: &Job) -> BTreeMap<&'static str, u64> {
    let c = job.counters();
    BTreeMap::from([
        ("short", c["short"].records_out),
        ("long", c["long"].records_out),
        ("win_out", c["win"].records_out),
        ("sink", c["sink"].records_in),
    ])
}

/// Records in the open window panes of a savepoint's window state.
fn open_pane_records(sp: &Savepoint) -> u64 {
    let groups: BTreeMap<u32, BTreeMap<u64, Vec<Pane>>> = decode_groups(&sp.state["win"]).unwrap();
    groups
        .values()
        .flat_map(BTreeMap::values)
        .flatten()
        .map(|p| p.count)
        .sum()
}

/// (a) + (b) in-process: windows fire while the long source runs after the short one
/// finished; a stop-with-savepoint then holds no open pane; a restore at another
/// parallelism of every operator (the finished source at 2 subtasks) fires the windows of
/// the long source's next events too; the sink wrote exactly the reference rows, each once.
#[test]
fn windows_keep_firing_after_a_bounded_source_finished_and_after_a_rescaled_restore() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    let first = spec(PHASE1, FIRST, &out);
    let job = Job::start(
        first.clone(),
        None,
        EngineMetrics::new().unwrap(),
        options(),
    )
    .unwrap();
    let expected1 = due_rows(PHASE1);
    wait_windows_fired("first run", PHASE1, expected1.len() as u64, || {
        in_process_counters(&job)
    });

    let sp = dir.path().join("sp");
    if let Err(f) = job
        .stop_with_savepoint(StopKind::Stop, sp.clone())
        .recv_timeout(Duration::from_secs(90))
        .unwrap()
    {
        panic!("stop-with-savepoint failed: {}", f.reason);
    }
    let stopped = job.join();
    assert!(stopped.errors.is_empty(), "{:?}", stopped.errors);
    let snapshot = Savepoint::read(&sp, &first).unwrap();
    assert_eq!(snapshot.metadata.sources["short"].emitted, SHORT);
    assert_eq!(snapshot.metadata.sources["long"].emitted, PHASE1);
    assert_eq!(
        open_pane_records(&snapshot),
        0,
        "every window of the emitted events fired before the stop"
    );
    assert_eq!(sink_rows(&out), expected1, "sink rows after the first run");

    // Restore at another parallelism; the long source bursts to PHASE2 events and idles.
    let second = spec(PHASE2, RESCALED, &out);
    let restored = Savepoint::read(&sp, &second).unwrap();
    let job = Job::start(
        second,
        Some(&restored),
        EngineMetrics::new().unwrap(),
        options(),
    )
    .unwrap();
    let expected2 = due_rows(PHASE2);
    wait_windows_fired("restored run", PHASE2, expected2.len() as u64, || {
        in_process_counters(&job)
    });
    let last = dir.path().join("last");
    if let Err(f) = job
        .stop_with_savepoint(StopKind::Stop, last.clone())
        .recv_timeout(Duration::from_secs(90))
        .unwrap()
    {
        panic!("stop-with-savepoint failed: {}", f.reason);
    }
    let done = job.join();
    assert!(done.errors.is_empty(), "{:?}", done.errors);
    let m = &done.savepoint.metadata;
    assert_eq!(
        (m.sources["short"].emitted, m.counters["short"].records_out),
        (SHORT, SHORT),
        "the finished source emitted nothing again"
    );
    assert_eq!(
        sink_rows(&out),
        expected2,
        "sink rows after the restored run"
    );
}

/// The same over the real engine process (REST, job files, `--restore` and
/// `--parallelism`), as the controller rescales.
#[test]
fn engine_process_fires_windows_after_a_bounded_source_finished_and_after_a_rescale() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    let sps = dir.path().join("savepoints");
    let job1 = dir.path().join("job1.yaml");
    std::fs::write(&job1, yaml(PHASE1, FIRST, &out)).unwrap();
    let job2 = dir.path().join("job2.yaml");
    std::fs::write(&job2, yaml(PHASE2, FIRST, &out)).unwrap();

    fn rest_counters(engine: &EngineProcess) -> BTreeMap<&'static str, u64> {
        let view = engine.job();
        let op = |name: &str, field: &str| common::operator_count(&view, name, field);
        BTreeMap::from([
            ("short", op("short", "recordsOut")),
            ("long", op("long", "recordsOut")),
            ("win_out", op("win", "recordsOut")),
            ("sink", op("sink", "recordsIn")),
        ])
    }

    let mut first = EngineProcess::start(&job1, &sps, &[]);
    let expected1 = due_rows(PHASE1);
    wait_windows_fired("engine, first run", PHASE1, expected1.len() as u64, || {
        rest_counters(&first)
    });
    let (sp, _) = first.stop_with_savepoint(false);
    let snapshot = Savepoint::read(&sp, &spec(PHASE1, FIRST, &out)).unwrap();
    assert_eq!(snapshot.metadata.sources["short"].emitted, SHORT);
    assert_eq!(open_pane_records(&snapshot), 0);
    assert_eq!(sink_rows(&out), expected1);

    let sp_arg = sp.display().to_string();
    let mut second = EngineProcess::start(
        &job2,
        &sps,
        &[
            "--parallelism",
            "short=2,sbids=3,long=1,lbids=3,win=3,sink=2",
            "--restore",
            &sp_arg,
        ],
    );
    let expected2 = due_rows(PHASE2);
    wait_windows_fired(
        "engine, restored run",
        PHASE2,
        expected2.len() as u64,
        || rest_counters(&second),
    );
    let (_, view) = second.stop_with_savepoint(false);
    let short = common::operator_count(&view, "short", "recordsOut");
    assert_eq!(short, SHORT, "the finished source emitted nothing again");
    assert_eq!(sink_rows(&out), expected2);
}
