//! The planner's unit tests.

use super::*;
use crate::model::estimate;
use crate::model::sample::{ServiceMoments, SubtaskSample};
use crate::model::testutil::{Synth, job, window};
use proptest::prelude::*;

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

fn sub(rin: f64, rout: f64, busy: f64, bp: f64) -> SubtaskSample {
    SubtaskSample {
        records_in: rin,
        records_out: rout,
        busy_seconds: busy,
        backpressured_seconds: bp,
        ..SubtaskSample::default()
    }
}

fn src(arrivals: f64, backlog: f64) -> SubtaskSample {
    SubtaskSample {
        source_arrivals: Some(arrivals),
        source_backlog: Some(backlog),
        ..SubtaskSample::default()
    }
}

/// Three scrapes at t = 100, 103 and 110 s (irregular; only first and last enter rates).
fn ds2_window() -> Vec<MetricSample> {
    let sample = |t: f64, ops: Vec<(&str, Vec<SubtaskSample>)>| MetricSample {
        at_seconds: t,
        operators: ops.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    };
    vec![
        sample(
            100.0,
            vec![
                ("src", vec![src(5000.0, 200.0)]),
                (
                    "map",
                    vec![
                        sub(1000.0, 500.0, 10.0, 1.0),
                        sub(2000.0, 1000.0, 20.0, 0.0),
                    ],
                ),
                ("sink", vec![sub(0.0, 0.0, 5.0, 0.0)]),
            ],
        ),
        sample(
            103.0,
            vec![
                ("src", vec![src(5300.0, 250.0)]),
                (
                    "map",
                    vec![
                        sub(1100.0, 550.0, 12.0, 1.5),
                        sub(2200.0, 1100.0, 22.0, 0.5),
                    ],
                ),
                ("sink", vec![sub(100.0, 0.0, 5.5, 0.0)]),
            ],
        ),
        sample(
            110.0,
            vec![
                ("src", vec![src(6000.0, 300.0)]),
                (
                    "map",
                    vec![
                        sub(1500.0, 750.0, 18.0, 2.0),
                        sub(2500.0, 1250.0, 28.0, 1.0),
                    ],
                ),
                ("sink", vec![sub(500.0, 0.0, 7.0, 0.0)]),
            ],
        ),
    ]
}

#[test]
fn ds2_chain_worked_by_hand() {
    let spec = job(CHAIN);
    let d = plan(&spec, &ds2_window(), &PlannerSettings::default()).expect("plans");
    // Δt = 110 − 100 = 10 s.
    // src: γ = (6000 − 5000)/10 = 100 rec/s; backlog 300 → target 100 + 300/30 = 110 rec/s.
    let s = &d.sources["src"];
    assert!((s.arrival_rate - 100.0).abs() < 1e-9);
    assert_eq!(s.backlog_records, 300.0);
    assert!((s.target_rate - 110.0).abs() < 1e-9);
    // map: Δin = 500 + 500 = 1000, Δout = 250 + 250 = 500, Δbusy = 8 + 8 = 16 s.
    // μ = 1000/16 = 62.5 rec/s per subtask; selectivity 500/1000 = 0.5;
    // measured utilization 16/(2·10) = 0.8; backpressured (1 + 1)/(2·10) = 0.1.
    let map = &d.operators["map"];
    assert!((map.true_processing_rate.expect("μ") - 62.5).abs() < 1e-9);
    assert!((map.selectivity - 0.5).abs() < 1e-12);
    assert!((map.observed_utilization - 0.8).abs() < 1e-12);
    assert!((map.backpressured_share - 0.1).abs() < 1e-12);
    assert!((map.observed_input_rate - 100.0).abs() < 1e-9);
    // Target λ_map = 110 → p = ⌈110 / (0.7 · 62.5)⌉ = ⌈2.514⌉ = 3; ρ = 110/(3·62.5) = 0.5867.
    assert!((map.arrival_rate - 110.0).abs() < 1e-9);
    assert_eq!(map.parallelism, 3);
    assert!((map.predicted_utilization.expect("ρ") - 110.0 / 187.5).abs() < 1e-12);
    // sink: Δin = 500, Δbusy = 2 s → μ = 250; λ_sink = 0.5 · 110 = 55 → ⌈55/175⌉ = 1.
    let sink = &d.operators["sink"];
    assert!((sink.true_processing_rate.expect("μ") - 250.0).abs() < 1e-9);
    assert!((sink.arrival_rate - 55.0).abs() < 1e-9);
    assert!((sink.steady_arrival_rate - 50.0).abs() < 1e-9);
    assert_eq!(sink.parallelism, 1);
    assert_eq!(
        d.parallelism,
        BTreeMap::from([("map".into(), 3), ("sink".into(), 1), ("src".into(), 1)])
    );
    assert_eq!(d.current["map"], 2);
    assert!(d.changed());
    // Latency at steady rates: map M/M/3 at λ=100, μ=62.5 (a=1.6): B3 = 0.14962,
    // C = 0.14962/(1 − 0.5333·0.85038) = 0.27380, W = 0.27380/87.5 + 0.016 = 0.019129 s;
    // sink M/M/1 at 50/250: W = 1/200 = 0.005 s. Total 0.024129 s ≤ 1 s.
    assert!((map.predicted_sojourn_seconds - 0.019129106).abs() < 1e-8);
    assert!((d.predicted_latency_seconds - 0.024129106).abs() < 1e-8);
    assert_eq!(d.critical_path, ["src", "map", "sink"]);
    // p99 bound along it: the 1% budget split over the 2 operators (ε' = 0.005). map M/M/3
    // at λ = 100, μ = 62.5: C = 0.27380, wait decay θ = 3·62.5 − 100 = 87.5; its sojourn
    // tail (1 − C)e^(−62.5t) + C(62.5e^(−87.5t) − 87.5e^(−62.5t))/(62.5 − 87.5) = ε' at
    // t = 0.0924588 s (solved numerically). sink M/M/1 at 50/250: the sojourn is
    // exponential at 200/s, ln(1/ε')/200 = 0.0264916 s.
    let expected = 0.092_458_757_6 + 200f64.ln() / 200.0;
    assert_eq!(d.latency_percentile, 0.99);
    assert!(
        (d.predicted_latency_percentile_seconds - expected).abs() < 1e-6,
        "{} vs {expected}",
        d.predicted_latency_percentile_seconds
    );
    assert!(d.predicted_latency_percentile_seconds > d.predicted_latency_seconds);
    // Bottleneck: map at ρ = 100/(2·62.5) = 0.8 (sink 50/250 = 0.2).
    let b = d.bottleneck.as_deref().expect("bottleneck");
    assert!(b.starts_with("map: ρ=0.80 at p=2, μ=62.50"), "{b}");
    assert!(d.slo_met());
}

/// CHAIN with `map` at p=2, μ = 200 rec/s per subtask, and the source at `gamma` rec/s
/// without backlog (so λ_target = γ), planned at `slo` seconds.
fn tolerance_plan(gamma: f64, slo: f64) -> Decision {
    let ops = [
        Synth::source("src", 1, gamma, 0.0),
        Synth::op("map", 2, gamma, 200.0, 1.0),
        Synth::op("sink", 1, gamma, 10_000.0, 0.0),
    ];
    let settings = PlannerSettings {
        latency_slo_seconds: Some(slo),
        ..PlannerSettings::default()
    };
    plan(&job(CHAIN), &window(&ops, &[0.0, 10.0]), &settings).expect("plans")
}

#[test]
fn inside_the_scale_up_tolerance_with_the_slo_met_holds() {
    // ρ at p=2: 300/(2·200) = 0.75 > ρ_target 0.7 but ≤ 0.7·1.1 = 0.77; DS2 alone would
    // ask ⌈300/(0.7·200)⌉ = ⌈2.14⌉ = 3.
    let d = tolerance_plan(300.0, 1.0);
    assert!(d.slo_met());
    assert_eq!(d.parallelism["map"], 2);
    assert!(!d.changed());
    let map = &d.operators["map"];
    assert!((map.predicted_utilization.expect("ρ") - 0.75).abs() < 1e-9);
    assert!(
        map.reason.contains("within the scale-up tolerance"),
        "{}",
        map.reason
    );
}

#[test]
fn above_the_scale_up_tolerance_scales_to_the_target() {
    // ρ at p=2: 316/400 = 0.79 > 0.77 → DS2 sizing ⌈316/140⌉ = 3 (ρ 0.527).
    let d = tolerance_plan(316.0, 1.0);
    assert_eq!(d.parallelism["map"], 3);
    assert!(!d.operators["map"].reason.contains("tolerance"));
}

#[test]
fn inside_the_scale_up_tolerance_with_the_slo_at_risk_scales() {
    // Same ρ 0.75 at p=2, but an SLO the p99 bound at p=2 misses: the latency allocation
    // adds subtasks to map (the only operator that can cut it much) despite the band.
    let loose = tolerance_plan(300.0, 1.0);
    let bound_at_2 = loose.predicted_latency_percentile_seconds;
    let d = tolerance_plan(300.0, 0.8 * bound_at_2);
    assert!(
        d.slo_met(),
        "{} > {}",
        d.predicted_latency_percentile_seconds,
        0.8 * bound_at_2
    );
    assert!(d.parallelism["map"] >= 3, "{:?}", d.parallelism);
    assert!(d.operators["map"].reason.contains("for the latency SLO"));
}

#[test]
fn no_input_scales_down_to_the_minimum() {
    // A pause in the stream: no records anywhere, so no busy time and no μ; DS2 needs
    // no capacity for λ = 0 and map goes from 4 to its minimum 1.
    let ops = [
        Synth::source("src", 1, 0.0, 0.0),
        Synth::op("map", 4, 0.0, 200.0, 1.0),
        Synth::op("sink", 1, 0.0, 10_000.0, 0.0),
    ];
    let d = plan(
        &job(CHAIN),
        &window(&ops, &[0.0, 10.0]),
        &PlannerSettings::default(),
    )
    .expect("plans");
    assert_eq!(d.operators["map"].true_processing_rate, None);
    assert_eq!(d.parallelism["map"], 1);
    assert!(d.operators["map"].reason.contains("no input"));
}

#[test]
fn the_job_files_latency_percentile_is_used_unless_overridden() {
    let mut spec = job(CHAIN);
    spec.autoscaler.latency_percentile = 0.9;
    let p99 = plan(&job(CHAIN), &ds2_window(), &PlannerSettings::default()).expect("plans");
    let p90 = plan(&spec, &ds2_window(), &PlannerSettings::default()).expect("plans");
    assert_eq!(p90.latency_percentile, 0.9);
    assert!(p90.predicted_latency_percentile_seconds < p99.predicted_latency_percentile_seconds);
    let settings = PlannerSettings {
        latency_percentile: Some(0.99),
        ..PlannerSettings::default()
    };
    let overridden = plan(&spec, &ds2_window(), &settings).expect("plans");
    assert_eq!(overridden.latency_percentile, 0.99);
}

#[test]
fn greedy_marginal_allocation_meets_a_tight_slo() {
    let spec = job(CHAIN);
    let settings = PlannerSettings {
        latency_slo_seconds: Some(0.108),
        ..PlannerSettings::default()
    };
    let d = plan(&spec, &ds2_window(), &settings).expect("plans");
    // The SLO is on the p99 bound: per operator its sojourn's ε'-quantile, ε' = 0.01/2
    // (two operators on the path; see `ds2_chain_worked_by_hand`).
    // Start (DS2): map 3 (0.092459), sink 1 (0.026492): 0.118950 > 0.108.
    // Step 1 gains: map 3→4: 0.092459 − 0.085777 = 0.006682; sink 1→2: 0.026492 − 0.021282
    //   = 0.005210 → map 4: 0.085777 + 0.026492 = 0.112268 > 0.108.
    // Step 2 gains: map 4→5: 0.085777 − 0.084945 = 0.000832; sink 0.005210 → sink 2:
    //   0.085777 + 0.021282 = 0.107059 ≤ 0.108, stop. (Map 5 instead would give 0.111436.)
    assert_eq!(d.parallelism["map"], 4);
    assert_eq!(d.parallelism["sink"], 2);
    assert!(
        (d.predicted_latency_percentile_seconds - 0.107_058_8).abs() < 1e-6,
        "{}",
        d.predicted_latency_percentile_seconds
    );
    assert!(d.slo_met());
    // The mean is far below the bound (and alone would have met the SLO at DS2's sizing).
    assert!(d.predicted_latency_seconds < 0.03);
    // No allocation with fewer subtasks meets the SLO (greedy is optimal here).
    let m = Model::new(&spec, &ds2_window(), &settings).expect("model");
    let (map, sink) = (m.graph.topo.index["map"], m.graph.topo.index["sink"]);
    for pm in 3..=8u32 {
        for ps in 1..=4u32 {
            if pm + ps < 6 {
                assert!(m.tail(map, pm) + m.tail(sink, ps) > 0.108, "{pm} {ps}");
            }
        }
    }
    assert!(
        d.reasons.iter().any(|r| r.contains("greedy")),
        "{:?}",
        d.reasons
    );
    // A tail does not depend on which tails were computed before it (the memo only
    // saves work): up, down and cold give the same bits.
    let fresh = || Model::new(&spec, &ds2_window(), &settings).expect("model");
    let (up, down) = (fresh(), fresh());
    let ups: Vec<u64> = (1..=12).map(|p| up.tail(map, p).to_bits()).collect();
    let downs: Vec<u64> = (1..=12)
        .rev()
        .map(|p| down.tail(map, p).to_bits())
        .collect();
    for p in 1..=12u32 {
        let cold = fresh().tail(map, p).to_bits();
        assert_eq!(ups[p as usize - 1], cold, "p={p}");
        assert_eq!(downs[12 - p as usize], cold, "p={p}");
    }
}

/// [`ds2_window`] with the map's subtasks reporting service-time sums at its first and
/// last scrapes: 100 batches of 10 records each per subtask, whose residuals make cs² =
/// `cs`² exactly (Σr² = cs²·m²·(Σn − Σn²/Σn), m the subtask's mean).
fn ds2_window_with_service_cv(cs: f64) -> Vec<MetricSample> {
    let mut w = ds2_window();
    let last = w.len() - 1;
    for (k, m) in [2e-3, 3e-3].into_iter().enumerate() {
        let (records, records_sq) = (1000.0, 100.0 * 100.0);
        let dof = records - records_sq / records;
        let sums = ServiceMoments {
            records,
            seconds: records * m,
            seconds_sq: records_sq * m * m + cs * cs * m * m * dof,
            record_seconds: 10.0 * records * m,
            records_sq,
        };
        for (i, at) in [(0, ServiceMoments::default()), (last, sums)] {
            w[i].operators.get_mut("map").expect("map")[k].service = Some(at);
        }
    }
    w
}

#[test]
fn a_variable_operator_gets_more_subtasks_for_the_same_slo() {
    let spec = job(CHAIN);
    // Sized at ρ 0.95, where the map's wait (Allen-Cunneen: (ca² + cs²)/2 times the M/M/c
    // wait) dominates its p99 term, so cs decides how many subtasks the SLO needs.
    let settings = PlannerSettings {
        latency_slo_seconds: Some(0.2),
        target_utilization: Some(0.95),
        ..PlannerSettings::default()
    };
    let at = |cs: f64, settings: &PlannerSettings| {
        plan(&spec, &ds2_window_with_service_cv(cs), settings).expect("plans")
    };
    let est = estimate(&spec, &ds2_window_with_service_cv(1.2)).expect("estimates");
    let measured = est.operators["map"].service_cv.expect("measured");
    assert!((measured - 1.2).abs() < 1e-9, "{measured}");
    assert_eq!(
        est.operators["sink"].service_cv, None,
        "no sums, no measurement"
    );
    let (steady, variable) = (at(0.5, &settings), at(1.2, &settings));
    let plain = plan(&spec, &ds2_window(), &settings).expect("plans");
    assert!(
        steady.parallelism["map"] < variable.parallelism["map"],
        "map: cs 0.5 → {}, cs 1.2 → {}",
        steady.parallelism["map"],
        variable.parallelism["map"]
    );
    assert!(steady.slo_met() && variable.slo_met());
    let why = &variable.operators["map"].reason;
    assert!(why.contains("(measured service cs 1.20)"), "{why}");
    // No measurement is cs 1, as before; a measured 1 plans the same.
    assert_eq!(at(1.0, &settings).parallelism, plain.parallelism);
    assert!(!plain.operators["map"].reason.contains("measured"));
    // The utilization sizing does not depend on cs: a loose SLO gives the same plan.
    let loose = PlannerSettings {
        latency_slo_seconds: Some(100.0),
        ..settings.clone()
    };
    assert_eq!(at(0.5, &loose).parallelism, at(1.2, &loose).parallelism);
    // A configured cs overrides the measurement: the plan without one, reason and all.
    let set = PlannerSettings {
        service_cv: Some(1.0),
        ..settings.clone()
    };
    let overridden = at(1.2, &set);
    assert_eq!(overridden.parallelism, plain.parallelism);
    assert_eq!(
        overridden.operators["map"].reason,
        plain.operators["map"].reason
    );
}

#[test]
fn unattainable_slo_is_reported_without_adding_subtasks() {
    let spec = job(CHAIN);
    // Service times alone are 1/62.5 + 1/250 = 0.02 s > 0.019 s.
    let settings = PlannerSettings {
        latency_slo_seconds: Some(0.019),
        ..PlannerSettings::default()
    };
    let d = plan(&spec, &ds2_window(), &settings).expect("plans");
    assert_eq!(d.parallelism["map"], 3);
    assert_eq!(d.parallelism["sink"], 1);
    assert!(!d.slo_met());
    assert!(
        d.reasons.iter().any(|r| r.contains("unattainable")),
        "{:?}",
        d.reasons
    );
}

/// With `onUnattainableSlo: bestEffort`, the SLO of the test above (unattainable: service
/// times alone exceed it) still gets subtasks for latency: down to (1 + BEST_EFFORT_MARGIN)
/// × the bound at maximum parallelism, and none that bound does not need.
#[test]
fn best_effort_allocates_an_unattainable_slo_down_to_near_its_lowest_bound() {
    let mut spec = job(CHAIN);
    spec.autoscaler.on_unattainable_slo = UnattainableSlo::BestEffort;
    let settings = PlannerSettings {
        latency_slo_seconds: Some(0.019),
        ..PlannerSettings::default()
    };
    let d = plan(&spec, &ds2_window(), &settings).expect("plans");
    assert!(!d.slo_met());
    assert!(
        d.reasons
            .iter()
            .any(|r| r.starts_with("latency SLO 0.019 s unattainable")
                && r.contains("best effort (onUnattainableSlo: bestEffort)")),
        "{:?}",
        d.reasons
    );
    let model = Model::new(&spec, &ds2_window(), &settings).expect("model");
    let at = |map: u32, sink: u32| {
        let p: BTreeMap<&str, u32> = [("src", 1), ("map", map), ("sink", sink)].into();
        model.assess(&p).2
    };
    let max = spec.max_parallelism;
    let target = (1.0 + BEST_EFFORT_MARGIN) * at(max, max);
    let (map, sink) = (d.parallelism["map"], d.parallelism["sink"]);
    let bound = d.predicted_latency_percentile_seconds;
    assert!(bound <= target, "{bound} > {target}");
    assert!((bound - at(map, sink)).abs() < 1e-12);
    // More subtasks than the utilization sizing (map 3, sink 1), each one needed.
    assert!(map + sink > 4, "map {map}, sink {sink}");
    if map > 3 {
        assert!(at(map - 1, sink) > target, "map {map} has a spare subtask");
    }
    if sink > 1 {
        assert!(
            at(map, sink - 1) > target,
            "sink {sink} has a spare subtask"
        );
    }
    // The utilization-only plan's bound is above the target: best effort bought latency.
    spec.autoscaler.on_unattainable_slo = UnattainableSlo::UtilizationOnly;
    let plain = plan(&spec, &ds2_window(), &settings).expect("plans");
    assert!(plain.predicted_latency_percentile_seconds > target);
}

/// Best effort does not scale up while the current parallelism's bound is within the
/// scale-up tolerance above the best-effort bound (map μ 100 rec/s at γ 180 rec/s: sized 3,
/// best effort 4, and at 3 the bound is 4.7 % above the best-effort bound; the SLO 5 ms is
/// below the service time); it scales down to its plan from above it.
#[test]
fn best_effort_holds_the_current_parallelism_within_its_band() {
    let mut spec = job(CHAIN);
    spec.autoscaler.on_unattainable_slo = UnattainableSlo::BestEffort;
    let settings = PlannerSettings {
        latency_slo_seconds: Some(0.005),
        ..PlannerSettings::default()
    };
    let gamma = 180.0;
    let win = |map: u32| {
        window(
            &[
                Synth::source("src", 1, gamma, 0.0),
                Synth::op("map", map, gamma, 100.0, 1.0),
                Synth::op("sink", 1, gamma, 10_000.0, 0.0),
            ],
            &[0.0, 5.0, 10.0],
        )
    };
    let held = |d: &Decision| {
        d.reasons
            .iter()
            .any(|r| r.starts_with("best effort: the current parallelism"))
    };
    let sized = plan(&spec, &win(1), &PlannerSettings::default())
        .expect("plans")
        .parallelism["map"];
    let best = plan(&spec, &win(1), &settings).expect("plans").parallelism["map"];
    assert_eq!((sized, best), (3, 4));
    let mut seen = [0; 3];
    for map in 1..=3 * best {
        let d = plan(&spec, &win(map), &settings).expect("plans");
        let model = Model::new(&spec, &win(map), &settings).expect("model");
        let at = |m: u32| {
            let p: BTreeMap<&str, u32> = [("src", 1), ("map", m), ("sink", 1)].into();
            model.assess(&p).2
        };
        let target = (1.0 + BEST_EFFORT_MARGIN) * at(spec.max_parallelism);
        let band = map >= sized && at(map) <= target * (1.0 + SCALE_UP_TOLERANCE);
        let want = if map < best && band { map } else { best };
        assert_eq!(d.parallelism["map"], want, "current {map}: {:?}", d.reasons);
        assert_eq!(
            held(&d),
            map < best && band,
            "current {map}: {:?}",
            d.reasons
        );
        seen[usize::from(map < best) + usize::from(map < best && band)] += 1;
    }
    assert!(seen.iter().all(|&k| k > 0), "{seen:?}");
}

/// An attainable SLO is planned the same with or without best effort (at 0.11 s the
/// allocation adds subtasks: the bound is 0.1190 s at the sizing, 0.1060 s at maximum
/// parallelism).
#[test]
fn best_effort_changes_nothing_when_the_slo_is_attainable() {
    for slo in [0.11, 0.2, 1.0] {
        let settings = PlannerSettings {
            latency_slo_seconds: Some(slo),
            ..PlannerSettings::default()
        };
        let mut spec = job(CHAIN);
        let plain = plan(&spec, &ds2_window(), &settings).expect("plans");
        spec.autoscaler.on_unattainable_slo = UnattainableSlo::BestEffort;
        let best = plan(&spec, &ds2_window(), &settings).expect("plans");
        assert_eq!(plain, best, "SLO {slo} s");
        assert!(best.slo_met(), "SLO {slo} s");
        assert_eq!(
            slo == 0.11,
            best.reasons
                .iter()
                .any(|r| r.contains("greedy marginal allocation added")),
            "SLO {slo} s: {:?}",
            best.reasons
        );
    }
}

#[test]
fn clamped_at_max_is_reported() {
    let spec = job(&CHAIN.replace(
        "{ name: map, kind: map, parallelism: 2 }",
        "{ name: map, kind: map, parallelism: 2, scaling: { max: 2 } }",
    ));
    let d = plan(&spec, &ds2_window(), &PlannerSettings::default()).expect("plans");
    let map = &d.operators["map"];
    assert_eq!(map.parallelism, 2);
    assert!(map.clamped_at_max);
    // ρ = 110/(2·62.5) = 0.88 > 0.7.
    assert!((map.predicted_utilization.expect("ρ") - 0.88).abs() < 1e-12);
    assert!(
        d.reasons.iter().any(|r| r.starts_with("map: needs p=3")),
        "{:?}",
        d.reasons
    );
}

#[test]
fn unknown_rate_keeps_parallelism() {
    let spec = job(CHAIN);
    let mut ops = vec![
        Synth::source("src", 1, 1000.0, 0.0),
        Synth::op("map", 2, 1000.0, 100.0, 1.0),
        Synth::op("sink", 1, 1000.0, 5000.0, 0.0),
    ];
    ops[1].mu = None;
    let d = plan(
        &spec,
        &window(&ops, &[0.0, 10.0]),
        &PlannerSettings::default(),
    )
    .expect("plans");
    assert_eq!(d.parallelism["map"], 2);
    assert_eq!(d.operators["map"].true_processing_rate, None);
    assert!(d.operators["map"].reason.contains("unknown"));
    assert!(
        d.reasons
            .iter()
            .any(|r| r.starts_with("map: true processing rate unknown"))
    );
    // The sink is still sized: ⌈1000/(0.7·5000)⌉ = 1.
    assert_eq!(d.parallelism["sink"], 1);
}

#[test]
fn keyed_operator_uses_separate_queues() {
    let spec = job(&CHAIN.replace(
        "{ name: map, kind: map, parallelism: 2 }",
        "{ name: map, kind: window, sizeMs: 1000, parallelism: 2 }",
    ));
    let d = plan(&spec, &ds2_window(), &PlannerSettings::default()).expect("plans");
    // Same sizing (p = 3), but sojourn is M/M/1 at the busiest subtask's arrival rate: with
    // 128 key groups in contiguous ranges 43/43/42 and even load it takes 43/128 of
    // λ = 100 → 33.59 rec/s: W = 1/(62.5 − 33.59) = 0.034590 s.
    let map = &d.operators["map"];
    assert_eq!(map.parallelism, 3);
    // The 1 s window's period is not added: a window result counts from the window's end.
    let hot = 100.0 * 43.0 / 128.0;
    assert!((map.predicted_sojourn_seconds - 1.0 / (62.5 - hot)).abs() < 1e-12);
    // ρ is taken at the target rate (110 rec/s, with catch-up) on the busiest subtask.
    let rho = map.arrival_rate * 43.0 / 128.0 / 62.5;
    assert!((map.predicted_utilization.expect("μ") - rho).abs() < 1e-12);
}

/// A keyed chain src → win (p subtasks) → sink, over 10 s, with γ = `gamma` rec/s, μ = 100
/// rec/s per subtask and the given per-subtask input shares of `win`. Latency SLO 100 s: these
/// cases check the utilization and key-group sizing, without the latency allocation (it
/// never ran on them while the 1 s window period counted against a 1 s SLO).
fn keyed_window(p: u32, gamma: f64, shares: &[f64]) -> (JobSpec, Vec<MetricSample>) {
    let spec = job(&format!(
        "name: keyed\noperators:\n  - {{ name: src, kind: source, rate: {{ constant: 1 }} }}\n  - {{ name: win, kind: window, sizeMs: 1000, parallelism: {p} }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: src, to: win }}\n  - {{ from: win, to: sink }}\nautoscaler: {{ latencySloSeconds: 100.0 }}\n"
    ));
    let at = |t: f64| {
        let win = shares
            .iter()
            .map(|sh| {
                let rin = gamma * sh * t;
                sub(rin, rin * 0.1, rin / 100.0, 0.0)
            })
            .collect();
        MetricSample {
            at_seconds: t,
            operators: [
                ("src".to_string(), vec![src(gamma * t, 0.0)]),
                ("win".to_string(), win),
                (
                    "sink".to_string(),
                    vec![sub(gamma * 0.1 * t, 0.0, 0.001 * t, 0.0)],
                ),
            ]
            .into_iter()
            .collect(),
        }
    };
    (spec, vec![at(0.0), at(5.0), at(10.0)])
}

#[test]
fn key_group_alignment_drops_subtasks_that_add_nothing() {
    // DS2 asks for ⌈3500 / 70⌉ = 50 subtasks; with 128 key groups p=50 gives some subtask 3
    // groups, and 43 subtasks already give every subtask at most 3: ρ = 3500·3/128/100 = 0.82
    // > 0.7, so the busiest subtask needs ⌈128/p⌉ = 2 groups: p = 64.
    let (spec, w) = keyed_window(4, 3500.0, &[0.25; 4]);
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    assert_eq!(d.parallelism["win"], 64, "{:?}", d.operators["win"].reason);
    // At 2800 rec/s DS2 says 40 (ρ would be 2800·4/128/100 = 0.875 on a 4-group subtask);
    // 3 groups per subtask (ρ 0.656) needs only ⌈128/3⌉ = 43.
    let (spec, w) = keyed_window(4, 2800.0, &[0.25; 4]);
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    assert_eq!(d.parallelism["win"], 43, "{:?}", d.operators["win"].reason);
    assert!(d.operators["win"].predicted_utilization.expect("μ") <= 0.7);
}

/// A keyed sizing that starts where an earlier search at a lower or equal rate stopped
/// ([`KeyedSearch`]) finds what a search from scratch finds, over a random walk of rates
/// (rising and falling) and starting points.
#[test]
fn keyed_sizing_from_an_earlier_search_finds_what_a_fresh_one_does() {
    let (spec, w) = keyed_window(4, 1000.0, &[0.4, 0.1, 0.3, 0.2]);
    let mut m = Model::new(&spec, &w, &PlannerSettings::default()).expect("model");
    let i = m.graph.topo.index["win"];
    let mu = m.mu(i).expect("μ");
    let limit = m.s.rho * mu * (1.0 + CEIL_SLACK);
    let (mut x, mut skipped) = (0x9e37_79b9_7f4a_7c15u64, 0);
    for step in 0..600 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Blocks of 40 steps around a random rate, mostly rising, some falling; starting
        // points mostly low (under what the skew needs), sometimes above it.
        let base = 100.0 + ((step / 40) * 7919 % 4000) as f64;
        let lambda = if x % 5 == 0 {
            base - (x % 50) as f64
        } else {
            base + f64::from(step % 40) * 3.0
        };
        let from = if x % 7 == 0 {
            1 + (x >> 20) as u32 % 60
        } else {
            1 + (step / 40) as u32 % 5
        };
        m.lambda_target[i] = lambda;
        let start = from.clamp(1, m.graph.key_groups);
        let known = m.keyed_searches.borrow()[i];
        if known.is_some_and(|k| k.reaches(lambda, limit, start) && k.stopped > start) {
            skipped += 1;
        }
        let (mut why, mut reasons) = (String::new(), Vec::new());
        let with = m.size_keyed(i, from, mu, false, &mut why, &mut reasons);
        m.keyed_searches.borrow_mut()[i] = None;
        let fresh = m.size_keyed(i, from, mu, false, &mut why, &mut reasons);
        assert_eq!(with, fresh, "λ {lambda} rec/s from p={from}");
    }
    assert!(skipped > 20, "only {skipped} searches skipped ahead");
}

#[test]
fn skew_sizes_for_the_busiest_subtask() {
    // Subtask 0 of 2 takes 80% of 100 rec/s: its 64 key groups carry 1.25% each, the
    // others 0.3125%. DS2 (no skew) would say ⌈100/70⌉ = 2; the busiest subtask must stay
    // under 70 rec/s: 100 · share ≤ 70 → share ≤ 0.7; at p=2 the share is 0.8, at p=3
    // ranges 0..43, 43..86, 86..128 give 43·1.25% = 53.75% → p = 3.
    let (spec, w) = keyed_window(2, 100.0, &[0.8, 0.2]);
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    assert_eq!(d.parallelism["win"], 3);
    let rho = d.operators["win"].predicted_utilization.expect("μ");
    assert!(
        (rho - 100.0 * 43.0 * 0.8 / 64.0 / 100.0).abs() < 1e-9,
        "{rho}"
    );
    let load = key_group_load(&[0.8, 0.2], 128);
    assert!((load.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    assert!((load[0] - 0.8 / 64.0).abs() < 1e-15 && (load[127] - 0.2 / 64.0).abs() < 1e-15);
}

#[test]
fn a_hot_key_group_is_reported_and_not_scaled() {
    // One subtask of 128 (one key group each) takes half of 200 rec/s: 100 rec/s > 70 at
    // the target, and no parallelism splits one key group. The other 127 groups carry
    // 0.5/127 each (0.79 rec/s): the hot group's subtask may carry 10 % of its 50 % besides
    // it, 12 of them, so ranges of ⌈128/p⌉ ≤ 13 groups isolate it: p = 10, not 128 (the
    // extra 118 subtasks take nothing off the hot one) and not more.
    let mut shares = vec![0.5 / 127.0; 128];
    shares[0] = 0.5;
    let (mut spec, w) = keyed_window(128, 200.0, &shares);
    spec.max_parallelism = 128;
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    assert_eq!(d.parallelism["win"], 10, "{:?}", d.operators["win"].reason);
    let reason = d
        .reasons
        .iter()
        .find(|r| r.starts_with("win: hot-key bottleneck"))
        .unwrap_or_else(|| panic!("{:?}", d.reasons));
    assert!(
        reason.contains("key group 0 takes 50.0% of 200 rec/s")
            && reason.contains("p=10 isolates it"),
        "{reason}"
    );
    // 100 rec/s is a subtask's full μ, not more: no "cannot keep up" clause.
    assert!(!reason.contains("cannot keep up"), "{reason}");
    // At 250 rec/s the group (125 rec/s) exceeds μ = 100 itself: said so.
    let (mut spec, w) = keyed_window(128, 250.0, &shares);
    spec.max_parallelism = 128;
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    assert!(
        d.reasons.iter().any(|r| r.starts_with("win: hot-key bottleneck")
            && r.contains("even more than its full capacity μ 100 rec/s: the operator cannot keep up at any parallelism")),
        "{:?}",
        d.reasons
    );
}

/// A hot key group just under a subtask's rate at the target (ρ·μ = 70 rec/s) and one just
/// over it get the same parallelism (found by a user test: just under, the ordinary search
/// went to maxParallelism for the hot group's subtask; just over, it was isolated at ~20).
/// One key group per subtask at p=128, group 0 hot, the other 127 sharing the rest of 200
/// rec/s (about 1.03 rec/s each): isolating group 0 lets its subtask carry 10 % of ~70 rec/s
/// besides it, 6 groups, so ranges of ⌈128/p⌉ ≤ 7 groups: p = 19 on both sides, held. A
/// group well under the margin (0.85 · 70) is sized by the ordinary search, no further.
#[test]
fn a_hot_group_just_under_or_over_the_target_gets_the_same_parallelism() {
    let at = |load: f64| {
        let h = load / 200.0;
        let mut shares = vec![(1.0 - h) / 127.0; 128];
        shares[0] = h;
        let (mut spec, w) = keyed_window(128, 200.0, &shares);
        spec.max_parallelism = 128;
        plan(&spec, &w, &PlannerSettings::default()).expect("plans")
    };
    let hot_key = |d: &Decision| {
        d.reasons
            .iter()
            .find(|r| r.starts_with("win: hot-key bottleneck"))
            .cloned()
    };
    let under = at(0.99 * 70.0);
    let over = at(1.01 * 70.0);
    assert_eq!(
        under.parallelism["win"], over.parallelism["win"],
        "under: {:?}, over: {:?}",
        under.operators["win"].reason, over.operators["win"].reason
    );
    assert_eq!(over.parallelism["win"], 19, "{:?}", over.operators["win"]);
    let reason = hot_key(&under).unwrap_or_else(|| panic!("{:?}", under.reasons));
    assert!(
        reason.contains("(69.30 rec/s), within 10% under one subtask's 70.00 rec/s")
            && reason.contains("p=19 isolates it"),
        "{reason}"
    );
    let reason = hot_key(&over).unwrap_or_else(|| panic!("{:?}", over.reasons));
    assert!(
        reason.contains("(70.70 rec/s), more than one subtask's 70.00 rec/s"),
        "{reason}"
    );
    // Well under the margin: no hot-key bottleneck, and no more than isolation would take.
    let cool = at(0.85 * 70.0);
    assert!(hot_key(&cool).is_none(), "{:?}", cool.reasons);
    assert!(cool.parallelism["win"] <= 19, "{:?}", cool.operators["win"]);
}

/// The user test's latency case: a keyed window held as a hot-key bottleneck (group 0 at
/// 1.01 × the 70 rec/s target, isolated at p=19) keeps the p99 bound over the SLO through
/// its hot subtask. The allocation judged the SLO attainable with the window at its max
/// (128: the hot subtask carries only its group) and then, the window being held, gave the
/// fast sink subtask after subtask for next to nothing. Now the window counts at its held
/// p: the SLO is reported unattainable naming it, and no subtask is added.
#[test]
fn a_held_hot_key_operator_makes_the_slo_unattainable_and_adds_no_subtasks() {
    let mut shares = vec![(1.0 - 0.3535) / 127.0; 128];
    shares[0] = 0.3535;
    let (mut spec, w) = keyed_window(128, 200.0, &shares);
    spec.max_parallelism = 128;
    let slo = |s: f64| PlannerSettings {
        latency_slo_seconds: Some(s),
        ..PlannerSettings::default()
    };
    let loose = plan(&spec, &w, &slo(100.0)).expect("plans");
    let held = loose.operators["win"].predicted_sojourn_percentile_seconds;
    assert_eq!(loose.parallelism["win"], 19, "{:?}", loose.operators["win"]);
    // The window's term at 128 subtasks (its hot subtask with group 0 alone) is lower.
    let d = plan(&spec, &w, &slo(0.2)).expect("plans");
    assert_eq!(d.parallelism, loose.parallelism, "{:?}", d.reasons);
    assert!(
        d.reasons
            .iter()
            .any(|r| r.starts_with("latency SLO 0.2 s unattainable")
                && r.contains("win is held at p=19 as a hot-key bottleneck")),
        "{:?}",
        d.reasons
    );
    assert!(
        !d.reasons
            .iter()
            .any(|r| r.contains("greedy marginal allocation")),
        "{:?}",
        d.reasons
    );
    assert!(held > 0.2, "held term {held}");
}

/// A step of the latency allocation that cuts the bound by a negligible amount (under
/// `NEGLIGIBLE_CUT` × SLO per subtask) is not taken: `map` at its max (p=2, ρ 0.95) keeps
/// the bound just over the SLO, and only the 10⁶ rec/s sink could cut it, by microseconds
/// a subtask. Before, the greedy gave the sink subtasks until it met the SLO.
#[test]
fn a_negligible_latency_cut_adds_no_subtask() {
    let spec = job(
        "name: chain\noperators:\n  - { name: src, kind: source, rate: { constant: 1 } }\n  - { name: map, kind: map, parallelism: 2, scaling: { max: 2 } }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: map }\n  - { from: map, to: sink }\n",
    );
    let ops = [
        Synth::source("src", 1, 380.0, 0.0),
        Synth::op("map", 2, 380.0, 200.0, 1.0),
        Synth::op("sink", 1, 380.0, 20_000.0, 0.0),
    ];
    let w = window(&ops, &[0.0, 10.0]);
    let slo = |s: f64| PlannerSettings {
        latency_slo_seconds: Some(s),
        ..PlannerSettings::default()
    };
    let loose = plan(&spec, &w, &slo(100.0)).expect("plans");
    let bound = loose.predicted_latency_percentile_seconds;
    let sink = loose.operators["sink"].predicted_sojourn_percentile_seconds;
    assert_eq!(loose.parallelism["sink"], 1);
    // 0.1 µs over: a second sink subtask would cut that (its queueing share of the ~5 µs
    // term), but by far less than 10⁻⁴ × 0.27 s = 27 µs.
    let tight = bound - 1e-6;
    let d = plan(&spec, &w, &slo(tight)).expect("plans");
    assert_eq!(d.parallelism, loose.parallelism, "{:?}", d.reasons);
    assert!(
        d.reasons.iter().any(|r| r
            .contains("unattainable: no subtask on the slowest path cuts its p99 bound")
            && r.contains("a negligible cut, under 1e-4 of the SLO, adds none")),
        "{:?}",
        d.reasons
    );
    assert!(sink < 1e-3, "{sink}");
}

/// (records/s processed, share of the time busy, the listed key groups) of one subtask.
type ListedSubtask = (f64, f64, Vec<(u32, f64)>);

/// A keyed window `win` of 128 key groups at p = `subs.len()` fed by one source at γ
/// records/s with `backlog` records due: subtask j processes `subs[j].0` records/s, is busy
/// `subs[j].1` of the time and lists its busiest key groups `subs[j].2` (the engine's
/// `streamscale_key_group_share`); samples each second over `secs` seconds.
fn listed_window(
    gamma: f64,
    backlog: f64,
    subs: &[ListedSubtask],
    secs: u32,
) -> (JobSpec, Vec<MetricSample>) {
    let mut spec = job(&format!(
        "name: keyed\noperators:\n  - {{ name: src, kind: source, rate: {{ constant: 1 }} }}\n  - {{ name: win, kind: window, sizeMs: 1000, parallelism: {} }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: src, to: win }}\n  - {{ from: win, to: sink }}\nautoscaler: {{ latencySloSeconds: 100.0 }}\n",
        subs.len()
    ));
    spec.max_parallelism = 128;
    let at = |t: f64| {
        let win = subs
            .iter()
            .map(|(rate, busy, list)| SubtaskSample {
                key_group_shares: list.clone(),
                ..sub(rate * t, rate * t * 0.01, busy * t, 0.0)
            })
            .collect();
        let out: f64 = subs.iter().map(|x| x.0 * 0.01).sum();
        MetricSample {
            at_seconds: t,
            operators: [
                ("src".to_string(), vec![src(gamma * t, backlog)]),
                ("win".to_string(), win),
                ("sink".to_string(), vec![sub(out * t, 0.0, 0.001 * t, 0.0)]),
            ]
            .into_iter()
            .collect(),
        }
    };
    (spec, (0..=secs).map(|t| at(f64::from(t))).collect())
}

/// The kzipf job isolated at p=64 (`streamscale run`, the bug's reproduction): key group 0
/// takes 21.5 % of 2000 rec/s (431 rec/s), subtask 0 owns groups 0 and 1 and carries
/// almost only group 0, μ ≈ 470 rec/s (ρ_target·μ 329). `others` records/s go to the other
/// 63 subtasks (1569 in steady state), each listing two groups at about half its input.
fn kzipf_at_64(
    hot_rate: f64,
    hot_busy: f64,
    others: f64,
    backlog: f64,
) -> (JobSpec, Vec<MetricSample>) {
    let mut subs = vec![(hot_rate, hot_busy, vec![(0, 0.994), (1, 0.006)])];
    for j in 1..64u32 {
        let rate = others / 63.0;
        subs.push((rate, rate / 470.0, vec![(2 * j, 0.55), (2 * j + 1, 0.45)]));
    }
    listed_window(2000.0, backlog, &subs, 4)
}

fn hot_key_reason(d: &Decision) -> Option<&String> {
    d.reasons
        .iter()
        .find(|r| r.starts_with("win: hot-key bottleneck"))
}

/// The share inside a hot-key reason (`key group G takes X% of`), as a fraction.
fn reason_share(reason: &str) -> f64 {
    let after = reason.split(" takes ").nth(1).expect("takes");
    after
        .split('%')
        .next()
        .expect("%")
        .parse::<f64>()
        .expect("a share")
        / 100.0
}

#[test]
fn a_saturated_isolated_hot_subtask_stays_a_hot_key_bottleneck_while_the_others_catch_up() {
    // Right after the restore at p=64 the other subtasks drain the downtime's backlog at
    // twice the steady rate while the hot subtask, saturated, processes its μ: its share
    // of what was processed reads 465 / (465 + 3138) = 12.9 % (the run's 14.4 % reading,
    // and its WITHIN LIMITS). What it processed is a lower bound on what was offered to it:
    // 465 of the 2036 rec/s the planner sizes for (22.8 % · 0.994), over one subtask's 329.
    let (spec, w) = kzipf_at_64(465.0, 0.99, 2.0 * 1569.0, 1084.0);
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    let reason = hot_key_reason(&d).unwrap_or_else(|| panic!("{:?}", d.reasons));
    let share = reason_share(reason);
    assert!((share - 0.215).abs() <= 0.02, "{share}: {reason}");
    assert!(reason.contains("key group 0 takes"), "{reason}");
    // In steady state (no backlog, the hot subtask at 431 rec/s, busy 0.92) it reads the
    // same group at its share, on its point reading (it is held: isolated).
    let (spec, w) = kzipf_at_64(431.0, 0.92, 1569.0, 0.0);
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    let reason = hot_key_reason(&d).unwrap_or_else(|| panic!("{:?}", d.reasons));
    let share = reason_share(reason);
    assert!((share - 0.215).abs() <= 0.005, "{share}: {reason}");
}

#[test]
fn a_saturated_hot_subtask_that_falls_behind_is_read_at_its_offered_load() {
    // The hot group takes 520 rec/s of 2000, more than the hot subtask's μ 470: it
    // processes 470 (busy 1.0) and the other subtasks their 1480. The 50 rec/s the
    // operator did not process queued at the saturated subtask: its group's load reads
    // (470 + 50) · 0.994, not 470 / 1950 of the input.
    let (spec, w) = kzipf_at_64(470.0, 1.0, 1480.0, 0.0);
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    let reason = hot_key_reason(&d).unwrap_or_else(|| panic!("{:?}", d.reasons));
    let share = reason_share(reason);
    assert!((share - 0.26 * 0.994).abs() <= 0.003, "{share}: {reason}");
    assert!(
        reason.contains("even more than its full capacity"),
        "{reason}"
    );
}

#[test]
fn a_held_hot_key_operator_is_released_only_under_the_band() {
    // Held (group 0 isolated at p=64, its subtask not saturated): a group just under
    // the claim threshold (its load · 1.1 = 0.95 of one subtask's 329 rec/s) stays a
    // hot-key bottleneck, and is released once it falls under the band (0.85).
    let mu = 470.0;
    let limit = 0.7 * mu;
    let at = |x: f64, p64: bool| {
        let hot = x * limit / (1.0 + HOT_KEY_ISOLATION);
        let others = 2000.0 - hot;
        let subs: Vec<_> = if p64 {
            let mut v = vec![(hot, hot / mu, vec![(0, 1.0)])];
            for j in 1..64u32 {
                let r = others / 63.0;
                v.push((r, r / mu, vec![(2 * j, 0.55), (2 * j + 1, 0.45)]));
            }
            v
        } else {
            // The same load at p=1: nothing isolated, a claim to make.
            vec![(2000.0, 2000.0 / mu, vec![(0, hot / 2000.0), (5, 0.01)])]
        };
        let (spec, w) = listed_window(2000.0, 0.0, &subs, 10);
        plan(&spec, &w, &PlannerSettings::default()).expect("plans")
    };
    let held = at(0.95, true);
    let reason = hot_key_reason(&held).unwrap_or_else(|| panic!("{:?}", held.reasons));
    assert!(reason.contains("released only under"), "{reason}");
    let released = at(0.85, true);
    assert!(
        hot_key_reason(&released).is_none(),
        "{:?}",
        released.reasons
    );
    // Not held, the same 0.95 is no claim.
    let fresh = at(0.95, false);
    assert!(hot_key_reason(&fresh).is_none(), "{:?}", fresh.reasons);
    // And over the threshold it is claimed either way.
    assert!(hot_key_reason(&at(1.05, false)).is_some());
    assert!(hot_key_reason(&at(1.05, true)).is_some());
}

/// [`offered_shares`] of an operator's estimate.
fn offered_of(e: &OperatorEstimate, rates: Rates, out: &mut Vec<f64>) -> bool {
    offered_shares(
        e.input_rate,
        &e.subtask_input_shares,
        &e.subtask_saturation,
        !e.subtask_key_group_shares.is_empty(),
        rates,
        out,
    )
}

#[test]
fn offered_shares_raise_only_saturated_subtasks_and_keep_the_sum() {
    let (spec, w) = kzipf_at_64(465.0, 0.99, 2.0 * 1569.0, 1084.0);
    let est = &super::super::estimate(&spec, &w)
        .expect("estimates")
        .operators["win"];
    let mut out = Vec::new();
    let rates = Rates {
        target: 2036.0,
        steady: 2000.0,
        scale: 1.0,
    };
    assert!(offered_of(est, rates, &mut out));
    assert!((out[0] - 465.0 / 2036.0).abs() < 1e-9, "{}", out[0]);
    assert!((out.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    let f = (1.0 - out[0]) / (1.0 - est.subtask_input_shares[0]);
    for (a, b) in out.iter().zip(&est.subtask_input_shares).skip(1) {
        assert!((a - b * f).abs() < 1e-12);
    }
    // Through a forecast's arrival scale (1.5) the steady rate it reads is no deficit: the
    // same share.
    let scaled = Rates {
        target: 1.5 * 2036.0,
        steady: 1.5 * 2000.0,
        scale: 1.5,
    };
    let mut again = Vec::new();
    assert!(offered_of(est, scaled, &mut again));
    assert!(
        (again[0] - out[0]).abs() < 1e-12,
        "{} vs {}",
        again[0],
        out[0]
    );
    // No saturated subtask, or no key-group lists (the simulator): nothing to correct.
    let mut cool = est.clone();
    cool.subtask_saturation[0] = 0.5;
    assert!(!offered_of(&cool, rates, &mut out));
    let mut sim = est.clone();
    sim.subtask_key_group_shares.clear();
    assert!(!offered_of(&sim, rates, &mut out));
    // Every subtask saturated: the measured shares stand.
    let mut all = est.clone();
    all.subtask_saturation.iter_mut().for_each(|x| *x = 1.0);
    assert!(!offered_of(&all, rates, &mut out));
}

#[test]
fn a_reported_hot_key_group_is_not_scaled_for_skew() {
    // All of 100 rec/s on subtask 0 of 2 (μ = 100, ρ target 0.7). Spread evenly over its 64
    // key groups the load would split at p=3 (43 of them: 67 rec/s): a scale-up.
    let (spec, w) = keyed_window(2, 100.0, &[1.0, 0.0]);
    let before = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    assert!(
        before.parallelism["win"] > 2,
        "{:?}",
        before.operators["win"]
    );
    let hot_key = |d: &Decision| {
        d.reasons
            .iter()
            .any(|r| r.starts_with("win: hot-key bottleneck"))
    };
    assert!(!hot_key(&before), "{:?}", before.reasons);
    let with_h = |h: f64| {
        let mut w = w.clone();
        for s in &mut w {
            let win = s.operators.get_mut("win").expect("win");
            win[0].hottest_key_group_share = Some(h);
        }
        plan(&spec, &w, &PlannerSettings::default()).expect("plans")
    };
    // The engine says one key group takes it all (h = 1; read as (1000 − 2·√1000) / 1000
    // ≈ 0.94 of the subtask's 1000 records): 94 rec/s on one key group, more than a
    // subtask's 70 at any parallelism. Its subtask carries only the other 6 % (under 10 %
    // of the group's load) at p=1 already, and subtask 1 nothing: p=1 isolates it as well
    // as p=2, so the operator is sized to 1 (no scale-up) and reported, in this one
    // decision.
    let d = with_h(1.0);
    assert_eq!(d.parallelism["win"], 1, "{:?}", d.operators["win"]);
    assert!(hot_key(&d), "{:?}", d.reasons);
    // An even spread reported (h ≤ 1/64 on its 64 groups) changes nothing.
    let even = with_h(1.0 / 128.0);
    assert_eq!(even.parallelism, before.parallelism);
    assert_eq!(even.reasons, before.reasons);
}

#[test]
fn key_group_load_puts_the_hot_share_on_one_group() {
    // Only the hottest share: on the first group of the range (its index is unknown).
    let load = key_group_load_with_hot(&[0.8, 0.2], &[Some(0.5), None], &[], 128);
    assert!((load.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    assert!((load[0] - 0.4).abs() < 1e-15);
    assert!((load[1] - 0.4 / 63.0).abs() < 1e-15 && (load[63] - 0.4 / 63.0).abs() < 1e-15);
    assert!((load[64] - 0.2 / 64.0).abs() < 1e-15);
    // Absent everywhere: exactly the even spread.
    assert_eq!(
        key_group_load_with_hot(&[0.8, 0.2], &[None, None], &[], 128),
        key_group_load(&[0.8, 0.2], 128)
    );
    // Listed groups go to their real indices: subtask 0 (groups 0..64) lists 40 at 0.5 and
    // 10 at 0.25 (and 70, outside its range, and 3 at 0.01, under an even 1/64: ignored);
    // the other 25 % spread over its 62 other groups. The list wins over the hottest share.
    let listed = vec![vec![(40, 0.5), (10, 0.25), (70, 0.1), (3, 0.01)], vec![]];
    let load = key_group_load_with_hot(&[0.8, 0.2], &[Some(0.5), None], &listed, 128);
    assert!((load.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    assert!((load[40] - 0.4).abs() < 1e-15 && (load[10] - 0.2).abs() < 1e-15);
    for g in [0, 3, 39, 41, 63] {
        assert!(
            (load[g] - 0.8 * 0.25 / 62.0).abs() < 1e-15,
            "{g}: {}",
            load[g]
        );
    }
    assert!((load[70] - 0.2 / 64.0).abs() < 1e-15);
    // The hottest run starts at the real hot group.
    assert_eq!(hottest_run(&load).0, (40, 41));
    // Shares summing above 1 (two readings of a changing list) are kept within the
    // subtask's share; a list of groups no hotter than an even spread is the even spread.
    let load = key_group_load_with_hot(&[1.0], &[], &[vec![(5, 0.7), (6, 0.6)]], 16);
    assert!((load[5] - 0.7).abs() < 1e-15 && (load[6] - 0.3).abs() < 1e-15);
    assert!(
        load.iter()
            .enumerate()
            .all(|(g, &x)| g == 5 || g == 6 || x == 0.0)
    );
    let flat = key_group_load_with_hot(&[0.5, 0.5], &[], &[vec![(1, 1.0 / 64.0)], vec![]], 128);
    assert_eq!(flat, key_group_load(&[0.5, 0.5], 128));
}

/// The few-keys job of issue 6 (found by a user test): 10 keys through a keyed window at
/// 480 rec/s, μ = 100 rec/s per subtask (ρ target 0.7: 70 rec/s). With 128 key groups the
/// engine's hash puts two keys in one group (20 % of the input: 96 rec/s, over 70 but
/// under μ) and the others in one group each (48 rec/s: one fits a subtask, two do not).
/// Before, the planner saw only the busiest group's share, put it on the first group of
/// the range and kept p=1 as a hot-key bottleneck, although isolating the hot group lets the
/// operator take the whole input. Now the engine lists each subtask's busiest groups with
/// their indices: the planner sizes up to the parallelism that gives the hot group a subtask
/// of its own and every other subtask at most one key, then holds there.
#[test]
fn a_few_keys_are_sized_up_to_isolate_the_hot_group_then_held() {
    use streamscale_engine::keygroup::key_group;
    let k = 128u32;
    let mut key_load = vec![0.0_f64; k as usize];
    for key in 0..10u64 {
        key_load[key_group(key, k) as usize] += 0.1;
    }
    let hot = (0..k)
        .max_by(|&a, &b| {
            key_load[a as usize]
                .total_cmp(&key_load[b as usize])
                .then(b.cmp(&a))
        })
        .expect("groups");
    assert!(
        (key_load[hot as usize] - 0.2).abs() < 1e-12,
        "the hash puts two keys in one group"
    );
    // A window at parallelism p with each subtask's exact share and its 8 busiest groups.
    let window_at = |p: u32| {
        let ranges: Vec<_> = (0..p).map(|j| key_group_range(j, p, k)).collect();
        let shares: Vec<f64> = ranges
            .iter()
            .map(|r| r.clone().map(|g| key_load[g as usize]).sum())
            .collect();
        let (mut spec, mut w) = keyed_window(p, 480.0, &shares);
        spec.max_parallelism = k;
        let lists: Vec<Vec<(u32, f64)>> = ranges
            .iter()
            .zip(&shares)
            .map(|(r, &s)| {
                let mut l: Vec<(u32, f64)> = r
                    .clone()
                    .filter(|&g| key_load[g as usize] > 0.0)
                    .map(|g| (g, key_load[g as usize] / s))
                    .collect();
                l.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                l.truncate(8);
                l
            })
            .collect();
        for sample in &mut w {
            let win = sample.operators.get_mut("win").expect("win");
            for (sub, l) in win.iter_mut().zip(&lists) {
                sub.hottest_key_group_share = l.first().map(|x| x.1);
                sub.key_group_shares = l.clone();
            }
        }
        (spec, w)
    };
    // At p=1 the one subtask lists 8 of the 9 loaded groups (the hot one first).
    let (spec, w) = window_at(1);
    let first = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    let p1 = first.parallelism["win"];
    assert!(p1 > 1, "sized up: {:?}", first.operators["win"].reason);
    let reason = first
        .reasons
        .iter()
        .find(|r| r.starts_with("win: hot-key bottleneck"))
        .unwrap_or_else(|| panic!("{:?}", first.reasons));
    assert!(
        reason.contains(&format!("key group {hot} takes"))
            && reason.contains(&format!("p={p1} isolates it")),
        "{reason}"
    );
    // Then, at each new parallelism, the subtasks list the groups they own: the plan moves
    // at most once more (a group the p=1 list left out may share the hot group's range)
    // and then holds, with the hot group alone on its subtask and every other subtask
    // within the target, and stays far from the 128 key groups.
    let mut p = p1;
    let mut held = None;
    for _ in 0..3 {
        let (spec, w) = window_at(p);
        let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
        assert!(
            d.reasons
                .iter()
                .any(|r| r.starts_with("win: hot-key bottleneck")),
            "p={p}: {:?}",
            d.reasons
        );
        let next = d.parallelism["win"];
        if next == p {
            held = Some(p);
            break;
        }
        p = next;
    }
    let p = held.unwrap_or_else(|| panic!("not held: went on to p={p}"));
    assert!(p >= p1.min(p) && p <= 32, "p={p}");
    for j in 0..p {
        let r = key_group_range(j, p, k);
        let load: f64 = r.clone().map(|g| key_load[g as usize]).sum();
        if r.contains(&hot) {
            assert!(
                (load - 0.2).abs() < 1e-12,
                "p={p}: the hot group's subtask carries {load}"
            );
        } else {
            assert!(480.0 * load <= 70.0, "p={p}: subtask {j} carries {load}");
        }
    }
    // One subtask fewer (p − 1) leaves another subtask over the target or shares the hot one.
    let q = p - 1;
    let isolated_at_q = (0..q).all(|j| {
        let r = key_group_range(j, q, k);
        let load: f64 = r.clone().map(|g| key_load[g as usize]).sum();
        if r.contains(&hot) {
            (load - 0.2).abs() < 0.02
        } else {
            480.0 * load <= 70.0
        }
    });
    assert!(!isolated_at_q, "p={q} isolates it too");
    // A backlog to drain raises the target rate to about 800 rec/s: the hot group's 160
    // rec/s exceed even μ = 100, so the operator takes at most μ / 0.2 ≈ 500 rec/s whatever
    // its parallelism. At that rate one key still fits a subtask: the plan stays at p
    // (sizing the others for 800 rec/s, where one key alone is over the target, would ask
    // for a subtask per key and twice the parallelism, for nothing).
    let (spec, mut w) = window_at(p);
    for sample in &mut w {
        sample.operators.get_mut("src").expect("src")[0].source_backlog = Some(9600.0);
    }
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    assert!(
        d.operators["win"].arrival_rate > 700.0,
        "{:?}",
        d.operators["win"]
    );
    assert_eq!(d.parallelism["win"], p, "{:?}", d.operators["win"].reason);
    assert!(
        d.reasons
            .iter()
            .any(|r| r.starts_with("win: hot-key bottleneck")
                && r.contains("the operator cannot keep up at any parallelism (it takes at most")),
        "{:?}",
        d.reasons
    );
}

/// src (γ = 1000) → `mid` (window of 1 s or map, p = 4, μ = 1000, selectivity 0.5) → map
/// (p = 1, μ = 1000) → sink (μ = 100 000).
fn burst_job(mid_kind: &str) -> (JobSpec, Vec<MetricSample>) {
    let spec = job(&format!(
        "name: burst\noperators:\n  - {{ name: src, kind: source, rate: {{ constant: 1 }} }}\n  - {{ name: mid, kind: {mid_kind}, parallelism: 4 }}\n  - {{ name: map, kind: map }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: src, to: mid }}\n  - {{ from: mid, to: map }}\n  - {{ from: map, to: sink }}\n"
    ));
    let ops = [
        Synth::source("src", 1, 1000.0, 0.0),
        Synth::op("mid", 4, 1000.0, 1000.0, 0.5),
        Synth::op("map", 1, 500.0, 1000.0, 1.0),
        Synth::op("sink", 1, 500.0, 100_000.0, 0.0),
    ];
    (spec, window(&ops, &[0.0, 10.0]))
}

#[test]
fn a_window_delays_its_records_and_its_downstream_sees_a_burst() {
    let (spec, w) = burst_job("window, sizeMs: 1000");
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    // The window emits 500 rec/s as one batch of 500 records per second. map (DS2: ⌈500/700⌉
    // = 1 subtask) takes 500/1000 = 0.5 s to work it off: the last record waits 0.5 s, a
    // record 0.25 s on average. Its smooth input is 0, so no other queueing: mean sojourn
    // 1/μ + 0.25 s; its percentile term (ε' = 0.01/3, three operators on the path) is the
    // service quantile ln(300)/1000 plus the whole drain.
    let map = &d.operators["map"];
    assert_eq!(map.parallelism, 1);
    assert!(
        (map.predicted_sojourn_seconds - (0.001 + 0.25)).abs() < 1e-9,
        "{map:?}"
    );
    let tail = 300f64.ln() / 1000.0 + 0.5;
    assert!(
        (map.predicted_sojourn_percentile_seconds - tail).abs() < 1e-9,
        "{map:?}"
    );
    // The window's own terms are its queueing and service only: the wait for the 1 s
    // window to close is not latency (a window result counts from the window's end), so
    // they equal those of a keyed map in its place.
    let mid = &d.operators["mid"];
    assert!(mid.predicted_sojourn_seconds < 0.1, "{mid:?}");
    assert!(mid.predicted_sojourn_percentile_seconds < 0.1, "{mid:?}");
    // The sink after the map sees the map's (smooth) output, no burst.
    let sink = &d.operators["sink"];
    assert!(sink.predicted_sojourn_percentile_seconds < 0.001);
    // The same job with a map instead of the window: a smooth 500 rec/s at ρ = 0.5, a tail
    // term of ln(300)/500 = 0.011 s, far below the burst's.
    let (spec_m, w_m) = burst_job("map");
    let smooth = plan(&spec_m, &w_m, &PlannerSettings::default()).expect("plans");
    let m = &smooth.operators["map"];
    assert!((m.predicted_sojourn_percentile_seconds - 300f64.ln() / 500.0).abs() < 1e-9);
}

#[test]
fn a_window_burst_drives_the_latency_allocation_downstream() {
    // SLO 0.3 s on p99. DS2 sizing: mid 2 (keyed, ρ 0.5 per subtask), map 1, sink 1; the
    // bound is ≈ 0.011 (the window's M/M/1 quantile; its 1 s period is not latency) +
    // 0.506 (map: burst drain 0.5 s) = 0.517 s. One more map subtask halves the drain
    // (−0.25 s), more than anything else on the path: 0.267 s ≤ 0.3 s.
    let settings = PlannerSettings {
        latency_slo_seconds: Some(0.3),
        ..PlannerSettings::default()
    };
    let (spec, w) = burst_job("window, sizeMs: 1000");
    let d = plan(&spec, &w, &settings).expect("plans");
    assert_eq!(d.parallelism["mid"], 2, "{:?}", d.reasons);
    assert_eq!(d.parallelism["map"], 2, "{:?}", d.reasons);
    assert_eq!(d.parallelism["sink"], 1);
    assert!(d.slo_met(), "{d:?}");
    assert!(
        d.reasons
            .iter()
            .any(|r| r.contains("greedy marginal allocation added map +1")),
        "{:?}",
        d.reasons
    );
    // Below what the path takes at maximum parallelism (the map's service quantile alone
    // is ln(300)/1000 = 5.7 ms): reported, no subtasks added.
    let tight = PlannerSettings {
        latency_slo_seconds: Some(0.005),
        ..PlannerSettings::default()
    };
    let d = plan(&spec, &w, &tight).expect("plans");
    assert!(
        d.reasons.iter().any(|r| r.contains("unattainable")),
        "{:?}",
        d.reasons
    );
    assert_eq!(d.parallelism["map"], 1);
}

#[test]
fn a_window_period_above_the_slo_can_still_meet_it() {
    // The burst job with a 2 s tumbling window and a 1 s SLO: the wait for the window to
    // close is not latency (a window result counts from its window's end, Flink's
    // convention and the engine's), so the SLO is met without reporting it unattainable;
    // the period still sizes the map's burst (1000 records every 2 s: a 1 s drain at
    // p = 1), which the allocation works off: map +1 → 0.5 s.
    let settings = PlannerSettings {
        latency_slo_seconds: Some(1.0),
        ..PlannerSettings::default()
    };
    let (spec, w) = burst_job("window, sizeMs: 2000");
    let d = plan(&spec, &w, &settings).expect("plans");
    assert!(
        !d.reasons.iter().any(|r| r.contains("unattainable")),
        "{:?}",
        d.reasons
    );
    assert!(d.slo_met(), "{d:?}");
    assert!(d.predicted_latency_percentile_seconds < 1.0, "{d:?}");
    assert_eq!(d.parallelism["map"], 2, "{:?}", d.reasons);
    let map = &d.operators["map"];
    let tail = 300f64.ln() / 1000.0 + 0.5;
    assert!(
        (map.predicted_sojourn_percentile_seconds - tail).abs() < 1e-9,
        "{map:?}"
    );
}

/// A Nexmark source (`eventRate` events per second of event time, watermark bound
/// `bound_ms`) → bids (select, p = 1, μ = 10 000) → counts (`eventWindow` with `assigner`,
/// keyed, p = 2, μ = 5000) → sink (μ = 100 000), at γ = 1000 rec/s.
fn event_time_job(assigner: &str, bound_ms: u64, event_rate: u64) -> (JobSpec, Vec<MetricSample>) {
    let spec = job(&format!(
        "name: et\noperators:\n  - {{ name: src, kind: source, rate: {{ constant: 1000 }}, nexmark: {{ eventRate: {event_rate}, maxOutOfOrdernessMs: {bound_ms} }} }}\n  - {{ name: bids, kind: select, query: bids }}\n  - {{ name: counts, kind: eventWindow, key: auction, window: {assigner}, parallelism: 2 }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: src, to: bids }}\n  - {{ from: bids, to: counts }}\n  - {{ from: counts, to: sink }}\n"
    ));
    let ops = [
        Synth::source("src", 1, 1000.0, 0.0),
        Synth::op("bids", 1, 1000.0, 10_000.0, 1.0),
        Synth::op("counts", 2, 1000.0, 5000.0, 0.1),
        Synth::op("sink", 1, 100.0, 100_000.0, 0.0),
    ];
    (spec, window(&ops, &[0.0, 10.0]))
}

#[test]
fn an_event_time_window_counts_its_watermark_delay() {
    // Watermark bound 250 ms of event time at 2000 events/s of event time: the window
    // ending at e fires once the source emitted event time e + 250 ms, 500 events later:
    // 0.5 s at γ = 1000 rec/s. Added in full to the window's mean and percentile terms,
    // not its 1 s period.
    let tumbling = "{ tumbling: { sizeMs: 1000 } }";
    let settings = PlannerSettings::default();
    let (spec0, w0) = event_time_job(tumbling, 0, 2000);
    let (spec, w) = event_time_job(tumbling, 250, 2000);
    let d0 = plan(&spec0, &w0, &settings).expect("plans");
    let d = plan(&spec, &w, &settings).expect("plans");
    assert_eq!(d.parallelism, d0.parallelism);
    let (c0, c) = (&d0.operators["counts"], &d.operators["counts"]);
    assert!(c0.predicted_sojourn_percentile_seconds < 0.1, "{c0:?}");
    let tail = c.predicted_sojourn_percentile_seconds - c0.predicted_sojourn_percentile_seconds;
    let mean = c.predicted_sojourn_seconds - c0.predicted_sojourn_seconds;
    assert!((tail - 0.5).abs() < 1e-12, "{c:?}");
    assert!((mean - 0.5).abs() < 1e-12, "{c:?}");
    let bound = d.predicted_latency_percentile_seconds - d0.predicted_latency_percentile_seconds;
    assert!((bound - 0.5).abs() < 1e-12);
    // Only the window waits: the operators before and after it are unchanged.
    for op in ["bids", "sink"] {
        assert_eq!(d.operators[op], d0.operators[op], "{op}");
    }
    // At event time's own pace (eventRate = γ) the wait is the bound itself; a session
    // window (its gap is its end's definition) waits the same.
    let (spec_s, w_s) = event_time_job("{ session: { gapMs: 3000 } }", 250, 1000);
    let s = plan(&spec_s, &w_s, &settings).expect("plans");
    let (spec_s0, w_s0) = event_time_job("{ session: { gapMs: 3000 } }", 0, 1000);
    let s0 = plan(&spec_s0, &w_s0, &settings).expect("plans");
    let wait = s.operators["counts"].predicted_sojourn_percentile_seconds
        - s0.operators["counts"].predicted_sojourn_percentile_seconds;
    assert!((wait - 0.25).abs() < 1e-12, "{wait}");
    assert!(
        s0.slo_met() && s0.predicted_latency_percentile_seconds < 0.1,
        "{s0:?}"
    );
    // A watermark delay above the SLO cannot be helped by parallelism: reported.
    let (spec_l, w_l) = event_time_job(tumbling, 1000, 2000);
    let late = plan(&spec_l, &w_l, &settings).expect("plans");
    assert!(
        late.reasons.iter().any(|r| r.contains("unattainable")
            && r.contains("counts waits 2.0000 s beyond its windows' ends for the watermark")),
        "{:?}",
        late.reasons
    );
    assert!(late.predicted_latency_percentile_seconds > 2.0);
}

#[test]
fn feedback_loops_are_planned_and_unstable_ones_rejected() {
    // src → a → b → a (loop), b → sink. Every edge out of b carries b's selectivity g:
    // λ_a = γ + g·λ_b, λ_b = λ_a, so λ_a = γ / (1 − g). (The engine's job validation still
    // rejects cycles; the planner takes the parsed graph.)
    let spec = JobSpec::from_yaml("name: loop\noperators:\n  - { name: src, kind: source, rate: { constant: 1 } }\n  - { name: a, kind: map }\n  - { name: b, kind: map }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: a }\n  - { from: a, to: b }\n  - { from: b, to: a }\n  - { from: b, to: sink }\n").expect("parses");
    let w = |g: f64| {
        window(
            &[
                Synth::source("src", 1, 100.0, 0.0),
                Synth::op("a", 1, 200.0, 100.0, 1.0),
                Synth::op("b", 1, 200.0, 1000.0, g),
                Synth::op("sink", 1, 100.0, 1000.0, 0.0),
            ],
            &[0.0, 10.0],
        )
    };
    // g = 0.5: λ_a = λ_b = 200, λ_sink = 100; a needs ⌈200/70⌉ = 3 subtasks.
    let d = plan(&spec, &w(0.5), &PlannerSettings::default()).expect("plans");
    assert!((d.operators["a"].arrival_rate - 200.0).abs() < 1e-9);
    assert!((d.operators["sink"].arrival_rate - 100.0).abs() < 1e-9);
    assert_eq!(d.parallelism["a"], 3);
    assert_eq!(d.critical_path, ["src", "a", "b", "sink"]);
    // g = 1: every record goes round forever; the error names the loop and its gain.
    let err = plan(&spec, &w(1.0), &PlannerSettings::default()).expect_err("unstable");
    let msg = err.to_string();
    assert!(
        msg.starts_with("unstable feedback loop through operators a, b")
            && msg.contains("round-trip gain 1.0000"),
        "{msg}"
    );
}

#[test]
fn a_scale_down_is_not_blocked_by_its_own_downtime_backlog_within_the_band() {
    // map: μ = 100 per subtask at p = 2, γ = 69 rec/s. Without the downtime backlog DS2
    // needs ⌈69/70⌉ = 1. A 30 s rescale adds 69·30/60 = 34.5 rec/s of catch-up: λ_target
    // 103.5 needs ⌈103.5/100⌉ = 2 on full capacity, so the backlog of the scale-down's own
    // downtime would keep p = 2 (and then no rescale, no downtime). At p = 1 the sizing
    // rate max(69, 0.7 · 103.5) = 72.45 runs at ρ 0.7245 ≤ 0.7 · 1.1: scale down.
    let spec = job(CHAIN);
    let ops = |gamma: f64| {
        vec![
            Synth::source("src", 1, gamma, 0.0),
            Synth::op("map", 2, gamma, 100.0, 1.0),
            Synth::op("sink", 1, gamma, 50_000.0, 0.0),
        ]
    };
    let settings = |downtime: f64| PlannerSettings {
        catch_up_seconds: Some(60.0),
        latency_slo_seconds: Some(1e9),
        rescale_downtime_seconds: Some(downtime),
        ..PlannerSettings::default()
    };
    let w = window(&ops(69.0), &[0.0, 30.0]);
    let d = plan(&spec, &w, &settings(30.0)).expect("plans");
    assert_eq!(d.parallelism["map"], 1, "{}", d.operators["map"].reason);
    assert!(
        d.operators["map"].reason.contains("scale-down to p=1")
            && d.operators["map"].reason.contains("ρ=0.724"),
        "{}",
        d.operators["map"].reason
    );
    // A 40 s rescale adds 46 rec/s: sizing ρ 0.7 · 115 / 100 = 0.805 at p = 1, outside the
    // band: stays at 2.
    let d = plan(&spec, &w, &settings(40.0)).expect("plans");
    assert_eq!(d.parallelism["map"], 2, "{}", d.operators["map"].reason);
    // A 5 s rescale's backlog (λ_target 74.75) fits one subtask's full capacity: DS2 alone
    // scales down, as without a downtime.
    for downtime in [5.0, 0.0] {
        let d = plan(&spec, &w, &settings(downtime)).expect("plans");
        assert_eq!(d.parallelism["map"], 1);
        assert!(!d.operators["map"].reason.contains("scale-down to"));
    }
}

#[test]
fn rescale_downtime_adds_its_backlog_to_the_catch_up() {
    // γ = 1000 rec/s, μ = 100, catch-up 30 s, no backlog: DS2 gives ⌈1000/70⌉ = 15. A rescale
    // of 21 s creates 21000 records; draining them in 30 s adds 700 rec/s: 1700 rec/s on the
    // subtasks' full capacity needs ⌈1700/100⌉ = 17. (A 4.2 s rescale's 140 rec/s fits the
    // headroom of 15: max(1000/0.7, 1140)/100 = 14.3 → 15.)
    let (spec, w) = keyed_window(4, 1000.0, &[0.25; 4]);
    let shared = spec.to_yaml().replace("kind: window", "kind: map");
    let spec = job(&shared.replace("sizeMs: 1000", ""));
    let d = plan(&spec, &w, &PlannerSettings::default()).expect("plans");
    assert_eq!(d.parallelism["win"], 15);
    let downtime = |seconds: f64| PlannerSettings {
        rescale_downtime_seconds: Some(seconds),
        ..PlannerSettings::default()
    };
    let d = plan(&spec, &w, &downtime(4.2)).expect("plans");
    assert_eq!(d.parallelism["win"], 15);
    assert!((d.sources["src"].target_rate - 1140.0).abs() < 1e-9);
    assert!(
        d.operators["win"].reason.starts_with(
            "DS2: λ 1000 rec/s / (ρ_target 0.70 × μ 100 rec/s) = 14.29 → p=15 (the backlog drains in the headroom: λ_target 1140 rec/s on full capacity)"
        ),
        "{}",
        d.operators["win"].reason
    );
    let settings = downtime(21.0);
    let d = plan(&spec, &w, &settings).expect("plans");
    assert_eq!(d.parallelism["win"], 17, "{}", d.operators["win"].reason);
    assert!((d.sources["src"].target_rate - 1700.0).abs() < 1e-9);
    assert!(
        d.reasons
            .iter()
            .any(|r| r.contains("+ 21000 records from the rescale's 21.00 s downtime")),
        "{:?}",
        d.reasons
    );
    assert!(
        d.operators["win"].reason.starts_with(
            "DS2: λ_target 1700 rec/s draining the backlog on full capacity / μ 100 rec/s = 17.00 → p=17 (λ 1000 rec/s at ρ_target 0.70 needs less)"
        ),
        "{}",
        d.operators["win"].reason
    );
    // Running 15 subtasks already (ρ = 1000/1500 = 0.67 ≤ 0.7) there is no rescale, hence no
    // downtime: the plan keeps 15 instead of scaling up to absorb a rescale it would cause.
    let (spec15, w15) = keyed_window(15, 1000.0, &[1.0 / 15.0; 15]);
    let spec15 = job(&spec15
        .to_yaml()
        .replace("kind: window", "kind: map")
        .replace("sizeMs: 1000", ""));
    let d = plan(&spec15, &w15, &settings).expect("plans");
    assert_eq!(d.parallelism["win"], 15, "{:?}", d.reasons);
    assert!(!d.changed());
    assert!((d.sources["src"].target_rate - 1000.0).abs() < 1e-9);
}

#[test]
fn a_model_on_reused_buffers_plans_as_a_fresh_one() {
    // Two windows on one graph, differently skewed and loaded: the second model takes the
    // first one's buffers (its key-group arrays and memos hold the first window's values).
    let (spec, first) = keyed_window(4, 3500.0, &[0.1, 0.2, 0.3, 0.4]);
    let (_, second) = keyed_window(4, 2000.0, &[0.4, 0.3, 0.2, 0.1]);
    let settings = PlannerSettings {
        latency_slo_seconds: Some(0.05),
        rescale_downtime_seconds: Some(5.0),
        ..PlannerSettings::default()
    };
    let graph = Arc::new(JobGraph::new(&spec).expect("graph").with_templates());
    let model = |w: &[MetricSample]| {
        Model::with_graph(Arc::clone(&graph), &spec, w, None, &settings).expect("model")
    };
    let fresh_first = Model::new(&spec, &first, &settings).expect("model").plan();
    assert_eq!(model(&first).plan(), fresh_first);
    assert!(graph.buffers.0.lock().expect("pool").tail_memo.is_used());
    let reused = model(&second).plan();
    let fresh = Model::new(&spec, &second, &settings).expect("model").plan();
    assert_eq!(reused, fresh);
    assert_ne!(reused, fresh_first, "the two windows plan differently");
    // Planned twice more on the kept buffers: the same again.
    assert_eq!(model(&second).plan(), fresh);
    assert_eq!(model(&first).plan(), fresh_first);
}

#[test]
fn decisions_share_the_graphs_names_and_unshared_names_refresh_alike() {
    let (spec, window) = keyed_window(4, 3500.0, &[0.1, 0.2, 0.3, 0.4]);
    let settings = PlannerSettings {
        latency_slo_seconds: Some(0.05),
        ..PlannerSettings::default()
    };
    let graph = Arc::new(JobGraph::new(&spec).expect("graph").with_templates());
    let mut model =
        Model::with_graph(Arc::clone(&graph), &spec, &window, None, &settings).expect("model");
    let d = model.plan();
    // The name-keyed maps hold the graph's own names (from the templates and for the
    // sources), and are what a graph without templates collects.
    let shared = |k: &Arc<str>| graph.shared_names.iter().any(|s| Arc::ptr_eq(k, s));
    assert!(d.operators.keys().all(shared));
    assert!(d.current.keys().all(shared));
    assert!(d.sources.keys().all(shared));
    assert_eq!(d.operators.len(), 3);
    assert_eq!(
        d,
        Model::new(&spec, &window, &settings).expect("model").plan()
    );
    // Serialized, the names are plain strings.
    let json = serde_json::to_value(&d).expect("serializes");
    assert_eq!(json["current"]["win"], 4);
    assert!(json["operators"]["win"]["reason"].is_string());
    // The kind is the engine's static name, and a plain string in JSON, read back owned.
    assert!(matches!(d.operators["win"].kind, Cow::Borrowed("window")));
    assert_eq!(json["operators"]["win"]["kind"], "window");
    let back: OperatorPlan =
        serde_json::from_value(json["operators"]["win"].clone()).expect("deserializes");
    assert!(matches!(back.kind, Cow::Owned(ref k) if k == "window"));
    // With copies of the names (as read back from JSON): still the graph's operators, and a
    // guard's edit refreshes the same as on the decision itself.
    let mut copy = d.clone();
    let unshared = |k: &Arc<str>| Arc::<str>::from(&**k);
    copy.current = d.current.iter().map(|(k, &v)| (unshared(k), v)).collect();
    copy.operators = (d.operators.iter())
        .map(|(k, v)| (unshared(k), v.clone()))
        .collect();
    assert!(!copy.operators.keys().any(shared) && !copy.current.keys().any(shared));
    assert!(graph.keys_match(&copy.operators) && graph.keys_match(&copy.current));
    assert_eq!(copy, d);
    let mut edited = d.clone();
    for x in [&mut edited, &mut copy] {
        *x.parallelism.get_mut("win").expect("win") += 3;
        model.refresh_planned(x);
    }
    assert_ne!(edited, d, "the edit changes the predictions");
    assert_eq!(copy, edited);
    // One operator missing, or another in its place: not the graph's operators.
    let mut other = copy.clone();
    let plan = other.operators.remove("win").expect("win");
    assert!(!graph.keys_match(&other.operators));
    other.operators.insert(Arc::from("wim"), plan);
    assert!(!graph.keys_match(&other.operators));
}

#[test]
fn decision_round_trips_through_json_with_infinity() {
    let spec = job(&CHAIN.replace(
        "{ name: map, kind: map, parallelism: 2 }",
        "{ name: map, kind: map, parallelism: 1, scaling: { max: 1 } }",
    ));
    let ops = vec![
        Synth::source("src", 1, 1000.0, 0.0),
        Synth::op("map", 1, 100.0, 100.0, 1.0),
        Synth::op("sink", 1, 100.0, 5000.0, 0.0),
    ];
    let d = plan(
        &spec,
        &window(&ops, &[0.0, 10.0]),
        &PlannerSettings::default(),
    )
    .expect("plans");
    assert_eq!(d.predicted_latency_seconds, f64::INFINITY);
    let text = serde_json::to_string(&d).expect("serializes");
    let back: Decision = serde_json::from_str(&text).expect("deserializes");
    assert_eq!(back, d);
}

#[test]
fn invalid_settings_rejected() {
    let spec = job(CHAIN);
    let bad = PlannerSettings {
        target_utilization: Some(1.5),
        ..PlannerSettings::default()
    };
    assert!(matches!(
        plan(&spec, &ds2_window(), &bad),
        Err(ModelError::InvalidSettings(_))
    ));
}

/// A random DAG: `n_src` sources, then operators each fed by 1–2 earlier operators.
#[derive(Debug, Clone)]
struct Dag {
    yaml: String,
    ops: Vec<Synth>,
}

/// The job file and synthetic operators of a DAG: `inputs[i]` lists operator i's inputs,
/// the first `n_src` operators are sources (with `backlogs`), `rates[i]` is
/// (parallelism, arrival rate records/s, μ records/s, selectivity), operators without
/// outputs are sinks and every third other one a 1 s window.
fn dag_of(
    n_src: usize,
    inputs: &[Vec<usize>],
    rates: &[(u32, f64, f64, f64)],
    maxes: &[Option<u32>],
    backlogs: &[f64],
) -> Dag {
    let n = inputs.len();
    let has_out: Vec<bool> = (0..n)
        .map(|j| inputs.iter().any(|v| v.contains(&j)))
        .collect();
    let mut yaml = String::from("name: dag\noperators:\n");
    let mut ops = Vec::new();
    for i in 0..n {
        let (p, rate, mu, sel) = rates[i];
        let name = format!("op{i}");
        let scaling = maxes[i]
            .map(|m| format!(", scaling: {{ max: {} }}", m.max(p)))
            .unwrap_or_default();
        if i < n_src {
            yaml += &format!(
                "  - {{ name: {name}, kind: source, parallelism: {p}, rate: {{ constant: 1 }} }}\n"
            );
            ops.push(Synth::source(&name, p, rate, backlogs[i]));
        } else {
            let kind = if !has_out[i] {
                "sink"
            } else if i % 3 == 0 {
                "window, sizeMs: 1000"
            } else {
                "map"
            };
            yaml += &format!("  - {{ name: {name}, kind: {kind}, parallelism: {p}{scaling} }}\n");
            ops.push(Synth::op(&name, p, rate, mu, sel));
        }
    }
    yaml += "edges:\n";
    for (i, ins) in inputs.iter().enumerate() {
        for j in ins {
            yaml += &format!("  - {{ from: op{j}, to: op{i} }}\n");
        }
    }
    Dag { yaml, ops }
}

fn dag() -> impl Strategy<Value = Dag> {
    (1usize..=2, 2usize..=8).prop_flat_map(|(n_src, n_rest)| {
        let n = n_src + n_rest;
        (
            Just(n_src),
            prop::collection::vec((any::<u32>(), any::<u32>(), any::<bool>()), n_rest),
            prop::collection::vec((1u32..=4, 1.0f64..1000.0, 10.0f64..2000.0, 0.1f64..2.0), n),
            prop::collection::vec(prop::option::of(1u32..=6), n),
            prop::collection::vec(0.0f64..3000.0, n_src),
        )
            .prop_map(move |(n_src, links, rates, maxes, backlogs)| {
                let n = n_src + links.len();
                let mut inputs: Vec<Vec<usize>> = vec![Vec::new(); n];
                for (k, (a, b, two)) in links.iter().enumerate() {
                    let i = n_src + k;
                    let first = *a as usize % i;
                    inputs[i].push(first);
                    let second = *b as usize % i;
                    if *two && second != first {
                        inputs[i].push(second);
                    }
                }
                dag_of(n_src, &inputs, &rates, &maxes, &backlogs)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn planned_utilization_within_target(d in dag(), slo in 0.001f64..5.0, rho in 0.3f64..1.0) {
        let spec = job(&d.yaml);
        let settings = PlannerSettings {
            target_utilization: Some(rho),
            latency_slo_seconds: Some(slo),
            ..PlannerSettings::default()
        };
        let dec = plan(&spec, &window(&d.ops, &[0.0, 7.0]), &settings).expect("plans");
        // The greedy phase meets the SLO unless it reported it unattainable.
        if !dec.reasons.iter().any(|r| r.contains("unattainable")) {
            prop_assert!(dec.slo_met(), "{} > {}", dec.predicted_latency_seconds, slo);
        }
        for (name, op) in &dec.operators {
            if op.kind == "source" {
                prop_assert_eq!(op.parallelism, op.current_parallelism);
                continue;
            }
            let hot = format!("{name}: hot-key bottleneck");
            if dec.reasons.iter().any(|r| r.starts_with(&hot)) {
                continue; // kept on purpose: more parallelism cannot help a hot key
            }
            if op.reason.contains("upstream of a bottleneck") {
                // Sized for what the bottleneck below it passes on (FLINK-31215).
                prop_assert!(op.parallelism < op.max_parallelism);
                continue;
            }
            prop_assert!(op.parallelism >= 1 && op.parallelism <= op.max_parallelism);
            // ρ at the target rate (backlog drain included) and at the steady rate; the
            // sizing rate is the larger of the steady rate and ρ_target × the target rate.
            let target_u = op.predicted_utilization.expect("μ known");
            let steady_u = if op.arrival_rate > 0.0 {
                target_u * op.steady_arrival_rate / op.arrival_rate
            } else {
                0.0
            };
            let u = steady_u.max(rho * target_u);
            if op.clamped_at_max {
                prop_assert_eq!(op.parallelism, op.max_parallelism);
                prop_assert!(u > rho);
                let prefix = format!("{name}: needs p=");
                prop_assert!(dec.reasons.iter().any(|r| r.starts_with(&prefix)));
            } else if op.parallelism == op.current_parallelism {
                // Held inside the scale-up tolerance band, or sized at the target.
                prop_assert!(u <= rho * (1.0 + SCALE_UP_TOLERANCE) * (1.0 + 1e-6), "{}: ρ={} > {}", name, u, rho);
            } else {
                prop_assert!(u <= rho * (1.0 + 1e-6), "{}: ρ={} > {}", name, u, rho);
            }
        }
    }

    #[test]
    fn more_input_never_less_parallelism(d in dag(), factor in 1.0f64..4.0, slo in prop::sample::select(vec![0.01, 0.1, 1000.0])) {
        let spec = job(&d.yaml);
        let settings = PlannerSettings {
            latency_slo_seconds: Some(slo),
            ..PlannerSettings::default()
        };
        let lo = plan(&spec, &window(&d.ops, &[0.0, 7.0]), &settings).expect("plans");
        let more: Vec<Synth> = d
            .ops
            .iter()
            .map(|o| {
                let mut o = o.clone();
                o.source = o.source.map(|(g, b)| (g * factor, b * factor));
                o
            })
            .collect();
        let hi = plan(&spec, &window(&more, &[0.0, 7.0]), &settings).expect("plans");
        // When the SLO is unattainable even at maximum parallelism at the higher load the
        // planner deliberately adds no subtasks for latency (see
        // `unattainable_slo_is_reported_without_adding_subtasks`), while at the lower load
        // it may have been attainable there and allocated (and even got stuck a negligible
        // cut above it: seed 44 found op3 32 → 1 so, at an SLO of 0.01 s).
        let gave_up = |d: &Decision| {
            d.reasons
                .iter()
                .any(|r| r.contains("unattainable: even at maximum parallelism"))
        };
        prop_assume!(!gave_up(&hi) || gave_up(&lo));
        // Per operator the utilization sizing (DS2) is monotone: more input, no fewer
        // subtasks. The greedy latency allocation on top may spread its subtasks otherwise
        // at another load (seed 1005: op9 2 → 1 while op6 43 → 128, both plans meeting the
        // SLO), so per operator the higher load's plan is compared with the lower load's
        // sizing, and only the total with the lower load's plan.
        let loose = PlannerSettings {
            latency_slo_seconds: Some(1e9),
            ..settings
        };
        let sized = plan(&spec, &window(&d.ops, &[0.0, 7.0]), &loose).expect("plans");
        for (name, p) in &sized.parallelism {
            prop_assert!(hi.parallelism[name] >= *p, "{}: sized {} → {} with ×{}", name, p, hi.parallelism[name], factor);
        }
        let total = |d: &Decision| d.parallelism.values().map(|&p| u64::from(p)).sum::<u64>();
        prop_assert!(total(&hi) >= total(&lo), "{} → {} subtasks with ×{}", total(&lo), total(&hi), factor);
        if slo >= 1000.0 {
            prop_assert_eq!(&sized.parallelism, &lo.parallelism);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// `onUnattainableSlo: bestEffort` changes a plan only when the SLO is unattainable
    /// even at maximum parallelism, and then only adds subtasks (per operator at least the
    /// utilization-only plan's) and only lowers the slowest path's bound.
    #[test]
    fn best_effort_only_adds_subtasks_and_only_cuts_the_bound(d in dag(), slo in prop::sample::select(vec![0.001, 0.01, 0.1, 1.0])) {
        let mut spec = job(&d.yaml);
        let settings = PlannerSettings {
            latency_slo_seconds: Some(slo),
            ..PlannerSettings::default()
        };
        let w = window(&d.ops, &[0.0, 7.0]);
        let plain = plan(&spec, &w, &settings).expect("plans");
        spec.autoscaler.on_unattainable_slo = UnattainableSlo::BestEffort;
        let best = plan(&spec, &w, &settings).expect("plans");
        let gave_up = plain
            .reasons
            .iter()
            .any(|r| r.contains("unattainable: even at maximum parallelism"));
        if !gave_up {
            prop_assert_eq!(&plain, &best);
        } else {
            for (name, p) in &plain.parallelism {
                prop_assert!(best.parallelism[name] >= *p, "{}: {} → {}", name, p, best.parallelism[name]);
            }
            let (a, b) = (plain.predicted_latency_percentile_seconds, best.predicted_latency_percentile_seconds);
            prop_assert!(b <= a || (a.is_nan() && b.is_nan()) || a == f64::INFINITY, "bound {} → {}", a, b);
            prop_assert!(!best.slo_met());
        }
    }
}

/// A random DAG of `n` operators (operator i fed by up to three earlier ones; those
/// without inputs are sources) as a job spec.
fn random_dag(n: usize, picks: &[(usize, usize)]) -> JobSpec {
    let mut inputs: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(i, j) in picks {
        let i = 1 + i % (n - 1);
        let j = j % i;
        if !inputs[i].contains(&j) && inputs[i].len() < 3 {
            inputs[i].push(j);
        }
    }
    let mut yaml = String::from("name: dag\noperators:\n");
    for (i, ins) in inputs.iter().enumerate() {
        if ins.is_empty() {
            yaml.push_str(&format!(
                "  - {{ name: op{i}, kind: source, rate: {{ constant: 1 }} }}\n"
            ));
        } else {
            yaml.push_str(&format!("  - {{ name: op{i}, kind: map }}\n"));
        }
    }
    yaml.push_str("edges:\n");
    for (i, ins) in inputs.iter().enumerate() {
        for j in ins {
            yaml.push_str(&format!("  - {{ from: op{j}, to: op{i} }}\n"));
        }
    }
    if inputs.iter().skip(1).all(Vec::is_empty) {
        yaml.push_str("  []\n");
        yaml = yaml.replace("edges:\n  []\n", "edges: []\n");
    }
    JobSpec::from_yaml(&yaml).expect("the random DAG parses")
}

proptest! {
    /// The greedy allocation's incremental longest-path update gives the same distances,
    /// predecessors, latency and end as recomputing every operator, after every change of
    /// one operator's term (decreases, as in the allocation, and increases, with ties).
    #[test]
    fn incremental_longest_path_equals_the_full_update(
        n in 2usize..40,
        picks in proptest::collection::vec((0usize..1000, 0usize..1000), 1..100),
        w0 in proptest::collection::vec(0u32..8, 40),
        changes in proptest::collection::vec((0usize..1000, 0u32..8, proptest::bool::ANY), 1..30),
    ) {
        let spec = random_dag(n, &picks);
        let g = JobGraph::new(&spec).expect("a DAG");
        let n = g.topo.len();
        // Small integer terms (and ∞) so that ties between paths are common.
        let term = |x: u32, inf: bool| if inf { f64::INFINITY } else { f64::from(x) * 0.5 };
        let mut w: Vec<f64> = (0..n).map(|i| term(w0[i], false)).collect();
        let (mut dist, mut via) = (Vec::new(), Vec::new());
        g.topo.longest_path_into(&w, &mut dist, &mut via);
        let mut dirty = vec![false; n];
        for (i, x, inf) in changes {
            let i = i % n;
            w[i] = term(x, inf && x == 0);
            let fast = g.propagate(&w, &mut dist, &mut via, i, &mut dirty);
            let (mut d2, mut v2) = (Vec::new(), Vec::new());
            let full = g.longest_path_into(&w, &mut d2, &mut v2);
            let (mut d3, mut v3) = (Vec::new(), Vec::new());
            let reference = g.topo.longest_path_into(&w, &mut d3, &mut v3);
            prop_assert_eq!(full.1, reference.1);
            prop_assert_eq!(full.0.to_bits(), reference.0.to_bits());
            prop_assert_eq!(&v2, &v3);
            prop_assert_eq!(
                d2.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                d3.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
            prop_assert_eq!(fast.1, full.1);
            prop_assert_eq!(fast.0.to_bits(), full.0.to_bits());
            prop_assert_eq!(&via, &v2);
            prop_assert_eq!(
                dist.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                d2.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
            prop_assert!(dirty.iter().all(|d| !d));
        }
    }
}

/// A random job of 3–40 operators for the latency allocation: 1–3 sources, each other
/// operator fed by 1–3 earlier ones (mostly the eight before it: long paths that share
/// operators), every third one a 1 s tumbling window (keyed: key-group jumps, bursts
/// downstream), random running parallelism, rates, μ, selectivity and scaling max.
fn wide_dag() -> impl Strategy<Value = Dag> {
    (1usize..=3, 2usize..=37).prop_flat_map(|(n_src, n_rest)| {
        let n = n_src + n_rest;
        (
            Just(n_src),
            prop::collection::vec((any::<u32>(), any::<u32>(), any::<u32>(), 1u32..=3), n_rest),
            prop::collection::vec((1u32..=4, 1.0f64..500.0, 20.0f64..400.0, 0.3f64..1.5), n),
            prop::collection::vec(prop::option::of(2u32..=40), n),
            prop::collection::vec(0.0f64..2000.0, n_src),
        )
            .prop_map(move |(n_src, links, rates, maxes, backlogs)| {
                let n = n_src + links.len();
                let mut inputs: Vec<Vec<usize>> = vec![Vec::new(); n];
                for (k, &(a, b, c, fan)) in links.iter().enumerate() {
                    let i = n_src + k;
                    for (r, pick) in [a, b, c].into_iter().take(fan as usize).enumerate() {
                        let j = if r == 0 || pick % 10 < 7 {
                            i - 1 - (pick as usize / 10) % i.min(8)
                        } else {
                            pick as usize % i
                        };
                        if !inputs[i].contains(&j) {
                            inputs[i].push(j);
                        }
                    }
                }
                // Non-source operators arrive at no more than 60 % of their capacity.
                let rates: Vec<_> = rates
                    .iter()
                    .enumerate()
                    .map(|(i, &(p, rate, mu, sel))| {
                        let rate = if i < n_src {
                            rate
                        } else {
                            rate.min(0.6 * mu * f64::from(p))
                        };
                        (p, rate, mu, sel)
                    })
                    .collect();
                dag_of(n_src, &inputs, &rates, &maxes, &backlogs)
            })
    })
}

/// `plan` with the reference one-step greedy allocation instead of the rounds.
fn plan_with_reference_greedy(
    spec: &JobSpec,
    window: &[MetricSample],
    settings: &PlannerSettings,
) -> Result<Decision, ModelError> {
    allocate::REFERENCE_GREEDY.with(|r| r.set(true));
    let d = plan(spec, window, settings);
    allocate::REFERENCE_GREEDY.with(|r| r.set(false));
    d
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        max_global_rejects: 4096,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// The latency allocation in rounds against the reference one-step greedy, over random
    /// DAGs at SLOs from 30 % to 100 % of the sized plan's bound (so the allocation runs,
    /// and may meet the SLO or get stuck), with and without a rescale downtime (the hold
    /// check's early stop) and at random target utilizations: the SLO is met exactly when
    /// the greedy meets it (both verdicts from the exact bound); a met SLO's plan has at
    /// most max(2, ⌈2 %⌉) more subtasks than the greedy's (1200 cases while tuning: 1176
    /// equal, 23 fewer — the trim also gives back subtasks the greedy's keyed jumps did not
    /// need —, one with one more, +1 on 267; the SLO verdict equal in all; a sweep of 40
    /// seeds × 200 cases on 2026-12-02 found one at +4 on 267, 1.5 %, at the greedy's
    /// exact bound), an unattainable one's is the greedy's trimmed to its bound: the same
    /// bound, no more subtasks.
    #[test]
    fn rounds_end_where_the_one_step_greedy_ends(
        d in wide_dag(),
        frac in 0.3f64..1.0,
        rho in 0.5f64..0.9,
        downtime in prop::option::of(0.5f64..10.0),
    ) {
        let spec = job(&d.yaml);
        let w = window(&d.ops, &[0.0, 6.0, 12.0]);
        let loose = PlannerSettings {
            target_utilization: Some(rho),
            latency_slo_seconds: Some(1e9),
            rescale_downtime_seconds: downtime,
            ..PlannerSettings::default()
        };
        let sized = plan(&spec, &w, &loose).expect("plans");
        let bound = sized.predicted_latency_percentile_seconds;
        prop_assume!(bound.is_finite() && bound > 0.0);
        let slo = frac * bound;
        let settings = PlannerSettings {
            latency_slo_seconds: Some(slo),
            ..loose
        };
        let rounds = plan(&spec, &w, &settings).expect("plans");
        let reference = plan_with_reference_greedy(&spec, &w, &settings).expect("plans");
        prop_assert_eq!(
            rounds.slo_met(),
            reference.slo_met(),
            "rounds {} s, greedy {} s, SLO {} s",
            rounds.predicted_latency_percentile_seconds,
            reference.predicted_latency_percentile_seconds,
            slo
        );
        let total = |d: &Decision| d.parallelism.values().map(|&p| u64::from(p)).sum::<u64>();
        let (ours, theirs) = (total(&rounds), total(&reference));
        if rounds.slo_met() {
            prop_assert!(rounds.predicted_latency_percentile_seconds <= slo);
            prop_assert!(
                ours <= theirs + theirs.div_ceil(50).max(2),
                "{} subtasks against the greedy's {}",
                ours,
                theirs
            );
        } else {
            // Unattainable: the greedy's allocation, trimmed to its bound.
            prop_assert_eq!(
                rounds.predicted_latency_percentile_seconds.to_bits(),
                reference.predicted_latency_percentile_seconds.to_bits()
            );
            prop_assert!(ours <= theirs, "{} subtasks against the greedy's {}", ours, theirs);
        }
    }
}

/// A case the proptest above found (CI, 2026-12-02): the SLO is unattainable (the rounds
/// and the greedy both stuck at the same bound), and the rounds had taken `op5` to 124
/// subtasks where the one-step greedy, which stops at the first slowest path it cannot
/// cut, took it to 118. An unattainable SLO is now allocated by the greedy, trimmed. (The SLO
/// factor was 0.4517 before sizing drained backlogs on full capacity, 0.4125 gives the case
/// again: op4 stuck at its max 27, op5 at 118.)
#[test]
fn an_unattainable_slo_is_allocated_as_the_one_step_greedy_allocates_it() {
    let yaml = "name: dag\noperators:\n  - { name: op0, kind: source, parallelism: 1, rate: { constant: 1 } }\n  - { name: op1, kind: source, parallelism: 1, rate: { constant: 1 } }\n  - { name: op2, kind: map, parallelism: 1 }\n  - { name: op3, kind: window, sizeMs: 1000, parallelism: 1 }\n  - { name: op4, kind: sink, parallelism: 1, scaling: { max: 27 } }\n  - { name: op5, kind: sink, parallelism: 1 }\nedges:\n  - { from: op0, to: op2 }\n  - { from: op2, to: op3 }\n  - { from: op1, to: op3 }\n  - { from: op2, to: op4 }\n  - { from: op3, to: op4 }\n  - { from: op3, to: op5 }\n  - { from: op2, to: op5 }\n";
    let op = |name: &str, mu: Option<f64>, selectivity: f64, source: Option<(f64, f64)>| Synth {
        name: name.into(),
        parallelism: 1,
        // 10 rec/s: 120 records over the window, enough for op2's selectivity 1.47
        // to be used (`MIN_SELECTIVITY_RECORDS`; the rates planned come from the
        // sources, so the figure changes nothing else).
        input_rate: if source.is_some() { 0.0 } else { 10.0 },
        mu,
        selectivity,
        source,
    };
    let ops = [
        op(
            "op0",
            None,
            1.0,
            Some((393.011_801_836_777_75, 1_194.984_462_736_083_7)),
        ),
        op("op1", None, 1.0, Some((457.339_693_289_571_47, 0.0))),
        op(
            "op2",
            Some(107.277_918_631_376_3),
            1.469_891_152_438_079_8,
            None,
        ),
        op(
            "op3",
            Some(270.454_648_079_631_6),
            0.407_001_271_105_859,
            None,
        ),
        op("op4", Some(187.053_061_566_701_44), 0.3, None),
        op("op5", Some(81.431_340_212_878_07), 0.3, None),
    ];
    let spec = job(yaml);
    let w = window(&ops, &[0.0, 6.0, 12.0]);
    let loose = PlannerSettings {
        target_utilization: Some(0.659_232_537_718_986_5),
        latency_slo_seconds: Some(1e9),
        ..PlannerSettings::default()
    };
    let sized = plan(&spec, &w, &loose).expect("plans");
    let settings = PlannerSettings {
        latency_slo_seconds: Some(0.4125 * sized.predicted_latency_percentile_seconds),
        ..loose
    };
    let rounds = plan(&spec, &w, &settings).expect("plans");
    let reference = plan_with_reference_greedy(&spec, &w, &settings).expect("plans");
    assert!(!rounds.slo_met() && !reference.slo_met());
    assert!(
        rounds.reasons.iter().any(|r| r.contains("unattainable")),
        "{:?}",
        rounds.reasons
    );
    assert_eq!(
        rounds.predicted_latency_percentile_seconds.to_bits(),
        reference.predicted_latency_percentile_seconds.to_bits(),
        "the stuck path keeps its bound"
    );
    assert_eq!(rounds.parallelism["op5"], 118, "{:?}", rounds.parallelism);
    assert_eq!(rounds.parallelism, reference.parallelism);
}

#[test]
fn a_range_subset_never_exceeds_the_busiest_range() {
    for k in [1u32, 7, 128, 1000] {
        for p0 in [1u32, 2, 3, 5, 6] {
            let shares: Vec<f64> = (0..p0.min(k)).map(|j| f64::from(1 + j % 2)).collect();
            let total: f64 = shares.iter().sum();
            let shares: Vec<f64> = shares.iter().map(|s| s / total).collect();
            let load = key_group_load(&shares, k);
            let mut prefix = vec![0.0];
            for l in &load {
                prefix.push(prefix.last().copied().unwrap_or(0.0) + l);
            }
            let ((a, b), largest) = hottest_run(&load);
            assert_eq!(
                largest.to_bits(),
                load.iter().copied().fold(0.0, f64::max).to_bits()
            );
            assert!(a < b && b <= k);
            assert!(
                load[a as usize..b as usize]
                    .iter()
                    .all(|&x| x == load[a as usize])
            );
            assert!(load.iter().all(|&x| x <= load[a as usize]));
            for q in 1..=k.min(200) {
                let full = busiest_range_load(&prefix, q, k);
                let part = busiest_range_load_over(&prefix, q, k, a, b);
                assert!(part <= full, "k={k} p0={p0} q={q}: {part} > {full}");
                // One of the terms: a range's load at q.
                assert!(
                    (0..q).any(|j| {
                        let r = key_group_range(j, q, k);
                        prefix[r.end as usize] - prefix[r.start as usize] == part
                    }),
                    "k={k} p0={p0} q={q}"
                );
                // Any run: still a lower bound.
                for (x, y) in [(0, k), (k / 2, k), (0, 1), (k - 1, k)] {
                    assert!(busiest_range_load_over(&prefix, q, k, x, y) <= full);
                }
                // Stopping early answers a monotone question as the full maximum does.
                for t in [
                    0.0,
                    part * 0.5,
                    part,
                    part * (1.0 + 1e-15),
                    full,
                    full * 2.0,
                ] {
                    let stopped = busiest_range_load_over_until(&prefix, q, k, a, b, |v| v >= t);
                    assert_eq!(stopped >= t, part >= t, "k={k} p0={p0} q={q} t={t}");
                    assert!(stopped <= part);
                    let stopped =
                        busiest_of_ranges_until(&prefix, q, k, 0, u64::from(q) - 1, |v| v > t);
                    assert_eq!(stopped > t, full > t, "k={k} p0={p0} q={q} t={t}");
                }
            }
        }
    }
}

#[test]
fn busiest_range_load_follows_the_key_group_assignment() {
    for k in [1u32, 7, 128, 1000] {
        let load: Vec<f64> = (0..k).map(|g| f64::from(1 + g % 5)).collect();
        let mut prefix = vec![0.0];
        for l in &load {
            prefix.push(prefix.last().copied().unwrap_or(0.0) + l);
        }
        for q in 1..=k.min(200) {
            let reference = (0..q)
                .map(|j| {
                    let r = key_group_range(j, q, k);
                    prefix[r.end as usize] - prefix[r.start as usize]
                })
                .fold(0.0, f64::max);
            assert_eq!(
                busiest_range_load(&prefix, q, k).to_bits(),
                reference.to_bits()
            );
        }
    }
}
