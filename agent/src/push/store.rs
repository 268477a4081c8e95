//! The version store of a mount and the atomic swap.
//!
//! Mount `<parent>/<name>` is a symlink to `.versions/<name>/<id>` (relative,
//! so the tree survives being bind-mounted elsewhere). A push extracts into
//! `.versions/<name>/.partial-<boot>-<n>/`, renames that to its version id
//! once complete and verified, then points the mount at it by creating a
//! temporary link `.versions/<name>/.link-<boot>-<n>` and exchanging it with
//! the mount's link (`renameat2(RENAME_EXCHANGE)`), then removing the
//! temporary, which now holds the old link. A reader resolving the mount
//! path at any moment finds the old tree or the new one, never nothing:
//! plain `rename(2)` over a link is not atomic on every file system
//! (fuse-overlayfs, the rootless engines' storage driver, lets a reader
//! find no link at all now and then), while an exchange is. Where the
//! mount has no link yet, or the file system cannot exchange, the link is
//! renamed into place.
//!
//! Retired versions stay for a grace period so readers that resolved the old
//! link can finish, and at most `keep` of them are kept whatever their age.
//! Names carry the boot id of the agent that made them, so a new agent can
//! tell an interrupted extract of a previous boot ([`clean_leftovers`]) from
//! one in progress.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::fs_error::FsError;

use crate::paths::STORE_DIR;
/// Prefix of an extract in progress.
const PARTIAL_PREFIX: &str = ".partial-";
/// Prefix of a link about to be renamed over a mount.
const LINK_PREFIX: &str = ".link-";
/// How deep under a push root the start-up sweep looks for version stores:
/// mounts sit a few levels down, and a bound keeps a huge unrelated tree
/// under the root from slowing the sweep.
const LEFTOVER_SCAN_DEPTH: usize = 8;

/// A version's id, `<seq>-<sha256>`: ordered by `seq`, and naming the bundle
/// it holds so "unchanged" needs no other record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionId {
    /// Increases with every version of the mount.
    pub seq: u64,
    /// Hex SHA-256 of the bundle.
    pub sha256: String,
}

impl VersionId {
    /// Parses a directory name; `None` for anything that is not a version.
    pub fn parse(name: &str) -> Option<Self> {
        let (seq, sha256) = name.split_once('-')?;
        let valid = seq.len() == 6 || (seq.len() > 6 && !seq.starts_with('0'));
        let hex = silo_protocol::auth::is_sha256_hex(sha256);
        if !(valid && hex && seq.bytes().all(|b| b.is_ascii_digit())) {
            return None;
        }
        Some(Self {
            seq: seq.parse().ok()?,
            sha256: sha256.to_owned(),
        })
    }
}

impl std::fmt::Display for VersionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:06}-{}", self.seq, self.sha256)
    }
}

/// The versions in a store.
pub fn versions(store: &Path) -> io::Result<Vec<VersionId>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(store)? {
        let entry = entry?;
        if let Some(id) = entry.file_name().to_str().and_then(VersionId::parse) {
            out.push(id);
        }
    }
    out.sort_by_key(|id| id.seq);
    Ok(out)
}

/// The staging directory of the extract tagged `<boot_id>-<n>`.
pub fn staging_path(store: &Path, tag: &str) -> PathBuf {
    store.join(format!("{PARTIAL_PREFIX}{tag}"))
}

/// Renames a complete staging directory to its version id, then points the
/// mount's link at it. On failure nothing live has changed; the caller
/// removes whatever of `staging` or the version is left.
pub fn commit_and_swap(
    staging: &Path,
    store: &Path,
    link: &Path,
    name: &str,
    id: &VersionId,
    tmp_link_tag: &str,
) -> Result<PathBuf, FsError> {
    let version = store.join(id.to_string());
    std::fs::rename(staging, &version).map_err(FsError::at("rename", staging))?;
    let tmp = store.join(format!("{LINK_PREFIX}{tmp_link_tag}"));
    let target = Path::new(STORE_DIR).join(name).join(id.to_string());
    std::os::unix::fs::symlink(&target, &tmp).map_err(FsError::at("create", &tmp))?;
    if let Err(err) = swap_link(&tmp, link) {
        let _ = std::fs::remove_file(&tmp);
        return Err(FsError::new("swap", link, err));
    }
    // Make the swap itself durable; file data is not fsynced (see ARCHITECTURE.md).
    if let Some(parent) = link.parent() {
        if let Ok(dir) = std::fs::File::open(parent) {
            let _ = dir.sync_all();
        }
    }
    Ok(version)
}

/// Puts link `new` in the place of `link`: exchanged with it when `link`
/// is a link (so the path never names nothing), then `new`, holding the old
/// link, is removed; renamed over it otherwise.
fn swap_link(new: &Path, link: &Path) -> io::Result<()> {
    let is_link = std::fs::symlink_metadata(link).is_ok_and(|m| m.file_type().is_symlink());
    if is_link {
        match exchange(new, link) {
            Ok(()) => {
                // A leftover the start-up sweep removes if this fails.
                let _ = std::fs::remove_file(new);
                return Ok(());
            }
            // No exchange on this file system (or kernel): rename.
            Err(err) if matches!(err.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {}
            Err(err) => return Err(err),
        }
    }
    std::fs::rename(new, link)
}

/// `renameat2(a, b, RENAME_EXCHANGE)`: both paths stay, each naming what
/// the other did, in one step. Called through `syscall` because musl has no
/// wrapper for it.
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c_path = |path: &Path| {
        CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a path"))
    };
    let (a, b) = (c_path(a)?, c_path(b)?);
    // SAFETY: both pointers are to NUL-terminated strings that outlive the
    // call, and the kernel reads nothing else.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Removes retired versions: all but the newest `keep`, and any retired
/// longer than `grace`. `retired` maps a version to when it stopped being
/// live; a version it does not know (made by an earlier boot) counts as
/// retired `now`. Returns when the next one will be due, if any remain.
pub fn collect_garbage(
    store: &Path,
    live: Option<&VersionId>,
    retired: &mut BTreeMap<u64, Instant>,
    grace: Duration,
    keep: usize,
    now: Instant,
) -> Option<Instant> {
    let all = match versions(store) {
        Ok(all) => all,
        Err(err) => {
            tracing::warn!(store = %store.display(), %err, "cannot list versions for cleanup");
            return None;
        }
    };
    let mut old: Vec<VersionId> = all.into_iter().filter(|v| Some(v) != live).collect();
    // Newest first, so the first `keep` are the ones kept.
    old.sort_by_key(|v| std::cmp::Reverse(v.seq));
    let mut next_due: Option<Instant> = None;
    let mut still: BTreeMap<u64, Instant> = BTreeMap::new();
    for (index, version) in old.iter().enumerate() {
        let since = *retired.get(&version.seq).unwrap_or(&now);
        let due = since + grace;
        if index >= keep || due <= now {
            // Retried in the background until gone when a reader stops it.
            crate::cleanup::global().remove(&store.join(version.to_string()));
        } else {
            still.insert(version.seq, since);
            next_due = Some(next_due.map_or(due, |n| n.min(due)));
        }
    }
    *retired = still;
    next_due
}

/// Removes what interrupted pushes of earlier boots left in the version
/// stores under `roots`: partial extracts and temporary links. Never follows
/// a symlink and never leaves the roots.
pub fn clean_leftovers(roots: &[PathBuf], boot_id: &str) -> usize {
    let mut removed = 0;
    for root in roots {
        sweep(root, boot_id, 0, &mut removed);
    }
    removed
}

fn sweep(dir: &Path, boot_id: &str, depth: usize, removed: &mut usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        // DirEntry::file_type does not follow symlinks.
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if !kind.is_dir() {
            continue;
        }
        let path = entry.path();
        if entry.file_name() == STORE_DIR {
            for store in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                if store.file_type().is_ok_and(|k| k.is_dir()) {
                    sweep_store(&store.path(), boot_id, removed);
                }
            }
        } else if depth + 1 < LEFTOVER_SCAN_DEPTH {
            sweep(&path, boot_id, depth + 1, removed);
        }
    }
}

fn sweep_store(store: &Path, boot_id: &str, removed: &mut usize) {
    let ours = format!("{boot_id}-");
    for entry in std::fs::read_dir(store).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let Some(tag) = name
            .strip_prefix(PARTIAL_PREFIX)
            .or_else(|| name.strip_prefix(LINK_PREFIX))
        else {
            continue;
        };
        if tag.starts_with(&ours) {
            continue;
        }
        if crate::cleanup::global().remove(&entry.path()) {
            *removed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn id(seq: u64) -> VersionId {
        VersionId {
            seq,
            sha256: format!("{seq:064x}"),
        }
    }

    #[test]
    fn version_ids_round_trip_and_others_are_ignored() {
        let v = id(7);
        assert_eq!(VersionId::parse(&v.to_string()), Some(v));
        assert_eq!(
            VersionId::parse(&id(1_234_567).to_string()).unwrap().seq,
            1_234_567
        );
        for other in [".partial-x-1", "000001-abc", "1-", "0000001-00", "x"] {
            assert_eq!(VersionId::parse(other), None, "{other}");
        }
    }

    #[test]
    fn swap_then_collect_keeps_live_and_recent() {
        let dir = tempfile::tempdir().unwrap();
        let parent = dir.path();
        let store = parent.join(STORE_DIR).join("app");
        std::fs::create_dir_all(&store).unwrap();
        let link = parent.join("app");
        let mut retired = BTreeMap::new();
        let t0 = Instant::now();
        for seq in 1..=5 {
            let staging = staging_path(&store, &format!("boot-{seq}"));
            std::fs::create_dir(&staging).unwrap();
            std::fs::write(staging.join("f"), seq.to_string()).unwrap();
            commit_and_swap(
                &staging,
                &store,
                &link,
                "app",
                &id(seq),
                &format!("boot-{seq}"),
            )
            .unwrap();
            assert_eq!(
                std::fs::read_to_string(link.join("f")).unwrap(),
                seq.to_string()
            );
            if seq > 1 {
                retired.insert(seq - 1, t0);
            }
            // The exchange's temporary, holding the old link, is gone.
            let temporaries = std::fs::read_dir(&store)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(LINK_PREFIX))
                .count();
            assert_eq!(temporaries, 0);
            assert!(
                std::fs::symlink_metadata(&link)
                    .unwrap()
                    .file_type()
                    .is_symlink()
            );
        }
        let grace = Duration::from_secs(60);
        let next = collect_garbage(&store, Some(&id(5)), &mut retired, grace, 2, t0);
        assert_eq!(next, Some(t0 + grace));
        let left: Vec<u64> = versions(&store).unwrap().iter().map(|v| v.seq).collect();
        assert_eq!(left, [3, 4, 5]);
        let next = collect_garbage(&store, Some(&id(5)), &mut retired, grace, 2, t0 + grace);
        assert_eq!(next, None);
        let left: Vec<u64> = versions(&store).unwrap().iter().map(|v| v.seq).collect();
        assert_eq!(left, [5]);
    }

    #[test]
    fn leftovers_of_other_boots_go_and_ours_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("a/b").join(STORE_DIR).join("app");
        std::fs::create_dir_all(&store).unwrap();
        let old = staging_path(&store, "old-1");
        let ours = staging_path(&store, "new-1");
        std::fs::create_dir(&old).unwrap();
        std::fs::create_dir(&ours).unwrap();
        std::os::unix::fs::symlink("x", store.join(".link-old-2")).unwrap();
        std::fs::create_dir(store.join(id(1).to_string())).unwrap();
        assert_eq!(clean_leftovers(&[dir.path().to_path_buf()], "new"), 2);
        assert!(!old.exists() && ours.exists());
        assert!(store.join(id(1).to_string()).exists());
    }
}
