//! [`BlobWriter`]: one blob being written: a temp file in `tmp/` that is
//! hashed as it fills and renamed to its digest when finished; and
//! [`BlobTee`], which fills one from a stream that is parsed as it passes.

use std::fs::{File, Permissions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use tempfile::NamedTempFile;

use super::error::io as io_err;
use super::{Digest, StoreError};

/// Bytes buffered before a write reaches the temp file: tar parsers read
/// 512-byte headers, which would otherwise be one syscall each.
const WRITE_BUFFER: usize = 256 * 1024;

/// Mode of a finished blob: content-addressed, so never written again.
const BLOB_MODE: u32 = 0o400;
/// Mode of a blob being written: only this process writes or reads it.
const TEMP_MODE: u32 = 0o600;

/// A blob being written. Write its bytes, then [`BlobWriter::finish`].
///
/// Dropping it unfinished removes its temp file (best effort; anything
/// left behind is swept by [`super::Store::sweep_temps`]).
pub struct BlobWriter {
    /// The open temp file, removed when dropped; `None` once finished.
    file: Option<BufWriter<NamedTempFile>>,
    /// Its path in `tmp/`.
    temp: PathBuf,
    /// `blobs/sha256/`, where the finished blob is renamed to.
    blobs: PathBuf,
    /// The sha256 of everything written so far.
    hasher: Sha256,
    /// How many bytes were written.
    size: u64,
}

/// A finished blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Its name.
    pub digest: Digest,
    /// Its length in bytes.
    pub size: u64,
    /// Whether this write added it (`false`: the store had it already).
    pub new: bool,
}

impl BlobWriter {
    /// Creates a fresh temp file in `tmp/`, under a random name.
    pub(super) fn create(tmp_dir: &Path, blobs: PathBuf) -> Result<Self, StoreError> {
        let file = tempfile::Builder::new()
            .permissions(Permissions::from_mode(TEMP_MODE))
            .tempfile_in(tmp_dir)
            .map_err(io_err("create a temp file in", tmp_dir))?;
        let temp = file.path().to_owned();
        Ok(Self {
            file: Some(BufWriter::with_capacity(WRITE_BUFFER, file)),
            temp,
            blobs,
            hasher: Sha256::new(),
            size: 0,
        })
    }

    /// Bytes written so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Makes the blob durable under its digest: flush and fsync the temp
    /// file, rename it into `blobs/sha256/` (or drop it if that blob is there
    /// already), and fsync the directory so the name survives a crash.
    pub fn finish(mut self) -> Result<Written, StoreError> {
        let Some(buffered) = self.file.take() else {
            return Err(unusable(&self.temp));
        };
        let file = buffered
            .into_inner()
            .map_err(|e| io_err("write", &self.temp)(e.into_error()))?;
        file.as_file()
            .set_permissions(Permissions::from_mode(BLOB_MODE))
            .map_err(io_err("chmod", &self.temp))?;
        file.as_file()
            .sync_all()
            .map_err(io_err("fsync", &self.temp))?;
        let digest = Digest::from_hasher(std::mem::take(&mut self.hasher));
        let target = self.blobs.join(digest.as_str());
        let exists = target.try_exists().map_err(io_err("look for", &target))?;
        if exists {
            // Same name, same bytes: keep the blob that is there (someone may
            // be reading it) and drop ours.
            file.close().map_err(io_err("remove", &self.temp))?;
        } else {
            file.persist(&target)
                .map_err(|err| io_err("rename", &self.temp)(err.error))?;
            sync_dir(&self.blobs)?;
        }
        Ok(Written {
            digest,
            size: self.size,
            new: !exists,
        })
    }
}

impl BlobWriter {
    /// Appends all of `buf`, failing with the temp file's path (a full disk
    /// reads as "cannot write <store>/tmp/…: No space left on device").
    pub fn append(&mut self, buf: &[u8]) -> Result<(), StoreError> {
        let Some(file) = self.file.as_mut() else {
            return Err(unusable(&self.temp));
        };
        file.write_all(buf).map_err(io_err("write", &self.temp))?;
        self.hasher.update(buf);
        self.size += buf.len() as u64;
        Ok(())
    }
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.append(buf).map_err(io::Error::other)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.file.as_mut() {
            Some(file) => file.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            // Unfinished: the bytes are unwanted, so skip the buffer's flush.
            // Dropping the temp file removes it (best effort: a leftover is
            // swept under the exclusive lock).
            let (file, _unwritten) = file.into_parts();
            drop(file);
        }
    }
}

impl std::fmt::Debug for BlobWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobWriter")
            .field("temp", &self.temp)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Makes the entries of `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}

fn unusable(temp: &Path) -> StoreError {
    io_err("finish", temp)(io::Error::other("blob writer already finished"))
}

/// Reads through to `inner` and writes every byte read into a blob, so one
/// pass over a stream both stores it and feeds a parser.
///
/// A failed write is kept apart, as [`BlobTee::write_error`], and the read
/// that met it fails: the parser then stops with a read error, which the
/// caller must not report in place of the store's (a full store is not a
/// malformed stream).
pub struct BlobTee<'a, R> {
    inner: R,
    blob: &'a mut BlobWriter,
    write_error: Option<StoreError>,
}

impl<'a, R> BlobTee<'a, R> {
    /// Tees `inner` into `blob`.
    pub fn new(inner: R, blob: &'a mut BlobWriter) -> Self {
        Self {
            inner,
            blob,
            write_error: None,
        }
    }

    /// The failed write to the blob, if one failed.
    pub fn write_error(&mut self) -> Option<StoreError> {
        self.write_error.take()
    }

    /// The reader teed from.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

impl<R: Read> Read for BlobTee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.write_error.is_some() {
            return Err(io::Error::other("the blob write failed"));
        }
        let n = self.inner.read(buf)?;
        if let Err(error) = self.blob.append(&buf[..n]) {
            self.write_error = Some(error);
            return Err(io::Error::other("the blob write failed"));
        }
        Ok(n)
    }
}
