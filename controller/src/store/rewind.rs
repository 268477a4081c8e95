//! The layer that brings a live tree back to a stored one: what an
//! in-place rewind sends the sandbox's agent, computed from the change
//! list the agent made and from the store alone.
//!
//! The agent knows what changed since a moment at which the controller
//! knows the machine's tree exactly (the *anchor*: the tree of the
//! machine's last snapshot or rewind, or of what the machine was made
//! from). The controller knows the anchor's layers and the target's. A
//! path can differ between the live tree and the target only if it changed
//! since the anchor, or if the anchor and the target differ there, and two
//! stacks of layers can differ only where a layer above their common
//! bottom names a path. So the paths to look at are:
//! - every path in the change list;
//! - every path a layer of either stack names above the layers both share
//!   (entries, whiteouts, opaque directories);
//! - everything the target has under a path where something was replaced
//!   wholesale: a path the change list says is gone or is no longer a
//!   directory, and a path such a layer hides, makes opaque or puts a
//!   non-directory at. Whatever the live tree lost below it comes back;
//! - and, where the target has a directory at such a path, everything the
//!   anchor has under it: a directory the target's layers removed and made
//!   again holds none of what the anchor has below it from the layers both
//!   share, which the live tree still has (those layers name it, so no
//!   rule above would look at it), and which must go.
//!
//! Each of those paths, but those under one of the machine's excluded
//! roots, goes into the layer as the target has it (from the topmost layer
//! holding it, [`super::table::Tree`]), or as a whiteout where the target
//! has nothing; nothing is written below a path the layer already removes
//! or replaces with a non-directory. A file with several names in the
//! target goes back with every one of them that the target has from the
//! same layer: the first written carries the data, the others are hard
//! links to it (the agent links only within one layer). Devices cannot be made by the agent:
//! a path the target has as one is removed, and counted. Times go to the
//! nanosecond and extended attributes with them, as PAX records
//! ([`silo_protocol::extras`]). A regular file the agent sent block sums
//! of, which the target has with one name, goes as a patch instead
//! ([`silo_protocol::blocks`]): the blocks of the target's file whose sums
//! differ from the live file's, its size and metadata. The target's root directory entry, where
//! its layers have one, always goes in first: it is one header.
//!
//! A target whose bottom is a listing of paths the store holds no files
//! of (a provider's template, see [`Restore::unheld_base`]) can only be
//! reached where the live tree still has the template's own: a directory
//! the target has from the template alone is left as the live tree has it
//! (what changed below it is looked at path by path), and any other path
//! the target has from there that changed since the anchor, or that the
//! anchor had otherwise, cannot be put back ([`RestoreError::NotHeld`]);
//! the caller makes a new machine instead.
//!
//! The layer is built in memory: it holds what changed, and the agent's
//! change list that bounds it is itself capped.

use std::collections::{BTreeSet, HashMap, HashSet, hash_map};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};

use serde::Serialize;
use silo_protocol::blocks::{BlockSums, Patch};
use silo_protocol::link::append_symlink;
use silo_protocol::rewind::Change;
use silo_protocol::snapshot::{ROOT_ENTRY, WHITEOUT_PREFIX, join_child, split_parent};
use tar::{EntryType, Header};

use super::blocks;
use super::squash::{append_marker, as_path};
use super::table::{DataError, Entry, TableError, Tree, ancestors};
use super::{Digest, Index, Store, StoreError};

/// What to bring back, and from what.
#[derive(Debug, Clone, Copy)]
pub struct Restore<'a> {
    /// The anchor's layers, bottom first: the tree the machine had at the
    /// moment the agent counted its changes from.
    pub from: &'a [Digest],
    /// The target's layers, bottom first.
    pub to: &'a [Digest],
    /// The agent's change list.
    pub changes: &'a [(Change, &'a [u8])],
    /// Paths relative to `/` the layer must never name, with everything
    /// under them (the machine's mounts, the agent's own directory).
    pub excluded: &'a [Vec<u8>],
    /// The target's paths, when its bottom is a listing whose files the
    /// store does not hold (see the module docs); `None` when every file
    /// of the target is in its layers.
    pub unheld_base: Option<&'a Index>,
    /// The agent applies the root directory's own entry (protocol
    /// feature `RootEntry`); an older one would only count it as skipped.
    pub root: bool,
    /// The block sums the agent sent of changed files as they are now
    /// (protocol feature `BlockRewind`): such a file the target has with
    /// one name goes back as a patch of the blocks that differ.
    pub sums: &'a HashMap<&'a [u8], BlockSums>,
}

/// The restoring layer and what it holds.
#[derive(Debug)]
pub struct Restoring {
    /// An uncompressed image layer.
    pub layer: Vec<u8>,
    /// Its counts.
    pub stats: RestoreStats,
}

/// What a restoring layer holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RestoreStats {
    /// Paths the agent listed as changed.
    pub changed: u64,
    /// Paths looked up in the target, listed or not.
    pub looked_at: u64,
    /// Entries put back as the target has them.
    pub restored: u64,
    /// Paths removed (whiteouts).
    pub removed: u64,
    /// Bytes of file data in the layer.
    pub bytes: u64,
    /// Of the entries put back, files patched by the blocks that differ.
    pub patched: u64,
    /// Devices of the target the agent cannot make.
    pub left_out: u64,
}

/// Why a restoring layer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// A layer could not be read into a table.
    #[error(transparent)]
    Table(#[from] TableError),
    /// A file's data could not be read from its layer.
    #[error(transparent)]
    Read(#[from] DataError),
    /// The layer could not be written.
    #[error("cannot write the restoring layer")]
    Write(#[source] io::Error),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The target has a path from a base whose files the store does not
    /// hold, and the live tree no longer has it as the base did.
    #[error(
        "/{path} comes from a base whose files are not stored (a provider's template), \
         and it changed since"
    )]
    NotHeld {
        /// The path, relative to `/`.
        path: String,
    },
}

/// Computes and writes the restoring layer (blocking).
pub fn restoring_layer(store: &Store, restore: &Restore<'_>) -> Result<Restoring, RestoreError> {
    // The machine stands on the target and nothing changed since (a pool
    // member made ahead, claimed untouched): no path can differ, so the
    // layer is empty, and the trees need not be read.
    if restore.changes.is_empty() && restore.from == restore.to {
        let layer = tar::Builder::new(Vec::new())
            .into_inner()
            .map_err(RestoreError::Write)?;
        return Ok(Restoring {
            layer,
            stats: RestoreStats::default(),
        });
    }
    let target = Tree::of(store, restore.to)?;
    let shared = restore
        .from
        .iter()
        .zip(restore.to)
        .take_while(|(a, b)| a == b)
        .count();
    let anchor_only = Tree::of(store, &restore.from[shared..])?;
    let anchor = Tree::on(&target.layers()[..shared], &anchor_only);
    let paths = paths_to_restore(&target, shared, &anchor, restore);
    let mut stats = RestoreStats {
        changed: restore.changes.len() as u64,
        looked_at: paths.len() as u64,
        ..RestoreStats::default()
    };
    let mut writer = Writer {
        store,
        layers: restore.to,
        open: HashMap::new(),
        builder: tar::Builder::new(Vec::new()),
        written: HashMap::new(),
    };
    let changed: HashMap<&[u8], Change> = restore
        .changes
        .iter()
        .map(|(change, path)| (*path, *change))
        .collect();
    // The root's own metadata, whatever changed: one header.
    if let Some(root) = target.root().filter(|_| restore.root) {
        writer.root(root)?;
    }
    let mut covered: HashSet<&[u8]> = HashSet::new();
    for path in &paths {
        if ancestors(path).any(|dir| covered.contains(dir)) {
            continue;
        }
        match target.lookup(path) {
            None if from_unheld_base(restore.unheld_base, path) => {
                let live_dir = match changed.get(path.as_slice()) {
                    Some(change) => *change == Change::Dir,
                    None => anchor_only
                        .lookup(path)
                        .is_some_and(|(_, entry)| entry.is_dir()),
                };
                if !live_dir {
                    return Err(RestoreError::NotHeld {
                        path: String::from_utf8_lossy(path).into_owned(),
                    });
                }
            }
            Some((layer, entry)) if is_made_by_agent(entry.kind) => {
                if !entry.is_dir() {
                    covered.insert(path);
                }
                let live = restore.sums.get(path.as_slice());
                let one_name = || target.layers()[layer].link_group(path).len() == 1;
                stats.bytes += match live {
                    Some(live) if is_regular(entry.kind) && one_name() => {
                        stats.patched += 1;
                        writer.patch(path, layer, entry, live)?
                    }
                    _ => writer.put(&target, path, layer, entry)?,
                };
                stats.restored += 1;
            }
            found => {
                if found.is_some() {
                    stats.left_out += 1;
                }
                covered.insert(path);
                writer.remove(path)?;
                stats.removed += 1;
            }
        }
    }
    let layer = writer.builder.into_inner().map_err(RestoreError::Write)?;
    Ok(Restoring { layer, stats })
}

/// Every path the live tree may differ from the target at, sorted, none
/// under an excluded root (see the module docs). The two trees share their
/// bottom `shared` layers.
fn paths_to_restore(
    target: &Tree,
    shared: usize,
    anchor: &Tree,
    restore: &Restore<'_>,
) -> BTreeSet<Vec<u8>> {
    let mut paths: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut replaced: BTreeSet<Vec<u8>> = BTreeSet::new();
    let target_only = target.layers().get(shared..).unwrap_or_default();
    let anchor_only = anchor.layers().get(shared..).unwrap_or_default();
    for layer in target_only.iter().chain(anchor_only) {
        paths.extend(layer.paths().map(<[u8]>::to_vec));
        replaced.extend(layer.replaced().map(<[u8]>::to_vec));
    }
    for (change, path) in restore.changes {
        paths.insert(path.to_vec());
        if *change != Change::Dir {
            replaced.insert(path.to_vec());
        }
    }
    for path in &replaced {
        if target.lookup(path).is_some_and(|(_, entry)| entry.is_dir()) {
            paths.extend(target.subtree(path));
            paths.extend(anchor.subtree(path));
        }
    }
    with_link_groups(target, &mut paths);
    // The root itself (its own metadata changed) is no path: its entry
    // always goes in.
    paths.retain(|path| !path.is_empty() && !is_excluded(path, restore.excluded));
    paths
}

/// Adds to `paths` every other name the target has of each file among
/// them from the same layer: a file with several names goes back whole,
/// or the names put back would be a file of their own.
fn with_link_groups(target: &Tree, paths: &mut BTreeSet<Vec<u8>>) {
    let names: Vec<Vec<u8>> = paths
        .iter()
        .filter_map(|path| {
            let (layer, _) = target.lookup(path)?;
            let group = target.layers()[layer].link_group(path);
            (group.len() > 1).then(|| {
                group
                    .into_iter()
                    .filter(|name| target.lookup(name).is_some_and(|(at, _)| at == layer))
                    .map(<[u8]>::to_vec)
                    .collect::<Vec<_>>()
            })
        })
        .flatten()
        .collect();
    paths.extend(names);
}

/// The layer that gives a machine whose tree an engine built from
/// `layers` what the engine leaves out of it, for its agent to apply:
/// the root directory's own metadata (a container's root is the engine's
/// own directory, whatever the layers say) and every extended attribute
/// with an empty value (the engine's tar reader drops them), each entry
/// that has one going in whole with its other names and below its own
/// directories (whose metadata it puts back after placing it); the root only
/// `with_root` (an agent that applies it). `None` when the tree has
/// neither (blocking).
pub fn engine_gaps(
    store: &Store,
    layers: &[Digest],
    with_root: bool,
) -> Result<Option<Restoring>, RestoreError> {
    let target = Tree::of(store, layers)?;
    let mut paths: BTreeSet<Vec<u8>> = BTreeSet::new();
    for (at, layer) in target.layers().iter().enumerate() {
        let lost = layer.entries().filter(|(_, entry)| {
            entry
                .extras
                .xattrs
                .iter()
                .any(|(_, value)| value.is_empty())
        });
        for (path, _) in lost {
            if target.lookup(path).is_some_and(|(from, _)| from == at) {
                paths.insert(path.to_vec());
            }
        }
    }
    let root = target.root().filter(|_| with_root);
    if root.is_none() && paths.is_empty() {
        return Ok(None);
    }
    with_link_groups(&target, &mut paths);
    // Every directory above them too, with its own metadata: placing an
    // entry in a directory of a lower layer copies it up, and an overlay's
    // copy-up may not keep its setuid and setgid bits.
    let parents: Vec<Vec<u8>> = paths
        .iter()
        .flat_map(|path| ancestors(path))
        .filter(|dir| target.lookup(dir).is_some_and(|(_, entry)| entry.is_dir()))
        .map(<[u8]>::to_vec)
        .collect();
    paths.extend(parents);
    let mut writer = Writer {
        store,
        layers,
        open: HashMap::new(),
        builder: tar::Builder::new(Vec::new()),
        written: HashMap::new(),
    };
    let mut stats = RestoreStats {
        looked_at: paths.len() as u64,
        ..RestoreStats::default()
    };
    if let Some(root) = root {
        writer.root(root)?;
    }
    for path in &paths {
        let found = target.lookup(path);
        if let Some((layer, entry)) = found.filter(|(_, entry)| is_made_by_agent(entry.kind)) {
            stats.bytes += writer.put(&target, path, layer, entry)?;
            stats.restored += 1;
        }
    }
    let layer = writer.builder.into_inner().map_err(RestoreError::Write)?;
    Ok(Some(Restoring { layer, stats }))
}

/// Whether the target has `path` only from a base whose files the store
/// does not hold (the caller has looked it up in the target's layers).
fn from_unheld_base(unheld_base: Option<&Index>, path: &[u8]) -> bool {
    unheld_base.is_some_and(|index| index.contains(path))
}

/// Whether `path` is an excluded root or under one.
fn is_excluded(path: &[u8], excluded: &[Vec<u8>]) -> bool {
    excluded.iter().any(|root| {
        path.starts_with(root) && (path.len() == root.len() || path[root.len()] == b'/')
    })
}

/// Kinds the agent places (it skips devices and FIFOs).
fn is_made_by_agent(kind: EntryType) -> bool {
    matches!(
        kind,
        EntryType::Directory
            | EntryType::Regular
            | EntryType::Continuous
            | EntryType::Symlink
            | EntryType::Link
            | EntryType::Fifo
    )
}

/// Whether an entry of `kind` is a regular file's data.
fn is_regular(kind: EntryType) -> bool {
    matches!(kind, EntryType::Regular | EntryType::Continuous)
}

/// The layer being written, and the blobs its data comes from.
struct Writer<'a> {
    store: &'a Store,
    layers: &'a [Digest],
    open: HashMap<usize, File>,
    builder: tar::Builder<Vec<u8>>,
    /// Files written so far, by where they came from (layer, the file's
    /// path there) → the name written: another name of the same file is a
    /// hard link to it.
    written: HashMap<(usize, Vec<u8>), Vec<u8>>,
}

impl Writer<'_> {
    /// Writes `entry` (from layer `layer` of `tree`) at `path`; its data's
    /// size.
    fn put(
        &mut self,
        tree: &Tree,
        path: &[u8],
        layer: usize,
        entry: &Entry,
    ) -> Result<u64, RestoreError> {
        let name = as_path(path);
        let write = |result: io::Result<()>| result.map_err(RestoreError::Write);
        // The first name, in its layer, of the inode this entry is a name
        // of (a hard link's target; else the entry itself).
        let head: &[u8] = match entry.kind {
            EntryType::Link => entry.link.as_deref().unwrap_or_default(),
            _ => path,
        };
        let original = match entry.kind {
            // The inode it names, as that layer has it.
            EntryType::Link => tree.layers()[layer]
                .entry(head)
                .filter(|e| !e.is_dir() && e.kind != EntryType::Link)
                .cloned()
                .ok_or_else(|| {
                    RestoreError::Write(io::Error::other(format!(
                        "hard link {} names nothing its layer has",
                        name.display()
                    )))
                })?,
            _ => entry.clone(),
        };
        // Every name carries the inode's time: an engine sets the times of
        // a link it makes too.
        write(original.extras.append(&mut self.builder))?;
        let mut header = header_of(&original);
        if let Some(first) = self.written.get(&(layer, head.to_vec())) {
            // Another name of an inode already in this layer.
            header.set_entry_type(EntryType::Link);
            header.set_size(0);
            let first = as_path(first).to_path_buf();
            write(self.builder.append_link(&mut header, name, first))?;
            return Ok(0);
        }
        let size = match original.kind {
            EntryType::Directory | EntryType::Fifo => {
                write(self.builder.append_data(&mut header, name, io::empty()))?;
                0
            }
            EntryType::Symlink => {
                let target = original.link.as_deref().unwrap_or_default();
                write(append_symlink(&mut self.builder, &mut header, name, target))?;
                0
            }
            _ => self.file(path, layer, &original)?,
        };
        if original.kind != EntryType::Directory {
            self.written.insert((layer, head.to_vec()), path.to_vec());
        }
        Ok(size)
    }

    /// Writes `entry` (a regular file of layer `layer` with one name) at
    /// `path` as a patch on the live file whose blocks have the sums
    /// `live`: the blocks of the entry's data that differ, and the entry's
    /// size and metadata; the patch's size.
    fn patch(
        &mut self,
        path: &[u8],
        layer: usize,
        entry: &Entry,
        live: &BlockSums,
    ) -> Result<u64, RestoreError> {
        let digest = self.layers[layer].clone();
        let root = self.store.root().to_path_buf();
        let blob = blob(&mut self.open, self.store, self.layers, layer)?;
        let wanted = blocks::of_entry(&root, blob, &digest, path, entry)?;
        let patch = Patch {
            size: entry.size,
            ranges: live.differing(&wanted, entry.size),
        };
        let mut data = Vec::with_capacity(usize::try_from(patch.data_len()).unwrap_or(0));
        for range in &patch.ranges {
            let read = |source| DataError::new(&digest, path, source);
            blob.seek(SeekFrom::Start(entry.data_at + range.at))
                .map_err(read)?;
            let before = data.len();
            (&mut *blob)
                .take(range.len)
                .read_to_end(&mut data)
                .map_err(read)?;
            if (data.len() - before) as u64 != range.len {
                return Err(read(io::ErrorKind::UnexpectedEof.into()).into());
            }
        }
        let write = |result: io::Result<()>| result.map_err(RestoreError::Write);
        write(entry.extras.append_patch(&mut self.builder, &patch))?;
        let mut header = header_of(entry);
        header.set_entry_type(EntryType::Regular);
        header.set_size(data.len() as u64);
        write(
            self.builder
                .append_data(&mut header, as_path(path), &data[..]),
        )?;
        Ok(data.len() as u64)
    }

    /// Writes a regular file with `entry`'s metadata and data at `path`.
    fn file(&mut self, path: &[u8], layer: usize, entry: &Entry) -> Result<u64, RestoreError> {
        let digest = self.layers[layer].clone();
        let file = blob(&mut self.open, self.store, self.layers, layer)?;
        let mut data = entry.data(file, &digest, path)?;
        let mut header = header_of(entry);
        header.set_entry_type(EntryType::Regular);
        header.set_size(entry.size);
        self.builder
            .append_data(&mut header, as_path(path), &mut data)
            .map_err(RestoreError::Write)?;
        Ok(entry.size)
    }

    /// Writes a whiteout of `path`.
    /// Writes the root directory's own entry.
    fn root(&mut self, entry: &Entry) -> Result<(), RestoreError> {
        let write = |result: io::Result<()>| result.map_err(RestoreError::Write);
        write(entry.extras.append(&mut self.builder))?;
        let mut header = header_of(entry);
        write(
            self.builder
                .append_data(&mut header, ROOT_ENTRY, io::empty()),
        )
    }

    fn remove(&mut self, path: &[u8]) -> Result<(), RestoreError> {
        let (parent, name) = split_parent(path);
        let mut marker = WHITEOUT_PREFIX.as_bytes().to_vec();
        marker.extend_from_slice(name);
        append_marker(&mut self.builder, &join_child(parent, &marker)).map_err(RestoreError::Write)
    }
}

/// The blob of layer `layer` of `layers`, opened once into `open`.
fn blob<'o>(
    open: &'o mut HashMap<usize, File>,
    store: &Store,
    layers: &[Digest],
    layer: usize,
) -> Result<&'o mut File, RestoreError> {
    Ok(match open.entry(layer) {
        hash_map::Entry::Occupied(open) => open.into_mut(),
        hash_map::Entry::Vacant(slot) => slot.insert(store.open_blob(&layers[layer])?),
    })
}

/// A header with `entry`'s kind, owner, mode and time, no size yet.
fn header_of(entry: &Entry) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(entry.kind);
    header.set_mode(entry.mode);
    header.set_uid(entry.uid);
    header.set_gid(entry.gid);
    header.set_mtime(entry.extras.mtime.header_secs());
    header.set_size(0);
    header
}

#[cfg(test)]
mod tests;
