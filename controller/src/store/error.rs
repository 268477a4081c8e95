//! [`StoreError`]: every way an operation on the blob store itself can fail.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Digest;

/// Why a blob store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file operation in the store failed.
    #[error("blob store: cannot {what} {}", path.display())]
    Io {
        /// The operation ("create", "rename", "fsync").
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The blob is not in the store.
    #[error("blob {digest} is not in the store at {}", root.display())]
    Missing {
        /// The blob.
        digest: Digest,
        /// The store.
        root: PathBuf,
    },
    /// Another process held the store's lock for too long.
    #[error(
        "blob store lock {} is still held by another silo process after {waited:?}",
        path.display()
    )]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// An exclusive lock of one store was offered as proof for another.
    #[error("the lock {} does not belong to the store at {}", lock.display(), root.display())]
    ForeignLock {
        /// The lock's file.
        lock: PathBuf,
        /// The store it was used on.
        root: PathBuf,
    },
}

/// Wraps an I/O error with the operation and path.
pub(super) fn io(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_owned();
    move |source| StoreError::Io { what, path, source }
}
