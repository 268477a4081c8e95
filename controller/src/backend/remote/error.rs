//! [`RemoteError`]: why a step every provider backend takes the same way
//! failed (finding the agent to upload, reading it, this home's identity,
//! an agent that never answered through the proxy). Each provider's own
//! error carries it whole.

use crate::agent_binary::AgentBinaryError;

/// Why a provider-independent step of a remote backend failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The agent to upload could not be found.
    #[error(transparent)]
    AgentBinary(#[from] AgentBinaryError),
    /// The agent binary could not be read.
    #[error("cannot read the agent binary {path}")]
    ReadAgent {
        /// Its path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// This home's identity, which labels its machines, could not be read
    /// or made.
    #[error("cannot read or create this home's identity {path}")]
    HomeId {
        /// Its file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The provider's proxy refused the sandbox's access token, and again
    /// after a new one was fetched.
    #[error(
        "{provider}'s proxy refused the access token of sandbox {id} ({status}), \
         and the new one fetched after it lapsed as well"
    )]
    AccessLapsed {
        /// The provider, as people know it.
        provider: &'static str,
        /// The provider's id of the sandbox.
        id: String,
        /// The proxy's last answer.
        status: u16,
    },
    /// The agent was started but never answered through the provider's
    /// proxy.
    #[error("{provider} sandbox {id} started, but {why}")]
    AgentNotReady {
        /// The provider, as people know it.
        provider: &'static str,
        /// The provider's id of the sandbox.
        id: String,
        /// What the last probe saw.
        why: String,
    },
    /// A memory capture was asked of a provider that has none.
    #[error("{provider} cannot capture a sandbox with its memory")]
    NoMemoryCapture {
        /// The provider, as people know it.
        provider: &'static str,
    },
}
