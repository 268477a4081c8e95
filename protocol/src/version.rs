//! Protocol versions, their negotiation, and the features each one has.
//!
//! A version is one integer, bumped whenever the wire gains or changes
//! something a peer must know about. Each side speaks a range of versions
//! ([`Versions`]): the agent accepts a request announcing any version in its
//! range (in [`crate::http::HEADER_PROTOCOL`]) and reports its range on
//! every answer and in `GET /healthz`; the controller learns the agent's
//! range and speaks the newest version both have ([`Versions::common`]).
//! What a version offers is the list of [`Feature`]s, each with the version
//! that brought it, so a client refuses a request the agent's version lacks
//! before sending it, and says which feature is missing.
//!
//! Changes stay additive (new endpoints, new messages, optional fields with
//! defaults), so an agent serves every version in its range the same way:
//! the announced version says what the client understands, and an agent
//! newer than its controller keeps serving it.

use std::fmt;

use crate::{files, http};

/// The newest protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 11;
/// The oldest protocol version this build still speaks.
pub const MIN_PROTOCOL_VERSION: u32 = 1;

/// Something a protocol version may or may not offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// Commands on the exec channel: exec, attach and replay, interrupt,
    /// status, stdin.
    Exec,
    /// `POST /v1/push`: bundles swapped in atomically at a mount.
    Push,
    /// `POST /v1/snapshot`: the sandbox's changes as an image layer.
    Snapshot,
    /// Shell sessions on the exec channel (`session` runs, open, list,
    /// close, interrupt).
    Sessions,
    /// Commands under a pseudo-terminal (`tty`, resize).
    Tty,
    /// The file API (`/v1/files/…`).
    Files,
    /// `POST /v1/layers`: an image layer applied onto the machine.
    Layers,
    /// `POST /v1/index`: every path of the machine's file system.
    Index,
    /// `POST /v1/rewind` and the layer apply that finishes it: the sandbox
    /// brought back to a snapshot in place.
    Rewind,
    /// Snapshots that build on the last one: the request's
    /// `descend_since_ns` and the answer's `x-silo-stopped-at-ns`
    /// ([`crate::snapshot`]), so a later snapshot of the same machine walks
    /// only what changed since an earlier one stopped its processes.
    IncrementalSnapshot,
    /// Baselines named by their digest: a snapshot or rewind request's
    /// `baseline_digest` ([`crate::snapshot`]) stands for the tree the
    /// agent kept from its last snapshot or rewind, and an agent without
    /// that tree answers [`crate::ErrorKind::UnknownBaseline`].
    BaselineDigest,
    /// A snapshot or rewind request's `walk_hint`
    /// ([`crate::snapshot::WalkHint`]): the directories a change can be
    /// in, as the host read them from the machine's overlay upper layer.
    WalkHint,
    /// Names as bytes: a snapshot or rewind request's `baseline_raw`
    /// ([`crate::snapshot::SnapshotRequest`]) carries the baseline's paths
    /// that are not UTF-8, and the agent indexes, applies and keeps them
    /// like any other (older agents left them out).
    ByteNames,
    /// [`crate::exec::ClientMessage::List`]: the execs the agent holds,
    /// with what they run.
    ExecList,
    /// Output offsets per stream: an attach may name where stdout and
    /// stderr each continue ([`crate::exec::StreamOffsets`]), and the
    /// agent says where each stands at the replay's first byte.
    StreamOffsets,
    /// `POST` [`crate::files::PATH_RENAME`]: a path moved to another name.
    FileRename,
    /// [`crate::http::PATH_DEADLINE`]: a lifetime after which the agent
    /// stops the sandbox, set and read at run time.
    Deadline,
    /// [`crate::exec::ClientMessage::Watch`]: a directory's changes
    /// streamed on the exec channel.
    Watch,
    /// The root directory's own entry ([`crate::snapshot::ROOT_ENTRY`]):
    /// every snapshot layer starts with it, a change list names it under
    /// the empty path when it changed, and a layer applied with it gives
    /// the root its mode, owner, time and attributes (older agents leave
    /// the root as it is).
    RootEntry,
    /// Block sums and patches ([`crate::blocks`]): a rewind request may
    /// ask for the block sums of changed files (`block_sums`), and a layer
    /// may carry a patch on a file instead of the whole file.
    BlockRewind,
    /// [`crate::http::PATH_SUSPEND`] and [`crate::http::PATH_RESUME`]
    /// ([`crate::suspend`]): the agent stops the sandbox's processes and
    /// lets go of every host socket so the runtime can checkpoint its
    /// memory, wakes with the key it then finds, and continues the
    /// processes when told.
    Suspend,
}

impl Feature {
    /// Every feature, oldest first.
    pub const ALL: [Self; 21] = [
        Self::Exec,
        Self::Push,
        Self::Snapshot,
        Self::Sessions,
        Self::Tty,
        Self::Files,
        Self::Layers,
        Self::Index,
        Self::Rewind,
        Self::IncrementalSnapshot,
        Self::BaselineDigest,
        Self::WalkHint,
        Self::ByteNames,
        Self::ExecList,
        Self::StreamOffsets,
        Self::FileRename,
        Self::Deadline,
        Self::Watch,
        Self::RootEntry,
        Self::BlockRewind,
        Self::Suspend,
    ];

    /// The first protocol version that has this feature.
    pub fn since(self) -> u32 {
        match self {
            Self::Exec | Self::Push => 1,
            Self::Snapshot
            | Self::Sessions
            | Self::Tty
            | Self::Files
            | Self::Layers
            | Self::Index => 2,
            Self::Rewind => 3,
            Self::IncrementalSnapshot => 4,
            Self::BaselineDigest => 5,
            Self::WalkHint => 6,
            Self::ByteNames => 7,
            Self::ExecList
            | Self::StreamOffsets
            | Self::FileRename
            | Self::Deadline
            | Self::Watch => 8,
            Self::RootEntry => 9,
            Self::BlockRewind => 10,
            Self::Suspend => 11,
        }
    }

    /// The feature an HTTP endpoint belongs to, by the path of a request
    /// target (its query ignored). `None` for `/healthz`, which every
    /// version has, and for paths the protocol does not have.
    pub fn of_path(path_and_query: &str) -> Option<Self> {
        let path = path_and_query
            .split_once('?')
            .map_or(path_and_query, |(path, _)| path);
        match path {
            http::PATH_EXEC => Some(Self::Exec),
            http::PATH_PUSH => Some(Self::Push),
            http::PATH_SNAPSHOT => Some(Self::Snapshot),
            files::PATH_FILE
            | files::PATH_STAT
            | files::PATH_LIST
            | files::PATH_MKDIR
            | files::PATH_TREE => Some(Self::Files),
            files::PATH_RENAME => Some(Self::FileRename),
            http::PATH_DEADLINE => Some(Self::Deadline),
            http::PATH_LAYERS => Some(Self::Layers),
            http::PATH_INDEX => Some(Self::Index),
            http::PATH_REWIND => Some(Self::Rewind),
            http::PATH_SUSPEND | http::PATH_RESUME => Some(Self::Suspend),
            _ => None,
        }
    }

    /// Whether protocol `version` has this feature.
    pub fn in_version(self, version: u32) -> bool {
        version >= self.since()
    }

    /// What the feature is called in messages ("which has no {name}").
    pub fn name(self) -> &'static str {
        match self {
            Self::Exec => "exec channel",
            Self::Push => "push endpoint",
            Self::Snapshot => "snapshot endpoint",
            Self::Sessions => "shell sessions",
            Self::Tty => "terminal (tty) execs",
            Self::Files => "file API",
            Self::Layers => "layer apply",
            Self::Index => "path index",
            Self::Rewind => "in-place rewind",
            Self::IncrementalSnapshot => "incremental snapshots",
            Self::BaselineDigest => "baselines named by digest",
            Self::WalkHint => "walk hints",
            Self::ByteNames => "names as bytes",
            Self::ExecList => "exec listing",
            Self::StreamOffsets => "per-stream output offsets",
            Self::FileRename => "file rename",
            Self::Deadline => "lifetime deadline",
            Self::Watch => "directory watches",
            Self::RootEntry => "the root directory's own entry",
            Self::BlockRewind => "rewinds by changed blocks",
            Self::Suspend => "suspend for a memory checkpoint",
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The protocol versions one side speaks: every version from `min` to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Versions {
    /// The oldest.
    pub min: u32,
    /// The newest.
    pub max: u32,
}

impl Versions {
    /// What this build speaks.
    pub const OURS: Self = Self {
        min: MIN_PROTOCOL_VERSION,
        max: PROTOCOL_VERSION,
    };

    /// This build's range with its newest version lowered to `max`, to act
    /// as an older peer would (the agent's `--max-protocol`, a client
    /// pinned to an older version; both for testing compatibility).
    pub fn capped(max: u32) -> Result<Self, VersionError> {
        if Self::OURS.contains(max) {
            Ok(Self { max, ..Self::OURS })
        } else {
            Err(VersionError::Unsupported {
                announced: max,
                ours: Self::OURS,
            })
        }
    }

    /// Whether `version` is in the range.
    pub fn contains(self, version: u32) -> bool {
        (self.min..=self.max).contains(&version)
    }

    /// Checks the version a request announced (the raw header value, or
    /// `None` when the header was absent) and returns it.
    pub fn admit(self, announced: Option<&str>) -> Result<u32, VersionError> {
        let raw = announced.ok_or(VersionError::Missing { ours: self })?;
        let announced: u32 = raw
            .trim()
            .parse()
            .map_err(|_| VersionError::Unparsable(raw.to_owned()))?;
        if self.contains(announced) {
            Ok(announced)
        } else {
            Err(VersionError::Unsupported {
                announced,
                ours: self,
            })
        }
    }

    /// The version to speak with a peer that speaks `theirs`: the newest
    /// both speak.
    pub fn common(self, theirs: Versions) -> Result<u32, VersionError> {
        let newest = self.max.min(theirs.max);
        if newest >= self.min.max(theirs.min) {
            Ok(newest)
        } else {
            Err(VersionError::Disjoint { ours: self, theirs })
        }
    }
}

impl fmt::Display for Versions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.max)
        } else {
            write!(f, "{} to {}", self.min, self.max)
        }
    }
}

/// Why a protocol version was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VersionError {
    /// The request did not say which version it speaks.
    #[error("the request announced no protocol version (this side speaks {ours})")]
    Missing {
        /// What this side speaks.
        ours: Versions,
    },
    /// The announced version is not a number.
    #[error("the request announced an unreadable protocol version {0:?}")]
    Unparsable(String),
    /// The announced version is outside this side's range.
    #[error(
        "protocol version {announced} is not spoken here (this side speaks {ours}); \
         upgrade the older of silo and silo-agent"
    )]
    Unsupported {
        /// What the peer announced.
        announced: u32,
        /// What this side speaks.
        ours: Versions,
    },
    /// The two sides have no version in common.
    #[error("no protocol version in common: this side speaks {ours}, the peer {theirs}")]
    Disjoint {
        /// What this side speaks.
        ours: Versions,
        /// What the peer speaks.
        theirs: Versions,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: Versions = Versions { min: 1, max: 1 };

    #[test]
    fn the_agent_admits_its_whole_range_and_names_what_it_refuses() {
        let ours = Versions::OURS;
        for version in MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION {
            assert_eq!(ours.admit(Some(&version.to_string())), Ok(version));
        }
        assert_eq!(ours.admit(Some(" 1 ")), Ok(1));
        assert_eq!(ours.admit(None), Err(VersionError::Missing { ours }));
        assert!(matches!(
            ours.admit(Some("x")),
            Err(VersionError::Unparsable(_))
        ));
        let err = ours.admit(Some("999")).unwrap_err();
        assert!(err.to_string().contains("999"), "{err}");
        assert!(
            err.to_string()
                .contains(&format!("1 to {PROTOCOL_VERSION}")),
            "{err}"
        );
        assert!(ours.admit(Some("0")).is_err());
        // An agent capped at 1 refuses 2, as an agent of version 1 does.
        let capped = Versions::capped(1).unwrap();
        assert_eq!(capped, V1);
        assert!(capped.admit(Some("2")).is_err());
        assert!(Versions::capped(PROTOCOL_VERSION + 1).is_err());
        assert!(Versions::capped(0).is_err());
    }

    #[test]
    fn both_sides_speak_the_newest_version_they_share() {
        let ours = Versions::OURS;
        assert_eq!(ours.common(ours), Ok(PROTOCOL_VERSION));
        // An older agent: we step down to it.
        assert_eq!(ours.common(V1), Ok(1));
        // A newer agent that still speaks ours: it steps down to us.
        let newer = Versions {
            min: 1,
            max: PROTOCOL_VERSION + 1,
        };
        assert_eq!(ours.common(newer), Ok(PROTOCOL_VERSION));
        // A newer agent that dropped ours, and a peer older than our oldest.
        let dropped = Versions {
            min: PROTOCOL_VERSION + 1,
            max: PROTOCOL_VERSION + 2,
        };
        let err = ours.common(dropped).unwrap_err();
        let range = format!("{} to {}", PROTOCOL_VERSION + 1, PROTOCOL_VERSION + 2);
        assert!(err.to_string().contains(&range), "{err}");
        let ancient = Versions { min: 0, max: 0 };
        assert!(ours.common(ancient).is_err());
    }

    #[test]
    fn the_protocol_document_states_the_versions_and_features() {
        let doc = include_str!("../../docs/protocol.md");
        let line = format!(
            "Protocol version: **{PROTOCOL_VERSION}** (oldest still spoken: **{MIN_PROTOCOL_VERSION}**)"
        );
        assert!(doc.contains(&line), "docs/protocol.md lacks {line:?}");
        for feature in Feature::ALL {
            let name = format!("{feature:?}").to_lowercase();
            let row = format!("| {name} | {} |", feature.since());
            assert!(doc.contains(&row), "docs/protocol.md lacks the row {row:?}");
        }
    }

    #[test]
    fn features_know_their_version() {
        assert!(Feature::Exec.in_version(1) && Feature::Push.in_version(1));
        for feature in [
            Feature::Snapshot,
            Feature::Sessions,
            Feature::Tty,
            Feature::Files,
        ] {
            assert!(!feature.in_version(1) && feature.in_version(2), "{feature}");
        }
        for feature in Feature::ALL {
            assert!(
                Versions::OURS.contains(feature.since()),
                "{feature} needs a version this build does not speak"
            );
        }
        assert_eq!(Feature::Files.to_string(), "file API");
        assert_eq!(
            Feature::of_path("/v1/files/stat?path=/a"),
            Some(Feature::Files)
        );
        assert_eq!(Feature::of_path("/v1/push?mount=/m"), Some(Feature::Push));
        assert_eq!(
            Feature::of_path(http::PATH_SNAPSHOT),
            Some(Feature::Snapshot)
        );
        assert_eq!(Feature::of_path(http::PATH_HEALTHZ), None);
        assert!(!Feature::Rewind.in_version(2) && Feature::Rewind.in_version(3));
        assert_eq!(Feature::of_path(http::PATH_REWIND), Some(Feature::Rewind));
        // Incremental snapshots share the snapshot endpoint: a request
        // field, not a path, needs version 4.
        assert!(
            !Feature::IncrementalSnapshot.in_version(3)
                && Feature::IncrementalSnapshot.in_version(4)
        );
        assert!(!Feature::BaselineDigest.in_version(4) && Feature::BaselineDigest.in_version(5));
    }
}
