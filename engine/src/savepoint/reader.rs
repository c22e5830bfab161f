//! Reads one savepoint state file for a restore in bounded memory: the file is read once, in
//! order, through one buffer of at most [`READ_BUFFER_BYTES`], to verify its size, CRC-32 and
//! chunk index and to check every `window` chunk's key order while building its sparse index
//! ([`SparseIndex`]). The key groups are then handed out as regions of the open file
//! ([`KeyGroupData::Stored`]), read on demand by positioned reads (`pread`) by whichever
//! subtask owns them after the restore: the heap backend reads a key group on its first use, the
//! disk backend reads it in place as a segment. So a restore never holds a whole state file in
//! memory, and state larger than memory restores into the disk backend.
//!
//! Event-time operators' blobs ([`ChunkEntry::blob`]) are read into memory here (their
//! operators decode them at start anyway), each into its own buffer of its own size.
//!
//! What is held per state file after the read: the open file, and per `window` key group its
//! sparse index (one key per [`crate::state::segment::BLOCK_ENTRIES`] entries, 1/1152 of the
//! state's bytes).

use std::cell::Cell;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::{ChunkEntry, FileEntry, SavepointError};
use crate::state::chunk::{ENTRY_BYTES, LEGACY_ENTRY_BYTES};
use crate::state::segment::{Segment, SparseIndex};
use crate::state::{KeyGroupData, KeyedState};

/// Size of the one read buffer used to verify a state file (bytes): 1 MiB rounded down to a
/// whole number of `window` entries (72 bytes).
pub const READ_BUFFER_BYTES: usize = (1 << 20) / ENTRY_BYTES * ENTRY_BYTES;

// Bytes currently held in restore read buffers on this thread, and the most held at once since
// the last [`reset_read_buffer_peak`] (a hook for tests and benchmarks). Per thread, because
// [`crate::savepoint::Savepoint::read`] reads every state file on the calling thread, and so
// that restores running at the same time on other threads (parallel tests) do not count.
thread_local! {
    static HELD: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

/// The most bytes held at once in restore read buffers on the calling thread since the last
/// [`reset_read_buffer_peak`] on it.
pub fn read_buffer_peak() -> usize {
    PEAK.with(Cell::get)
}

/// Starts a new peak measurement for [`read_buffer_peak`] on the calling thread.
pub fn reset_read_buffer_peak() {
    PEAK.with(|p| p.set(HELD.with(Cell::get)));
}

/// A read buffer whose size is counted in `HELD` while it lives (on the thread that made it;
/// it is never sent to another).
struct Counted(Vec<u8>);

impl Counted {
    fn new(len: usize) -> Counted {
        let held = HELD.with(|h| {
            h.set(h.get() + len);
            h.get()
        });
        PEAK.with(|p| p.set(p.get().max(held)));
        Counted(vec![0; len])
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get().saturating_sub(self.0.len())));
    }
}

/// Checks `entry`'s chunk index against a file of `len` bytes: chunks tile it in order, each
/// `window` chunk a whole number of `entry_bytes`-byte entries, no key group twice.
fn check_index(
    entry: &FileEntry,
    len: u64,
    entry_bytes: usize,
    bad: &impl Fn(String) -> SavepointError,
) -> Result<(), SavepointError> {
    let mut next = 0u64;
    let mut seen = std::collections::BTreeSet::new();
    for c in &entry.chunks {
        let end = c.offset.checked_add(c.bytes).filter(|e| *e <= len);
        let Some(end) = end.filter(|_| c.offset == next) else {
            return Err(bad(format!(
                "chunk index: key group {} at offset {} (+{} bytes) does not follow the previous chunk within the file",
                c.key_group, c.offset, c.bytes
            )));
        };
        next = end;
        if !c.blob && !c.bytes.is_multiple_of(entry_bytes as u64) {
            return Err(bad(format!(
                "key group {}: {} bytes is not a whole number of entries",
                c.key_group, c.bytes
            )));
        }
        if !seen.insert((c.blob, c.key_group)) {
            return Err(bad(format!(
                "chunk index lists key group {} twice",
                c.key_group
            )));
        }
    }
    if next != len {
        return Err(bad(format!("chunk index covers {next} of {len} bytes")));
    }
    Ok(())
}

/// Reads `c` (a `window` chunk) through `buf`, feeding the CRC-32 and the sparse index.
fn scan_chunk(
    file: &File,
    c: &ChunkEntry,
    buf: &mut [u8],
    crc: &mut crc32fast::Hasher,
) -> std::io::Result<Result<SparseIndex, crate::state::StateError>> {
    let mut index = SparseIndex::default();
    let mut order = Ok(());
    let (mut at, end) = (c.offset, c.offset + c.bytes);
    while at < end {
        let n = buf.len().min((end - at) as usize);
        file.read_exact_at(&mut buf[..n], at)?;
        crc.update(&buf[..n]);
        if order.is_ok() {
            order = index.feed(c.key_group, &buf[..n]);
        }
        at += n as u64;
    }
    Ok(order.map(|()| index))
}

/// Verifies the state file `file` (named `path` in errors) of a savepoint of format version
/// `version` against its manifest entry (size, CRC-32, chunk index, key order of every
/// `window` chunk) in one pass through a buffer of at most [`READ_BUFFER_BYTES`], and returns
/// its key groups as regions of the file. A version 2 file's `window` chunks are migrated
/// instead ([`migrate_version_2`]), into memory.
///
/// # Errors
/// [`SavepointError::Invalid`] naming `path`: truncated, checksum mismatch, a malformed chunk
/// index, keys out of order; [`SavepointError::Io`] when a read fails.
pub(super) fn load_state_file(
    path: &Path,
    entry: &FileEntry,
    file: File,
    version: u32,
) -> Result<KeyedState, SavepointError> {
    let bad = |reason: String| SavepointError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let len = file
        .metadata()
        .map_err(super::io(path, "cannot read state file metadata"))?
        .len();
    if len != entry.bytes {
        return Err(bad(format!(
            "truncated: {len} bytes, metadata says {}",
            entry.bytes
        )));
    }
    if entry.chunks.is_empty() {
        // A file of an earlier version: one postcard value, read whole.
        let mut bytes = vec![0; len as usize];
        file.read_exact_at(&mut bytes, 0)
            .map_err(super::io(path, "cannot read state file"))?;
        super::verify_file(path, entry, &bytes)?;
        return super::decode_state_file(path, entry, bytes::Bytes::from(bytes));
    }
    if version < 3 {
        check_index(entry, len, LEGACY_ENTRY_BYTES, &bad)?;
        return migrate_version_2(path, entry, &file);
    }
    check_index(entry, len, ENTRY_BYTES, &bad)?;
    let file = Arc::new(file);
    let mut buf = Counted::new(READ_BUFFER_BYTES.min(len as usize));
    let mut crc = crc32fast::Hasher::new();
    let mut state = KeyedState::default();
    let mut disorder = None;
    for c in &entry.chunks {
        if c.blob {
            let mut blob = vec![0; c.bytes as usize];
            file.read_exact_at(&mut blob, c.offset)
                .map_err(super::io(path, "cannot read state file"))?;
            crc.update(&blob);
            state.blobs.insert(c.key_group, blob);
            continue;
        }
        let scanned = match scan_chunk(&file, c, &mut buf.0, &mut crc) {
            Ok(s) => s,
            Err(e) => return Err(super::io(path, "cannot read state file")(e)),
        };
        match scanned {
            Ok(index) => {
                let (index, open_panes) = index.finish();
                let seg = Segment::region(
                    file.clone(),
                    path.to_path_buf(),
                    c.offset,
                    c.bytes as usize,
                    index,
                    open_panes,
                );
                state
                    .groups
                    .insert(c.key_group, KeyGroupData::Stored(Arc::new(seg)));
            }
            Err(e) => {
                disorder.get_or_insert(e);
            }
        }
    }
    drop(buf);
    let crc = crc.finalize();
    if crc != entry.crc32 {
        return Err(bad(format!(
            "checksum mismatch: CRC-32 {crc:08x}, metadata says {:08x}",
            entry.crc32
        )));
    }
    if let Some(e) = disorder {
        return Err(bad(format!("cannot decode state: {e}")));
    }
    Ok(state)
}
/// Reads a chunked state file of savepoint format version 2 (its index already checked against
/// the file's length) whole, verifies its CRC-32, and migrates every `window` chunk to this
/// version's entries ([`crate::state::chunk::migrate_legacy`]), held in memory as
/// [`KeyGroupData::Encoded`]: a version 2 restore costs the state's size in memory once; the
/// next checkpoint writes it in the current format.
///
/// # Errors
/// [`SavepointError::Invalid`] naming `path` (checksum mismatch, a malformed chunk), with
/// nothing returned; [`SavepointError::Io`] when the read fails.
fn migrate_version_2(
    path: &Path,
    entry: &FileEntry,
    file: &File,
) -> Result<KeyedState, SavepointError> {
    let bad = |reason: String| SavepointError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let mut bytes = vec![0; entry.bytes as usize];
    file.read_exact_at(&mut bytes, 0)
        .map_err(super::io(path, "cannot read state file"))?;
    super::verify_file(path, entry, &bytes)?;
    let mut state = KeyedState::default();
    for c in &entry.chunks {
        let region = &bytes[c.offset as usize..(c.offset + c.bytes) as usize];
        if c.blob {
            state.blobs.insert(c.key_group, region.to_vec());
            continue;
        }
        let (migrated, open_panes) = crate::state::chunk::migrate_legacy(c.key_group, region)
            .map_err(|e| bad(format!("cannot migrate format version 2 state: {e}")))?;
        state.groups.insert(
            c.key_group,
            KeyGroupData::Encoded {
                bytes: migrated,
                open_panes,
            },
        );
    }
    Ok(state)
}
