//! Planner benchmarks: `plan()` on a random 200-operator DAG with a synthetic metric window, and
//! `Autoscaler::decide` on a small six-operator job (the simulator's hot path: one call per
//! decision interval, ~318 k calls for a 55-day replay).

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group};
use streamscale_controller::model::forecast::{ForecastConfig, RateHistory};
use streamscale_controller::model::{
    Autoscaler, GuardSettings, MetricSample, PlannerSettings, ServiceMoments, SubtaskSample,
    Verdict, plan,
};
use streamscale_engine::keygroup::key_group_range;
use streamscale_engine::spec::{
    AutoscalerSpec, EdgeSpec, ForecastMode, ForecastSpec, JobSpec, OperatorKind, OperatorSpec,
    RateSpec, ScalingBounds,
};

/// Marsaglia's xorshift64: a tiny deterministic generator (no `rand` dependency).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const OPERATORS: usize = 200;
const SOURCES: usize = 4;

/// The 200-operator job and the rates its metric windows are made from.
struct Dag {
    spec: JobSpec,
    gamma: Vec<f64>,
    lambda: Vec<f64>,
    sel: Vec<f64>,
    mu: Vec<f64>,
    par: Vec<u32>,
    outdeg: Vec<usize>,
    keyed: Vec<bool>,
    /// The keyed operator with a hot key group: at p=1, its group 0 takes [`HOT_SHARE`] of the
    /// input, 0.8 × its μ at the target rate (a hot-key bottleneck to the planner, held where
    /// the group has a subtask of its own).
    hot: usize,
}

/// Key groups (the job's max parallelism).
const KEY_GROUPS: u32 = 128;
/// The hot operator's hottest key group's share of its input.
const HOT_SHARE: f64 = 0.5;
/// The hot operator's target rate over its steady input rate in the bench window (the sources'
/// backlog drained within the catch-up time, the forecast's rise ahead).
const TARGET_OVER_STEADY: f64 = 3.75;
/// Records per timed batch in the bench's service sums.
const BATCH: f64 = 8.0;

/// Seconds of the bench window's first sample: two days and a bit into the forecast's
/// history, on the rising side of its daily cycle.
const T0: f64 = 2.0 * 86_400.0 + 1_000.0;

/// A 200-operator DAG (4 sources, every other operator fed by 1–3 earlier ones) and a
/// 6-sample window whose counters follow flow-conserving rates (each operator splits its
/// output evenly over its outgoing edges, so rates stay bounded through the graph). Keyed
/// (window) operators get skewed subtasks: odd subtasks take twice the input of even ones, and
/// list their busiest key groups as the engine does (`Dag::listed_groups`; one operator has a
/// hot group the planner isolates and holds); every other subtask reports timed-batch service
/// sums (measured cs 0.5, 0.9 or 1.3, [`cs_of`]). Forecasting is on
/// (`autoscaler.forecast.mode: on`, a daily season).
fn build(seed: u64) -> (JobSpec, Vec<MetricSample>) {
    let dag = build_dag(seed);
    let window = dag.window(&dag.par, 1.0, T0);
    (dag.spec, window)
}

fn build_dag(seed: u64) -> Dag {
    let mut rng = XorShift(seed);
    let mut inputs: Vec<Vec<usize>> = vec![Vec::new(); OPERATORS];
    for (i, ins) in inputs.iter_mut().enumerate().skip(SOURCES) {
        let k = 1 + rng.below(3);
        for _ in 0..k {
            let j = if rng.unit() < 0.7 && i > SOURCES + 8 {
                i - 1 - rng.below(8) // mostly local edges: long paths
            } else {
                rng.below(i)
            };
            if !ins.contains(&j) {
                ins.push(j);
            }
        }
    }
    let mut outdeg = vec![0usize; OPERATORS];
    for ins in &inputs {
        for &j in ins {
            outdeg[j] += 1;
        }
    }
    let name = |i: usize| format!("op{i:03}");
    let mut keyed = vec![false; OPERATORS];
    let mut operators = Vec::new();
    let mut gamma = vec![0.0; OPERATORS];
    let mut lambda = vec![0.0; OPERATORS];
    let mut sel = vec![1.0; OPERATORS];
    let mut mu = vec![0.0; OPERATORS];
    let mut par = vec![1u32; OPERATORS];
    for i in 0..OPERATORS {
        let kind = if i < SOURCES {
            gamma[i] = 2_000.0 + 8_000.0 * rng.unit();
            lambda[i] = gamma[i];
            OperatorKind::Source {
                rate: RateSpec::Constant(gamma[i]),
                keys: 1000,
                count: None,
                nexmark: None,
                kafka: None,
            }
        } else {
            lambda[i] = inputs[i]
                .iter()
                .map(|&j| lambda[j] * sel[j] / outdeg[j].max(1) as f64)
                .sum();
            if outdeg[i] == 0 {
                OperatorKind::Sink {
                    output: None,
                    delivery: Default::default(),
                    kafka: None,
                }
            } else if rng.below(4) == 0 {
                keyed[i] = true;
                OperatorKind::Window {
                    size_ms: 1000,
                    aggregates: None,
                }
            } else {
                OperatorKind::Map
            }
        };
        sel[i] = if i < SOURCES { 1.0 } else { 0.5 + rng.unit() };
        mu[i] = 200.0 + 2_000.0 * rng.unit();
        par[i] = 1 + rng.below(6) as u32;
        operators.push(OperatorSpec {
            name: name(i),
            parallelism: par[i],
            cpu: 0.0,
            io: 0.0,
            scaling: ScalingBounds::default(),
            kind,
        });
    }
    let edges = inputs
        .iter()
        .enumerate()
        .flat_map(|(i, ins)| {
            ins.iter().map(move |&j| EdgeSpec {
                from: name(j),
                to: name(i),
            })
        })
        .collect();
    // Start from a parsed minimal job so fields added to JobSpec later keep their defaults.
    let mut spec = JobSpec::from_yaml(
        "name: bench\noperators:\n  - { name: s, kind: source, rate: { constant: 1 } }\nedges: []\n",
    )
    .expect("the minimal job parses");
    spec.max_parallelism = KEY_GROUPS;
    spec.channel_capacity = 1024;
    spec.operators = operators;
    spec.edges = edges;
    spec.autoscaler = AutoscalerSpec {
        target_utilization: 0.7,
        latency_slo_seconds: 0.09,
        catch_up_seconds: 30.0,
        forecast: Some(ForecastSpec {
            mode: ForecastMode::On,
            ..ForecastSpec::default()
        }),
        ..AutoscalerSpec::default()
    };
    // The keyed operator with the most input gets one hot key group: at p=1 its group 0 carries
    // HOT_SHARE of the input, more than one subtask takes at ρ_target 0.7 but less than its μ.
    let hot = (0..OPERATORS)
        .filter(|&i| keyed[i])
        .max_by(|&a, &b| lambda[a].total_cmp(&lambda[b]))
        .expect("the DAG has keyed operators");
    par[hot] = 1;
    // The planner sizes for the target rate, with the sources' backlog drained and the forecast
    // ahead: about TARGET_OVER_STEADY × the steady rate here. The group takes 0.8 × μ there.
    mu[hot] = HOT_SHARE * lambda[hot] * TARGET_OVER_STEADY / 0.8;
    spec.operators[hot].parallelism = 1;
    Dag {
        spec,
        gamma,
        lambda,
        sel,
        mu,
        par,
        outdeg,
        keyed,
        hot,
    }
}

impl Dag {
    /// Six scrapes 5 s apart from `t0` at parallelism `par`, every μ times `mu_scale`.
    fn window(&self, par: &[u32], mu_scale: f64, t0: f64) -> Vec<MetricSample> {
        let name = |i: usize| format!("op{i:03}");
        [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]
            .iter()
            .map(|&t| MetricSample {
                at_seconds: t0 + t,
                operators: (0..OPERATORS)
                    .map(|i| {
                        let p = par[i];
                        // Subtask weights: skewed for keyed operators, even otherwise.
                        let w = |j: u32| {
                            if self.keyed[i] {
                                f64::from(1 + j % 2)
                            } else {
                                1.0
                            }
                        };
                        let total: f64 = (0..p).map(w).sum();
                        let subs = (0..p)
                            .map(|j| {
                                let share = w(j) / total;
                                if i < SOURCES {
                                    SubtaskSample {
                                        records_out: self.gamma[i] * t * share,
                                        source_arrivals: Some(self.gamma[i] * t * share),
                                        source_backlog: Some(self.gamma[i] * 2.0 * share),
                                        ..SubtaskSample::default()
                                    }
                                } else {
                                    let rin = self.lambda[i] * t * share;
                                    let busy = rin / (self.mu[i] * mu_scale);
                                    SubtaskSample {
                                        records_in: rin,
                                        // Gain per edge sel/outdeg: flow is conserved overall.
                                        records_out: rin * self.sel[i]
                                            / self.outdeg[i].max(1) as f64,
                                        busy_seconds: busy,
                                        key_group_shares: if self.keyed[i] {
                                            self.listed_groups(i, j, p)
                                        } else {
                                            Vec::new()
                                        },
                                        service: Some(service_sums(rin, busy, cs_of(i))),
                                        ..SubtaskSample::default()
                                    }
                                }
                            })
                            .collect();
                        (name(i), subs)
                    })
                    .collect::<BTreeMap<_, _>>(),
            })
            .collect()
    }

    /// The key groups keyed operator `i`'s subtask `j` of `p` lists, as the engine does (its
    /// busiest 8 with their share of its input): its range's groups evenly, except the hot
    /// operator's group 0, which takes [`HOT_SHARE`].
    fn listed_groups(&self, i: usize, j: u32, p: u32) -> Vec<(u32, f64)> {
        let range = key_group_range(j, p, KEY_GROUPS);
        let n = f64::from(range.end - range.start);
        if i == self.hot && range.contains(&0) {
            let rest = (1.0 - HOT_SHARE) / (n - 1.0).max(1.0);
            return std::iter::once((0, HOT_SHARE))
                .chain(range.clone().skip(1).take(7).map(|g| (g, rest)))
                .collect();
        }
        range.take(8).map(|g| (g, 1.0 / n)).collect()
    }

    /// Two days of the sources' total input rate with a daily cycle (±20% around the bench
    /// window's rate, rising at the bench window), scraped every 5 min, as the forecast's
    /// history.
    fn history(&self) -> RateHistory {
        let cfg = ForecastConfig::of(&self.spec).expect("forecasting is on");
        let total: f64 = self.gamma.iter().sum();
        let mut h = RateHistory::new(&cfg);
        let mut arrivals = 0.0;
        let mut t = 0.0;
        while t < T0 - 300.0 {
            let rate = total * (1.0 + 0.2 * (2.0 * std::f64::consts::PI * t / 86_400.0).sin());
            arrivals += rate * 300.0;
            t += 300.0;
            let sample = MetricSample {
                at_seconds: t,
                operators: (0..SOURCES)
                    .map(|i| {
                        let sub = SubtaskSample {
                            source_arrivals: Some(arrivals * self.gamma[i] / total),
                            source_backlog: Some(0.0),
                            ..SubtaskSample::default()
                        };
                        (format!("op{i:03}"), vec![sub])
                    })
                    .collect(),
            };
            h.observe(&cfg, &[sample], &self.spec);
        }
        h
    }
}

/// The bench's measured service-time coefficient of variation of operator `i`: 0.5, 0.9 or 1.3.
fn cs_of(i: usize) -> f64 {
    0.5 + 0.4 * (i % 3) as f64
}

/// Cumulative timed-batch sums of a subtask that processed `records` records in `seconds`, in
/// batches of [`BATCH`] records whose per-record service times have coefficient of variation
/// `cs` (independent, so a batch's time has variance BATCH·σ², σ = cs·m): the estimator's σ̂²
/// reads σ² · n/(n − BATCH).
fn service_sums(records: f64, seconds: f64, cs: f64) -> ServiceMoments {
    let batches = records / BATCH;
    let m = if records > 0.0 {
        seconds / records
    } else {
        0.0
    };
    let var_batch = BATCH * (cs * m).powi(2);
    ServiceMoments {
        records,
        seconds,
        seconds_sq: batches * ((BATCH * m).powi(2) + var_batch),
        record_seconds: BATCH * seconds,
        records_sq: BATCH * records,
    }
}

/// Planner settings for the 200-operator DAG with everything on: the SLO on the p99 bound
/// (tight enough that greedy marginal allocation runs on the slowest path, which crosses
/// several 1 s windows and their bursts), and a 5 s rescale downtime (the plan is made
/// without and, as it rescales, with the downtime's backlog).
fn dag_settings(spec: &JobSpec, window: &[MetricSample]) -> PlannerSettings {
    let loose = PlannerSettings {
        latency_slo_seconds: Some(1e9),
        rescale_downtime_seconds: Some(5.0),
        ..PlannerSettings::default()
    };
    let l0 = plan(spec, window, &loose)
        .expect("the benchmark job plans")
        .predicted_latency_percentile_seconds;
    // The tightest of these SLOs that greedy allocation can still meet.
    let mut chosen = loose.clone();
    for f in [0.98, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6] {
        let s = PlannerSettings {
            latency_slo_seconds: Some(f * l0),
            ..loose.clone()
        };
        let d = plan(spec, window, &s).expect("the benchmark job plans");
        if d.reasons.iter().any(|r| r.contains("unattainable")) {
            break;
        }
        chosen = s;
    }
    chosen
}

/// The 200-operator bench inputs: the job, its window, the planner settings, and the
/// guarded policy with everything on, primed with a previous window, and the time of the
/// benched decision.
struct DagBench {
    spec: JobSpec,
    window: Vec<MetricSample>,
    settings: PlannerSettings,
    auto: Autoscaler,
    now: f64,
}

fn dag_bench() -> DagBench {
    let dag = build_dag(0x5eed_cafe_f00d_d00d);
    let (spec, window) = build(0x5eed_cafe_f00d_d00d);
    let settings = dag_settings(&spec, &window);
    // The window holds what the engine reports: measured service cs and key-group lists.
    let est =
        streamscale_controller::model::estimate(&spec, &window).expect("the window estimates");
    let read = |i: usize| &est.operators[format!("op{i:03}").as_str()];
    let cs = read(SOURCES).service_cv;
    assert!(
        cs.is_some_and(|cs| (cs - cs_of(SOURCES)).abs() < 0.05),
        "measured cs {cs:?}, bench {}",
        cs_of(SOURCES)
    );
    assert!(!read(dag.hot).subtask_key_group_shares.is_empty());
    // The guarded policy on the same job with everything on: forecasting (two days of
    // history, a usable forecast above the measured rate), the learned correction (the
    // previous window ran one subtask fewer of every operator with more than one, 5% faster
    // per subtask: factors below 1), skewed keyed operators, guards and the rescale-cost check
    // (a fresh Autoscaler per call would rebuild the graph; this one keeps it, as the operator
    // and the simulator do).
    let mut auto = Autoscaler::new(GuardSettings {
        planner: settings.clone(),
        ..GuardSettings::default()
    });
    auto.set_rate_history(dag.history());
    let before: Vec<u32> = dag
        .par
        .iter()
        .enumerate()
        .map(|(i, &p)| if i < SOURCES { p } else { p.max(2) - 1 })
        .collect();
    let mut spec_before = spec.clone();
    for (o, &p) in spec_before.operators.iter_mut().zip(&before) {
        o.parallelism = p;
    }
    let _ = auto.decide(
        T0 - 40.0,
        &dag.window(&before, 1.05, T0 - 70.0),
        &spec_before,
    );
    DagBench {
        spec,
        window,
        settings,
        auto,
        now: T0 + 30.0,
    }
}

/// `STREAMSCALE_BENCH_CALLS=N`: instead of criterion, N calls of `plan` and then N of
/// `Autoscaler::decide` on the 200-operator DAG, each inside [`count_plan`] / [`count_decide`]
/// so that `valgrind --tool=callgrind` can count instructions per call exactly (the number
/// of calls under criterion depends on the time they take).
///
/// With `STREAMSCALE_BENCH_PRINT` set as well, prints the bench's `plan` and its first two
/// `Autoscaler::decide` verdicts as JSON instead (to compare the decisions of two builds).
fn count_calls(n: usize) {
    let mut b = dag_bench();
    // One uncounted decision first: the learned correction takes its notes from the change
    // since the priming window once, as under criterion, whose later calls see none.
    let first = b.auto.decide(b.now, &b.window, &b.spec);
    if std::env::var_os("STREAMSCALE_BENCH_PRINT").is_some() {
        // The decisions themselves (JSON, floats round-trip exact), to compare two builds.
        let plan = plan(&b.spec, &b.window, &b.settings).expect("the benchmark job plans");
        println!(
            "{}",
            serde_json::to_string_pretty(&plan).expect("a plan serializes")
        );
        println!(
            "{}",
            serde_json::to_string_pretty(&first).expect("a verdict serializes")
        );
        let second = b.auto.decide(b.now, &b.window, &b.spec);
        println!(
            "{}",
            serde_json::to_string_pretty(&second).expect("a verdict serializes")
        );
        return;
    }
    black_box(first);
    for _ in 0..n {
        black_box(count_plan(&b.spec, &b.window, &b.settings));
    }
    for _ in 0..n {
        black_box(count_decide(&mut b.auto, b.now, &b.window, &b.spec));
    }
}

#[inline(never)]
fn count_plan(spec: &JobSpec, window: &[MetricSample], settings: &PlannerSettings) -> Option<u32> {
    plan(black_box(spec), black_box(window), black_box(settings))
        .ok()
        .map(|d| d.parallelism.values().sum())
}

#[inline(never)]
fn count_decide(auto: &mut Autoscaler, now: f64, window: &[MetricSample], spec: &JobSpec) -> bool {
    matches!(
        auto.decide(black_box(now), black_box(window), black_box(spec)),
        Verdict::Rescale(_)
    )
}

fn bench_plan(c: &mut Criterion) {
    let DagBench {
        spec,
        window,
        settings,
        mut auto,
        now,
    } = dag_bench();
    let d = plan(&spec, &window, &settings).expect("the benchmark job plans");
    eprintln!(
        "plan_200_operator_dag: {} operators, {} edges, {} subtasks planned (from {}), p99 bound {:.4} s (SLO {} s), mean {:.4} s",
        spec.operators.len(),
        spec.edges.len(),
        d.parallelism.values().sum::<u32>(),
        d.current.values().sum::<u32>(),
        d.predicted_latency_percentile_seconds,
        d.latency_slo_seconds,
        d.predicted_latency_seconds
    );
    for r in &d.reasons {
        if r.contains("latency") || r.contains("downtime") {
            eprintln!("  {}", r.chars().take(300).collect::<String>());
        }
    }
    c.bench_function("plan_200_operator_dag", |b| {
        b.iter(|| plan(black_box(&spec), black_box(&window), black_box(&settings)))
    });
    let v = auto.decide(now, &window, &spec);
    eprintln!(
        "decide_200_operator_dag: {}",
        match &v {
            Verdict::Rescale(d) =>
                format!("rescale; {}", d.reasons.last().map_or("", String::as_str)),
            Verdict::Hold { reason, .. } => format!("hold: {reason}"),
        }
    );
    let all_on = match &v {
        Verdict::Rescale(d) => d
            .reasons
            .iter()
            .chain(d.operators.values().map(|o| &o.reason))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        Verdict::Hold { .. } => String::new(),
    };
    for want in ["forecast (Holt-Winters", "scalability factor", "key groups"] {
        assert!(
            all_on.contains(want),
            "the decide bench runs with `{want}` on"
        );
    }
    for r in all_on.lines().filter(|r| r.starts_with("forecast")) {
        eprintln!("  {}", r.chars().take(300).collect::<String>());
    }
    c.bench_function("decide_200_operator_dag", |b| {
        b.iter(|| auto.decide(black_box(now), black_box(&window), black_box(&spec)))
    });
}

/// The simulator's six-operator job (examples/sim/six-ops.yaml with a constant rate).
const SIX_OPS: &str = r"
name: six-ops
maxParallelism: 128
channelCapacity: 64
operators:
  - { name: source, kind: source, keys: 1000, rate: { constant: 100 } }
  - { name: parse, kind: map, cpu: 300 }
  - { name: enrich, kind: map, cpu: 20, io: 5000 }
  - { name: spam, kind: filter, keep: 0.8, cpu: 50 }
  - { name: counts, kind: window, sizeMs: 1000, cpu: 20, io: 1000 }
  - { name: sink, kind: sink }
edges:
  - { from: source, to: parse }
  - { from: parse, to: enrich }
  - { from: enrich, to: spam }
  - { from: spam, to: counts }
  - { from: counts, to: sink }
autoscaler: { targetUtilization: 0.7, latencySloSeconds: 1.0, catchUpSeconds: 60 }
";

/// A 60 s window of 5 scrapes 15 s apart (the simulator's defaults) for the six-operator job
/// at `gamma` records/s with the given parallelism per operator (source first).
fn six_ops_window(gamma: f64, par: [u32; 6], t0: f64) -> Vec<MetricSample> {
    let names = ["source", "parse", "enrich", "spam", "counts", "sink"];
    // Per-operator (input rate multiplier, μ per subtask, selectivity).
    let ops = [
        (1.0, 0.0, 1.0),
        (1.0, 3_000.0, 1.0),
        (1.0, 190.0, 1.0),
        (1.0, 18_000.0, 0.8),
        (0.8, 950.0, 0.1),
        (0.08, 50_000.0, 0.0),
    ];
    (0..5)
        .map(|k| {
            let t = 15.0 * f64::from(k);
            MetricSample {
                at_seconds: t0 + t,
                operators: names
                    .iter()
                    .zip(ops)
                    .zip(par)
                    .enumerate()
                    .map(|(i, ((name, (m, mu, sel)), p))| {
                        let pf = f64::from(p);
                        let subs = (0..p)
                            .map(|_| {
                                if i == 0 {
                                    SubtaskSample {
                                        records_out: gamma * t / pf,
                                        source_arrivals: Some(gamma * t / pf),
                                        source_backlog: Some(0.0),
                                        ..SubtaskSample::default()
                                    }
                                } else {
                                    let rin = gamma * m * t / pf;
                                    SubtaskSample {
                                        records_in: rin,
                                        records_out: rin * sel,
                                        busy_seconds: rin / mu,
                                        idle_seconds: (t - rin / mu).max(0.0),
                                        ..SubtaskSample::default()
                                    }
                                }
                            })
                            .collect();
                        ((*name).to_string(), subs)
                    })
                    .collect::<BTreeMap<_, _>>(),
            }
        })
        .collect()
}

fn bench_decide(c: &mut Criterion) {
    let spec = JobSpec::from_yaml(SIX_OPS).expect("the six-operator job parses");
    // Steady: 100 rec/s on the parallelism the plan wants (enrich 1 → 1 at ρ 0.53): a hold.
    let steady = six_ops_window(100.0, [1, 1, 1, 1, 1, 1], 1000.0);
    // Ramp: 160 rec/s on the same parallelism: a scale-up of enrich (every call, state kept).
    let ramp = six_ops_window(160.0, [1, 1, 1, 1, 1, 1], 1000.0);
    let mut auto = Autoscaler::new(GuardSettings::default());
    let hold = auto.decide(2000.0, &steady, &spec);
    assert!(matches!(hold, Verdict::Hold { .. }), "{hold:?}");
    let up = auto.decide(2000.0, &ramp, &spec);
    assert!(matches!(up, Verdict::Rescale(_)), "{up:?}");
    c.bench_function("decide_6_operator_hold", |b| {
        b.iter(|| auto.decide(black_box(2000.0), black_box(&steady), black_box(&spec)))
    });
    c.bench_function("decide_6_operator_scale_up", |b| {
        b.iter(|| auto.decide(black_box(2000.0), black_box(&ramp), black_box(&spec)))
    });
}

criterion_group!(benches, bench_plan, bench_decide);

fn main() {
    if let Some(n) = std::env::var("STREAMSCALE_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        count_calls(n);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
