//! The Flink backend: autoscaling the jobs of an Apache Flink session cluster through its REST
//! API with the same planner and guards as the bundled engine.
//!
//! The phases, one module each:
//! * collect: [`collect`] (one scrape of a job), [`rest`] (the REST client), [`rest_auth`] (its credentials and CA), [`topology`] (vertices and edges as the planner's
//!   job graph), [`metrics`] (per-subtask counters as the planner's metric sample);
//! * evaluate, plan, guard: [`crate::model::Autoscaler`], unchanged;
//! * realize: [`in_place`] (the adaptive scheduler's resource requirements, FLIP-291) or
//!   [`runtime`] (stop-with-savepoint and resubmit, driven by [`crate::executor::Executor`],
//!   the rescale protocol the bundled engine uses);
//! * [`slots`]: the task slots a job holds and may use (plans capped at them);
//! * [`settings`]: the `--settings` file (the job file's `autoscaler` schema, vertex bounds);
//! * [`session`]: the loop of `streamscale flink` over one or more jobs, its live lines and its
//!   report; [`plot`]: a job's `timeline.png`.

pub mod collect;
pub mod in_place;
pub mod metrics;
#[cfg(test)]
mod mock_rest;
pub mod plot;
pub mod rest;
pub mod rest_auth;
pub mod runtime;
pub mod session;
pub mod settings;
pub mod slots;
pub mod topology;

pub use rest::{FlinkError, FlinkRest};
