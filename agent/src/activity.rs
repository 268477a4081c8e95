//! What counts as use of the agent, for `--idle-timeout`.
//!
//! The agent is idle when no authenticated request has arrived, nothing was
//! under way (an exec connection, a push, a file transfer, a snapshot) and
//! no exec has been running for the whole timeout.
//! Health probes do not count: a controller polling `/healthz` must not keep
//! an abandoned sandbox alive.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::exec::Execs;

/// Longest sleep between idleness checks.
const IDLE_CHECK_MAX: Duration = Duration::from_secs(1);

/// Last use, and the work under way.
#[derive(Debug)]
pub struct Activity {
    origin: Instant,
    /// Milliseconds after `origin` of the last use.
    last_ms: AtomicU64,
    /// Exec connections and streamed requests under way.
    busy: AtomicUsize,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
        }
    }
}

impl Activity {
    /// Records use now.
    pub fn touch(&self) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// Counts the agent as in use until the guard drops (an exec
    /// connection, or a request whose body streams).
    pub fn busy(self: &Arc<Self>) -> BusyGuard {
        self.busy.fetch_add(1, Ordering::Relaxed);
        self.touch();
        BusyGuard(Arc::clone(self))
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }
}

/// Keeps the agent counted as in use.
#[derive(Debug)]
pub struct BusyGuard(Arc<Activity>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// Resolves once the agent has been idle for `timeout`.
pub async fn idle_for(activity: &Activity, execs: &Execs, timeout: Duration) {
    loop {
        if execs.running() > 0 || activity.busy.load(Ordering::Relaxed) > 0 {
            activity.touch();
        }
        let idle = activity.idle_for();
        if idle >= timeout {
            return;
        }
        tokio::time::sleep((timeout - idle).min(IDLE_CHECK_MAX)).await;
    }
}
