//! `streamscale`: the controller's command line.
fn main() {}
