//! Streams one savepoint state file to disk: key groups are encoded on several threads into a
//! small pool of reused buffers and written in key-group order by the calling thread while a
//! third thread keeps the device busy with `fdatasync` every [`SYNC_EVERY`] bytes.
//!
//! Why (measured at 1 GB of state, 20.8 M keys, `BENCHMARKS.md`): encoding every key group
//! into its own buffer first and writing afterwards made the kernel hand the process 1 GB of
//! fresh zeroed pages (`clear_page_erms` was a third of the stop-with-savepoint's samples),
//! and one `fsync` at the end left the whole file for the device to write after everything
//! else was done. Here memory stays at `pool` buffers of one key group each, and writeback
//! overlaps encoding and copying, so the file is on disk shortly after its last byte is
//! written.
//!
//! The file's CRC-32 is combined from the key groups' CRCs (computed by the encoding threads)
//! and its chunk index is built in file order ([`IndexBuilder`], shared with
//! [`super::Savepoint::stream_state_file`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};

use super::{FileEntry, IndexBuilder, SavepointError, io};
use crate::state::{KeyGroupData, StateError};

/// Bytes written between two background `fdatasync`s (which start the device writing the
/// file's dirty pages while the rest is encoded).
pub const SYNC_EVERY: u64 = 64 << 20;

/// One unit of encoding work: a key group of one operator.
pub(super) enum Work<'a> {
    /// `window` state.
    Keys(&'a KeyGroupData),
    /// An event-time operator's encoded blob.
    Blob(&'a [u8]),
}

/// A key group's bytes: in a pool buffer, or shared with the state (already encoded).
enum Piece {
    Owned(Vec<u8>),
    Shared(Bytes, Vec<u8>),
}

impl Piece {
    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Owned(v) => v,
            Piece::Shared(b, _) => b,
        }
    }

    fn into_buffer(self) -> Vec<u8> {
        match self {
            Piece::Owned(v) | Piece::Shared(_, v) => v,
        }
    }
}

/// An encoded key group: index in the work list, bytes, CRC-32 state, pane flag.
type Done = (usize, Result<(Piece, crc32fast::Hasher, bool), String>);

/// How to stream a file: encoding threads and buffers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Streaming {
    /// Encoding threads (at least 1).
    pub threads: usize,
    /// Buffers in flight (at least `threads`); bounds the writer's memory to this many key
    /// groups.
    pub buffers: usize,
    /// Bytes between background `fdatasync`s.
    pub sync_every: u64,
}

impl Streaming {
    /// One encoding thread per core and two buffers per thread.
    pub fn for_this_machine() -> Streaming {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Streaming {
            threads,
            buffers: 2 * threads + 2,
            sync_every: SYNC_EVERY,
        }
    }
}

fn encode_one(work: &Work<'_>, mut buf: Vec<u8>) -> Result<(Piece, bool), (StateError, Vec<u8>)> {
    buf.clear();
    match work {
        Work::Blob(b) => {
            buf.extend_from_slice(b);
            Ok((Piece::Owned(buf), false))
        }
        Work::Keys(d) => match d.encode_into(&mut buf) {
            Ok((Some(shared), open)) => Ok((Piece::Shared(shared, buf), open)),
            Ok((None, open)) => Ok((Piece::Owned(buf), open)),
            Err(e) => Err((e, buf)),
        },
    }
}

/// Encoding thread: takes a buffer, then the next key group, until none is left or the
/// writer gave up (the pool's sender is gone).
fn encoder(
    items: &[(u32, Work<'_>)],
    next: &AtomicUsize,
    pool: &Receiver<Vec<u8>>,
    done: &Sender<Done>,
    abort: &AtomicBool,
) {
    while !abort.load(Ordering::Relaxed) {
        let Ok(buf) = pool.recv() else { return };
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some((kg, work)) = items.get(i) else {
            return;
        };
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| encode_one(work, buf)));
        let out = match result {
            Ok(Ok((piece, open))) => {
                let mut h = crc32fast::Hasher::new();
                h.update(piece.bytes());
                Ok((piece, h, open))
            }
            Ok(Err((e, _))) => Err(format!("cannot encode state: {e}")),
            Err(_) => Err(format!("encoding key group {kg} panicked")),
        };
        if done.send((i, out)).is_err() {
            return;
        }
    }
}

/// Background `fdatasync`s of `file` on request (requests arriving meanwhile are merged);
/// the first error is kept for the writer (which would not see it again in its own `fsync`:
/// a writeback error is reported once per open file).
fn syncer(file: File, requests: Receiver<()>, error: &Mutex<Option<std::io::Error>>) {
    while requests.recv().is_ok() {
        while requests.try_recv().is_ok() {}
        if let Err(e) = file.sync_data() {
            if let Ok(mut slot) = error.lock() {
                slot.get_or_insert(e);
            }
            return;
        }
    }
}

/// Writes `items` (key groups in file order) as the state file `path` (created; must not
/// exist), fsynced, and returns its entry for the manifest (size, CRC-32, chunk index).
///
/// # Errors
/// [`SavepointError::Io`] when the file cannot be created, written or synced;
/// [`SavepointError::Invalid`] when a key group cannot be encoded. The file may be left
/// partial; the caller removes its temporary directory.
pub(super) fn write_state_file(
    path: &Path,
    name: &str,
    items: &[(u32, Work<'_>)],
    how: Streaming,
) -> Result<FileEntry, SavepointError> {
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io(path, "cannot create file"))?;
    let sync_file = file.try_clone().map_err(io(path, "cannot open file"))?;
    let threads = how.threads.max(1).min(items.len().max(1));
    let buffers = how.buffers.max(threads);
    let next = AtomicUsize::new(0);
    let abort = AtomicBool::new(false);
    let sync_error = Mutex::new(None);
    let bad = |reason: String| SavepointError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let entry = std::thread::scope(|scope| {
        let (pool_tx, pool_rx) = bounded::<Vec<u8>>(buffers);
        for _ in 0..buffers {
            let _ = pool_tx.send(Vec::new());
        }
        let (done_tx, done_rx) = unbounded::<Done>();
        for _ in 0..threads {
            let (pool_rx, done_tx, next, abort) = (pool_rx.clone(), done_tx.clone(), &next, &abort);
            scope.spawn(move || encoder(items, next, &pool_rx, &done_tx, abort));
        }
        drop((pool_rx, done_tx));
        let (sync_tx, sync_rx) = unbounded::<()>();
        let sync_error = &sync_error;
        let sync_thread = scope.spawn(move || syncer(sync_file, sync_rx, sync_error));
        let result = (|| {
            let mut pending: BTreeMap<usize, (Piece, crc32fast::Hasher, bool)> = BTreeMap::new();
            let mut index = IndexBuilder::new(name, items.len());
            let mut since_sync = 0u64;
            let mut written = 0usize;
            while written < items.len() {
                let i = written;
                let Some((piece, h, open)) = pending.remove(&i) else {
                    let (j, out) = done_rx
                        .recv()
                        .map_err(|_| bad(format!("key group {} was not encoded", items[i].0)))?;
                    pending.insert(j, out.map_err(&bad)?);
                    continue;
                };
                let bytes = piece.bytes();
                file.write_all(bytes)
                    .map_err(io(path, "cannot write file"))?;
                index.push(
                    items[i].0,
                    bytes.len() as u64,
                    &h,
                    matches!(items[i].1, Work::Blob(_)),
                    open,
                );
                written += 1;
                since_sync += bytes.len() as u64;
                let _ = pool_tx.try_send(piece.into_buffer());
                if since_sync >= how.sync_every {
                    since_sync = 0;
                    let _ = sync_tx.send(());
                }
            }
            Ok(index.finish())
        })();
        abort.store(true, Ordering::Relaxed);
        drop((pool_tx, done_rx, sync_tx));
        let _ = sync_thread.join();
        result
    })?;
    if let Some(e) = sync_error.lock().ok().and_then(|mut e| e.take()) {
        return Err(io(path, "cannot fsync file")(e));
    }
    file.sync_all().map_err(io(path, "cannot fsync file"))?;
    Ok(entry)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::state::{KeyState, chunk};
    use std::sync::Arc;

    /// Key groups of different sizes in every form the writer takes: maps, encoded chunks
    /// (written without a copy), empty ones, and blobs after them.
    type Groups = Vec<(u32, KeyGroupData)>;
    type Blobs = Vec<(u32, Vec<u8>)>;

    fn state() -> (Groups, Blobs) {
        let mut groups = Vec::new();
        for kg in 0..40u32 {
            let map: BTreeMap<u64, KeyState> = (0..u64::from(kg * 7 % 23))
                .map(|k| {
                    (
                        k * 128 + u64::from(kg),
                        KeyState {
                            total_count: k + 1,
                            pane_count: u64::from(kg == 3),
                            ..KeyState::default()
                        },
                    )
                })
                .collect();
            let data = if kg % 3 == 0 {
                let bytes = chunk::encode(map.iter().map(|(k, s)| (*k, *s)));
                KeyGroupData::Encoded {
                    bytes,
                    open_panes: kg == 3,
                }
            } else {
                KeyGroupData::Map(Arc::new(map))
            };
            groups.push((kg, data));
        }
        let blobs = vec![(1, vec![1, 2, 3]), (7, vec![]), (9, vec![9; 100])];
        (groups, blobs)
    }

    #[test]
    fn streams_the_same_bytes_index_and_crc_with_any_threads_and_buffers() {
        let (groups, blobs) = state();
        let mut items: Vec<(u32, Work<'_>)> =
            groups.iter().map(|(kg, d)| (*kg, Work::Keys(d))).collect();
        items.extend(blobs.iter().map(|(kg, b)| (*kg, Work::Blob(b))));
        let mut expected = Vec::new();
        for (_, w) in &items {
            match w {
                Work::Keys(d) => expected.extend_from_slice(&d.encode().unwrap().0),
                Work::Blob(b) => expected.extend_from_slice(b),
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let mut first: Option<FileEntry> = None;
        for (threads, buffers, sync_every) in
            [(1, 1, 1), (3, 3, 100), (4, 10, SYNC_EVERY), (2, 1, 0)]
        {
            let path = dir.path().join(format!("s-{threads}-{buffers}.bin"));
            let how = Streaming {
                threads,
                buffers,
                sync_every,
            };
            let entry = write_state_file(&path, "state-w.bin", &items, how).unwrap();
            let written = std::fs::read(&path).unwrap();
            assert_eq!(written, expected, "threads {threads}, buffers {buffers}");
            assert_eq!(entry.bytes, expected.len() as u64);
            assert_eq!(entry.crc32, crc32fast::hash(&expected));
            assert_eq!(entry.chunks.len(), items.len());
            let mut at = 0;
            for (c, (kg, w)) in entry.chunks.iter().zip(&items) {
                assert_eq!((c.key_group, c.offset), (*kg, at));
                assert_eq!(c.blob, matches!(w, Work::Blob(_)));
                assert_eq!(c.open_panes, !c.blob && *kg == 3);
                at += c.bytes;
            }
            if let Some(f) = &first {
                assert_eq!(f, &entry);
            }
            first = Some(entry);
        }
    }

    #[test]
    fn an_existing_file_is_not_overwritten() {
        let (groups, _) = state();
        let items: Vec<(u32, Work<'_>)> =
            groups.iter().map(|(kg, d)| (*kg, Work::Keys(d))).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state-w.bin");
        std::fs::write(&path, b"good").unwrap();
        let err = write_state_file(&path, "state-w.bin", &items, Streaming::for_this_machine())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("state-w.bin") && err.contains("cannot create file"),
            "{err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"good");
    }
}
