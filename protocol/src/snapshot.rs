//! The snapshot channel: `POST /v1/snapshot` with a JSON
//! [`SnapshotRequest`]; the answer is the sandbox's changes since its image,
//! streamed as one image layer (`application/x-tar`).
//!
//! The agent finds what changed by itself, from inside the sandbox, so a
//! snapshot costs what changed rather than a walk of the engine's layers:
//! a path changed if its inode's ctime is at or after
//! [`SnapshotRequest::changed_since_ns`] (ctime cannot be set back by a
//! process, and every write, chmod, rename or link moves it), and a path of
//! [`SnapshotRequest::baseline`] that is gone from a changed directory was
//! deleted. A snapshot that builds on an earlier one of the same machine
//! asks for what changed since that one's [`HEADER_STOPPED_AT`], with the
//! earlier snapshot's whole tree as the baseline, and stays small.
//!
//! The agent keeps the tree of its last snapshot or rewind (the baseline it
//! used, with the layer's changes applied). A request may name that tree
//! by its [`tree_digest`] in [`SnapshotRequest::baseline_digest`] instead
//! of carrying its paths (protocol 5, [`crate::Feature::BaselineDigest`]):
//! the agent walks against it only if its own tree has exactly that digest,
//! and otherwise refuses with [`crate::ErrorKind::UnknownBaseline`], and
//! the client sends the paths. A digest covers every path, so the layer is
//! the one the paths would have given. The layer uses the image-layer
//! conventions every engine applies: paths relative to `/`, directories
//! before their entries, hard links to earlier entries, and a deletion as an
//! empty `.wh.<name>` entry ([`WHITEOUT_PREFIX`]) in its parent directory.
//!
//! The sandbox's processes (everything but the agent when it is PID 1; on
//! a machine it runs on beside the provider's own processes, started with
//! `--machine-agent`, only the agent's descendants) are stopped while the
//! layer is read and continued when its last byte is sent, so the layer is
//! one consistent moment. Such a layer comes back onto a machine that is
//! not an engine through [`crate::layers`]. A well-formed layer ends with the tar end marker;
//! a body without it was cut short and must be discarded.

use std::collections::BTreeSet;
use std::ops::Bound;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::http::PATH_SNAPSHOT;

/// Name prefix of a deletion marker in an image layer.
pub const WHITEOUT_PREFIX: &str = ".wh.";
/// Name of the marker that hides every lower entry of its directory.
pub const OPAQUE_WHITEOUT: &str = ".wh..wh..opq";
/// Name of the root directory's own entry in a layer: its mode, owner,
/// time and extended attributes. Every snapshot layer and restoring layer
/// has one, first; an engine ignores it (a container's root is its own
/// upper directory), so the agent applies it after the layer's entries.
pub const ROOT_ENTRY: &str = "./";
/// Content type of the answer.
pub const LAYER_CONTENT_TYPE: &str = "application/x-tar";
/// Answer header: how many processes the agent stopped for the layer.
pub const HEADER_STOPPED: &str = "x-silo-stopped";
/// Answer header: how many of those had not reached the stopped state when
/// the layer started (a process in uninterruptible sleep, say). A write of
/// theirs may be in the layer half done; the controller warns of it.
pub const HEADER_UNSETTLED: &str = "x-silo-unsettled";
/// Answer header: Unix nanoseconds on the machine's own clock once every
/// process had stopped, before the first path was read. Nothing in the
/// layer changed after it, so the next snapshot of the same machine need
/// only capture what changed since (less a margin for the coarse clock the
/// kernel stamps ctimes with).
pub const HEADER_STOPPED_AT: &str = "x-silo-stopped-at-ns";

/// How far before a snapshot's or a rewind's moment a path's ctime still
/// counts as changed: file times come from a coarse clock that ticks a few
/// milliseconds behind the fine one the moments are read from. A margin
/// can only make a snapshot larger, never miss a change.
pub const CTIME_MARGIN_NS: i64 = 20_000_000;

/// What the controller asks the agent to capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRequest {
    /// Unix nanoseconds before which the sandbox's image was complete and
    /// none of its processes had run: a baseline path whose ctime is at or
    /// after this changed. A path the baseline lacks is new, whatever its
    /// ctime.
    pub changed_since_ns: i64,
    /// Ignored: every directory is walked. Pruning by a directory's own
    /// ctime missed changes two levels below it (a directory's times move
    /// only when its own entries change, and fuse-overlayfs keeps a lower
    /// directory's times on copy-up). Controllers send `false`, so an agent
    /// from before this rule walks every directory too.
    pub prune_unchanged_dirs: bool,
    /// Ignored, as `prune_unchanged_dirs` is. A controller sends it (the
    /// machine's start) on a snapshot that builds on an earlier one, as
    /// protocol 4's `IncrementalSnapshot` asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descend_since_ns: Option<i64>,
    /// Absolute paths left out with everything under them (the controller's
    /// own mounts, the engine's `/etc/hosts` and the like). Mount points the
    /// agent finds in `/proc/self/mountinfo` are left out as well.
    pub exclude: Vec<String>,
    /// Every path of the image the sandbox was made from, relative to `/`
    /// and without a trailing slash: what the agent compares every
    /// directory's names against to find deletions and new paths. Empty
    /// when `baseline_digest` names it. Paths that are not UTF-8 travel in
    /// `baseline_raw`; [`SnapshotRequest::set_baseline`] splits a list.
    pub baseline: Vec<String>,
    /// The baseline's paths that are not UTF-8, each as its bytes (protocol
    /// 7, [`crate::Feature::ByteNames`]): a name is bytes on Linux, and a
    /// path the baseline lacks would be taken for new and, once deleted,
    /// never for gone. An older agent ignores the field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline_raw: Vec<Vec<u8>>,
    /// The [`tree_digest`] of the baseline, sent instead of its paths to
    /// an agent that may hold it (protocol 5): the agent uses the tree it
    /// kept if that tree has this digest, else it refuses with
    /// `unknown_baseline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_digest: Option<String>,
    /// Where changes can be, as the host sees the machine's file system
    /// (protocol 6): directories outside it hold none, so the agent need
    /// not read them. `None`: every directory is walked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walk_hint: Option<WalkHint>,
    /// Rewinds only: the snapshot gone back to, named in the exits of the
    /// commands the rewind ends ([`crate::exec::ExitInfo::ended_by_rewind`]).
    /// An agent that does not know the field ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewind_to: Option<String>,
    /// Rewinds only (protocol 10, [`crate::Feature::BlockRewind`]): follow
    /// each changed regular file's record by its block sums where it has
    /// one name and at least [`crate::blocks::MIN_SUMMED_BYTES`], so the
    /// restoring layer can patch it. An older agent ignores the field.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub block_sums: bool,
}

impl SnapshotRequest {
    /// Sets the baseline to `paths`: the UTF-8 ones in `baseline`, the
    /// others in `baseline_raw`.
    pub fn set_baseline(&mut self, paths: Vec<Vec<u8>>) {
        self.baseline.clear();
        self.baseline_raw.clear();
        for path in paths {
            match String::from_utf8(path) {
                Ok(text) => self.baseline.push(text),
                Err(raw) => self.baseline_raw.push(raw.into_bytes()),
            }
        }
    }

    /// Takes every path of the baseline, UTF-8 or not, leaving it empty.
    pub fn take_baseline(&mut self) -> Vec<Vec<u8>> {
        let mut paths: Vec<Vec<u8>> = std::mem::take(&mut self.baseline)
            .into_iter()
            .map(String::into_bytes)
            .collect();
        paths.append(&mut self.baseline_raw);
        paths
    }
}

/// The directories a change can be in, read by the host from the upper
/// layer of the machine's overlay file system (Docker's and Podman's
/// overlay2 and fuse-overlayfs drivers): anything a process changes, makes
/// or deletes puts its directory, and every directory above it, in the
/// upper layer, so a directory that is not there holds exactly what the
/// image has, as it did at every earlier snapshot.
///
/// The host reads the list before the agent stops the sandbox's
/// processes. A directory made in the upper layer since (made, copied up,
/// or renamed) has a ctime at or after `since_ns`, so the agent walks
/// into every directory that is in `dirs`, or changed, or has such a
/// ctime. An agent that does not know where every path of its baseline
/// was (it has no kept tree, see [`SnapshotRequest::baseline_digest`])
/// walks everything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalkHint {
    /// Every directory of the upper layer, relative to `/` (`""` is the
    /// root), without a trailing slash.
    pub dirs: Vec<String>,
    /// Unix ns on the machine's clock before the host began reading
    /// `dirs`, less a margin for the coarse clock of file times.
    pub since_ns: i64,
}

/// The digest a baseline is named by: lowercase hex SHA-256 of its paths in
/// byte order, each followed by a NUL byte (the path index's encoding,
/// uncompressed). Both sides hash the same sorted, duplicate-free list.
pub fn tree_digest<'a>(sorted_paths: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut hasher = Sha256::new();
    for path in sorted_paths {
        hasher.update(path);
        hasher.update([0u8]);
    }
    hex::encode(hasher.finalize())
}

/// The paths strictly under directory `dir` in a sorted tree (`dir` itself
/// left out), cloned so the caller may remove them: both sides drop a
/// removed or replaced directory's contents from their trees by this one
/// rule, so the trees they hash with [`tree_digest`] stay equal.
/// Descendants sort between `dir/` and `dir0`, since `0` follows `/`.
pub fn paths_under(paths: &BTreeSet<Vec<u8>>, dir: &[u8]) -> Vec<Vec<u8>> {
    let (mut low, mut high) = (dir.to_vec(), dir.to_vec());
    low.push(b'/');
    high.push(b'0');
    paths
        .range::<[u8], _>((
            Bound::Included(low.as_slice()),
            Bound::Excluded(high.as_slice()),
        ))
        .cloned()
        .collect()
}

/// What one layer does to a tree of paths (the path index's form:
/// relative, joined by one `/`, names as bytes): the paths it hides with everything under
/// them (`.wh.NAME`), the paths it empties of what lower layers had below
/// them (a directory's `.wh..wh..opq`, `""` being the root, and every
/// entry that is not a directory: a file or link put where a directory
/// was replaces it whole, as every engine applies it), and the paths it
/// adds, each with its parent directories, as a marker's directory is
/// added too. Removals go before additions. The controller's store reads it from a layer's
/// headers and the agent from what it wrote or placed; both apply it to
/// the trees they name by [`tree_digest`], so it is recorded by one set of
/// rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerPaths {
    hidden: Vec<Vec<u8>>,
    opaque: Vec<Vec<u8>>,
    added: BTreeSet<Vec<u8>>,
}

impl LayerPaths {
    /// An entry at `path`: it and each missing parent are added.
    pub fn entry(&mut self, path: &[u8]) {
        let mut path = path;
        // An ancestor already added brought its own ancestors along.
        while !path.is_empty() && self.added.insert(path.to_vec()) {
            path = split_parent(path).0;
        }
    }

    /// A whiteout of `path`, which sits in `path`'s parent directory.
    pub fn hide(&mut self, path: &[u8]) {
        self.entry(split_parent(path).0);
        self.hidden.push(path.to_vec());
    }

    /// An opaque marker in `dir`.
    pub fn make_opaque(&mut self, dir: &[u8]) {
        self.entry(dir);
        self.opaque.push(dir.to_vec());
    }

    /// An entry at `path` that is not a directory: it is added, and
    /// whatever lower layers had below `path` is gone (a directory that
    /// became a symlink or a file leaves none of its entries behind).
    pub fn replace(&mut self, path: &[u8]) {
        self.entry(path);
        self.opaque.push(path.to_vec());
    }

    /// An entry at `path`, a directory or not ([`LayerPaths::entry`] or
    /// [`LayerPaths::replace`]).
    pub fn entry_of_kind(&mut self, path: &[u8], is_dir: bool) {
        if is_dir {
            self.entry(path);
        } else {
            self.replace(path);
        }
    }

    /// The paths hidden with everything under them, in the layer's order.
    pub fn hidden(&self) -> &[Vec<u8>] {
        &self.hidden
    }

    /// The paths emptied of what lower layers had below them (opaque
    /// directories and entries that are not directories).
    pub fn opaque(&self) -> &[Vec<u8>] {
        &self.opaque
    }

    /// The paths added, parents included, sorted.
    pub fn added(&self) -> &BTreeSet<Vec<u8>> {
        &self.added
    }
}

/// `a/b/c` → (`a/b`, `c`); `c` → (``, `c`).
pub fn split_parent(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(at) => (&path[..at], &path[at + 1..]),
        None => (&[], path),
    }
}

/// `name` inside `dir` (`""` is the root).
pub fn join_child(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    if !dir.is_empty() {
        path.extend_from_slice(dir);
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// The request path (the snapshot takes no query).
pub fn path() -> &'static str {
    PATH_SNAPSHOT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layers_paths_bring_their_parents_and_markers_their_directories() {
        let mut layer = LayerPaths::default();
        layer.entry(b"usr/bin/env");
        layer.hide(b"etc/old");
        layer.make_opaque(b"var/cache");
        layer.hide(&join_child(b"", b"gone\xff"));
        assert_eq!(layer.hidden(), [&b"etc/old"[..], b"gone\xff"]);
        assert_eq!(layer.opaque(), [b"var/cache"]);
        let added: Vec<&[u8]> = layer.added().iter().map(Vec::as_slice).collect();
        assert_eq!(
            added,
            [
                &b"etc"[..],
                b"usr",
                b"usr/bin",
                b"usr/bin/env",
                b"var",
                b"var/cache"
            ]
        );
        assert_eq!(split_parent(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split_parent(b"c"), (&b""[..], &b"c"[..]));
        assert_eq!(join_child(b"a/b", b"c"), b"a/b/c");
    }

    #[test]
    fn an_entry_that_is_not_a_directory_empties_its_path() {
        let mut layer = LayerPaths::default();
        layer.entry_of_kind(b"w/d", false);
        layer.entry_of_kind(b"w/e", true);
        assert_eq!(layer.opaque(), [b"w/d"]);
        let added: Vec<&[u8]> = layer.added().iter().map(Vec::as_slice).collect();
        assert_eq!(added, [&b"w"[..], b"w/d", b"w/e"]);
    }

    #[test]
    fn paths_under_a_directory_leave_out_it_and_its_look_alike_siblings() {
        let paths: BTreeSet<Vec<u8>> = ["a", "a b", "a-x", "a/b", "a/b/c", "a0", "ab", "b"]
            .into_iter()
            .map(|path| path.as_bytes().to_vec())
            .collect();
        assert_eq!(paths_under(&paths, b"a"), [&b"a/b"[..], b"a/b/c"]);
        assert_eq!(paths_under(&paths, b"a/b"), [b"a/b/c"]);
        assert!(paths_under(&paths, b"b").is_empty());
    }

    #[test]
    fn a_request_round_trips_through_json() {
        let request = SnapshotRequest {
            changed_since_ns: 1_700_000_000_000_000_000,
            prune_unchanged_dirs: true,
            descend_since_ns: Some(1_600_000_000_000_000_000),
            exclude: vec!["/.silo".into()],
            baseline: vec!["etc".into(), "etc/passwd".into()],
            baseline_raw: vec![b"etc/\xff".to_vec()],
            baseline_digest: Some(tree_digest([&b"etc"[..], b"etc/passwd"])),
            walk_hint: None,
            rewind_to: None,
            block_sums: false,
        };
        let text = serde_json::to_string(&request).unwrap();
        assert_eq!(
            serde_json::from_str::<SnapshotRequest>(&text).unwrap(),
            request
        );
        assert_eq!(path(), "/v1/snapshot");
    }

    #[test]
    fn a_request_without_descend_since_still_parses() {
        let text =
            r#"{"changed_since_ns":5,"prune_unchanged_dirs":true,"exclude":[],"baseline":[]}"#;
        let request: SnapshotRequest = serde_json::from_str(text).unwrap();
        assert_eq!(request.descend_since_ns, None);
        assert_eq!(request.baseline_digest, None);
        assert!(request.baseline_raw.is_empty());
    }

    #[test]
    fn a_baseline_keeps_names_that_are_not_utf8_apart() {
        let mut request: SnapshotRequest = serde_json::from_str(
            r#"{"changed_since_ns":5,"prune_unchanged_dirs":false,"exclude":[],"baseline":["old"]}"#,
        )
        .unwrap();
        request.set_baseline(vec![b"etc".to_vec(), b"etc/\xffname".to_vec()]);
        assert_eq!(request.baseline, ["etc"]);
        assert_eq!(request.baseline_raw, [b"etc/\xffname".to_vec()]);
        let text = serde_json::to_string(&request).unwrap();
        let mut back: SnapshotRequest = serde_json::from_str(&text).unwrap();
        assert_eq!(back.take_baseline(), [&b"etc"[..], b"etc/\xffname"]);
        assert!(back.baseline.is_empty() && back.baseline_raw.is_empty());
    }

    #[test]
    fn a_tree_digest_covers_every_path_and_its_end() {
        let digest = tree_digest([&b"etc"[..], b"etc/passwd"]);
        assert_eq!(digest.len(), 64);
        assert_eq!(digest, tree_digest([&b"etc"[..], b"etc/passwd"]));
        // The NUL after each path keeps `ab` apart from `a` then `b`.
        assert_ne!(tree_digest([&b"ab"[..]]), tree_digest([&b"a"[..], b"b"]));
        assert_ne!(digest, tree_digest([&b"etc"[..]]));
        assert_eq!(
            tree_digest([]),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
