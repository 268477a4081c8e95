//! What changed since the tree a rewind goes back from, as the change list
//! the controller computes the restoring layer from: the snapshot walk
//! ([`crate::snapshot::walk`]) with a sink that writes one record per path
//! instead of a layer.
//!
//! A path the walk would put in a layer is listed with what it is now; a
//! whiteout the walk finds (a baseline path gone from a changed directory)
//! is listed as gone, under its own name; the root's own metadata, when it
//! changed, under the empty path. Asked to (`block_sums`), a changed
//! regular file with one name and at least [`MIN_SUMMED_BYTES`] is
//! followed by its block sums ([`silo_protocol::blocks`]), read while no
//! process runs, so the controller can send back only its blocks that
//! differ. The list is held in memory up to [`MAX_CHANGES_BYTES`]: a
//! sandbox that changed more than that is better made again than rewound
//! in place (sums that would not fit are left out: the file goes back
//! whole).

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use silo_protocol::blocks::{BlockSums, MIN_SUMMED_BYTES};
use silo_protocol::rewind::{Change, MAX_CHANGES_BYTES, push_record, push_sums};
use silo_protocol::snapshot::WHITEOUT_PREFIX;

use crate::paths::as_path;
use crate::snapshot::SnapshotError;
use crate::snapshot::walk::{self, Sink, WalkSpec, Walked};

/// The changed paths under `root`, as the walk finds them, with the block
/// sums of big files when `block_sums` (blocking).
pub fn list(root: &Path, spec: &WalkSpec, block_sums: bool) -> Result<Listed, SnapshotError> {
    let mut sink = Listed {
        summed_under: block_sums.then(|| root.to_path_buf()),
        ..Listed::default()
    };
    walk::walk(root, spec, &mut sink)?;
    Ok(sink)
}

/// A change list, and how many paths of each kind it holds.
#[derive(Debug, Default)]
pub struct Listed {
    /// The records.
    pub body: Vec<u8>,
    /// Paths that are there now.
    pub present: u64,
    /// Paths that are gone.
    pub gone: u64,
    /// Files followed by their block sums.
    pub summed: u64,
    /// What the walk looked at.
    pub walked: Walked,
    /// The root the walk reads, when big files are summed.
    summed_under: Option<PathBuf>,
}

impl Listed {
    fn push(&mut self, kind: Change, path: &[u8]) -> io::Result<()> {
        if self.body.len() + path.len() + 2 > MAX_CHANGES_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("the change list is over {MAX_CHANGES_BYTES} bytes"),
            ));
        }
        push_record(&mut self.body, kind, path);
        Ok(())
    }

    /// Follows the file record just pushed by the file's block sums, where
    /// they are asked for, it has one name and is big enough. A file that
    /// cannot be read, or sums that would not fit, are left out: the file
    /// then goes back whole.
    fn sums(&mut self, rel: &Path, meta: &Metadata) {
        let Some(root) = &self.summed_under else {
            return;
        };
        if meta.nlink() != 1 || meta.len() < MIN_SUMMED_BYTES {
            return;
        }
        let path = root.join(rel);
        let sums = open_plain(&path).and_then(BlockSums::read);
        let sums = match sums {
            Ok(sums) => sums,
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "left its block sums out");
                return;
            }
        };
        if self.body.len() + sums.0.len() * 2 * silo_protocol::blocks::SUM_BYTES + 2
            > MAX_CHANGES_BYTES
        {
            return;
        }
        push_sums(&mut self.body, &sums);
        self.summed += 1;
    }
}

/// `path` opened to read, never through a symlink.
fn open_plain(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

impl Sink for Listed {
    fn root(&mut self, _meta: &Metadata, changed: bool) -> io::Result<()> {
        // The root's own metadata, listed under the empty path.
        if changed {
            self.present += 1;
            self.push(Change::Dir, b"")?;
        }
        Ok(())
    }

    fn entry(&mut self, rel: &Path, meta: &Metadata) -> io::Result<()> {
        let kind = meta.file_type();
        let kind = if kind.is_dir() {
            Change::Dir
        } else if kind.is_file() {
            Change::File
        } else if kind.is_symlink() {
            Change::Symlink
        } else {
            Change::Other
        };
        self.present += 1;
        self.push(kind, rel.as_os_str().as_bytes())?;
        if kind == Change::File {
            self.sums(rel, meta);
        }
        Ok(())
    }

    fn whiteout(&mut self, rel: &Path) -> io::Result<()> {
        let name = rel.file_name().map_or(&[][..], |n| n.as_bytes());
        let gone = name
            .strip_prefix(WHITEOUT_PREFIX.as_bytes())
            .unwrap_or(name);
        let path = match rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) => parent.join(as_path(gone)),
            None => as_path(gone).to_path_buf(),
        };
        self.gone += 1;
        self.push(Change::Gone, path.as_os_str().as_bytes())
    }

    fn seen(&mut self, rel: &Path, meta: &Metadata) {
        self.walked.seen(rel, meta);
    }

    fn read_dir(&mut self, rel: &Path) {
        self.walked.read_dir(rel);
    }
}

/// Whether `err` is the list's own cap.
pub fn over_cap(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::FileTooLarge
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use std::collections::HashSet;
    use std::os::unix::fs::symlink;

    use silo_protocol::rewind::split_changes;

    use super::*;
    use crate::snapshot::walk::Baseline;

    #[test]
    fn every_change_is_listed_with_what_it_is_now_and_deletions_as_gone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc/apt")).unwrap();
        std::fs::write(root.join("etc/passwd"), "root").unwrap();
        symlink("passwd", root.join("etc/link")).unwrap();
        let spec = WalkSpec {
            changed_since_ns: 0,
            excluded: HashSet::new(),
            baseline: Baseline::new(&["etc".into(), "etc/group".into(), "etc/apt".into()]),
            hint: None,
        };
        let listed = list(root, &spec, false).unwrap();
        let records = split_changes(&listed.body).unwrap();
        let shown: Vec<(Change, &str)> = records
            .iter()
            .map(|(kind, path)| (*kind, std::str::from_utf8(path).unwrap()))
            .collect();
        assert_eq!(
            shown,
            [
                (Change::Dir, ""),
                (Change::Dir, "etc"),
                (Change::Gone, "etc/group"),
                (Change::Dir, "etc/apt"),
                (Change::Symlink, "etc/link"),
                (Change::File, "etc/passwd"),
            ]
        );
        assert_eq!((listed.present, listed.gone), (5, 1));
    }

    #[test]
    fn big_files_with_one_name_come_with_their_block_sums_when_asked() {
        use silo_protocol::blocks::{BlockSums, MIN_SUMMED_BYTES};
        use silo_protocol::rewind::split_with_sums;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let big: Vec<u8> = (0..MIN_SUMMED_BYTES + 5).map(|i| (i % 7) as u8).collect();
        std::fs::write(root.join("big"), &big).unwrap();
        std::fs::write(root.join("linked"), &big).unwrap();
        std::fs::hard_link(root.join("linked"), root.join("linked2")).unwrap();
        std::fs::write(root.join("small"), b"small").unwrap();
        let spec = || WalkSpec {
            changed_since_ns: 0,
            excluded: HashSet::new(),
            baseline: Baseline::new(&[]),
            hint: None,
        };
        let listed = list(root, &spec(), true).unwrap();
        let (records, sums) = split_with_sums(&listed.body).unwrap();
        assert_eq!(records.len(), 5, "the root and four files");
        assert_eq!(sums, [(&b"big"[..], BlockSums::read(&big[..]).unwrap())]);
        assert_eq!(listed.summed, 1);
        // Not asked: none.
        let listed = list(root, &spec(), false).unwrap();
        assert!(split_with_sums(&listed.body).unwrap().1.is_empty());
    }
}
