//! `streamscale`: the controller's command line.
//!
//! * `streamscale run [JOB.yaml]`: run the job on a local engine under the autoscaler and write
//!   a report.
//! * `streamscale plan JOB.yaml --metrics-url URL`: scrape a running engine twice and print the
//!   planner's decision after `run`'s guards as JSON (what the guards did on stderr).
//! * `streamscale flink --rest-url URL (--job ID ... | --all)`: autoscale the jobs of an Apache
//!   Flink session cluster through its REST API and write a report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use std::io::{IsTerminal as _, Write as _};

use clap::{Parser, Subcommand};
use streamscale_controller::console::Console;
use streamscale_controller::flink::session::FlinkOptions;
use streamscale_controller::run::{self, RunError, RunOptions};

#[derive(Parser)]
#[command(
    name = "streamscale",
    version,
    about = "Model-based autoscaler for streaming jobs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Produce JSON records to a Kafka topic at a trace's rate (a load generator for Kafka
    /// jobs): `{"seq", "key", "value", "ts"}` keyed by `key`.
    Load {
        /// Bootstrap servers, `host:port[,host:port...]`.
        #[arg(long)]
        brokers: String,
        /// Topic to write (created with --partitions partitions when missing).
        #[arg(long)]
        topic: String,
        /// Trace file (`t_seconds,rate`).
        #[arg(long)]
        trace: PathBuf,
        /// Trace-seconds per wall-clock second.
        #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
        speedup: f64,
        /// Factor applied to the trace's rates.
        #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
        scale: f64,
        /// Trace time (seconds) at which the replay starts.
        #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
        start_seconds: f64,
        /// Number of distinct keys.
        #[arg(long, default_value_t = 1000)]
        keys: u64,
        /// Partitions of the topic if it has to be created.
        #[arg(long, default_value_t = 6, allow_negative_numbers = true)]
        partitions: i32,
        /// Stop after this long (seconds, or `90s`, `10m`, `1h`); default: the end of the trace.
        #[arg(long, allow_hyphen_values = true)]
        duration: Option<String>,
    },
    /// Run a job on a local engine under the autoscaler and write a report.
    Run {
        /// Job file (default: examples/jobs/tweets.yaml).
        job: Option<PathBuf>,
        /// Trace file (`t_seconds,rate`) for the first source.
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Trace-seconds per wall-clock second.
        #[arg(long, allow_negative_numbers = true)]
        speedup: Option<f64>,
        /// Factor applied to the trace's rates.
        #[arg(long, allow_negative_numbers = true)]
        scale: Option<f64>,
        /// Run length: seconds, or with a unit (`90s`, `10m`, `1h`). Default: the trace window.
        #[arg(long, allow_hyphen_values = true)]
        duration: Option<String>,
        /// Report directory.
        #[arg(long, default_value = "report")]
        report: PathBuf,
        /// Scrape interval, seconds.
        #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
        interval: f64,
        /// Latency SLO in seconds (default: the job's autoscaler.latencySloSeconds).
        #[arg(long, allow_negative_numbers = true)]
        slo: Option<f64>,
        /// Sliding metric window for the planner, seconds.
        #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
        window: f64,
        /// Seconds after a (re)start before the planner may decide again.
        #[arg(long, default_value_t = 3.0, allow_negative_numbers = true)]
        stabilization: f64,
        /// Seconds a scale-down must be wanted before it is applied.
        #[arg(long, default_value_t = 15.0, allow_negative_numbers = true)]
        scale_down_delay: f64,
        /// Only report decisions; run at the job's parallelism throughout.
        #[arg(long)]
        no_autoscale: bool,
        /// Engine binary (default: $STREAMSCALE_ENGINE_BIN, else next to this executable, else PATH).
        #[arg(long)]
        engine: Option<PathBuf>,
        /// Percentile of end-to-end latency the SLO is on, in (0, 1) (default 0.99 = p99).
        #[arg(long, allow_negative_numbers = true)]
        latency_percentile: Option<f64>,
        /// Completed savepoints kept in REPORT/savepoints; older ones are removed (at least 1).
        #[arg(long, default_value_t = streamscale_controller::savepoint_history::DEFAULT_KEEP_SAVEPOINTS)]
        keep_savepoints: u32,
    },
    /// Scrape a running engine twice and print the planner's decision, after the guards of
    /// `run`, as JSON.
    Plan {
        /// Job file the engine runs.
        job: PathBuf,
        /// The engine's Prometheus endpoint, e.g. http://127.0.0.1:40123/metrics.
        #[arg(long)]
        metrics_url: String,
        /// Seconds between the two scrapes.
        #[arg(long, default_value_t = 2.0, allow_negative_numbers = true)]
        interval: f64,
    },
    /// Autoscale the jobs of an Apache Flink session cluster through its REST API and write a
    /// report (summary.json, timeline.csv).
    Flink(Box<FlinkArgs>),
}

#[derive(clap::Args)]
struct FlinkArgs {
    /// The cluster's REST URL (`https://` for TLS).
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    rest_url: String,
    /// A file holding a bearer token sent on every REST request (`Authorization: Bearer`).
    #[arg(long)]
    rest_token_file: Option<PathBuf>,
    /// A file holding one line `username:password` for basic auth on every REST request.
    #[arg(long)]
    rest_basic_auth_file: Option<PathBuf>,
    /// PEM CA certificate(s) the https endpoint's certificate must chain to (default: the
    /// system's trusted roots).
    #[arg(long)]
    rest_ca_file: Option<PathBuf>,
    /// A job id to autoscale (repeatable).
    #[arg(long = "job")]
    jobs: Vec<String>,
    /// Autoscale every running job of the cluster, also those submitted later.
    #[arg(long)]
    all: bool,
    /// `auto` applies decisions; `recommend` only prints and records them.
    #[arg(long, value_enum, default_value_t = ModeArg::Auto)]
    mode: ModeArg,
    /// `auto`: in place when the cluster runs the adaptive scheduler, else savepoint +
    /// resubmit; `in-place`; `savepoint`.
    #[arg(long, value_enum, default_value_t = RescaleArg::Auto)]
    rescale: RescaleArg,
    /// Resubmit from a savepoint by running this jar id (as `POST /jars/upload` named it).
    #[arg(long)]
    resubmit_jar: Option<String>,
    /// Entry class for --resubmit-jar (default: the jar's manifest).
    #[arg(long)]
    entry_class: Option<String>,
    /// Program argument for --resubmit-jar (repeatable, in order).
    #[arg(long = "arg", allow_hyphen_values = true)]
    args: Vec<String>,
    /// Resubmit from a savepoint by this shell command; `{savepoint}` and `{overrides}` are
    /// replaced, and its output must name the new job (`JobID <id>`, as `flink run -d` does).
    #[arg(long)]
    resubmit_command: Option<String>,
    /// Where savepoints go (default: the cluster's execution.checkpointing.savepoint-dir).
    #[arg(long)]
    savepoint_dir: Option<String>,
    /// Settings file: `autoscaler:` (the job file's schema) and `vertices:` bounds by name.
    #[arg(long)]
    settings: Option<PathBuf>,
    /// Latency SLO in seconds (overrides the settings file).
    #[arg(long, allow_negative_numbers = true)]
    slo: Option<f64>,
    /// Utilization every vertex must stay under, in (0, 1] (overrides the settings file).
    #[arg(long, allow_negative_numbers = true)]
    target_utilization: Option<f64>,
    /// Seconds between scrapes (Flink refreshes its metrics every 10 s by default).
    #[arg(long, default_value_t = 10.0, allow_negative_numbers = true)]
    interval: f64,
    /// Seconds of metrics the planner reads.
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true)]
    window: f64,
    /// Seconds after a (re)start before the planner may decide again.
    #[arg(long, default_value_t = 30.0, allow_negative_numbers = true)]
    stabilization: f64,
    /// Seconds a scale-down must be wanted before it is applied.
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true)]
    scale_down_delay: f64,
    /// Seconds a rescale may take before it is given up and rolled back.
    #[arg(long, default_value_t = 120.0, allow_negative_numbers = true)]
    rescale_timeout: f64,
    /// Stop after this long (seconds, or `90s`, `10m`, `1h`); default: until SIGINT (Ctrl-C) or
    /// SIGTERM.
    #[arg(long, allow_hyphen_values = true)]
    duration: Option<String>,
    /// Report directory.
    #[arg(long, default_value = "report-flink")]
    report: PathBuf,
    /// Where what the autoscaler learned about each job is kept between sessions, one file per
    /// job id (`learned-state-flink-ID.json`); default: the report directory.
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ModeArg {
    Auto,
    Recommend,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum RescaleArg {
    Auto,
    InPlace,
    Savepoint,
}

/// Builds the Flink session's options from the command line, and the REST client's
/// credentials and trust.
fn flink_options(
    a: FlinkArgs,
) -> Result<
    (
        FlinkOptions,
        streamscale_controller::flink::rest_auth::RestAuth,
    ),
    RunError,
> {
    use streamscale_controller::flink::rest::JarSubmission;
    use streamscale_controller::flink::runtime::Resubmit;
    use streamscale_controller::flink::session::{Mode, RescalePath};
    let mut settings = match &a.settings {
        Some(p) => streamscale_controller::flink::settings::load(p).map_err(RunError::Option)?,
        None => Default::default(),
    };
    if let Some(slo) = a.slo {
        settings.autoscaler.latency_slo_seconds = slo;
    }
    if let Some(u) = a.target_utilization {
        settings.autoscaler.target_utilization = u;
    }
    streamscale_controller::flink::settings::check_autoscaler(&settings.autoscaler)
        .map_err(|e| RunError::Option(format!("--slo/--target-utilization: {e}")))?;
    let resubmit = match (a.resubmit_jar, a.resubmit_command) {
        (Some(_), Some(_)) => {
            return Err(RunError::Option(
                "give --resubmit-jar or --resubmit-command, not both".into(),
            ));
        }
        (Some(jar_id), None) => Some(Resubmit::Jar(JarSubmission {
            jar_id,
            entry_class: a.entry_class,
            args: a.args,
        })),
        (None, Some(c)) => Some(Resubmit::Command(c)),
        (None, None) => None,
    };
    if matches!(a.rescale, RescaleArg::Savepoint) && resubmit.is_none() {
        return Err(RunError::Option(
            "--rescale savepoint needs --resubmit-jar or --resubmit-command (how to submit the job again)".into(),
        ));
    }
    if a.jobs.is_empty() && !a.all {
        return Err(RunError::Option(
            "name the jobs to autoscale (--job ID, repeatable) or pass --all".into(),
        ));
    }
    if a.all && !a.jobs.is_empty() {
        return Err(RunError::Option(
            "give --job (the jobs named) or --all (every running job, also later ones), not both"
                .into(),
        ));
    }
    if resubmit.is_some() && (a.all || a.jobs.len() > 1) {
        return Err(RunError::Option(
            "--resubmit-jar/--resubmit-command submit one program: name its job with one --job (with --all or several jobs, every job rescaled by savepoint would come back as that program)".into(),
        ));
    }
    run::check_http_url("--rest-url", &a.rest_url, "http://127.0.0.1:8081")?;
    let auth = streamscale_controller::flink::rest_auth::RestAuth::from_files(
        a.rest_token_file.as_deref(),
        a.rest_basic_auth_file.as_deref(),
        a.rest_ca_file.as_deref(),
    )
    .map_err(|e| RunError::Option(e.to_string()))?;
    let duration_s = a
        .duration
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(|e| RunError::Option(format!("--duration: {e}")))?;
    for (flag, v) in [
        ("--interval", a.interval),
        ("--window", a.window),
        ("--rescale-timeout", a.rescale_timeout),
    ] {
        if !(v > 0.0 && v.is_finite()) {
            return Err(RunError::Option(format!(
                "{flag}: must be a positive number of seconds (got {v})"
            )));
        }
    }
    for (flag, v) in [
        ("--stabilization", a.stabilization),
        ("--scale-down-delay", a.scale_down_delay),
    ] {
        if !(v >= 0.0 && v.is_finite()) {
            return Err(RunError::Option(format!(
                "{flag}: must be 0 or a positive number of seconds (got {v})"
            )));
        }
    }
    if a.window < a.interval {
        return Err(RunError::Option(format!(
            "--window ({} s) must be at least --interval ({} s)",
            a.window, a.interval
        )));
    }
    // Flink's job ids are 32 hex digits (`JobID`): another value is a typo, refused before the
    // cluster's own HTTP 400 would be.
    if let Some(bad) = a
        .jobs
        .iter()
        .find(|j| j.len() != 32 || !j.chars().all(|c| c.is_ascii_hexdigit()))
    {
        return Err(RunError::Option(format!(
            "--job {bad}: a Flink job id is 32 hexadecimal digits (as `flink list` and the web UI show it)"
        )));
    }
    let opts = FlinkOptions {
        credentials: auth.credentials.clone(),
        rest_url: a.rest_url,
        jobs: a.jobs,
        all: a.all,
        mode: match a.mode {
            ModeArg::Auto => Mode::Auto,
            ModeArg::Recommend => Mode::Recommend,
        },
        rescale: match a.rescale {
            RescaleArg::Auto => RescalePath::Auto,
            RescaleArg::InPlace => RescalePath::InPlace,
            RescaleArg::Savepoint => RescalePath::Savepoint,
        },
        resubmit,
        savepoint_dir: a.savepoint_dir,
        settings: settings.autoscaler,
        bounds: settings.vertices,
        interval_s: a.interval,
        window_s: a.window,
        stabilization_s: a.stabilization,
        scale_down_delay_s: a.scale_down_delay,
        duration_s,
        report_dir: a.report,
        state_dir: a.state_dir,
        rescale_timeout_s: a.rescale_timeout,
    };
    Ok((opts, auth))
}

/// Parses `90`, `90s`, `10m`, `1.5h` into seconds.
fn parse_duration(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let (number, factor) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1.0),
        Some((i, 'm')) => (&s[..i], 60.0),
        Some((i, 'h')) => (&s[..i], 3600.0),
        _ => (s, 1.0),
    };
    let not_a_duration = || format!("`{s}` is not a duration (seconds, or e.g. 90s, 10m, 1h)");
    let v: f64 = number.trim().parse().map_err(|_| not_a_duration())?;
    if v.is_nan() {
        return Err(not_a_duration());
    }
    if v <= 0.0 {
        return Err(format!("must be > 0 (got {s})"));
    }
    // `inf` and `1e400` are positive: they fail the limit below, not the sign check.
    let seconds = v * factor;
    if seconds > run::MAX_SECONDS {
        return Err(format!(
            "`{s}` is longer than a year; give at most 365 days (8760h, {} s)",
            run::MAX_SECONDS
        ));
    }
    Ok(seconds)
}

/// Standard output for the command's lines ([`Console`]: a closed stdout does not end a run
/// before its draining savepoint and report).
fn console() -> Console {
    Console::new("streamscale", "the run goes on, see the report")
}

/// Writes one line to stderr; a closed stderr is ignored (nothing else can be told).
fn err(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `path` (absolute, as the engine reported it) shown under `report_dir` as the user gave it
/// when it lies in that directory (`report/savepoints/sp-…`), else as it is.
fn shown_under(path: &Path, report_dir: &Path) -> PathBuf {
    [
        std::fs::canonicalize(report_dir).ok(),
        std::path::absolute(report_dir).ok(),
    ]
    .into_iter()
    .flatten()
    .find_map(|full| {
        path.strip_prefix(full)
            .ok()
            .map(|rest| report_dir.join(rest))
    })
    .unwrap_or_else(|| path.to_path_buf())
}

/// Resolves on the first SIGINT or SIGTERM (Ctrl-C elsewhere) that arrives after this call,
/// even before it is first polled. The handlers are installed here, whatever disposition the
/// process inherited (a script's background job starts with SIGINT ignored). Needs a runtime.
fn interrupted() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        async fn next(s: &mut Option<Signal>) {
            if let Some(s) = s
                && s.recv().await.is_some()
            {
                return;
            }
            std::future::pending::<()>().await;
        }
        let mut int = signal(SignalKind::interrupt()).ok();
        let mut term = signal(SignalKind::terminate()).ok();
        async move {
            tokio::select! {
                () = next(&mut int) => {}
                () = next(&mut term) => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn exit_code(e: &RunError) -> u8 {
    match e {
        RunError::Option(_) | RunError::Spec(_) => 2,
        _ => 1,
    }
}

/// The exit status of a failed command: 2 for bad input (an option, a job file, a trace), 1
/// for the rest.
fn error_exit_code(e: &anyhow::Error) -> u8 {
    use streamscale_controller::flink::session::SessionError;
    use streamscale_controller::load::LoadError;
    if let Some(r) = e.downcast_ref::<RunError>() {
        return exit_code(r);
    }
    match (
        e.downcast_ref::<SessionError>(),
        e.downcast_ref::<LoadError>(),
    ) {
        (Some(SessionError::Option(_)), _)
        | (_, Some(LoadError::Option(_) | LoadError::Trace(_))) => 2,
        _ => 1,
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // A closed stderr drops log lines instead of panicking in tracing's own error report.
        .log_internal_errors(false)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    match main_inner(cli).await {
        Ok(code) => code,
        Err(e) => {
            err(&format!("streamscale: {e}"));
            ExitCode::from(error_exit_code(&e))
        }
    }
}

async fn main_inner(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run {
            job,
            trace,
            speedup,
            scale,
            duration,
            report,
            interval,
            slo,
            window,
            engine,
            stabilization,
            scale_down_delay,
            no_autoscale,
            latency_percentile,
            keep_savepoints,
        } => {
            // Parsed here rather than by clap, so that a bad value is one `streamscale: --X:`
            // line like every other option's, not clap's three-line usage error.
            let duration = duration
                .as_deref()
                .map(parse_duration)
                .transpose()
                .map_err(|e| RunError::Option(format!("--duration: {e}")))?;
            let opts = RunOptions {
                job: job.unwrap_or_else(|| PathBuf::from(run::DEFAULT_JOB)),
                trace,
                speedup,
                scale,
                duration_s: duration,
                report_dir: report,
                interval_s: interval,
                slo_s: slo,
                window_s: window,
                engine_bin: engine,
                stabilization_s: stabilization,
                scale_down_delay_s: scale_down_delay,
                autoscale: !no_autoscale,
                latency_percentile,
                keep_savepoints,
            };
            let mut console = console();
            let outcome = run::run(
                &opts,
                &mut |line: &str| console.line(line),
                &mut |line: &str| err(line),
            )
            .await?;
            let s = &outcome.summary;
            console.line(&format!(
                "done in {:.0} s: {} rescale(s) ({} failed){}, {:.0} subtask·s (mean {:.2} subtasks in all), {} above the {} s SLO for {:.0} s{}; report in {}{}",
                s.duration_s,
                s.rescales.len(),
                s.failed_rescales.len(),
                if s.restarts.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", {} engine restart(s) (recovery {:.1} s)",
                        s.restarts.len(),
                        s.recovery_s
                    )
                },
                s.parallelism_seconds,
                s.mean_parallelism,
                streamscale_controller::progress::percentile_label(s.latency_percentile),
                s.slo_s,
                s.slo_violation_seconds,
                if s.no_output_seconds >= 1.0 && s.no_output_seconds >= 0.5 * s.duration_s {
                    format!(
                        " (no record reached a sink in {:.0} s of it: no latency measured then)",
                        s.no_output_seconds
                    )
                } else {
                    String::new()
                },
                outcome.report_dir.display(),
                s.final_savepoint
                    .as_deref()
                    .map(|sp| format!(
                        ", final savepoint {}",
                        shown_under(Path::new(sp), &outcome.report_dir).display()
                    ))
                    .unwrap_or_default()
            ));
            if let (Some(e), Some(a), Some(f)) =
                (s.records_emitted, s.records_accounted, s.records_filtered)
            {
                console.line(&format!(
                    "records: {e} emitted, {a} accounted at sinks, {f} filtered"
                ));
            }
            if s.source_backlog_at_end >= 1.0 {
                let due = format!("{:.0}", s.source_backlog_at_end);
                let (noun, verb) = if due == "1" {
                    ("record", "was")
                } else {
                    ("records", "were")
                };
                console.line(&format!(
                    "sources' backlog at the end: {due} {noun} {verb} due but not emitted when the run stopped (summary.json: source_backlog_at_end)"
                ));
            }
            if s.source_backlog_at_end.is_nan() {
                console.line(
                    "sources' backlog at the end: unknown (a source exports no backlog metric; summary.json: source_backlog_at_end null)",
                );
            }
            if let Some(failure) = &s.failure {
                err(&format!("streamscale: run failed: {failure}"));
                return Ok(ExitCode::from(1));
            }
            if let Some(sig) = outcome.interrupted {
                // Like a shell: 128 + the signal's number, after the report is complete.
                err(&format!(
                    "streamscale: interrupted by {}; the run stopped early with a draining savepoint (summary.json: \"interrupted\": true)",
                    sig.name()
                ));
                if let Some(lost) = s.records_lost.filter(|l| *l != 0) {
                    err(&format!(
                        "streamscale: records lost: {lost} of {} emitted were neither accounted at a sink nor filtered",
                        s.records_emitted.unwrap_or(0)
                    ));
                    return Ok(ExitCode::from(1));
                }
                return Ok(ExitCode::from(sig.exit_code()));
            }
            if let Some(lost) = s.records_lost.filter(|l| *l != 0) {
                err(&format!(
                    "streamscale: records lost: {lost} of {} emitted were neither accounted at a sink nor filtered",
                    s.records_emitted.unwrap_or(0)
                ));
                return Ok(ExitCode::from(1));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Load {
            brokers,
            topic,
            trace,
            speedup,
            scale,
            start_seconds,
            keys,
            partitions,
            duration,
        } => {
            let duration = duration
                .as_deref()
                .map(parse_duration)
                .transpose()
                .map_err(|e| RunError::Option(format!("--duration: {e}")))?;
            let opts = streamscale_controller::load::LoadOptions {
                brokers,
                topic,
                partitions,
                trace,
                speedup,
                scale,
                start_seconds,
                keys,
                duration,
            };
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let on_signal = stop.clone();
            let signalled = interrupted();
            tokio::spawn(async move {
                signalled.await;
                on_signal.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            let summary = tokio::task::spawn_blocking(move || {
                let mut console = console();
                streamscale_controller::load::run(&opts, &stop, &mut |l| console.line(l))
            })
            .await??;
            console().line(&format!(
                "load: sent {} records in {:.1} s",
                summary.records, summary.seconds
            ));
            Ok(ExitCode::SUCCESS)
        }
        Command::Plan {
            job,
            metrics_url,
            interval,
        } => {
            let outcome = run::plan_once(&job, &metrics_url, interval).await?;
            for note in &outcome.notes {
                err(&format!("streamscale plan: {note}"));
            }
            console().line(&serde_json::to_string_pretty(&outcome.decision)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Flink(args) => {
            let (opts, auth) = flink_options(*args)?;
            let mut console = console();
            if auth.credentials != Default::default() && !opts.rest_url.starts_with("https:") {
                err(&format!(
                    "streamscale flink: warning: sending REST credentials over plain http to {} (use an https --rest-url)",
                    opts.rest_url
                ));
            }
            // Submitting a job from a jar can take tens of seconds.
            let client = auth
                .client(
                    &opts.rest_url,
                    reqwest::Client::builder()
                        .no_proxy()
                        .timeout(std::time::Duration::from_secs(90)),
                )
                .map_err(|e| RunError::Option(e.to_string()))?;
            // Caught before the session starts: SIGINT or SIGTERM ends it with its report. Said
            // at once: the session ends only after what it is doing (a rescale completes or is
            // rolled back first, which can take minutes).
            let signal = interrupted();
            let (said, heard) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(async move {
                signal.await;
                eprintln!(
                    "streamscale flink: interrupted: ending after what is in progress (a rescale completes or is rolled back first), then writing the report"
                );
                let _ = said.send(());
            });
            let stop = async move {
                if heard.await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            let summary = streamscale_controller::flink::session::run(
                &opts,
                client,
                stop,
                &mut |line: &str| console.line(line),
            )
            .await?;
            let count = |outcome: &str| -> usize {
                summary
                    .jobs
                    .iter()
                    .map(|j| j.rescales.iter().filter(|r| r.outcome == outcome).count())
                    .sum()
            };
            let (rescales, down) = (count("rescaled"), count("failed"));
            console.line(&format!(
                "done in {:.0} s: {} job(s), {rescales} rescale(s){}",
                summary.duration_seconds,
                summary.jobs.len(),
                if down > 0 {
                    format!(", {down} that left its job not running (see above and summary.json)")
                } else {
                    String::new()
                }
            ));
            // A rescale that left a job stopped is the session's failure.
            Ok(if down > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(90.0));
        assert_eq!(parse_duration("90s"), Ok(90.0));
        assert_eq!(parse_duration("10m"), Ok(600.0));
        assert_eq!(parse_duration("1.5h"), Ok(5400.0));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("-5s").is_err());
        assert!(parse_duration("abc").is_err());
        assert_eq!(parse_duration("8760h"), Ok(run::MAX_SECONDS));
        for absurd in ["1e300h", "8761h", "1e308", "inf"] {
            assert!(parse_duration(absurd).is_err(), "{absurd}");
        }
        // Positive but unbounded values are refused for their size, not their sign.
        for huge in ["inf", "1e400", "1e400s"] {
            let e = parse_duration(huge).unwrap_err();
            assert!(e.contains("longer than a year"), "{huge}: {e}");
        }
        let e = parse_duration("nan").unwrap_err();
        assert!(e.contains("is not a duration"), "{e}");
        assert!(parse_duration("-inf").unwrap_err().contains("must be > 0"));
    }

    /// A negative `--duration` reaches the duration check (which names the option) rather
    /// than clap, which took `-1` for a flag.
    #[test]
    fn a_negative_duration_is_a_value_in_every_subcommand() {
        let duration = |args: &[&str]| match Cli::try_parse_from(args).map(|c| c.command) {
            Ok(Command::Flink(a)) => a.duration,
            Ok(Command::Load { duration, .. }) => duration,
            Ok(_) => panic!("another command"),
            Err(e) => panic!("{args:?}: {e}"),
        };
        let flink = ["streamscale", "flink", "--all", "--duration", "-1"];
        assert_eq!(duration(&flink).as_deref(), Some("-1"));
        let load = [
            "streamscale",
            "load",
            "--brokers",
            "b",
            "--topic",
            "t",
            "--trace",
            "f",
            "--duration",
            "-1",
        ];
        assert_eq!(duration(&load).as_deref(), Some("-1"));
    }

    /// One resubmit setting is one program: with --all or several jobs, a job rescaled by
    /// savepoint would come back as another job's program.
    #[test]
    fn a_resubmission_is_for_one_named_job() {
        let options = |jobs: &[&str]| {
            let mut args = vec!["streamscale", "flink", "--resubmit-jar", "x.jar"];
            args.extend_from_slice(jobs);
            match Cli::try_parse_from(args).map(|c| c.command) {
                Ok(Command::Flink(a)) => flink_options(*a).map(|_| ()),
                Ok(_) => panic!("another command"),
                Err(e) => panic!("{e}"),
            }
        };
        let one = "0123456789abcdef0123456789abcdef";
        let two = "fedcba9876543210fedcba9876543210";
        assert!(options(&["--job", one]).is_ok());
        for jobs in [vec!["--all"], vec!["--job", one, "--job", two]] {
            let err = options(&jobs).expect_err("refused");
            assert!(err.to_string().contains("submit one program"), "{err}");
            assert_eq!(exit_code(&err), 2);
        }
    }

    #[test]
    fn named_jobs_and_all_are_not_both_given() {
        let args = [
            "streamscale",
            "flink",
            "--all",
            "--job",
            "0123456789abcdef0123456789abcdef",
        ];
        let Ok(Command::Flink(a)) = Cli::try_parse_from(args).map(|c| c.command) else {
            panic!("parsed");
        };
        let err = flink_options(*a).expect_err("refused");
        assert!(err.to_string().contains("not both"), "{err}");
        assert_eq!(exit_code(&err), 2);
    }

    /// `streamscale load`'s bad options and traces exit 2 as `run`'s do (they exited 1, while
    /// its bad `--duration` exited 2); a broker or send failure stays 1.
    #[test]
    fn load_refuses_bad_input_with_exit_status_2() {
        use streamscale_controller::load::LoadError;
        let option = anyhow::Error::from(LoadError::Option("--keys: must be at least 1".into()));
        assert_eq!(error_exit_code(&option), 2);
        let trace = streamscale_engine::trace::RateFunction::from_spec(
            &streamscale_engine::spec::RateSpec::Trace(streamscale_engine::spec::TraceRate {
                file: "/nonexistent/t.rate.csv".into(),
                speedup: 1.0,
                scale: 1.0,
                start_seconds: 0.0,
                end_seconds: None,
                gaps: streamscale_engine::spec::GapPolicy::Hold,
            }),
        )
        .map(|_| ())
        .expect_err("no such trace");
        assert_eq!(error_exit_code(&LoadError::Trace(trace).into()), 2);
        assert_eq!(
            error_exit_code(&LoadError::Send("send to topic t: failed".into()).into()),
            1
        );
        assert_eq!(
            error_exit_code(&RunError::Option("--interval".into()).into()),
            2
        );
    }
}
