//! Rewinds in place whose restoring layer was sent to the agent but whose
//! outcome is not recorded yet. One is written before the layer goes out
//! and removed in the transaction that records the rewind (or the machine
//! replaced, or the sandbox removed), so a row outlives only a client that
//! died in between; whoever opens the sandbox next settles it
//! (`silo::snapshot::settle`).

use super::sql::{Sql, args};
use super::{StateDb, StateError, db};

/// A rewind whose layer was sent, as recorded before it went out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRewind {
    /// The sandbox rewound.
    pub sandbox_id: String,
    /// The snapshot it went back to.
    pub snapshot: String,
    /// Hex SHA-256 of the restoring layer sent.
    pub layer_sha256: String,
    /// A fork onto a pool member, which records the snapshot as its origin.
    pub fork: bool,
    /// Unix ms when the layer was about to be sent.
    pub at_ms: i64,
}

impl StateDb {
    /// Records that `pending`'s layer is about to be sent.
    pub fn begin_pending_rewind(&mut self, pending: &PendingRewind) -> Result<(), StateError> {
        self.write("recording a rewind under way", |tx| {
            tx.execute(
                "INSERT INTO pending_rewinds \
                 (sandbox_id, snapshot, layer_sha256, fork, at) VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (sandbox_id) DO UPDATE SET snapshot = excluded.snapshot, \
                 layer_sha256 = excluded.layer_sha256, fork = excluded.fork, at = excluded.at",
                args![
                    pending.sandbox_id,
                    pending.snapshot,
                    pending.layer_sha256,
                    pending.fork,
                    pending.at_ms
                ],
            )
            .map(drop)
            .map_err(db("recording a rewind under way"))
        })
    }

    /// The rewind under way on `sandbox_id`, if one was left unsettled.
    pub fn pending_rewind(&self, sandbox_id: &str) -> Result<Option<PendingRewind>, StateError> {
        let what = "reading a rewind under way";
        let Some(row) = self
            .sql()
            .query_opt(
                "SELECT sandbox_id, snapshot, layer_sha256, fork, at FROM pending_rewinds \
                 WHERE sandbox_id = ?1",
                args![sandbox_id],
            )
            .map_err(db(what))?
        else {
            return Ok(None);
        };
        Ok(Some(PendingRewind {
            sandbox_id: row.get(0).map_err(db(what))?,
            snapshot: row.get(1).map_err(db(what))?,
            layer_sha256: row.get(2).map_err(db(what))?,
            fork: row.get(3).map_err(db(what))?,
            at_ms: row.get(4).map_err(db(what))?,
        }))
    }

    /// Forgets the rewind under way on `sandbox_id` (its layer never went in).
    pub fn clear_pending_rewind(&mut self, sandbox_id: &str) -> Result<(), StateError> {
        self.write("forgetting a rewind under way", |tx| {
            clear_in(tx, sandbox_id)
        })
    }
}

/// Removes `sandbox_id`'s pending rewind inside a transaction that records
/// its outcome.
pub(super) fn clear_in(tx: &dyn Sql, sandbox_id: &str) -> Result<(), StateError> {
    tx.execute(
        "DELETE FROM pending_rewinds WHERE sandbox_id = ?1",
        args![sandbox_id],
    )
    .map(drop)
    .map_err(db("forgetting a rewind under way"))
}
