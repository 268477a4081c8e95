//! [`E2bError`]: why an E2B backend operation failed, each naming what was
//! asked and what E2B (or envd, or the agent) answered. What every provider
//! shares (its configuration, a call that failed or was refused, a step
//! every remote backend takes) is wrapped whole; the rest is E2B's own.

use crate::backend::remote::config::ProviderConfigError;
use crate::backend::remote::error::RemoteError;
use crate::backend::remote::rest::RestError;
use crate::client::ClientError;

/// Why an E2B operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum E2bError {
    /// The configuration is incomplete or wrong.
    #[error(transparent)]
    Config(#[from] ProviderConfigError),
    /// E2B (or envd) could not be reached, kept saying "later", or refused.
    #[error(transparent)]
    Rest(#[from] RestError),
    /// E2B served none of the generations of a route silo knows.
    #[error("E2B cannot {what}: it serves none of the routes silo knows ({tried})")]
    NoRoute {
        /// What was asked.
        what: &'static str,
        /// Each route tried, with what E2B answered.
        tried: String,
    },
    /// The system gave no randomness for a create's idempotency key.
    #[error("cannot make an idempotency key: the system gives no randomness")]
    NoRandomness,
    /// E2B no longer knows the sandbox (killed, or its timeout passed).
    #[error("E2B has no sandbox {0} any more (killed, or its timeout passed)")]
    Gone(String),
    /// The sandbox is not running (paused), so E2B cannot snapshot it.
    #[error("E2B sandbox {0} is not running, so it cannot be snapshotted; resume it first")]
    NotRunning(String),
    /// envd did something silo did not expect.
    #[error("envd: {0}")]
    Envd(String),
    /// envd could not be reached through the proxy.
    #[error("cannot reach {what}")]
    EnvdUnreachable {
        /// What was asked.
        what: String,
        /// Why.
        #[source]
        source: ClientError,
    },
    /// A step every remote backend takes failed.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}
