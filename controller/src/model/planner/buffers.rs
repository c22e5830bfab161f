//! The buffers a job graph's models reuse: a model takes its largest arrays from its graph's
//! pool when it is made and puts them back when dropped.

use super::*;

/// A [`Model`]'s largest arrays (the keyed operators' key-group loads and their prefix sums,
/// the share and tail memos: tens of KB each for a 200-operator job). Only their allocations
/// pass from one model to the next: a model refills the key-group arrays and resets the memos
/// to all NaN ([`NanMemo::reset`]) before reading them.
#[derive(Default)]
pub(super) struct ModelBuffers {
    pub(super) kg_loads: Vec<f64>,
    pub(super) kg_prefixes: Vec<f64>,
    pub(super) share_memo: NanMemo,
    pub(super) tail_memo: NanMemo,
    /// The window's per-subtask figures ([`estimate_flat`]).
    pub(super) figures: SubtaskFigures,
}

/// The [`ModelBuffers`] of one [`JobGraph`]'s models: a model takes them when it is made and
/// puts them back when dropped (a model made meanwhile starts with empty ones). A cache of
/// allocations, never of values: it takes no part in the graph's equality.
#[derive(Default)]
pub(super) struct BufferPool(pub(super) std::sync::Mutex<ModelBuffers>);

impl BufferPool {
    /// The kept buffers, leaving empty ones (also after a panic poisoned the lock).
    pub(super) fn take(&self) -> ModelBuffers {
        self.0
            .lock()
            .map(|mut b| std::mem::take(&mut *b))
            .unwrap_or_default()
    }

    /// Keeps `buffers` for the next model.
    pub(super) fn put(&self, buffers: ModelBuffers) {
        if let Ok(mut b) = self.0.lock() {
            *b = buffers;
        }
    }
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BufferPool")
    }
}

impl PartialEq for BufferPool {
    fn eq(&self, _: &BufferPool) -> bool {
        true
    }
}

impl Drop for Model {
    /// Puts the model's largest arrays back into its graph's [`BufferPool`].
    fn drop(&mut self) {
        self.graph.buffers.put(ModelBuffers {
            kg_loads: std::mem::take(&mut self.kg_loads),
            kg_prefixes: std::mem::take(&mut self.kg_prefixes),
            share_memo: std::mem::take(self.share_memo.get_mut()),
            tail_memo: std::mem::take(self.tail_memo.get_mut()),
            figures: std::mem::take(&mut self.figures),
        });
    }
}
