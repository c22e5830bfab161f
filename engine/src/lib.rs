//! streamscale's bundled streaming engine.

pub mod spec;
