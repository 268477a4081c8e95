//! Directory watches: a directory's changes, read from the kernel with
//! inotify and handed to one exec connection as batches of [`FsEvent`]s.
//!
//! A watch lives as long as its [`Watch`] handle (the connection keeps it
//! in a table; an unwatch or the connection's end drops it). A recursive
//! watch adds the subdirectories it finds and those made later; names in
//! events are relative to the watched directory. What the kernel could not
//! queue is reported as one `overflow` event, never silently dropped.
//! Symlinks are not followed: a link to a directory is a path like any
//! other, not a way out of the tree.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use silo_protocol::ErrorKind;
use silo_protocol::exec::{FsEvent, FsEventKind};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Most directories one recursive watch follows; a larger tree is refused
/// at the start, and what is made past the cap later is reported as an
/// overflow (the kernel's own limit is per user, shared with the sandbox).
pub const MAX_WATCHED_DIRS: usize = 8192;

/// What a watch reports on.
const MASK: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_MODIFY)
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR)
    .union(AddWatchFlags::IN_DONT_FOLLOW);

/// Why a watch could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// Nothing at the path.
    #[error("{} does not exist", .0.display())]
    NotFound(PathBuf),
    /// Something other than a directory at the path.
    #[error("{} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// The tree has more directories than one watch follows.
    #[error("{} holds more than {MAX_WATCHED_DIRS} directories; watch a part of it", .0.display())]
    TooLarge(PathBuf),
    /// The kernel refused (no permission, its per-user limit reached).
    #[error("cannot watch {}: {source}", path.display())]
    Kernel {
        /// The directory.
        path: PathBuf,
        /// What the kernel said.
        source: Errno,
    },
    /// The runtime could not poll the watch.
    #[error("cannot poll a watch: {0}")]
    Poll(#[source] std::io::Error),
}

impl WatchError {
    /// The error kind a refused watch request answers with.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::NotADirectory(_) => ErrorKind::NotADirectory,
            Self::TooLarge(_) => ErrorKind::LimitReached,
            Self::Kernel { source, .. } => match source {
                Errno::EACCES | Errno::EPERM => ErrorKind::PermissionDenied,
                Errno::ENOSPC | Errno::EMFILE | Errno::ENFILE => ErrorKind::LimitReached,
                _ => ErrorKind::Internal,
            },
            Self::Poll(_) => ErrorKind::Internal,
        }
    }
}

/// What a running watch sends: a batch of changes, or its end.
#[derive(Debug)]
pub enum Watched {
    /// Changes, in the kernel's order.
    Events(Vec<FsEvent>),
    /// It ended on its own, for this reason; nothing follows.
    Ended(String),
}

/// A running watch; dropping it stops it.
#[derive(Debug)]
pub struct Watch {
    task: JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watch {
    /// Starts watching `root` (with `recursive`, its subdirectories too);
    /// batches go to `out`, with `id`, until the handle drops or `out` closes.
    pub fn start(
        id: u64,
        root: &Path,
        recursive: bool,
        out: mpsc::Sender<(u64, Watched)>,
    ) -> Result<Watch, WatchError> {
        match std::fs::symlink_metadata(root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(WatchError::NotADirectory(root.to_path_buf())),
            Err(_) => return Err(WatchError::NotFound(root.to_path_buf())),
        }
        let kernel = |source| WatchError::Kernel {
            path: root.to_path_buf(),
            source,
        };
        let inotify =
            Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(kernel)?;
        // SAFETY: the `Inotify` owns its descriptor and keeps it open and
        // unchanged for as long as the `AsyncFd` that owns it exists.
        let fd = unsafe { AsyncFd::register(Kernel(inotify)) }
            .map_err(|e| WatchError::Poll(e.into()))?;
        let mut tree = Tree {
            fd,
            root: root.to_path_buf(),
            recursive,
            dirs: HashMap::new(),
        };
        let root_wd = tree.add(Path::new(""), true)?;
        let task = tokio::spawn(async move {
            let ended = tree.pump(root_wd, id, &out).await;
            if let Some(reason) = ended {
                let _ = out.send((id, Watched::Ended(reason))).await;
            }
        });
        Ok(Watch { task })
    }
}

/// The kernel's watch queue, as tokio polls it.
struct Kernel(Inotify);

impl AsRawFd for Kernel {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// The watched directories, by the kernel's descriptor.
struct Tree {
    fd: AsyncFd<Kernel>,
    root: PathBuf,
    recursive: bool,
    /// Descriptor → the directory's path relative to the root.
    dirs: HashMap<WatchDescriptor, PathBuf>,
}

impl Tree {
    /// Watches the directory `rel` (relative to the root) and, when
    /// recursive, every directory below it. At the start (`strict`) a
    /// failure or a tree past the cap is an error; later, what cannot be
    /// added is left out and the answer says so (false).
    fn add(&mut self, rel: &Path, strict: bool) -> Result<WatchDescriptor, WatchError> {
        let mut pending = vec![rel.to_path_buf()];
        let mut first = None;
        while let Some(dir) = pending.pop() {
            if self.dirs.len() >= MAX_WATCHED_DIRS {
                return Err(WatchError::TooLarge(self.root.clone()));
            }
            let path = self.root.join(&dir);
            let wd = match self.fd.get_ref().0.add_watch(&path, MASK) {
                Ok(wd) => wd,
                Err(source) if strict => return Err(WatchError::Kernel { path, source }),
                // Gone again, or not a directory any more: nothing to watch.
                Err(_) => continue,
            };
            self.dirs.insert(wd, dir.clone());
            first.get_or_insert(wd);
            if !self.recursive {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&path) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    pending.push(dir.join(entry.file_name()));
                }
            }
        }
        first.ok_or_else(|| WatchError::NotFound(self.root.join(rel)))
    }

    /// Reads the kernel's events and sends them on until the root goes
    /// away (answers why) or the receiver does (answers `None`).
    async fn pump(
        &mut self,
        root_wd: WatchDescriptor,
        id: u64,
        out: &mpsc::Sender<(u64, Watched)>,
    ) -> Option<String> {
        loop {
            let read = {
                let mut ready = match self.fd.readable().await {
                    Ok(ready) => ready,
                    Err(error) => return Some(format!("the watch failed: {error}")),
                };
                match ready.get_inner().0.read_events() {
                    Ok(read) => read,
                    Err(Errno::EAGAIN) => {
                        ready.clear_ready();
                        continue;
                    }
                    Err(errno) => return Some(format!("the watch failed: {errno}")),
                }
            };
            let mut batch = Vec::with_capacity(read.len());
            let mut ended = None;
            for event in read {
                if event.wd == root_wd
                    && event.mask.intersects(
                        AddWatchFlags::IN_DELETE_SELF
                            | AddWatchFlags::IN_MOVE_SELF
                            | AddWatchFlags::IN_IGNORED,
                    )
                {
                    ended = Some("the watched directory was removed or moved".to_owned());
                    break;
                }
                self.translate(&event, &mut batch);
            }
            if !batch.is_empty() && out.send((id, Watched::Events(batch))).await.is_err() {
                return None;
            }
            if ended.is_some() {
                return ended;
            }
        }
    }

    /// The events one kernel event makes (none for bookkeeping ones), and
    /// new subdirectories watched when recursive.
    fn translate(&mut self, event: &InotifyEvent, batch: &mut Vec<FsEvent>) {
        let mask = event.mask;
        if mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            batch.push(FsEvent {
                kind: FsEventKind::Overflow,
                name: String::new(),
                dir: false,
            });
            return;
        }
        if mask.contains(AddWatchFlags::IN_IGNORED) {
            self.dirs.remove(&event.wd);
            return;
        }
        // A subdirectory's own removal arrives as its parent's delete.
        if mask.intersects(AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF) {
            return;
        }
        let Some(dir) = self.dirs.get(&event.wd) else {
            return;
        };
        let rel = match &event.name {
            Some(name) => dir.join(trim_nul(name)),
            None => dir.clone(),
        };
        let is_dir = mask.contains(AddWatchFlags::IN_ISDIR);
        let kind = if mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
            FsEventKind::Create
        } else if mask.contains(AddWatchFlags::IN_DELETE) {
            FsEventKind::Remove
        } else if mask.contains(AddWatchFlags::IN_MOVED_FROM) {
            FsEventKind::Rename
        } else if mask.contains(AddWatchFlags::IN_MODIFY) {
            FsEventKind::Write
        } else if mask.contains(AddWatchFlags::IN_ATTRIB) {
            FsEventKind::Chmod
        } else {
            return;
        };
        batch.push(FsEvent {
            kind,
            name: rel.to_string_lossy().into_owned(),
            dir: is_dir,
        });
        // A directory gone again before it could be watched needs no word;
        // one past the cap goes unwatched, which the client must know.
        if self.recursive && is_dir && kind == FsEventKind::Create {
            if let Err(WatchError::TooLarge(_)) = self.add(&rel, false) {
                batch.push(FsEvent {
                    kind: FsEventKind::Overflow,
                    name: rel.to_string_lossy().into_owned(),
                    dir: true,
                });
            }
        }
    }
}

/// A name as the kernel gives it may carry NUL padding.
fn trim_nul(name: &OsStr) -> &OsStr {
    use std::os::unix::ffi::OsStrExt;
    let bytes = name.as_bytes();
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    OsStr::from_bytes(&bytes[..end])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use std::time::Duration;

    use super::*;

    async fn collect(
        rx: &mut mpsc::Receiver<(u64, Watched)>,
        until: impl Fn(&[FsEvent]) -> bool,
    ) -> Vec<FsEvent> {
        let mut seen = Vec::new();
        while !until(&seen) {
            match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
                Ok(Some((7, Watched::Events(batch)))) => seen.extend(batch),
                other => panic!("no more events after {seen:?}: {other:?}"),
            }
        }
        seen
    }

    fn has(events: &[FsEvent], kind: FsEventKind, name: &str) -> bool {
        events.iter().any(|e| e.kind == kind && e.name == name)
    }

    #[tokio::test]
    async fn a_recursive_watch_sees_changes_in_directories_made_later() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("old")).unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let _watch = Watch::start(7, dir.path(), true, tx).unwrap();
        std::fs::write(dir.path().join("old/a.txt"), "a").unwrap();
        std::fs::create_dir(dir.path().join("new")).unwrap();
        // The new directory is watched once its create is read.
        collect(&mut rx, |seen| has(seen, FsEventKind::Create, "new")).await;
        std::fs::write(dir.path().join("new/b.txt"), "b").unwrap();
        std::fs::rename(dir.path().join("old/a.txt"), dir.path().join("c.txt")).unwrap();
        std::fs::remove_file(dir.path().join("new/b.txt")).unwrap();
        let seen = collect(&mut rx, |seen| has(seen, FsEventKind::Remove, "new/b.txt")).await;
        assert!(has(&seen, FsEventKind::Create, "new/b.txt"), "{seen:?}");
        assert!(has(&seen, FsEventKind::Rename, "old/a.txt"), "{seen:?}");
        assert!(has(&seen, FsEventKind::Create, "c.txt"), "{seen:?}");
    }

    #[tokio::test]
    async fn a_flat_watch_ignores_subdirectories_and_ends_with_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("w");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let _watch = Watch::start(7, &root, false, tx).unwrap();
        std::fs::write(root.join("sub/hidden.txt"), "x").unwrap();
        std::fs::write(root.join("seen.txt"), "x").unwrap();
        let seen = collect(&mut rx, |seen| has(seen, FsEventKind::Create, "seen.txt")).await;
        assert!(!seen.iter().any(|e| e.name.contains("hidden")), "{seen:?}");
        std::fs::remove_dir_all(&root).unwrap();
        loop {
            match tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
            {
                Some((_, Watched::Events(_))) => {}
                Some((_, Watched::Ended(reason))) => {
                    assert!(reason.contains("removed"), "{reason}");
                    break;
                }
                None => panic!("the watch ended without saying why"),
            }
        }
    }

    #[test]
    fn what_cannot_be_watched_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let (tx, _rx) = mpsc::channel(1);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = runtime.enter();
        let not_dir = Watch::start(1, &file, false, tx.clone());
        assert!(matches!(not_dir, Err(WatchError::NotADirectory(_))));
        let missing = Watch::start(1, &dir.path().join("none"), false, tx);
        assert!(matches!(missing, Err(WatchError::NotFound(_))));
    }
}
