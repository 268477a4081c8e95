//! The upper layer of a container's overlay file system, read from the
//! host: where every change the container made lives (Docker's and
//! Podman's `overlay2`, `overlay` and `fuse-overlayfs` storage drivers).
//! A directory the container changed anything below (a file written,
//! made, deleted or copied up) is in it, with every directory above it, so
//! its directories are the walk hint a snapshot hands the agent
//! ([`WalkHint`]): the agent need not read a directory outside them.
//!
//! The hint is read whole or not at all: an upper layer the host cannot
//! read (another user's, a remote engine's, a name that is not UTF-8) gives
//! none, and the agent walks everything.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use bollard::models::DriverData;
use silo_protocol::snapshot::WalkHint;

/// Storage drivers whose containers are overlays with an upper layer.
const OVERLAY_DRIVERS: &[&str] = &["overlay2", "overlay", "fuse-overlayfs"];
/// Most directories a hint lists; an upper layer with more gives none (the
/// request carrying it stays well under its body cap).
pub const MAX_HINT_DIRS: usize = 200_000;

/// A container's upper layer, by its path on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpperLayer(PathBuf);

impl UpperLayer {
    /// The upper layer the engine reports for a container, if its driver
    /// is an overlay and the path is absolute.
    pub(super) fn of(driver: Option<&DriverData>) -> Option<Self> {
        let driver = driver?;
        if !OVERLAY_DRIVERS.contains(&driver.name.as_str()) {
            return None;
        }
        let path = PathBuf::from(driver.data.get("UpperDir")?);
        path.is_absolute().then_some(Self(path))
    }

    /// The hint it gives now (blocking): its directories, and a moment
    /// `margin_ns` before they were read. `None` if it cannot be read
    /// whole.
    pub fn hint(&self, margin_ns: i64) -> Option<WalkHint> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
        let since_ns = i64::try_from(now.as_nanos())
            .ok()?
            .saturating_sub(margin_ns);
        match directories(&self.0) {
            Ok(Some(dirs)) => Some(WalkHint { dirs, since_ns }),
            Ok(None) => None,
            Err(err) => {
                tracing::debug!(upper = %self.0.display(), %err, "no walk hint: the upper layer cannot be read");
                None
            }
        }
    }
}

/// Every directory under `top`, relative to it (`""` for `top`); `None`
/// when a name is not UTF-8 or there are more than [`MAX_HINT_DIRS`].
fn directories(top: &Path) -> io::Result<Option<Vec<String>>> {
    let mut dirs = vec![String::new()];
    let mut next = 0;
    while let Some(rel) = dirs.get(next).cloned() {
        next += 1;
        for entry in fs::read_dir(top.join(&rel))? {
            let entry = entry?;
            if !entry.file_type()?.is_dir() {
                continue;
            }
            let Ok(name) = entry.file_name().into_string() else {
                return Ok(None);
            };
            dirs.push(match rel.is_empty() {
                true => name,
                false => format!("{rel}/{name}"),
            });
            if dirs.len() > MAX_HINT_DIRS {
                return Ok(None);
            }
        }
    }
    Ok(Some(dirs))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn only_overlay_drivers_have_an_upper_layer() {
        let driver = |name: &str, upper: &str| DriverData {
            name: name.to_owned(),
            data: HashMap::from([("UpperDir".to_owned(), upper.to_owned())]),
        };
        assert!(UpperLayer::of(Some(&driver("fuse-overlayfs", "/var/x/diff"))).is_some());
        assert!(UpperLayer::of(Some(&driver("overlay2", "/var/x/diff"))).is_some());
        assert!(UpperLayer::of(Some(&driver("btrfs", "/var/x/diff"))).is_none());
        assert!(UpperLayer::of(Some(&driver("overlay2", "relative"))).is_none());
        assert!(UpperLayer::of(None).is_none());
    }

    #[test]
    fn the_hint_lists_every_directory_and_none_when_a_name_is_not_utf8() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        fs::create_dir_all(dir.path().join("etc")).unwrap();
        fs::write(dir.path().join("usr/bin/new"), "x").unwrap();
        let upper = UpperLayer(dir.path().to_owned());
        let mut dirs = upper.hint(0).unwrap().dirs;
        dirs.sort();
        assert_eq!(dirs, ["", "etc", "usr", "usr/bin"]);
        let odd = std::ffi::OsStr::new(std::str::from_utf8(b"ok").unwrap()).to_owned();
        fs::create_dir_all(dir.path().join(odd)).unwrap();
        use std::os::unix::ffi::OsStrExt;
        fs::create_dir_all(dir.path().join(std::ffi::OsStr::from_bytes(b"\xff"))).unwrap();
        assert!(upper.hint(0).is_none());
        let gone = UpperLayer(dir.path().join("missing"));
        assert!(gone.hint(0).is_none());
    }
}
