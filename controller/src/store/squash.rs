//! Squashing a run of stacked image layers into one layer with the same
//! effect on whatever lies below them: what keeps a long chain of small
//! snapshots under the engine's limit on layers per image.
//!
//! The layers are applied in order onto a map of paths with the rules
//! [`super::index`] describes, keeping for each path where its header and
//! data are (which layer, which entry) rather than copying anything:
//! - a whiteout drops the path and everything under it from the map, and
//!   stays as a whiteout, since it may hide a path below the run;
//! - an opaque marker drops everything under its directory and stays;
//! - an entry replaces what the map had at its path. A directory that
//!   replaces a non-directory (a file, or a whiteout) becomes opaque: the
//!   file it replaces hid the lower directory's entries, so the squashed
//!   directory must too. A non-directory that replaces a directory drops
//!   everything under it.
//!
//! Like in [`super::index`], a layer's markers hide only lower layers, so
//! each layer's removals go before its additions. The output lists paths
//! in byte order (a directory before its entries), the root directory's own
//! entry first (the topmost layer's), each directory's opaque
//! marker right after it. The names of one file stay one file: the first
//! of them in path order carries its data and the others link to it (a
//! layer lists a file's later-found names after it, out of path order), and
//! a link whose target has since been replaced keeps the file it pointed
//! to, which is what a reader of the link saw.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::ops::Bound;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use silo_protocol::extras::Extras;
use silo_protocol::link::append_symlink;
use silo_protocol::members::Members;
use silo_protocol::snapshot::{
    OPAQUE_WHITEOUT, ROOT_ENTRY, WHITEOUT_PREFIX, join_child, split_parent,
};
use tar::{EntryType, Header};

use super::{Digest, Store, StoreError, Written};

/// Where an entry came from: its layer and its place in that layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Origin {
    layer: usize,
    ordinal: usize,
}

/// One entry as found in its layer.
#[derive(Debug, Clone)]
struct Found {
    origin: Origin,
    header: Header,
    /// Its time to the nanosecond and attributes (beyond the header).
    extras: Extras,
    /// The link's target (hard or symbolic), as its bytes, when it has one.
    link: Option<Vec<u8>>,
    /// A hard link's target entry, in the same layer.
    hard_target: Option<Origin>,
    /// Where its data starts in its layer, and how long it is.
    data: (u64, u64),
}

impl Found {
    fn is_dir(&self) -> bool {
        self.header.entry_type() == EntryType::Directory
    }
}

/// What the squashed layer holds at a path.
#[derive(Debug, Clone)]
enum Node {
    Entry(Box<Found>),
    Whiteout,
}

/// Why a run of layers could not be squashed.
#[derive(Debug, thiserror::Error)]
pub enum SquashError {
    /// A layer could not be read as a tar.
    #[error("cannot read layer {layer} for squashing")]
    Read {
        /// The layer.
        layer: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A layer names a path outside the image, or a marker without a name.
    #[error("layer {layer} has entry {path:?}, which is not a path inside the image")]
    BadPath {
        /// The layer.
        layer: String,
        /// The entry's name as found.
        path: String,
    },
    /// Writing the squashed layer failed.
    #[error("cannot write the squashed layer")]
    Write(#[source] io::Error),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Squashes `layers` (bottom first) into one layer in `store`.
pub fn squash(store: &Store, layers: &[Digest]) -> Result<Written, SquashError> {
    let mut map: BTreeMap<Vec<u8>, Node> = BTreeMap::new();
    let mut opaque: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut by_origin: HashMap<Origin, Found> = HashMap::new();
    let mut root = None;
    for (index, digest) in layers.iter().enumerate() {
        let layer = read_layer(store, digest, index)?;
        root = layer.root.or(root);
        for path in &layer.hidden {
            remove_with_descendants(&mut map, &mut opaque, path);
            map.insert(path.clone(), Node::Whiteout);
        }
        for dir in &layer.opaque {
            remove_descendants(&mut map, &mut opaque, dir);
        }
        for (path, found) in layer.entries {
            by_origin.insert(found.origin, found.clone());
            let replaced_non_dir = match map.get(&path) {
                Some(Node::Entry(previous)) if previous.is_dir() => {
                    if !found.is_dir() {
                        remove_with_descendants(&mut map, &mut opaque, &path);
                    }
                    false
                }
                Some(Node::Entry(_) | Node::Whiteout) => true,
                None => false,
            };
            if found.is_dir() && replaced_non_dir {
                opaque.insert(path.clone());
            } else if !found.is_dir() {
                opaque.remove(&path);
            }
            map.insert(path, Node::Entry(Box::new(found)));
        }
        opaque.extend(layer.opaque);
    }
    write_squashed(store, layers, root.as_ref(), &map, &opaque, &by_origin)
}

/// One layer read headers-only: its markers and its entries.
struct Layer {
    /// The root directory's own entry.
    root: Option<Found>,
    hidden: Vec<Vec<u8>>,
    opaque: Vec<Vec<u8>>,
    entries: Vec<(Vec<u8>, Found)>,
}

fn read_layer(store: &Store, digest: &Digest, layer: usize) -> Result<Layer, SquashError> {
    let read_err = |source| SquashError::Read {
        layer: digest.to_string(),
        source,
    };
    let bad_path = |path: &[u8]| SquashError::BadPath {
        layer: digest.to_string(),
        path: String::from_utf8_lossy(path).into_owned(),
    };
    let file = store.open_blob(digest)?;
    let mut archive = tar::Archive::new(BufReader::new(file));
    let mut out = Layer {
        root: None,
        hidden: Vec::new(),
        opaque: Vec::new(),
        entries: Vec::new(),
    };
    let mut seen: HashMap<Vec<u8>, Origin> = HashMap::new();
    let members = Members::new(archive.entries_with_seek().map_err(read_err)?);
    for (ordinal, member) in members.enumerate() {
        let member = member.map_err(read_err)?;
        let kind = member.header.entry_type();
        let path = match named(&member.path).ok_or_else(|| bad_path(&member.path))? {
            Named::Root if kind == EntryType::Directory => Vec::new(),
            Named::Root | Named::Nothing => continue,
            Named::Opaque(dir) => {
                out.opaque.push(dir);
                continue;
            }
            Named::Hidden(path) => {
                out.hidden.push(path);
                continue;
            }
            Named::Path(path) => path,
        };
        let origin = Origin { layer, ordinal };
        let link = member.link;
        let hard_target = match (&link, kind) {
            (Some(target), EntryType::Link) => {
                let target = normalize(target).ok_or_else(|| bad_path(target))?;
                target.and_then(|t| seen.get(&t).copied())
            }
            _ => None,
        };
        let found = Found {
            origin,
            data: (member.data.raw_file_position(), member.data.size()),
            header: member.header,
            extras: member.extras,
            link,
            hard_target,
        };
        if path.is_empty() {
            out.root = Some(found);
            continue;
        }
        seen.insert(path.clone(), origin);
        out.entries.push((path, found));
    }
    Ok(out)
}

fn write_squashed(
    store: &Store,
    layers: &[Digest],
    root: Option<&Found>,
    map: &BTreeMap<Vec<u8>, Node>,
    opaque: &BTreeSet<Vec<u8>>,
    by_origin: &HashMap<Origin, Found>,
) -> Result<Written, SquashError> {
    let mut sources = layers
        .iter()
        .map(|digest| store.open_blob(digest))
        .collect::<Result<Vec<File>, StoreError>>()?;
    let mut builder = tar::Builder::new(store.writer()?);
    let mut written: HashMap<Origin, Vec<u8>> = HashMap::new();
    if let Some(root) = root {
        // The topmost layer's root entry: each holds the whole of it.
        root.extras
            .append(&mut builder)
            .map_err(SquashError::Write)?;
        let name = Path::new(ROOT_ENTRY);
        write_found(&mut builder, &mut sources, name, root.header.clone(), root)?;
    }
    let paths: BTreeSet<&Vec<u8>> = map.keys().chain(opaque.iter()).collect();
    for path in paths {
        match map.get(path) {
            Some(Node::Whiteout) => {
                let (parent, name) = split_parent(path);
                let mut marker = WHITEOUT_PREFIX.as_bytes().to_vec();
                marker.extend_from_slice(name);
                append_marker(&mut builder, &join_child(parent, &marker))
                    .map_err(SquashError::Write)?;
            }
            Some(Node::Entry(found)) => {
                append_entry(
                    &mut builder,
                    &mut sources,
                    path,
                    found,
                    by_origin,
                    &mut written,
                )?;
            }
            None => {}
        }
        if opaque.contains(path) {
            append_marker(&mut builder, &join_child(path, OPAQUE_WHITEOUT.as_bytes()))
                .map_err(SquashError::Write)?;
        }
    }
    let out = builder.into_inner().map_err(SquashError::Write)?;
    Ok(out.finish()?)
}

fn append_entry(
    builder: &mut tar::Builder<super::BlobWriter>,
    sources: &mut [File],
    path: &[u8],
    found: &Found,
    by_origin: &HashMap<Origin, Found>,
    written: &mut HashMap<Origin, Vec<u8>>,
) -> Result<(), SquashError> {
    let name = as_path(path);
    // The file this entry is a name of: a hard link's target as its layer
    // had it (kept even where a later layer replaced that path), else
    // the entry itself.
    let mut file = found.origin;
    let mut original = Some(found);
    while let Some(link) = original.filter(|f| f.header.entry_type() == EntryType::Link) {
        original = link.hard_target.and_then(|target| {
            file = target;
            by_origin.get(&target)
        });
    }
    let Some(original) = original else {
        return Err(SquashError::Write(io::Error::other(format!(
            "hard link {} points to no earlier entry of its layer",
            name.display()
        ))));
    };
    // Every name carries the file's time: an engine sets the times of a
    // link it makes too.
    original
        .extras
        .append(builder)
        .map_err(SquashError::Write)?;
    if let Some(first) = written.get(&file) {
        // Another name of a file already out: a link to it.
        let mut header = original.header.clone();
        header.set_entry_type(EntryType::Link);
        header.set_size(0);
        return builder
            .append_link(&mut header, name, as_path(first))
            .map_err(SquashError::Write);
    }
    write_found(builder, sources, name, original.header.clone(), original)?;
    if !original.is_dir() {
        written.insert(file, path.to_vec());
    }
    Ok(())
}

/// Writes a found entry that is not a hard link, its time record already out.
fn write_found(
    builder: &mut tar::Builder<impl Write>,
    sources: &mut [File],
    name: &Path,
    mut header: Header,
    found: &Found,
) -> Result<(), SquashError> {
    match (found.header.entry_type(), &found.link) {
        (EntryType::Symlink, Some(target)) => {
            append_symlink(builder, &mut header, name, target).map_err(SquashError::Write)
        }
        _ => {
            let data = data_of(sources, found)?;
            builder
                .append_data(&mut header, name, data)
                .map_err(SquashError::Write)
        }
    }
}

/// An entry's data, read from its layer.
fn data_of<'a>(sources: &'a mut [File], found: &Found) -> Result<impl Read + 'a, SquashError> {
    let (start, len) = found.data;
    let file = sources
        .get_mut(found.origin.layer)
        .ok_or_else(|| SquashError::Write(io::Error::other("entry of an unknown layer")))?;
    file.seek(SeekFrom::Start(start))
        .map_err(SquashError::Write)?;
    Ok(BufReader::new(file).take(len))
}

/// Appends an empty marker entry (a whiteout or an opaque marker) named `path`.
pub(super) fn append_marker(builder: &mut tar::Builder<impl Write>, path: &[u8]) -> io::Result<()> {
    let mut header = Header::new_gnu();
    header.set_entry_type(EntryType::Regular);
    header.set_mode(0o644);
    header.set_size(0);
    header.set_mtime(0);
    builder.append_data(&mut header, as_path(path), io::empty())
}

fn remove_descendants(
    map: &mut BTreeMap<Vec<u8>, Node>,
    opaque: &mut BTreeSet<Vec<u8>>,
    dir: &[u8],
) {
    let mut prefix = dir.to_vec();
    if !prefix.is_empty() {
        prefix.push(b'/');
    }
    let doomed: Vec<Vec<u8>> = map
        .range::<[u8], _>((Bound::Included(prefix.as_slice()), Bound::Unbounded))
        .take_while(|(path, _)| path.starts_with(&prefix))
        .map(|(path, _)| path.clone())
        .collect();
    for path in doomed {
        map.remove(&path);
    }
    let doomed: Vec<Vec<u8>> = opaque
        .range::<[u8], _>((Bound::Included(prefix.as_slice()), Bound::Unbounded))
        .take_while(|path| path.starts_with(&prefix))
        .cloned()
        .collect();
    for path in doomed {
        opaque.remove(&path);
    }
}

fn remove_with_descendants(
    map: &mut BTreeMap<Vec<u8>, Node>,
    opaque: &mut BTreeSet<Vec<u8>>,
    path: &[u8],
) {
    map.remove(path);
    opaque.remove(path);
    remove_descendants(map, opaque, path);
}

/// What a layer entry's name says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Named {
    /// The root directory's own entry ([`ROOT_ENTRY`]).
    Root,
    /// The engine's own bookkeeping (`.wh..wh.*` but the opaque marker):
    /// nothing to take.
    Nothing,
    /// `DIR/.wh..wh..opq`: what lower layers have in the directory is hidden.
    Opaque(Vec<u8>),
    /// `DIR/.wh.NAME`: the path is hidden, with everything under it.
    Hidden(Vec<u8>),
    /// An entry at this path.
    Path(Vec<u8>),
}

/// What an entry's name means in a layer; `None` for a name that climbs
/// out of the image or a whiteout that names nothing.
pub(super) fn named(raw: &[u8]) -> Option<Named> {
    let Some(path) = normalize(raw)? else {
        return Some(Named::Root);
    };
    let (parent, name) = split_parent(&path);
    if name == OPAQUE_WHITEOUT.as_bytes() {
        return Some(Named::Opaque(parent.to_vec()));
    }
    let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX.as_bytes()) else {
        return Some(Named::Path(path));
    };
    if hidden.starts_with(WHITEOUT_PREFIX.as_bytes()) {
        return Some(Named::Nothing);
    }
    if hidden.is_empty() || hidden == b"." || hidden == b".." {
        return None;
    }
    Some(Named::Hidden(join_child(parent, hidden)))
}

/// A layer entry's name as a path relative to `/` without trailing slash;
/// `Some(None)` for the root itself, `None` if it climbs out or is empty
/// in the middle.
pub(super) fn normalize(raw: &[u8]) -> Option<Option<Vec<u8>>> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return None,
            name => parts.push(name),
        }
    }
    if parts.is_empty() {
        return Some(None);
    }
    Some(Some(parts.join(&b'/')))
}

pub(super) fn as_path(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::store::tests::{E, Seen, engine_apply as apply, stored_layer as layer};

    #[test]
    fn a_squashed_run_reads_the_same_as_the_layers_it_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let lower = layer(
            &store,
            &[
                E::Dir("d"),
                E::File("d/x", "lower"),
                E::Dir("e"),
                E::File("e/y", "lower"),
                E::File("keep", "lower"),
                E::Dir("n"),
                E::File("n/old", "lower"),
            ],
        );
        let run = [
            layer(
                &store,
                &[
                    E::Dir("d"),
                    E::File("d/new", "1"),
                    E::File("f", "f1"),
                    E::Link("g", "f"),
                    E::Whiteout("keep"),
                    E::Dir("n"),
                    E::File("n/a", "a"),
                    E::Symlink("s", "../../x/y/../z"),
                ],
            ),
            layer(
                &store,
                &[
                    E::Whiteout("d"),
                    E::Dir("d"),
                    E::File("d/z", "z"),
                    E::Dir("e"),
                    E::Opaque("e"),
                    E::File("e/w", "w"),
                    E::File("f", "f2"),
                    E::Dir("h"),
                    E::File("h/1", "one"),
                    E::Link("h/2", "h/1"),
                ],
            ),
            layer(
                &store,
                &[
                    E::Dir("keep"),
                    E::File("keep/k", "k"),
                    E::Whiteout("n"),
                    E::File("n", "now a file"),
                ],
            ),
        ];
        let mut stacked = BTreeMap::new();
        for digest in std::iter::once(&lower).chain(&run) {
            apply(&mut stacked, &store, digest);
        }
        let squashed = squash(&store, &run).unwrap();
        let mut flat = BTreeMap::new();
        apply(&mut flat, &store, &lower);
        apply(&mut flat, &store, &squashed.digest);
        assert_eq!(flat, stacked);
        assert!(!flat.values().any(|seen| *seen == Seen::Marker));
        // Spot checks of the rules, beside the equality.
        assert_eq!(
            flat["g"],
            Seen::File(0o644, b"f1".to_vec()),
            "link kept its file"
        );
        assert_eq!(flat["s"], Seen::Symlink(b"../../x/y/../z".to_vec()));
        assert!(!flat.contains_key("d/x") && !flat.contains_key("e/y"));
        assert_eq!(flat["n"], Seen::File(0o644, b"now a file".to_vec()));

        // The same run squashed again is the same blob; a bad one is named.
        assert_eq!(squash(&store, &run).unwrap().digest, squashed.digest);
        let climbing = layer(&store, &[E::Whiteout("..")]);
        let err = squash(&store, &[climbing]).unwrap_err();
        assert!(err.to_string().contains("not a path inside"), "{err}");
    }

    /// A layer lists a file's names in the order the walk met the file, so
    /// a name that sorts first can come last, as a link. Squashed into path
    /// order, the names must stay one file (they became two copies).
    #[test]
    fn names_of_one_file_stay_one_file_whatever_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let run = [
            layer(
                &store,
                &[
                    E::Dir("b"),
                    E::File("b/f", "shared"),
                    E::Dir("a"),
                    E::Link("a/x", "b/f"),
                    E::Link("c", "b/f"),
                ],
            ),
            layer(&store, &[E::Dir("d")]),
        ];
        let squashed = squash(&store, &run).unwrap();
        let mut archive = tar::Archive::new(store.open_blob(&squashed.digest).unwrap());
        let mut kinds = BTreeMap::new();
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let target = entry
                .link_name()
                .unwrap()
                .map(|t| t.to_string_lossy().into_owned());
            kinds.insert(path, (entry.header().entry_type(), target));
        }
        assert_eq!(kinds["a/x"], (EntryType::Regular, None));
        assert_eq!(kinds["b/f"], (EntryType::Link, Some("a/x".to_owned())));
        assert_eq!(kinds["c"], (EntryType::Link, Some("a/x".to_owned())));
    }
}
