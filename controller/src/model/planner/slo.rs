//! One plan at the targets in use: the sizing, then the latency SLO on the slowest path's
//! percentile bound (attainable at maximum parallelism, or best effort), the latency
//! allocation ([`super::allocate`]) and what its outcome adds to the reasons.

use super::*;

/// A latency-allocation step is negligible, and not taken, when it cuts the slowest path's
/// bound by less than this fraction of the SLO per subtask added (0.1 ms at a 1 s SLO: at that
/// rate 100 subtasks would cut 1 % of the SLO). Without it the greedy gave a 2 M rec/s sink
/// 127 subtasks for nanoseconds each while a held hot-key operator kept the bound over the SLO.
pub const NEGLIGIBLE_CUT: f64 = 1e-4;

/// With `autoscaler.onUnattainableSlo: bestEffort`, an SLO unattainable even at maximum
/// parallelism (the slowest path's bound there is L_max > SLO) is replaced, for the latency
/// allocation, by the bound (1 + this) · L_max: subtasks are added while they cut the
/// bound toward the lowest the limits allow, and stop within 10 % of it, where each further
/// subtask buys little (a path's queueing terms fall off exponentially in the spare capacity
/// cμ − λ, the M/M/c waiting-time tail, so the last 10 % would take most of the subtasks).
pub const BEST_EFFORT_MARGIN: f64 = 0.1;

impl Model {
    /// One plan at the targets in use. With `hold_only` (called only when the sizing keeps
    /// every operator at or below its current parallelism, see [`Model::plan`]), `None` as
    /// soon as it is known that the plan changes some operator's parallelism (the latency
    /// allocation raising one above it: it never lowers one again), and otherwise the decision
    /// only if it keeps every operator's parallelism.
    pub(super) fn plan_once(&self, hold_only: bool, free: Option<&[u32]>) -> Option<Decision> {
        let n = self.graph.topo.len();
        let mut p = vec![1u32; n];
        let mut clamped = vec![false; n];
        let mut why = vec![String::new(); n];
        let mut reasons = Vec::new();
        self.size(true, free, &mut p, &mut clamped, &mut why, &mut reasons);

        // 2. Greedy marginal allocation for the latency SLO (on the percentile bound of the
        // slowest path) at the steady rates. Operators flagged for ineffective scaling count 0
        // here: nothing else is scaled for them.
        let w: Vec<f64> = (0..n)
            .map(|i| {
                if self.frozen[i] {
                    0.0
                } else {
                    self.tail(i, p[i])
                }
            })
            .collect();
        let (mut dist, mut via) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut lat, end) = self.graph.longest_path_into(&w, &mut dist, &mut via);
        let adjustable = |i: usize| self.mu(i).is_some() && !self.frozen[i];
        if lat > self.s.slo {
            // Attainable at maximum parallelism? Upper bounds on the tails first (the
            // longest path is monotone in its terms): when they meet the SLO so do the exact
            // tails, which are then not needed. Operators the allocation cannot scale further
            // (`next_parallelism` refuses: a hot-key bottleneck held where it isolates its hot
            // group) count at their sized parallelism, where the allocation leaves them.
            let held: Vec<bool> = (0..n)
                .map(|i| adjustable(i) && self.held_for_latency(i, p[i]))
                .collect();
            let mut w_max: Vec<f64> = (0..n)
                .map(|i| {
                    if adjustable(i) && !held[i] {
                        self.tail_upper(i, self.graph.bounds[i].1.max(p[i]))
                    } else {
                        w[i]
                    }
                })
                .collect();
            let (mut max_dist, mut max_via) = (Vec::new(), Vec::new());
            let (mut lat_max, mut max_end) =
                self.graph
                    .longest_path_into(&w_max, &mut max_dist, &mut max_via);
            // (NaN included: then the exact tails decide, as before.)
            if lat_max.is_nan() || lat_max > self.s.slo {
                for (i, x) in w_max.iter_mut().enumerate() {
                    if adjustable(i) && !held[i] {
                        *x = self.tail(i, self.graph.bounds[i].1.max(p[i]));
                    }
                }
                (lat_max, max_end) =
                    self.graph
                        .topo
                        .longest_path_into(&w_max, &mut max_dist, &mut max_via);
            }
            // The bound the allocation works down to: the SLO, or with an unattainable one
            // the best-effort bound (`None`: no subtasks added for latency).
            let target = if lat_max > self.s.slo {
                let best_effort = self
                    .s
                    .best_effort
                    .then_some(lat_max * (1.0 + BEST_EFFORT_MARGIN));
                let mut why = format!(
                    "latency SLO {} s unattainable: even at maximum parallelism the {} bound is {:.4} s{}",
                    self.s.slo,
                    self.percentile_label(),
                    lat_max,
                    self.held_on_path(&p, &w, &held, &max_via, max_end)
                );
                match best_effort {
                    Some(t) => {
                        let _ = write!(
                            why,
                            "; best effort (onUnattainableSlo: bestEffort): the latency allocation aims at {t:.4} s instead, within {:.0} % of that bound",
                            100.0 * BEST_EFFORT_MARGIN
                        );
                    }
                    None => why.push_str("; no subtasks added for latency"),
                }
                // What parallelism cannot shorten: event-time windows' watermark delays (a
                // window's period is not latency: its results count from the window's end).
                if let Some((i, w)) = (0..n)
                    .map(|i| (i, self.window_wait(i)))
                    .filter(|&(_, w)| w > 0.0)
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                {
                    let _ = write!(
                        why,
                        " ({} waits {w:.4} s beyond its windows' ends for the watermark, which no parallelism shortens)",
                        self.name(i)
                    );
                }
                reasons.push(why);
                best_effort
            } else {
                Some(self.s.slo)
            };
            // Best effort follows the load more finely than the sizing does (its target moves
            // with every window's rates): a best-effort allocation that would raise an operator
            // above its current parallelism is not taken while the current parallelism has at
            // least the sizing everywhere and its bound is within the scale-up tolerance above
            // the best-effort bound (the current parallelism holds instead).
            let hold_at = match target {
                Some(t) if t > self.s.slo => self.best_effort_hold(&p, &w, &held, t),
                _ => None,
            };
            if let Some(target) = target.filter(|&t| lat > t) {
                let before = lat;
                let mut st = LatencyState {
                    target,
                    p,
                    w,
                    dist,
                    via,
                    lat,
                    end,
                    added: vec![0u32; n],
                };
                let outcome = self.allocate_latency(&mut st, hold_only);
                let grows =
                    outcome == Allocated::Grew || (0..n).any(|i| st.p[i] > self.est[i].parallelism);
                if let Some(bound) = hold_at.filter(|_| grows) {
                    reasons.push(format!(
                        "best effort: the current parallelism's {} bound {:.4} s is within {:.0} % above the best-effort bound {target:.4} s; held",
                        self.percentile_label(),
                        bound,
                        100.0 * SCALE_UP_TOLERANCE
                    ));
                    p = st.p;
                    for (i, x) in p.iter_mut().enumerate() {
                        let cur = self.est[i].parallelism;
                        if *x != cur {
                            cat!(&mut why[i]; "; held at the current p=", cur, " (best effort within its band)");
                            *x = cur;
                        }
                    }
                    return Some(self.decision(&p, &clamped, why, reasons));
                }
                let added = st.added;
                (p, lat) = (st.p, st.lat);
                match outcome {
                    Allocated::Grew => return None,
                    Allocated::Stuck => {
                        let held: Vec<bool> = (0..n)
                            .map(|i| adjustable(i) && self.held_for_latency(i, p[i]))
                            .collect();
                        reasons.push(format!(
                            "{}: no subtask on the slowest path cuts its {} bound {:.4} s by {:.2e} s or more (a negligible cut, under {:.0e} of the SLO, adds none){}",
                            if target > self.s.slo {
                                format!("best-effort bound {target:.4} s not reached")
                            } else {
                                format!("latency SLO {} s unattainable", self.s.slo)
                            },
                            self.percentile_label(),
                            lat,
                            NEGLIGIBLE_CUT * self.s.slo,
                            NEGLIGIBLE_CUT,
                            self.held_on_path(&p, &st.w, &held, &st.via, st.end)
                        ));
                    }
                    Allocated::Met => {}
                }
                let mut list = String::new();
                for i in (0..n).filter(|&i| added[i] > 0) {
                    if !list.is_empty() {
                        list.push_str(", ");
                    }
                    cat!(&mut list; self.name(i), " +", added[i]);
                }
                let best_effort = target > self.s.slo;
                if !list.is_empty() {
                    let over = if best_effort {
                        format!("best-effort bound {target:.4} s")
                    } else {
                        format!("SLO {} s", self.s.slo)
                    };
                    reasons.push(format!(
                        "latency: {} bound {:.4} s at utilization-sized parallelism exceeds the {over}; greedy marginal allocation added {} → {:.4} s",
                        self.percentile_label(),
                        before,
                        list,
                        lat
                    ));
                }
                for i in 0..n {
                    if added[i] > 0 {
                        cat!(&mut why[i];
                            "; +", added[i],
                            if best_effort {
                                " for latency, best effort (greedy marginal allocation) → p="
                            } else {
                                " for the latency SLO (greedy marginal allocation) → p="
                            },
                            p[i]
                        );
                        if let Some(cs) = self.measured_cs(i) {
                            let _ = write!(why[i], " (measured service cs {cs:.2})");
                        }
                    }
                }
            }
        }
        if hold_only && (0..n).any(|i| p[i] != self.est[i].parallelism) {
            return None;
        }
        Some(self.decision(&p, &clamped, why, reasons))
    }

    /// For best effort at the bound `target` (seconds): the slowest path's bound at the
    /// current parallelism when it can hold, i.e. every operator's current parallelism is at
    /// least its sized one `p` (operators the allocation leaves alone — μ unknown, flagged for
    /// ineffective scaling, or `held` hot-key operators — at exactly it), within its bounds, and
    /// the bound is at most target · (1 + [`SCALE_UP_TOLERANCE`]); `None` otherwise. `w` holds
    /// the terms at `p`.
    pub(super) fn best_effort_hold(
        &self,
        p: &[u32],
        w: &[f64],
        held: &[bool],
        target: f64,
    ) -> Option<f64> {
        let n = p.len();
        let mut cur_w = Vec::with_capacity(n);
        for i in 0..n {
            let cur = self.est[i].parallelism;
            let (lo, hi) = self.graph.bounds[i];
            let fixed = !self.adjustable(i) || held[i] || self.graph.topo.is_source[i];
            if cur < p[i] || (fixed && cur != p[i]) || !(lo..=hi).contains(&cur) {
                return None;
            }
            cur_w.push(if cur == p[i] { w[i] } else { self.tail(i, cur) });
        }
        let (mut dist, mut via) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (bound, _) = self.graph.longest_path_into(&cur_w, &mut dist, &mut via);
        (bound <= target * (1.0 + SCALE_UP_TOLERANCE)).then_some(bound)
    }
}
