//! Fast mode: a fluid, discrete-time model of the job.
//!
//! Per step of `dt` seconds, records flow as a continuous quantity. Each operator has
//! `servers` effective servers of rate μ = 1/service time (keyed operators: 1 / hottest
//! key-group share), a bounded input queue of `channelCapacity` records per subtask, and
//! backpressure: a reverse topological pass computes how much each operator may accept (free
//! queue room plus what it can process given its own downstream room), then a forward pass
//! moves records. Nothing is ever dropped, so per operator `received = processed + queued`
//! and per source `arrived = emitted + backlog` hold exactly at every step.
//!
//! Latency: deterministic queueing delay (queued records / drain rate, source backlog / rate)
//! plus the stochastic sojourn of the planner's own formulas (Allen-Cunneen / Kingman) at the
//! step's arrival rate, with the variance of [`JobModel::sojourn_variance`], combined along
//! every source-to-sink path ([`JobModel::path_latency`]), at the SLO's percentile
//! ([`JobModel::slo_quantile`]) and, when that is not 0.99, at p99 as well. The formulas'
//! arrival variability ca² is the sources' (1 for Poisson arrivals, 0 for `arrivals: paced`)
//! carried through the network with the Queueing Network Analyzer's departure, splitting and
//! merging rules ([`JobModel::input_scv`], [`JobModel::output_scv`]): exactly 1 everywhere with
//! Poisson arrivals and exponential service. A window is a keyed operator whose output is
//! thinned by its selectivity and not held until the window closes: a window result's latency
//! counts from the window's end (Flink's convention, as the engine's sink histogram, the
//! planner and the event mode count it), and its boundary burst is not modelled.
//!
//! Service rates: constant per operator, or replayed over time
//! ([`JobModel::with_service_rates`]); a step uses each operator's mean service time over the
//! step ([`JobModel::service_s_over`]).
//!
//! Speed: a step whose inputs (state at its start, arrivals, length, time still down) are
//! bit-for-bit those of the previous step has the very same outputs, so it is replayed by
//! adding the previous step's increments instead of recomputing queueing delays and latency
//! quantiles. Piecewise-constant traces spend most steps in such stationary stretches.

use crate::model::{JobModel, OpKind, Quantile, StepLatency, hash64};
use crate::plant::{OpCounters, Plant, Snapshot, StepStats, capacity};

/// A memoized sojourn: (arrival rate records/s, service time s, arrival SCV, sojourn s, its
/// variance s²).
type SojournMemo = (f64, f64, f64, f64, f64);

/// The fluid deployment.
#[derive(Debug, Clone)]
pub struct FluidPlant<'m> {
    model: &'m JobModel,
    p: Vec<u32>,
    servers: Vec<f64>,
    queue: Vec<f64>,
    backlog: Vec<f64>,
    counters: Vec<OpCounters>,
    /// Lifetime totals: received and processed per operator; arrived and emitted per source.
    received: Vec<f64>,
    processed: Vec<f64>,
    last_rate: Vec<f64>,
    down_until: f64,
    // Scratch buffers.
    max_in: Vec<f64>,
    max_out: Vec<f64>,
    limit: Vec<f64>,
    inflow: Vec<f64>,
    delay: Vec<f64>,
    soj: Vec<f64>,
    /// Variance of each operator's sojourn, s² ([`JobModel::sojourn_variance`]).
    soj_var: Vec<f64>,
    /// Squared coefficient of variation of each operator's output stream in the step
    /// ([`JobModel::output_scv`]).
    out_scv: Vec<f64>,
    /// Records/s leaving each operator in the step (its input's rate for a source).
    out_rate: Vec<f64>,
    gamma: Vec<f64>,
    /// Mean service time of each operator over the step, seconds ([`JobModel::service_s_over`]).
    svc: Vec<f64>,
    /// Inputs of the last fully computed step: `[dt, up, still down, arrivals..., service
    /// times (replayed rates only)..., queue..., backlog..., last_rate...]`; empty when invalid
    /// (after a rescale).
    key: Vec<f64>,
    /// Whether the last computed step left the state (queues, backlogs, rates) as it found it.
    fixed: bool,
    /// Increments of the last fully computed step: counters, received, processed.
    inc: Vec<OpCounters>,
    inc_received: Vec<f64>,
    inc_processed: Vec<f64>,
    /// Statistics of the last fully computed step.
    last_stats: StepStats,
    /// Hash of the last computed step's inputs and parallelism (a chain of 64-bit finalizer
    /// mixes): the class of the last step ([`Plant::step_class`]), computed when first asked
    /// for (most policies never ask).
    class: std::cell::Cell<Option<u64>>,
    /// Selectivity of each operator in the step being computed (at its last input rate).
    sel: Vec<f64>,
    /// Per operator: the last sojourn computed, as (arrival rate, service time, arrival SCV,
    /// sojourn, its variance); valid for the running parallelism only (cleared on rescale).
    soj_memo: Vec<Option<SojournMemo>>,
    /// The last capacity computed and the source rates and service times it was for (cleared
    /// on rescale).
    cap_memo: Option<(Vec<f64>, Vec<f64>, f64)>,
    /// Whether steps report [`StepStats::p99_engine_s`].
    engine_p99: bool,
}

impl<'m> FluidPlant<'m> {
    /// A deployment of `model` at parallelism `p`, empty queues, no backlog.
    pub fn new(model: &'m JobModel, p: &[u32]) -> FluidPlant<'m> {
        let n = model.ops.len();
        let mut f = FluidPlant {
            model,
            p: p.to_vec(),
            servers: vec![0.0; n],
            queue: vec![0.0; n],
            backlog: vec![0.0; n],
            counters: vec![OpCounters::default(); n],
            received: vec![0.0; n],
            processed: vec![0.0; n],
            last_rate: vec![0.0; n],
            down_until: f64::NEG_INFINITY,
            max_in: vec![0.0; n],
            max_out: vec![0.0; n],
            limit: vec![0.0; n],
            inflow: vec![0.0; n],
            delay: vec![0.0; n],
            soj: vec![0.0; n],
            soj_var: vec![0.0; n],
            out_scv: vec![0.0; n],
            out_rate: vec![0.0; n],
            gamma: vec![0.0; n],
            svc: model.ops.iter().map(|o| o.service_s).collect(),
            key: Vec::new(),
            fixed: false,
            inc: vec![OpCounters::default(); n],
            inc_received: vec![0.0; n],
            inc_processed: vec![0.0; n],
            last_stats: StepStats::default(),
            class: std::cell::Cell::new(None),
            sel: vec![0.0; n],
            soj_memo: vec![None; n],
            cap_memo: None,
            engine_p99: false,
        };
        f.set_servers();
        f
    }

    /// Also report the p99 as the engine's sink histogram would ([`StepStats::p99_engine_s`]:
    /// the worst path's latency law read through the histogram's buckets).
    pub fn with_engine_p99(mut self, on: bool) -> Self {
        self.engine_p99 = on;
        self
    }

    /// A step with the same inputs as the last computed one: the same increments and statistics
    /// (the state is a fixed point, see the module docs).
    fn repeat_step(&mut self) -> StepStats {
        self.apply_increments()
    }

    /// Adds the last computed step's increments to the counters and lifetime totals, sets the
    /// gauges, and returns its statistics with the conservation error of the new totals.
    fn apply_increments(&mut self) -> StepStats {
        let m = self.model;
        let mut conservation: f64 = 0.0;
        for i in 0..m.ops.len() {
            let (c, d) = (&mut self.counters[i], &self.inc[i]);
            c.records_in += d.records_in;
            c.records_out += d.records_out;
            c.busy_s += d.busy_s;
            c.idle_s += d.idle_s;
            c.backpressured_s += d.backpressured_s;
            c.arrivals += d.arrivals;
            c.queue = self.queue[i];
            c.backlog = self.backlog[i];
            self.received[i] += self.inc_received[i];
            self.processed[i] += self.inc_processed[i];
            let held = if m.ops[i].kind == OpKind::Source {
                self.backlog[i]
            } else {
                self.queue[i]
            };
            conservation = conservation.max((self.received[i] - self.processed[i] - held).abs());
        }
        StepStats {
            conservation_error: conservation,
            ..self.last_stats
        }
    }

    fn set_servers(&mut self) {
        for i in 0..self.model.ops.len() {
            self.servers[i] = self.model.effective_servers(i, self.p[i]);
        }
    }
}

impl Plant for FluidPlant<'_> {
    fn advance(&mut self, t: f64, dt: f64, arrivals_in: &[f64]) -> StepStats {
        let m = self.model;
        let n = m.ops.len();
        let up = (t + dt - t.max(self.down_until)).clamp(0.0, dt);
        // Time still down after this step adds to every record's latency.
        let still_down = (self.down_until - (t + dt)).max(0.0);
        // Replayed service rates: each operator's mean service time over the step, an external
        // input of the step (constant otherwise, and then not part of the key).
        let replayed = m.has_service_series();
        if replayed {
            m.service_times_over(t, t + dt, &mut self.svc);
        }
        let svc_len = if replayed { n } else { 0 };
        // A step repeats the last computed one when that one was a fixed point (it left the
        // state as it found it) and the external inputs are the same: then the whole key is.
        let ext = 3 + arrivals_in.len() + svc_len;
        if self.fixed
            && self.key.len() >= ext
            && self.key[..3] == [dt, up, still_down]
            && self.key[3..3 + arrivals_in.len()] == *arrivals_in
            && self.key[3 + arrivals_in.len()..ext] == self.svc[..svc_len]
        {
            return self.repeat_step();
        }
        self.key.clear();
        self.key.extend_from_slice(&[dt, up, still_down]);
        self.key.extend_from_slice(arrivals_in);
        self.key.extend_from_slice(&self.svc[..svc_len]);
        self.key.extend_from_slice(&self.queue);
        self.key.extend_from_slice(&self.backlog);
        self.key.extend_from_slice(&self.last_rate);
        self.class.set(None);
        self.inc.iter_mut().for_each(|c| *c = OpCounters::default());
        self.inc_received.iter_mut().for_each(|x| *x = 0.0);
        self.inc_processed.iter_mut().for_each(|x| *x = 0.0);
        // Reverse pass: how much each operator may accept this step.
        for i in (0..n).rev() {
            let op = &m.ops[i];
            let mut out = f64::INFINITY;
            for &j in &op.outputs {
                out = out.min(self.max_in[j] / m.ops[j].inputs.len().max(1) as f64);
            }
            self.max_out[i] = out;
            if op.kind == OpKind::Source {
                continue;
            }
            let cap = self.servers[i] * up / self.svc[i];
            let sel = m.selectivity(i, self.last_rate[i]);
            self.sel[i] = sel;
            let by_output = if sel > 0.0 { out / sel } else { f64::INFINITY };
            self.limit[i] = cap.min(by_output);
            let qcap = m.channel_capacity * f64::from(self.p[i]);
            self.max_in[i] = (qcap - self.queue[i]).max(0.0) + self.limit[i];
        }
        // Forward pass.
        self.inflow.iter_mut().for_each(|x| *x = 0.0);
        self.gamma.iter_mut().for_each(|x| *x = 0.0);
        let mut arrivals = 0.0;
        for ((s, _), &a) in m.sources.iter().zip(arrivals_in) {
            let a = a.max(0.0);
            arrivals += a;
            self.gamma[*s] += a / dt;
            self.inc[*s].arrivals += a;
            self.inc_received[*s] += a;
        }
        for i in 0..n {
            let op = &m.ops[i];
            let c = &mut self.inc[i];
            let slots = f64::from(self.p[i]) * up;
            if op.kind == OpKind::Source {
                let avail = self.backlog[i] + self.gamma[i] * dt;
                let e = if up > 0.0 {
                    avail.min(self.max_out[i])
                } else {
                    0.0
                };
                self.backlog[i] = avail - e;
                self.delay[i] = self.backlog[i] / self.gamma[i].max(e / dt).max(1e-9);
                self.soj[i] = 0.0;
                self.soj_var[i] = 0.0;
                self.out_rate[i] = e / dt;
                self.out_scv[i] = m.source_scv();
                c.records_out += e;
                c.backpressured_s += if e < avail { slots } else { 0.0 };
                c.idle_s += if e < avail { 0.0 } else { slots };
                self.inc_processed[i] += e;
                for &j in &op.outputs {
                    self.inflow[j] += e;
                }
                continue;
            }
            let inflow = self.inflow[i];
            self.inc_received[i] += inflow;
            let avail = self.queue[i] + inflow;
            let done = avail.min(self.limit[i]);
            self.queue[i] = avail - done;
            self.inc_processed[i] += done;
            let rate_in = inflow / dt;
            // The selectivity at the last rate, as the reverse pass computed it.
            let sel = self.sel[i];
            self.last_rate[i] = rate_in;
            let out = done * sel;
            for &j in &op.outputs {
                self.inflow[j] += out;
            }
            let service_s = self.svc[i];
            let busy = (done * service_s).min(slots);
            c.records_in += done;
            c.records_out += out;
            c.busy_s += busy;
            let cap = self.servers[i] * up / service_s;
            if self.limit[i] < cap && done >= self.limit[i] && avail > done {
                c.backpressured_s += slots - busy;
            } else {
                c.idle_s += slots - busy;
            }
            // Latency pieces: drain time of the queue ahead plus the stochastic sojourn.
            let drain = self.servers[i] / service_s;
            self.delay[i] = self.queue[i] / drain;
            let lambda = rate_in.min(drain);
            // Variability of the input stream: the sources' (Poisson or paced) carried through
            // the upstream queues (QNA's departure, splitting and merging rules).
            let ca2 = m.input_scv(i, &self.out_rate, &self.out_scv);
            (self.soj[i], self.soj_var[i]) = match self.soj_memo[i] {
                Some((l, sv, c, soj, var)) if l == lambda && sv == service_s && c == ca2 => {
                    (soj, var)
                }
                _ => {
                    let soj = m.sojourn(i, lambda, self.p[i], self.servers[i], service_s, ca2);
                    let var = m.sojourn_variance(i, soj, service_s);
                    self.soj_memo[i] = Some((lambda, service_s, ca2, soj, var));
                    (soj, var)
                }
            };
            self.out_rate[i] = out / dt;
            let rho = done * service_s / (self.servers[i] * dt).max(1e-12);
            self.out_scv[i] = m.output_scv(i, ca2, rho, self.servers[i], sel);
        }
        // Latency at the SLO's percentile, and the p99 (the same unless the SLO is on another).
        let (mut at_q, mut tail) = m.path_latency(&self.delay, &self.soj, &self.soj_var);
        let p99_too = !m.slo_quantile.is_p99();
        let mut p99 = if p99_too {
            m.path_latency_at(&Quantile::P99, &self.delay, &self.soj, &self.soj_var)
                .0
        } else {
            at_q
        };
        // Down for part of the step (a rescale at its start): the records that arrived
        // meanwhile waited for the restart as well.
        let down_here = if up > 0.0 { dt - up } else { 0.0 };
        let law = (down_here > 0.0 || self.engine_p99).then(|| {
            let (d, mean, var) = m.worst_path_law(&self.delay, &self.soj, &self.soj_var);
            StepLatency {
                d,
                m: mean,
                v: var,
                f: down_here / dt,
                down: down_here,
            }
        });
        if let Some(l) = law.filter(|_| down_here > 0.0) {
            at_q = at_q.max(l.quantile(&m.slo_quantile));
            p99 = if p99_too { p99.max(l.p99()) } else { at_q };
            tail = tail.max(l.tail(m.slo_s));
        }
        let p99 = p99 + still_down;
        let at_q = at_q + still_down;
        let tail = if still_down > m.slo_s { 1.0 } else { tail };
        let p99_engine_s = law
            .filter(|_| self.engine_p99)
            .and_then(|l| crate::plant::engine_p99_of_cdf(|x| 1.0 - l.tail(x - still_down)));
        let n_state = self.queue.len();
        let state = &self.key[ext..];
        self.fixed = state.len() == 3 * n_state
            && state[..n_state] == *self.queue
            && state[n_state..2 * n_state] == *self.backlog
            && state[2 * n_state..] == *self.last_rate;
        self.last_stats = StepStats {
            arrivals,
            p99_s: Some(p99),
            slo_latency_s: Some(at_q),
            p99_engine_s,
            late: arrivals * tail,
            backlog: m.sources.iter().map(|(s, _)| self.backlog[*s]).sum(),
            queued: self.queue.iter().sum(),
            capacity: match &self.cap_memo {
                Some((g, sv, c)) if *g == self.gamma && *sv == self.svc => *c,
                _ => {
                    let c = capacity(m, &self.servers, &self.svc, &self.gamma, &mut self.limit);
                    self.cap_memo = Some((self.gamma.clone(), self.svc.clone(), c));
                    c
                }
            },
            conservation_error: 0.0,
        };
        self.apply_increments()
    }

    fn step_class(&self) -> Option<u64> {
        if let Some(c) = self.class.get() {
            return Some(c);
        }
        let mut h: u64 = 0x243f_6a88_85a3_08d3;
        for x in &self.key {
            h = hash64(h ^ x.to_bits());
        }
        for p in &self.p {
            h = hash64(h ^ u64::from(*p));
        }
        self.class.set(Some(h));
        Some(h)
    }

    fn snapshot(&self, at_s: f64) -> Snapshot {
        Snapshot {
            at_s,
            ops: self.counters.clone(),
        }
    }

    fn parallelism(&self) -> &[u32] {
        &self.p
    }

    fn snapshot_into(&self, at_s: f64, out: &mut Snapshot) {
        out.at_s = at_s;
        out.ops.clone_from(&self.counters);
    }

    fn rescale(&mut self, p: &[u32], t: f64, downtime_s: f64) {
        self.p = p.to_vec();
        self.set_servers();
        self.key.clear();
        self.class.set(None);
        self.soj_memo.iter_mut().for_each(|x| *x = None);
        self.cap_memo = None;
        self.fixed = false;
        self.down_until = t + downtime_s;
        for (i, c) in self.counters.iter_mut().enumerate() {
            *c = OpCounters {
                queue: self.queue[i],
                backlog: self.backlog[i],
                ..OpCounters::default()
            };
        }
    }
}
