//! Each operator's predicted latency terms: the mean sojourn time and the percentile bound of
//! its sojourn (memoized by parallelism), with an event-time window's watermark wait and a
//! window burst's drain time.

use super::*;

/// Most parallelisms (0 ..) kept per operator in the tail memo: an operator's row covers
/// 0 ..= its max parallelism, up to this many entries.
pub(super) const TAIL_ROW_MAX: usize = 1024;

impl Model {
    /// Seconds operator `i`'s window results wait beyond their windows' ends (the watermark
    /// delay of an event-time window, [`watermark_waits`]; 0 for other operators, processing-time
    /// windows included). A window's period is not part of a record's latency: a window
    /// result's latency counts from the window's end (Flink's convention, the engine's).
    pub(super) fn window_wait(&self, i: usize) -> f64 {
        self.wait.get(i).copied().unwrap_or(0.0)
    }

    /// Seconds the busiest subtask of operator `i` needs to work off its share of the batch
    /// that bursty windowed upstream operators deliver at each window boundary (fluid: the
    /// batch's records times the subtask's share, over μ). The last record of the batch waits
    /// this long; on average a record waits half of it. 0 without windowed inputs.
    pub(super) fn drain(&self, i: usize, p: u32, mu: f64) -> f64 {
        if self.burst_in[i] > 0.0 {
            self.burst_in[i] * self.max_share(i, p) / mu
        } else {
            0.0
        }
    }

    /// Operator `i`'s service-time coefficient of variation: the configured cs when set
    /// ([`PlannerSettings::service_cv`]), else its measured one
    /// ([`OperatorEstimate::service_cv`]), else the default cs (1).
    #[inline]
    pub(super) fn cs(&self, i: usize) -> f64 {
        self.measured_cs(i).unwrap_or(self.s.cs)
    }

    /// Operator `i`'s measured cs when the planner uses it (no configured cs overrides it).
    #[inline]
    pub(super) fn measured_cs(&self, i: usize) -> Option<f64> {
        self.est[i].service_cv.filter(|_| !self.s.cs_set)
    }

    /// Mean sojourn at the steady rate with `p` subtasks: queueing of the smooth input and
    /// service, plus an event-time window's watermark delay ([`Model::window_wait`]: a window
    /// result counts from its window's end, the period is not added) and half the burst drain
    /// of a window's downstream. 0 for sources; the watermark delay alone for unknown μ.
    pub(super) fn sojourn(&self, i: usize, p: u32) -> f64 {
        let window = self.window_wait(i);
        match self.mu_at(i, p) {
            Some(mu) if self.overloaded(i, p, mu) => f64::INFINITY,
            Some(mu) => {
                operator_sojourn_time(
                    self.graph.topo.queue[i],
                    self.effective_lambda(i, self.lambda_smooth[i], p),
                    mu,
                    p,
                    self.s.ca,
                    self.cs(i),
                ) + window
                    + 0.5 * self.drain(i, p, mu)
            }
            None => window,
        }
    }

    /// Operator `i`'s term of the path percentile bound at `p` subtasks, seconds: the
    /// ε'-quantile bound of its sojourn ([`super::queueing::sojourn_quantile_bound`] at the smooth input: a
    /// keyed operator's busiest subtask is one server, a shared queue has p), plus an
    /// event-time window's watermark delay ([`Model::window_wait`]; not the window period: a
    /// window result's latency counts from its window's end) and the burst drain time (no
    /// record of a batch waits longer than the busiest subtask's share of it, in the fluid
    /// view). 0 for sources; the watermark delay alone for unknown μ.
    pub(super) fn tail(&self, i: usize, p: u32) -> f64 {
        let Some(at) = self.tail_slot(i, p) else {
            return self.tail_uncached(i, p);
        };
        let m = self.tail_memo.borrow().get(at);
        if !m.is_nan() {
            return m;
        }
        let t = self.tail_uncached(i, p);
        self.tail_memo.borrow_mut().set(at, t);
        t
    }

    /// The tail memo's entry for operator `i` at parallelism `p`, if its row covers `p`.
    pub(super) fn tail_slot(&self, i: usize, p: u32) -> Option<usize> {
        let at = self.graph.tail_at[i] + p as usize;
        (at < self.graph.tail_at[i + 1]).then_some(at)
    }

    /// The memoized tail of operator `i` at `p`, if computed.
    pub(super) fn tail_memoized(&self, i: usize, p: u32) -> Option<f64> {
        let at = self.tail_slot(i, p)?;
        Some(self.tail_memo.borrow().get(at)).filter(|t| !t.is_nan())
    }

    /// An upper bound on [`Model::tail`] that skips the quantile's root finding (the
    /// quantile's starting bracket end, [`super::queueing::sojourn_quantile_upper`]): the same terms added in
    /// the same order to a term that is at least the quantile, so never below `tail(i, p)`.
    pub(super) fn tail_upper(&self, i: usize, p: u32) -> f64 {
        if let Some(t) = self.tail_memoized(i, p) {
            return t;
        }
        let window = self.window_wait(i);
        let Some(mu) = self.mu_at(i, p) else {
            return window;
        };
        if self.overloaded(i, p, mu) {
            return f64::INFINITY;
        }
        sojourn_quantile_upper_in(
            self.tail_node(i, p, mu),
            self.s.ca,
            self.cs(i),
            &self.budget,
        ) + window
            + self.drain(i, p, mu)
    }

    /// The queue a record of operator `i` joins at `p` subtasks of μ each: a keyed
    /// operator's busiest subtask (one server), else the shared queue of p servers.
    pub(super) fn tail_node(&self, i: usize, p: u32, mu: f64) -> TailNode {
        if self.kg_slot[i].is_some() {
            TailNode {
                lambda: self.lambda_smooth[i] * self.max_share(i, p),
                mu,
                servers: 1,
            }
        } else {
            TailNode {
                lambda: self.lambda_smooth[i],
                mu,
                servers: p.max(1),
            }
        }
    }

    /// [`Model::tail`] without the memo.
    pub(super) fn tail_uncached(&self, i: usize, p: u32) -> f64 {
        let window = self.window_wait(i);
        let Some(mu) = self.mu_at(i, p) else {
            return window;
        };
        if self.overloaded(i, p, mu) {
            return f64::INFINITY;
        }
        let node = self.tail_node(i, p, mu);
        sojourn_quantile_bound_in(node, self.s.ca, self.cs(i), &self.budget, f64::NAN)
            + window
            + self.drain(i, p, mu)
    }
}
