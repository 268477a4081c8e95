//! The hosts that use one state, and what they share.
//!
//! A host is recorded when it opens the state, and seen again at most once
//! a minute after that (so a command costs no write for it). On a fleet's
//! shared database the master key lives in `settings`, where the first host
//! to open the database puts one; every host then derives the same sandbox
//! keys, so any of them can reach a provider's VM another made.

use serde::Serialize;

use super::sql::args;
use super::{StateDb, StateError, db, now_ms};

/// How stale a host's `seen_at` may get before opening the state renews it.
const SEEN_EVERY_MS: i64 = 60_000;

/// The setting that holds a shared database's master key (hex).
const MASTER_KEY: &str = "master_key";

/// A host that has used this state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostRecord {
    /// Its name (`SILO_HOST`).
    pub name: String,
    /// When it last opened the state (unix ms, to the minute).
    pub seen_at_ms: i64,
}

impl StateDb {
    /// Records that `host` is using the state now, unless it was seen
    /// within the last minute.
    pub fn host_seen(&mut self, host: &str) -> Result<(), StateError> {
        let now = now_ms();
        let what = "recording this host";
        let seen: Option<i64> = self
            .sql()
            .query_opt("SELECT seen_at FROM hosts WHERE name = ?1", args![host])
            .map_err(db(what))?
            .map(|row| row.get(0))
            .transpose()
            .map_err(db(what))?;
        if seen.is_some_and(|at| now.saturating_sub(at) < SEEN_EVERY_MS) {
            return Ok(());
        }
        self.write(what, |tx| {
            tx.execute(
                "INSERT INTO hosts (name, seen_at) VALUES (?1, ?2) \
                 ON CONFLICT (name) DO UPDATE SET seen_at = excluded.seen_at",
                args![host, now],
            )
            .map(drop)
            .map_err(db(what))
        })
    }

    /// Every host that has used the state, by name.
    pub fn hosts(&self) -> Result<Vec<HostRecord>, StateError> {
        let what = "listing hosts";
        self.sql()
            .query("SELECT name, seen_at FROM hosts ORDER BY name", &[])
            .map_err(db(what))?
            .iter()
            .map(|row| {
                Ok(HostRecord {
                    name: row.get(0).map_err(db(what))?,
                    seen_at_ms: row.get(1).map_err(db(what))?,
                })
            })
            .collect()
    }

    /// The master key every host of this state shares (hex): the one
    /// recorded, else `candidate`, recorded now. Of two hosts racing to
    /// record one, both get the first.
    pub fn shared_master_key(&mut self, candidate: &str) -> Result<String, StateError> {
        let what = "reading the fleet's master key";
        self.write(what, |tx| {
            tx.execute(
                "INSERT INTO settings (name, value) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                args![MASTER_KEY, candidate],
            )
            .map_err(db(what))?;
            let row = tx
                .query_opt(
                    "SELECT value FROM settings WHERE name = ?1",
                    args![MASTER_KEY],
                )
                .map_err(db(what))?;
            match row {
                Some(row) => row.get(0).map_err(db(what)),
                None => Err(StateError::Corrupt {
                    id: MASTER_KEY.into(),
                    what: "the setting is missing after it was written".into(),
                }),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::state::test_support::temp_dbs;

    #[test]
    fn hosts_are_recorded_once_a_minute_and_share_one_key() {
        for (_scratch, mut db) in temp_dbs() {
            db.host_seen("a").unwrap();
            let first = db.hosts().unwrap();
            db.host_seen("a").unwrap();
            assert_eq!(db.hosts().unwrap(), first, "seen again within the minute");
            db.host_seen("b").unwrap();
            let names: Vec<String> = db.hosts().unwrap().into_iter().map(|h| h.name).collect();
            assert_eq!(names, ["a", "b"]);

            let key = db.shared_master_key("k1").unwrap();
            assert_eq!(key, "k1");
            assert_eq!(
                db.shared_master_key("k2").unwrap(),
                "k1",
                "the first key stays"
            );
        }
    }
}
