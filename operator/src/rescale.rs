//! The rescale state machine of a StreamJob: the controller crate's
//! [`streamscale_controller::rescale::machine`], whose [`RescaleState`] is the StreamJob's
//! `status.rescale` (the CRD's `RescaleStatus`). The reconciler drives it one step per
//! reconcile through [`streamscale_controller::rescale::drive`] (see
//! `reconciler::rescale_driving`).

pub use streamscale_controller::rescale::machine::*;
