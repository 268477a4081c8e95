//! One path at a time: stat, list, read, write, mkdir and remove.

use std::fs::{File, Metadata, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use sha2::{Digest, Sha256};
use silo_protocol::files::{FileKind, FileStat, Listing, Removed};

use super::path::{Target, undo};
use super::{DEFAULT_DIR_MODE, DEFAULT_FILE_MODE, FilesError};
use crate::body::BodyError;
use crate::cleanup;
use crate::fs_error::FsError;

/// Buffer for copying a body into a file.
const COPY_BUFFER: usize = 256 * 1024;
/// Mode of a temporary file while it fills: nobody else needs to look in.
const TEMP_MODE: u32 = 0o600;
/// Ends the name of a temporary file, so one a crash left is recognisable.
const TEMP_SUFFIX: &str = ".silo-tmp";

/// What is at the path, a final symlink not followed.
pub fn stat(target: &Target) -> Result<FileStat, FilesError> {
    target.check()?;
    let meta = lstat(&target.path)?;
    describe(target.shown.clone(), target.name(), &target.path, &meta)
}

/// The directory's entries, sorted by name, none of them followed.
pub fn list(target: &Target) -> Result<Listing, FilesError> {
    target.check()?;
    let dir = &target.path;
    let meta = std::fs::metadata(dir).map_err(|e| not_found_or(e, "inspect", dir))?;
    if !meta.is_dir() {
        return Err(FilesError::NotADirectory(dir.clone()));
    }
    let base = target.shown.trim_end_matches('/');
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(FsError::at("read directory", dir))? {
        let entry = entry.map_err(FsError::at("read directory", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let meta = match entry.metadata() {
            Ok(meta) => meta,
            // Removed since the directory was read.
            Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
            Err(err) => return Err(FsError::new("inspect", &path, err).into()),
        };
        entries.push(describe(format!("{base}/{name}"), name, &path, &meta)?);
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Listing { entries })
}

/// Opens a regular file for reading.
pub fn open_read(target: &Target) -> Result<File, FilesError> {
    target.check()?;
    let path = &target.path;
    let mut options = OpenOptions::new();
    options.read(true);
    // A FIFO would block the open; non-blocking, it is opened and refused.
    let mut flags = libc::O_NONBLOCK;
    if target.confine.is_some() {
        flags |= libc::O_NOFOLLOW;
    }
    let file = options
        .custom_flags(flags)
        .open(path)
        .map_err(|e| not_found_or(e, "open", path))?;
    let meta = file.metadata().map_err(FsError::at("inspect", path))?;
    if meta.is_dir() {
        return Err(FilesError::IsADirectory(path.clone()));
    }
    if !meta.is_file() {
        return Err(FilesError::NotRegular(path.clone()));
    }
    Ok(file)
}

/// How a file is written.
#[derive(Debug, Clone)]
pub struct WriteSpec {
    /// Permission bits; unset keeps an existing file's.
    pub mode: Option<u32>,
    /// Make missing parent directories.
    pub parents: bool,
    /// The signed SHA-256 the body must have.
    pub sha256: String,
    /// Most bytes the body may have.
    pub limit: u64,
}

/// Writes `body` to a temporary file beside the path, checks its size and
/// hash, and renames it over the path. On failure nothing is left: no
/// temporary file (its journaled intent removes it) and no parent made for it.
pub fn write_file(
    target: &Target,
    how: &WriteSpec,
    body: impl Read,
) -> Result<FileStat, FilesError> {
    target.check()?;
    let path = &target.path;
    let existing = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => return Err(FilesError::IsADirectory(path.clone())),
        Ok(meta) => Some(meta),
        Err(err) if matches!(err.raw_os_error(), Some(libc::ENOENT)) => None,
        Err(err) => return Err(FsError::new("inspect", path, err).into()),
    };
    let mode = how.mode.unwrap_or_else(|| {
        existing
            .as_ref()
            .filter(|meta| meta.is_file())
            .map_or(DEFAULT_FILE_MODE, |meta| meta.mode() & 0o7777)
    });
    let made = target.ensure_parent(how.parents)?;
    let result = fill_and_persist(target, mode, how, body);
    if result.is_err() {
        undo(&made);
    }
    result?;
    stat(target)
}

fn fill_and_persist(
    target: &Target,
    mode: u32,
    how: &WriteSpec,
    mut body: impl Read,
) -> Result<(), FilesError> {
    let (dir, path) = (target.parent()?, &target.path);
    let name = cleanup::unique_name(&format!(".{}", target.name()), TEMP_SUFFIX);
    // Journaled before it exists, so an agent killed mid-write leaves the
    // next boot a name to sweep; dropped on failure, it removes the file.
    let intent = cleanup::global().intend(dir.join(name));
    let temp = intent.path().to_path_buf();
    // O_EXCL under a name no agent used before, so it never follows a link
    // planted in its place.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(TEMP_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&temp)
        .map_err(FsError::at("create a temporary file in", dir))?;
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0; COPY_BUFFER];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(BodyError::Broken(err).into()),
        };
        total += n as u64;
        if total > how.limit {
            return Err(BodyError::over(how.limit).into());
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])
            .map_err(FsError::at("write", &temp))?;
    }
    let actual = hex::encode(hasher.finalize());
    if actual != how.sha256 {
        return Err(FilesError::HashMismatch {
            claimed: how.sha256.clone(),
            actual,
        });
    }
    // Exactly the asked bits: the umask narrowed them at creation.
    let written = &file;
    written
        .set_permissions(Permissions::from_mode(mode))
        .map_err(FsError::at("chmod", &temp))?;
    // On disk before it is visible, so a crash never shows a short file.
    written.sync_all().map_err(FsError::at("sync", &temp))?;
    drop(file);
    std::fs::rename(&temp, path).map_err(|err| FsError::new("rename into place", path, err))?;
    intent.done();
    Ok(())
}

/// Makes a directory (and, with `parents`, those above it). One already
/// there is kept as it is.
pub fn make_dir(target: &Target, mode: Option<u32>, parents: bool) -> Result<FileStat, FilesError> {
    target.check()?;
    let path = &target.path;
    let made = target.ensure_parent(parents)?;
    let mode = mode.unwrap_or(DEFAULT_DIR_MODE);
    let result = match std::fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => std::fs::set_permissions(path, Permissions::from_mode(mode))
            .map_err(|e| FsError::new("chmod", path, e).into()),
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.is_dir() => Ok(()),
                _ => Err(FilesError::NotADirectory(path.clone())),
            }
        }
        Err(err) => Err(FsError::new("create", path, err).into()),
    };
    if result.is_err() {
        undo(&made);
    }
    result?;
    stat(target)
}

/// Moves `from` to `to` with one `rename(2)`: atomic, on one file system.
/// A file at `to` is replaced, a directory only when empty; `from` itself
/// is moved, not what a symlink there points to.
pub fn rename(from: &Target, to: &Target, parents: bool) -> Result<FileStat, FilesError> {
    from.check()?;
    to.check()?;
    lstat(&from.path)?;
    let made = to.ensure_parent(parents)?;
    if let Err(err) = std::fs::rename(&from.path, &to.path) {
        undo(&made);
        return Err(match err.raw_os_error() {
            Some(libc::ENOTEMPTY | libc::EEXIST) => FilesError::NotEmpty(to.path.clone()),
            Some(libc::EXDEV) => FilesError::BadPath {
                path: to.shown.clone(),
                reason: "is on another file system (a rename cannot cross file systems)",
            },
            Some(libc::EINVAL) => FilesError::BadPath {
                path: to.shown.clone(),
                reason: "is inside the directory being moved",
            },
            _ => FsError::new("rename", &from.path, err).into(),
        });
    }
    stat(to)
}

/// Removes a file, a symlink (not what it points to) or an empty
/// directory; with `recursive`, a directory and everything in it.
pub fn remove(target: &Target, recursive: bool) -> Result<Removed, FilesError> {
    target.check()?;
    let path = &target.path;
    let meta = lstat(path)?;
    let entries = if !meta.is_dir() {
        std::fs::remove_file(path).map_err(|e| not_found_or(e, "remove", path))?;
        1
    } else if recursive {
        remove_tree(path)?
    } else {
        match std::fs::remove_dir(path) {
            Ok(()) => 1,
            Err(err) if err.raw_os_error() == Some(libc::ENOTEMPTY) => {
                return Err(FilesError::NotEmpty(path.clone()));
            }
            Err(err) => return Err(not_found_or(err, "remove", path)),
        }
    };
    Ok(Removed { entries })
}

/// Removes a directory tree without following any symlink in it, counting
/// what it removed.
pub(super) fn remove_tree(dir: &Path) -> Result<u64, FilesError> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir).map_err(FsError::at("read directory", dir))? {
        let entry = entry.map_err(FsError::at("read directory", dir))?;
        let path = entry.path();
        // `file_type` does not follow a symlink, so a link to a directory
        // is unlinked, never descended into.
        let is_dir = entry
            .file_type()
            .map_err(FsError::at("inspect", &path))?
            .is_dir();
        if is_dir {
            removed += remove_tree(&path)?;
        } else {
            match std::fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(FsError::new("remove", &path, err).into()),
            }
        }
    }
    std::fs::remove_dir(dir).map_err(FsError::at("remove", dir))?;
    Ok(removed + 1)
}

/// What is at `path`, a final symlink not followed; nothing there is
/// [`FilesError::NotFound`].
pub(super) fn lstat(path: &Path) -> Result<Metadata, FilesError> {
    std::fs::symlink_metadata(path).map_err(|e| not_found_or(e, "inspect", path))
}

/// A missing path as [`FilesError::NotFound`], anything else as it came.
fn not_found_or(err: io::Error, what: &'static str, path: &Path) -> FilesError {
    if err.kind() == io::ErrorKind::NotFound {
        FilesError::NotFound(path.to_path_buf())
    } else {
        FsError::new(what, path, err).into()
    }
}

/// A [`FileStat`] from metadata that did not follow a final symlink.
fn describe(
    shown: String,
    name: String,
    path: &Path,
    meta: &Metadata,
) -> Result<FileStat, FilesError> {
    let file_type = meta.file_type();
    let kind = if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_dir() {
        FileKind::Dir
    } else if file_type.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    let link_target = if file_type.is_symlink() {
        let target = std::fs::read_link(path).map_err(FsError::at("read link", path))?;
        Some(target.to_string_lossy().into_owned())
    } else {
        None
    };
    let modified_ms = meta
        .mtime()
        .saturating_mul(1000)
        .saturating_add(meta.mtime_nsec() / 1_000_000);
    Ok(FileStat {
        path: shown,
        name,
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        modified_ms,
        link_target,
    })
}
