//! The state backend interface a keyed window subtask uses, and the per-job choice between
//! the heap and the disk backend.

use super::disk::DiskBackend;
use super::heap::HeapBackend;
use super::{KeyState, KeyedState, StateError};
use crate::spec::{StateBackendKind, StateSpec};

/// What a keyed subtask needs from its state: per-key access, the keys with an open window
/// pane, and consistent snapshots by key group.
pub trait KeyedStateBackend {
    /// State of `key` (in `key_group`, which must be one this subtask owns), created empty on
    /// first use. Marks the key as possibly having an open pane.
    ///
    /// # Errors
    /// [`StateError`] when a restored key group cannot be decoded or the disk fails.
    fn entry(&mut self, key_group: u32, key: u64) -> Result<&mut KeyState, StateError>;

    /// Calls `emit(key, state)` for every key whose pane is open (`pane_count > 0`), in key
    /// order within each key group, then closes those panes (pane fields back to 0).
    ///
    /// # Errors
    /// As [`KeyedStateBackend::entry`].
    fn fire_panes(&mut self, emit: &mut dyn FnMut(u64, &KeyState)) -> Result<(), StateError>;

    /// A consistent point-in-time view of every key group for a checkpoint, taken without
    /// copying the state: the caller encodes and writes it on another thread while this
    /// backend keeps changing.
    ///
    /// # Errors
    /// [`StateError`] when the disk backend cannot commit its cache.
    fn snapshot(&mut self) -> Result<KeyedState, StateError>;
}

/// Who owns a backend: names the disk backend's working file.
#[derive(Debug, Clone)]
pub struct StateOwner {
    /// Job name.
    pub job: String,
    /// Operator name.
    pub operator: String,
    /// Subtask index.
    pub subtask: u32,
    /// Where the disk backend reports the bytes of restored state it has not loaded into its
    /// database yet (the subtask's `streamscale_state_restored_unloaded_bytes`), if anywhere.
    pub unloaded_gauge: Option<prometheus::Gauge>,
}

/// The backend of one keyed subtask, as chosen by the job's `state` section.
#[derive(Debug)]
pub enum StateBackend {
    /// In memory.
    Heap(HeapBackend),
    /// On disk (redb), with a write-back cache.
    Disk(Box<DiskBackend>),
}

impl StateBackend {
    /// Opens the backend `spec` selects for `owner`, holding `restored` (the key groups this
    /// subtask owns, kept encoded: the heap backend decodes a key group on first use, the disk
    /// backend reads keys through from the encoded chunks and loads them into its database
    /// after the first records, a slice per commit).
    ///
    /// # Errors
    /// [`StateError::Disk`] when the disk backend's directory or file cannot be created.
    pub fn open(
        spec: &StateSpec,
        owner: &StateOwner,
        max_parallelism: u32,
        restored: KeyedState,
    ) -> Result<StateBackend, StateError> {
        Ok(match spec.backend {
            StateBackendKind::Heap => {
                StateBackend::Heap(HeapBackend::new(max_parallelism, restored))
            }
            StateBackendKind::Disk => {
                StateBackend::Disk(Box::new(DiskBackend::open(spec, owner, restored)?))
            }
        })
    }
}

impl KeyedStateBackend for StateBackend {
    #[inline]
    fn entry(&mut self, key_group: u32, key: u64) -> Result<&mut KeyState, StateError> {
        match self {
            StateBackend::Heap(h) => h.entry(key_group, key),
            StateBackend::Disk(d) => d.entry(key_group, key),
        }
    }

    fn fire_panes(&mut self, emit: &mut dyn FnMut(u64, &KeyState)) -> Result<(), StateError> {
        match self {
            StateBackend::Heap(h) => h.fire_panes(emit),
            StateBackend::Disk(d) => d.fire_panes(emit),
        }
    }

    fn snapshot(&mut self) -> Result<KeyedState, StateError> {
        match self {
            StateBackend::Heap(h) => h.snapshot(),
            StateBackend::Disk(d) => d.snapshot(),
        }
    }
}
