//! Workload traces (`t_seconds,rate` CSV) and the source rate functions built on them.
//!
//! A [`RateFunction`] maps wall-clock seconds since the job started to a target emission rate
//! (records/s) and to the cumulative number of records that should have been emitted by then,
//! which is what a source's backlog is measured against.

use std::path::{Path, PathBuf};

use crate::spec::{GapPolicy, RateSpec, TraceRate};

/// Errors from reading a trace file.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{path}: cannot read trace: {source}")]
    Read {
        /// The trace file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line is malformed.
    #[error("{path}:{line}: {reason}")]
    Line {
        /// The trace file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The file has a header but no data rows.
    #[error("{path}: trace has no data rows")]
    Empty {
        /// The trace file.
        path: PathBuf,
    },
}

/// A recorded rate series: `(t_seconds, rate)` rows, strictly increasing in time.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Sample times in trace seconds, strictly increasing.
    pub times: Vec<f64>,
    /// Rate in events/s averaged over each sample's bin.
    pub rates: Vec<f64>,
    /// Usual spacing between rows (the median step), seconds. A larger step is a gap.
    pub resolution: f64,
}

impl Trace {
    /// Reads a trace in the shared format: header `t_seconds,rate`, then one row per bin.
    ///
    /// # Errors
    /// [`TraceError`] naming the line for an unknown header, a non-numeric, negative or NaN
    /// rate, a time that does not increase, or an empty file.
    pub fn from_file(path: &Path) -> Result<Trace, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Trace::parse(&text).map_err(|e| match e {
            ParseFailure::Line(line, reason) => TraceError::Line {
                path: path.to_path_buf(),
                line,
                reason,
            },
            ParseFailure::Empty => TraceError::Empty {
                path: path.to_path_buf(),
            },
        })
    }

    fn parse(text: &str) -> Result<Trace, ParseFailure> {
        // A UTF-8 byte order mark (spreadsheets write one) is not part of the header.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, h)) if h.trim() == "t_seconds,rate" => {}
            Some((_, h)) => {
                return Err(ParseFailure::Line(
                    1,
                    format!("unknown header `{}`, expected `t_seconds,rate`", h.trim()),
                ));
            }
            None => return Err(ParseFailure::Empty),
        }
        let (mut times, mut rates) = (Vec::new(), Vec::new());
        for (i, raw) in lines {
            let line = i + 1;
            let row = raw.trim();
            if row.is_empty() {
                continue;
            }
            let mut cols = row.split(',');
            let (Some(t), Some(r), None) = (cols.next(), cols.next(), cols.next()) else {
                return Err(ParseFailure::Line(
                    line,
                    format!("expected two columns `t_seconds,rate`, got `{row}`"),
                ));
            };
            let t: f64 = t.trim().parse().map_err(|_| {
                ParseFailure::Line(line, format!("t_seconds `{t}` is not a number"))
            })?;
            let r: f64 = r
                .trim()
                .parse()
                .map_err(|_| ParseFailure::Line(line, format!("rate `{r}` is not a number")))?;
            if !t.is_finite() {
                return Err(ParseFailure::Line(
                    line,
                    format!("t_seconds {t} is not finite"),
                ));
            }
            if !(r.is_finite() && r >= 0.0) {
                return Err(ParseFailure::Line(
                    line,
                    format!("rate {r} must be a non-negative number"),
                ));
            }
            if let Some(&prev) = times.last()
                && t <= prev
            {
                return Err(ParseFailure::Line(
                    line,
                    format!("t_seconds {t} does not increase (previous row {prev})"),
                ));
            }
            times.push(t);
            rates.push(r);
        }
        if times.is_empty() {
            return Err(ParseFailure::Empty);
        }
        let mut steps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        steps.sort_by(f64::total_cmp);
        let resolution = steps.get(steps.len() / 2).copied().unwrap_or(1.0);
        Ok(Trace {
            times,
            rates,
            resolution,
        })
    }

    /// Index of the row whose bin contains trace time `t` (None before the first row).
    fn bin(&self, t: f64) -> Option<usize> {
        match self.times.partition_point(|&x| x <= t) {
            0 => None,
            n => Some(n - 1),
        }
    }

    /// Rate (events/s) at trace time `t`: the rate of the bin containing `t`; in a gap, the
    /// last rate (`hold`) or 0 (`zero`); 0 before the first row and after the last bin.
    pub fn rate_at(&self, t: f64, gaps: GapPolicy) -> f64 {
        let Some(i) = self.bin(t) else { return 0.0 };
        let bin_end = self.times[i] + self.resolution;
        let next = self.times.get(i + 1).copied();
        match next {
            None if t >= bin_end => 0.0,
            Some(_) if t >= bin_end && gaps == GapPolicy::Zero => 0.0,
            _ => self.rates[i],
        }
    }

    /// Last trace time covered: the last row's time plus one resolution step.
    pub fn end(&self) -> f64 {
        self.times.last().copied().unwrap_or(0.0) + self.resolution
    }
}

enum ParseFailure {
    Line(usize, String),
    Empty,
}

/// A source's target rate over wall-clock time since the job started.
#[derive(Debug, Clone)]
pub enum RateFunction {
    /// Constant records/s.
    Constant(f64),
    /// Piecewise constant: `(from wall seconds, records/s)`, increasing in time.
    Steps(Vec<(f64, f64)>),
    /// A trace replayed with time compression and rate scale.
    Trace {
        /// The trace rows.
        trace: Trace,
        /// Replay settings.
        settings: TraceRate,
        /// Prefix sums: records (at scale) up to each row start, in wall-clock terms.
        cumulative: Vec<f64>,
    },
}

impl RateFunction {
    /// Builds the rate function of a source's rate spec, loading the trace file when there is one.
    ///
    /// # Errors
    /// [`TraceError`] when the trace file is unreadable or malformed.
    pub fn from_spec(spec: &RateSpec) -> Result<RateFunction, TraceError> {
        Ok(match spec {
            RateSpec::Constant(r) => RateFunction::Constant(*r),
            RateSpec::Steps(s) => RateFunction::Steps(
                s.iter()
                    .map(|s| (s.at_seconds, s.records_per_second))
                    .collect(),
            ),
            RateSpec::Trace(settings) => {
                let trace = Trace::from_file(&settings.file)?;
                let mut cumulative = Vec::with_capacity(trace.times.len() + 1);
                let mut acc = 0.0;
                for i in 0..trace.times.len() {
                    cumulative.push(acc);
                    let width = match trace.times.get(i + 1) {
                        Some(next) if settings.gaps == GapPolicy::Zero => {
                            (next - trace.times[i]).min(trace.resolution)
                        }
                        Some(next) => next - trace.times[i],
                        None => trace.resolution,
                    };
                    acc += trace.rates[i] * width;
                }
                cumulative.push(acc);
                RateFunction::Trace {
                    trace,
                    settings: settings.clone(),
                    cumulative,
                }
            }
        })
    }

    /// Trace time (seconds) reached at wall-clock second `wall_s`, if this follows a trace.
    pub fn trace_time(&self, wall_s: f64) -> Option<f64> {
        match self {
            RateFunction::Trace { settings, .. } => {
                Some(settings.start_seconds + wall_s * settings.speedup)
            }
            _ => None,
        }
    }

    /// Wall-clock seconds after which the rate stays 0 (end of the trace window), if any.
    pub fn wall_end(&self) -> Option<f64> {
        match self {
            RateFunction::Trace {
                trace, settings, ..
            } => {
                let end = settings.end_seconds.unwrap_or(trace.end()).min(trace.end());
                Some(((end - settings.start_seconds) / settings.speedup).max(0.0))
            }
            _ => None,
        }
    }

    /// Target rate in records/s at wall-clock second `wall_s` since the job started.
    pub fn rate(&self, wall_s: f64) -> f64 {
        match self {
            RateFunction::Constant(r) => *r,
            RateFunction::Steps(steps) => steps
                .iter()
                .take_while(|(at, _)| *at <= wall_s)
                .last()
                .map_or(0.0, |(_, r)| *r),
            RateFunction::Trace {
                trace, settings, ..
            } => {
                let t = settings.start_seconds + wall_s * settings.speedup;
                if settings.end_seconds.is_some_and(|e| t >= e) {
                    return 0.0;
                }
                trace.rate_at(t, settings.gaps) * settings.scale
            }
        }
    }

    /// Records that should have been emitted by wall-clock second `wall_s`: ∫₀^wall_s rate.
    pub fn cumulative(&self, wall_s: f64) -> f64 {
        let wall_s = wall_s.max(0.0);
        match self {
            RateFunction::Constant(r) => r * wall_s,
            RateFunction::Steps(steps) => {
                let mut total = 0.0;
                for (i, (at, r)) in steps.iter().enumerate() {
                    if *at >= wall_s {
                        break;
                    }
                    let until = steps.get(i + 1).map_or(wall_s, |(n, _)| n.min(wall_s));
                    total += r * (until - at);
                }
                total
            }
            RateFunction::Trace {
                trace,
                settings,
                cumulative,
            } => {
                let in_trace = |t: f64| trace_integral(trace, cumulative, settings.gaps, t);
                let start = settings.start_seconds;
                let mut t = start + wall_s * settings.speedup;
                if let Some(e) = settings.end_seconds {
                    t = t.min(e);
                }
                // ∫ rate(wall) dwall = scale / speedup × ∫ trace_rate(t) dt over trace time.
                (in_trace(t) - in_trace(start)) * settings.scale / settings.speedup
            }
        }
    }
}

/// ∫ from the first row to `t` of the trace's rate, in events (trace time).
fn trace_integral(trace: &Trace, cumulative: &[f64], gaps: GapPolicy, t: f64) -> f64 {
    let Some(i) = trace.bin(t) else { return 0.0 };
    let start = trace.times[i];
    let mut width = t - start;
    if trace.times.get(i + 1).is_none() || gaps == GapPolicy::Zero {
        width = width.min(trace.resolution);
    }
    cumulative[i] + trace.rates[i] * width
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Trace, String> {
        Trace::parse(text).map_err(|e| match e {
            ParseFailure::Line(l, r) => format!("line {l}: {r}"),
            ParseFailure::Empty => "empty".into(),
        })
    }

    #[test]
    fn rejects_bad_rows_naming_the_line() {
        assert!(parse("time,value\n0,1\n").unwrap_err().contains("line 1"));
        assert!(
            parse("t_seconds,rate\n0,1\n300,abc\n")
                .unwrap_err()
                .contains("line 3")
        );
        assert!(
            parse("t_seconds,rate\n0,1\n300,-2\n")
                .unwrap_err()
                .contains("line 3")
        );
        assert!(
            parse("t_seconds,rate\n0,1\n300,NaN\n")
                .unwrap_err()
                .contains("line 3")
        );
        assert!(
            parse("t_seconds,rate\n300,1\n0,1\n")
                .unwrap_err()
                .contains("does not increase")
        );
        assert_eq!(parse("t_seconds,rate\n").unwrap_err(), "empty");
        assert_eq!(parse("").unwrap_err(), "empty");
    }

    #[test]
    fn gaps_hold_or_zero() {
        let t = parse("t_seconds,rate\n0,1\n10,2\n20,3\n50,4\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.resolution, 10.0);
        assert_eq!(t.rate_at(35.0, GapPolicy::Hold), 3.0);
        assert_eq!(t.rate_at(35.0, GapPolicy::Zero), 0.0);
        assert_eq!(t.rate_at(25.0, GapPolicy::Zero), 3.0);
        assert_eq!(t.rate_at(65.0, GapPolicy::Hold), 0.0);
    }

    #[test]
    fn cumulative_matches_rate_integral_with_speedup_and_scale() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("t.csv");
        std::fs::write(&file, "t_seconds,rate\n0,1\n100,3\n200,2\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let spec = RateSpec::Trace(TraceRate {
            file,
            speedup: 10.0,
            scale: 5.0,
            start_seconds: 50.0,
            end_seconds: Some(250.0),
            gaps: GapPolicy::Hold,
        });
        let f = RateFunction::from_spec(&spec).unwrap_or_else(|e| panic!("{e}"));
        // wall 0..5 s covers trace 50..100 at rate 1 × 5 = 5 rec/s → 25 records.
        assert!((f.cumulative(5.0) - 25.0).abs() < 1e-9);
        // wall 5..15 covers trace 100..200 at rate 3 × 5 = 15 rec/s → 150 more.
        assert!((f.cumulative(15.0) - 175.0).abs() < 1e-9);
        assert_eq!(f.rate(10.0), 15.0);
        // trace end at 250 → wall 20; nothing after it.
        assert!((f.cumulative(100.0) - (175.0 + 5.0 * 10.0)).abs() < 1e-9);
        assert_eq!(f.rate(21.0), 0.0);
        assert_eq!(f.wall_end(), Some(20.0));
    }

    #[test]
    fn steps_integrate_piecewise() {
        let f = RateFunction::Steps(vec![(0.0, 10.0), (2.0, 100.0)]);
        assert_eq!(f.cumulative(1.0), 10.0);
        assert_eq!(f.cumulative(3.0), 120.0);
        assert_eq!(f.rate(2.5), 100.0);
    }
}
