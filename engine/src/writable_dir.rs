//! Whether a directory can be used (written into, or created) at a path, checked before a job
//! starts: the disk state backend's `state.dir` when a job file is read, `streamscale run`'s
//! `--report`. A path the process cannot use then fails up front, naming it and the reason,
//! instead of once the engine runs.
//!
//! Permission bits cannot answer this (root passes every `access(2)` check, yet cannot create
//! anything under `/proc`), so the check tries it: it creates an empty directory with a unique
//! hidden name (`.streamscale-probe-PID-N`) in the directory, or in the nearest existing
//! ancestor when the directory does not exist yet (where creating it starts), and removes it
//! again at once. Nothing is left behind; the directory's modification time changes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Why no directory can be used at a path.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// The path exists and is not a directory.
    #[error("{} exists and is not a directory", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The path does not exist and cannot be created: an ancestor is not a directory.
    #[error("{} cannot be created: {} is not a directory", path.display(), ancestor.display())]
    AncestorNotADirectory {
        /// The path.
        path: PathBuf,
        /// Its nearest existing ancestor, which is not a directory.
        ancestor: PathBuf,
    },
    /// The directory exists but nothing can be created in it.
    #[error("{} is not writable: cannot create an entry in it: {source}", path.display())]
    NotWritable {
        /// The directory.
        path: PathBuf,
        /// The error creating the probe directory.
        source: std::io::Error,
    },
    /// The path does not exist and its nearest existing ancestor does not allow creating it.
    #[error(
        "{} cannot be created: cannot create a directory in {}: {source}",
        path.display(),
        ancestor.display()
    )]
    CannotCreate {
        /// The path.
        path: PathBuf,
        /// Its nearest existing ancestor.
        ancestor: PathBuf,
        /// The error creating the probe directory there.
        source: std::io::Error,
    },
}

/// Probe directories made by this process so far (part of their unique names).
static PROBES: AtomicU32 = AtomicU32::new(0);

/// Checks that a directory can be used at `dir`: it exists as a directory in which an entry
/// can be created, or it does not exist and its nearest existing ancestor (the working
/// directory for a relative path none of whose ancestors exist) is a directory in which one
/// can be created. Tries it with an empty probe directory that it removes again (see the
/// module documentation); symbolic links are followed.
///
/// # Errors
/// [`DirError`]: the path or an ancestor is not a directory, or creating in it failed (with
/// the operating system's error: permission denied, read-only file system, no such file or
/// directory under `/proc`, ...).
pub fn check_usable_dir(dir: &Path) -> Result<(), DirError> {
    let existing = dir
        .ancestors()
        .map(|a| {
            if a.as_os_str().is_empty() {
                Path::new(".")
            } else {
                a
            }
        })
        .find_map(|a| std::fs::metadata(a).ok().map(|m| (a, m.is_dir())));
    let Some((base, is_dir)) = existing else {
        // Not even the root exists (cannot happen on a working system): leave it to the
        // creation itself to say why.
        return Ok(());
    };
    let at_dir = base == dir;
    if !is_dir {
        return Err(if at_dir {
            DirError::NotADirectory {
                path: dir.to_path_buf(),
            }
        } else {
            DirError::AncestorNotADirectory {
                path: dir.to_path_buf(),
                ancestor: base.to_path_buf(),
            }
        });
    }
    probe(base).map_err(|source| {
        if at_dir {
            DirError::NotWritable {
                path: dir.to_path_buf(),
                source,
            }
        } else {
            DirError::CannotCreate {
                path: dir.to_path_buf(),
                ancestor: base.to_path_buf(),
                source,
            }
        }
    })
}

/// Creates and removes an empty directory with a new name in `dir`.
fn probe(dir: &Path) -> std::io::Result<()> {
    loop {
        let n = PROBES.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".streamscale-probe-{}-{n}", std::process::id()));
        match std::fs::create_dir(&path) {
            Ok(()) => {
                // A probe that cannot be removed is only an empty hidden directory; the
                // directory was usable.
                let _ = std::fs::remove_dir(&path);
                return Ok(());
            }
            // Left by an earlier process of the same id: try the next name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &Path) -> Vec<std::ffi::OsString> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    }

    #[test]
    fn a_writable_or_creatable_directory_passes_and_is_left_as_it_was() {
        let tmp = tempfile::tempdir().unwrap();
        check_usable_dir(tmp.path()).unwrap();
        check_usable_dir(&tmp.path().join("a/b/c")).unwrap();
        assert!(entries(tmp.path()).is_empty(), "{:?}", entries(tmp.path()));
    }

    #[test]
    fn files_in_the_way_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let e = check_usable_dir(&file).unwrap_err();
        assert!(matches!(e, DirError::NotADirectory { .. }), "{e}");
        let e = check_usable_dir(&file.join("sub/dir")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} cannot be created: {} is not a directory",
                file.join("sub/dir").display(),
                file.display()
            )
        );
    }

    /// Fails even for root: nothing can be created under `/proc`.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_directory_nothing_can_be_created_in_is_refused() {
        let e = check_usable_dir(Path::new("/proc/streamscale-nope/state")).unwrap_err();
        assert!(
            matches!(&e, DirError::CannotCreate { ancestor, .. } if ancestor == Path::new("/proc")),
            "{e}"
        );
        let e = check_usable_dir(Path::new("/proc")).unwrap_err();
        assert!(matches!(e, DirError::NotWritable { .. }), "{e}");
    }
}
