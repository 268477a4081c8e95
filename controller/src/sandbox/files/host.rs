//! The host's half of a copy, as blocking calls: a host tree read into a
//! tar that keeps its permission bits, and a tar from a sandbox unpacked
//! into a staging directory beside its destination and moved into place.
//!
//! A tree going in is walked by the push walk ([`files_from_dir`]), so a
//! symlink or a special file is refused by name before anything is sent.
//! A tar coming out was written by sandbox code's reach, so it is checked
//! before it is unpacked: one top entry named as asked, plain relative
//! names, and only files, directories and symlinks. It is unpacked with the
//! tar crate's guarded unpack (no entry written through a symlink or outside
//! the staging directory, permission bits without setuid, setgid or sticky,
//! no owners) and then renamed into place, so a refused tar leaves nothing.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use silo_protocol::bundle::FileEntry;
use silo_protocol::exact::ExactReader;

use super::copy::{Copied, CopyError};
use crate::push::files_from_dir;

/// Permission bits a copy keeps, as the agent's extract does: no setuid,
/// setgid or sticky bit.
pub(super) const MODE_BITS: u32 = 0o777;
/// How staging directories beside a destination start their names.
const STAGING_PREFIX: &str = ".silo-cp-";

/// A host directory as an uncompressed tar: entries named from `top` down
/// (`top` itself included, with its mode), or the directory's contents
/// alone when `top` is `None`. Answers the tar and what it holds.
pub(super) fn tar_of_dir(dir: &Path, top: Option<&str>) -> Result<(Vec<u8>, Copied), CopyError> {
    let set = files_from_dir(dir)?;
    let mut tar = tar::Builder::new(Vec::new());
    let mut tally = Copied::default();
    if let Some(top) = top {
        append_dir(&mut tar, top, dir)?;
        tally.dirs += 1;
    }
    for (relative, entry) in set.iter() {
        let name = match top {
            Some(top) => format!("{top}/{relative}"),
            None => relative.to_owned(),
        };
        let path = dir.join(relative);
        match entry {
            FileEntry::Dir => {
                append_dir(&mut tar, &name, &path)?;
                tally.dirs += 1;
            }
            FileEntry::File { .. } => {
                tally.bytes += append_file(&mut tar, &name, &path)?;
                tally.files += 1;
            }
        }
    }
    let tar = tar
        .into_inner()
        .map_err(|e| CopyError::host("write a tar of", dir, e))?;
    Ok((tar, tally))
}

/// A regular host file's bytes and permission bits, read without
/// following a symlink put in its place since it was looked at.
pub(super) fn read_file(path: &Path) -> Result<(Vec<u8>, u32), CopyError> {
    let (file, meta) = open_regular(path)?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    io::copy(&mut ExactReader::new(file, meta.len()), &mut bytes)
        .map_err(|e| CopyError::host("read", path, e))?;
    Ok((bytes, meta.mode() & MODE_BITS))
}

fn open_regular(path: &Path) -> Result<(File, std::fs::Metadata), CopyError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| CopyError::host("open", path, e))?;
    let meta = file
        .metadata()
        .map_err(|e| CopyError::host("inspect", path, e))?;
    if !meta.is_file() {
        return Err(CopyError::host(
            "read",
            path,
            io::Error::other("it is no longer a regular file"),
        ));
    }
    Ok((file, meta))
}

fn append_dir(tar: &mut tar::Builder<Vec<u8>>, name: &str, path: &Path) -> Result<(), CopyError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| CopyError::host("inspect", path, e))?;
    let mut header = header(&meta, tar::EntryType::Directory, 0);
    tar.append_data(&mut header, name, io::empty())
        .map_err(|e| CopyError::host("write a tar of", path, e))
}

fn append_file(tar: &mut tar::Builder<Vec<u8>>, name: &str, path: &Path) -> Result<u64, CopyError> {
    let (file, meta) = open_regular(path)?;
    let mut header = header(&meta, tar::EntryType::Regular, meta.len());
    tar.append_data(&mut header, name, ExactReader::new(file, meta.len()))
        .map_err(|e| CopyError::host("read", path, e))?;
    Ok(meta.len())
}

/// A header with the entry's permission bits and mtime; owners are not kept.
fn header(meta: &std::fs::Metadata, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(meta.mode() & MODE_BITS);
    header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    header.set_uid(0);
    header.set_gid(0);
    header
}

/// What a sandbox's tar holds, checked before anything is unpacked.
#[derive(Debug)]
struct Survey {
    top_is_dir: bool,
    tally: Copied,
}

/// Checks a tar from a sandbox: every entry under `top`, named plainly,
/// and a file, a directory or a symlink.
fn survey(tar: &[u8], top: &str) -> Result<Survey, CopyError> {
    let bad = |reason: String| CopyError::BadTar { reason };
    let mut archive = tar::Archive::new(tar);
    let mut top_is_dir = None;
    let mut tally = Copied::default();
    for entry in archive.entries().map_err(|e| bad(e.to_string()))? {
        let entry = entry.map_err(|e| bad(e.to_string()))?;
        let path = entry.path().map_err(|e| bad(e.to_string()))?.into_owned();
        let mut parts = path.components();
        if parts.next() != Some(Component::Normal(top.as_ref())) {
            return Err(bad(format!("{} is not under {top}", path.display())));
        }
        if !parts.all(|part| matches!(part, Component::Normal(_))) {
            return Err(bad(format!("{} is not a plain path", path.display())));
        }
        let kind = entry.header().entry_type();
        match kind {
            tar::EntryType::Regular | tar::EntryType::Symlink => {
                tally.files += 1;
                tally.bytes += entry.size();
            }
            tar::EntryType::Directory => tally.dirs += 1,
            other => {
                return Err(bad(format!(
                    "{} has entry type {other:?}; only files, directories and symlinks are copied",
                    path.display()
                )));
            }
        }
        if top_is_dir.is_none() {
            if path.components().count() != 1 {
                return Err(bad(format!("it does not start with {top}")));
            }
            top_is_dir = Some(kind == tar::EntryType::Directory);
        }
    }
    let top_is_dir = top_is_dir.ok_or_else(|| bad("it is empty".into()))?;
    Ok(Survey { top_is_dir, tally })
}

/// Puts what a sandbox's tar of `top` holds at `dst` with `docker cp`'s
/// rules (see [`super::Files::copy_out`]). Answers what was copied, and
/// where its top landed.
pub(super) fn place(
    tar: &[u8],
    top: &str,
    dst: &Path,
    contents_only: bool,
) -> Result<(Copied, PathBuf), CopyError> {
    let survey = survey(tar, top)?;
    if contents_only && !survey.top_is_dir {
        return Err(CopyError::NotADirectory {
            path: top.to_owned(),
        });
    }
    let dst_is_dir = match std::fs::metadata(dst) {
        Ok(meta) => Some(meta.is_dir()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => None,
        Err(err) => return Err(CopyError::host("inspect", dst, err)),
    };
    let target = match dst_is_dir {
        Some(true) if contents_only => dst.to_path_buf(),
        Some(true) => dst.join(top),
        Some(false) if survey.top_is_dir => {
            return Err(CopyError::DirOntoFile {
                path: dst.display().to_string(),
            });
        }
        Some(false) => dst.to_path_buf(),
        None => {
            let parent = host_parent(dst);
            let dir_named = dst.as_os_str().as_encoded_bytes().ends_with(b"/");
            if (dir_named && !survey.top_is_dir) || !parent.is_dir() {
                let missing = if dir_named { dst } else { parent };
                return Err(CopyError::DestinationMissing {
                    path: missing.display().to_string(),
                });
            }
            dst.to_path_buf()
        }
    };
    // Contents go into a directory that is there; everything else lands
    // under a name of its own, made or replaced by one rename.
    let merge = contents_only && dst_is_dir == Some(true);
    let beside = if merge {
        target.as_path()
    } else {
        host_parent(&target)
    };
    let staging = tempfile::Builder::new()
        .prefix(STAGING_PREFIX)
        .tempdir_in(beside)
        .map_err(|e| CopyError::host("make a staging directory in", beside, e))?;
    tar::Archive::new(tar)
        .unpack(staging.path())
        .map_err(|e| CopyError::host("unpack into", staging.path(), e))?;
    let unpacked = staging.path().join(top);
    if merge {
        merge_contents(&unpacked, &target)?;
    } else {
        move_into_place(&unpacked, &target)?;
    }
    Ok((survey.tally, target))
}

/// The directory holding `path` (`.` for a bare name).
fn host_parent(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Moves `from` to `to`: whole when nothing is there or a file is replaced,
/// merged when both are directories.
fn move_into_place(from: &Path, to: &Path) -> Result<(), CopyError> {
    let from_is_dir = std::fs::symlink_metadata(from)
        .map_err(|e| CopyError::host("inspect", from, e))?
        .is_dir();
    match std::fs::metadata(to) {
        Ok(meta) if meta.is_dir() && from_is_dir => return merge_contents(from, to),
        Ok(meta) if meta.is_dir() => {
            return Err(CopyError::host(
                "replace",
                to,
                io::Error::other("it is a directory"),
            ));
        }
        Ok(_) if from_is_dir => {
            return Err(CopyError::DirOntoFile {
                path: to.display().to_string(),
            });
        }
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(CopyError::host("inspect", to, err)),
    }
    std::fs::rename(from, to).map_err(|e| CopyError::host("move into place", to, e))
}

/// Moves everything in the directory `from` into the directory `to`.
fn merge_contents(from: &Path, to: &Path) -> Result<(), CopyError> {
    for entry in std::fs::read_dir(from).map_err(|e| CopyError::host("read", from, e))? {
        let entry = entry.map_err(|e| CopyError::host("read", from, e))?;
        move_into_place(&entry.path(), &to.join(entry.file_name()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("src");
        std::fs::create_dir_all(root.join("a/empty")).unwrap();
        std::fs::write(root.join("a/x.txt"), "x").unwrap();
        std::fs::write(root.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o4750))
            .unwrap();
        std::fs::set_permissions(root.join("a"), std::fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    #[test]
    fn a_tree_round_trips_with_its_modes_and_without_special_bits() {
        let dir = tree();
        let (tar, tally) = tar_of_dir(&dir.path().join("src"), Some("src")).unwrap();
        assert_eq!((tally.files, tally.dirs, tally.bytes), (2, 3, 11));

        let out = tempfile::tempdir().unwrap();
        // An existing directory: the tree goes inside it.
        let (copied, landed) = place(&tar, "src", out.path(), false).unwrap();
        assert_eq!(landed, out.path().join("src"));
        assert_eq!((copied.files, copied.dirs, copied.bytes), (2, 3, 11));
        assert_eq!(mode(&landed.join("run.sh")), 0o750);
        assert_eq!(mode(&landed.join("a")), 0o700);
        assert!(landed.join("a/empty").is_dir());
        // A new name: the tree becomes it.
        let (_, landed) = place(&tar, "src", &out.path().join("copy"), false).unwrap();
        assert_eq!(std::fs::read(landed.join("a/x.txt")).unwrap(), b"x");
        // Contents only, merged into what is there.
        std::fs::write(out.path().join("copy/kept"), "k").unwrap();
        place(&tar, "src", &out.path().join("copy"), true).unwrap();
        assert!(out.path().join("copy/kept").exists());
        assert!(!out.path().join("copy/src").exists());
        // Nothing staged is left behind.
        let names: Vec<_> = std::fs::read_dir(out.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with(STAGING_PREFIX)),
            "{names:?}"
        );
    }

    #[test]
    fn docker_cp_refusals() {
        let dir = tree();
        let (tar, _) = tar_of_dir(&dir.path().join("src"), Some("src")).unwrap();
        let out = tempfile::tempdir().unwrap();
        std::fs::write(out.path().join("file"), "f").unwrap();
        let err = place(&tar, "src", &out.path().join("file"), false).unwrap_err();
        assert!(matches!(err, CopyError::DirOntoFile { .. }), "{err}");
        let err = place(&tar, "src", &out.path().join("no/such"), false).unwrap_err();
        assert!(err.to_string().contains("no"), "{err}");

        let mut single = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_mode(0o640);
        single.append_data(&mut header, "one", &b"1"[..]).unwrap();
        let single = single.into_inner().unwrap();
        let err = place(&single, "one", &out.path().join("new/"), false).unwrap_err();
        assert!(matches!(err, CopyError::DestinationMissing { .. }), "{err}");
        let err = place(&single, "one", out.path(), true).unwrap_err();
        assert!(matches!(err, CopyError::NotADirectory { .. }), "{err}");
        // A file onto a file replaces it, with the file's mode.
        place(&single, "one", &out.path().join("file"), false).unwrap();
        assert_eq!(std::fs::read(out.path().join("file")).unwrap(), b"1");
        assert_eq!(mode(&out.path().join("file")), 0o640);
    }

    #[test]
    fn host_symlinks_are_refused_by_name() {
        let dir = tree();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("src/a/link")).unwrap();
        let err = tar_of_dir(&dir.path().join("src"), None).unwrap_err();
        assert!(err.to_string().contains("a/link"), "{err}");
    }

    #[test]
    fn hostile_tars_are_refused_before_anything_is_written() {
        let out = tempfile::tempdir().unwrap();
        let raw = |name: &str, kind: tar::EntryType| {
            let mut builder = tar::Builder::new(Vec::new());
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_size(0);
            header.set_mode(0o644);
            // Set the name raw: the builder's own setter refuses `..`.
            header.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
            header.set_cksum();
            builder.append(&header, io::empty()).unwrap();
            builder.into_inner().unwrap()
        };
        for (tar, why) in [
            (raw("top/../../escape", tar::EntryType::Regular), "plain"),
            (raw("other", tar::EntryType::Regular), "not under"),
            (raw("top", tar::EntryType::Char), "entry type"),
            (raw("top", tar::EntryType::Link), "entry type"),
        ] {
            let err = place(&tar, "top", out.path(), false).unwrap_err();
            assert!(err.to_string().contains(why), "{err}");
        }
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_link_in_a_sandbox_tar_is_never_written_through() {
        let outside = tempfile::tempdir().unwrap();
        let mut tar = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        tar.append_data(&mut dir, "top", io::empty()).unwrap();
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        tar.append_link(&mut link, "top/l", outside.path()).unwrap();
        let mut file = tar::Header::new_gnu();
        file.set_size(3);
        file.set_mode(0o644);
        tar.append_data(&mut file, "top/l/planted", &b"bad"[..])
            .unwrap();
        let tar = tar.into_inner().unwrap();

        let out = tempfile::tempdir().unwrap();
        assert!(place(&tar, "top", out.path(), false).is_err());
        assert!(!outside.path().join("planted").exists());
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
    }
}
