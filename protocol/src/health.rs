//! The `GET /healthz` answer: the one request that needs no signature, so a
//! controller can tell "agent is up" from "agent rejects my key".

use serde::{Deserialize, Serialize};

/// What a live agent says about itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Health {
    /// The agent's crate version.
    pub agent_version: String,
    /// The protocol version the agent speaks.
    pub protocol_version: u32,
    /// Milliseconds since the agent started.
    pub uptime_ms: u64,
    /// Random id drawn at start; changes when the agent restarts, so a client can
    /// tell that exec ids it remembers are gone.
    pub boot_id: String,
    /// The agent's pid in its own pid namespace (1 inside a container).
    pub pid: u32,
}
