//! Sorted segment files of the disk state backend: one immutable file per key group holding
//! the key group's entries in the savepoint chunk format ([`chunk`]: fixed 72-byte entries in
//! key order), so that a checkpoint or savepoint copies a segment's bytes as they are instead
//! of reading and re-encoding every key (as Flink's RocksDB native savepoints copy SST files).
//!
//! A point read goes through a sparse in-memory index (the first key of every block of
//! [`BLOCK_ENTRIES`] entries) and one positioned read of that block (`pread`, no mmap).
//! A segment file is removed when its last holder (the backend or a snapshot) drops it; the
//! directory holding a backend's segments is removed when its last segment and the backend are
//! gone.
//!
//! A segment can also be a **region of a savepoint's state file** ([`Segment::region`]): a
//! restored key group is read in place, through the same sparse index and positioned reads,
//! from the savepoint file that [`crate::savepoint::Savepoint::read`] verified (the open file
//! handle keeps the data readable even if the checkpoint is deleted meanwhile). Such a segment
//! is never removed on drop.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use super::chunk::{self, ENTRY_BYTES};
use super::{KeyState, StateError};

/// Entries per block of the sparse index (one `pread` of at most 128 × 72 = 9 KiB per point
/// read).
pub const BLOCK_ENTRIES: usize = 128;

/// A backend's segment directory; removed (best effort) when the last holder drops it.
#[derive(Debug)]
pub struct SegmentDir {
    path: PathBuf,
}

impl SegmentDir {
    /// Creates directory `path`.
    ///
    /// # Errors
    /// [`StateError::Disk`] when it cannot be created.
    pub fn create(path: PathBuf) -> Result<Arc<SegmentDir>, StateError> {
        std::fs::create_dir_all(&path).map_err(|e| StateError::Disk {
            path: path.clone(),
            action: "cannot create the segment directory",
            reason: e.to_string(),
        })?;
        Ok(Arc::new(SegmentDir { path }))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SegmentDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// One key group's entries in an immutable file ([`chunk`] form, checked when written), or in
/// a region of a savepoint's state file.
#[derive(Debug)]
pub struct Segment {
    file: Arc<File>,
    path: PathBuf,
    /// Byte offset of the entries in the file (0 for the backend's own segment files).
    offset: u64,
    len: usize,
    /// First key of each block of [`BLOCK_ENTRIES`] entries.
    index: Vec<u64>,
    /// Some entry has an open window pane.
    open_panes: bool,
    /// The backend's segment directory; `None` for a region of a savepoint file (not removed
    /// on drop).
    dir: Option<Arc<SegmentDir>>,
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.dir.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Segment {
    /// Writes `bytes` (a key group's chunk, keys strictly increasing, as checked by
    /// [`chunk::check`]) as file `name` in `dir`. Not fsynced: segments are a working copy;
    /// recovery goes through checkpoints.
    ///
    /// # Errors
    /// [`StateError::Disk`] when the file cannot be created or written.
    pub fn write(dir: &Arc<SegmentDir>, name: &str, bytes: &[u8]) -> Result<Segment, StateError> {
        let path = dir.path.join(name);
        let err = |action: &'static str| {
            let path = path.clone();
            move |e: std::io::Error| StateError::Disk {
                path,
                action,
                reason: e.to_string(),
            }
        };
        let mut file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(err("cannot create a segment file"))?;
        file.write_all(bytes)
            .map_err(err("cannot write a segment file"))?;
        let mut open_panes = false;
        chunk::for_each(bytes, |_, v| open_panes |= chunk::value_has_open_pane(v));
        let index = bytes
            .chunks(BLOCK_ENTRIES * ENTRY_BYTES)
            .map(|b| chunk::entry_key(b, 0))
            .collect();
        Ok(Segment {
            file: Arc::new(file),
            path,
            offset: 0,
            len: bytes.len(),
            index,
            open_panes,
            dir: Some(dir.clone()),
        })
    }

    /// A key group's chunk at `offset..offset + len` of the already verified file `file`
    /// (`path` names it in errors): keys strictly increasing, `index` the first key of every
    /// block of [`BLOCK_ENTRIES`] entries (as [`SparseIndex`] builds it while the chunk is
    /// read once). Nothing is read here; the file is not removed on drop.
    pub fn region(
        file: Arc<File>,
        path: PathBuf,
        offset: u64,
        len: usize,
        index: Vec<u64>,
        open_panes: bool,
    ) -> Segment {
        Segment {
            file,
            path,
            offset,
            len,
            index,
            open_panes,
            dir: None,
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the segment holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of entries.
    pub fn keys(&self) -> usize {
        self.len / ENTRY_BYTES
    }

    /// Whether this is a region of a savepoint's state file ([`Segment::region`]) rather than
    /// a backend's own segment file.
    pub fn is_region(&self) -> bool {
        self.dir.is_none()
    }

    /// Whether some entry has an open window pane.
    pub fn open_panes(&self) -> bool {
        self.open_panes
    }

    fn read_at(&self, at: usize, len: usize) -> Result<Vec<u8>, StateError> {
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, self.offset + at as u64)
            .map_err(|e| StateError::Disk {
                path: self.path.clone(),
                action: "cannot read a segment file",
                reason: e.to_string(),
            })?;
        Ok(buf)
    }

    /// The whole segment ([`chunk`] form), read from the file (the page cache, usually).
    ///
    /// # Errors
    /// [`StateError::Disk`] when the read fails.
    pub fn read_all(&self) -> Result<Bytes, StateError> {
        Ok(Bytes::from(self.read_at(0, self.len)?))
    }

    /// Appends the whole segment ([`chunk`] form) to `out`, read from the file.
    ///
    /// # Errors
    /// [`StateError::Disk`] when the read fails.
    pub fn read_into(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
        let at = out.len();
        out.resize(at + self.len, 0);
        self.file
            .read_exact_at(&mut out[at..], self.offset)
            .map_err(|e| StateError::Disk {
                path: self.path.clone(),
                action: "cannot read a segment file",
                reason: e.to_string(),
            })
    }

    /// The state of `key`: a binary search of the sparse index, then one read of the block.
    ///
    /// # Errors
    /// [`StateError::Disk`] when the read fails.
    pub fn find(&self, key: u64) -> Result<Option<KeyState>, StateError> {
        let block = self.index.partition_point(|first| *first <= key);
        let Some(block) = block.checked_sub(1) else {
            return Ok(None);
        };
        let at = block * BLOCK_ENTRIES * ENTRY_BYTES;
        let len = (BLOCK_ENTRIES * ENTRY_BYTES).min(self.len - at);
        Ok(chunk::find(&self.read_at(at, len)?, key))
    }
}

/// Builds a chunk's sparse index, key-order check and open-pane flag while the chunk passes
/// by in pieces (each a whole number of entries), so that a restored chunk is checked and
/// indexed in the same single read that verifies its checksum.
#[derive(Debug, Default)]
pub struct SparseIndex {
    index: Vec<u64>,
    entries: usize,
    last: Option<u64>,
    open_panes: bool,
}

impl SparseIndex {
    /// Takes the next `piece` of the chunk (a whole number of entries).
    ///
    /// # Errors
    /// [`StateError::Decode`] naming `key_group` when a key is not greater than the one
    /// before it.
    pub fn feed(&mut self, key_group: u32, piece: &[u8]) -> Result<(), StateError> {
        let mut bad = None;
        chunk::for_each(piece, |key, v| {
            if bad.is_some() {
                return;
            }
            if self.last.is_some_and(|l| key <= l) {
                bad = Some(key);
                return;
            }
            if self.entries.is_multiple_of(BLOCK_ENTRIES) {
                self.index.push(key);
            }
            self.entries += 1;
            self.last = Some(key);
            self.open_panes |= chunk::value_has_open_pane(v);
        });
        match bad {
            Some(key) => Err(StateError::Decode {
                key_group,
                reason: format!("keys out of order at key {key} (entry {})", self.entries),
            }),
            None => Ok(()),
        }
    }

    /// The index and whether some entry has an open pane.
    pub fn finish(self) -> (Vec<u64>, bool) {
        (self.index, self.open_panes)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn finds_every_key_reads_back_and_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SegmentDir::create(tmp.path().join("s.seg")).unwrap();
        let entries: Vec<(u64, KeyState)> = (0..1000u64)
            .map(|i| {
                (
                    3 * i + 1,
                    KeyState {
                        total_count: i,
                        pane_count: u64::from(i == 999),
                        ..KeyState::default()
                    },
                )
            })
            .collect();
        let bytes = chunk::encode(entries.clone().into_iter());
        let seg = Segment::write(&dir, "7-0", &bytes).unwrap();
        assert_eq!(seg.keys(), 1000);
        assert!(seg.open_panes());
        assert_eq!(seg.read_all().unwrap(), bytes);
        let mut into = vec![7u8];
        seg.read_into(&mut into).unwrap();
        assert_eq!((into[0], &into[1..]), (7, &bytes[..]));
        for (k, s) in &entries {
            assert_eq!(seg.find(*k).unwrap(), Some(*s));
            assert_eq!(seg.find(k + 1).unwrap(), None);
        }
        assert_eq!(seg.find(0).unwrap(), None);
        let path = tmp.path().join("s.seg");
        drop(dir);
        assert!(path.exists(), "a live segment keeps its directory");
        drop(seg);
        assert!(!path.exists());
    }
}
