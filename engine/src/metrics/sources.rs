//! The sources' figures (arrivals, backlog, target rate, Kafka partitions), read from each
//! running source subtask at every scrape.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};

use super::{LABELS, MetricsError, label_pairs};

/// A source operator's figures at one moment, operator-wide (every subtask of the source
/// reads the same; each reports a 1/p share).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SourceReading {
    /// Records that should have been emitted by now: the rate function's cumulative
    /// arrivals ∫₀ᵗ rate since the job first started (carried across restores), floored and
    /// capped by the source's `count`.
    pub due: u64,
    /// Records the source's subtasks have claimed so far (its position).
    pub emitted: u64,
    /// Target rate now, records/s.
    pub rate: f64,
    /// Kafka sources: the topic's partition count, the source's useful parallelism at most
    /// (`streamscale_source_partitions`); `None` for other sources.
    pub partitions: Option<u32>,
}

/// Reads a source operator's [`SourceReading`] now; the runtime implements it from what the
/// source loop itself uses (rate function, job start, `count`, the gate's position), so the
/// figures are current at every scrape even while the source thread is blocked on a full
/// output channel. Called at scrape time, never per record.
pub trait SourceProbe: Send + Sync {
    /// The figures at this moment.
    fn read(&self) -> SourceReading;
}

/// Last exposed figures of one source subtask, and where fresh ones come from while it runs.
#[derive(Default)]
struct SourceSeries {
    live: Option<LiveSource>,
    /// `streamscale_source_arrivals_total`: never decreases.
    arrivals: f64,
    backlog: f64,
    rate: f64,
    partitions: Option<u32>,
}

struct LiveSource {
    probe: Arc<dyn SourceProbe>,
    /// The source's parallelism p: the subtask reports 1/p of the operator's figures.
    parallelism: f64,
    /// Added to the arrivals share so that a series a previous run of the job left higher
    /// (an in-process restart from scratch) continues from where it was.
    offset: f64,
    /// Which attachment this is ([`SourceMetricsVec::attach`]): a late detach of an older
    /// run must not stop a newer one.
    generation: u64,
}

impl SourceSeries {
    /// Reads the probe (if the source runs) into the exposed figures.
    fn refresh(&mut self) {
        let Some(live) = &self.live else { return };
        let r = live.probe.read();
        let p = live.parallelism;
        // A wall clock stepping back lowers `due` for a while: the counter then holds.
        self.arrivals = self.arrivals.max(live.offset + r.due as f64 / p);
        self.backlog = r.due.saturating_sub(r.emitted) as f64 / p;
        self.rate = r.rate / p;
        self.partitions = r.partitions.or(self.partitions);
    }
}

struct SourceFamilies {
    arrivals: Desc,
    backlog: Desc,
    rate: Desc,
    partitions: Desc,
    /// Series by label values (`operator`, `subtask`), and the last generation handed out.
    series: Mutex<(BTreeMap<[String; 2], SourceSeries>, u64)>,
}

/// The sources' families `streamscale_source_arrivals_total` (counter),
/// `streamscale_source_backlog_records`, `streamscale_source_rate_records_per_second` and,
/// for Kafka sources only, `streamscale_source_partitions` (gauges), labels `operator` and
/// `subtask`, computed at scrape time.
///
/// A running source subtask [`attaches`](SourceMetricsVec::attach) a [`SourceProbe`] and its
/// parallelism p; every scrape then reads the probe, so the figures are current whatever the
/// source thread is doing (blocked in `send` under backpressure, the controller's arrival
/// rate γ = Δarrivals / Δt stays unbiased). Per subtask: arrivals = due / p (monotone: the
/// largest value exposed so far), backlog = (due − emitted) / p, rate = rate / p. When the
/// subtask ends (its [`AttachedSource`] is dropped) the figures are read once more and then
/// stay as they are, as a stopped source's do.
#[derive(Clone)]
pub struct SourceMetricsVec {
    inner: Arc<SourceFamilies>,
}

impl SourceMetricsVec {
    /// The three families, without series.
    ///
    /// # Errors
    /// [`prometheus::Error`] if a name or help is not valid (a programming error).
    pub fn new() -> Result<SourceMetricsVec, MetricsError> {
        let desc = |name: &str, help: &str| {
            let labels = LABELS.iter().map(|l| (*l).to_string()).collect();
            Desc::new(name.into(), help.into(), labels, HashMap::new())
        };
        Ok(SourceMetricsVec {
            inner: Arc::new(SourceFamilies {
                arrivals: desc(
                    "streamscale_source_arrivals_total",
                    "Records the source should have emitted by now (external arrivals).",
                )?,
                backlog: desc(
                    "streamscale_source_backlog_records",
                    "Records the source should have emitted by now but has not.",
                )?,
                rate: desc(
                    "streamscale_source_rate_records_per_second",
                    "Current target emission rate of the source.",
                )?,
                partitions: desc(
                    "streamscale_source_partitions",
                    "Partitions of a Kafka source's topic (its useful parallelism at most).",
                )?,
                series: Mutex::new((BTreeMap::new(), 0)),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (BTreeMap<[String; 2], SourceSeries>, u64)> {
        self.inner
            .series
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the series `[operator, subtask]` report `probe`'s figures divided by
    /// `parallelism` (p ≥ 1; 0 counts as 1) from now on, until the returned handle is
    /// dropped. The series exists from this call on, read at once.
    ///
    /// A series that already exists (a job restarted in the same process) continues: its
    /// arrivals counter never decreases, and when the new run's share starts below it (a
    /// restart from scratch, whose arrivals count from 0 again) it grows from where it was.
    /// A restart from a checkpoint keeps the job's start time, so its share continues the
    /// old one and no offset is needed.
    pub fn attach(
        &self,
        labels: [&str; 2],
        parallelism: u32,
        probe: Arc<dyn SourceProbe>,
    ) -> AttachedSource {
        let key = labels.map(str::to_string);
        let p = f64::from(parallelism.max(1));
        let first = probe.read();
        let mut guard = self.lock();
        let (series, generation) = &mut *guard;
        *generation += 1;
        let s = series.entry(key.clone()).or_default();
        s.live = Some(LiveSource {
            offset: (s.arrivals - first.due as f64 / p).max(0.0),
            probe,
            parallelism: p,
            generation: *generation,
        });
        s.refresh();
        AttachedSource {
            family: self.clone(),
            key,
            generation: *generation,
        }
    }

    /// The exposed `(arrivals, backlog, rate)` of the series `[operator, subtask]`, read now
    /// when it runs (`None` if it does not exist).
    pub fn get(&self, labels: [&str; 2]) -> Option<(f64, f64, f64)> {
        let key = labels.map(str::to_string);
        let mut guard = self.lock();
        let s = guard.0.get_mut(&key)?;
        s.refresh();
        Some((s.arrivals, s.backlog, s.rate))
    }
}

/// A running source subtask's hold on its series ([`SourceMetricsVec::attach`]); dropping it
/// reads the figures a last time and leaves them as they are.
pub struct AttachedSource {
    family: SourceMetricsVec,
    key: [String; 2],
    generation: u64,
}

impl Drop for AttachedSource {
    fn drop(&mut self) {
        let mut guard = self.family.lock();
        if let Some(s) = guard.0.get_mut(&self.key)
            && s.live
                .as_ref()
                .is_some_and(|l| l.generation == self.generation)
        {
            s.refresh();
            s.live = None;
        }
    }
}

impl Collector for SourceMetricsVec {
    fn desc(&self) -> Vec<&Desc> {
        vec![
            &self.inner.arrivals,
            &self.inner.backlog,
            &self.inner.rate,
            &self.inner.partitions,
        ]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut guard = self.lock();
        let series = &mut guard.0;
        series.values_mut().for_each(SourceSeries::refresh);
        let family = |desc: &Desc, kind: MetricType, value: fn(&SourceSeries) -> Option<f64>| {
            let metrics = series
                .iter()
                .filter_map(|(values, s)| Some((values, value(s)?)))
                .map(|(values, v)| {
                    let mut m = proto::Metric::from_label(label_pairs(values));
                    if kind == MetricType::COUNTER {
                        let mut c = proto::Counter::default();
                        c.set_value(v);
                        m.set_counter(c);
                    } else {
                        let mut g = proto::Gauge::default();
                        g.set_value(v);
                        m.set_gauge(g);
                    }
                    m
                })
                .collect();
            let mut f = MetricFamily::default();
            f.set_name(desc.fq_name.clone());
            f.set_help(desc.help.clone());
            f.set_field_type(kind);
            f.set_metric(metrics);
            f
        };
        let mut out = vec![
            family(&self.inner.arrivals, MetricType::COUNTER, |s| {
                Some(s.arrivals)
            }),
            family(&self.inner.backlog, MetricType::GAUGE, |s| Some(s.backlog)),
            family(&self.inner.rate, MetricType::GAUGE, |s| Some(s.rate)),
            family(&self.inner.partitions, MetricType::GAUGE, |s| {
                s.partitions.map(f64::from)
            }),
        ];
        // A family without series is left out (no Kafka source: no partitions family).
        out.retain(|f| !f.get_metric().is_empty());
        out
    }
}
