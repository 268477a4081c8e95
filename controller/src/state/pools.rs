//! Warm pools: named sets of started sandboxes of one spec, kept ready so
//! `silo up --pool` costs a rename rather than a machine start.
//!
//! A member is an ordinary sandbox row with `pool` set and its id as its
//! name (a form [`crate::naming::validate_name`] refuses, so no sandbox can
//! collide with it). Lookups by name or id and the sandbox list skip
//! members; a claim renames one and clears `pool` in one transaction, so a
//! member is claimed at most once and a claimed sandbox is a sandbox like
//! any other, with its own id and key.

use serde::Serialize;

use super::events::{EventKind, insert_event};
use super::sandboxes::{COLUMNS, RawRow, name_taken_or, to_json};
use super::sql::{Row, SqlError, args};
use super::{NewSandbox, SandboxRecord, StateDb, StateError, db, now_ms};
use crate::spec::SandboxSpec;

/// A warm pool as recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pool {
    /// Its name (a valid sandbox name).
    pub name: String,
    /// The spec of every member.
    pub spec: SandboxSpec,
    /// How many members it keeps ready.
    pub size: u32,
    /// Unix ms of creation.
    pub created_at_ms: i64,
    /// The snapshot its members stand on, when it keeps forks of one
    /// (`silo pool create --snapshot`); `None`: fresh machines of `spec`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

impl StateDb {
    /// Records a new pool; fails with [`StateError::PoolExists`] if the
    /// name is taken.
    pub fn insert_pool(&mut self, pool: &Pool) -> Result<(), StateError> {
        let spec = to_json(&pool.name, &pool.spec)?;
        self.write("recording a pool", |tx| {
            let inserted = tx
                .execute(
                    "INSERT INTO pools (name, spec, size, created_at, snapshot) \
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
                    args![
                        pool.name,
                        spec,
                        pool.size,
                        pool.created_at_ms,
                        pool.snapshot
                    ],
                )
                .map_err(db("recording a pool"))?;
            match inserted {
                0 => Err(StateError::PoolExists(pool.name.clone())),
                _ => Ok(()),
            }
        })
    }

    /// The pool called `name`.
    pub fn pool(&self, name: &str) -> Result<Pool, StateError> {
        let row = self
            .sql()
            .query_opt(
                &format!("SELECT {POOL_COLUMNS} FROM pools WHERE name = ?1"),
                args![name],
            )
            .map_err(db("looking up a pool"))?
            .ok_or_else(|| StateError::UnknownPool(name.to_owned()))?;
        parse_pool(read_pool(&row).map_err(db("looking up a pool"))?)
    }

    /// Every pool, by name.
    pub fn pools(&self) -> Result<Vec<Pool>, StateError> {
        let rows = self
            .sql()
            .query(
                &format!("SELECT {POOL_COLUMNS} FROM pools ORDER BY name"),
                &[],
            )
            .map_err(db("listing pools"))?;
        rows.iter()
            .map(|row| parse_pool(read_pool(row).map_err(db("listing pools"))?))
            .collect()
    }

    /// Forgets a pool. Its members must be removed first.
    pub fn delete_pool(&mut self, name: &str) -> Result<(), StateError> {
        self.write("removing a pool", |tx| {
            let deleted = tx
                .execute("DELETE FROM pools WHERE name = ?1", args![name])
                .map_err(db("removing a pool"))?;
            match deleted {
                0 => Err(StateError::UnknownPool(name.to_owned())),
                _ => Ok(()),
            }
        })
    }

    /// Records a new member of `pool`, named by its id.
    pub fn insert_pool_member(
        &mut self,
        pool: &str,
        new: &NewSandbox,
    ) -> Result<SandboxRecord, StateError> {
        self.insert_sandbox_in(new, Some(pool))
    }

    /// The members of `pool`, oldest first.
    pub fn pool_members(&self, pool: &str) -> Result<Vec<SandboxRecord>, StateError> {
        let rows = self
            .sql()
            .query(
                &format!("SELECT {COLUMNS} FROM sandboxes WHERE pool = ?1 ORDER BY created_at, id"),
                args![pool],
            )
            .map_err(db("listing a pool's members"))?;
        RawRow::parse_all(&rows, "listing a pool's members")
    }

    /// The ids of every sandbox and pool member: what owns a machine.
    pub fn machine_owner_ids(&self) -> Result<Vec<String>, StateError> {
        let what = "listing sandbox ids";
        let rows = self
            .sql()
            .query("SELECT id FROM sandboxes", &[])
            .map_err(db(what))?;
        rows.iter()
            .map(|row| row.get(0).map_err(db(what)))
            .collect()
    }

    /// Makes `member` of `pool` the sandbox called `name` and logs
    /// `claimed`; `None` if another process claimed it first. Fails with
    /// [`StateError::NameTaken`] if a sandbox has the name.
    pub fn claim_member(
        &mut self,
        pool: &str,
        member: &SandboxRecord,
        name: &str,
    ) -> Result<Option<SandboxRecord>, StateError> {
        let now = now_ms();
        let claimed = self.write("claiming a pool member", |tx| {
            let changed = tx
                .execute(
                    "UPDATE sandboxes SET name = ?3, pool = NULL, updated_at = ?4 \
                     WHERE id = ?1 AND pool = ?2",
                    args![member.id, pool, name, now],
                )
                .map_err(|e| name_taken_or(e, name, "claiming a pool member"))?;
            if changed == 0 {
                return Ok(false);
            }
            insert_event(
                tx,
                &member.id,
                name,
                now,
                EventKind::Claimed,
                &serde_json::json!({ "pool": pool }),
            )?;
            Ok(true)
        })?;
        Ok(claimed.then(|| SandboxRecord {
            name: name.to_owned(),
            updated_at_ms: now,
            ..member.clone()
        }))
    }
}

/// A pool's columns, in the order [`read_pool`] reads them.
const POOL_COLUMNS: &str = "name, spec, size, created_at, snapshot";

/// A pool's row, before its spec is parsed.
type PoolRow = (String, String, u32, i64, Option<String>);

fn read_pool(row: &Row) -> Result<PoolRow, SqlError> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
    ))
}

fn parse_pool((name, spec, size, created_at_ms, snapshot): PoolRow) -> Result<Pool, StateError> {
    let spec = serde_json::from_str(&spec).map_err(|e| StateError::Corrupt {
        id: name.clone(),
        what: format!("pool spec: {e}"),
    })?;
    Ok(Pool {
        name,
        spec,
        size,
        created_at_ms,
        snapshot,
    })
}
