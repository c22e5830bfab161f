//! Keyed operators over several inputs.

pub mod join;
