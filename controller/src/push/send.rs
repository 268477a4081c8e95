//! One bundle to one agent: the signed request, and retrying it.
//!
//! A push is safe to repeat (the agent answers "unchanged" once the bundle
//! is live), so failures that another try can cure are retried: the agent
//! unreachable, a timeout, a connection lost mid-request, the agent's
//! `internal` failure, and a 5xx other than 507 that carries no kind of the
//! agent's (a proxy's error page, a newer agent's kind). Refusals that
//! would only repeat are not: every other kind (malformed, unauthorized,
//! mount_not_allowed, mount_conflict, too_large, hash_mismatch, disk_full,
//! version_mismatch, ...), and an agent too old to take a push. Pauses double from [`RetryPolicy::first_delay`] up to
//! [`RetryPolicy::max_delay`], each with random jitter so a fan-out's
//! retries do not arrive in lockstep, and no new try starts once the
//! [`RetryPolicy::budget`] would be exceeded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use silo_protocol::ErrorKind;
use silo_protocol::http::ErrorBody;
use silo_protocol::push::{Declared, PushResponse, path_and_query_declared};

use super::SharedBundle;
use crate::client::{AgentClient, ClientError, SentCallback};
use crate::retry::{Backoff, jitter};

/// Time budget for retries of one push, from its first try.
pub const DEFAULT_RETRY_BUDGET: Duration = Duration::from_secs(20);
/// Pause before the first retry.
pub const DEFAULT_FIRST_DELAY: Duration = Duration::from_millis(100);
/// Longest pause between tries.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(3);
/// Longest a single try may take (upload, extract and answer).
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(300);

/// When to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// No try starts later than this after the first.
    pub budget: Duration,
    /// Pause before the first retry; doubled after each.
    pub first_delay: Duration,
    /// Cap on the pause.
    pub max_delay: Duration,
    /// Cap on one try.
    pub attempt_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            budget: DEFAULT_RETRY_BUDGET,
            first_delay: DEFAULT_FIRST_DELAY,
            max_delay: DEFAULT_MAX_DELAY,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
        }
    }
}

/// Why one try failed.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// The request could not be made or its answer not read.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The try took longer than the policy allows.
    #[error("the try timed out: no answer within {0:?} (see --attempt-timeout)")]
    TimedOut(Duration),
    /// The agent refused the push.
    #[error("agent answered HTTP {status} ({kind}): {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The error body's kind.
        kind: ErrorKind,
        /// The agent's explanation.
        message: String,
    },
    /// The agent's success answer is unreadable.
    #[error("unreadable push answer: {0}")]
    BadAnswer(String),
}

impl AttemptError {
    /// Whether another try may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Client(
                ClientError::Connect { .. }
                | ClientError::Timeout { .. }
                | ClientError::Http(_)
                | ClientError::Disconnected,
            )
            | Self::TimedOut(_) => true,
            Self::Refused { kind, status, .. } => match kind {
                ErrorKind::Internal => true,
                // No kind of the agent's: only the status tells.
                ErrorKind::Unknown(_) => (500..600).contains(status) && *status != 507,
                _ => false,
            },
            _ => false,
        }
    }

    /// A short machine-readable category, for reports.
    pub fn reason(&self) -> String {
        match self {
            Self::Client(ClientError::Connect { .. }) => "unreachable".into(),
            Self::Client(ClientError::Timeout { .. }) | Self::TimedOut(_) => "timeout".into(),
            Self::Client(ClientError::Http(_) | ClientError::Disconnected) => {
                "connection_lost".into()
            }
            Self::Client(ClientError::Sign(_)) => "signing".into(),
            Self::Client(_) | Self::BadAnswer(_) => "protocol".into(),
            Self::Refused { kind, .. } => kind.to_string(),
        }
    }
}

/// A push that failed for good.
#[derive(Debug, thiserror::Error)]
#[error("push failed after {attempts} attempt(s)")]
pub struct PushFailed {
    /// Tries made.
    pub attempts: u32,
    /// The last try's failure.
    #[source]
    pub last: AttemptError,
}

/// One try: sends `bundle` to `mount` and reads the answer.
pub async fn push_once(
    client: &AgentClient,
    mount: &str,
    bundle: &SharedBundle,
    sent: Option<SentCallback>,
) -> Result<PushResponse, AttemptError> {
    let response = client
        .request_streamed(
            http::Method::POST,
            &path_and_query_declared(
                mount,
                Declared {
                    entries: Some(bundle.entries),
                    unpacked: Some(bundle.unpacked_bytes),
                },
            ),
            bundle.bytes.clone(),
            &bundle.sha256,
            sent,
        )
        .await?;
    if response.status.is_success() {
        return serde_json::from_slice(&response.body)
            .map_err(|e| AttemptError::BadAnswer(e.to_string()));
    }
    let ErrorBody { kind, message } = response.error_body();
    Err(AttemptError::Refused {
        status: response.status.as_u16(),
        kind,
        message,
    })
}

/// Asks whether a sandbox's machine is gone (removed, replaced, or
/// stopped): a push to it stops retrying at once.
pub type GoneProbe = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

/// Pushes `bundle` to one agent, retrying transient failures per `policy`.
/// Returns the answer and how many tries it took.
pub async fn push_to_sandbox(
    client: &AgentClient,
    mount: &str,
    bundle: &SharedBundle,
    policy: &RetryPolicy,
    sent: Option<SentCallback>,
) -> Result<(PushResponse, u32), PushFailed> {
    push_unless_gone(client, mount, bundle, policy, sent, None).await
}

/// [`push_to_sandbox`] that, when the agent cannot be reached, asks `gone`
/// before waiting to retry: a machine that is no longer there fails the
/// push at once instead of after the whole retry budget.
pub async fn push_unless_gone(
    client: &AgentClient,
    mount: &str,
    bundle: &SharedBundle,
    policy: &RetryPolicy,
    sent: Option<SentCallback>,
    gone: Option<&GoneProbe>,
) -> Result<(PushResponse, u32), PushFailed> {
    let start = Instant::now();
    let backoff = Backoff {
        first: policy.first_delay,
        max: policy.max_delay,
    };
    let mut attempts = 0;
    loop {
        attempts += 1;
        let attempt = tokio::time::timeout(
            policy.attempt_timeout,
            push_once(client, mount, bundle, sent.as_ref().map(Arc::clone)),
        )
        .await
        .unwrap_or(Err(AttemptError::TimedOut(policy.attempt_timeout)));
        match attempt {
            Ok(answer) => return Ok((answer, attempts)),
            Err(last) => {
                let pause = jitter(backoff.pause(attempts - 1));
                if !last.is_transient() || start.elapsed() + pause > policy.budget {
                    return Err(PushFailed { attempts, last });
                }
                let unreachable = matches!(
                    last,
                    AttemptError::Client(ClientError::Connect { .. } | ClientError::Disconnected)
                );
                if let Some(gone) = gone.filter(|_| unreachable) {
                    if gone().await {
                        return Err(PushFailed { attempts, last });
                    }
                }
                tracing::debug!(mount, attempts, error = %last, "push failed; retrying");
                tokio::time::sleep(pause).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_curable_failures_are_transient() {
        let refused = |status: u16, kind: ErrorKind| AttemptError::Refused {
            status,
            kind,
            message: String::new(),
        };
        // A proxy's page (or a kind newer than this build): the status decides.
        let page = || ErrorKind::from("http");
        for status in [500, 502, 503] {
            assert!(refused(status, page()).is_transient(), "{status}");
        }
        for status in [400, 401, 403, 409, 413, 422, 507] {
            assert!(!refused(status, page()).is_transient(), "{status}");
        }
        // The agent's own kinds decide by themselves.
        assert!(refused(500, ErrorKind::Internal).is_transient());
        for kind in [
            ErrorKind::Malformed,
            ErrorKind::RejectedEntry,
            ErrorKind::MountConflict,
            ErrorKind::TooLarge,
            ErrorKind::DiskFull,
            ErrorKind::Unsupported,
        ] {
            let status = kind.status().unwrap();
            assert!(!refused(status, kind.clone()).is_transient(), "{kind}");
            assert_eq!(refused(status, kind.clone()).reason(), kind.to_string());
        }
        let connect = AttemptError::Client(ClientError::Connect {
            endpoint: "unix:/x".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        });
        assert!(connect.is_transient());
        assert_eq!(connect.reason(), "unreachable");
        assert!(AttemptError::TimedOut(Duration::from_secs(1)).is_transient());
        assert!(!AttemptError::BadAnswer(String::new()).is_transient());
    }
}
