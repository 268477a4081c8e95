//! Which protocol version a client speaks with one agent, and what that
//! version lets it ask for.
//!
//! The client learns the agent's versions once per client, shared by its
//! clones (from an exec upgrade's answer, or `GET /healthz`), speaks the
//! newest version both have, and checks every request's [`Feature`]
//! against it before sending anything,
//! so an agent too old for a request is refused here with a message that
//! says what is missing and what to do, rather than failing strangely on
//! the agent's side.

use silo_protocol::{Feature, Versions};

use super::ClientError;

/// What to do about an agent older than this silo.
pub const REBAKE_HINT: &str = "re-bake the image with this silo's agent (`silo image bake`) \
                               or start the sandbox with the mounted agent";

/// The version one client speaks with one agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spoken {
    /// The version announced on every request: the newest both speak.
    pub version: u32,
    /// What this client speaks (this build's range, unless pinned older).
    pub ours: Versions,
    /// What the agent speaks.
    pub theirs: Versions,
    /// The agent in messages: "in sandbox NAME" or "at ENDPOINT".
    pub agent: String,
}

impl Spoken {
    /// The newest version both sides speak, or why there is none.
    pub fn new(ours: Versions, theirs: Versions, agent: String) -> Result<Self, ClientError> {
        match ours.common(theirs) {
            Ok(version) => Ok(Self {
                version,
                ours,
                theirs,
                agent,
            }),
            Err(_) => Err(ClientError::NoCommonVersion {
                agent,
                ours,
                theirs,
                hint: if theirs.max < ours.min {
                    REBAKE_HINT.to_owned()
                } else {
                    format!("upgrade silo to one that speaks protocol {}", theirs.min)
                },
            }),
        }
    }

    /// Checks that the spoken version has `feature`; nothing is sent when
    /// it has not.
    pub fn require(&self, feature: Feature) -> Result<(), ClientError> {
        if feature.in_version(self.version) {
            Ok(())
        } else if !feature.in_version(self.theirs.max) {
            Err(ClientError::AgentTooOld {
                agent: self.agent.clone(),
                speaks: self.theirs.max,
                feature,
            })
        } else {
            Err(ClientError::ClientPinned {
                speaks: self.ours.max,
                feature,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use silo_protocol::PROTOCOL_VERSION;

    const V1: Versions = Versions { min: 1, max: 1 };

    #[test]
    fn an_older_agent_is_spoken_to_in_its_version_and_its_gaps_named() {
        let spoken = Spoken::new(Versions::OURS, V1, "in sandbox demo".into()).unwrap();
        assert_eq!(spoken.version, 1);
        assert!(spoken.require(Feature::Exec).is_ok());
        let err = spoken.require(Feature::Files).unwrap_err();
        assert!(matches!(err, ClientError::AgentTooOld { .. }));
        let text = err.to_string();
        for part in [
            "in sandbox demo",
            "speaks protocol 1",
            "no file API",
            "needs protocol 2",
            "silo image bake",
        ] {
            assert!(text.contains(part), "{text}");
        }
    }

    #[test]
    fn a_pinned_client_names_itself_as_the_limit() {
        let pinned = Versions::capped(1).unwrap();
        let spoken = Spoken::new(pinned, Versions::OURS, "at x".into()).unwrap();
        assert_eq!(spoken.version, 1);
        let err = spoken.require(Feature::Sessions).unwrap_err();
        assert!(
            matches!(err, ClientError::ClientPinned { speaks: 1, .. }),
            "{err}"
        );
        let newest = Spoken::new(Versions::OURS, Versions::OURS, "at x".into()).unwrap();
        assert_eq!(newest.version, PROTOCOL_VERSION);
        assert!(Feature::ALL.iter().all(|f| newest.require(*f).is_ok()));
    }

    #[test]
    fn no_common_version_says_which_side_to_upgrade() {
        let ancient = Versions { min: 0, max: 0 };
        let err = Spoken::new(Versions::OURS, ancient, "at x".into()).unwrap_err();
        assert!(err.to_string().contains("silo image bake"), "{err}");
        let future = Versions { min: 90, max: 99 };
        let err = Spoken::new(Versions::OURS, future, "at x".into()).unwrap_err();
        assert!(err.to_string().contains("upgrade silo"), "{err}");
    }
}
