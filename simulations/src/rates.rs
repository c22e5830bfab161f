//! Replayed service rates: a time series of measured true processing rates μ per operator
//! (`--service-rates FILE`), used over time instead of the constant mean service time.
//!
//! On a shared machine the engine's service rates move with the load (CPU contention stretches
//! every record's busy time), while the model's are constant. Replaying the rates a real run
//! measured lets the simulator reproduce that run's capacity over time (the sim-to-real check of
//! `scripts/sim-vs-real.sh`).
//!
//! # Format
//!
//! CSV, one header line, then one row per interval (`streamscale run --report DIR` writes
//! `DIR/service_rates.csv` in this format):
//!
//! ```text
//! t_s,parse,enrich,counts
//! 0.000,1905.2,188.4,
//! 1.004,1893.0,61.7,840.0
//! ```
//!
//! * `t_s`: the start of the interval, simulated seconds (a real run's seconds since it
//!   started; the trace replays at the same speedup), non-negative, strictly increasing.
//! * One column per operator, named as in the job file (no source, no duplicates): that
//!   operator's true processing rate μ from `t_s` until the next row's `t_s`, records per busy
//!   second per subtask (DS2's rate: records in / busy seconds), a positive number.
//! * An empty cell means "not measured in this interval": the previous value holds. Before an
//!   operator's first value, and for operators without a column, the model's own service time
//!   applies (job file or `--service`); after the last row, the last value holds.
//!
//! Between rows the rate is constant (a step function of time); the mean service time over an
//! interval `[a, b)` is `(b − a) / ∫ₐᵇ μ(s) ds` ([`RateSeries::mean_service_s`]), so that a
//! fluid step carries exactly the records the replayed rates allow.

use std::path::Path;

use crate::SimError;

/// The parsed file: operator names (header order) and, per row, its start time and each
/// operator's μ (`None` for an empty cell).
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceRates {
    /// Where the series came from (for messages).
    pub source: String,
    /// Operator names, header order.
    pub operators: Vec<String>,
    /// Start of each row, simulated seconds, strictly increasing.
    pub times: Vec<f64>,
    /// `mu[k][j]`: operator `operators[j]`'s μ from `times[k]` on, records/s per subtask.
    pub mu: Vec<Vec<Option<f64>>>,
}

fn format_error(path: &str, line: usize, problem: String) -> SimError {
    SimError::ServiceRates {
        path: path.to_string(),
        line,
        problem,
    }
}

impl ServiceRates {
    /// Reads and checks a service-rates file ([module docs](self)).
    ///
    /// # Errors
    /// [`SimError::Config`] when the file cannot be read; [`SimError::ServiceRates`] naming the
    /// file, the line and the reason for a bad header, a row with the wrong number of fields, a
    /// time that is not a non-negative number or does not increase, a rate that is not a
    /// positive number, or a file without rows.
    pub fn from_file(path: &Path) -> Result<ServiceRates, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Config {
            path: path.display().to_string(),
            problem: format!("cannot read the service rates: {e}"),
        })?;
        ServiceRates::parse(&text, &path.display().to_string())
    }

    /// Parses the text of a service-rates file; `path` names it in errors.
    ///
    /// # Errors
    /// As [`ServiceRates::from_file`].
    pub fn parse(text: &str, path: &str) -> Result<ServiceRates, SimError> {
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim_end()));
        let Some((hl, header)) = lines.find(|(_, l)| !l.trim().is_empty()) else {
            return Err(format_error(
                path,
                1,
                "empty file (expected a header `t_s,<operator>...`)".into(),
            ));
        };
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        if names.first() != Some(&"t_s") {
            return Err(format_error(
                path,
                hl,
                format!(
                    "header `{header}`: the first column must be `t_s`, then one column per operator"
                ),
            ));
        }
        let operators: Vec<String> = names[1..].iter().map(|s| s.to_string()).collect();
        if operators.is_empty() {
            return Err(format_error(
                path,
                hl,
                "header names no operator (expected `t_s,<operator>...`)".into(),
            ));
        }
        for (j, op) in operators.iter().enumerate() {
            if op.is_empty() {
                return Err(format_error(
                    path,
                    hl,
                    format!("header column {} is empty", j + 2),
                ));
            }
            if operators[..j].contains(op) {
                return Err(format_error(
                    path,
                    hl,
                    format!("operator `{op}` appears twice in the header"),
                ));
            }
        }
        let mut times: Vec<f64> = Vec::new();
        let mut mu = Vec::new();
        for (ln, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let cells: Vec<&str> = line.split(',').map(str::trim).collect();
            if cells.len() != names.len() {
                return Err(format_error(
                    path,
                    ln,
                    format!(
                        "{} fields, the header has {} (`{line}`)",
                        cells.len(),
                        names.len()
                    ),
                ));
            }
            let t: f64 = cells[0].parse().map_err(|_| {
                format_error(path, ln, format!("t_s: `{}` is not a number", cells[0]))
            })?;
            if !(t.is_finite() && t >= 0.0) {
                return Err(format_error(
                    path,
                    ln,
                    format!("t_s: {t} must be a non-negative number of seconds"),
                ));
            }
            if let Some(&prev) = times.last()
                && t <= prev
            {
                return Err(format_error(
                    path,
                    ln,
                    format!("t_s: {t} does not increase (previous row {prev})"),
                ));
            }
            let mut row = Vec::with_capacity(operators.len());
            for (cell, op) in cells[1..].iter().zip(&operators) {
                if cell.is_empty() {
                    row.push(None);
                    continue;
                }
                let v: f64 = cell.parse().map_err(|_| {
                    format_error(path, ln, format!("{op}: `{cell}` is not a number"))
                })?;
                if !(v.is_finite() && v > 0.0) {
                    return Err(format_error(
                        path,
                        ln,
                        format!("{op}: {v} must be a positive rate (records/s per subtask)"),
                    ));
                }
                row.push(Some(v));
            }
            times.push(t);
            mu.push(row);
        }
        if times.is_empty() {
            return Err(format_error(path, hl, "no rows after the header".into()));
        }
        Ok(ServiceRates {
            source: path.to_string(),
            operators,
            times,
            mu,
        })
    }

    /// Operator `name`'s series, starting from the nominal rate `nominal_mu` (records/s per
    /// subtask) before its first value; `None` when its column is missing or has no value.
    pub fn series(&self, name: &str, nominal_mu: f64) -> Option<RateSeries> {
        let j = self.operators.iter().position(|o| o == name)?;
        let mut times = Vec::new();
        let mut values = Vec::new();
        for (t, row) in self.times.iter().zip(&self.mu) {
            if let Some(v) = row[j] {
                // An empty cell holds the previous value: only changes are knots.
                if values.last() != Some(&v) {
                    times.push(*t);
                    values.push(v);
                }
            }
        }
        if times.is_empty() {
            return None;
        }
        Some(RateSeries::new(nominal_mu, times, values))
    }
}

/// One operator's true processing rate over time: `nominal` before `times[0]`, `values[k]` on
/// `[times[k], times[k+1])`, the last value after the last knot (records/s per subtask); with
/// the running integral at each knot for means over intervals.
#[derive(Debug, Clone, PartialEq)]
pub struct RateSeries {
    nominal: f64,
    times: Vec<f64>,
    values: Vec<f64>,
    /// ∫₀^times[k] μ(s) ds, records per subtask.
    integral: Vec<f64>,
}

impl RateSeries {
    /// A series from its knots (`times` strictly increasing and non-negative, `values`
    /// positive, same length, at least one).
    pub fn new(nominal: f64, times: Vec<f64>, values: Vec<f64>) -> RateSeries {
        let mut integral = Vec::with_capacity(times.len());
        let mut acc = nominal * times.first().copied().unwrap_or(0.0).max(0.0);
        for k in 0..times.len() {
            if k > 0 {
                acc += values[k - 1] * (times[k] - times[k - 1]);
            }
            integral.push(acc);
        }
        RateSeries {
            nominal,
            times,
            values,
            integral,
        }
    }

    /// μ at simulated second `t`, records/s per subtask.
    pub fn mu_at(&self, t: f64) -> f64 {
        match self.times.partition_point(|&k| k <= t) {
            0 => self.nominal,
            k => self.values[k - 1],
        }
    }

    /// ∫₀ᵗ μ(s) ds, records per subtask.
    pub fn integral_to(&self, t: f64) -> f64 {
        match self.times.partition_point(|&k| k <= t) {
            0 => self.nominal * t.max(0.0),
            k => self.integral[k - 1] + self.values[k - 1] * (t - self.times[k - 1]),
        }
    }

    /// Mean service time over `[a, b)`, seconds: (b − a) / ∫ₐᵇ μ — the service time under
    /// which a subtask busy all along processes as many records as under the varying rate.
    /// For `b ≤ a`: 1 / μ(a).
    pub fn mean_service_s(&self, a: f64, b: f64) -> f64 {
        if b > a {
            let n = self.integral_to(b) - self.integral_to(a);
            if n > 0.0 {
                return (b - a) / n;
            }
        }
        1.0 / self.mu_at(a)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn err(text: &str) -> String {
        ServiceRates::parse(text, "rates.csv")
            .unwrap_err()
            .to_string()
    }

    /// Every format error names the file and the line, and says what is wrong.
    #[test]
    fn format_errors_name_file_and_line() {
        assert_eq!(
            err(""),
            "rates.csv: line 1: empty file (expected a header `t_s,<operator>...`)"
        );
        assert!(err("time,enrich\n0,1\n").starts_with("rates.csv: line 1: header `time,enrich`"));
        assert!(err("t_s\n0\n").starts_with("rates.csv: line 1: header names no operator"));
        assert!(err("t_s,a,a\n0,1,2\n").contains("line 1: operator `a` appears twice"));
        assert!(err("t_s,a,\n0,1,2\n").contains("line 1: header column 3 is empty"));
        assert!(err("t_s,a\n").contains("line 1: no rows after the header"));
        assert!(
            err("t_s,a\n0,1\n1,2,3\n").starts_with("rates.csv: line 3: 3 fields, the header has 2")
        );
        assert!(
            err("t_s,a\n0,1\nx,2\n").starts_with("rates.csv: line 3: t_s: `x` is not a number")
        );
        assert!(err("t_s,a\n-1,1\n").contains("line 2: t_s: -1 must be a non-negative"));
        assert!(err("t_s,a\n0,1\n0,2\n").contains("line 3: t_s: 0 does not increase"));
        assert!(err("t_s,a\n0,1\n1,abc\n").contains("line 3: a: `abc` is not a number"));
        assert!(err("t_s,a\n0,0\n").contains("line 2: a: 0 must be a positive rate"));
        assert!(err("t_s,a\n0,NaN\n").contains("line 2: a: NaN must be a positive rate"));
        assert!(err("t_s,a\n0,inf\n").contains("line 2: a: inf must be a positive rate"));
        // Blank lines are skipped, but still counted.
        assert!(err("t_s,a\n\n0,1\n\n-3,1\n").contains("line 5:"));
    }

    /// Empty cells hold the previous value; the nominal rate applies before the first one and
    /// for an operator whose column is empty throughout.
    #[test]
    fn empty_cells_hold_and_the_nominal_rate_starts() {
        let r = ServiceRates::parse("t_s,a,b\n0,,\n2,100,\n3,,\n5,50,\n", "r").unwrap();
        let a = r.series("a", 200.0).unwrap();
        assert_eq!(a.mu_at(0.0), 200.0);
        assert_eq!(a.mu_at(1.99), 200.0);
        assert_eq!(a.mu_at(2.0), 100.0);
        assert_eq!(a.mu_at(4.0), 100.0);
        assert_eq!(a.mu_at(5.0), 50.0);
        assert_eq!(a.mu_at(1e6), 50.0);
        assert!(r.series("b", 1.0).is_none());
        assert!(r.series("c", 1.0).is_none());
    }

    /// The mean service time over an interval is its length over the records one busy
    /// subtask processes under the step function (checked against a fine sum).
    #[test]
    fn mean_service_time_integrates_the_rate() {
        let s = RateSeries::new(200.0, vec![1.0, 1.5, 4.0], vec![100.0, 25.0, 400.0]);
        // [0.5, 2): 0.5 s at 200 + 0.5 s at 100 + 0.5 s at 25 = 162.5 records.
        assert!((s.mean_service_s(0.5, 2.0) - 1.5 / 162.5).abs() < 1e-12);
        let fine: f64 = (0..100_000)
            .map(|k| s.mu_at(3.0 + 2.0 * (k as f64 + 0.5) / 1e5) * 2.0 / 1e5)
            .sum();
        assert!((s.mean_service_s(3.0, 5.0) - 2.0 / fine).abs() < 1e-9);
        assert_eq!(s.mean_service_s(2.0, 2.0), 1.0 / 25.0);
    }
}
