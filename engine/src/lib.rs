//! streamscale's bundled streaming engine.
//!
//! A job ([`spec::JobSpec`]) runs as one thread per subtask joined by bounded channels
//! ([`runtime`]); keyed state lives in key groups ([`keygroup`], [`state`]); a
//! stop-with-savepoint drains the graph and writes a checksummed savepoint ([`savepoint`])
//! from which the job restores at any parallelism; per-subtask rates are served in Prometheus
//! format ([`metrics`]) beside a small REST API ([`server`]).
//!
//! Nexmark sources ([`nexmark`]) emit events with event time; watermarks flow in-band and
//! drive event-time windows ([`time`]) and a keyed two-input join ([`operators::join`]).

pub mod aggregates;
pub mod auth;
pub mod chain;
pub mod checkpoint;
pub mod clock;
pub mod json_extract;
pub mod json_field;
pub mod kafka;
pub mod keygroup;
pub mod metrics;
pub mod nexmark;
pub mod operators;
pub mod payload;
pub mod record;
pub mod runtime;
pub mod savepoint;
pub mod server;
pub mod service_time;
pub mod shed;
pub mod sink;
pub mod spec;
pub mod state;
pub mod time;
pub mod tls;
pub mod trace;
pub mod writable_dir;
