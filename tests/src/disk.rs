//! A small file system of a test's own (a tmpfs), for what silo does when
//! its disk fills up. Mounting needs root: without it a test under CI fails,
//! since a green run must mean the full-disk paths ran; elsewhere it is
//! skipped with the reason printed.

use std::path::Path;

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::docker::in_ci;

/// A tmpfs of a fixed size, unmounted (lazily, so a straggler cannot keep
/// it) when dropped.
pub struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts a tmpfs of `bytes` on a fresh directory, or `None` (with the
    /// reason printed) when this process may not mount and this is not CI.
    pub fn mount(bytes: u64) -> Option<Self> {
        let dir = tempfile::Builder::new()
            .prefix("silo-small-disk-")
            .tempdir()
            .expect("tempdir");
        let options = format!("size={bytes},mode=0700");
        match mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        ) {
            Ok(()) => Some(Self { dir }),
            Err(errno) if in_ci() => {
                panic!("CI=true but a tmpfs cannot be mounted here (root is needed): {errno}")
            }
            Err(errno) => {
                eprintln!("skipping: cannot mount a tmpfs ({errno}); CI=true makes this fail");
                None
            }
        }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = umount2(self.dir.path(), MntFlags::MNT_DETACH);
    }
}
