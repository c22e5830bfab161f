//! The Flink backend's collect phase on REST answers recorded from a real Flink 2.3 session
//! cluster running the demo job (`controller/tests/data/flink/README.md` says how): the job
//! graph, two reads of every vertex ten seconds apart, and the source's metrics.

use std::collections::BTreeMap;
use std::path::PathBuf;

use streamscale_controller::flink::metrics::{self, SourceMetricIds, VertexScrape};
use streamscale_controller::flink::rest::{JobDetails, MetricValue, VertexDetails};
use streamscale_controller::flink::topology::{FlinkTopology, VertexRole};

fn data(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/flink")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn parse<T: serde::de::DeserializeOwned>(name: &str) -> T {
    serde_json::from_str(&data(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The source's values, read per subtask (`Source__trace.x`), as the vertex-level ids
/// (`0.Source__trace.x`) the collector asks for.
fn source_values(name: &str) -> Vec<MetricValue> {
    parse::<Vec<MetricValue>>(name)
        .into_iter()
        .map(|m| MetricValue {
            id: format!("0.{}", m.id),
            value: m.value,
        })
        .collect()
}

fn scrapes(topo: &FlinkTopology, suffix: &str, values: &str) -> BTreeMap<String, VertexScrape> {
    let mut out = BTreeMap::new();
    for v in &topo.vertices {
        let file = match v.role {
            VertexRole::Source => format!("vertex-source{suffix}.json"),
            _ => format!("vertex-keyed{suffix}.json"),
        };
        let details: VertexDetails = parse(&file);
        let (ids, vals) = if v.role == VertexRole::Source {
            let vals = source_values(values);
            (
                SourceMetricIds::from_listing(&vals),
                metrics::metric_values(&vals),
            )
        } else {
            (SourceMetricIds::default(), BTreeMap::new())
        };
        out.insert(
            v.id.clone(),
            VertexScrape {
                details,
                source_values: vals,
                source_ids: ids,
            },
        );
    }
    out
}

#[test]
fn the_demo_jobs_graph_is_a_source_feeding_a_keyed_vertex() {
    let job: JobDetails = parse("job.json");
    let t =
        FlinkTopology::from_job(&job, &Default::default(), &Default::default()).expect("topology");
    let roles: Vec<_> = t
        .vertices
        .iter()
        .map(|v| (v.name.as_str(), v.role, v.max_parallelism))
        .collect();
    assert_eq!(
        roles,
        vec![
            ("Source: trace", VertexRole::Source, 128),
            ("count -> discard: Writer", VertexRole::Keyed, 128),
        ]
    );
    assert_eq!(t.spec.edges.len(), 1);
    assert!(job.all_running());
    let restarting: JobDetails = parse("job-restarting.json");
    assert!(!restarting.all_running());
}

/// A job being created (`job-created.json`, recorded after a TaskManager was killed: `CREATED`)
/// lists its vertices in another order and no plan. Its graph is not read from that answer (the
/// keyed vertex would be taken for a source, as the demo's first session line once did), and a
/// graph read from the running job stays the same when that answer comes.
#[test]
fn a_job_without_a_plan_is_not_read_as_a_graph_of_sources() {
    use streamscale_controller::flink::topology::{TopologyError, graph_known};
    let created: JobDetails = parse("job-created.json");
    assert!(!graph_known(&created));
    assert_eq!(
        FlinkTopology::from_job(&created, &Default::default(), &Default::default()),
        Err(TopologyError::PlanNotListed {
            job: created.jid.clone(),
            state: "CREATED".into(),
        })
    );
    let running: JobDetails = parse("job.json");
    let t = FlinkTopology::from_job(&running, &Default::default(), &Default::default())
        .expect("topology");
    assert!(t.same_graph(&running));
    assert!(t.same_graph(&created), "no plan: nothing to compare");
    // A graph whose keyed edge became a forward one is another graph (same vertex ids).
    let mut forward = running.clone();
    for n in &mut forward.plan.nodes {
        for i in &mut n.inputs {
            i.ship_strategy = "FORWARD".into();
        }
    }
    assert!(!t.same_graph(&forward));
    assert!(
        t.describe().ends_with(
            "Source: trace (source, p=1, max 128) -> count -> discard: Writer (keyed, p=1, max 128)"
        ),
        "{}",
        t.describe()
    );
}

#[test]
fn counters_are_dated_by_when_flink_fetched_them() {
    let job: JobDetails = parse("job.json");
    let t =
        FlinkTopology::from_job(&job, &Default::default(), &Default::default()).expect("topology");
    // Read at local times 100 s and 110 s (the answers' `now` 10.1 s apart).
    let first = metrics::sample(
        &t,
        &scrapes(&t, "", "source-subtask0-metric-values.json"),
        100.0,
        None,
    );
    let later = metrics::sample(
        &t,
        &scrapes(&t, "-later", "source-subtask0-metric-values-later.json"),
        110.0,
        Some(&first.sample),
    );
    // Each read is dated by the fetch its counters come from (start + busy + idle +
    // back-pressured of the keyed subtask, which reports all three), not by when it was read.
    let fetch = |file: &str| {
        let v: VertexDetails = parse(file);
        let s = &v.subtasks[0];
        let c = s.metrics.as_ref().expect("counters");
        (
            s.start_time_ms as f64 + c.busy_ms + c.idle_ms + c.backpressured_ms,
            v.now as f64,
        )
    };
    let (f0, now0) = fetch("vertex-keyed.json");
    let (f1, now1) = fetch("vertex-keyed-later.json");
    assert!((first.age_seconds - (now0 - f0) / 1000.0).abs() < 0.2);
    assert!((later.age_seconds - (now1 - f1) / 1000.0).abs() < 0.2);
    let dt = later.sample.at_seconds - first.sample.at_seconds;
    let expected = 10.0 - (later.age_seconds - first.age_seconds);
    assert!((dt - expected).abs() < 1e-9, "{dt} vs {expected}");
    // The keyed vertex was busy the whole time (overloaded at parallelism 1).
    let k = "count -> discard: Writer";
    let (a, b) = (&first.sample.operators[k][0], &later.sample.operators[k][0]);
    let busy = (b.busy_seconds - a.busy_seconds) / ((f1 - f0) / 1000.0);
    assert!(busy > 0.95 && busy <= 1.01, "{busy}");
    // The source reports its backlog and its emitted records.
    let values = metrics::metric_values(&source_values("source-subtask0-metric-values-later.json"));
    let (pending, out) = (
        values["0.Source__trace.pendingRecords"],
        values["0.Source__trace.numRecordsOut"],
    );
    let s = &later.sample.operators["Source: trace"][0];
    assert_eq!(s.source_backlog, Some(pending));
    assert_eq!(s.source_arrivals, Some(out + pending));
    assert!(later.notes.is_empty(), "{:?}", later.notes);
}

/// A source that lists no pendingRecords metric yet (a source registers it once it runs) gets
/// a note; once the metric is listed the note is gone and the source is named as reporting it
/// again, so that the session can say the earlier line no longer holds.
#[test]
fn a_source_whose_pending_records_appear_is_named_once_they_do() {
    let job: JobDetails = parse("job.json");
    let t =
        FlinkTopology::from_job(&job, &Default::default(), &Default::default()).expect("topology");
    let mut early = scrapes(&t, "", "source-subtask0-metric-values.json");
    for s in early.values_mut() {
        s.source_ids.pending.clear();
    }
    let first = metrics::sample(&t, &early, 100.0, None);
    assert_eq!(first.notes.len(), 1, "{:?}", first.notes);
    assert!(
        first.notes[0].starts_with("Source: trace: no pendingRecords metric"),
        "{:?}",
        first.notes
    );
    let later = metrics::sample(
        &t,
        &scrapes(&t, "-later", "source-subtask0-metric-values-later.json"),
        110.0,
        Some(&first.sample),
    );
    assert!(later.notes.is_empty(), "{:?}", later.notes);
    assert_eq!(
        metrics::sources_reporting_again(&first.notes, &later.notes),
        vec!["Source: trace"]
    );
    assert!(metrics::sources_reporting_again(&first.notes, &first.notes).is_empty());
    assert!(metrics::sources_reporting_again(&later.notes, &first.notes).is_empty());
}

/// Recorded from a Kafka-fed job (`bench/kafka-flink`'s `KafkaWindowSum`: `Source: kafka`
/// reading a 3-partition topic at 20,000 records/s, parallelism 2, into a keyed window): each
/// reader lists an offset metric per partition it is assigned (subtask 0 two, subtask 1 one).
/// The source's samples carry the 3 partitions, and the planner sizes the source from its
/// records read per busy second: far under its load at 2 subtasks, it plans 1 (a parallelism
/// that spreads 3 partitions evenly, never above 3).
#[test]
fn a_kafka_sources_partitions_are_read_and_size_it() {
    let job: JobDetails = parse("kafka-job.json");
    let t =
        FlinkTopology::from_job(&job, &Default::default(), &Default::default()).expect("topology");
    let listing: Vec<MetricValue> = parse("kafka-source-metric-ids.json");
    let ids = SourceMetricIds::from_listing(&listing);
    assert_eq!(ids.partitions, 3);
    assert_eq!(ids.pending.len(), 2);
    let scrape = |suffix: &str| {
        let mut out = BTreeMap::new();
        for v in &t.vertices {
            let (file, ids, vals) = if v.role == VertexRole::Source {
                let vals: Vec<MetricValue> =
                    parse(&format!("kafka-source-metric-values{suffix}.json"));
                (
                    format!("kafka-vertex-source{suffix}.json"),
                    ids.clone(),
                    metrics::metric_values(&vals),
                )
            } else {
                (
                    format!("kafka-vertex-window{suffix}.json"),
                    SourceMetricIds::default(),
                    BTreeMap::new(),
                )
            };
            out.insert(
                v.id.clone(),
                VertexScrape {
                    details: parse(&file),
                    source_values: vals,
                    source_ids: ids,
                },
            );
        }
        out
    };
    let first = metrics::sample(&t, &scrape(""), 100.0, None);
    let later = metrics::sample(&t, &scrape("-later"), 110.0, Some(&first.sample));
    let src = &later.sample.operators["Source: kafka"];
    assert_eq!(src.len(), 2);
    assert!(
        src.iter().all(|s| s.source_partitions == Some(3.0)),
        "{src:?}"
    );
    let window = [first.sample, later.sample];
    let plan = |window: &[streamscale_controller::model::MetricSample]| {
        streamscale_controller::model::plan(
            &t.spec,
            window,
            &streamscale_controller::model::PlannerSettings::default(),
        )
        .expect("a plan")
    };
    let decision = plan(&window);
    assert_eq!(decision.parallelism["Source: kafka"], 1, "{decision:?}");
    let source = &decision.operators["Source: kafka"];
    assert_eq!(source.max_parallelism, 3, "{source:?}");
    assert!(
        source.reason.starts_with("source with 3 partitions"),
        "{}",
        source.reason
    );
    // Without the partitions the source keeps its parallelism, as other sources do.
    let mut blind = window.clone();
    for s in &mut blind {
        for sub in s.operators.get_mut("Source: kafka").expect("source") {
            sub.source_partitions = None;
        }
    }
    let decision = plan(&blind);
    assert_eq!(decision.parallelism["Source: kafka"], 2, "{decision:?}");
}

/// A mock of the JobManager's REST API serving the recorded demo job's vertices: the source's
/// task answer is the earlier fetch at the first read and the later one after, while its
/// operator counts are the later fetch's (Flink fetched new metrics between the two answers).
mod same_fetch_mock {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Json;
    use axum::extract::{Path, Query, State};
    use serde_json::Value;
    use streamscale_controller::flink::FlinkRest;
    use streamscale_controller::flink::collect::Collector;

    use super::*;

    #[derive(Default)]
    struct Reads {
        source_details: AtomicUsize,
    }

    fn prefixed(name: &str) -> Value {
        let mut v: Value = serde_json::from_str(&data(name)).expect("json");
        for m in v.as_array_mut().expect("list") {
            let id = m["id"].as_str().expect("id").to_string();
            m["id"] = Value::String(format!("0.{id}"));
        }
        v
    }

    async fn vertex(
        State(reads): State<Arc<Reads>>,
        Path((_jid, vid)): Path<(String, String)>,
    ) -> Json<Value> {
        let job: JobDetails = parse("job.json");
        let source = job
            .vertices
            .iter()
            .any(|v| v.id == vid && v.name.starts_with("Source"));
        let file = if !source {
            "vertex-keyed-later.json"
        } else if reads.source_details.fetch_add(1, Ordering::SeqCst) == 0 {
            "vertex-source.json"
        } else {
            "vertex-source-later.json"
        };
        Json(serde_json::from_str(&data(file)).expect("json"))
    }

    async fn vertex_metrics(Query(q): Query<BTreeMap<String, String>>) -> Json<Value> {
        Json(if q.contains_key("get") {
            prefixed("source-subtask0-metric-values-later.json")
        } else {
            prefixed("source-subtask0-metric-ids.json")
        })
    }

    #[tokio::test]
    async fn a_sources_counts_and_times_are_read_from_one_fetch() {
        let reads = Arc::new(Reads::default());
        let app = axum::Router::new()
            .route("/jobs/{jid}/vertices/{vid}", axum::routing::get(vertex))
            .route(
                "/jobs/{jid}/vertices/{vid}/metrics",
                axum::routing::get(vertex_metrics),
            )
            .with_state(Arc::clone(&reads));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("port").port();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let rest = FlinkRest::new(reqwest::Client::new(), &format!("http://127.0.0.1:{port}"));
        let job: JobDetails = parse("job.json");
        let topo = FlinkTopology::from_job(&job, &Default::default(), &Default::default())
            .expect("topology");
        let got = Collector::new()
            .collect(&rest, &job, &topo, 100.0, None)
            .await
            .expect("collected")
            .expect("every vertex running");
        // The source's task read again after its counts: the later fetch's times date them.
        assert!(reads.source_details.load(Ordering::SeqCst) >= 2);
        let expected = metrics::sample(
            &topo,
            &scrapes(&topo, "-later", "source-subtask0-metric-values-later.json"),
            100.0,
            None,
        );
        assert_eq!(got.sample, expected.sample);
        assert_eq!(got.age_seconds, expected.age_seconds);
    }
}
