//! The operator's own Prometheus metrics, served on `/metrics`.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
};

/// Counters and histograms of the operator.
#[derive(Clone)]
pub struct Metrics {
    /// The registry holding them all.
    pub registry: Registry,
    /// Reconciles run.
    pub reconciles: IntCounter,
    /// Reconciles that failed.
    pub errors: IntCounter,
    /// Autoscaler decisions, labelled `verdict` (`rescale`, `recommend`, `hold`).
    pub decisions: IntCounterVec,
    /// Seconds spent in each rescale step, labelled `step`.
    pub rescale_step_seconds: HistogramVec,
    /// Seconds per reconcile.
    pub reconcile_seconds: Histogram,
    /// Successful reads of an engine's metrics, labelled `source` (`engine`: its `/metrics`;
    /// `prometheus`: a Prometheus server's HTTP API).
    pub metric_reads: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Fresh metrics in a new registry.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let reconciles = IntCounter::new("streamscale_operator_reconciles_total", "Reconciles run")
            .expect("valid metric");
        let errors = IntCounter::new(
            "streamscale_operator_reconcile_errors_total",
            "Reconciles that failed",
        )
        .expect("valid metric");
        let decisions = IntCounterVec::new(
            Opts::new(
                "streamscale_operator_decisions_total",
                "Autoscaler decisions by verdict",
            ),
            &["verdict"],
        )
        .expect("valid metric");
        let rescale_step_seconds = HistogramVec::new(
            HistogramOpts::new(
                "streamscale_operator_rescale_step_seconds",
                "Seconds spent per rescale step",
            )
            .buckets(vec![
                0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
            ]),
            &["step"],
        )
        .expect("valid metric");
        let reconcile_seconds = Histogram::with_opts(HistogramOpts::new(
            "streamscale_operator_reconcile_seconds",
            "Seconds per reconcile",
        ))
        .expect("valid metric");
        let metric_reads = IntCounterVec::new(
            Opts::new(
                "streamscale_operator_metric_reads_total",
                "Successful reads of engine metrics by source",
            ),
            &["source"],
        )
        .expect("valid metric");
        for c in [
            Box::new(reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(errors.clone()),
            Box::new(decisions.clone()),
            Box::new(rescale_step_seconds.clone()),
            Box::new(reconcile_seconds.clone()),
            Box::new(metric_reads.clone()),
        ] {
            registry.register(c).expect("unique metric");
        }
        Metrics {
            registry,
            reconciles,
            errors,
            decisions,
            rescale_step_seconds,
            reconcile_seconds,
            metric_reads,
        }
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> String {
        let mut buf = String::new();
        let _ = prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut buf);
        buf
    }
}
