//! The live sandboxes: one row each, from creation until removal.
//!
//! Every change to a row is written in the same transaction as the event that
//! describes it, so the log and the table never disagree.

use serde::Serialize;

use super::events::{EventKind, insert_event};
use super::sql::{Row, SqlError, args};
use super::{StateDb, StateError, db, now_ms};
use crate::spec::{BackendKind, SandboxSpec};

/// A sandbox as the state database knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxRecord {
    /// Stable id (`sbx-` and 12 hex digits); the sandbox key derives from it.
    pub id: String,
    /// Unique human name.
    pub name: String,
    /// The backend that runs it.
    pub backend: BackendKind,
    /// What it was created with.
    pub spec: SandboxSpec,
    /// Hash of `spec`, stored so drift can be seen without re-hashing old specs.
    pub spec_hash: String,
    /// The backend's handle on the machine (shape owned by the backend).
    /// Shown (JSON output, the event log) without its access tokens.
    #[serde(serialize_with = "serialize_without_secrets")]
    pub backend_ref: serde_json::Value,
    /// Unix ms of creation.
    pub created_at_ms: i64,
    /// Unix ms of the last change to this row.
    pub updated_at_ms: i64,
    /// The snapshot its current machine was made from (rewind, fork,
    /// restore); `None` when it was made from the spec's image.
    pub origin_snapshot: Option<String>,
    /// Where its current machine's files started: on a backend whose
    /// snapshots are layers applied by the agent (remote VMs), and on a
    /// container made from an image the store lacked (the image's listing);
    /// `None` elsewhere, and until the machine's agent has been asked.
    pub baseline: Option<Baseline>,
    /// The newest snapshot of its current machine, which the next one
    /// builds on; `None` until one is taken, and whenever the machine is
    /// replaced.
    pub checkpoint: Option<Checkpoint>,
    /// The host that made it (`SILO_HOST`); `None` for a sandbox made
    /// before hosts were recorded. A machine that lives on one host is
    /// operated from that host only.
    pub host: Option<String>,
}

/// What the first snapshot of a machine measures its changes against when
/// no snapshot of it came before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Baseline {
    /// The stored image its files started from: the template's path index
    /// for a fresh VM, the snapshot's base for a restored one, the image's
    /// listing for a container made from an image the store lacked.
    pub image: String,
    /// Unix ns on the machine's own clock from which a changed path counts
    /// as the sandbox's: taken before the template was indexed, or after a
    /// snapshot's layers were applied (a container's creation serves
    /// instead, as for any container).
    pub changed_since_ns: i64,
}

/// A snapshot of a sandbox's current machine and the moment it was read:
/// the next snapshot of the same machine stores only what changed since,
/// on top of this one's layers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Checkpoint {
    /// The snapshot.
    pub snapshot: String,
    /// Unix ns on the machine's own clock once its processes had stopped
    /// for that snapshot, before any path was read.
    pub stopped_at_ns: i64,
}

impl SandboxRecord {
    /// Whether a backend ever reported making this sandbox's current
    /// machine: a sandbox is recorded (with an empty handle) before its
    /// machine is made, so a create cut short leaves it without one.
    pub fn machine_recorded(&self) -> bool {
        self.backend_ref.as_object().is_some_and(|o| !o.is_empty())
    }
}

/// What is needed to record a new sandbox.
#[derive(Debug, Clone)]
pub struct NewSandbox {
    /// Its id.
    pub id: String,
    /// Its name, already validated.
    pub name: String,
    /// Its spec.
    pub spec: SandboxSpec,
    /// The snapshot its first machine is made from (a fork), if any.
    pub origin_snapshot: Option<String>,
    /// The host making it.
    pub host: String,
}

pub(super) const COLUMNS: &str = "id, name, backend, spec, spec_hash, backend_ref, created_at, updated_at, \
                       origin_snapshot, baseline, checkpoint, host";

impl StateDb {
    /// Records a new sandbox (with an empty backend handle) and its `created`
    /// event. Fails with [`StateError::NameTaken`] if the name is in use.
    pub fn insert_sandbox(&mut self, new: &NewSandbox) -> Result<SandboxRecord, StateError> {
        self.insert_sandbox_in(new, None)
    }

    /// Records a sandbox as [`StateDb::insert_sandbox`] does, as a member
    /// of `pool` when given: hidden from every lookup by name or id until
    /// it is claimed.
    pub(super) fn insert_sandbox_in(
        &mut self,
        new: &NewSandbox,
        pool: Option<&str>,
    ) -> Result<SandboxRecord, StateError> {
        let spec_json = to_json(&new.id, &new.spec)?;
        let spec_hash = new.spec.hash();
        let now = now_ms();
        let backend = new.spec.backend;
        self.write("recording a new sandbox", |tx| {
            tx.execute(
                &format!(
                    "INSERT INTO sandboxes ({COLUMNS}, pool) \
                     VALUES (?1, ?2, ?3, ?4, ?5, '{{}}', ?6, ?6, ?7, NULL, NULL, ?9, ?8)"
                ),
                args![
                    new.id,
                    new.name,
                    backend.as_str(),
                    spec_json,
                    spec_hash,
                    now,
                    new.origin_snapshot,
                    pool,
                    new.host
                ],
            )
            .map_err(|e| name_taken_or(e, &new.name, "recording a new sandbox"))?;
            insert_event(
                tx,
                &new.id,
                &new.name,
                now,
                EventKind::Created,
                &serde_json::json!({
                    "backend": backend,
                    "spec_hash": spec_hash,
                    "from_snapshot": new.origin_snapshot,
                    "host": new.host,
                }),
            )?;
            Ok(())
        })?;
        Ok(SandboxRecord {
            id: new.id.clone(),
            name: new.name.clone(),
            backend,
            spec: new.spec.clone(),
            spec_hash,
            backend_ref: serde_json::json!({}),
            created_at_ms: now,
            updated_at_ms: now,
            origin_snapshot: new.origin_snapshot.clone(),
            baseline: None,
            checkpoint: None,
            host: Some(new.host.clone()),
        })
    }

    /// The live sandbox with this name or id.
    pub fn sandbox(&self, name_or_id: &str) -> Result<SandboxRecord, StateError> {
        let row = self
            .sql()
            .query_opt(
                &format!(
                    "SELECT {COLUMNS} FROM sandboxes WHERE (id = ?1 OR name = ?1) AND pool IS NULL"
                ),
                args![name_or_id],
            )
            .map_err(db("looking up a sandbox"))?
            .ok_or_else(|| StateError::UnknownSandbox(name_or_id.to_owned()))?;
        RawRow::read(&row)
            .map_err(db("looking up a sandbox"))?
            .parse()
    }

    /// Every live sandbox, oldest first (not the members of warm pools).
    pub fn sandboxes(&self) -> Result<Vec<SandboxRecord>, StateError> {
        let rows = self
            .sql()
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM sandboxes WHERE pool IS NULL ORDER BY created_at, id"
                ),
                &[],
            )
            .map_err(db("listing sandboxes"))?;
        RawRow::parse_all(&rows, "listing sandboxes")
    }

    /// Replaces a sandbox's backend handle and, when given, logs an event with it.
    pub fn update_backend_ref(
        &mut self,
        sandbox: &SandboxRecord,
        backend_ref: &serde_json::Value,
        event: Option<(EventKind, serde_json::Value)>,
    ) -> Result<SandboxRecord, StateError> {
        let ref_json = to_json(&sandbox.id, backend_ref)?;
        let now = now_ms();
        self.write("updating a sandbox", |tx| {
            let changed = tx
                .execute(
                    "UPDATE sandboxes SET backend_ref = ?2, updated_at = ?3 WHERE id = ?1",
                    args![sandbox.id, ref_json, now],
                )
                .map_err(db("updating a sandbox"))?;
            if changed == 0 {
                return Err(StateError::UnknownSandbox(sandbox.name.clone()));
            }
            if let Some((kind, detail)) = &event {
                insert_event(tx, &sandbox.id, &sandbox.name, now, *kind, detail)?;
            }
            Ok(())
        })?;
        Ok(SandboxRecord {
            backend_ref: backend_ref.clone(),
            updated_at_ms: now,
            ..sandbox.clone()
        })
    }

    /// Records that a sandbox's machine is being replaced under the same id:
    /// made fresh with `spec` (a new spec hash), or from the snapshot
    /// `origin` (rewind, restore). The backend handle is empty until the new
    /// machine is up; `event` is logged in the same transaction.
    pub fn replace_machine(
        &mut self,
        sandbox: &SandboxRecord,
        spec: &SandboxSpec,
        origin: Option<&str>,
        event: (EventKind, serde_json::Value),
    ) -> Result<SandboxRecord, StateError> {
        let spec_json = to_json(&sandbox.id, spec)?;
        let spec_hash = spec.hash();
        let now = now_ms();
        self.write("replacing a sandbox's machine", |tx| {
            let changed = tx
                .execute(
                    "UPDATE sandboxes SET backend = ?2, spec = ?3, spec_hash = ?4, \
                     backend_ref = '{}', updated_at = ?5, origin_snapshot = ?6, \
                     baseline = NULL, checkpoint = NULL WHERE id = ?1",
                    args![
                        sandbox.id,
                        spec.backend.as_str(),
                        spec_json,
                        spec_hash,
                        now,
                        origin
                    ],
                )
                .map_err(db("replacing a sandbox's machine"))?;
            if changed == 0 {
                return Err(StateError::UnknownSandbox(sandbox.name.clone()));
            }
            // A new machine settles any rewind left under way on the old one.
            super::pending::clear_in(tx, &sandbox.id)?;
            let (kind, detail) = &event;
            insert_event(tx, &sandbox.id, &sandbox.name, now, *kind, detail)
        })?;
        Ok(SandboxRecord {
            backend: spec.backend,
            spec: spec.clone(),
            spec_hash,
            backend_ref: serde_json::json!({}),
            updated_at_ms: now,
            origin_snapshot: origin.map(str::to_owned),
            baseline: None,
            checkpoint: None,
            ..sandbox.clone()
        })
    }

    /// Records a change to the sandbox's spec its running machine took in
    /// place (a new spec hash, the same machine), logging `event` in the
    /// same transaction.
    pub fn update_spec(
        &mut self,
        sandbox: &SandboxRecord,
        spec: &SandboxSpec,
        event: (EventKind, serde_json::Value),
    ) -> Result<SandboxRecord, StateError> {
        let spec_json = to_json(&sandbox.id, spec)?;
        let spec_hash = spec.hash();
        let now = now_ms();
        self.write("updating a sandbox's spec", |tx| {
            let changed = tx
                .execute(
                    "UPDATE sandboxes SET spec = ?2, spec_hash = ?3, updated_at = ?4 WHERE id = ?1",
                    args![sandbox.id, spec_json, spec_hash, now],
                )
                .map_err(db("updating a sandbox's spec"))?;
            if changed == 0 {
                return Err(StateError::UnknownSandbox(sandbox.name.clone()));
            }
            let (kind, detail) = &event;
            insert_event(tx, &sandbox.id, &sandbox.name, now, *kind, detail)
        })?;
        Ok(SandboxRecord {
            spec: spec.clone(),
            spec_hash,
            updated_at_ms: now,
            ..sandbox.clone()
        })
    }

    /// Records where the sandbox's current machine's files started.
    pub fn set_baseline(
        &mut self,
        sandbox: &SandboxRecord,
        baseline: &Baseline,
    ) -> Result<SandboxRecord, StateError> {
        let text = to_json(&sandbox.id, baseline)?;
        self.write("recording a sandbox's baseline", |tx| {
            let changed = tx
                .execute(
                    "UPDATE sandboxes SET baseline = ?2 WHERE id = ?1",
                    args![sandbox.id, text],
                )
                .map_err(db("recording a sandbox's baseline"))?;
            match changed {
                0 => Err(StateError::UnknownSandbox(sandbox.name.clone())),
                _ => Ok(()),
            }
        })?;
        Ok(SandboxRecord {
            baseline: Some(baseline.clone()),
            ..sandbox.clone()
        })
    }

    /// Records that a sandbox's machine was brought back to a snapshot in
    /// place: the machine stays, `checkpoint` (that snapshot, and the
    /// moment its tree was in place) is what its next snapshot builds on,
    /// and `baseline` what its files started from (`None` when nothing
    /// needs to be known of it any more); `rewound` is logged with
    /// `detail` in the same transaction. A fork onto a pool member gives
    /// the snapshot it was made from as `origin`.
    pub fn rewound_in_place(
        &mut self,
        sandbox: &SandboxRecord,
        checkpoint: &Checkpoint,
        baseline: Option<&Baseline>,
        origin: Option<&str>,
        detail: &serde_json::Value,
    ) -> Result<SandboxRecord, StateError> {
        let text = to_json(&sandbox.id, checkpoint)?;
        let baseline_text = baseline.map(|b| to_json(&sandbox.id, b)).transpose()?;
        let now = now_ms();
        self.write("recording an in-place rewind", |tx| {
            let changed = tx
                .execute(
                    "UPDATE sandboxes SET checkpoint = ?2, baseline = ?3, updated_at = ?4, \
                     origin_snapshot = COALESCE(?5, origin_snapshot) WHERE id = ?1",
                    args![sandbox.id, text, baseline_text, now, origin],
                )
                .map_err(db("recording an in-place rewind"))?;
            if changed == 0 {
                return Err(StateError::UnknownSandbox(sandbox.name.clone()));
            }
            super::pending::clear_in(tx, &sandbox.id)?;
            insert_event(
                tx,
                &sandbox.id,
                &sandbox.name,
                now,
                EventKind::Rewound,
                detail,
            )
        })?;
        Ok(SandboxRecord {
            checkpoint: Some(checkpoint.clone()),
            baseline: baseline.cloned(),
            origin_snapshot: origin
                .map(str::to_owned)
                .or_else(|| sandbox.origin_snapshot.clone()),
            updated_at_ms: now,
            ..sandbox.clone()
        })
    }

    /// Deletes a sandbox's row and logs `removed` with `detail`. Its events stay.
    pub fn delete_sandbox(
        &mut self,
        sandbox: &SandboxRecord,
        detail: &serde_json::Value,
    ) -> Result<(), StateError> {
        let now = now_ms();
        self.write("removing a sandbox", |tx| {
            let changed = tx
                .execute("DELETE FROM sandboxes WHERE id = ?1", args![sandbox.id])
                .map_err(db("removing a sandbox"))?;
            if changed == 0 {
                return Err(StateError::UnknownSandbox(sandbox.name.clone()));
            }
            super::pending::clear_in(tx, &sandbox.id)?;
            insert_event(
                tx,
                &sandbox.id,
                &sandbox.name,
                now,
                EventKind::Removed,
                detail,
            )
        })
    }
}

/// A row as stored, before its JSON columns are parsed.
pub(super) struct RawRow {
    id: String,
    name: String,
    backend: String,
    spec: String,
    spec_hash: String,
    backend_ref: String,
    created_at: i64,
    updated_at: i64,
    origin_snapshot: Option<String>,
    baseline: Option<String>,
    checkpoint: Option<String>,
    host: Option<String>,
}

impl RawRow {
    pub(super) fn read(row: &Row) -> Result<Self, SqlError> {
        Ok(Self {
            id: row.get(0)?,
            name: row.get(1)?,
            backend: row.get(2)?,
            spec: row.get(3)?,
            spec_hash: row.get(4)?,
            backend_ref: row.get(5)?,
            created_at: row.get(6)?,
            updated_at: row.get(7)?,
            origin_snapshot: row.get(8)?,
            baseline: row.get(9)?,
            checkpoint: row.get(10)?,
            host: row.get(11)?,
        })
    }

    /// Every row of a `SELECT {COLUMNS}`, parsed; `what` names the query.
    pub(super) fn parse_all(
        rows: &[Row],
        what: &'static str,
    ) -> Result<Vec<SandboxRecord>, StateError> {
        rows.iter()
            .map(|row| Self::read(row).map_err(db(what))?.parse())
            .collect()
    }

    pub(super) fn parse(self) -> Result<SandboxRecord, StateError> {
        let corrupt = |what: String| StateError::Corrupt {
            id: self.id.clone(),
            what,
        };
        let backend: BackendKind = self
            .backend
            .parse()
            .map_err(|e: crate::spec::UnknownBackend| corrupt(e.to_string()))?;
        let spec: SandboxSpec =
            serde_json::from_str(&self.spec).map_err(|e| corrupt(format!("spec: {e}")))?;
        let backend_ref = serde_json::from_str(&self.backend_ref)
            .map_err(|e| corrupt(format!("backend_ref: {e}")))?;
        let baseline = optional_json(self.baseline.as_deref())
            .map_err(|e| corrupt(format!("baseline: {e}")))?;
        let checkpoint = optional_json(self.checkpoint.as_deref())
            .map_err(|e| corrupt(format!("checkpoint: {e}")))?;
        Ok(SandboxRecord {
            id: self.id,
            name: self.name,
            backend,
            spec,
            spec_hash: self.spec_hash,
            backend_ref,
            created_at_ms: self.created_at,
            updated_at_ms: self.updated_at,
            origin_snapshot: self.origin_snapshot,
            baseline,
            checkpoint,
            host: self.host,
        })
    }
}

/// A backend handle as it is shown: a provider's access tokens (E2B's envd
/// and traffic tokens, Daytona's preview token), which the handle needs and
/// a reader does not, are left out. JSON output and the event log, which
/// outlives the sandbox, both show handles; the database keeps them whole.
pub fn without_secrets(backend_ref: &serde_json::Value) -> serde_json::Value {
    match backend_ref {
        serde_json::Value::Object(fields) => fields
            .iter()
            .filter(|(name, _)| !name.ends_with("_token"))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
        other => other.clone(),
    }
}

fn serialize_without_secrets<S: serde::Serializer>(
    backend_ref: &serde_json::Value,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    without_secrets(backend_ref).serialize(serializer)
}

pub(super) fn to_json(id: &str, value: &impl Serialize) -> Result<String, StateError> {
    serde_json::to_string(value).map_err(|e| StateError::Corrupt {
        id: id.to_owned(),
        what: e.to_string(),
    })
}

/// A JSON column that may be NULL.
fn optional_json<T: serde::de::DeserializeOwned>(
    text: Option<&str>,
) -> Result<Option<T>, serde_json::Error> {
    text.map(serde_json::from_str).transpose()
}

/// Maps a UNIQUE violation on the name column to [`StateError::NameTaken`].
pub(super) fn name_taken_or(error: SqlError, name: &str, context: &'static str) -> StateError {
    if error.violates_unique("sandboxes", "name") {
        return StateError::NameTaken(name.to_owned());
    }
    StateError::Db {
        context,
        source: error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::test_support::{local_sandbox as new, temp_dbs};

    #[test]
    fn handles_are_shown_without_their_tokens() {
        let handle = serde_json::json!({
            "sandbox_id": "i1", "envd_token": "e", "traffic_token": "t", "template": "base",
        });
        let shown = serde_json::json!({ "sandbox_id": "i1", "template": "base" });
        assert_eq!(without_secrets(&handle), shown);
        for (_scratch, mut db) in temp_dbs() {
            let record = db.insert_sandbox(&new("sbx-00000000000c", "c")).unwrap();
            let record = db.update_backend_ref(&record, &handle, None).unwrap();
            assert_eq!(
                db.sandbox("c").unwrap().backend_ref,
                handle,
                "the database keeps it whole"
            );
            let json = serde_json::to_value(&record).unwrap();
            assert_eq!(json["backend_ref"], shown);
        }
    }

    #[test]
    fn create_get_list_update_remove() {
        for (_scratch, mut db) in temp_dbs() {
            let a = db.insert_sandbox(&new("sbx-00000000000a", "a")).unwrap();
            db.insert_sandbox(&new("sbx-00000000000b", "b")).unwrap();
            assert_eq!(db.sandbox("a").unwrap(), a);
            assert_eq!(db.sandbox("sbx-00000000000a").unwrap(), a);
            assert_eq!(a.spec_hash, a.spec.hash());

            let names: Vec<String> = db
                .sandboxes()
                .unwrap()
                .into_iter()
                .map(|s| s.name)
                .collect();
            assert_eq!(names, ["a", "b"]);

            let handle = serde_json::json!({ "pid": 42 });
            let a2 = db
                .update_backend_ref(
                    &a,
                    &handle,
                    Some((EventKind::Started, serde_json::json!({}))),
                )
                .unwrap();
            assert_eq!(db.sandbox("a").unwrap(), a2);
            assert_eq!(a2.backend_ref, handle);

            db.delete_sandbox(&a2, &serde_json::json!({})).unwrap();
            assert!(matches!(db.sandbox("a"), Err(StateError::UnknownSandbox(n)) if n == "a"));
            assert_eq!(db.sandboxes().unwrap().len(), 1);
            // Once removed, the name is free again.
            db.insert_sandbox(&new("sbx-00000000000c", "a")).unwrap();
        }
    }

    #[test]
    fn names_are_unique_and_unknown_sandboxes_are_named() {
        for (_scratch, mut db) in temp_dbs() {
            db.insert_sandbox(&new("sbx-00000000000a", "a")).unwrap();
            let err = db
                .insert_sandbox(&new("sbx-00000000000b", "a"))
                .unwrap_err();
            assert!(
                matches!(&err, StateError::NameTaken(n) if n == "a"),
                "{err}"
            );
            let err = db.sandbox("ghost").unwrap_err();
            assert_eq!(err.to_string(), r#"unknown sandbox "ghost""#);
            // A failed insert leaves no trace in the log.
            assert_eq!(db.events_of("a").unwrap().len(), 1);
        }
    }
}
