//! Reason text shared by the sizing and the latency allocation: rates as the reasons print
//! them, an unknown rate downstream of a silent window, an operator's output model, the
//! operators held on a path, the percentile's label.

use super::*;

/// A rate as the reasons and `streamscale run`'s AT LIMIT line print it: no decimals from
/// 100 records/s up, two below.
pub(crate) fn fmt_rate(x: f64) -> Fixed {
    if x.abs() >= 100.0 {
        Fixed(x, 0)
    } else {
        Fixed(x, 2)
    }
}

impl Model {
    /// Why operator `i`, downstream of the silent window `w`, keeps `p` subtasks.
    pub(super) fn silent_why(&self, w: usize, p: u32) -> String {
        let period = match self.outputs[w] {
            OutputModel::Silent(period) => period,
            _ => 0.0,
        };
        format!(
            "arrival rate unknown: window {} fires once per {} s and did not fire in this metric window: keeps p={p} (not planned from a window of silence)",
            self.name(w),
            Short(period)
        )
    }

    /// The job-wide reason for operator `i`'s output model when it is not the window's
    /// selectivity (a burst read over its period, a fixed rate, a silent window).
    pub(super) fn output_reason(&self, i: usize, reasons: &mut Vec<String>) {
        let e = &self.est[i];
        let text = match (self.outputs[i], self.graph.window[i]) {
            (OutputModel::Silent(period), _) => format!(
                "{}: window fires once per {} s and emitted nothing in this shorter metric window: its output rate is unknown, the operators downstream keep their parallelism",
                self.name(i),
                Short(period)
            ),
            (OutputModel::Fixed(rate), _) => format!(
                "{}: selectivity from {} input records (fewer than {}) is not used; its output is taken as the measured {} rec/s, not scaled with its input",
                self.name(i),
                Fixed(e.input_rate * self.elapsed, 0),
                MIN_SELECTIVITY_RECORDS,
                fmt_rate(rate)
            ),
            (OutputModel::Proportional(g), Some((period, true)))
                if (g - e.selectivity).abs() > 1e-12 * e.selectivity.abs().max(1.0) =>
            {
                format!(
                    "{}: window bursts read over its {} s period: selectivity {} (the metric window alone read {})",
                    self.name(i),
                    Short(period),
                    Fixed(g, 4),
                    Fixed(e.selectivity, 4)
                )
            }
            _ => return,
        };
        reasons.push(text);
    }

    /// For an unattainable-SLO reason: the operators flagged in `held` on the path ending at
    /// `end` (predecessors `via`), each with its parallelism in `p`, why it is held and its term
    /// in `w` (seconds); empty when none is.
    pub(super) fn held_on_path(
        &self,
        p: &[u32],
        w: &[f64],
        held: &[bool],
        via: &[usize],
        end: usize,
    ) -> String {
        let mut out = String::new();
        let mut at = end;
        while at < held.len() {
            if held[at] {
                let what = if self.hot_key_bottleneck(at, p[at].saturating_add(1)) {
                    "a hot-key bottleneck (more subtasks cannot unload its hot key group's subtask)"
                } else {
                    "a keyed operator whose busiest subtask's key-group share no higher parallelism lowers"
                };
                let _ = write!(
                    out,
                    "{}{} is held at p={} as {what}, its term {:.4} s",
                    if out.is_empty() { " (" } else { "; " },
                    self.name(at),
                    p[at],
                    w[at]
                );
            }
            at = via.get(at).copied().unwrap_or(usize::MAX);
        }
        if !out.is_empty() {
            out.push(')');
        }
        out
    }

    /// "p99" for percentile 0.99, "p99.9" for 0.999.
    pub(super) fn percentile_label(&self) -> String {
        format!("p{}", Short((self.s.percentile * 1e6).round() / 1e4))
    }
}
