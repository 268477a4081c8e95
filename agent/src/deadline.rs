//! The sandbox's lifetime deadline (`/v1/deadline`), beside the idle
//! timeout: once set, the agent stops the sandbox when it passes, whatever
//! runs and whoever is connected, the way the idle timeout does (a clean
//! exit, files kept). A later setting replaces an earlier one; none clears it.
//! It lives in the agent, so it holds on every backend and across
//! controller processes, and ends with the agent.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// Longest deadline accepted: about 100 years, so `now + seconds` cannot
/// overflow the clock.
pub const MAX_SECONDS: u64 = 100 * 365 * 24 * 3600;

/// When the agent stops the sandbox, if ever.
#[derive(Debug)]
pub struct Lifetime {
    at: watch::Sender<Option<Instant>>,
}

impl Default for Lifetime {
    fn default() -> Self {
        Self {
            at: watch::channel(None).0,
        }
    }
}

impl Lifetime {
    /// Stops the sandbox `seconds` from now (at most [`MAX_SECONDS`]); `None`
    /// clears the deadline.
    pub fn set(&self, seconds: Option<u64>) {
        let at = seconds.map(|s| Instant::now() + Duration::from_secs(s.min(MAX_SECONDS)));
        self.at.send_replace(at);
    }

    /// Time left; `None` without a deadline.
    pub fn remaining(&self) -> Option<Duration> {
        let at = (*self.at.borrow())?;
        Some(at.saturating_duration_since(Instant::now()))
    }

    /// Resolves once the deadline in force passes; a change while waiting
    /// is taken into account.
    pub async fn reached(&self) {
        let mut changes = self.at.subscribe();
        loop {
            let at = *changes.borrow_and_update();
            let passed = async {
                match at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = passed => return,
                changed = changes.changed() => {
                    if changed.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_latest_setting_decides_and_none_clears() {
        let lifetime = Lifetime::default();
        assert_eq!(lifetime.remaining(), None);
        lifetime.set(Some(60));
        assert_eq!(lifetime.remaining(), Some(Duration::from_secs(60)));
        let waiting = lifetime.reached();
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_secs(30), &mut waiting)
                .await
                .is_err()
        );
        lifetime.set(Some(5));
        tokio::time::timeout(Duration::from_secs(6), &mut waiting)
            .await
            .expect("a shorter deadline wakes the waiter");
        lifetime.set(None);
        assert_eq!(lifetime.remaining(), None);
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), lifetime.reached())
                .await
                .is_err(),
            "no deadline, no stop"
        );
    }
}
