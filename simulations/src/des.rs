//! Event-level mode: a discrete-event simulation of the job, record by record, for short
//! windows; it checks the fast mode.
//!
//! Arrivals at each source are Poisson at the step's mean trace rate (exponential gaps,
//! resampled at step boundaries, which is exact for a piecewise-constant rate), or, with
//! `arrivals: paced` ([`crate::config::Arrivals`]), evenly spaced as the engine's source emits
//! them (record k when ∫ rate reaches k; the fraction of a record due carries across steps). Each operator
//! has `p` servers; service times are gamma-distributed with the configured mean and
//! coefficient of variation (exponential at CV 1; statrs sampling, seeded). Keyed operators
//! have one queue per subtask and route each record by its key's key group (Flink's
//! assignment, as the engine); other operators share one queue. Queues hold `channelCapacity`
//! records per subtask; a server whose output queue is full holds its record, blocked
//! (backpressure), and a source whose output is full keeps arrivals in its backlog. Latency is
//! measured per record from its arrival at the source to a sink. A window passes each record
//! it keeps (its selectivity: one per active key and period) on after its service, without
//! holding it until the window closes: a window result's latency counts from the window's end
//! (Flink's convention; the engine's sink histogram and the planner count it so), and the wait
//! for a window to close is not latency. Not modelled: the burst a window emits at its
//! boundary (the planner adds its drain downstream) and the engine's stamp of a result with
//! the largest delay among its pane's records.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rand::SeedableRng;
use rand::rngs::StdRng;
use statrs::distribution::{Exp, Gamma};

use crate::model::{JobModel, OpKind, hash64};
use crate::plant::{OpCounters, Plant, Snapshot, StepStats, capacity};
use streamscale_engine::keygroup::{key_group, subtask_for_key_group};

#[derive(Debug, Clone, Copy)]
struct Rec {
    born: f64,
    seq: u64,
}

#[derive(Debug, Clone, Default)]
struct Server {
    /// Record in service, or held while blocked.
    holding: Option<Rec>,
    /// Downstream operators still to receive the held record (blocked when non-empty and done).
    pending: Vec<usize>,
    done: bool,
    blocked_since: f64,
    /// Service start time and duration.
    busy: (f64, f64),
    /// Since when the server holds no record (idle), simulated seconds.
    idle_since: f64,
}

#[derive(Debug)]
enum Service {
    Fixed(f64),
    Gamma(Gamma),
    Exp(Exp),
}

/// The event-level deployment.
#[derive(Debug)]
pub struct DesPlant<'m> {
    model: &'m JobModel,
    p: Vec<u32>,
    servers_eff: Vec<f64>,
    queues: Vec<Vec<VecDeque<Rec>>>,
    servers: Vec<Vec<Server>>,
    service: Vec<Service>,
    backlog: Vec<VecDeque<Rec>>,
    next_arrival: Vec<f64>,
    /// Paced arrivals: per source operator, the records due but not emitted at the step's start
    /// (in [0, 1], up to rounding).
    phase: Vec<f64>,
    seq: Vec<u64>,
    counters: Vec<OpCounters>,
    received: Vec<u64>,
    processed: Vec<u64>,
    events: BinaryHeap<Reverse<(u64, usize, usize, u64)>>,
    event_seq: u64,
    rng: StdRng,
    now: f64,
    down_until: f64,
    started: f64,
    latencies: Vec<f64>,
    rate_in: Vec<f64>,
}

/// Event times are kept as integer nanoseconds in the heap for a total order.
fn ns(t: f64) -> u64 {
    (t * 1e9).round().max(0.0) as u64
}

impl<'m> DesPlant<'m> {
    /// A deployment of `model` at parallelism `p`, seeded with `seed`.
    pub fn new(model: &'m JobModel, p: &[u32], seed: u64) -> DesPlant<'m> {
        let n = model.ops.len();
        let service = model
            .ops
            .iter()
            .map(|o| {
                let (m, cv) = (o.service_s, o.cv);
                if cv <= 1e-9 {
                    Service::Fixed(m)
                } else if (cv - 1.0).abs() < 1e-12 {
                    Exp::new(1.0 / m).map_or(Service::Fixed(m), Service::Exp)
                } else {
                    let shape = 1.0 / (cv * cv);
                    Gamma::new(shape, shape / m).map_or(Service::Fixed(m), Service::Gamma)
                }
            })
            .collect();
        let mut d = DesPlant {
            model,
            p: p.to_vec(),
            servers_eff: vec![0.0; n],
            queues: vec![Vec::new(); n],
            servers: vec![Vec::new(); n],
            service,
            backlog: vec![VecDeque::new(); n],
            next_arrival: vec![f64::INFINITY; n],
            phase: vec![0.0; n],
            seq: vec![0; n],
            counters: vec![OpCounters::default(); n],
            received: vec![0; n],
            processed: vec![0; n],
            events: BinaryHeap::new(),
            event_seq: 0,
            rng: StdRng::seed_from_u64(seed),
            now: 0.0,
            down_until: f64::NEG_INFINITY,
            started: 0.0,
            latencies: Vec::new(),
            rate_in: vec![0.0; n],
        };
        d.layout(Vec::new());
        d
    }

    /// (Re)creates queues and servers for the current parallelism and re-routes `records`
    /// (per operator) into them.
    fn layout(&mut self, records: Vec<Vec<Rec>>) {
        let m = self.model;
        for i in 0..m.ops.len() {
            let p = self.p[i].max(1) as usize;
            self.servers_eff[i] = m.effective_servers(i, self.p[i]);
            let nq = if m.ops[i].keyed { p } else { 1 };
            self.queues[i] = vec![VecDeque::new(); nq];
            let idle = Server {
                idle_since: self.down_until.max(self.now),
                ..Server::default()
            };
            self.servers[i] = vec![
                idle;
                if m.ops[i].kind == OpKind::Source {
                    0
                } else {
                    p
                }
            ];
        }
        for (i, recs) in records.into_iter().enumerate() {
            for r in recs {
                let q = self.queue_of(i, r.seq);
                self.queues[i][q].push_back(r);
            }
        }
    }

    fn queue_of(&self, i: usize, seq: u64) -> usize {
        let m = self.model;
        if !m.ops[i].keyed {
            return 0;
        }
        let key = hash64(seq) % m.keys.max(1);
        subtask_for_key_group(key_group(key, m.key_groups), self.p[i], m.key_groups)
            .min(self.queues[i].len() - 1)
    }

    fn queue_cap(&self, i: usize) -> usize {
        let c = self.model.channel_capacity as usize;
        if self.model.ops[i].keyed {
            c
        } else {
            c * self.p[i].max(1) as usize
        }
    }

    fn has_room(&self, j: usize, seq: u64) -> bool {
        let q = self.queue_of(j, seq);
        self.queues[j][q].len() < self.queue_cap(j)
    }

    /// A service time of operator `i` starting now, seconds: drawn from the operator's law
    /// (mean [`OpModel::service_s`](crate::model::OpModel::service_s)) and, when its rate is
    /// replayed ([`JobModel::with_service_rates`]), scaled by the replayed mean service time
    /// at this instant over the nominal one (the CV is kept).
    fn sample_service(&mut self, i: usize) -> f64 {
        use rand::distr::Distribution;
        let x = match &self.service[i] {
            Service::Fixed(m) => *m,
            Service::Gamma(g) => g.sample(&mut self.rng),
            Service::Exp(e) => e.sample(&mut self.rng),
        };
        let m = self.model;
        if m.has_service_series() {
            x * (m.service_s_over(i, self.now, self.now) / m.ops[i].service_s)
        } else {
            x
        }
    }

    fn schedule(&mut self, t: f64, op: usize, server: usize) {
        self.event_seq += 1;
        self.events
            .push(Reverse((ns(t), op, server, self.event_seq)));
    }

    /// Starts service on every idle server of operator `i` that has a record waiting.
    fn start_services(&mut self, i: usize) {
        if self.now < self.down_until {
            return;
        }
        let keyed = self.model.ops[i].keyed;
        for s in 0..self.servers[i].len() {
            if self.servers[i][s].holding.is_some() {
                continue;
            }
            let q = if keyed { s } else { 0 };
            let Some(r) = self.queues[i][q].pop_front() else {
                continue;
            };
            let d = self.sample_service(i);
            let srv = &mut self.servers[i][s];
            self.counters[i].idle_s += (self.now - srv.idle_since).max(0.0);
            srv.holding = Some(r);
            srv.done = false;
            srv.busy = (self.now, d);
            self.counters[i].records_in += 1.0;
            self.schedule(self.now + d, i, s);
            // A slot freed in i's queue: upstream may push.
            self.unblock_upstream(i);
        }
    }

    /// Retries blocked servers and source backlogs feeding operator `j`.
    fn unblock_upstream(&mut self, j: usize) {
        let inputs = self.model.ops[j].inputs.clone();
        for u in inputs {
            if self.model.ops[u].kind == OpKind::Source {
                self.drain_backlog(u);
            } else {
                for s in 0..self.servers[u].len() {
                    // A server whose `pending` is empty is inside `try_push` further up the
                    // stack (it took the list): retrying it here would free it under that call.
                    let srv = &self.servers[u][s];
                    if srv.done && srv.holding.is_some() && !srv.pending.is_empty() {
                        self.try_push(u, s);
                    }
                }
            }
        }
    }

    /// Emits a source's backlog while its outputs have room.
    fn drain_backlog(&mut self, s: usize) {
        if self.now < self.down_until {
            return;
        }
        while let Some(&r) = self.backlog[s].front() {
            let outs = &self.model.ops[s].outputs;
            if !outs.iter().all(|&j| self.has_room(j, r.seq)) {
                break;
            }
            self.backlog[s].pop_front();
            self.counters[s].records_out += 1.0;
            self.processed[s] += 1;
            for j in self.model.ops[s].outputs.clone() {
                self.enqueue(j, r);
            }
        }
        self.counters[s].backlog = self.backlog[s].len() as f64;
    }

    fn enqueue(&mut self, j: usize, r: Rec) {
        let q = self.queue_of(j, r.seq);
        self.queues[j][q].push_back(r);
        self.received[j] += 1;
        self.start_services(j);
    }

    /// Pushes server `s` of operator `i`'s finished record to its pending outputs; frees the
    /// server when all took it.
    fn try_push(&mut self, i: usize, s: usize) {
        let Some(r) = self.servers[i][s].holding else {
            return;
        };
        let pending = std::mem::take(&mut self.servers[i][s].pending);
        let mut left = Vec::new();
        for j in pending {
            if self.has_room(j, r.seq) {
                self.enqueue(j, r);
            } else {
                left.push(j);
            }
        }
        let srv = &mut self.servers[i][s];
        if left.is_empty() {
            if srv.blocked_since.is_finite() && srv.blocked_since > 0.0 {
                self.counters[i].backpressured_s += self.now - srv.blocked_since;
            }
            srv.holding = None;
            srv.done = false;
            srv.blocked_since = 0.0;
            srv.idle_since = self.now;
            self.start_services(i);
        } else {
            if srv.blocked_since <= 0.0 {
                srv.blocked_since = self.now.max(1e-12);
            }
            srv.pending = left;
        }
    }

    fn complete(&mut self, i: usize, s: usize) {
        let Some(r) = self.servers[i][s].holding else {
            return;
        };
        let m = self.model;
        self.counters[i].busy_s += self.servers[i][s].busy.1;
        self.processed[i] += 1;
        self.servers[i][s].done = true;
        let sel = m.selectivity(i, self.rate_in[i]);
        let keep = match m.ops[i].kind {
            OpKind::Sink => {
                let lat = self.now - r.born;
                self.latencies.push(lat);
                false
            }
            OpKind::Map | OpKind::Source => true,
            _ => (hash64(r.seq ^ (i as u64) << 48) as f64 / u64::MAX as f64) < sel,
        };
        if keep {
            self.counters[i].records_out += 1.0;
            self.servers[i][s].pending = m.ops[i].outputs.clone();
            self.try_push(i, s);
        } else {
            self.servers[i][s].holding = None;
            self.servers[i][s].done = false;
            self.servers[i][s].idle_since = self.now;
            self.start_services(i);
        }
    }

    fn arrive(&mut self, src: usize, t: f64) {
        self.seq[src] += 1;
        // Record sequence numbers are unique across sources.
        let seq = self.seq[src] * 64 + src as u64;
        self.counters[src].arrivals += 1.0;
        self.received[src] += 1;
        self.backlog[src].push_back(Rec { born: t, seq });
        self.drain_backlog(src);
    }
}

impl Plant for DesPlant<'_> {
    fn advance(&mut self, t: f64, dt: f64, arrivals_in: &[f64]) -> StepStats {
        use rand::distr::Distribution;
        let m = self.model;
        let end = t + dt;
        self.latencies.clear();
        let mut arrivals = 0.0;
        let mut gamma = vec![0.0; m.ops.len()];
        let mut rates = Vec::new();
        for ((s, _), &a) in m.sources.iter().zip(arrivals_in) {
            let rate = a.max(0.0) / dt;
            gamma[*s] += rate;
            rates.push((*s, rate));
        }
        // A bounded source that reached its `count` emits nothing more.
        let done = |received: &[u64], k: usize, s: usize| {
            m.source_counts[k].is_some_and(|c| received[s] as f64 >= c)
        };
        let paced = m.paced_arrivals;
        // Paced: arrival j (from 0) of the step at t + (j + 1 − phase) / rate, from the phase at
        // the step's start (no accumulated rounding).
        let mut paced_at: Vec<(f64, u64)> = vec![(0.0, 0); m.ops.len()];
        for (k, &(s, rate)) in rates.iter().enumerate() {
            paced_at[s] = (self.phase[s], 0);
            self.next_arrival[s] = if rate > 0.0 && !done(&self.received, k, s) {
                if paced {
                    t + (1.0 - self.phase[s]) / rate
                } else {
                    t + Exp::new(rate).map_or(f64::INFINITY, |e| e.sample(&mut self.rng))
                }
            } else {
                f64::INFINITY
            };
        }
        let mut resumed = self.down_until <= t;
        loop {
            let next_event = self
                .events
                .peek()
                .map_or(f64::INFINITY, |Reverse((tn, ..))| *tn as f64 / 1e9);
            let (src_i, next_arr) = rates
                .iter()
                .enumerate()
                .map(|(k, (s, _))| (k, self.next_arrival[*s]))
                .fold(
                    (usize::MAX, f64::INFINITY),
                    |a, b| if b.1 < a.1 { b } else { a },
                );
            let resume_at = if resumed {
                f64::INFINITY
            } else {
                self.down_until
            };
            let next = next_event.min(next_arr).min(resume_at);
            if next >= end {
                break;
            }
            self.now = next;
            if next == resume_at {
                resumed = true;
                for i in 0..m.ops.len() {
                    if m.ops[i].kind == OpKind::Source {
                        self.drain_backlog(i);
                    } else {
                        self.start_services(i);
                    }
                }
            } else if next == next_arr {
                let (s, rate) = rates[src_i];
                self.arrive(s, next);
                arrivals += 1.0;
                self.next_arrival[s] = if done(&self.received, src_i, s) {
                    f64::INFINITY
                } else if paced {
                    let (phase, j) = &mut paced_at[s];
                    *j += 1;
                    t + (*j as f64 + 1.0 - *phase) / rate
                } else {
                    next + Exp::new(rate).map_or(f64::INFINITY, |e| e.sample(&mut self.rng))
                };
            } else if let Some(Reverse((_, op, server, _))) = self.events.pop() {
                self.complete(op, server);
            }
        }
        self.now = end;
        if paced {
            // What was due and not emitted in the step carries over (a record due exactly at
            // the step's end arrives at the next step's start).
            for &(s, rate) in &rates {
                let (phase, j) = paced_at[s];
                self.phase[s] = (phase + rate * dt - j as f64).max(0.0);
            }
        }
        let lam = m.traffic(&gamma);
        self.rate_in.copy_from_slice(&lam);
        let mut lat = std::mem::take(&mut self.latencies);
        lat.sort_by(f64::total_cmp);
        let p99 = nearest_rank(&lat, 0.99);
        let slo_latency_s = if m.slo_quantile.is_p99() {
            p99
        } else {
            nearest_rank(&lat, m.slo_quantile.q)
        };
        let late = lat.iter().filter(|&&l| l > m.slo_s).count() as f64;
        let p99_engine_s = crate::plant::engine_p99_of_samples(&lat);
        self.latencies = lat;
        let mut err: f64 = 0.0;
        let mut queued = 0.0;
        for i in 0..m.ops.len() {
            let in_q: usize = self.queues[i].iter().map(VecDeque::len).sum();
            let held = self.servers[i]
                .iter()
                .filter(|s| s.holding.is_some() && !s.done)
                .count();
            let here = if m.ops[i].kind == OpKind::Source {
                self.backlog[i].len()
            } else {
                in_q + held
            };
            if m.ops[i].kind != OpKind::Source {
                queued += here as f64;
            }
            self.counters[i].queue = in_q as f64;
            err = err.max((self.received[i] as f64 - self.processed[i] as f64 - here as f64).abs());
        }
        let mut scratch = vec![0.0; m.ops.len()];
        let mut service = Vec::with_capacity(m.ops.len());
        m.service_times_over(t, end, &mut service);
        StepStats {
            arrivals,
            p99_s: p99,
            slo_latency_s,
            p99_engine_s,
            late,
            backlog: m
                .sources
                .iter()
                .map(|(s, _)| self.backlog[*s].len() as f64)
                .sum(),
            queued,
            capacity: capacity(m, &self.servers_eff, &service, &gamma, &mut scratch),
            conservation_error: err,
        }
    }

    fn snapshot(&self, at_s: f64) -> Snapshot {
        let mut ops = self.counters.clone();
        for (i, c) in ops.iter_mut().enumerate() {
            for s in &self.servers[i] {
                if s.holding.is_none() {
                    c.idle_s += (at_s - s.idle_since).max(0.0);
                }
            }
        }
        Snapshot { at_s, ops }
    }

    fn parallelism(&self) -> &[u32] {
        &self.p
    }

    fn rescale(&mut self, p: &[u32], t: f64, downtime_s: f64) {
        // Stop: records in service or held go back to the head of their operator's input.
        let mut records: Vec<Vec<Rec>> = vec![Vec::new(); self.model.ops.len()];
        for i in 0..self.model.ops.len() {
            for s in &mut self.servers[i] {
                if let Some(r) = s.holding.take() {
                    if s.done {
                        // Processed already; its remaining outputs are delivered on restore.
                        for &j in &s.pending {
                            records[j].push(r);
                            self.received[j] += 1;
                        }
                    } else {
                        records[i].push(r);
                    }
                }
            }
            for q in &mut self.queues[i] {
                records[i].extend(q.drain(..));
            }
            records[i].sort_by(|a, b| a.born.total_cmp(&b.born));
        }
        self.events.clear();
        self.p = p.to_vec();
        self.layout(records);
        self.down_until = t + downtime_s;
        self.started = t + downtime_s;
        self.now = t;
        for (i, c) in self.counters.iter_mut().enumerate() {
            *c = OpCounters {
                backlog: self.backlog[i].len() as f64,
                ..OpCounters::default()
            };
        }
    }
}

/// The `q`-quantile of `sorted` (ascending) by nearest rank: the ⌈q·n⌉-th smallest of the n
/// values (at least the first); `None` for no values.
fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    (!sorted.is_empty())
        .then(|| sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::{ServiceOverride, SimConfig};
    use streamscale_engine::spec::JobSpec;

    /// Service times are sampled (statrs, seeded) with the configured mean and coefficient of
    /// variation: gamma for CV ≠ 1, exponential at 1, fixed at 0.
    #[test]
    fn service_times_have_the_configured_mean_and_cv() {
        let spec = JobSpec::from_yaml(
            "name: s\noperators:\n  - { name: src, kind: source, rate: { constant: 10 } }\n  - { name: a, kind: map, cpu: 1000 }\n  - { name: b, kind: map, cpu: 1000 }\n  - { name: c, kind: map, cpu: 1000 }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: a }\n  - { from: a, to: b }\n  - { from: b, to: c }\n  - { from: c, to: sink }\n",
        )
        .unwrap();
        let mut cfg = SimConfig::default();
        for (op, mean, cv) in [("a", 2000.0, 0.5), ("b", 1000.0, 1.0), ("c", 3000.0, 0.0)] {
            cfg.operators.insert(
                op.into(),
                ServiceOverride {
                    mean_micros: Some(mean),
                    cv: Some(cv),
                },
            );
        }
        let model = JobModel::new(&spec, &cfg, Some(10.0)).unwrap();
        let mut plant = DesPlant::new(&model, &model.initial_parallelism(), 5);
        for (i, mean, cv) in [(1, 2e-3, 0.5), (2, 1e-3, 1.0), (3, 3e-3, 0.0)] {
            let n = 200_000;
            let xs: Vec<f64> = (0..n).map(|_| plant.sample_service(i)).collect();
            let m = xs.iter().sum::<f64>() / n as f64;
            let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64;
            assert!((m / mean - 1.0).abs() < 0.01, "op {i}: mean {m}");
            assert!(
                (var.sqrt() / m - cv).abs() < 0.01,
                "op {i}: cv {}",
                var.sqrt() / m
            );
        }
    }
}
