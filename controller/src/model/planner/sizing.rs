//! Step 1 of a plan, DS2 sizing at the target utilization (Kalavri et al., OSDI 2018 §3):
//! each operator's parallelism for its target rate, with the scale-up tolerance band, learned
//! scalability, Kafka sources' partition alignment and the limit upstream of a bottleneck.

use super::*;

/// Relative slack when rounding λ/(ρμ) up, so that 2.0000000001 from float noise is 2.
pub(super) const CEIL_SLACK: f64 = 1e-9;

/// The share of a Kafka source's input its busiest subtask reads at `p` subtasks over `n`
/// partitions (n ≥ 1): Flink's `KafkaSource` deals the partitions round-robin, so the busiest
/// subtask reads ⌈n/min(p, n)⌉ of them, ⌈n/p⌉ / n of the input with partitions equally loaded.
pub(crate) fn partition_share(n: u32, p: u32) -> f64 {
    let n = n.max(1);
    let q = p.clamp(1, n);
    f64::from(n.div_ceil(q)) / f64::from(n)
}

/// The smallest parallelism with the same busiest-subtask share as `p` over `n` partitions:
/// ⌈n / ⌈n/p⌉⌉ (the key-group rule of [`Model::size_keyed`], for partitions): 3 for 4 or 5
/// over 6 partitions, never above n. 0 stays 0.
pub(crate) fn align_to_partitions(n: u32, p: u32) -> u32 {
    if p == 0 || n == 0 {
        return p;
    }
    let q = p.min(n);
    n.div_ceil(n.div_ceil(q))
}

/// Scale-up tolerance band, relative to the target utilization ρ_target: an operator whose
/// busiest subtask would run at ρ ≤ ρ_target · (1 + this) at its current parallelism (and the
/// target rate, backlog drain included) is not scaled up by the utilization sizing; the target
/// is then a sizing target, and the trigger for a scale-up is ρ above the band or the latency
/// SLO at risk (the greedy latency allocation still adds subtasks when the tail bound exceeds
/// the SLO). The value is the Kubernetes HPA's default tolerance (0.1, the
/// `--horizontal-pod-autoscaler-tolerance` flag), so a job sized by both rules flaps no more
/// than under HPA. Scale-downs are not affected.
pub const SCALE_UP_TOLERANCE: f64 = 0.1;

/// The largest parallelism a scale-up from `cur` subtasks may probe in one step for an
/// operator with learned scalability factor `f` (see [`super::learn`]): unbounded for
/// scaling within [`SCALE_UP_TOLERANCE`] of linear (f > 0.9: the prior f = 1 included, DS2's
/// one-step sizing; a factor of 0.98 from one noisy rescale is no evidence against linear
/// scaling), else ⌈cur / (1 − f)⌉. The factor is how far the linear model was off on the last
/// rescales: the further it is below 1, the less an extrapolation to many more subtasks is
/// worth (capacity that stops growing, shared CPU), so the step is smaller and the next
/// window measures it before the next step (f = 0.9: up to 10×; 0.8: 5×; 0.5: 2×; the
/// smallest factor kept, 0.25: 1.33×).
pub(super) fn probe_limit(cur: u32, f: f64) -> u32 {
    if f.is_nan() || f <= 0.0 || f > 1.0 - SCALE_UP_TOLERANCE {
        return u32::MAX;
    }
    let x = f64::from(cur.max(1)) / (1.0 - f);
    let r = (x - CEIL_SLACK * x).ceil();
    if r >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        (r as u32).max(cur.saturating_add(1))
    }
}

impl Model {
    /// ρ of operator `i` at its current parallelism `cur` when `cur` lies in `bounds` and that ρ
    /// is within the scale-up tolerance of `rho_t` (at most `rho_t` × (1 + [`SCALE_UP_TOLERANCE`]),
    /// below 1): a scale-up that small is not made.
    pub(super) fn tolerated_rho(
        &self,
        i: usize,
        cur: u32,
        bounds: std::ops::RangeInclusive<u32>,
        rho_t: f64,
    ) -> Option<f64> {
        if !bounds.contains(&cur) {
            return None;
        }
        self.sizing_rho(i, cur)
            .filter(|&rho| rho <= (rho_t * (1.0 + SCALE_UP_TOLERANCE)).min(1.0 - CEIL_SLACK))
    }

    /// The most subtasks operator `i` may have: its max, and for a Kafka source at most its
    /// partition count (more would idle).
    pub(super) fn upper_bound(&self, i: usize) -> u32 {
        let hi = self.graph.bounds[i].1;
        self.partitions(i).map_or(hi, |n| hi.min(n))
    }

    /// Kafka source `i` (N partitions, μ per subtask known) sized as DS2 sizes an operator,
    /// with partition alignment, the key-group rule of [`Model::size_keyed`] for partitions:
    /// the smallest p ≤ N whose busiest subtask, reading ⌈N/p⌉ partitions, stays at or under
    /// ρ_target at the source's target rate, then lowered to the smallest p with the same
    /// ⌈N/p⌉ (a divisor-like p: 3 rather than 4 or 5 for 6 partitions). Returns the needed
    /// parallelism before the bounds (N + 1 when even one partition per subtask is too much)
    /// and the text of its sizing.
    pub(super) fn size_source(&self, i: usize, n: u32, mu: f64) -> (u32, String) {
        let lambda = self.lambda_size(i);
        let limit = self.s.rho * mu * (1.0 + CEIL_SLACK);
        let fits = |p: u32| lambda * partition_share(n, p) <= limit;
        let Some(p) = (1..=n).find(|&p| fits(p)) else {
            let why = format!(
                "source with {n} partitions: λ_target {} rec/s needs more than one partition per subtask at ρ_target {} × μ {} rec/s → p={} (more than its partitions)",
                fmt_rate(lambda),
                Fixed(self.s.rho, 2),
                fmt_rate(mu),
                n + 1
            );
            return (n.saturating_add(1), why);
        };
        let aligned = align_to_partitions(n, p);
        let why = format!(
            "source with {n} partitions: λ_target {} rec/s, busiest subtask reads ⌈{n}/p⌉ of them, ρ_target {} × μ {} rec/s → p={aligned}",
            fmt_rate(lambda),
            Fixed(self.s.rho, 2),
            fmt_rate(mu)
        );
        (aligned, why)
    }

    /// The largest parallelism operator `i` may take in this decision: its max, and for an
    /// operator with learned sub-linear scaling the probe step's limit ([`probe_limit`]).
    pub(super) fn step_max(&self, i: usize) -> u32 {
        self.graph.bounds[i]
            .1
            .min(probe_limit(self.est[i].parallelism, self.factor[i]))
    }

    /// Step 1 of a plan: the sources' reasons and DS2 sizing at the target utilization into
    /// `p` (with `clamped`, each operator's `why` and the job-wide `reasons`). With `explain`
    /// false no text is written (the parallelism is the same). `free`: the sizing without the
    /// rescale's downtime backlog, when these targets include it (see [`Model::plan`]).
    pub(super) fn size(
        &self,
        explain: bool,
        free: Option<&[u32]>,
        p: &mut [u32],
        clamped: &mut [bool],
        why: &mut [String],
        reasons: &mut Vec<String>,
    ) {
        let n = self.graph.topo.len();
        let rho_t = self.s.rho;

        for i in (0..n).filter(|_| explain) {
            let e = &self.est[i];
            if let Some(src) = e.source {
                let downtime = if self.with_downtime && self.s.downtime > 0.0 {
                    format!(
                        " + {} records from the rescale's {} s downtime",
                        Fixed(src.arrival_rate * self.s.downtime, 0),
                        Fixed(self.s.downtime, 2)
                    )
                } else {
                    String::new()
                };
                reasons.push(format!(
                    "source {}: arrival rate γ={} rec/s, backlog {} records{downtime} → target rate {} rec/s (drains the backlog within {} s)",
                    self.name(i),
                    fmt_rate(src.arrival_rate),
                    Fixed(src.backlog_records, 0),
                    fmt_rate(self.gamma_target[i]),
                    Short(self.s.catch_up)
                ));
            }
            if e.parallelism != self.spec_parallelism[i] {
                reasons.push(format!(
                    "{}: the job spec says parallelism {} but {} subtasks report metrics; planning from the running {}",
                    self.name(i),
                    self.spec_parallelism[i],
                    e.parallelism,
                    e.parallelism
                ));
            }
            self.output_reason(i, reasons);
            if !self.graph.topo.is_source[i] && e.selectivity_is_prior {
                reasons.push(format!(
                    "{}: no input in the window; selectivity prior 1.0 assumed",
                    self.name(i)
                ));
            }
        }

        // 1. DS2 sizing at the target utilization.
        for i in 0..n {
            let cur = self.est[i].parallelism;
            let (lo, hi) = self.graph.bounds[i];
            if self.graph.topo.is_source[i] {
                let (Some(n), Some(mu)) = (self.partitions(i), self.source_mu(i)) else {
                    p[i] = cur;
                    if explain {
                        why[i] = format!("source: not rescaled, keeps p={cur}");
                    }
                    continue;
                };
                let hi = self.upper_bound(i);
                let lo = lo.min(hi);
                let (mut need, text) = self.size_source(i, n, mu);
                if explain {
                    why[i] = text;
                }
                if need > cur
                    && let Some(rho_cur) = self.tolerated_rho(i, cur, lo..=hi, rho_t)
                {
                    if explain {
                        cat!(&mut why[i];
                            "; ρ=", Fixed(rho_cur, 3), " at the current p=", cur,
                            " is within the scale-up tolerance: keeps p=", cur
                        );
                    }
                    need = cur;
                }
                // Within the bounds, and aligned again there (a max of 4 over 6 partitions
                // gives 3: a fourth subtask would take no partition off the busiest).
                p[i] = align_to_partitions(n, need.clamp(lo, hi)).max(lo);
                if need > hi {
                    clamped[i] = true;
                    if explain {
                        let rho = self.predicted_rho(i, p[i]).unwrap_or(f64::INFINITY);
                        let _ = write!(why[i], "; at its limit p={}: predicted ρ={rho:.2}", p[i]);
                        let limit = if hi == n && self.graph.bounds[i].1 >= n {
                            format!("its topic has {n} partitions")
                        } else {
                            format!("its max is {hi}")
                        };
                        reasons.push(format!(
                            "{}: needs p={need} for ρ ≤ {rho_t:.2} but {limit}; predicted ρ={rho:.2}{}",
                            self.name(i),
                            if rho >= 1.0 {
                                " (unstable: backlog will grow)"
                            } else {
                                ""
                            }
                        ));
                    }
                }
                continue;
            }
            let Some(mu) = self.mu(i) else {
                if let Some(w) = self.flow.silent_from[i].filter(|_| self.flow.unknown[i]) {
                    p[i] = cur.clamp(lo, hi);
                    if explain {
                        why[i] = self.silent_why(w, p[i]);
                    }
                    continue;
                }
                if self.lambda_target[i] <= 0.0 && self.lambda_steady[i] <= 0.0 {
                    // No input at all (a pause in the stream): μ cannot be measured, but DS2
                    // needs no subtask for λ = 0, so the operator goes to its minimum.
                    p[i] = lo.max(1).min(hi);
                    if explain {
                        why[i] = format!(
                            "no input in the window (λ_target 0 rec/s): DS2 needs no capacity → p={} (minimum)",
                            p[i]
                        );
                    }
                    continue;
                }
                p[i] = cur.clamp(lo, hi);
                if !explain {
                    continue;
                }
                why[i] = format!(
                    "true processing rate unknown (no measurable busy time in the window): keeps p={}",
                    p[i]
                );
                if p[i] != cur {
                    let _ = write!(why[i], " (current {cur} moved into bounds [{lo}, {hi}])");
                }
                reasons.push(format!(
                    "{}: true processing rate unknown; parallelism kept at {} and its sojourn left out of the latency prediction",
                    self.name(i),
                    p[i]
                ));
                continue;
            };
            let lambda = self.lambda_size(i);
            let x = lambda / (rho_t * mu);
            let need = if x.is_finite() {
                (x - CEIL_SLACK * x.max(1.0)).ceil().max(1.0)
            } else {
                f64::MAX
            };
            let mut need_u = if need >= f64::from(u32::MAX) {
                u32::MAX
            } else {
                need as u32
            };
            if explain {
                // Room for the clauses appended below in one allocation.
                why[i] = String::with_capacity(256);
                let (steady, target) = (self.lambda_steady[i], self.lambda_target[i]);
                if rho_t * target > steady {
                    // The backlog's drain decides: the target rate on full capacity.
                    cat!(&mut why[i];
                        "DS2: λ_target ", fmt_rate(target), " rec/s draining the backlog on full capacity / μ ",
                        fmt_rate(mu), " rec/s = ", Fixed(x, 2), " → p=", need_u,
                        " (λ ", fmt_rate(steady), " rec/s at ρ_target ", Fixed(rho_t, 2), " needs less)"
                    );
                } else if target > steady * (1.0 + CEIL_SLACK) {
                    // The steady rate decides; the drain fits the headroom.
                    cat!(&mut why[i];
                        "DS2: λ ", fmt_rate(steady), " rec/s / (ρ_target ", Fixed(rho_t, 2),
                        " × μ ", fmt_rate(mu), " rec/s) = ", Fixed(x, 2), " → p=", need_u,
                        " (the backlog drains in the headroom: λ_target ", fmt_rate(target),
                        " rec/s on full capacity)"
                    );
                } else {
                    cat!(&mut why[i];
                        "DS2: λ_target ", fmt_rate(lambda), " rec/s / (ρ_target ", Fixed(rho_t, 2),
                        " × μ ", fmt_rate(mu), " rec/s) = ", Fixed(x, 2), " → p=", need_u
                    );
                }
            }
            // Above the current parallelism μ is corrected by the learned scalability factor.
            let mut mu_size = mu;
            let f = self.factor[i];
            if need_u > cur && f != 1.0 {
                mu_size = mu * f;
                let xf = lambda / (rho_t * mu_size);
                let needf = if xf.is_finite() {
                    (xf - CEIL_SLACK * xf.max(1.0)).ceil().max(1.0)
                } else {
                    f64::MAX
                };
                need_u = if needf >= f64::from(u32::MAX) {
                    u32::MAX
                } else {
                    (needf as u32).max(cur.saturating_add(1))
                };
                let probe = probe_limit(cur, f);
                if need_u > probe {
                    if explain {
                        cat!(&mut why[i];
                            "; sub-linear scaling: probes at most ", Fixed(1.0 / (1.0 - f), 2),
                            "× its current p per step → p=", probe
                        );
                    }
                    need_u = probe;
                }
                if explain {
                    cat!(&mut why[i];
                        "; scalability factor ", Fixed(f, 2), " (μ ", fmt_rate(mu_size),
                        " rec/s per subtask above p=", cur, ") → p=", need_u
                    );
                }
            }
            let mut need_u = if self.kg_slot[i].is_some() {
                self.size_keyed(i, need_u, mu_size, explain, &mut why[i], reasons)
            } else {
                need_u
            };
            if self.frozen[i] && need_u > cur {
                if explain {
                    let _ = write!(
                        why[i],
                        "; ineffective scaling: not scaled up, keeps p={cur}"
                    );
                }
                need_u = cur;
            }
            // Scale back down to the smallest parallelism measured to give the capacity that
            // more subtasks did not raise (μ per subtask at `cur` understates it below `cur`).
            let from = self.flat_from[i];
            if self.frozen[i] && from > 0 && from < cur && need_u > from {
                if explain {
                    let _ = write!(
                        why[i],
                        "; p={from} gave the same capacity before the scale-up that did not raise it → p={from}"
                    );
                }
                need_u = from;
            }
            if need_u > cur
                && let Some(rho_cur) = self.tolerated_rho(i, cur, lo..=hi, rho_t)
            {
                if explain {
                    cat!(&mut why[i];
                        "; ρ=", Fixed(rho_cur, 3), " at the current p=", cur,
                        " is within the scale-up tolerance (", Fixed(100.0 * SCALE_UP_TOLERANCE, 0),
                        "% above ρ_target): keeps p=", cur, " unless the latency SLO needs more"
                    );
                }
                need_u = cur;
            }
            // A scale-down the plan without the rescale's downtime backlog makes, kept when the
            // lower parallelism stays within the scale-up tolerance band with that backlog.
            if let Some(&down) = free.and_then(|f| f.get(i))
                && down < cur
                && down < need_u
                && let Some(rho_down) = self.sizing_rho(i, down)
                && rho_down <= (rho_t * (1.0 + SCALE_UP_TOLERANCE)).min(1.0 - CEIL_SLACK)
            {
                if explain {
                    let _ = write!(
                        why[i],
                        "; scale-down to p={down}: with the rescale's downtime backlog its busiest subtask runs at ρ={} there, within the scale-up tolerance ({}% above ρ_target) → p={down}",
                        Fixed(rho_down, 3),
                        Fixed(100.0 * SCALE_UP_TOLERANCE, 0)
                    );
                }
                need_u = down;
            }
            p[i] = need_u.clamp(lo, hi);
            if need_u > hi {
                clamped[i] = true;
                if !explain {
                    continue;
                }
                let rho = self.predicted_rho(i, hi).unwrap_or(f64::INFINITY);
                let _ = write!(why[i], "; clamped to max {hi}: predicted ρ={rho:.2}");
                reasons.push(format!(
                    "{}: needs p={} for ρ ≤ {:.2} but its max is {}; predicted ρ={:.2}{}",
                    self.name(i),
                    need_u,
                    rho_t,
                    hi,
                    rho,
                    if rho >= 1.0 {
                        " (unstable: backlog will grow)"
                    } else {
                        ""
                    }
                ));
            } else if explain && need_u < lo {
                let _ = write!(why[i], "; raised to min {lo}");
            }
        }
        self.limit_upstream_of_bottlenecks(explain, p, why);
    }

    /// Nothing upstream of a bottleneck is sized for more than the bottleneck can take
    /// (FLINK-31215): an operator planned at `p` whose capacity ([`Model::capacity_at`]) is
    /// below its target rate (capped at its max, a hot-key bottleneck, held for ineffective
    /// scaling) passes on only the fraction capacity / λ_target of it, and backpressure holds
    /// everything upstream of it to that fraction (a blocked output blocks the whole subtask,
    /// so an operator takes the smallest fraction over its outputs, and that of anything
    /// further down). In reverse topological order each operator's fraction is the smaller of
    /// its own and its outputs'; a planned scale-up of an operator whose outputs pass on a
    /// fraction f < 1 is then sized for f · λ_target instead (the smallest parallelism whose
    /// busiest subtask stays within ρ_target there, and not below the current one). Operators
    /// without such a bottleneck below them keep their sizing.
    pub(super) fn limit_upstream_of_bottlenecks(
        &self,
        explain: bool,
        p: &mut [u32],
        why: &mut [String],
    ) {
        let topo = &self.graph.topo;
        let n = topo.len();
        let mut through = vec![1.0_f64; n];
        let mut any = false;
        for i in (0..n).rev() {
            let lambda = self.lambda_target[i];
            let own = if topo.is_source[i] || lambda.is_nan() || lambda <= 0.0 {
                1.0
            } else {
                (self.capacity_at(i, p[i]) / lambda).min(1.0)
            };
            let below = self.fraction_below(i, &through);
            through[i] = own.min(below);
            any |= through[i] < 1.0;
        }
        if !any {
            return;
        }
        for i in 0..n {
            let cur = self.est[i].parallelism;
            let f = self.fraction_below(i, &through);
            if topo.is_source[i] || p[i] <= cur || f.is_nan() || f >= 1.0 || self.mu(i).is_none() {
                continue;
            }
            let lambda = self.lambda_size(i) * f;
            let limit =
                |q: u32| self.mu_at(i, q).map_or(0.0, |mu| self.s.rho * mu) * (1.0 + CEIL_SLACK);
            let q = (1..p[i])
                .find(|&q| lambda * self.max_share(i, q) <= limit(q))
                .unwrap_or(p[i]);
            let band = (self.s.rho * (1.0 + SCALE_UP_TOLERANCE)).min(1.0 - CEIL_SLACK);
            let keep_cur = self
                .mu_at(i, cur)
                .is_some_and(|mu| lambda * self.max_share(i, cur) <= band * mu);
            let q = if keep_cur { cur } else { q.max(cur) };
            let q = q.max(self.graph.bounds[i].0);
            if q >= p[i] {
                continue;
            }
            if explain {
                let _ = write!(
                    why[i],
                    "; upstream of a bottleneck that passes on only {}% of its target rate: sized for {} rec/s → p={q} (FLINK-31215)",
                    Fixed(100.0 * f, 1),
                    fmt_rate(lambda)
                );
            }
            p[i] = q;
        }
    }

    /// The smallest of `through` over operator `i`'s forward outputs (1 without outputs).
    pub(super) fn fraction_below(&self, i: usize, through: &[f64]) -> f64 {
        self.graph.topo.outputs[i]
            .iter()
            .filter(|&&j| j > i)
            .map(|&j| through[j])
            .fold(1.0, f64::min)
    }
}
