//! Trees as tar: a download streams one, an upload lands in a staging
//! directory and is merged in only once its hash is known to be right.

use std::fs::{Metadata, OpenOptions, Permissions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use silo_protocol::bundle::BundleLimits;
use silo_protocol::files::TreeWritten;
use silo_protocol::link::append_symlink;

use super::ops::lstat;
use super::path::{Target, undo};
use super::{DEFAULT_DIR_MODE, FilesError};
use crate::body::BodyError;
use crate::cleanup;
use crate::fs_error::FsError;
use crate::push::archive::Packing;
use crate::push::extract;

/// Mode of a staging directory while it fills: nobody else needs to look in.
const STAGING_MODE: u32 = 0o700;
/// The first bytes of a gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Ends the name of a staging directory beside an upload's destination.
const STAGING_SUFFIX: &str = ".silo-staging";

/// Checks that there is something to download, before the answer starts.
pub fn check_download(target: &Target) -> Result<Metadata, FilesError> {
    target.check()?;
    lstat(&target.path)
}

/// Writes the path (a file, a symlink or a whole directory) as a tar whose
/// entries are named from the path's last component down. Symlinks are
/// stored as symlinks; devices, FIFOs and sockets are left out.
pub fn download(target: &Target, out: impl Write) -> Result<(), FilesError> {
    let meta = check_download(target)?;
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    let name = PathBuf::from(target.name());
    add(&mut builder, &target.path, &name, &meta)?;
    builder
        .into_inner()
        .and_then(|mut out| out.flush())
        .map_err(|e| FsError::new("send tar of", &target.path, e))?;
    Ok(())
}

fn add<W: Write>(
    builder: &mut tar::Builder<W>,
    path: &Path,
    name: &Path,
    meta: &Metadata,
) -> Result<(), FilesError> {
    let send = |e| FsError::new("send tar of", path, e);
    let file_type = meta.file_type();
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
    if file_type.is_symlink() {
        let target = std::fs::read_link(path).map_err(FsError::at("read link", path))?;
        append_symlink(builder, &mut header, name, target.as_os_str().as_bytes()).map_err(send)?;
    } else if file_type.is_file() {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(FsError::at("open", path))?;
        // The size in the header is the one read: a file that shrinks
        // meanwhile would otherwise leave a short, corrupt entry.
        let meta = file.metadata().map_err(FsError::at("inspect", path))?;
        header.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
        let size = meta.len();
        let body = file.take(size).chain(io::repeat(0).take(size));
        builder
            .append_data(&mut header, name, body.take(size))
            .map_err(send)?;
    } else if file_type.is_dir() {
        header.set_size(0);
        builder
            .append_data(&mut header, name, io::empty())
            .map_err(send)?;
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(path).map_err(FsError::at("read directory", path))? {
            let entry = entry.map_err(FsError::at("read directory", path))?;
            entries.push(entry.file_name());
        }
        entries.sort();
        for entry in entries {
            let child = path.join(&entry);
            match std::fs::symlink_metadata(&child) {
                Ok(meta) => add(builder, &child, &name.join(&entry), &meta)?,
                // Removed since the directory was read.
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(FsError::new("inspect", &child, err).into()),
            }
        }
    } else {
        tracing::debug!(path = %path.display(), "left out of a tree download: not a file, directory or symlink");
    }
    Ok(())
}

/// How a tree is uploaded.
#[derive(Debug, Clone)]
pub struct Upload<'a> {
    /// Make missing directories above the destination.
    pub parents: bool,
    /// The signed SHA-256 the body must have.
    pub sha256: &'a str,
    /// Caps on the tree.
    pub limits: &'a BundleLimits,
    /// Set when the client has gone away.
    pub cancelled: &'a AtomicBool,
}

/// Extracts the tar (plain, or gzip by its magic bytes) read from `body`
/// into a staging directory beside the path, then, once its hash matches,
/// merges it into the directory at the path (made if missing). Whatever
/// fails before the merge leaves nothing behind.
pub fn upload(
    target: &Target,
    how: &Upload<'_>,
    body: impl Read,
) -> Result<TreeWritten, FilesError> {
    target.check()?;
    let dest = &target.path;
    match std::fs::symlink_metadata(dest) {
        Ok(meta) if meta.is_dir() => {}
        Ok(meta) if meta.file_type().is_symlink() && target.confine.is_none() => {
            if !std::fs::metadata(dest).is_ok_and(|m| m.is_dir()) {
                return Err(FilesError::NotADirectory(dest.clone()));
            }
        }
        Ok(_) => return Err(FilesError::NotADirectory(dest.clone())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(FsError::new("inspect", dest, err).into()),
    }
    let made = target.ensure_parent(how.parents)?;
    let name = cleanup::unique_name(&format!(".{}", target.name()), STAGING_SUFFIX);
    // Journaled before it exists, so an agent killed mid-way leaves the
    // next boot a name to sweep; dropped at the end, it removes what is left.
    let intent = cleanup::global().intend(target.parent()?.join(name));
    let staging = intent.path().to_path_buf();
    if let Err(err) = std::fs::DirBuilder::new()
        .mode(STAGING_MODE)
        .create(&staging)
    {
        undo(&made);
        return Err(FsError::new("create", &staging, err).into());
    }
    let extracted = extract_into(&staging, how, body);
    let result = extracted.and_then(|extracted| {
        // The staging directory itself becomes the destination if that is new.
        std::fs::set_permissions(&staging, Permissions::from_mode(DEFAULT_DIR_MODE))
            .map_err(FsError::at("chmod", &staging))?;
        let mut dirs = 0;
        merge(target, &staging, dest, &mut dirs)?;
        Ok(TreeWritten {
            files: extracted.files,
            dirs,
            bytes: extracted.bytes,
        })
    });
    // Gone already when a new destination went in with one rename.
    drop(intent);
    if result.is_err() {
        undo(&made);
    }
    result
}

fn extract_into(
    staging: &Path,
    how: &Upload<'_>,
    body: impl Read,
) -> Result<extract::Extracted, FilesError> {
    let mut body = BufReader::new(body);
    let packing = match body.fill_buf() {
        Ok(head) if head.starts_with(&GZIP_MAGIC) => Packing::Gzip,
        Ok(_) => Packing::Tar,
        Err(err) => return Err(BodyError::Broken(err).into()),
    };
    Ok(extract::extract_packed(
        packing,
        body,
        staging,
        how.limits,
        how.sha256,
        how.cancelled,
    )?)
}

/// Moves what `from` holds into `to`: directories are made or kept, files
/// (and whatever else is in their way but a directory) replaced.
fn merge(target: &Target, from: &Path, to: &Path, dirs: &mut u64) -> Result<(), FilesError> {
    match std::fs::symlink_metadata(to) {
        Ok(meta) if meta.file_type().is_symlink() && target.confine.is_some() => {
            return Err(FilesError::OutsideConfine {
                path: to.to_path_buf(),
                reason: "is a symlink",
            });
        }
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            // A whole new directory goes in with one rename.
            std::fs::rename(from, to).map_err(FsError::at("rename into place", to))?;
            *dirs += count_dirs(to)?;
            return Ok(());
        }
        Err(err) => return Err(FsError::new("inspect", to, err).into()),
    }
    if !std::fs::metadata(to).is_ok_and(|m| m.is_dir()) {
        return Err(FilesError::NotADirectory(to.to_path_buf()));
    }
    *dirs += 1;
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(from).map_err(FsError::at("read directory", from))? {
        let entry = entry.map_err(FsError::at("read directory", from))?;
        let is_dir = entry
            .file_type()
            .map_err(FsError::at("inspect", &entry.path()))?
            .is_dir();
        entries.push((entry.file_name(), is_dir));
    }
    for (name, is_dir) in entries {
        let (src, dst) = (from.join(&name), to.join(&name));
        if is_dir {
            merge(target, &src, &dst, dirs)?;
        } else {
            if std::fs::symlink_metadata(&dst).is_ok_and(|m| m.is_dir()) {
                return Err(FilesError::IsADirectory(dst));
            }
            std::fs::rename(&src, &dst).map_err(FsError::at("rename into place", &dst))?;
        }
    }
    Ok(())
}

/// Directories in a tree, its top included.
fn count_dirs(dir: &Path) -> Result<u64, FilesError> {
    let mut count = 1;
    for entry in std::fs::read_dir(dir).map_err(FsError::at("read directory", dir))? {
        let entry = entry.map_err(FsError::at("read directory", dir))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            count += count_dirs(&entry.path())?;
        }
    }
    Ok(count)
}
