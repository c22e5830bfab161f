//! Load shedding at the sources, set by the controller when the needed capacity exceeds the
//! job's limits (`autoscaler.limits.onLimit: shed`).
//!
//! - `GET /v1/shed`: `{"share": 0.25, "recordsShed": 1234}`.
//! - `POST /v1/shed` `{"share": 0.25}`: from now on every source subtask drops that share of its
//!   due records (400 unless `share` is in [0, 1]).
//!
//! A dropped record is never emitted and never silently lost: it is counted per source subtask
//! in `streamscale_records_shed_total{operator, subtask}` (served on `/metrics`) and in
//! `recordsShed`. It counts as taken from the source (it is not backlog, and it is not replayed
//! after a restore). So at every moment: records due at the sources = emitted + shed + backlog,
//! and emitted = accounted + filtered (+ in flight).
//!
//! Which records: of consecutive sequence numbers, record `seq` is dropped when
//! ⌊(seq + 1)·s⌋ > ⌊seq·s⌋, so every run of n records loses ⌊n·s⌋ or ⌈n·s⌉ of them (evenly
//! spread, deterministic, no random state).
//!
//! The share is process-wide (the engine runs one job per process), held as the bits of an
//! `f64` in an atomic; the per-record check is one relaxed load when nothing is shed.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::core::Collector;
use prometheus::{Encoder, IntCounterVec, Opts, Registry, TextEncoder};

/// Bits of the current shed share (0.0 = nothing shed).
static SHARE: AtomicU64 = AtomicU64::new(0);

struct ShedMetrics {
    registry: Registry,
    shed: IntCounterVec,
}

fn metrics() -> &'static ShedMetrics {
    static M: OnceLock<ShedMetrics> = OnceLock::new();
    M.get_or_init(|| {
        let registry = Registry::new();
        let shed = IntCounterVec::new(
            Opts::new(
                "streamscale_records_shed_total",
                "Source records dropped by load shedding (never emitted), per source subtask",
            ),
            &["operator", "subtask"],
        )
        .unwrap_or_else(|e| unreachable!("static metric definition: {e}"));
        // Registering one family in a fresh registry cannot collide.
        let _ = registry.register(Box::new(shed.clone()));
        ShedMetrics { registry, shed }
    })
}

/// The share of due source records dropped now, in [0, 1].
pub fn share() -> f64 {
    f64::from_bits(SHARE.load(Ordering::Relaxed))
}

/// Sets the shed share.
///
/// # Errors
/// A message when `share` is not a number in [0, 1].
pub fn set_share(share: f64) -> Result<(), String> {
    if !(0.0..=1.0).contains(&share) {
        return Err(format!("share: {share} is not in [0, 1]"));
    }
    SHARE.store(share.to_bits(), Ordering::Relaxed);
    Ok(())
}

/// Counts `n` records shed by the source subtask `labels` = `[operator, subtask]`. Called once
/// per emitted batch (not per record), so shedding adds no per-record label lookup to the
/// source's loop.
pub fn count_shed(labels: &[&str; 2], n: u64) {
    if n > 0 {
        metrics().shed.with_label_values(labels).inc_by(n);
    }
}

/// Whether record `seq` is among the dropped ones at share `s`: ⌊(seq + 1)·s⌋ > ⌊seq·s⌋.
pub fn drops(seq: u64, s: f64) -> bool {
    ((seq + 1) as f64 * s).floor() > (seq as f64 * s).floor()
}

/// Records shed so far by every source subtask of this process.
pub fn records_shed() -> u64 {
    metrics()
        .shed
        .collect()
        .iter()
        .flat_map(|f| f.get_metric())
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

/// The shed counter in Prometheus text format (appended to `/metrics`).
pub fn render() -> String {
    let mut buf = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&metrics().registry.gather(), &mut buf) {
        return format!("# error encoding shed metrics: {e}\n");
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Body of `POST /v1/shed`.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShedRequest {
    /// Share of due source records to drop, in [0, 1].
    pub share: f64,
}

/// Body of `GET /v1/shed` and of the answer to `POST /v1/shed`.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShedStatus {
    /// The share dropped now.
    pub share: f64,
    /// Records shed so far.
    pub records_shed: u64,
}

/// The current status.
pub fn status() -> ShedStatus {
    ShedStatus {
        share: share(),
        records_shed: records_shed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_run_loses_its_share() {
        for s in [0.0, 0.1, 0.25, 1.0 / 3.0, 0.5, 0.9, 1.0] {
            let dropped =
                |from: u64, n: u64| (from..from + n).filter(|&q| drops(q, s)).count() as f64;
            for (from, n) in [(0, 1000), (17, 333), (1_000_003, 50)] {
                let d = dropped(from, n);
                assert!((d - n as f64 * s).abs() <= 1.0, "share {s}: {d} of {n}");
            }
        }
    }
}
