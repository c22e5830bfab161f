//! Closed-form queueing results used to predict each operator's sojourn time.
//!
//! Notation: λ arrival rate (records/s), μ true processing rate of one subtask (records/s),
//! c servers (subtasks), a = λ/μ offered load (Erlangs), ρ = a/c utilization, ca and cs the
//! coefficients of variation of inter-arrival and service times. All times are seconds.
//!
//! Every function returns `f64::INFINITY` for an unstable queue (ρ ≥ 1) or a non-positive /
//! non-finite μ: the mean waiting time of such a queue grows without bound.

use serde::{Deserialize, Serialize};

/// Erlang B blocking probability of an M/M/c/c loss system with `servers` servers and offered
/// load `offered_load` = λ/μ (Erlangs), by the numerically stable recursion (no factorials):
/// B₀ = 1, B_k = a·B_{k−1} / (k + a·B_{k−1}). Dimensionless, in 0..=1.
///
/// A non-positive or NaN load gives 0 for `servers ≥ 1`; `servers = 0` gives 1.
pub fn erlang_b(servers: u32, offered_load: f64) -> f64 {
    erlang_b_truncated(servers, offered_load, 0.0)
}

/// Erlang B recursion stopped once B_k ≤ `eps` (past k > a, B_k only decreases, so the result
/// is an upper bound within `eps` of the exact value). `eps = 0` is exact.
fn erlang_b_truncated(servers: u32, offered_load: f64, eps: f64) -> f64 {
    if servers == 0 {
        return 1.0;
    }
    if offered_load.is_nan() || offered_load <= 0.0 {
        return 0.0;
    }
    if offered_load.is_infinite() {
        return 1.0;
    }
    let a = offered_load;
    let mut b = 1.0;
    // k counts in f64 (exact: servers < 2^53), the same values as f64::from(k) for k in
    // 1..=servers without a conversion and the inclusive range's bookkeeping per step.
    let mut k = 0.0;
    for _ in 0..servers {
        k += 1.0;
        let ab = a * b;
        b = ab / (k + ab);
        if b <= eps {
            break; // eps = 0: underflow, stays 0 for every larger k
        }
    }
    b
}

/// Erlang C: probability that an arrival to an M/M/c queue must wait, from Erlang B:
/// C = B_c / (1 − ρ(1 − B_c)) with ρ = a/c. Dimensionless. Returns 1 when ρ ≥ 1 (unstable:
/// every arrival waits) or `servers = 0`.
pub fn erlang_c(servers: u32, offered_load: f64) -> f64 {
    erlang_c_truncated(servers, offered_load, 0.0)
}

fn erlang_c_truncated(servers: u32, offered_load: f64, eps: f64) -> f64 {
    if servers == 0 {
        return 1.0;
    }
    let rho = offered_load / f64::from(servers);
    if rho.is_nan() || rho >= 1.0 {
        return 1.0;
    }
    let b = erlang_b_truncated(servers, offered_load, eps);
    b / (1.0 - rho * (1.0 - b))
}

/// Below this blocking probability the planner's sojourn times stop the Erlang B recursion:
/// the waiting-time error is then under 1e-18 / ((1 − ρ)(c − a)) service times, far below f64
/// resolution of the sojourn, and a many-server evaluation costs O(a) instead of O(c).
const SOJOURN_ERLANG_EPS: f64 = 1e-18;

fn unstable(lambda: f64, mu: f64, servers: u32) -> bool {
    !(mu > 0.0 && mu.is_finite() && lambda.is_finite())
        || servers == 0
        || lambda >= f64::from(servers) * mu
}

/// M/M/1 mean waiting time in queue (seconds): Wq = ρ/(μ − λ), ρ = λ/μ.
/// `f64::INFINITY` when λ ≥ μ. λ ≤ 0 gives 0.
pub fn mm1_waiting_time(lambda: f64, mu: f64) -> f64 {
    mmc_waiting_time(lambda, mu, 1)
}

/// M/M/1 mean sojourn time (seconds): W = 1/(μ − λ). `f64::INFINITY` when λ ≥ μ.
pub fn mm1_sojourn_time(lambda: f64, mu: f64) -> f64 {
    mmc_sojourn_time(lambda, mu, 1)
}

/// M/M/c mean waiting time in queue (seconds): Wq = C(c, a) / (cμ − λ), with C the Erlang C
/// probability of waiting and a = λ/μ. `f64::INFINITY` when λ ≥ cμ; 0 when λ ≤ 0.
pub fn mmc_waiting_time(lambda: f64, mu: f64, servers: u32) -> f64 {
    mmc_waiting_time_truncated(lambda, mu, servers, 0.0)
}

fn mmc_waiting_time_truncated(lambda: f64, mu: f64, servers: u32, eps: f64) -> f64 {
    if unstable(lambda, mu, servers) {
        return f64::INFINITY;
    }
    if lambda <= 0.0 {
        return 0.0;
    }
    let c = f64::from(servers);
    erlang_c_truncated(servers, lambda / mu, eps) / (c * mu - lambda)
}

/// M/M/c mean sojourn time (seconds): W = Wq + 1/μ. `f64::INFINITY` when λ ≥ cμ.
pub fn mmc_sojourn_time(lambda: f64, mu: f64, servers: u32) -> f64 {
    mmc_waiting_time(lambda, mu, servers) + 1.0 / mu
}

/// Allen-Cunneen approximation of the G/G/c mean waiting time in queue (seconds):
/// Wq ≈ Wq(M/M/c) · (ca² + cs²)/2. Exact for M/M/c (ca = cs = 1). `f64::INFINITY` when λ ≥ cμ.
pub fn allen_cunneen_waiting_time(
    lambda: f64,
    mu: f64,
    servers: u32,
    arrival_cv: f64,
    service_cv: f64,
) -> f64 {
    let w = mmc_waiting_time(lambda, mu, servers);
    if w == 0.0 || w.is_infinite() {
        return w;
    }
    w * variability(arrival_cv, service_cv)
}

/// Kingman's approximation of the G/G/1 mean waiting time in queue (seconds):
/// Wq ≈ ρ/(1 − ρ) · (ca² + cs²)/2 · 1/μ. Equals the M/M/1 Wq at ca = cs = 1.
/// `f64::INFINITY` when λ ≥ μ.
pub fn kingman_waiting_time(lambda: f64, mu: f64, arrival_cv: f64, service_cv: f64) -> f64 {
    if unstable(lambda, mu, 1) {
        return f64::INFINITY;
    }
    if lambda <= 0.0 {
        return 0.0;
    }
    let rho = lambda / mu;
    rho / (1.0 - rho) * variability(arrival_cv, service_cv) / mu
}

fn variability(arrival_cv: f64, service_cv: f64) -> f64 {
    (arrival_cv * arrival_cv + service_cv * service_cv) / 2.0
}

/// How an operator's subtasks share their input (see the engine's channel layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum QueueKind {
    /// Keyed (partitioned by key group): p separate single-server queues, each fed λ/p
    /// (no skew assumed).
    Keyed,
    /// One shared input queue pulled by all p subtasks: a true c-server queue with c = p.
    Shared,
}

/// Mean sojourn time (seconds: waiting plus service) of a record at an operator with
/// `parallelism` subtasks, total arrival rate `lambda` (records/s) and true processing rate
/// `mu` per subtask (records/s).
///
/// * [`QueueKind::Keyed`]: one of p G/G/1 queues at λ/p, Kingman's approximation
///   (the M/M/1 sojourn 1/(μ − λ/p) at ca = cs = 1).
/// * [`QueueKind::Shared`]: a G/G/c queue with c = p, Allen-Cunneen's approximation
///   (the M/M/c sojourn at ca = cs = 1); the Erlang B recursion stops once the blocking
///   probability is below 1e-18 (negligible next to the service time).
///
/// `f64::INFINITY` when unstable (λ ≥ pμ) or μ is not a positive finite number.
pub fn operator_sojourn_time(
    kind: QueueKind,
    lambda: f64,
    mu: f64,
    parallelism: u32,
    arrival_cv: f64,
    service_cv: f64,
) -> f64 {
    if unstable(lambda, mu, parallelism) {
        return f64::INFINITY;
    }
    let wq = match kind {
        QueueKind::Keyed => {
            kingman_waiting_time(lambda / f64::from(parallelism), mu, arrival_cv, service_cv)
        }
        QueueKind::Shared => {
            mmc_waiting_time_truncated(lambda, mu, parallelism, SOJOURN_ERLANG_EPS)
                * variability(arrival_cv, service_cv)
        }
    };
    wq + 1.0 / mu
}

/// Waiting-time tail P(Wq > t) of a G/G/c queue (dimensionless), from the M/M/c result
/// P(Wq > t) = C(c, a) · e^(−(cμ − λ) t) (Erlang C, see [`erlang_c`]) with the decay rate
/// divided by the Allen-Cunneen factor (ca² + cs²)/2, so that the mean of the tail,
/// C / θ, equals the Allen-Cunneen mean waiting time ([`allen_cunneen_waiting_time`]).
/// Exact for M/M/c (ca = cs = 1). `t` in seconds; 1 when unstable (λ ≥ cμ).
pub fn ggc_waiting_tail(
    lambda: f64,
    mu: f64,
    servers: u32,
    arrival_cv: f64,
    service_cv: f64,
    t: f64,
) -> f64 {
    if unstable(lambda, mu, servers) {
        return 1.0;
    }
    if lambda <= 0.0 {
        return 0.0;
    }
    let c = erlang_c(servers, lambda / mu);
    let theta = tail_decay(lambda, mu, servers, arrival_cv, service_cv);
    (c * (-theta * t.max(0.0)).exp()).min(1.0)
}

/// Decay rate θ (1/s) of the G/G/c waiting-time tail: (cμ − λ) / ((ca² + cs²)/2).
fn tail_decay(lambda: f64, mu: f64, servers: u32, arrival_cv: f64, service_cv: f64) -> f64 {
    let v = variability(arrival_cv, service_cv).max(1e-9);
    (f64::from(servers) * mu - lambda) / v
}

/// The smallest t (seconds) with P(Wq > t) ≤ `eps` for the tail of [`ggc_waiting_tail`]:
/// max(0, ln(C/ε)/θ). `f64::INFINITY` when unstable or ε ≤ 0.
pub fn ggc_waiting_quantile(
    lambda: f64,
    mu: f64,
    servers: u32,
    arrival_cv: f64,
    service_cv: f64,
    eps: f64,
) -> f64 {
    if unstable(lambda, mu, servers) || eps.is_nan() || eps <= 0.0 {
        return f64::INFINITY;
    }
    if lambda <= 0.0 || eps >= 1.0 {
        return 0.0;
    }
    // The truncated Erlang B recursion gives an upper bound on C within 1e-18, so the
    // quantile stays an upper bound and a many-server evaluation costs O(a), not O(c).
    let c = erlang_c_truncated(servers, lambda / mu, SOJOURN_ERLANG_EPS);
    let theta = tail_decay(lambda, mu, servers, arrival_cv, service_cv);
    ((c / eps).ln() / theta).max(0.0)
}

/// The `eps`-tail quantile of one operator's sojourn time T = Wq + S (seconds): the smallest
/// t with P(T > t) ≤ `eps`, by the convolution of the two independent terms (a record's own
/// service time does not depend on the wait before it):
///
/// * Wq: with probability C (Erlang C) an exponential wait of rate θ, else 0
///   ([`ggc_waiting_tail`]: exact for M/M/c, the Allen-Cunneen-scaled decay for G/G/c);
/// * S: exponential of rate m = μ / max(1, cs²). For cs ≥ 1 a gamma service time (shape
///   k = 1/cs² ≤ 1) has a decreasing hazard rate that tends to kμ, so its tail is below
///   e^(−kμx) everywhere; for cs < 1 the exponential tail is the conservative choice at the
///   small `eps` the planner uses (exact for cs = 1).
///
/// P(T > t) = (1 − C)·e^(−mt) + C·(m·e^(−θt) − θ·e^(−mt)) / (m − θ) (the hypoexponential
/// tail; (1 + mt)·e^(−mt) when θ = m). Exact for M/M/1 (T exponential at μ − λ) and M/M/c
/// with exponential service. Solved by safeguarded Newton steps on ln P(T > t), started at the
/// root of the slower-decaying exponential term alone (see `asymptotic_root`), inside a
/// bracket whose upper end always has P(T > t) ≤ `eps`, which is returned: the result never
/// understates the quantile by more than 1e-12 relative. One server with an exponential
/// sojourn in this model (M/M/1, or ca = cs ≥ 1; see `exponential_sojourn`) takes the closed
/// form ln(1/ε)/θ instead, which agrees with the root finding within that tolerance.
/// `f64::INFINITY` when unstable, μ is not positive and finite, or `eps` ≤ 0.
pub fn sojourn_quantile_bound(node: TailNode, arrival_cv: f64, service_cv: f64, eps: f64) -> f64 {
    sojourn_quantile_bound_from(node, arrival_cv, service_cv, eps, f64::NAN)
}

/// [`sojourn_quantile_bound`] with its root finding started at `start` seconds, when `start`
/// lies strictly inside the bracket (outside: the bracket's upper end; NaN: the start
/// [`sojourn_quantile_bound`] takes, which is then the result bit for bit). The root finding
/// keeps the same bracket (`start` becomes its lower or upper end by the sign of
/// P(T > start) − `eps`) and the same tolerance (1e-12 relative), so the result is the same
/// bound up to that tolerance: P(T > t) ≤ `eps` at the result (but for the rounding that bound
/// already allows).
pub fn sojourn_quantile_bound_from(
    node: TailNode,
    arrival_cv: f64,
    service_cv: f64,
    eps: f64,
    start: f64,
) -> f64 {
    sojourn_quantile_bound_in(node, arrival_cv, service_cv, &TailBudget::new(eps), start)
}

/// A tail budget ε with the logarithms the quantile bound takes of it, computed once for the
/// many bounds at the same ε (the same values, so the same results bit for bit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TailBudget {
    eps: f64,
    /// ln ε.
    ln_eps: f64,
    /// ln(1/ε).
    ln_1_eps: f64,
    /// ln(2/ε).
    ln_2_eps: f64,
}

impl TailBudget {
    /// The budget `eps` (a probability; out-of-range values give the bounds' edge results).
    pub fn new(eps: f64) -> TailBudget {
        TailBudget {
            eps,
            ln_eps: eps.ln(),
            ln_1_eps: (1.0 / eps).ln(),
            ln_2_eps: (2.0 / eps).ln(),
        }
    }
}

/// [`sojourn_quantile_bound_from`] at a precomputed [`TailBudget`].
pub fn sojourn_quantile_bound_in(
    node: TailNode,
    arrival_cv: f64,
    service_cv: f64,
    budget: &TailBudget,
    start: f64,
) -> f64 {
    let (c, theta, m) = match quantile_terms(node, arrival_cv, service_cv, budget) {
        Terms::Done(t) => return t,
        Terms::Solve { c, theta, m } => (c, theta, m),
    };
    if node.servers == 1 && !nearly_equal(m, theta) && exponential_sojourn(arrival_cv, service_cv) {
        return budget.ln_1_eps / theta;
    }
    newton_quantile(c, theta, m, bracket_end(c, theta, m, budget), budget, start)
}

/// Whether one server's sojourn T = Wq + S is exactly exponential in the tail model of
/// [`sojourn_quantile_bound`], at rate θ: when the Allen-Cunneen factor v = (ca² + cs²)/2 of
/// the wait's decay θ = (μ − λ)/v equals the divisor max(1, cs²) of the service rate
/// m = μ / max(1, cs²) (M/M/1, or ca = cs ≥ 1). Then θ = m(1 − ρ) and, C being ρ for one
/// server, P(T > t) = A·e^(−mt) + B·e^(−θt) has A = 1 − C − Cθ/(m − θ) = 0 and
/// B = Cm/(m − θ) = 1: P(T > t) = e^(−θt), whose ε-quantile is ln(1/ε)/θ in closed form.
fn exponential_sojourn(arrival_cv: f64, service_cv: f64) -> bool {
    variability(arrival_cv, service_cv).max(1e-9) == (service_cv * service_cv).max(1.0)
}

/// Whether the service rate `m` and the wait's decay rate `theta` are within 1e-9 relative
/// (then the tail is taken as (1 + mt)·e^(−mt) after the wait's share).
fn nearly_equal(m: f64, theta: f64) -> bool {
    (m - theta).abs() <= 1e-9 * m.max(theta)
}

/// The root finding of [`sojourn_quantile_bound_in`] (see there): Erlang C `c`, the wait's
/// decay rate `theta` and the service rate `m` (1/s), the bracket's upper end `hi` (seconds).
fn newton_quantile(
    c: f64,
    theta: f64,
    m: f64,
    mut hi: f64,
    budget: &TailBudget,
    start: f64,
) -> f64 {
    let eps = budget.eps;
    // P(T > t) and its derivative.
    let near = nearly_equal(m, theta);
    let tail = |t: f64| -> (f64, f64) {
        let em = (-m * t).exp();
        let (h, dh) = if near {
            ((1.0 + m * t) * em, -m * m * t * em)
        } else {
            let et = (-theta * t).exp();
            (
                (m * et - theta * em) / (m - theta),
                -m * theta * (et - em) / (m - theta),
            )
        };
        ((1.0 - c) * em + c * h, -(1.0 - c) * m * em + c * dh)
    };
    let mut lo = 0.0;
    let target = budget.ln_eps;
    let start = if start.is_nan() && !near {
        asymptotic_root(c, theta, m, budget)
    } else {
        start
    };
    let mut t = if start > 0.0 && start < hi { start } else { hi };
    for _ in 0..100 {
        let (p, dp) = tail(t);
        if p <= eps {
            hi = t;
        } else {
            lo = t;
        }
        if hi - lo <= 1e-12 * hi {
            break;
        }
        // Newton on ln P(t) = ln eps; fall back to bisection outside the bracket.
        let next = if p > 0.0 && dp < 0.0 {
            t - (p.ln() - target) * p / dp
        } else {
            f64::NAN
        };
        if (next - hi).abs() <= 1e-12 * hi || (next - lo).abs() <= 1e-12 * hi {
            // Newton has converged onto an end of the bracket (or just past it, by rounding:
            // without this check that step would fall back to bisecting the whole bracket).
            hi = hi.min(next.max(lo));
            break;
        }
        t = if next > lo && next < hi {
            next
        } else {
            0.5 * (lo + hi)
        };
        if (t - hi).abs() <= 1e-12 * hi || (t - lo).abs() <= 1e-12 * hi {
            // Newton has converged onto an end of the bracket: the root is within 1e-12 of it
            // (at `lo` the tail exceeds `eps` by rounding only).
            hi = hi.min(t.max(lo));
            break;
        }
    }
    hi.max(0.0)
}

/// Where [`sojourn_quantile_bound_in`] starts its root finding without a given start: the
/// root of the slower-decaying of the tail's two exponential terms alone. With
/// P(T > t) = A·e^(−mt) + B·e^(−θt), A = 1 − C − Cθ/(m − θ), B = Cm/(m − θ), the term of rate
/// r = min(m, θ) dominates for large t, and its coefficient (B when θ < m, else A) is then
/// positive: t₀ = ln(coefficient / ε) / r. The other term is e^(−|m − θ|·t₀) relative to it
/// there, so t₀ is usually close to the root (one to three Newton steps; from the bracket's
/// upper end it takes one more). NaN (start at the upper end) when the coefficient or the rate
/// is not positive. Only a starting point: the root finding keeps its bracket and tolerance.
/// Not used when θ ≈ m (the tail is then (1 + mt)·e^(−mt) after the wait's share).
fn asymptotic_root(c: f64, theta: f64, m: f64, budget: &TailBudget) -> f64 {
    let (coef, rate) = if theta < m {
        (c * m / (m - theta), theta)
    } else {
        ((1.0 - c) + c * theta / (theta - m), m)
    };
    if coef > 0.0 && rate > 0.0 {
        (coef.ln() - budget.ln_eps) / rate
    } else {
        f64::NAN
    }
}

/// The start of [`sojourn_quantile_bound`]: either its result outright (unstable, `eps` out
/// of range, or no wait: the service quantile alone), or the Erlang C probability `c`, the
/// wait's decay rate `theta` and the service rate `m` (1/s), from which [`bracket_end`] gives
/// the root finding's bracket.
enum Terms {
    Done(f64),
    Solve { c: f64, theta: f64, m: f64 },
}

fn quantile_terms(node: TailNode, arrival_cv: f64, service_cv: f64, budget: &TailBudget) -> Terms {
    let eps = budget.eps;
    let (lambda, mu, servers) = (node.lambda, node.mu, node.servers);
    if !(mu > 0.0 && mu.is_finite()) || eps.is_nan() || eps <= 0.0 || unstable(lambda, mu, servers)
    {
        return Terms::Done(f64::INFINITY);
    }
    if eps >= 1.0 {
        return Terms::Done(0.0);
    }
    let m = mu / (service_cv * service_cv).max(1.0);
    let (c, theta) = if lambda > 0.0 {
        (
            erlang_c_truncated(servers, lambda / mu, SOJOURN_ERLANG_EPS),
            tail_decay(lambda, mu, servers, arrival_cv, service_cv),
        )
    } else {
        (0.0, f64::INFINITY)
    };
    if c <= 0.0 || !theta.is_finite() {
        return Terms::Done(budget.ln_1_eps / m);
    }
    Terms::Solve { c, theta, m }
}

/// The bracket's upper end (seconds): the union bound of the wait's and the service's
/// `eps`/2-quantiles, P(T > end) ≤ `eps`.
fn bracket_end(c: f64, theta: f64, m: f64, budget: &TailBudget) -> f64 {
    ((2.0 * c / budget.eps).ln() / theta).max(0.0) + budget.ln_2_eps / m
}

/// An upper bound on [`sojourn_quantile_bound`] (seconds) without its root finding: the
/// bracket's upper end (the union bound of the wait's and the service's `eps`/2-quantiles),
/// which the root finding only ever lowers, so the result is never below the quantile bound
/// (bit for bit; equal where that one needs no root finding). A few times cheaper.
pub fn sojourn_quantile_upper(node: TailNode, arrival_cv: f64, service_cv: f64, eps: f64) -> f64 {
    sojourn_quantile_upper_in(node, arrival_cv, service_cv, &TailBudget::new(eps))
}

/// [`sojourn_quantile_upper`] at a precomputed [`TailBudget`].
pub fn sojourn_quantile_upper_in(
    node: TailNode,
    arrival_cv: f64,
    service_cv: f64,
    budget: &TailBudget,
) -> f64 {
    match quantile_terms(node, arrival_cv, service_cv, budget) {
        Terms::Done(t) => t,
        Terms::Solve { c, theta, m } => bracket_end(c, theta, m, budget).max(0.0),
    }
}

/// One operator on a path, for [`path_latency_quantile_bound`]: its queue as seen by one
/// record (rates in records/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TailNode {
    /// Arrival rate λ of the queue a record joins (a keyed operator: the busiest subtask's).
    pub lambda: f64,
    /// True processing rate μ of one server, records/s.
    pub mu: f64,
    /// Servers of that queue (a keyed operator's subtask: 1; a shared queue: p).
    pub servers: u32,
}

/// An upper bound on the `percentile`-quantile (e.g. 0.99) of the end-to-end latency along a
/// path of queues, seconds. Each record's latency is Σᵢ Tᵢ, Tᵢ = Wqᵢ + Sᵢ its sojourn at
/// node i. By the union bound, P(Σ Tᵢ > Σ tᵢ) ≤ Σ P(Tᵢ > tᵢ) for any dependence between the
/// nodes (Boole's inequality; a convolution across nodes would need independence, which a
/// network's sojourn times do not have in general), so splitting the tail budget
/// ε = 1 − percentile evenly over the k nodes and adding each node's ε/k-quantile
/// ([`sojourn_quantile_bound`], itself an exact convolution of the node's wait and service)
/// gives an upper bound. Conservative by design: for one M/M/1 queue it is exact; for three
/// M/M/1 queues in tandem at ρ ≈ 0.5 it is about 1.5× the simulated p99 (see the tests).
/// `f64::INFINITY` when a node is unstable; 0 for an empty path.
pub fn path_latency_quantile_bound(
    nodes: &[TailNode],
    percentile: f64,
    arrival_cv: f64,
    service_cv: f64,
) -> f64 {
    if nodes.is_empty() {
        return 0.0;
    }
    let eps = (1.0 - percentile) / nodes.len() as f64;
    nodes
        .iter()
        .map(|&n| sojourn_quantile_bound(n, arrival_cv, service_cv, eps))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn erlang_b_known_values() {
        // a = 2, c = 3: B1 = 2/(1+2) = 2/3; B2 = (4/3)/(2+4/3) = 2/5; B3 = (4/5)/(3+4/5) = 4/19.
        assert!(close(erlang_b(3, 2.0), 4.0 / 19.0));
        // a = 1, c = 2: B1 = 1/2; B2 = (1/2)/(2+1/2) = 1/5.
        assert!(close(erlang_b(2, 1.0), 0.2));
        assert_eq!(erlang_b(0, 5.0), 1.0);
        assert_eq!(erlang_b(4, 0.0), 0.0);
    }

    proptest::proptest! {
        /// The recursion with its step counted in f64 is the textbook one, bit for bit, exact
        /// and truncated, from light to heavy loads and one to many servers.
        #[test]
        fn erlang_b_counts_steps_exactly(
            servers in 0u32..400,
            load in proptest::prop_oneof![0.0f64..2.0, 0.0f64..500.0, 1e-30f64..1e-10],
            eps in proptest::prop_oneof![proptest::strategy::Just(0.0), proptest::strategy::Just(SOJOURN_ERLANG_EPS), 1e-12f64..1e-3],
        ) {
            let reference = || {
                if servers == 0 {
                    return 1.0;
                }
                if load <= 0.0 {
                    return 0.0;
                }
                let mut b = 1.0f64;
                for k in 1..=servers {
                    b = load * b / (f64::from(k) + load * b);
                    if b <= eps {
                        break;
                    }
                }
                b
            };
            proptest::prop_assert_eq!(erlang_b_truncated(servers, load, eps).to_bits(), reference().to_bits());
        }
    }

    #[test]
    fn erlang_c_known_values() {
        // a = 2, c = 3: ρ = 2/3, B3 = 4/19; C = (4/19)/(1 − (2/3)(15/19)) = (4/19)/(9/19) = 4/9.
        assert!(close(erlang_c(3, 2.0), 4.0 / 9.0));
        // a = 1, c = 1: B1 = 1/2, ρ = 1 → unstable, C = 1 (the formula also gives (1/2)/(1 − 1/2) = 1).
        assert_eq!(erlang_c(1, 1.0), 1.0);
        // a = 0.5, c = 1: B1 = 0.5/1.5 = 1/3; C = (1/3)/(1 − 0.5·2/3) = (1/3)/(2/3) = 1/2 = ρ (M/M/1).
        assert!(close(erlang_c(1, 0.5), 0.5));
        // a = 1, c = 2: B2 = 1/5, ρ = 1/2; C = 0.2/(1 − 0.5·0.8) = 0.2/0.6 = 1/3.
        assert!(close(erlang_c(2, 1.0), 1.0 / 3.0));
        // Over capacity: everyone waits.
        assert_eq!(erlang_c(2, 3.0), 1.0);
    }

    #[test]
    fn erlang_b_is_stable_for_many_servers() {
        // Factorial formulas overflow at c = 171; the recursion does not.
        let b = erlang_b(1000, 950.0);
        assert!(b > 0.0 && b < 0.1, "{b}");
        let c = erlang_c(1000, 950.0);
        assert!(c > b && c < 1.0, "{c}");
    }

    #[test]
    fn mmc_waiting_and_sojourn() {
        // λ = 2, μ = 1, c = 3: C = 4/9, Wq = (4/9)/(3 − 2) = 4/9 s, W = 4/9 + 1 = 13/9 s.
        assert!(close(mmc_waiting_time(2.0, 1.0, 3), 4.0 / 9.0));
        assert!(close(mmc_sojourn_time(2.0, 1.0, 3), 13.0 / 9.0));
        // λ = 100, μ = 100, c = 2: a = 1, C = 1/3, Wq = (1/3)/(200 − 100) = 1/300 s.
        assert!(close(mmc_waiting_time(100.0, 100.0, 2), 1.0 / 300.0));
        // M/M/1, λ = 50, μ = 100: W = 1/(100 − 50) = 0.02 s, Wq = 0.5/50 = 0.01 s.
        assert!(close(mm1_sojourn_time(50.0, 100.0), 0.02));
        assert!(close(mm1_waiting_time(50.0, 100.0), 0.01));
        // Unstable.
        assert_eq!(mmc_waiting_time(300.0, 100.0, 3), f64::INFINITY);
        assert_eq!(mm1_sojourn_time(100.0, 100.0), f64::INFINITY);
        assert_eq!(mmc_sojourn_time(1.0, 0.0, 3), f64::INFINITY);
        // No load: only the service time.
        assert_eq!(mmc_sojourn_time(0.0, 4.0, 3), 0.25);
    }

    #[test]
    fn allen_cunneen_and_kingman() {
        // At ca = cs = 1 Allen-Cunneen is M/M/c and Kingman is M/M/1.
        for (l, m, c) in [(2.0, 1.0, 3), (90.0, 40.0, 4), (10.0, 11.0, 1)] {
            assert!(close(
                allen_cunneen_waiting_time(l, m, c, 1.0, 1.0),
                mmc_waiting_time(l, m, c)
            ));
        }
        assert!(close(
            kingman_waiting_time(50.0, 100.0, 1.0, 1.0),
            mm1_waiting_time(50.0, 100.0)
        ));
        // Deterministic service (cs = 0) halves the wait: (1 + 0)/2.
        assert!(close(
            allen_cunneen_waiting_time(2.0, 1.0, 3, 1.0, 0.0),
            2.0 / 9.0
        ));
        // Kingman λ = 50, μ = 100, ca = 1, cs = 2: ρ/(1−ρ) = 1, (1+4)/2 = 2.5, E[S] = 0.01 → 0.025 s.
        assert!(close(kingman_waiting_time(50.0, 100.0, 1.0, 2.0), 0.025));
    }

    #[test]
    fn operator_sojourn_by_queue_kind() {
        // Keyed, λ = 150 over p = 3 → 50 per queue, μ = 100: W = 1/(100 − 50) = 0.02 s.
        let keyed = operator_sojourn_time(QueueKind::Keyed, 150.0, 100.0, 3, 1.0, 1.0);
        assert!(close(keyed, 0.02));
        // Shared, λ = 200, μ = 100, c = 3: a = 2, Wq = (4/9)/100, W = 0.01 + 4/900.
        let shared = operator_sojourn_time(QueueKind::Shared, 200.0, 100.0, 3, 1.0, 1.0);
        assert!(close(shared, 0.01 + 4.0 / 900.0));
        // Pooling: a shared queue beats separate queues at the same load.
        let k = operator_sojourn_time(QueueKind::Keyed, 200.0, 100.0, 3, 1.0, 1.0);
        assert!(shared < k);
        assert_eq!(
            operator_sojourn_time(QueueKind::Keyed, 300.0, 100.0, 3, 1.0, 1.0),
            f64::INFINITY
        );
    }

    #[test]
    fn waiting_tail_is_erlang_c_exponential() {
        // λ = 2, μ = 1, c = 3: C = 4/9, θ = 1: P(Wq > 0) = 4/9, P(Wq > 1) = 4/9 · e⁻¹.
        assert!(close(
            ggc_waiting_tail(2.0, 1.0, 3, 1.0, 1.0, 0.0),
            4.0 / 9.0
        ));
        assert!(close(
            ggc_waiting_tail(2.0, 1.0, 3, 1.0, 1.0, 1.0),
            4.0 / 9.0 / std::f64::consts::E
        ));
        // Its quantile inverts it; below C the quantile is > 0, above it 0.
        let t = ggc_waiting_quantile(2.0, 1.0, 3, 1.0, 1.0, 0.01);
        assert!(close(ggc_waiting_tail(2.0, 1.0, 3, 1.0, 1.0, t), 0.01));
        assert_eq!(ggc_waiting_quantile(2.0, 1.0, 3, 1.0, 1.0, 0.5), 0.0);
        // Deterministic service halves the Allen-Cunneen factor: the decay doubles.
        let t_d = ggc_waiting_quantile(2.0, 1.0, 3, 1.0, 0.0, 0.01);
        assert!(close(t_d, t / 2.0));
        // The tail's mean C/θ is the Allen-Cunneen mean wait.
        for (ca, cs) in [(1.0, 1.0), (1.0, 0.5), (2.0, 1.0)] {
            let theta = tail_decay(2.0, 1.0, 3, ca, cs);
            assert!(close(
                erlang_c(3, 2.0) / theta,
                allen_cunneen_waiting_time(2.0, 1.0, 3, ca, cs)
            ));
        }
        assert_eq!(ggc_waiting_tail(3.0, 1.0, 3, 1.0, 1.0, 5.0), 1.0);
        assert_eq!(
            ggc_waiting_quantile(3.0, 1.0, 3, 1.0, 1.0, 0.01),
            f64::INFINITY
        );
    }

    /// Exact sojourn times of a tandem of FIFO single-server queues with Poisson arrivals and
    /// exponential service, by the Lindley recursion on each queue's departures, for `n`
    /// records from a seeded xorshift generator. Returns the sorted end-to-end latencies.
    fn tandem_latencies(lambda: f64, mus: &[f64], n: usize, seed: u64) -> Vec<f64> {
        let mut x = seed;
        let mut unit = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let mut free_at = vec![0.0f64; mus.len()];
        let mut t = 0.0;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            t += -unit().ln() / lambda;
            let mut at = t;
            for (k, mu) in mus.iter().enumerate() {
                let start = at.max(free_at[k]);
                at = start - unit().ln() / mu;
                free_at[k] = at;
            }
            out.push(at - t);
        }
        out.sort_by(f64::total_cmp);
        out
    }

    proptest::proptest! {
        /// The bracket's upper end bounds the quantile from above, bit for bit, over stable
        /// and unstable queues, one and many servers, and G/G/c variability.
        #[test]
        fn the_quantile_upper_bound_is_never_below_the_quantile(
            mu in 0.1f64..5000.0,
            rho in 0.0f64..1.2,
            servers in 1u32..150,
            ca in 0.0f64..3.0,
            cs in 0.0f64..3.0,
            eps in 1e-6f64..0.5,
        ) {
            let node = TailNode { lambda: rho * mu * f64::from(servers), mu, servers };
            let exact = sojourn_quantile_bound(node, ca, cs, eps);
            let upper = sojourn_quantile_upper(node, ca, cs, eps);
            proptest::prop_assert!(upper >= exact, "{} < {}", upper, exact);
        }
    }

    proptest::proptest! {
        /// The root finding ends at the same quantile (within its 1e-12 tolerance) from the
        /// default start, from below and above the root and from the bracket's upper end, and
        /// the tail there is ε (up to rounding): the start and the converged-past-the-bracket
        /// exit change no more than the last bits.
        #[test]
        fn the_quantile_is_the_same_root_from_any_start(
            mu in 0.1f64..5000.0,
            rho in 0.0f64..0.999,
            servers in 1u32..150,
            cs in 0.5f64..2.0,
            eps in 1e-6f64..0.2,
            below in 0.2f64..1.0,
        ) {
            let node = TailNode { lambda: rho * mu * f64::from(servers), mu, servers };
            let q = sojourn_quantile_bound(node, 1.0, cs, eps);
            proptest::prop_assume!(q.is_finite() && q > 0.0);
            for start in [q * below, q / below, sojourn_quantile_upper(node, 1.0, cs, eps), 1e300] {
                let r = sojourn_quantile_bound_from(node, 1.0, cs, eps, start);
                proptest::prop_assert!((r - q).abs() <= 4e-12 * q, "{} from {}: {} vs {}", q, start, r, q);
            }
            let budget = TailBudget::new(eps);
            if let Terms::Solve { c, theta, m } = quantile_terms(node, 1.0, cs, &budget) {
                let tail = |t: f64| {
                    let em = (-m * t).exp();
                    let h = if (m - theta).abs() <= 1e-9 * m.max(theta) {
                        (1.0 + m * t) * em
                    } else {
                        (m * (-theta * t).exp() - theta * em) / (m - theta)
                    };
                    (1.0 - c) * em + c * h
                };
                proptest::prop_assert!(tail(q) <= eps * (1.0 + 1e-9), "{}: {} > {}", q, tail(q), eps);
                proptest::prop_assert!(tail(q * (1.0 - 1e-9)) > eps, "{} is not the smallest", q);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 2000,
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// One server with an exponential sojourn: the closed form is the root the Newton
        /// solver finds, within 1e-12 relative, over loads from nearly none to nearly
        /// saturated, M/M/1 and ca = cs ≥ 1; and it is the solver's result only there.
        #[test]
        fn the_single_server_closed_form_is_the_newton_root(
            mu in 0.01f64..1e5,
            rho in proptest::prop_oneof![1e-8f64..1e-3, 1e-3f64..0.999, 0.999f64..0.999_999],
            cv in proptest::prop_oneof![proptest::strategy::Just(1.0), 1.0f64..3.0],
            eps in proptest::prop_oneof![1e-9f64..1e-4, 1e-4f64..0.5],
        ) {
            let node = TailNode { lambda: rho * mu, mu, servers: 1 };
            let budget = TailBudget::new(eps);
            let Terms::Solve { c, theta, m } = quantile_terms(node, cv, cv, &budget) else {
                return Err(proptest::test_runner::TestCaseError::fail("no terms"));
            };
            proptest::prop_assert!(exponential_sojourn(cv, cv));
            let newton = newton_quantile(c, theta, m, bracket_end(c, theta, m, &budget), &budget, f64::NAN);
            let closed = sojourn_quantile_bound(node, cv, cv, eps);
            if nearly_equal(m, theta) {
                proptest::prop_assert_eq!(closed.to_bits(), newton.to_bits());
            } else {
                proptest::prop_assert_eq!(closed.to_bits(), (budget.ln_1_eps / theta).to_bits());
                proptest::prop_assert!(
                    (closed - newton).abs() <= 1e-12 * newton,
                    "closed {} vs Newton {}", closed, newton
                );
            }
            // Not exponential (ca ≠ cs, or two servers): the Newton root, bit for bit.
            for (ca, servers) in [(0.5 * cv, 1), (cv, 2)] {
                let node = TailNode { lambda: rho * mu, mu, servers };
                if let Terms::Solve { c, theta, m } = quantile_terms(node, ca, cv, &budget) {
                    let newton = newton_quantile(c, theta, m, bracket_end(c, theta, m, &budget), &budget, f64::NAN);
                    proptest::prop_assert_eq!(sojourn_quantile_bound(node, ca, cv, eps).to_bits(), newton.to_bits());
                }
            }
        }
    }

    #[test]
    fn sojourn_quantile_is_the_convolution_of_wait_and_service() {
        let node = |lambda: f64, mu: f64, servers: u32| TailNode {
            lambda,
            mu,
            servers,
        };
        // No load: the exponential service quantile ln(1/ε)/μ.
        let q = sojourn_quantile_bound(node(0.0, 10.0, 2), 1.0, 1.0, 0.01);
        assert!(close(q, 100f64.ln() / 10.0));
        // M/M/3, λ = 2, μ = 1: C = 4/9, θ = 1 = μ (the degenerate case): P(T > t) =
        // (5/9)e^(−t) + (4/9)(1 + t)e^(−t); check the tail at the result is ε.
        let t = sojourn_quantile_bound(node(2.0, 1.0, 3), 1.0, 1.0, 0.001);
        let p = (5.0 / 9.0) * (-t).exp() + (4.0 / 9.0) * (1.0 + t) * (-t).exp();
        assert!((p - 0.001).abs() < 1e-9, "{t}: {p}");
        // Near θ = μ both branches agree (continuity).
        let a = sojourn_quantile_bound(node(2.0, 1.0, 3), 1.0, 1.0 + 1e-7, 0.001);
        assert!((a - t).abs() < 1e-5 * t, "{a} vs {t}");
        // M/M/4, λ = 3, μ = 2: θ = 5 ≠ μ; the hypoexponential tail at the result is ε, and the
        // result is below the two-term union bound at ε/2 each.
        let t = sojourn_quantile_bound(node(3.0, 2.0, 4), 1.0, 1.0, 0.0025);
        let c = erlang_c(4, 1.5);
        let (m, th) = (2.0, 5.0);
        let h = (m * (-th * t).exp() - th * (-m * t).exp()) / (m - th);
        let p = (1.0 - c) * (-m * t).exp() + c * h;
        assert!((p - 0.0025).abs() < 1e-9, "{t}: {p}");
        let union = ggc_waiting_quantile(3.0, 2.0, 4, 1.0, 1.0, 0.00125) + 800f64.ln() / 2.0;
        assert!(t < union);
        // Heavier-tailed service (cs = 2): the service rate is taken as μ/cs², a larger quantile.
        assert!(sojourn_quantile_bound(node(3.0, 2.0, 4), 1.0, 2.0, 0.0025) > t);
        // M/M/1: the sojourn is exponential at μ − λ, the quantile ln(1/ε)/(μ − λ), also when
        // Newton lands on the root from below (a case found by the planner's proptest).
        for (l, m) in [
            (519.2173789454811, 1541.6182646958682),
            (50.0, 100.0),
            (0.9, 1.0),
        ] {
            let q = sojourn_quantile_bound(node(l, m, 1), 1.0, 1.0, 0.005);
            assert!((q - 200f64.ln() / (m - l)).abs() < 1e-9 * q, "{l}/{m}: {q}");
        }
        assert_eq!(
            sojourn_quantile_bound(node(8.0, 2.0, 4), 1.0, 1.0, 0.01),
            f64::INFINITY
        );
    }

    #[test]
    fn path_bound_holds_against_a_simulated_tandem() {
        // Three M/M/1 queues in tandem at λ = 50 rec/s, μ = 100, 80, 120 (ρ up to 0.63).
        let mus = [100.0, 80.0, 120.0];
        let lat = tandem_latencies(50.0, &mus, 200_000, 0x5eed);
        let nodes: Vec<TailNode> = mus
            .iter()
            .map(|&mu| TailNode {
                lambda: 50.0,
                mu,
                servers: 1,
            })
            .collect();
        for p in [0.9, 0.99, 0.999] {
            let empirical = lat[((lat.len() as f64) * p) as usize];
            let bound = path_latency_quantile_bound(&nodes, p, 1.0, 1.0);
            // Sound (above the measured quantile) and not vacuous (within 3×).
            assert!(
                bound >= empirical,
                "p{p}: bound {bound} < measured {empirical}"
            );
            assert!(
                bound <= 3.0 * empirical,
                "p{p}: bound {bound} ≫ measured {empirical}"
            );
        }
        // One M/M/1 queue: the sojourn is exponential, p99 = ln(100)/(μ − λ) exactly.
        let one = [TailNode {
            lambda: 50.0,
            mu: 100.0,
            servers: 1,
        }];
        let exact = 100f64.ln() / 50.0;
        let b = path_latency_quantile_bound(&one, 0.99, 1.0, 1.0);
        assert!((b - exact).abs() <= 1e-9 * exact, "{b} vs {exact}");
        assert_eq!(path_latency_quantile_bound(&[], 0.99, 1.0, 1.0), 0.0);
        let unstable = [TailNode {
            lambda: 100.0,
            mu: 100.0,
            servers: 1,
        }];
        assert_eq!(
            path_latency_quantile_bound(&unstable, 0.99, 1.0, 1.0),
            f64::INFINITY
        );
    }
}
