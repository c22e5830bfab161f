//! The synthetic per-record costs of an operator: CPU burnt and blocking waits.

use super::*;

/// Spends `cpu_us` of real computation; returns a value so the work is not optimized away.
pub(super) fn burn_cpu(cpu_us: f64, seed: u64) -> u64 {
    if cpu_us <= 0.0 {
        return seed;
    }
    let until = Instant::now() + Duration::from_secs_f64(cpu_us / 1e6);
    let mut x = seed | 1;
    loop {
        for _ in 0..64 {
            x = murmur_fmix64(x);
        }
        if Instant::now() >= until {
            return std::hint::black_box(x);
        }
    }
}

pub(super) fn spend(cpu_us: f64, io_us: f64, seed: u64) {
    std::hint::black_box(burn_cpu(cpu_us, seed));
    if io_us > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(io_us / 1e6));
    }
}
