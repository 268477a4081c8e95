//! The layer apply channel (new with remote backends): `POST /v1/layers`
//! with one uncompressed image layer as the body, its SHA-256 in the signed
//! `x-silo-content-sha256` header. The only query is `rewind=TOKEN`
//! (protocol 3), which finishes an in-place rewind (see [`crate::rewind`]):
//! the layer is applied under that rewind's hold, which then ends. The
//! answer is an
//! [`ApplyResponse`] (JSON), or the usual [`crate::http::ErrorBody`] with
//! one of the [`crate::ErrorKind`] values.
//!
//! This is how a snapshot restores on a machine that is not a Docker
//! engine (an E2B or Daytona VM): the controller sends the snapshot's
//! layers, base first, one request each, and the agent applies each onto
//! its root file system. The body follows the conventions the snapshot
//! endpoint writes ([`crate::snapshot`]): paths relative to `/`,
//! directories before their entries, hard links naming an earlier entry of
//! the same layer, `.wh.NAME` ([`WHITEOUT_PREFIX`]) deleting `NAME` in its
//! directory and `.wh..wh..opq` ([`OPAQUE_WHITEOUT`]) hiding everything
//! the directory held before this layer.
//!
//! The agent streams the body into a staging directory, checking every
//! entry and, at the end, the body's hash; only then does it touch the live
//! tree. So a refused layer (not a tar, a hash mismatch, a `..` or absolute
//! name, an entry whose parent on the machine is a symlink or a file, a path
//! at or under `/proc`, `/sys`, `/dev`, `/.silo` or a mount point) changes
//! nothing. Once the layer is whole, removals come first (whiteouts, then
//! the contents of opaque directories: a layer's markers hide what was
//! there before it, never its own entries), then the entries in layer
//! order, then the directories' modes and times. Ownership, modes (setuid
//! and setgid included) and modification times are the layer's; devices
//! and FIFOs are never created but listed in [`ApplyResponse::skipped`].
//! A failure after the first live change is answered with
//! [`crate::ErrorKind::Incomplete`]: the machine holds part of the layer and should be
//! made afresh. An agent killed while placing (protocol 3 and later) finds
//! the staged layer and its journal under `/.silo/layers` when it starts
//! again and finishes placing it before it serves anything.
//!
//! One apply runs at a time, never beside a snapshot (either is refused
//! with [`crate::ErrorKind::Busy`] while the other runs), and pushes wait while an
//! apply changes the live tree.

use serde::{Deserialize, Serialize};

use crate::http::PATH_LAYERS;
pub use crate::snapshot::{LAYER_CONTENT_TYPE, OPAQUE_WHITEOUT, WHITEOUT_PREFIX};

/// Largest layer body the agent takes, in bytes.
pub const MAX_LAYER_BYTES: u64 = 64 * 1024 * 1024 * 1024;
/// Most entries one layer may hold (the agent keeps one plan step per entry).
pub const MAX_LAYER_ENTRIES: u64 = 2_000_000;
/// Most skipped entries listed by name in an answer; the count is exact.
pub const MAX_SKIPPED_LISTED: usize = 100;

/// What the agent did with a layer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyResponse {
    /// Hex SHA-256 of the layer applied.
    pub sha256: String,
    /// Entries that changed the machine: every directory, file, symlink,
    /// hard link, FIFO and whiteout or opaque marker below.
    pub entries: u64,
    /// Directories made or given the layer's metadata.
    pub dirs: u64,
    /// Regular files placed.
    pub files: u64,
    /// Their total size in bytes.
    pub bytes: u64,
    /// Symlinks placed.
    pub symlinks: u64,
    /// Hard links made.
    pub hard_links: u64,
    /// Named pipes made (sent by agents since FIFOs are applied).
    #[serde(default)]
    pub fifos: u64,
    /// Whiteout and opaque markers carried out.
    pub whiteouts: u64,
    /// Entries left out, whatever the reason (exact, unlike the list).
    pub skipped_count: u64,
    /// The first [`MAX_SKIPPED_LISTED`] entries left out, and why.
    pub skipped: Vec<Skipped>,
    /// Owners (uid, gid) were set as the layer says. False when the agent
    /// does not run as root: everything is then owned by the agent's user.
    pub owners_applied: bool,
    /// Milliseconds the apply took, from the request to the answer.
    pub ms: u64,
    /// Unix ns on the machine's clock once the layer was in place: a path
    /// whose ctime is at or after it changed after the apply. Sent by
    /// agents of protocol 3 and later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at_ns: Option<i64>,
}

/// The last layer an agent placed on its machine, as `GET /healthz`
/// reports it: a controller that died while its layer was placed learns
/// from it that the layer is in (the agent keeps it across restarts, and
/// one that finished a cut apply at boot reports that layer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedLayer {
    /// Hex SHA-256 of the layer.
    pub sha256: String,
    /// Unix ns on the machine's clock once it was in place.
    pub applied_at_ns: i64,
}

/// One entry the agent left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// The entry's name in the layer (lossy UTF-8).
    pub path: String,
    /// Why it was left out.
    pub reason: SkipReason,
}

/// Why an entry was left out rather than applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// A character or block device: the agent never makes device nodes.
    Device,
    /// A named pipe, from an agent that did not make FIFOs (agents now
    /// make them as any other entry).
    Fifo,
    /// The name is not UTF-8 (the path index and snapshot baselines are
    /// UTF-8, so such a path could not be tracked afterwards).
    NotUtf8,
    /// The engine's own `.wh..wh.` bookkeeping, never file system content.
    EngineMetadata,
    /// The root directory itself: its metadata is the machine's.
    Root,
    /// A tar entry type with no file system meaning here (sparse,
    /// contiguous, vendor types).
    Unsupported,
}

/// The request path (the apply takes no query).
pub fn path() -> &'static str {
    PATH_LAYERS
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn an_answer_round_trips_and_reasons_are_snake_case() {
        let answer = ApplyResponse {
            sha256: "ab".repeat(32),
            entries: 3,
            files: 1,
            skipped_count: 1,
            skipped: vec![Skipped {
                path: "dev/null".into(),
                reason: SkipReason::NotUtf8,
            }],
            owners_applied: true,
            ..ApplyResponse::default()
        };
        let text = serde_json::to_string(&answer).unwrap();
        assert!(text.contains(r#""reason":"not_utf8""#), "{text}");
        assert_eq!(
            serde_json::from_str::<ApplyResponse>(&text).unwrap(),
            answer
        );
        assert_eq!(path(), "/v1/layers");
    }
}
