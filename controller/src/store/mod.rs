//! The content-addressed blob store under `$SILO_HOME/store`: the image
//! layers and configs that snapshots are made of, the path index of each
//! image, and the two archive formats through which blobs leave and enter
//! the engine.
//!
//! Layout: `blobs/sha256/<hex>` holds each blob under the lowercase hex
//! sha256 of its bytes ([`Digest`]); `tmp/` holds blobs being written;
//! `sums/` the block sums read from layers (derived, rebuilt when
//! missing); `lock` is the store's `flock`. Everything is synchronous `std::io`
//! (callers run it in `spawn_blocking`).
//!
//! Invariants:
//! - A blob's name is the hash of its bytes. A blob appears under its name
//!   only by `rename` of a complete, fsynced temp file, followed by an fsync
//!   of `blobs/sha256/`, so a reader never sees a partial blob and a crash
//!   leaves at worst a stray temp file. Blobs are never written in place
//!   (mode 0400).
//! - Whoever writes blobs and then records them elsewhere (in SQLite) holds
//!   a [`SharedLock`] across both steps. Garbage collection holds the
//!   [`ExclusiveLock`] while it lists, removes and sweeps, so it never sees
//!   a blob that is written but not yet recorded, nor a live temp file.
//!   [`Store::remove`] and [`Store::sweep_temps`] take the exclusive guard
//!   as proof. A process holding a shared lock must not ask for the
//!   exclusive one: it would wait for itself until its timeout.
//!
//! Layout of this module:
//! - this file: [`Store`] (open, blobs, locks).
//! - `digest`: [`Digest`], a validated lowercase hex sha256.
//! - `writer`: [`BlobWriter`], hash-while-writing, then rename; [`BlobTee`],
//!   storing a stream while it is parsed.
//! - `lock`: [`SharedLock`] and [`ExclusiveLock`] (`flock`).
//! - [`index`]: [`Index`], the set of paths of an image's file system, and
//!   image-layer semantics (whiteouts, opaque directories).
//! - [`save_archive`]: reading an engine's image export into the store.
//! - [`load_archive`]: writing an image import for the engine from the store.
//! - [`squash`]: a run of stacked layers as one layer with the same effect.
//! - [`table`]: a layer's entries by path (cached), and a stack of layers
//!   read as one tree.
//! - [`rewind`]: the layer that brings a live tree back to a stored one.
//! - `blocks`: the block sums of the files layers hold, cached under
//!   `sums/`, for rewinds that patch a file's changed blocks.
//! - [`shared`]: [`SharedStore`], a fleet's bucket on the S3 API behind
//!   this store, which then caches it: a blob missing here is fetched from
//!   there when first read ([`Store::open_blob`], [`Store::size`]).

pub mod blocks;
mod diff;
mod digest;
mod error;
pub mod index;
pub mod load_archive;
mod lock;
pub mod rewind;
pub mod save_archive;
pub mod shared;
pub mod squash;
pub mod table;
mod writer;

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::home::create_private_dir;

pub use diff::{Aspect, DiffError, PathChange, diff};
pub use digest::Digest;
pub use error::StoreError;
use error::io as io_err;
pub use index::{Index, IndexError, LayerDelta, LayerStats};
pub use load_archive::{LoadArchiveError, LoadPlan};
pub use lock::{ExclusiveLock, SharedLock};
pub use save_archive::IngestError;
pub use shared::{SharedError, SharedStore};
pub use writer::{BlobTee, BlobWriter, Written};

/// The blob store rooted at one directory (`$SILO_HOME/store`), caching a
/// fleet's shared store when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    root: PathBuf,
    shared: Option<SharedStore>,
}

impl Store {
    /// Opens the store at `dir`, creating it and its `blobs/sha256/` and
    /// `tmp/` directories (mode 0700) if missing. The root is kept
    /// canonical (absolute, symlinks resolved).
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root: PathBuf = dir.into();
        for dir in [root.join("blobs").join("sha256"), root.join("tmp")] {
            create_private_dir(&dir).map_err(io_err("create", &dir))?;
        }
        // One spelling of the root, so a lock from another `Store` value of
        // the same directory is recognised as this store's.
        let root = fs::canonicalize(&root).map_err(io_err("resolve", &root))?;
        Ok(Self { root, shared: None })
    }

    /// This store as the cache of `shared`: what it lacks is fetched from
    /// there when read.
    pub fn caching(mut self, shared: Option<SharedStore>) -> Self {
        self.shared = shared;
        self
    }

    /// The fleet's shared store behind this one, if any.
    pub fn shared(&self) -> Option<&SharedStore> {
        self.shared.as_ref()
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Starts a new blob. Hold a [`SharedLock`] from before this call until
    /// the blob is recorded.
    pub fn writer(&self) -> Result<BlobWriter, StoreError> {
        BlobWriter::create(&self.tmp_dir(), self.blob_dir())
    }

    /// Where the blob `digest` lives (whether or not it is there).
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.blob_dir().join(digest.as_str())
    }

    /// Whether the store has the blob.
    pub fn has(&self, digest: &Digest) -> Result<bool, StoreError> {
        let path = self.path(digest);
        path.try_exists().map_err(io_err("look for", &path))
    }

    /// The blob's length in bytes (fetched first from the shared store,
    /// if this one lacks it).
    pub fn size(&self, digest: &Digest) -> Result<u64, StoreError> {
        let path = self.path(digest);
        self.reading(digest, || fs::metadata(&path))
            .map(|meta| meta.len())
            .map_err(|e| self.missing_or(e, digest, "stat", &path))
    }

    /// Opens the blob for reading (fetched first from the shared store, if
    /// this one lacks it). (Named apart from [`Store::open`], which opens
    /// the store.)
    pub fn open_blob(&self, digest: &Digest) -> Result<File, StoreError> {
        let path = self.path(digest);
        let file = self
            .reading(digest, || File::open(&path))
            .map_err(|e| self.missing_or(e, digest, "open", &path))?;
        if self.shared.is_some() {
            // When it was last read, for the cache's eviction: the bytes
            // never change, so the modification time is free to say it.
            let _ = file.set_modified(std::time::SystemTime::now());
        }
        Ok(file)
    }

    /// When the blob was last read through [`Store::open_blob`] (with a
    /// shared store behind; else when it was written).
    pub fn last_read(&self, digest: &Digest) -> Result<std::time::SystemTime, StoreError> {
        let path = self.path(digest);
        fs::metadata(&path)
            .and_then(|meta| meta.modified())
            .map_err(|e| self.missing_or(e, digest, "stat", &path))
    }

    /// `read`, and again after fetching the blob from the shared store when
    /// the first try finds it missing. A fetch that fails says why in the
    /// error (the blob stays missing).
    fn reading<T>(&self, digest: &Digest, read: impl Fn() -> io::Result<T>) -> io::Result<T> {
        match (read(), &self.shared) {
            (Err(e), Some(shared)) if e.kind() == io::ErrorKind::NotFound => {
                shared
                    .fetch_blocking(self, digest)
                    .map_err(|e| io::Error::new(io::ErrorKind::NotFound, e))?;
                read()
            }
            (outcome, _) => outcome,
        }
    }

    /// Every blob with its size, sorted by digest. Names that are not
    /// digests (nothing silo writes) are left out.
    pub fn list(&self) -> Result<Vec<(Digest, u64)>, StoreError> {
        let dir = self.blob_dir();
        let mut blobs = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err("list", &dir))? {
            let entry = entry.map_err(io_err("list", &dir))?;
            let Some(digest) = entry
                .file_name()
                .to_str()
                .and_then(|n| Digest::parse(n).ok())
            else {
                continue;
            };
            match entry.metadata() {
                Ok(meta) => blobs.push((digest, meta.len())),
                // Removed between the listing and the stat.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("stat", &entry.path())(e)),
            }
        }
        blobs.sort();
        Ok(blobs)
    }

    /// Removes a blob; `false` if it was not there. Only garbage collection
    /// removes blobs, under the exclusive lock.
    pub fn remove(&self, digest: &Digest, lock: &ExclusiveLock) -> Result<bool, StoreError> {
        self.check_lock(lock)?;
        let path = self.path(digest);
        blocks::forget_layer(&self.root, digest)
            .map_err(io_err("remove the block sums of", &path))?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err("remove", &path)(e)),
        }
    }

    /// Removes everything in `tmp/` (writers that died before finishing)
    /// and returns how many entries went. Under the exclusive lock no writer
    /// is live, so nothing there is in use.
    pub fn sweep_temps(&self, lock: &ExclusiveLock) -> Result<usize, StoreError> {
        self.check_lock(lock)?;
        let dir = self.tmp_dir();
        let mut removed = 0;
        for entry in fs::read_dir(&dir).map_err(io_err("list", &dir))? {
            let entry = entry.map_err(io_err("list", &dir))?;
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            let gone = if is_dir {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            match gone {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &path)(e)),
            }
        }
        Ok(removed)
    }

    /// Waits as long as it takes for a shared lock: blobs written while it
    /// is held are safe from garbage collection until it is dropped.
    pub fn shared_lock(&self) -> Result<SharedLock, StoreError> {
        lock::shared(&self.lock_path())
    }

    /// Waits up to `timeout` for the exclusive lock, polling every
    /// [`LOCK_POLL`] (writers holding shared locks go first).
    pub fn exclusive_lock(&self, timeout: Duration) -> Result<ExclusiveLock, StoreError> {
        lock::exclusive(&self.lock_path(), timeout)
    }

    fn blob_dir(&self) -> PathBuf {
        self.root.join("blobs").join("sha256")
    }

    fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn lock_path(&self) -> PathBuf {
        self.root.join("lock")
    }

    fn check_lock(&self, lock: &ExclusiveLock) -> Result<(), StoreError> {
        if lock.path() == self.lock_path() {
            Ok(())
        } else {
            Err(StoreError::ForeignLock {
                lock: lock.path().to_owned(),
                root: self.root.clone(),
            })
        }
    }

    fn missing_or(
        &self,
        error: io::Error,
        digest: &Digest,
        what: &'static str,
        path: &Path,
    ) -> StoreError {
        if error.kind() == io::ErrorKind::NotFound {
            StoreError::Missing {
                digest: digest.clone(),
                root: self.root.clone(),
            }
        } else {
            io_err(what, path)(error)
        }
    }
}

#[cfg(test)]
mod tests;
