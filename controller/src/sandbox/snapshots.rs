//! Snapshots of one sandbox: take, list, diff, rewind. The one way a caller
//! reaches [`Silo`]'s snapshot engine for a sandbox, whether it holds a
//! [`crate::Sandbox`] (its `snapshots()`) or only a name
//! ([`Silo::snapshots_of`]). A fork starts from a snapshot, whatever became
//! of its sandbox, so it is [`Silo::fork`].

use crate::silo::{DiffReport, RestoreReport, SnapshotProgressFn, SnapshotReport, no_progress};
use crate::state::Snapshot;
use crate::{Silo, SiloError};

/// The snapshots of one sandbox.
#[derive(Clone)]
pub struct Snapshots {
    silo: Silo,
    sandbox_id: String,
    progress: SnapshotProgressFn,
}

impl std::fmt::Debug for Snapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshots")
            .field("sandbox_id", &self.sandbox_id)
            .finish_non_exhaustive()
    }
}

impl Snapshots {
    pub(crate) fn new(silo: Silo, sandbox_id: String) -> Self {
        Self {
            silo,
            sandbox_id,
            progress: no_progress(),
        }
    }

    /// Reports the long steps of what follows (storing a base, loading an
    /// image) to `progress`, for progress bars.
    pub fn with_progress(mut self, progress: SnapshotProgressFn) -> Self {
        self.progress = progress;
        self
    }

    /// Captures the sandbox's file system now, with an optional message
    /// (starting the sandbox first if it is stopped).
    pub async fn take(&self, message: Option<String>) -> Result<SnapshotReport, SiloError> {
        self.silo
            .snapshot(&self.sandbox_id, message, &self.progress)
            .await
    }

    /// The sandbox's snapshots, oldest first.
    pub fn list(&self) -> Result<Vec<Snapshot>, SiloError> {
        self.silo.snapshots(Some(&self.sandbox_id))
    }

    /// What differs between the sandbox's live tree and `snapshot` (its
    /// latest when `None`), path by path; the live tree is captured as a
    /// snapshot first.
    pub async fn diff(&self, snapshot: Option<&str>) -> Result<DiffReport, SiloError> {
        self.silo.diff(&self.sandbox_id, snapshot).await
    }

    /// Puts the sandbox back to `snapshot` (same id, mounts, network, env).
    pub async fn rewind(&self, snapshot: &str) -> Result<RestoreReport, SiloError> {
        self.silo
            .rewind(&self.sandbox_id, snapshot, &self.progress)
            .await
    }
}

impl Silo {
    /// The snapshots of sandbox `name_or_id`, whether or not it runs (a
    /// snapshot starts it; a rewind makes its machine again).
    pub fn snapshots_of(&self, name_or_id: &str) -> Result<Snapshots, SiloError> {
        let sandbox = self.get(name_or_id)?;
        Ok(Snapshots::new(self.clone(), sandbox.id))
    }
}
