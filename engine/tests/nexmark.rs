//! Nexmark Q1, Q2, Q3, Q5, Q8 and Q11: the example jobs under `examples/nexmark/` run by the
//! real engine binary (sources and keyed operators at parallelism 2, results written by a
//! file sink as JSON lines), compared with a plain reference implementation of each query
//! over the same events, generated here with the `nexmark` crate directly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::EngineProcess;
use nexmark::EventGenerator;
use nexmark::config::NexmarkConfig;
use nexmark::event::Event;
use serde_json::Value;
use streamscale_engine::nexmark::NexmarkSourceSpec;
use streamscale_engine::spec::{JobSpec, OperatorKind, RateSpec};
use streamscale_engine::time::window::WindowSpec;

/// Events per test run: a few seconds of event time at the default 10 000 events/s.
const EVENTS: u64 = 30_000;

fn example(query: &str) -> JobSpec {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/nexmark/{query}.yaml"));
    JobSpec::from_file(&path).unwrap()
}

/// The example job of `query` bounded to [`EVENTS`] events at `rate` events/s, writing its
/// output to `dir/out.jsonl`.
fn bounded_example(query: &str, rate: f64, dir: &Path) -> JobSpec {
    let mut spec = example(query);
    let (count, out) = (EVENTS, dir.join("out.jsonl"));
    for op in &mut spec.operators {
        match &mut op.kind {
            OperatorKind::Source {
                count: c, rate: r, ..
            } => {
                *c = Some(count);
                *r = RateSpec::Constant(rate);
            }
            OperatorKind::Sink { output, .. } => *output = Some(out.clone()),
            _ => {}
        }
    }
    spec
}

fn nexmark_spec(spec: &JobSpec) -> NexmarkSourceSpec {
    spec.operators
        .iter()
        .find_map(|o| match &o.kind {
            OperatorKind::Source { nexmark, .. } => nexmark.clone(),
            _ => None,
        })
        .expect("a nexmark source")
}

/// The same events as the job's source, straight from the generator.
fn events(spec: &JobSpec, count: u64) -> Vec<Event> {
    let n = nexmark_spec(spec);
    let config = NexmarkConfig {
        base_time: n.base_time_ms,
        first_rate: n.event_rate as usize,
        next_rate: n.event_rate as usize,
        out_of_order_group_size: n.out_of_order_group_size as usize,
        ..Default::default()
    };
    EventGenerator::new(config).take(count as usize).collect()
}

fn window_of(spec: &JobSpec, name: &str) -> WindowSpec {
    match &spec.operator(name).unwrap().kind {
        OperatorKind::EventWindow { window, .. } => *window,
        OperatorKind::Join { window: Some(w) } => *w,
        k => panic!("{name} has no window: {k:?}"),
    }
}

fn set_window(spec: &mut JobSpec, name: &str, w: WindowSpec) {
    for op in &mut spec.operators {
        if op.name == name {
            match &mut op.kind {
                OperatorKind::EventWindow { window, .. } => *window = w,
                OperatorKind::Join { window } => *window = Some(w),
                k => panic!("{name} has no window: {k:?}"),
            }
        }
    }
}

/// Runs `spec` to completion with the engine binary and returns the sink's JSON rows.
fn run(spec: &JobSpec, dir: &Path, parallelism: &str) -> Vec<Value> {
    let job = dir.join("job.yaml");
    std::fs::write(&job, spec.to_yaml()).unwrap();
    let engine = EngineProcess::start(&job, &dir.join("sp"), &["--parallelism", parallelism]);
    engine.wait_state("finished", Duration::from_secs(120));
    read_rows(&sink_file(spec))
}

fn sink_file(spec: &JobSpec) -> PathBuf {
    spec.operators
        .iter()
        .find_map(|o| match &o.kind {
            OperatorKind::Sink { output, .. } => output.clone(),
            _ => None,
        })
        .unwrap()
}

fn read_rows(path: &Path) -> Vec<Value> {
    common::read_sink_output(path)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn int(v: &Value, f: &str) -> u64 {
    v[f].as_u64()
        .unwrap_or_else(|| panic!("{f} missing in {v}"))
}

fn string(v: &Value, f: &str) -> String {
    v[f].as_str()
        .unwrap_or_else(|| panic!("{f} missing in {v}"))
        .to_string()
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

fn bids(events: &[Event]) -> impl Iterator<Item = &nexmark::event::Bid> {
    events.iter().filter_map(|e| match e {
        Event::Bid(b) => Some(b),
        _ => None,
    })
}

/// (start, end) of the Flink windows containing `ts`.
fn windows(w: WindowSpec, ts: u64) -> Vec<(u64, u64)> {
    match w {
        WindowSpec::Tumbling { size_ms } => {
            vec![(ts / size_ms * size_ms, ts / size_ms * size_ms + size_ms)]
        }
        WindowSpec::Sliding { size_ms, slide_ms } => {
            let mut out = Vec::new();
            let mut start = ts / slide_ms * slide_ms;
            while start + size_ms > ts {
                out.push((start, start + size_ms));
                start -= slide_ms;
            }
            out
        }
        WindowSpec::Session { .. } => unreachable!(),
    }
}

#[test]
fn q1_currency_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let spec = bounded_example("q1", 100_000.0, dir.path());
    let got = run(&spec, dir.path(), "events=2,q1=2");
    let key = |a: u64, b: u64, t: u64, p: f64| (t, a, b, (p * 1000.0).round() as u64);
    let got = sorted(
        got.iter()
            .map(|v| {
                key(
                    int(v, "auction"),
                    int(v, "bidder"),
                    int(v, "dateTime"),
                    v["price"].as_f64().unwrap(),
                )
            })
            .collect(),
    );
    let events = events(&spec, EVENTS);
    let want = sorted(
        bids(&events)
            .map(|b| {
                key(
                    b.auction as u64,
                    b.bidder as u64,
                    b.date_time,
                    0.908 * b.price as f64,
                )
            })
            .collect(),
    );
    assert!(want.len() > EVENTS as usize / 2);
    assert_eq!(got, want);
}

#[test]
fn q2_selection() {
    let dir = tempfile::tempdir().unwrap();
    let spec = bounded_example("q2", 100_000.0, dir.path());
    let got = run(&spec, dir.path(), "events=2,q2=2");
    let got = sorted(
        got.iter()
            .map(|v| (int(v, "auction"), int(v, "price")))
            .collect(),
    );
    let events = events(&spec, EVENTS);
    let want = sorted(
        bids(&events)
            .filter(|b| b.auction % 123 == 0)
            .map(|b| (b.auction as u64, b.price as u64))
            .collect(),
    );
    assert!(!want.is_empty());
    assert_eq!(got, want);
}

fn q3_reference(events: &[Event]) -> Vec<(String, String, String, u64)> {
    let persons: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Person(p) if ["OR", "ID", "CA"].contains(&p.state.to_uppercase().as_str()) => {
                Some(p)
            }
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for e in events {
        if let Event::Auction(a) = e
            && a.category == 10
        {
            for p in persons.iter().filter(|p| p.id == a.seller) {
                out.push((p.name.clone(), p.city.clone(), p.state.clone(), a.id as u64));
            }
        }
    }
    sorted(out)
}

fn q3_rows(rows: &[Value]) -> Vec<(String, String, String, u64)> {
    sorted(
        rows.iter()
            .map(|v| {
                (
                    string(v, "name"),
                    string(v, "city"),
                    string(v, "state"),
                    int(v, "id"),
                )
            })
            .collect(),
    )
}

#[test]
fn q3_local_item_suggestion() {
    let dir = tempfile::tempdir().unwrap();
    let spec = bounded_example("q3", 100_000.0, dir.path());
    let got = run(&spec, dir.path(), "events=2,join=2");
    let want = q3_reference(&events(&spec, EVENTS));
    assert!(want.len() > 10, "{}", want.len());
    assert_eq!(q3_rows(&got), want);
}

fn q5_reference(events: &[Event], w: WindowSpec) -> Vec<(u64, u64, u64, u64)> {
    let mut counts: BTreeMap<(u64, u64), BTreeMap<u64, u64>> = BTreeMap::new();
    for b in bids(events) {
        for win in windows(w, b.date_time) {
            *counts
                .entry(win)
                .or_default()
                .entry(b.auction as u64)
                .or_default() += 1;
        }
    }
    let mut out = Vec::new();
    for ((start, end), per_auction) in counts {
        let max = per_auction.values().copied().max().unwrap();
        for (a, c) in per_auction {
            if c == max {
                out.push((a, c, start, end));
            }
        }
    }
    sorted(out)
}

fn window_rows(rows: &[Value], key: &str) -> Vec<(u64, u64, u64, u64)> {
    sorted(
        rows.iter()
            .map(|v| {
                (
                    int(v, key),
                    int(v, "count"),
                    int(v, "windowStart"),
                    int(v, "windowEnd"),
                )
            })
            .collect(),
    )
}

#[test]
fn q5_hot_items() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = bounded_example("q5", 100_000.0, dir.path());
    // Shorter windows than the example's 10 s / 2 s so that 3 s of events span many.
    set_window(
        &mut spec,
        "counts",
        WindowSpec::Sliding {
            size_ms: 1000,
            slide_ms: 250,
        },
    );
    let got = run(&spec, dir.path(), "events=2,counts=2,hot=2");
    let want = q5_reference(&events(&spec, EVENTS), window_of(&spec, "counts"));
    assert!(want.len() >= 12, "{want:?}");
    assert_eq!(window_rows(&got, "auction"), want);
}

fn q8_reference(events: &[Event], size: u64) -> Vec<(u64, String, u64, u64)> {
    let mut sellers: BTreeSet<(u64, u64)> = BTreeSet::new();
    for e in events {
        if let Event::Auction(a) = e {
            sellers.insert((a.date_time / size, a.seller as u64));
        }
    }
    let mut out = BTreeSet::new();
    for e in events {
        if let Event::Person(p) = e {
            let w = p.date_time / size;
            if sellers.contains(&(w, p.id as u64)) {
                out.insert((p.id as u64, p.name.clone(), w * size, w * size + size));
            }
        }
    }
    out.into_iter().collect()
}

#[test]
fn q8_monitor_new_users() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = bounded_example("q8", 100_000.0, dir.path());
    set_window(&mut spec, "join", WindowSpec::Tumbling { size_ms: 500 });
    let got = run(&spec, dir.path(), "events=2,join=2");
    let got = sorted(
        got.iter()
            .map(|v| {
                (
                    int(v, "id"),
                    string(v, "name"),
                    int(v, "windowStart"),
                    int(v, "windowEnd"),
                )
            })
            .collect::<Vec<_>>(),
    );
    let want = q8_reference(&events(&spec, EVENTS), 500);
    assert!(want.len() > 10, "{want:?}");
    assert_eq!(got, want);
}

fn q11_reference(events: &[Event], gap: u64) -> Vec<(u64, u64, u64, u64)> {
    let mut per_bidder: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for b in bids(events) {
        per_bidder
            .entry(b.bidder as u64)
            .or_default()
            .push(b.date_time);
    }
    let mut out = Vec::new();
    for (bidder, mut ts) in per_bidder {
        ts.sort_unstable();
        let (mut start, mut last, mut count) = (ts[0], ts[0], 0);
        for t in ts {
            if t >= last + gap {
                out.push((bidder, count, start, last + gap));
                start = t;
                count = 0;
            }
            last = t;
            count += 1;
        }
        out.push((bidder, count, start, last + gap));
    }
    sorted(out)
}

#[test]
fn q11_user_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = bounded_example("q11", 100_000.0, dir.path());
    set_window(&mut spec, "sessions", WindowSpec::Session { gap_ms: 100 });
    let got = run(&spec, dir.path(), "events=2,sessions=2");
    let want = q11_reference(&events(&spec, EVENTS), 100);
    assert!(
        want.iter().any(|s| s.1 > 1) && want.len() > 100,
        "{}",
        want.len()
    );
    assert_same(&window_rows(&got, "bidder"), &want);
}

/// Asserts equal row multisets, naming the rows only one side has.
fn assert_same<T: Ord + Clone + std::fmt::Debug>(got: &[T], want: &[T]) {
    if got != want {
        let g: BTreeSet<T> = got.iter().cloned().collect();
        let w: BTreeSet<T> = want.iter().cloned().collect();
        panic!(
            "{} rows, {} expected; only in the engine's: {:?}; only in the reference: {:?}",
            got.len(),
            want.len(),
            g.difference(&w).take(10).collect::<Vec<_>>(),
            w.difference(&g).take(10).collect::<Vec<_>>()
        );
    }
}

/// Q5's window state and Q3's join state survive a stop-with-savepoint mid-stream and a
/// restore at another parallelism: the output across both runs is exactly the reference.
#[test]
fn window_and_join_state_survive_rescaling() {
    for (query, first, second) in [
        ("q5", "events=1,counts=1,hot=1", "events=2,counts=3,hot=2"),
        ("q3", "events=2,join=3", "events=1,join=2"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = bounded_example(query, 6_000.0, dir.path());
        if query == "q5" {
            set_window(
                &mut spec,
                "counts",
                WindowSpec::Sliding {
                    size_ms: 1000,
                    slide_ms: 250,
                },
            );
        }
        let job = dir.path().join("job.yaml");
        std::fs::write(&job, spec.to_yaml()).unwrap();
        let sp = dir.path().join("sp");
        let mut engine = EngineProcess::start(&job, &sp, &["--parallelism", first]);
        std::thread::sleep(Duration::from_millis(2000));
        // Mid-stream means after some events (a loaded machine can delay them past the pause).
        engine.wait_source_records_above(0);
        let (savepoint, view) = engine.stop_with_savepoint(false);
        // Records the source emitted, each once.
        let sent = view["sourceRecords"].as_u64().unwrap();
        assert!(sent > 0 && sent < EVENTS, "stop was not mid-stream: {view}");
        let restored = EngineProcess::start(
            &job,
            &sp,
            &[
                "--parallelism",
                second,
                "--restore",
                savepoint.to_str().unwrap(),
            ],
        );
        restored.wait_state("finished", Duration::from_secs(120));
        let rows = read_rows(&sink_file(&spec));
        let events = events(&spec, EVENTS);
        if query == "q5" {
            let want = q5_reference(&events, window_of(&spec, "counts"));
            assert_eq!(window_rows(&rows, "auction"), want, "q5 across a rescale");
        } else {
            assert_eq!(q3_rows(&rows), q3_reference(&events), "q3 across a rescale");
        }
    }
}

/// Out-of-order events: with a watermark bound covering the generator's disorder no record
/// is late and Q11 matches the reference; with no bound, late bids are dropped and counted.
#[test]
fn late_records_are_dropped_and_counted() {
    for (bound, expect_late) in [(250, false), (0, true)] {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = bounded_example("q11", 100_000.0, dir.path());
        set_window(&mut spec, "sessions", WindowSpec::Session { gap_ms: 100 });
        for op in &mut spec.operators {
            if let OperatorKind::Source {
                nexmark: Some(n), ..
            } = &mut op.kind
            {
                // Groups of 2000 events (200 ms of event time, more than the 100 ms session
                // gap) come in a shuffled order.
                n.out_of_order_group_size = 2000;
                n.max_out_of_orderness_ms = bound;
            }
        }
        let job = dir.path().join("job.yaml");
        std::fs::write(&job, spec.to_yaml()).unwrap();
        let engine = EngineProcess::start(
            &job,
            &dir.path().join("sp"),
            &["--parallelism", "events=2,sessions=2"],
        );
        engine.wait_state("finished", Duration::from_secs(120));
        let late: f64 = engine
            .metrics()
            .lines()
            .filter(|l| l.starts_with("streamscale_late_records_dropped_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        let rows = window_rows(&read_rows(&sink_file(&spec)), "bidder");
        let want = q11_reference(&events(&spec, EVENTS), 100);
        if expect_late {
            assert!(late > 0.0, "no late record counted without a bound");
            let got: u64 = rows.iter().map(|r| r.1).sum();
            let all: u64 = want.iter().map(|r| r.1).sum();
            assert_eq!(
                got + late as u64,
                all,
                "every bid is either counted or dropped as late"
            );
        } else {
            assert_eq!(late, 0.0);
            assert_eq!(rows, want);
        }
    }
}
