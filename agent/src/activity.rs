//! What counts as use of the agent, for `--idle-timeout`.
//!
//! The agent is idle when no authenticated request has arrived, no exec
//! session is open and no exec has been running for the whole timeout.
//! Health probes do not count: a controller polling `/healthz` must not keep
//! an abandoned sandbox alive.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::exec::Execs;

/// Longest sleep between idleness checks.
const IDLE_CHECK_MAX: Duration = Duration::from_secs(1);

/// Last use and open sessions.
#[derive(Debug)]
pub struct Activity {
    origin: Instant,
    /// Milliseconds after `origin` of the last use.
    last_ms: AtomicU64,
    sessions: AtomicUsize,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
            sessions: AtomicUsize::new(0),
        }
    }
}

impl Activity {
    /// Records use now.
    pub fn touch(&self) {
        let now = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// Marks a session open until the guard drops.
    pub fn session(self: &Arc<Self>) -> SessionGuard {
        self.sessions.fetch_add(1, Ordering::Relaxed);
        self.touch();
        SessionGuard(Arc::clone(self))
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }
}

/// Keeps a session counted as open.
#[derive(Debug)]
pub struct SessionGuard(Arc<Activity>);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.0.sessions.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// Resolves once the agent has been idle for `timeout`.
pub async fn idle_for(activity: &Activity, execs: &Execs, timeout: Duration) {
    loop {
        if execs.running() > 0 || activity.sessions.load(Ordering::Relaxed) > 0 {
            activity.touch();
        }
        let idle = activity.idle_for();
        if idle >= timeout {
            return;
        }
        tokio::time::sleep((timeout - idle).min(IDLE_CHECK_MAX)).await;
    }
}
