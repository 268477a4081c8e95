//! [`Index`]: the set of paths in an image's file system, built by applying
//! its layers in order with the image-layer rules every engine applies.
//!
//! Paths are relative to `/`, without leading or trailing slash
//! (`etc/passwd`); the root itself is not a member. A layer is read headers
//! only into a [`LayerDelta`] (what it hides and what it adds), which is then
//! applied to the index of the layers below it:
//! - `<dir>/.wh.<name>` ([`WHITEOUT_PREFIX`]) hides `<dir>/<name>` and
//!   everything under it, and is not itself a path;
//! - `<dir>/.wh..wh..opq` ([`OPAQUE_WHITEOUT`]) hides everything under
//!   `<dir>` from lower layers;
//! - every other entry is added, with its parent directories (as the engine
//!   creates missing parents, whiteouts' parents included); one that is not
//!   a directory also hides everything lower layers had under its path (a
//!   symlink put where a directory was leaves none of its entries).
//!
//! A layer's markers hide only lower layers' paths, never its own, so a
//! delta's removals are applied before its additions. The engine's AUFS
//! metadata (`.wh..wh.plnk` and other `.wh..wh.` names) is skipped
//! (counted in [`LayerStats::skipped`]). A path is bytes, as a name is on
//! Linux: UTF-8 or not, it is a member like any other.
//!
//! An index is stored as gzip of its paths each followed by a NUL, in
//! sorted order: the same set always encodes to the same bytes.

use std::collections::BTreeSet;
use std::io::{self, Read, Write};

use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use silo_protocol::members::Members;
use silo_protocol::snapshot::{
    LayerPaths, OPAQUE_WHITEOUT, WHITEOUT_PREFIX, join_child, paths_under, split_parent,
};

use super::squash::normalize;

/// Names starting with this (other than [`OPAQUE_WHITEOUT`]) are the
/// engine's AUFS bookkeeping, never file system content.
const WHITEOUT_META_PREFIX: &[u8] = b".wh..wh.";

/// The set of paths of an image's file system.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    /// Sorted, so descendants of a directory are one range and the encoding
    /// is deterministic.
    paths: BTreeSet<Vec<u8>>,
}

/// What one layer holds, counted while reading it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Entries that are paths (whiteouts and skipped entries excluded).
    pub entries: u64,
    /// Whiteout and opaque markers.
    pub whiteouts: u64,
    /// Bytes of regular files.
    pub file_bytes: u64,
    /// Entries left out: AUFS metadata.
    pub skipped: u64,
}

/// One layer's effect on the paths below it, read from its headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerDelta {
    /// What it hides, empties and adds.
    paths: LayerPaths,
    /// Counts.
    stats: LayerStats,
}

/// Why a layer or an encoded index could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The layer is not a readable tar.
    #[error("cannot read layer tar")]
    Layer(#[source] io::Error),
    /// A layer entry's path leaves the root or names nothing.
    #[error("layer entry {path:?} is not a path inside the image")]
    BadPath {
        /// The entry's name as found (lossy where it is not UTF-8).
        path: String,
    },
    /// The encoded index could not be read or written.
    #[error("cannot {what} path index")]
    Io {
        /// "read" or "write".
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The encoded index decompressed but is not a list of paths.
    #[error("path index is corrupt: {0}")]
    Corrupt(&'static str),
}

impl LayerDelta {
    /// Reads a layer tar's headers (skipping file data) into its delta.
    pub fn read(reader: impl Read) -> Result<Self, IndexError> {
        let mut archive = tar::Archive::new(reader);
        let mut delta = Self::default();
        for entry in Members::new(archive.entries().map_err(IndexError::Layer)?) {
            let entry = entry.map_err(IndexError::Layer)?;
            let kind = entry.header.entry_type();
            let raw = entry.path;
            let Some(path) = normal(&raw)? else {
                continue; // the root directory
            };
            let (parent, name) = split_parent(&path);
            if name == OPAQUE_WHITEOUT.as_bytes() {
                delta.stats.whiteouts += 1;
                delta.paths.make_opaque(parent);
            } else if name.starts_with(WHITEOUT_META_PREFIX)
                || path.starts_with(WHITEOUT_META_PREFIX)
            {
                delta.stats.skipped += 1;
            } else if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
                if matches!(hidden, b"" | b"." | b"..") {
                    return Err(bad(&path));
                }
                delta.stats.whiteouts += 1;
                delta.paths.hide(&join_child(parent, hidden));
            } else {
                delta.stats.entries += 1;
                if matches!(kind, tar::EntryType::Regular | tar::EntryType::Continuous) {
                    delta.stats.file_bytes += entry.data.size();
                }
                // A file or link where a directory was replaces it whole.
                delta.paths.entry_of_kind(&path, kind.is_dir());
            }
        }
        Ok(delta)
    }

    /// What the layer held.
    pub fn stats(&self) -> LayerStats {
        self.stats
    }
}

impl Index {
    /// An empty index (no layers).
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one layer on top: its markers hide lower paths, then its
    /// entries are added.
    pub fn apply(&mut self, delta: &LayerDelta) {
        for path in delta.paths.hidden() {
            self.paths.remove(path.as_slice());
            self.remove_under(path);
        }
        for dir in delta.paths.opaque() {
            self.remove_under(dir);
        }
        self.paths.extend(delta.paths.added().iter().cloned());
    }

    /// Reads a layer tar (headers only) and applies it.
    pub fn apply_layer(&mut self, reader: impl Read) -> Result<LayerStats, IndexError> {
        let delta = LayerDelta::read(reader)?;
        self.apply(&delta);
        Ok(delta.stats)
    }

    /// The paths, sorted.
    pub fn paths(&self) -> impl Iterator<Item = &[u8]> {
        self.paths.iter().map(Vec::as_slice)
    }

    /// The paths, sorted, owned (a snapshot request's baseline).
    pub fn to_vec(&self) -> Vec<Vec<u8>> {
        self.paths.iter().cloned().collect()
    }

    /// The paths, sorted, as text (tests name paths that are UTF-8).
    #[cfg(test)]
    pub(crate) fn text_paths(&self) -> Vec<&str> {
        let text = |path| std::str::from_utf8(path).expect("a test path is UTF-8");
        self.paths().map(text).collect()
    }

    /// Whether `path` (normalized form) is in the image.
    pub fn contains(&self, path: impl AsRef<[u8]>) -> bool {
        self.paths.contains(path.as_ref())
    }

    /// How many paths.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Writes the encoding: gzip of the sorted paths, each followed by NUL.
    pub fn write_to(&self, out: impl Write) -> Result<(), IndexError> {
        let write_err = |source| IndexError::Io {
            what: "write",
            source,
        };
        let mut gz = GzEncoder::new(io::BufWriter::new(out), Compression::default());
        for path in &self.paths {
            gz.write_all(path).map_err(write_err)?;
            gz.write_all(b"\0").map_err(write_err)?;
        }
        gz.finish()
            .and_then(|mut out| out.flush())
            .map_err(write_err)
    }

    /// Reads what [`Index::write_to`] wrote.
    pub fn read_from(reader: impl Read) -> Result<Self, IndexError> {
        let mut bytes = Vec::new();
        GzDecoder::new(reader)
            .read_to_end(&mut bytes)
            .map_err(|source| IndexError::Io {
                what: "read",
                source,
            })?;
        Self::from_paths(&bytes)
    }

    /// The index of an uncompressed encoding: each path followed by a NUL,
    /// as a machine's agent lists them (`silo_protocol::index`).
    pub fn from_paths(bytes: &[u8]) -> Result<Self, IndexError> {
        let Some(body) = bytes.strip_suffix(b"\0") else {
            return match bytes.is_empty() {
                true => Ok(Self::default()),
                false => Err(IndexError::Corrupt("the last path is not terminated")),
            };
        };
        let mut paths = BTreeSet::new();
        for raw in body.split(|&b| b == 0) {
            match normalize(raw) {
                Some(Some(normal)) if normal == raw => {
                    paths.insert(normal);
                }
                _ => return Err(IndexError::Corrupt("a path is not in normal form")),
            }
        }
        Ok(Self { paths })
    }

    /// Removes every path strictly under `dir` (`""`: everything).
    fn remove_under(&mut self, dir: &[u8]) {
        if dir.is_empty() {
            self.paths.clear();
            return;
        }
        let doomed = paths_under(&self.paths, dir);
        for path in doomed {
            self.paths.remove(&path);
        }
    }
}

/// `./etc//passwd/` → `etc/passwd`; the root → `None`; `..` or NUL → error.
fn normal(raw: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
    match normalize(raw) {
        Some(path) if !raw.contains(&0) => Ok(path),
        _ => Err(bad(raw)),
    }
}

fn bad(raw: &[u8]) -> IndexError {
    IndexError::BadPath {
        path: String::from_utf8_lossy(&raw[..raw.len().min(4096)]).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::layer;

    fn paths(index: &Index) -> Vec<&str> {
        index.text_paths()
    }

    /// A layer of `names` (bytes) as empty files.
    fn raw_layer(names: &[&[u8]]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for name in names {
            let mut header = tar::Header::new_gnu();
            header.set_size(0);
            header.set_entry_type(tar::EntryType::Regular);
            let path = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name);
            builder.append_data(&mut header, path, &[][..]).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn names_that_are_not_utf8_are_paths_like_any_other() {
        let mut index = Index::new();
        let stats = index
            .apply_layer(&raw_layer(&[b"d\xff/f", b"e\xfe"])[..])
            .unwrap();
        assert_eq!(stats.skipped, 0);
        let paths: Vec<&[u8]> = index.paths().collect();
        assert_eq!(paths, [&b"d\xff"[..], b"d\xff/f", b"e\xfe"]);
        assert!(index.contains(b"e\xfe"));
        index.apply_layer(&raw_layer(&[b".wh.d\xff"])[..]).unwrap();
        let mut encoded = Vec::new();
        index.write_to(&mut encoded).unwrap();
        let back = Index::read_from(&encoded[..]).unwrap();
        assert_eq!(back, index);
        assert_eq!(back.paths().collect::<Vec<_>>(), [b"e\xfe"]);
    }

    #[test]
    fn entries_are_normalized_and_parents_added() {
        let mut index = Index::new();
        let stats = index
            .apply_layer(&layer(&[("./", 'd'), ("./etc/", 'd'), ("usr/bin/env", 'f')])[..])
            .unwrap();
        assert_eq!(paths(&index), ["etc", "usr", "usr/bin", "usr/bin/env"]);
        assert_eq!(
            stats,
            LayerStats {
                entries: 2,
                whiteouts: 0,
                file_bytes: 3,
                skipped: 0
            }
        );
    }

    #[test]
    fn whiteouts_remove_the_path_and_everything_under_it() {
        let mut index = Index::new();
        index
            .apply_layer(
                &layer(&[
                    ("etc/issue", 'f'),
                    ("etc/issue.d/a", 'f'),
                    ("etc/issuer", 'f'),
                    ("etc/issue-x", 'f'),
                    ("opt/app/lib/x", 'f'),
                    ("top", 'f'),
                ])[..],
            )
            .unwrap();
        let stats = index
            .apply_layer(
                &layer(&[
                    ("etc/.wh.issue", 'f'),
                    ("etc/.wh.issue.d", 'f'),
                    ("opt/.wh.app", 'f'),
                    (".wh.top", 'f'),
                ])[..],
            )
            .unwrap();
        assert_eq!(stats.whiteouts, 4);
        assert_eq!(stats.entries, 0);
        assert_eq!(paths(&index), ["etc", "etc/issue-x", "etc/issuer", "opt"]);
    }

    #[test]
    fn opaque_hides_lower_contents_but_not_its_own_layer() {
        let mut index = Index::new();
        index
            .apply_layer(&layer(&[("var/lib/a/x", 'f'), ("var/lib/b", 'f'), ("var/libx", 'f')])[..])
            .unwrap();
        // The new entry comes before the marker in the tar: order within a
        // layer must not matter.
        index
            .apply_layer(&layer(&[("var/lib/new", 'f'), ("var/lib/.wh..wh..opq", 'f')])[..])
            .unwrap();
        assert_eq!(paths(&index), ["var", "var/lib", "var/lib/new", "var/libx"]);
    }

    #[test]
    fn whiteouts_of_one_layer_do_not_hide_its_own_entries() {
        let mut index = Index::new();
        index.apply_layer(&layer(&[("a/old", 'f')])[..]).unwrap();
        index
            .apply_layer(&layer(&[("a/new", 'd'), ("a/new/f", 'f'), ("a/.wh.old", 'f')])[..])
            .unwrap();
        assert_eq!(paths(&index), ["a", "a/new", "a/new/f"]);
    }

    #[test]
    fn aufs_metadata_is_skipped_and_escapes_are_rejected() {
        let mut index = Index::new();
        let stats = index
            .apply_layer(&layer(&[(".wh..wh.plnk/123", 'f'), ("a/.wh..wh.aufs", 'f')])[..])
            .unwrap();
        assert_eq!(stats.skipped, 2);
        assert_eq!(paths(&index), Vec::<&str>::new());
        let mut raw = layer(&[("x", 'f')]);
        // `..` cannot be set through the builder; patch the name field.
        raw[..4].copy_from_slice(b"../x");
        let mut header = tar::Header::from_byte_slice(&raw[..512]).clone();
        header.set_cksum();
        raw[..512].copy_from_slice(header.as_bytes());
        assert!(matches!(
            index.apply_layer(&raw[..]),
            Err(IndexError::BadPath { .. })
        ));
        assert!(matches!(
            index.apply_layer(&b"not a tar"[..]),
            Err(IndexError::Layer(_))
        ));
    }

    #[test]
    fn the_encoding_round_trips_and_is_deterministic() {
        let mut index = Index::new();
        index
            .apply_layer(&layer(&[("etc/passwd", 'f'), ("bin/sh", 'f'), ("ünï/ç", 'f')])[..])
            .unwrap();
        let mut one = Vec::new();
        index.write_to(&mut one).unwrap();
        let mut two = Vec::new();
        index.clone().write_to(&mut two).unwrap();
        assert_eq!(one, two);
        assert_eq!(Index::read_from(&one[..]).unwrap(), index);

        let mut empty = Vec::new();
        Index::new().write_to(&mut empty).unwrap();
        assert!(Index::read_from(&empty[..]).unwrap().is_empty());

        let mut bad = Vec::new();
        let mut gz = GzEncoder::new(&mut bad, Compression::default());
        gz.write_all(b"/abs\0").unwrap();
        gz.finish().unwrap();
        assert!(matches!(
            Index::read_from(&bad[..]),
            Err(IndexError::Corrupt(_))
        ));
    }
}
