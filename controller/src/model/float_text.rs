//! Fast float formatting for the planner's reason strings, byte-for-byte equal to `std`'s.
//!
//! `format!("{:.2}", x)` runs `std`'s exact decimal expansion (Grisu with a Dragon fallback),
//! which dominated the cost of a small job's decision. [`Fixed`] and [`Short`] print the same
//! text through integer arithmetic whenever that is provably exact and fall back to `std`
//! otherwise (a tie within rounding error, large or non-finite values).

use std::fmt;

/// 10^k for k = 0..=9.
const POW10: [u64; 10] = [
    1,
    10,
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
];

/// Displays an `f64` like `format!("{:.N}", x)` with `N` = the second field (0..=9).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fixed(pub f64, pub usize);

/// Displays an `f64` like `format!("{}", x)` (shortest representation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Short(pub f64);

/// The two-digit decimal strings "00" to "99", back to back.
const PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Writes the two digits of `r` (below 100) just before `at` in `buf`; returns the new start.
fn pair(buf: &mut [u8; 48], at: usize, r: u64) -> usize {
    let r = r as usize * 2;
    buf[at - 2..at].copy_from_slice(&PAIRS[r..r + 2]);
    at - 2
}

/// Writes `int.frac` (frac zero-padded to `decimals` digits) into `buf` from the end; returns
/// the start index. (Two digits per division where it can: the same digits.)
fn digits(buf: &mut [u8; 48], mut int: u64, mut frac: u64, decimals: usize) -> usize {
    let mut at = buf.len();
    let mut left = decimals;
    while left >= 2 {
        at = pair(buf, at, frac % 100);
        frac /= 100;
        left -= 2;
    }
    if left == 1 {
        at -= 1;
        buf[at] = b'0' + (frac % 10) as u8;
    }
    if decimals > 0 {
        at -= 1;
        buf[at] = b'.';
    }
    while int >= 100 {
        at = pair(buf, at, int % 100);
        int /= 100;
    }
    if int >= 10 {
        pair(buf, at, int)
    } else {
        at -= 1;
        buf[at] = b'0' + int as u8;
        at
    }
}

fn write_buf(f: &mut fmt::Formatter<'_>, negative: bool, buf: &[u8]) -> fmt::Result {
    if negative {
        f.write_str("-")?;
    }
    // Only ASCII digits, '.' and '-' were written.
    f.write_str(std::str::from_utf8(buf).map_err(|_| fmt::Error)?)
}

impl Fixed {
    /// The digits of `x` to `decimals` places into `buf` when integer arithmetic provably gives
    /// `std`'s text: their start index and whether a '-' goes first; `None` otherwise.
    fn fast(x: f64, decimals: usize, buf: &mut [u8; 48]) -> Option<(usize, bool)> {
        if decimals < POW10.len() && x.is_finite() {
            let scale = POW10[decimals];
            // y = |x|·10^d, correctly rounded: its error is at most y·2⁻⁵³, so unless the
            // fraction is within that of ½ the rounding of y equals that of the exact value.
            let y = x.abs() * scale as f64;
            if y < 4.0e15 {
                // y ≥ 0 and below 2⁵²: truncation is the floor, and exact (no libm call).
                let int = y as u64;
                let frac = y - int as f64; // exact below 2⁵²
                let slack = y * 2f64.powi(-51) + 1e-300;
                if (frac - 0.5).abs() > slack {
                    let r = int + u64::from(frac > 0.5);
                    let at = digits(buf, r / scale, r % scale, decimals);
                    return Some((at, x.is_sign_negative()));
                }
            }
        }
        None
    }
}

/// Appending to a `String` without `fmt::write`'s machinery: the same text as `Display`
/// (`{}`) for [`Fixed`], [`Short`] and integers, and the string itself for `&str`.
pub(crate) trait PushText {
    /// Appends the text to `s`.
    fn push_to(&self, s: &mut String);
}

impl PushText for &str {
    fn push_to(&self, s: &mut String) {
        s.push_str(self);
    }
}

impl PushText for Fixed {
    fn push_to(&self, s: &mut String) {
        let mut buf = [0u8; 48];
        match Fixed::fast(self.0, self.1, &mut buf) {
            Some((at, negative)) => push_buf(s, negative, &buf[at..]),
            None => {
                use fmt::Write as _;
                let _ = write!(s, "{self}");
            }
        }
    }
}

impl PushText for Short {
    fn push_to(&self, s: &mut String) {
        use fmt::Write as _;
        let _ = write!(s, "{self}");
    }
}

impl PushText for u32 {
    fn push_to(&self, s: &mut String) {
        let mut buf = [0u8; 48];
        let at = digits(&mut buf, u64::from(*self), 0, 0);
        push_buf(s, false, &buf[at..]);
    }
}

fn push_buf(s: &mut String, negative: bool, buf: &[u8]) {
    if negative {
        s.push('-');
    }
    // Only ASCII digits and '.' were written.
    s.extend(buf.iter().map(|&b| char::from(b)));
}

/// Appends each piece's [`PushText`] to the `String`: `cat!(s; "ρ=", Fixed(r, 2), " at p=", p)`
/// writes what `write!(s, "ρ={} at p={p}", Fixed(r, 2))` writes.
macro_rules! cat {
    ($s:expr; $($x:expr),* $(,)?) => {{
        let s: &mut String = $s;
        $( $crate::model::float_text::PushText::push_to(&$x, s); )*
    }};
}
pub(crate) use cat;

impl fmt::Display for Fixed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Fixed(x, decimals) = *self;
        let mut buf = [0u8; 48];
        match Fixed::fast(x, decimals, &mut buf) {
            Some((at, negative)) => write_buf(f, negative, &buf[at..]),
            None => write!(f, "{x:.decimals$}"),
        }
    }
}

impl fmt::Display for Short {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let x = self.0;
        // Integral values below 2⁵³ print as their integer (`std` prints 60.0 as "60").
        if x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15 {
            let mut buf = [0u8; 48];
            let at = digits(&mut buf, x.abs() as u64, 0, 0);
            return write_buf(f, x.is_sign_negative(), &buf[at..]);
        }
        write!(f, "{x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_values_and_edges() {
        for (x, d) in [
            (0.125, 2),
            (0.375, 2),
            (2.5, 0),
            (3.5, 0),
            (-0.0, 2),
            (-0.001, 2),
            (1e20, 2),
            (f64::INFINITY, 1),
            (f64::NAN, 3),
            (0.7, 2),
            (99.995, 2),
            (1.005, 2),
        ] {
            assert_eq!(Fixed(x, d).to_string(), format!("{x:.d$}"), "{x} {d}");
        }
        for x in [0.0, -0.0, 60.0, 1.0, 0.09, 1e16, -3.0, 1.5e-7, f64::NAN] {
            assert_eq!(Short(x).to_string(), format!("{x}"), "{x}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 20_000, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn fixed_equals_std(x in prop_oneof![
            -1e6f64..1e6,
            0.0f64..2.0,
            (0u32..200_000).prop_map(|k| f64::from(k) / 1000.0 + 0.0005),
            (0u32..20_000).prop_map(|k| f64::from(k) / 8.0),
            any::<f64>(),
        ], d in 0usize..=6) {
            prop_assert_eq!(Fixed(x, d).to_string(), format!("{x:.d$}"));
        }

        #[test]
        fn pushed_text_equals_display(x in prop_oneof![-1e6f64..1e6, any::<f64>()], d in 0usize..=6, n in any::<u32>()) {
            let mut s = String::from("x");
            cat!(&mut s; "a ", Fixed(x, d), " b ", Short(x), " c ", n);
            prop_assert_eq!(s, format!("xa {} b {} c {n}", Fixed(x, d), Short(x)));
        }

        #[test]
        fn short_equals_std(x in prop_oneof![(-100_000i64..100_000).prop_map(|k| k as f64), any::<f64>()]) {
            prop_assert_eq!(Short(x).to_string(), format!("{x}"));
        }
    }
}
