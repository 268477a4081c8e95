//! A stored layer's entries by path, and a stack of layers read as the one
//! tree an engine would make of them: what an in-place rewind looks paths
//! up in (see [`super::rewind`]).
//!
//! A [`LayerTable`] is a layer read headers-only (data is skipped by
//! seeking, so a base image of hundreds of megabytes reads in the time of
//! its headers): each entry's kind, owner, mode, time, size, link and
//! where its data starts in the blob, and the layer's markers. Blobs are
//! named by their content, so a table never goes stale: tables are kept in
//! a process-wide cache of at most [`MAX_CACHED_ENTRIES`] entries (oldest
//! table out first), and a harness that rewinds again and again reads a
//! base image's headers once.
//!
//! The root directory's own entry ([`silo_protocol::snapshot::ROOT_ENTRY`])
//! is kept apart from the paths: it is no path of the tree, and no marker
//! hides it; the topmost layer's counts.
//!
//! A [`Tree`] is a stack of tables, bottom first, and answers with the
//! rules of [`super::index`] and [`super::squash`], exactly: the topmost
//! layer with an entry at a path gives it, unless a layer above hides the
//! path (a whiteout of it or of an ancestor, an opaque marker on an
//! ancestor, or a non-directory at an ancestor, which replaced the
//! directory and everything in it).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::ops::Bound;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use silo_protocol::extras::Extras;
use silo_protocol::members::{Member, Members};
use silo_protocol::snapshot::split_parent;
use tar::EntryType;

use super::squash::{Named, named, normalize};
use super::{Digest, Store, StoreError};

/// Most entries the cache of layer tables keeps, all tables together
/// (about 100 bytes each, path included).
pub const MAX_CACHED_ENTRIES: usize = 1_000_000;

/// One entry of a layer, as much of it as rewriting it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// What it is.
    pub kind: EntryType,
    /// Permission bits (setuid, setgid and sticky included).
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
    /// Modification time to the nanosecond and extended attributes, where
    /// the layer has them.
    pub extras: Extras,
    /// Size of its data.
    pub size: u64,
    /// Where its data starts in the layer's blob.
    pub data_at: u64,
    /// A symlink's target, or a hard link's target path in the same layer.
    pub link: Option<Box<[u8]>>,
}

impl Entry {
    /// Whether `other` is the same entry wherever it is stored: kind,
    /// mode, owner, attributes, size, link, and time but a directory's (it
    /// moves whenever an entry of it does, which the entries say; and an
    /// overlay may report a directory's new time only a moment later).
    pub fn same_as(&self, other: &Entry) -> bool {
        let time = self.is_dir() || self.extras.mtime == other.extras.mtime;
        time && (self.kind, self.mode, self.uid, self.gid, self.size)
            == (other.kind, other.mode, other.uid, other.gid, other.size)
            && self.extras.xattrs == other.extras.xattrs
            && self.link == other.link
    }

    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind == EntryType::Directory
    }

    /// The entry's data in `blob`, the layer it is an entry of (`layer`
    /// and `path` name it in errors).
    pub fn data<R: Read + Seek>(
        &self,
        mut blob: R,
        layer: &Digest,
        path: &[u8],
    ) -> Result<io::Take<BufReader<R>>, DataError> {
        blob.seek(SeekFrom::Start(self.data_at))
            .map_err(|source| DataError::new(layer, path, source))?;
        Ok(BufReader::new(blob).take(self.size))
    }
}

/// Why a file's data could not be read from its layer.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the data of {path:?} from layer {layer}")]
pub struct DataError {
    /// The layer.
    pub layer: String,
    /// The path.
    pub path: String,
    /// Why.
    #[source]
    pub source: io::Error,
}

impl DataError {
    /// Reading `path`'s data from `layer` failed with `source`.
    pub fn new(layer: &Digest, path: &[u8], source: io::Error) -> Self {
        Self {
            layer: layer.to_string(),
            path: String::from_utf8_lossy(path).into_owned(),
            source,
        }
    }
}

/// Why a layer could not be read into a table.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The layer is not a readable tar.
    #[error("cannot read layer {layer}")]
    Read {
        /// The layer.
        layer: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// An entry's name climbs out of the image or names nothing.
    #[error("layer {layer} has entry {path:?}, which is not a path inside the image")]
    BadPath {
        /// The layer.
        layer: String,
        /// The entry's name as found.
        path: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One layer's entries and markers, by path.
#[derive(Debug, Default)]
pub struct LayerTable {
    /// The root directory's own entry, if the layer has one.
    root: Option<Entry>,
    /// Entries by normalized path (relative to `/`).
    entries: BTreeMap<Box<[u8]>, Entry>,
    /// Paths hidden with everything under them (`.wh.NAME`).
    hidden: BTreeSet<Box<[u8]>>,
    /// Directories whose lower contents are hidden (`.wh..wh..opq`).
    opaque: BTreeSet<Box<[u8]>>,
    /// A file's path → the hard links to it in this layer.
    links: BTreeMap<Box<[u8]>, Vec<Box<[u8]>>>,
}

impl LayerTable {
    /// Reads a layer's headers (blocking).
    pub fn read(store: &Store, digest: &Digest) -> Result<Self, TableError> {
        let layer = || digest.to_string();
        let read_err = |source| TableError::Read {
            layer: layer(),
            source,
        };
        let bad_path = |path: &[u8]| TableError::BadPath {
            layer: layer(),
            path: String::from_utf8_lossy(path).into_owned(),
        };
        let mut archive = tar::Archive::new(BufReader::new(store.open_blob(digest)?));
        let mut table = Self::default();
        for member in Members::new(archive.entries_with_seek().map_err(read_err)?) {
            let Member {
                header,
                path: raw,
                link,
                extras,
                data,
            } = member.map_err(read_err)?;
            let kind = header.entry_type();
            let path = match named(&raw).ok_or_else(|| bad_path(&raw))? {
                Named::Root if kind == EntryType::Directory => Vec::new(),
                Named::Root | Named::Nothing => continue,
                Named::Opaque(dir) => {
                    table.opaque.insert(dir.into());
                    continue;
                }
                Named::Hidden(path) => {
                    table.hidden.insert(path.into());
                    continue;
                }
                Named::Path(path) => path,
            };
            let link = match (kind, link) {
                (EntryType::Link, Some(target)) => normalize(&target)
                    .ok_or_else(|| bad_path(&target))?
                    .map(Vec::into_boxed_slice),
                (_, target) => target.map(Vec::into_boxed_slice),
            };
            // An empty numeric field (some writers leave the owner blank)
            // reads as the engine reads it: zero.
            let entry = Entry {
                kind,
                mode: header.mode().unwrap_or(0) & 0o7777,
                uid: header.uid().unwrap_or(0),
                gid: header.gid().unwrap_or(0),
                extras,
                size: data.size(),
                data_at: data.raw_file_position(),
                link,
            };
            if path.is_empty() {
                table.root = Some(entry);
                continue;
            }
            if let (EntryType::Link, Some(file)) = (entry.kind, &entry.link) {
                table
                    .links
                    .entry(file.clone())
                    .or_default()
                    .push(path.clone().into());
            }
            table.entries.insert(path.into(), entry);
        }
        Ok(table)
    }

    /// Every name of the file `path` is or links to, in this layer: the
    /// file's own path and its hard links' (`path` alone when it is no
    /// file or has no links).
    pub fn link_group<'a>(&'a self, path: &'a [u8]) -> Vec<&'a [u8]> {
        let file = match self.entries.get_key_value(path) {
            Some((_, entry)) if entry.kind == EntryType::Link => {
                match entry
                    .link
                    .as_deref()
                    .and_then(|f| self.entries.get_key_value(f))
                {
                    Some((file, _)) => file.as_ref(),
                    None => return vec![path],
                }
            }
            Some((file, _)) => file.as_ref(),
            None => return vec![path],
        };
        let mut names = vec![file];
        if let Some(links) = self.links.get(file) {
            names.extend(links.iter().map(AsRef::as_ref));
        }
        names
    }

    /// The root directory's own entry, if this layer has one.
    pub fn root(&self) -> Option<&Entry> {
        self.root.as_ref()
    }

    /// Its entries, by path.
    pub fn entries(&self) -> impl Iterator<Item = (&[u8], &Entry)> {
        self.entries
            .iter()
            .map(|(path, entry)| (path.as_ref(), entry))
    }

    /// The entry at `path`, if this layer has one.
    pub fn entry(&self, path: &[u8]) -> Option<&Entry> {
        self.entries.get(path)
    }

    /// Every path this layer names: its entries, and what its markers hide.
    pub fn paths(&self) -> impl Iterator<Item = &[u8]> {
        self.entries
            .keys()
            .chain(&self.hidden)
            .chain(&self.opaque)
            .map(AsRef::as_ref)
    }

    /// The paths below which this layer changes what lower layers had
    /// wholesale: those it hides, its opaque directories, and its
    /// non-directories (each replaces whatever was there, a directory
    /// tree included).
    pub fn replaced(&self) -> impl Iterator<Item = &[u8]> {
        let non_dirs = self
            .entries
            .iter()
            .filter(|(_, entry)| !entry.is_dir())
            .map(|(path, _)| path);
        self.hidden
            .iter()
            .chain(&self.opaque)
            .chain(non_dirs)
            .map(AsRef::as_ref)
    }

    /// How many entries it holds (its weight in the cache).
    pub fn len(&self) -> usize {
        self.entries.len() + self.hidden.len() + self.opaque.len()
    }

    /// Whether this layer hides `path` from the layers below it (and has
    /// no entry of its own there).
    fn hides(&self, path: &[u8]) -> bool {
        if self.hidden.contains(path) {
            return true;
        }
        ancestors(path).any(|dir| {
            self.hidden.contains(dir)
                || self.opaque.contains(dir)
                || self.entries.get(dir).is_some_and(|entry| !entry.is_dir())
        })
    }

    /// This layer's entries strictly under `dir` (`""`: all of them).
    fn under<'a>(&'a self, dir: &[u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        let prefix = dir_prefix(dir);
        self.entries
            .range::<[u8], _>((Bound::Included(prefix.as_slice()), Bound::Unbounded))
            .map(|(path, _)| path.as_ref())
            .take_while(move |path| path.starts_with(&prefix))
    }
}

/// The strict ancestors of `path`, nearest first (`a/b/c` → `a/b`, `a`).
pub(super) fn ancestors(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = path;
    std::iter::from_fn(move || {
        let (parent, _) = split_parent(at);
        if parent.is_empty() {
            return None;
        }
        at = parent;
        Some(parent)
    })
}

/// `dir/`, the prefix of everything under `dir` (`""` for the root).
fn dir_prefix(dir: &[u8]) -> Vec<u8> {
    let mut prefix = dir.to_vec();
    if !prefix.is_empty() {
        prefix.push(b'/');
    }
    prefix
}

/// The table of a stored layer, from the cache or read now (blocking).
pub fn table(store: &Store, digest: &Digest) -> Result<Arc<LayerTable>, TableError> {
    if let Some(table) = cache().get(digest) {
        return Ok(table);
    }
    let table = Arc::new(LayerTable::read(store, digest)?);
    cache().put(digest.clone(), Arc::clone(&table));
    Ok(table)
}

/// Recently read tables, oldest first out once over the bound.
#[derive(Default)]
struct Cache {
    tables: HashMap<Digest, Arc<LayerTable>>,
    order: VecDeque<Digest>,
    entries: usize,
}

struct Shared(Mutex<Cache>);

impl Shared {
    fn get(&self, digest: &Digest) -> Option<Arc<LayerTable>> {
        self.lock().tables.get(digest).cloned()
    }

    fn put(&self, digest: Digest, table: Arc<LayerTable>) {
        let mut cache = self.lock();
        if table.len() > MAX_CACHED_ENTRIES || cache.tables.contains_key(&digest) {
            return;
        }
        cache.entries += table.len();
        cache.order.push_back(digest.clone());
        cache.tables.insert(digest, table);
        while cache.entries > MAX_CACHED_ENTRIES {
            let Some(oldest) = cache.order.pop_front() else {
                break;
            };
            if let Some(gone) = cache.tables.remove(&oldest) {
                cache.entries -= gone.len();
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn cache() -> &'static Shared {
    static CACHE: OnceLock<Shared> = OnceLock::new();
    CACHE.get_or_init(|| Shared(Mutex::default()))
}

/// A stack of layers, bottom first, read as one tree.
#[derive(Debug, Clone, Default)]
pub struct Tree {
    layers: Vec<Arc<LayerTable>>,
}

impl Tree {
    /// The tree of `layers` (bottom first) in `store` (blocking).
    pub fn of(store: &Store, layers: &[Digest]) -> Result<Self, TableError> {
        let layers = layers
            .iter()
            .map(|digest| table(store, digest))
            .collect::<Result<_, _>>()?;
        Ok(Self { layers })
    }

    /// The tree of `top` stacked on `bottom`'s layers (tables read
    /// already, shared).
    pub fn on(bottom: &[Arc<LayerTable>], top: &Tree) -> Self {
        Self {
            layers: bottom.iter().chain(&top.layers).cloned().collect(),
        }
    }

    /// Its layers, bottom first.
    pub fn layers(&self) -> &[Arc<LayerTable>] {
        &self.layers
    }

    /// The root directory's own entry, from the topmost layer that has
    /// one (a tree none of whose layers has one knows nothing of it).
    pub fn root(&self) -> Option<&Entry> {
        self.layers.iter().rev().find_map(|layer| layer.root())
    }

    /// What the tree has at `path`, and the layer it comes from.
    pub fn lookup(&self, path: &[u8]) -> Option<(usize, &Entry)> {
        for (at, layer) in self.layers.iter().enumerate().rev() {
            if let Some(entry) = layer.entry(path) {
                return Some((at, entry));
            }
            if layer.hides(path) {
                return None;
            }
        }
        None
    }

    /// Every path the tree has strictly under `dir`, sorted.
    pub fn subtree(&self, dir: &[u8]) -> Vec<Vec<u8>> {
        let candidates: BTreeSet<&[u8]> = self
            .layers
            .iter()
            .flat_map(|layer| layer.under(dir))
            .collect();
        candidates
            .into_iter()
            .filter(|path| self.lookup(path).is_some())
            .map(<[u8]>::to_vec)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::store::tests::{E, stored_layer};

    #[test]
    fn the_topmost_entry_wins_unless_a_layer_above_hides_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let layers = [
            stored_layer(
                &store,
                &[
                    E::Dir("d"),
                    E::File("d/x", "lower"),
                    E::File("d/y", "lower"),
                    E::Dir("e"),
                    E::File("e/in", "lower"),
                    E::Dir("n"),
                    E::File("n/old", "lower"),
                    E::File("w", "lower"),
                ],
            ),
            stored_layer(
                &store,
                &[
                    E::File("d/x", "upper"),
                    E::Dir("e"),
                    E::Opaque("e"),
                    E::File("e/new", "upper"),
                    E::File("n", "now a file"),
                    E::Whiteout("w"),
                    E::Symlink("s", "d/x"),
                ],
            ),
        ];
        let tree = Tree::of(&store, &layers).unwrap();
        let at = |path: &str| {
            tree.lookup(path.as_bytes())
                .map(|(layer, e)| (layer, e.kind))
        };
        assert_eq!(at("d/x"), Some((1, EntryType::Regular)));
        assert_eq!(at("d/y"), Some((0, EntryType::Regular)));
        assert_eq!(at("e"), Some((1, EntryType::Directory)));
        assert_eq!(at("e/in"), None, "hidden by the opaque marker");
        assert_eq!(at("n/old"), None, "its directory was replaced by a file");
        assert_eq!(at("w"), None);
        assert_eq!(at("s"), Some((1, EntryType::Symlink)));
        assert_eq!(at("nothing"), None);
        let listed = |dir: &str| -> Vec<String> {
            tree.subtree(dir.as_bytes())
                .into_iter()
                .map(|p| String::from_utf8(p).unwrap())
                .collect()
        };
        assert_eq!(listed("d"), ["d/x", "d/y"]);
        assert_eq!(listed("e"), ["e/new"]);
        assert!(listed("n").is_empty());
        assert_eq!(
            tree.lookup(b"s").unwrap().1.link.as_deref(),
            Some(&b"d/x"[..])
        );
        // A table read twice is the cache's.
        let again = table(&store, &layers[0]).unwrap();
        assert!(Arc::ptr_eq(&again, &tree.layers()[0]));
        let mut replaced: Vec<&[u8]> = tree.layers()[1].replaced().collect();
        replaced.sort();
        assert_eq!(replaced, [&b"d/x"[..], b"e", b"e/new", b"n", b"s", b"w"]);
    }
}
