//! A memo of `f64` values by slot, NaN meaning "not computed", whose allocation is reused from
//! one model to the next: resetting it rewrites only the slots written since the last reset
//! instead of the whole array (the tail memo has a row of up to 129 parallelisms per operator,
//! of which a decision uses a few).

/// An array of `f64` slots, each NaN until [`NanMemo::set`]; remembers which slots were set.
///
/// Invariant: every slot not listed in `touched` is NaN.
#[derive(Debug, Default)]
pub(super) struct NanMemo {
    values: Vec<f64>,
    /// The slots set since the last reset (with repeats; each holds a value or NaN).
    touched: Vec<usize>,
}

impl NanMemo {
    /// Makes every one of `len` slots NaN, keeping the allocation.
    pub(super) fn reset(&mut self, len: usize) {
        if self.values.len() == len {
            for &at in &self.touched {
                self.values[at] = f64::NAN;
            }
        } else {
            self.values.clear();
            self.values.resize(len, f64::NAN);
        }
        self.touched.clear();
    }

    /// Makes every slot NaN again (the same length).
    pub(super) fn clear(&mut self) {
        self.reset(self.values.len());
    }

    /// Slot `at`'s value, NaN when not set (panics when `at` is out of range, like indexing).
    pub(super) fn get(&self, at: usize) -> f64 {
        self.values[at]
    }

    /// Sets slot `at` to `value`.
    pub(super) fn set(&mut self, at: usize, value: f64) {
        self.values[at] = value;
        self.touched.push(at);
    }

    /// Whether any slot was set since the last reset.
    pub(super) fn is_used(&self) -> bool {
        !self.touched.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_leaves_every_slot_nan() {
        let mut m = NanMemo::default();
        m.reset(8);
        assert!((0..8).all(|k| m.get(k).is_nan()) && !m.is_used());
        m.set(2, 1.5);
        m.set(7, -3.0);
        m.set(2, 4.0);
        assert_eq!((m.get(2), m.get(7)), (4.0, -3.0));
        assert!(m.is_used());
        m.reset(8);
        assert!((0..8).all(|k| m.get(k).is_nan()) && !m.is_used());
        m.set(5, 2.0);
        m.clear();
        assert!((0..8).all(|k| m.get(k).is_nan()));
        m.set(1, 2.0);
        m.reset(3);
        assert!((0..3).all(|k| m.get(k).is_nan()));
    }
}
