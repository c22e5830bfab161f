//! How rates flow through the job: each operator's output model (selectivity, a window's
//! bursts, a trickle's fixed rate, a silent window), the traffic equations' inputs, event-time
//! windows' watermark waits, and each operator's μ and predicted utilization ρ.

use super::*;

/// How often a windowed operator emits and whether it emits in bursts: (seconds, bursty).
/// Tumbling windows emit every `sizeMs`, sliding windows every `slideMs` (all keys' windows
/// close together: a burst at each boundary); session windows close per key `gapMs` after its
/// last record (spread out, not a burst). The period sizes the burst a window's downstream
/// receives; it is not part of a record's latency: a window result's latency counts from the
/// window's end (Flink's convention, and the engine's sink histogram: no parallelism can
/// shorten the wait for a window to close, the session gap included), see [`watermark_waits`]
/// for what a window adds beyond its end. `None` for operators that are not windowed.
pub(super) fn window_period(kind: &OperatorKind) -> Option<(f64, bool)> {
    let secs = |ms: u64| ms as f64 / 1000.0;
    match kind {
        OperatorKind::Window { size_ms, .. } => Some((secs(*size_ms), true)),
        OperatorKind::EventWindow { window, .. }
        | OperatorKind::Join {
            window: Some(window),
        } => Some(match *window {
            WindowSpec::Tumbling { size_ms } => (secs(size_ms), true),
            WindowSpec::Sliding { slide_ms, .. } => (secs(slide_ms), true),
            WindowSpec::Session { gap_ms } => (secs(gap_ms), false),
        }),
        _ => None,
    }
}

/// Fewest input records (over the metric window, all subtasks) from which an operator's
/// selectivity above 1 drives the plan: the input count's relative standard error is 1/√n (a
/// Poisson count), 10 % at 100 records, the scale-up tolerance band ([`SCALE_UP_TOLERANCE`]).
/// Below it a ratio out/in above 1 is noise that the traffic equations multiply into the
/// downstream's target rate (2 records in, 1000 out read as selectivity 500), and the
/// operator's output is taken as the fixed rate it was measured at (`OutputModel::Fixed`).
/// A selectivity up to 1 can at most pass the operator's own rate on, and stands.
pub const MIN_SELECTIVITY_RECORDS: f64 = 100.0;

/// How an operator's output rate follows its input rate in the traffic equations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum OutputModel {
    /// Output = selectivity × input (DS2's edge gain), records out per record in.
    Proportional(f64),
    /// Output at a fixed rate (records/s), whatever the input: a selectivity above 1 rests
    /// on fewer than [`MIN_SELECTIVITY_RECORDS`] input records (a trickle of input with a
    /// burst of output from a window or timers), so the measured output rate is what is known.
    Fixed(f64),
    /// A window that fires once per period emitted nothing in a metric window shorter than
    /// that period (seconds): its output rate is unknown, not 0, and no operator downstream
    /// of it is planned from this window ("a window of silence").
    Silent(f64),
}

/// The output of a window that emits in bursts ([`window_period`]), read over its period
/// rather than over the metric window: per scrape interval the operator's Σ Δrecords_in and
/// Σ Δrecords_out. `None` when the output is not bursty at the scrape resolution (every
/// interval with input has output), or an operator's row is missing (then the window-wide
/// selectivity stands). Otherwise `Some(Some(rate))`: the output in the window O over its B
/// bursts (maximal runs of intervals with output), one per firing, O / (B · period) records/s
/// (a window shorter than the period holds at most one firing, and O over the window's span
/// would overstate the rate by period / span); `Some(None)` when no burst is in a window
/// shorter than the period (silence). A window spanning a period or more without output
/// reads as rate 0 (`Some(Some(0))`).
pub(super) fn burst_output_rate(
    name: &str,
    window: &[MetricSample],
    period: f64,
    span: f64,
) -> Option<Option<f64>> {
    let totals = |s: &MetricSample| {
        s.operators.get(name).map(|subs| {
            subs.iter().fold((0.0, 0.0), |(i, o), x| {
                (i + x.records_in, o + x.records_out)
            })
        })
    };
    let mut prev = totals(window.first()?)?;
    let (mut out, mut bursts, mut silent, mut in_burst) = (0.0, 0u32, false, false);
    for s in &window[1..] {
        let cur = totals(s)?;
        let (d_in, d_out) = (cur.0 - prev.0, cur.1 - prev.1);
        prev = cur;
        if d_out > 0.0 {
            out += d_out;
            bursts += u32::from(!in_burst);
            in_burst = true;
        } else {
            silent |= d_in > 0.0;
            in_burst = false;
        }
    }
    if !silent || period.is_nan() || period <= 0.0 {
        return None;
    }
    Some(match bursts {
        0 if span < period => None,
        0 => Some(0.0),
        b => Some(out / (f64::from(b) * period)),
    })
}

/// Operator `e`'s [`OutputModel`] from the metric `window` (spanning `span` seconds);
/// `window_kind` is its [`window_period`], `name` its name in the samples. Sources and
/// operators without input keep their estimate's selectivity (1 and the prior 1).
pub(super) fn output_model(
    e: &OperatorEstimate,
    window_kind: Option<(f64, bool)>,
    name: &str,
    window: &[MetricSample],
    span: f64,
) -> OutputModel {
    if e.source.is_some() {
        return OutputModel::Proportional(e.selectivity);
    }
    let records_in = e.input_rate * span;
    let burst = match window_kind {
        Some((period, true)) => burst_output_rate(name, window, period, span),
        _ => None,
    };
    let out_rate = match burst {
        Some(None) => return OutputModel::Silent(window_kind.map_or(0.0, |(p, _)| p)),
        Some(Some(rate)) => Some(rate),
        None => None,
    };
    let fixed = out_rate.unwrap_or(e.output_rate);
    if records_in > 0.0 && records_in < MIN_SELECTIVITY_RECORDS && fixed > e.input_rate {
        return OutputModel::Fixed(fixed);
    }
    match out_rate {
        Some(rate) if e.input_rate > 0.0 => OutputModel::Proportional(rate / e.input_rate),
        _ => OutputModel::Proportional(e.selectivity),
    }
}

/// The traffic equations' inputs from every operator's [`OutputModel`], indexed like the
/// topology: edge gains (selectivity; 0 for a fixed or unknown output), the fixed output
/// rate each operator injects into every one of its outputs (records/s), and whether an
/// operator's arrival rate is unknown (downstream of a silent window, feedback edges not
/// followed).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Flow {
    pub(super) gain: Vec<f64>,
    pub(super) fixed: Vec<f64>,
    pub(super) inject: Vec<f64>,
    pub(super) unknown: Vec<bool>,
    /// The silent window upstream of each operator whose rate is unknown (its index).
    pub(super) silent_from: Vec<Option<usize>>,
}

impl Flow {
    pub(super) fn of(topo: &Topology, outputs: &[OutputModel]) -> Flow {
        let n = topo.len();
        let mut f = Flow {
            gain: vec![0.0; n],
            fixed: vec![0.0; n],
            inject: vec![0.0; n],
            unknown: vec![false; n],
            silent_from: vec![None; n],
        };
        for (i, m) in outputs.iter().enumerate() {
            match *m {
                OutputModel::Proportional(g) => f.gain[i] = g,
                OutputModel::Fixed(rate) => f.fixed[i] = rate,
                OutputModel::Silent(_) => f.silent_from[i] = Some(i),
            }
        }
        for i in 0..n {
            for &u in topo.inputs[i].iter().filter(|&&u| u < i) {
                f.inject[i] += f.fixed[u];
                if let Some(w) = f.silent_from[u].filter(|_| !f.unknown[i]) {
                    f.unknown[i] = true;
                    f.silent_from[i] = f.silent_from[i].or(Some(w));
                }
            }
        }
        f
    }

    /// `gamma` (external arrivals per operator, records/s) plus the fixed outputs injected
    /// (borrowed as it is when no operator has a fixed output, the usual case).
    pub(super) fn injected<'a>(&self, gamma: &'a [f64]) -> Cow<'a, [f64]> {
        if self.inject.iter().all(|&x| x == 0.0) {
            return Cow::Borrowed(gamma);
        }
        Cow::Owned(gamma.iter().zip(&self.inject).map(|(g, x)| g + x).collect())
    }

    /// Operator `i`'s output rate at input rate `lambda` (records/s).
    pub(super) fn out_rate(&self, i: usize, lambda: f64) -> f64 {
        self.gain[i] * lambda + self.fixed[i]
    }
}

/// Seconds by which each operator's window results trail their windows' ends, indexed like
/// `topo` (empty when the job has no event-time windowed operator): an event-time window
/// (`eventWindow`, a windowed `join`) fires when the watermark passes its end, and a Nexmark
/// source's watermark trails the largest event time it emitted by its `maxOutOfOrdernessMs`
/// bound B (`engine/src/nexmark/source.rs`), so a window ending at event time e fires once the
/// source has emitted event time e + B: B·`eventRate`/1000 events later, B·`eventRate`/(1000·γ)
/// seconds at the source's measured rate γ (records/s; B of event time when γ is 0). The
/// input watermark is the minimum over the upstream sources, so the slowest one counts. No
/// allowed lateness is added: the engine's event-time windows have none (late records are
/// dropped). Processing-time windows fire at their end: 0. `gamma` is indexed like `topo`.
pub(super) fn watermark_waits(topo: &Topology, spec: &JobSpec, gamma: &[f64]) -> Vec<f64> {
    let event_time = |k: &OperatorKind| {
        matches!(
            k,
            OperatorKind::EventWindow { .. } | OperatorKind::Join { window: Some(_) }
        )
    };
    if !spec.operators.iter().any(|o| event_time(&o.kind)) {
        return Vec::new();
    }
    let n = topo.len();
    let mut nexmark = vec![None; n];
    for o in &spec.operators {
        if let (
            Some(&i),
            OperatorKind::Source {
                nexmark: Some(x), ..
            },
        ) = (topo.index.get(&o.name), &o.kind)
        {
            let bound = x.max_out_of_orderness_ms as f64 / 1000.0;
            let g = gamma.get(i).copied().unwrap_or(0.0);
            nexmark[i] = Some(if g > 0.0 {
                bound * x.event_rate as f64 / g
            } else {
                bound
            });
        }
    }
    let mut waits = vec![0.0; n];
    for o in spec.operators.iter().filter(|o| event_time(&o.kind)) {
        let Some(&i) = topo.index.get(&o.name) else {
            continue;
        };
        // The Nexmark sources upstream of `i` (loops included: each operator visited once).
        let (mut seen, mut stack, mut wait) = (vec![false; n], vec![i], 0.0_f64);
        while let Some(j) = stack.pop() {
            if std::mem::replace(&mut seen[j], true) {
                continue;
            }
            if let Some(w) = nexmark[j] {
                wait = wait.max(w);
            }
            stack.extend(topo.inputs[j].iter().copied().filter(|&u| !seen[u]));
        }
        waits[i] = wait;
    }
    waits
}

impl Model {
    /// Arrival rate to size operator `i` against as if its `p` subtasks were evenly loaded:
    /// λ · max_share(p) · p, so that λ_eff / p is the busiest subtask's arrival rate.
    pub(super) fn effective_lambda(&self, i: usize, lambda: f64, p: u32) -> f64 {
        lambda * self.max_share(i, p) * f64::from(p.max(1))
    }

    /// Predicted utilization ρ of operator `i`'s busiest subtask at `p` and the target rate.
    pub(super) fn predicted_rho(&self, i: usize, p: u32) -> Option<f64> {
        self.rho_at_rate(i, p, self.lambda_target[i])
    }

    /// ρ of operator `i`'s busiest subtask at `p` subtasks and the target rate without the
    /// backlog of the rescale's own downtime ([`Model::utilization_at`]).
    pub(super) fn staying_rho(&self, i: usize, p: u32) -> Option<f64> {
        let lambda = if self.with_downtime {
            self.lambda_target_hold[i]
        } else {
            self.lambda_target[i]
        };
        self.rho_at_rate(i, p, lambda)
    }

    /// ρ of operator `i`'s busiest subtask at `p` subtasks and arrival rate `lambda` (μ at `p`,
    /// or a Kafka source's μ; `None` without one).
    fn rho_at_rate(&self, i: usize, p: u32, lambda: f64) -> Option<f64> {
        self.mu_at(i, p)
            .or_else(|| self.source_mu(i))
            .map(|m| self.effective_lambda(i, lambda, p) / (f64::from(p.max(1)) * m))
    }

    /// The rate operator `i` is sized against at ρ_target, records/s: max(λ_steady, ρ_target ·
    /// λ_target). Utilization headroom is for the steady arrival rate; a backlog (the current
    /// one and the rescale's own) drains on the subtasks' full capacity within the catch-up
    /// time, so p · μ ≥ λ_target suffices for it. Sizing p · ρ_target · μ ≥ this rate meets
    /// both: the smallest parallelism that keeps the steady rate at the target utilization
    /// and drains the backlog in time (sizing λ_target at ρ_target would reserve the headroom
    /// for the drain as well, up to 1/ρ_target times the capacity the drain needs).
    pub(super) fn lambda_size(&self, i: usize) -> f64 {
        self.lambda_steady[i].max(self.s.rho * self.lambda_target[i])
    }

    /// Predicted ρ of operator `i`'s busiest subtask at `p` for the sizing rate
    /// ([`Model::lambda_size`]): compared with ρ_target and its scale-up tolerance band.
    pub(super) fn sizing_rho(&self, i: usize, p: u32) -> Option<f64> {
        self.rho_at_rate(i, p, self.lambda_size(i))
    }

    /// Utilization ρ of operator `i`'s busiest subtask at parallelism `p` and the steady
    /// arrival rate (μ at `p`, or a Kafka source's μ; `None` without one): λ_eff / (p · μ).
    pub(super) fn steady_rho(&self, i: usize, p: u32) -> Option<f64> {
        self.rho_at_rate(i, p, self.lambda_steady[i])
    }

    /// The partition count of Kafka source `i` (`None` for other operators).
    pub(super) fn partitions(&self, i: usize) -> Option<u32> {
        self.est[i]
            .source
            .and_then(|s| s.partitions)
            .filter(|&n| n > 0)
    }

    /// A Kafka source's μ per subtask (records read per busy second,
    /// [`SourceEstimate::processing_rate`](super::estimate::SourceEstimate::processing_rate));
    /// `None` for other operators. Kept apart from [`Model::mu`]: a source has no sojourn in
    /// the latency prediction.
    pub(super) fn source_mu(&self, i: usize) -> Option<f64> {
        let src = self.est[i].source?;
        src.partitions?;
        src.processing_rate.filter(|m| m.is_finite() && *m > 0.0)
    }

    /// μ per subtask (records/s) expected at parallelism `p`: the measured μ, times the learned
    /// scalability factor above the current parallelism (Lohrmann et al. ICDCS'15 fitting
    /// factor; see [`super::learn`]).
    pub(super) fn mu_at(&self, i: usize, p: u32) -> Option<f64> {
        let mu = self.mu(i)?;
        Some(if p > self.est[i].parallelism {
            mu * self.factor[i]
        } else {
            mu
        })
    }

    /// μ per subtask at the current parallelism (records/s); `None` for sources, when the
    /// window has too little busy time, and when the operator's arrival rate is unknown
    /// (downstream of a silent window, [`OutputModel::Silent`]): such an operator keeps its
    /// parallelism and is left out of the latency prediction.
    pub(super) fn mu(&self, i: usize) -> Option<f64> {
        if self.graph.topo.is_source[i] || self.flow.unknown[i] {
            None
        } else {
            self.est[i].true_processing_rate
        }
    }

    /// Whether operator `i` at `p` subtasks (μ per subtask) cannot keep up with its steady
    /// arrival rate (its busiest subtask at ρ ≥ 1).
    pub(super) fn overloaded(&self, i: usize, p: u32, mu: f64) -> bool {
        self.effective_lambda(i, self.lambda_steady[i], p) >= f64::from(p.max(1)) * mu
    }

    /// The rate operator `i` passes on at most at `p` subtasks, records/s: the input rate at
    /// which its busiest subtask saturates, μ(p) / (its share of the input at p)
    /// ([`Model::mu_at`], [`Model::max_share`]); ∞ when μ is unknown (a source, too little
    /// busy time).
    pub(super) fn capacity_at(&self, i: usize, p: u32) -> f64 {
        self.mu_at(i, p)
            .map_or(f64::INFINITY, |mu| mu / self.max_share(i, p))
    }
}
