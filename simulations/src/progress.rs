//! Progress of a long replay: an [`indicatif`] bar counting simulated steps over all policies.
//!
//! The command line draws it on stderr (which indicatif leaves blank when stderr is not a
//! terminal); tests draw it on an in-memory terminal. The replay reports its steps through
//! [`crate::runner::replay_all`]'s `on_steps` callback, which the caller forwards to
//! [`ProgressBar::inc`].

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::model::JobModel;

/// Replays with fewer simulated steps than this (summed over the policies) get no bar: they
/// take well under a second.
pub const LONG_REPLAY_STEPS: u64 = 200_000;

/// The bar's layout: bar, percentage, steps done of all, estimated time left.
const TEMPLATE: &str = "{bar:40} {percent:>3}% {pos}/{len} steps, eta {eta}";

/// Steps [`crate::runner::replay_all`] makes for policies `names` at a step of `step_s`
/// seconds: the steps of one replay (⌈duration / step⌉, at least 1, as
/// [`crate::runner::Schedule`] counts them) times the policies it replays
/// ([`crate::runner::replayed_policies`]: the names without repeats, plus the oracle).
pub fn total_steps(model: &JobModel, step_s: f64, names: &[String]) -> u64 {
    let per_policy = (model.duration_s.max(0.0) / step_s).ceil().max(1.0) as u64;
    per_policy * crate::runner::replayed_policies(names).len() as u64
}

/// A bar over `total_steps` steps drawing to `target`, or a hidden one (which still counts)
/// when `quiet` or the replay is short ([`LONG_REPLAY_STEPS`]).
pub fn replay_bar(total_steps: u64, quiet: bool, target: ProgressDrawTarget) -> ProgressBar {
    if quiet || total_steps < LONG_REPLAY_STEPS {
        let bar = ProgressBar::hidden();
        bar.set_length(total_steps);
        return bar;
    }
    let bar = ProgressBar::with_draw_target(Some(total_steps), target);
    // The template is a constant known to parse; the default bar is a fallback only.
    bar.set_style(
        ProgressStyle::with_template(TEMPLATE).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_parses() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
    }
}
