//! What a real provider does that a mock on one machine would otherwise
//! never show, as switches a test turns on: connections cut when an E2B
//! sandbox pauses, a proxy answering `502` for a while after a sandbox
//! resumes or starts, rate limits (`429` with `Retry-After`), and preview
//! tokens that lapse, a toolbox older than `files/bulk-upload`
//! (Daytona), and creates that fail inside the provider (E2B's `500`). All are
//! off unless a test turns them on.
//!
//! A test holding the in-process mock calls [`Faults`]'s setters through
//! `MockE2b::faults` or `MockDaytona::faults`; a test driving the mock
//! binary (the providers' SDK journeys) sends the same settings as JSON to
//! the control plane's test-only route [`ADMIN_PATH`] with the API key
//! ([`Switches`] is the body). Each provider decides what each switch
//! means for its own servers.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The test-only route that reads and sets the switches (`GET`: the
/// current ones; `POST` with [`Switches`]: changes what it names).
pub const ADMIN_PATH: &str = "/_mock/faults";
/// Longest a switch may keep a proxy unready or a client waiting.
pub const MAX_FAULT_DURATION: Duration = Duration::from_secs(600);

/// The switches, as the admin route reads and answers them. Fields left
/// out of a `POST` keep their value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Switches {
    /// E2B: a pause ends every open connection to the sandbox (relayed
    /// ports and envd streams), as the VM's network goes away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_on_pause: Option<bool>,
    /// Seconds the proxy answers `502` after a sandbox resumes (E2B) or
    /// starts (Daytona), as while the VM's network comes back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unready_secs: Option<f64>,
    /// The next this many control-plane requests answer `429`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limited_requests: Option<u32>,
    /// The `Retry-After` of those answers, in whole seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
    /// Daytona: every preview token issued so far stops working now (a
    /// new one comes with the next preview URL). Not kept: an action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lapse_preview_tokens: Option<bool>,
    /// Daytona: the toolbox does not serve `POST /files/bulk-upload`, as a
    /// daemon from before it did not (`404`, as an unknown route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_bulk_upload: Option<bool>,
    /// E2B: the next this many sandbox creates answer `500`, as E2B
    /// failing to place a VM does; other routes are served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_creates: Option<u32>,
}

#[derive(Debug, Default)]
struct State {
    drop_on_pause: bool,
    unready: Duration,
    rate_limited: u32,
    retry_after_secs: u64,
    no_bulk_upload: bool,
    failed_creates: u32,
}

/// The switches of one running mock.
#[derive(Debug, Default)]
pub struct Faults {
    state: Mutex<State>,
}

/// Why a switch setting was refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FaultError {
    /// A duration that is negative, not a number, or too long.
    #[error("unreadySecs must be between 0 and {max} seconds, not {given}")]
    Duration {
        /// What was asked.
        given: f64,
        /// The bound.
        max: u64,
    },
}

impl Faults {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// E2B: whether a pause cuts the sandbox's open connections.
    pub fn set_drop_on_pause(&self, on: bool) {
        self.state().drop_on_pause = on;
    }

    /// Whether a pause cuts the sandbox's open connections.
    pub fn drop_on_pause(&self) -> bool {
        self.state().drop_on_pause
    }

    /// How long the proxy answers `502` after a resume or start (zero: not at all).
    pub fn set_unready(&self, unready: Duration) {
        self.state().unready = unready.min(MAX_FAULT_DURATION);
    }

    /// Until when a sandbox resumed or started now stays unready, if at all.
    pub fn unready_until(&self, now: Instant) -> Option<Instant> {
        let unready = self.state().unready;
        (!unready.is_zero()).then(|| now + unready)
    }

    /// The next `requests` control-plane requests answer `429` with
    /// `Retry-After: retry_after` (whole seconds).
    pub fn rate_limit(&self, requests: u32, retry_after: Duration) {
        let mut state = self.state();
        state.rate_limited = requests;
        state.retry_after_secs = retry_after.min(MAX_FAULT_DURATION).as_secs();
    }

    /// Daytona: whether the toolbox leaves `files/bulk-upload` unserved.
    pub fn set_no_bulk_upload(&self, on: bool) {
        self.state().no_bulk_upload = on;
    }

    /// Whether `files/bulk-upload` is unserved now.
    pub fn no_bulk_upload(&self) -> bool {
        self.state().no_bulk_upload
    }

    /// The next `creates` sandbox creates fail inside the provider.
    pub fn fail_creates(&self, creates: u32) {
        self.state().failed_creates = creates;
    }

    /// Takes one failed create if any is left: whether this create fails.
    pub fn take_failed_create(&self) -> bool {
        let mut state = self.state();
        let fails = state.failed_creates > 0;
        state.failed_creates = state.failed_creates.saturating_sub(1);
        fails
    }

    /// Takes one rate-limited answer if any is left: its `Retry-After`.
    pub fn take_rate_limit(&self) -> Option<u64> {
        let mut state = self.state();
        if state.rate_limited == 0 {
            return None;
        }
        state.rate_limited -= 1;
        Some(state.retry_after_secs)
    }

    /// The switches now, as the admin route answers them.
    pub fn switches(&self) -> Switches {
        let state = self.state();
        Switches {
            drop_on_pause: Some(state.drop_on_pause),
            unready_secs: Some(state.unready.as_secs_f64()),
            rate_limited_requests: Some(state.rate_limited),
            retry_after_secs: Some(state.retry_after_secs),
            lapse_preview_tokens: None,
            no_bulk_upload: Some(state.no_bulk_upload),
            failed_creates: Some(state.failed_creates),
        }
    }

    /// Applies what `switches` names (not the preview-token action, which
    /// is the provider's); the rest keeps its value.
    pub fn apply(&self, switches: &Switches) -> Result<(), FaultError> {
        let unready = match switches.unready_secs {
            None => None,
            Some(secs) => {
                let max = MAX_FAULT_DURATION.as_secs();
                if !(0.0..=max as f64).contains(&secs) {
                    return Err(FaultError::Duration { given: secs, max });
                }
                Some(Duration::from_secs_f64(secs))
            }
        };
        let mut state = self.state();
        if let Some(on) = switches.drop_on_pause {
            state.drop_on_pause = on;
        }
        if let Some(unready) = unready {
            state.unready = unready;
        }
        if let Some(requests) = switches.rate_limited_requests {
            state.rate_limited = requests;
        }
        if let Some(secs) = switches.retry_after_secs {
            state.retry_after_secs = secs.min(MAX_FAULT_DURATION.as_secs());
        }
        if let Some(on) = switches.no_bulk_upload {
            state.no_bulk_upload = on;
        }
        if let Some(creates) = switches.failed_creates {
            state.failed_creates = creates;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_run_out_after_the_count() {
        let faults = Faults::default();
        assert_eq!(faults.take_rate_limit(), None);
        faults.rate_limit(2, Duration::from_secs(3));
        assert_eq!(faults.take_rate_limit(), Some(3));
        assert_eq!(faults.take_rate_limit(), Some(3));
        assert_eq!(faults.take_rate_limit(), None);
    }

    #[test]
    fn failed_creates_run_out_after_the_count() {
        let faults = Faults::default();
        assert!(!faults.take_failed_create());
        faults.fail_creates(1);
        assert!(faults.take_failed_create());
        assert!(!faults.take_failed_create());
    }

    #[test]
    fn switches_left_out_keep_their_value() {
        let faults = Faults::default();
        faults.set_drop_on_pause(true);
        let change: Switches = serde_json::from_str(r#"{"unreadySecs": 1.5}"#).unwrap();
        faults.apply(&change).unwrap();
        let now = faults.switches();
        assert_eq!(now.drop_on_pause, Some(true));
        assert_eq!(now.unready_secs, Some(1.5));
        let bad: Switches = serde_json::from_str(r#"{"unreadySecs": -1}"#).unwrap();
        assert!(faults.apply(&bad).is_err());
        assert!(serde_json::from_str::<Switches>(r#"{"dropOnPuase": true}"#).is_err());
    }

    #[test]
    fn unready_is_off_at_zero() {
        let faults = Faults::default();
        let now = Instant::now();
        assert_eq!(faults.unready_until(now), None);
        faults.set_unready(Duration::from_secs(2));
        assert_eq!(
            faults.unready_until(now),
            Some(now + Duration::from_secs(2))
        );
    }
}
