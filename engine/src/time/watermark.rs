//! Input watermark of a subtask: the minimum over its input channels.
//!
//! Every upstream subtask is one channel (numbered job-wide). A subtask's input watermark is
//! the minimum, over all `expected` upstream channels, of the largest watermark received on
//! each; until every channel has sent one it is "none" (no event time has passed).
//!
//! An ended channel counts as `+∞` (`u64::MAX`), whatever it sent last: nothing follows on
//! it, so its last watermark must not hold back the minimum over the channels that still
//! run. A finished Flink task sends the final watermark `Long.MAX_VALUE` before its end of
//! input (FLIP-147); so do this engine's finished sources and event-time stages, and
//! [`WatermarkTracker::end`] makes the end of a channel count as that final watermark even
//! when the sender did not send it.

use std::collections::BTreeMap;

/// Tracks the watermarks of a subtask's input channels.
#[derive(Debug, Clone)]
pub struct WatermarkTracker {
    expected: usize,
    channels: BTreeMap<u32, u64>,
    /// Channels that said they are idle ([`WatermarkTracker::idle`]) and sent no watermark
    /// since.
    idle: std::collections::BTreeSet<u32>,
    current: Option<u64>,
}

impl WatermarkTracker {
    /// A tracker for a subtask fed by `expected` upstream subtasks (the sum of its input
    /// operators' parallelism).
    pub fn new(expected: usize) -> WatermarkTracker {
        WatermarkTracker {
            expected: expected.max(1),
            channels: BTreeMap::new(),
            idle: std::collections::BTreeSet::new(),
            current: None,
        }
    }

    /// The input watermark (ms since the Unix epoch), or `None` before every channel has sent one.
    pub fn current(&self) -> Option<u64> {
        self.current
    }

    /// Records the end of `channel` (nothing follows on it): its watermark becomes `+∞`
    /// (`u64::MAX`, the final watermark), so that its last one no longer holds back the
    /// input watermark. Returns the new input watermark if it advanced.
    pub fn end(&mut self, channel: u32) -> Option<u64> {
        self.update(channel, u64::MAX)
    }

    /// Records that `channel` is idle (a Kafka source subtask whose partitions all had no
    /// record for the idle timeout, or that owns none; Flink's `WatermarkStatus.IDLE`): it
    /// counts as having reported and is left out of the minimum until its next watermark.
    /// Returns the new input watermark
    /// if it advanced. When every channel is idle, the input watermark is the largest any of
    /// them sent.
    pub fn idle(&mut self, channel: u32) -> Option<u64> {
        self.idle.insert(channel);
        self.advance()
    }

    /// Records watermark `ms` on `channel` (active again if it was idle); returns the new input
    /// watermark if it advanced.
    pub fn update(&mut self, channel: u32, ms: u64) -> Option<u64> {
        self.idle.remove(&channel);
        let slot = self.channels.entry(channel).or_insert(ms);
        *slot = (*slot).max(ms);
        self.advance()
    }

    /// The minimum over the active channels, if every channel has reported and it advanced.
    fn advance(&mut self) -> Option<u64> {
        let reported = self.channels.len()
            + self
                .idle
                .iter()
                .filter(|c| !self.channels.contains_key(c))
                .count();
        if reported < self.expected {
            return None;
        }
        let active = self
            .channels
            .iter()
            .filter(|(c, _)| !self.idle.contains(c))
            .map(|(_, ms)| *ms)
            .min();
        // Every channel idle: nothing will advance them, so the largest watermark any of them
        // sent holds (Flink's StatusWatermarkValve does the same).
        let min = match active {
            Some(m) => m,
            None => self.channels.values().copied().max()?,
        };
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

    #[test]
    fn an_ended_channels_last_watermark_does_not_hold_back_the_others() {
        let mut t = WatermarkTracker::new(3);
        assert_eq!(t.update(1, 100), None);
        assert_eq!(t.update(2, 300), None);
        // Channel 3 ends without having sent a watermark: it counts as +∞.
        assert_eq!(t.end(3), Some(100));
        assert_eq!(t.update(1, 200), Some(200));
        // Channel 2 ends after its last watermark 300: the minimum follows channel 1 alone.
        assert_eq!(t.end(2), None);
        assert_eq!(t.update(1, 1000), Some(1000));
        assert_eq!(t.update(1, 5000), Some(5000));
        // A final watermark before the end changes nothing more.
        assert_eq!(t.update(1, u64::MAX), Some(u64::MAX));
        assert_eq!(t.end(1), None);
        assert_eq!(t.current(), Some(u64::MAX));
    }

    #[test]
    fn an_idle_channel_is_left_out_until_it_sends_a_watermark_again() {
        let mut t = WatermarkTracker::new(3);
        assert_eq!(t.update(1, 100), None);
        // Channel 3 is idle from the start (a subtask without partitions): it has reported.
        assert_eq!(t.idle(3), None, "channel 2 has not reported");
        assert_eq!(t.update(2, 300), Some(100));
        assert_eq!(t.update(1, 400), Some(300));
        // Channel 2 goes idle: the minimum follows channel 1 alone.
        assert_eq!(t.idle(2), Some(400));
        assert_eq!(t.update(1, 500), Some(500));
        // Every channel idle: the largest watermark any of them sent (channel 1's 500).
        assert_eq!(t.idle(1), None);
        assert_eq!(t.current(), Some(500));
        let mut u = WatermarkTracker::new(2);
        assert_eq!(u.update(1, 900), None);
        assert_eq!(u.update(2, 100), Some(100));
        assert_eq!(u.idle(1), None, "channel 2 (100) still active");
        assert_eq!(u.idle(2), Some(900), "both idle: nothing holds 900 back");
        // Channel 3 comes back behind: it holds the minimum again, which never goes back.
        assert_eq!(t.update(3, 450), None);
        assert_eq!(t.update(3, 700), Some(700));
        assert_eq!(t.update(2, 650), None, "channel 2 is active again at 650");
        assert_eq!(t.update(2, 900), None, "channel 3 (700) is the minimum");
        assert_eq!(t.update(3, 1000), Some(900));
    }
}
