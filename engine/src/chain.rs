//! Operator chaining: which operators run in the thread of their upstream operator.
//!
//! As in Flink, an edge `u → d` is *chained* when records can go forward from subtask `i` of
//! `u` to subtask `i` of `d` without a channel: `u` has exactly one output (`d`), `d` has
//! exactly one input (`u`), both have the same parallelism, and `d`'s input is not partitioned
//! by key group (a keyed input must receive every subtask's records of its key groups). A
//! chain is a maximal path of chained edges; subtask `i` of a chain runs in one thread, the
//! chain's *head* reading the input queue (or generating records, for a source) and every
//! later member receiving its upstream member's output in batches of at most
//! [`CHAIN_BATCH`] records, in order with watermarks, barriers and the end of input.
//!
//! Metrics stay per operator and subtask. Every member counts its own records in and out;
//! time is attributed as if each member were its own thread: a member's *busy* time is the
//! time spent in its own code (measured around each batch it processes, minus the time its
//! downstream members took); the time downstream members took counts as the member's
//! *backpressured* time (its output is not accepted until they are done), together with the
//! tail's real waits on full channels; whatever is left of the wall-clock time is *idle*
//! (waiting for input, which includes the time upstream members spend). So each member's
//! busy + idle + backpressured time equals the wall time, and its true processing rate
//! (records in / busy time) is the rate it would reach alone, which is what the planner needs
//! to size each operator.

use crate::spec::{JobSpec, OperatorKind};

/// Largest number of records a chain member hands to the next member at once.
///
/// With metrics on, every hand-over is timed (a clock read per member and batch, see
/// `runtime::ChainMember::run_pending`), so a fast chain's batch must be long enough for those
/// reads to cost little: 512 records of a map-only chain take about 30 µs, its 3 clock reads
/// (about 50 ns each inside a busy loop on a VM) under 1 % of that. A slow chain's batch is
/// shorter: with metrics on, the runtime sizes it to the time the chain takes (at most an
/// eighth of the flush interval per run); without metrics it is always this long.
pub const CHAIN_BATCH: usize = 512;

/// The operator `name` forwards its records to in its own thread, if its output edge is
/// chained (see the module documentation for the rule). `enabled: false` chains nothing.
pub fn chained_successor<'a>(spec: &'a JobSpec, name: &str, enabled: bool) -> Option<&'a str> {
    if !enabled {
        return None;
    }
    let up = spec.operator(name)?;
    if matches!(up.kind, OperatorKind::Sink { .. }) {
        return None;
    }
    let outputs = spec.outputs_of(name);
    let [to] = outputs.as_slice() else {
        return None;
    };
    let down = spec.operator(to)?;
    let chained = spec.inputs_of(to) == [name]
        && down.parallelism == up.parallelism
        && !down.kind.is_keyed()
        && !matches!(down.kind, OperatorKind::Source { .. });
    chained.then_some(down.name.as_str())
}

/// Whether `name` runs in its upstream operator's thread (it is a chain member but not its
/// head).
pub fn is_chained_member(spec: &JobSpec, name: &str, enabled: bool) -> bool {
    spec.inputs_of(name)
        .first()
        .is_some_and(|up| chained_successor(spec, up, enabled) == Some(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> JobSpec {
        JobSpec::from_yaml(yaml).expect("valid spec")
    }

    const Q5: &str = r#"
name: q5
operators:
  - { name: events, kind: source, parallelism: 2, rate: { constant: 10 },
      nexmark: { baseTimeMs: 1600000000000, eventRate: 10000, maxOutOfOrdernessMs: 0 } }
  - { name: bids, kind: select, query: bids, parallelism: 2 }
  - { name: counts, kind: eventWindow, key: auction, parallelism: 2,
      window: { sliding: { sizeMs: 10000, slideMs: 2000 } } }
  - { name: hot, kind: windowTop, key: auction, parallelism: 2 }
  - { name: sink, kind: sink, parallelism: SINKP }
edges:
  - { from: events, to: bids }
  - { from: bids, to: counts }
  - { from: counts, to: hot }
  - { from: hot, to: sink }
"#;

    #[test]
    fn forward_edges_of_equal_parallelism_chain_and_keyed_edges_do_not() {
        let s = spec(&Q5.replace("SINKP", "2"));
        assert_eq!(chained_successor(&s, "events", true), Some("bids"));
        assert_eq!(chained_successor(&s, "bids", true), None, "counts is keyed");
        assert_eq!(chained_successor(&s, "counts", true), None, "hot is keyed");
        assert_eq!(chained_successor(&s, "hot", true), Some("sink"));
        assert_eq!(chained_successor(&s, "sink", true), None);
        assert!(is_chained_member(&s, "bids", true));
        assert!(is_chained_member(&s, "sink", true));
        assert!(!is_chained_member(&s, "events", true));
        assert!(!is_chained_member(&s, "counts", true));
        assert!(!is_chained_member(&s, "bids", false), "chaining disabled");
    }

    #[test]
    fn different_parallelism_or_fan_in_or_fan_out_breaks_the_chain() {
        let s = spec(&Q5.replace("SINKP", "1"));
        assert_eq!(chained_successor(&s, "hot", true), None, "p 2 → 1");
        let two_outputs = spec(
            r#"
name: fan
operators:
  - { name: src, kind: source, rate: { constant: 10 } }
  - { name: a, kind: map }
  - { name: b, kind: sink }
  - { name: c, kind: sink }
edges:
  - { from: src, to: a }
  - { from: a, to: b }
  - { from: a, to: c }
"#,
        );
        assert_eq!(chained_successor(&two_outputs, "src", true), Some("a"));
        assert_eq!(chained_successor(&two_outputs, "a", true), None, "fan-out");
        let two_inputs = spec(
            r#"
name: fanin
operators:
  - { name: s1, kind: source, rate: { constant: 10 } }
  - { name: s2, kind: source, rate: { constant: 10 } }
  - { name: m, kind: map }
  - { name: out, kind: sink }
edges:
  - { from: s1, to: m }
  - { from: s2, to: m }
  - { from: m, to: out }
"#,
        );
        assert_eq!(chained_successor(&two_inputs, "s1", true), None, "fan-in");
        assert_eq!(chained_successor(&two_inputs, "m", true), Some("out"));
    }
}
