//! The database schema as an ordered list of migrations, each written for
//! both engines: the same tables, columns and constraints, in each one's
//! DDL (SQLite's `STRICT` tables, PostgreSQL's `BIGINT` for every integer,
//! since the state reads and writes 64-bit integers only).
//!
//! SQLite's `user_version` pragma records how many migrations a file has
//! had; PostgreSQL's `silo_schema` table does the same for a database.
//! Migrations are only ever appended: the snapshot and lease tables arrive
//! as new entries, and a released entry is never edited, because databases
//! out there already ran it.

use rusqlite::{Connection, TransactionBehavior};

use super::postgres::{Outcome, Postgres};
use super::sql::{Sql, args};
use super::{StateError, db};

/// How many migrations there are: each is written once per engine, in
/// [`SQLITE`] and [`POSTGRES`], entry `i` moving a database from version
/// `i` to `i + 1`.
const MIGRATIONS: usize = 9;

/// The migrations in SQLite's DDL.
const SQLITE: [&str; MIGRATIONS] = [
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
    // 9: a fleet: several hosts on one database. A sandbox's `host` is the
    // host that made it; on a backend whose machines live on one host only
    // that host operates it. A lease's `owner_host` is its owner's host. `hosts` lists every
    // host that opened the database and when it was last seen. `settings`
    // holds what the hosts share: on a shared database, the master key
    // every sandbox key derives from (a secret of the whole fleet).
    // `blob_holds` and `blob_deletions` keep a shared store's gc from
    // deleting a blob a snapshot being recorded names (see `blobs`).
    r#"
    ALTER TABLE sandboxes ADD COLUMN host TEXT;
    ALTER TABLE leases ADD COLUMN owner_host TEXT;  -- NULL: taken before hosts were recorded
    CREATE TABLE hosts (
        name    TEXT PRIMARY KEY,
        seen_at INTEGER NOT NULL  -- unix ms
    ) STRICT;
    CREATE TABLE settings (
        name  TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT;
    CREATE TABLE blob_holds (
        digest TEXT NOT NULL,
        holder TEXT NOT NULL,     -- host, pid and a token of the holding call
        at     INTEGER NOT NULL,  -- unix ms
        PRIMARY KEY (digest, holder)
    ) STRICT;
    CREATE TABLE blob_deletions (
        digest TEXT PRIMARY KEY,
        at     INTEGER NOT NULL   -- unix ms
    ) STRICT;
    "#,
];

/// The migrations in PostgreSQL's DDL, step for step the SQLite ones
/// (whose comments say what each column holds). SQLite's `rowid` and
/// `AUTOINCREMENT` keys are identity columns here, under the same names,
/// so the statements that order by them read the same on both.
const POSTGRES: [&str; MIGRATIONS] = [
    // 1
    r#"
    CREATE TABLE sandboxes (
        id          TEXT PRIMARY KEY,
        name        TEXT NOT NULL UNIQUE,
        backend     TEXT NOT NULL,
        spec        TEXT NOT NULL,
        spec_hash   TEXT NOT NULL,
        backend_ref TEXT NOT NULL,
        created_at  BIGINT NOT NULL,
        updated_at  BIGINT NOT NULL
    );
    CREATE TABLE events (
        seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        sandbox_id   TEXT NOT NULL,
        sandbox_name TEXT NOT NULL,
        at           BIGINT NOT NULL,
        kind         TEXT NOT NULL,
        detail       TEXT NOT NULL
    );
    CREATE INDEX events_by_sandbox ON events (sandbox_id, seq);
    CREATE INDEX events_by_name ON events (sandbox_name, seq);
    CREATE FUNCTION events_are_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'events are append-only'; END $$;
    CREATE TRIGGER events_are_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_are_append_only();
    "#,
    // 2
    r#"
    CREATE TABLE leases (
        name        TEXT PRIMARY KEY,
        owner_pid   BIGINT NOT NULL,
        owner_start BIGINT NOT NULL,
        owner_boot  TEXT NOT NULL,
        owner_token TEXT NOT NULL,
        op          TEXT NOT NULL,
        acquired_at BIGINT NOT NULL
    );
    "#,
    // 3
    r#"
    CREATE TABLE images (
        image_id   TEXT PRIMARY KEY,
        config     TEXT NOT NULL,
        layers     TEXT NOT NULL,
        index_blob TEXT NOT NULL,
        bytes      BIGINT NOT NULL,
        stored_at  BIGINT NOT NULL
    );
    CREATE TABLE snapshots (
        rowid        BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
        id           TEXT PRIMARY KEY,
        sandbox_id   TEXT NOT NULL,
        sandbox_name TEXT NOT NULL,
        parent       TEXT,
        spec         TEXT NOT NULL,
        base_image   TEXT NOT NULL REFERENCES images (image_id),
        layers       TEXT NOT NULL,
        config       TEXT NOT NULL,
        message      TEXT,
        layer_bytes  BIGINT NOT NULL,
        new_bytes    BIGINT NOT NULL,
        created_at   BIGINT NOT NULL
    );
    CREATE INDEX snapshots_by_sandbox ON snapshots (sandbox_id, created_at);
    ALTER TABLE sandboxes ADD COLUMN origin_snapshot TEXT;
    "#,
    // 4
    r#"
    ALTER TABLE images ADD COLUMN identity TEXT;
    ALTER TABLE sandboxes ADD COLUMN baseline TEXT;
    "#,
    // 5
    r#"
    ALTER TABLE sandboxes ADD COLUMN checkpoint TEXT;
    "#,
    // 6
    r#"
    CREATE TABLE pools (
        name       TEXT PRIMARY KEY,
        spec       TEXT NOT NULL,
        size       BIGINT NOT NULL,
        created_at BIGINT NOT NULL
    );
    ALTER TABLE sandboxes ADD COLUMN pool TEXT;
    CREATE INDEX sandboxes_by_pool ON sandboxes (pool);
    "#,
    // 7
    r#"
    CREATE TABLE pending_rewinds (
        sandbox_id    TEXT PRIMARY KEY,
        snapshot      TEXT NOT NULL,
        layer_sha256  TEXT NOT NULL,
        fork          BIGINT NOT NULL,
        at            BIGINT NOT NULL
    );
    "#,
    // 8
    r#"
    ALTER TABLE pools ADD COLUMN snapshot TEXT;
    "#,
    // 9
    r#"
    ALTER TABLE sandboxes ADD COLUMN host TEXT;
    ALTER TABLE leases ADD COLUMN owner_host TEXT;
    CREATE TABLE hosts (
        name    TEXT PRIMARY KEY,
        seen_at BIGINT NOT NULL
    );
    CREATE TABLE settings (
        name  TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    CREATE TABLE blob_holds (
        digest TEXT NOT NULL,
        holder TEXT NOT NULL,
        at     BIGINT NOT NULL,
        PRIMARY KEY (digest, holder)
    );
    CREATE TABLE blob_deletions (
        digest TEXT PRIMARY KEY,
        at     BIGINT NOT NULL
    );
    "#,
];

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS as i64;

/// Applies the migrations a file lacks, all in one transaction, so a process
/// racing this one either sees the old schema or the new one.
pub(super) fn migrate_sqlite(conn: &mut Connection) -> Result<(), StateError> {
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
    for sql in SQLITE.iter().skip(start) {
        tx.execute_batch(sql).map_err(db("migrating the schema"))?;
    }
    if found < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(db("recording the schema version"))?;
    }
    tx.commit().map_err(db("committing the schema migration"))
}

/// How many times a migration whose connection was lost is tried.
const MIGRATE_TRIES: u32 = 5;

/// Applies the migrations a PostgreSQL database lacks (see
/// [`migrate_postgres_once`]), again when the server went away under it:
/// its transaction rolled back, or committed, which the next try's read of
/// the version tells (the connection is made again, the server waited for).
pub(super) fn migrate_postgres(pg: &Postgres) -> Result<(), StateError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match migrate_postgres_once(pg) {
            Err(StateError::Db { source, .. })
                if source.is_connection_lost() && tries < MIGRATE_TRIES => {}
            outcome => return outcome,
        }
    }
}

/// Applies the migrations a PostgreSQL database lacks, in one transaction
/// under an advisory lock, so two hosts starting at once migrate it once.
fn migrate_postgres_once(pg: &Postgres) -> Result<(), StateError> {
    // Every open after the first finds its version with one read (which
    // fails on a new database, whose version table is not there yet).
    if postgres_version(pg).ok() == Some(SCHEMA_VERSION) {
        return Ok(());
    }
    // One lock for every silo migrating this database (the number is
    // silo's own: "silo" in ASCII), taken before the transaction begins:
    // a serializable transaction reads as of its first statement, so the
    // version must be read after the lock is ours, not before.
    pg.batch("SELECT pg_advisory_lock(1936288879)")
        .map_err(db("locking the schema"))?;
    let migrated = pg.transaction(|tx: &dyn Sql| {
        tx.batch("CREATE TABLE IF NOT EXISTS silo_schema (version BIGINT NOT NULL)")
            .map_err(db("creating the schema's version table"))?;
        let found = postgres_version(tx)?;
        if found > SCHEMA_VERSION {
            return Err(StateError::NewerSchema {
                found,
                known: SCHEMA_VERSION,
            });
        }
        let start = usize::try_from(found).unwrap_or(0);
        for sql in POSTGRES.iter().skip(start) {
            tx.batch(sql).map_err(db("migrating the schema"))?;
        }
        tx.execute("DELETE FROM silo_schema", &[])
            .map_err(db("recording the schema version"))?;
        tx.execute(
            "INSERT INTO silo_schema (version) VALUES (?1)",
            args![SCHEMA_VERSION],
        )
        .map_err(db("recording the schema version"))?;
        Ok(())
    });
    // The lock goes with the connection if this fails.
    let _ = pg.batch("SELECT pg_advisory_unlock(1936288879)");
    match migrated {
        Outcome::Done(()) => Ok(()),
        Outcome::Failed(error) => Err(error),
        Outcome::Begin(source) | Outcome::Commit(source) => Err(StateError::Db {
            context: "committing the schema migration",
            source,
        }),
    }
}

/// The version a PostgreSQL database's schema is at (0 when new).
fn postgres_version(sql: &dyn Sql) -> Result<i64, StateError> {
    let row = sql
        .query_opt("SELECT max(version) FROM silo_schema", &[])
        .map_err(db("reading the schema version"))?;
    let version: Option<i64> = match row {
        Some(row) => row.get(0).map_err(db("reading the schema version"))?,
        None => None,
    };
    Ok(version.unwrap_or(0))
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
        migrate_sqlite(&mut conn).unwrap();
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
