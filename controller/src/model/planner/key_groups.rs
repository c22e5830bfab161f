//! Key-group loads and ranges: how a keyed operator's input spreads over its subtasks'
//! contiguous key-group ranges (Flink's assignment), and the busiest range at a parallelism.

use super::*;

/// The largest load of one subtask's key-group range when `k` key groups (loads' prefix sums
/// `prefix`, k + 1 entries) are split over `q` ≤ k subtasks: subtask j owns key groups
/// [⌈jK/q⌉, ⌈(j+1)K/q⌉), Flink's contiguous assignment ([`key_group_range`]); each range
/// starts where the previous one ended, so one division per subtask.
pub(super) fn busiest_range_load(prefix: &[f64], q: u32, k: u32) -> f64 {
    if q == 0 {
        return 0.0;
    }
    busiest_of_ranges(prefix, q, k, 0, u64::from(q) - 1)
}

/// The largest load of subtasks `first..=last`'s key-group ranges (q ≥ 1 subtasks over k key
/// groups, see [`busiest_range_load`]). The range boundaries ⌈jK/q⌉ are stepped without a
/// division: with K = d·q + r, ⌈(j+1)K/q⌉ = ⌈jK/q⌉ + d + (1 when the remainder of jK + q − 1
/// plus r reaches q).
pub(super) fn busiest_of_ranges(prefix: &[f64], q: u32, k: u32, first: u64, last: u64) -> f64 {
    busiest_of_ranges_until(prefix, q, k, first, last, |_| false)
}

/// [`busiest_of_ranges`], stopping at the first range that raises the running maximum to a
/// value satisfying `stop` (then that maximum; the full maximum when none does). For a `stop`
/// non-decreasing in the share, `stop` of the result is `stop` of the full maximum.
#[inline]
pub(super) fn busiest_of_ranges_until(
    prefix: &[f64],
    q: u32,
    k: u32,
    first: u64,
    last: u64,
    stop: impl Fn(f64) -> bool,
) -> f64 {
    let (k64, q64) = (u64::from(k), u64::from(q));
    let (d, r) = ((k64 / q64) as usize, k64 % q64);
    let b = first * k64 + q64 - 1;
    let mut start = (b / q64) as usize;
    let mut rem = b % q64;
    // The running maximum: `x > share` keeps what `f64::max(share, x)` keeps (a NaN load is
    // skipped, share is never NaN), and `stop` is asked again only when the maximum changed
    // (it answered false for the same value before). Each range's end is the next one's start:
    // one prefix read per range.
    let mut share = 0.0;
    let mut at_start = prefix[start];
    // (A half-open count: an inclusive range's iteration checks its end twice.)
    let ranges = (last + 1).saturating_sub(first);
    if r == 0 {
        // q divides k: no range carries an extra key group (the remainder stays q − 1).
        for _ in 0..ranges {
            let end = start + d;
            let at_end = prefix[end];
            let x = at_end - at_start;
            if x > share {
                share = x;
                if stop(share) {
                    break;
                }
            }
            start = end;
            at_start = at_end;
        }
        return share;
    }
    for _ in 0..ranges {
        rem += r;
        let carry = rem >= q64;
        if carry {
            rem -= q64;
        }
        let end = start + d + usize::from(carry);
        let at_end = prefix[end];
        let x = at_end - at_start;
        if x > share {
            share = x;
            if stop(share) {
                break;
            }
        }
        start = end;
        at_start = at_end;
    }
    share
}

/// How many subtask ranges [`busiest_range_load_over`] looks at, at most.
pub(super) const PROBE_RANGES: u64 = 6;

/// [`busiest_range_load`] over only a few of the subtask ranges that overlap key groups [a, b)
/// (a < b ≤ k; the subtasks ⌊a·q/k⌋ ..= ⌊(b − 1)·q/k⌋ own them): at most [`PROBE_RANGES`]
/// consecutive ones around the run's middle, each range's load computed as there, so the
/// result is never above it. 0 for an empty run.
#[cfg(test)]
pub(super) fn busiest_range_load_over(prefix: &[f64], q: u32, k: u32, a: u32, b: u32) -> f64 {
    busiest_range_load_over_until(prefix, q, k, a, b, |_| false)
}

/// [`busiest_range_load_over`], stopping as [`busiest_of_ranges_until`] does.
pub(super) fn busiest_range_load_over_until(
    prefix: &[f64],
    q: u32,
    k: u32,
    a: u32,
    b: u32,
    stop: impl Fn(f64) -> bool,
) -> f64 {
    if a >= b || b > k || q == 0 {
        return 0.0;
    }
    let (k64, q64) = (u64::from(k), u64::from(q));
    let mut first = u64::from(a) * q64 / k64;
    let mut last = (u64::from(b) - 1) * q64 / k64;
    if last - first >= PROBE_RANGES {
        let mid = (u64::from(a) + u64::from(b)) / 2 * q64 / k64;
        first = mid.saturating_sub(PROBE_RANGES / 2).max(first);
        last = (first + PROBE_RANGES - 1).min(last);
    }
    busiest_of_ranges_until(prefix, q, k, first, last, stop)
}

/// The input among `ins` with the largest distance in `dist` (the first on a tie) and that
/// distance; (0, `usize::MAX`) for no inputs.
#[inline]
pub(super) fn farthest_of(ins: &[u32], dist: &[f64]) -> (f64, usize) {
    let Some((&first, rest)) = ins.split_first() else {
        return (0.0, usize::MAX);
    };
    let mut arg = first as usize;
    let mut d = dist[arg];
    for &j in rest {
        let x = dist[j as usize];
        if x > d {
            d = x;
            arg = j as usize;
        }
    }
    (d, arg)
}

/// The first run [a, b) of equal largest entries of `load` (the key groups of the most loaded
/// subtask range they were estimated from); (0, 0) when empty.
/// Also the largest load as `fold(0.0, f64::max)` gives it (0 when none is positive; NaN
/// loads ignored), found in the same pass.
pub(super) fn hottest_run(load: &[f64]) -> ((u32, u32), f64) {
    let mut a = 0;
    let mut largest = 0.0;
    for (g, &x) in load.iter().enumerate() {
        if x > load[a] {
            a = g;
        }
        largest = f64::max(largest, x);
    }
    let Some(&top) = load.get(a) else {
        return ((0, 0), largest);
    };
    let b = load[a..].iter().take_while(|&&x| x == top).count() + a;
    ((a as u32, b as u32), largest)
}

/// Estimated input share per key group (sums to 1) of a keyed operator from its subtasks'
/// input shares at the current parallelism: each subtask's share spread evenly over the
/// key groups it owns. Uniform when the shares are unknown (no input in the window).
pub fn key_group_load(subtask_shares: &[f64], key_groups: u32) -> Vec<f64> {
    key_group_load_with_hot(subtask_shares, &[], &[], key_groups)
}

/// [`key_group_load`] where the engine reports how much of a subtask's input its busiest key
/// group takes (`hottest[j]`, [`OperatorEstimate::subtask_hottest_key_group_shares`], a
/// conservative reading) and, where it lists them, which key groups are its busiest with their
/// shares (`listed[j]`, [`OperatorEstimate::subtask_key_group_shares`], conservative readings
/// too). A subtask with listed groups: each listed group of its range whose share h is more
/// than an even spread (h · width > 1: a group at or under it says nothing the even spread does
/// not) gets h·s of the subtask's share s at its real index, and the rest s·(1 − Σh) is spread
/// evenly over the range's other key groups (so each of them gets less than an even spread).
/// Without a list, the hottest share h goes to one key group (the first of its range: the
/// figure does not say which) and (1 − h)·s evenly over the others, as long as h · width > 1.
/// A subtask with neither, or with one key group, is spread evenly; empty `hottest` and
/// `listed` give exactly [`key_group_load`].
pub fn key_group_load_with_hot(
    subtask_shares: &[f64],
    hottest: &[Option<f64>],
    listed: &[Vec<(u32, f64)>],
    key_groups: u32,
) -> Vec<f64> {
    let mut load = Vec::new();
    key_group_load_into(subtask_shares, hottest, listed, key_groups, &mut load);
    load
}

/// Subtasks' listed key groups by subtask, as [`key_group_load_with_hot`] reads them.
pub(super) trait Listed {
    /// Subtask `j`'s list; `None` past the last subtask with one.
    fn list(&self, j: usize) -> Option<&[(u32, f64)]>;
}

impl Listed for [Vec<(u32, f64)>] {
    fn list(&self, j: usize) -> Option<&[(u32, f64)]> {
        self.get(j).map(Vec::as_slice)
    }
}

impl Listed for KeyGroupLists<'_> {
    fn list(&self, j: usize) -> Option<&[(u32, f64)]> {
        self.get(j)
    }
}

/// [`key_group_load_with_hot`] appended to `out` (max(K, 1) entries).
pub(super) fn key_group_load_into<L: Listed + ?Sized>(
    subtask_shares: &[f64],
    hottest: &[Option<f64>],
    listed: &L,
    key_groups: u32,
    out: &mut Vec<f64>,
) {
    let k = key_groups.max(1);
    let p = subtask_shares.len() as u32;
    if p == 0 || p > k || subtask_shares.iter().sum::<f64>() <= 0.0 {
        out.extend(std::iter::repeat_n(1.0 / f64::from(k), k as usize));
        return;
    }
    let start = out.len();
    out.resize(start + k as usize, 0.0);
    let load = &mut out[start..];
    for (j, share) in subtask_shares.iter().enumerate() {
        let r = key_group_range(j as u32, p, k);
        let width = f64::from(r.end - r.start).max(1.0);
        if r.end - r.start > 1
            && let Some(groups) = listed.list(j).filter(|l| !l.is_empty())
        {
            // The listed groups of the range that are hotter than an even spread, first
            // listing of each, their shares' sum kept within 1.
            let (mut placed, mut sum) = (0u32, 0.0);
            for &(g, h) in groups {
                if !(r.contains(&g) && h.is_finite() && h * width > 1.0) || load[g as usize] < 0.0 {
                    continue;
                }
                let h = h.min(1.0 - sum);
                if h <= 0.0 {
                    break;
                }
                // Marked (negative) until the rest is spread.
                load[g as usize] = -share * h;
                sum += h;
                placed += 1;
            }
            if placed > 0 {
                let others = r.end - r.start - placed;
                let rest = if others > 0 {
                    share * (1.0 - sum).max(0.0) / f64::from(others)
                } else {
                    0.0
                };
                for kg in r.clone() {
                    let x = &mut load[kg as usize];
                    *x = if *x < 0.0 { -*x } else { rest };
                }
                continue;
            }
        }
        let hot = hottest
            .get(j)
            .copied()
            .flatten()
            .filter(|h| h.is_finite() && *h * width > 1.0 && r.end - r.start > 1)
            .map(|h| h.min(1.0));
        match hot {
            Some(h) => {
                let rest = share * (1.0 - h) / (width - 1.0);
                for kg in r.clone() {
                    load[kg as usize] = rest;
                }
                load[r.start as usize] = share * h;
            }
            None => {
                for kg in r {
                    load[kg as usize] = share / width;
                }
            }
        }
    }
}
