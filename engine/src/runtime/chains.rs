//! Chains: forward-connected operators of equal parallelism run in one thread per subtask.

use super::*;

/// A chain member: an operator subtask running in its upstream subtask's thread
/// ([`crate::chain`]).
pub(super) struct ChainMember {
    pub(super) op: Operator,
    pub(super) ctx: SubtaskContext,
    /// Records (and watermarks) from the upstream member not processed yet, in order.
    pub(super) pending: Vec<Record>,
    /// Pending records that make the upstream member run this member: [`CHAIN_BATCH`] for a
    /// fast chain, fewer for a slow one ([`chain_batch`]); 1 until the first run is timed.
    pub(super) batch: usize,
}

/// The batch size for a chain member whose last run of `n` records (and what it ran
/// downstream) took `took`: as many records as fit in `budget` at that pace, between 1 and
/// [`CHAIN_BATCH`].
pub(super) fn chain_batch(n: usize, took: Duration, budget: Duration) -> usize {
    let fit = fit_in_budget(n as u64, took, budget, CHAIN_BATCH as u64);
    fit as usize
}

/// How many of `n` steps that took `took` together fit in `budget`, between 1 and `most`.
/// Integer arithmetic on nanoseconds, with no division when all `most` fit (fast operators).
#[inline]
pub(super) fn fit_in_budget(n: u64, took: Duration, budget: Duration, most: u64) -> u64 {
    let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
    let room = u64::try_from(budget.as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_mul(n);
    if took.saturating_mul(most) <= room {
        return most;
    }
    (room / took).clamp(1, most)
}

impl ChainMember {
    /// Runs `f` and adds its duration, minus the time the chain downstream took (counted as
    /// backpressured by then), to this member's busy time.
    pub(super) fn timed(&mut self, f: impl FnOnce(&mut Self) -> bool) -> bool {
        let t = self.ctx.meter.now();
        let waited = self.ctx.meter.backpressured;
        let ok = f(self);
        if let Some(t) = t {
            let downstream = self.ctx.meter.backpressured.saturating_sub(waited);
            self.ctx.meter.busy += t.elapsed().saturating_sub(downstream);
        }
        ok
    }

    /// Processes the pending batch and then flushes the rest of the chain. `start` is the
    /// clock read by the caller just before (`None` without metrics). Returns false if a
    /// receiver downstream is gone, and the clock read when this member and the chain after
    /// it were done (`None` without metrics).
    ///
    /// The run's duration minus the time the chain downstream took is this member's busy
    /// time. The end is the reading the downstream run ended with when that run came last
    /// (the usual case: the batch that filled the next member's batch was this one's last
    /// record), so that a chain of `n` members reads the clock `n` times per batch.
    pub(super) fn run_pending(&mut self, start: Option<Instant>) -> (bool, Option<Instant>) {
        let waited = self.ctx.meter.backpressured;
        if let Some(start) = start
            && self.ctx.meter.sink.is_some()
        {
            // Every record of the batch reaches the sink at or after the batch's start (and a
            // batch is short: [`chain_batch`]): measure latency there.
            let clock_us = self.ctx.meter.unix_us_at(start);
            if let Some(sink) = &mut self.ctx.meter.sink {
                sink.latency.set_clock(clock_us);
            }
        }
        // A member's input came after a wait of unknown length.
        self.op.clock_stale();
        let mut ok = true;
        for rec in self.pending.drain(..) {
            if !ok {
                continue;
            }
            if !rec.payload.is_watermark() {
                self.ctx.meter.records_in += 1;
                self.ctx.meter.totals.records_in += 1;
            }
            self.ctx.outputs.ran_until = None;
            ok = self.op.process(rec, &mut self.ctx);
        }
        ok = ok && self.ctx.outputs.flush(&mut self.ctx.meter);
        let Some(start) = start else {
            return (ok, None);
        };
        let end = self
            .ctx
            .outputs
            .ran_until
            .take()
            .unwrap_or_else(Instant::now);
        let downstream = self.ctx.meter.backpressured.saturating_sub(waited);
        self.ctx.meter.busy += end
            .saturating_duration_since(start)
            .saturating_sub(downstream);
        if self.ctx.meter.check_with(end, || 0) == Check::Flushed {
            self.ctx.outputs.check_chain();
        }
        (ok, Some(end))
    }

    /// A barrier, the end of input or a watermark from the upstream member (its only input,
    /// so a barrier is aligned at once). Returns false if a receiver downstream is gone.
    pub(super) fn on_event(&mut self, event: Event) -> bool {
        match event {
            Event::Data(rec) => {
                self.pending.push(rec);
                let start = self.ctx.meter.now();
                self.run_pending(start).0
            }
            Event::Batch(recs) => {
                self.pending.extend(recs);
                let start = self.ctx.meter.now();
                self.run_pending(start).0
            }
            Event::Barrier(b) => self.timed(|m| m.op.on_aligned(b, &mut m.ctx)),
            Event::End => self.timed(|m| {
                let ok = m.op.fire_due_windows(&mut m.ctx, true)
                    && m.ctx.outputs.broadcast(Event::End, &mut m.ctx.meter);
                m.ctx.ended = ok;
                ok
            }),
        }
    }
}
