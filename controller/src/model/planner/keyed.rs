//! Keyed operators: the busiest subtask's share of the input at a parallelism, saturated
//! subtasks' offered load, hot key groups (isolation, hysteresis) and the key-group-aligned
//! sizing and latency steps.

use super::*;

/// A keyed operator's sizing search in [`Model::size_keyed`]: at arrival rate `lambda` ≥ 0
/// (records/s) and the limit `limit` (records/s a subtask may take), every parallelism from
/// `start` up to `stopped` (excluded) put a subtask over the limit; `stopped` fits, or is the
/// number of key groups.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyedSearch {
    pub(super) lambda: f64,
    pub(super) limit: f64,
    pub(super) start: u32,
    pub(super) stopped: u32,
}

impl KeyedSearch {
    /// Whether a search at `lambda` with `limit` from `start` may skip to `stopped`: every
    /// parallelism p in [start, stopped) has λ_then · share(p) > limit, and λ · share(p) ≥
    /// λ_then · share(p) for λ ≥ λ_then ≥ 0 (shares are ≥ 0; rounding is monotone).
    pub(super) fn reaches(&self, lambda: f64, limit: f64, start: u32) -> bool {
        self.lambda >= 0.0
            && lambda >= self.lambda
            && limit.to_bits() == self.limit.to_bits()
            && start >= self.start
    }
}

/// A key group is hot when its estimated load is at least this multiple of the mean.
pub const HOT_KEY_GROUP_FACTOR: f64 = 2.0;

/// A hot key group too large for one subtask at the target utilization counts as isolated
/// (`Model::isolating_parallelism`) when its subtask carries at most this multiple of the
/// group's own load besides it: 10 %, the scale-up tolerance band ([`SCALE_UP_TOLERANCE`]), so
/// the isolated subtask runs within that band of its unavoidable minimum (the group alone).
pub const HOT_KEY_ISOLATION: f64 = 0.1;

/// Whether a key group carrying `load` records/s is isolated by [`Model::isolating_parallelism`]
/// (and its operator held there) rather than sized for by the ordinary key-group search, with
/// `limit` = ρ_target·μ a subtask's rate at the target: when `load` · (1 + [`HOT_KEY_ISOLATION`])
/// exceeds `limit`, i.e. also a group up to the isolation margin *under* the limit. There
/// the ordinary search would need its subtask to carry less than `HOT_KEY_ISOLATION` × its
/// load besides it (limit − load < 0.1 · load), so it would go past the isolating
/// parallelism only to shave that remainder (up to maxParallelism for a group just under the
/// limit), while a group just over it was isolated and held: the two sides now meet. Under
/// the margin the ordinary search lets the hot subtask carry limit − load ≥ 0.1 · load besides
/// it, more than isolation does, so it never stops above the isolating parallelism for the
/// sake of the hottest group's subtask.
pub(super) fn isolates(load: f64, limit: f64) -> bool {
    load * (1.0 + HOT_KEY_ISOLATION) > limit
}

/// Hysteresis of the hot-key judgement: an operator held as a hot-key bottleneck (its hottest
/// key group already has a subtask to itself, `isolated_groups`) is released only when that
/// group's load, read at its point estimate, falls this fraction below what claims one
/// (`isolates` against ρ_target·μ·(1 − this)). 10 %, the scale-up tolerance band
/// ([`SCALE_UP_TOLERANCE`]): a group that drifts within the band around the threshold from one
/// window to the next neither claims nor releases the operator each time.
pub const HOT_KEY_RELEASE: f64 = 0.1;

/// Saturation ((busy + backpressured time) / elapsed, [`OperatorEstimate::subtask_saturation`])
/// from which a keyed subtask counts as saturated in `offered_shares`: it processed what it
/// could, not what was offered to it.
pub const SATURATED: f64 = 0.9;

/// The rates [`offered_shares`] relates a keyed operator's subtasks to, records/s.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rates {
    /// The rate the planner multiplies key-group shares by (the smaller of its targets).
    pub(super) target: f64,
    /// The steady input rate from the sources' arrival rates (traffic equations), read
    /// through the arrival scale.
    pub(super) steady: f64,
    /// The arrival scale f the window's arrivals are read through (1 without one): the
    /// operator processed what it did at f = 1, so its offered load scales by f.
    pub(super) scale: f64,
}

/// A keyed operator's subtask input shares corrected for saturated subtasks, written into
/// `out`; false (and `out` left alone) when there is nothing to correct: no key-group list
/// from the engine (the simulator's windows, which stay as they were), no input, or no
/// saturated subtask ([`SATURATED`]).
///
/// The measured shares are of the records each subtask *processed*. A saturated subtask
/// processed r_j = s_j · λ_obs records/s, less than was offered to it whenever it fell behind,
/// and its share of the processed total reads low whenever the other subtasks processed more
/// than the steady rate (catching up a backlog after a restart): the hot subtask of a job
/// isolated at p=64 read 14.4 % of the input where its group took 21.75 %. So each saturated
/// subtask gets at least f · (r_j + D · r_j / R) / λ_target, with D = max(0, λ_steady / f −
/// λ_obs) the steady load the operator did not process (it queued at the saturated subtasks,
/// the others keep up; split in proportion to what they processed, R their sum), λ_target the
/// rate the planner multiplies shares by and f the arrival scale (a forecast's, 1 without):
/// λ_target times the share is at least what the subtask processed plus its part of the
/// deficit (scaled by f), a lower bound on its offered load. The other subtasks share the rest
/// in their measured proportions. When the saturated subtasks' shares would reach 1 (all
/// saturated, say) the measured shares stand.
///
/// `input_rate`, `shares`, `sat`: the operator's [`OperatorEstimate::input_rate`],
/// [`OperatorEstimate::subtask_input_shares`] and [`OperatorEstimate::subtask_saturation`];
/// `listed`: whether its [`OperatorEstimate::subtask_key_group_shares`] is not empty.
pub(super) fn offered_shares(
    input_rate: f64,
    shares: &[f64],
    sat: &[f64],
    listed: bool,
    rates: Rates,
    out: &mut Vec<f64>,
) -> bool {
    let Rates {
        target: lambda_target,
        steady,
        scale,
    } = rates;
    if !listed
        || shares.is_empty()
        || sat.len() != shares.len()
        || !(input_rate > 0.0
            && lambda_target > 0.0
            && lambda_target.is_finite()
            && scale > 0.0
            && scale.is_finite())
    {
        return false;
    }
    let saturated = |j: usize| sat[j] >= SATURATED;
    let processed: f64 = (0..shares.len())
        .filter(|&j| saturated(j))
        .map(|j| shares[j] * input_rate)
        .sum();
    if processed.is_nan() || processed <= 0.0 {
        return false;
    }
    let deficit = (steady / scale - input_rate).max(0.0);
    out.clear();
    out.extend(shares.iter().enumerate().map(|(j, &s)| {
        if saturated(j) {
            let r = s * input_rate;
            s.max(scale * (r + deficit * r / processed) / lambda_target)
        } else {
            s
        }
    }));
    let (mut taken, mut rest) = (0.0, 0.0);
    for (j, x) in out.iter().enumerate() {
        if saturated(j) {
            taken += x;
        } else {
            rest += x;
        }
    }
    if !(taken < 1.0 && rest > 0.0) {
        return false;
    }
    let f = (1.0 - taken) / rest;
    for (j, x) in out.iter_mut().enumerate() {
        if !saturated(j) {
            *x *= f;
        }
    }
    true
}

/// The key groups that a keyed operator's window shows with a subtask to themselves: each
/// subtask's busiest listed group (point reading,
/// [`OperatorEstimate::subtask_key_group_point_shares`]) when it lies in the subtask's range
/// and the subtask carries at most [`HOT_KEY_ISOLATION`] of its load besides it (share ≥
/// 1 / (1 + that)), as [`Model::isolating_parallelism`] leaves a hot group. Empty without
/// lists.
pub(super) fn isolated_groups(point: KeyGroupLists<'_>, key_groups: u32) -> Vec<u32> {
    let p = point.len() as u32;
    let k = key_groups.max(1);
    if p == 0 || p > k {
        return Vec::new();
    }
    (0..point.len())
        .filter_map(|j| {
            let &(g, h) = point.get(j)?.first()?;
            (key_group_range(j as u32, p, k).contains(&g)
                && h * (1.0 + HOT_KEY_ISOLATION) >= 1.0 - 1e-9)
                .then_some(g)
        })
        .collect()
}

/// Whether `x` > `limit` (false when either is NaN).
pub(super) fn above(x: f64, limit: f64) -> bool {
    x > limit
}

/// Whether `x` ≥ `limit` (false when either is NaN).
pub(super) fn at_least(x: f64, limit: f64) -> bool {
    x >= limit
}

impl Model {
    /// Entries per keyed operator in `kg_loads`: the key groups (at least 1, as
    /// [`key_group_load`] returns).
    pub(super) fn kg_len(&self) -> usize {
        self.graph.key_groups.max(1) as usize
    }

    /// The prefix sums of slot `s`'s key-group loads ([`Model::kg_len`] + 1 entries).
    pub(super) fn kg_prefix_of(&self, s: usize) -> &[f64] {
        let l = self.kg_len() + 1;
        &self.kg_prefixes[s * l..(s + 1) * l]
    }

    /// Share of operator `i`'s input that its busiest subtask receives at parallelism `p`:
    /// a Kafka source's busiest subtask reads ⌈N/p⌉ of its N partitions ([`partition_share`]);
    /// keyed operators sum the key-group loads of each subtask's contiguous key-group range
    /// (so both skew and an uneven split of key groups count); other operators share one
    /// queue, 1/p.
    pub(super) fn max_share(&self, i: usize, p: u32) -> f64 {
        let p = p.max(1);
        if let Some(n) = self.partitions(i) {
            return partition_share(n, p);
        }
        let Some(s) = self.kg_slot[i] else {
            return 1.0 / f64::from(p);
        };
        let k = self.graph.key_groups;
        let q = p.min(k);
        let at = s * (k as usize + 1) + q as usize;
        let m = self.share_memo.borrow().get(at);
        if !m.is_nan() {
            return m;
        }
        let share = busiest_range_load(self.kg_prefix_of(s), q, k);
        self.share_memo.borrow_mut().set(at, share);
        share
    }

    /// Whether a lower bound on [`Model::max_share`]`(i, p)`, cheaper than it, satisfies
    /// `reached` (non-decreasing in the share: once true, true for every larger share): the
    /// exact share when it is in the memo, else for a keyed operator the largest load of the
    /// subtask ranges at `p` that overlap its hottest key-group run (each range's load is one
    /// of the terms whose maximum `max_share` is, computed the same way, so never above it;
    /// where the busiest range lies in that run, as it does under skew, it is equal). The
    /// ranges' running maximum stops as soon as it satisfies `reached`: by monotonicity the
    /// answer is that of their full maximum. Used to rule out parallelisms whose share is
    /// certainly too large without the full O(p) scan.
    pub(super) fn share_reaches(&self, i: usize, p: u32, reached: impl Fn(f64) -> bool) -> bool {
        let p = p.max(1);
        let Some(s) = self.kg_slot[i] else {
            return reached(1.0 / f64::from(p));
        };
        let k = self.graph.key_groups;
        let q = p.min(k);
        let m = self
            .share_memo
            .borrow()
            .get(s * (k as usize + 1) + q as usize);
        if !m.is_nan() {
            return reached(m);
        }
        let (a, b) = self.hot_run[i];
        reached(busiest_range_load_over_until(
            self.kg_prefix_of(s),
            q,
            k,
            a,
            b,
            &reached,
        ))
    }

    /// Keyed operator `i`: the smallest parallelism from `from` (the DS2 value, a lower bound
    /// since max_share(p) ≥ 1/p) up to the number of key groups whose busiest subtask stays at
    /// or under the target utilization (it may exceed the operator's max: the caller clamps
    /// and reports), then lowered to the smallest parallelism with the same busiest-subtask
    /// share (key-group alignment: with K key groups in contiguous ranges, p and
    /// ⌈K / ⌈K/p⌉⌉ give every subtask at most ⌈K/p⌉ groups, so extra subtasks would add
    /// nothing). When one key group alone exceeds a subtask's capacity at the target, or comes
    /// within the isolation margin under it ([`isolates`]), no parallelism brings its subtask
    /// under the target, or only by shaving the little it carries besides the group: the
    /// operator is sized by
    /// [`Model::isolating_parallelism`] instead (the smallest parallelism at which every other
    /// subtask fits at the target and the hot group's subtask carries almost nothing else), held
    /// there (not scaled further for utilization) and reported as a hot-key bottleneck, saying
    /// when the group even exceeds a subtask's full capacity μ: then the job cannot keep up at
    /// any parallelism, the operator takes at most μ / (the group's share of its input), and the
    /// other subtasks are sized for that rate (a backlog's drain rate above it would otherwise
    /// ask for subtasks that cannot raise what the operator takes).
    pub(super) fn size_keyed(
        &self,
        i: usize,
        from: u32,
        mu: f64,
        explain: bool,
        why: &mut String,
        reasons: &mut Vec<String>,
    ) -> u32 {
        let lambda = self.lambda_target[i];
        let cap = self.s.rho * mu;
        let hottest = self.hottest[i];
        if self.hot_key_at(i, mu) {
            // A group above even a subtask's full μ caps what the operator takes at μ / its share
            // (its subtask saturates and backpressure holds the input there): the other
            // subtasks need to fit only that rate, not the target rate it cannot reach.
            let hot = lambda * hottest;
            let over = hot > mu * (1.0 + CEIL_SLACK);
            let taken = if over { mu / hottest } else { lambda };
            let (p, group, other) = self.isolating_parallelism(i, taken, cap * (1.0 + CEIL_SLACK));
            if !explain {
                return p;
            }
            // Rates to 4 significant digits at least, so that the group's load and a subtask's
            // rate at the target read differently when they are close.
            let rate = |x: f64| {
                let d = match x.abs() {
                    a if a >= 1000.0 => 0,
                    a if a >= 100.0 => 1,
                    a if a >= 10.0 => 2,
                    _ => 3,
                };
                format!("{x:.d$}")
            };
            let compared = if hot > cap {
                format!(
                    "more than one subtask's {} rec/s at ρ {:.2}",
                    rate(cap),
                    self.s.rho
                )
            } else if isolates(hot, cap * (1.0 + CEIL_SLACK)) {
                format!(
                    "within {:.0}% under one subtask's {} rec/s at ρ {:.2}",
                    HOT_KEY_ISOLATION * 100.0,
                    rate(cap),
                    self.s.rho
                )
            } else {
                // Held (`hot_held`) within the release band.
                format!(
                    "under one subtask's {} rec/s at ρ {:.2} but it has a subtask to itself, released only under {} rec/s",
                    rate(cap),
                    self.s.rho,
                    rate(cap * (1.0 - HOT_KEY_RELEASE) / (1.0 + HOT_KEY_ISOLATION))
                )
            };
            let cannot = if hot > cap {
                "more parallelism cannot bring it under the target"
            } else {
                "more parallelism would only shave what its subtask carries besides it"
            };
            let isolated = if p == 1 {
                format!(
                    "p=1 isolates it (the one subtask carries {:.1}% of the input besides it)",
                    other * 100.0
                )
            } else {
                format!(
                    "p={p} isolates it (its subtask carries {:.1}% of the input besides it, every other subtask within the target)",
                    other * 100.0
                )
            };
            reasons.push(format!(
                "{}: hot-key bottleneck: key group {group} takes {:.1}% of {} rec/s ({} rec/s), {compared}{}; {cannot}: {isolated}, holds there",
                self.name(i),
                hottest * 100.0,
                fmt_rate(lambda),
                rate(hot),
                if over {
                    format!(
                        ", even more than its full capacity μ {} rec/s: the operator cannot keep up at any parallelism (it takes at most {} rec/s{})",
                        fmt_rate(mu),
                        fmt_rate(taken),
                        if p > 1 {
                            ", the rate the other subtasks are sized for"
                        } else {
                            ""
                        }
                    )
                } else {
                    String::new()
                },
            ));
            let _ = write!(
                why,
                "; hot key group {group}: p={p} isolates it, holds there"
            );
            return p;
        }
        let lambda = self.lambda_size(i);
        let limit = cap * (1.0 + CEIL_SLACK);
        // (A share whose lower bound already misses the limit misses it: λ ≥ 0 and the
        // product is monotone in the share.)
        let fits = |p: u32| {
            !(lambda >= 0.0 && self.share_reaches(i, p, |v| lambda * v > limit))
                && lambda * self.max_share(i, p) <= limit
        };
        let start = from.clamp(1, self.graph.key_groups);
        // Every parallelism from an earlier search's start up to where it stopped failed there
        // at λ ≤ this λ and the same limit, so it fails here too (λ · share is monotone in λ,
        // the share ≥ 0): this search starts where that one stopped (the same answer).
        let known = self.keyed_searches.borrow()[i];
        let mut p = match known {
            Some(k) if k.reaches(lambda, limit, start) => start.max(k.stopped),
            _ => start,
        };
        while p < self.graph.key_groups && !fits(p) {
            p += 1;
        }
        if lambda >= 0.0 {
            self.keyed_searches.borrow_mut()[i] = Some(KeyedSearch {
                lambda,
                limit,
                start,
                stopped: p,
            });
        }
        if !fits(p) {
            // Even one key group per subtask is too much: more than the key groups are needed.
            return self.graph.key_groups.saturating_add(1).max(from);
        }
        let share = self.max_share(i, p);
        let same = share * (1.0 + 1e-12);
        while p > 1
            && !self.share_reaches(i, p - 1, |v| above(v, same))
            && self.max_share(i, p - 1) <= same
        {
            p -= 1;
        }
        if explain && p != from {
            cat!(why;
                "; key groups: the busiest subtask takes ", Fixed(share * 100.0, 1),
                "% of the input at p=", p, " → p=", p
            );
        }
        p
    }

    /// Whether keyed operator `i` is a hot-key bottleneck at parallelism `p`'s μ (the learned
    /// scalability factor applied above the current parallelism, as in the sizing): its
    /// busiest key group holds at least [`HOT_KEY_GROUP_FACTOR`] times the mean load and, at
    /// the target rate, more than one subtask takes at the target utilization (ρ_target·μ) or
    /// comes within the isolation margin under it ([`isolates`]), the condition under which [`Model::size_keyed`] sizes it by
    /// [`Model::isolating_parallelism`].
    pub(super) fn hot_key_bottleneck(&self, i: usize, p: u32) -> bool {
        self.kg_slot[i].is_some() && self.mu_at(i, p).is_some_and(|mu| self.hot_key_at(i, mu))
    }

    /// The hot-key rule of keyed operator `i` at service rate `mu` (records/s per subtask), the
    /// one test [`Model::size_keyed`] and [`Model::hot_key_bottleneck`] share: its hottest key
    /// group has at least [`HOT_KEY_GROUP_FACTOR`] times the mean load (the estimate spreads
    /// each subtask's load over its range, so uneven ranges alone differ by far less) and that
    /// group's load at the target rate is too much for one subtask at ρ_target·μ, or within
    /// the isolation margin under it ([`isolates`]).
    /// An operator held as a hot-key bottleneck ([`Model::hot_limit`]) stays one until its
    /// group falls under the [`HOT_KEY_RELEASE`] band below that limit.
    pub(super) fn hot_key_at(&self, i: usize, mu: f64) -> bool {
        let hottest = self.hottest[i];
        hottest * f64::from(self.graph.key_groups) >= HOT_KEY_GROUP_FACTOR
            && isolates(
                self.lambda_target[i] * hottest,
                self.hot_limit(i, self.s.rho * mu * (1.0 + CEIL_SLACK)),
            )
    }

    /// The limit [`isolates`] judges operator `i`'s hottest key group against, given a
    /// subtask's rate at the target `limit` (records/s): `limit` to claim a hot key, and
    /// `limit` · (1 − [`HOT_KEY_RELEASE`]) for an operator the window shows held as a hot-key
    /// bottleneck (`hot_held`): the hysteresis that keeps one noisy window from releasing it.
    pub(super) fn hot_limit(&self, i: usize, limit: f64) -> f64 {
        if self.hot_held[i] {
            limit * (1.0 - HOT_KEY_RELEASE)
        } else {
            limit
        }
    }

    /// Keyed operator `i` with key groups too hot for one subtask at the target (`hot` = those
    /// whose load λ·load exceeds `limit`, ρ_target·μ, or comes within the isolation margin
    /// under it, [`isolates`]): the smallest parallelism p at which every
    /// subtask range (Flink's contiguous assignment, [`key_group_range`]) either holds no hot
    /// group and fits, λ·load ≤ `limit`, or holds exactly one hot group and besides it at most
    /// [`HOT_KEY_ISOLATION`] times that group's load ("almost nothing else": what is left is
    /// the unavoidable hot group itself). More subtasks cannot lower the hot subtask below its
    /// group's load, and any fewer leave another subtask over the target or load the hot one
    /// further, so this is where the operator is held. Such a p exists: at p = K each range is
    /// one key group, a hot one alone or a cool one that fits by definition. Returns p, the
    /// hottest group and the load its subtask carries besides it at p (share of the input).
    /// `lambda` is the operator's input rate, records/s ([`Model::size_keyed`] passes the
    /// target rate, or the μ / share its hottest group lets through when that is less). The
    /// search starts at a lower bound (the hot groups need a subtask each, and the others'
    /// subtasks carry the rest at `limit`) and checks each p in O(p), stopping at the first: O(p²)
    /// range sums in all, p usually a few dozen (at worst K² / 2, when only single-group ranges
    /// separate the hot groups).
    pub(super) fn isolating_parallelism(
        &self,
        i: usize,
        lambda: f64,
        limit: f64,
    ) -> (u32, u32, f64) {
        let k = self.graph.key_groups.max(1);
        let Some(s) = self.kg_slot[i] else {
            return (self.est[i].parallelism, 0, 0.0);
        };
        let load = &self.kg_loads[s * self.kg_len()..(s + 1) * self.kg_len()];
        let prefix = self.kg_prefix_of(s);
        let hottest = self.hot_run[i].0;
        let hottest_limit = self.hot_limit(i, limit);
        let hot: Vec<u32> = (0..k)
            .filter(|&g| {
                let l = if g == hottest { hottest_limit } else { limit };
                isolates(lambda * load[g as usize], l)
            })
            .collect();
        let hot_sum: f64 = hot.iter().map(|&g| load[g as usize]).sum();
        let rest = lambda * (1.0 - (1.0 + HOT_KEY_ISOLATION) * hot_sum);
        let lower = if limit > 0.0 && rest > 0.0 {
            (rest / limit).floor().min(f64::from(k))
        } else {
            0.0
        };
        let start = (hot.len() as u32).saturating_add(lower as u32).clamp(1, k);
        // Whether every range at q isolates or fits; the hottest group's extra load on the way.
        let check = |q: u32| -> Option<f64> {
            let mut h = hot.iter().peekable();
            let mut extra = 0.0;
            for j in 0..q {
                let r = key_group_range(j, q, k);
                let range_load = prefix[r.end as usize] - prefix[r.start as usize];
                let mut in_range = None;
                while let Some(&&g) = h.peek() {
                    if g >= r.end {
                        break;
                    }
                    if in_range.is_some() {
                        return None;
                    }
                    in_range = Some(g);
                    h.next();
                }
                match in_range {
                    None if lambda * range_load > limit => return None,
                    None => {}
                    Some(g) => {
                        let own = load[g as usize];
                        let besides = (range_load - own).max(0.0);
                        if besides > HOT_KEY_ISOLATION * own * (1.0 + 1e-9) {
                            return None;
                        }
                        if g == hottest {
                            extra = besides;
                        }
                    }
                }
            }
            Some(extra)
        };
        for q in start..=k {
            if let Some(extra) = check(q) {
                return (q, hottest, extra);
            }
        }
        (k, hottest, 0.0)
    }

    /// The next parallelism above `p` worth trying for operator `i` in the latency allocation,
    /// within its max ([`Model::step_max`]): `p + 1`, or for a keyed operator the smallest higher parallelism that
    /// lowers its busiest subtask's share (adding subtasks that leave ⌈K/p⌉ unchanged cuts no
    /// latency, which would break the convexity the greedy allocation relies on). `None` for a
    /// keyed operator held as a hot-key bottleneck ([`Model::hot_key_bottleneck`]): sized to
    /// isolate its hot key group, it is not scaled further, for latency either (more subtasks
    /// would only shave the little its hot subtask carries besides that group).
    pub(super) fn next_parallelism(&self, i: usize, p: u32) -> Option<u32> {
        let hi = self.step_max(i);
        if self.kg_slot[i].is_none() {
            return (p < hi).then_some(p + 1);
        }
        if self.hot_key_bottleneck(i, p.saturating_add(1)) {
            return None;
        }
        let lower = self.max_share(i, p) * (1.0 - 1e-12);
        (p + 1..=hi.min(self.graph.key_groups)).find(|&q| {
            !self.share_reaches(i, q, |v| at_least(v, lower)) && self.max_share(i, q) < lower
        })
    }

    /// Whether the latency allocation leaves operator `i` at `p` although it is below its max
    /// ([`Model::next_parallelism`] offers no higher parallelism: a hot-key bottleneck, or a
    /// keyed operator whose busiest subtask's share no higher parallelism lowers).
    pub(super) fn held_for_latency(&self, i: usize, p: u32) -> bool {
        p < self.step_max(i) && self.next_parallelism(i, p).is_none()
    }
}
