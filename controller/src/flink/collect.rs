//! One scrape of a running Flink job through its REST API: every vertex's per-subtask counters
//! and, for source vertices, the source operator's output and `pendingRecords`, turned into the
//! planner's sample ([`super::metrics::sample`]). Shared by `streamscale flink` and the
//! operator's `FlinkScaler`.

use std::collections::BTreeMap;

use crate::collect::MetricsSource;
use crate::model::MetricSample;

use super::metrics::{self, FlinkSample, SourceMetricIds, VertexScrape};
use super::rest::{FlinkError, FlinkRest, JobDetails};
use super::topology::{FlinkTopology, VertexRole};

/// Seconds a source vertex's metric listing is reused: a Kafka source's readers report the
/// partitions they are assigned, and a topic can gain partitions while the job runs.
pub const SOURCE_LISTING_MAX_AGE_S: f64 = 60.0;

/// Reads samples of Flink jobs, keeping the metric ids of their source vertices between scrapes
/// (listing a vertex's metrics is one more request; the ids change with the parallelism, the
/// Kafka partitions with the topic: listed again after [`SOURCE_LISTING_MAX_AGE_S`]).
#[derive(Debug, Clone, Default)]
pub struct Collector {
    /// Source metric ids by `job id/vertex id`, with when they were listed (seconds on the
    /// caller's clock).
    source_ids: BTreeMap<String, (SourceMetricIds, f64)>,
}

impl Collector {
    /// A collector with nothing cached.
    pub fn new() -> Collector {
        Collector::default()
    }

    /// Collects one sample of every vertex of `topo` for `job` (as just read by
    /// [`FlinkRest::job`]), read at `at_s` seconds on the caller's monotonic clock; `previous`
    /// is the last sample of the same job. `None` when not every vertex of the job is
    /// `RUNNING` (metrics right after a (re)start are partial).
    ///
    /// # Errors
    /// [`FlinkError`] when a request fails.
    pub async fn collect(
        &mut self,
        rest: &FlinkRest,
        job: &JobDetails,
        topo: &FlinkTopology,
        at_s: f64,
        previous: Option<&MetricSample>,
    ) -> Result<Option<FlinkSample>, FlinkError> {
        if !job.all_running() {
            return Ok(None);
        }
        let mut scrapes = BTreeMap::new();
        for v in &topo.vertices {
            let details = rest.vertex(&job.jid, &v.id).await?;
            let mut scrape = VertexScrape {
                details,
                source_values: BTreeMap::new(),
                source_ids: SourceMetricIds::default(),
            };
            if v.role == VertexRole::Source {
                let key = format!("{}/{}", job.jid, v.id);
                let cached = self
                    .source_ids
                    .get(&key)
                    .filter(|(ids, at)| {
                        ids.records_out.len() >= v.parallelism as usize
                            && at_s - at < SOURCE_LISTING_MAX_AGE_S
                    })
                    .map(|(ids, _)| ids.clone());
                let ids = match cached {
                    Some(ids) => ids,
                    None => {
                        let listing = rest.vertex_metrics(&job.jid, &v.id, &[]).await?;
                        let ids = SourceMetricIds::from_listing(&listing);
                        self.source_ids.insert(key, (ids.clone(), at_s));
                        ids
                    }
                };
                let wanted = ids.all();
                if !wanted.is_empty() {
                    // The source operator's counts and the task's times come in two answers:
                    // when Flink fetched new metrics between them, the counts are newer than
                    // the times that date the sample (a burst, then a sample of nothing). The
                    // task's answer read again after the counts tells: unchanged, both are of
                    // one fetch.
                    for attempt in 0..SAME_FETCH_TRIES {
                        let values = rest.vertex_metrics(&job.jid, &v.id, &wanted).await?;
                        scrape.source_values = metrics::metric_values(&values);
                        let again = rest.vertex(&job.jid, &v.id).await?;
                        let same = metrics::same_fetch(&scrape.details, &again);
                        scrape.details = again;
                        if same || attempt + 1 == SAME_FETCH_TRIES {
                            break;
                        }
                    }
                }
                scrape.source_ids = ids;
            }
            scrapes.insert(v.id.clone(), scrape);
        }
        Ok(Some(metrics::sample(topo, &scrapes, at_s, previous)))
    }
}

/// Reads of a source vertex until its counts and times are of one fetch of Flink's metrics.
const SAME_FETCH_TRIES: usize = 3;

impl crate::collect::Reading for FlinkSample {
    fn sample(&self) -> &MetricSample {
        &self.sample
    }
}

/// One collection of a Flink job through its REST API as a [`MetricsSource`]: `job` as just
/// read by [`FlinkRest::job`], `previous` the job's last sample, source metric ids cached in
/// `collector` ([`Collector::collect`]).
pub struct FlinkRestSource<'a> {
    /// Keeps the source vertices' metric ids between collections.
    pub collector: &'a mut Collector,
    /// The cluster's REST API.
    pub rest: &'a FlinkRest,
    /// The job.
    pub job: &'a JobDetails,
    /// Its topology.
    pub topo: &'a FlinkTopology,
    /// The job's last sample.
    pub previous: Option<&'a MetricSample>,
}

impl MetricsSource for FlinkRestSource<'_> {
    type Reading = FlinkSample;
    type Error = FlinkError;

    fn kind(&self) -> &'static str {
        "flink"
    }

    /// [`Collector::collect`] at `clock()` (read before the requests: Flink stamps its own
    /// fetch time, see [`metrics::sample`]).
    async fn collect(
        &mut self,
        clock: &(dyn Fn() -> f64 + Sync),
    ) -> Result<Option<FlinkSample>, FlinkError> {
        let at_s = clock();
        self.collector
            .collect(self.rest, self.job, self.topo, at_s, self.previous)
            .await
    }
}
