//! Mount paths: which ones a push may name, and where they live on disk.
//!
//! A mount path is checked lexically first (absolute, plain components,
//! strictly under an allowed push root, not inside a version store), so a
//! refused one costs no syscall. [`prepare`] then walks from the push root to
//! the mount's parent, creating missing directories and refusing any
//! component that is a symlink or not a directory, so a push can never be
//! steered outside the root through a link planted in the tree.
//!
//! With `--push-base DIR` (the local backend, where the agent is a host
//! process with no private `/`), mount `/a/b` lives at `DIR/a/b`; in a
//! container the base is `/`.

use std::io;
use std::path::{Component, Path, PathBuf};

use super::PushConfig;
use super::store::VersionId;
use crate::fs_error::FsError;
use crate::paths::STORE_DIR;

/// A mount path that passed the lexical checks, with its place on disk.
#[derive(Debug, Clone)]
pub struct Mount {
    /// The path as the request named it.
    pub path: String,
    /// The allowed root it lies under, as requests name it.
    root_path: PathBuf,
    /// Physical directory of that root.
    root: PathBuf,
    /// Components from the root to the mount's parent.
    between: Vec<String>,
    /// The mount's last component: the name of the link.
    pub name: String,
}

impl Mount {
    /// The physical parent directory of the mount.
    pub fn parent(&self) -> PathBuf {
        let mut dir = self.root.clone();
        dir.extend(&self.between);
        dir
    }

    /// The physical path of the mount (the symlink).
    pub fn link(&self) -> PathBuf {
        self.parent().join(&self.name)
    }

    /// The mount's version store: `<parent>/.versions/<name>/`.
    pub fn store(&self) -> PathBuf {
        self.parent().join(STORE_DIR).join(&self.name)
    }
}

/// Checks `path` against the allowed roots, without touching the disk.
pub fn resolve(path: &str, config: &PushConfig) -> Result<Mount, MountError> {
    let invalid = |reason: &'static str| MountError::Invalid {
        path: path.to_owned(),
        reason,
    };
    if !path.starts_with('/') {
        return Err(invalid("not an absolute path"));
    }
    let mut components = Vec::new();
    for part in path.split('/').skip(1) {
        match part {
            "" => return Err(invalid("empty path component")),
            "." | ".." => return Err(invalid("'.' and '..' are not allowed")),
            STORE_DIR => return Err(invalid("lies inside a version store")),
            _ => components.push(part.to_owned()),
        }
    }
    for root in &config.roots {
        let root_parts: Vec<String> = root
            .components()
            .filter_map(|c| match c {
                Component::Normal(part) => Some(part.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        if components.len() > root_parts.len() && components.starts_with(&root_parts) {
            let mut between = components[root_parts.len()..].to_vec();
            let name = between.pop().unwrap_or_default();
            return Ok(Mount {
                path: path.to_owned(),
                root_path: root.clone(),
                root: physical(&config.base, root),
                between,
                name,
            });
        }
    }
    Err(MountError::NotAllowed {
        path: path.to_owned(),
        roots: config
            .roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Where virtual path `path` lives under `base`.
pub fn physical(base: &Path, path: &Path) -> PathBuf {
    let mut out = base.to_path_buf();
    out.extend(
        path.components()
            .filter(|c| matches!(c, Component::Normal(_))),
    );
    out
}

/// What is at the mount now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Live {
    /// Nothing: this is the mount's first push.
    Nothing,
    /// Our link, pointing at this version.
    Version(VersionId),
}

/// Creates the directories down to the mount's version store and reports
/// what is live. Refuses symlinks and non-directories on the way, and
/// anything at the mount itself that silo did not put there.
pub fn prepare(mount: &Mount) -> Result<Live, MountError> {
    std::fs::create_dir_all(&mount.root).map_err(FsError::at("create", &mount.root))?;
    let mut dir = mount.root.clone();
    let mut shown = mount.root_path.clone();
    for part in &mount.between {
        dir.push(part);
        shown.push(part);
        ensure_real_dir(&dir, &shown, mount)?;
    }
    let live = inspect_link(mount)?;
    // The store is made only once the mount is known to be ours (or free),
    // so a refused push leaves nothing behind.
    let mut store = dir;
    for part in [STORE_DIR, mount.name.as_str()] {
        store.push(part);
        shown.push(part);
        ensure_real_dir(&store, &shown, mount)?;
    }
    Ok(live)
}

fn inspect_link(mount: &Mount) -> Result<Live, MountError> {
    let link = mount.link();
    match std::fs::symlink_metadata(&link) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(Live::Nothing),
        Err(err) => Err(FsError::new("inspect", &link, err).into()),
        Ok(meta) if meta.file_type().is_symlink() => {
            let target = std::fs::read_link(&link).map_err(FsError::at("read", &link))?;
            let expected = Path::new(STORE_DIR).join(&mount.name);
            target
                .strip_prefix(&expected)
                .ok()
                .and_then(|rest| rest.to_str())
                .and_then(VersionId::parse)
                .map(Live::Version)
                .ok_or_else(|| MountError::Conflict {
                    path: mount.path.clone(),
                    reason: "is a symlink that silo did not make",
                })
        }
        Ok(_) => Err(MountError::Conflict {
            path: mount.path.clone(),
            reason: "already exists and is not managed by silo; move it away first \
                     (silo never deletes data it did not push)",
        }),
    }
}

/// Makes `dir` (shown to callers as `shown`) a real directory, or says
/// which path stands in the way, since that is the one a user must move.
fn ensure_real_dir(dir: &Path, shown: &Path, mount: &Mount) -> Result<(), MountError> {
    let blocked = |reason| MountError::Blocked {
        path: mount.path.clone(),
        at: shown.display().to_string(),
        reason,
    };
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(meta) if meta.file_type().is_symlink() => Err(blocked("is a symlink")),
        Ok(_) => Err(blocked("is not a directory")),
        Err(err) if err.kind() == io::ErrorKind::NotFound => match std::fs::create_dir(dir) {
            Ok(()) => Ok(()),
            // Made by someone else meanwhile: look again.
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                ensure_real_dir(dir, shown, mount)
            }
            Err(err) => Err(FsError::new("create", dir, err).into()),
        },
        Err(err) => Err(FsError::new("inspect", dir, err).into()),
    }
}

/// Why a mount path cannot be pushed to.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// Not a plain absolute path.
    #[error("mount path {path:?} is invalid: {reason}")]
    Invalid {
        /// The path.
        path: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Not under an allowed root.
    #[error("mount path {path:?} is not under an allowed push root ({roots})")]
    NotAllowed {
        /// The path.
        path: String,
        /// The allowed roots.
        roots: String,
    },
    /// Something silo does not manage is in the way.
    #[error("mount path {path:?} {reason}")]
    Conflict {
        /// The path.
        path: String,
        /// What is in the way.
        reason: &'static str,
    },
    /// A directory on the way to the mount or its version store is a
    /// symlink or a file, which a push never follows or replaces.
    #[error(
        "mount path {path:?} cannot be used: {at:?} {reason}; silo writes only through \
         real directories, so move {at:?} away or push to another path"
    )]
    Blocked {
        /// The mount path.
        path: String,
        /// The path that stands in the way.
        at: String,
        /// What it is.
        reason: &'static str,
    },
    /// A file system operation failed.
    #[error(transparent)]
    Io(#[from] FsError),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn config(base: &Path) -> PushConfig {
        PushConfig {
            roots: vec![PathBuf::from("/workspace/managed")],
            base: base.to_path_buf(),
            ..PushConfig::default()
        }
    }

    #[test]
    fn only_plain_paths_under_a_root_are_accepted() {
        let c = config(Path::new("/"));
        let m = resolve("/workspace/managed/a/app", &c).unwrap();
        assert_eq!(m.link(), Path::new("/workspace/managed/a/app"));
        assert_eq!(m.store(), Path::new("/workspace/managed/a/.versions/app"));
        for bad in [
            "/workspace/managed",
            "/workspace/managedx/app",
            "/etc/app",
            "relative/app",
        ] {
            assert!(
                matches!(
                    resolve(bad, &c),
                    Err(MountError::NotAllowed { .. } | MountError::Invalid { .. })
                ),
                "{bad}"
            );
        }
        for bad in [
            "/workspace/managed/../etc",
            "/workspace/managed//app",
            "/workspace/managed/.versions/x",
            "/workspace/managed/app/",
        ] {
            assert!(
                matches!(resolve(bad, &c), Err(MountError::Invalid { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn prepare_refuses_what_silo_did_not_make() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path());
        let m = resolve("/workspace/managed/sub/app", &c).unwrap();
        assert_eq!(prepare(&m).unwrap(), Live::Nothing);
        assert!(m.store().is_dir());
        assert!(m.link().starts_with(dir.path()));

        std::fs::create_dir(m.link()).unwrap();
        assert!(matches!(prepare(&m), Err(MountError::Conflict { .. })));
        std::fs::remove_dir(m.link()).unwrap();
        std::os::unix::fs::symlink("/etc", m.link()).unwrap();
        assert!(matches!(prepare(&m), Err(MountError::Conflict { .. })));

        let outside = tempfile::tempdir().unwrap();
        let root = dir.path().join("workspace/managed");
        std::os::unix::fs::symlink(outside.path(), root.join("evil")).unwrap();
        let m = resolve("/workspace/managed/evil/app", &c).unwrap();
        let err = prepare(&m).unwrap_err();
        assert!(
            matches!(&err, MountError::Blocked { at, .. } if at == "/workspace/managed/evil"),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_symlinked_version_store_is_named_in_the_refusal() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path());
        let m = resolve("/workspace/managed/app", &c).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("workspace/managed")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), m.parent().join(STORE_DIR)).unwrap();
        let err = prepare(&m).unwrap_err();
        assert!(
            matches!(&err, MountError::Blocked { at, .. } if at == "/workspace/managed/.versions"),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("\"/workspace/managed/.versions\" is a symlink")
        );
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }
}
