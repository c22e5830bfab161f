//! Per-record service-time variability, measured from batch timings.
//!
//! A subtask's records are timed in batches, never one by one (a clock read per record would
//! cost more than a fast record): batch i holds n_i records and took T_i seconds of the
//! subtask's own processing. A batch ends wherever the runtime reads the clock anyway: a
//! chain member's batch is one run of its pending records (timed around the run,
//! `runtime::ChainMember::run_pending`); a subtask that reads its own input queue closes a batch
//! at each of its periodic clock checks (every 1 to 128 records) and at the end of each
//! chain run, and its batch time is the wall time since the previous one minus the time it
//! waited for input or on its output meanwhile. A stretch without records (the subtask's
//! start, a window fired on a timer, a barrier) is no batch and is left out: the planner
//! models window bursts on their own.
//!
//! Each subtask exports five counters per `operator`/`subtask`, from which a reader takes
//! deltas over any window:
//!
//! | family | sum |
//! |---|---|
//! | `streamscale_service_records_total` | Σ n_i |
//! | `streamscale_service_time_seconds_total` | Σ T_i (s) |
//! | `streamscale_service_time_sq_seconds_total` | Σ T_i² (s²) |
//! | `streamscale_service_time_records_seconds_total` | Σ n_i·T_i (records·s) |
//! | `streamscale_service_records_sq_total` | Σ n_i² |
//!
//! **Estimator.** With the per-record service times independent with mean m and variance σ²,
//! T_i = n_i·m + e_i with E e_i = 0 and Var e_i = n_i·σ². The mean is m̂ = ΣT / Σn (the
//! weighted least-squares fit) and the residuals give
//!
//! ```text
//! Σ (T_i − n_i·m̂)² = ΣT² − 2·m̂·ΣnT + m̂²·Σn²,    E[…] = σ²·(Σn − Σn²/Σn),
//! ```
//!
//! so σ̂² = Σ(T_i − n_i·m̂)² / (Σn − Σn²/Σn) is unbiased (for batches of one record it is the
//! sample variance), and the squared coefficient of variation is cs² = σ̂² / m̂². The
//! controller computes it (`streamscale::model::service_cv`); the engine only adds.
//!
//! **Assumption.** Service times independent within a batch and identically distributed
//! over the window. Anything that changes the pace of whole batches (CPU contention, the
//! thread being descheduled, a cache gone cold) adds to the estimate, the more the longer the
//! batches: that is variability a queued record does see, but a steady record cost measured
//! on a busy machine does not read as cs² = 0.

use std::time::Duration;

use prometheus::{Counter, CounterVec, IntCounter, IntCounterVec, Opts, Registry};

/// The five sums of a subtask's timed batches since they were last published (see the module
/// documentation). Adding a batch is five additions and three multiplications; nothing
/// allocates.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServiceMoments {
    /// Σ n_i, records.
    pub records: u64,
    /// Σ T_i, seconds.
    pub seconds: f64,
    /// Σ T_i², seconds².
    pub seconds_sq: f64,
    /// Σ n_i·T_i, record-seconds.
    pub record_seconds: f64,
    /// Σ n_i², records².
    pub records_sq: u64,
}

impl ServiceMoments {
    /// Adds a batch of `n` records that took `took` of processing.
    #[inline]
    pub fn add(&mut self, n: u64, took: Duration) {
        let t = took.as_secs_f64();
        self.records += n;
        self.seconds += t;
        self.seconds_sq += t * t;
        self.record_seconds += n as f64 * t;
        self.records_sq = self.records_sq.saturating_add(n.saturating_mul(n));
    }
}

/// The engine's five service-time counter families (labels `operator`, `subtask`).
#[derive(Clone)]
pub struct ServiceTimeVec {
    records: IntCounterVec,
    seconds: CounterVec,
    seconds_sq: CounterVec,
    record_seconds: CounterVec,
    records_sq: IntCounterVec,
}

/// One subtask's series of a [`ServiceTimeVec`], looked up once.
pub struct ServiceTimeSeries {
    records: IntCounter,
    seconds: Counter,
    seconds_sq: Counter,
    record_seconds: Counter,
    records_sq: IntCounter,
}

impl ServiceTimeVec {
    /// Registers the five families in `registry`.
    ///
    /// # Errors
    /// [`prometheus::Error`] if a family cannot be registered (a duplicate name).
    pub fn register(registry: &Registry) -> Result<ServiceTimeVec, prometheus::Error> {
        const LABELS: &[&str] = &["operator", "subtask"];
        let int = |name: &str, help: &str| -> Result<IntCounterVec, prometheus::Error> {
            let c = IntCounterVec::new(Opts::new(name, help), LABELS)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let float = |name: &str, help: &str| -> Result<CounterVec, prometheus::Error> {
            let c = CounterVec::new(Opts::new(name, help), LABELS)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        Ok(ServiceTimeVec {
            records: int(
                "streamscale_service_records_total",
                "Records in timed batches (sum of n over batches).",
            )?,
            seconds: float(
                "streamscale_service_time_seconds_total",
                "Processing seconds of timed batches (sum of T).",
            )?,
            seconds_sq: float(
                "streamscale_service_time_sq_seconds_total",
                "Sum over timed batches of the squared batch time T^2, seconds^2.",
            )?,
            record_seconds: float(
                "streamscale_service_time_records_seconds_total",
                "Sum over timed batches of records times batch time n*T, record-seconds.",
            )?,
            records_sq: int(
                "streamscale_service_records_sq_total",
                "Sum over timed batches of the squared record count n^2.",
            )?,
        })
    }

    /// The series of subtask `[operator, subtask]` (created at 0 if new).
    pub fn series(&self, labels: [&str; 2]) -> ServiceTimeSeries {
        ServiceTimeSeries {
            records: self.records.with_label_values(&labels),
            seconds: self.seconds.with_label_values(&labels),
            seconds_sq: self.seconds_sq.with_label_values(&labels),
            record_seconds: self.record_seconds.with_label_values(&labels),
            records_sq: self.records_sq.with_label_values(&labels),
        }
    }
}

impl ServiceTimeSeries {
    /// Adds `m` to the counters (at a metrics flush).
    pub fn publish(&self, m: &ServiceMoments) {
        self.records.inc_by(m.records);
        self.seconds.inc_by(m.seconds);
        self.seconds_sq.inc_by(m.seconds_sq);
        self.record_seconds.inc_by(m.record_seconds);
        self.records_sq.inc_by(m.records_sq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_add_up_to_the_five_sums() {
        let mut m = ServiceMoments::default();
        m.add(2, Duration::from_millis(3));
        m.add(4, Duration::from_millis(5));
        assert_eq!(m.records, 6);
        assert_eq!(m.records_sq, 20);
        assert!((m.seconds - 0.008).abs() < 1e-15, "{}", m.seconds);
        assert!((m.seconds_sq - 34e-6).abs() < 1e-15, "{}", m.seconds_sq);
        assert!(
            (m.record_seconds - 0.026).abs() < 1e-15,
            "{}",
            m.record_seconds
        );
    }

    #[test]
    fn series_publish_into_the_registry() {
        let registry = Registry::new();
        let vec = ServiceTimeVec::register(&registry).expect("families");
        let s = vec.series(["map", "1"]);
        let mut m = ServiceMoments::default();
        m.add(3, Duration::from_millis(2));
        s.publish(&m);
        s.publish(&m);
        let text = {
            use prometheus::Encoder;
            let mut buf = Vec::new();
            prometheus::TextEncoder::new()
                .encode(&registry.gather(), &mut buf)
                .expect("encode");
            String::from_utf8(buf).expect("utf-8")
        };
        for line in [
            "streamscale_service_records_total{operator=\"map\",subtask=\"1\"} 6",
            "streamscale_service_records_sq_total{operator=\"map\",subtask=\"1\"} 18",
            "streamscale_service_time_seconds_total{operator=\"map\",subtask=\"1\"} 0.004",
            "streamscale_service_time_records_seconds_total{operator=\"map\",subtask=\"1\"} 0.012",
        ] {
            assert!(text.contains(line), "missing {line} in {text}");
        }
    }
}
