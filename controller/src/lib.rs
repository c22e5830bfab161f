//! streamscale's controller: scrapes an engine's metrics, models the job as an open Jackson
//! network of queues, plans every operator's parallelism at once and applies the plan by
//! stop-with-savepoint and restore.

pub mod model;
