//! The autoscaler's last decision in status (`status.lastDecision` of StreamJobs and
//! FlinkScalers): a rescale, a recommendation or a hold, with its reason. Pure.
//!
//! A hold is decided every metrics interval, and its reason carries figures that change each
//! time ("stabilizing: 12.3 s since the last (re)start"). Writing each one would update the
//! status at every tick, so a decision replaces the recorded one only when it says something
//! new: another action, another parallelism, or a reason that differs apart from its figures
//! ([`reason_shape`]). The recorded `time` is then when the decision was first made.

use std::collections::BTreeMap;

use streamscale_controller::model::Decision;

use crate::crd::{DecisionAction, DecisionStatus};

/// `reason` with every number (digits with their `.`, `,`, `e`, `+` and `-`) replaced by `#`:
/// two reasons with the same shape say the same thing with other figures.
pub fn reason_shape(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    let mut in_number = false;
    for c in reason.chars() {
        let continues = in_number && matches!(c, '.' | 'e' | '+' | '-');
        if c.is_ascii_digit() || continues {
            if !in_number {
                out.push('#');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

/// Whether `new` says something `old` does not: another action, another planned
/// parallelism (`to`), or a reason of another [`reason_shape`].
pub fn differs(old: Option<&DecisionStatus>, new: &DecisionStatus) -> bool {
    old.is_none_or(|o| {
        o.action != new.action
            || o.to != new.to
            || o.applied != new.applied
            || reason_shape(&o.reason) != reason_shape(&new.reason)
    })
}

/// Records `new` in `slot` when it [`differs`] from the decision there; returns whether it
/// did (the caller publishes an Event then).
pub fn record(slot: &mut Option<DecisionStatus>, new: DecisionStatus) -> bool {
    let changed = differs(slot.as_ref(), &new);
    if changed {
        *slot = Some(new);
    }
    changed
}

/// Stores the decision `new` in `slot`: a rescale always (each is news), a recommendation or a
/// hold when it [`differs`] ([`record`]).
pub fn store(slot: &mut Option<DecisionStatus>, new: DecisionStatus) {
    if new.action == DecisionAction::Rescale {
        *slot = Some(new);
    } else {
        record(slot, new);
    }
}

/// The status of a planner decision `d` made at `time` (RFC 3339) while the job ran `from`.
pub fn of_decision(
    d: &Decision,
    from: &BTreeMap<String, u32>,
    action: DecisionAction,
    reason: String,
    time: String,
) -> DecisionStatus {
    DecisionStatus {
        time,
        from: from.clone(),
        to: d.parallelism.clone(),
        reason,
        predicted_utilization: d
            .operators
            .values()
            .filter_map(|o| o.predicted_utilization)
            .fold(None, |acc: Option<f64>, u| {
                Some(acc.map_or(u, |a| a.max(u)))
            }),
        predicted_latency_seconds: d
            .predicted_latency_seconds
            .is_finite()
            .then_some(d.predicted_latency_seconds),
        bottleneck: d
            .bottleneck
            .as_ref()
            .map(|b| b.split(':').next().unwrap_or(b).to_string()),
        applied: action == DecisionAction::Rescale,
        action,
    }
}

/// The status of a hold without a plan (waiting for data, stabilizing, cannot plan): the job
/// keeps `current`.
pub fn hold(current: &BTreeMap<String, u32>, reason: String, time: String) -> DecisionStatus {
    DecisionStatus {
        time,
        from: current.clone(),
        to: current.clone(),
        reason,
        predicted_utilization: None,
        predicted_latency_seconds: None,
        bottleneck: None,
        applied: false,
        action: DecisionAction::Hold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: u32) -> BTreeMap<String, u32> {
        [("work".to_string(), v)].into()
    }

    #[test]
    fn figures_do_not_change_a_reason_s_shape() {
        assert_eq!(
            reason_shape("stabilizing: 12.3 s since the last (re)start, need 60 s"),
            "stabilizing: # s since the last (re)start, need # s"
        );
        assert_eq!(
            reason_shape("backlog grows by about 1.5e3 rec/s at p=4"),
            "backlog grows by about # rec/s at p=#"
        );
        assert_ne!(
            reason_shape("waiting for data: 1 of 2 metric samples"),
            reason_shape("stabilizing: 1 s since the last (re)start, need 2 s")
        );
    }

    #[test]
    fn a_hold_is_recorded_once_until_it_says_something_new() {
        let mut slot = None;
        let t0 = "2026-12-04T19:00:00Z".to_string();
        let t1 = "2026-12-04T19:00:05Z".to_string();
        assert!(record(
            &mut slot,
            hold(
                &p(2),
                "stabilizing: 1.0 s since the last (re)start".into(),
                t0.clone()
            )
        ));
        // Same reason, other figures, later: the record (and its time) stays.
        assert!(!record(
            &mut slot,
            hold(
                &p(2),
                "stabilizing: 6.0 s since the last (re)start".into(),
                t1.clone()
            )
        ));
        assert_eq!(slot.as_ref().map(|d| d.time.as_str()), Some(t0.as_str()));
        // Another reason: recorded.
        assert!(record(
            &mut slot,
            hold(
                &p(2),
                "the plan keeps the current parallelism".into(),
                t1.clone()
            )
        ));
        // Same reason, another recommendation: recorded.
        let mut other = hold(&p(2), "the plan keeps the current parallelism".into(), t1);
        other.to = p(3);
        assert!(record(&mut slot, other));
        let d = slot.expect("recorded");
        assert_eq!(
            (d.action, d.applied, d.to),
            (DecisionAction::Hold, false, p(3))
        );
    }
}
