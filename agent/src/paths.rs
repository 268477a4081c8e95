//! The names of the agent's own places in a machine's file system, at the
//! floor of the agent: every module that makes, skips or removes them
//! names them from here, and this module imports nothing.

/// The agent's own directory under the root (journals, staging, the
/// placed-layer record): never part of a layer, a snapshot or a rewind.
pub const STATE_DIR: &str = ".silo";

/// The directory beside a push root's mounts that holds their version
/// stores (`<root>/.versions/<mount>/<version>`).
pub const STORE_DIR: &str = ".versions";
