//! Waiting and retrying, in one place. Two shapes recur: a condition polled
//! at a steady pace until a deadline ([`Deadline`]: an agent coming up, a
//! lock or a lease coming free, a process going away, SQLite letting go of
//! its lock), and a failed try repeated after pauses that double up to a cap
//! ([`Backoff`], with [`jitter`] where many clients retry at once: pushes
//! and re-attaches).

use std::time::{Duration, Instant};

/// A deadline, polled every `every`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
    every: Duration,
}

impl Deadline {
    /// `within` from now, polled every `every`.
    pub(crate) fn after(within: Duration, every: Duration) -> Self {
        Self {
            at: Instant::now() + within,
            every,
        }
    }

    /// Whether the deadline has passed.
    pub(crate) fn passed(&self) -> bool {
        Instant::now() >= self.at
    }

    /// Waits one pause before the next poll; false, at once, when the
    /// deadline has passed and the caller should give up.
    pub(crate) async fn pause(&self) -> bool {
        if self.passed() {
            return false;
        }
        tokio::time::sleep(self.every).await;
        true
    }

    /// [`Deadline::pause`] for blocking code.
    pub(crate) fn pause_blocking(&self) -> bool {
        if self.passed() {
            return false;
        }
        std::thread::sleep(self.every);
        true
    }
}

/// Pauses between tries that double from `first` up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// The pause before the first retry.
    pub(crate) first: Duration,
    /// The longest pause.
    pub(crate) max: Duration,
}

impl Backoff {
    /// The pause before retry `n` (0 for the first): `first` doubled `n`
    /// times, at most `max`.
    pub(crate) fn pause(&self, n: u32) -> Duration {
        self.first
            .checked_mul(1u32.checked_shl(n).unwrap_or(u32::MAX))
            .map_or(self.max, |pause| pause.min(self.max))
    }
}

/// `pause` scaled by a random factor in [0.5, 1.0), so clients that failed
/// together do not retry in lockstep.
pub(crate) fn jitter(pause: Duration) -> Duration {
    let mut byte = [0u8; 1];
    // Without randomness the pause is simply not jittered.
    let _ = getrandom::fill(&mut byte);
    pause.mul_f64(0.5 + f64::from(byte[0]) / 512.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let backoff = Backoff {
            first: Duration::from_millis(100),
            max: Duration::from_secs(3),
        };
        let pauses: Vec<u128> = (0..7).map(|n| backoff.pause(n).as_millis()).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1600, 3000, 3000]);
        assert_eq!(backoff.pause(40), backoff.max);
        assert_eq!(backoff.pause(u32::MAX), backoff.max);
    }

    #[test]
    fn jitter_stays_within_half_and_whole() {
        for _ in 0..100 {
            let d = jitter(Duration::from_millis(1000));
            assert!(d >= Duration::from_millis(500) && d < Duration::from_millis(1000));
        }
    }

    #[tokio::test]
    async fn a_deadline_pauses_until_it_passes() {
        let deadline = Deadline::after(Duration::from_millis(30), Duration::from_millis(10));
        let started = Instant::now();
        let mut pauses = 0;
        while deadline.pause().await {
            pauses += 1;
        }
        assert!(deadline.passed());
        assert!(started.elapsed() >= Duration::from_millis(30));
        // Each pause is at least 10 ms, so no more than four fit; a loaded
        // machine may oversleep, so fewer may.
        assert!((1..=4).contains(&pauses), "{pauses} pauses");
        assert!(!Deadline::after(Duration::ZERO, Duration::from_secs(60)).pause_blocking());
    }
}
