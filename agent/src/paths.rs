//! The names of the agent's own places in a machine's file system, and
//! how a path relative to the root (bytes, as layers and trees hold it) is
//! named to the file system; at the floor of the agent: every module that
//! makes, skips or removes those places names them from here, and this
//! module imports nothing of the agent's.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The agent's own directory under the root (journals, staging, the
/// placed-layer record): never part of a layer, a snapshot or a rewind.
pub const STATE_DIR: &str = ".silo";

/// The directory beside a push root's mounts that holds their version
/// stores (`<root>/.versions/<mount>/<version>`).
pub const STORE_DIR: &str = ".versions";

/// A relative path of bytes (a layer's, a kept tree's) as the file system
/// names it: a name is bytes on Linux, UTF-8 or not.
pub fn as_path(path: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(path))
}
