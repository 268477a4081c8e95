//! The tree the agent keeps from its last snapshot or rewind, so the next
//! request can name its baseline by digest instead of carrying every path
//! (see [`silo_protocol::snapshot`]).
//!
//! After a snapshot, the kept tree is the baseline the walk used with the
//! layer's changes applied; after a rewind, the baseline of its change list
//! with the restoring layer applied. Changes apply by the rules the
//! controller's path index applies a layer with, recorded as the
//! protocol's [`LayerPaths`]: a whiteout removes its path and everything
//! under it, an opaque marker everything under its directory, an entry adds
//! itself and its parent directories, and a layer's removals go before its
//! additions. Names are bytes, UTF-8 or not, as the controller's index
//! holds them.
//!
//! Correctness does not rest on those rules matching the controller's: the
//! tree is used only for a request naming its exact digest, which covers
//! every path, so the walk measures against the very paths the request
//! would have carried. A mismatch only costs a resend.
//!
//! One tree is kept, at most [`MAX_KEPT_TREE_BYTES`] of path text. It lives
//! in [`Kept`], shared by the snapshot and rewind services; a request takes
//! it out for its walk (the snapshot slot makes requests one at a time) and
//! puts back either the tree it made or, on failure, the one it took.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use silo_protocol::snapshot::{
    LayerPaths, OPAQUE_WHITEOUT, WHITEOUT_PREFIX, join_child, paths_under, split_parent,
    tree_digest,
};

use super::walk::{Baseline, Sink, Walked};
use crate::paths::as_path;

/// Largest tree kept, in bytes of path text (about 200,000 paths of 40
/// bytes, some 35 MiB held with the walk's index of it; the Debian image's
/// 6,800 paths are 230 KB); a larger baseline is walked against and
/// forgotten, and the next request carries its paths again.
pub const MAX_KEPT_TREE_BYTES: usize = 8 * 1024 * 1024;

/// A tree's paths in byte order (the order of its digest), with its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    paths: BTreeSet<Vec<u8>>,
    bytes: usize,
    digest: String,
}

impl Tree {
    /// The tree of a request's baseline, or `None` if a path is not in the
    /// normal form the controller's index holds (then no later request can
    /// name it) or the tree is over [`MAX_KEPT_TREE_BYTES`].
    pub fn of_list(list: Vec<Vec<u8>>) -> Option<Self> {
        let mut bytes = 0usize;
        let mut paths = BTreeSet::new();
        for path in list {
            if !is_normal(&path) {
                return None;
            }
            bytes = bytes.saturating_add(path.len());
            if bytes > MAX_KEPT_TREE_BYTES {
                return None;
            }
            paths.insert(path);
        }
        let digest = tree_digest(paths.iter().map(Vec::as_slice));
        Some(Self {
            paths,
            bytes,
            digest,
        })
    }

    /// The digest a request names this tree by.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Applies a layer's `changes` to the tree and to `baseline`, the walk's
    /// index of the same paths; `None` (the tree is forgotten) if the
    /// changes cannot be followed or the tree outgrows its bound. Names
    /// change in the index a directory at a time, so a layer that adds or
    /// removes many names in one directory costs its size, not its square.
    pub fn apply(mut self, changes: &Changes, baseline: &mut Baseline) -> Option<Self> {
        if changes.unfollowable {
            return None;
        }
        if let Some(inodes) = baseline.inodes_mut() {
            // What the layer removed or put is on inodes no walk has seen:
            // the next walk captures those paths again.
            for path in changes.paths.hidden() {
                inodes.forget(as_path(path), true);
            }
            for dir in changes.paths.opaque() {
                inodes.forget(as_path(dir), true);
            }
            for path in changes.paths.added() {
                inodes.forget(as_path(path), false);
            }
        }
        let mut gone: HashMap<&[u8], HashSet<OsString>> = HashMap::new();
        for path in changes.paths.hidden() {
            if self.paths.remove(path.as_slice()) {
                self.bytes = self.bytes.saturating_sub(path.len());
                let (dir, name) = split_parent(path);
                gone.entry(dir).or_default().insert(os_name(name));
            }
            self.remove_under(path, baseline);
        }
        for dir in changes.paths.opaque() {
            self.remove_under(dir, baseline);
        }
        for (dir, names) in &gone {
            baseline.remove_names(dir, names);
        }
        let mut made: HashMap<&[u8], Vec<OsString>> = HashMap::new();
        for path in changes.paths.added() {
            if self.paths.insert(path.clone()) {
                self.bytes = self.bytes.saturating_add(path.len());
                let (dir, name) = split_parent(path);
                made.entry(dir).or_default().push(os_name(name));
            }
        }
        for (dir, names) in made {
            baseline.add_names(dir, names);
        }
        if self.bytes > MAX_KEPT_TREE_BYTES {
            return None;
        }
        self.digest = tree_digest(self.paths.iter().map(Vec::as_slice));
        Some(self)
    }

    /// Removes every path strictly under `dir` (`""`: every path). Whole
    /// directories of the walk's index go at once: a name at a time would
    /// cost the square of a large directory's size.
    fn remove_under(&mut self, dir: &[u8], baseline: &mut Baseline) {
        if dir.is_empty() {
            self.paths.clear();
            self.bytes = 0;
            *baseline = Baseline::default();
            return;
        }
        let doomed = paths_under(&self.paths, dir);
        baseline.forget_dir(dir);
        for path in doomed {
            self.paths.remove(&path);
            self.bytes = self.bytes.saturating_sub(path.len());
            // Its directory is `dir` or under it: gone whole as well (the
            // tree need not hold every parent of its paths).
            baseline.forget_dir(split_parent(&path).0);
            baseline.forget_dir(&path);
        }
    }
}

/// Whether `path` is as the controller's index holds paths: relative,
/// plain names joined by one `/`, no `.` or `..`, no NUL.
fn is_normal(path: &[u8]) -> bool {
    !path.is_empty()
        && !path.contains(&0)
        && path
            .split(|&b| b == b'/')
            .all(|part| !matches!(part, b"" | b"." | b".."))
}

/// A name of the tree as a directory listing holds it.
fn os_name(name: &[u8]) -> OsString {
    std::ffi::OsStr::from_bytes(name).to_os_string()
}

/// What one layer does to a tree: its removals, then its additions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// What it hides, empties and adds.
    paths: LayerPaths,
    /// A path could not be followed; the tree is forgotten.
    unfollowable: bool,
    /// What the walk that made the layer looked at (none for a layer the
    /// agent placed: its paths are on new inodes).
    walked: Option<Walked>,
}

impl Changes {
    /// The paths the layer put in place (relative to the root).
    pub fn added(&self) -> &std::collections::BTreeSet<Vec<u8>> {
        self.paths.added()
    }

    /// An entry of the layer at `path` (relative to the root), a
    /// directory or not: one that is not replaces whatever was below it.
    pub fn entry(&mut self, path: &[u8], is_dir: bool) {
        self.paths.entry_of_kind(path, is_dir);
    }

    /// A whiteout of `path` (without the marker prefix).
    pub fn hide(&mut self, path: &[u8]) {
        self.paths.hide(path);
    }

    /// An opaque marker in `dir`.
    pub fn make_opaque(&mut self, dir: &[u8]) {
        self.paths.make_opaque(dir);
    }

    /// Something in the layer the tree cannot follow (an entry left out of
    /// what was placed).
    pub fn unfollowable(&mut self) {
        self.unfollowable = true;
    }

    /// A layer entry as the walk hands it to its sink: a path (a
    /// directory or not), or a whiteout marker in its parent directory.
    fn record(&mut self, rel: &Path, entry: Recorded) {
        let path = rel.as_os_str().as_bytes();
        let Recorded::Whiteout = entry else {
            self.entry(path, entry == Recorded::Dir);
            return;
        };
        let (dir, name) = split_parent(path);
        if name == OPAQUE_WHITEOUT.as_bytes() {
            self.make_opaque(dir);
        } else if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
            self.hide(&join_child(dir, hidden));
        }
    }
}

/// What the walk handed its sink at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recorded {
    Dir,
    NotDir,
    Whiteout,
}

/// A sink that passes everything on to `inner` and notes it in `changes`,
/// with where every path it saw was.
pub struct Recording<'a, S> {
    /// Where the layer goes.
    pub inner: &'a mut S,
    /// What it did to the tree.
    pub changes: Changes,
}

impl<S: Sink> Sink for Recording<'_, S> {
    fn root(&mut self, meta: &std::fs::Metadata, changed: bool) -> std::io::Result<()> {
        // Not a path of the tree: its names are.
        self.inner.root(meta, changed)
    }

    fn entry(&mut self, rel: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
        self.inner.entry(rel, meta)?;
        let kind = if meta.is_dir() {
            Recorded::Dir
        } else {
            Recorded::NotDir
        };
        self.changes.record(rel, kind);
        Ok(())
    }

    fn whiteout(&mut self, rel: &Path) -> std::io::Result<()> {
        self.inner.whiteout(rel)?;
        self.changes.record(rel, Recorded::Whiteout);
        Ok(())
    }

    fn seen(&mut self, rel: &Path, meta: &std::fs::Metadata) {
        self.changes
            .walked
            .get_or_insert_with(Walked::default)
            .seen(rel, meta);
    }

    fn read_dir(&mut self, rel: &Path) {
        self.changes
            .walked
            .get_or_insert_with(Walked::default)
            .read_dir(rel);
    }
}

/// The kept tree with the walk's index of it, or nothing.
#[derive(Debug, Clone, Default)]
pub struct Kept(Arc<Mutex<Option<(Tree, Baseline)>>>);

/// What a request walks against.
#[derive(Debug)]
pub enum Against {
    /// The kept tree it named, taken out for the walk.
    Kept(Tree, Baseline),
    /// The paths it carried.
    List(Vec<Vec<u8>>),
}

impl Against {
    /// The walk's index of the paths, and what makes the kept tree after
    /// the walk: the tree taken, or the list (made a tree only once the
    /// walk is done, so the freeze does not wait for it).
    pub fn split(self) -> (Baseline, Source) {
        match self {
            Self::Kept(tree, baseline) => (baseline, Source::Tree(tree)),
            Self::List(list) => (Baseline::new(&list), Source::List(list)),
        }
    }
}

/// The tree a walk measured against, to apply its changes to.
#[derive(Debug)]
pub enum Source {
    /// Taken from [`Kept`].
    Tree(Tree),
    /// Carried by the request.
    List(Vec<Vec<u8>>),
}

impl Source {
    /// The tree after `changes`, or `None` if it cannot be kept; a walk's
    /// changes teach the baseline where the paths it saw are.
    pub fn after(self, changes: &mut Changes, baseline: &mut Baseline) -> Option<(Tree, Baseline)> {
        let tree = match self {
            Self::Tree(tree) => tree,
            Self::List(list) => Tree::of_list(list)?,
        };
        let tree = tree.apply(changes, baseline)?;
        if let Some(walked) = changes.walked.take() {
            baseline.learn(walked);
        }
        Some((tree, std::mem::take(baseline)))
    }
}

impl Kept {
    /// What a request walks against: the kept tree if `digest` names it
    /// (taken out until [`Kept::put`]), else the request's `list`; `Err`
    /// when a digest names no kept tree.
    pub fn against(&self, digest: Option<&str>, list: Vec<Vec<u8>>) -> Result<Against, String> {
        let Some(digest) = digest else {
            return Ok(Against::List(list));
        };
        let mut kept = self.lock();
        match kept.take() {
            Some((tree, baseline)) if tree.digest == digest => Ok(Against::Kept(tree, baseline)),
            other => {
                let held = other.as_ref().map(|(tree, _)| tree.digest.clone());
                *kept = other;
                Err(match held {
                    Some(held) => format!(
                        "the baseline {digest} is not the tree this agent kept ({held}); \
                         send its paths"
                    ),
                    None => format!(
                        "this agent keeps no tree (it restarted, or its last tree was not \
                         kept), so the baseline {digest} is unknown; send its paths"
                    ),
                })
            }
        }
    }

    /// Keeps `tree` (or nothing) as the tree of the last snapshot or rewind.
    pub fn put(&self, tree: Option<(Tree, Baseline)>) {
        *self.lock() = tree;
    }

    /// The digest of the kept tree, if any.
    pub fn digest(&self) -> Option<String> {
        self.lock().as_ref().map(|(tree, _)| tree.digest.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Tree, Baseline)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(paths: &[&str]) -> Vec<Vec<u8>> {
        paths.iter().map(|p| p.as_bytes().to_vec()).collect()
    }

    fn paths(tree: &Tree) -> Vec<&str> {
        tree.paths
            .iter()
            .map(|path| std::str::from_utf8(path).unwrap())
            .collect()
    }

    #[test]
    fn changes_apply_as_the_index_applies_a_layer() {
        let start = list(&[
            "a", "a/old", "a/old/x", "a/oldish", "b", "b/keep", "c", "c/d", "c/d/e",
        ]);
        let mut baseline = Baseline::new(&start);
        let tree = Tree::of_list(start).unwrap();
        let mut changes = Changes::default();
        // In layer order: the walk names parents first, whiteouts in place.
        changes.record(Path::new("a"), Recorded::Dir);
        changes.record(Path::new("a/.wh.old"), Recorded::Whiteout);
        changes.record(Path::new("a/new/f"), Recorded::NotDir);
        changes.record(Path::new("c/.wh..wh..opq"), Recorded::Whiteout);
        changes.record(Path::new("c/d2"), Recorded::Dir);
        let tree = tree.apply(&changes, &mut baseline).unwrap();
        let expected = [
            "a", "a/new", "a/new/f", "a/oldish", "b", "b/keep", "c", "c/d2",
        ];
        assert_eq!(paths(&tree), expected);
        assert_eq!(tree.digest(), tree_digest(expected.map(str::as_bytes)));
        // The walk's index follows the tree exactly.
        assert_eq!(baseline, Baseline::new(&list(&expected)));
    }

    #[test]
    fn a_whiteout_at_the_root_and_an_emptied_root() {
        let start = list(&["top", "top/x", "other"]);
        let mut baseline = Baseline::new(&start);
        let tree = Tree::of_list(start).unwrap();
        let mut changes = Changes::default();
        changes.record(Path::new(".wh.top"), Recorded::Whiteout);
        let tree = tree.apply(&changes, &mut baseline).unwrap();
        assert_eq!(paths(&tree), ["other"]);
        let mut changes = Changes::default();
        changes.make_opaque(b"");
        changes.entry(b"fresh", false);
        let tree = tree.apply(&changes, &mut baseline).unwrap();
        assert_eq!(paths(&tree), ["fresh"]);
        assert_eq!(baseline, Baseline::new(&list(&["fresh"])));
    }

    #[test]
    fn a_removed_subtree_leaves_the_index_as_its_paths_would() {
        // A tree need not list every parent (`a/b` is missing), and a big
        // directory goes at once.
        let mut start = list(&["a", "a/b/c", "a/b/c/d", "a/e", "z"]);
        start.extend((0..20_000).map(|i| format!("a/e/f{i:05}").into_bytes()));
        let mut baseline = Baseline::new(&start);
        let tree = Tree::of_list(start).unwrap();
        let mut changes = Changes::default();
        changes.hide(b"a/b/c");
        changes.hide(b"a/e");
        let tree = tree.apply(&changes, &mut baseline).unwrap();
        // A whiteout brings its directory, as the index has it.
        assert_eq!(paths(&tree), ["a", "a/b", "z"]);
        assert_eq!(baseline, Baseline::new(&list(&["a", "a/b", "z"])));
    }

    #[test]
    fn trees_that_cannot_be_named_are_not_kept() {
        assert!(Tree::of_list(list(&["etc/./x"])).is_none());
        assert!(Tree::of_list(list(&["/etc"])).is_none());
        assert!(Tree::of_list(list(&["etc/"])).is_none());
        assert!(Tree::of_list(list(&["a/../b"])).is_none());
        let big = vec![vec![b'x'; 1024]; MAX_KEPT_TREE_BYTES / 1024 + 1];
        assert!(Tree::of_list(big).is_none());
        let mut changes = Changes::default();
        changes.unfollowable();
        let tree = Tree::of_list(list(&["a"])).unwrap();
        assert!(tree.apply(&changes, &mut Baseline::default()).is_none());
    }

    #[test]
    fn a_digest_names_the_kept_tree_once_and_a_wrong_one_leaves_it() {
        let kept = Kept::default();
        let digest = tree_digest([&b"a"[..]]);
        let err = kept.against(Some(&digest), Vec::new()).unwrap_err();
        assert!(err.contains("keeps no tree"), "{err}");
        let baseline = Baseline::new(&list(&["a"]));
        kept.put(Some((Tree::of_list(list(&["a"])).unwrap(), baseline)));
        let err = kept.against(Some("beef"), Vec::new()).unwrap_err();
        assert!(err.contains(&digest), "{err}");
        assert_eq!(kept.digest(), Some(digest.clone()));
        assert!(matches!(
            kept.against(Some(&digest), Vec::new()),
            Ok(Against::Kept(..))
        ));
        // Taken out for the walk: until it is put back, nothing is kept.
        assert_eq!(kept.digest(), None);
        assert!(matches!(
            kept.against(None, list(&["b"])),
            Ok(Against::List(l)) if l == [b"b"]
        ));
    }
}
