//! Finding what changed: one walk of the file system from a root, in the
//! order the layer lists it.
//!
//! [`walk`] never follows a symlink and hands its [`Sink`] every changed
//! path in byte order of the whole path (`a`, `a.b`, `a/x`: a directory is
//! walked once the names of its parent that sort before `name/` are done),
//! so each directory comes before what is in it and a walk that takes
//! everything is the sorted path index. A changed path whose parent
//! directories did not change still gets them first, with their own
//! metadata, so whoever applies the layer never has to invent one. The
//! root's own metadata is handed first, every time ([`Sink::root`]).
//! Excluded paths (the request's, plus every mount point but the root) are
//! skipped with everything under them.
//!
//! # Why it cannot miss a change
//! Every directory is read and every entry in it is looked at: no subtree
//! is skipped because of its parent's times. A directory's times move only
//! when its own entries change, and on fuse-overlayfs a copied-up
//! directory keeps the lower layer's times, so a parent's ctime says
//! nothing about what lies two levels below it. What is decided per path:
//! - a name the baseline does not have at that path (made, or moved
//!   there) is captured, whatever its times, and a directory of that kind
//!   is captured whole: a moved directory keeps its entries' ctimes;
//! - a name the baseline has is captured when its ctime is at or after the
//!   threshold: every change of content or metadata (write, truncate,
//!   chmod, chown, a new hard link, an extended attribute, a rename onto
//!   it) moves the ctime, which no process can set;
//! - a baseline name missing from a directory that changed (its ctime or
//!   identity moved) becomes a whiteout: removing an entry always moves
//!   its directory's ctime;
//! - every name of a file with several goes in with the first that does
//!   (a layer that held one name alone would split the file in two);
//! - where the baseline knows what inode each of its paths was when the
//!   agent last walked or placed it ([`Inodes`]), a path now on another
//!   inode is captured too: a directory moved onto a path the baseline
//!   has keeps its entries' old ctimes, and only their inodes tell that
//!   they are not the ones the baseline had there (and a lower file that
//!   an overlay brings back over the sandbox's copy, only its owner, mode,
//!   size or mtime: [`Identity`]). A baseline carried as
//!   paths (the agent restarted) knows no inodes.
//!
//! The request's `prune_unchanged_dirs` and `descend_since_ns` are read
//! and ignored: pruning by a directory's times was the shortcut that
//! missed files. The one shortcut taken is the host's [`Hint`], where the
//! machine is an overlay whose upper layer the host can read: a directory
//! that is not in the upper layer holds what the image has, as it did at
//! every earlier snapshot, and one put there after the host read it has a
//! ctime after the hint's. It is taken only when the baseline knows every
//! path's inode: a directory moved onto a path the baseline has is found
//! by its inode, and the entries below it by theirs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::{self, Metadata};
use std::io;
use std::iter::Peekable;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use silo_protocol::snapshot::WHITEOUT_PREFIX;

use super::SnapshotError;
use crate::fs_error::FsError;
use crate::paths::as_path;

/// Where the kernel lists this process's mounts.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";
/// The kernel's own file systems, relative to a machine's root: a walk of
/// the whole machine (the path index) and a layer apply never enter them,
/// mounted or not.
pub const SYSTEM_DIRS: [&str; 3] = ["proc", "sys", "dev"];

/// What the walk looks for, with every path relative to the walk's root.
#[derive(Debug, Default)]
pub struct WalkSpec {
    /// A baseline path changed if its ctime, in Unix nanoseconds, is at
    /// or after this.
    pub changed_since_ns: i64,
    /// Paths left out with everything under them (the empty path is the root).
    pub excluded: HashSet<PathBuf>,
    /// The image's paths, by parent directory.
    pub baseline: Baseline,
    /// Where changes can be, from the host; `None`: everywhere.
    pub hint: Option<Hint>,
}

/// The directories a change can be in ([`silo_protocol::snapshot::WalkHint`]).
#[derive(Debug, Default)]
pub struct Hint {
    /// Directories of the overlay's upper layer, relative to the root.
    pub dirs: HashSet<PathBuf>,
    /// A directory whose ctime is at or after this is walked too.
    pub since_ns: i64,
}

impl Hint {
    /// The hint a request carries, if any.
    pub fn of(hint: Option<silo_protocol::snapshot::WalkHint>) -> Option<Self> {
        let hint = hint?;
        let dirs = hint
            .dirs
            .iter()
            .filter_map(|dir| relative(Path::new(dir)))
            .collect();
        Some(Self {
            dirs,
            since_ns: hint.since_ns,
        })
    }
}

impl WalkSpec {
    fn changed(&self, meta: &Metadata) -> bool {
        ctime_ns(meta) >= i128::from(self.changed_since_ns)
    }

    /// Whether directory `rel`, not changed itself, can hold a change: with
    /// no hint (or no inodes to tell a moved entry by) any can; with one,
    /// those the host saw in the upper layer, and those put there since.
    fn may_hold_changes(&self, rel: &Path, meta: &Metadata) -> bool {
        match &self.hint {
            Some(hint) if self.baseline.inodes.is_some() => {
                hint.dirs.contains(rel) || ctime_ns(meta) >= i128::from(hint.since_ns)
            }
            _ => true,
        }
    }
}

fn ctime_ns(meta: &Metadata) -> i128 {
    i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec())
}

/// The image's paths as directory → the names in it, each list sorted,
/// and the inodes they were on when known.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Baseline {
    children: HashMap<PathBuf, Vec<OsString>>,
    /// Where each path was when the agent last walked or placed it; `None`
    /// when unknown for the whole tree (a baseline sent as paths).
    inodes: Option<Inodes>,
}

/// What a walk looked at: where each path it saw was, and the directories
/// whose entries it read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Walked {
    /// Where each path was.
    pub inodes: Inodes,
    /// The directories read, as bytes.
    pub dirs: HashSet<Vec<u8>>,
}

impl Walked {
    /// Notes where `rel` is.
    pub fn seen(&mut self, rel: &Path, meta: &Metadata) {
        self.inodes.note(rel, meta);
    }

    /// Notes that directory `rel` was read.
    pub fn read_dir(&mut self, rel: &Path) {
        self.dirs.insert(rel.as_os_str().as_bytes().to_vec());
    }
}

/// What paths were as a walk saw them, by path as bytes (byte order keeps
/// a directory's descendants together, between `dir/` and `dir0`, and
/// compares fast: a walk notes every path of the machine).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Inodes(BTreeMap<Vec<u8>, Identity>);

/// What a path was when a walk saw it: its inode, and what `lstat` said
/// of it besides its ctime. On an overlay, a lower file that comes back
/// over the sandbox's own copy (fuse-overlayfs's `rm -rf D && mkdir D &&
/// mv D E`) keeps the inode number of the copy and an old ctime; only its
/// owner, mode, size or mtime tell it apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    dev: u64,
    ino: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
}

impl Identity {
    fn of(meta: &Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            size: if meta.is_dir() { 0 } else { meta.size() },
            mtime: if meta.is_dir() {
                (0, 0)
            } else {
                (meta.mtime(), meta.mtime_nsec())
            },
        }
    }
}

impl Inodes {
    /// Notes where `rel` is now.
    pub fn note(&mut self, rel: &Path, meta: &Metadata) {
        self.0
            .insert(rel.as_os_str().as_bytes().to_vec(), Identity::of(meta));
    }

    /// What `rel` was when last noted.
    fn get(&self, rel: &Path) -> Option<&Identity> {
        self.0.get(rel.as_os_str().as_bytes())
    }

    /// Forgets `rel` and, with `under`, everything below it: what the
    /// agent placed or removed there is on inodes no walk has seen.
    pub fn forget(&mut self, rel: &Path, under: bool) {
        let rel = rel.as_os_str().as_bytes();
        self.0.remove(rel);
        if !under {
            return;
        }
        let (mut low, mut high) = (rel.to_vec(), rel.to_vec());
        low.push(b'/');
        high.push(b'0');
        let below: Vec<Vec<u8>> = self
            .0
            .range(low..high)
            .map(|(path, _)| path.clone())
            .collect();
        for path in below {
            self.0.remove(&path);
        }
    }
}

impl Baseline {
    /// Indexes `paths` (relative to `/`, a leading or trailing slash is
    /// tolerated). Paths that name nothing a directory could hold (empty,
    /// `..`, a NUL byte) are ignored: nothing on disk can match them.
    pub fn new(paths: &[Vec<u8>]) -> Self {
        let mut children: HashMap<PathBuf, Vec<OsString>> = HashMap::new();
        for path in paths {
            if path.contains(&0) {
                continue;
            }
            let start = path.iter().position(|&b| b != b'/').unwrap_or(path.len());
            let trimmed = OsStr::from_bytes(&path[start..]);
            let Some(mut rel) = relative(Path::new(trimmed)) else {
                continue;
            };
            let Some(name) = rel.file_name().map(ToOwned::to_owned) else {
                continue;
            };
            rel.pop();
            children.entry(rel).or_default().push(name);
        }
        for names in children.values_mut() {
            names.sort();
            names.dedup();
        }
        Self {
            children,
            inodes: None,
        }
    }

    /// Adds `names` to directory `dir` (normal form, `""` the root).
    pub fn add_names(&mut self, dir: &[u8], names: Vec<OsString>) {
        let list = self.children.entry(as_path(dir).to_path_buf()).or_default();
        list.extend(names);
        list.sort();
        list.dedup();
    }

    /// Removes `names` from directory `dir`; what is under them is the
    /// caller's to remove.
    pub fn remove_names(&mut self, dir: &[u8], names: &HashSet<OsString>) {
        let dir = as_path(dir);
        let Some(list) = self.children.get_mut(dir) else {
            return;
        };
        list.retain(|name| !names.contains(name));
        if list.is_empty() {
            self.children.remove(dir);
        }
    }

    /// Forgets every name in directory `dir` (normal form, `""` the root),
    /// all of which are gone with it.
    pub fn forget_dir(&mut self, dir: &[u8]) {
        self.children.remove(as_path(dir));
    }

    fn children(&self, dir: &Path) -> &[OsString] {
        self.children.get(dir).map_or(&[], Vec::as_slice)
    }

    /// Whether the image has `name` in directory `dir`.
    fn has(&self, dir: &Path, name: &OsString) -> bool {
        self.children(dir).binary_search(name).is_ok()
    }

    /// Whether `rel`, a baseline path, is on another inode than the one
    /// the baseline knows it on, or no longer looks as it did ([`Identity`];
    /// never, when the inodes are unknown; a path with none noted counts
    /// as moved).
    fn moved(&self, rel: &Path, meta: &Metadata) -> bool {
        self.inodes
            .as_ref()
            .is_some_and(|inodes| inodes.get(rel) != Some(&Identity::of(meta)))
    }

    /// The inodes known, if any.
    pub fn inodes_mut(&mut self) -> Option<&mut Inodes> {
        self.inodes.as_mut()
    }

    /// The same paths with no inodes known (for comparing trees by paths).
    #[cfg(test)]
    pub fn without_inodes(mut self) -> Self {
        self.inodes = None;
        self
    }

    /// Learns where paths are from a walk: in every directory it read,
    /// its entries are where the walk saw them (and those it did not see
    /// are gone); elsewhere what was known stands. A walk against a
    /// baseline with no inodes read every directory (a hint needs them),
    /// so what it saw is all there is.
    pub fn learn(&mut self, walked: Walked) {
        match &mut self.inodes {
            None => self.inodes = Some(walked.inodes),
            Some(known) => {
                known.0.retain(|path, _| {
                    let parent = path
                        .iter()
                        .rposition(|&b| b == b'/')
                        .map_or(&[][..], |at| &path[..at]);
                    !walked.dirs.contains(parent)
                });
                known.0.extend(walked.inodes.0);
            }
        }
    }
}

/// `path` as plain names only (`.` dropped, one leading `/` allowed and
/// dropped); `None` if it climbs with `..`.
pub fn relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Where the walk's findings go, in order.
pub trait Sink {
    /// The root directory itself, as it is now (handed once, first, and
    /// `changed` when its ctime is at or after the threshold): its own
    /// metadata, which no path under it carries.
    fn root(&mut self, _meta: &Metadata, _changed: bool) -> io::Result<()> {
        Ok(())
    }
    /// A path to put in the layer as it is now; `meta` is its `lstat`.
    fn entry(&mut self, rel: &Path, meta: &Metadata) -> io::Result<()>;
    /// A deletion marker (`rel` already carries the whiteout prefix).
    fn whiteout(&mut self, rel: &Path) -> io::Result<()>;
    /// Every path the walk looked at, changed or not, with its `lstat`.
    fn seen(&mut self, _rel: &Path, _meta: &Metadata) {}
    /// Every directory whose entries the walk read.
    fn read_dir(&mut self, _rel: &Path) {}
}

/// The names of files that have more than one, so that a layer holding
/// one name of such a file holds them all: placed alone, a name would
/// become a file of its own, and a write through one name would no longer
/// show through the other.
#[derive(Default)]
struct LinkGroups {
    /// Files the layer holds, by (device, inode).
    in_layer: HashSet<(u64, u64)>,
    /// Names met, unchanged, before their file went into the layer.
    quiet: HashMap<(u64, u64), Vec<PathBuf>>,
}

impl LinkGroups {
    /// The inode's key, when it has more than one name (any inode but a
    /// directory's: a symlink or a FIFO can have several too).
    fn key(meta: &Metadata) -> Option<(u64, u64)> {
        (!meta.is_dir() && meta.nlink() > 1).then(|| (meta.dev(), meta.ino()))
    }

    /// Whether a file the walk would leave out must go in all the same:
    /// another of its names is in the layer. Otherwise it is noted, in
    /// case one comes later.
    fn pulls_in(&mut self, rel: &Path, meta: &Metadata) -> bool {
        let Some(key) = Self::key(meta) else {
            return false;
        };
        if self.in_layer.contains(&key) {
            return true;
        }
        self.quiet.entry(key).or_default().push(rel.to_owned());
        false
    }

    /// Notes that the file went into the layer; its names met earlier,
    /// which must follow it there (after it, out of path order: a hard
    /// link names an earlier entry of its layer).
    fn entered(&mut self, meta: &Metadata) -> Vec<PathBuf> {
        match Self::key(meta) {
            Some(key) if self.in_layer.insert(key) => self.quiet.remove(&key).unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}

/// A directory being walked.
struct Frame {
    rel: PathBuf,
    meta: Metadata,
    /// Already handed to the sink (always true for the root, never emitted).
    emitted: bool,
    /// Not in the image at this path: everything under it is captured.
    fresh: bool,
    names: Peekable<std::vec::IntoIter<OsString>>,
    /// Subdirectories met but not walked yet, by the key their entries sort
    /// at (`name/`): each is walked once no name before that key is left,
    /// so paths come in byte order (`a`, `a.b`, `a/x`).
    pending: BTreeMap<Vec<u8>, Subdir>,
}

/// A subdirectory waiting for its turn.
struct Subdir {
    rel: PathBuf,
    meta: Metadata,
    emitted: bool,
    fresh: bool,
}

/// Walks `root` (blocking) and tells `sink` what changed, in layer order:
/// every path after its parent, and all of them in byte order of the whole
/// path, so a full walk is the sorted path index.
pub fn walk(root: &Path, spec: &WalkSpec, sink: &mut impl Sink) -> Result<(), SnapshotError> {
    let top = PathBuf::new();
    if spec.excluded.contains(&top) {
        return Ok(());
    }
    let meta = fs::symlink_metadata(root).map_err(FsError::at("stat", root))?;
    let mut stack = Vec::new();
    let mut links = LinkGroups::default();
    // The root's own metadata goes in whole, changed or not: it is one
    // header, and a tree rebuilt by an engine has lost it (see
    // `ROOT_ENTRY`). Its names are compared as any changed directory's are.
    let root_changed = spec.changed(&meta);
    sink.root(&meta, root_changed)
        .map_err(FsError::at("add", root))?;
    enter(
        root,
        spec,
        sink,
        &mut stack,
        top,
        meta,
        (true, root_changed),
        false,
    )?;
    while let Some(frame) = stack.last_mut() {
        let next = frame.names.peek();
        let subdir_first = frame
            .pending
            .first_key_value()
            .is_some_and(|(key, _)| next.is_none_or(|name| key.as_slice() < name.as_bytes()));
        if subdir_first {
            if let Some((_, dir)) = frame.pending.pop_first() {
                enter(
                    root,
                    spec,
                    sink,
                    &mut stack,
                    dir.rel,
                    dir.meta,
                    (dir.emitted, dir.emitted),
                    dir.fresh,
                )?;
            }
            continue;
        }
        let Some(name) = frame.names.next() else {
            stack.pop();
            continue;
        };
        // Inside a directory captured whole, nothing is in the baseline.
        let in_baseline = !frame.fresh && spec.baseline.has(&frame.rel, &name);
        let rel = frame.rel.join(&name);
        if spec.excluded.contains(&rel) {
            continue;
        }
        let path = root.join(&rel);
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            // Gone since its directory was read: nothing to capture.
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(FsError::new("stat", &path, err).into()),
        };
        sink.seen(&rel, &meta);
        let changed = !in_baseline || spec.changed(&meta) || spec.baseline.moved(&rel, &meta);
        if meta.is_dir() {
            if changed {
                emit_parents(&mut stack, sink)?;
                sink.entry(&rel, &meta).map_err(FsError::at("add", &path))?;
            }
            // Every directory is walked, changed or not, unless the host
            // tells where changes can be (see the module docs).
            if changed || spec.may_hold_changes(&rel, &meta) {
                let mut key = name.into_vec();
                key.push(b'/');
                let dir = Subdir {
                    rel,
                    meta,
                    emitted: changed,
                    fresh: !in_baseline,
                };
                if let Some(frame) = stack.last_mut() {
                    frame.pending.insert(key, dir);
                }
            }
        } else if meta.file_type().is_socket() {
            // No layer holds a socket.
        } else if changed || links.pulls_in(&rel, &meta) {
            emit_parents(&mut stack, sink)?;
            sink.entry(&rel, &meta).map_err(FsError::at("add", &path))?;
            for earlier in links.entered(&meta) {
                sink.entry(&earlier, &meta)
                    .map_err(FsError::at("add", &root.join(&earlier)))?;
            }
        }
    }
    Ok(())
}

/// Reads directory `rel`, reports its deletions if it changed (`emitted.1`:
/// its ctime or identity moved, or the baseline lacks it), and pushes it
/// on the stack to be walked, already emitted or not (`emitted.0`).
#[allow(
    clippy::too_many_arguments,
    reason = "the walk's state, passed explicitly rather than bundled for one call"
)]
fn enter(
    root: &Path,
    spec: &WalkSpec,
    sink: &mut impl Sink,
    stack: &mut Vec<Frame>,
    rel: PathBuf,
    meta: Metadata,
    emitted: (bool, bool),
    fresh: bool,
) -> Result<(), SnapshotError> {
    let (emitted, changed) = emitted;
    let path = root.join(&rel);
    let mut names: Vec<OsString> = match fs::read_dir(&path) {
        Ok(dir) => dir
            .map(|entry| entry.map(|entry| entry.file_name()))
            .collect::<io::Result<_>>()
            .map_err(FsError::at("read directory", &path))?,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(FsError::new("read directory", &path, err).into()),
    };
    names.sort();
    sink.read_dir(&rel);
    // Deletions are found by names, in a directory that changed: removing
    // an entry moves its directory's ctime, always (on an overlay too,
    // whose whiteout copies the directory up). A name the baseline has
    // and an unchanged directory lacks was never the machine's (a fork
    // onto another backend's base of the same id, which lacks a provider's
    // own directory): not a deletion of the sandbox's.
    let gone: Vec<&OsString> = match changed {
        false => Vec::new(),
        true => spec
            .baseline
            .children(&rel)
            .iter()
            .filter(|gone| {
                names.binary_search(gone).is_err() && !spec.excluded.contains(&rel.join(gone))
            })
            .collect(),
    };
    stack.push(Frame {
        rel: rel.clone(),
        meta,
        emitted,
        fresh,
        names: names.into_iter().peekable(),
        pending: BTreeMap::new(),
    });
    if !gone.is_empty() {
        emit_parents(stack, sink)?;
    }
    for gone in gone {
        let mut marker = OsString::from(WHITEOUT_PREFIX);
        marker.push(gone);
        sink.whiteout(&rel.join(marker))
            .map_err(FsError::at("add a whiteout in", &path))?;
    }
    Ok(())
}

/// Hands the sink every directory on the current path it has not seen yet.
fn emit_parents(stack: &mut [Frame], sink: &mut impl Sink) -> Result<(), SnapshotError> {
    for frame in stack.iter_mut().filter(|frame| !frame.emitted) {
        sink.entry(&frame.rel, &frame.meta)
            .map_err(FsError::at("add", &frame.rel))?;
        frame.emitted = true;
    }
    Ok(())
}

/// The mount points in `/proc/self/mountinfo` below `root` (absolute),
/// relative to it; `root` itself is left out.
pub fn mount_points(root: &Path) -> Result<Vec<PathBuf>, SnapshotError> {
    let text = fs::read(MOUNTINFO).map_err(FsError::at("read", Path::new(MOUNTINFO)))?;
    let root = relative(root).unwrap_or_default();
    Ok(parse_mountinfo(&text)
        .into_iter()
        .filter_map(|mount| Some(mount.strip_prefix(&root).ok()?.to_path_buf()))
        .filter(|rel| !rel.as_os_str().is_empty())
        .collect())
}

/// The mount point (field 5, octal escapes decoded) of every line, relative
/// to `/`; the root itself and unparseable lines are left out.
pub fn parse_mountinfo(text: &[u8]) -> Vec<PathBuf> {
    text.split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .map(|field| PathBuf::from(OsString::from_vec(unescape_octal(field))))
        .filter(|path| path.is_absolute())
        .filter_map(|path| relative(&path))
        .filter(|rel| !rel.as_os_str().is_empty())
        .collect()
}

/// Decodes the kernel's `\ooo` escapes (space, tab, newline, backslash).
fn unescape_octal(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let digits = field.get(i + 1..i + 4);
        let octal = digits.filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (field[i], octal) {
            (b'\\', Some(d)) => {
                let value = d.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_fields_are_decoded_and_the_root_left_out() {
        let text = b"22 1 0:21 / / rw,relatime - overlay overlay rw\n\
            23 22 0:22 / /proc rw - proc proc rw\n\
            24 22 8:1 /x /my\\040dir/a\\134b rw - ext4 /dev/sda1 rw\n\
            short line\n";
        assert_eq!(
            parse_mountinfo(text),
            vec![PathBuf::from("proc"), PathBuf::from("my dir/a\\b")]
        );
        assert_eq!(unescape_octal(b"a\\01"), b"a\\01".to_vec());
    }

    #[test]
    fn relative_paths_refuse_climbing() {
        assert_eq!(relative(Path::new("/a/./b/")), Some(PathBuf::from("a/b")));
        assert_eq!(relative(Path::new("/")), Some(PathBuf::new()));
        assert_eq!(relative(Path::new("/a/../b")), None);
    }

    #[test]
    fn the_baseline_is_indexed_by_parent() {
        let baseline = Baseline::new(&[
            b"etc".to_vec(),
            b"etc/passwd".to_vec(),
            b"/etc/hosts/".to_vec(),
            b"etc/passwd".to_vec(),
            b"etc/\xff".to_vec(),
            b"..".to_vec(),
            b"bad\0name".to_vec(),
            Vec::new(),
        ]);
        assert_eq!(baseline.children(Path::new("")), [OsString::from("etc")]);
        assert_eq!(
            baseline.children(Path::new("etc")),
            [
                OsString::from("hosts"),
                OsString::from("passwd"),
                OsString::from_vec(b"\xff".to_vec())
            ]
        );
        assert!(baseline.children(Path::new("usr")).is_empty());
    }
}
