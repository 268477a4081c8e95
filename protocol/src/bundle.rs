//! The push bundle: what a push carries, its limits, and the deterministic
//! builder that makes it.
//!
//! A bundle is a gzip-compressed tar holding only directories and regular
//! files. The builder writes entries in byte order of their paths, with a
//! fixed mtime, uid, gid and mode (0644, or 0755 for executables and
//! directories) and a fixed gzip level and header, so the same files always
//! give the same bytes and therefore the same SHA-256 from the same build of
//! silo. That hash is what the agent compares to decide "unchanged", and what
//! the signature binds.
//!
//! [`BundleLimits`] are the caps the agent enforces while extracting; the
//! builder checks the same caps up front, so a bundle the controller would
//! send is refused on the host with a clear message rather than by the agent.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use flate2::{Compression, GzBuilder};
use sha2::{Digest, Sha256};

use crate::exact::ExactReader;

/// Largest single file a bundle may hold.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 25 * 1024 * 1024;
/// Largest bundle (the compressed body) a push may send.
pub const DEFAULT_MAX_BUNDLE_BYTES: u64 = 100 * 1024 * 1024;
/// Most bytes a bundle may unpack to, all files together.
pub const DEFAULT_MAX_UNPACKED_BYTES: u64 = 1024 * 1024 * 1024;
/// Most entries (files and directories) a bundle may hold.
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;
/// Largest accepted ratio of unpacked to compressed bytes; beyond it a bundle
/// is treated as a decompression bomb.
pub const DEFAULT_MAX_RATIO: u64 = 200;
/// Unpacked bytes below which the ratio is not enforced: a small bundle of
/// highly compressible files (zero-filled fixtures) is harmless.
pub const RATIO_FLOOR_BYTES: u64 = 8 * 1024 * 1024;
/// Longest accepted entry path, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest accepted path component, in bytes (Linux's `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;
/// The gzip level every bundle is compressed with. Part of the format: a
/// different level gives different bytes and so a different hash.
pub const GZIP_LEVEL: u32 = 6;
/// The mtime every entry carries. Extraction ignores it.
pub const ENTRY_MTIME: u64 = 0;
/// Mode of plain files in a bundle.
pub const FILE_MODE: u32 = 0o644;
/// Mode of executable files and directories in a bundle.
pub const EXEC_MODE: u32 = 0o755;

/// The caps a bundle must stay within. The agent takes its own values from
/// its flags; these defaults are what it uses when none are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleLimits {
    /// Largest single file.
    pub max_file_bytes: u64,
    /// Largest bundle (compressed).
    pub max_bundle_bytes: u64,
    /// Most bytes unpacked, all files together.
    pub max_unpacked_bytes: u64,
    /// Most entries.
    pub max_entries: u64,
    /// Largest unpacked/compressed ratio (enforced past [`RATIO_FLOOR_BYTES`]).
    pub max_ratio: u64,
}

impl Default for BundleLimits {
    fn default() -> Self {
        Self {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_bundle_bytes: DEFAULT_MAX_BUNDLE_BYTES,
            max_unpacked_bytes: DEFAULT_MAX_UNPACKED_BYTES,
            max_entries: DEFAULT_MAX_ENTRIES,
            max_ratio: DEFAULT_MAX_RATIO,
        }
    }
}

/// Where a file's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FileSource {
    /// Bytes in memory (shared, so one set can feed many bundles cheaply).
    Bytes(Arc<[u8]>),
    /// A file on disk, read when the bundle is built.
    Path(PathBuf),
}

/// One entry of a [`FileSet`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FileEntry {
    /// A directory (only needed for empty ones: parents are implied).
    Dir,
    /// A regular file.
    File {
        /// Its bytes.
        source: FileSource,
        /// Whether it gets mode 0755 instead of 0644.
        executable: bool,
    },
}

/// The files to push, keyed by their relative `/`-separated path. Ordered,
/// so iteration is the bundle's entry order. Two equal sets build the same
/// bundle, which is how a fan-out builds each distinct bundle once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FileSet {
    entries: BTreeMap<String, FileEntry>,
}

impl FileSet {
    /// An empty set (pushing it makes the mount an empty directory).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an entry; the path must be relative and plain (see [`check_path`]).
    pub fn insert(&mut self, path: &str, entry: FileEntry) -> Result<(), BundleError> {
        check_path(path).map_err(|reason| BundleError::BadPath {
            path: path.to_owned(),
            reason,
        })?;
        if self.entries.insert(path.to_owned(), entry).is_some() {
            return Err(BundleError::BadPath {
                path: path.to_owned(),
                reason: "duplicate entry",
            });
        }
        Ok(())
    }

    /// Adds a file held in memory.
    pub fn insert_bytes(
        &mut self,
        path: &str,
        bytes: impl Into<Arc<[u8]>>,
        executable: bool,
    ) -> Result<(), BundleError> {
        let source = FileSource::Bytes(bytes.into());
        self.insert(path, FileEntry::File { source, executable })
    }

    /// The entries in bundle order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &FileEntry)> {
        self.entries
            .iter()
            .map(|(path, entry)| (path.as_str(), entry))
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Checks that `path` is a plain relative path: `/`-separated components,
/// none empty, `.` or `..`, within the length limits. Returns why not.
pub fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("empty path");
    }
    if path.starts_with('/') {
        return Err("absolute path");
    }
    if path.len() > MAX_PATH_BYTES {
        return Err("path too long");
    }
    if path.contains('\0') {
        return Err("path contains a NUL byte");
    }
    for component in path.split('/') {
        match component {
            "" => return Err("empty path component"),
            "." => return Err("'.' path component"),
            ".." => return Err("'..' path component"),
            name if name.len() > MAX_NAME_BYTES => return Err("path component too long"),
            _ => {}
        }
    }
    Ok(())
}

/// A built bundle, ready to send to any number of agents.
#[derive(Debug, Clone)]
pub struct Bundle {
    /// The tar.gz bytes.
    pub bytes: Vec<u8>,
    /// Lowercase hex SHA-256 of `bytes`.
    pub sha256: String,
    /// Regular files in it.
    pub files: u64,
    /// Tar entries in it (files and directories).
    pub entries: u64,
    /// Their total size, unpacked.
    pub unpacked_bytes: u64,
}

impl Bundle {
    /// Builds the bundle of `files`, refusing one over `limits`.
    pub fn build(files: &FileSet, limits: &BundleLimits) -> Result<Self, BundleError> {
        let mut bytes = Vec::new();
        let summary = write_bundle(files, limits, &mut bytes)?;
        let len = bytes.len() as u64;
        if len > limits.max_bundle_bytes {
            return Err(BundleError::TooLarge {
                what: "bundle",
                bytes: len,
                limit: limits.max_bundle_bytes,
            });
        }
        Ok(Self {
            bytes,
            sha256: summary.sha256,
            files: summary.files,
            entries: files.len() as u64,
            unpacked_bytes: summary.unpacked_bytes,
        })
    }
}

/// What [`write_bundle`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleSummary {
    /// Hex SHA-256 of the bytes written.
    pub sha256: String,
    /// Compressed bytes written.
    pub bytes: u64,
    /// Regular files.
    pub files: u64,
    /// Their total size.
    pub unpacked_bytes: u64,
}

/// Writes the bundle of `files` to `out`, checking every limit but the
/// compressed size (which [`Bundle::build`] checks once it is known).
pub fn write_bundle<W: Write>(
    files: &FileSet,
    limits: &BundleLimits,
    out: W,
) -> Result<BundleSummary, BundleError> {
    if files.len() as u64 > limits.max_entries {
        return Err(BundleError::TooLarge {
            what: "entry count",
            bytes: files.len() as u64,
            limit: limits.max_entries,
        });
    }
    let hashing = HashingWriter {
        inner: out,
        hasher: Sha256::new(),
        written: 0,
    };
    // A bare header (no name, mtime 0, OS "unknown") keeps the bytes
    // independent of where and when the bundle is built.
    let gzip = GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(hashing, Compression::new(GZIP_LEVEL));
    let mut tar = tar::Builder::new(gzip);
    let mut file_count = 0u64;
    let mut unpacked = 0u64;
    for (path, entry) in files.iter() {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(ENTRY_MTIME);
        header.set_uid(0);
        header.set_gid(0);
        match entry {
            FileEntry::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(EXEC_MODE);
                header.set_size(0);
                tar.append_data(&mut header, format!("{path}/"), io::empty())
                    .map_err(write_error)?;
            }
            FileEntry::File { source, executable } => {
                let (size, reader) = open_source(path, source)?;
                if size > limits.max_file_bytes {
                    return Err(BundleError::TooLarge {
                        what: "file",
                        bytes: size,
                        limit: limits.max_file_bytes,
                    });
                }
                unpacked += size;
                if unpacked > limits.max_unpacked_bytes {
                    return Err(BundleError::TooLarge {
                        what: "unpacked total",
                        bytes: unpacked,
                        limit: limits.max_unpacked_bytes,
                    });
                }
                file_count += 1;
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(if *executable { EXEC_MODE } else { FILE_MODE });
                header.set_size(size);
                let exact = ExactReader::new(reader, size);
                tar.append_data(&mut header, path, exact)
                    .map_err(|source| BundleError::Read {
                        path: path.to_owned(),
                        source,
                    })?;
            }
        }
    }
    let gzip = tar.into_inner().map_err(write_error)?;
    let hashing = gzip.finish().map_err(write_error)?;
    Ok(BundleSummary {
        sha256: hex::encode(hashing.hasher.finalize()),
        bytes: hashing.written,
        files: file_count,
        unpacked_bytes: unpacked,
    })
}

fn open_source<'a>(
    path: &str,
    source: &'a FileSource,
) -> Result<(u64, Box<dyn Read + 'a>), BundleError> {
    match source {
        FileSource::Bytes(bytes) => Ok((bytes.len() as u64, Box::new(&bytes[..]))),
        FileSource::Path(file) => {
            let read_error = |source| BundleError::Read {
                path: path.to_owned(),
                source,
            };
            let opened = File::open(file).map_err(read_error)?;
            let meta = opened.metadata().map_err(read_error)?;
            if !meta.is_file() {
                return Err(BundleError::BadPath {
                    path: path.to_owned(),
                    reason: "not a regular file",
                });
            }
            Ok((meta.len(), Box::new(opened)))
        }
    }
}

fn write_error(source: io::Error) -> BundleError {
    BundleError::Write(source)
}

struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Why a bundle could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// An entry path is not a plain relative path, or cannot be bundled.
    #[error("cannot bundle {path:?}: {reason}")]
    BadPath {
        /// The entry.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A file could not be read.
    #[error("cannot read {path:?} for the bundle")]
    Read {
        /// The entry.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Something is over a limit.
    #[error("{what} of {bytes} is over the limit of {limit}")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// Its size (bytes, or a count).
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// Writing the archive failed.
    #[error("cannot write the bundle")]
    Write(#[source] io::Error),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn sample() -> FileSet {
        let mut set = FileSet::new();
        set.insert_bytes("b/z.txt", b"zz".to_vec(), false).unwrap();
        set.insert_bytes("a.sh", b"#!/bin/sh\n".to_vec(), true)
            .unwrap();
        set.insert("empty", FileEntry::Dir).unwrap();
        set
    }

    #[test]
    fn same_files_same_bytes() {
        let one = Bundle::build(&sample(), &BundleLimits::default()).unwrap();
        let two = Bundle::build(&sample(), &BundleLimits::default()).unwrap();
        assert_eq!(one.bytes, two.bytes);
        assert_eq!(one.sha256, two.sha256);
        assert_eq!(one.sha256, hex::encode(Sha256::digest(&one.bytes)));
        assert_eq!((one.files, one.unpacked_bytes), (2, 12));

        let decoder = flate2::read::GzDecoder::new(&one.bytes[..]);
        let mut archive = tar::Archive::new(decoder);
        let seen: Vec<(String, u32, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().display().to_string(),
                    h.mode().unwrap(),
                    h.mtime().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("a.sh".to_owned(), 0o755, 0),
                ("b/z.txt".to_owned(), 0o644, 0),
                ("empty/".to_owned(), 0o755, 0),
            ]
        );
    }

    #[test]
    fn paths_must_be_plain_and_relative() {
        for (bad, why) in [
            ("", "empty path"),
            ("/etc/passwd", "absolute path"),
            ("a/../b", "'..' path component"),
            ("a//b", "empty path component"),
            ("./a", "'.' path component"),
        ] {
            assert_eq!(check_path(bad), Err(why), "{bad}");
        }
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert!(check_path(&long).is_err());
        assert!(check_path("a/b.c/.hidden").is_ok());
        let mut set = sample();
        assert!(set.insert_bytes("a.sh", b"x".to_vec(), false).is_err());
    }

    #[test]
    fn limits_are_checked_before_sending() {
        let mut set = FileSet::new();
        set.insert_bytes("big", vec![0u8; 2048], false).unwrap();
        let limits = BundleLimits {
            max_file_bytes: 1024,
            ..BundleLimits::default()
        };
        assert!(matches!(
            Bundle::build(&set, &limits),
            Err(BundleError::TooLarge { what: "file", .. })
        ));
        let limits = BundleLimits {
            max_entries: 0,
            ..BundleLimits::default()
        };
        assert!(matches!(
            Bundle::build(&set, &limits),
            Err(BundleError::TooLarge {
                what: "entry count",
                ..
            })
        ));
    }
}
