//! The job's record balance (`GET /v1/job`'s record totals): what was emitted, what reached
//! the sinks, what was removed on purpose.

use std::collections::BTreeMap;

use crate::savepoint::OperatorCounters;
use crate::spec::{JobSpec, OperatorKind};

/// The job's record balance, exact for any acyclic job graph: once nothing is in flight
/// (a finished bounded job, or after a draining stop-with-savepoint),
/// `emitted = accounted + absorbed`; a shortfall means records were lost, an excess that
/// they were counted twice.
///
/// Definition. Let `paths(X)` be the number of distinct paths from operator `X` to a sink
/// (`paths(sink) = 1`; with fan-out a record is delivered once per path). Then
/// - `emitted` = Σ over sources of source records × `paths(source)`, plus Σ over aggregating
///   operators (`eventWindow`, `windowTop`, `join`) of the records they derived ×
///   `paths(X)` — their results are new records, not 1:1 images of their inputs;
/// - `accounted` = Σ over sinks of the source records that reached it (a synthetic `window`
///   result carries the count of the records it aggregates, so it stays 1:1 with its input);
/// - `absorbed` = Σ over operators of records they removed on purpose × `paths(X)`: dropped
///   by `filter` or `select`, and every input record of an aggregating operator (including
///   late records it dropped).
///
/// Records are counted per record (watermarks and barriers are not records). The inputs of an
/// aggregating operator are event-time records, which always stand for one record each, so
/// their input count is in the same unit as the sink's `accounted`. A record that a map, a
/// channel or a rescale silently drops is absorbed nowhere and shows as
/// `emitted − accounted − absorbed > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordBalance {
    /// Record deliveries owed to the sinks.
    pub emitted: u64,
    /// Source records that reached a sink, over every sink.
    pub accounted: u64,
    /// Records removed or consumed on purpose, weighted by paths to a sink.
    pub absorbed: u64,
    /// Records the sources emitted, each once.
    pub source_records: u64,
}

impl RecordBalance {
    /// The balance of `spec` from cumulative per-operator `counters` (missing operators count
    /// as zero). The graph must be acyclic (as [`JobSpec::validate`] ensures); operators on a
    /// cycle get no paths.
    pub fn of(spec: &JobSpec, counters: &BTreeMap<String, OperatorCounters>) -> RecordBalance {
        let paths = paths_to_sinks(spec);
        let mut b = RecordBalance::default();
        for op in &spec.operators {
            let c = counters.get(&op.name).copied().unwrap_or_default();
            let w = paths.get(op.name.as_str()).copied().unwrap_or(0);
            // records_out counts each record once, however many output edges it goes on.
            let produced = c.records_out;
            match &op.kind {
                OperatorKind::Source { .. } => {
                    b.source_records = b.source_records.saturating_add(produced);
                    b.emitted = b.emitted.saturating_add(produced.saturating_mul(w));
                }
                OperatorKind::Sink { .. } => b.accounted = b.accounted.saturating_add(c.accounted),
                OperatorKind::EventWindow { .. }
                | OperatorKind::WindowTop { .. }
                | OperatorKind::Join { .. } => {
                    b.emitted = b.emitted.saturating_add(produced.saturating_mul(w));
                    b.absorbed = b.absorbed.saturating_add(c.records_in.saturating_mul(w));
                }
                OperatorKind::Map
                | OperatorKind::Filter { .. }
                | OperatorKind::Select { .. }
                | OperatorKind::Window { .. } => {}
            }
            if !matches!(op.kind, OperatorKind::Sink { .. }) {
                b.absorbed = b.absorbed.saturating_add(c.filtered.saturating_mul(w));
            }
        }
        b
    }

    /// `emitted − accounted − absorbed`: records lost (positive) or counted twice (negative).
    pub fn lost(&self) -> i128 {
        i128::from(self.emitted) - i128::from(self.accounted) - i128::from(self.absorbed)
    }
}

/// Number of distinct paths from each operator to a sink (saturating).
fn paths_to_sinks(spec: &JobSpec) -> BTreeMap<&str, u64> {
    let mut paths = BTreeMap::new();
    let Ok(order) = spec.topological_order() else {
        return paths;
    };
    for name in order.into_iter().rev() {
        let Some(op) = spec.operator(&name) else {
            continue;
        };
        let w = if matches!(op.kind, OperatorKind::Sink { .. }) {
            1
        } else {
            spec.outputs_of(&name)
                .iter()
                .map(|o| paths.get(o).copied().unwrap_or(0))
                .fold(0u64, u64::saturating_add)
        };
        paths.insert(op.name.as_str(), w);
    }
    paths
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec(yaml: &str) -> JobSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn counters(items: &[(&str, u64, u64, u64, u64)]) -> BTreeMap<String, OperatorCounters> {
        items
            .iter()
            .map(|&(n, records_in, records_out, accounted, filtered)| {
                (
                    n.to_string(),
                    OperatorCounters {
                        records_in,
                        records_out,
                        accounted,
                        filtered,
                    },
                )
            })
            .collect()
    }

    const SRC: &str = "{ name: src, kind: source, rate: { constant: 1 } }";

    #[test]
    fn select_drops_are_absorbed() {
        let s = spec(&format!(
            "name: j\noperators: [{SRC}, {{ name: q, kind: select, query: q1 }}, {{ name: sink, kind: sink }}]\nedges: [{{ from: src, to: q }}, {{ from: q, to: sink }}]\n"
        ));
        let c = counters(&[
            ("src", 0, 100, 0, 0),
            ("q", 100, 92, 0, 8),
            ("sink", 92, 0, 92, 0),
        ]);
        let b = RecordBalance::of(&s, &c);
        assert_eq!(
            (b.emitted, b.accounted, b.absorbed, b.lost()),
            (100, 92, 8, 0)
        );
    }

    #[test]
    fn fan_out_counts_each_path_once() {
        // source -> a -> {s1, s2}: every record is delivered to two sinks.
        let s = spec(&format!(
            "name: j\noperators: [{SRC}, {{ name: a, kind: map }}, {{ name: s1, kind: sink }}, {{ name: s2, kind: sink }}]\nedges: [{{ from: src, to: a }}, {{ from: a, to: s1 }}, {{ from: a, to: s2 }}]\n"
        ));
        let c = counters(&[
            ("src", 0, 601, 0, 0),
            // records_out counts each record once, not once per output edge.
            ("a", 601, 601, 0, 0),
            ("s1", 601, 0, 601, 0),
            ("s2", 601, 0, 601, 0),
        ]);
        let b = RecordBalance::of(&s, &c);
        assert_eq!((b.source_records, b.emitted, b.lost()), (601, 1202, 0));
        // source -> {a (map), b (filter keep 0.5)} -> sink.
        let s = spec(&format!(
            "name: j\noperators: [{SRC}, {{ name: a, kind: map }}, {{ name: b, kind: filter, keep: 0.5 }}, {{ name: sink, kind: sink }}]\nedges: [{{ from: src, to: a }}, {{ from: src, to: b }}, {{ from: a, to: sink }}, {{ from: b, to: sink }}]\n"
        ));
        let c = counters(&[
            ("src", 0, 100, 0, 0),
            ("a", 100, 100, 0, 0),
            ("b", 100, 48, 0, 52),
            ("sink", 148, 0, 148, 0),
        ]);
        let b = RecordBalance::of(&s, &c);
        assert_eq!(
            (b.source_records, b.emitted, b.absorbed, b.lost()),
            (100, 200, 52, 0)
        );
    }

    #[test]
    fn aggregations_absorb_inputs_and_emit_results() {
        let s = spec(
            "name: j\noperators: [{ name: src, kind: source, rate: { constant: 1 }, nexmark: {} }, { name: bids, kind: select, query: bids }, { name: w, kind: eventWindow, key: auction, window: { tumbling: { sizeMs: 1000 } } }, { name: top, kind: windowTop, key: auction }, { name: sink, kind: sink }]\nedges: [{ from: src, to: bids }, { from: bids, to: w }, { from: w, to: top }, { from: top, to: sink }]\n",
        );
        let c = counters(&[
            ("src", 0, 1000, 0, 0),
            ("bids", 1000, 920, 0, 80),
            ("w", 920, 40, 0, 0),
            ("top", 40, 12, 0, 0),
            ("sink", 12, 0, 12, 0),
        ]);
        let b = RecordBalance::of(&s, &c);
        assert_eq!(b.emitted, 1000 + 40 + 12);
        assert_eq!(b.absorbed, 80 + 920 + 40);
        assert_eq!(b.lost(), 0);
    }

    #[test]
    fn a_record_dropped_by_a_map_is_reported_lost() {
        let s = spec(&format!(
            "name: j\noperators: [{SRC}, {{ name: a, kind: map }}, {{ name: sink, kind: sink }}]\nedges: [{{ from: src, to: a }}, {{ from: a, to: sink }}]\n"
        ));
        // `a` received 100 records but passed on only 99.
        let c = counters(&[
            ("src", 0, 100, 0, 0),
            ("a", 100, 99, 0, 0),
            ("sink", 99, 0, 99, 0),
        ]);
        assert_eq!(RecordBalance::of(&s, &c).lost(), 1);
    }
}
