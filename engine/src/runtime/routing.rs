//! Where a subtask's output goes: keyed routes by key group, rebalancing, and the next member of its chain.

use super::*;

impl Outputs {
    /// Sends `rec` to every downstream operator; returns false if a receiver is gone.
    pub(super) fn send(&mut self, rec: Record, meter: &mut Meter) -> bool {
        if let Some(next) = &mut self.chain {
            // Chained: queue for the next member (watermarks too, in order), which runs when
            // its batch is full or the head flushes.
            if !rec.payload.is_watermark() {
                meter.records_out += 1;
                meter.totals.records_out += 1;
            }
            next.pending.push(rec);
            if next.pending.len() >= next.batch {
                return self.flush(meter);
            }
            return true;
        }
        if rec.payload.is_watermark() {
            // Watermarks go to every downstream subtask and are not counted as records.
            return self.broadcast(Event::Data(rec), meter);
        }
        // Every route but the last gets a copy; the last one the record itself.
        let last = self.routes.len().saturating_sub(1);
        let mut rec = Some(rec);
        for (r, route) in self.routes.iter_mut().enumerate() {
            let Some(this) = (if r == last { rec.take() } else { rec.clone() }) else {
                break;
            };
            let key = (route.key_of)(&this);
            let msg = Message {
                channel: route.channel,
                event: Event::Data(this),
            };
            let ok = if route.keyed {
                let kg = key_group(key, self.max_parallelism);
                let i = subtask_for_key_group(kg, route.txs.len() as u32, self.max_parallelism);
                send_one(&route.txs[i], msg, meter)
            } else {
                rebalance(route, msg, meter)
            };
            if !ok {
                return false;
            }
        }
        // Once per record, however many downstream operators it goes to (Flink's
        // numRecordsOut): the planner's traffic equations send an operator's output along each
        // of its edges, so counting per edge would double a fan-out's selectivity.
        if !self.routes.is_empty() {
            meter.records_out += 1;
            meter.totals.records_out += 1;
        }
        true
    }

    /// Sends `event` (a barrier or the end) on every output channel, in order after every
    /// record sent before; returns false if a receiver is gone.
    pub(super) fn broadcast(&mut self, event: Event, meter: &mut Meter) -> bool {
        if self.chain.is_some() {
            if !self.flush(meter) {
                return false;
            }
            let t = meter.now();
            let ok = self.chain.as_mut().is_none_or(|next| next.on_event(event));
            if let Some(t) = t {
                let took = t.elapsed();
                meter.backpressured += took;
                meter.waited(took);
            }
            return ok;
        }
        for route in &self.routes {
            for tx in &route.txs {
                let msg = Message {
                    channel: route.channel,
                    event: event.clone(),
                };
                if !send_one(tx, msg, meter) {
                    return false;
                }
            }
        }
        true
    }
}

impl Outputs {
    /// Runs the records queued for the rest of the chain (all of it, to the tail), timing
    /// that as this subtask's backpressured time: its output is not accepted until the chain
    /// downstream is done. Returns false if a receiver downstream of the chain is gone.
    ///
    /// The time the run took sets the next member's batch size ([`chain_batch`]), so that a
    /// slow chain runs in batches short enough for every member (and this subtask) to flush
    /// its metrics on time and for records not to wait behind a long batch.
    ///
    /// The clock is read once where one member hands over to the next (the next member's
    /// start) and once when the tail is done; each reading serves both sides of the hand-over
    /// (see [`ChainMember::run_pending`]).
    #[inline(never)]
    pub(super) fn flush(&mut self, meter: &mut Meter) -> bool {
        let Some(next) = &mut self.chain else {
            return true;
        };
        if next.pending.is_empty() {
            return true;
        }
        let n = next.pending.len();
        let start = meter.now();
        let (ok, end) = next.run_pending(start);
        if let (Some(start), Some(end)) = (start, end) {
            let took = end.saturating_duration_since(start);
            meter.backpressured += took;
            meter.waited(took);
            if !meter.chained {
                // A head ticks (a member checks after each of its runs instead).
                meter.saw_clock(end);
            }
            next.batch = chain_batch(n, took, meter.check_budget);
        }
        self.ran_until = end;
        ok
    }

    /// Publishes the chain members' metrics if their flush interval has passed (the head
    /// calls this when it is about to wait and whenever it flushed its own, so members'
    /// metrics stay fresh while idle or while the head is slow).
    pub(super) fn check_chain(&mut self) {
        let mut next = self.chain.as_deref_mut();
        while let Some(m) = next {
            m.ctx.meter.check(|| 0);
            next = m.ctx.outputs.chain.as_deref_mut();
        }
    }

    /// Ends every chain member after the head's thread stopped: flushes sinks and metrics and
    /// returns each member's result (its state for the final savepoint), in chain order.
    pub(super) fn finish_chain(&mut self) -> Vec<SubtaskResult> {
        let mut results = Vec::new();
        let mut next = self.chain.take();
        while let Some(mut m) = next {
            next = m.ctx.outputs.chain.take();
            m.ctx.meter.flush(0);
            let (state, error) = m.op.finish(&mut m.ctx);
            results.push(m.ctx.result(state, error));
        }
        results
    }
}
