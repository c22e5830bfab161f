//! Step 2 of a plan, the latency allocation: while the slowest path's percentile bound exceeds
//! the SLO (or, for an SLO unattainable even at maximum parallelism under
//! `onUnattainableSlo: bestEffort`, the best-effort bound [`super::BEST_EFFORT_MARGIN`] above
//! the lowest bound there; either is the state's `target`), one subtask (a keyed operator: the smallest jump that lowers its busiest subtask's
//! share) goes to the operator on the slowest path whose step cuts its term the most per
//! subtask added (greedy marginal allocation, DRS ICDCS'15 / Lohrmann et al. ICDCS'15).
//!
//! The steps are taken in *rounds* on one path at a time: the slowest path (the `via` walk
//! from the slowest sink) takes the greedy's steps among its own operators — only its own
//! distances updated — until its bound is at the SLO or `ROUND_SLACK` × SLO below an upper
//! bound on every other path (which its cuts can only lower); then one longest-path pass finds
//! the next slowest path. The one-step greedy instead recomputes the slowest path after every
//! step, and where several paths are within a step of each other (water-filling: the common
//! case) it takes turns between them one subtask at a time; a round lets the path it works on go
//! up to the slack below the others first. That changes only the order of the steps near ties,
//! by at most the slack: every step is still the best cut on a path whose bound exceeds the SLO,
//! and the allocation ends only when the longest path's exact bound is within the SLO, or when a
//! path whose bound exceeds it cannot be cut. In that second case (an unattainable SLO) the
//! order of the steps matters more: paths other than the stuck one may have been taken further
//! than the one-step greedy, which stops at the first slowest path it cannot cut, would have
//! taken them, and a keyed operator's jumps land elsewhere (a proptest found plans 1.3 % larger
//! at the same bound). So an unattainable SLO is allocated again from the start by the one-step
//! greedy, which is then trimmed down to the stuck path's bound: at most the greedy's subtasks,
//! at its bound, at the cost of a second allocation only when the SLO cannot be met. The
//! proptest `rounds_end_where_the_one_step_greedy_ends` compares the result with the reference
//! one-step allocation, [`Model::allocate_greedy`], over random DAGs.

use super::{JobGraph, Model, NEGLIGIBLE_CUT};

/// How far (relative to the SLO) a round may take its path below the longest other path
/// before the next longest-path pass.
const ROUND_SLACK: f64 = 0.01;

/// Relative room below the SLO that [`Model::trim`] keeps (far above the rounding of path sums
/// taken in different orders), so the exact longest path after it is within the SLO.
const TRIM_MARGIN: f64 = 1e-9;

/// Whether `x` > `limit` (false when either is NaN).
fn exceeds(x: f64, limit: f64) -> bool {
    x > limit
}

/// Whether `x` ≤ `limit` (false when either is NaN).
fn within(x: f64, limit: f64) -> bool {
    x <= limit
}

/// How the latency allocation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Allocated {
    /// The slowest path's bound meets the target (the SLO, or the best-effort bound).
    Met,
    /// No operator on the slowest path can cut its term: the allocation stops there.
    Stuck,
    /// A plan that may only hold raised an operator above its current parallelism.
    Grew,
}

/// The allocation's state, indexed like the topology: parallelism `p`, each operator's term of
/// the path bound `w` (seconds; 0 for operators left out), the longest-path distance into each
/// operator `dist` (seconds) and its predecessor `via` (`usize::MAX`: none), the slowest path's
/// bound `lat` (seconds) and its last operator `end`, the subtasks `added` per operator, and
/// the bound the allocation works down to, `target` (seconds: the SLO, or the best-effort
/// bound of an unattainable SLO, see [`super::BEST_EFFORT_MARGIN`]).
#[derive(Clone)]
pub(super) struct LatencyState {
    pub target: f64,
    pub p: Vec<u32>,
    pub w: Vec<f64>,
    pub dist: Vec<f64>,
    pub via: Vec<usize>,
    pub lat: f64,
    pub end: usize,
    pub added: Vec<u32>,
}

impl LatencyState {
    /// Fills `chain` with the slowest path's operators, from its last operator back to its
    /// first (along `via`).
    fn slowest_path_into(&self, chain: &mut Vec<usize>) {
        chain.clear();
        let mut at = self.end;
        while at != usize::MAX {
            chain.push(at);
            at = self.via[at];
        }
    }
}

/// The scores of a round's chain with [`Model::best_of`]'s choice among them kept in a
/// tournament tree, so that a step (one score changes) costs O(log n) instead of a scan. Each
/// node holds the choice of its leaves (`usize::MAX`: none has a score): the right one when its
/// score is strictly larger, else the left one, which is the scan's choice (the largest, the
/// first on a tie) as long as no score is NaN (a NaN first score stays the scan's choice, which
/// does not split into halves); with a NaN anywhere it scans. Tests compare every choice with
/// the scan.
///
/// The tree is built only at a round's [`BestScores::SCANS`]-th choice: most rounds take a
/// step or two, and a scan of the chain costs less than building the tree.
#[derive(Default)]
struct BestScores {
    leaves: Vec<Option<f64>>,
    /// Heap order, root at 1, leaves from `width` (when `built`).
    tree: Vec<(f64, usize)>,
    width: usize,
    nan: usize,
    /// Whether `tree`, `width` and `nan` are those of `leaves`.
    built: bool,
    /// Choices made by scanning since the reset.
    scans: usize,
}

impl BestScores {
    const NONE: (f64, usize) = (f64::NEG_INFINITY, usize::MAX);

    /// Choices made by scanning the leaves before the tree is built.
    const SCANS: usize = 3;

    fn pick(a: (f64, usize), b: (f64, usize)) -> (f64, usize) {
        if a.1 == usize::MAX || (b.1 != usize::MAX && b.0 > a.0) {
            b
        } else {
            a
        }
    }

    fn reset(&mut self, scores: impl Iterator<Item = Option<f64>>) {
        self.leaves.clear();
        self.leaves.extend(scores);
        self.built = false;
        self.scans = 0;
    }

    /// Builds the tree over the leaves.
    fn build(&mut self) {
        self.built = true;
        self.width = self.leaves.len().next_power_of_two();
        // Every entry from 1 on is written below (the leaves and their padding, then the
        // inner nodes), so the kept entries need no clearing; entry 0 is never read.
        self.tree.resize(2 * self.width, Self::NONE);
        self.nan = 0;
        let leaves = &mut self.tree[self.width..];
        for (pos, (t, s)) in leaves.iter_mut().zip(&self.leaves).enumerate() {
            *t = match *s {
                Some(x) => {
                    self.nan += usize::from(x.is_nan());
                    (x, pos)
                }
                None => Self::NONE,
            };
        }
        leaves[self.leaves.len()..].fill(Self::NONE);
        for k in (1..self.width).rev() {
            self.tree[k] = Self::pick(self.tree[2 * k], self.tree[2 * k + 1]);
        }
    }

    fn set(&mut self, pos: usize, score: Option<f64>) {
        if !self.built {
            self.leaves[pos] = score;
            return;
        }
        let was_nan = self.leaves[pos].is_some_and(f64::is_nan);
        let is_nan = score.is_some_and(f64::is_nan);
        self.nan = self.nan + usize::from(is_nan) - usize::from(was_nan);
        self.leaves[pos] = score;
        let mut k = self.width + pos;
        self.tree[k] = score.map_or(Self::NONE, |x| (x, pos));
        while k > 1 {
            k /= 2;
            self.tree[k] = Self::pick(self.tree[2 * k], self.tree[2 * k + 1]);
        }
    }

    /// [`Model::best_of`] over the scores.
    fn best(&mut self) -> Option<usize> {
        if !self.built {
            if self.scans < Self::SCANS {
                self.scans += 1;
                return Model::best_of(self.leaves.iter().copied());
            }
            self.build();
        }
        let best = if self.nan > 0 || self.width < 2 {
            Model::best_of(self.leaves.iter().copied())
        } else {
            let (score, pos) = self.tree[1];
            (pos != usize::MAX && score > 0.0).then_some(pos)
        };
        #[cfg(test)]
        assert_eq!(best, Model::best_of(self.leaves.iter().copied()));
        best
    }
}

/// The slowest path's bound during a round, kept without re-adding the path after each step:
/// the exact bound D (the path's terms added from its first operator on, as the longest-path
/// update adds them) at the last full addition, plus each step's change of its operator's
/// term. In floating point the running value `approx` differs from the D a full addition
/// would give by at most the rounding of the path's n additions (≤ n·u·Σ terms, u = 2⁻⁵³)
/// and of the s running updates (≤ 2u per update of a value ≤ `mass`), with `mass` ≥ every
/// partial sum (the terms are ≥ 0: `mass` = D + Σ |changes|). [`ChainSum::exceeds`] answers
/// "D > limit" from `approx` only when it is further from `limit` than 4× that bound, else
/// `None`: then the caller adds the path up exactly. With an infinite or NaN term it always
/// defers. Tests check every answer against a full addition.
struct ChainSum {
    approx: f64,
    mass: f64,
    terms: usize,
    steps: usize,
    /// Highest chain position stepped since the last full addition.
    dirty: usize,
}

impl ChainSum {
    fn new(exact: f64, terms: usize) -> ChainSum {
        ChainSum {
            approx: exact,
            mass: exact.abs(),
            terms,
            steps: 0,
            dirty: 0,
        }
    }

    /// Chain position `pos`'s term changed from `before` to `after`.
    fn step(&mut self, pos: usize, before: f64, after: f64) {
        let change = after - before;
        self.approx += change;
        self.mass += change.abs();
        self.steps += 1;
        self.dirty = self.dirty.max(pos);
    }

    /// The highest chain position whose distance is stale.
    fn dirty_from(&self) -> usize {
        self.dirty
    }

    /// Whether the exact path sum exceeds `limit`, when `approx` tells for certain.
    fn exceeds(&self, limit: f64) -> Option<bool> {
        if !(self.approx.is_finite() && self.mass.is_finite() && limit.is_finite()) {
            return None;
        }
        let rounding = (self.terms + 2 * self.steps + 2) as f64 * f64::EPSILON * self.mass;
        let gap = self.approx - limit;
        if gap.abs() > 4.0 * rounding {
            Some(gap > 0.0)
        } else {
            None
        }
    }
}

/// The "longest after" sums of [`JobGraph::longest_other_path`], kept from one call to the
/// next, indexed like the topology: `after` the longest sum of terms after each operator to a
/// sink ([`JobGraph::longest_after`]), `through` that operator's own term (sources 0) plus
/// it (the sum its upstream operators compare; the same expression, so the same bits). Both
/// are current from index `stale` on: the caller keeps `stale` at or above the highest index
/// whose entries may differ from what the terms now give (an operator's entries depend only
/// on its own term and those after it: after terms changed at indices up to m, m + 1 will
/// do; n when they were never made). The entries below are made afresh, as the full pass
/// makes them, so every entry is the full pass's bit for bit; `stale` is then 0 (left as it
/// was when a NaN term makes the call return ∞ before any entry is made). `nan`: how many
/// terms are NaN (kept by the caller through [`AfterSums::changed`] instead of a scan per
/// call).
pub(super) struct AfterSums {
    pub after: Vec<f64>,
    pub through: Vec<f64>,
    pub stale: usize,
    pub nan: usize,
}

impl AfterSums {
    /// Sums for the terms `w` (n operators), none current.
    pub fn new(w: &[f64]) -> AfterSums {
        let n = w.len();
        AfterSums {
            after: vec![0.0; n],
            through: vec![0.0; n],
            stale: n,
            nan: w.iter().filter(|x| x.is_nan()).count(),
        }
    }

    /// Operator `i`'s term changed from `was` to `now`.
    fn changed(&mut self, i: usize, was: f64, now: f64) {
        self.stale = self.stale.max(i + 1);
        self.nan = self.nan + usize::from(now.is_nan()) - usize::from(was.is_nan());
    }

    /// Every term may have changed (`w` the terms now).
    fn reset(&mut self, w: &[f64]) {
        self.stale = w.len();
        self.nan = w.iter().filter(|x| x.is_nan()).count();
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: plan with the reference one-step greedy instead of the rounds.
    pub(super) static REFERENCE_GREEDY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Model {
    /// Whether operator `i` takes part in the latency allocation (μ known, not flagged for
    /// ineffective scaling).
    pub(super) fn adjustable(&self, i: usize) -> bool {
        self.mu(i).is_some() && !self.frozen[i]
    }

    /// Operator `at`'s score in the greedy: the cut of its term per subtask added by its
    /// candidate step (∞ when an infinite term becomes finite, `f64::MAX` when it stays
    /// infinite); `None` without a candidate or when the cut is negligible, under
    /// [`NEGLIGIBLE_CUT`] × SLO per subtask. `next` caches each operator's candidate step
    /// (parallelism, term; `u32::MAX` when it has none).
    fn score(&self, at: usize, st: &LatencyState, next: &mut [Option<(u32, f64)>]) -> Option<f64> {
        let (p, w) = (&st.p, &st.w);
        let cand = if self.adjustable(at) && p[at] < self.graph.bounds[at].1 {
            *next[at].get_or_insert_with(|| {
                self.next_parallelism(at, p[at])
                    .map_or((u32::MAX, w[at]), |q| (q, self.tail(at, q)))
            })
        } else {
            (u32::MAX, w[at])
        };
        if cand.0 == u32::MAX {
            return None;
        }
        let nx = cand.1;
        Some(if w[at].is_infinite() {
            if nx.is_finite() {
                f64::INFINITY
            } else {
                f64::MAX
            }
        } else {
            // Latency cut per subtask added (a keyed jump adds several); a negligible one is no
            // candidate (see `NEGLIGIBLE_CUT`).
            let cut = (w[at] - nx) / f64::from(cand.0 - p[at]);
            if cut < NEGLIGIBLE_CUT * self.s.slo {
                return None;
            }
            cut
        })
    }

    /// The greedy's choice among scores in chain order: the largest, the first one on a tie;
    /// `None` when it does not cut (≤ 0 or NaN). Returns the position.
    fn best_of(scores: impl Iterator<Item = Option<f64>>) -> Option<usize> {
        let mut best: Option<(f64, usize)> = None;
        for (pos, s) in scores.enumerate() {
            if let Some(score) = s
                && best.is_none_or(|(b, _)| score > b)
            {
                best = Some((score, pos));
            }
        }
        best.filter(|(s, _)| *s > 0.0).map(|(_, pos)| pos)
    }

    /// The greedy's choice among the operators of `chain` (last operator first, the order of
    /// the `via` walk; see [`Model::score`] and [`Model::best_of`]): the operator, `None` when
    /// none cuts its term.
    fn best_on(
        &self,
        chain: &[usize],
        st: &LatencyState,
        next: &mut [Option<(u32, f64)>],
    ) -> Option<usize> {
        Self::best_of(chain.iter().map(|&at| self.score(at, st, next))).map(|pos| chain[pos])
    }

    /// [`Model::score`] through `known`, each operator's score while its parallelism and term
    /// are unchanged (`None`: not known; the allocation forgets an operator's score whenever
    /// it changes them, so a kept score is the one `score` would compute).
    fn score_known(
        &self,
        at: usize,
        st: &LatencyState,
        next: &mut [Option<(u32, f64)>],
        known: &mut [Option<Option<f64>>],
    ) -> Option<f64> {
        let score = *known[at].get_or_insert_with(|| self.score(at, st, next));
        #[cfg(test)]
        assert_eq!(
            score.map(f64::to_bits),
            self.score(at, st, next).map(f64::to_bits),
            "a kept score is the one made afresh"
        );
        score
    }

    /// Takes operator `i`'s candidate step (see [`Model::best_on`]).
    fn take_step(&self, st: &mut LatencyState, next: &mut [Option<(u32, f64)>], i: usize) {
        let (q, wq) = next[i]
            .take()
            .unwrap_or_else(|| (st.p[i] + 1, self.tail(i, st.p[i] + 1)));
        st.added[i] += q - st.p[i];
        st.p[i] = q;
        st.w[i] = wq;
    }

    /// The latency allocation from `st` (the sized parallelism, its terms and longest path)
    /// until the slowest path's bound is at most `st.target` (see the module docs). With
    /// `hold_only` it stops with [`Allocated::Grew`] as soon as an operator rises above its
    /// current parallelism.
    pub(super) fn allocate_latency(&self, st: &mut LatencyState, hold_only: bool) -> Allocated {
        #[cfg(test)]
        if REFERENCE_GREEDY.with(std::cell::Cell::get) {
            return self.allocate_greedy(st, hold_only);
        }
        let g = &*self.graph;
        let n = st.p.len();
        let start = st.clone();
        let mut next: Vec<Option<(u32, f64)>> = vec![None; n];
        let mut known: Vec<Option<Option<f64>>> = vec![None; n];
        let mut dirty = vec![false; n];
        let (mut chain, mut scores) = (Vec::new(), BestScores::default());
        let mut on_chain = vec![false; n];
        let mut sums = AfterSums::new(&st.w);
        let slack = ROUND_SLACK * st.target.abs();
        // After a path over the SLO that cannot be cut: one-step greedy to the end.
        let mut one_step = false;
        let mut trimmed = false;
        while st.lat > st.target {
            st.slowest_path_into(&mut chain);
            let stop = if one_step {
                f64::INFINITY
            } else {
                let other = g.longest_other_path(&chain, &st.w, &st.dist, &mut on_chain, &mut sums);
                if other == f64::NEG_INFINITY {
                    st.target
                } else {
                    // ∞ or NaN (an infinite or NaN term): a single step.
                    (other - slack).max(st.target)
                }
            };
            if !exceeds(st.lat, stop) {
                let Some(i) = self.best_on(&chain, st, &mut next) else {
                    // Unattainable: the rounds may have taken paths other than the stuck one
                    // further than the one-step greedy, which stops at the first slowest path
                    // it cannot cut, and the order of the steps decides where a keyed
                    // operator's jumps land. The one-step greedy from the start instead.
                    *st = start;
                    return self.allocate_greedy_trimmed(st, hold_only);
                };
                let was = st.w[i];
                self.take_step(st, &mut next, i);
                sums.changed(i, was, st.w[i]);
                known[i] = None;
                if hold_only && st.p[i] > self.est[i].parallelism {
                    return Allocated::Grew;
                }
                (st.lat, st.end) = g.propagate(&st.w, &mut st.dist, &mut st.via, i, &mut dirty);
                continue;
            }
            // A round on the chain: the greedy's steps among its operators while its bound is
            // above `stop`; only the chain's own distances are updated, and only when the
            // comparison with `stop` needs them (see `ChainSum`).
            scores.reset(
                chain
                    .iter()
                    .map(|&at| self.score_known(at, st, &mut next, &mut known)),
            );
            let mut sum = ChainSum::new(st.dist[chain[0]], chain.len());
            // The lowest index stepped in this round: the distances below it stay current.
            let mut stepped_from = n;
            loop {
                let Some(pos) = scores.best() else {
                    one_step = true;
                    break;
                };
                let i = chain[pos];
                let (before, was) = (g.own(&st.w, i), st.w[i]);
                self.take_step(st, &mut next, i);
                stepped_from = stepped_from.min(i);
                sums.changed(i, was, st.w[i]);
                if hold_only && st.p[i] > self.est[i].parallelism {
                    return Allocated::Grew;
                }
                known[i] = None;
                scores.set(pos, self.score_known(i, st, &mut next, &mut known));
                sum.step(pos, before, g.own(&st.w, i));
                let over = match sum.exceeds(stop) {
                    Some(over) => over,
                    None => {
                        // The same sums the longest-path update makes along the chain (its
                        // first operator has no inputs: distance 0 before its own term), from
                        // the highest position stepped since they were last made.
                        for k in (0..=sum.dirty_from()).rev() {
                            let v = chain[k];
                            let d = chain.get(k + 1).map_or(0.0, |&u| st.dist[u]);
                            st.dist[v] = d + g.own(&st.w, v);
                        }
                        sum = ChainSum::new(st.dist[chain[0]], chain.len());
                        exceeds(st.dist[chain[0]], stop)
                    }
                };
                #[cfg(test)]
                {
                    let mut d = 0.0;
                    for &v in chain.iter().rev() {
                        d += g.own(&st.w, v);
                    }
                    assert_eq!(over, exceeds(d, stop), "chain sum {d} vs stop {stop}");
                }
                if !over {
                    break;
                }
            }
            // Only the terms stepped in the round changed, and the round rewrote only chain
            // distances at or after the first of them: the longest-path pass from there on
            // (the full pass's result, bit for bit).
            (st.lat, st.end) = g.longest_path_from(&st.w, &mut st.dist, &mut st.via, stepped_from);
            #[cfg(test)]
            {
                let (mut dist, mut via) = (Vec::new(), Vec::new());
                let (lat, end) = g.longest_path_into(&st.w, &mut dist, &mut via);
                assert_eq!((lat.to_bits(), end), (st.lat.to_bits(), st.end));
                assert_eq!(via, st.via);
                let bits = |d: &[f64]| d.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&dist),
                    bits(&st.dist),
                    "the pass from the first step is the full one"
                );
            }
            if !exceeds(st.lat, st.target) && !trimmed {
                trimmed = true;
                let target = st.target;
                self.trim(st, &mut sums.after, target);
                sums.reset(&st.w);
                // (Trimming changes parallelisms and terms: their scores are made afresh.)
                known.fill(None);
            }
        }
        Allocated::Met
    }

    /// After the rounds met the target (`bound` the target), or got stuck on a path they cannot cut
    /// (`bound` that path's finite bound, seconds): gives back subtasks the allocation added
    /// that the bound does not need, least useful first (the smallest rise of the operator's
    /// term), each only when every path through the operator stays `TRIM_MARGIN` × `bound`
    /// within `bound` (so the stuck path keeps its bound, the longest); the
    /// longest path is recomputed after each; passes repeat until none is given back. A round
    /// can take its path further than the one-step greedy would have at that point (up to the
    /// slack, and past cuts that other paths' steps would have made for it); this takes such
    /// surplus subtasks back. One subtask at a time, keyed operators too (a keyed operator's
    /// lower parallelism is valid, only its busiest subtask's share may be the same as one
    /// lower still, which the next pass then gives back at no rise). `after` is scratch space.
    /// Leaves `st`'s distances, `lat` and `end` current.
    fn trim(&self, st: &mut LatencyState, after: &mut [f64], bound: f64) {
        let g = &*self.graph;
        let n = st.p.len();
        let limit = bound - TRIM_MARGIN * bound.abs();
        let mut changed = true;
        let mut fresh = false;
        while changed {
            changed = false;
            let mut cand: Vec<(f64, usize)> = (0..n)
                .filter(|&i| st.added[i] > 0)
                .map(|i| (self.tail(i, st.p[i] - 1) - st.w[i], i))
                .filter(|(rise, _)| *rise >= 0.0)
                .collect();
            if cand.is_empty() {
                return;
            }
            cand.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            // (Current from the pass before, which ended with an update of both.)
            if !fresh {
                g.longest_after(&st.w, after);
                fresh = true;
            }
            for (_, i) in cand {
                let lower = self.tail(i, st.p[i] - 1);
                let ins = &g.fwd_in[g.fwd_in_at[i] as usize..g.fwd_in_at[i + 1] as usize];
                let before = ins.iter().map(|&j| st.dist[j as usize]).fold(0.0, f64::max);
                if !within(before + lower + after[i], limit) {
                    continue;
                }
                st.p[i] -= 1;
                st.added[i] -= 1;
                st.w[i] = lower;
                // Only operator i's term changed: the distances from i on and the "longest
                // after" sums below it (each the full pass's, bit for bit).
                (st.lat, st.end) = g.longest_path_from(&st.w, &mut st.dist, &mut st.via, i);
                g.longest_after_below(&st.w, after, i + 1);
                #[cfg(test)]
                {
                    let bits = |d: &[f64]| d.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let (mut dist, mut via, mut full) = (Vec::new(), Vec::new(), vec![0.0; n]);
                    let (lat, end) = g.longest_path_into(&st.w, &mut dist, &mut via);
                    g.longest_after(&st.w, &mut full);
                    assert_eq!((lat.to_bits(), end), (st.lat.to_bits(), st.end));
                    assert_eq!((bits(&dist), via), (bits(&st.dist), st.via.clone()));
                    assert_eq!(bits(&full), bits(after));
                }
                changed = true;
            }
        }
    }
    /// The allocation of an unattainable SLO: [`Model::allocate_greedy`] from `st`, and when it
    /// gets stuck on a path with a finite bound, [`Model::trim`] down to that bound (it stays
    /// the longest path's).
    fn allocate_greedy_trimmed(&self, st: &mut LatencyState, hold_only: bool) -> Allocated {
        let outcome = self.allocate_greedy(st, hold_only);
        let bound = match outcome {
            Allocated::Grew => return outcome,
            Allocated::Stuck if st.lat.is_finite() => st.lat,
            Allocated::Stuck => return outcome,
            Allocated::Met => st.target,
        };
        let mut after = vec![0.0; st.p.len()];
        self.trim(st, &mut after, bound);
        outcome
    }

    /// The one-step greedy: the incremental longest-path update after every step, as the
    /// planner made it before the rounds. Tests compare the rounds with it.
    pub(super) fn allocate_greedy(&self, st: &mut LatencyState, hold_only: bool) -> Allocated {
        let n = st.p.len();
        let mut next: Vec<Option<(u32, f64)>> = vec![None; n];
        let mut dirty = vec![false; n];
        let mut chain = Vec::new();
        while st.lat > st.target {
            st.slowest_path_into(&mut chain);
            let Some(i) = self.best_on(&chain, st, &mut next) else {
                return Allocated::Stuck;
            };
            self.take_step(st, &mut next, i);
            if hold_only && st.p[i] > self.est[i].parallelism {
                return Allocated::Grew;
            }
            (st.lat, st.end) =
                self.graph
                    .propagate(&st.w, &mut st.dist, &mut st.via, i, &mut dirty);
        }
        Allocated::Met
    }
}

impl JobGraph {
    /// Operator `i`'s term in a path sum: `w[i]`, 0 for sources.
    fn own(&self, w: &[f64], i: usize) -> f64 {
        if self.topo.is_source[i] { 0.0 } else { w[i] }
    }

    /// Into `after`: for each operator the longest sum of the terms `w` (sources 0) of the
    /// operators after it on a path over forward edges to a sink, seconds (0 at a sink, −∞
    /// when no sink is reachable over forward edges).
    fn longest_after(&self, w: &[f64], after: &mut [f64]) {
        self.longest_after_below(w, after, after.len());
    }

    /// [`JobGraph::longest_after`] when only the terms of operators below index `below`
    /// changed since `after` was last made for `w`: an operator's entry depends only on the
    /// terms after it, so the entries from `below` on are kept, and each entry below is made
    /// as the full pass makes it (the same bits).
    fn longest_after_below(&self, w: &[f64], after: &mut [f64], below: usize) {
        let n = after.len();
        let below = below.min(n);
        // (Slices of length n up front, so that only the edge targets are bounds-checked.)
        let (at, init) = (&self.fwd_out_at[..=n], &self.after_init[..n]);
        let (src, w) = (&self.topo.is_source[..n], &w[..n]);
        let mut hi = at[below] as usize;
        for i in (0..below).rev() {
            let lo = at[i] as usize;
            let mut a = init[i];
            for &k in &self.fwd_out[lo..hi] {
                let k = k as usize;
                // ∞ + (−∞): no sink after k, no path.
                let t = (if src[k] { 0.0 } else { w[k] }) + after[k];
                if t > a {
                    a = t;
                }
            }
            after[i] = a;
            hi = lo;
        }
    }

    /// An upper bound on every path other than `chain` (operator indices, last first, as the
    /// `via` walk gives them): paths over forward edges from an operator without inputs to a
    /// sink, of the terms `w` (sources 0), seconds. From `dist` (the longest-path distance into
    /// each operator, current for `w`): the longest path through any operator off the chain,
    /// or through an edge between two chain operators that the chain does not take (every
    /// other path has one of the two). −∞ when there is no other path, ∞ when a term is NaN.
    /// `on_chain` (all `false`, left all `false`) is scratch space; `sums` keeps the "longest
    /// after" sums from call to call (see [`AfterSums`]).
    pub(super) fn longest_other_path(
        &self,
        chain: &[usize],
        w: &[f64],
        dist: &[f64],
        on_chain: &mut [bool],
        sums: &mut AfterSums,
    ) -> f64 {
        debug_assert_eq!(sums.nan, w.iter().filter(|x| x.is_nan()).count());
        if sums.nan > 0 {
            return f64::INFINITY;
        }
        let n = dist.len();
        let outs =
            |i: usize| &self.fwd_out[self.fwd_out_at[i] as usize..self.fwd_out_at[i + 1] as usize];
        for &v in chain {
            on_chain[v] = true;
        }
        // `longest_after` with the longest path through each operator off the chain taken as
        // its `after` is made. (The largest of those sums, in the reverse of the operators'
        // order: no sum is NaN — no term is, and an infinite distance meets only a finite
        // `after` — so the order changes at most the sign of a zero maximum, which the
        // caller's `other − slack` does not see.)
        let mut other = f64::NEG_INFINITY;
        let (at, init) = (&self.fwd_out_at[..=n], &self.after_init[..n]);
        let fresh_below = std::mem::take(&mut sums.stale).min(n);
        let (src, w, dist, after, through, on) = (
            &self.topo.is_source[..n],
            &w[..n],
            &dist[..n],
            &mut sums.after[..n],
            &mut sums.through[..n],
            &on_chain[..n],
        );
        // The kept entries first, then the ones made afresh: every operator in the reverse of
        // the operators' order, as in one loop.
        for v in (fresh_below..n).rev() {
            let a = after[v];
            if !on[v] && a > f64::NEG_INFINITY {
                let t = dist[v] + a;
                if t > other {
                    other = t;
                }
            }
        }
        let mut hi = at[fresh_below] as usize;
        for v in (0..fresh_below).rev() {
            let lo = at[v] as usize;
            let mut a = init[v];
            for &k in &self.fwd_out[lo..hi] {
                // ∞ + (−∞): no sink after k, no path (`through` is NaN).
                let t = through[k as usize];
                if t > a {
                    a = t;
                }
            }
            after[v] = a;
            through[v] = (if src[v] { 0.0 } else { w[v] }) + a;
            hi = lo;
            if !on[v] && a > f64::NEG_INFINITY {
                let t = dist[v] + a;
                if t > other {
                    other = t;
                }
            }
        }
        let after = &sums.after[..n];
        #[cfg(test)]
        {
            // Every kept entry is the full pass's.
            let mut full = vec![0.0; n];
            self.longest_after(w, &mut full);
            for v in 0..n {
                let through = (if src[v] { 0.0 } else { w[v] }) + full[v];
                assert_eq!(after[v].to_bits(), full[v].to_bits(), "after[{v}]");
                assert_eq!(sums.through[v].to_bits(), through.to_bits(), "through[{v}]");
            }
        }
        for (pos, &u) in chain.iter().enumerate().skip(1) {
            for &k in outs(u) {
                let k = k as usize;
                if on_chain[k] && k != chain[pos - 1] && after[k] > f64::NEG_INFINITY {
                    let t = dist[u] + self.own(w, k) + after[k];
                    if t > other {
                        other = t;
                    }
                }
            }
        }
        for &v in chain {
            on_chain[v] = false;
        }
        other
    }
}

#[cfg(test)]
mod tests {
    use super::{BestScores, Model};

    /// The tournament tree chooses as the scan does: the largest score, the first on a tie,
    /// none when the best does not cut (≤ 0), through updates, with ∞, −∞, NaN and gaps.
    #[test]
    fn best_scores_choose_as_the_scan() {
        let inf = f64::INFINITY;
        let cases: Vec<Vec<Option<f64>>> = vec![
            vec![],
            vec![Some(1.0)],
            vec![Some(-1.0)],
            vec![Some(1.0), Some(2.0), Some(2.0), None, Some(-inf), Some(2.0)],
            vec![
                None,
                Some(0.0),
                Some(f64::MAX),
                Some(inf),
                Some(inf),
                Some(3.0),
                None,
            ],
            vec![Some(f64::NAN), Some(5.0), Some(1.0)],
            vec![Some(-inf), Some(-inf), None, Some(0.5), Some(0.5)],
        ];
        let updates = [
            Some(2.0),
            Some(0.5),
            None,
            Some(inf),
            Some(f64::NAN),
            Some(-1.0),
        ];
        for scores in cases {
            let mut tree = BestScores::default();
            tree.reset(scores.iter().copied());
            let mut scan = scores.clone();
            assert_eq!(
                tree.best(),
                Model::best_of(scan.iter().copied()),
                "{scan:?}"
            );
            for (k, u) in updates.iter().enumerate() {
                if scan.is_empty() {
                    break;
                }
                let pos = (3 * k + 1) % scan.len();
                scan[pos] = *u;
                tree.set(pos, *u);
                assert_eq!(
                    tree.best(),
                    Model::best_of(scan.iter().copied()),
                    "{scan:?}"
                );
            }
        }
        // Ties go to the first position, scanned or from the tree (built before the first
        // choice, or after the first scans as in a round).
        for build_first in [false, true] {
            let mut tree = BestScores::default();
            tree.reset([Some(1.0), Some(3.0), Some(2.0), Some(3.0)].into_iter());
            if build_first {
                tree.build();
            }
            assert_eq!(tree.best(), Some(1));
            tree.set(1, Some(2.0));
            assert_eq!(tree.best(), Some(3));
            tree.set(0, Some(3.0));
            assert_eq!(tree.best(), Some(0));
            tree.set(0, Some(1.0));
            assert_eq!(tree.best(), Some(3));
            assert!(tree.built, "the tree is built by the fourth choice");
            tree.set(3, Some(2.0));
            assert_eq!(tree.best(), Some(1));
        }
    }

    /// A tree reset after other rounds (longer, shorter, other scores) is the tree a fresh one
    /// builds: no entry of an earlier round is left in it.
    #[test]
    fn a_reset_tree_is_a_fresh_tree() {
        let cases: Vec<Vec<Option<f64>>> = vec![
            (0..37).map(|k| Some(f64::from(k % 7))).collect(),
            vec![Some(1.0), None, Some(4.0)],
            vec![None; 5],
            (0..9)
                .map(|k| (k % 3 != 0).then_some(-f64::from(k)))
                .collect(),
            vec![Some(f64::INFINITY), Some(f64::NAN), Some(2.0)],
            vec![Some(0.5)],
            Vec::new(),
            (0..130).map(|k| Some(f64::from(k * 31 % 17))).collect(),
        ];
        let bits = |t: &BestScores| -> Vec<(u64, usize)> {
            t.tree[1..].iter().map(|&(x, p)| (x.to_bits(), p)).collect()
        };
        let mut reused = BestScores::default();
        for scores in cases.iter().chain(cases.iter().rev()) {
            reused.reset(scores.iter().copied());
            reused.build();
            let mut fresh = BestScores::default();
            fresh.reset(scores.iter().copied());
            fresh.build();
            assert_eq!((reused.width, reused.nan), (fresh.width, fresh.nan));
            assert_eq!(bits(&reused), bits(&fresh), "{scores:?}");
            assert_eq!(reused.best(), fresh.best());
        }
    }
}
