//! Synthetic metric windows for tests.

use std::collections::BTreeMap;

use streamscale_engine::spec::JobSpec;

use super::sample::{MetricSample, SubtaskSample};

/// One operator's steady behaviour, from which consistent counters are generated.
#[derive(Debug, Clone)]
pub(crate) struct Synth {
    pub name: String,
    pub parallelism: u32,
    /// Total input rate, records/s (sources: ignored).
    pub input_rate: f64,
    /// True processing rate per subtask (None: no busy time reported).
    pub mu: Option<f64>,
    pub selectivity: f64,
    /// Sources: (arrival rate γ, backlog).
    pub source: Option<(f64, f64)>,
}

impl Synth {
    pub fn op(name: &str, p: u32, input_rate: f64, mu: f64, selectivity: f64) -> Synth {
        Synth {
            name: name.into(),
            parallelism: p,
            input_rate,
            mu: Some(mu),
            selectivity,
            source: None,
        }
    }
    pub fn source(name: &str, p: u32, gamma: f64, backlog: f64) -> Synth {
        Synth {
            name: name.into(),
            parallelism: p,
            input_rate: 0.0,
            mu: None,
            selectivity: 1.0,
            source: Some((gamma, backlog)),
        }
    }
}

/// Samples at `times` (seconds) with counters growing linearly at the given rates.
pub(crate) fn window(ops: &[Synth], times: &[f64]) -> Vec<MetricSample> {
    times
        .iter()
        .map(|&t| MetricSample {
            at_seconds: t,
            operators: ops
                .iter()
                .map(|o| {
                    let p = f64::from(o.parallelism);
                    let subs = (0..o.parallelism)
                        .map(|_| match o.source {
                            Some((gamma, backlog)) => SubtaskSample {
                                records_out: gamma * t / p,
                                source_arrivals: Some(gamma * t / p),
                                source_backlog: Some(backlog / p),
                                ..SubtaskSample::default()
                            },
                            None => {
                                let rin = o.input_rate * t / p;
                                let busy = o.mu.map_or(0.0, |m| rin / m);
                                SubtaskSample {
                                    records_in: rin,
                                    records_out: rin * o.selectivity,
                                    busy_seconds: busy,
                                    idle_seconds: (t - busy).max(0.0),
                                    ..SubtaskSample::default()
                                }
                            }
                        })
                        .collect();
                    (o.name.clone(), subs)
                })
                .collect::<BTreeMap<_, _>>(),
        })
        .collect()
}

/// Parses and validates a YAML job.
pub(crate) fn job(yaml: &str) -> JobSpec {
    let spec = JobSpec::from_yaml(yaml).expect("test job parses");
    spec.validate().expect("test job is valid");
    spec
}
