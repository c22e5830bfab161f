//! Per-subtask meters: busy, idle and back-pressured time, records, service-time batches, sink latency.

use super::*;

/// Most [`Meter::tick`] calls between two clock reads (fast operators: one read per this many
/// records).
pub(super) const MAX_TICKS_PER_CHECK: u32 = 128;
/// A subtask reads the clock at least this many times per flush interval, however slow its
/// records (or batches) are, so its metrics are at most 1/this of the interval late.
pub(super) const CHECKS_PER_FLUSH: u32 = 8;

/// What [`Meter::tick`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// The clock was not read.
    Skipped,
    /// The clock was read; no flush was due.
    Checked,
    /// The counters were flushed.
    Flushed,
}

/// Time and count accumulators of a subtask, flushed to the registry periodically.
pub(super) struct Meter {
    /// Exact counts since this run started, reported with each barrier.
    pub(super) totals: OperatorCounters,
    pub(super) enabled: bool,
    pub(super) records_in: u64,
    pub(super) records_out: u64,
    pub(super) idle: Duration,
    pub(super) backpressured: Duration,
    /// Chain members (not heads) measure their busy time directly ([`crate::chain`]); their
    /// idle time is the rest of the wall time.
    pub(super) chained: bool,
    /// Busy time measured since the last flush (chain members only).
    pub(super) busy: Duration,
    pub(super) last_flush: Instant,
    /// `last_flush + flush_interval`: when the next flush is due.
    pub(super) next_flush: Instant,
    /// [`Meter::tick`] calls since the clock was last read.
    pub(super) ticks: u32,
    /// Ticks between clock reads, adapted to how long a tick takes ([`Meter::check`]).
    pub(super) check_every: u32,
    /// Ticks until the next clock read: `check_every`, or 0 after a long wait so that the
    /// next tick reads the clock.
    pub(super) check_at: u32,
    /// When the clock was last read by [`Meter::check`].
    pub(super) last_check: Instant,
    pub(super) flush_interval: Duration,
    /// Longest time between two clock reads: a flush is at most this late.
    pub(super) check_budget: Duration,
    pub(super) labels: [String; 2],
    pub(super) metrics: EngineMetrics,
    pub(super) live: Arc<LiveCounters>,
    /// Sinks with metrics on: the latency histogram and accounted counter.
    pub(super) sink: Option<SinkMeter>,
    /// Keyed operators with metrics on: records per owned key group, decayed, for
    /// `streamscale_hottest_key_group_share` and `streamscale_key_group_share` (counted in
    /// [`Operator::process`] on the key group the operator computes for its state), with the
    /// subtask's series of the latter.
    pub(super) key_groups: Option<(KeyGroupLoad, KeyGroupShareSeries)>,
    /// Non-source operators with metrics on: the service-time batches
    /// ([`crate::service_time`]).
    pub(super) service: Option<ServiceMeter>,
    /// A clock reading and the wall clock (µs since the Unix epoch) at that moment, renewed
    /// at every flush: converts the monotonic readings a chain run takes anyway into wall
    /// time for a sink's latency ([`Meter::unix_us_at`]).
    pub(super) anchor: (Instant, u64),
}

/// A subtask's service-time batches ([`crate::service_time`]): where the current batch
/// started, and the sums of the closed ones since the last flush.
pub(super) struct ServiceMeter {
    pub(super) series: ServiceTimeSeries,
    pub(super) moments: ServiceMoments,
    /// `totals.records_in` when the current batch started.
    pub(super) mark_records: u64,
    /// The clock reading the current batch started at (subtasks reading their own queue).
    pub(super) mark_at: Instant,
    /// [`Meter::service_clock`] when the current batch started.
    pub(super) mark_clock: Duration,
    /// What [`Meter::service_clock`] counts, up to the last flush (the meter's own counts
    /// restart from zero at every flush).
    pub(super) flushed: Duration,
}

/// A sink subtask's metrics: the latency histogram, counted per record in the thread, and
/// the accounted counter, published from [`OperatorCounters::accounted`] at each flush.
pub(super) struct SinkMeter {
    pub(super) latency: LocalLatencyHistogram,
    pub(super) accounted: IntCounter,
    /// `totals.accounted` when the counter was last published.
    pub(super) accounted_published: u64,
    /// Records until a sink reading its own input queue reads the clock again. Latency is
    /// measured against a chained sink's batch start ([`ChainMember::run_pending`]), else
    /// against the clock read every [`SINK_CLOCK_USES`] records ([`SinkMeter::tick_clock`]).
    pub(super) clock_uses: u32,
}

/// A sink that reads its own input queue reads the clock once per this many records (and
/// after every wait for input): latency is in ms, a record takes ns.
pub(super) const SINK_CLOCK_USES: u32 = 16;

impl SinkMeter {
    /// Before a record of a sink reading its own input queue: reads the clock every
    /// [`SINK_CLOCK_USES`] records.
    #[inline]
    pub(super) fn tick_clock(&mut self) {
        if self.clock_uses == 0 {
            self.latency.set_clock(now_unix_us());
            self.clock_uses = SINK_CLOCK_USES;
        }
        self.clock_uses -= 1;
    }
}

impl Meter {
    /// A subtask's meter from now on: nothing counted yet, a flush due at once, the clock read
    /// [`CHECKS_PER_FLUSH`] times per `flush_interval`, no sink, key-group or service-time
    /// meters (set them on the result where they apply).
    pub(super) fn new(
        enabled: bool,
        flush_interval: Duration,
        chained: bool,
        labels: [String; 2],
        metrics: EngineMetrics,
        live: Arc<LiveCounters>,
    ) -> Meter {
        let now = Instant::now();
        Meter {
            totals: OperatorCounters::default(),
            enabled,
            records_in: 0,
            records_out: 0,
            idle: Duration::ZERO,
            backpressured: Duration::ZERO,
            chained,
            busy: Duration::ZERO,
            last_flush: now,
            next_flush: now,
            ticks: 0,
            check_every: 1,
            check_at: 1,
            last_check: now,
            flush_interval,
            check_budget: flush_interval / CHECKS_PER_FLUSH,
            labels,
            metrics,
            live,
            sink: None,
            key_groups: None,
            service: None,
            anchor: (now, crate::clock::now_unix_us()),
        }
    }

    /// Publishes the accumulated counts. Busy time is derived as Flink does: the wall time
    /// since the last flush minus the measured idle and backpressured time, so the hot path
    /// reads the clock only when it blocks. A chain member measures its busy time around the
    /// batches it processes instead, and its idle time is the rest ([`crate::chain`]).
    pub(super) fn flush(&mut self, queue_len: usize) {
        self.flush_at(Instant::now(), queue_len);
    }

    /// [`Meter::flush`] with the clock read at `now`.
    pub(super) fn flush_at(&mut self, now: Instant, queue_len: usize) {
        let wall = now.saturating_duration_since(self.last_flush);
        let clock = self.service_clock_since_flush();
        if let Some(svc) = &mut self.service {
            // The counts below restart from zero: keep the batch clock running.
            svc.flushed += clock;
            svc.series.publish(&svc.moments);
            svc.moments = ServiceMoments::default();
        }
        if self.chained {
            let busy = self.busy.min(wall);
            self.backpressured = self.backpressured.min(wall - busy);
            self.idle = wall - busy - self.backpressured;
            self.busy = Duration::ZERO;
        }
        let busy = wall
            .saturating_sub(self.idle)
            .saturating_sub(self.backpressured);
        let l = [self.labels[0].as_str(), self.labels[1].as_str()];
        self.live
            .records_in
            .fetch_add(self.records_in, Ordering::Relaxed);
        self.live
            .records_out
            .fetch_add(self.records_out, Ordering::Relaxed);
        if self.enabled {
            let m = &self.metrics;
            m.records_in.with_label_values(&l).inc_by(self.records_in);
            m.records_out.with_label_values(&l).inc_by(self.records_out);
            m.busy_seconds
                .with_label_values(&l)
                .inc_by(busy.as_secs_f64());
            m.idle_seconds
                .with_label_values(&l)
                .inc_by(self.idle.min(wall).as_secs_f64());
            m.backpressured_seconds
                .with_label_values(&l)
                .inc_by(self.backpressured.min(wall).as_secs_f64());
            m.input_queue_length
                .with_label_values(&l)
                .set(queue_len as f64);
            if let Some((load, top)) = self.key_groups.as_mut()
                && let Some(share) = load.flush(wall)
            {
                m.hottest_key_group_share.with_label_values(&l).set(share);
                top.set(load.top());
            }
            if let Some(sink) = &mut self.sink {
                sink.latency.flush();
                sink.accounted
                    .inc_by(self.totals.accounted - sink.accounted_published);
                sink.accounted_published = self.totals.accounted;
            }
        }
        self.records_in = 0;
        self.records_out = 0;
        self.idle = Duration::ZERO;
        self.backpressured = Duration::ZERO;
        self.last_flush = now;
        self.next_flush = now + self.flush_interval;
        if self.sink.is_some() {
            self.anchor = (now, now_unix_us());
        }
    }

    /// The wall clock (µs since the Unix epoch) at the clock reading `t`, from the anchor
    /// taken at the last flush: exact up to the wall clock's adjustment since then (NTP
    /// slews it by at most 0.05 %, so < 50 µs over a 100 ms flush interval).
    #[inline]
    pub(super) fn unix_us_at(&self, t: Instant) -> u64 {
        let (at, unix_us) = self.anchor;
        let since = t.saturating_duration_since(at);
        let since_us = since
            .as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(since.subsec_micros()));
        unix_us.saturating_add(since_us)
    }

    /// Time that does not count towards a service batch, since the last flush: for a chain
    /// member its busy time (measured directly; the batch time is its growth), for any other
    /// subtask its idle and backpressured time (the batch time is the wall time less its
    /// growth).
    #[inline]
    pub(super) fn service_clock_since_flush(&self) -> Duration {
        if self.chained {
            self.busy
        } else {
            self.idle + self.backpressured
        }
    }

    /// Closes the current service batch at the clock reading `now` (a reading taken anyway)
    /// ([`crate::service_time`]): its records are those received since it started, its time
    /// what the subtask spent since then; a batch without records (the subtask's start, a
    /// timer, a barrier) is dropped. The next batch starts at `now`. A few arithmetic
    /// operations, no allocation.
    #[inline]
    pub(super) fn close_service_batch(&mut self, now: Instant) {
        let clock = self.service_clock_since_flush();
        let records = self.totals.records_in;
        let chained = self.chained;
        let Some(svc) = &mut self.service else { return };
        let n = records.saturating_sub(svc.mark_records);
        let clock = svc.flushed + clock;
        if n > 0 {
            let counted = clock.saturating_sub(svc.mark_clock);
            let took = if chained {
                counted
            } else {
                now.saturating_duration_since(svc.mark_at)
                    .saturating_sub(counted)
            };
            svc.moments.add(n, took);
            svc.mark_records = records;
        }
        svc.mark_clock = clock;
        svc.mark_at = now;
    }

    /// Called once per record (or source batch): flushes if the flush interval has passed,
    /// reading the clock only every `check_every` calls: [`MAX_TICKS_PER_CHECK`] for
    /// fast operators, fewer for slow ones so that the clock is read at least
    /// [`CHECKS_PER_FLUSH`] times per flush interval.
    #[inline]
    pub(super) fn tick(&mut self, queue_len: impl FnOnce() -> usize) -> Check {
        self.ticks += 1;
        if self.ticks >= self.check_at {
            return self.check(queue_len);
        }
        Check::Skipped
    }

    /// Reads the clock and flushes if the flush interval has passed. Sets the number of ticks
    /// until the next check from the time the ticks since the last check took: as many as fit
    /// in `check_budget` at that pace, between 1 and [`MAX_TICKS_PER_CHECK`], and at most
    /// twice as many as before.
    #[inline(never)]
    pub(super) fn check(&mut self, queue_len: impl FnOnce() -> usize) -> Check {
        self.check_with(Instant::now(), queue_len)
    }

    /// [`Meter::check`] with the clock read at `now`.
    pub(super) fn check_with(&mut self, now: Instant, queue_len: impl FnOnce() -> usize) -> Check {
        self.close_service_batch(now);
        self.adapt(now);
        if now >= self.next_flush {
            self.flush_at(now, queue_len());
            return Check::Flushed;
        }
        Check::Checked
    }

    /// Notes a clock reading `now` taken for another purpose (the end of a chain run) as a
    /// check, so that the ticks need not read the clock themselves; a flush that is due then
    /// happens at the next tick (which knows the input queue's length).
    #[inline]
    pub(super) fn saw_clock(&mut self, now: Instant) {
        self.close_service_batch(now);
        self.adapt(now);
        if now >= self.next_flush {
            self.check_at = 0;
        }
    }

    /// Sets the number of ticks until the next check from the time the ticks since the last
    /// check took (see [`Meter::check`]), the clock being read at `now`.
    #[inline]
    pub(super) fn adapt(&mut self, now: Instant) {
        if self.ticks > 0 {
            let since = now.saturating_duration_since(self.last_check);
            // Down at once, up at most twofold per check: one stretch of quick ticks (a
            // record that ran no chain) must not stretch the next check over slow ones.
            let most = self.check_every.saturating_mul(2).min(MAX_TICKS_PER_CHECK);
            let fit = fit_in_budget(
                u64::from(self.ticks),
                since,
                self.check_budget,
                u64::from(most),
            );
            self.check_every = fit as u32;
            self.ticks = 0;
        }
        self.check_at = self.check_every;
        self.last_check = now;
    }

    /// Notes a wait of `d` (measured by the caller): after a wait longer than the check budget
    /// the next tick reads the clock, so that a subtask blocked for long (a full channel, a
    /// slow chain downstream) still flushes on time.
    #[inline]
    pub(super) fn waited(&mut self, d: Duration) {
        if d >= self.check_budget {
            self.check_at = 0;
        }
    }

    /// The clock, when time is measured.
    pub(super) fn now(&self) -> Option<Instant> {
        self.enabled.then(Instant::now)
    }
}
