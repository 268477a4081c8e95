//! Push: files from the host become the tree at a mount path in one or many
//! sandboxes, each all at once or not at all.
//!
//! The controller's half of the push channel. A [`FileSet`] (from
//! [`files_from_dir`] or built in memory) becomes a bundle with the
//! deterministic builder of `silo_protocol::bundle`, once per distinct set;
//! [`push_to_sandbox`] sends one bundle to one agent with retries, and
//! [`push_all`] does that for many agents at once under a concurrency bound
//! and gathers every outcome. The agent does the checking, extracting and
//! swapping; `Silo::push_to_sandboxes` ties this to sandboxes and the event log.
//!
//! # Layout
//! - `files`: a directory as a [`FileSet`], refusing what cannot be pushed.
//! - `send`: one push to one agent, and the retry policy.
//! - `fanout`: many pushes at once, progress, and the aggregate report.

mod fanout;
mod files;
mod send;

use bytes::Bytes;
use silo_protocol::bundle::{Bundle, BundleError, BundleLimits, FileSet};

pub use fanout::{
    DEFAULT_CONCURRENCY, Job, PushEvent, PushFailure, PushOptions, PushProgressFn, PushReport,
    push_all,
};
pub use files::{FilesError, files_from_dir};
pub use send::{
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_RETRY_BUDGET, GoneProbe, RetryPolicy, push_to_sandbox,
};

/// A built bundle, shared by every push that sends it (the bytes are
/// reference-counted, so a fan-out never copies them).
#[derive(Debug, Clone)]
pub struct SharedBundle {
    /// The tar.gz bytes.
    pub bytes: Bytes,
    /// Hex SHA-256 of `bytes`.
    pub sha256: String,
    /// Regular files in it.
    pub files: u64,
    /// Tar entries in it, declared to the agent so it can refuse at once.
    pub entries: u64,
    /// Their total size unpacked.
    pub unpacked_bytes: u64,
}

impl From<Bundle> for SharedBundle {
    fn from(bundle: Bundle) -> Self {
        Self {
            bytes: Bytes::from(bundle.bytes),
            sha256: bundle.sha256,
            files: bundle.files,
            entries: bundle.entries,
            unpacked_bytes: bundle.unpacked_bytes,
        }
    }
}

/// Builds the bundle of `files` on a blocking thread (it reads and compresses).
pub async fn build_bundle(files: FileSet, limits: BundleLimits) -> Result<SharedBundle, PushError> {
    tokio::task::spawn_blocking(move || Bundle::build(&files, &limits))
        .await
        .map_err(|e| PushError::Task(e.to_string()))?
        .map(SharedBundle::from)
        .map_err(PushError::Bundle)
}

/// Why a push could not even start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PushError {
    /// The files to push cannot be read as a tree.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The bundle cannot be built (a file over a limit, unreadable, ...).
    #[error("cannot build the bundle")]
    Bundle(#[source] BundleError),
    /// A background task failed.
    #[error("push task failed: {0}")]
    Task(String),
}
