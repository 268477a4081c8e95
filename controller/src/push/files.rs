//! The files of a directory, as a [`FileSet`] to bundle.
//!
//! Only regular files and directories can be pushed (the agent refuses
//! everything else), so a symlink or a special file in the directory is an
//! error naming it, found here before anything is sent rather than as a
//! rejection from every agent. File contents are read when the bundle is
//! built, not here.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use silo_protocol::bundle::{FileEntry, FileSet, FileSource};

/// Permission bits that make a pushed file executable (mode 0755 in the bundle).
const ANY_EXEC_BIT: u32 = 0o111;

/// Reads the tree under `dir` into a [`FileSet`] (paths relative to `dir`).
pub fn files_from_dir(dir: &Path) -> Result<FileSet, FilesError> {
    let meta = std::fs::metadata(dir).map_err(io_error(dir))?;
    if !meta.is_dir() {
        return Err(FilesError::NotADirectory(dir.to_owned()));
    }
    let mut set = FileSet::new();
    walk(dir, "", &mut set)?;
    Ok(set)
}

fn walk(dir: &Path, prefix: &str, set: &mut FileSet) -> Result<(), FilesError> {
    let entries = std::fs::read_dir(dir).map_err(io_error(dir))?;
    for entry in entries {
        let entry = entry.map_err(io_error(dir))?;
        let path = entry.path();
        let name = entry
            .file_name()
            .into_string()
            .map_err(|_| FilesError::NotUtf8(path.clone()))?;
        let relative = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        // Not following links: a symlink is refused, never pushed as its target.
        let meta = std::fs::symlink_metadata(&path).map_err(io_error(&path))?;
        let kind = meta.file_type();
        let added = if kind.is_dir() {
            let added = set.insert(&relative, FileEntry::Dir);
            walk(&path, &relative, set)?;
            added
        } else if kind.is_file() {
            let executable = meta.permissions().mode() & ANY_EXEC_BIT != 0;
            set.insert(
                &relative,
                FileEntry::File {
                    source: FileSource::Path(path.clone()),
                    executable,
                },
            )
        } else if kind.is_symlink() {
            return Err(FilesError::Unsupported {
                path,
                what: "a symlink",
            });
        } else {
            return Err(FilesError::Unsupported {
                path,
                what: "a special file (device, FIFO or socket)",
            });
        };
        added.map_err(FilesError::Bundle)?;
    }
    Ok(())
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> FilesError {
    let path = path.to_owned();
    move |source| FilesError::Io { path, source }
}

/// Why a directory cannot be pushed as it is.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The path to push is not a directory.
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// Something in it cannot be pushed.
    #[error("{} is {what}; only regular files and directories can be sent to a sandbox", path.display())]
    Unsupported {
        /// The offending path.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// A name is not UTF-8 (bundles carry UTF-8 names only).
    #[error("{} has a name that is not UTF-8", .0.display())]
    NotUtf8(PathBuf),
    /// The path is not acceptable in a bundle.
    #[error(transparent)]
    Bundle(silo_protocol::bundle::BundleError),
    /// Reading the directory failed.
    #[error("cannot read {}", path.display())]
    Io {
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn a_tree_becomes_a_file_set_and_links_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/empty")).unwrap();
        std::fs::write(dir.path().join("a/x.txt"), "x").unwrap();
        std::fs::write(dir.path().join("run.sh"), "#!/bin/sh").unwrap();
        std::fs::set_permissions(
            dir.path().join("run.sh"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        let set = files_from_dir(dir.path()).unwrap();
        let listed: Vec<(&str, bool)> = set
            .iter()
            .map(|(p, e)| {
                (
                    p,
                    matches!(
                        e,
                        FileEntry::File {
                            executable: true,
                            ..
                        }
                    ),
                )
            })
            .collect();
        assert_eq!(
            listed,
            [
                ("a", false),
                ("a/empty", false),
                ("a/x.txt", false),
                ("run.sh", true)
            ]
        );
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("a/link")).unwrap();
        let err = files_from_dir(dir.path()).unwrap_err();
        assert!(err.to_string().contains("a/link"), "{err}");
    }
}
