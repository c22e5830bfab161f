//! Nexmark: sources built on the `nexmark` crate's generator, and the stateless query stages
//! (Q1's projection, Q2's filter, and the per-type selections feeding windows and joins).
//!
//! A Nexmark source is a `source` operator with a `nexmark` block:
//!
//! ```yaml
//! - name: events
//!   kind: source
//!   rate: { constant: 50000 }   # wall-clock emission rate (records/s), or steps / a trace
//!   count: 1000000              # stop after this many events
//!   nexmark: { baseTimeMs: 1600000000000, eventRate: 10000, maxOutOfOrdernessMs: 0 }
//! ```
//!
//! Event times are the generator's, not the wall clock: event `n` happens at
//! `baseTimeMs + n · 1000 / eventRate` ms (within out-of-order groups, see
//! [`NexmarkSourceSpec::out_of_order_group_size`]), so a run is reproducible whatever the
//! emission rate and parallelism.

pub mod queries;
pub mod source;

use serde::{Deserialize, Serialize};

/// Default generator base time: 2020-09-13T12:26:40Z, ms since the Unix epoch.
pub const DEFAULT_BASE_TIME_MS: u64 = 1_600_000_000_000;
/// Default event-time rate of the generator, events per second of event time.
pub const DEFAULT_EVENT_RATE: u64 = 10_000;

/// Settings of a Nexmark source (the `nexmark` block of a `source` operator).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NexmarkSourceSpec {
    /// Event time of the first event, ms since the Unix epoch. Fixed (not the wall clock) so
    /// runs are reproducible. Default 1600000000000.
    #[serde(default = "default_base_time")]
    pub base_time_ms: u64,
    /// Events per second of event time (the generator's `first_rate` = `next_rate`): event
    /// `n` is stamped `baseTimeMs + n·1000/eventRate`. Independent of the wall-clock `rate`.
    /// Default 10000.
    #[serde(default = "default_event_rate")]
    pub event_rate: u64,
    /// The generator emits every group of this many events in a pseudo-random order (1: in
    /// event-time order). Default 1.
    #[serde(default = "default_group")]
    pub out_of_order_group_size: u64,
    /// Bound of the out-of-orderness the watermarks allow, in ms: each source subtask's
    /// watermark is the largest event time it emitted minus this bound minus 1 ms. Default 0.
    #[serde(default)]
    pub max_out_of_orderness_ms: u64,
}

impl Default for NexmarkSourceSpec {
    fn default() -> Self {
        NexmarkSourceSpec {
            base_time_ms: DEFAULT_BASE_TIME_MS,
            event_rate: DEFAULT_EVENT_RATE,
            out_of_order_group_size: 1,
            max_out_of_orderness_ms: 0,
        }
    }
}

fn default_base_time() -> u64 {
    DEFAULT_BASE_TIME_MS
}
fn default_event_rate() -> u64 {
    DEFAULT_EVENT_RATE
}
fn default_group() -> u64 {
    1
}

impl NexmarkSourceSpec {
    /// The generator configuration these settings describe (one generator timeline; the
    /// source's subtasks share it, each emitting a disjoint set of event indices).
    pub fn config(&self) -> nexmark::config::NexmarkConfig {
        let rate = usize::try_from(self.event_rate).unwrap_or(usize::MAX);
        nexmark::config::NexmarkConfig {
            base_time: self.base_time_ms,
            first_rate: rate,
            next_rate: rate,
            out_of_order_group_size: usize::try_from(self.out_of_order_group_size)
                .unwrap_or(usize::MAX),
            ..Default::default()
        }
    }

    /// Checks the settings; `at` names the operator (e.g. `operators[0] (events)`).
    ///
    /// # Errors
    /// A message naming the offending field.
    pub fn validate(&self, at: &str) -> Result<(), String> {
        if self.event_rate == 0 || self.event_rate > 1_000_000_000 {
            return Err(format!(
                "{at}.nexmark.eventRate: {} must be between 1 and 1e9 events/s",
                self.event_rate
            ));
        }
        if self.out_of_order_group_size == 0 || self.out_of_order_group_size > 1_000_000 {
            return Err(format!(
                "{at}.nexmark.outOfOrderGroupSize: {} must be between 1 and 1000000",
                self.out_of_order_group_size
            ));
        }
        Ok(())
    }
}
