//! The window's checks: every sample has every operator, the same subtasks, finite
//! non-negative values and counters that do not go backwards (a reset), or names what fails.

use super::*;

pub(super) fn subtasks<'a>(
    rows: &[Option<&'a [SubtaskSample]>],
    sample: usize,
    name: &str,
) -> Result<&'a [SubtaskSample], ModelError> {
    rows.get(sample)
        .copied()
        .flatten()
        .ok_or_else(|| ModelError::MissingOperator {
            operator: name.to_string(),
            sample,
        })
}

/// Whether a counter or gauge value passes [`check_value`]: finite and non-negative.
pub(super) fn valid(value: f64) -> bool {
    // Finite and ≥ 0: +0 up to the largest finite value, or −0.
    let bits = value.to_bits();
    bits < f64::INFINITY.to_bits() || bits == (-0.0f64).to_bits()
}

/// Whether every counter of `s` and its queue length pass [`check_value`].
pub(super) fn all_valid(s: &SubtaskSample) -> bool {
    valid(s.records_in)
        & valid(s.records_out)
        & valid(s.busy_seconds)
        & valid(s.idle_seconds)
        & valid(s.backpressured_seconds)
        & valid(s.queue_length)
}

/// Whether every counter of `b` is finite and at least its value in `a` (the checks of a
/// valid `a`'s successor that [`estimate_operator`] makes per counter).
pub(super) fn grown(a: &SubtaskSample, b: &SubtaskSample) -> bool {
    // y ≥ x ≥ −0 (x valid): y is not NaN nor −∞, so y < +∞ is y finite.
    not_below(a, b) & below_infinity(b)
}

/// Whether every counter of `s` is below +∞.
pub(super) fn below_infinity(s: &SubtaskSample) -> bool {
    (s.records_in < f64::INFINITY)
        & (s.records_out < f64::INFINITY)
        & (s.busy_seconds < f64::INFINITY)
        & (s.idle_seconds < f64::INFINITY)
        & (s.backpressured_seconds < f64::INFINITY)
}

/// Whether no counter of `b` is below (or NaN against) its value in `a`. Along a window whose
/// first sample is valid, this at every step and [`below_infinity`] at the last sample give
/// [`grown`] at every step: the counters only grow, so none is infinite before the last
/// sample unless it is there, and none is negative or NaN after the first.
pub(super) fn not_below(a: &SubtaskSample, b: &SubtaskSample) -> bool {
    (b.records_in >= a.records_in)
        & (b.records_out >= a.records_out)
        & (b.busy_seconds >= a.busy_seconds)
        & (b.idle_seconds >= a.idle_seconds)
        & (b.backpressured_seconds >= a.backpressured_seconds)
}

/// [`ModelError::MissingSubtask`] when `s` (subtask `subtask` of `name`'s `p` in sample
/// `sample`) is the place of a subtask missing from its scrape.
pub(super) fn absent(
    name: &str,
    subtask: usize,
    sample: usize,
    p: usize,
    s: &SubtaskSample,
) -> Result<(), ModelError> {
    if s.is_absent() {
        return Err(ModelError::MissingSubtask {
            operator: name.to_string(),
            subtask,
            parallelism: p,
            sample,
        });
    }
    Ok(())
}

pub(super) fn check_value(
    name: &str,
    subtask: usize,
    sample: usize,
    field: &'static str,
    value: f64,
) -> Result<(), ModelError> {
    if valid(value) {
        Ok(())
    } else {
        Err(ModelError::InvalidValue {
            operator: name.to_string(),
            subtask,
            field,
            sample,
            value,
        })
    }
}
pub(super) fn counters(s: &SubtaskSample) -> [(&'static str, f64); 5] {
    [
        ("records_in", s.records_in),
        ("records_out", s.records_out),
        ("busy_seconds", s.busy_seconds),
        ("idle_seconds", s.idle_seconds),
        ("backpressured_seconds", s.backpressured_seconds),
    ]
}

/// The first and last rows of an operator's window and the output of its intervals with input
/// (see [`estimate_operator`]), after every check, in the order that names the first problem.
type Checked<'a> = (&'a [SubtaskSample], &'a [SubtaskSample], f64);

/// [`estimate_operator`]'s checks of every sample: presence, subtask count, finite values,
/// monotone counters, the sources' figures; the first failure is the error. Returns what
/// [`plain_window`] returns when that one applies (the same sums in the same order).
pub(super) fn checked_window<'a>(
    name: &str,
    is_source: bool,
    rows: &[Option<&'a [SubtaskSample]>],
    arrival_scale: Option<f64>,
) -> Result<Checked<'a>, ModelError> {
    let first = subtasks(rows, 0, name)?;
    let (backlog_reported, arrivals_reported) = if is_source {
        source_reports(rows)
    } else {
        (true, true)
    };
    let arr = |k: usize, s: &SubtaskSample| {
        source_arrivals(s, k, first, arrival_scale, arrivals_reported)
    };
    let p = first.len();
    if p == 0 {
        return Err(ModelError::NoSubtasks {
            operator: name.to_string(),
            sample: 0,
        });
    }
    // Validate every sample: presence, subtask count, finite values, monotone counters.
    // Meanwhile sum the output of the intervals with input only: an interval with output but
    // no input (timers, window flushes) must not inflate the selectivity.
    let mut out_with_input = 0.0;
    let mut prev = first;
    for (k, s) in first.iter().enumerate() {
        // Fast path: every figure valid (the checks below then pass; they run, in the same
        // order, only to name what is wrong).
        if !is_source && all_valid(s) {
            continue;
        }
        absent(name, k, 0, p, s)?;
        for (field, v) in counters(s) {
            check_value(name, k, 0, field, v)?;
        }
        check_value(name, k, 0, "queue_length", s.queue_length)?;
        if is_source {
            source_fields(name, k, 0, s, arr(k, s), backlog_reported)?;
        }
    }
    for i in 1..rows.len() {
        let cur = subtasks(rows, i, name)?;
        if cur.len() != p {
            return Err(ModelError::ParallelismChanged {
                operator: name.to_string(),
                first: p,
                other: cur.len(),
                sample: i,
            });
        }
        for (k, (a, b)) in prev.iter().zip(cur).enumerate() {
            // Fast path: `b` valid and no counter reset (`a` was validated before).
            if !is_source && valid(b.queue_length) && grown(a, b) {
                continue;
            }
            absent(name, k, i, p, b)?;
            check_value(name, k, i, "queue_length", b.queue_length)?;
            let arrivals = if is_source {
                let (_, arr_a) = source_fields(name, k, i - 1, a, arr(k, a), backlog_reported)?;
                let (_, arr_b) = source_fields(name, k, i, b, arr(k, b), backlog_reported)?;
                Some(("source_arrivals", arr_a, arr_b))
            } else {
                None
            };
            let pairs = counters(a)
                .into_iter()
                .zip(counters(b))
                .map(|((f, x), (_, y))| (f, x, y))
                .chain(arrivals);
            for (field, x, y) in pairs {
                if y >= x && y.is_finite() {
                    continue; // x was validated: y is finite, non-negative and not a reset
                }
                check_value(name, k, i, field, y)?;
                if y < x {
                    return Err(ModelError::CounterReset {
                        operator: name.to_string(),
                        subtask: k,
                        counter: field,
                        sample: i,
                        from: x,
                        to: y,
                    });
                }
            }
        }
        let d_in_k: f64 = prev
            .iter()
            .zip(cur)
            .map(|(a, b)| b.records_in - a.records_in)
            .sum();
        if d_in_k > 0.0 {
            out_with_input += prev
                .iter()
                .zip(cur)
                .map(|(a, b)| b.records_out - a.records_out)
                .sum::<f64>();
        }
        prev = cur;
    }
    Ok((first, prev, out_with_input))
}

/// The window of a non-source operator whose every sample is present with the first one's
/// subtask count, every figure valid and no counter reset (the usual case), in one pass: the
/// first and last rows and Σ over the intervals with input (Σ Δrecords_in > 0) of their
/// Σ Δrecords_out, each sum in the order [`checked_window`] takes it. `None` when anything is
/// off (then [`checked_window`] names it).
pub(super) fn plain_window<'a>(rows: &[Option<&'a [SubtaskSample]>]) -> Option<Checked<'a>> {
    let (first, later) = rows.split_first()?;
    let first = (*first)?;
    let p = first.len();
    if p == 0 {
        return None;
    }
    let mut ok = first.iter().fold(true, |ok, s| ok & all_valid(s));
    let mut out_with_input = 0.0;
    let mut prev = first;
    for row in later {
        let cur = (*row)?;
        if cur.len() != p {
            return None;
        }
        // Iterator sums of f64 start at −0.0: so do these, to be the same sums bit for bit.
        let (mut d_in, mut d_out) = (-0.0, -0.0);
        for (a, b) in prev.iter().zip(cur) {
            ok &= valid(b.queue_length) & not_below(a, b);
            d_in += b.records_in - a.records_in;
            d_out += b.records_out - a.records_out;
        }
        if d_in > 0.0 {
            out_with_input += d_out;
        }
        prev = cur;
    }
    // Finite at the last sample: then at every sample (see `not_below`).
    ok &= prev.iter().fold(true, |ok, b| ok & below_infinity(b));
    ok.then_some((first, prev, out_with_input))
}
