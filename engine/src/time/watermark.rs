//! Input watermark of a subtask: the minimum over its input channels.
//!
//! Every upstream subtask is one channel (numbered job-wide). A subtask's input watermark is
//! the minimum, over all `expected` upstream channels, of the largest watermark received on
//! each; until every channel has sent one it is "none" (no event time has passed).

use std::collections::BTreeMap;

/// Tracks the watermarks of a subtask's input channels.
#[derive(Debug, Clone)]
pub struct WatermarkTracker {
    expected: usize,
    channels: BTreeMap<u32, u64>,
    current: Option<u64>,
}

impl WatermarkTracker {
    /// A tracker for a subtask fed by `expected` upstream subtasks (the sum of its input
    /// operators' parallelism).
    pub fn new(expected: usize) -> WatermarkTracker {
        WatermarkTracker {
            expected: expected.max(1),
            channels: BTreeMap::new(),
            current: None,
        }
    }

    /// The input watermark (ms since the Unix epoch), or `None` before every channel has sent one.
    pub fn current(&self) -> Option<u64> {
        self.current
    }

    /// Records watermark `ms` on `channel`; returns the new input watermark if it advanced.
    pub fn update(&mut self, channel: u32, ms: u64) -> Option<u64> {
        let slot = self.channels.entry(channel).or_insert(ms);
        *slot = (*slot).max(ms);
        if self.channels.len() < self.expected {
            return None;
        }
        let min = self.channels.values().copied().min()?;
        if self.current.is_some_and(|c| c >= min) {
            return None;
        }
        self.current = Some(min);
        Some(min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_watermark_is_the_minimum_over_all_channels() {
        let mut t = WatermarkTracker::new(2);
        assert_eq!(t.update(7, 100), None, "one channel has not reported yet");
        assert_eq!(t.update(9, 50), Some(50));
        assert_eq!(
            t.update(9, 40),
            None,
            "a channel's watermark never goes back"
        );
        assert_eq!(t.update(9, 120), Some(100));
        assert_eq!(t.update(7, 110), Some(110));
        assert_eq!(t.current(), Some(110));
    }
}
