//! `streamscale-engine`: runs one job.
fn main() {}
