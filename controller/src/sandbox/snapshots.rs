//! Snapshots of one sandbox: take, list, rewind, fork. A thin view over
//! [`Silo`]'s snapshot engine, scoped to the sandbox it was made for.

use crate::silo::{RestoreReport, SnapshotReport, no_progress};
use crate::state::Snapshot;
use crate::{Silo, SiloError};

/// The snapshots of one sandbox.
#[derive(Debug, Clone)]
pub struct Snapshots {
    silo: Silo,
    sandbox_id: String,
}

impl Snapshots {
    pub(super) fn new(silo: Silo, sandbox_id: String) -> Self {
        Self { silo, sandbox_id }
    }

    /// Captures the sandbox's file system now, with an optional message.
    pub async fn take(&self, message: Option<String>) -> Result<SnapshotReport, SiloError> {
        self.silo
            .snapshot(&self.sandbox_id, message, &no_progress())
            .await
    }

    /// The sandbox's snapshots, oldest first.
    pub fn list(&self) -> Result<Vec<Snapshot>, SiloError> {
        self.silo.snapshots(Some(&self.sandbox_id))
    }

    /// Puts the sandbox back to `snapshot` (same id, mounts, network, env).
    pub async fn rewind(&self, snapshot: &str) -> Result<RestoreReport, SiloError> {
        self.silo
            .rewind(&self.sandbox_id, snapshot, &no_progress())
            .await
    }

    /// Makes a new sandbox `name` from `snapshot`; this one is untouched.
    pub async fn fork(&self, snapshot: &str, name: &str) -> Result<RestoreReport, SiloError> {
        self.silo.fork(snapshot, name, &no_progress()).await
    }
}
