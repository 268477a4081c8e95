//! [`DaytonaError`]: why a Daytona backend operation failed, each naming
//! what was asked and what Daytona (its API, its toolbox, or the agent)
//! answered.

use super::config::DaytonaConfigError;
use crate::backend::remote::error::RemoteError;
use crate::backend::remote::rest::RestError;

/// Why a Daytona operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaytonaError {
    /// The configuration is incomplete or wrong.
    #[error(transparent)]
    Config(#[from] DaytonaConfigError),
    /// Daytona could not be reached, or kept saying "later".
    #[error(transparent)]
    Rest(#[from] RestError),
    /// The control plane or the toolbox answered with an error.
    #[error("Daytona refused to {what} ({status}): {message}{}", hint(*status))]
    Refused {
        /// What was asked.
        what: &'static str,
        /// Its HTTP status.
        status: u16,
        /// Daytona's message.
        message: String,
    },
    /// A sandbox's toolbox answered with an error.
    #[error(
        "the toolbox of Daytona sandbox {id} refused to {what} ({status}): {}",
        if message.is_empty() { "it gave no reason" } else { message.as_str() }
    )]
    ToolboxRefused {
        /// The Daytona sandbox id.
        id: String,
        /// What was asked.
        what: String,
        /// Its HTTP status.
        status: u16,
        /// The toolbox's message.
        message: String,
    },
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

/// What to do about an answer, when the status says it.
fn hint(status: u16) -> &'static str {
    match status {
        401 => " (check DAYTONA_API_KEY)",
        403 => " (the key's organization may not do this)",
        404 => " (check the snapshot name: silo up --image SNAPSHOT)",
        429 => " (the organization's quota or rate limit; remove sandboxes or wait)",
        _ => "",
    }
}
