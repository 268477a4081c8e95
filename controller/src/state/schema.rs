//! The database schema as an ordered list of migrations.
//!
//! SQLite's `user_version` pragma records how many migrations a file has had.
//! Migrations are only ever appended: the snapshot and lease tables arrive as
//! new entries, and a released entry is never edited, because files out there
//! already ran it.

use rusqlite::{Connection, TransactionBehavior};

use super::{StateError, db};

/// Each entry moves the schema from version `index` to `index + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: sandboxes and the event log.
    r#"
    CREATE TABLE sandboxes (
        id          TEXT PRIMARY KEY,
        name        TEXT NOT NULL UNIQUE,
        backend     TEXT NOT NULL,
        spec        TEXT NOT NULL,  -- JSON SandboxSpec
        spec_hash   TEXT NOT NULL,
        backend_ref TEXT NOT NULL,  -- JSON, shape owned by the backend
        created_at  INTEGER NOT NULL,  -- unix ms
        updated_at  INTEGER NOT NULL
    ) STRICT;

    -- No foreign key to sandboxes: the log outlives the sandboxes it describes.
    -- The name is kept beside the id so a removed sandbox's history can still
    -- be found by the name people knew it by.
    CREATE TABLE events (
        seq          INTEGER PRIMARY KEY AUTOINCREMENT,
        sandbox_id   TEXT NOT NULL,
        sandbox_name TEXT NOT NULL,
        at           INTEGER NOT NULL,  -- unix ms
        kind         TEXT NOT NULL,
        detail       TEXT NOT NULL      -- JSON object
    ) STRICT;
    CREATE INDEX events_by_sandbox ON events (sandbox_id, seq);
    CREATE INDEX events_by_name ON events (sandbox_name, seq);

    CREATE TRIGGER events_are_append_only_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
    CREATE TRIGGER events_are_append_only_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
    "#,
    // 2: leases serializing lifecycle operations across processes.
    // Keyed by sandbox name, not id: `silo up NAME` must hold the lease before
    // the sandbox (and so its id) exists. The owner is a pid, that process's
    // start time and the boot id, so neither a recycled pid nor a reboot can
    // pass for a live owner; the token tells the owner's own leases apart
    // from other handles in the same process.
    r#"
    CREATE TABLE leases (
        name        TEXT PRIMARY KEY,
        owner_pid   INTEGER NOT NULL,
        owner_start INTEGER NOT NULL,  -- clock ticks after boot, /proc/PID/stat field 22
        owner_boot  TEXT NOT NULL,     -- /proc/sys/kernel/random/boot_id
        owner_token TEXT NOT NULL,
        op          TEXT NOT NULL,
        acquired_at INTEGER NOT NULL   -- unix ms
    ) STRICT;
    "#,
    // 3: snapshots, the base images whose layers the store keeps, and which
    // snapshot each sandbox's machine was made from.
    // Layers are listed whole in each row (the base's, then every snapshot
    // layer of the chain, bottom first), so deleting a parent never strands a
    // child, and the blobs a row needs are all named in that row. No foreign
    // key from a snapshot to its parent or sandbox: both may go first.
    r#"
    CREATE TABLE images (
        image_id   TEXT PRIMARY KEY,  -- the engine's id of the image (sha256:…)
        config     TEXT NOT NULL,     -- JSON image config, as the engine exported it
        layers     TEXT NOT NULL,     -- JSON array of layer digests, bottom first
        index_blob TEXT NOT NULL,     -- digest of the blob listing its paths
        bytes      INTEGER NOT NULL,  -- bytes its layers and index take in the store
        stored_at  INTEGER NOT NULL   -- unix ms
    ) STRICT;

    CREATE TABLE snapshots (
        id           TEXT PRIMARY KEY,
        sandbox_id   TEXT NOT NULL,
        sandbox_name TEXT NOT NULL,
        parent       TEXT,              -- the snapshot the machine was made from
        spec         TEXT NOT NULL,     -- JSON SandboxSpec of the sandbox, for forks
        base_image   TEXT NOT NULL REFERENCES images (image_id),
        layers       TEXT NOT NULL,     -- JSON array of layer digests, bottom first
        config       TEXT NOT NULL,     -- the image config the engine is given (JSON text)
        message      TEXT,
        layer_bytes  INTEGER NOT NULL,  -- size of this snapshot's own layer
        new_bytes    INTEGER NOT NULL,  -- how much the store grew by taking it
        created_at   INTEGER NOT NULL   -- unix ms
    ) STRICT;
    CREATE INDEX snapshots_by_sandbox ON snapshots (sandbox_id, created_at);

    ALTER TABLE sandboxes ADD COLUMN origin_snapshot TEXT;
    "#,
    // 4: snapshots on machines that are not engines (remote VMs). An image
    // may be a provider template's path index with no layers; `identity` is
    // the base id silo's own images carry (`silo.base-id`), which tells a
    // Docker image and a template made from it are the same files. A
    // sandbox's `baseline` is where its current machine's files started
    // and from when (the machine's clock) a changed path is its own.
    r#"
    ALTER TABLE images ADD COLUMN identity TEXT;
    ALTER TABLE sandboxes ADD COLUMN baseline TEXT;  -- JSON Baseline, or NULL
    "#,
    // 5: incremental snapshots. A sandbox's `checkpoint` names the newest
    // snapshot of its current machine and when, on the machine's clock, it
    // was read; the next snapshot stores only what changed since.
    r#"
    ALTER TABLE sandboxes ADD COLUMN checkpoint TEXT;  -- JSON Checkpoint, or NULL
    "#,
    // 6: warm pools. A pool keeps `size` started sandboxes of one spec. Its
    // members are sandbox rows named by their id (a form no sandbox name
    // may take) with `pool` set; a claim renames one and clears `pool`, in
    // one transaction, so each member is claimed once.
    r#"
    CREATE TABLE pools (
        name       TEXT PRIMARY KEY,
        spec       TEXT NOT NULL,     -- JSON SandboxSpec of every member
        size       INTEGER NOT NULL,  -- members to keep ready
        created_at INTEGER NOT NULL   -- unix ms
    ) STRICT;
    ALTER TABLE sandboxes ADD COLUMN pool TEXT;  -- the pool it waits in, until claimed
    CREATE INDEX sandboxes_by_pool ON sandboxes (pool);
    "#,
    // 7: rewinds in place whose layer was sent. Recorded before the layer
    // goes out and cleared when its outcome is recorded, so whoever opens
    // the sandbox after a client died half way can ask the agent whether
    // the layer went in, and record the rewind if it did.
    r#"
    CREATE TABLE pending_rewinds (
        sandbox_id    TEXT PRIMARY KEY,
        snapshot      TEXT NOT NULL,     -- the snapshot gone back to
        layer_sha256  TEXT NOT NULL,     -- the restoring layer sent
        fork          INTEGER NOT NULL,  -- 1: a fork onto a pool member
        at            INTEGER NOT NULL   -- unix ms
    ) STRICT;
    "#,
    // 8: pools standing on a snapshot. Their members are made and then
    // rewound to it, so a fork of that snapshot claims one that is there
    // already.
    r#"
    ALTER TABLE pools ADD COLUMN snapshot TEXT;  -- the snapshot its members stand on, or NULL
    "#,
];

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Applies the migrations a file lacks, all in one transaction, so a process
/// racing this one either sees the old schema or the new one.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StateError> {
    // A file already at this build's version (every open after the first)
    // needs no write lock: versions only ever go up, so a plain read that
    // finds ours is final. Anything else is decided under the lock below.
    let current: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(db("reading the schema version"))?;
    if current == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db("starting the schema migration"))?;
    let found: i64 = tx
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(db("reading the schema version"))?;
    if found > SCHEMA_VERSION {
        return Err(StateError::NewerSchema {
            found,
            known: SCHEMA_VERSION,
        });
    }
    let start = usize::try_from(found).unwrap_or(0);
    for sql in MIGRATIONS.iter().skip(start) {
        tx.execute_batch(sql).map_err(db("migrating the schema"))?;
    }
    if found < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(db("recording the schema version"))?;
    }
    tx.commit().map_err(db("committing the schema migration"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateDb;

    #[test]
    fn migrating_twice_is_a_no_op_and_newer_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(StateDb::open(&path).unwrap());
        let mut conn = Connection::open(&path).unwrap();
        migrate(&mut conn).unwrap();
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);

        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        drop(conn);
        let err = StateDb::open(&path).unwrap_err();
        assert!(matches!(err, StateError::NewerSchema { .. }), "{err}");
    }
}
