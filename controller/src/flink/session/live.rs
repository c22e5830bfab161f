//! The live line of a job every interval: per vertex its busy share, rates and backlog.

use super::*;

/// Rates of one vertex between two samples, for the live line and the timeline.
struct VertexRates {
    busy: f64,
    records_in: f64,
    records_out: f64,
    backlog: Option<f64>,
}

/// Busy share above which a pair of samples is no measurement (a share is at most 1; Flink's
/// accumulated times can step a little).
const MAX_BUSY_SHARE: f64 = 1.5;

/// The rates of vertex `name` between samples `a` and `b`, `None` when the pair measures
/// nothing: the vertex missing or at another parallelism, a subtask absent, samples less than
/// `min_dt` seconds apart, or an impossible busy share (samples across a restart, dated by
/// fetches that do not follow each other: seen as busy 999 % and 1,066,547 records/s).
fn vertex_rates(
    a: &MetricSample,
    b: &MetricSample,
    name: &str,
    min_dt: f64,
) -> Option<VertexRates> {
    let dt = b.at_seconds - a.at_seconds;
    let (x, y) = (a.operators.get(name)?, b.operators.get(name)?);
    if !(dt >= min_dt && dt > 0.0) || x.len() != y.len() || y.iter().any(|s| s.is_absent()) {
        return None;
    }
    let n = y.len().max(1) as f64;
    let sum = |f: &dyn Fn(&crate::model::SubtaskSample) -> f64| -> f64 {
        x.iter().zip(y).map(|(p, q)| f(q) - f(p)).sum::<f64>()
    };
    let backlog: Option<f64> = y.iter().map(|s| s.source_backlog).sum();
    let rates = VertexRates {
        busy: sum(&|s| s.busy_seconds) / dt / n,
        records_in: sum(&|s| s.records_in) / dt,
        records_out: sum(&|s| s.records_out) / dt,
        backlog,
    };
    let plausible =
        rates.busy <= MAX_BUSY_SHARE && rates.records_in >= 0.0 && rates.records_out >= 0.0;
    plausible.then_some(rates)
}

/// The sample of `window` (oldest first) that the last one's rates are measured against: the
/// newest earlier one at least `min_dt` seconds before it (Flink's fetches can come a few
/// milliseconds apart, and such a pair measures nothing); `None` when there is none yet.
fn rate_base<'a>(
    window: impl DoubleEndedIterator<Item = &'a MetricSample>,
    min_dt: f64,
) -> Option<&'a MetricSample> {
    let mut newest_first = window.rev();
    let last = newest_first.next()?;
    newest_first.find(|s| last.at_seconds - s.at_seconds >= min_dt)
}

impl JobSession {
    /// Prints the job's live line for the last sample of the window, its rates measured
    /// against the newest sample at least `interval_s / 4` before it ([`rate_base`]; no line
    /// while there is none), and records it in the timeline.
    pub(super) fn live_line(
        &mut self,
        at_s: f64,
        interval_s: f64,
        topo: &FlinkTopology,
        print: &mut dyn FnMut(&str),
    ) {
        let window = self.session.window();
        let n = window.len();
        if n < 2 {
            return;
        }
        let (prev, b) = (&window[n - 2], &window[n - 1]);
        // The report's time accounting goes interval by interval.
        let dt = b.at_seconds - prev.at_seconds;
        self.report.subtask_seconds +=
            dt * b.operators.values().map(|s| s.len() as f64).sum::<f64>();
        let Some(a) = rate_base(window.iter(), interval_s / 4.0) else {
            return;
        };
        let mut parts = Vec::new();
        let mut growing = false;
        for v in &topo.vertices {
            let p = b.operators.get(&v.name).map_or(0, Vec::len);
            let Some(r) = vertex_rates(a, b, &v.name, 0.0) else {
                parts.push(format!("{} p={p} (no data)", v.name));
                continue;
            };
            let lag = match (v.role, r.backlog) {
                (VertexRole::Source, Some(l)) => {
                    let before: Option<f64> = a
                        .operators
                        .get(&v.name)
                        .and_then(|x| x.iter().map(|s| s.source_backlog).sum());
                    if before.is_some_and(|x| l > x + 1.0) {
                        growing = true;
                    }
                    format!(" lag {l:.0}")
                }
                (VertexRole::Source, None) => " lag ?".to_string(),
                _ => String::new(),
            };
            let rate = if v.role == VertexRole::Source {
                format!("out {:.0}/s", r.records_out)
            } else {
                format!("in {:.0}/s", r.records_in)
            };
            // A share over 1 (up to MAX_BUSY_SHARE passes) is the fetches' dating, not work:
            // shown and kept as 100 %.
            let busy = r.busy.clamp(0.0, 1.0);
            parts.push(format!(
                "{} p={p} busy {:.0}% {rate}{lag}",
                v.name,
                100.0 * busy
            ));
            self.timeline.push(TimelineRow {
                t_s: at_s,
                job_id: self.report.job_id.clone(),
                vertex: v.name.clone(),
                vertex_id: v.id.clone(),
                role: v.role,
                parallelism: p,
                busy,
                records_in: r.records_in,
                records_out: r.records_out,
                backlog: r.backlog,
            });
        }
        if growing {
            self.report.lag_growing_seconds += dt;
        }
        print(&format!(
            "t={at_s:>6.0}s {}: {}",
            short(&self.report.job_id),
            parts.join(" | ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SubtaskSample;

    fn sample(at: f64, busy: f64, records: f64) -> MetricSample {
        MetricSample {
            at_seconds: at,
            operators: [(
                "v".to_string(),
                vec![SubtaskSample {
                    busy_seconds: busy,
                    records_in: records,
                    records_out: records,
                    ..SubtaskSample::default()
                }],
            )]
            .into_iter()
            .collect(),
        }
    }

    /// A pair of samples a few milliseconds apart (across a restart, seen as busy 999 % and
    /// 1,066,547 records/s) or with an impossible busy share is not shown as rates.
    #[test]
    fn samples_too_close_or_impossible_are_no_rates() {
        let a = sample(100.0, 10.0, 1000.0);
        let r = vertex_rates(&a, &sample(104.0, 12.0, 5000.0), "v", 1.0).expect("rates");
        assert!((r.busy - 0.5).abs() < 1e-9 && (r.records_out - 1000.0).abs() < 1e-9);
        assert!(vertex_rates(&a, &sample(100.004, 10.04, 5000.0), "v", 1.0).is_none());
        assert!(vertex_rates(&a, &sample(104.0, 20.0, 5000.0), "v", 1.0).is_none());
        assert!(vertex_rates(&a, &sample(104.0, 12.0, 5000.0), "w", 1.0).is_none());
    }

    /// The last sample is measured against the newest one far enough before it: a fetch that
    /// came right after the previous one does not make the line `(no data)`.
    #[test]
    fn rates_skip_a_sample_too_close_to_the_last() {
        let at = |w: &[MetricSample]| rate_base(w.iter(), 2.5).map(|s| s.at_seconds);
        let w = [
            sample(100.0, 10.0, 1000.0),
            sample(110.0, 15.0, 3000.0),
            sample(110.02, 15.01, 3004.0),
        ];
        assert_eq!(at(&w), Some(110.0 - 10.0));
        assert_eq!(at(&w[..2]), Some(100.0));
        // The first two fetches of a session, close together: no base yet, no line.
        assert_eq!(at(&w[1..]), None);
        assert_eq!(at(&w[..1]), None);
        assert_eq!(at(&[]), None);
    }
}
