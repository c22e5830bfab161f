//! The exactly-once file sink (Flink's `FileSink` part-file life cycle) on the
//! [`two_phase`](super::two_phase) seam.
//!
//! `output` is a directory. Each sink subtask appends its lines (`key,count,sum`, or one JSON
//! object for Nexmark events and query rows) to a hidden in-progress file
//! `.<operator>.part-<operator>-<attempt>-<subtask>-<n>.inprogress`; at each barrier the file
//! is flushed, fsynced and closed (pre-commit), and once the checkpoint covering it completes
//! it is renamed to `part-<operator>-<attempt>-<subtask>-<n>` (commit) and the directory
//! fsynced. A reader of `part-*` therefore sees only whole files of whole lines, each record
//! once: on a restore, the in-progress files the checkpoint lists are published and every
//! other in-progress file of the operator is deleted (its records come again from the
//! sources' restored positions). Published files are never modified or removed.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::two_phase::{Committable, SinkError, TransactionalWriter, TwoPhaseCommitSink};
use crate::record::Record;

/// Suffix of an in-progress part file.
pub const IN_PROGRESS_SUFFIX: &str = ".inprogress";
/// Prefix of a published part file.
pub const PART_PREFIX: &str = "part-";

/// Writes one record as one line: its payload's JSON when it has one, else
/// `key,count,value`.
///
/// # Errors
/// The writer's I/O error.
pub fn write_line(w: &mut impl Write, rec: &Record) -> std::io::Result<()> {
    match rec.payload.to_json() {
        Some(json) => writeln!(w, "{json}"),
        None => writeln!(w, "{},{},{}", rec.key, rec.count, rec.value),
    }
}

/// The exactly-once file sink of one sink operator writing into one directory.
#[derive(Debug, Clone)]
pub struct FileSink {
    operator: String,
    dir: PathBuf,
}

impl FileSink {
    /// The sink of operator `operator` publishing part files into `dir` (created by
    /// [`TwoPhaseCommitSink::recover`] when missing).
    pub fn new(operator: &str, dir: impl Into<PathBuf>) -> FileSink {
        FileSink {
            operator: operator.to_string(),
            dir: dir.into(),
        }
    }

    /// The directory the part files are published in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn in_progress_prefix(&self) -> String {
        format!(".{}.", self.operator)
    }

    fn bad(&self, c: &Committable, reason: &str) -> SinkError {
        SinkError::Committable {
            sink: format!("{} ({})", self.operator, self.dir.display()),
            committable: c.to_string(),
            reason: reason.to_string(),
        }
    }

    /// The (in-progress, published) file names of committable `c`, checked to be plain names
    /// of this operator's files.
    fn names<'a>(&self, c: &'a Committable) -> Result<(&'a str, &'a str), SinkError> {
        let field = |k: &str| c.get(k).and_then(|v| v.as_str());
        let (Some(from), Some(to)) = (field("inProgress"), field("published")) else {
            return Err(self.bad(c, "expected {\"inProgress\": NAME, \"published\": NAME}"));
        };
        let plain = |n: &str| !n.is_empty() && !n.contains('/') && n != "." && n != "..";
        if !plain(from)
            || !plain(to)
            || !from.starts_with(&self.in_progress_prefix())
            || !from.ends_with(IN_PROGRESS_SUFFIX)
            || !to.starts_with(PART_PREFIX)
        {
            return Err(self.bad(c, "not a part file of this operator"));
        }
        Ok((from, to))
    }

    fn sync_dir(&self) -> Result<(), SinkError> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| SinkError::Io {
                path: self.dir.clone(),
                action: "cannot fsync the output directory",
                source,
            })
    }
}

impl TwoPhaseCommitSink for FileSink {
    fn create_writer(
        &self,
        subtask: u32,
        _parallelism: u32,
        attempt: &str,
    ) -> Result<Box<dyn TransactionalWriter>, SinkError> {
        Ok(Box::new(PartWriter {
            dir: self.dir.clone(),
            prefix: self.in_progress_prefix(),
            stem: format!("{PART_PREFIX}{}-{attempt}-{subtask}", self.operator),
            next: 0,
            open: None,
        }))
    }

    fn commit(&self, committables: &[Committable]) -> Result<(), SinkError> {
        let mut renamed = false;
        for c in committables {
            let (from, to) = self.names(c)?;
            let (from, to) = (self.dir.join(from), self.dir.join(to));
            if to.exists() {
                continue; // committed before (a commit runs again after a crash)
            }
            if !from.exists() {
                return Err(self.bad(
                    c,
                    "neither the in-progress nor the published part file exists (deleted by hand?)",
                ));
            }
            fs::rename(&from, &to).map_err(|source| SinkError::Io {
                path: to.clone(),
                action: "cannot publish part file",
                source,
            })?;
            renamed = true;
        }
        if renamed {
            self.sync_dir()?;
        }
        Ok(())
    }

    fn recover(&self, restored: &[Committable]) -> Result<(), SinkError> {
        fs::create_dir_all(&self.dir).map_err(|source| SinkError::Io {
            path: self.dir.clone(),
            action: "cannot create the output directory",
            source,
        })?;
        self.commit(restored)?;
        let entries = fs::read_dir(&self.dir).map_err(|source| SinkError::Io {
            path: self.dir.clone(),
            action: "cannot list the output directory",
            source,
        })?;
        let prefix = self.in_progress_prefix();
        let mut aborted = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) && name.ends_with(IN_PROGRESS_SUFFIX) {
                let path = entry.path();
                fs::remove_file(&path).map_err(|source| SinkError::Io {
                    path,
                    action: "cannot remove an aborted in-progress part file",
                    source,
                })?;
                aborted += 1;
            }
        }
        if aborted > 0 {
            tracing::info!(operator = %self.operator, dir = %self.dir.display(), aborted, "aborted in-progress part files the restored checkpoint does not cover");
            self.sync_dir()?;
        }
        Ok(())
    }
}

/// One subtask's in-progress part file, opened on the first record after a pre-commit.
struct PartWriter {
    dir: PathBuf,
    /// `.<operator>.`
    prefix: String,
    /// `part-<operator>-<attempt>-<subtask>`
    stem: String,
    /// Number of the next part file.
    next: u64,
    /// The open part: its writer, in-progress name and published name.
    open: Option<(BufWriter<File>, String, String)>,
}

impl TransactionalWriter for PartWriter {
    fn write(&mut self, record: &Record) -> Result<(), SinkError> {
        if self.open.is_none() {
            let published = format!("{}-{}", self.stem, self.next);
            let in_progress = format!("{}{published}{IN_PROGRESS_SUFFIX}", self.prefix);
            let path = self.dir.join(&in_progress);
            let file = File::options()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|source| SinkError::Io {
                    path,
                    action: "cannot create in-progress part file",
                    source,
                })?;
            self.next += 1;
            self.open = Some((BufWriter::new(file), in_progress, published));
        }
        if let Some((w, name, _)) = &mut self.open {
            write_line(w, record).map_err(|source| SinkError::Io {
                path: self.dir.join(name.as_str()),
                action: "cannot write in-progress part file",
                source,
            })?;
        }
        Ok(())
    }

    fn pre_commit(&mut self, _checkpoint: Option<u64>) -> Result<Vec<Committable>, SinkError> {
        let Some((w, in_progress, published)) = self.open.take() else {
            return Ok(Vec::new());
        };
        let path = self.dir.join(&in_progress);
        let file = w.into_inner().map_err(|e| SinkError::Io {
            path: path.clone(),
            action: "cannot write in-progress part file",
            source: e.into_error(),
        })?;
        file.sync_data().map_err(|source| SinkError::Io {
            path,
            action: "cannot fsync in-progress part file",
            source,
        })?;
        Ok(vec![
            serde_json::json!({ "inProgress": in_progress, "published": published }),
        ])
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::payload::Payload;

    fn rec(key: u64) -> Record {
        Record {
            seq: key,
            key,
            value: 2 * key as i64,
            count: 1,
            created_us: 0,
            payload: Payload::None,
        }
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn parts_are_published_on_commit_and_unlisted_ones_aborted_on_recover() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let sink = FileSink::new("sink", &out);
        sink.recover(&[]).unwrap();
        let mut w = sink.create_writer(0, 1, "a1").unwrap();
        assert!(w.pre_commit(Some(1)).unwrap().is_empty(), "nothing written");
        w.write(&rec(1)).unwrap();
        w.write(&rec(2)).unwrap();
        let first = w.pre_commit(Some(2)).unwrap();
        w.write(&rec(3)).unwrap();
        let second = w.pre_commit(Some(3)).unwrap();
        w.write(&rec(4)).unwrap(); // never pre-committed: lost with the crash below
        assert_eq!(listing(&out).len(), 3);
        assert!(listing(&out).iter().all(|n| n.starts_with(".sink.")));
        sink.commit(&first).unwrap();
        sink.commit(&first).unwrap(); // idempotent
        assert_eq!(
            fs::read_to_string(out.join("part-sink-a1-0-0")).unwrap(),
            "1,1,2\n2,1,4\n"
        );
        // A crash before the second commit; the restored checkpoint lists it.
        drop(w);
        sink.recover(&second).unwrap();
        assert_eq!(listing(&out), vec!["part-sink-a1-0-0", "part-sink-a1-0-1"]);
        assert_eq!(
            fs::read_to_string(out.join("part-sink-a1-0-1")).unwrap(),
            "3,1,6\n"
        );
        // Another operator's in-progress files are not touched.
        fs::write(out.join(".other.part-x.inprogress"), "x").unwrap();
        sink.recover(&[]).unwrap();
        assert!(out.join(".other.part-x.inprogress").exists());
    }

    #[test]
    fn bad_or_missing_committables_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let sink = FileSink::new("sink", tmp.path());
        for c in [
            serde_json::json!({"inProgress": "../x.inprogress", "published": "part-x"}),
            serde_json::json!({"inProgress": ".other.part-x.inprogress", "published": "part-x"}),
            serde_json::json!("part-x"),
        ] {
            let e = sink.commit(&[c]).unwrap_err().to_string();
            assert!(e.contains("invalid committable"), "{e}");
        }
        let gone =
            serde_json::json!({"inProgress": ".sink.part-x.inprogress", "published": "part-x"});
        let e = sink.commit(&[gone]).unwrap_err().to_string();
        assert!(
            e.contains("neither the in-progress nor the published"),
            "{e}"
        );
    }
}
