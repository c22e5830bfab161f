//! The estimator's unit tests.

use super::*;
use crate::model::testutil::{Synth, job, window};

const CHAIN: &str = r"
name: chain
operators:
  - { name: src, kind: source, rate: { constant: 100 } }
  - { name: map, kind: map, parallelism: 2 }
  - { name: sink, kind: sink }
edges:
  - { from: src, to: map }
  - { from: map, to: sink }
";

fn ops() -> Vec<Synth> {
    vec![
        Synth::source("src", 1, 100.0, 0.0),
        Synth::op("map", 2, 100.0, 62.5, 0.5),
        Synth::op("sink", 1, 50.0, 250.0, 0.0),
    ]
}

#[test]
fn valid_is_finite_and_not_negative() {
    for x in [0.0, -0.0, 1.0, f64::MAX, f64::MIN_POSITIVE, 5e-324] {
        assert!(valid(x), "{x}");
    }
    for x in [
        -1.0,
        -5e-324,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
    ] {
        assert!(!valid(x), "{x}");
    }
}

#[test]
fn key_group_shares_are_read_conservatively_per_group() {
    let spec = job(CHAIN);
    let mut w = window(&ops(), &[10.0, 20.0]);
    // map: 100 rec/s over 2 subtasks, 500 records each in the 10 s window. Subtask 1 lists
    // three key groups; subtask 0 lists none.
    let last = w.last_mut().expect("rows");
    let map = last.operators.get_mut("map").expect("map");
    map[1].key_group_shares = vec![(117, 0.5), (70, 0.002), (64, 0.3)];
    let est = estimate(&spec, &w).expect("estimates");
    let got = &est.operators["map"].subtask_key_group_shares;
    assert_eq!(got.len(), 2);
    assert!(got[0].is_empty());
    // 250 records less 2·√250, over 500; 150 less 2·√150; 1 record less 2 is 0: dropped.
    let want = [
        (117, (250.0 - 2.0 * 250f64.sqrt()) / 500.0),
        (64, (150.0 - 2.0 * 150f64.sqrt()) / 500.0),
    ];
    assert_eq!(got[1].len(), 2, "{got:?}");
    for (g, w) in got[1].iter().zip(want) {
        assert_eq!(g.0, w.0);
        assert!((g.1 - w.1).abs() < 1e-12, "{got:?}");
    }
    // No subtask lists any: empty, and nothing else changes.
    assert!(est.operators["sink"].subtask_key_group_shares.is_empty());
    let plain = estimate(&spec, &window(&ops(), &[10.0, 20.0])).expect("estimates");
    assert!(plain.operators["map"].subtask_key_group_shares.is_empty());
}

#[test]
fn point_shares_and_saturation_per_subtask() {
    let spec = job(CHAIN);
    let mut w = window(&ops(), &[10.0, 20.0]);
    // map: 500 records per subtask in the 10 s window, busy 8 s each (μ 62.5); subtask 1
    // also blocked on its output for 1.5 s and lists two groups.
    let last = w.last_mut().expect("rows");
    let map = last.operators.get_mut("map").expect("map");
    map[1].backpressured_seconds += 1.5;
    map[1].key_group_shares = vec![(117, 0.5), (70, 0.002), (64, f64::NAN)];
    let est = estimate(&spec, &w).expect("estimates");
    let m = &est.operators["map"];
    // As reported (a share that is not a number dropped), not lowered by 2·√(h·n).
    assert_eq!(
        m.subtask_key_group_point_shares,
        vec![vec![], vec![(117, 0.5), (70, 0.002)]]
    );
    assert_eq!(m.subtask_key_group_shares[1].len(), 1);
    let sat = &m.subtask_saturation;
    assert!(
        (sat[0] - 0.8).abs() < 1e-9 && (sat[1] - 0.95).abs() < 1e-9,
        "{sat:?}"
    );
    // Without lists: none either way.
    let plain = estimate(&spec, &window(&ops(), &[10.0, 20.0])).expect("estimates");
    assert!(
        plain.operators["map"]
            .subtask_key_group_point_shares
            .is_empty()
    );
}

#[test]
fn rates_from_synthetic_counters() {
    let spec = job(CHAIN);
    let mut w = window(&ops(), &[10.0, 13.0, 20.0]);
    // Operators the job does not have are ignored, wherever they sort.
    for s in &mut w {
        for extra in ["aaa", "mapx", "zzz"] {
            s.operators
                .insert(extra.into(), vec![SubtaskSample::default()]);
        }
    }
    let est = estimate(&spec, &w).expect("estimates");
    assert_eq!(est.operators.len(), 3);
    assert_eq!(est.elapsed_seconds, 10.0);
    let map = &est.operators["map"];
    assert_eq!(map.parallelism, 2);
    assert!((map.input_rate - 100.0).abs() < 1e-9);
    assert!((map.output_rate - 50.0).abs() < 1e-9);
    assert!((map.true_processing_rate.expect("known") - 62.5).abs() < 1e-9);
    assert!((map.selectivity - 0.5).abs() < 1e-12);
    // busy 100/62.5 = 1.6 s per second over 2 subtasks = 0.8.
    assert!((map.utilization - 0.8).abs() < 1e-9);
    let src = est.operators["src"].source.expect("source");
    assert!((src.arrival_rate - 100.0).abs() < 1e-9);
    assert_eq!(est.operators["src"].selectivity, 1.0);
}

#[test]
fn a_rise_counts_at_once_a_fall_only_over_the_window() {
    let spec = job(CHAIN);
    // γ = 100 rec/s for 8 s, then 400 rec/s in the last 1 s interval.
    let mut w = window(&ops(), &[0.0, 4.0, 8.0, 9.0]);
    let arrivals = |t: f64| {
        if t <= 8.0 {
            100.0 * t
        } else {
            800.0 + 400.0 * (t - 8.0)
        }
    };
    for s in &mut w {
        let a = arrivals(s.at_seconds);
        s.operators.get_mut("src").expect("src")[0].source_arrivals = Some(a);
    }
    let src = estimate(&spec, &w).expect("estimates").operators["src"]
        .source
        .expect("source");
    assert!((src.window_arrival_rate - 1200.0 / 9.0).abs() < 1e-9);
    assert!((src.recent_arrival_rate - 400.0).abs() < 1e-9);
    assert!((src.arrival_rate - 400.0).abs() < 1e-9);
    // A fall in the last interval does not lower γ below the window average.
    let fall = |t: f64| {
        if t <= 8.0 {
            100.0 * t
        } else {
            800.0 + 10.0 * (t - 8.0)
        }
    };
    for s in &mut w {
        let a = fall(s.at_seconds);
        s.operators.get_mut("src").expect("src")[0].source_arrivals = Some(a);
    }
    let src = estimate(&spec, &w).expect("estimates").operators["src"]
        .source
        .expect("source");
    assert!((src.recent_arrival_rate - 10.0).abs() < 1e-9);
    assert!((src.arrival_rate - 810.0 / 9.0).abs() < 1e-9);
}

#[test]
fn window_errors() {
    let spec = job(CHAIN);
    let w = window(&ops(), &[0.0, 5.0, 10.0]);
    assert_eq!(
        estimate(&spec, &w[..1]),
        Err(ModelError::TooFewSamples { got: 1 })
    );
    let same = window(&ops(), &[5.0, 5.0]);
    assert!(matches!(
        estimate(&spec, &same),
        Err(ModelError::ZeroElapsed { .. })
    ));

    let mut missing = w.clone();
    missing[1].operators.remove("sink");
    assert_eq!(
        estimate(&spec, &missing),
        Err(ModelError::MissingOperator {
            operator: "sink".into(),
            sample: 1
        })
    );

    let mut rescaled = w.clone();
    let extra = rescaled[2].operators["map"][0].clone();
    rescaled[2]
        .operators
        .get_mut("map")
        .expect("map")
        .push(extra);
    assert!(matches!(
        estimate(&spec, &rescaled),
        Err(ModelError::ParallelismChanged { ref operator, first: 2, other: 3, sample: 2 }) if operator == "map"
    ));

    // A reset in the middle sample is caught even though last > first.
    let mut reset = w.clone();
    reset[1].operators.get_mut("map").expect("map")[1].busy_seconds = 0.0;
    reset[0].operators.get_mut("map").expect("map")[1].busy_seconds = 0.5;
    assert!(matches!(
        estimate(&spec, &reset),
        Err(ModelError::CounterReset {
            counter: "busy_seconds",
            subtask: 1,
            sample: 1,
            ..
        })
    ));

    let mut no_backlog = w.clone();
    no_backlog[2].operators.get_mut("src").expect("src")[0].source_backlog = None;
    assert!(matches!(
        estimate(&spec, &no_backlog),
        Err(ModelError::SourceWithoutBacklog {
            missing: "source_backlog",
            sample: 2,
            ..
        })
    ));

    let mut nan = w.clone();
    nan[1].operators.get_mut("sink").expect("sink")[0].records_in = f64::NAN;
    assert!(matches!(
        estimate(&spec, &nan),
        Err(ModelError::InvalidValue {
            field: "records_in",
            ..
        })
    ));
}

#[test]
fn output_without_input_does_not_inflate_selectivity() {
    let spec = job(CHAIN);
    // map takes 100 rec/s and emits half of it while input flows (t = 0..10); then its
    // input stops and a window flush emits 300 records (t = 10..15).
    let mut w = window(&ops(), &[0.0, 5.0, 10.0, 15.0]);
    let m10 = w[2].operators["map"].clone();
    let last = w[3].operators.get_mut("map").expect("map");
    for (sub, before) in last.iter_mut().zip(&m10) {
        sub.records_in = before.records_in;
        sub.busy_seconds = before.busy_seconds;
        sub.records_out = before.records_out + 150.0;
    }
    let map = &estimate(&spec, &w).expect("estimates").operators["map"];
    assert!((map.selectivity - 0.5).abs() < 1e-12, "{}", map.selectivity);
    // The output rate still counts every record emitted: (500 + 300) / 15.
    assert!((map.output_rate - 800.0 / 15.0).abs() < 1e-9);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 200,
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// Rates are counter deltas over the measured elapsed time: any scrape times (irregular
    /// intervals, jitter) give the same rates for counters growing at constant rates.
    #[test]
    fn irregular_scrapes_do_not_bias_rates(
        start in 0.0f64..1e4,
        gaps in proptest::collection::vec(0.01f64..60.0, 1..8),
        gamma in 1.0f64..1e5,
    ) {
        let spec = job(CHAIN);
        let mut times = vec![start];
        for g in gaps {
            let t = times[times.len() - 1] + g;
            times.push(t);
        }
        let o = vec![
            Synth::source("src", 1, gamma, 0.0),
            Synth::op("map", 2, gamma, 3.0 * gamma, 0.5),
            Synth::op("sink", 1, gamma / 2.0, 1e6, 0.0),
        ];
        let est = estimate(&spec, &window(&o, &times)).expect("estimates");
        let map = &est.operators["map"];
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
        proptest::prop_assert!(close(map.input_rate, gamma), "{} vs {}", map.input_rate, gamma);
        proptest::prop_assert!(close(map.true_processing_rate.expect("μ"), 3.0 * gamma));
        proptest::prop_assert!(close(map.selectivity, 0.5));
        let src = est.operators["src"].source.expect("source");
        proptest::prop_assert!(close(src.window_arrival_rate, gamma));
    }

    /// Reading the sources' arrivals through a scale gives the estimate (or the error) of
    /// the window `scale_arrivals` returns, bit for bit: two sources of 1–3 subtasks, some
    /// arrivals missing, reset, NaN or infinite, subtasks added in later samples.
    #[test]
    fn scaled_arrivals_read_in_place_equal_the_scaled_copy(
        factor in proptest::prop_oneof![0.5f64..3.0, proptest::strategy::Just(1.0), proptest::strategy::Just(0.0)],
        subs in proptest::collection::vec(1usize..4, 2),
        extra in proptest::collection::vec(proptest::bool::weighted(0.1), 8),
        edits in proptest::collection::vec((0usize..4, 0usize..2, 0usize..3, 0u8..6), 0..3),
        rates in proptest::collection::vec(1.0f64..1e4, 2),
    ) {
        let spec = job(TWO_SOURCES);
        let o = vec![
            Synth::source("a", subs[0] as u32, rates[0], 3.0),
            Synth::source("b", subs[1] as u32, rates[1], 0.0),
            Synth::op("m", 1, rates[0] + rates[1], 1e5, 1.0),
        ];
        let mut w = window(&o, &[0.0, 5.0, 10.0, 15.0]);
        for (k, s) in w.iter_mut().enumerate().skip(1) {
            for (j, name) in ["a", "b"].into_iter().enumerate() {
                if extra[2 * (k - 1) + j] {
                    let row = s.operators.get_mut(name).expect("source");
                    let mut sub = row[0].clone();
                    sub.source_arrivals = sub.source_arrivals.map(|a| a * 0.5);
                    row.push(sub);
                }
            }
        }
        for (k, op, sub, how) in edits {
            let row = w[k].operators.get_mut(["a", "b"][op]).expect("source");
            let n = row.len();
            let a = &mut row[sub % n].source_arrivals;
            *a = match how {
                0 => None,
                1 => a.map(|x| x * 0.25),
                2 => Some(f64::NAN),
                3 => Some(f64::INFINITY),
                4 => a.map(|x| x + 7.0),
                _ => Some(-1.0),
            };
        }
        let topo = Topology::from_spec(&spec).expect("a DAG");
        let copy = crate::model::forecast::scale_arrivals(&w, &spec, factor);
        let in_place = format!("{:?}", estimate_indexed(&topo, &w, Some(factor)));
        let reference = format!("{:?}", estimate_indexed(&topo, &copy, None));
        proptest::prop_assert_eq!(in_place, reference);
    }
}

/// A random operator window for [`plain_window`]: `p` subtasks over `s` samples with
/// counters from random increments (zero increments included, so that intervals without
/// input occur), then `edits` applied: (sample, subtask, field, kind) with kind 0 NaN,
/// 1 +∞, 2 −1, 3 a reset to 0, 4 −0.0, 5 a row removed, 6 a subtask added.
fn random_rows(
    p: usize,
    incs: &[(f64, f64, f64, f64, f64, f64)],
    edits: &[(usize, usize, usize, u8)],
) -> Vec<Option<Vec<SubtaskSample>>> {
    let s = incs.len() / p;
    let mut acc = vec![SubtaskSample::default(); p];
    let mut rows: Vec<Option<Vec<SubtaskSample>>> = (0..s)
        .map(|k| {
            for (j, a) in acc.iter_mut().enumerate() {
                let (i, o, b, d, bp, q) = incs[k * p + j];
                a.records_in += i;
                a.records_out += o;
                a.busy_seconds += b;
                a.idle_seconds += d;
                a.backpressured_seconds += bp;
                a.queue_length = q;
            }
            Some(acc.clone())
        })
        .collect();
    for &(k, j, f, kind) in edits {
        let k = k % s;
        let Some(row) = rows[k].as_mut() else {
            continue;
        };
        match kind {
            5 => {
                rows[k] = None;
                continue;
            }
            6 => {
                row.push(SubtaskSample::default());
                continue;
            }
            _ => {}
        }
        let sub = &mut row[j % p];
        let x = match f % 6 {
            0 => &mut sub.records_in,
            1 => &mut sub.records_out,
            2 => &mut sub.busy_seconds,
            3 => &mut sub.idle_seconds,
            4 => &mut sub.backpressured_seconds,
            _ => &mut sub.queue_length,
        };
        *x = match kind {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => -1.0,
            3 => 0.0,
            _ => -0.0,
        };
    }
    rows
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 500,
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// The one-pass window of a non-source operator applies exactly when the checks pass,
    /// and is then the checked one, bit for bit (else the checks name the problem).
    #[test]
    fn the_plain_window_is_the_checked_window(
        p in 1usize..5,
        s in 2usize..7,
        incs in proptest::collection::vec(
            (
                proptest::prop_oneof![proptest::strategy::Just(0.0), 0.0f64..1e4],
                proptest::prop_oneof![proptest::strategy::Just(0.0), 0.0f64..1e4],
                0.0f64..10.0,
                0.0f64..10.0,
                proptest::prop_oneof![proptest::strategy::Just(0.0), 0.0f64..10.0],
                proptest::prop_oneof![proptest::strategy::Just(-0.0), 0.0f64..100.0],
            ),
            24,
        ),
        edits in proptest::collection::vec((0usize..6, 0usize..4, 0usize..6, 0u8..7), 0..3),
    ) {
        let rows = random_rows(p, &incs[..p * s], &edits);
        let rows: Vec<Option<&[SubtaskSample]>> = rows.iter().map(|r| r.as_deref()).collect();
        let plain = plain_window(&rows);
        let checked = checked_window("op", false, &rows, None);
        match (plain, checked) {
            (Some((f1, l1, o1)), Ok((f2, l2, o2))) => {
                proptest::prop_assert!(std::ptr::eq(f1, f2) && std::ptr::eq(l1, l2));
                proptest::prop_assert_eq!(o1.to_bits(), o2.to_bits());
            }
            (None, Err(_)) => {}
            (None, Ok(_)) => proptest::prop_assert!(false, "checked but not plain"),
            (Some(_), Err(e)) => proptest::prop_assert!(false, "plain but {e}"),
        }
    }
}

const TWO_SOURCES: &str = r"
name: two
operators:
  - { name: a, kind: source, rate: { constant: 1 } }
  - { name: b, kind: source, rate: { constant: 1 } }
  - { name: m, kind: map }
edges:
  - { from: a, to: m }
  - { from: b, to: m }
";

#[test]
fn unknown_rate_and_prior_selectivity() {
    let spec = job(CHAIN);
    let mut o = ops();
    o[1].mu = None; // input but no busy time
    o[2].input_rate = 0.0; // no input at all
    let est = estimate(&spec, &window(&o, &[0.0, 10.0])).expect("estimates");
    let map = &est.operators["map"];
    assert_eq!(map.true_processing_rate, None);
    assert!(!map.selectivity_is_prior);
    let sink = &est.operators["sink"];
    assert_eq!(sink.true_processing_rate, None);
    assert!(sink.selectivity_is_prior);
    assert_eq!(sink.selectivity, 1.0);
}
