//! The `GET /healthz` answer: the one request that needs no signature, so a
//! controller can tell "agent is up" from "agent rejects my key".

use serde::{Deserialize, Serialize};

use crate::layers::PlacedLayer;
use crate::version::Versions;

/// What a live agent says about itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Health {
    /// The agent's crate version.
    pub agent_version: String,
    /// The newest protocol version the agent speaks.
    pub protocol_version: u32,
    /// The oldest protocol version the agent speaks; absent from agents
    /// before version 2, which spoke only their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_min: Option<u32>,
    /// Milliseconds since the agent started.
    pub uptime_ms: u64,
    /// Random id drawn at start; changes when the agent restarts, so a client can
    /// tell that exec ids it remembers are gone.
    pub boot_id: String,
    /// The agent's pid in its own pid namespace (1 inside a container).
    pub pid: u32,
    /// The machine's clock when the agent answered (unix ms); absent from
    /// agents before it was added. File ctimes on the machine come from this
    /// clock, so a snapshot's "changed since" is read from it, never from
    /// the controller's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_ms: Option<i64>,
    /// The last layer placed on the machine, if any since its agent was
    /// first started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_layer: Option<PlacedLayer>,
    /// Hex SHA-256 of a layer being applied as the agent answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applying: Option<String>,
}

impl Health {
    /// The protocol versions the agent speaks.
    pub fn versions(&self) -> Versions {
        Versions {
            min: self
                .protocol_min
                .unwrap_or(self.protocol_version)
                .min(self.protocol_version),
            max: self.protocol_version,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn an_answer_from_an_agent_before_version_2_still_reads() {
        let old = r#"{"agent_version":"0.1.0","protocol_version":1,"uptime_ms":5,
                      "boot_id":"b","pid":1}"#;
        let health: Health = serde_json::from_str(old).unwrap();
        assert_eq!(health.versions(), Versions { min: 1, max: 1 });
        let new = Health {
            protocol_min: Some(1),
            protocol_version: 2,
            ..health
        };
        let text = serde_json::to_string(&new).unwrap();
        assert!(text.contains(r#""protocol_min":1"#), "{text}");
        assert_eq!(
            serde_json::from_str::<Health>(&text).unwrap().versions(),
            Versions { min: 1, max: 2 }
        );
    }
}
