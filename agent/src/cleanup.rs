//! Removal that cannot silently fail, and temporary names that outlive no
//! agent.
//!
//! On fuse-overlayfs a `remove_dir_all` of a tree another process is reading
//! can stop with `ENOTEMPTY`, and a removal that failed once used to be
//! logged and forgotten (hundreds of MB of old versions stayed). Here a
//! removal is tried a few times at once; if it still fails, the path is
//! written to a journal under `<root>/.silo/cleanup/<boot id>/` and a
//! background thread retries it, with backoff, until it is gone. Each
//! agent holds an `flock` on its own journal; a journal whose lock is free
//! belongs to an agent that is gone, and whatever it still names is removed
//! by the next agent's retrier (several agents may share a root outside a
//! container).
//!
//! The same journal makes temporary names safe across a `kill -9`: before
//! the agent creates a staging directory or a temporary file outside its
//! own directories (a `silo cp` beside its destination), it records the
//! name as an [`Intent`]. Finished, the intent is forgotten; abandoned, its
//! path is removed; and an agent killed in between leaves the entry for the
//! next boot's sweep. Names carry the boot id ([`unique_name`]), so they
//! never collide with a leftover of an earlier agent, which, as PID 1 of
//! every container, had the same pid and counters.
//!
//! The journal only ever removes names the agent makes (see
//! [`is_agent_name`]), so a planted entry cannot aim it at anything else.
//! Without a writable root the journal lives in memory, bounded by
//! [`MAX_PENDING`].

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

use crate::paths::{STATE_DIR, STORE_DIR};

/// The journal's directory under the agent's state directory.
pub const JOURNAL_DIR: &str = "cleanup";
/// Tries of a removal before it goes to the background.
pub const QUICK_TRIES: u32 = 4;
/// Pause after the first failed try; it doubles with each one after.
pub const FIRST_PAUSE: Duration = Duration::from_millis(20);
/// First pause of the background retries; it doubles up to [`MAX_PAUSE`].
pub const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Longest pause between background retries.
pub const MAX_PAUSE: Duration = Duration::from_secs(30);
/// Most removals waiting in memory when the journal cannot be written.
pub const MAX_PENDING: usize = 4096;
/// Endings of every temporary name the agent makes outside its own
/// directories, and prefixes of those inside version stores.
const AGENT_SUFFIXES: [&str; 2] = [".silo-staging", ".silo-tmp"];
const AGENT_PREFIXES: [&str; 3] = [".partial-", ".link-", ".silo-apply."];
/// Characters of the boot id in a temporary name: 64 random bits tell
/// boots apart, and a short name keeps room for the file's own.
const BOOT_TAG_CHARS: usize = 16;
/// The file each agent holds an `flock` on while it lives.
const LOCK_FILE: &str = ".lock";
/// Mode of the journal's directory.
const JOURNAL_MODE: u32 = 0o700;

/// The agent's cleanup: one per process, set up by the boot step.
pub struct Cleanup {
    journal: Option<Journal>,
    boot_id: String,
    next: AtomicU64,
    state: Mutex<State>,
    wake: Condvar,
}

/// This agent's journal directory, locked while the agent lives.
struct Journal {
    /// Every agent's journal lies here.
    root: PathBuf,
    /// This agent's.
    dir: PathBuf,
    _lock: Flock<File>,
}

#[derive(Default)]
struct State {
    /// Journal entries of intents still under way: not for the retrier.
    live: HashSet<String>,
    /// Removals waiting when there is no journal on disk.
    in_memory: Vec<PathBuf>,
    /// Something failed since the retrier last looked.
    dirty: bool,
}

static GLOBAL: OnceLock<Cleanup> = OnceLock::new();

/// Sets up the agent's cleanup with its journal under `state_dir` and
/// starts the retrier, which first resumes what earlier boots left. Only
/// the first call counts.
pub fn install(state_dir: &Path, boot_id: &str) -> &'static Cleanup {
    let journal = match open_journal(state_dir, boot_id) {
        Ok(journal) => Some(journal),
        Err(err) => {
            tracing::warn!(dir = %state_dir.display(), %err, "no cleanup journal: failed removals are retried in memory only");
            None
        }
    };
    let cleanup = GLOBAL.get_or_init(|| Cleanup::new(journal, boot_id.to_owned()));
    cleanup.state().dirty = true;
    let spawned = std::thread::Builder::new()
        .name("cleanup".into())
        .spawn(move || cleanup.retry_forever());
    if let Err(err) = spawned {
        tracing::warn!(%err, "cannot start the cleanup thread; leftovers wait for the next boot");
    }
    cleanup
}

/// The agent's cleanup; before [`install`] (unit tests, fuzzing) one with
/// no journal and no retrier, which still retries each removal at once.
pub fn global() -> &'static Cleanup {
    GLOBAL.get_or_init(|| Cleanup::new(None, crate::random_hex::<8>().unwrap_or_default()))
}

/// Makes and locks `<state_dir>/cleanup/<boot_id>/`.
fn open_journal(state_dir: &Path, boot_id: &str) -> io::Result<Journal> {
    let root = state_dir.join(JOURNAL_DIR);
    let dir = root.join(boot_id);
    make_dirs(&[state_dir, &root, &dir])?;
    let lock = File::create(dir.join(LOCK_FILE))?;
    let lock = Flock::lock(lock, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, errno)| io::Error::from(errno))?;
    Ok(Journal {
        root,
        dir,
        _lock: lock,
    })
}

fn make_dirs(dirs: &[&Path]) -> io::Result<()> {
    for &dir in dirs {
        match std::fs::DirBuilder::new().mode(JOURNAL_MODE).create(dir) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(err),
        }
        if !std::fs::symlink_metadata(dir)?.is_dir() {
            return Err(io::Error::other("not a directory (a symlink is refused)"));
        }
    }
    Ok(())
}

/// `base` made unique across agents: `<base>.<boot id>-<n>`, then `suffix`.
pub fn unique_name(base: &str, suffix: &str) -> String {
    let cleanup = global();
    let n = cleanup.next.fetch_add(1, Ordering::Relaxed);
    let boot: String = cleanup.boot_id.chars().take(BOOT_TAG_CHARS).collect();
    format!("{base}.{boot}-{n}{suffix}")
}

/// Whether the last component of `path` is a temporary name the agent
/// makes, so the journal may remove it.
pub fn is_agent_name(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    AGENT_SUFFIXES.iter().any(|s| name.ends_with(s))
        || AGENT_PREFIXES.iter().any(|p| name.starts_with(p))
        || path.components().any(|part| {
            let part = part.as_os_str();
            part == STORE_DIR || part == STATE_DIR
        })
}

/// A temporary path the agent is about to make: removed unless
/// [`Intent::done`] is called, and by the next boot if the agent dies first.
#[must_use = "an intent dropped at once removes its path"]
pub struct Intent {
    path: PathBuf,
    entry: Option<String>,
    used: bool,
}

impl Intent {
    /// The path it covers.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path was used up (renamed into place): nothing to remove.
    pub fn done(mut self) {
        self.used = true;
        if let Some(entry) = self.entry.take() {
            global().forget(&entry);
        }
    }
}

impl Drop for Intent {
    fn drop(&mut self) {
        if self.used {
            return;
        }
        let cleanup = global();
        let entry = self.entry.take();
        if let Some(entry) = &entry {
            cleanup.state().live.remove(entry);
        }
        match remove_now(&self.path) {
            Ok(()) => {
                if let Some(entry) = &entry {
                    cleanup.forget(entry);
                }
            }
            Err(err) => {
                tracing::warn!(path = %self.path.display(), %err, "cannot remove a temporary path yet; retrying in the background");
                if entry.is_none() {
                    cleanup.remember(&self.path);
                }
                cleanup.poke();
            }
        }
    }
}

impl Cleanup {
    fn new(journal: Option<Journal>, boot_id: String) -> Self {
        Self {
            journal,
            boot_id,
            next: AtomicU64::new(1),
            state: Mutex::default(),
            wake: Condvar::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `path` before it is made (see [`Intent`]).
    pub fn intend(&self, path: PathBuf) -> Intent {
        let entry = self.journal.as_ref().and_then(|journal| {
            let entry = self.next.fetch_add(1, Ordering::Relaxed).to_string();
            self.state().live.insert(entry.clone());
            match std::fs::write(journal.dir.join(&entry), path.as_os_str().as_bytes()) {
                Ok(()) => Some(entry),
                Err(err) => {
                    self.state().live.remove(&entry);
                    tracing::warn!(%err, "cannot journal a temporary path; a crash would leave it");
                    None
                }
            }
        });
        Intent {
            path,
            entry,
            used: false,
        }
    }

    /// Removes `path` (a tree, a file or a link) now, or, failing that,
    /// journals it and keeps retrying in the background. True when it is
    /// gone already.
    pub fn remove(&self, path: &Path) -> bool {
        match remove_now(path) {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(path = %path.display(), %err, "cannot remove yet; retrying in the background");
                self.remember(path);
                self.poke();
                false
            }
        }
    }

    /// Removals still waiting (journal entries and in-memory ones).
    pub fn pending(&self) -> usize {
        let on_disk = self.journal.as_ref().map_or(0, |journal| {
            std::fs::read_dir(&journal.dir).map_or(0, |entries| entries.count().saturating_sub(1))
        });
        on_disk + self.state().in_memory.len()
    }

    fn remember(&self, path: &Path) {
        if let Some(journal) = &self.journal {
            let entry = self.next.fetch_add(1, Ordering::Relaxed).to_string();
            if std::fs::write(journal.dir.join(entry), path.as_os_str().as_bytes()).is_ok() {
                return;
            }
        }
        let mut state = self.state();
        if state.in_memory.len() < MAX_PENDING {
            state.in_memory.push(path.to_path_buf());
        } else {
            tracing::warn!(path = %path.display(), "too many removals pending; this one waits for the next boot");
        }
    }

    fn forget(&self, entry: &str) {
        self.state().live.remove(entry);
        if let Some(journal) = &self.journal {
            let _ = std::fs::remove_file(journal.dir.join(entry));
        }
    }

    fn poke(&self) {
        self.state().dirty = true;
        self.wake.notify_one();
    }

    /// The retrier: sweeps whenever something failed, and while anything
    /// is left, again after a pause that doubles up to [`MAX_PAUSE`].
    fn retry_forever(&self) {
        let mut pause = RETRY_PAUSE;
        loop {
            let left = self.sweep();
            let mut state = self.state();
            if left == 0 {
                pause = RETRY_PAUSE;
                while !state.dirty {
                    state = self
                        .wake
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            } else if !state.dirty {
                state = self
                    .wake
                    .wait_timeout(state, pause)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            state.dirty = false;
        }
    }

    /// One pass over every waiting removal; returns how many are left.
    pub fn sweep(&self) -> usize {
        let mut left = 0;
        let waiting = std::mem::take(&mut self.state().in_memory);
        for path in waiting {
            if remove_now(&path).is_err() {
                left += 1;
                self.state().in_memory.push(path);
            }
        }
        let Some(journal) = &self.journal else {
            return left;
        };
        left += self.sweep_journal(&journal.dir, true);
        // Journals of agents that are gone: their lock is free.
        for other in std::fs::read_dir(&journal.root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = other.path();
            if dir == journal.dir || !other.file_type().is_ok_and(|kind| kind.is_dir()) {
                continue;
            }
            let Ok(lock) = File::open(dir.join(LOCK_FILE)) else {
                continue;
            };
            let Ok(_held) = Flock::lock(lock, FlockArg::LockExclusiveNonblock) else {
                continue;
            };
            let others_left = self.sweep_journal(&dir, false);
            if others_left == 0 {
                let _ = std::fs::remove_file(dir.join(LOCK_FILE));
                let _ = std::fs::remove_dir(&dir);
            }
            left += others_left;
        }
        left
    }

    /// Removes what the journal at `dir` names (entries still under way
    /// skipped in this agent's own); returns how many are left.
    fn sweep_journal(&self, dir: &Path, own: bool) -> usize {
        let mut left = 0;
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == LOCK_FILE || (own && self.state().live.contains(&name)) {
                continue;
            }
            let Ok(bytes) = std::fs::read(entry.path()) else {
                continue;
            };
            let path = PathBuf::from(OsString::from_vec(bytes));
            if !path.is_absolute() || !is_agent_name(&path) {
                tracing::warn!(path = %path.display(), "cleanup journal names no temporary path of the agent; ignored");
            } else if let Err(err) = remove_now(&path) {
                tracing::debug!(path = %path.display(), %err, "still cannot remove");
                left += 1;
                continue;
            }
            let _ = std::fs::remove_file(entry.path());
        }
        left
    }
}

/// Removes a tree, a file or a link, trying [`QUICK_TRIES`] times.
fn remove_now(path: &Path) -> io::Result<()> {
    let mut pause = FIRST_PAUSE;
    let mut tries = 0;
    loop {
        match remove_once(path) {
            Ok(()) => return Ok(()),
            Err(err) => {
                tries += 1;
                if tries >= QUICK_TRIES {
                    return Err(err);
                }
                std::thread::sleep(pause);
                pause *= 2;
            }
        }
    }
}

fn remove_once(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
        Ok(meta) if meta.is_dir() => remove_tree(path),
        Ok(_) => match std::fs::remove_file(path) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        },
    }
}

/// Removes a directory tree, making read-only directories writable first
/// if that is what stops it (a pushed tree may hold 0555 directories).
pub fn remove_tree(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_dirs_writable(dir);
            std::fs::remove_dir_all(dir)
        }
    }
}

fn make_dirs_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    // Best effort: whatever still fails is reported by the retried removal.
    let mode = meta.permissions().mode() | 0o700;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode));
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        make_dirs_writable(&entry.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agents_own_names_may_be_journaled() {
        assert!(is_agent_name(Path::new("/w/.a.txt.ab12-3.silo-tmp")));
        assert!(is_agent_name(Path::new("/w/.dir.ab12-3.silo-staging")));
        assert!(is_agent_name(Path::new("/w/.versions/m/.partial-x")));
        assert!(is_agent_name(Path::new("/w/.versions/m/3-abc")));
        assert!(is_agent_name(Path::new("/.silo/layers/boot-1")));
        assert!(!is_agent_name(Path::new("/etc")));
        assert!(!is_agent_name(Path::new("/home/user/file.txt")));
    }

    #[test]
    fn a_journaled_removal_is_resumed_by_a_later_sweep() {
        let scratch = tempfile::tempdir().unwrap();
        let state = scratch.path().join("state");
        let staging = scratch.path().join(".tree.old-1.silo-staging");
        std::fs::create_dir_all(staging.join("sub")).unwrap();
        std::fs::write(staging.join("sub/f"), b"x").unwrap();
        // What an agent killed mid-way leaves: its journal, and the tree.
        let old = open_journal(&state, "old").unwrap();
        std::fs::write(old.dir.join("1"), staging.as_os_str().as_bytes()).unwrap();
        std::fs::write(old.dir.join("2"), b"/etc").unwrap();
        let alive = open_journal(&state, "alive").unwrap();
        let alive_entry = alive.dir.join("1");
        std::fs::write(&alive_entry, staging.as_os_str().as_bytes()).unwrap();
        let old_dir = old.dir.clone();

        let cleanup = Cleanup::new(Some(open_journal(&state, "new").unwrap()), "new".into());
        cleanup.sweep();
        assert!(
            staging.exists(),
            "the journal of a living agent is left alone"
        );
        drop(old);
        assert_eq!(cleanup.sweep(), 0);
        assert!(!staging.exists());
        assert!(Path::new("/etc").exists());
        assert!(!old_dir.exists(), "a finished journal goes");
        assert!(alive_entry.exists());
    }

    #[test]
    fn a_live_intent_is_left_alone_until_it_ends() {
        let scratch = tempfile::tempdir().unwrap();
        let temp = scratch.path().join(".f.x-1.silo-tmp");
        let intent = global().intend(temp.clone());
        std::fs::write(&temp, b"partial").unwrap();
        global().sweep();
        assert!(temp.exists(), "a sweep leaves an intent under way alone");
        drop(intent);
        assert!(!temp.exists(), "an abandoned intent removes its path");

        let kept = scratch.path().join(".g.x-2.silo-tmp");
        let intent = global().intend(kept.clone());
        std::fs::write(&kept, b"whole").unwrap();
        intent.done();
        assert!(kept.exists());
    }
}
