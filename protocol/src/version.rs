//! Protocol versioning.
//!
//! The version is a single integer bumped on any incompatible wire change. The
//! client sends it in [`crate::http::HEADER_PROTOCOL`] on every request and the
//! agent refuses a mismatch before doing anything else, naming both versions,
//! so a stale agent baked into an old image fails loudly instead of strangely.

/// The protocol version spoken by this build.
pub const PROTOCOL_VERSION: u32 = 1;

/// Checks the version a peer announced against ours.
///
/// `announced` is the raw header value, or `None` when the header was absent.
pub fn check_peer(announced: Option<&str>) -> Result<(), VersionError> {
    let raw = announced.ok_or(VersionError::Missing)?;
    let theirs: u32 = raw
        .trim()
        .parse()
        .map_err(|_| VersionError::Unparsable(raw.to_owned()))?;
    if theirs == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(VersionError::Mismatch {
            ours: PROTOCOL_VERSION,
            theirs,
        })
    }
}

/// Why a peer's protocol version was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VersionError {
    /// The peer did not say which version it speaks.
    #[error("peer did not announce a protocol version (expected {PROTOCOL_VERSION})")]
    Missing,
    /// The announced version is not a number.
    #[error("peer announced an unreadable protocol version {0:?}")]
    Unparsable(String),
    /// Both sides speak different versions.
    #[error(
        "protocol version mismatch: this side speaks {ours}, the peer speaks {theirs}; \
         upgrade the older of silo and silo-agent"
    )]
    Mismatch {
        /// Our version.
        ours: u32,
        /// The peer's version.
        theirs: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_own_version_and_refuses_others() {
        assert_eq!(check_peer(Some(&PROTOCOL_VERSION.to_string())), Ok(()));
        assert_eq!(check_peer(None), Err(VersionError::Missing));
        assert!(matches!(
            check_peer(Some("x")),
            Err(VersionError::Unparsable(_))
        ));
        let err = check_peer(Some("999")).unwrap_err();
        assert!(err.to_string().contains("999"), "{err}");
    }
}
