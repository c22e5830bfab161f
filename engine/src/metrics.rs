//! Per-subtask metrics with Flink's meaning, served in Prometheus text format.
//!
//! Every metric carries the labels `operator` and `subtask` (0-based index).

use prometheus::{
    CounterVec, Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    Opts, Registry, TextEncoder,
};

/// Upper bounds (seconds) of the sinks' end-to-end latency histogram
/// (`streamscale_sink_latency_seconds`); a +∞ bucket follows. Shared with the simulator, which
/// reports its p99 through the same buckets to compare like with like.
pub const SINK_LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0,
];

/// The engine's metric families.
#[derive(Clone)]
pub struct EngineMetrics {
    registry: Registry,
    /// Records received by a subtask (counter).
    pub records_in: IntCounterVec,
    /// Records sent downstream by a subtask (counter).
    pub records_out: IntCounterVec,
    /// Seconds spent processing records (counter).
    pub busy_seconds: CounterVec,
    /// Seconds spent waiting for input (counter).
    pub idle_seconds: CounterVec,
    /// Seconds spent blocked on a full output channel (counter).
    pub backpressured_seconds: CounterVec,
    /// Records waiting in the subtask's input queue (gauge).
    pub input_queue_length: GaugeVec,
    /// Sources: records that should have been emitted by now but have not (gauge).
    pub source_backlog: GaugeVec,
    /// Sources: records that should have been emitted by now, the external arrival count (counter).
    pub source_arrivals: CounterVec,
    /// Sources: current target rate in records/s (gauge).
    pub source_rate: GaugeVec,
    /// Sinks: end-to-end latency from a record's arrival at the source to the sink, seconds.
    pub sink_latency: HistogramVec,
    /// Sinks: source records whose effect reached the sink (counter).
    pub sink_accounted: IntCounterVec,
    /// `streamscale_late_records_dropped_total`: records an event-time operator dropped
    /// because every window they belong to had already fired (event time ≤ watermark).
    pub late_records_dropped: IntCounterVec,
    /// Checkpoints (and savepoints) completed and written (counter, no labels).
    pub checkpoints_completed: IntCounter,
    /// Checkpoints (and savepoints) that failed: storage unwritable, timeout, job failure
    /// (counter, no labels).
    pub checkpoints_failed: IntCounter,
    /// Seconds from the trigger to the written manifest of the last completed checkpoint (gauge).
    pub checkpoint_duration: Gauge,
    /// Bytes of state files in the last completed checkpoint (gauge).
    pub checkpoint_size: Gauge,
    /// In-process restarts from a checkpoint after a subtask failure (counter, no labels).
    pub restarts: IntCounter,
    /// Disk state backend: bytes of restored keyed state still served from the savepoint's
    /// chunks in memory, not yet written out as the subtask's segment files (gauge; 0 once
    /// written).
    pub state_restored_unloaded_bytes: GaugeVec,
}

/// Errors building the registry (only on a programming error such as a duplicate name).
pub type MetricsError = prometheus::Error;

const LABELS: &[&str] = &["operator", "subtask"];

impl EngineMetrics {
    /// Registers every family in a fresh registry.
    ///
    /// # Errors
    /// [`prometheus::Error`] if a family cannot be registered.
    pub fn new() -> Result<EngineMetrics, MetricsError> {
        let registry = Registry::new();
        let int_counter = |name: &str, help: &str| -> Result<IntCounterVec, MetricsError> {
            let c = IntCounterVec::new(Opts::new(name, help), LABELS)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let counter = |name: &str, help: &str| -> Result<CounterVec, MetricsError> {
            let c = CounterVec::new(Opts::new(name, help), LABELS)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let gauge = |name: &str, help: &str| -> Result<GaugeVec, MetricsError> {
            let g = GaugeVec::new(Opts::new(name, help), LABELS)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let records_in = int_counter("streamscale_records_in_total", "Records received.")?;
        let records_out = int_counter("streamscale_records_out_total", "Records sent downstream.")?;
        let busy_seconds = counter(
            "streamscale_busy_time_seconds_total",
            "Seconds spent processing records.",
        )?;
        let idle_seconds = counter(
            "streamscale_idle_time_seconds_total",
            "Seconds spent waiting for input.",
        )?;
        let backpressured_seconds = counter(
            "streamscale_backpressured_time_seconds_total",
            "Seconds spent blocked on a full output channel.",
        )?;
        let input_queue_length = gauge(
            "streamscale_input_queue_length",
            "Records waiting in the input queue.",
        )?;
        let source_backlog = gauge(
            "streamscale_source_backlog_records",
            "Records the source should have emitted by now but has not.",
        )?;
        let source_arrivals = counter(
            "streamscale_source_arrivals_total",
            "Records the source should have emitted by now (external arrivals).",
        )?;
        let source_rate = gauge(
            "streamscale_source_rate_records_per_second",
            "Current target emission rate of the source.",
        )?;
        let sink_latency = HistogramVec::new(
            HistogramOpts::new(
                "streamscale_sink_latency_seconds",
                "End-to-end latency from arrival at the source to the sink.",
            )
            .buckets(SINK_LATENCY_BUCKETS.to_vec()),
            LABELS,
        )?;
        registry.register(Box::new(sink_latency.clone()))?;
        let sink_accounted = int_counter(
            "streamscale_sink_accounted_records_total",
            "Source records whose effect reached the sink.",
        )?;
        let late_records_dropped = int_counter(
            "streamscale_late_records_dropped_total",
            "Records dropped by an event-time operator because they arrived after the watermark closed their windows.",
        )?;
        let state_restored_unloaded_bytes = gauge(
            "streamscale_state_restored_unloaded_bytes",
            "Disk state backend: bytes of restored keyed state not yet written out as segment files.",
        )?;
        let checkpoints_completed = IntCounter::new(
            "streamscale_checkpoints_completed_total",
            "Checkpoints and savepoints completed and written.",
        )?;
        let checkpoints_failed = IntCounter::new(
            "streamscale_checkpoints_failed_total",
            "Checkpoints and savepoints that failed (storage, timeout, job failure).",
        )?;
        let checkpoint_duration = Gauge::new(
            "streamscale_last_checkpoint_duration_seconds",
            "Seconds from trigger to written manifest of the last completed checkpoint.",
        )?;
        let checkpoint_size = Gauge::new(
            "streamscale_last_checkpoint_size_bytes",
            "Bytes of state files in the last completed checkpoint.",
        )?;
        let restarts = IntCounter::new(
            "streamscale_job_restarts_total",
            "In-process restarts from a checkpoint after a subtask failure.",
        )?;
        registry.register(Box::new(checkpoints_completed.clone()))?;
        registry.register(Box::new(checkpoints_failed.clone()))?;
        registry.register(Box::new(checkpoint_duration.clone()))?;
        registry.register(Box::new(checkpoint_size.clone()))?;
        registry.register(Box::new(restarts.clone()))?;
        Ok(EngineMetrics {
            registry,
            records_in,
            records_out,
            busy_seconds,
            idle_seconds,
            backpressured_seconds,
            input_queue_length,
            source_backlog,
            source_arrivals,
            source_rate,
            sink_latency,
            sink_accounted,
            late_records_dropped,
            checkpoints_completed,
            checkpoints_failed,
            checkpoint_duration,
            checkpoint_size,
            restarts,
            state_restored_unloaded_bytes,
        })
    }

    /// The registry in Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            return format!("# error encoding metrics: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}
