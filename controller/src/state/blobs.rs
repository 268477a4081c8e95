//! Holds on the blobs of a fleet's shared store, and the deletions under
//! way, so that garbage collection on one host never deletes a blob a
//! snapshot on another is about to name.
//!
//! The race it closes: a host taking a snapshot finds a blob already in the
//! bucket (a layer another snapshot had, since deleted) and does not send
//! it again; gc elsewhere, which found that blob named by nothing, deletes
//! it; the snapshot is then recorded naming a blob that is gone. So:
//! - a snapshot *holds* each blob it will name, in a transaction that also
//!   finds whether gc is deleting it, before it looks in the bucket; it
//!   waits out a deletion under way and then sends the blob itself;
//! - gc *dooms* the blobs it will delete, in a transaction that reads the
//!   names and the holds, then deletes them from the bucket, then forgets
//!   the deletions.
//!
//! The two transactions read what the other writes, so on PostgreSQL
//! (serializable) one of two racing ones fails and runs again, seeing the
//! other's row; on SQLite they take turns. Either way a held blob is never
//! doomed, and a doomed one is never held until it is gone. A hold older
//! than [`HOLD_TTL_MS`] was left by a process that died, and holds nothing;
//! so does a deletion older than [`DELETION_TTL_MS`] (a gc that died half
//! way), after which a snapshot that wants the blob sends it again if the
//! bucket lost it.

use super::snapshots::named_blobs_in;
use super::sql::{Param, Sql, args};
use super::{StateDb, StateError, db, now_ms};

/// How long a hold keeps its blob from gc: far longer than any snapshot
/// takes to record.
pub const HOLD_TTL_MS: i64 = 60 * 60 * 1000;
/// How long a deletion keeps snapshots that want its blob waiting: far
/// longer than gc takes to delete what it doomed.
pub const DELETION_TTL_MS: i64 = 10 * 60 * 1000;

impl StateDb {
    /// Holds `digests` for `holder`; answers those gc is deleting now,
    /// which are not held (wait, and hold them again).
    pub fn hold_blobs(
        &mut self,
        holder: &str,
        digests: &[String],
    ) -> Result<Vec<String>, StateError> {
        let what = "holding blobs";
        let now = now_ms();
        self.write(what, |tx| {
            let doomed = deleting(tx, digests, now)?;
            for digest in digests.iter().filter(|d| !doomed.contains(d)) {
                tx.execute(
                    "INSERT INTO blob_holds (digest, holder, at) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (digest, holder) DO UPDATE SET at = excluded.at",
                    args![digest, holder, now],
                )
                .map_err(db(what))?;
            }
            Ok(doomed)
        })
    }

    /// Lets go of every blob `holder` holds.
    pub fn release_blobs(&mut self, holder: &str) -> Result<(), StateError> {
        let what = "releasing blobs";
        self.write(what, |tx| {
            tx.execute("DELETE FROM blob_holds WHERE holder = ?1", args![holder])
                .map(drop)
                .map_err(db(what))
        })
    }

    /// Of `candidates` (blobs in the shared store), marks for deletion
    /// those no row names and no live hold holds, and answers them.
    pub fn doom_blobs(&mut self, candidates: &[String]) -> Result<Vec<String>, StateError> {
        let what = "marking blobs for deletion";
        let now = now_ms();
        self.write(what, |tx| {
            let named = named_blobs_in(tx)?;
            let held = held(tx, now)?;
            let doomed: Vec<String> = candidates
                .iter()
                .filter(|d| !named.contains(*d) && !held.contains(*d))
                .cloned()
                .collect();
            for digest in &doomed {
                tx.execute(
                    "INSERT INTO blob_deletions (digest, at) VALUES (?1, ?2) \
                     ON CONFLICT (digest) DO UPDATE SET at = excluded.at",
                    args![digest, now],
                )
                .map_err(db(what))?;
            }
            Ok(doomed)
        })
    }

    /// Forgets the deletions of `digests`, which are gone from the store.
    pub fn forget_deletions(&mut self, digests: &[String]) -> Result<(), StateError> {
        let what = "forgetting deletions";
        self.write(what, |tx| {
            for digest in digests {
                tx.execute(
                    "DELETE FROM blob_deletions WHERE digest = ?1",
                    args![digest],
                )
                .map_err(db(what))?;
            }
            Ok(())
        })
    }
}

/// Of `digests`, those gc is deleting now.
fn deleting(tx: &dyn Sql, digests: &[String], now: i64) -> Result<Vec<String>, StateError> {
    let what = "reading deletions";
    if digests.is_empty() {
        return Ok(Vec::new());
    }
    let wanted: Vec<String> = (2..digests.len() + 2).map(|n| format!("?{n}")).collect();
    let since = now - DELETION_TTL_MS;
    let mut params = vec![Param::Int(since)];
    params.extend(digests.iter().map(|d| Param::Text(d)));
    tx.query(
        &format!(
            "SELECT digest FROM blob_deletions WHERE at > ?1 AND digest IN ({})",
            wanted.join(", ")
        ),
        &params,
    )
    .map_err(db(what))?
    .iter()
    .map(|row| row.get(0).map_err(db(what)))
    .collect()
}

/// Every blob a live hold holds.
fn held(tx: &dyn Sql, now: i64) -> Result<std::collections::BTreeSet<String>, StateError> {
    let what = "reading holds";
    tx.query(
        "SELECT DISTINCT digest FROM blob_holds WHERE at > ?1",
        args![now - HOLD_TTL_MS],
    )
    .map_err(db(what))?
    .iter()
    .map(|row| row.get(0).map_err(db(what)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::test_support::temp_dbs;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_held_blob_is_never_doomed_and_a_doomed_one_is_not_held() {
        for (_scratch, mut db) in temp_dbs() {
            assert!(db.hold_blobs("a:1:t", &strings(&["x"])).unwrap().is_empty());
            assert_eq!(db.doom_blobs(&strings(&["x", "y"])).unwrap(), ["y"]);
            // y is being deleted: a snapshot that wants it waits.
            assert_eq!(
                db.hold_blobs("b:2:t", &strings(&["y", "z"])).unwrap(),
                ["y"]
            );
            db.forget_deletions(&strings(&["y"])).unwrap();
            assert!(db.hold_blobs("b:2:t", &strings(&["y"])).unwrap().is_empty());
            assert!(
                db.doom_blobs(&strings(&["x", "y", "z"]))
                    .unwrap()
                    .is_empty()
            );
            db.release_blobs("a:1:t").unwrap();
            db.release_blobs("b:2:t").unwrap();
            assert_eq!(
                db.doom_blobs(&strings(&["x", "y", "z"])).unwrap(),
                ["x", "y", "z"]
            );
            // A hold left by a process that died holds nothing.
            db.forget_deletions(&strings(&["x", "y", "z"])).unwrap();
            db.hold_blobs("dead:3:t", &strings(&["x"])).unwrap();
            db.sql()
                .execute(
                    "UPDATE blob_holds SET at = ?1",
                    args![now_ms() - HOLD_TTL_MS - 1],
                )
                .unwrap();
            assert_eq!(db.doom_blobs(&strings(&["x"])).unwrap(), ["x"]);
        }
    }
}
