//! [`DaytonaError`]: why a Daytona backend operation failed, each naming
//! what was asked and what Daytona (its API, its toolbox, or the agent)
//! answered. What every provider shares (its configuration, a call that
//! failed or was refused, a step every remote backend takes) is wrapped
//! whole; the rest is Daytona's own.

use crate::backend::remote::config::ProviderConfigError;
use crate::backend::remote::error::RemoteError;
use crate::backend::remote::rest::RestError;

/// Why a Daytona operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaytonaError {
    /// The configuration is incomplete or wrong.
    #[error(transparent)]
    Config(#[from] ProviderConfigError),
    /// Daytona (its API, a toolbox) could not be reached, kept saying
    /// "later", or refused.
    #[error(transparent)]
    Rest(#[from] RestError),
    /// Daytona no longer knows the sandbox.
    #[error("Daytona has no sandbox {0} any more (deleted, or auto-deleted)")]
    Gone(String),
    /// The sandbox ended in a state silo cannot use.
    #[error("Daytona sandbox {id} is {state}{}", reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    BadState {
        /// The Daytona sandbox id.
        id: String,
        /// Its state.
        state: String,
        /// Daytona's reason, when it gave one.
        reason: Option<String>,
    },
    /// The sandbox did not reach the state asked for in time.
    #[error("Daytona sandbox {id} did not become {wanted} within {secs} s (it is {state})")]
    Timeout {
        /// The Daytona sandbox id.
        id: String,
        /// The state waited for.
        wanted: &'static str,
        /// The last state seen.
        state: String,
        /// How long silo waited.
        secs: u64,
    },
    /// A Daytona answer did not have the shape its spec gives.
    #[error("Daytona answered {what} in an unexpected shape: {why}")]
    Unexpected {
        /// What was read.
        what: &'static str,
        /// What was wrong.
        why: String,
    },
    /// A step every remote backend takes failed.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}
