//! `streamscale-sim`: replays a workload trace through a model of a job under several
//! autoscaling policies and compares them.
//!
//! `streamscale-sim JOB.yaml --trace FILE [--policy NAME[,NAME...]|all] [--slo SECONDS]
//! [--latency-percentile P] [--on-unattainable-slo utilizationOnly|bestEffort]
//! [--report DIR] [--scale X] [--speedup N] [--gaps hold|zero] [--start S] [--end S]
//! [--duration S] [--mode fast|event] [--step S] [--interval S] [--window S] [--seed N]
//! [--sim-config FILE] [--downtime S] [--seconds-per-mb S] [--service OP=MEAN_US[:CV],...]
//! [--service-rates FILE]
//! [--threads N] [--engine-p99] [--quiet] [--plot png|svg]`

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;
use indicatif::ProgressDrawTarget;
use streamscale_engine::spec::{GapPolicy, JobSpec, OperatorKind, RateSpec, UnattainableSlo};
use streamscale_simulations::config::SimConfig;
use streamscale_simulations::model::JobModel;
use streamscale_simulations::policy::POLICIES;
use streamscale_simulations::rates::ServiceRates;
use streamscale_simulations::run_settings::{self, RunSettings};
use streamscale_simulations::runner::{Mode, ReplayOptions, default_step, replay_all};
use streamscale_simulations::{progress, report};

/// Replays a trace through a model of a job under several autoscaling policies.
#[derive(Debug, Parser)]
#[command(name = "streamscale-sim", version, allow_negative_numbers = true)]
struct Args {
    /// Job spec (YAML), the same file the engine runs.
    job: PathBuf,
    /// Trace file (`t_seconds,rate`) replacing the first source's rate.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Policies, comma-separated, or `all`.
    #[arg(long, default_value = "all")]
    policy: String,
    /// Latency SLO, seconds (default: the job's autoscaler.latencySloSeconds; with
    /// --service-rates, the replayed run's).
    #[arg(long)]
    slo: Option<f64>,
    /// Percentile the SLO is on, in (0, 1) (default: the job's autoscaler.latencyPercentile,
    /// 0.99 = p99; with --service-rates, the replayed run's): the latency graded, planned for
    /// and plotted.
    #[arg(long)]
    latency_percentile: Option<f64>,
    /// What streamscale's planner does when the SLO is unattainable even at maximum
    /// parallelism by its bound: `utilizationOnly` (no subtasks for latency) or `bestEffort`
    /// (subtasks down to 1.1 × the lowest bound there) (default: the job's
    /// autoscaler.onUnattainableSlo, itself `utilizationOnly` by default).
    #[arg(long, value_parser = ["utilizationOnly", "bestEffort"])]
    on_unattainable_slo: Option<String>,
    /// Report directory (summary.json, timeseries.csv, comparison.png).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Factor on the trace's rates.
    #[arg(long)]
    scale: Option<f64>,
    /// Trace-seconds per simulated second.
    #[arg(long)]
    speedup: Option<f64>,
    /// Meaning of missing trace rows: `hold` the last rate or `zero`.
    #[arg(long)]
    gaps: Option<String>,
    /// Trace time to start at, seconds.
    #[arg(long)]
    start: Option<f64>,
    /// Trace time to end at, seconds.
    #[arg(long)]
    end: Option<f64>,
    /// Simulated seconds to replay (default: the trace window / speedup).
    #[arg(long)]
    duration: Option<f64>,
    /// `fast` (fluid, discrete time) or `event` (discrete events, for short windows).
    #[arg(long, default_value = "fast")]
    mode: String,
    /// Step, simulated seconds (default: 1 s up to 6 h, else 10 s).
    #[arg(long)]
    step: Option<f64>,
    /// Metrics (decision) interval of streamscale and ds2, seconds (default 5, the operator's;
    /// with --service-rates, the replayed run's).
    #[arg(long)]
    interval: Option<f64>,
    /// Metric window of streamscale and ds2, seconds (default 30, the operator's; with
    /// --service-rates, the replayed run's).
    #[arg(long)]
    window: Option<f64>,
    /// streamscale: seconds after a (re)start before deciding (default 10, the operator's;
    /// with --service-rates, the replayed run's).
    #[arg(long)]
    stabilization: Option<f64>,
    /// streamscale: seconds a scale-down must be wanted (default 30, the operator's; with
    /// --service-rates, the replayed run's).
    #[arg(long)]
    scale_down_delay: Option<f64>,
    /// streamscale: least metric history before deciding, seconds (default max(window/2,
    /// 2 × interval); with --service-rates, the replayed run's).
    #[arg(long)]
    guard_window: Option<f64>,
    /// Seed of the event-level mode.
    #[arg(long)]
    seed: Option<u64>,
    /// Simulator settings (YAML; see the crate docs of `config`).
    #[arg(long)]
    sim_config: Option<PathBuf>,
    /// Fixed downtime per rescale, seconds (default 0.6).
    #[arg(long)]
    downtime: Option<f64>,
    /// Extra downtime per MB of keyed state, seconds (default 0.02).
    #[arg(long)]
    seconds_per_mb: Option<f64>,
    /// Service-time overrides: `op=MEAN_US[:CV],...`.
    #[arg(long)]
    service: Option<String>,
    /// Measured true processing rates over time to replay instead of the constant service
    /// times (CSV `t_s,<op>...`, records/s per subtask; `streamscale run --report DIR` writes
    /// DIR/service_rates.csv; format in `simulations/src/rates.rs`). The settings of
    /// --interval, --window, --guard-window, --stabilization, --scale-down-delay, --slo and
    /// --latency-percentile not given come from the run's DIR/summary.json when it records
    /// them; one line says which.
    #[arg(long)]
    service_rates: Option<PathBuf>,
    /// Threads to run policies on, at least 1 (default: the machine's available parallelism).
    #[arg(long)]
    threads: Option<usize>,
    /// Also write, per time-series row, the p99 as the engine's sink histogram would report
    /// it (`p99_engine_s`: the same buckets and interpolation as `streamscale run`).
    #[arg(long)]
    engine_p99: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Format of the comparison figure in the report directory: `png` (comparison.png) or
    /// `svg` (comparison.svg).
    #[arg(long, default_value = "png", value_parser = ["png", "svg"])]
    plot: String,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!(
            "error: {}",
            streamscale_controller::causes::with_causes(e.as_ref())
        );
        std::process::exit(2);
    }
}

fn non_negative(name: &str, v: Option<f64>) -> anyhow::Result<()> {
    if let Some(v) = v
        && !(v.is_finite() && v >= 0.0)
    {
        bail!("{name}: {v} must be a non-negative number of seconds");
    }
    Ok(())
}

fn positive(name: &str, v: Option<f64>) -> anyhow::Result<()> {
    if let Some(v) = v
        && !(v.is_finite() && v > 0.0)
    {
        bail!("{name}: {v} must be a positive number");
    }
    Ok(())
}

/// Most steps one replay may take: the arrival schedule holds one f64 per step and source, so
/// this bounds its memory (2·10⁷ steps ≈ 160 MB per source) before it is allocated.
const MAX_STEPS: f64 = 2e7;

fn run(a: Args) -> anyhow::Result<()> {
    if a.threads == Some(0) {
        bail!(
            "--threads: must be at least 1 (leave it out to use the machine's available parallelism)"
        );
    }
    if let Some(dir) = &a.report
        && dir.exists()
        && !dir.is_dir()
    {
        bail!(
            "--report: {} exists and is not a directory (the report is a directory: summary.json, timeseries.csv, comparison.png)",
            dir.display()
        );
    }
    // The report directory must be writable before hours of traffic are replayed into it.
    if let Some(dir) = &a.report {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--report: cannot create {}", dir.display()))?;
        let probe = dir.join(format!(".streamscale-sim-probe-{}", std::process::id()));
        std::fs::write(&probe, b"")
            .with_context(|| format!("--report: cannot write into {}", dir.display()))?;
        let _ = std::fs::remove_file(&probe);
    }
    if let Some(p) = &a.sim_config
        && std::fs::read_to_string(p).is_ok_and(|text| {
            text.lines()
                .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        })
    {
        bail!(
            "--sim-config: {} is empty (no settings); leave --sim-config out to use the defaults",
            p.display()
        );
    }
    let mut cfg = match &a.sim_config {
        Some(p) => SimConfig::from_file(p).context("--sim-config")?,
        None => SimConfig::default(),
    };
    for (name, v) in [
        ("--slo", a.slo),
        ("--scale", a.scale),
        ("--speedup", a.speedup),
        ("--duration", a.duration),
        ("--step", a.step),
        ("--interval", a.interval),
        ("--window", a.window),
    ] {
        positive(name, v)?;
    }
    non_negative("--downtime", a.downtime)?;
    non_negative("--seconds-per-mb", a.seconds_per_mb)?;
    if let Some(v) = a.slo {
        cfg.slo_seconds = Some(v);
    }
    if let Some(q) = a.latency_percentile {
        if !(q > 0.0 && q < 1.0) {
            bail!("--latency-percentile: {q} is not in (0, 1) (0.99 is p99)");
        }
        cfg.latency_percentile = Some(q);
    }
    match a.on_unattainable_slo.as_deref() {
        None => {}
        Some("bestEffort") => cfg.on_unattainable_slo = Some(UnattainableSlo::BestEffort),
        Some("utilizationOnly") => {
            cfg.on_unattainable_slo = Some(UnattainableSlo::UtilizationOnly);
        }
        Some(v) => bail!("--on-unattainable-slo: `{v}` is not `utilizationOnly` or `bestEffort`"),
    }
    if let Some(v) = a.step {
        cfg.step_seconds = Some(v);
    }
    if let Some(v) = a.interval {
        cfg.interval_seconds = v;
    }
    if let Some(v) = a.window {
        cfg.window_seconds = v;
    }
    if let Some(v) = a.stabilization {
        cfg.stabilization_seconds = v;
    }
    if let Some(v) = a.scale_down_delay {
        cfg.scale_down_delay_seconds = v;
    }
    if let Some(v) = a.guard_window {
        cfg.guard_window_seconds = Some(v);
    }
    if let Some(v) = a.seed {
        cfg.seed = v;
    }
    if let Some(v) = a.downtime {
        cfg.rescale.downtime_seconds = v;
    }
    if let Some(v) = a.seconds_per_mb {
        cfg.rescale.seconds_per_mb = v;
    }
    if let Some(list) = &a.service {
        for item in list.split(',').filter(|s| !s.trim().is_empty()) {
            let (op, rest) = item
                .split_once('=')
                .with_context(|| format!("--service: `{item}` is not op=MEAN_US[:CV]"))?;
            let (mean, cv) = match rest.split_once(':') {
                Some((m, c)) => (m, Some(c)),
                None => (rest, None),
            };
            let o = cfg.operators.entry(op.trim().to_string()).or_default();
            let mean_us: f64 = mean
                .trim()
                .parse()
                .with_context(|| format!("--service: `{mean}` is not a number of µs"))?;
            if !(mean_us.is_finite() && mean_us > 0.0) {
                bail!("--service: `{item}`: the mean service time {mean_us} µs must be positive");
            }
            o.mean_micros = Some(mean_us);
            if let Some(c) = cv {
                let cv: f64 = c
                    .trim()
                    .parse()
                    .with_context(|| format!("--service: `{c}` is not a CV"))?;
                if !(cv.is_finite() && cv >= 0.0) {
                    bail!("--service: `{item}`: the CV {cv} must be a non-negative number");
                }
                o.cv = Some(cv);
            }
        }
    }
    // Replaying a run's rates: the settings the run decided with, where the user gave none.
    let settings_line = match &a.service_rates {
        Some(rates) => {
            let mut given = match &a.sim_config {
                Some(p) => std::fs::read_to_string(p)
                    .map(|text| run_settings::given_in_settings_file(&text))
                    .unwrap_or_default(),
                None => RunSettings::default(),
            };
            for (slot, flag) in [
                (&mut given.interval_s, a.interval),
                (&mut given.window_s, a.window),
                (&mut given.guard_window_s, a.guard_window),
                (&mut given.stabilization_s, a.stabilization),
                (&mut given.scale_down_delay_s, a.scale_down_delay),
                (&mut given.slo_s, a.slo),
                (&mut given.latency_percentile, a.latency_percentile),
            ] {
                if flag.is_some() {
                    *slot = flag;
                }
            }
            let path = run_settings::summary_beside(rates);
            let recorded = run_settings::read(&path)?;
            run_settings::resolve(
                &mut cfg,
                &given,
                recorded.as_ref().map(|r| (path.as_path(), r)),
            )
        }
        None => None,
    };
    cfg.validate().map_err(|e| match &settings_line {
        Some(line) => anyhow::anyhow!("{e} ({line})"),
        None => anyhow::anyhow!("{e}"),
    })?;
    let mode = match a.mode.as_str() {
        "fast" => Mode::Fast,
        "event" => Mode::Event,
        m => bail!("--mode: `{m}` is not `fast` or `event`"),
    };
    let gaps = match a.gaps.as_deref() {
        None => None,
        Some("hold") => Some(GapPolicy::Hold),
        Some("zero") => Some(GapPolicy::Zero),
        Some(g) => bail!("--gaps: `{g}` is not `hold` or `zero`"),
    };
    let mut spec = JobSpec::from_file(&a.job)?;
    if let Some(list) = &a.service {
        for op in list.split(',').filter_map(|item| item.split_once('=')) {
            let op = op.0.trim();
            if !spec.operators.iter().any(|o| o.name == op) {
                let names: Vec<&str> = spec.operators.iter().map(|o| o.name.as_str()).collect();
                bail!(
                    "--service: `{op}` is not an operator of {} (its operators: {})",
                    a.job.display(),
                    names.join(", ")
                );
            }
        }
    }
    let source = spec
        .operators
        .iter_mut()
        .find(|o| matches!(o.kind, OperatorKind::Source { .. }))
        .with_context(|| format!("{}: the job has no source", a.job.display()))?;
    if let OperatorKind::Source { rate, .. } = &mut source.kind {
        if let Some(file) = &a.trace {
            let mut t = match rate {
                RateSpec::Trace(t) => t.clone(),
                _ => serde_saphyr::from_str("file: x")
                    .map_err(|e| anyhow::anyhow!("internal: {e}"))?,
            };
            t.file = file.clone();
            if !matches!(rate, RateSpec::Trace(_)) {
                t.start_seconds = 0.0;
                t.end_seconds = None;
            } else if a.start.is_none() && a.end.is_none() {
                // A different trace: replay all of it unless told otherwise.
                t.start_seconds = 0.0;
                t.end_seconds = None;
            }
            *rate = RateSpec::Trace(t);
        }
        if let RateSpec::Trace(t) = rate {
            if let Some(v) = a.scale {
                t.scale = v;
            }
            if let Some(v) = a.speedup {
                t.speedup = v;
            }
            if let Some(g) = gaps {
                t.gaps = g;
            }
            if let Some(v) = a.start {
                t.start_seconds = v;
            }
            if a.end.is_some() {
                t.end_seconds = a.end;
            }
        } else if a.scale.is_some()
            || a.speedup.is_some()
            || a.gaps.is_some()
            || a.start.is_some()
            || a.end.is_some()
        {
            bail!(
                "--scale/--speedup/--gaps/--start/--end need a trace (--trace FILE or a trace rate in the job)"
            );
        }
    }
    // The command-line overrides can contradict each other or the trace (`--end` before
    // `--start`, a start past the trace's end): check the spec again as the engine would.
    spec.validate()
        .map_err(|e| anyhow::anyhow!("{} with the command-line overrides: {e}", a.job.display()))?;
    // A reader that went away (`| head`) does not end the replay before its report.
    let mut out = streamscale_controller::console::Console::new(
        "streamscale-sim",
        "the report is still written",
    );
    let mut model = JobModel::new(&spec, &cfg, a.duration)?;
    if let Some(p) = &a.service_rates {
        model = model.with_service_rates(&ServiceRates::from_file(p)?)?;
        if let Some(line) = &settings_line {
            out.write(&format!("{line}\n"));
        }
    }
    if model.duration_s.is_nan() || model.duration_s <= 0.0 {
        bail!(
            "nothing to simulate: the replay lasts {} s (check --start/--end/--duration against the trace)",
            model.duration_s
        );
    }
    let names: Vec<String> = if a.policy == "all" {
        POLICIES.iter().map(|s| s.to_string()).collect()
    } else {
        a.policy.split(',').map(|s| s.trim().to_string()).collect()
    };
    let step = cfg
        .step_seconds
        .unwrap_or_else(|| default_step(model.duration_s));
    if step > model.duration_s {
        bail!(
            "--step: {step} s is longer than the whole replay ({} s)",
            model.duration_s
        );
    }
    let steps = model.duration_s / step;
    if steps > MAX_STEPS {
        bail!(
            "{:.0} s at a step of {step} s is {steps:.3e} steps, more than {MAX_STEPS:.0e}: raise --step or shorten the replay (--duration, --speedup)",
            model.duration_s
        );
    }
    let opts = ReplayOptions {
        mode,
        step_s: step,
        seed: cfg.seed,
        max_rows: 2000,
        threads: a.threads.unwrap_or(0),
        engine_p99: a.engine_p99,
    };
    let bar = progress::replay_bar(
        progress::total_steps(&model, step, &names),
        a.quiet,
        ProgressDrawTarget::stderr(),
    );
    let started = std::time::Instant::now();
    let (summary, runs) = replay_all(&model, &names, &opts, &cfg, &|n| {
        bar.inc(n);
    })?;
    bar.finish_and_clear();
    out.write(&format!(
        "job `{}`: {} simulated ({} mode, step {} s, SLO {} s{}) in {:.2} s\n",
        spec.name,
        if model.duration_s < 3600.0 {
            format!("{:.0} s", model.duration_s)
        } else {
            format!("{:.1} h", model.duration_s / 3600.0)
        },
        summary.mode,
        step,
        model.slo_s,
        if model.slo_quantile.is_p99() {
            String::new()
        } else {
            format!(" on {}", model.slo_quantile.label())
        },
        started.elapsed().as_secs_f64()
    ));
    out.write(&report::table(&summary, &names));
    if let Some(dir) = &a.report {
        report::write_files(dir, &summary, &runs, &model)?;
        report::plot(&dir.join(format!("comparison.{}", a.plot)), &runs, &model)?;
        out.write(&format!("report in {}\n", dir.display()));
    }
    Ok(())
}
