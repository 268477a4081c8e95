//! `silo diff`: what differs between a sandbox's live tree and one of its
//! snapshots (by default its latest that no diff took), path by path. The live tree is
//! captured first, as a snapshot like any other (message `silo diff`, a
//! checkpoint the sandbox can be rewound to), so both sides are stored
//! trees and every path is compared exactly, bytes included, from the
//! store alone (`store::diff`).

use serde::Serialize;

use super::{SnapshotError, blocking, digests, no_progress};
use crate::silo::{Silo, SiloError};
use crate::store::{PathChange, diff};

/// The message of the snapshot a diff takes of the live tree.
pub const DIFF_MESSAGE: &str = "silo diff";

/// What differs between a sandbox's live tree and a snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    /// The sandbox's name.
    pub sandbox: String,
    /// The snapshot compared with.
    pub snapshot: String,
    /// The snapshot taken of the live tree.
    pub live: String,
    /// Every path that differs, sorted: added and removed are from the
    /// snapshot's tree to the live one.
    pub paths: Vec<DiffedPath>,
}

/// One path that differs.
#[derive(Debug, Clone, Serialize)]
pub struct DiffedPath {
    /// Absolute; bytes that are not UTF-8 shown as U+FFFD.
    pub path: String,
    /// How it differs.
    #[serde(flatten)]
    pub change: PathChange,
}

impl Silo {
    /// What differs between sandbox `name_or_id`'s live tree and
    /// `snapshot` (when `None`, its latest that no diff took); see the
    /// module docs.
    pub async fn diff(
        &self,
        name_or_id: &str,
        snapshot: Option<&str>,
    ) -> Result<DiffReport, SiloError> {
        let sandbox = self.get(name_or_id)?;
        let target = match snapshot {
            Some(id) => self.db().snapshot(id)?,
            // The latest a diff did not take: a diff after a diff compares
            // with what the user took, not with the last diff's capture.
            None => self
                .snapshots(Some(&sandbox.id))?
                .into_iter()
                .rev()
                .find(|snapshot| snapshot.message.as_deref() != Some(DIFF_MESSAGE))
                .ok_or_else(|| SnapshotError::NoSnapshots {
                    name: sandbox.name.clone(),
                })?,
        };
        let live = self
            .snapshot(&sandbox.id, Some(DIFF_MESSAGE.to_owned()), &no_progress())
            .await?
            .snapshot;
        let store = self.store()?;
        let (from, to) = (digests(&target.layers)?, digests(&live.layers)?);
        let found = blocking(move || Ok(diff(&store, &from, &to)?)).await?;
        let paths = found
            .into_iter()
            .map(|found| DiffedPath {
                path: format!("/{}", String::from_utf8_lossy(&found.path)),
                change: found.change,
            })
            .collect();
        Ok(DiffReport {
            sandbox: sandbox.name,
            snapshot: target.id,
            live: live.id,
            paths,
        })
    }
}
