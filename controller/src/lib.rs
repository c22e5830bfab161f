//! streamscale's controller: scrapes an engine's metrics, models the job as an open Jackson
//! network of queues, plans every operator's parallelism at once and applies the plan by
//! stop-with-savepoint and restore.
//!
//! * [`model`]: the pure model and planner (metric windows in, decisions out).
//! * [`autoscale_session`]: one job under autoscaling (metric window, guarded autoscaler,
//!   learned-state store), used by every command and the operator.
//! * [`collect`]: where a job's metrics come from ([`collect::MetricsSource`]).
//! * [`scrape`]: Prometheus text → [`model::MetricSample`] plus latency histogram and totals.
//! * [`api`]: the engine's REST API (job status, savepoints).
//! * [`runtime`]: where engines run ([`runtime::EngineRuntime`], [`runtime::LocalRuntime`]).
//! * [`executor`]: rescale by stop-with-savepoint and restore, with fallbacks.
//! * [`flink`]: the Flink backend (`streamscale flink`): a Flink cluster's jobs autoscaled
//!   through its REST API.
//! * [`state_store`]: what the autoscaler learned about a job, kept across runs and restarts
//!   behind one [`state_store::StateStore`] interface.
//! * [`savepoint_history`]: keeps the newest savepoints of a run's report, removes older ones.
//! * [`stats`], [`progress`], [`report`], [`plot`]: per-interval statistics, live lines, the
//!   run report and its chart.

pub mod api;
pub mod autoscale_session;
pub mod causes;
pub mod collect;
pub mod console;
pub mod executor;
pub mod flink;
pub mod load;
pub mod model;
pub mod plot;
pub mod progress;
pub mod report;
pub mod rescale;
pub mod run;
pub mod runtime;
pub mod savepoint_history;
pub mod scrape;
pub mod state_store;
pub mod stats;
