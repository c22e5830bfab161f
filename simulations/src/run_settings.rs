//! The settings of the real run whose measured rates are replayed (`--service-rates`).
//!
//! `streamscale run --report DIR` writes `DIR/service_rates.csv` and `DIR/summary.json`; the
//! summary records the settings the run's autoscaler decided with: `interval_s`, `window_s`,
//! `guard_window_s`, `stabilization_s`, `scale_down_delay_s`, `slo_s` and
//! `latency_percentile` (runs before the window and guards were recorded have only the
//! interval and the SLO). Replaying the rates file of such a report, the simulator takes each
//! of these settings the user did not give (by flag or in the settings file) from the run, so
//! that its `streamscale` policy decides as the run did; the others keep their defaults (the
//! operator's). [`resolve`] applies them and says in one line where every setting came from.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::SimError;
use crate::config::SimConfig;

/// The settings of the `streamscale` policy that a run records, each `None` when unknown (not
/// recorded or, for what the user gave, not given). Seconds, except the percentile.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RunSettings {
    /// Metrics (decision) interval (`--interval`; `interval_s` in a run's summary,
    /// `intervalSeconds` in the settings file).
    #[serde(rename = "intervalSeconds")]
    pub interval_s: Option<f64>,
    /// Metric window (`--window`; `window_s`, `windowSeconds`).
    #[serde(rename = "windowSeconds")]
    pub window_s: Option<f64>,
    /// Least history before a decision (`--guard-window`; `guard_window_s`,
    /// `guardWindowSeconds`).
    #[serde(rename = "guardWindowSeconds")]
    pub guard_window_s: Option<f64>,
    /// No decision this long after a (re)start (`--stabilization`; `stabilization_s`,
    /// `stabilizationSeconds`).
    #[serde(rename = "stabilizationSeconds")]
    pub stabilization_s: Option<f64>,
    /// A scale-down must be wanted this long (`--scale-down-delay`; `scale_down_delay_s`,
    /// `scaleDownDelaySeconds`).
    #[serde(rename = "scaleDownDelaySeconds")]
    pub scale_down_delay_s: Option<f64>,
    /// Latency SLO (`--slo`; `slo_s`, `sloSeconds`).
    #[serde(rename = "sloSeconds")]
    pub slo_s: Option<f64>,
    /// Percentile the SLO is on, in (0, 1) (`--latency-percentile`; `latency_percentile`,
    /// `latencyPercentile`).
    pub latency_percentile: Option<f64>,
}

/// One setting: its flag, its field in a run's `summary.json`, and where it lives in
/// [`RunSettings`] and [`SimConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setting {
    Interval,
    Window,
    GuardWindow,
    Stabilization,
    ScaleDownDelay,
    Slo,
    Percentile,
}

/// In the order they are printed.
const SETTINGS: [Setting; 7] = [
    Setting::Interval,
    Setting::Window,
    Setting::GuardWindow,
    Setting::Stabilization,
    Setting::ScaleDownDelay,
    Setting::Slo,
    Setting::Percentile,
];

/// What values a setting takes.
#[derive(Clone, Copy)]
enum Range {
    Positive,
    NonNegative,
    Fraction,
}

impl Setting {
    fn flag(self) -> &'static str {
        match self {
            Setting::Interval => "--interval",
            Setting::Window => "--window",
            Setting::GuardWindow => "--guard-window",
            Setting::Stabilization => "--stabilization",
            Setting::ScaleDownDelay => "--scale-down-delay",
            Setting::Slo => "--slo",
            Setting::Percentile => "--latency-percentile",
        }
    }

    fn field(self) -> &'static str {
        match self {
            Setting::Interval => "interval_s",
            Setting::Window => "window_s",
            Setting::GuardWindow => "guard_window_s",
            Setting::Stabilization => "stabilization_s",
            Setting::ScaleDownDelay => "scale_down_delay_s",
            Setting::Slo => "slo_s",
            Setting::Percentile => "latency_percentile",
        }
    }

    fn range(self) -> Range {
        match self {
            Setting::Interval | Setting::Window | Setting::Slo => Range::Positive,
            Setting::GuardWindow | Setting::Stabilization | Setting::ScaleDownDelay => {
                Range::NonNegative
            }
            Setting::Percentile => Range::Fraction,
        }
    }

    fn slot(self, s: &mut RunSettings) -> &mut Option<f64> {
        match self {
            Setting::Interval => &mut s.interval_s,
            Setting::Window => &mut s.window_s,
            Setting::GuardWindow => &mut s.guard_window_s,
            Setting::Stabilization => &mut s.stabilization_s,
            Setting::ScaleDownDelay => &mut s.scale_down_delay_s,
            Setting::Slo => &mut s.slo_s,
            Setting::Percentile => &mut s.latency_percentile,
        }
    }

    fn get(self, s: &RunSettings) -> Option<f64> {
        match self {
            Setting::Interval => s.interval_s,
            Setting::Window => s.window_s,
            Setting::GuardWindow => s.guard_window_s,
            Setting::Stabilization => s.stabilization_s,
            Setting::ScaleDownDelay => s.scale_down_delay_s,
            Setting::Slo => s.slo_s,
            Setting::Percentile => s.latency_percentile,
        }
    }

    fn set(self, cfg: &mut SimConfig, v: f64) {
        match self {
            Setting::Interval => cfg.interval_seconds = v,
            Setting::Window => cfg.window_seconds = v,
            Setting::GuardWindow => cfg.guard_window_seconds = Some(v),
            Setting::Stabilization => cfg.stabilization_seconds = v,
            Setting::ScaleDownDelay => cfg.scale_down_delay_seconds = v,
            Setting::Slo => cfg.slo_seconds = Some(v),
            Setting::Percentile => cfg.latency_percentile = Some(v),
        }
    }

    /// The value the `streamscale` policy runs with under `cfg`; `None` for the SLO and its
    /// percentile when they are the job's.
    fn effective(self, cfg: &SimConfig) -> Option<f64> {
        match self {
            Setting::Interval => Some(cfg.interval_seconds),
            Setting::Window => Some(cfg.window_seconds),
            Setting::GuardWindow => Some(cfg.guard_settings().window_seconds),
            Setting::Stabilization => Some(cfg.stabilization_seconds),
            Setting::ScaleDownDelay => Some(cfg.scale_down_delay_seconds),
            Setting::Slo => cfg.slo_seconds,
            Setting::Percentile => cfg.latency_percentile,
        }
    }
}

/// The run report's `summary.json` beside a rates file: `DIR/summary.json` for
/// `DIR/service_rates.csv`.
pub fn summary_beside(rates: &Path) -> PathBuf {
    rates
        .parent()
        .unwrap_or_else(|| Path::new(""))
        .join("summary.json")
}

/// The settings a run's `summary.json` at `path` records; `Ok(None)` when there is no such
/// file. A field that is absent or `null` is `None` (a summary of the simulator's own, or of an
/// older run, records fewer or none).
///
/// # Errors
/// [`SimError::RunSummary`] naming the file and, for a bad value, the field: unreadable, not
/// JSON, not an object, or a setting that is not a number in its range (interval, window and
/// SLO positive; guard window, stabilization and scale-down delay non-negative; percentile in
/// (0, 1)).
pub fn read(path: &Path) -> Result<Option<RunSettings>, SimError> {
    let bad = |problem: String| SimError::RunSummary {
        path: path.display().to_string(),
        problem,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(format!("cannot read the replayed run's settings: {e}"))),
    };
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| bad(format!("not JSON ({e}); a run report's summary.json is")))?;
    let object = value
        .as_object()
        .ok_or_else(|| bad("not a JSON object, as a run report's summary.json is".into()))?;
    let mut out = RunSettings::default();
    for s in SETTINGS {
        let v = match object.get(s.field()) {
            None | Some(serde_json::Value::Null) => continue,
            Some(v) => v,
        };
        let x = v.as_f64().ok_or_else(|| {
            bad(format!(
                "{}: `{v}` is not a number (the run's {} setting)",
                s.field(),
                s.flag()
            ))
        })?;
        let (ok, want) = match s.range() {
            Range::Positive => (x.is_finite() && x > 0.0, "a positive number of seconds"),
            Range::NonNegative => (
                x.is_finite() && x >= 0.0,
                "a non-negative number of seconds",
            ),
            Range::Fraction => (x > 0.0 && x < 1.0, "in (0, 1)"),
        };
        if !ok {
            return Err(bad(format!(
                "{}: {x} must be {want} (the run's {} setting)",
                s.field(),
                s.flag()
            )));
        }
        *s.slot(&mut out) = Some(x);
    }
    Ok(Some(out))
}

/// The settings a simulator settings file (`--sim-config`, YAML) gives, by their keys; those
/// it does not name are `None`. Text the settings file's own reader rejects gives nothing.
pub fn given_in_settings_file(text: &str) -> RunSettings {
    serde_saphyr::from_str(text).unwrap_or_default()
}

/// Applies to `cfg` the replayed run's settings (`recorded`: its `summary.json` and what it
/// records, `None` when there is none) that the user did not give (`given`: `Some` where a flag
/// or the settings file set one; `cfg` already holds those) and returns the line that says so,
/// with the flags that would reproduce them:
/// * `settings from DIR/summary.json (the replayed run's): --interval 1 --window 10 ...`, then
///   `; given: ...` for what the user set and `; not recorded there, defaults: ...` for what the
///   summary lacks;
/// * without a summary, or one recording nothing:
///   `no settings of the replayed run (no DIR/summary.json): defaults: --interval 5 ...`.
///
/// `None` when the user gave every setting.
pub fn resolve(
    cfg: &mut SimConfig,
    given: &RunSettings,
    recorded: Option<(&Path, &RunSettings)>,
) -> Option<String> {
    let mut taken = Vec::new();
    let mut as_given = Vec::new();
    let mut defaults = Vec::new();
    for s in SETTINGS {
        if s.get(given).is_some() {
            as_given.push(s);
        } else if let Some(v) = recorded.and_then(|(_, r)| s.get(r)) {
            s.set(cfg, v);
            taken.push(s);
        } else {
            defaults.push(s);
        }
    }
    if taken.is_empty() && defaults.is_empty() {
        return None;
    }
    // Values once everything is applied: the default guard window follows the window and
    // interval in force.
    let flags = |list: &[Setting]| -> String {
        list.iter()
            .filter_map(|&s| s.effective(cfg).map(|v| format!("{} {v}", s.flag())))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut default_text = flags(&defaults);
    if defaults.contains(&Setting::Slo) || defaults.contains(&Setting::Percentile) {
        let what = match (
            defaults.contains(&Setting::Slo),
            defaults.contains(&Setting::Percentile),
        ) {
            (true, true) => "SLO and percentile",
            (true, false) => "SLO",
            _ => "SLO percentile",
        };
        if !default_text.is_empty() {
            default_text.push_str(", ");
        }
        default_text.push_str(&format!("the job's {what}"));
    }
    let mut line = match recorded {
        Some((path, _)) if !taken.is_empty() => {
            let mut line = format!(
                "settings from {} (the replayed run's): {}",
                path.display(),
                flags(&taken)
            );
            if !defaults.is_empty() {
                line.push_str(&format!("; not recorded there, defaults: {default_text}"));
            }
            line
        }
        Some((path, _)) => format!(
            "no settings of the replayed run ({} records none): defaults: {default_text}",
            path.display()
        ),
        None => format!(
            "no settings of the replayed run (no summary.json beside the rates file): defaults: {default_text}"
        ),
    };
    if !as_given.is_empty() {
        line.push_str(&format!("; given: {}", flags(&as_given)));
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("summary.json");
        std::fs::write(&p, text).expect("write");
        p
    }

    /// The fields `streamscale run` writes, at its defaults.
    const RUN: &str = r#"{"job": "tweets", "interval_s": 1.0, "window_s": 10.0,
        "guard_window_s": 3.0, "stabilization_s": 3.0, "scale_down_delay_s": 15.0,
        "slo_s": 0.5, "latency_percentile": 0.95, "rescales": []}"#;

    #[test]
    fn a_run_summary_gives_every_setting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(dir.path(), RUN);
        let r = read(&path).expect("valid").expect("present");
        assert_eq!(
            r,
            RunSettings {
                interval_s: Some(1.0),
                window_s: Some(10.0),
                guard_window_s: Some(3.0),
                stabilization_s: Some(3.0),
                scale_down_delay_s: Some(15.0),
                slo_s: Some(0.5),
                latency_percentile: Some(0.95),
            }
        );
        let mut cfg = SimConfig::default();
        let line = resolve(&mut cfg, &RunSettings::default(), Some((&path, &r))).expect("line");
        assert_eq!(
            line,
            format!(
                "settings from {} (the replayed run's): --interval 1 --window 10 --guard-window 3 --stabilization 3 --scale-down-delay 15 --slo 0.5 --latency-percentile 0.95",
                path.display()
            )
        );
        assert_eq!(
            (
                cfg.interval_seconds,
                cfg.window_seconds,
                cfg.guard_window_seconds,
                cfg.stabilization_seconds,
                cfg.scale_down_delay_seconds,
                cfg.slo_seconds,
                cfg.latency_percentile
            ),
            (1.0, 10.0, Some(3.0), 3.0, 15.0, Some(0.5), Some(0.95))
        );
        let guards = cfg.guard_settings();
        assert_eq!(
            (
                guards.window_seconds,
                guards.stabilization_seconds,
                guards.scale_down_delay_seconds
            ),
            (3.0, 3.0, 15.0)
        );
    }

    #[test]
    fn what_the_user_gave_wins_and_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(dir.path(), RUN);
        let r = read(&path).expect("valid").expect("present");
        // As the command line leaves it: the flags already applied.
        let mut cfg = SimConfig {
            window_seconds: 30.0,
            scale_down_delay_seconds: 60.0,
            ..SimConfig::default()
        };
        let given = RunSettings {
            window_s: Some(30.0),
            scale_down_delay_s: Some(60.0),
            ..RunSettings::default()
        };
        let line = resolve(&mut cfg, &given, Some((&path, &r))).expect("line");
        assert!(
            line.ends_with(
                "--interval 1 --guard-window 3 --stabilization 3 --slo 0.5 --latency-percentile 0.95; given: --window 30 --scale-down-delay 60"
            ),
            "{line}"
        );
        assert_eq!(
            (
                cfg.interval_seconds,
                cfg.window_seconds,
                cfg.scale_down_delay_seconds
            ),
            (1.0, 30.0, 60.0)
        );
        // Everything given: nothing to say, nothing changed.
        let all = RunSettings {
            interval_s: Some(2.0),
            window_s: Some(20.0),
            guard_window_s: Some(4.0),
            stabilization_s: Some(0.0),
            scale_down_delay_s: Some(5.0),
            slo_s: Some(1.0),
            latency_percentile: Some(0.99),
        };
        let mut cfg = SimConfig::default();
        assert_eq!(resolve(&mut cfg, &all, Some((&path, &r))), None);
        assert_eq!(cfg, SimConfig::default());
    }

    #[test]
    fn without_a_run_summary_the_defaults_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("summary.json");
        assert_eq!(read(&missing).expect("absent is fine"), None);
        let mut cfg = SimConfig::default();
        let line = resolve(&mut cfg, &RunSettings::default(), None).expect("line");
        assert_eq!(
            line,
            "no settings of the replayed run (no summary.json beside the rates file): defaults: --interval 5 --window 30 --guard-window 15 --stabilization 10 --scale-down-delay 30, the job's SLO and percentile"
        );
        assert_eq!(cfg, SimConfig::default());
        // A summary.json that records none of them (not a run report's).
        let path = write(dir.path(), r#"{"policies": {}, "step_s": 1.0}"#);
        let r = read(&path).expect("valid").expect("present");
        assert_eq!(r, RunSettings::default());
        let line = resolve(&mut cfg, &RunSettings::default(), Some((&path, &r))).expect("line");
        assert!(
            line.starts_with(&format!(
                "no settings of the replayed run ({} records none): defaults: --interval 5",
                path.display()
            )),
            "{line}"
        );
    }

    #[test]
    fn an_older_run_summary_gives_what_it_records() {
        // Before the window and guards were recorded: the interval and the SLO only. The
        // default guard window follows the run's interval: max(30 / 2, 2 × 1) = 15.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(
            dir.path(),
            r#"{"interval_s": 1.0, "slo_s": 1.0, "latency_percentile": 0.99}"#,
        );
        let r = read(&path).expect("valid").expect("present");
        let mut cfg = SimConfig::default();
        let line = resolve(&mut cfg, &RunSettings::default(), Some((&path, &r))).expect("line");
        assert!(
            line.ends_with(
                "(the replayed run's): --interval 1 --slo 1 --latency-percentile 0.99; not recorded there, defaults: --window 30 --guard-window 15 --stabilization 10 --scale-down-delay 30"
            ),
            "{line}"
        );
        assert_eq!(cfg.interval_seconds, 1.0);
    }

    #[test]
    fn a_bad_run_summary_names_the_file_and_field() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (text, want) in [
            (
                r#"{"interval_s": "fast"}"#,
                "summary.json: interval_s: `\"fast\"` is not a number (the run's --interval setting)",
            ),
            (
                r#"{"interval_s": 1, "window_s": 0}"#,
                "summary.json: window_s: 0 must be a positive number of seconds",
            ),
            (
                r#"{"stabilization_s": -3}"#,
                "summary.json: stabilization_s: -3 must be a non-negative number of seconds",
            ),
            (
                r#"{"latency_percentile": 99}"#,
                "summary.json: latency_percentile: 99 must be in (0, 1)",
            ),
            ("[1, 2]", "summary.json: not a JSON object"),
            ("{\"interval_s\": 1", "summary.json: not JSON ("),
        ] {
            let path = write(dir.path(), text);
            let e = read(&path).expect_err(text).to_string();
            assert!(e.contains(want), "{text}: {e}");
            assert!(e.starts_with(&path.display().to_string()), "{e}");
        }
    }

    #[test]
    fn the_settings_file_gives_what_it_names() {
        let g = given_in_settings_file(
            "seed: 7\nintervalSeconds: 2\nscaleDownDelaySeconds: 0\nsloSeconds: 1\noperators:\n  enrich: { meanMicros: 5200 }\n",
        );
        assert_eq!(
            g,
            RunSettings {
                interval_s: Some(2.0),
                scale_down_delay_s: Some(0.0),
                slo_s: Some(1.0),
                ..RunSettings::default()
            }
        );
        assert_eq!(given_in_settings_file(""), RunSettings::default());
    }

    #[test]
    fn the_summary_beside_a_rates_file() {
        assert_eq!(
            summary_beside(Path::new("report/service_rates.csv")),
            Path::new("report/summary.json")
        );
        assert_eq!(
            summary_beside(Path::new("service_rates.csv")),
            Path::new("summary.json")
        );
    }
}
