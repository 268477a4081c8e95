//! The event log: what happened to each sandbox, in order.
//!
//! Rows are only ever inserted; triggers in the schema refuse updates and
//! deletes, so the log survives the sandboxes it describes and a bug cannot
//! rewrite history.

use super::sql::{Param, Sql, ToParam, args};
use serde::Serialize;

use super::{StateDb, StateError, db, now_ms};
use crate::state::SandboxRecord;

/// Kinds of event this build writes. Stored as text, so logs written by a
/// newer silo (with kinds this one does not know) still read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The sandbox was recorded and its machine is being made.
    Created,
    /// Its machine (agent) came up.
    Started,
    /// Its machine was stopped.
    Stopped,
    /// `silo up` reused it (running, or started again).
    Resumed,
    /// Its machine was replaced by a fresh one under the same id (spec
    /// changed with `--recreate`, idle TTL expired, or removed outside silo).
    Recreated,
    /// Files were pushed into one of its mounts (and changed it).
    Pushed,
    /// It was removed; its events remain.
    Removed,
    /// A snapshot of its file system was stored.
    Snapshot,
    /// One of its snapshots was deleted.
    SnapshotRemoved,
    /// gc removed its machine after its idle TTL expired, keeping the
    /// sandbox for its snapshots (`silo up` restores it).
    Reclaimed,
    /// Its machine was replaced by one made from a snapshot (`silo rewind`,
    /// or `silo up` restoring a machine that was gone), or brought back to
    /// one in place (`silo rewind`, detail `in_place: true`).
    Rewound,
    /// It was taken from a warm pool and given its name (`silo up --pool`).
    Claimed,
    /// Its machine's outbound rules were changed in place (`silo
    /// network`); detail: the rules before and after.
    NetworkChanged,
}

impl EventKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Created => "created",
            EventKind::Started => "started",
            EventKind::Stopped => "stopped",
            EventKind::Resumed => "resumed",
            EventKind::Recreated => "recreated",
            EventKind::Pushed => "pushed",
            EventKind::Removed => "removed",
            EventKind::Snapshot => "snapshot",
            EventKind::SnapshotRemoved => "snapshot_removed",
            EventKind::Rewound => "rewound",
            EventKind::Reclaimed => "reclaimed",
            EventKind::Claimed => "claimed",
            EventKind::NetworkChanged => "network_changed",
        }
    }
}

/// One logged event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventRecord {
    /// Position in the log; increases across all sandboxes.
    pub seq: i64,
    /// The sandbox it concerns.
    pub sandbox_id: String,
    /// That sandbox's name at the time.
    pub sandbox_name: String,
    /// Unix ms.
    pub at_ms: i64,
    /// What happened: `created`, `started`, `stopped`, `removed`, … (the
    /// lowercase names of the controller's event kinds).
    pub kind: String,
    /// Kind-specific facts (a JSON object).
    pub detail: serde_json::Value,
}

impl StateDb {
    /// Appends an event about a sandbox.
    pub fn append_event(
        &mut self,
        sandbox: &SandboxRecord,
        kind: EventKind,
        detail: &serde_json::Value,
    ) -> Result<(), StateError> {
        let now = now_ms();
        self.write("logging an event", |tx| {
            insert_event(tx, &sandbox.id, &sandbox.name, now, kind, detail)
        })
    }

    /// The events of the sandbox with this name or id, oldest first.
    ///
    /// A live sandbox wins; otherwise an id, then a name, of a removed sandbox
    /// is looked up in the log (for a reused name, the most recent holder).
    pub fn events_of(&self, name_or_id: &str) -> Result<Vec<EventRecord>, StateError> {
        let id = match self.sandbox(name_or_id) {
            Ok(sandbox) => sandbox.id,
            Err(StateError::UnknownSandbox(_)) => {
                let what = "looking up a removed sandbox";
                self.sql()
                    .query_opt(
                        "SELECT sandbox_id FROM events \
                         WHERE sandbox_id = CAST(?1 AS TEXT) OR sandbox_name = CAST(?1 AS TEXT) \
                         ORDER BY sandbox_id = CAST(?1 AS TEXT) DESC, seq DESC LIMIT 1",
                        args![name_or_id],
                    )
                    .map_err(db(what))?
                    .ok_or_else(|| StateError::UnknownSandbox(name_or_id.to_owned()))?
                    .get::<String>(0)
                    .map_err(db(what))?
            }
            Err(other) => return Err(other),
        };
        let what = "reading events";
        let rows = self
            .sql()
            .query(
                "SELECT seq, sandbox_id, sandbox_name, at, kind, detail FROM events \
                 WHERE sandbox_id = ?1 ORDER BY seq",
                args![id],
            )
            .map_err(db(what))?;
        let mut out = Vec::new();
        for row in rows {
            let seq = row.get(0).map_err(db(what))?;
            let detail: String = row.get(5).map_err(db(what))?;
            out.push(EventRecord {
                seq,
                sandbox_id: row.get(1).map_err(db(what))?,
                sandbox_name: row.get(2).map_err(db(what))?,
                at_ms: row.get(3).map_err(db(what))?,
                kind: row.get(4).map_err(db(what))?,
                detail: serde_json::from_str(&detail).map_err(|e| StateError::Corrupt {
                    id: id.clone(),
                    what: format!("event {seq}: {e}"),
                })?,
            });
        }
        Ok(out)
    }
}

impl StateDb {
    /// The most recent of the sandbox's events whose kind is one of `kinds`:
    /// its kind and when (unix ms).
    pub fn last_event_among(
        &self,
        sandbox_id: &str,
        kinds: &[EventKind],
    ) -> Result<Option<(String, i64)>, StateError> {
        if kinds.is_empty() {
            return Ok(None);
        }
        // `kind IN (?2, ?3, …)`, one parameter per kind.
        let wanted: Vec<String> = (2..kinds.len() + 2).map(|n| format!("?{n}")).collect();
        let sql = format!(
            "SELECT kind, at FROM events WHERE sandbox_id = ?1 AND kind IN ({}) \
             ORDER BY seq DESC LIMIT 1",
            wanted.join(", ")
        );
        let mut params = vec![sandbox_id.param()];
        params.extend(kinds.iter().map(|k| Param::Text(k.as_str())));
        let what = "reading the last event";
        let Some(row) = self.sql().query_opt(&sql, &params).map_err(db(what))? else {
            return Ok(None);
        };
        Ok(Some((
            row.get(0).map_err(db(what))?,
            row.get(1).map_err(db(what))?,
        )))
    }
}

/// Inserts one event inside a caller's transaction.
pub(super) fn insert_event(
    tx: &dyn Sql,
    sandbox_id: &str,
    sandbox_name: &str,
    at_ms: i64,
    kind: EventKind,
    detail: &serde_json::Value,
) -> Result<(), StateError> {
    let detail = serde_json::to_string(detail).map_err(|e| StateError::Corrupt {
        id: sandbox_id.to_owned(),
        what: e.to_string(),
    })?;
    tx.execute(
        "INSERT INTO events (sandbox_id, sandbox_name, at, kind, detail) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
        args![sandbox_id, sandbox_name, at_ms, kind.as_str(), detail],
    )
    .map_err(db("logging an event"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::NewSandbox;
    use crate::state::test_support::{local_sandbox, temp_dbs};
    use serde_json::json;

    fn kinds(events: &[EventRecord]) -> Vec<&str> {
        events.iter().map(|e| e.kind.as_str()).collect()
    }

    #[test]
    fn events_are_append_only_and_outlive_their_sandbox() {
        for (_scratch, mut db) in temp_dbs() {
            let new = local_sandbox("sbx-00000000000a", "a");
            let a = db.insert_sandbox(&new).unwrap();
            db.append_event(&a, EventKind::Started, &json!({ "pid": 1 }))
                .unwrap();
            db.delete_sandbox(&a, &json!({})).unwrap();

            let by_name = db.events_of("a").unwrap();
            assert_eq!(kinds(&by_name), ["created", "started", "removed"]);
            assert_eq!(by_name[1].detail, json!({ "pid": 1 }));
            assert!(by_name.windows(2).all(|w| w[0].seq < w[1].seq));
            assert_eq!(db.events_of("sbx-00000000000a").unwrap(), by_name);

            // The schema itself refuses rewriting history.
            assert!(
                db.sql()
                    .execute("UPDATE events SET kind = 'x'", &[])
                    .is_err()
            );
            assert!(db.sql().execute("DELETE FROM events", &[]).is_err());

            // A new sandbox reusing the name shadows the removed one.
            let b = db
                .insert_sandbox(&NewSandbox {
                    id: "sbx-00000000000b".into(),
                    ..new
                })
                .unwrap();
            assert_eq!(kinds(&db.events_of("a").unwrap()), ["created"]);
            assert_eq!(db.events_of("a").unwrap()[0].sandbox_id, b.id);
            assert!(matches!(
                db.events_of("nobody"),
                Err(StateError::UnknownSandbox(_))
            ));
        }
    }
}
