//! What differs between two stored trees (two stacks of layers, bottom
//! first), path by path, from the store alone. Two stacks can differ only
//! where a layer above the layers they share names a path (an entry, a
//! whiteout, an opaque directory), or below a path such a layer replaces
//! wholesale; each of those paths is looked up in both trees and compared
//! by what it is, its metadata and its bytes (hashed from the layers).
//!
//! A file with several names is one inode: every name a layer links to a
//! path looked at is looked at too, in both trees, and a name whose file
//! has other names in one tree than in the other differs in its links
//! ([`Aspect::Links`]), as a listing of the machine would show. A name
//! left in a layer below a new entry of another name of its file is the
//! case this catches: the new entry split the file in two.

use std::collections::BTreeSet;
use std::io::Read;

use serde::Serialize;
use sha2::{Digest as _, Sha256};
use tar::EntryType;

use super::table::{DataError, Entry, TableError, Tree};
use super::{Digest, Index, Store, StoreError};

/// How one path differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "change")]
pub enum PathChange {
    /// Only the second tree has it.
    Added,
    /// Only the first tree has it.
    Removed,
    /// Both have it, different in these respects.
    Changed {
        /// What differs, in a fixed order.
        what: Vec<Aspect>,
    },
}

/// One respect in which an entry differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Aspect {
    /// File, directory, symlink, FIFO, device.
    Kind,
    /// Permission bits (setuid, setgid and sticky included).
    Mode,
    /// Owner or group.
    Owner,
    /// A file's bytes.
    Content,
    /// A symlink's target.
    Target,
    /// Extended attributes.
    Xattrs,
    /// Modification time (to the nanosecond).
    Mtime,
    /// Which other names the file has (its hard links).
    Links,
}

/// A path that differs, relative to `/`, as bytes (not always UTF-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathDiff {
    /// The path.
    pub path: Vec<u8>,
    /// How.
    pub change: PathChange,
}

/// Why two trees could not be compared.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// A layer could not be read into a table.
    #[error(transparent)]
    Table(#[from] TableError),
    /// A file's bytes could not be read from its layer.
    #[error(transparent)]
    Read(#[from] DataError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What differs from the tree of `from` to the tree of `to`, sorted by
/// path (blocking), the root directory's own metadata first (the empty
/// path). Directories' times are left out: they move whenever an entry of
/// theirs does, which the entry's own line says.
///
/// Where both stand on a base whose files the store does not hold (a
/// provider's template, `unheld_base` its paths), a directory of the base
/// that one tree has in a layer (as the parent of a change) and the other
/// has from the base alone cannot be compared, and is not reported: as a
/// rewind leaves such a directory as it is.
pub fn diff(
    store: &Store,
    from: &[Digest],
    to: &[Digest],
    unheld_base: Option<&Index>,
) -> Result<Vec<PathDiff>, DiffError> {
    let shared = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    let (a, b) = (Tree::of(store, from)?, Tree::of(store, to)?);
    let mut paths: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut replaced: BTreeSet<Vec<u8>> = BTreeSet::new();
    for layer in a.layers()[shared..].iter().chain(&b.layers()[shared..]) {
        paths.extend(layer.paths().map(<[u8]>::to_vec));
        replaced.extend(layer.replaced().map(<[u8]>::to_vec));
    }
    for dir in &replaced {
        paths.extend(a.subtree(dir));
        paths.extend(b.subtree(dir));
    }
    let linked: Vec<Vec<u8>> = paths
        .iter()
        .flat_map(|path| [link_names(&a, path), link_names(&b, path)])
        .flatten()
        .collect();
    paths.extend(linked);
    let mut out = Vec::new();
    // The root's own metadata, under the empty path, where both trees
    // know it.
    if let (Some(old), Some(new)) = (a.root(), b.root()) {
        let what = metadata_differences(old, new);
        if !what.is_empty() {
            out.push(PathDiff {
                path: Vec::new(),
                change: PathChange::Changed { what },
            });
        }
    }
    for path in paths {
        let change = match (a.lookup(&path), b.lookup(&path)) {
            (None, None) => continue,
            (None, Some((_, one))) | (Some((_, one)), None)
                if one.is_dir() && unheld_base.is_some_and(|base| base.contains(&path)) =>
            {
                continue;
            }
            (None, Some(_)) => PathChange::Added,
            (Some(_), None) => PathChange::Removed,
            (Some(old), Some(new)) => {
                let what = differences(store, (from, &a, old), (to, &b, new), &path)?;
                if what.is_empty() {
                    continue;
                }
                PathChange::Changed { what }
            }
        };
        out.push(PathDiff { path, change });
    }
    Ok(out)
}

/// One side of a comparison: its layers, its tree, and what it has at the
/// path (the layer it comes from, and the entry).
type Side<'a> = (&'a [Digest], &'a Tree, (usize, &'a Entry));

/// The respects in which the two sides' entries at `path` differ.
fn differences(
    store: &Store,
    old: Side<'_>,
    new: Side<'_>,
    path: &[u8],
) -> Result<Vec<Aspect>, DiffError> {
    let (old_file, new_file) = (file_of(old, path), file_of(new, path));
    let (a, b) = (old_file.1, new_file.1);
    let mut what = metadata_differences(a, b);
    if kind(a) == EntryType::Regular && kind(b) == EntryType::Regular {
        // One entry of one layer on both sides has the same bytes.
        let same = old.0[old_file.0] == new.0[new_file.0] && a == b;
        if !same
            && (a.size != b.size
                || hash(store, old, old_file, path)? != hash(store, new, new_file, path)?)
        {
            what.push(Aspect::Content);
        }
    }
    if a.kind == EntryType::Symlink && a.link != b.link {
        what.push(Aspect::Target);
    }
    if !a.is_dir() && !b.is_dir() && link_names(old.1, path) != link_names(new.1, path) {
        what.push(Aspect::Links);
    }
    what.sort();
    what.dedup();
    Ok(what)
}

/// How two entries differ in what every entry has: kind, mode, owner,
/// extended attributes, and a time unless both are directories.
fn metadata_differences(a: &Entry, b: &Entry) -> Vec<Aspect> {
    let mut what = Vec::new();
    if kind(a) != kind(b) {
        what.push(Aspect::Kind);
    }
    if a.mode != b.mode {
        what.push(Aspect::Mode);
    }
    if (a.uid, a.gid) != (b.uid, b.gid) {
        what.push(Aspect::Owner);
    }
    if a.extras.xattrs != b.extras.xattrs {
        what.push(Aspect::Xattrs);
    }
    if !(a.is_dir() && b.is_dir()) && a.extras.mtime != b.extras.mtime {
        what.push(Aspect::Mtime);
    }
    what
}

/// Every name `tree` gives the file at `path` (`path` included), sorted:
/// the names its layer links together there that no layer above covers
/// (nothing when the tree has nothing at `path`).
fn link_names(tree: &Tree, path: &[u8]) -> Vec<Vec<u8>> {
    let Some((layer, _)) = tree.lookup(path) else {
        return Vec::new();
    };
    let mut names: Vec<Vec<u8>> = tree.layers()[layer]
        .link_group(path)
        .into_iter()
        .filter(|name| tree.lookup(name).is_some_and(|(at, _)| at == layer))
        .map(<[u8]>::to_vec)
        .collect();
    names.sort();
    names
}

/// A regular file and its hard links are one kind.
fn kind(entry: &Entry) -> EntryType {
    match entry.kind {
        EntryType::Continuous | EntryType::Link => EntryType::Regular,
        other => other,
    }
}

/// The entry whose data and metadata a side has at `path`: a hard link's
/// file in its own layer, else the entry itself; with its layer.
fn file_of<'a>(side: Side<'a>, path: &[u8]) -> (usize, &'a Entry) {
    let (_, tree, (layer, entry)) = side;
    if entry.kind != EntryType::Link {
        return (layer, entry);
    }
    let file = entry
        .link
        .as_deref()
        .and_then(|file| tree.layers()[layer].entry(file));
    match file {
        Some(file) => (layer, file),
        None => {
            tracing::debug!(path = %String::from_utf8_lossy(path), "a hard link to no file of its layer");
            (layer, entry)
        }
    }
}

/// SHA-256 of a file entry's bytes, read from its layer.
fn hash(
    store: &Store,
    side: Side<'_>,
    file: (usize, &Entry),
    path: &[u8],
) -> Result<[u8; 32], DiffError> {
    let (layers, _, _) = side;
    let (layer, entry) = file;
    let digest = &layers[layer];
    let mut data = entry.data(store.open_blob(digest)?, digest, path)?;
    let mut hasher = Sha256::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = data
            .read(&mut buf)
            .map_err(|source| DataError::new(digest, path, source))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::store::tests::{E, stored_layer as stored};

    const X: &[(&str, &[u8])] = &[("user.k", b"v")];

    fn changes(found: &[PathDiff]) -> Vec<(&[u8], &PathChange)> {
        found
            .iter()
            .map(|found| (found.path.as_slice(), &found.change))
            .collect()
    }

    fn changed(what: &[Aspect]) -> PathChange {
        PathChange::Changed {
            what: what.to_vec(),
        }
    }

    #[test]
    fn the_root_s_own_metadata_is_compared_under_the_empty_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (before, after) = (E::DirMode("./", 0o755), E::DirMode("./", 0o1777));
        let a = stored(&store, &[before, E::Dir("w")]);
        let b = stored(&store, &[E::Xattrs(&after, X), E::Dir("w")]);
        let found = diff(&store, std::slice::from_ref(&a), &[b], None).unwrap();
        assert_eq!(
            changes(&found),
            [(&b""[..], &changed(&[Aspect::Mode, Aspect::Xattrs]))]
        );
        // A tree that knows nothing of its root (no layer has one) is not
        // said to differ there.
        let none = stored(&store, &[E::Dir("w")]);
        assert!(diff(&store, &[a], &[none], None).unwrap().is_empty());
    }

    #[test]
    fn a_template_directory_that_only_parents_a_change_is_not_reported() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let template = Index::from_paths(b"sbin\0sbin/init\0").unwrap();
        let first = stored(&store, &[E::Dir("./")]);
        let next = stored(&store, &[E::Dir("./"), E::Dir("sbin"), E::Dir("sbin/new")]);
        let (from, to) = (std::slice::from_ref(&first), &[first.clone(), next][..]);
        let found = diff(&store, from, to, Some(&template)).unwrap();
        assert_eq!(changes(&found), [(&b"sbin/new"[..], &PathChange::Added)]);
        // Without the template's paths, its directory reads as added.
        assert_eq!(diff(&store, from, to, None).unwrap().len(), 2);
    }

    #[test]
    fn an_xattr_change_on_a_second_link_name_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let base = stored(
            &store,
            &[E::Dir("w"), E::File("w/a", "x"), E::Link("w/b", "w/a")],
        );
        // Both names captured again: the inode's change on each.
        let both = stored(
            &store,
            &[
                E::Dir("w"),
                E::Xattrs(&E::File("w/a", "x"), X),
                E::Xattrs(&E::Link("w/b", "w/a"), X),
            ],
        );
        let found = diff(
            &store,
            std::slice::from_ref(&base),
            &[base.clone(), both],
            None,
        )
        .unwrap();
        assert_eq!(
            changes(&found),
            [
                (&b"w/a"[..], &changed(&[Aspect::Xattrs])),
                (&b"w/b"[..], &changed(&[Aspect::Xattrs])),
            ]
        );
        // The second name alone captured (an overlay copies up the name
        // written through, alone): the other name is no longer its file's.
        let second = stored(&store, &[E::Dir("w"), E::Xattrs(&E::File("w/b", "x"), X)]);
        let found = diff(
            &store,
            std::slice::from_ref(&base),
            &[base.clone(), second],
            None,
        )
        .unwrap();
        assert_eq!(
            changes(&found),
            [
                (&b"w/a"[..], &changed(&[Aspect::Links])),
                (&b"w/b"[..], &changed(&[Aspect::Xattrs, Aspect::Links])),
            ]
        );
    }

    #[test]
    fn a_new_name_of_a_file_changes_the_links_of_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let base = stored(&store, &[E::Dir("w"), E::File("w/a", "x")]);
        let linked = stored(
            &store,
            &[E::Dir("w"), E::File("w/a", "x"), E::Link("w/c", "w/a")],
        );
        let found = diff(
            &store,
            std::slice::from_ref(&base),
            &[base.clone(), linked],
            None,
        )
        .unwrap();
        assert_eq!(
            changes(&found),
            [
                (&b"w/a"[..], &changed(&[Aspect::Links])),
                (&b"w/c"[..], &PathChange::Added),
            ]
        );
    }
}
