//! Sending one message downstream, metered; rebalancing over a shared route.

use super::*;

/// Sends on one queue, timing a wait for room as backpressure.
pub(super) fn send_one(tx: &Sender<Message>, msg: Message, meter: &mut Meter) -> bool {
    match tx.try_send(msg) {
        Ok(()) => true,
        Err(TrySendError::Full(msg)) => {
            let t = Instant::now();
            let ok = tx.send(msg).is_ok();
            let took = t.elapsed();
            meter.backpressured += took;
            meter.waited(took);
            ok
        }
        Err(TrySendError::Disconnected(_)) => false,
    }
}

/// Sends `part` to downstream subtask `i` of `route`: as one [`Event::Batch`] when its queue
/// has room for every record of it (counted in records: messages plus the queue's
/// [`Batched`] count), else record by record as [`Outputs::send`] does (waiting while the
/// queue is full, [`send_one`]). So a batch never takes a queue past its capacity in records;
/// records sent one by one after a batch may, until the batches are read (at most twice the
/// capacity); a queue that stays full gets records one by one, as without batches.
pub(super) fn send_part(route: &Route, i: usize, part: Vec<Record>, meter: &mut Meter) -> bool {
    let (tx, batched) = (&route.txs[i], &route.batched[i]);
    let channel = route.channel;
    let n = part.len();
    let queued = tx.len() + batched.load(Ordering::Relaxed);
    let room = tx
        .capacity()
        .map_or(usize::MAX, |c| c.saturating_sub(queued));
    if n >= 2 && n <= room {
        batched.fetch_add(n - 1, Ordering::Relaxed);
        let msg = Message {
            channel,
            event: Event::Batch(part),
        };
        if send_one(tx, msg, meter) {
            return true;
        }
        batched.fetch_sub(n - 1, Ordering::Relaxed);
        return false;
    }
    part.into_iter().all(|rec| {
        let msg = Message {
            channel,
            event: Event::Data(rec),
        };
        send_one(tx, msg, meter)
    })
}

/// Puts `msg` in the first downstream queue with room (round-robin start); when all are
/// full, waits for the first to have room.
pub(super) fn rebalance(route: &mut Route, mut msg: Message, meter: &mut Meter) -> bool {
    let n = route.txs.len();
    if n == 1 {
        return send_one(&route.txs[0], msg, meter);
    }
    for k in 0..n {
        let i = (route.next + k) % n;
        match route.txs[i].try_send(msg) {
            Ok(()) => {
                route.next = (i + 1) % n;
                return true;
            }
            Err(TrySendError::Full(m)) => msg = m,
            Err(TrySendError::Disconnected(_)) => return false,
        }
    }
    let t = Instant::now();
    let mut sel = Select::new();
    for tx in &route.txs {
        sel.send(tx);
    }
    let oper = sel.select();
    let i = oper.index();
    let ok = oper.send(&route.txs[i], msg).is_ok();
    route.next = (i + 1) % n;
    let took = t.elapsed();
    meter.backpressured += took;
    meter.waited(took);
    ok
}
