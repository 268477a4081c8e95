//! Copies between the host and a sandbox, with `docker cp`'s rules for
//! where things land, so `silo cp` and a harness behave alike.
//!
//! The rules, for a source SRC and a destination DST:
//! - SRC a file: DST a directory gets it as `DST/<name of SRC>`; DST a file
//!   is replaced; a missing DST becomes the file (its directory must exist,
//!   and a DST ending in `/` must be an existing directory).
//! - SRC a directory: DST a directory gets it as `DST/<name of SRC>`,
//!   merged with what is there; a missing DST is made with SRC's contents
//!   (its parent must exist); DST a file is refused.
//! - SRC ending in `/.`: its contents go into DST, not SRC itself.
//! - A symlink at DST in the sandbox is followed when it leads to a
//!   directory; otherwise it is replaced like a file.
//!
//! Permission bits are kept (not setuid, setgid or sticky; not owners).
//! A host symlink or special file is refused by name (the agent's extract
//! takes neither); symlinks in the sandbox come out as symlinks. Unlike
//! `docker cp`, a relative sandbox path starts at the agent's working
//! directory, as commands' paths do. Transfers are held in memory whole,
//! and trees going in are bound by the agent's push caps (per file and per
//! tar); a single file goes in through a plain write instead.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use silo_protocol::ErrorKind;
use silo_protocol::files::FileKind;

use super::host::{self, MODE_BITS};
use super::{FileError, Files};

/// What a copy moved, and where its top landed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Copied {
    /// Files (and symlinks) copied.
    pub files: u64,
    /// Directories made or merged into.
    pub dirs: u64,
    /// Bytes of file contents.
    pub bytes: u64,
    /// Where the source landed: a sandbox path for [`Files::copy_in`], a
    /// host path for [`Files::copy_out`].
    pub path: String,
}

/// What is at a copy's destination in the sandbox.
enum Dest {
    Dir,
    NotDir,
    Missing,
}

impl Files {
    /// Copies the host file or directory `src` to `dst` in the sandbox.
    pub async fn copy_in(&self, src: &Path, dst: &str) -> Result<Copied, CopyError> {
        let (src, contents_only) = host_contents(src);
        let meta =
            std::fs::symlink_metadata(&src).map_err(|e| CopyError::host("inspect", &src, e))?;
        let kind = meta.file_type();
        if !kind.is_dir() && !kind.is_file() {
            let what = if kind.is_symlink() {
                "a symlink"
            } else {
                "a special file (device, FIFO or socket)"
            };
            return Err(crate::push::FilesError::Unsupported { path: src, what }.into());
        }
        if contents_only && !kind.is_dir() {
            return Err(CopyError::NotADirectory {
                path: src.display().to_string(),
            });
        }
        let name = host_name(&src)?;
        let dest = self.dest(dst).await?;
        if kind.is_file() {
            let path = match dest {
                Dest::Dir => join(dst, &name),
                Dest::NotDir => dst.to_owned(),
                Dest::Missing if dst.ends_with('/') => {
                    return Err(CopyError::DestinationMissing { path: dst.into() });
                }
                Dest::Missing => {
                    self.parent_must_exist(dst).await?;
                    dst.to_owned()
                }
            };
            let (bytes, mode) = blocking(move || host::read_file(&src)).await?;
            let written = self.write(&path, bytes, Some(mode)).await?;
            return Ok(Copied {
                files: 1,
                dirs: 0,
                bytes: written.size,
                path,
            });
        }
        match dest {
            Dest::NotDir => Err(CopyError::DirOntoFile { path: dst.into() }),
            Dest::Dir => {
                let top = (!contents_only).then(|| name.clone());
                let (tar, tally) = blocking(move || host::tar_of_dir(&src, top.as_deref())).await?;
                self.upload(dst, tar).await?;
                let path = if contents_only {
                    dst.to_owned()
                } else {
                    join(dst, &name)
                };
                Ok(Copied { path, ..tally })
            }
            Dest::Missing => {
                self.parent_must_exist(dst).await?;
                let mode = meta.mode() & MODE_BITS;
                let (tar, tally) = blocking(move || host::tar_of_dir(&src, None)).await?;
                // Made first, so it has the source directory's mode.
                self.mkdir(dst, Some(mode)).await?;
                if let Err(err) = self.upload(dst, tar).await {
                    // Nothing of a failed upload is merged: the directory is empty.
                    let _ = self.remove(dst, false).await;
                    return Err(err.into());
                }
                Ok(Copied {
                    dirs: tally.dirs + 1,
                    path: dst.to_owned(),
                    ..tally
                })
            }
        }
    }

    /// Copies the sandbox's file, symlink or directory `src` to the host
    /// path `dst`, staged beside it so a failed copy leaves nothing there.
    pub async fn copy_out(&self, src: &str, dst: &Path) -> Result<Copied, CopyError> {
        let (src, contents_only) = sandbox_contents(src);
        let top = src
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .filter(|name| !name.is_empty())
            .ok_or(CopyError::WholeRoot)?
            .to_owned();
        let tar = self.download(src).await?;
        let dst = dst.to_path_buf();
        let (tally, landed) =
            blocking(move || host::place(&tar, &top, &dst, contents_only)).await?;
        Ok(Copied {
            path: landed.display().to_string(),
            ..tally
        })
    }

    /// Whether `dst` is a directory (a symlink to one counts), something
    /// else, or nothing.
    async fn dest(&self, dst: &str) -> Result<Dest, CopyError> {
        match self.stat(dst).await {
            Ok(stat) => Ok(match stat.kind {
                FileKind::Dir => Dest::Dir,
                // A trailing slash makes the kernel follow the link.
                FileKind::Symlink => match self.stat(&format!("{dst}/")).await {
                    Ok(stat) if stat.kind == FileKind::Dir => Dest::Dir,
                    _ => Dest::NotDir,
                },
                FileKind::File | FileKind::Other => Dest::NotDir,
            }),
            Err(err) if refused_as(&err, &ErrorKind::NotFound) => Ok(Dest::Missing),
            Err(err) => Err(err.into()),
        }
    }

    /// `docker cp` makes no missing parents: a typo is an error, not a tree.
    async fn parent_must_exist(&self, dst: &str) -> Result<(), CopyError> {
        let Some(parent) = sandbox_parent(dst) else {
            // A bare name: its directory is the agent's working directory.
            return Ok(());
        };
        match self.dest(parent).await? {
            Dest::Dir => Ok(()),
            Dest::NotDir => Err(CopyError::NotADirectory {
                path: parent.into(),
            }),
            Dest::Missing => Err(CopyError::DestinationMissing {
                path: parent.into(),
            }),
        }
    }
}

/// Why a copy failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    /// The sandbox's side refused or failed.
    #[error(transparent)]
    Files(#[from] FileError),
    /// A host tree holds something that cannot be sent (a symlink, a
    /// special file, a name that is not UTF-8).
    #[error(transparent)]
    Tree(#[from] crate::push::FilesError),
    /// A host file system call failed.
    #[error("cannot {what} {}", path.display())]
    Host {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The directory a destination needs does not exist.
    #[error("destination directory {path} does not exist")]
    DestinationMissing {
        /// The directory.
        path: String,
    },
    /// A directory was to be copied where a file is.
    #[error("cannot copy a directory onto the file {path}")]
    DirOntoFile {
        /// The file.
        path: String,
    },
    /// A directory was asked for (`SRC/.`, a destination's parent) and
    /// something else is there.
    #[error("{path} is not a directory")]
    NotADirectory {
        /// The path.
        path: String,
    },
    /// `/` itself has no name to copy it under.
    #[error("cannot copy / as a whole; name a directory under it, or `/.` for its contents")]
    WholeRoot,
    /// The sandbox's tar is not what a download sends.
    #[error("refused the tar the sandbox sent: {reason}")]
    BadTar {
        /// What is wrong with it.
        reason: String,
    },
    /// A blocking task of the copy died.
    #[error("a copy task failed: {0}")]
    Task(String),
}

impl CopyError {
    pub(super) fn host(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Host {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}

fn refused_as(err: &FileError, wanted: &ErrorKind) -> bool {
    matches!(err, FileError::Refused { kind, .. } if kind == wanted)
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, CopyError> + Send + 'static,
) -> Result<T, CopyError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| CopyError::Task(e.to_string()))?
}

/// A host source without a final `/.`, and whether it had one.
fn host_contents(src: &Path) -> (PathBuf, bool) {
    let bytes = src.as_os_str().as_bytes();
    match bytes {
        b"." => (PathBuf::from("."), true),
        _ if bytes.ends_with(b"/.") => {
            let dir = OsStr::from_bytes(&bytes[..bytes.len() - 1]);
            (PathBuf::from(dir), true)
        }
        _ => (src.to_path_buf(), false),
    }
}

/// A sandbox source without a final `/.`, and whether it had one.
fn sandbox_contents(src: &str) -> (&str, bool) {
    match src.strip_suffix("/.") {
        Some("") => ("/", true),
        Some(dir) => (dir, true),
        None => (src, false),
    }
}

/// The name a host source is copied under.
fn host_name(src: &Path) -> Result<String, CopyError> {
    let named = match src.file_name() {
        Some(name) => PathBuf::from(name),
        // `.`, `..` or `/`: the name of what it resolves to.
        None => std::fs::canonicalize(src)
            .map_err(|e| CopyError::host("resolve", src, e))?
            .file_name()
            .map(PathBuf::from)
            .ok_or(CopyError::WholeRoot)?,
    };
    named
        .into_os_string()
        .into_string()
        .map_err(|_| crate::push::FilesError::NotUtf8(src.to_path_buf()).into())
}

/// `dir/name`, whether or not `dir` ends in a slash.
fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// The directory holding a sandbox path; `None` for a bare name.
fn sandbox_parent(path: &str) -> Option<&str> {
    match path.trim_end_matches('/').rsplit_once('/') {
        Some(("", _)) => Some("/"),
        Some((parent, _)) => Some(parent),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_as_docker_cp_reads_them() {
        assert_eq!(sandbox_contents("/a/b/."), ("/a/b", true));
        assert_eq!(sandbox_contents("/."), ("/", true));
        assert_eq!(sandbox_contents("/a/b/"), ("/a/b/", false));
        assert_eq!(host_contents(Path::new("dir/.")), ("dir/".into(), true));
        assert_eq!(host_contents(Path::new(".")), (".".into(), true));
        assert_eq!(host_contents(Path::new("dir")), ("dir".into(), false));
        assert_eq!(sandbox_parent("/a/b/"), Some("/a"));
        assert_eq!(sandbox_parent("/a"), Some("/"));
        assert_eq!(sandbox_parent("rel/x"), Some("rel"));
        assert_eq!(sandbox_parent("x"), None);
        assert_eq!(join("/a/", "b"), "/a/b");
        assert_eq!(host_name(Path::new("/tmp/x/")).unwrap(), "x");
    }
}
