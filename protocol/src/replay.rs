//! The replay guard: the nonces of signed requests seen within the skew
//! window, so a captured request cannot be sent again.
//!
//! A nonce must be remembered until its request's timestamp leaves the
//! window (`timestamp + skew`); after that the timestamp check alone refuses
//! the request. Nonces are kept in a set and, beside it, in buckets by that
//! second, so expiry pops whole buckets from the front: amortised O(1) per
//! request, whatever the rate, and no scan of the set.
//!
//! Memory is bounded by [`MAX_REMEMBERED`]. When a sustained rate fills it,
//! the nonces closest to expiry are dropped early and the guard raises a
//! *floor*: a request whose timestamp would have expired by the floor is
//! refused as too old to check, because its nonce may have been forgotten.
//! Fresh requests (timestamp near now) are always above the floor, so no
//! rate ever locks the controller out; only a request signed long before
//! it arrives is refused, and only while the guard is at its bound.

use std::collections::{BTreeMap, HashSet};

use sha2::{Digest, Sha256};

/// Most nonces remembered at once (about 40 bytes each with their bucket
/// entries): enough for the whole skew window at ~400 requests per second,
/// and past that the floor takes over.
pub const MAX_REMEMBERED: usize = 1 << 17;

/// What the guard said about a nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Never seen: remembered now.
    Fresh,
    /// Seen before within its window.
    Replayed,
    /// Its window may have lost nonces to the memory bound; it is refused
    /// because a replay could no longer be recognised.
    TooOld,
}

/// The nonces seen, with their expiry seconds.
#[derive(Debug, Default)]
pub struct ReplayGuard {
    /// Digests of remembered nonces (a fixed 16 bytes, whatever the nonce's length).
    seen: HashSet<u128>,
    /// The same digests by the unix second after which they may be forgotten.
    by_expiry: BTreeMap<u64, Vec<u128>>,
    /// Requests expiring at or before this second may have lost their nonce.
    floor: u64,
}

impl ReplayGuard {
    /// An empty guard.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks and remembers `nonce`, which may be forgotten after `expires`
    /// (unix seconds); `now` drives expiry.
    pub fn admit(&mut self, now: u64, nonce: &str, expires: u64) -> Admission {
        self.forget_expired(now);
        if expires <= self.floor {
            return Admission::TooOld;
        }
        let digest = digest(nonce);
        if !self.seen.insert(digest) {
            return Admission::Replayed;
        }
        self.by_expiry.entry(expires).or_default().push(digest);
        while self.seen.len() > MAX_REMEMBERED {
            self.drop_soonest();
        }
        Admission::Fresh
    }

    /// How many nonces are remembered.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    fn forget_expired(&mut self, now: u64) {
        while let Some(entry) = self.by_expiry.first_entry() {
            if *entry.key() >= now {
                break;
            }
            for digest in entry.remove() {
                self.seen.remove(&digest);
            }
        }
    }

    /// Forgets the bucket closest to expiry, and raises the floor past it.
    fn drop_soonest(&mut self) {
        if let Some((expires, digests)) = self.by_expiry.pop_first() {
            for digest in digests {
                self.seen.remove(&digest);
            }
            self.floor = self.floor.max(expires);
        }
    }
}

fn digest(nonce: &str) -> u128 {
    let hash = Sha256::digest(nonce.as_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&hash[..16]);
    u128::from_le_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: u64 = 300;

    fn nonce(i: u64) -> String {
        format!("{i:032x}")
    }

    #[test]
    fn any_rate_is_admitted_and_replays_are_not() {
        let mut guard = ReplayGuard::new();
        // 1,000 requests a second for 400 s: far past the bound.
        let mut i = 0;
        for now in 1_000..1_400 {
            for _ in 0..1_000 {
                assert_eq!(guard.admit(now, &nonce(i), now + WINDOW), Admission::Fresh);
                i += 1;
            }
            assert!(guard.len() <= MAX_REMEMBERED);
        }
        // The last second's requests replayed at once are refused.
        let last = i - 1;
        assert_eq!(
            guard.admit(1_600, &nonce(last), 1_599 + WINDOW),
            Admission::Replayed
        );
        // A request signed long ago (its window possibly forgotten) is refused, never admitted twice.
        assert_eq!(
            guard.admit(1_600, &nonce(0), 1_000 + WINDOW),
            Admission::TooOld
        );
    }

    #[test]
    fn nonces_are_forgotten_when_their_window_ends() {
        let mut guard = ReplayGuard::new();
        assert_eq!(guard.admit(100, &nonce(1), 100 + WINDOW), Admission::Fresh);
        // Timestamps within the window may arrive out of order.
        assert_eq!(guard.admit(101, &nonce(2), 50 + WINDOW), Admission::Fresh);
        assert_eq!(
            guard.admit(300, &nonce(1), 100 + WINDOW),
            Admission::Replayed
        );
        assert_eq!(guard.len(), 2);
        guard.admit(351, &nonce(3), 351 + WINDOW);
        assert_eq!(guard.len(), 2, "the nonce expiring at 350 is gone");
        guard.admit(401, &nonce(4), 401 + WINDOW);
        assert_eq!(guard.len(), 2, "and the one expiring at 400");
    }

    #[test]
    fn below_the_bound_nothing_recent_is_refused() {
        let mut guard = ReplayGuard::new();
        for i in 0..10_000 {
            assert_eq!(
                guard.admit(500, &nonce(i), 200 + WINDOW + i % 600),
                Admission::Fresh
            );
        }
        // Old but within its window, and nothing was dropped early.
        assert_eq!(
            guard.admit(500, &nonce(99_999), 201 + WINDOW),
            Admission::Fresh
        );
    }
}
