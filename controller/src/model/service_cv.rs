//! The per-record service time's coefficient of variation cs, from the engine's batch sums.
//!
//! The engine times records in batches (`streamscale_engine::service_time`): batch i holds
//! n_i records and took T_i seconds. Assuming the per-record service times independent with
//! mean m and variance σ² (so T_i = n_i·m + e_i, Var e_i = n_i·σ²), over a window
//!
//! ```text
//! m̂  = ΣT / Σn
//! σ̂² = (ΣT² − 2·m̂·ΣnT + m̂²·Σn²) / (Σn − Σn²/Σn)      (= Σ(T_i − n_i·m̂)² / its expectation over σ²)
//! cs² = σ̂² / m̂²
//! ```
//!
//! The denominator is the residuals' expected sum of squares over σ² for the weighted
//! least-squares mean, so σ̂² is unbiased: for batches of one record it is the sample
//! variance, and a single batch says nothing (0 degrees of freedom). The effective number of
//! batches (Σn)²/Σn² (K for K equal batches) decides whether the window says enough
//! ([`MIN_SERVICE_BATCHES`]). Several subtasks of an operator are pooled as subtasks of one
//! shape at possibly different speeds: each subtask's residuals about its own mean, over that
//! mean squared, their sums and degrees of freedom added (so a subtask on a slower core does
//! not read as variability).

use super::sample::ServiceMoments;

/// Fewest effective batches ((Σn)²/Σn², summed over the subtasks) from which cs is estimated:
/// σ̂² then has a relative standard error of about √(2/30) ≈ 26 % for normal batch errors.
/// Fewer: no estimate (the planner keeps the configured cs).
pub const MIN_SERVICE_BATCHES: f64 = 30.0;

/// Largest cs read from a measurement. Batch-pace noise (a descheduled thread, a cache gone
/// cold) adds to the estimate, the more the longer the batches; above this (cs² = 9, a very
/// heavy tail) the figure is more likely that noise than the records' own service times, and
/// the planner's G/G/c terms would size on it.
pub const MAX_MEASURED_SERVICE_CV: f64 = 3.0;

/// Pools subtasks' window deltas of [`ServiceMoments`] into an operator's cs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServicePool {
    /// Σ over subtasks of the residual sum of squares about the subtask's mean m_j, over m_j²
    /// (records).
    rss: f64,
    /// Σ over subtasks of Σn − Σn²/Σn (records).
    dof: f64,
    /// Σ over subtasks of the effective batch count (Σn)²/Σn².
    batches: f64,
}

impl ServicePool {
    /// Adds one subtask's sums over the window (`d`: the last scrape's less the first's).
    /// A subtask with no record, a non-finite or negative sum (a counter reset) or sums that
    /// no set of batches can have is left out.
    pub fn add(&mut self, d: &ServiceMoments) {
        let fields = [
            d.records,
            d.seconds,
            d.seconds_sq,
            d.record_seconds,
            d.records_sq,
        ];
        if !fields.iter().all(|x| x.is_finite() && *x >= 0.0)
            || d.records <= 0.0
            || d.seconds <= 0.0
        {
            return;
        }
        // Σn² ≥ (Σn)²/K ≥ … and Σn² ≤ (Σn)²: a single batch (or none) has no spread.
        if d.records_sq <= 0.0 || d.records_sq > d.records * d.records {
            return;
        }
        let m = d.seconds / d.records;
        let rss = d.seconds_sq - 2.0 * m * d.record_seconds + m * m * d.records_sq;
        self.rss += rss.max(0.0) / (m * m);
        self.dof += d.records - d.records_sq / d.records;
        self.batches += d.records * d.records / d.records_sq;
    }

    /// The effective number of batches pooled so far.
    pub fn batches(&self) -> f64 {
        self.batches
    }

    /// The squared coefficient of variation cs² (see the module documentation), `None` with
    /// fewer than [`MIN_SERVICE_BATCHES`] effective batches.
    pub fn squared_cv(&self) -> Option<f64> {
        if !(self.batches >= MIN_SERVICE_BATCHES && self.dof > 0.0) {
            return None;
        }
        let scv = self.rss / self.dof;
        scv.is_finite().then_some(scv)
    }

    /// cs = √cs², at most [`MAX_MEASURED_SERVICE_CV`]; `None` as [`Self::squared_cv`].
    pub fn cv(&self) -> Option<f64> {
        Some(self.squared_cv()?.sqrt().min(MAX_MEASURED_SERVICE_CV))
    }
}

/// An operator's cs from its subtasks' window deltas ([`ServicePool`]).
pub fn service_cv<'a>(deltas: impl IntoIterator<Item = &'a ServiceMoments>) -> Option<f64> {
    let mut pool = ServicePool::default();
    for d in deltas {
        pool.add(d);
    }
    pool.cv()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sums of batches given as (records, seconds).
    fn moments(batches: &[(u64, f64)]) -> ServiceMoments {
        let mut m = ServiceMoments::default();
        for &(n, t) in batches {
            let n = n as f64;
            m.records += n;
            m.seconds += t;
            m.seconds_sq += t * t;
            m.record_seconds += n * t;
            m.records_sq += n * n;
        }
        m
    }

    /// A deterministic uniform stream in (0, 1) (SplitMix64).
    struct Uniform(u64);

    impl Uniform {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
    }

    /// Batches of `sizes` records (cycled) of per-record times drawn by `draw`, `k` batches.
    fn batches(k: usize, sizes: &[u64], mut draw: impl FnMut() -> f64) -> Vec<(u64, f64)> {
        (0..k)
            .map(|i| {
                let n = sizes[i % sizes.len()];
                (n, (0..n).map(|_| draw()).sum())
            })
            .collect()
    }

    #[test]
    fn known_batches_give_the_hand_computed_variance() {
        // Batches of one record: the sample variance. Times 1, 2, 3, 6 (mean 3):
        // Σ(t − 3)² = 4 + 1 + 0 + 9 = 14 over 3 → σ̂² = 14/3, cs² = 14/27.
        let one = moments(&[(1, 1.0), (1, 2.0), (1, 3.0), (1, 6.0)]);
        let mut pool = ServicePool::default();
        pool.add(&one);
        assert!((rss_over_dof(&one) - 14.0 / 27.0).abs() < 1e-12);
        assert!((pool.batches() - 4.0).abs() < 1e-12);
        // Too few batches for an estimate…
        assert_eq!(pool.squared_cv(), None);
        // …but the same figure from 32 copies of them (8× each), up to the dof correction:
        // Σ(t − 3)² = 8·14 = 112 over 32 − 1 = 31.
        let many: Vec<_> = (0..8)
            .flat_map(|_| [(1, 1.0), (1, 2.0), (1, 3.0), (1, 6.0)])
            .collect();
        let mut pool = ServicePool::default();
        pool.add(&moments(&many));
        let got = pool.squared_cv().expect("32 batches");
        assert!((got - 112.0 / 31.0 / 9.0).abs() < 1e-12, "{got}");
        // Unequal batches: records 2 and 4 taking 3 and 5 s: m = 8/6 = 4/3, residuals
        // 3 − 8/3 = 1/3 and 5 − 16/3 = −1/3, Σr² = 2/9 over 6 − 20/6 = 8/3 → σ̂² = 1/12,
        // cs² = (1/12) / (16/9) = 3/64.
        let two = moments(&[(2, 3.0), (4, 5.0)]);
        assert!((rss_over_dof(&two) - 3.0 / 64.0).abs() < 1e-12);
    }

    /// cs² of one subtask's sums, whatever their number of batches.
    fn rss_over_dof(d: &ServiceMoments) -> f64 {
        let mut pool = ServicePool::default();
        pool.add(d);
        pool.rss / pool.dof
    }

    #[test]
    fn constant_service_reads_as_zero() {
        // 200 µs a record in batches of 1 to 128 records.
        let b = batches(200, &[1, 7, 64, 128, 33], || 200e-6);
        let scv = service_cv([&moments(&b)]).expect("enough batches");
        assert!(scv < 1e-3, "cs {scv}");
    }

    #[test]
    fn exponential_service_reads_as_one() {
        // Exponential times (inverse transform of a fixed uniform stream) in batches of 1 to
        // 128 records, over two subtasks of different speeds (means 1 and 3 ms): cs² ≈ 1.
        let mut u = Uniform(42);
        let a = batches(2000, &[1, 16, 128, 50], || -1e-3 * u.next().ln());
        let b = batches(2000, &[3, 100], || -3e-3 * u.next().ln());
        let scv = ServicePool::squared_cv(&{
            let mut p = ServicePool::default();
            p.add(&moments(&a));
            p.add(&moments(&b));
            p
        })
        .expect("enough batches");
        assert!((scv - 1.0).abs() < 0.1, "cs² {scv}");
        // Uniform (0, 2 ms): cs² = 1/3.
        let c = batches(2000, &[1, 16, 128, 50], || 2e-3 * u.next());
        let scv = service_cv([&moments(&c)]).expect("enough batches").powi(2);
        assert!((scv - 1.0 / 3.0).abs() < 0.05, "cs² {scv}");
    }

    #[test]
    fn too_little_or_broken_data_gives_no_estimate() {
        let mut u = Uniform(7);
        let b = batches(29, &[10], || -1e-3 * u.next().ln());
        assert_eq!(service_cv([&moments(&b)]), None, "29 batches");
        // One huge batch and tiny ones: (Σn)²/Σn² is about 1.
        let mut b = batches(40, &[1], || 1e-3);
        b.push((10_000, 10.0));
        assert_eq!(service_cv([&moments(&b)]), None);
        // A reset (negative delta), NaN, no record.
        let good = moments(&batches(100, &[10], || -1e-3 * u.next().ln()));
        let reset = ServiceMoments {
            seconds: -1.0,
            ..good
        };
        let nan = ServiceMoments {
            seconds_sq: f64::NAN,
            ..good
        };
        assert_eq!(service_cv([&reset, &nan, &ServiceMoments::default()]), None);
        assert_eq!(
            service_cv([&reset, &good, &nan]),
            service_cv([&good]),
            "broken subtasks are left out"
        );
    }

    #[test]
    fn a_wild_estimate_is_capped() {
        // Mostly 1 µs records and a few of 10 ms: cs far above 3.
        let mut i = 0;
        let b = batches(100, &[1], || {
            i += 1;
            if i % 50 == 0 { 10e-3 } else { 1e-6 }
        });
        assert_eq!(service_cv([&moments(&b)]), Some(MAX_MEASURED_SERVICE_CV));
    }
}
