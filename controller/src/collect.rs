//! The collect phase: where a job's metrics come from ([`MetricsSource`]). Each source yields
//! a reading that carries the planner's [`MetricSample`] ([`Reading::sample`]) beside what only
//! that source knows (the engine's latency histogram, Prometheus' scrape time, Flink's counter
//! age). Implemented by the engine's `/metrics` page ([`EngineScrape`]), Flink's REST API
//! ([`crate::flink::collect::FlinkRestSource`]) and, in the operator, a Prometheus server.

use std::future::Future;

use crate::model::MetricSample;
use crate::scrape::{EngineMetrics, ScrapeError, scrape_stamped};

/// What one collection yields: the planner's sample and the source's own extras.
pub trait Reading {
    /// The planner's sample.
    fn sample(&self) -> &MetricSample;
}

impl Reading for EngineMetrics {
    fn sample(&self) -> &MetricSample {
        &self.sample
    }
}

/// A source of a job's metrics.
pub trait MetricsSource {
    /// What one collection yields.
    type Reading: Reading;
    /// Why a collection failed.
    type Error: std::error::Error;

    /// The source's kind, for logs and counters (`engine`, `prometheus`, `flink`).
    fn kind(&self) -> &'static str;

    /// Collects one reading, its sample stamped by `clock` (seconds on the caller's monotonic
    /// clock, read when the figures were taken). `Ok(None)` when the job has nothing to read
    /// yet (e.g. not every Flink vertex is running).
    ///
    /// # Errors
    /// [`MetricsSource::Error`] naming what could not be read.
    fn collect(
        &mut self,
        clock: &(dyn Fn() -> f64 + Sync),
    ) -> impl Future<Output = Result<Option<Self::Reading>, Self::Error>> + Send;
}

/// The engine's own `/metrics` page (Prometheus text exposition), read over HTTP.
#[derive(Debug, Clone, Copy)]
pub struct EngineScrape<'a> {
    client: &'a reqwest::Client,
    url: &'a str,
}

impl<'a> EngineScrape<'a> {
    /// The page at `url` (an engine's `…/metrics`), read with `client`.
    pub fn new(client: &'a reqwest::Client, url: &'a str) -> EngineScrape<'a> {
        EngineScrape { client, url }
    }
}

impl MetricsSource for EngineScrape<'_> {
    type Reading = EngineMetrics;
    type Error = ScrapeError;

    fn kind(&self) -> &'static str {
        "engine"
    }

    /// The page, stamped when it arrived ([`scrape_stamped`]); never `Ok(None)`.
    async fn collect(
        &mut self,
        clock: &(dyn Fn() -> f64 + Sync),
    ) -> Result<Option<EngineMetrics>, ScrapeError> {
        scrape_stamped(self.client, self.url, clock).await.map(Some)
    }
}
