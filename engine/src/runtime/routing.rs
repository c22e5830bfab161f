//! Where a subtask's output goes: keyed routes by key group, rebalancing, and the next member of its chain.

use super::*;

impl Route {
    /// The downstream subtask (index into `txs`) owning `rec`'s key group (keyed routes).
    fn subtask_of(&self, rec: &Record, max_parallelism: u32) -> usize {
        let kg = key_group((self.key_of)(rec), max_parallelism);
        subtask_for_key_group(kg, self.txs.len() as u32, max_parallelism)
    }
}

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
            let keyed = route
                .keyed
                .then(|| route.subtask_of(&this, self.max_parallelism));
            let msg = Message {
                channel: route.channel,
                event: Event::Data(this),
            };
            let ok = if let Some(i) = keyed {
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

    /// Sends `recs` (data records, no watermarks) as [`Outputs::send`] sends each in turn, with
    /// the same order per downstream subtask and the same counts. Over one keyed route (and
    /// no chain), a downstream subtask's records go as one [`Event::Batch`] message when its
    /// queue has room for all of them in records (messages plus its [`Batched`] count), else
    /// one by one, waiting for room as `send` does; any other output sends them one by one.
    /// `recs` is left empty. Returns false if a receiver is gone.
    pub(super) fn send_batch(&mut self, recs: &mut Vec<Record>, meter: &mut Meter) -> bool {
        let one_keyed = self.chain.is_none() && self.routes.len() == 1 && self.routes[0].keyed;
        if !one_keyed || recs.len() < 2 {
            return recs.drain(..).all(|rec| self.send(rec, meter));
        }
        let route = &mut self.routes[0];
        let n = route.txs.len();
        let mut parts: Vec<Vec<Record>> = (0..n).map(|_| Vec::new()).collect();
        if n == 1 {
            parts[0] = std::mem::take(recs);
        } else {
            for rec in recs.drain(..) {
                parts[route.subtask_of(&rec, self.max_parallelism)].push(rec);
            }
        }
        for (i, part) in parts.into_iter().enumerate() {
            let count = part.len() as u64;
            if !send_part(route, i, part, meter) {
                return false;
            }
            meter.records_out += count;
            meter.totals.records_out += count;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn meter() -> Meter {
        Meter::new(
            false,
            Duration::from_millis(100),
            false,
            ["w".into(), "0".into()],
            EngineMetrics::new().expect("metrics"),
            Arc::default(),
        )
    }

    fn record(seq: u64) -> Record {
        Record {
            seq,
            key: murmur_fmix64(seq % 37),
            value: seq as i64,
            count: 1,
            created_us: 0,
            payload: Payload::None,
        }
    }

    /// Outputs over one keyed route into `n` queues of capacity `cap`.
    fn keyed(n: usize, cap: usize) -> (Outputs, Vec<Queue>) {
        let queues: Vec<Queue> = (0..n)
            .map(|_| {
                let (tx, rx) = bounded(cap);
                (tx, rx, Batched::default())
            })
            .collect();
        let route = Route {
            txs: queues.iter().map(|(tx, _, _)| tx.clone()).collect(),
            batched: queues.iter().map(|(_, _, b)| b.clone()).collect(),
            channel: 3,
            keyed: true,
            key_of: |r| r.key,
            next: 0,
        };
        let outputs = Outputs {
            routes: vec![route],
            max_parallelism: 128,
            chain: None,
            ran_until: None,
        };
        (outputs, queues)
    }

    /// Every message waiting in `q`, taken off its count as a subtask does.
    fn drain(q: &Queue) -> Vec<Message> {
        let mut out = Vec::new();
        while let Ok(m) = q.1.try_recv() {
            took(&q.2, &m);
            out.push(m);
        }
        out
    }

    fn records(msgs: &[Message]) -> Vec<u64> {
        let mut seqs = Vec::new();
        for m in msgs {
            assert_eq!(m.channel, 3);
            match &m.event {
                Event::Data(r) => seqs.push(r.seq),
                Event::Batch(rs) => seqs.extend(rs.iter().map(|r| r.seq)),
                other => panic!("not data: {other:?}"),
            }
        }
        seqs
    }

    #[test]
    fn a_batch_goes_to_each_key_groups_subtask_in_order_as_one_message() {
        let (mut out, queues) = keyed(3, 1024);
        let mut m = meter();
        let mut recs: Vec<Record> = (0..200).map(record).collect();
        assert!(out.send_batch(&mut recs, &mut m));
        assert!(recs.is_empty());
        assert_eq!((m.records_out, m.totals.records_out), (200, 200));
        let mut seen = 0;
        for (i, q) in queues.iter().enumerate() {
            let want: Vec<u64> = (0..200)
                .filter(|&s| {
                    let kg = key_group(record(s).key, 128);
                    subtask_for_key_group(kg, 3, 128) == i
                })
                .collect();
            assert!(want.len() >= 2, "subtask {i} gets {} records", want.len());
            // The queue's length in records, then one message holding them.
            assert_eq!(queue_len(&q.1, &q.2), want.len());
            let msgs = drain(q);
            assert_eq!(msgs.len(), 1);
            assert_eq!(records(&msgs), want);
            assert_eq!(queue_len(&q.1, &q.2), 0);
            seen += want.len();
        }
        assert_eq!(seen, 200);
    }

    #[test]
    fn records_that_do_not_fit_go_one_by_one() {
        let (mut out, queues) = keyed(1, 4);
        let q = &queues[0];
        let mut m = meter();
        // Two records: one batch message, 2 of the queue's 4 records of room.
        assert!(out.send_batch(&mut vec![record(0), record(1)], &mut m));
        assert_eq!((q.1.len(), queue_len(&q.1, &q.2)), (1, 2));
        // Three more do not fit in the 2 left: one message each.
        assert!(out.send_batch(&mut vec![record(2), record(3), record(4)], &mut m));
        assert_eq!((q.1.len(), queue_len(&q.1, &q.2)), (4, 5));
        let msgs = drain(q);
        let shapes: Vec<&str> = msgs
            .iter()
            .map(|m| match m.event {
                Event::Batch(_) => "batch",
                _ => "data",
            })
            .collect();
        assert_eq!(shapes, ["batch", "data", "data", "data"]);
        assert_eq!(records(&msgs), [0, 1, 2, 3, 4]);
        assert_eq!((m.records_out, queue_len(&q.1, &q.2)), (5, 0));
        // An empty queue has room again.
        assert!(out.send_batch(&mut vec![record(5), record(6), record(7)], &mut m));
        assert_eq!((q.1.len(), queue_len(&q.1, &q.2)), (1, 3));
    }

    #[test]
    fn other_outputs_get_the_records_one_by_one() {
        let (mut out, queues) = keyed(2, 64);
        out.routes[0].keyed = false;
        let mut m = meter();
        assert!(out.send_batch(&mut (0..6).map(record).collect(), &mut m));
        let mut all: Vec<Message> = queues.iter().flat_map(drain).collect();
        assert_eq!(all.len(), 6);
        all.sort_by_key(|m| records(std::slice::from_ref(m))[0]);
        assert_eq!(records(&all), [0, 1, 2, 3, 4, 5]);
        assert_eq!(m.records_out, 6);
    }
}
