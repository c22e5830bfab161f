//! Failure cases of issue 22 owned by the planner: a tumbling window's bursts (1), selectivity
//! from a trickle (4), upstream of a capped bottleneck (6) and sub-linear scaling (7). Each
//! test failed on the planner before its fix (the commit messages quote what it printed).

use std::collections::BTreeMap;

use crate::model::autoscaler::{Autoscaler, Verdict};
use crate::model::guards::GuardSettings;
use crate::model::planner::{Decision, PlannerSettings, plan};
use crate::model::sample::{MetricSample, SubtaskSample};
use crate::model::testutil::{Synth, job, window};

/// Scrape times of the windows below: 20 s at 5 s intervals.
const TIMES: [f64; 5] = [0.0, 5.0, 10.0, 15.0, 20.0];

/// One operator's cumulative counters at time t: (records in, records out, busy seconds),
/// spread evenly over its subtasks.
type Counters = Box<dyn Fn(f64) -> (f64, f64, f64)>;

/// A window at [`TIMES`]: sources (name, p, γ, backlog) and operators (name, p, counters).
fn sampled(sources: &[(&str, u32, f64, f64)], ops: &[(&str, u32, Counters)]) -> Vec<MetricSample> {
    TIMES
        .iter()
        .map(|&t| {
            let mut operators = BTreeMap::new();
            for &(name, p, gamma, backlog) in sources {
                let pf = f64::from(p);
                let subs = (0..p)
                    .map(|_| SubtaskSample {
                        records_out: gamma * t / pf,
                        source_arrivals: Some(gamma * t / pf),
                        source_backlog: Some(backlog / pf),
                        ..SubtaskSample::default()
                    })
                    .collect();
                operators.insert(name.to_string(), subs);
            }
            for (name, p, f) in ops {
                let (rin, rout, busy) = f(t);
                let pf = f64::from(*p);
                let subs = (0..*p)
                    .map(|_| SubtaskSample {
                        records_in: rin / pf,
                        records_out: rout / pf,
                        busy_seconds: busy / pf,
                        idle_seconds: (t - busy / pf).max(0.0),
                        ..SubtaskSample::default()
                    })
                    .collect();
                operators.insert((*name).to_string(), subs);
            }
            MetricSample {
                at_seconds: t,
                operators,
            }
        })
        .collect()
}

/// src (γ = 1000 rec/s) → `win`, a tumbling window of 60 s (p = 2, μ = 5000 rec/s per
/// subtask) → `down` (map, p = 4) → sink.
const WINDOWED: &str = r"
name: windowed
operators:
  - { name: src, kind: source, rate: { constant: 1000 } }
  - { name: win, kind: window, sizeMs: 60000, parallelism: 2 }
  - { name: down, kind: map, parallelism: 4 }
  - { name: sink, kind: sink }
edges:
  - { from: src, to: win }
  - { from: win, to: down }
  - { from: down, to: sink }
";

/// [`WINDOWED`]'s window: `win` emits `burst` records between t = 10 and 15 s (none when 0),
/// `down` takes them at μ = 1000 rec/s; with `busy_down` it instead works off a queue from
/// an earlier firing at 200 rec/s, 100 % busy.
fn windowed(burst: f64, busy_down: bool) -> Vec<MetricSample> {
    let fired = move |t: f64| if t > 12.0 { burst } else { 0.0 };
    let ops: Vec<(&str, u32, Counters)> = vec![
        (
            "win",
            2,
            Box::new(move |t| (1000.0 * t, fired(t), 1000.0 * t / 5000.0)),
        ),
        (
            "down",
            4,
            Box::new(move |t| {
                if busy_down {
                    (200.0 * t, 200.0 * t, 4.0 * t)
                } else {
                    (fired(t), fired(t), fired(t) / 1000.0)
                }
            }),
        ),
        (
            "sink",
            1,
            Box::new(move |t| {
                let rin = if busy_down { 200.0 * t } else { fired(t) };
                (rin, 0.0, rin / 100_000.0)
            }),
        ),
    ];
    sampled(&[("src", 1, 1000.0, 0.0)], &ops)
}

/// Case 1: a window that did not fire in a metric window shorter than its period says
/// nothing about its output rate; its downstream is not planned from that silence.
#[test]
fn a_window_of_silence_does_not_scale_the_downstream_down() {
    let spec = job(WINDOWED);
    let d = plan(&spec, &windowed(0.0, false), &PlannerSettings::default()).expect("plans");
    assert_eq!(d.parallelism["down"], 4, "{:?}", d.operators["down"].reason);
    assert!(
        d.operators["down"]
            .reason
            .contains("not planned from a window of silence"),
        "{:?}",
        d.operators["down"].reason
    );
    // `down` 100 % busy on the last firing's records while the window is silent: kept too.
    let d = plan(&spec, &windowed(0.0, true), &PlannerSettings::default()).expect("plans");
    assert_eq!(d.parallelism["down"], 4, "{:?}", d.operators["down"].reason);
}

/// Case 1: one firing in a 20 s metric window is one period's output (60 s), not 20 s's.
#[test]
fn a_window_burst_is_sized_over_its_period() {
    let spec = job(WINDOWED);
    // Selectivity 0.01: 60 000 records in per period, 600 out at each firing.
    let d = plan(&spec, &windowed(600.0, false), &PlannerSettings::default()).expect("plans");
    let down = &d.operators["down"];
    assert!(
        (down.steady_arrival_rate - 10.0).abs() < 1e-9,
        "{} {:?}",
        down.steady_arrival_rate,
        d.reasons
    );
    assert!(
        d.reasons
            .iter()
            .any(|r| r.starts_with("win: window bursts read over its 60 s period")),
        "{:?}",
        d.reasons
    );
}

/// src → `tick` (a map that gets a trickle of input and emits a burst: selectivity 500
/// from 2 records) → `down` (p = 2, μ = 50 rec/s per subtask) → sink.
const TRICKLE: &str = r"
name: trickle
operators:
  - { name: src, kind: source, rate: { constant: 1 } }
  - { name: tick, kind: map }
  - { name: down, kind: map, parallelism: 2 }
  - { name: sink, kind: sink }
edges:
  - { from: src, to: tick }
  - { from: tick, to: down }
  - { from: down, to: sink }
";

/// Case 4: selectivity 500 from 2 input records must not size the downstream. The source's
/// backlog of 9 records raises its target to 0.1 + 9/30 = 0.4 rec/s; read through the
/// selectivity that asked 500 · 0.4 = 200 rec/s of `down`: ⌈200 / 35⌉ = 6 subtasks. Its
/// measured 50 rec/s need ⌈50 / 35⌉ = 2.
#[test]
fn selectivity_from_a_trickle_does_not_drive_the_downstream() {
    let spec = job(TRICKLE);
    let w = window(
        &[
            Synth::source("src", 1, 0.1, 9.0),
            Synth::op("tick", 1, 0.1, 10.0, 500.0),
            Synth::op("down", 2, 50.0, 50.0, 1.0),
            Synth::op("sink", 1, 50.0, 100_000.0, 0.0),
        ],
        &TIMES,
    );
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    assert_eq!(d.parallelism["down"], 2, "{:?}", d.operators["down"].reason);
    assert!(
        d.reasons
            .iter()
            .any(|r| r.starts_with("tick: selectivity from 2 input records")),
        "{:?}",
        d.reasons
    );
}

/// src → `up` (p = 2) → `capped` (p = 2, at its max 2) → sink; both μ = 100 rec/s per
/// subtask, both saturated at the 200 rec/s `capped` lets through while γ = 600 and the
/// backlog grows.
const CAPPED: &str = r"
name: capped
operators:
  - { name: src, kind: source, rate: { constant: 600 } }
  - { name: up, kind: map, parallelism: 2 }
  - { name: capped, kind: map, parallelism: 2, scaling: { max: 2 } }
  - { name: sink, kind: sink }
edges:
  - { from: src, to: up }
  - { from: up, to: capped }
  - { from: capped, to: sink }
";

/// Case 6 (FLINK-31215): the target 600 + 3000/30 = 700 rec/s asked ⌈700/70⌉ = 10 subtasks
/// of `up`, but `capped` takes at most 2 × 100 = 200 rec/s: `up` needs ⌈200/70⌉ = 3.
#[test]
fn nothing_upstream_of_a_capped_bottleneck_is_sized_beyond_it() {
    let spec = job(CAPPED);
    let w = window(
        &[
            Synth::source("src", 1, 600.0, 3000.0),
            Synth::op("up", 2, 200.0, 100.0, 1.0),
            Synth::op("capped", 2, 200.0, 100.0, 1.0),
            Synth::op("sink", 1, 200.0, 100_000.0, 0.0),
        ],
        &TIMES,
    );
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    assert_eq!(d.parallelism["capped"], 2);
    assert_eq!(d.parallelism["up"], 3, "{:?}", d.operators["up"].reason);
    assert!(
        d.operators["up"]
            .reason
            .contains("upstream of a bottleneck"),
        "{:?}",
        d.operators["up"].reason
    );
}

/// src → map (p = 5) → sink.
const SHARED_CPU: &str = r"
name: shared
operators:
  - { name: src, kind: source, rate: { constant: 450 } }
  - { name: map, kind: map, parallelism: 5 }
  - { name: sink, kind: sink }
edges:
  - { from: src, to: map }
  - { from: map, to: sink }
";

/// `map` at `p` on a shared CPU whose capacity is 200 rec/s whatever the parallelism (μ per
/// subtask 200 / p), under γ = 450 with a growing backlog.
fn shared_cpu(p: u32) -> Vec<MetricSample> {
    window(
        &[
            Synth::source("src", 1, 450.0, 5000.0),
            Synth::op("map", p, 200.0, 200.0 / f64::from(p), 1.0),
            Synth::op("sink", 1, 200.0, 100_000.0, 0.0),
        ],
        &TIMES,
    )
}

fn rescaled_to(v: &Verdict) -> Option<u32> {
    match v {
        Verdict::Rescale(d) => Some(d.parallelism["map"]),
        Verdict::Hold { .. } => None,
    }
}

fn planned(v: &Verdict) -> &Decision {
    match v {
        Verdict::Rescale(d) => d,
        Verdict::Hold {
            recommendation: Some(d),
            ..
        } => d,
        Verdict::Hold { .. } => panic!("no plan: {v:?}"),
    }
}

/// Case 7: capacity that stops growing. The first step follows DS2 (nothing learned yet:
/// 5 → ⌈(450 + 5000/30) / (0.7 · 40)⌉ = 23); at 23 the capacity is the same 200 rec/s, so the
/// operator goes back to 5, the smallest parallelism measured to give it, and stays there.
#[test]
fn sub_linear_scaling_scales_back_to_the_smallest_parallelism_with_the_capacity() {
    let spec = job(SHARED_CPU);
    let mut a = Autoscaler::new(GuardSettings {
        scale_down_delay_seconds: 0.0,
        ..GuardSettings::default()
    });
    let v = a.decide(20.0, &shared_cpu(5), &spec);
    let first = rescaled_to(&v).expect("scales up");
    assert!(first > 5, "{v:?}");
    let v = a.decide(40.0, &shared_cpu(first), &spec);
    assert!(a.scalability().is_ineffective("map"), "{v:?}");
    assert_eq!(rescaled_to(&v), Some(5), "{v:?}");
    assert!(
        planned(&v).operators["map"]
            .reason
            .contains("p=5 gave the same capacity"),
        "{:?}",
        planned(&v).operators["map"].reason
    );
    // Back at 5 at the same capacity: flagged still, held, not scaled up again.
    let v = a.decide(60.0, &shared_cpu(5), &spec);
    assert!(a.scalability().is_ineffective("map"), "{v:?}");
    assert_eq!(rescaled_to(&v), None, "{v:?}");
    assert_eq!(planned(&v).parallelism["map"], 5);
}

/// Case 7: once a scale-up measured sub-linear scaling, the next one probes a step whose size
/// follows the factor (⌈p / (1 − f)⌉) instead of extrapolating DS2's linear sizing.
#[test]
fn a_sub_linear_operator_probes_in_bounded_steps() {
    let spec = job(SHARED_CPU);
    let mut a = Autoscaler::default();
    // p = 2 at μ 100, then p = 4 at μ 60 (capacity 240 vs 200: sub-linear, not ineffective).
    let at = |p: u32, mu: f64, gamma: f64| {
        window(
            &[
                Synth::source("src", 1, gamma, 0.0),
                Synth::op("map", p, gamma, mu, 1.0),
                Synth::op("sink", 1, gamma, 100_000.0, 0.0),
            ],
            &TIMES,
        )
    };
    a.decide(20.0, &at(2, 100.0, 100.0), &spec);
    let v = a.decide(40.0, &at(4, 60.0, 1000.0), &spec);
    // f = 0.5 · 1 + 0.5 · 0.6 = 0.8: at most ⌈4 / 0.2⌉ = 20, where DS2 with the factor asks
    // ⌈1000 / (0.7 · 48)⌉ = 30.
    let f = a.scalability().factor("map");
    assert!((f - 0.8).abs() < 1e-12, "{f}");
    assert!(!a.scalability().is_ineffective("map"));
    assert_eq!(rescaled_to(&v), Some(20), "{v:?}");
}
