//! Safe extraction of a bundle stream into a fresh, empty directory.
//!
//! The body comes through the reader chain of `archive` (hash, caps,
//! gzip for bundles, a plain tar for the file API's tree uploads); this
//! module is the push tree that takes its entries, and the pieces a
//! layer's staging (`crate::layers`, which has rules of its own) shares:
//! [`normalize`], [`write_new_file`], [`Reject`] and [`ExtractError`].
//! In the push tree every entry is checked before anything is written for
//! it: a plain UTF-8 relative path with no `..`, only regular files and
//! directories (symlinks, hard links, devices, FIFOs and every other type
//! are refused), no duplicates or file/directory clashes, and the
//! per-file, total and entry-count caps. Files are created with
//! `O_EXCL | O_NOFOLLOW` and their modes masked to the permission bits.
//! The hash is compared to the signed one only at the end, so the caller
//! must treat the directory as untrusted until [`extract`] returns `Ok`.
//!
//! Nothing here cleans up: on error the caller removes the directory.

use std::collections::HashMap;
use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use silo_protocol::ErrorKind;
use silo_protocol::blocks::fill;
use silo_protocol::bundle::{BundleLimits, MAX_NAME_BYTES, MAX_PATH_BYTES};
use silo_protocol::members::Member;
use silo_protocol::snapshot::WHITEOUT_PREFIX;

use super::archive::{Meter, Packing, Unpack, read_archive};
use crate::fs_error::FsError;
/// Buffer for copying one file's bytes to disk: a whole number of
/// [`HOLE_BLOCK`]s, so each full read ends on a block boundary.
const COPY_BUFFER: usize = 64 * HOLE_BLOCK;
/// Permission bits kept from an entry's mode: no setuid, setgid or sticky.
const MODE_MASK: u32 = 0o777;
/// Bits every extracted directory gets, so the agent can always fill and
/// later remove it whatever mode the bundle asked for.
const DIR_OWNER_BITS: u32 = 0o700;
/// Mode of directories a bundle implies without listing.
const IMPLIED_DIR_MODE: u32 = 0o755;

/// What an extract produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// Regular files written.
    pub files: u64,
    /// Their total size.
    pub bytes: u64,
    /// Hex SHA-256 of the whole body.
    pub sha256: String,
}

/// Extracts the tar.gz read from `body` into `dest` (existing and empty),
/// then checks the body's SHA-256 against `claimed_sha256`. Stops before
/// the next entry once `cancelled` is set (the client went away).
pub fn extract<R: Read>(
    body: R,
    dest: &Path,
    limits: &BundleLimits,
    claimed_sha256: &str,
    cancelled: &AtomicBool,
) -> Result<Extracted, ExtractError> {
    extract_packed(Packing::Gzip, body, dest, limits, claimed_sha256, cancelled)
}

/// [`extract`] for a body packed as `packing`. Every entry rule is the same;
/// only a gzip body has an inflation ratio to bound.
pub fn extract_packed<R: Read>(
    packing: Packing,
    body: R,
    dest: &Path,
    limits: &BundleLimits,
    claimed_sha256: &str,
    cancelled: &AtomicBool,
) -> Result<Extracted, ExtractError> {
    let mut tree = Tree::new(dest, limits);
    let sha256 = read_archive(packing, body, limits, claimed_sha256, cancelled, &mut tree)?;
    Ok(Extracted {
        files: tree.files,
        bytes: tree.bytes,
        sha256,
    })
}

/// What a bundle holds, counted from its headers alone: the entries and
/// unpacked bytes a client did not declare, found in the time it takes to
/// read the body rather than to write every file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    /// Entries of any kind.
    pub entries: u64,
    /// Bytes of regular files.
    pub unpacked: u64,
}

/// Reads a gzip bundle from `body` through every check [`extract`] makes of
/// the archive itself (body, ratio and entry caps, the hash) and counts it
/// against `limits`, writing nothing.
pub fn count(
    body: impl Read,
    limits: &BundleLimits,
    claimed_sha256: &str,
    cancelled: &AtomicBool,
) -> Result<Counted, ExtractError> {
    let mut counter = Counter {
        limits,
        counted: Counted::default(),
    };
    read_archive(
        Packing::Gzip,
        body,
        limits,
        claimed_sha256,
        cancelled,
        &mut counter,
    )?;
    Ok(counter.counted)
}

/// The [`Unpack`] of [`count`]: sizes only, the data skipped.
struct Counter<'a> {
    limits: &'a BundleLimits,
    counted: Counted,
}

impl Unpack for Counter<'_> {
    fn add<R: Read>(
        &mut self,
        entry: &mut Member<'_, R>,
        _meter: &Meter,
    ) -> Result<(), ExtractError> {
        self.counted.entries += 1;
        if entry.header.entry_type().is_file() {
            self.counted.unpacked = self.counted.unpacked.saturating_add(entry.data.size());
            if self.counted.unpacked > self.limits.max_unpacked_bytes {
                return Err(ExtractError::UnpackedTooLarge {
                    limit: self.limits.max_unpacked_bytes,
                });
            }
        }
        Ok(())
    }
}

/// What a path in the tree is so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// A parent of some entry, not listed itself.
    ImpliedDir,
    /// A listed directory.
    Dir,
    /// A regular file.
    File,
}

/// The tree being written, and what it holds so far.
struct Tree<'a> {
    dest: &'a Path,
    limits: &'a BundleLimits,
    seen: HashMap<String, Seen>,
    files: u64,
    bytes: u64,
    buf: Vec<u8>,
}

impl<'a> Tree<'a> {
    fn new(dest: &'a Path, limits: &'a BundleLimits) -> Self {
        Self {
            dest,
            limits,
            seen: HashMap::new(),
            files: 0,
            bytes: 0,
            buf: copy_buffer(),
        }
    }
}

impl Unpack for Tree<'_> {
    fn add<R: Read>(
        &mut self,
        entry: &mut Member<'_, R>,
        meter: &Meter,
    ) -> Result<(), ExtractError> {
        let raw = entry.path.clone();
        let Ok(name) = String::from_utf8(raw.clone()) else {
            return Err(reject(&String::from_utf8_lossy(&raw), Reject::NotUtf8));
        };
        let is_dir = match entry.header.entry_type() {
            tar::EntryType::Regular => false,
            tar::EntryType::Directory => true,
            tar::EntryType::Symlink => return Err(reject(&name, Reject::Symlink)),
            tar::EntryType::Link => return Err(reject(&name, Reject::HardLink)),
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(reject(&name, Reject::Device));
            }
            tar::EntryType::Fifo => return Err(reject(&name, Reject::Fifo)),
            other => return Err(reject(&name, Reject::Unsupported(other.as_byte()))),
        };
        let Some(path) = normalize(&name).map_err(|why| reject(&name, why))? else {
            // `./` itself: the root, which exists already.
            return if is_dir {
                Ok(())
            } else {
                Err(reject(&name, Reject::BadName("empty path")))
            };
        };
        let mode = entry.header.mode().map_err(ExtractError::Malformed)? & MODE_MASK;
        self.make_parents(&name, &path)?;
        if is_dir {
            return self.add_dir(&name, path, mode);
        }
        let size = entry.data.size();
        if size > self.limits.max_file_bytes {
            return Err(ExtractError::FileTooLarge {
                entry: name,
                size,
                limit: self.limits.max_file_bytes,
            });
        }
        if self.bytes + size > self.limits.max_unpacked_bytes {
            return Err(ExtractError::UnpackedTooLarge {
                limit: self.limits.max_unpacked_bytes,
            });
        }
        if self.seen.insert(path.clone(), Seen::File).is_some() {
            return Err(reject(&name, Reject::Duplicate));
        }
        let target = self.dest.join(&path);
        write_new_file(
            &mut entry.data,
            &target,
            mode,
            Zeros::Written,
            &mut self.buf,
            meter,
        )?;
        self.files += 1;
        self.bytes += size;
        Ok(())
    }
}

impl Tree<'_> {
    /// Creates the parents of `path` not made yet; refuses a parent that is a file.
    fn make_parents(&mut self, name: &str, path: &str) -> Result<(), ExtractError> {
        let mut end = 0;
        while let Some(slash) = path[end..].find('/') {
            end += slash;
            let parent = &path[..end];
            match self.seen.get(parent) {
                Some(Seen::File) => return Err(reject(name, Reject::FileDirClash)),
                Some(_) => {}
                None => {
                    let dir = self.dest.join(parent);
                    DirBuilder::new()
                        .mode(IMPLIED_DIR_MODE)
                        .create(&dir)
                        .map_err(write_error("create", &dir))?;
                    self.seen.insert(parent.to_owned(), Seen::ImpliedDir);
                }
            }
            end += 1;
        }
        Ok(())
    }

    fn add_dir(&mut self, name: &str, path: String, mode: u32) -> Result<(), ExtractError> {
        let dir = self.dest.join(&path);
        let mode = mode | DIR_OWNER_BITS;
        match self.seen.insert(path, Seen::Dir) {
            None => DirBuilder::new()
                .mode(mode)
                .create(&dir)
                .map_err(write_error("create", &dir))?,
            Some(Seen::ImpliedDir) => {}
            Some(Seen::Dir | Seen::File) => {
                return Err(reject(name, Reject::Duplicate));
            }
        }
        std::fs::set_permissions(&dir, Permissions::from_mode(mode))
            .map_err(write_error("chmod", &dir))
    }
}

/// How a file's runs of zeros are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zeros {
    /// As bytes, like any others (a push writes what it was given).
    Written,
    /// Every block of `HOLE_BLOCK` zero bytes as a hole: a layer carries
    /// a sparse file's holes as zeros, and a file that comes back from one
    /// takes no more disk than the file it was taken from.
    Holes,
}

/// The block a hole is made of: the smallest a file system allocates.
pub(crate) const HOLE_BLOCK: usize = 4096;

/// Creates `target` (which must not exist, and is never followed if it is
/// a link) with `mode`, fills it with the entry's contents through `buf`,
/// its blocks of zeros as `zeros` says, and sets `mode` exactly (the umask
/// narrowed it at creation).
pub fn write_new_file<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    target: &Path,
    mode: u32,
    zeros: Zeros,
    buf: &mut [u8],
    meter: &Meter,
) -> Result<File, ExtractError> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(target)
        .map_err(write_error("create", target))?;
    let mut at = 0u64;
    loop {
        // Every read but the last ends on a block boundary (the buffer is
        // a whole number of blocks), so a block of zeros is never split
        // between two reads and written as data: a body arrives in chunks
        // of any size.
        let n = fill(entry, buf).map_err(|e| meter.read_error(e))?;
        if n == 0 {
            break;
        }
        write_at(&file, &buf[..n], at, zeros).map_err(write_error("write", target))?;
        at += n as u64;
    }
    if zeros == Zeros::Holes {
        // A trailing hole: the length says where the file ends.
        file.set_len(at).map_err(write_error("write", target))?;
    }
    file.set_permissions(Permissions::from_mode(mode))
        .map_err(write_error("chmod", target))?;
    Ok(file)
}

/// Writes `data` at offset `at` of `file`, skipping its whole blocks of
/// zeros when `zeros` asks for holes (runs of data go in one write).
fn write_at(file: &File, data: &[u8], at: u64, zeros: Zeros) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    if zeros == Zeros::Written {
        return file.write_all_at(data, at);
    }
    let mut run_start = None;
    let mut i = 0;
    while i < data.len() {
        // Blocks are aligned to the file, not to the read.
        let into_block = usize::try_from((at + i as u64) % HOLE_BLOCK as u64).unwrap_or(0);
        let end = (i + HOLE_BLOCK - into_block).min(data.len());
        let whole = end - i == HOLE_BLOCK;
        if whole && data[i..end].iter().all(|&b| b == 0) {
            if let Some(start) = run_start.take() {
                file.write_all_at(&data[start..i], at + start as u64)?;
            }
        } else {
            run_start.get_or_insert(i);
        }
        i = end;
    }
    match run_start {
        Some(start) => file.write_all_at(&data[start..], at + start as u64),
        None => Ok(()),
    }
}

/// A buffer for [`write_new_file`].
pub fn copy_buffer() -> Vec<u8> {
    vec![0; COPY_BUFFER]
}

/// The entry's path as `a/b/c`, or `None` for the root itself (`./`).
/// Leading `./`, repeated slashes and a trailing slash are tolerated (tar
/// tools write them); `..`, absolute paths and oversize names are not.
pub fn normalize(name: &str) -> Result<Option<String>, Reject> {
    let normal = normalize_within(name.as_bytes(), MAX_NAME_BYTES)?;
    // Cut only at `/`, so every part is still UTF-8.
    normal
        .map(|path| String::from_utf8(path).map_err(|_| Reject::NotUtf8))
        .transpose()
}

/// [`normalize`] for a name of any bytes (a snapshot layer's: a name is
/// bytes on Linux, and a layer brings back what the machine had). A
/// component may be as long as a name plus the `.wh.` a layer's deletion
/// marker puts before it; the file system refuses a longer name it is
/// asked to make.
pub fn normalize_bytes(name: &[u8]) -> Result<Option<Vec<u8>>, Reject> {
    normalize_within(name, MAX_NAME_BYTES + WHITEOUT_PREFIX.len())
}

/// [`normalize`]'s rules with components up to `name_max` bytes.
fn normalize_within(name: &[u8], name_max: usize) -> Result<Option<Vec<u8>>, Reject> {
    if name.starts_with(b"/") {
        return Err(Reject::Absolute);
    }
    if name.len() > MAX_PATH_BYTES {
        return Err(Reject::BadName("path too long"));
    }
    if name.contains(&0) {
        return Err(Reject::BadName("a NUL byte in a name"));
    }
    let mut parts = Vec::new();
    for part in name.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err(Reject::DotDot),
            part if part.len() > name_max => return Err(Reject::BadName("name too long")),
            part => parts.push(part),
        }
    }
    Ok((!parts.is_empty()).then(|| parts.join(&b'/')))
}

/// Entry `entry` is refused for `reason`.
pub fn reject(entry: &str, reason: Reject) -> ExtractError {
    ExtractError::Rejected {
        entry: entry.to_owned(),
        reason,
    }
}

/// A failed write to `path`: disk full, or a plain file system error.
pub fn write_error(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ExtractError {
    let path = path.to_owned();
    move |source| {
        if super::is_disk_full(&source) {
            ExtractError::DiskFull { path, source }
        } else {
            ExtractError::Io(FsError { what, path, source })
        }
    }
}

/// Why an entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// A `..` component.
    #[error("'..' in a path could climb out of the destination")]
    DotDot,
    /// Starts with `/`.
    #[error("absolute paths are not allowed")]
    Absolute,
    /// The name is not UTF-8.
    #[error("name is not UTF-8")]
    NotUtf8,
    /// Empty, or over a length limit.
    #[error("bad name: {0}")]
    BadName(&'static str),
    /// A symbolic link.
    #[error("symlinks are not allowed")]
    Symlink,
    /// A hard link.
    #[error("hard links are not allowed")]
    HardLink,
    /// A character or block device.
    #[error("device files are not allowed")]
    Device,
    /// A named pipe.
    #[error("FIFOs are not allowed")]
    Fifo,
    /// Any other type (tar cannot carry sockets; vendor and sparse types land here).
    #[error("unsupported entry type {:?} (only files and directories can be pushed)", char::from(*.0))]
    Unsupported(u8),
    /// The same path twice.
    #[error("duplicate entry")]
    Duplicate,
    /// A path used as a directory below a file.
    #[error("a file is in the way of this path")]
    FileDirClash,
    /// At or under a path a layer may not change (`/proc`, a mount point).
    #[error("lies at or under /{0}, which a layer may not change")]
    Excluded(String),
    /// A parent directory is a symlink on the destination.
    #[error("its parent /{0} is a symlink on the machine")]
    ParentSymlink(String),
    /// A parent directory is something else than a directory on the destination.
    #[error("its parent /{0} is not a directory on the machine")]
    ParentNotDir(String),
    /// A hard link to anything but an earlier file of the same archive.
    #[error("a hard link must name an earlier file of the same layer")]
    LinkTarget,
    /// A whiteout naming nothing (`.wh.`, `.wh..`, `.wh...`).
    #[error("a whiteout must name an entry")]
    BadWhiteout,
    /// A patch on what is not a regular file with one name on the machine,
    /// or on a path the same layer already brings.
    #[error(
        "a patch needs a regular file with one name at its path, which the layer does not bring"
    )]
    PatchTarget,
}

/// Why an extract failed.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    /// Not a readable tar or tar.gz (or the body ended early).
    #[error("body is not a readable tar or tar.gz")]
    Malformed(#[source] io::Error),
    /// An entry is refused.
    #[error("entry {entry:?} rejected: {reason}")]
    Rejected {
        /// The entry's name as the bundle gave it.
        entry: String,
        /// Why.
        reason: Reject,
    },
    /// One file is over the per-file cap.
    #[error("entry {entry:?} is {size} bytes, over the per-file limit of {limit}")]
    FileTooLarge {
        /// The entry.
        entry: String,
        /// Its size.
        size: u64,
        /// The cap.
        limit: u64,
    },
    /// Too many entries.
    #[error("archive has more than {limit} entries")]
    TooManyEntries {
        /// The cap.
        limit: u64,
    },
    /// The files add up to more than the unpacked cap.
    #[error("bundle unpacks to more than {limit} bytes")]
    UnpackedTooLarge {
        /// The cap.
        limit: u64,
    },
    /// The body is over the bundle cap.
    #[error("body is larger than {limit} bytes")]
    BundleTooLarge {
        /// The cap.
        limit: u64,
    },
    /// The body inflates beyond the ratio bound.
    #[error("bundle inflates more than {ratio}x (decompression bomb)")]
    Bomb {
        /// The bound.
        ratio: u64,
    },
    /// The request went away before the bundle was extracted.
    #[error("the client went away; extraction stopped")]
    Cancelled,
    /// Bytes after the gzip stream.
    #[error("bundle has data after the end of its gzip stream")]
    TrailingData,
    /// The body is not what was signed.
    #[error("body SHA-256 is {actual}, but the request was signed for {claimed}")]
    HashMismatch {
        /// The signed hash.
        claimed: String,
        /// The body's.
        actual: String,
    },
    /// The disk is full.
    #[error("disk full writing {}", path.display())]
    DiskFull {
        /// The file.
        path: PathBuf,
        /// The error (ENOSPC or EDQUOT).
        #[source]
        source: io::Error,
    },
    /// Another file system failure.
    #[error(transparent)]
    Io(#[from] FsError),
}

impl ExtractError {
    /// The error kind of every endpoint that extracts (push and the file
    /// API): a refused entry answers `rejected`, and a failed system call
    /// whatever `io` makes of it.
    pub fn kind(&self, rejected: ErrorKind, io: impl FnOnce(&io::Error) -> ErrorKind) -> ErrorKind {
        match self {
            Self::Malformed(_) | Self::TrailingData | Self::Cancelled => ErrorKind::Malformed,
            Self::Rejected { .. } => rejected,
            Self::FileTooLarge { .. }
            | Self::TooManyEntries { .. }
            | Self::UnpackedTooLarge { .. }
            | Self::BundleTooLarge { .. }
            | Self::Bomb { .. } => ErrorKind::TooLarge,
            Self::HashMismatch { .. } => ErrorKind::HashMismatch,
            Self::DiskFull { .. } => ErrorKind::DiskFull,
            Self::Io(err) => io(&err.source),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use sha2::{Digest, Sha256};
    use silo_protocol::bundle::{Bundle, FileEntry, FileSet};

    /// Hands out at most `chunk` bytes a read, as a body arriving in
    /// chunks does.
    struct Trickle<'a> {
        bytes: &'a [u8],
        chunk: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.chunk).min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_sparse_file_read_in_odd_chunks_stays_sparse() {
        use std::os::unix::fs::MetadataExt as _;
        // 1 MiB: a block of data at the start and one at the end, zeros
        // between, read back a few hundred bytes at a time.
        let mut content = vec![0u8; 1 << 20];
        content[..HOLE_BLOCK].fill(b'a');
        let end = content.len() - HOLE_BLOCK;
        content[end..].fill(b'z');
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        builder
            .append_data(&mut header, "sparse", content.as_slice())
            .unwrap();
        let tar = builder.into_inner().unwrap();
        let mut archive = tar::Archive::new(Trickle {
            bytes: &tar,
            chunk: 1000,
        });
        let mut entries = archive.entries().unwrap();
        let mut entry = entries.next().unwrap().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("sparse");
        let meter = Meter::default();
        let file = write_new_file(
            &mut entry,
            &target,
            0o644,
            Zeros::Holes,
            &mut copy_buffer(),
            &meter,
        )
        .unwrap();
        drop(file);
        assert_eq!(std::fs::read(&target).unwrap(), content);
        // Two blocks of data, in 512-byte units; a file system may add a
        // block of its own, never the zeros between.
        let blocks = std::fs::metadata(&target).unwrap().blocks();
        assert!(blocks <= 3 * (HOLE_BLOCK as u64 / 512), "{blocks} blocks");
    }

    fn run(
        bytes: &[u8],
        sha: &str,
        limits: &BundleLimits,
    ) -> (tempfile::TempDir, Result<Extracted, ExtractError>) {
        let dir = tempfile::tempdir().unwrap();
        let result = extract(bytes, dir.path(), limits, sha, &AtomicBool::new(false));
        (dir, result)
    }

    #[test]
    fn a_built_bundle_round_trips_with_masked_modes() {
        let mut set = FileSet::new();
        set.insert_bytes("bin/run", b"#!/bin/sh\n".to_vec(), true)
            .unwrap();
        set.insert_bytes("a/b/c.txt", b"hello".to_vec(), false)
            .unwrap();
        set.insert("empty", FileEntry::Dir).unwrap();
        let bundle = Bundle::build(&set, &BundleLimits::default()).unwrap();
        let (dir, result) = run(&bundle.bytes, &bundle.sha256, &BundleLimits::default());
        let done = result.unwrap();
        assert_eq!((done.files, done.bytes), (2, 15));
        let read = |p: &str| std::fs::read(dir.path().join(p)).unwrap();
        assert_eq!(read("a/b/c.txt"), b"hello");
        let mode = |p: &str| {
            std::fs::metadata(dir.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("bin/run"), 0o755);
        assert_eq!(mode("a/b/c.txt"), 0o644);
        assert!(dir.path().join("empty").is_dir());
    }

    #[test]
    fn hash_mismatch_and_garbage_are_refused() {
        let bundle = Bundle::build(&FileSet::new(), &BundleLimits::default()).unwrap();
        let (_d, r) = run(&bundle.bytes, &"0".repeat(64), &BundleLimits::default());
        assert!(matches!(r, Err(ExtractError::HashMismatch { .. })), "{r:?}");
        let (_d, r) = run(b"not gzip", &bundle.sha256, &BundleLimits::default());
        assert!(matches!(r, Err(ExtractError::Malformed(_))), "{r:?}");
        let mut trailing = bundle.bytes.clone();
        trailing.extend_from_slice(b"junk");
        let (_d, r) = run(&trailing, &bundle.sha256, &BundleLimits::default());
        assert!(matches!(r, Err(ExtractError::TrailingData)), "{r:?}");
    }

    #[test]
    fn caps_and_bombs_are_refused() {
        let mut set = FileSet::new();
        set.insert_bytes("zeros", vec![0u8; 20 * 1024 * 1024], false)
            .unwrap();
        let bundle = Bundle::build(&set, &BundleLimits::default()).unwrap();
        let (_d, r) = run(&bundle.bytes, &bundle.sha256, &BundleLimits::default());
        assert!(matches!(r, Err(ExtractError::Bomb { .. })), "{r:?}");
        let small = BundleLimits {
            max_file_bytes: 1024,
            ..BundleLimits::default()
        };
        let (_d, r) = run(&bundle.bytes, &bundle.sha256, &small);
        assert!(matches!(r, Err(ExtractError::FileTooLarge { .. })), "{r:?}");
        let tiny = BundleLimits {
            max_bundle_bytes: 100,
            ..BundleLimits::default()
        };
        let (_d, r) = run(&bundle.bytes, &bundle.sha256, &tiny);
        assert!(
            matches!(r, Err(ExtractError::BundleTooLarge { .. })),
            "{r:?}"
        );
    }

    #[test]
    fn a_plain_tar_meets_the_same_rules() {
        let tar_of = |name: &str| {
            let mut header = tar::Header::new_gnu();
            header.set_size(2);
            header.set_mode(0o640);
            header.set_entry_type(tar::EntryType::Regular);
            // `set_path` refuses `..`; a hostile writer does not.
            header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            header.set_cksum();
            let mut builder = tar::Builder::new(Vec::new());
            builder.append(&header, &b"hi"[..]).unwrap();
            builder.into_inner().unwrap()
        };
        let limits = BundleLimits::default();
        let good = tar_of("d/f");
        let sha = hex::encode(Sha256::digest(&good));
        let dir = tempfile::tempdir().unwrap();
        let never = AtomicBool::new(false);
        let done = extract_packed(Packing::Tar, &good[..], dir.path(), &limits, &sha, &never);
        assert_eq!(done.unwrap().files, 1);
        assert_eq!(std::fs::read(dir.path().join("d/f")).unwrap(), b"hi");

        let bad = tar_of("../escape");
        let sha = hex::encode(Sha256::digest(&bad));
        let dir = tempfile::tempdir().unwrap();
        let r = extract_packed(Packing::Tar, &bad[..], dir.path(), &limits, &sha, &never);
        assert!(matches!(r, Err(ExtractError::Rejected { .. })), "{r:?}");
    }

    #[test]
    fn names_are_normalized_or_refused() {
        assert_eq!(normalize("./a//b/").unwrap().as_deref(), Some("a/b"));
        assert_eq!(normalize("./").unwrap(), None);
        assert_eq!(normalize("a/../../b"), Err(Reject::DotDot));
        assert_eq!(normalize("/etc/passwd"), Err(Reject::Absolute));
    }
}
