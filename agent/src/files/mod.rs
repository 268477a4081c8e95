//! The file API's work: read, write, stat, list, make and remove paths, and
//! move trees in and out as tar, with the sandbox user's own rights.
//!
//! Every operation is a plain blocking function, run on the blocking pool
//! by `server::files`, and every one starts from a [`Target`]: the request's
//! path checked lexically, taken from the workdir when relative, and, under
//! `confine`, walked from the confining directory down so no symlink steers
//! it elsewhere. Nothing a body carries becomes visible before its signed
//! SHA-256 matches: a file is written beside its destination and renamed
//! over it, a tree is extracted into a staging directory beside its
//! destination (by the push extractor, with every one of its entry rules)
//! and merged in only afterwards. Each file lands atomically; a tree merge
//! that fails half way (something in the way) keeps what it already moved.
//!
//! # Layout
//! - `path`: resolving and confining a request's path, making parents.
//! - `ops`: stat, list, read, write, mkdir and remove.
//! - `tree`: tar download and staged tree upload.

mod ops;
mod path;
mod tree;

use std::io;
use std::path::PathBuf;

use silo_protocol::ErrorKind;
use silo_protocol::bundle::BundleLimits;
use silo_protocol::query::QueryError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::body::BodyError;
use crate::fs_error::FsError;
use crate::push::extract::ExtractError;
use crate::push::is_disk_full;

pub use ops::{WriteSpec, list, make_dir, open_read, remove, rename, stat, write_file};
pub use path::Target;
pub use tree::{Upload, check_download, download, upload};

/// File operations running at once; more wait for a permit.
pub const MAX_ACTIVE_FILE_OPS: usize = 16;
/// Mode of a file written without `mode` where none existed.
pub const DEFAULT_FILE_MODE: u32 = 0o644;
/// Mode of a directory made without `mode`, and of every parent made.
pub const DEFAULT_DIR_MODE: u32 = 0o755;

/// What the file API needs to know.
#[derive(Debug, Clone)]
pub struct FilesConfig {
    /// Where relative paths start (the agent's workdir, as for execs).
    pub workdir: PathBuf,
    /// Caps on an uploaded tree (the agent's push limits).
    pub tree_limits: BundleLimits,
}

/// The file service: its settings and its admission permits.
pub struct Files {
    /// Its settings.
    pub config: FilesConfig,
    active: std::sync::Arc<Semaphore>,
}

impl Files {
    /// A file service.
    pub fn new(config: FilesConfig) -> Self {
        Self {
            config,
            active: std::sync::Arc::new(Semaphore::new(MAX_ACTIVE_FILE_OPS)),
        }
    }

    /// Waits for room to run one operation.
    pub async fn admit(&self) -> Result<OwnedSemaphorePermit, FilesError> {
        std::sync::Arc::clone(&self.active)
            .acquire_owned()
            .await
            .map_err(|_| FilesError::Internal("file permits closed".into()))
    }
}

/// Why a file request failed; [`FilesError::kind`] makes the answer.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The query cannot be read.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// The tree was replaced while the write waited.
    #[error(transparent)]
    Replaced(#[from] crate::snapshot::Replaced),
    /// The path (or `confine`) breaks a lexical rule.
    #[error("path {path:?} is invalid: {reason}")]
    BadPath {
        /// The path as given.
        path: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The path leaves `confine`, or reaches into it through a symlink.
    #[error("{} {reason}, outside the confining directory", path.display())]
    OutsideConfine {
        /// The path or the symlink in the way.
        path: PathBuf,
        /// How.
        reason: &'static str,
    },
    /// Nothing at a path the operation needs.
    #[error("{} does not exist", .0.display())]
    NotFound(PathBuf),
    /// A directory where a file was asked for.
    #[error("{} is a directory", .0.display())]
    IsADirectory(PathBuf),
    /// Something else where a directory was asked for.
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A device, FIFO or socket where a regular file was asked for.
    #[error("{} is not a regular file", .0.display())]
    NotRegular(PathBuf),
    /// A non-empty directory removed without `recursive`.
    #[error("{} is not empty (remove it with recursive)", .0.display())]
    NotEmpty(PathBuf),
    /// The request body was not taken whole.
    #[error(transparent)]
    Body(#[from] BodyError),
    /// The body is not what was signed.
    #[error("body SHA-256 is {actual}, but the request was signed for {claimed}")]
    HashMismatch {
        /// The signed hash.
        claimed: String,
        /// The body's.
        actual: String,
    },
    /// The uploaded tree is refused or could not be extracted.
    #[error(transparent)]
    Extract(#[from] ExtractError),
    /// A file system call failed.
    #[error(transparent)]
    Io(#[from] FsError),
    /// The agent failed in a way the request could not cause.
    #[error("internal error: {0}")]
    Internal(String),
}

impl FilesError {
    /// The error body's kind (which fixes the answer's status).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Query(_) | Self::BadPath { .. } | Self::NotRegular(_) => ErrorKind::Malformed,
            Self::Body(err) => err.kind(),
            Self::OutsideConfine { .. } => ErrorKind::OutsideConfine,
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::IsADirectory(_) => ErrorKind::IsADirectory,
            Self::NotADirectory(_) => ErrorKind::NotADirectory,
            Self::NotEmpty(_) => ErrorKind::NotEmpty,
            Self::HashMismatch { .. } => ErrorKind::HashMismatch,
            // The file API names no refused entry apart: it is malformed input.
            Self::Extract(err) => err.kind(ErrorKind::Malformed, by_errno),
            Self::Io(err) => by_errno(&err.source),
            Self::Internal(_) => ErrorKind::Internal,
            Self::Replaced(_) => ErrorKind::Busy,
        }
    }
}

/// The kind of a failed system call, by what the kernel said.
fn by_errno(err: &io::Error) -> ErrorKind {
    if is_disk_full(err) {
        return ErrorKind::DiskFull;
    }
    match err.raw_os_error() {
        Some(libc::ENOENT) => ErrorKind::NotFound,
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => ErrorKind::PermissionDenied,
        Some(libc::EISDIR) => ErrorKind::IsADirectory,
        Some(libc::ENOTDIR) => ErrorKind::NotADirectory,
        Some(libc::ENOTEMPTY) => ErrorKind::NotEmpty,
        // Only opens with O_NOFOLLOW, used under `confine`, see ELOOP: a
        // symlink appeared where the walk found none.
        Some(libc::ELOOP) => ErrorKind::OutsideConfine,
        _ => ErrorKind::Internal,
    }
}

#[cfg(test)]
mod tests;
