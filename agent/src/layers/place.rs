//! A staged [`Plan`] carried out on the live tree.
//!
//! Every change goes through directory descriptors: a path's parents are
//! opened from the root one component at a time with `O_NOFOLLOW`, and the
//! change is an `*at` call on the last one, so a symlink a process of the
//! sandbox plants after the staging checks makes the apply fail, never
//! steers it elsewhere. The removals come first (whiteouts, then opaque
//! directories' contents), never following a link and never entering an
//! excluded path or another file system; then the steps in layer order: a
//! directory is made (mode `0700` for now) or kept, a staged file or
//! symlink is renamed over whatever is there (a directory there is removed
//! first; across file systems it is copied beside and renamed), a hard link
//! is made beside and renamed; last, every directory of the layer gets its
//! owner, mode and time, deepest first, so placing entries in it neither
//! moves its time nor is refused by its mode, and the root directory its
//! own (the layer's [`silo_protocol::snapshot::ROOT_ENTRY`]) after them
//! all. A plan placed again after
//! the agent died half way ([`Resume`]) skips the removals once they were
//! done and the staged entries already renamed into place.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{
    FileStat, Mode, SFlag, UtimensatFlags, fchmod, fstatat, futimens, mkdirat, utimensat,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{
    Gid, Uid, UnlinkatFlags, fchown, fchownat, linkat, mkfifoat, symlinkat, unlinkat,
};

use silo_protocol::extras::Xattr;
use silo_protocol::snapshot::split_parent;

use super::stage::{Meta, Plan, Removal, RootDir, Step, set_xattrs};
use crate::fs_error::FsError;
use crate::paths::as_path;
use crate::push::extract::HOLE_BLOCK;
use crate::snapshot::layer::carried;

/// Mode of a directory made for a parent the layer does not list.
const IMPLIED_DIR_MODE: u32 = 0o755;
/// Mode of a directory the layer lists, until its own is set at the end.
const PLACING_DIR_MODE: u32 = 0o700;
/// Mode of a file copied across file systems while it is written.
const COPY_MODE: u32 = 0o600;
/// Bytes of a patch read from staging at a time: whole hole blocks.
const PATCH_BUFFER: usize = 64 * HOLE_BLOCK;

/// What placing a plan did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Placed {
    /// Directories made or kept.
    pub dirs: u64,
    /// Files placed.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// FIFOs placed.
    pub fifos: u64,
    /// Symlinks placed.
    pub symlinks: u64,
    /// Hard links made.
    pub hard_links: u64,
    /// Whiteouts and opaque markers carried out.
    pub whiteouts: u64,
}

/// Where a plan goes.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The machine's root.
    pub root: &'a Path,
    /// The staging directory the plan's files are in.
    pub staging: &'a Path,
    /// Paths (relative to `root`) never removed: mount points, `/proc` and the like.
    pub excluded: &'a HashSet<PathBuf>,
}

/// How far an earlier placing of the same plan got (see `journal`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Resume {
    /// The plan was being placed before: a file or symlink gone from
    /// staging was renamed into place then.
    pub again: bool,
    /// Its removals were all done: they are not run again.
    pub removals_done: bool,
}

/// Carries out `plan` (blocking), calling `removed` once the removals are
/// done. On error, what was done stays done.
pub fn place(
    plan: &Plan,
    target: Target<'_>,
    resume: Resume,
    removed: impl FnOnce() -> Result<(), FsError>,
) -> Result<Placed, FsError> {
    let root = open_dir(AT_FDCWD, target.root).map_err(sys("open", target.root))?;
    let root_dev = fstat_dev(&root, target.root)?;
    let staging = open_dir(AT_FDCWD, target.staging).map_err(sys("open", target.staging))?;
    let guard = Guard {
        root: target.root,
        excluded: target.excluded,
        root_dev,
    };
    let mut placer = Placer {
        dirs: Dirs {
            path: target.root.to_path_buf(),
            root,
            open: Vec::new(),
        },
        guard,
        staging,
        owners: plan.owners,
        placed: Placed::default(),
        temps: 0,
        again: resume.again,
    };
    if !resume.removals_done {
        for removal in &plan.removals {
            placer.remove(removal)?;
        }
        removed()?;
    }
    // Removed directories may be among the open ones.
    placer.dirs.open.clear();
    for step in &plan.steps {
        placer.step(step)?;
    }
    for step in plan.steps.iter().rev() {
        if let Step::Dir { path, meta, xattrs } = step {
            placer.finish_dir(path, meta, xattrs)?;
        }
    }
    if let Some(root) = &plan.root {
        placer.finish_root(root)?;
    }
    Ok(placer.placed)
}

/// The directories of the last path walked, kept open for the next.
struct Dirs {
    path: PathBuf,
    root: OwnedFd,
    /// `open[i]` is the path's first `i + 1` components.
    open: Vec<(Vec<u8>, OwnedFd)>,
}

impl Dirs {
    /// The directory at `rel` (`""`: the root), opened without following a
    /// symlink; a missing one is made (`create`) or answers `None`.
    fn dir(&mut self, rel: &[u8], create: bool) -> Result<Option<BorrowedFd<'_>>, FsError> {
        let parts: Vec<&[u8]> = rel
            .split(|&b| b == b'/')
            .filter(|part| !part.is_empty())
            .collect();
        let keep = self
            .open
            .iter()
            .zip(&parts)
            .take_while(|((open, _), part)| open == *part)
            .count();
        self.open.truncate(keep);
        for (depth, part) in parts.iter().enumerate().skip(keep) {
            let shown = || self.path.join(as_path(&parts[..=depth].join(&b'/')));
            let fd = {
                let at = self
                    .open
                    .last()
                    .map_or(self.root.as_fd(), |(_, fd)| fd.as_fd());
                match open_dir(at, *part) {
                    Ok(fd) => fd,
                    Err(Errno::ENOENT) if create => {
                        match mkdirat(at, *part, Mode::from_bits_truncate(IMPLIED_DIR_MODE)) {
                            Ok(()) | Err(Errno::EEXIST) => {}
                            Err(err) => return Err(FsError::new("create", &shown(), err.into())),
                        }
                        open_dir(at, *part).map_err(|err| not_a_dir(&shown(), err))?
                    }
                    Err(Errno::ENOENT) => return Ok(None),
                    // Not a directory (a file, a link never followed): nothing
                    // can be below it, which is all a lookup without
                    // `create` (a removal) needs to know.
                    Err(Errno::ENOTDIR | Errno::ELOOP) if !create => return Ok(None),
                    Err(err) => return Err(not_a_dir(&shown(), err)),
                }
            };
            self.open.push(((*part).to_vec(), fd));
        }
        Ok(Some(
            self.open
                .last()
                .map_or(self.root.as_fd(), |(_, fd)| fd.as_fd()),
        ))
    }
}

/// A failed open of a directory on the way, named plainly when it is a link.
fn not_a_dir(path: &Path, err: Errno) -> FsError {
    let source = match err {
        Errno::ELOOP => io::Error::other("is a symlink, which an apply never follows"),
        Errno::ENOTDIR => io::Error::other("is not a directory"),
        err => err.into(),
    };
    FsError::new("open directory", path, source)
}

/// What removals must never touch.
struct Guard<'a> {
    root: &'a Path,
    excluded: &'a HashSet<PathBuf>,
    root_dev: u64,
}

impl Guard<'_> {
    /// Removes `name` in `at` (`rel` from the root) and everything under it,
    /// never following a link, entering an excluded path or leaving the
    /// root's file system. Missing: nothing to do.
    fn remove(&self, at: BorrowedFd<'_>, name: &OsStr, rel: &Path) -> Result<(), FsError> {
        let shown = || self.root.join(rel);
        let stat = match fstatat(at, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::ENOENT) => return Ok(()),
            Err(err) => return Err(FsError::new("inspect", &shown(), err.into())),
        };
        if !is_dir(&stat) {
            return unlinkat(at, name, UnlinkatFlags::NoRemoveDir).map_err(sys("remove", &shown()));
        }
        if self.excluded.contains(rel) || stat.st_dev != self.root_dev {
            tracing::warn!(path = %shown().display(), "left in place: another file system or an excluded path");
            return Ok(());
        }
        let fd = open_dir(at, name).map_err(|err| not_a_dir(&shown(), err))?;
        if stat.st_mode & 0o700 != 0o700 {
            // Emptying it needs its owner's rights; it goes anyway.
            let mode = Mode::from_bits_truncate((stat.st_mode | 0o700) & 0o7777);
            fchmod(&fd, mode).map_err(sys("chmod", &shown()))?;
        }
        let mut dir = Dir::from_fd(fd).map_err(sys("read", &shown()))?;
        for child in children(&mut dir) {
            self.remove(dir.as_fd(), &child, &rel.join(&child))?;
        }
        unlinkat(at, name, UnlinkatFlags::RemoveDir).map_err(sys("remove", &shown()))
    }
}

struct Placer<'a> {
    dirs: Dirs,
    guard: Guard<'a>,
    staging: OwnedFd,
    owners: bool,
    placed: Placed,
    /// Names of temporaries made beside a destination.
    temps: u64,
    /// Placing a plan again (see [`Resume::again`]).
    again: bool,
}

impl Placer<'_> {
    fn remove(&mut self, removal: &Removal) -> Result<(), FsError> {
        match removal {
            Removal::Whiteout(path) => {
                let (parent, name) = split_parent(path);
                if let Some(at) = self.dirs.dir(parent, false)? {
                    self.guard
                        .remove(at, OsStr::from_bytes(name), as_path(path))?;
                }
            }
            Removal::Opaque(dir) => {
                let Some(at) = self.dirs.dir(dir, false)? else {
                    return Ok(());
                };
                let shown = self.guard.root.join(as_path(dir));
                let fd = at
                    .try_clone_to_owned()
                    .map_err(FsError::at("open", &shown))?;
                let mut list = Dir::from_fd(fd).map_err(sys("read", &shown))?;
                for child in children(&mut list) {
                    let rel = as_path(dir).join(&child);
                    if !self.guard.excluded.contains(&rel) {
                        self.guard.remove(list.as_fd(), &child, &rel)?;
                    }
                }
            }
        }
        self.placed.whiteouts += 1;
        Ok(())
    }

    fn step(&mut self, step: &Step) -> Result<(), FsError> {
        match step {
            Step::Dir { path, .. } => {
                self.make_dir(path)?;
                self.placed.dirs += 1;
            }
            Step::File { path, staged, size } => {
                self.put(path, staged, Staged::File)?;
                self.placed.files += 1;
                self.placed.bytes += size;
            }
            Step::Symlink { path, staged } => {
                self.put(path, staged, Staged::Symlink)?;
                self.placed.symlinks += 1;
            }
            Step::Fifo { path, staged } => {
                self.put(path, staged, Staged::Fifo)?;
                self.placed.fifos += 1;
            }
            Step::HardLink { path, target } => {
                self.link(path, target)?;
                self.placed.hard_links += 1;
            }
            Step::Patch {
                path,
                staged,
                size,
                ranges,
                meta,
                xattrs,
            } => {
                let patch = Patching {
                    staged,
                    size: *size,
                    ranges,
                };
                self.placed.bytes += self.patch(path, &patch, meta, xattrs)?;
                self.placed.files += 1;
            }
        }
        Ok(())
    }

    /// Writes a patch's staged bytes into the regular file at `path`, in
    /// place, then gives it the patch's size and `meta`, and exactly
    /// `xattrs`; the bytes written. Placing it again gives the same file.
    fn patch(
        &mut self,
        path: &[u8],
        patch: &Patching<'_>,
        meta: &Meta,
        xattrs: &[Xattr],
    ) -> Result<u64, FsError> {
        let shown = self.guard.root.join(as_path(path));
        let (parent, name) = split_parent(path);
        let at = self.dirs.dir(parent, false)?.ok_or_else(|| gone(&shown))?;
        let flags = OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let file = File::from(openat(at, name, flags, Mode::empty()).map_err(sys("open", &shown))?);
        let stat = nix::sys::stat::fstat(&file).map_err(sys("inspect", &shown))?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG
            || stat.st_nlink != 1
        {
            return Err(FsError::new(
                "patch",
                &shown,
                io::Error::other("is no longer a regular file with one name"),
            ));
        }
        let staged = File::from(
            openat(
                &self.staging,
                patch.staged,
                OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(sys("open the staged patch of", &shown))?,
        );
        let mut from = 0u64;
        let mut buf = vec![0u8; PATCH_BUFFER];
        for &(to, len) in patch.ranges {
            copy_range(&staged, from, &file, (to, len), &mut buf)
                .map_err(FsError::at("patch", &shown))?;
            from += len;
        }
        // What is already as wanted is left alone: on an overlay each call
        // is a trip to its daemon, and a new size drops the file's cache.
        if u64::try_from(stat.st_size).ok() != Some(patch.size) {
            file.set_len(patch.size)
                .map_err(FsError::at("cut", &shown))?;
        }
        // Owner first: a chown clears setuid and setgid, and drops
        // `security.capability`.
        let owner_differs = (stat.st_uid, stat.st_gid) != (meta.uid, meta.gid);
        if self.owners && owner_differs {
            fchown(
                &file,
                Some(Uid::from_raw(meta.uid)),
                Some(Gid::from_raw(meta.gid)),
            )
            .map_err(sys("chown", &shown))?;
        }
        if (self.owners && owner_differs) || stat.st_mode & 0o7777 != meta.mode & 0o7777 {
            fchmod(&file, Mode::from_bits_truncate(meta.mode)).map_err(sys("chmod", &shown))?;
        }
        set_xattrs_exactly(&file, xattrs, &shown)
            .map_err(FsError::at("set the attributes of", &shown))?;
        let time = meta.time();
        futimens(&file, &time, &time).map_err(sys("set the time of", &shown))?;
        Ok(from)
    }

    fn make_dir(&mut self, path: &[u8]) -> Result<(), FsError> {
        let shown = self.guard.root.join(as_path(path));
        let (parent, name) = split_parent(path);
        let at = self.dirs.dir(parent, true)?.ok_or_else(|| gone(&shown))?;
        match fstatat(at, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) if is_dir(&stat) => return Ok(()),
            Ok(_) => {
                unlinkat(at, name, UnlinkatFlags::NoRemoveDir).map_err(sys("remove", &shown))?
            }
            Err(Errno::ENOENT) => {}
            Err(err) => return Err(FsError::new("inspect", &shown, err.into())),
        }
        mkdirat(at, name, Mode::from_bits_truncate(PLACING_DIR_MODE)).map_err(sys("create", &shown))
    }

    /// Renames staged `staged` to `path`, over anything there.
    fn put(&mut self, path: &[u8], staged: &str, kind: Staged) -> Result<(), FsError> {
        let shown = self.guard.root.join(as_path(path));
        let (parent, name) = split_parent(path);
        if self.again && is_gone(self.staging.as_fd(), staged, &shown)? {
            return Ok(());
        }
        let at = self.dirs.dir(parent, true)?.ok_or_else(|| gone(&shown))?;
        clear_dir(&self.guard, at, name, path)?;
        match renameat(&self.staging, staged, at, name) {
            Ok(()) => Ok(()),
            Err(Errno::EXDEV) => {
                self.temps += 1;
                let temp = temp_name(self.temps);
                let staging = self.staging.as_fd();
                let copied = match kind {
                    Staged::File => copy_file(staging, staged, at, &temp, self.owners),
                    Staged::Symlink => copy_link(staging, staged, at, &temp, self.owners),
                    Staged::Fifo => copy_fifo(staging, staged, at, &temp, self.owners),
                };
                replace_with(at, &temp, name, copied)
                    .map_err(FsError::at("copy into place", &shown))
            }
            Err(err) => Err(FsError::new("rename into place", &shown, err.into())),
        }
    }

    /// Makes `path` a second name of `target`, placed earlier.
    fn link(&mut self, path: &[u8], target: &[u8]) -> Result<(), FsError> {
        let shown = self.guard.root.join(as_path(path));
        let (target_parent, target_name) = split_parent(target);
        let from = self
            .dirs
            .dir(target_parent, false)?
            .ok_or_else(|| gone(&self.guard.root.join(as_path(target))))?
            .try_clone_to_owned()
            .map_err(FsError::at(
                "open",
                &self.guard.root.join(as_path(target_parent)),
            ))?;
        let (parent, name) = split_parent(path);
        let at = self.dirs.dir(parent, true)?.ok_or_else(|| gone(&shown))?;
        clear_dir(&self.guard, at, name, path)?;
        self.temps += 1;
        let temp = temp_name(self.temps);
        let linked = linkat(&from, target_name, at, temp.as_str(), AtFlags::empty())
            .map_err(io::Error::from);
        replace_with(at, &temp, name, linked).map_err(FsError::at("link into place", &shown))?;
        // A rename onto another name of the same file does nothing (a link
        // placed again), which leaves the temporary behind.
        match unlinkat(at, temp.as_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(err) => Err(FsError::new("remove", &shown, err.into())),
        }
    }

    /// Sets a directory's owner, mode, extended attributes (dropping those
    /// the layer does not give it) and time, after everything in it.
    fn finish_dir(&mut self, path: &[u8], meta: &Meta, xattrs: &[Xattr]) -> Result<(), FsError> {
        let shown = self.guard.root.join(as_path(path));
        let (parent, name) = split_parent(path);
        let at = self.dirs.dir(parent, false)?.ok_or_else(|| gone(&shown))?;
        let fd = open_dir(at, name).map_err(|err| not_a_dir(&shown, err))?;
        self.set_dir_meta(&fd, meta, xattrs, &shown)
    }

    /// Gives the root directory its own metadata, last: placing anything
    /// in it moves its time.
    fn finish_root(&mut self, root: &RootDir) -> Result<(), FsError> {
        let shown = self.guard.root.to_path_buf();
        let fd = self
            .dirs
            .root
            .try_clone()
            .map_err(FsError::at("open", &shown))?;
        // An agent that is not root may only change a root it owns (a
        // provider's machine where it runs as a user): elsewhere the root
        // stays as the machine has it.
        let owner = nix::sys::stat::fstat(&fd).map_err(sys("inspect", &shown))?;
        if !self.owners && owner.st_uid != nix::unistd::geteuid().as_raw() {
            tracing::warn!(path = %shown.display(), "root directory's metadata left as it is: not ours to change");
            return Ok(());
        }
        self.set_dir_meta(&fd, &root.meta, &root.xattrs, &shown)?;
        self.placed.dirs += 1;
        Ok(())
    }

    fn set_dir_meta(
        &self,
        fd: &OwnedFd,
        meta: &Meta,
        xattrs: &[Xattr],
        shown: &Path,
    ) -> Result<(), FsError> {
        if self.owners {
            fchown(
                fd,
                Some(Uid::from_raw(meta.uid)),
                Some(Gid::from_raw(meta.gid)),
            )
            .map_err(sys("chown", shown))?;
        }
        fchmod(fd, Mode::from_bits_truncate(meta.mode)).map_err(sys("chmod", shown))?;
        let dir = File::from(fd.try_clone().map_err(FsError::at("open", shown))?);
        set_xattrs_exactly(&dir, xattrs, shown)
            .map_err(FsError::at("set the attributes of", shown))?;
        let time = meta.time();
        futimens(fd, &time, &time).map_err(sys("set the time of", shown))
    }
}

/// Gives directory `dir` exactly the extended attributes `xattrs` (but the
/// file system's own, which no layer carries). Every value that is not the
/// wanted one goes before any is set: the space beside an inode is small
/// (about 4 KiB on ext4), and the old values and the new ones together may
/// not fit where either set alone does.
fn set_xattrs_exactly(dir: &File, xattrs: &[Xattr], shown: &Path) -> io::Result<()> {
    use xattr::FileExt;
    let present = match dir.list_xattr() {
        Ok(names) => names,
        Err(err) if err.raw_os_error() == Some(libc::EOPNOTSUPP) => return Ok(()),
        Err(err) => return Err(err),
    };
    let mut kept = Vec::new();
    for name in present {
        if let Some(text) = name.to_str() {
            if !carried(text) {
                continue;
            }
            let wanted = xattrs.iter().find(|(n, _)| n == text).map(|(_, v)| v);
            if wanted.is_some() && dir.get_xattr(&name)?.as_ref() == wanted {
                kept.push(text.to_owned());
                continue;
            }
        }
        match dir.remove_xattr(&name) {
            Ok(()) => {}
            Err(err) if matches!(err.raw_os_error(), Some(libc::EPERM | libc::ENODATA)) => {}
            Err(err) => return Err(err),
        }
    }
    let missing: Vec<Xattr> = xattrs
        .iter()
        .filter(|(name, _)| !kept.contains(name))
        .cloned()
        .collect();
    set_xattrs(shown, &missing, |name, value| dir.set_xattr(name, value))
}

/// A patch step's parts: the staged bytes' name, the size after, the
/// ranges (offset, length) the bytes go to, in order.
struct Patching<'a> {
    staged: &'a str,
    size: u64,
    ranges: &'a [(u64, u64)],
}

/// Copies `len` bytes at `from` of `staged` to `to` of `file`: each whole
/// [`HOLE_BLOCK`] of zeros (aligned to the file) as a hole, as a whole
/// file written from a layer has them, the rest as it is.
fn copy_range(
    staged: &File,
    from: u64,
    file: &File,
    (to, len): (u64, u64),
    buf: &mut [u8],
) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut done = 0u64;
    while done < len {
        let want = usize::try_from(len - done)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let chunk = &mut buf[..want];
        staged.read_exact_at(chunk, from + done)?;
        let mut i = 0usize;
        while i < chunk.len() {
            let at = to + done + i as u64;
            let into_block = usize::try_from(at % HOLE_BLOCK as u64).unwrap_or(0);
            let end = (i + HOLE_BLOCK - into_block).min(chunk.len());
            let block = &chunk[i..end];
            if block.len() == HOLE_BLOCK && block.iter().all(|&b| b == 0) {
                punch_hole(file, at, block)?;
            } else {
                file.write_all_at(block, at)?;
            }
            i = end;
        }
        done += want as u64;
    }
    Ok(())
}

/// Makes `zeros`' place at `at` of `file` a hole; where the file system
/// cannot punch one, writes the zeros.
fn punch_hole(file: &File, at: u64, zeros: &[u8]) -> io::Result<()> {
    use nix::fcntl::{FallocateFlags, fallocate};
    use std::os::unix::fs::FileExt;
    let (Ok(offset), Ok(len)) = (i64::try_from(at), i64::try_from(zeros.len())) else {
        return file.write_all_at(zeros, at);
    };
    let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    match fallocate(file, flags, offset, len) {
        Ok(()) => Ok(()),
        Err(Errno::EOPNOTSUPP | Errno::ENOSYS) => file.write_all_at(zeros, at),
        Err(err) => Err(err.into()),
    }
}

/// Removes a directory at `name` in `at`, which a file or link replaces.
fn clear_dir(
    guard: &Guard<'_>,
    at: BorrowedFd<'_>,
    name: &[u8],
    path: &[u8],
) -> Result<(), FsError> {
    match fstatat(at, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) if is_dir(&stat) => guard.remove(at, OsStr::from_bytes(name), as_path(path)),
        _ => Ok(()),
    }
}

/// Whether staged entry `staged` is no longer in staging (placed before).
fn is_gone(staging: BorrowedFd<'_>, staged: &str, shown: &Path) -> Result<bool, FsError> {
    match fstatat(staging, staged, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(false),
        Err(Errno::ENOENT) => Ok(true),
        Err(err) => Err(FsError::new("inspect the staged", shown, err.into())),
    }
}

/// Renames `temp` over `name` once `made` succeeded; removes it otherwise.
fn replace_with(
    at: BorrowedFd<'_>,
    temp: &str,
    name: &[u8],
    made: io::Result<()>,
) -> io::Result<()> {
    let result = made.and_then(|()| renameat(at, temp, at, name).map_err(io::Error::from));
    if result.is_err() {
        let _ = unlinkat(at, temp, UnlinkatFlags::NoRemoveDir);
    }
    result
}

/// Copies staged file `staged` to `temp` in `at`, metadata included.
fn copy_file(
    staging: BorrowedFd<'_>,
    staged: &str,
    at: BorrowedFd<'_>,
    temp: &str,
    owners: bool,
) -> io::Result<()> {
    let mut from = File::from(openat(
        staging,
        staged,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?);
    let meta = from.metadata()?;
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut to = File::from(openat(
        at,
        temp,
        flags,
        Mode::from_bits_truncate(COPY_MODE),
    )?);
    io::copy(&mut from, &mut to)?;
    if owners {
        std::os::unix::fs::fchown(&to, Some(meta.uid()), Some(meta.gid()))?;
    }
    to.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    copy_xattrs(&from, &to, Path::new(temp))?;
    to.set_modified(meta.modified()?)
}

/// Gives `to` (shown as `shown`) the extended attributes of `from`.
fn copy_xattrs(from: &File, to: &File, shown: &Path) -> io::Result<()> {
    use xattr::FileExt;
    let names = match from.list_xattr() {
        Ok(names) => names,
        Err(err) if err.raw_os_error() == Some(libc::EOPNOTSUPP) => return Ok(()),
        Err(err) => return Err(err),
    };
    let mut xattrs = Vec::new();
    for name in names {
        if let (Some(text), Some(value)) = (name.to_str(), from.get_xattr(&name)?) {
            xattrs.push((text.to_owned(), value));
        }
    }
    set_xattrs(shown, &xattrs, |name, value| to.set_xattr(name, value))
}

/// Makes `temp` in `at` a copy of staged symlink `staged`, owner and time included.
fn copy_link(
    staging: BorrowedFd<'_>,
    staged: &str,
    at: BorrowedFd<'_>,
    temp: &str,
    owners: bool,
) -> io::Result<()> {
    let link = readlinkat(staging, staged)?;
    let stat = fstatat(staging, staged, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    symlinkat(link.as_os_str(), at, temp)?;
    if owners {
        fchownat(
            at,
            temp,
            Some(Uid::from_raw(stat.st_uid)),
            Some(Gid::from_raw(stat.st_gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
    }
    let time = TimeSpec::new(stat.st_mtime, stat.st_mtime_nsec);
    utimensat(at, temp, &time, &time, UtimensatFlags::NoFollowSymlink)?;
    Ok(())
}

/// Makes `temp` in `at` a FIFO like staged FIFO `staged`, owner, mode and
/// time included.
fn copy_fifo(
    staging: BorrowedFd<'_>,
    staged: &str,
    at: BorrowedFd<'_>,
    temp: &str,
    owners: bool,
) -> io::Result<()> {
    let stat = fstatat(staging, staged, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    mkfifoat(at, temp, Mode::from_bits_truncate(0o600))?;
    // Set through a descriptor of the FIFO itself (opening it for reading
    // without blocking), never through a name that could be swapped.
    let fifo = File::from(openat(
        at,
        temp,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?);
    if owners {
        fchown(
            &fifo,
            Some(Uid::from_raw(stat.st_uid)),
            Some(Gid::from_raw(stat.st_gid)),
        )?;
    }
    fchmod(&fifo, Mode::from_bits_truncate(stat.st_mode & 0o7777))?;
    let time = TimeSpec::new(stat.st_mtime, stat.st_mtime_nsec);
    futimens(&fifo, &time, &time)?;
    Ok(())
}

/// What a staged entry is, for the copy that replaces a rename across
/// devices.
#[derive(Debug, Clone, Copy)]
enum Staged {
    File,
    Symlink,
    Fifo,
}

fn open_dir<P: ?Sized + nix::NixPath>(at: impl AsFd, name: &P) -> nix::Result<OwnedFd> {
    openat(
        at,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

fn fstat_dev(fd: &OwnedFd, path: &Path) -> Result<u64, FsError> {
    nix::sys::stat::fstat(fd)
        .map(|stat| stat.st_dev)
        .map_err(|err| FsError::new("inspect", path, err.into()))
}

fn is_dir(stat: &FileStat) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

/// The names in `dir` but `.` and `..`.
fn children(dir: &mut Dir) -> Vec<OsString> {
    dir.iter()
        .filter_map(Result::ok)
        .map(|entry| OsStr::from_bytes(entry.file_name().to_bytes()).to_owned())
        .filter(|child| child != "." && child != "..")
        .collect()
}

/// A failed system call `what` on `path`, for `map_err`.
fn sys(what: &'static str, path: &Path) -> impl FnOnce(Errno) -> FsError {
    let path = path.to_path_buf();
    move |err| FsError::new(what, &path, err.into())
}

fn temp_name(seq: u64) -> String {
    format!(".silo-apply.{}.{seq}", std::process::id())
}

/// A directory made or checked a moment ago is gone (made with `create`,
/// so only a race can do this).
fn gone(path: &Path) -> FsError {
    FsError::new(
        "open directory",
        path,
        io::Error::from(io::ErrorKind::NotFound),
    )
}
