//! The [`StateStore`] of `streamscale run` and `streamscale flink`: one JSON file (a
//! [`LearnedState`]), written whole or not at all ([`report::replace_file`]) and moved aside
//! (never deleted) when it cannot be used. `streamscale run` keeps it in the report directory
//! ([`STATE_FILE`], kept per job when jobs share a report directory: [`claim_job_file`]);
//! `streamscale flink` keeps one file per Flink job id ([`flink_state_file`]).
//!
//! Runs before this file existed kept the same state in two files, [`LEGACY_HISTORY_FILE`] and
//! [`LEGACY_LEARNED_FILE`] (`{"version": 1, "job": NAME, KEY: VALUE}`); while [`STATE_FILE`]
//! does not exist they are read instead (and left in place), so a report directory of an earlier
//! version keeps what it learned.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{LearnedState, STATE_VERSION, StateStore, StateStoreError};
use crate::model::forecast::RateHistory;
use crate::model::learn::ScalabilityTracker;
use crate::report;

/// File in the report directory that keeps what the autoscaler learned about the job
/// ([`LearnedState`] JSON; the history's times in Unix seconds).
pub const STATE_FILE: &str = "learned-state.json";

/// The forecast's rate history as earlier versions kept it: `{"version": 1, "job": NAME,
/// "history": RateHistory}`.
pub const LEGACY_HISTORY_FILE: &str = "forecast-history.json";

/// The learned scalability as earlier versions kept it: `{"version": 1, "job": NAME,
/// "scalability": ScalabilityTracker}`.
pub const LEGACY_LEARNED_FILE: &str = "scalability.json";

/// The file of `streamscale flink`'s learned state of the Flink job `job_id`:
/// `learned-state-flink-JOB_ID.json` (a character of the id other than an ASCII letter, digit,
/// `-` or `_` becomes `_`; Flink's ids are 32 hex digits).
pub fn flink_state_file(job_id: &str) -> String {
    let id: String = job_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("learned-state-flink-{id}.json")
}

/// The learned state of one job in a directory.
#[derive(Debug, Clone)]
pub struct FileStateStore {
    dir: PathBuf,
    /// The state file's name in `dir`.
    file: String,
    /// Whether an earlier version's files ([`LEGACY_HISTORY_FILE`], [`LEGACY_LEARNED_FILE`])
    /// are read while the state file does not exist (`streamscale run`'s store only).
    legacy: bool,
    job: String,
    migrated_from: Vec<PathBuf>,
}

impl FileStateStore {
    /// The store of job `job` in report directory `dir`: [`STATE_FILE`], else an earlier
    /// version's files (nothing is read yet).
    pub fn new(dir: &Path, job: &str) -> FileStateStore {
        FileStateStore {
            dir: dir.to_path_buf(),
            file: STATE_FILE.to_string(),
            legacy: true,
            job: job.to_string(),
            migrated_from: Vec::new(),
        }
    }

    /// The store of job `job` in the file `file` of directory `dir`, without an earlier
    /// version's files (nothing is read yet).
    pub fn in_file(dir: &Path, file: &str, job: &str) -> FileStateStore {
        FileStateStore {
            dir: dir.to_path_buf(),
            file: file.to_string(),
            legacy: false,
            job: job.to_string(),
            migrated_from: Vec::new(),
        }
    }

    /// The state file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.file)
    }

    /// Keeps the state in `file` (same directory) from now on: the current file, if any, is
    /// renamed to it (a Flink job resubmitted from a savepoint has a new id).
    ///
    /// # Errors
    /// [`StateStoreError::Write`] naming both files when the rename fails (the next save
    /// writes `file` all the same).
    pub fn move_to(&mut self, file: &str) -> Result<(), StateStoreError> {
        let (from, to) = (self.path(), self.dir.join(file));
        self.file = file.to_string();
        match std::fs::rename(&from, &to) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StateStoreError::Write {
                location: to.display().to_string(),
                problem: format!("cannot move {} to it: {e}", from.display()),
            }),
        }
    }

    /// The files of an earlier version the last [`StateStore::load`] read (empty when it read
    /// [`STATE_FILE`] or nothing).
    pub fn migrated_from(&self) -> &[PathBuf] {
        &self.migrated_from
    }

    /// Makes the state file (and the earlier version's files) this job's before it is read or
    /// written ([`claim_job_file`]). Returns the lines to print, and the warnings of moves that
    /// failed.
    pub fn claim(&self) -> (Vec<String>, Vec<String>) {
        let (mut notes, mut warnings) = (Vec::new(), Vec::new());
        let legacy = [LEGACY_HISTORY_FILE, LEGACY_LEARNED_FILE].map(|f| self.dir.join(f));
        let files = std::iter::once(self.path()).chain(legacy.into_iter().filter(|_| self.legacy));
        for path in files {
            match claim_job_file(&path, &self.job) {
                Ok(n) => notes.extend(n),
                Err(w) => warnings.push(w),
            }
        }
        (notes, warnings)
    }

    /// Reads the state file, see [`StateStore::load`].
    fn load_now(&mut self) -> Result<Option<LearnedState>, StateStoreError> {
        self.migrated_from.clear();
        let path = self.path();
        match read(&path)? {
            Some(text) => set_aside_unless_ok(&path, LearnedState::decode(&text, &self.job)),
            None if self.legacy => self.load_legacy(),
            None => Ok(None),
        }
    }

    /// Reads the two files of an earlier version into one state (`Ok(None)` when neither
    /// exists or holds this job's).
    fn load_legacy(&mut self) -> Result<Option<LearnedState>, StateStoreError> {
        #[derive(Deserialize)]
        struct History {
            version: u32,
            job: String,
            history: RateHistory,
        }
        #[derive(Deserialize)]
        struct Learned {
            version: u32,
            job: String,
            scalability: ScalabilityTracker,
        }
        let mut state = LearnedState {
            version: STATE_VERSION,
            job: self.job.clone(),
            ..LearnedState::default()
        };
        let history_path = self.dir.join(LEGACY_HISTORY_FILE);
        if let Some(text) = read(&history_path)? {
            let parsed = serde_json::from_str::<History>(&text)
                .map_err(|e| e.to_string())
                .and_then(|f| {
                    let s = LearnedState {
                        history: Some(f.history),
                        ..legacy(f.version, f.job)?
                    };
                    s.check().map(|()| s)
                })
                .map(|s| (s.job == self.job).then_some(s));
            if let Some(s) = set_aside_unless_ok(&history_path, parsed)? {
                state.history = s.history;
                self.migrated_from.push(history_path);
            }
        }
        let learned_path = self.dir.join(LEGACY_LEARNED_FILE);
        if let Some(text) = read(&learned_path)? {
            let parsed = serde_json::from_str::<Learned>(&text)
                .map_err(|e| e.to_string())
                .and_then(|f| {
                    let s = LearnedState {
                        scalability: f.scalability,
                        ..legacy(f.version, f.job)?
                    };
                    s.check().map(|()| s)
                })
                .map(|s| (s.job == self.job).then_some(s));
            if let Some(s) = set_aside_unless_ok(&learned_path, parsed)? {
                state.scalability = s.scalability;
                self.migrated_from.push(learned_path);
            }
        }
        Ok((!self.migrated_from.is_empty()).then_some(state))
    }
}

/// The envelope of an earlier version's file as a state (its version must be 1).
fn legacy(version: u32, job: String) -> Result<LearnedState, String> {
    if version != 1 {
        return Err(format!("version {version} is not 1"));
    }
    Ok(LearnedState {
        version: STATE_VERSION,
        job,
        ..LearnedState::default()
    })
}

/// The text of `path`, `None` when it does not exist.
fn read(path: &Path) -> Result<Option<String>, StateStoreError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StateStoreError::Read {
            location: path.display().to_string(),
            problem: e.to_string(),
        }),
    }
}

/// `parsed`, or when it is a problem: `path` moved to `PATH.corrupt` and
/// [`StateStoreError::Invalid`] naming both.
fn set_aside_unless_ok(
    path: &Path,
    parsed: Result<Option<LearnedState>, String>,
) -> Result<Option<LearnedState>, StateStoreError> {
    parsed.map_err(|problem| {
        let aside = path.with_extension("json.corrupt");
        let moved = std::fs::rename(path, &aside).is_ok();
        StateStoreError::Invalid {
            location: if moved {
                format!("{} (moved to {})", path.display(), aside.display())
            } else {
                path.display().to_string()
            },
            problem,
        }
    })
}

impl StateStore for FileStateStore {
    fn location(&self) -> String {
        self.path().display().to_string()
    }

    /// Reads the state file (or, for `streamscale run`, while it does not exist, the earlier
    /// version's files). A file that cannot be parsed or checked ([`LearnedState::check`]) is
    /// moved aside to `PATH.corrupt` and reported as [`StateStoreError::Invalid`].
    async fn load(&mut self) -> Result<Option<LearnedState>, StateStoreError> {
        self.load_now()
    }

    async fn save(&mut self, state: &LearnedState) -> Result<(), StateStoreError> {
        let path = self.path();
        let write = |problem: String| StateStoreError::Write {
            location: path.display().to_string(),
            problem,
        };
        let text = serde_json::to_vec(state).map_err(|e| write(e.to_string()))?;
        report::replace_file(&path, |tmp| std::fs::write(tmp, &text))
            .map_err(|e| write(e.to_string()))
    }
}

/// Makes `path` (a state file in a report directory) the file of job `job` before a run reads
/// or writes it, so that two jobs sharing a report directory never overwrite each other's
/// learned state: a file of another job (its `"job"` field) is renamed to
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

    fn block<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn a_shared_report_directory_keeps_each_jobs_learned_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(STATE_FILE);
        let file_of = |job: &str| format!(r#"{{"version": 1, "job": "{job}"}}"#);
        // Nothing there: nothing moved.
        assert_eq!(claim_job_file(&path, "a"), Ok(vec![]));
        std::fs::write(&path, file_of("a")).expect("write");
        assert_eq!(claim_job_file(&path, "a"), Ok(vec![]), "a's own file stays");
        // Job b runs in the same directory: a's file is set aside, not left to be overwritten.
        let notes = claim_job_file(&path, "b").expect("claim");
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("job `a`"), "{notes:?}");
        assert!(!path.exists());
        let aside_a = dir.path().join("learned-state.a.json");
        assert_eq!(
            std::fs::read_to_string(&aside_a).expect("aside"),
            file_of("a")
        );
        std::fs::write(&path, file_of("b")).expect("b writes its own");
        // Job a again: b's file is set aside and a's comes back.
        let (notes, warnings) = FileStateStore::new(dir.path(), "a").claim();
        assert_eq!((notes.len(), warnings.len()), (2, 0), "{notes:?}");
        assert_eq!(std::fs::read_to_string(&path).expect("back"), file_of("a"));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("learned-state.b.json")).expect("b"),
            file_of("b")
        );
        assert!(!aside_a.exists());
        // A file that is not JSON is left for the loader to set aside as corrupt.
        std::fs::write(&path, "{ not json").expect("write");
        assert_eq!(claim_job_file(&path, "b"), Ok(vec![]));
        assert!(path.exists());
    }

    #[test]
    fn the_state_round_trips_and_a_bad_file_is_set_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = FileStateStore::new(dir.path(), "j");
        assert_eq!(block(store.load()), Ok(None));
        let s = LearnedState {
            version: STATE_VERSION,
            job: "j".into(),
            history: Some(RateHistory {
                bin_seconds: 300.0,
                season_seconds: 86_400.0,
                bins: vec![(5_000_000, 12.5), (5_000_001, 13.0)],
                ..Default::default()
            }),
            scalability: ScalabilityTracker {
                factors: [("work".to_string(), 0.8)].into(),
                ..ScalabilityTracker::default()
            },
            rescale_downtime_seconds: None,
            rescale_downtimes_seconds: Vec::new(),
            flaps: crate::model::flaps::FlapHistory {
                scale_down_s: [("work".to_string(), 1_700_000_000.0)].into(),
                flaps_s: [1_700_000_600.0].into(),
            },
        };
        block(store.save(&s)).expect("saved");
        assert_eq!(block(store.load()), Ok(Some(s.clone())));
        assert!(store.migrated_from().is_empty());
        // Another job's state is not used (and left alone).
        let mut other = FileStateStore::new(dir.path(), "other");
        assert_eq!(block(other.load()), Ok(None));
        assert!(store.path().exists());
        // A truncated file: an error naming it, the file moved aside, never a panic.
        std::fs::write(store.path(), b"{\"version\": 1, \"job\": \"j\", \"hist").expect("write");
        let err = block(store.load()).expect_err("corrupt").to_string();
        assert!(
            err.contains(&store.location()) && err.contains("learned state ignored"),
            "{err}"
        );
        assert!(!store.path().exists() && store.path().with_extension("json.corrupt").exists());
        // A factor out of range is rejected by the check.
        let mut bad = s;
        bad.scalability.factors.insert("work".into(), 7.0);
        block(store.save(&bad)).expect("saved");
        let err = block(store.load()).expect_err("out of range").to_string();
        assert!(err.contains("factor 7 of `work`"), "{err}");
    }

    #[test]
    fn a_store_in_its_own_file_reads_no_earlier_version_and_follows_a_new_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        // `streamscale run`'s earlier-version file of the same job beside it is not read.
        std::fs::write(
            dir.path().join(LEGACY_LEARNED_FILE),
            r#"{"version":1,"job":"j","scalability":{"last":{},"factors":{"work":0.8},"ineffective":{}}}"#,
        )
        .expect("write");
        let file = flink_state_file("a1b2");
        assert_eq!(file, "learned-state-flink-a1b2.json");
        assert_eq!(flink_state_file("../x"), "learned-state-flink-___x.json");
        let mut store = FileStateStore::in_file(dir.path(), &file, "j");
        assert_eq!(store.path(), dir.path().join(&file));
        assert_eq!(block(store.load()), Ok(None));
        let (notes, warnings) = store.claim();
        assert!(notes.is_empty() && warnings.is_empty());
        assert!(dir.path().join(LEGACY_LEARNED_FILE).exists());
        let s = LearnedState {
            version: STATE_VERSION,
            job: "j".into(),
            rescale_downtime_seconds: Some(2.0),
            ..LearnedState::default()
        };
        block(store.save(&s)).expect("saved");
        // A resubmitted job has a new id: the file moves with it.
        store.move_to(&flink_state_file("c3d4")).expect("moved");
        assert!(!dir.path().join(&file).exists());
        assert_eq!(
            store.path(),
            dir.path().join("learned-state-flink-c3d4.json")
        );
        assert_eq!(block(store.load()), Ok(Some(s)));
        // Nothing to move is no error: the next save writes the new file.
        std::fs::remove_file(store.path()).expect("rm");
        store.move_to("elsewhere.json").expect("nothing to move");
        assert_eq!(store.path(), dir.path().join("elsewhere.json"));
    }

    #[test]
    fn the_files_of_an_earlier_version_are_read_until_the_state_file_exists() {
        let dir = tempfile::tempdir().expect("tempdir");
        let history = dir.path().join(LEGACY_HISTORY_FILE);
        let learned = dir.path().join(LEGACY_LEARNED_FILE);
        // As written by the version before STATE_FILE (learned_file.rs).
        std::fs::write(
            &history,
            r#"{"version":1,"job":"j","history":{"binSeconds":300.0,"seasonSeconds":86400.0,"bins":[[5000000,12.5],[5000001,13.0]],"open":null,"last":null,"pending":[],"checked":[]}}"#,
        )
        .expect("write");
        std::fs::write(
            &learned,
            r#"{"version":1,"job":"j","scalability":{"last":{},"factors":{"work":0.8},"ineffective":{}}}"#,
        )
        .expect("write");
        let mut store = FileStateStore::new(dir.path(), "j");
        let s = block(store.load()).expect("loads").expect("this job's");
        assert_eq!(store.migrated_from(), [history.clone(), learned.clone()]);
        assert_eq!(s.scalability.factor("work"), 0.8);
        let h = s.history.clone().expect("history");
        assert_eq!(h.bins, vec![(5_000_000, 12.5), (5_000_001, 13.0)]);
        assert_eq!(h.bin_seconds, 300.0);
        // Another job's old files are not this job's state.
        assert_eq!(block(FileStateStore::new(dir.path(), "k").load()), Ok(None));
        // Once saved, the new file is read; the old ones stay as they were.
        block(store.save(&s)).expect("saved");
        assert_eq!(block(store.load()), Ok(Some(s)));
        assert!(store.migrated_from().is_empty() && history.exists() && learned.exists());
        // A corrupt old file is set aside like the new one.
        std::fs::remove_file(store.path()).expect("rm");
        std::fs::write(&learned, "{").expect("write");
        let err = block(store.load()).expect_err("corrupt").to_string();
        assert!(err.contains(LEGACY_LEARNED_FILE), "{err}");
        assert!(dir.path().join("scalability.json.corrupt").exists());
    }
}
