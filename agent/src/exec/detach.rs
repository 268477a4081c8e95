//! The detach timeout: a command nobody follows any more is interrupted
//! after a while, so a client that died without saying so (a `kill -9`, a
//! dropped network) cannot leave commands running until the sandbox ends.
//!
//! It holds for every caller: a request that names no timeout gets the
//! agent's default ([`DEFAULT_DETACH_TIMEOUT`], or `--detach-timeout-secs`),
//! and only an explicit `0` keeps a command running with no client, as a
//! background job.
//!
//! The timer reads the exec's attached-connection count as a *state*, not a
//! stream of changes: an exec whose only connection left before its
//! supervisor started watching is already unattended, and is timed from
//! then. (Waiting for a change there missed exactly that case, and such
//! execs ran forever.)

use std::time::Duration;

use tokio::sync::watch;

/// How long a command may run with no client attached, when the request
/// says nothing: long enough to ride out a reconnect, short enough that a
/// dead client's commands do not pile up against the exec limit.
pub const DEFAULT_DETACH_TIMEOUT: Duration = Duration::from_secs(60);

/// The timeout an exec gets: the request's (`0` for none), else the default.
pub fn resolve(requested_ms: Option<u64>, default: Option<Duration>) -> Option<Duration> {
    match requested_ms {
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
        None => default,
    }
}

/// Completes once an exec has had no attached connection for its whole
/// timeout; never when it has none.
pub struct DetachTimer {
    attached: watch::Receiver<usize>,
    after: Option<Duration>,
}

impl DetachTimer {
    /// A timer over an exec's attached count.
    pub fn new(attached: watch::Receiver<usize>, after: Option<Duration>) -> Self {
        Self { attached, after }
    }

    /// Waits until no connection has been attached for the timeout. Keep
    /// the future alive across other events (pin it): a new one starts the
    /// unattended period again.
    pub async fn expired(&mut self) {
        let Some(after) = self.after else {
            return std::future::pending().await;
        };
        loop {
            // `wait_for` looks at the current value first. (Its guard is
            // turned into a bool at once: it must not live across an await.)
            let unattended = self.attached.wait_for(|n| *n == 0).await.is_ok();
            if !unattended {
                return std::future::pending().await;
            }
            let returned = tokio::select! {
                () = tokio::time::sleep(after) => return,
                back = async { self.attached.wait_for(|n| *n > 0).await.is_ok() } => back,
            };
            if !returned {
                return std::future::pending().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_exec_left_before_the_timer_started_is_timed_at_once() {
        let (count, _) = watch::channel(1usize);
        // The only connection leaves before anyone watches.
        count.send_replace(0);
        let mut timer = DetachTimer::new(count.subscribe(), Some(Duration::from_secs(5)));
        let started = tokio::time::Instant::now();
        timer.expired().await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_returning_client_restarts_the_period() {
        let (count, _) = watch::channel(0usize);
        let mut timer = DetachTimer::new(count.subscribe(), Some(Duration::from_secs(5)));
        let started = tokio::time::Instant::now();
        let client = async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            count.send_replace(1);
            tokio::time::sleep(Duration::from_secs(10)).await;
            count.send_replace(0);
            std::future::pending::<()>().await;
        };
        tokio::select! {
            () = timer.expired() => {}
            () = client => unreachable!(),
        }
        assert_eq!(started.elapsed(), Duration::from_secs(18));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_means_never_and_absent_means_the_default() {
        let default = Some(DEFAULT_DETACH_TIMEOUT);
        assert_eq!(resolve(Some(0), default), None);
        assert_eq!(resolve(None, default), default);
        assert_eq!(
            resolve(Some(1500), default),
            Some(Duration::from_millis(1500))
        );
        let (_count, rx) = watch::channel(0usize);
        let mut timer = DetachTimer::new(rx, None);
        let waited = tokio::time::timeout(Duration::from_secs(3600), timer.expired()).await;
        assert!(waited.is_err(), "no timeout never fires");
    }
}
