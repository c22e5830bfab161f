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
