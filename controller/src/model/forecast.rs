//! Forecasting the job's input rate, so that the planner can scale ahead of a predictable ramp.
//!
//! **Method.** Additive Holt-Winters with a damped trend, ETS(A,Ad,A) in the taxonomy of
//! Hyndman & Athanasopoulos, *Forecasting: Principles and Practice* (3rd ed., §8.3 Holt-Winters'
//! seasonal method, §8.2 damped trend; Gardner & McKenzie 1985), on the job's total source
//! arrival rate γ (records/s, summed over every source subtask) averaged into bins of
//! `binSeconds` (default season / 288, i.e. 5 min for a daily season). With m bins per season,
//! level ℓ, trend b, seasonal terms s:
//!
//! ```text
//! ℓ_t = α (y_t − s_{t−m}) + (1 − α)(ℓ_{t−1} + φ b_{t−1})
//! b_t = β (ℓ_t − ℓ_{t−1}) + (1 − β) φ b_{t−1}
//! s_t = γ (y_t − ℓ_t) + (1 − γ) s_{t−m}
//! ŷ_{t+h} = ℓ_t + (φ + φ² + … + φ^h) b_t + s_{t+h−m(⌊(h−1)/m⌋+1)}
//! ```
//!
//! with fixed smoothing constants α = 0.2, β = 0.05, γ = 0.3, φ = 0.9 (no likelihood fit: the
//! decision stays cheap and predictable), initialised from the first season (ℓ = its mean,
//! s = its deviations, b = 0). A bin without data (the controller was down) is skipped: level
//! and trend follow the forecast, the seasonal term is kept. Forecasts are clamped at 0.
//!
//! **Use.** With `forecast.mode: on`, the planner plans for max(measured γ, peak forecast over
//! the next `horizonSeconds` + the expected rescale downtime), so a scale-up lands before the
//! ramp rather than after it, and no scale-down happens just before one. The forecast is
//! applied by scaling the sources' arrival counters of the metric window (so γ, the catch-up
//! rate and the traffic equations all follow), at most by [`MAX_FACTOR`].
//!
//! **Fallback.** The decision is reactive (and its reasons say why) while the history spans
//! less than one season plus [`MIN_CHECKED`] bins, or while the recent forecast error — the
//! weighted absolute percentage error WAPE = Σ|y − ŷ| / Σ y of the forecasts made one horizon
//! ahead, over the last [`ERROR_WINDOW`] bins — exceeds `maxError` (default 30%).
//!
//! **History.** [`RateHistory`] holds the bins of the last [`KEEP_SEASONS`] seasons, the
//! pending and checked forecasts; it is plain data (serde), taken and returned by the
//! [`Autoscaler`](super::Autoscaler) so that callers can persist it (`streamscale run` writes
//! it to a file). Times are seconds on the caller's clock (`now_s`, `at_seconds`);
//! [`RateHistory::shifted`] moves a history to another clock.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use streamscale_engine::spec::{ForecastMode, ForecastSpec, JobSpec, OperatorKind};

use super::float_text::Fixed;
use super::sample::MetricSample;

/// Level smoothing constant α.
pub const ALPHA: f64 = 0.2;
/// Trend smoothing constant β.
pub const BETA: f64 = 0.05;
/// Seasonal smoothing constant γ.
pub const GAMMA: f64 = 0.3;
/// Trend damping φ.
pub const PHI: f64 = 0.9;
/// Seasons of bins kept.
pub const KEEP_SEASONS: i64 = 4;
/// Forecast checks the WAPE is taken over (the most recent).
pub const ERROR_WINDOW: usize = 24;
/// Checked forecasts needed (beyond one season of history) before the forecast is used.
pub const MIN_CHECKED: usize = 6;
/// Largest factor by which the forecast raises the planned source rates.
pub const MAX_FACTOR: f64 = 4.0;
/// Most bins per season; a finer `binSeconds` is coarsened to this.
pub const MAX_BINS_PER_SEASON: f64 = 4096.0;

/// Forecast settings resolved from a [`ForecastSpec`]. Seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForecastConfig {
    /// Off, on or recommend-only.
    pub mode: ForecastMode,
    /// Season length, s.
    pub season_seconds: f64,
    /// Bin width, s.
    pub bin_seconds: f64,
    /// Planning horizon before the rescale downtime is added, s.
    pub horizon_seconds: f64,
    /// Largest WAPE at which the forecast is used.
    pub max_error: f64,
}

impl ForecastConfig {
    /// The job's forecast settings (`autoscaler.forecast`), `None` when absent or `off`.
    pub fn of(spec: &JobSpec) -> Option<ForecastConfig> {
        let f: &ForecastSpec = spec.autoscaler.forecast.as_ref()?;
        if f.mode == ForecastMode::Off {
            return None;
        }
        let season = f.season_seconds;
        let bin = f
            .bin_seconds
            .unwrap_or(season / 288.0)
            .max(season / MAX_BINS_PER_SEASON);
        Some(ForecastConfig {
            mode: f.mode,
            season_seconds: season,
            bin_seconds: bin,
            horizon_seconds: f.horizon_seconds.unwrap_or(2.0 * bin),
            max_error: f.max_error,
        })
    }

    fn bins_per_season(&self) -> i64 {
        ((self.season_seconds / self.bin_seconds).round() as i64).max(2)
    }
}

/// The bin being filled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenBin {
    /// Bin index, ⌊t / binSeconds⌋.
    pub index: i64,
    /// Σ rate × covered seconds, records.
    pub records: f64,
    /// Covered seconds.
    pub seconds: f64,
}

/// The job's input-rate history and forecast bookkeeping. Plain data: persist it as JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RateHistory {
    /// Bin width the bins were made with, s.
    pub bin_seconds: f64,
    /// Season length the history was kept for, s.
    pub season_seconds: f64,
    /// Completed bins `(index, mean rate records/s)`, index ascending; index = ⌊t / binSeconds⌋.
    pub bins: Vec<(i64, f64)>,
    /// The bin being filled.
    pub open: Option<OpenBin>,
    /// The last `(time s, total arrivals records)` seen, for counter deltas.
    pub last: Option<(f64, f64)>,
    /// Forecasts awaiting their bin: `(bin index, forecast records/s)`.
    pub pending: Vec<(i64, f64)>,
    /// Checked forecasts `(actual, forecast)` in records/s, oldest first, at most
    /// [`ERROR_WINDOW`].
    pub checked: Vec<(f64, f64)>,
}

/// Errors of a history that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HistoryError {
    /// A field is out of range.
    #[error("forecast history: {0}")]
    Invalid(String),
}

/// The fitted Holt-Winters state after the last completed bin.
#[derive(Debug, Clone, PartialEq)]
struct Fit {
    last_index: i64,
    level: f64,
    trend: f64,
    /// Seasonal term by slot `index.rem_euclid(m)`.
    season: Vec<f64>,
}

/// What the forecast says about this decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// Factor (> 1) by which to raise the planned source rates, when the forecast applies.
    pub factor: Option<f64>,
    /// The sentence for the decision's reasons.
    pub note: String,
}

impl RateHistory {
    /// An empty history for `cfg`.
    pub fn new(cfg: &ForecastConfig) -> RateHistory {
        RateHistory {
            bin_seconds: cfg.bin_seconds,
            season_seconds: cfg.season_seconds,
            ..RateHistory::default()
        }
    }

    /// The same history on a clock `offset_s` seconds ahead (t' = t + offset): bins move by the
    /// whole number of bins nearest to the offset.
    pub fn shifted(&self, offset_s: f64) -> RateHistory {
        let mut h = self.clone();
        if self.bin_seconds.is_nan() || self.bin_seconds <= 0.0 || !offset_s.is_finite() {
            return h;
        }
        let k = (offset_s / self.bin_seconds).round() as i64;
        for b in &mut h.bins {
            b.0 += k;
        }
        for b in &mut h.pending {
            b.0 += k;
        }
        if let Some(o) = &mut h.open {
            o.index += k;
        }
        h.last = h.last.map(|(t, a)| (t + offset_s, a));
        h
    }

    /// Checks the invariants a loaded history must hold (finite, non-negative rates, ascending
    /// bins, a positive bin width).
    ///
    /// # Errors
    /// [`HistoryError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<(), HistoryError> {
        let bad = |w: String| Err(HistoryError::Invalid(w));
        if !(self.bin_seconds > 0.0 && self.bin_seconds.is_finite()) {
            return bad(format!("binSeconds {} must be positive", self.bin_seconds));
        }
        if !(self.season_seconds >= 2.0 * self.bin_seconds && self.season_seconds.is_finite()) {
            return bad(format!(
                "seasonSeconds {} must be at least two bins",
                self.season_seconds
            ));
        }
        for (k, w) in self.bins.windows(2).enumerate() {
            if w[1].0 <= w[0].0 {
                return bad(format!("bins[{}]: index {} not ascending", k + 1, w[1].0));
            }
        }
        for (k, (_, r)) in self.bins.iter().enumerate() {
            if !(r.is_finite() && *r >= 0.0) {
                return bad(format!("bins[{k}]: rate {r} is not a finite rate >= 0"));
            }
        }
        let all_finite = self
            .pending
            .iter()
            .map(|p| p.1)
            .chain(self.checked.iter().flat_map(|c| [c.0, c.1]))
            .all(f64::is_finite);
        if !all_finite {
            return bad("a pending or checked forecast is not finite".into());
        }
        Ok(())
    }

    fn matches(&self, cfg: &ForecastConfig) -> bool {
        self.bin_seconds == cfg.bin_seconds && self.season_seconds == cfg.season_seconds
    }

    /// Feeds the window's total source arrivals (summed over every source subtask) into the
    /// bins: each interval between consecutive samples newer than the last one seen adds its
    /// mean rate to the bins it covers. A sample lacking an arrival figure is skipped; a
    /// counter that went backwards (a restart) or a gap longer than a season restarts the
    /// deltas without adding anything. A history made for other bin or season lengths is
    /// started afresh.
    pub fn observe(&mut self, cfg: &ForecastConfig, window: &[MetricSample], spec: &JobSpec) {
        if !self.matches(cfg) {
            *self = RateHistory::new(cfg);
        }
        let sources: Vec<&str> = spec
            .operators
            .iter()
            .filter(|o| matches!(o.kind, OperatorKind::Source { .. }))
            .map(|o| o.name.as_str())
            .collect();
        for s in window {
            if self.last.is_some_and(|(t, _)| s.at_seconds <= t) || !s.at_seconds.is_finite() {
                continue;
            }
            let Some(total) = total_arrivals(s, &sources) else {
                continue;
            };
            if let Some((t0, a0)) = self.last {
                let dt = s.at_seconds - t0;
                if total >= a0 && dt <= cfg.season_seconds {
                    self.add(cfg, t0, s.at_seconds, (total - a0) / dt);
                }
            }
            self.last = Some((s.at_seconds, total));
        }
    }

    /// Adds rate `r` over `[t0, t1)` to the bins.
    fn add(&mut self, cfg: &ForecastConfig, t0: f64, t1: f64, r: f64) {
        let b = cfg.bin_seconds;
        let first = (t0 / b).floor() as i64;
        let last = ((t1 / b).ceil() as i64 - 1).max(first);
        for k in first..=last {
            let lo = t0.max(k as f64 * b);
            let hi = t1.min((k + 1) as f64 * b);
            if hi <= lo {
                continue;
            }
            match self.open {
                Some(o) if o.index == k => {}
                Some(o) if o.index > k => continue,
                _ => {
                    if let Some(o) = self.open.take() {
                        self.close(cfg, o);
                    }
                    self.open = Some(OpenBin {
                        index: k,
                        records: 0.0,
                        seconds: 0.0,
                    });
                }
            }
            if let Some(o) = &mut self.open {
                o.records += r * (hi - lo);
                o.seconds += hi - lo;
            }
        }
    }

    /// Completes bin `o`: checks the forecast made for it, refits, and records the forecast
    /// for the bin one horizon ahead.
    fn close(&mut self, cfg: &ForecastConfig, o: OpenBin) {
        if o.seconds <= 0.0 {
            return;
        }
        let y = o.records / o.seconds;
        if let Some(pos) = self.pending.iter().position(|p| p.0 == o.index) {
            let (_, f) = self.pending[pos];
            self.checked.push((y, f));
            if self.checked.len() > ERROR_WINDOW {
                self.checked.remove(0);
            }
        }
        self.pending.retain(|p| p.0 > o.index);
        self.bins.push((o.index, y));
        let m = cfg.bins_per_season();
        let oldest = o.index - KEEP_SEASONS * m;
        let cut = self.bins.partition_point(|b| b.0 <= oldest);
        self.bins.drain(..cut);
        let lead = ((cfg.horizon_seconds / cfg.bin_seconds).ceil() as i64).max(1);
        if let Some(fit) = self.fit(m) {
            let target = o.index + lead;
            self.pending.push((target, fit.forecast(target, m)));
        }
    }

    /// The Holt-Winters fit over the stored bins, `None` with less than one season.
    fn fit(&self, m: i64) -> Option<Fit> {
        let &(i0, _) = self.bins.first()?;
        let &(i1, _) = self.bins.last()?;
        if i1 - i0 + 1 < m {
            return None;
        }
        let mu = m as usize;
        let mut season = vec![0.0; mu];
        // The first season's bins (a prefix: the bins are in ascending order).
        let n0 = self.bins.iter().take_while(|b| b.0 < i0 + m).count();
        let first = &self.bins[..n0];
        let level0 = first.iter().map(|b| b.1).sum::<f64>() / first.len() as f64;
        for b in first {
            season[b.0.rem_euclid(m) as usize] = b.1 - level0;
        }
        let (mut level, mut trend) = (level0, 0.0);
        let mut next = first.len();
        for t in (i0 + m)..=i1 {
            let slot = t.rem_euclid(m) as usize;
            let obs = self.bins.get(next).filter(|b| b.0 == t).map(|b| b.1);
            if obs.is_some() {
                next += 1;
            }
            let damped = level + PHI * trend;
            match obs {
                Some(y) => {
                    let l = ALPHA * (y - season[slot]) + (1.0 - ALPHA) * damped;
                    trend = BETA * (l - level) + (1.0 - BETA) * PHI * trend;
                    season[slot] = GAMMA * (y - l) + (1.0 - GAMMA) * season[slot];
                    level = l;
                }
                None => {
                    level = damped;
                    trend *= PHI;
                }
            }
        }
        Some(Fit {
            last_index: i1,
            level,
            trend,
            season,
        })
    }

    /// Seconds from the first stored bin to the end of the last.
    fn span_seconds(&self) -> f64 {
        match (self.bins.first(), self.bins.last()) {
            (Some(a), Some(b)) => (b.0 - a.0 + 1) as f64 * self.bin_seconds,
            _ => 0.0,
        }
    }

    /// The recent forecast error, WAPE = Σ|y − ŷ| / Σ y over the checked forecasts.
    pub fn recent_error(&self) -> Option<f64> {
        if self.checked.is_empty() {
            return None;
        }
        let (abs, sum) = self
            .checked
            .iter()
            .fold((0.0, 0.0), |(a, s), (y, f)| (a + (y - f).abs(), s + y));
        Some(if sum > 0.0 {
            abs / sum
        } else if abs > 0.0 {
            f64::INFINITY
        } else {
            0.0
        })
    }

    /// The forecast peak rate (records/s) over `[now_s, now_s + lead_s]`, `None` before one
    /// season of history.
    pub fn peak(&self, cfg: &ForecastConfig, now_s: f64, lead_s: f64) -> Option<f64> {
        let m = cfg.bins_per_season();
        let fit = self.fit(m)?;
        let b = cfg.bin_seconds;
        let from = ((now_s / b).floor() as i64).max(fit.last_index + 1);
        let to = (((now_s + lead_s) / b).floor() as i64).max(from);
        (from..=to.min(from + m))
            .map(|k| fit.forecast(k, m))
            .reduce(f64::max)
    }

    /// Advice for a decision at `now_s` whose window measured the input rate `measured`
    /// (records/s), with `downtime_s` the expected rescale downtime.
    pub fn advise(
        &self,
        cfg: &ForecastConfig,
        now_s: f64,
        measured: f64,
        downtime_s: f64,
    ) -> Advice {
        let reactive = |why: String| Advice {
            factor: None,
            note: format!("forecast unused, reactive decision: {why}"),
        };
        let need = cfg.season_seconds + MIN_CHECKED as f64 * cfg.bin_seconds;
        let span = self.span_seconds();
        if span < need || self.checked.len() < MIN_CHECKED {
            return reactive(format!(
                "history spans {} s and {} forecasts were checked; need {} s (one season of {} s plus {MIN_CHECKED} bins) and {MIN_CHECKED} checks",
                Fixed(span, 0),
                self.checked.len(),
                Fixed(need, 0),
                Fixed(cfg.season_seconds, 0)
            ));
        }
        let err = self.recent_error().unwrap_or(f64::INFINITY);
        if err > cfg.max_error {
            return reactive(format!(
                "recent forecast error (WAPE over the last {} bins) {}% above maxError {}%",
                self.checked.len(),
                Fixed(100.0 * err, 0),
                Fixed(100.0 * cfg.max_error, 0)
            ));
        }
        let lead = cfg.horizon_seconds + downtime_s.max(0.0);
        let Some(peak) = self.peak(cfg, now_s, lead) else {
            return reactive("no fit".into());
        };
        let mut note = format!(
            "forecast (Holt-Winters, season {} s, error {}%): input peaks at {} rec/s within {} s (horizon {} s + rescale downtime {} s), measured {} rec/s",
            Fixed(cfg.season_seconds, 0),
            Fixed(100.0 * err, 0),
            Fixed(peak, 1),
            Fixed(lead, 0),
            Fixed(cfg.horizon_seconds, 0),
            Fixed(downtime_s.max(0.0), 1),
            Fixed(measured, 1)
        );
        if measured.is_nan() || measured <= 0.0 || peak <= measured {
            note.push_str("; planned for the measured rate");
            return Advice { factor: None, note };
        }
        let factor = (peak / measured).min(MAX_FACTOR);
        if cfg.mode == ForecastMode::Recommend {
            let _ = write!(
                note,
                "; recommend-only: would plan for {} rec/s (×{}), decided reactively",
                Fixed(measured * factor, 1),
                Fixed(factor, 2)
            );
            return Advice { factor: None, note };
        }
        let _ = write!(
            note,
            "; planned for {} rec/s (×{}) ahead of the ramp",
            Fixed(measured * factor, 1),
            Fixed(factor, 2)
        );
        Advice {
            factor: Some(factor),
            note,
        }
    }
}

impl Fit {
    fn forecast(&self, k: i64, m: i64) -> f64 {
        let h = (k - self.last_index).max(1);
        // φ + φ² + … + φ^h = φ (1 − φ^h) / (1 − φ).
        let damp = PHI * (1.0 - PHI.powi(h.min(i64::from(i32::MAX)) as i32)) / (1.0 - PHI);
        (self.level + damp * self.trend + self.season[k.rem_euclid(m) as usize]).max(0.0)
    }
}

/// Σ `source_arrivals` over every subtask of `sources` in `s`; `None` when any is missing.
fn total_arrivals(s: &MetricSample, sources: &[&str]) -> Option<f64> {
    let mut total = 0.0;
    for name in sources {
        for sub in s.operators.get(*name)? {
            total += sub.source_arrivals?;
        }
    }
    Some(total)
}

/// The measured input rate of the window (records/s): total arrivals from the first to the last
/// sample over its span; `None` when a figure is missing or the span is not positive.
pub fn measured_rate(window: &[MetricSample], spec: &JobSpec) -> Option<f64> {
    let sources: Vec<&str> = spec
        .operators
        .iter()
        .filter(|o| matches!(o.kind, OperatorKind::Source { .. }))
        .map(|o| o.name.as_str())
        .collect();
    let (first, last) = (window.first()?, window.last()?);
    let dt = last.at_seconds - first.at_seconds;
    let d = total_arrivals(last, &sources)? - total_arrivals(first, &sources)?;
    (dt > 0.0 && d >= 0.0).then(|| d / dt)
}

/// A copy of `window` whose source arrival counters grow `factor` times as fast (each
/// subtask's counter relative to its first sample), so every rate planned from the sources
/// (γ, the catch-up rate, λ) is `factor` times the measured one; backlogs are unchanged.
pub fn scale_arrivals(window: &[MetricSample], spec: &JobSpec, factor: f64) -> Vec<MetricSample> {
    let mut out = window.to_vec();
    let Some(first) = window.first() else {
        return out;
    };
    for op in &spec.operators {
        if !matches!(op.kind, OperatorKind::Source { .. }) {
            continue;
        }
        let Some(base) = first.operators.get(&op.name) else {
            continue;
        };
        for s in &mut out {
            let Some(subs) = s.operators.get_mut(&op.name) else {
                continue;
            };
            for (sub, b) in subs.iter_mut().zip(base) {
                if let (Some(a), Some(a0)) = (sub.source_arrivals, b.source_arrivals) {
                    sub.source_arrivals = Some(a0 + factor * (a - a0));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::autoscaler::{Autoscaler, Verdict};
    use crate::model::sample::SubtaskSample;
    use crate::model::testutil::job;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const SEASON: f64 = 1440.0;

    fn chain(forecast: &str) -> JobSpec {
        job(&format!(
            r"
name: chain
operators:
  - {{ name: src, kind: source, parallelism: 2, rate: {{ constant: 100 }} }}
  - {{ name: map, kind: map, parallelism: 1 }}
  - {{ name: sink, kind: sink }}
edges:
  - {{ from: src, to: map }}
  - {{ from: map, to: sink }}
autoscaler: {{ forecast: {forecast}, maxUtilization: 0.8, scaleDownLookbackSeconds: 0 }}
"
        ))
    }

    fn cfg_of(spec: &JobSpec) -> ForecastConfig {
        ForecastConfig::of(spec).expect("forecast on")
    }

    /// Diurnal rate: 300 ± 200 rec/s, trough at t = 0, peak at half a season.
    fn rate(t: f64) -> f64 {
        300.0 - 200.0 * (std::f64::consts::TAU * t / SEASON).cos()
    }

    /// ∫₀ᵗ rate.
    fn arrivals(t: f64) -> f64 {
        300.0 * t
            - 200.0 * SEASON / std::f64::consts::TAU * (std::f64::consts::TAU * t / SEASON).sin()
    }

    /// A consistent sample of the chain at `t`: 2 source subtasks sharing arrivals, map with
    /// μ = 100 rec/s per subtask at `map_p` subtasks, no backlog.
    fn sample(t: f64, map_p: u32, arr: &dyn Fn(f64) -> f64) -> MetricSample {
        let a = arr(t);
        let mut ops = BTreeMap::new();
        ops.insert(
            "src".to_string(),
            (0..2)
                .map(|_| SubtaskSample {
                    records_out: a / 2.0,
                    source_arrivals: Some(a / 2.0),
                    source_backlog: Some(0.0),
                    ..SubtaskSample::default()
                })
                .collect(),
        );
        let p = f64::from(map_p);
        ops.insert(
            "map".to_string(),
            (0..map_p)
                .map(|_| SubtaskSample {
                    records_in: a / p,
                    records_out: a / p,
                    busy_seconds: a / p / 100.0,
                    idle_seconds: (t - a / p / 100.0).max(0.0),
                    ..SubtaskSample::default()
                })
                .collect(),
        );
        ops.insert(
            "sink".to_string(),
            vec![SubtaskSample {
                records_in: a,
                busy_seconds: a / 10_000.0,
                idle_seconds: t,
                ..SubtaskSample::default()
            }],
        );
        MetricSample {
            at_seconds: t,
            operators: ops,
        }
    }

    fn win(t: f64, map_p: u32, arr: &dyn Fn(f64) -> f64) -> Vec<MetricSample> {
        (0..5)
            .map(|k| sample(t - 20.0 + 5.0 * f64::from(k), map_p, arr))
            .collect()
    }

    /// Feeds windows every 5 s over `[from, to)`.
    fn feed(h: &mut RateHistory, cfg: &ForecastConfig, spec: &JobSpec, from: f64, to: f64) {
        let mut t = from;
        while t < to {
            h.observe(cfg, &win(t, 4, &arrivals), spec);
            t += 5.0;
        }
    }

    #[test]
    fn config_defaults_and_off() {
        assert!(ForecastConfig::of(&chain("{ mode: off }")).is_none());
        let c = cfg_of(&chain("{ mode: on, seasonSeconds: 1440 }"));
        assert_eq!(c.bin_seconds, 5.0);
        assert_eq!(c.horizon_seconds, 10.0);
        assert_eq!(c.max_error, 0.3);
    }

    #[test]
    fn invalid_settings_name_the_field() {
        let bad = |f: &str| {
            let yaml = format!(
                "name: j\noperators:\n  - {{ name: s, kind: source, rate: {{ constant: 1 }} }}\nedges: []\nautoscaler: {{ forecast: {f} }}\n"
            );
            match JobSpec::from_yaml(&yaml) {
                Ok(s) => s.validate().expect_err("invalid"),
                Err(e) => e.to_string(),
            }
        };
        assert!(
            bad("{ mode: on, seasonSeconds: 0 }").contains("autoscaler.forecast.seasonSeconds")
        );
        assert!(bad("{ mode: on, seasonSeconds: 100, binSeconds: 60 }").contains("binSeconds"));
        assert!(bad("{ mode: on, horizonSeconds: -1 }").contains("horizonSeconds"));
        assert!(bad("{ mode: on, maxError: 0 }").contains("maxError"));
        assert!(bad("{ mode: sometimes }").contains("sometimes"));
    }

    #[test]
    fn learns_a_daily_cycle_and_tracks_its_error() {
        let spec = chain("{ mode: on, seasonSeconds: 1440 }");
        let cfg = cfg_of(&spec);
        let mut h = RateHistory::new(&cfg);
        feed(&mut h, &cfg, &spec, 20.0, 0.5 * SEASON);
        let a = h.advise(&cfg, 0.5 * SEASON, 300.0, 0.0);
        assert!(
            a.factor.is_none() && a.note.contains("history spans"),
            "{a:?}"
        );
        feed(&mut h, &cfg, &spec, 0.5 * SEASON, 3.0 * SEASON);
        let err = h.recent_error().expect("checked forecasts");
        assert!(err < 0.05, "WAPE {err}");
        // On the ramp (a quarter season in), the peak over the next 60 s is the rate at its end.
        let now = 3.25 * SEASON;
        feed(&mut h, &cfg, &spec, 3.0 * SEASON, now);
        let peak = h.peak(&cfg, now, 60.0).expect("fit");
        assert!(
            (peak - rate(now + 60.0)).abs() < 0.05 * rate(now + 60.0),
            "{peak} vs {}",
            rate(now + 60.0)
        );
        let a = h.advise(&cfg, now, rate(now), 50.0);
        let f = a.factor.expect("ahead of the ramp");
        assert!(f > 1.0, "{a:?}");
        assert!(a.note.contains("Holt-Winters") && a.note.contains("rescale downtime 50.0 s"));
        // At the peak nothing rises ahead: reactive.
        let now = 3.5 * SEASON;
        feed(&mut h, &cfg, &spec, 3.25 * SEASON, now);
        let a = h.advise(&cfg, now, rate(now), 0.0);
        assert!(
            a.factor.is_none() && a.note.contains("measured rate"),
            "{a:?}"
        );
    }

    #[test]
    fn large_recent_error_falls_back() {
        let spec = chain("{ mode: on, seasonSeconds: 1440 }");
        let cfg = cfg_of(&spec);
        let mut h = RateHistory::new(&cfg);
        feed(&mut h, &cfg, &spec, 20.0, 2.0 * SEASON);
        // Then the rate turns erratic (each 5 s at 50 or 1000 rec/s, pseudo-random): the
        // forecasts one horizon ahead miss by far more than 30%.
        let mut state = 12345u64;
        let mut total = arrivals(2.0 * SEASON - 5.0);
        let mut t = 2.0 * SEASON;
        while t < 2.2 * SEASON {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            total += 5.0 * if state >> 63 == 1 { 1000.0 } else { 50.0 };
            let at = total;
            h.observe(&cfg, &[sample(t, 4, &|_| at)], &spec);
            t += 5.0;
        }
        let a = h.advise(&cfg, t, 300.0, 0.0);
        assert!(a.factor.is_none(), "{a:?}");
        assert!(a.note.contains("recent forecast error"), "{}", a.note);
    }

    #[test]
    fn scaling_the_window_scales_gamma_only() {
        let spec = chain("{ mode: on }");
        let w = win(100.0, 4, &|t| 200.0 * t);
        let s = scale_arrivals(&w, &spec, 1.5);
        assert_eq!(measured_rate(&w, &spec), Some(200.0));
        let r = measured_rate(&s, &spec).expect("rate");
        assert!((r - 300.0).abs() < 1e-9);
        assert_eq!(s[4].operators["map"], w[4].operators["map"]);
    }

    #[test]
    fn history_round_trips_and_shifts() {
        let spec = chain("{ mode: on, seasonSeconds: 1440 }");
        let cfg = cfg_of(&spec);
        let mut h = RateHistory::new(&cfg);
        feed(&mut h, &cfg, &spec, 20.0, 1.5 * SEASON);
        let json = serde_json::to_string(&h).expect("json");
        let back: RateHistory = serde_json::from_str(&json).expect("parse");
        back.validate().expect("valid");
        assert_eq!(back.bins.len(), h.bins.len());
        assert!(
            back.bins
                .iter()
                .zip(&h.bins)
                .all(|(a, b)| a.0 == b.0 && (a.1 - b.1).abs() <= 1e-9 * b.1)
        );
        let moved = h.shifted(1000.0).shifted(-1000.0);
        assert!(moved == h, "shifting there and back changes the history");
        // A shifted history forecasts the same rate at the shifted time.
        let full = {
            let mut g = h.clone();
            feed(&mut g, &cfg, &spec, 1.5 * SEASON, 2.5 * SEASON);
            g
        };
        let later = full.shifted(7200.0);
        let (a, b) = (
            full.peak(&cfg, 2.6 * SEASON, 0.0).expect("fit"),
            later.peak(&cfg, 2.6 * SEASON + 7200.0, 0.0).expect("fit"),
        );
        assert!((a - b).abs() < 1e-6 * a.max(1.0), "{a} {b}");
        let mut broken = h;
        broken.bins[3].1 = f64::NAN;
        assert!(broken.validate().is_err());
    }

    /// Decides every 5 s over `[from, to)`, map at the parallelism the autoscaler chose.
    fn drive(a: &mut Autoscaler, spec: &JobSpec, from: f64, to: f64, p: &mut u32) -> Vec<Verdict> {
        let mut t = from;
        let mut out = Vec::new();
        while t < to {
            let v = a.decide(t, &win(t, *p, &arrivals), spec);
            if let Verdict::Rescale(d) = &v {
                *p = d.parallelism["map"];
            }
            out.push(v);
            t += 5.0;
        }
        out
    }

    #[test]
    fn scales_ahead_of_the_ramp_only_when_on() {
        // 120 s ahead the rate (≈ 342 rec/s) puts map's 4 subtasks at ρ ≈ 0.85, above the
        // planner's scale-up tolerance band (ρ_target 0.7 · 1.1); the reactive rate (≈ 238)
        // keeps them at ρ ≈ 0.6.
        let on = chain("{ mode: on, seasonSeconds: 1440, horizonSeconds: 120 }");
        let rec = chain("{ mode: recommend, seasonSeconds: 1440, horizonSeconds: 120 }");
        let off = chain("{ mode: off }");
        let mut runs = Vec::new();
        for spec in [&on, &rec, &off] {
            let mut a = Autoscaler::default();
            let mut p = 4;
            drive(&mut a, spec, 20.0, 3.2 * SEASON, &mut p);
            let v = drive(&mut a, spec, 3.2 * SEASON, 3.2 * SEASON + 5.0, &mut p);
            runs.push((p, v));
        }
        let note = |v: &Verdict| match v {
            Verdict::Rescale(d) => d.reasons.join(" | "),
            Verdict::Hold {
                recommendation: Some(d),
                ..
            } => d.reasons.join(" | "),
            Verdict::Hold { reason, .. } => reason.clone(),
        };
        // On the ramp: the forecast plans for the rate 120 s ahead, so map runs more subtasks.
        assert!(
            runs[0].0 > runs[2].0,
            "on {} vs off {}",
            runs[0].0,
            runs[2].0
        );
        assert_eq!(runs[1].0, runs[2].0, "recommend-only decides reactively");
        assert!(
            note(&runs[0].1[0]).contains("ahead of the ramp"),
            "{}",
            note(&runs[0].1[0])
        );
        assert!(
            note(&runs[1].1[0]).contains("recommend-only"),
            "{}",
            note(&runs[1].1[0])
        );
        assert!(!note(&runs[2].1[0]).contains("forecast"));
    }

    proptest! {
        /// A constant rate scraped at irregular intervals fills every bin with that rate, and
        /// the forecast of a constant series is that constant.
        #[test]
        fn constant_rate_irregular_scrapes(r in 1.0f64..1e4, gaps in prop::collection::vec(0.3f64..9.0, 700..900)) {
            let spec = chain("{ mode: on, seasonSeconds: 1440 }");
            let cfg = cfg_of(&spec);
            let mut h = RateHistory::new(&cfg);
            let mut t = 0.0;
            for g in gaps {
                t += g;
                h.observe(&cfg, &[sample(t, 1, &|x| r * x)], &spec);
            }
            for (_, b) in &h.bins {
                prop_assert!((b - r).abs() <= 1e-9 * r, "bin {} vs {}", b, r);
            }
            if let Some(p) = h.peak(&cfg, t, 100.0) {
                prop_assert!((p - r).abs() <= 1e-6 * r, "peak {} vs {}", p, r);
            }
        }

        /// Forecasts are finite and never negative whatever the history.
        #[test]
        fn forecasts_finite_and_non_negative(rates in prop::collection::vec(0.0f64..1e5, 300..700), lead in 0.0f64..2000.0) {
            let cfg = ForecastConfig { mode: ForecastMode::On, season_seconds: 1440.0, bin_seconds: 5.0, horizon_seconds: 10.0, max_error: 0.3 };
            let mut h = RateHistory::new(&cfg);
            for (k, r) in rates.iter().enumerate() {
                h.add(&cfg, 5.0 * k as f64, 5.0 * (k + 1) as f64, *r);
            }
            h.add(&cfg, 5.0 * rates.len() as f64, 5.0 * rates.len() as f64 + 1.0, 0.0);
            if let Some(p) = h.peak(&cfg, 5.0 * rates.len() as f64, lead) {
                prop_assert!(p.is_finite() && p >= 0.0);
            }
            let a = h.advise(&cfg, 5.0 * rates.len() as f64, 100.0, 5.0);
            if let Some(f) = a.factor {
                prop_assert!(f > 1.0 && f <= MAX_FACTOR);
            }
        }
    }
}
