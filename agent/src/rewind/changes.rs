//! What changed since the tree a rewind goes back from, as the change list
//! the controller computes the restoring layer from: the snapshot walk
//! ([`crate::snapshot::walk`]) with a sink that writes one record per path
//! instead of a layer.
//!
//! A path the walk would put in a layer is listed with what it is now; a
//! whiteout the walk finds (a baseline path gone from a changed directory)
//! is listed as gone, under its own name; the root's own metadata, when it
//! changed, under the empty path. The list is held in memory up to
//! [`MAX_CHANGES_BYTES`]: a sandbox that changed more than that is better
//! made again than rewound in place.

use std::fs::Metadata;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use silo_protocol::rewind::{Change, MAX_CHANGES_BYTES, push_record};
use silo_protocol::snapshot::WHITEOUT_PREFIX;

use crate::paths::as_path;
use crate::snapshot::SnapshotError;
use crate::snapshot::walk::{self, Sink, WalkSpec, Walked};

/// The changed paths under `root`, as the walk finds them (blocking).
pub fn list(root: &Path, spec: &WalkSpec) -> Result<Listed, SnapshotError> {
    let mut sink = Listed::default();
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
    /// What the walk looked at.
    pub walked: Walked,
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
        self.push(kind, rel.as_os_str().as_bytes())
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
        let listed = list(root, &spec).unwrap();
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
}
