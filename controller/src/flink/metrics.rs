//! Flink's per-subtask counters as the planner's metric sample. Pure.
//!
//! From `GET /jobs/:jid/vertices/:vid` every subtask's cumulative `read-records`,
//! `write-records`, `accumulated-busy-time`, `accumulated-idle-time` and
//! `accumulated-backpressured-time` (milliseconds) become the sample's records in/out and
//! busy/idle/back-pressured seconds; rates are their deltas over the measured time between
//! scrapes, as for the bundled engine. For a source vertex:
//! - busy time, which Flink does not measure for source tasks (`NaN`), is the subtask's
//!   running time less its idle and back-pressured time;
//! - the backlog is the source's `pendingRecords` (Kafka and other FLIP-27 sources that
//!   report it); arrivals are the source operator's `numRecordsOut` plus that backlog (what
//!   was emitted and what waits), so that Δarrivals/Δt is the producers' rate even while the
//!   source falls behind;
//! - a Kafka source's partition count ([`SourceMetricIds::partitions`]) is the sample's
//!   `source_partitions`: the planner sizes such a source like an operator, from its records
//!   read per busy second, never above its partitions;
//! - a source without `pendingRecords` (datagen, ...) has its arrivals read from its output;
//!   its backlog is taken as 0 while it spent under [`SOURCE_BP_LIMIT`] of the last interval
//!   back-pressured (a source that is not held back keeps up with its input), and as unknown
//!   otherwise (the planner then holds scale-downs), and the sample's notes say so.
//!
//! Flink's network buffers count bytes, not records, so the input queue length is 0.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{MetricSample, SubtaskSample};

use super::rest::{MetricValue, VertexDetails};
use super::topology::{FlinkTopology, VertexRole};

/// Share of a scrape interval a source without `pendingRecords` may spend back-pressured and
/// still be taken as keeping up (backlog 0).
pub const SOURCE_BP_LIMIT: f64 = 0.1;

/// Largest step back (seconds) of an accumulated time that is read as Flink's measurement
/// noise rather than a restarted subtask.
pub const STEP_BACK_TOLERANCE_S: f64 = 1.0;

/// The metric ids (as `GET /jobs/:jid/vertices/:vid/metrics` lists them, `<subtask>.<name>`)
/// of a source vertex's backlog and output, by subtask index, and the Kafka partitions its
/// readers report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SourceMetricIds {
    /// `<k>.<source operator>.pendingRecords`.
    pub pending: BTreeMap<u32, String>,
    /// `<k>.<source operator>.numRecordsOut`.
    pub records_out: BTreeMap<u32, String>,
    /// Kafka sources: the distinct topic partitions the vertex's readers report an offset of
    /// (`<k>.<source operator>.KafkaSourceReader.topic.<topic>.partition.<n>.currentOffset`,
    /// one per partition a reader is assigned, every partition assigned to one reader), the
    /// most subtasks the source can use; 0 for other sources.
    pub partitions: u32,
}

/// The partition a Kafka reader's offset metric is about, as `<scope>…topic.<t>.partition.<n>`
/// (the id without its subtask index and metric name, the same for any reader it is assigned
/// to); `None` for other metrics.
fn kafka_partition(rest: &str) -> Option<&str> {
    let key = rest.strip_suffix(".currentOffset")?;
    let (_, topic_partition) = key.split_once(".KafkaSourceReader.topic.")?;
    let (topic, n) = topic_partition.rsplit_once(".partition.")?;
    (!topic.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(key)
}

impl SourceMetricIds {
    /// Picks the ids from a vertex's metric listing: per subtask, the `pendingRecords` of an
    /// operator scope, and the `numRecordsOut` of the scope whose name starts with `Source`
    /// (Flink names a source operator's scope `Source__<name>`), else of any operator scope.
    pub fn from_listing(listing: &[MetricValue]) -> SourceMetricIds {
        let mut ids = SourceMetricIds::default();
        let mut fallback_out: BTreeMap<u32, String> = BTreeMap::new();
        let mut partitions: BTreeSet<&str> = BTreeSet::new();
        for m in listing {
            let Some((k, rest)) = m.id.split_once('.') else {
                continue;
            };
            let Ok(k) = k.parse::<u32>() else { continue };
            if let Some(p) = kafka_partition(rest) {
                partitions.insert(p);
                continue;
            }
            let Some((scope, name)) = rest.rsplit_once('.') else {
                continue;
            };
            match name {
                "pendingRecords" => {
                    ids.pending.entry(k).or_insert_with(|| m.id.clone());
                }
                "numRecordsOut" if scope.starts_with("Source") => {
                    ids.records_out.insert(k, m.id.clone());
                }
                "numRecordsOut" => {
                    fallback_out.entry(k).or_insert_with(|| m.id.clone());
                }
                _ => {}
            }
        }
        for (k, id) in fallback_out {
            ids.records_out.entry(k).or_insert(id);
        }
        ids.partitions = u32::try_from(partitions.len()).unwrap_or(u32::MAX);
        ids
    }

    /// Every id, to fetch in one request.
    pub fn all(&self) -> Vec<String> {
        self.pending
            .values()
            .chain(self.records_out.values())
            .cloned()
            .collect()
    }
}

/// One vertex's answers at a scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct VertexScrape {
    /// `GET /jobs/:jid/vertices/:vid`.
    pub details: VertexDetails,
    /// For a source vertex, the values of its [`SourceMetricIds`] (id -> value).
    pub source_values: BTreeMap<String, f64>,
    /// For a source vertex, the ids those values were fetched for.
    pub source_ids: SourceMetricIds,
}

/// Parses a metrics answer's values (Flink sends them as strings; unparsable ones are left out).
pub fn metric_values(values: &[MetricValue]) -> BTreeMap<String, f64> {
    values
        .iter()
        .filter_map(|m| {
            let v = m.value.as_deref()?.trim().parse::<f64>().ok()?;
            Some((m.id.clone(), v))
        })
        .collect()
}

/// Whether two answers about one vertex carry the counters of the same fetch of Flink's
/// metrics: every subtask's counters equal (`NaN` equal to `NaN`: a source task's busy time).
pub fn same_fetch(a: &VertexDetails, b: &VertexDetails) -> bool {
    let key = |d: &VertexDetails| -> Vec<(u32, Option<[u64; 5]>)> {
        d.subtasks
            .iter()
            .map(|s| {
                let c = s.metrics.as_ref().map(|c| {
                    [
                        c.read_records.to_bits(),
                        c.write_records.to_bits(),
                        c.busy_ms.to_bits(),
                        c.idle_ms.to_bits(),
                        c.backpressured_ms.to_bits(),
                    ]
                });
                (s.subtask, c)
            })
            .collect()
    };
    key(a) == key(b)
}

/// A scrape turned into a sample.
#[derive(Debug, Clone, PartialEq)]
pub struct FlinkSample {
    /// The planner's sample (operators named as the topology names them), stamped with the
    /// time Flink fetched the counters (see [`sample`]).
    pub sample: MetricSample,
    /// How old the counters were when they were read, seconds (Flink serves the metrics it
    /// fetched last, up to `metrics.fetcher.update-interval` old and older when nobody asked).
    pub age_seconds: f64,
    /// Sources planned without a reported backlog, with what was used instead.
    pub notes: Vec<String>,
}

/// When Flink fetched the counters it served, milliseconds on the JobManager's clock: a
/// subtask's busy, idle and back-pressured times add up to its running time at the fetch, so
/// `start-time + busy + idle + back-pressured` dates the fetch (all subtasks are fetched
/// together; the median over subtasks with all three measured). `None` when no subtask has
/// all three.
pub fn fetched_at_ms(scrapes: &BTreeMap<String, VertexScrape>) -> Option<f64> {
    let mut at: Vec<f64> = scrapes
        .values()
        .flat_map(|v| v.details.subtasks.iter())
        .filter(|s| s.status == "RUNNING")
        .filter_map(|s| {
            let c = s.metrics.as_ref()?;
            let sum = c.busy_ms + c.idle_ms + c.backpressured_ms;
            (sum.is_finite() && s.start_time_ms > 0).then_some(s.start_time_ms as f64 + sum)
        })
        .collect();
    if at.is_empty() {
        return None;
    }
    at.sort_by(f64::total_cmp);
    Some(at[at.len() / 2])
}

/// Builds the sample of one scrape read at `at_seconds` (seconds on the caller's monotonic
/// clock) from every vertex's answers (by vertex id). The sample is stamped with the time the
/// counters were fetched ([`fetched_at_ms`], moved to the caller's clock by the age of the
/// counters at the answer's `now`), so that rates are deltas over the time the counters really
/// span. `previous` is the last sample, to judge whether a source without `pendingRecords`
/// was back-pressured since. A vertex missing from `scrapes`, and a subtask not `RUNNING` or
/// without counters, gets [`SubtaskSample::absent`] places: an incomplete sample the planner
/// does not read as zeros.
pub fn sample(
    topo: &FlinkTopology,
    scrapes: &BTreeMap<String, VertexScrape>,
    at_seconds: f64,
    previous: Option<&MetricSample>,
) -> FlinkSample {
    let answered_ms = scrapes.values().map(|v| v.details.now).max().unwrap_or(0) as f64;
    let fetched_ms = fetched_at_ms(scrapes).filter(|&f| f <= answered_ms);
    let age_seconds = fetched_ms.map_or(0.0, |f| (answered_ms - f) / 1000.0);
    let at_seconds = at_seconds - age_seconds;
    let mut operators = BTreeMap::new();
    let mut notes = Vec::new();
    for v in &topo.vertices {
        let Some(scrape) = scrapes.get(&v.id) else {
            operators.insert(
                v.name.clone(),
                vec![SubtaskSample::absent(); v.parallelism as usize],
            );
            continue;
        };
        let d = &scrape.details;
        let mut subtasks = vec![SubtaskSample::absent(); d.parallelism as usize];
        let mut inferred = 0usize;
        for s in &d.subtasks {
            let Some(slot) = subtasks.get_mut(s.subtask as usize) else {
                continue;
            };
            let Some(c) = s.metrics.as_ref().filter(|_| s.status == "RUNNING") else {
                continue;
            };
            // The same subtask in the previous sample.
            let prev = previous
                .and_then(|p| p.operators.get(&v.name))
                .and_then(|p| p.get(s.subtask as usize))
                .filter(|p| !p.is_absent());
            let ms = 1e-3;
            let mut sub = SubtaskSample {
                records_in: c.read_records,
                records_out: c.write_records,
                busy_seconds: c.busy_ms * ms,
                idle_seconds: c.idle_ms * ms,
                backpressured_seconds: c.backpressured_ms * ms,
                queue_length: 0.0,
                ..SubtaskSample::default()
            };
            if v.role == VertexRole::Source {
                let bp = if c.backpressured_ms.is_finite() {
                    c.backpressured_ms
                } else {
                    0.0
                };
                let idle = if c.idle_ms.is_finite() {
                    c.idle_ms
                } else {
                    0.0
                };
                if !c.busy_ms.is_finite() {
                    let at_ms = fetched_ms.unwrap_or(d.now as f64);
                    let running_ms = (at_ms - s.start_time_ms as f64).max(0.0);
                    sub.busy_seconds = (running_ms - idle - bp).max(0.0) * ms;
                }
                sub.idle_seconds = idle * ms;
                sub.backpressured_seconds = bp * ms;
                let get = |ids: &BTreeMap<u32, String>| {
                    ids.get(&s.subtask)
                        .and_then(|id| scrape.source_values.get(id))
                        .copied()
                };
                let emitted = get(&scrape.source_ids.records_out).unwrap_or(c.write_records);
                sub.records_in = emitted;
                let partitions = scrape.source_ids.partitions;
                sub.source_partitions = (partitions > 0).then_some(f64::from(partitions));
                match get(&scrape.source_ids.pending) {
                    Some(pending) if pending >= 0.0 => {
                        sub.source_backlog = Some(pending);
                        sub.source_arrivals = Some(emitted + pending);
                    }
                    _ => {
                        let prev_bp = prev.map(|p| p.backpressured_seconds);
                        let gap = previous.map(|p| at_seconds - p.at_seconds);
                        let keeps_up = match (prev_bp, gap) {
                            (Some(b0), Some(gap)) if gap > 0.0 && b0.is_finite() => {
                                (sub.backpressured_seconds - b0) / gap < SOURCE_BP_LIMIT
                            }
                            _ => false,
                        };
                        if keeps_up {
                            sub.source_backlog = Some(0.0);
                            sub.source_arrivals = Some(emitted);
                            inferred += 1;
                        } else {
                            sub.source_backlog = None;
                            sub.source_arrivals = None;
                        }
                    }
                }
            }
            // Flink's accumulated times of a source task can step back a little between
            // fetches (seen: busy 471 ms, then 464 ms); a counter that only grows must not
            // read as a reset, so a small step back keeps the previous value.
            if let Some(p) = prev.filter(|p| sub.records_out >= p.records_out) {
                for (now, before) in [
                    (&mut sub.busy_seconds, p.busy_seconds),
                    (&mut sub.idle_seconds, p.idle_seconds),
                    (&mut sub.backpressured_seconds, p.backpressured_seconds),
                ] {
                    if *now < before && before - *now < STEP_BACK_TOLERANCE_S {
                        *now = before;
                    }
                }
            }
            *slot = sub;
        }
        if v.role == VertexRole::Source && scrape.source_ids.pending.is_empty() {
            notes.push(if inferred > 0 {
                format!(
                    "{}{NO_PENDING}; arrival rate read from its output, backlog taken as 0 (back-pressured under {:.0} % of the interval)",
                    v.name,
                    SOURCE_BP_LIMIT * 100.0
                )
            } else {
                format!(
                    "{}{NO_PENDING} and back-pressured (or no earlier sample): backlog unknown, arrival rate read from its output, no scale-down",
                    v.name
                )
            });
        }
        operators.insert(v.name.clone(), subtasks);
    }
    FlinkSample {
        sample: MetricSample {
            at_seconds,
            operators,
        },
        age_seconds,
        notes,
    }
}

/// The text after a vertex name in a [`FlinkSample::notes`] line about a source without a
/// `pendingRecords` metric.
const NO_PENDING: &str = ": no pendingRecords metric";

/// The source vertices a note of `before` said had no `pendingRecords` metric and no note of
/// `now` says so any more (the metric appeared: a source registers it once it runs), in
/// `before`'s order.
pub fn sources_reporting_again<'a>(before: &'a [String], now: &[String]) -> Vec<&'a str> {
    before
        .iter()
        .filter_map(|n| n.split_once(NO_PENDING).map(|(vertex, _)| vertex))
        .filter(|vertex| {
            !now.iter()
                .any(|n| n.split_once(NO_PENDING).is_some_and(|(v, _)| v == *vertex))
        })
        .collect()
}

/// Least time between the dates of two samples of one job, seconds. A sample dated closer
/// to the one before it (its counters' fetch dated from answers of two fetches) spans nearly
/// no time, and the records of one interval over it read as a rate a hundred times the real
/// one (seen: γ 466,375 rec/s for 5,000, and a rescale decided on it).
pub const MIN_SAMPLE_GAP_S: f64 = 0.5;

/// Whether `b` cannot be taken after `a`: the same counters ([`same_counters`]), or dated less
/// than [`MIN_SAMPLE_GAP_S`] after it.
pub fn no_new_measurement(a: &MetricSample, b: &MetricSample) -> bool {
    same_counters(a, b) || b.at_seconds - a.at_seconds < MIN_SAMPLE_GAP_S
}

/// Whether two samples carry the same counters (Flink refreshes the metrics it serves every
/// `metrics.fetcher.update-interval`, 10 s by default; a scrape between two refreshes repeats
/// the last one and must not count as a second measurement).
pub fn same_counters(a: &MetricSample, b: &MetricSample) -> bool {
    a.operators.len() == b.operators.len()
        && a.operators.iter().all(|(name, subs)| {
            b.operators.get(name).is_some_and(|other| {
                subs.len() == other.len()
                    && subs.iter().zip(other).all(|(x, y)| {
                        x.records_out.to_bits() == y.records_out.to_bits()
                            && x.records_in.to_bits() == y.records_in.to_bits()
                            && x.idle_seconds.to_bits() == y.idle_seconds.to_bits()
                    })
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_dated_on_top_of_the_last_is_no_new_measurement() {
        let at = |t: f64, records: f64| {
            let mut s = MetricSample {
                at_seconds: t,
                ..MetricSample::default()
            };
            s.operators.insert(
                "v".into(),
                vec![SubtaskSample {
                    records_in: records,
                    ..SubtaskSample::default()
                }],
            );
            s
        };
        assert!(!no_new_measurement(&at(10.0, 100.0), &at(12.0, 200.0)));
        assert!(no_new_measurement(&at(10.0, 100.0), &at(12.0, 100.0)));
        assert!(no_new_measurement(&at(10.0, 100.0), &at(10.03, 5100.0)));
        assert!(no_new_measurement(&at(10.0, 100.0), &at(9.0, 5100.0)));
    }
    use crate::flink::rest::{SubtaskCounters, SubtaskDetails};

    /// A vertex's metric listing of `ids` (`GET …/metrics` without `get`: ids, no values).
    fn listing(ids: &[&str]) -> Vec<MetricValue> {
        ids.iter()
            .map(|id| MetricValue {
                id: (*id).to_string(),
                value: None,
            })
            .collect()
    }

    /// Kafka's partition offsets as Flink's Kafka connector names them: a topic may hold dots,
    /// a reader reports only the partitions it is assigned, and each partition counts once.
    #[test]
    fn kafka_partitions_are_counted_once_across_readers() {
        let listing = listing(&[
            "0.Source__kafka.KafkaSourceReader.topic.orders.eu.partition.0.currentOffset",
            "0.Source__kafka.KafkaSourceReader.topic.orders.eu.partition.0.committedOffset",
            "1.Source__kafka.KafkaSourceReader.topic.orders.eu.partition.1.currentOffset",
            "1.Source__kafka.KafkaSourceReader.topic.orders.eu.partition.10.currentOffset",
            "2.Source__kafka.KafkaSourceReader.topic.clicks.partition.0.currentOffset",
            // Listed again by another reader (e.g. between an assignment and a restart).
            "2.Source__kafka.KafkaSourceReader.topic.orders.eu.partition.1.currentOffset",
            "0.Source__kafka.KafkaSourceReader.topic.x.partition.p.currentOffset",
            "0.Source__kafka.KafkaSourceReader.commitsSucceeded",
            "0.Source__kafka.pendingRecords",
        ]);
        let ids = SourceMetricIds::from_listing(&listing);
        assert_eq!(ids.partitions, 4);
        assert_eq!(ids.pending.len(), 1);
        assert_eq!(SourceMetricIds::default().partitions, 0);
    }

    #[test]
    fn source_metric_ids_prefer_the_source_operator() {
        let listing = listing(&[
            "0.numRecordsOut",
            "0.Source__trace.numRecordsOut",
            "0.Map.numRecordsOut",
            "0.Source__trace.pendingRecords",
            "1.Map.numRecordsOut",
        ]);
        let ids = SourceMetricIds::from_listing(&listing);
        assert_eq!(ids.records_out[&0], "0.Source__trace.numRecordsOut");
        assert_eq!(ids.records_out[&1], "1.Map.numRecordsOut");
        assert_eq!(ids.pending[&0], "0.Source__trace.pendingRecords");
        assert_eq!(ids.pending.len(), 1);
    }

    fn counters(out: f64, busy: f64, idle: f64, bp: f64) -> SubtaskCounters {
        SubtaskCounters {
            read_records: 0.0,
            read_records_complete: true,
            write_records: out,
            write_records_complete: true,
            busy_ms: busy,
            idle_ms: idle,
            backpressured_ms: bp,
        }
    }

    fn topo() -> FlinkTopology {
        use crate::flink::rest::{JobDetails, Plan, PlanInput, PlanNode, VertexSummary};
        let v = |id: &str, name: &str| VertexSummary {
            id: id.into(),
            name: name.into(),
            parallelism: 1,
            max_parallelism: 128,
            status: "RUNNING".into(),
        };
        let job = JobDetails {
            jid: "j".into(),
            name: "j".into(),
            state: "RUNNING".into(),
            now: 0,
            scheduler_type: None,
            vertices: vec![v("s", "src"), v("k", "agg")],
            plan: Plan {
                nodes: vec![
                    PlanNode {
                        id: "s".into(),
                        inputs: vec![],
                    },
                    PlanNode {
                        id: "k".into(),
                        inputs: vec![PlanInput {
                            id: "s".into(),
                            ship_strategy: "HASH".into(),
                        }],
                    },
                ],
            },
        };
        FlinkTopology::from_job(&job, &Default::default(), &Default::default()).expect("topo")
    }

    fn scrape(id: &str, now: i64, c: SubtaskCounters, status: &str) -> VertexScrape {
        VertexScrape {
            details: VertexDetails {
                id: id.into(),
                name: id.into(),
                parallelism: 1,
                now,
                subtasks: vec![SubtaskDetails {
                    subtask: 0,
                    status: status.into(),
                    start_time_ms: 0,
                    metrics: Some(c),
                }],
            },
            source_values: BTreeMap::new(),
            source_ids: SourceMetricIds::default(),
        }
    }

    #[test]
    fn a_source_with_pending_records_reports_backlog_and_arrivals() {
        let t = topo();
        let mut s = scrape(
            "s",
            10_000,
            counters(900.0, f64::NAN, 1000.0, 4000.0),
            "RUNNING",
        );
        s.source_ids
            .pending
            .insert(0, "0.Source__s.pendingRecords".into());
        s.source_ids
            .records_out
            .insert(0, "0.Source__s.numRecordsOut".into());
        s.source_values
            .insert("0.Source__s.pendingRecords".into(), 50.0);
        s.source_values
            .insert("0.Source__s.numRecordsOut".into(), 1000.0);
        let k = scrape(
            "k",
            10_000,
            counters(1000.0, 9000.0, 1000.0, 0.0),
            "RUNNING",
        );
        let got = sample(
            &t,
            &[("s".to_string(), s), ("k".to_string(), k)]
                .into_iter()
                .collect(),
            3.0,
            None,
        );
        let src = &got.sample.operators["src"][0];
        assert_eq!(src.source_backlog, Some(50.0));
        assert_eq!(src.source_arrivals, Some(1050.0));
        assert_eq!(src.records_out, 900.0, "what the vertex sent downstream");
        assert!(
            (src.busy_seconds - 5.0).abs() < 1e-9,
            "10 s running − 1 s idle − 4 s bp"
        );
        assert!(got.notes.is_empty());
        assert!((got.sample.operators["agg"][0].busy_seconds - 9.0).abs() < 1e-9);
    }

    #[test]
    fn a_source_without_pending_records_keeps_up_only_when_not_back_pressured() {
        let t = topo();
        let k = || scrape("k", 10_000, counters(0.0, 0.0, 0.0, 0.0), "RUNNING");
        let at = |bp: f64, at_s: f64, prev: Option<&MetricSample>| {
            let s = scrape("s", 10_000, counters(100.0, f64::NAN, 0.0, bp), "RUNNING");
            sample(
                &t,
                &[("s".to_string(), s), ("k".to_string(), k())]
                    .into_iter()
                    .collect(),
                at_s,
                prev,
            )
        };
        let first = at(0.0, 0.0, None);
        assert_eq!(first.sample.operators["src"][0].source_backlog, None);
        assert!(first.notes[0].contains("backlog unknown"));
        let calm = at(500.0, 10.0, Some(&first.sample));
        assert_eq!(calm.sample.operators["src"][0].source_backlog, Some(0.0));
        assert!(calm.notes[0].contains("taken as 0"), "{:?}", calm.notes);
        let held = at(5000.0, 20.0, Some(&calm.sample));
        assert_eq!(held.sample.operators["src"][0].source_backlog, None);
    }

    #[test]
    fn a_subtask_not_running_or_a_vertex_missing_is_absent() {
        let t = topo();
        let s = scrape("s", 10_000, counters(1.0, 1.0, 1.0, 1.0), "DEPLOYING");
        let got = sample(&t, &[("s".to_string(), s)].into_iter().collect(), 1.0, None);
        assert!(got.sample.operators["src"][0].is_absent());
        assert!(got.sample.operators["agg"][0].is_absent());
    }

    #[test]
    fn a_small_step_back_of_an_accumulated_time_is_not_a_reset() {
        let t = topo();
        let k = || scrape("k", 10_000, counters(0.0, 0.0, 0.0, 0.0), "RUNNING");
        let at = |busy: f64, out: f64, prev: Option<&MetricSample>| {
            let s = scrape("s", 10_000, counters(out, busy, 0.0, 0.0), "RUNNING");
            sample(
                &t,
                &[("s".to_string(), s), ("k".to_string(), k())]
                    .into_iter()
                    .collect(),
                1.0,
                prev,
            )
        };
        let first = at(471.0, 100.0, None);
        let later = at(464.0, 200.0, Some(&first.sample));
        assert!((later.sample.operators["src"][0].busy_seconds - 0.471).abs() < 1e-12);
        let restarted = at(10.0, 5.0, Some(&later.sample));
        assert!((restarted.sample.operators["src"][0].busy_seconds - 0.010).abs() < 1e-12);
    }
}
