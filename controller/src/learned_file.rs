//! What `streamscale run` keeps about a job between runs, in its report directory: the
//! forecast's input-rate history ([`HISTORY_FILE`]) and the scalability learned from rescales
//! ([`LEARNED_FILE`]). Each is a versioned JSON file naming its job, `{"version": 1, "job":
//! NAME, KEY: VALUE}`, written whole or not at all ([`report::replace_file`]), moved aside
//! (never deleted) when it cannot be used, and kept per job when jobs share a report
//! directory ([`claim_job_file`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::model::forecast::RateHistory;
use crate::model::learn::{FACTOR_MAX, FACTOR_MIN, ScalabilityTracker};
use crate::report::{self, ReportError};

/// File in the report directory that keeps the forecast's input-rate history across runs
/// (JSON: `{"version": 1, "job": NAME, "history": RateHistory}`, times in Unix seconds).
pub const HISTORY_FILE: &str = "forecast-history.json";

/// File in the report directory that keeps the per-operator scalability factors and
/// ineffective-scaling flags learned from rescales across runs (JSON: `{"version": 1, "job":
/// NAME, "scalability": {"factors", "ineffective"}}`).
pub const LEARNED_FILE: &str = "scalability.json";

/// The one version of both files' format.
const VERSION: u32 = 1;

/// A job file's envelope: the format version and the job, beside the remembered value's key.
#[derive(Debug, Serialize, Deserialize)]
struct JobFile<T> {
    version: u32,
    job: String,
    #[serde(flatten)]
    value: T,
}

/// One kind of remembered state, as the object under its key in the file.
trait Remembered: Serialize + DeserializeOwned {
    /// What it is, for messages ("forecast history").
    const WHAT: &'static str;
    /// What the run does when the file cannot be used.
    const INSTEAD: &'static str;
    /// Why a parsed value cannot be used, if it cannot.
    fn check(&self) -> Result<(), String>;
}

/// `{"history": RateHistory}`.
#[derive(Debug, Serialize, Deserialize)]
struct History {
    history: RateHistory,
}

impl Remembered for History {
    const WHAT: &'static str = "forecast history";
    const INSTEAD: &'static str = "starting with an empty history";
    fn check(&self) -> Result<(), String> {
        self.history.validate().map_err(|e| e.to_string())
    }
}

/// `{"scalability": ScalabilityTracker}`.
#[derive(Debug, Serialize, Deserialize)]
struct Learned {
    scalability: ScalabilityTracker,
}

impl Remembered for Learned {
    const WHAT: &'static str = "learned scalability";
    const INSTEAD: &'static str = "starting with nothing learned";
    fn check(&self) -> Result<(), String> {
        match self
            .scalability
            .factors
            .iter()
            .find(|(_, v)| !(FACTOR_MIN..=FACTOR_MAX).contains(*v))
        {
            Some((op, v)) => Err(format!(
                "factor {v} of `{op}` is outside [{FACTOR_MIN}, {FACTOR_MAX}]"
            )),
            None => Ok(()),
        }
    }
}

/// Reads the value of job `job` from `path`: `Ok(None)` when the file does not exist or
/// belongs to another job. A file that cannot be read, parsed or checked is moved aside to
/// `PATH.corrupt` and reported as `Err`, a warning naming the file and the problem.
fn load<T: Remembered>(path: &Path, job: &str) -> Result<Option<T>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(format!(
                "{}: cannot read the {}: {e}",
                path.display(),
                T::WHAT
            ));
        }
    };
    let parsed = serde_json::from_str::<JobFile<T>>(&text)
        .map_err(|e| e.to_string())
        .and_then(|f| {
            if f.version != VERSION {
                return Err(format!("version {} is not {VERSION}", f.version));
            }
            f.value.check()?;
            Ok(f)
        });
    match parsed {
        Ok(f) if f.job == job => Ok(Some(f.value)),
        Ok(_) => Ok(None),
        Err(problem) => {
            let aside = path.with_extension("json.corrupt");
            let moved = std::fs::rename(path, &aside).is_ok();
            Err(format!(
                "{}: {} ignored ({problem}){}; {}",
                path.display(),
                T::WHAT,
                if moved {
                    format!(", moved to {}", aside.display())
                } else {
                    String::new()
                },
                T::INSTEAD
            ))
        }
    }
}

/// Writes `value` as job `job`'s file at `path`, whole or not at all.
fn save<T: Remembered>(path: &Path, job: &str, value: T) -> Result<T, ReportError> {
    let file = JobFile {
        version: VERSION,
        job: job.to_string(),
        value,
    };
    let text = serde_json::to_vec(&file)?;
    report::replace_file(path, |tmp| std::fs::write(tmp, &text))?;
    Ok(file.value)
}

/// Reads the rate history of job `job` from `path` (times in Unix seconds). `Ok(None)` when
/// the file does not exist or belongs to another job. A file that cannot be read, parsed or
/// validated is moved aside to `PATH.corrupt` (nothing is deleted) and reported as `Err` with
/// a warning naming the file and the problem; the run then starts with an empty history.
///
/// # Errors
/// The warning text, when the file exists but cannot be used.
pub fn load_history(path: &Path, job: &str) -> Result<Option<RateHistory>, String> {
    Ok(load::<History>(path, job)?.map(|h| h.history))
}

/// Writes the rate history (times in Unix seconds) of job `job` to `path` atomically.
///
/// # Errors
/// [`ReportError`] naming the file.
pub fn save_history(path: &Path, job: &str, history: &RateHistory) -> Result<(), ReportError> {
    let history = history.clone();
    save(path, job, History { history }).map(|_| ())
}

/// Reads the scalability learned by earlier runs of job `job` from `path`. `Ok(None)` when the
/// file does not exist or belongs to another job; a file that cannot be read or parsed, or
/// holds a factor outside [`FACTOR_MIN`]..=[`FACTOR_MAX`], is moved aside to `PATH.corrupt` and
/// reported as `Err` with a warning naming it (the run starts with nothing learned).
///
/// # Errors
/// The warning text, when the file exists but cannot be used.
pub fn load_learned(path: &Path, job: &str) -> Result<Option<ScalabilityTracker>, String> {
    Ok(load::<Learned>(path, job)?.map(|l| l.scalability))
}

/// Writes the learned factors and flags of job `job` to `path` atomically and returns what was
/// written. The last observation per operator is left out: the next run starts at the job's
/// initial parallelism, which is not a rescale to learn from.
///
/// # Errors
/// [`ReportError`] naming the file.
pub fn save_learned(
    path: &Path,
    job: &str,
    learned: &ScalabilityTracker,
) -> Result<ScalabilityTracker, ReportError> {
    let scalability = ScalabilityTracker {
        last: BTreeMap::new(),
        ..learned.clone()
    };
    save(path, job, Learned { scalability }).map(|l| l.scalability)
}

/// Makes `path` (a [`HISTORY_FILE`] or [`LEARNED_FILE`] in a report directory) the file of
/// job `job` before a run reads or writes it, so that two jobs sharing a report directory never
/// overwrite each other's learned state: a file of another job (its `"job"` field) is renamed to
/// `STEM.<that job>.json`, and this job's file set aside that way by an earlier run is renamed
/// back. A file that is not JSON is left for the loader to set aside. Returns the lines to
/// print (each move, naming both files).
///
/// # Errors
/// The text of a rename that failed, naming the file.
pub fn claim_job_file(path: &Path, job: &str) -> Result<Vec<String>, String> {
    let aside_of = |name: &str| {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("learned");
        path.with_file_name(format!("{stem}.{name}.json"))
    };
    let job_of = |p: &Path| -> Option<String> {
        let text = std::fs::read_to_string(p).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get("job")?.as_str().map(str::to_string)
    };
    let rename = |from: &Path, to: &Path| {
        std::fs::rename(from, to)
            .map_err(|e| format!("cannot move {} to {}: {e}", from.display(), to.display()))
    };
    let mut notes = Vec::new();
    if let Some(other) = job_of(path).filter(|o| o != job) {
        // Only job names that the engine accepts become file names.
        if streamscale_engine::spec::valid_job_name(&other) {
            let aside = aside_of(&other);
            rename(path, &aside)?;
            notes.push(format!(
                "{} belongs to job `{other}`: kept as {} for that job's next run",
                path.display(),
                aside.display()
            ));
        }
    }
    let mine = aside_of(job);
    if !path.exists() && mine.is_file() {
        rename(&mine, path)?;
        notes.push(format!(
            "{} of this job restored from {}",
            path.display(),
            mine.display()
        ));
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_report_directory_keeps_each_jobs_learned_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(HISTORY_FILE);
        let file_of = |job: &str| format!(r#"{{"version": 1, "job": "{job}", "history": {{}}}}"#);
        // Nothing there: nothing moved.
        assert_eq!(claim_job_file(&path, "a"), Ok(vec![]));
        std::fs::write(&path, file_of("a")).expect("write");
        assert_eq!(claim_job_file(&path, "a"), Ok(vec![]), "a's own file stays");
        // Job b runs in the same directory: a's file is set aside, not left to be overwritten.
        let notes = claim_job_file(&path, "b").expect("claim");
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("job `a`"), "{notes:?}");
        assert!(!path.exists());
        let aside_a = dir.path().join("forecast-history.a.json");
        assert_eq!(
            std::fs::read_to_string(&aside_a).expect("aside"),
            file_of("a")
        );
        std::fs::write(&path, file_of("b")).expect("b writes its own");
        // Job a again: b's file is set aside and a's comes back.
        let notes = claim_job_file(&path, "a").expect("claim");
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(std::fs::read_to_string(&path).expect("back"), file_of("a"));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("forecast-history.b.json")).expect("b"),
            file_of("b")
        );
        assert!(!aside_a.exists());
        // A file that is not JSON is left for the loader to set aside as corrupt.
        std::fs::write(&path, "{ not json").expect("write");
        assert_eq!(claim_job_file(&path, "b"), Ok(vec![]));
        assert!(path.exists());
    }

    #[test]
    fn learned_scalability_round_trips_without_its_baseline_and_bad_files_are_set_aside() {
        use crate::model::learn::Observed;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(LEARNED_FILE);
        assert_eq!(load_learned(&path, "j"), Ok(None));
        let t = ScalabilityTracker {
            last: [(
                "work".to_string(),
                Observed {
                    parallelism: 3,
                    true_processing_rate: Some(900.0),
                    input_rate: 1500.0,
                    busiest_share: None,
                },
            )]
            .into(),
            factors: [("work".to_string(), 0.8)].into(),
            ..ScalabilityTracker::default()
        };
        let saved = save_learned(&path, "j", &t).expect("saved");
        assert!(saved.last.is_empty());
        let back = load_learned(&path, "j").expect("loads").expect("same job");
        assert_eq!(back.factor("work"), 0.8);
        assert!(back.last.is_empty(), "no baseline across runs");
        assert_eq!(load_learned(&path, "other"), Ok(None));
        let mut bad = t;
        bad.factors.insert("work".into(), 7.0);
        save_learned(&path, "j", &bad).expect("saved");
        let err = load_learned(&path, "j").expect_err("out of range");
        assert!(
            err.contains("factor 7 of `work`") && err.contains("ignored"),
            "{err}"
        );
        assert!(!path.exists() && path.with_extension("json.corrupt").exists());
    }

    #[test]
    fn forecast_history_round_trips_and_a_corrupt_file_is_set_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(HISTORY_FILE);
        assert_eq!(load_history(&path, "j"), Ok(None));
        let h = crate::model::forecast::RateHistory {
            bin_seconds: 300.0,
            season_seconds: 86_400.0,
            bins: vec![(5_000_000, 12.5), (5_000_001, 13.0)],
            ..Default::default()
        };
        save_history(&path, "j", &h).expect("saved");
        assert_eq!(load_history(&path, "j"), Ok(Some(h.clone())));
        // Another job's history is not used (and left alone).
        assert_eq!(load_history(&path, "other"), Ok(None));
        assert!(path.exists());
        // A truncated file: a warning naming it, the file moved aside, never a panic.
        std::fs::write(&path, b"{\"version\": 1, \"job\": \"j\", \"hist").expect("write");
        let err = load_history(&path, "j").expect_err("corrupt");
        assert!(
            err.contains(&path.display().to_string()) && err.contains("ignored"),
            "{err}"
        );
        assert!(!path.exists() && path.with_extension("json.corrupt").exists());
        // A parseable file with an invalid rate is rejected by validation.
        let mut bad = h;
        bad.bins[1].1 = -1.0;
        save_history(&path, "j", &bad).expect("saved");
        let err = load_history(&path, "j").expect_err("invalid");
        assert!(err.contains("bins[1]"), "{err}");
    }
}
