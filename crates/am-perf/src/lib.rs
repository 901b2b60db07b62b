//! Measurement and test tooling shared by the transports (above all the shared-memory ones,
//! sci-sim, extoll-sim and portals-sim): their rank-test programs, criterion benches and
//! multi-process tests measure and check the same things the same way, so the code that does
//! it lives here once.
//!
//! - [`am`]: the AM handler table of the measurements, timed round trips and streams;
//! - [`nic`]: the NIC alone, without the AM core: a Short request head and its reply through
//!   [`am_core::Transport`];
//! - [`rank`]: pieces of the rank-test programs: self-launch, floors, the echo table, the
//!   put ring and the killed-rank scenario;
//! - [`launch`]: the multi-process tests' side: start a job, check what the ranks wrote;
//! - [`mod@bench`]: the criterion groups every transport's bench shares.
//!
//! The crate also holds the tooling itself: the `sci-rank-test`, `extoll-rank-test`,
//! `portals-rank-test`, `loopback-rank-test` and `udp-rank-test` programs (`src/bin`), the
//! NICs' criterion benches and udp's `udp_mac` (`benches/`, run with `cargo bench -p am-perf
//! --bench sci`) and the multi-process tests (`tests/`, `kill_anywhere` among them).
//!
//! Not part of amnet's API (`publish = false`), and no library crate depends on it.

#![forbid(unsafe_code)]

use std::time::Instant;

pub mod am;
pub mod bench;
pub mod launch;
pub mod nic;
pub mod rank;

/// The rank that rank 0 measures against in every two-rank measurement.
pub const PEER: u32 = 1;

/// The median of `v` (the upper one for an even count), 0 when `v` is empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs `f` `iters` times and returns each run's wall time in µs.
pub fn samples_us<E>(iters: usize, mut f: impl FnMut() -> Result<(), E>) -> Result<Vec<f64>, E> {
    let mut v = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(v)
}

/// The median of [`samples_us`].
pub fn median_us<E>(iters: usize, f: impl FnMut() -> Result<(), E>) -> Result<f64, E> {
    samples_us(iters, f).map(median)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_takes_the_middle_of_the_sorted_values() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
    }

    #[test]
    fn samples_stop_at_the_first_error() {
        let mut n = 0;
        let r = samples_us(5, || {
            n += 1;
            if n == 3 {
                Err(n)
            } else {
                Ok(())
            }
        });
        assert_eq!(r, Err(3));
        assert_eq!(samples_us(4, || Ok::<(), ()>(())).map(|v| v.len()), Ok(4));
    }
}
