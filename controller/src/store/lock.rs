//! The store's lock: `flock` on `store/lock`, shared by writers that add
//! and record blobs, exclusive for garbage collection.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::StoreError;
use super::error::io as io_err;

/// How often [`super::Store::exclusive_lock`] retries a held lock.
pub const LOCK_POLL: Duration = Duration::from_millis(50);

/// Held by a process that writes blobs and then records them: while any
/// shared lock is held, no exclusive lock (garbage collection) can be taken.
/// Released when dropped.
#[derive(Debug)]
pub struct SharedLock {
    _flock: Flock<File>,
}

/// Held by garbage collection: no writer is between writing a blob and
/// recording it. Released when dropped.
#[derive(Debug)]
pub struct ExclusiveLock {
    _flock: Flock<File>,
    /// The lock file, so the store can check the lock is its own.
    path: PathBuf,
}

impl ExclusiveLock {
    /// The lock file this guard holds.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

/// Waits as long as it takes for the shared lock.
pub(super) fn shared(path: &Path) -> Result<SharedLock, StoreError> {
    let mut file = open(path)?;
    loop {
        match Flock::lock(file, FlockArg::LockShared) {
            Ok(flock) => return Ok(SharedLock { _flock: flock }),
            Err((back, Errno::EINTR)) => file = back,
            Err((_, errno)) => return Err(io_err("lock", path)(io::Error::from(errno))),
        }
    }
}

/// Takes the exclusive lock if it is free now.
pub(super) fn try_exclusive(path: &Path) -> Result<Option<ExclusiveLock>, StoreError> {
    let mut file = open(path)?;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(flock) => {
                return Ok(Some(ExclusiveLock {
                    _flock: flock,
                    path: path.to_owned(),
                }));
            }
            Err((back, Errno::EINTR)) => file = back,
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, errno)) => return Err(io_err("lock", path)(io::Error::from(errno))),
        }
    }
}

/// Polls for the exclusive lock every [`LOCK_POLL`] until `timeout` passes.
pub(super) fn exclusive(path: &Path, timeout: Duration) -> Result<ExclusiveLock, StoreError> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(lock) = try_exclusive(path)? {
            return Ok(lock);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(StoreError::LockTimeout {
                path: path.to_owned(),
                waited: timeout,
            });
        }
        std::thread::sleep(LOCK_POLL.min(deadline - now));
    }
}

/// Opens (creating) the lock file. Each guard has its own open file
/// description, so two guards in one process exclude each other like two
/// processes would.
fn open(path: &Path) -> Result<File, StoreError> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("open", path))
}
