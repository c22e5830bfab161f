//! The report directory: its lock, and the staging directory whose files move into it once the first engine runs.

use super::*;

/// The report directory's parent (created if missing) and its name.
///
/// # Errors
/// [`RunError::Option`] naming `--report` when the path has no name or the parent cannot be
/// created.
pub(super) fn report_parent(report_dir: &Path) -> Result<(&Path, &std::ffi::OsStr), RunError> {
    let (Some(parent), Some(name)) = (report_dir.parent(), report_dir.file_name()) else {
        return Err(RunError::Option(format!(
            "--report: {} does not name a directory",
            report_dir.display()
        )));
    };
    std::fs::create_dir_all(parent).map_err(|e| {
        RunError::Option(format!("--report: cannot create {}: {e}", parent.display()))
    })?;
    Ok((parent, name))
}

/// Takes the lock file `.NAME.lock` beside the report directory `NAME` (created if missing,
/// left in place afterwards unless the run could not start and created no `NAME`; an exclusive
/// advisory lock, released when the file is closed or the process exits), so that two runs
/// never write into one report directory. Returns the open file and its path.
///
/// # Errors
/// [`RunError::Option`] naming `--report` when another process holds the lock or the lock file
/// cannot be created.
pub(super) fn lock_report_dir(report_dir: &Path) -> Result<(std::fs::File, PathBuf), RunError> {
    let (parent, name) = report_parent(report_dir)?;
    let path = parent.join(format!(".{}.lock", name.to_string_lossy()));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| {
            RunError::Option(format!("--report: cannot create {}: {e}", path.display()))
        })?;
    match file.try_lock() {
        Ok(()) => Ok((file, path)),
        Err(std::fs::TryLockError::WouldBlock) => Err(RunError::Option(format!(
            "--report: {} is in use by another streamscale run (it holds {}); give another --report",
            report_dir.display(),
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(RunError::Option(format!(
            "--report: cannot lock {}: {e}",
            path.display()
        ))),
    }
}

/// The first engine's job file and log directory until it has started: a new directory
/// `NAME.starting-PID-N` beside the report directory `NAME` (same file system, so its files
/// can be renamed into the report).
pub(super) struct Staging {
    pub(super) dir: PathBuf,
}

impl Staging {
    /// Creates the directory (and the report directory's parent) and writes `job.yaml`.
    pub(super) fn create(report_dir: &Path, yaml: &str) -> Result<Staging, RunError> {
        let (parent, name) = report_parent(report_dir)?;
        let cannot = |path: &Path, e: std::io::Error| {
            RunError::Option(format!("--report: cannot create {}: {e}", path.display()))
        };
        let mut n = 0u32;
        let dir = loop {
            let dir = parent.join(format!(
                "{}.starting-{}-{n}",
                name.to_string_lossy(),
                std::process::id()
            ));
            match std::fs::create_dir(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(cannot(&dir, e)),
            }
        };
        let job = dir.join("job.yaml");
        if let Err(source) = std::fs::write(&job, yaml) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(RunError::Io { path: job, source });
        }
        Ok(Staging { dir })
    }

    /// After a failed start: keeps the directory when the engine ran long enough to log
    /// something (returns it), else removes it.
    pub(super) fn abandon(self, error: &RuntimeError) -> Option<PathBuf> {
        if matches!(error, RuntimeError::Spawn { .. }) {
            let _ = std::fs::remove_dir_all(&self.dir);
            None
        } else {
            Some(self.dir)
        }
    }

    /// Makes the report directory this run's: moves this run's `job.yaml` and `logs/` into it
    /// under temporary names (nothing of an earlier report is touched if that fails), removes
    /// the earlier run's report files ([`REPORT_FILES`], `summary.json` first, so that a
    /// `summary.json` always belongs to the rest) and engine logs, then gives the new ones
    /// their names. Savepoints and learned state stay.
    pub(super) async fn commit(
        self,
        report_dir: &Path,
        runtime: &LocalRuntime,
    ) -> Result<(), RunError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RunError::Io { path, source }
        };
        std::fs::create_dir_all(report_dir).map_err(io(report_dir))?;
        let pid = std::process::id();
        let new_logs = report_dir.join(format!(".logs.starting-{pid}"));
        let new_job = report_dir.join(format!(".job.yaml.starting-{pid}"));
        runtime.move_logs(&new_logs).await?;
        std::fs::rename(self.dir.join("job.yaml"), &new_job).map_err(io(&new_job))?;
        for file in REPORT_FILES {
            let path = report_dir.join(file);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&path)(e)),
                _ => {}
            }
        }
        let logs = report_dir.join("logs");
        match std::fs::remove_dir_all(&logs) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&logs)(e)),
            _ => {}
        }
        let job = report_dir.join("job.yaml");
        std::fs::rename(&new_job, &job).map_err(io(&job))?;
        runtime.move_logs(&logs).await?;
        std::fs::remove_dir(&self.dir).map_err(io(&self.dir))
    }
}

/// The directory in the report directory where the engines write savepoints.
pub const SAVEPOINTS_DIR: &str = "savepoints";

/// Files of a run's report that the next run in the same directory replaces, `summary.json`
/// first: it is written last, so a `summary.json` marks a complete report.
pub const REPORT_FILES: [&str; 5] = [
    "summary.json",
    "timeline.csv",
    "timeline.png",
    "service_rates.csv",
    "job.yaml",
];

/// The warning for a report directory that holds an earlier run's report (any of
/// [`REPORT_FILES`]), `None` for a new or empty one. A reused directory is not refused: it is
/// also where the autoscaler's learned state ([`STATE_FILE`]) is kept between runs of a job.
pub fn earlier_report(dir: &Path) -> Option<String> {
    let found: Vec<&str> = REPORT_FILES
        .iter()
        .copied()
        .filter(|f| dir.join(f).is_file())
        .collect();
    (!found.is_empty()).then(|| {
        format!(
            "warning: {} holds the report of an earlier run ({}); this run replaces it and its engine logs once its engine has started (savepoints stay, the newest --keep-savepoints; this job's {STATE_FILE} is read and kept, another job's are set aside). Use --report DIR to keep it.",
            dir.display(),
            found.join(", ")
        )
    })
}
