//! A layer read into a staging directory and a plan, every entry checked
//! before anything live is touched.
//!
//! [`Stager`] takes the entries `push::archive::read_archive` hands it, in
//! layer order. Each name is normalized by the push rules (no `..`, no
//! absolute path, length caps), refused at or under an excluded root, and
//! its parents are looked at: a parent the layer itself brings as a
//! directory is fine, one it brings as anything else is refused, and one it
//! does not bring is looked up on the machine with `lstat`, where a symlink
//! or a non-directory refuses the entry (a missing one will be made).
//! Regular files are written into the staging directory under a number,
//! with their owner, mode (setuid and setgid included) and time set there,
//! so that placing one is a single `rename`; symlinks are made there the
//! same way, and so are FIFOs. Directories, hard links (to an earlier file,
//! symlink or FIFO of this layer only), whiteouts and opaque markers become steps of the
//! [`Plan`]. Times come to the nanosecond and extended attributes with
//! them ([`silo_protocol::extras::Extras`], read by
//! [`silo_protocol::members`]). Names are bytes, UTF-8 or not. Devices, the
//! engine's own `.wh..wh.` files and the root's own entry are left out and
//! listed.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::fcntl::{AT_FDCWD, AtFlags};
use nix::sys::stat::{Mode, UtimensatFlags, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::mkfifo;
use nix::unistd::{Gid, Uid, fchownat};
use serde::{Deserialize, Serialize};
use silo_protocol::blocks::Patch;
use silo_protocol::bundle::MAX_NAME_BYTES;
use silo_protocol::extras::{Mtime, Xattr};
use silo_protocol::layers::{
    MAX_SKIPPED_LISTED, OPAQUE_WHITEOUT, SkipReason, Skipped, WHITEOUT_PREFIX,
};
use silo_protocol::members::Member;
use tar::EntryType;

use crate::fs_error::FsError;
use crate::paths::as_path;
use crate::push::archive::{Meter, Unpack};
use crate::push::extract::{
    ExtractError, Reject, Zeros, copy_buffer, normalize_bytes, reject, write_error, write_new_file,
};
use silo_protocol::snapshot::{join_child, split_parent};

use super::byte_path;
use crate::snapshot::tree::Changes;

/// Names starting with this (but [`OPAQUE_WHITEOUT`]) are the engine's
/// AUFS bookkeeping, never file system content.
const WHITEOUT_META_PREFIX: &[u8] = b".wh..wh.";
/// Mode a staged file has while it is written: only the agent reads it.
const STAGED_FILE_MODE: u32 = 0o600;
/// Permission bits an entry keeps: setuid, setgid and sticky included (the
/// layer came from a sandbox of the same kind, and the agent runs as root).
const MODE_BITS: u32 = 0o7777;

/// Owner, permission bits and modification time of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Permission bits (`MODE_BITS`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time, Unix seconds.
    pub mtime: i64,
    /// Nanoseconds past `mtime` (a journal from before they were kept
    /// reads as none).
    #[serde(default)]
    pub mtime_nsec: u32,
}

impl Meta {
    /// The modification time as the kernel takes it.
    pub fn time(&self) -> TimeSpec {
        TimeSpec::new(self.mtime, i64::from(self.mtime_nsec))
    }
}

/// What to remove before the layer's entries go in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Removal {
    /// A path, and everything under it (`.wh.NAME`).
    Whiteout(#[serde(with = "byte_path")] Vec<u8>),
    /// Everything in a directory (`.wh..wh..opq`); `""` is the root.
    Opaque(#[serde(with = "byte_path")] Vec<u8>),
}

/// One entry to put in place, in layer order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// A directory, made or kept; its metadata is set after every entry.
    Dir {
        /// Relative to the root.
        #[serde(with = "byte_path")]
        path: Vec<u8>,
        /// What to set.
        meta: Meta,
        /// Its extended attributes: those it has that are not here go
        /// (a journal from before they were kept reads as none).
        #[serde(default)]
        xattrs: Vec<Xattr>,
    },
    /// A regular file staged under `staged`, metadata set.
    File {
        /// Relative to the root.
        #[serde(with = "byte_path")]
        path: Vec<u8>,
        /// Its name in the staging directory.
        staged: String,
        /// Its size.
        size: u64,
    },
    /// A symlink staged under `staged`, owner and time set.
    Symlink {
        /// Relative to the root.
        #[serde(with = "byte_path")]
        path: Vec<u8>,
        /// Its name in the staging directory.
        staged: String,
    },
    /// A named pipe staged under `staged`, metadata set.
    Fifo {
        /// Relative to the root.
        #[serde(with = "byte_path")]
        path: Vec<u8>,
        /// Its name in the staging directory.
        staged: String,
    },
    /// A patch on the regular file at `path` ([`silo_protocol::blocks`]):
    /// the staged bytes written at `ranges`, then the size, owner, mode,
    /// attributes and time set; writing it twice gives the same file.
    Patch {
        /// Relative to the root.
        #[serde(with = "byte_path")]
        path: Vec<u8>,
        /// The ranges' bytes, one after another, under this name.
        staged: String,
        /// The file's size afterwards.
        size: u64,
        /// Where each run of the staged bytes goes: (offset, length).
        ranges: Vec<(u64, u64)>,
        /// What to set.
        meta: Meta,
        /// Its extended attributes: those it has that are not here go.
        xattrs: Vec<Xattr>,
    },
    /// A second name for a file placed earlier.
    HardLink {
        /// Relative to the root.
        #[serde(with = "byte_path")]
        path: Vec<u8>,
        /// The earlier file, relative to the root.
        #[serde(with = "byte_path")]
        target: Vec<u8>,
    },
}

/// A staged layer: what to remove, what to place, and what was left out
/// (written as the apply's journal, see `journal`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Plan {
    /// Carried out first.
    pub removals: Vec<Removal>,
    /// Then these, in order.
    pub steps: Vec<Step>,
    /// The first entries left out.
    pub skipped: Vec<Skipped>,
    /// How many were left out.
    pub skipped_count: u64,
    /// Owners were set on what was staged (and will be on directories).
    pub owners: bool,
    /// Hex SHA-256 of the layer (a journal from before it was kept reads
    /// as empty).
    #[serde(default)]
    pub sha256: String,
    /// The root directory's own metadata, set after everything else (a
    /// journal from before it was kept, or a layer without it: none).
    #[serde(default)]
    pub root: Option<RootDir>,
}

/// The root directory's own entry ([`silo_protocol::snapshot::ROOT_ENTRY`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootDir {
    /// What to set.
    pub meta: Meta,
    /// Its extended attributes: those it has that are not here go.
    pub xattrs: Vec<Xattr>,
}

impl Plan {
    /// What the layer does to a tree of paths: its removals, then every
    /// entry placed. An entry left out (a device, a FIFO) is in the layer
    /// but not on the machine, which the tree cannot follow.
    pub fn changes(&self) -> Changes {
        let mut changes = Changes::default();
        for removal in &self.removals {
            match removal {
                Removal::Whiteout(path) => changes.hide(path),
                Removal::Opaque(dir) => changes.make_opaque(dir),
            }
        }
        for step in &self.steps {
            match step {
                Step::Dir { path, .. } => changes.entry(path, true),
                Step::File { path, .. }
                | Step::Patch { path, .. }
                | Step::Symlink { path, .. }
                | Step::Fifo { path, .. }
                | Step::HardLink { path, .. } => changes.entry(path, false),
            }
        }
        if self.skipped_count > 0 {
            changes.unfollowable();
        }
        changes
    }
}

/// What a path is, as far as the layer's checks know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// A directory this layer brings, or one on the machine.
    Dir,
    /// A regular file this layer brings (a hard link may name it).
    File,
    /// A symlink or FIFO this layer brings (a hard link may name it too).
    Linkable,
    /// Not there once the removals are done (whited out, or missing).
    Absent,
}

/// Why a parent on the machine is not usable.
enum Looked {
    /// It is a symlink or not a directory.
    Refused(Reject),
    /// It could not be looked at.
    Failed(FsError),
}

/// The [`Unpack`] that stages a layer.
pub struct Stager<'a> {
    root: &'a Path,
    staging: &'a Path,
    excluded: &'a HashSet<PathBuf>,
    known: HashMap<Vec<u8>, Known>,
    plan: Plan,
    next: u64,
    buf: Vec<u8>,
}

impl<'a> Stager<'a> {
    /// Stages into `staging` (existing, empty) a layer meant for `root`,
    /// refusing entries at or under `excluded` (relative to `root`); sets
    /// owners when `owners`.
    pub fn new(
        root: &'a Path,
        staging: &'a Path,
        excluded: &'a HashSet<PathBuf>,
        owners: bool,
    ) -> Self {
        Self {
            root,
            staging,
            excluded,
            known: HashMap::new(),
            plan: Plan {
                owners,
                ..Plan::default()
            },
            next: 0,
            buf: copy_buffer(),
        }
    }

    /// The plan, once every entry is in.
    pub fn finish(self) -> Plan {
        self.plan
    }

    fn skip(&mut self, name: &[u8], reason: SkipReason) {
        self.plan.skipped_count += 1;
        if self.plan.skipped.len() < MAX_SKIPPED_LISTED {
            self.plan.skipped.push(Skipped {
                path: String::from_utf8_lossy(name).into_owned(),
                reason,
            });
        }
    }

    /// Refuses `path` if it or an ancestor is excluded.
    fn check_excluded(&self, name: &str, path: &[u8]) -> Result<(), ExtractError> {
        let mut end = 0;
        loop {
            let next = path[end..]
                .iter()
                .position(|&b| b == b'/')
                .map(|at| end + at);
            let prefix = &path[..next.unwrap_or(path.len())];
            if self.excluded.contains(as_path(prefix)) {
                return Err(reject(name, Reject::Excluded(shown(prefix))));
            }
            match next {
                Some(at) => end = at + 1,
                None => return Ok(()),
            }
        }
    }

    /// Refuses `path` if a parent is, or will be, anything but a directory.
    fn check_parents(&mut self, name: &str, path: &[u8]) -> Result<(), ExtractError> {
        let mut parents = Vec::new();
        let mut at = path;
        while let Some(slash) = at.iter().rposition(|&b| b == b'/') {
            at = &at[..slash];
            parents.push(at);
        }
        for parent in parents.into_iter().rev() {
            let known = match self.known.get(parent) {
                Some(known) => *known,
                None => {
                    let found = self.look(parent).map_err(|why| match why {
                        Looked::Refused(why) => reject(name, why),
                        Looked::Failed(err) => err.into(),
                    })?;
                    self.known.insert(parent.to_vec(), found);
                    found
                }
            };
            match known {
                Known::Dir | Known::Absent => {}
                Known::File | Known::Linkable => return Err(reject(name, Reject::FileDirClash)),
            }
        }
        Ok(())
    }

    /// What the machine has at `parent`; a symlink or a non-directory refuses.
    fn look(&self, parent: &[u8]) -> Result<Known, Looked> {
        let on_disk = self.root.join(as_path(parent));
        match std::fs::symlink_metadata(&on_disk) {
            Ok(meta) if meta.is_dir() => Ok(Known::Dir),
            Ok(meta) if meta.file_type().is_symlink() => {
                Err(Looked::Refused(Reject::ParentSymlink(shown(parent))))
            }
            Ok(_) => Err(Looked::Refused(Reject::ParentNotDir(shown(parent)))),
            Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                Ok(Known::Absent)
            }
            Err(err) => Err(Looked::Failed(FsError::new("inspect", &on_disk, err))),
        }
    }

    fn staged_name(&mut self) -> String {
        self.next += 1;
        self.next.to_string()
    }

    fn stage_file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        path: Vec<u8>,
        meta: Meta,
        xattrs: &[Xattr],
        meter: &Meter,
    ) -> Result<(), ExtractError> {
        let staged = self.staged_name();
        let target = self.staging.join(&staged);
        let file = write_new_file(
            entry,
            &target,
            STAGED_FILE_MODE,
            Zeros::Holes,
            &mut self.buf,
            meter,
        )?;
        // Owner first: a chown clears setuid and setgid.
        if self.plan.owners {
            std::os::unix::fs::fchown(&file, Some(meta.uid), Some(meta.gid))
                .map_err(write_error("chown", &target))?;
        }
        file.set_permissions(std::fs::Permissions::from_mode(meta.mode))
            .map_err(write_error("chmod", &target))?;
        file.set_modified(system_time(&meta))
            .map_err(write_error("set the time of", &target))?;
        // After the owner: a chown drops `security.capability`.
        set_xattrs(&target, xattrs, |name, value| {
            xattr::FileExt::set_xattr(&file, name, value)
        })
        .map_err(write_error("set the attributes of", &target))?;
        let size = entry.size();
        self.known.insert(path.clone(), Known::File);
        self.plan.steps.push(Step::File { path, staged, size });
        Ok(())
    }

    /// A patch: its bytes staged as they come (where they go, and which
    /// runs of zeros become holes, is for placing), on a path the machine
    /// has as a regular file with one name and this layer does not touch
    /// before.
    #[allow(clippy::too_many_arguments, reason = "one entry's parts")]
    fn stage_patch<R: Read>(
        &mut self,
        name: &str,
        entry: &mut tar::Entry<'_, R>,
        path: Vec<u8>,
        (meta, xattrs): (Meta, Vec<Xattr>),
        patch: Patch,
        meter: &Meter,
    ) -> Result<(), ExtractError> {
        let on_disk = self.root.join(as_path(&path));
        let plain = !self.known.contains_key(&path)
            && std::fs::symlink_metadata(&on_disk)
                .is_ok_and(|found| found.file_type().is_file() && found.nlink() == 1);
        if !plain {
            return Err(reject(name, Reject::PatchTarget));
        }
        let staged = self.staged_name();
        let target = self.staging.join(&staged);
        write_new_file(
            entry,
            &target,
            STAGED_FILE_MODE,
            Zeros::Written,
            &mut self.buf,
            meter,
        )?;
        self.known.insert(path.clone(), Known::File);
        self.plan.steps.push(Step::Patch {
            path,
            staged,
            size: patch.size,
            ranges: patch.ranges.iter().map(|r| (r.at, r.len)).collect(),
            meta,
            xattrs,
        });
        Ok(())
    }

    fn stage_symlink(
        &mut self,
        name: &str,
        link: Option<Vec<u8>>,
        path: Vec<u8>,
        meta: Meta,
        xattrs: &[Xattr],
    ) -> Result<(), ExtractError> {
        let Some(link) = link.filter(|link| !link.is_empty()) else {
            return Err(reject(name, Reject::BadName("a symlink without a target")));
        };
        let staged = self.staged_name();
        let target = self.staging.join(&staged);
        symlink(OsStr::from_bytes(&link), &target).map_err(write_error("create", &target))?;
        // A symlink has no mode of its own.
        self.set_staged(&target, &meta, None, xattrs)?;
        self.known.insert(path.clone(), Known::Linkable);
        self.plan.steps.push(Step::Symlink { path, staged });
        Ok(())
    }

    /// A named pipe: made in staging with its owner, mode and time, so
    /// that placing it is one `rename` as for a file.
    fn stage_fifo(
        &mut self,
        path: Vec<u8>,
        meta: Meta,
        xattrs: &[Xattr],
    ) -> Result<(), ExtractError> {
        let staged = self.staged_name();
        let target = self.staging.join(&staged);
        mkfifo(&target, Mode::from_bits_truncate(STAGED_FILE_MODE))
            .map_err(|e| write_error("create", &target)(e.into()))?;
        self.set_staged(&target, &meta, Some(meta.mode), xattrs)?;
        self.known.insert(path.clone(), Known::Linkable);
        self.plan.steps.push(Step::Fifo { path, staged });
        Ok(())
    }

    /// Gives staged `target` (no regular file: it is never followed) its
    /// owner, `mode` where it has one, time and extended attributes.
    fn set_staged(
        &self,
        target: &Path,
        meta: &Meta,
        mode: Option<u32>,
        xattrs: &[Xattr],
    ) -> Result<(), ExtractError> {
        if self.plan.owners {
            fchownat(
                AT_FDCWD,
                target,
                Some(Uid::from_raw(meta.uid)),
                Some(Gid::from_raw(meta.gid)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| write_error("chown", target)(e.into()))?;
        }
        if let Some(mode) = mode {
            std::fs::set_permissions(target, std::fs::Permissions::from_mode(mode))
                .map_err(write_error("chmod", target))?;
        }
        let time = meta.time();
        utimensat(
            AT_FDCWD,
            target,
            &time,
            &time,
            UtimensatFlags::NoFollowSymlink,
        )
        .map_err(|e| write_error("set the time of", target)(e.into()))?;
        set_xattrs(target, xattrs, |name, value| {
            xattr::set(target, name, value)
        })
        .map_err(write_error("set the attributes of", target))
    }

    fn stage_hard_link(
        &mut self,
        name: &str,
        link: Option<Vec<u8>>,
        path: Vec<u8>,
    ) -> Result<(), ExtractError> {
        let target = link
            .and_then(|link| normalize_bytes(&link).ok().flatten())
            .filter(|target| matches!(self.known.get(target), Some(Known::File | Known::Linkable)))
            .ok_or_else(|| reject(name, Reject::LinkTarget))?;
        self.known.insert(path.clone(), Known::File);
        self.plan.steps.push(Step::HardLink { path, target });
        Ok(())
    }

    /// A `.wh.` entry: `Ok(true)` if it was one (and is planned or skipped).
    fn whiteout(&mut self, name: &str, path: &[u8]) -> Result<bool, ExtractError> {
        let (parent, last) = split_parent(path);
        if last == OPAQUE_WHITEOUT.as_bytes() {
            if !parent.is_empty() {
                self.check_excluded(name, parent)?;
            }
            self.check_parents(name, path)?;
            self.plan.removals.push(Removal::Opaque(parent.to_vec()));
            return Ok(true);
        }
        if last.starts_with(WHITEOUT_META_PREFIX) || path.starts_with(WHITEOUT_META_PREFIX) {
            self.skip(path, SkipReason::EngineMetadata);
            return Ok(true);
        }
        let Some(hidden) = last.strip_prefix(WHITEOUT_PREFIX.as_bytes()) else {
            return Ok(false);
        };
        if matches!(hidden, b"" | b"." | b"..") {
            return Err(reject(name, Reject::BadWhiteout));
        }
        let target = join_child(parent, hidden);
        self.check_excluded(name, &target)?;
        self.check_parents(name, &target)?;
        self.known.entry(target.clone()).or_insert(Known::Absent);
        self.plan.removals.push(Removal::Whiteout(target));
        Ok(true)
    }
}

impl Unpack for Stager<'_> {
    fn add<R: Read>(
        &mut self,
        entry: &mut Member<'_, R>,
        meter: &Meter,
    ) -> Result<(), ExtractError> {
        let raw = std::mem::take(&mut entry.path);
        let kind = entry.header.entry_type();
        // The name as errors show it; the path keeps its bytes.
        let name = shown(&raw);
        let Some(path) = normalize_bytes(&raw).map_err(|why| reject(&name, why))? else {
            // The root's own metadata, set last; as anything but a
            // directory it means nothing.
            if kind != EntryType::Directory {
                self.skip(&raw, SkipReason::Root);
                return Ok(());
            }
            let meta =
                meta_of(&entry.header, entry.extras.mtime).map_err(|why| reject(&name, why))?;
            let xattrs = std::mem::take(&mut entry.extras.xattrs);
            self.plan.root = Some(RootDir { meta, xattrs });
            return Ok(());
        };
        if self.whiteout(&name, &path)? {
            return Ok(());
        }
        // Only a deletion marker may pass a name's length, by its prefix.
        if path
            .split(|&b| b == b'/')
            .any(|part| part.len() > MAX_NAME_BYTES)
        {
            return Err(reject(&name, Reject::BadName("name too long")));
        }
        let skip = match kind {
            EntryType::Char | EntryType::Block => Some(SkipReason::Device),
            EntryType::Regular
            | EntryType::Fifo
            | EntryType::Continuous
            | EntryType::Directory
            | EntryType::Symlink
            | EntryType::Link => None,
            _ => Some(SkipReason::Unsupported),
        };
        if let Some(reason) = skip {
            self.skip(&raw, reason);
            return Ok(());
        }
        self.check_excluded(&name, &path)?;
        self.check_parents(&name, &path)?;
        let meta = meta_of(&entry.header, entry.extras.mtime).map_err(|why| reject(&name, why))?;
        let xattrs = std::mem::take(&mut entry.extras.xattrs);
        let link = entry.link.take();
        match kind {
            EntryType::Directory => {
                self.known.insert(path.clone(), Known::Dir);
                self.plan.steps.push(Step::Dir { path, meta, xattrs });
                Ok(())
            }
            EntryType::Symlink => self.stage_symlink(&name, link, path, meta, &xattrs),
            EntryType::Link => self.stage_hard_link(&name, link, path),
            EntryType::Fifo => self.stage_fifo(path, meta, &xattrs),
            _ => match entry.extras.patch.take() {
                Some(patch) => {
                    self.stage_patch(&name, &mut entry.data, path, (meta, xattrs), patch, meter)
                }
                None => self.stage_file(&mut entry.data, path, meta, &xattrs, meter),
            },
        }
    }
}

/// The metadata a header gives with the entry's time, or why it is unusable.
fn meta_of(header: &tar::Header, mtime: Mtime) -> Result<Meta, Reject> {
    let bad = |_| Reject::BadName("unreadable mode, owner or time");
    let id = |value: u64| u32::try_from(value).map_err(|_| Reject::BadName("owner out of range"));
    Ok(Meta {
        mode: header.mode().map_err(bad)? & MODE_BITS,
        uid: id(header.uid().map_err(bad)?)?,
        gid: id(header.gid().map_err(bad)?)?,
        mtime: mtime.secs,
        mtime_nsec: mtime.nanos,
    })
}

/// Sets `xattrs` through `set`. One the file system or the agent's
/// privileges refuse (`security.capability` without `CAP_SETFCAP`, as in a
/// container silo made) is left off with a warning: the entry still holds
/// everything else, as the engine's own apply would.
pub(super) fn set_xattrs(
    shown: &Path,
    xattrs: &[Xattr],
    mut set: impl FnMut(&str, &[u8]) -> std::io::Result<()>,
) -> std::io::Result<()> {
    for (name, value) in xattrs {
        match set(name, value) {
            Ok(()) => {}
            Err(err) if matches!(err.raw_os_error(), Some(libc::EPERM | libc::EOPNOTSUPP)) => {
                tracing::warn!(path = %shown.display(), name, %err, "extended attribute left off");
            }
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// A path as messages show it (lossy where it is not UTF-8).
pub(super) fn shown(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// An entry's time as a `SystemTime` (before 1970 or out of range: the epoch).
fn system_time(meta: &Meta) -> SystemTime {
    u64::try_from(meta.mtime)
        .ok()
        .and_then(|secs| UNIX_EPOCH.checked_add(Duration::new(secs, meta.mtime_nsec)))
        .unwrap_or(UNIX_EPOCH)
}
