//! Rescaling a running job: one pure state machine ([`machine`]), the loop that drives it
//! through a backend ([`drive`]), and the backoff between failed attempts ([`backoff`]).
//!
//! The bundled engine as a local process (`streamscale run`) and as a Kubernetes pod (the
//! operator) are two backends of the same machine.

pub mod backoff;
pub mod drive;
pub mod machine;
pub mod restore_point;
pub mod runtime_backend;

pub use backoff::{BACKOFF_FIRST_S, BACKOFF_MAX_S, RescaleBackoff};
