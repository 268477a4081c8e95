//! [`FsError`]: a file system call that failed, with what it was doing and
//! to which path. Every part of the agent that touches files (push mounts,
//! extract, swap, snapshot walk) reports through it, so a failure reads the
//! same everywhere ("cannot create /app/.versions/…: No space left on
//! device") and the HTTP layer finds the `io::Error` in one place.

use std::io;
use std::path::{Path, PathBuf};

/// A file system call that failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} {}", path.display())]
pub struct FsError {
    /// The operation ("create", "rename", "read directory").
    pub what: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: io::Error,
}

impl FsError {
    /// `what` on `path` failed with `source`.
    pub fn new(what: &'static str, path: &Path, source: io::Error) -> Self {
        Self {
            what,
            path: path.to_owned(),
            source,
        }
    }

    /// The same, for `map_err`.
    pub fn at(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self {
        let path = path.to_owned();
        move |source| Self { what, path, source }
    }
}
