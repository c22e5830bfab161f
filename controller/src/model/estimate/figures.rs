//! Every operator's per-subtask figures of a window in flat storage (input shares,
//! saturation, key-group lists), and how they are read from the first and last samples with
//! the count-based confidence bounds of a key group's share.

use super::*;

/// Every operator's per-subtask figures of a window in flat storage: what
/// [`OperatorEstimate`]'s per-subtask vectors (`subtask_input_shares`, `subtask_saturation`,
/// `subtask_hottest_key_group_shares`, `subtask_key_group_shares` and
/// `subtask_key_group_point_shares`) hold, the same values, in a few arrays whose allocations
/// a caller reuses from one window to the next (the planner makes a model per decision, with
/// a list per keyed subtask and reading otherwise).
#[derive(Debug, Default)]
pub(crate) struct SubtaskFigures {
    /// Per operator (topological order): where its figures lie in the arrays below.
    ops: Vec<OperatorFigures>,
    /// Operators' subtask input shares, one run per operator.
    input_shares: Vec<f64>,
    /// Operators' subtask saturations, one run per operator.
    saturation: Vec<f64>,
    /// Operators' subtasks' busiest-key-group shares (conservative), one run per operator.
    hottest: Vec<Option<f64>>,
    /// Per listed subtask: the ends of its lists in `conservative` and `point`.
    list_ends: Vec<(u32, u32)>,
    /// Listed subtasks' key groups, conservative readings.
    conservative: Vec<(u32, f64)>,
    /// Listed subtasks' key groups, point readings.
    point: Vec<(u32, f64)>,
}

/// Where one operator's figures lie in a [`SubtaskFigures`]: start and end of each run.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct OperatorFigures {
    input_shares: (u32, u32),
    saturation: (u32, u32),
    hottest: (u32, u32),
    /// Its listed subtasks in `list_ends` (none when no subtask lists key groups).
    lists: (u32, u32),
    /// Where its first listed subtask's lists start in `conservative` and `point`.
    lists_from: (u32, u32),
}

/// One operator's key-group lists in a [`SubtaskFigures`] (one reading), by subtask.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyGroupLists<'a> {
    /// The reading's entries of every operator (the operator's lists lie within).
    entries: &'a [(u32, f64)],
    /// Per subtask of the operator: the ends of its lists in `entries`, (conservative, point).
    ends: &'a [(u32, u32)],
    /// Where the first subtask's list starts.
    from: u32,
    /// Whether the point readings (`.1` of `ends`) are read.
    point: bool,
}

impl<'a> KeyGroupLists<'a> {
    /// Subtasks with a list (0 when no subtask lists key groups).
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether no subtask lists key groups.
    pub(crate) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Subtask `j`'s list; `None` past the last subtask.
    pub(crate) fn get(&self, j: usize) -> Option<&'a [(u32, f64)]> {
        let end = |k: usize| {
            let e = self.ends[k];
            (if self.point { e.1 } else { e.0 }) as usize
        };
        if j >= self.ends.len() {
            return None;
        }
        let start = if j == 0 {
            self.from as usize
        } else {
            end(j - 1)
        };
        Some(&self.entries[start..end(j)])
    }
}

/// A run's bounds as a range.
pub(super) fn run(r: (u32, u32)) -> std::ops::Range<usize> {
    r.0 as usize..r.1 as usize
}

/// The current length of `v` as a run bound.
pub(super) fn at<T>(v: &[T]) -> u32 {
    u32::try_from(v.len()).unwrap_or(u32::MAX)
}

impl SubtaskFigures {
    /// Empties every array, keeping the allocations.
    pub(super) fn clear(&mut self) {
        self.ops.clear();
        self.input_shares.clear();
        self.saturation.clear();
        self.hottest.clear();
        self.list_ends.clear();
        self.conservative.clear();
        self.point.clear();
    }

    /// Operator `i`'s [`OperatorEstimate::subtask_input_shares`].
    pub(crate) fn input_shares(&self, i: usize) -> &[f64] {
        &self.input_shares[run(self.ops[i].input_shares)]
    }

    /// Operator `i`'s [`OperatorEstimate::subtask_saturation`].
    pub(crate) fn saturation(&self, i: usize) -> &[f64] {
        &self.saturation[run(self.ops[i].saturation)]
    }

    /// Operator `i`'s [`OperatorEstimate::subtask_hottest_key_group_shares`].
    pub(crate) fn hottest(&self, i: usize) -> &[Option<f64>] {
        &self.hottest[run(self.ops[i].hottest)]
    }

    /// Operator `i`'s [`OperatorEstimate::subtask_key_group_shares`] (`point` false) or
    /// [`OperatorEstimate::subtask_key_group_point_shares`] (`point` true).
    pub(crate) fn lists(&self, i: usize, point: bool) -> KeyGroupLists<'_> {
        let o = self.ops[i];
        KeyGroupLists {
            entries: if point {
                &self.point
            } else {
                &self.conservative
            },
            ends: &self.list_ends[run(o.lists)],
            from: if point {
                o.lists_from.1
            } else {
                o.lists_from.0
            },
            point,
        }
    }

    /// Writes operator `i`'s per-subtask figures into `e`'s vectors.
    pub(super) fn fill(&self, i: usize, e: &mut OperatorEstimate) {
        e.subtask_input_shares = self.input_shares(i).to_vec();
        e.subtask_saturation = self.saturation(i).to_vec();
        e.subtask_hottest_key_group_shares = self.hottest(i).to_vec();
        let read = |point: bool| -> Vec<Vec<(u32, f64)>> {
            let l = self.lists(i, point);
            (0..l.len())
                .map(|j| l.get(j).unwrap_or_default().to_vec())
                .collect()
        };
        e.subtask_key_group_shares = read(false);
        e.subtask_key_group_point_shares = read(true);
    }
}
/// Appends one operator's per-subtask figures to `figures` from the window's first and last
/// rows of its subtasks (Δrecords_in `d_in` summed over them, over `elapsed` seconds): its
/// [`OperatorEstimate::subtask_input_shares`] (none when `d_in` ≤ 0),
/// [`OperatorEstimate::subtask_saturation`],
/// [`OperatorEstimate::subtask_hottest_key_group_shares`] (none when no subtask reports it) and
/// key-group lists, both readings (none when no subtask lists any).
pub(super) fn subtask_figures(
    first: &[SubtaskSample],
    last: &[SubtaskSample],
    d_in: f64,
    elapsed: f64,
    figures: &mut SubtaskFigures,
) {
    let mut o = OperatorFigures::default();
    let f = &mut *figures;
    o.input_shares.0 = at(&f.input_shares);
    if d_in > 0.0 {
        f.input_shares.extend(
            first
                .iter()
                .zip(last)
                .map(|(a, b)| (b.records_in - a.records_in) / d_in),
        );
    }
    o.input_shares.1 = at(&f.input_shares);
    o.saturation.0 = at(&f.saturation);
    f.saturation.extend(first.iter().zip(last).map(|(a, b)| {
        let t =
            (b.busy_seconds - a.busy_seconds) + (b.backpressured_seconds - a.backpressured_seconds);
        (t / elapsed).clamp(0.0, 1.0)
    }));
    o.saturation.1 = at(&f.saturation);
    o.hottest.0 = at(&f.hottest);
    if !last.iter().all(|s| s.hottest_key_group_share.is_none()) {
        f.hottest.extend(first.iter().zip(last).map(|(a, b)| {
            conservative_share(b.hottest_key_group_share?, b.records_in - a.records_in)
        }));
    }
    o.hottest.1 = at(&f.hottest);
    o.lists.0 = at(&f.list_ends);
    o.lists_from = (at(&f.conservative), at(&f.point));
    if !last.iter().all(|s| s.key_group_shares.is_empty()) {
        for (a, b) in first.iter().zip(last) {
            let n = b.records_in - a.records_in;
            for &(g, h) in &b.key_group_shares {
                // (Where either reading is `None`, so is the other: the same test.)
                if !(h.is_finite() && h > 0.0 && n > 0.0) {
                    continue;
                }
                if let Some(read) = conservative_share(h, n).filter(|&x| x > 0.0) {
                    f.conservative.push((g, read));
                }
                if let Some(read) = point_share(h, n).filter(|&x| x > 0.0) {
                    f.point.push((g, read));
                }
            }
            f.list_ends.push((at(&f.conservative), at(&f.point)));
        }
    }
    o.lists.1 = at(&f.list_ends);
    f.ops.push(o);
}
/// Standard deviations taken off a record count in [`count_lower_bound`].
pub const COUNT_CONFIDENCE_Z: f64 = 2.0;

/// A lower confidence bound on a record count `n` treated as Poisson: n − z·√n with
/// z = [`COUNT_CONFIDENCE_Z`] (about 97.7 % one-sided), at least 0. Used where a share is read
/// from few records: the busiest key group's ([`OperatorEstimate::subtask_hottest_key_group_shares`])
/// and the busiest subtask's (`stats::CapacityEstimator::busiest_share`), so that the largest
/// of several noisy counts is not read as a hot spot.
pub fn count_lower_bound(n: f64) -> f64 {
    (n - COUNT_CONFIDENCE_Z * n.sqrt()).max(0.0)
}

/// A share `h` of `n` records read conservatively: the count h·n less
/// [`COUNT_CONFIDENCE_Z`]·√(h·n) ([`count_lower_bound`]), over n, within [0, 1]; `None` for
/// no record or a share that is not a positive number.
pub(super) fn conservative_share(h: f64, n: f64) -> Option<f64> {
    if !(h.is_finite() && h > 0.0 && n > 0.0) {
        return None;
    }
    Some((count_lower_bound(h.min(1.0) * n) / n).min(1.0))
}

/// A share `h` of `n` records as reported, within (0, 1]; `None` where
/// [`conservative_share`] is `None` (no record, or a share that is not a positive number).
pub(super) fn point_share(h: f64, n: f64) -> Option<f64> {
    (h.is_finite() && h > 0.0 && n > 0.0).then(|| h.min(1.0))
}
