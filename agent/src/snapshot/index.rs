//! The path index: every path of the machine's file system, sorted, each
//! followed by a NUL byte (the controller's stored index, uncompressed).
//!
//! It is the snapshot walk taking everything: no threshold, no pruning, no
//! baseline, so it leaves out what a snapshot leaves out (the request's
//! exclusions, every mount point, sockets) and never follows a symlink; on
//! top, `/proc`, `/sys` and `/dev` are left out even where they are not
//! mounted. The walk hands paths in byte order of the whole path, which is
//! the index's order, so the answer streams as the walk goes, in the
//! memory of one directory listing per level. Names are bytes, UTF-8 or
//! not, as the controller's index holds them.

use std::collections::HashSet;
use std::fs::Metadata;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use silo_protocol::ErrorKind;
use silo_protocol::http::error_chain;
use silo_protocol::index::{IndexRequest, PATH_END};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::walk::{self, SYSTEM_DIRS, Sink, WalkSpec};
use super::{LayerStream, SnapshotError, Snapshotter, excluded, stream};
use crate::fs_error::FsError;

impl Snapshotter {
    /// Starts one path index; on success the paths stream through the answer.
    pub async fn index(&self, request: IndexRequest) -> Result<LayerStream, IndexError> {
        let mut excluded = excluded(&request.exclude).map_err(IndexError::Malformed)?;
        excluded.extend(SYSTEM_DIRS.iter().map(PathBuf::from));
        let permit = Arc::clone(&self.indexes)
            .try_acquire_owned()
            .map_err(|_| IndexError::Busy)?;
        let (writer, paths) = stream::channel(Handle::current());
        let (ready_tx, ready_rx) = oneshot::channel();
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            take(&root, excluded, writer, ready_tx);
        });
        match ready_rx.await {
            Ok(Ok(())) => Ok(paths),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(IndexError::Internal(
                "the index task ended before the paths started".into(),
            )),
        }
    }
}

/// The blocking part of one index. `ready` hears whether the paths start;
/// after that, errors can only cut the answer short.
fn take(
    root: &Path,
    mut excluded: HashSet<PathBuf>,
    mut out: stream::ChannelWriter,
    ready: oneshot::Sender<Result<(), IndexError>>,
) {
    let started = Instant::now();
    match walk::mount_points(root) {
        Ok(mounts) => excluded.extend(mounts),
        Err(err) => {
            let _ = ready.send(Err(IndexError::from(err)));
            return;
        }
    }
    if ready.send(Ok(())).is_err() {
        return;
    }
    let written = write_index(root, excluded, &mut out);
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match written {
        Ok(stats) => match out.complete() {
            Ok(()) => tracing::info!(paths = stats.paths, ms, "path index taken"),
            Err(err) => tracing::info!(%err, "path index not delivered"),
        },
        Err(err) => {
            tracing::warn!(ms, "path index cut short: {}", error_chain(&err));
            out.abort();
        }
    }
}

/// What an index held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Paths written.
    pub paths: u64,
}

/// Walks `root` and writes every path not `excluded` (relative to `root`),
/// each followed by [`PATH_END`], in byte order.
pub fn write_index(
    root: &Path,
    excluded: HashSet<PathBuf>,
    out: impl Write,
) -> Result<IndexStats, SnapshotError> {
    let spec = WalkSpec {
        changed_since_ns: i64::MIN,
        excluded,
        baseline: walk::Baseline::default(),
        hint: None,
    };
    let mut list = PathList {
        out,
        stats: IndexStats::default(),
    };
    walk::walk(root, &spec, &mut list)?;
    list.out
        .flush()
        .map_err(|e| FsError::new("send the index of", root, e))?;
    Ok(list.stats)
}

/// The walk's sink for an index: each path's bytes and its end byte.
struct PathList<W> {
    out: W,
    stats: IndexStats,
}

impl<W: Write> Sink for PathList<W> {
    fn entry(&mut self, rel: &Path, _meta: &Metadata) -> io::Result<()> {
        self.out.write_all(rel.as_os_str().as_bytes())?;
        self.out.write_all(&[PATH_END])?;
        self.stats.paths += 1;
        Ok(())
    }

    fn whiteout(&mut self, _rel: &Path) -> io::Result<()> {
        // An empty baseline has nothing to delete.
        Ok(())
    }
}

/// Why a path index failed; [`IndexError::kind`] makes the answer.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// Another index is being taken.
    #[error("another path index is being taken")]
    Busy,
    /// The request cannot be read.
    #[error("{0}")]
    Malformed(String),
    /// The request body was not taken whole.
    #[error(transparent)]
    Body(#[from] crate::body::BodyError),
    /// A file system operation failed before the first path.
    #[error(transparent)]
    Io(#[from] FsError),
    /// The agent failed in a way the request could not cause.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<SnapshotError> for IndexError {
    fn from(err: SnapshotError) -> Self {
        match err {
            SnapshotError::Io(err) => Self::Io(err),
            other => Self::Internal(error_chain(&other)),
        }
    }
}

impl IndexError {
    /// The error body's kind (which fixes the status).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Busy => ErrorKind::Busy,
            Self::Malformed(_) => ErrorKind::Malformed,
            Self::Body(err) => err.kind(),
            Self::Io(_) | Self::Internal(_) => ErrorKind::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::symlink;

    fn index_of(root: &Path, excluded: &[&str]) -> (Vec<String>, IndexStats) {
        let mut out = Vec::new();
        let excluded = excluded.iter().map(PathBuf::from).collect();
        let stats = write_index(root, excluded, &mut out).unwrap();
        let paths = silo_protocol::index::split_paths(&out)
            .unwrap()
            .into_iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        (paths, stats)
    }

    #[test]
    fn every_path_in_byte_order_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // Names chosen so a per-directory walk would not be sorted: `a`'s
        // entries sort after `a.b` and `a-c` ('/' is above '.' and '-').
        for sub in ["a/x", "a.b", "z/deep/er", "skip/inner", "outside/t"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        std::fs::write(root.join("a-c"), "").unwrap();
        std::fs::write(root.join("a/x/f"), "").unwrap();
        std::fs::write(root.join("outside/t/secret"), "").unwrap();
        symlink(root.join("outside"), root.join("z/link")).unwrap();
        let bad = std::ffi::OsStr::from_bytes(b"bad\xff");
        std::fs::create_dir(root.join("z").join(bad)).unwrap();
        std::fs::write(root.join("z").join(bad).join("in"), "").unwrap();
        let (paths, stats) = index_of(root, &["skip", "outside"]);
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(paths, sorted);
        assert_eq!(
            paths,
            [
                "a",
                "a-c",
                "a.b",
                "a/x",
                "a/x/f",
                "z",
                "z/bad\u{fffd}",
                "z/bad\u{fffd}/in",
                "z/deep",
                "z/deep/er",
                "z/link",
            ]
        );
        assert_eq!(stats.paths, 11);
    }

    #[test]
    fn errors_map_to_the_index_kinds() {
        assert_eq!(IndexError::Busy.kind().status(), Some(409));
        assert_eq!(
            IndexError::Body(crate::body::BodyError::over(1)).kind(),
            ErrorKind::TooLarge
        );
        assert_eq!(IndexError::Malformed("x".into()).kind().status(), Some(400));
    }
}
