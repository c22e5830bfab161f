//! The live line of a job every interval: per vertex its busy share, rates and backlog.

use super::*;

/// Rates of one vertex between two samples, for the live line and the timeline.
struct VertexRates {
    busy: f64,
    records_in: f64,
    records_out: f64,
    backlog: Option<f64>,
}

fn vertex_rates(a: &MetricSample, b: &MetricSample, name: &str) -> Option<VertexRates> {
    let dt = b.at_seconds - a.at_seconds;
    let (x, y) = (a.operators.get(name)?, b.operators.get(name)?);
    if dt <= 0.0 || x.len() != y.len() || y.iter().any(|s| s.is_absent()) {
        return None;
    }
    let n = y.len().max(1) as f64;
    let sum = |f: &dyn Fn(&crate::model::SubtaskSample) -> f64| -> f64 {
        x.iter().zip(y).map(|(p, q)| f(q) - f(p)).sum::<f64>()
    };
    let backlog: Option<f64> = y.iter().map(|s| s.source_backlog).sum();
    Some(VertexRates {
        busy: sum(&|s| s.busy_seconds) / dt / n,
        records_in: sum(&|s| s.records_in) / dt,
        records_out: sum(&|s| s.records_out) / dt,
        backlog,
    })
}

impl JobSession {
    pub(super) fn live_line(
        &mut self,
        at_s: f64,
        topo: &FlinkTopology,
        print: &mut dyn FnMut(&str),
    ) {
        let window = self.session.window();
        let n = window.len();
        if n < 2 {
            return;
        }
        let (a, b) = (&window[n - 2], &window[n - 1]);
        let mut parts = Vec::new();
        let mut growing = false;
        for v in &topo.vertices {
            let p = b.operators.get(&v.name).map_or(0, Vec::len);
            let Some(r) = vertex_rates(a, b, &v.name) else {
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
            parts.push(format!(
                "{} p={p} busy {:.0}% {rate}{lag}",
                v.name,
                100.0 * r.busy.clamp(0.0, 9.99)
            ));
            self.timeline.push(format!(
                "{at_s:.1},{},{},{},{p},{:.4},{:.2},{:.2},{}",
                self.report.job_id,
                csv_field(&v.name),
                v.id,
                r.busy,
                r.records_in,
                r.records_out,
                r.backlog.map_or(String::new(), |l| format!("{l:.0}"))
            ));
        }
        let dt = b.at_seconds - a.at_seconds;
        if growing {
            self.report.lag_growing_seconds += dt;
        }
        self.report.subtask_seconds +=
            dt * b.operators.values().map(|s| s.len() as f64).sum::<f64>();
        print(&format!(
            "t={at_s:>6.0}s {}: {}",
            short(&self.report.job_id),
            parts.join(" | ")
        ));
    }
}
