//! The workload's restart policy: written by the controller into the agent's
//! command line (`--restart`) and kept in the sandbox spec, so both sides
//! spell each policy the same way.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// When the agent starts the workload again after it exits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Whatever the exit.
    Always,
    /// Unless it exited with code 0.
    #[default]
    OnFailure,
    /// Never; the agent keeps running without it.
    Never,
}

impl RestartPolicy {
    /// Every policy, in the order help lists them.
    pub const ALL: [Self; 3] = [Self::Always, Self::OnFailure, Self::Never];

    /// The policy's name on the agent's command line and in specs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "always",
            Self::OnFailure => "on-failure",
            Self::Never => "never",
        }
    }
}

impl fmt::Display for RestartPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A restart policy name that is not one of [`RestartPolicy::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown restart policy {0:?} (known: always, on-failure, never)")]
pub struct UnknownRestartPolicy(pub String);

impl FromStr for RestartPolicy {
    type Err = UnknownRestartPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownRestartPolicy(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_text_and_json() {
        for policy in RestartPolicy::ALL {
            assert_eq!(policy.as_str().parse::<RestartPolicy>(), Ok(policy));
            let json = serde_json::to_string(&policy).unwrap_or_default();
            assert_eq!(json, format!("\"{policy}\""));
        }
        let err = "sometimes".parse::<RestartPolicy>().unwrap_err();
        assert!(err.to_string().contains("on-failure"), "{err}");
    }
}
