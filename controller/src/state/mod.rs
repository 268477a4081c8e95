//! The controller's durable state: one SQLite database under `$SILO_HOME`,
//! or a fleet's shared PostgreSQL database (`SILO_STATE_URL`).
//!
//! It holds the sandboxes (spec, spec hash, and the backend's handle on the
//! machine) and an append-only event log. Several `silo` processes may use it
//! at once. SQLite runs in WAL mode (readers never block the writer), waits
//! on a busy lock instead of failing, and takes the write lock at the start
//! of every write transaction so two writers never deadlock on upgrading.
//! PostgreSQL runs every write transaction `SERIALIZABLE` and runs one that
//! lost a race again, which gives the same: each write sees the state as
//! its own reads found it. Uniqueness (of ids and names) is left to the
//! database's constraints rather than checked first, so a race between two
//! processes, or two hosts, cannot slip through.
//!
//! Layout: `sql` (the interface the tables are written against, and the
//! SQLite side of it), `postgres` (the PostgreSQL side), `schema`
//! (versioned migrations, for both engines), `sandboxes` (the live set),
//! `events` (the log), `blobs` (holds on a shared store's blobs against
//! gc), `hosts` (the hosts of a fleet, and what they
//! share), `leases` (who may run a lifecycle operation on a
//! sandbox right now), `pools` (warm pools and their members), `snapshots`
//! (snapshots and the base images whose layers the store keeps),
//! `master_key` (the key every sandbox key derives from).

mod blobs;
mod events;
mod hosts;
mod leases;
mod master_key;
mod pending;
mod pools;
mod postgres;
mod sandboxes;
mod schema;
mod snapshots;
pub(crate) mod sql;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use crate::retry::Deadline;
use postgres::{Outcome, Postgres};
use sql::{Sql, SqlError};

pub use events::{EventKind, EventRecord};
pub use hosts::HostRecord;
pub use leases::{LeaseAttempt, LeaseHolder, LeaseOwner};
pub use master_key::{MasterKeyError, load_or_create_master_key};
pub use pending::PendingRewind;
pub use pools::Pool;
pub use postgres::ScratchSchema;
pub use sandboxes::{Baseline, Checkpoint, NewSandbox, SandboxRecord, without_secrets};
pub use snapshots::{Snapshot, StoredImage};

/// How long a statement waits for another process's lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between tries to switch a new database to WAL mode.
const WAL_RETRY: Duration = Duration::from_millis(10);

/// Tries of a PostgreSQL write transaction that keeps losing races with
/// other hosts' before it is an error.
const WRITE_TRIES: u32 = 20;

/// An open state database. One per process is enough; share it behind a
/// mutex.
#[derive(Debug)]
pub struct StateDb {
    engine: Engine,
}

/// The database behind a [`StateDb`].
#[derive(Debug)]
enum Engine {
    /// A home's own file.
    Sqlite(Connection),
    /// A fleet's shared database.
    Postgres(Postgres),
}

impl StateDb {
    /// Opens (creating if needed) the database at `path` and brings its schema
    /// up to date.
    ///
    /// On a full disk nothing can be written, and a WAL database may not even
    /// open (its shared-memory file may need space). Then an up-to-date
    /// database is opened read-only as it was last checkpointed, so commands
    /// that only read still work, with a warning naming the full disk; and
    /// when that fails too, the error names the full disk rather than
    /// SQLite's "disk I/O error". The disk is checked before opening, not
    /// inferred from a failed open: with the WAL's files kept between
    /// processes, a writable open can succeed on a full disk.
    pub fn open(path: &Path) -> Result<Self, StateError> {
        let dir = path.parent().unwrap_or(path).to_owned();
        if !crate::fsutil::disk_is_full(&dir) {
            return Self::open_writable(path);
        }
        match Self::open_read_only(path) {
            Some(db) => {
                tracing::warn!(
                    "the disk holding {} is full: silo can read its state but change nothing \
                     until space is freed there",
                    dir.display()
                );
                Ok(db)
            }
            None => Err(StateError::DiskFull { dir }),
        }
    }

    fn open_writable(path: &Path) -> Result<Self, StateError> {
        let conn = Connection::open(path).map_err(|source| StateError::Open {
            path: path.to_owned(),
            source: source.into(),
        })?;
        let mut conn = configure(conn)?;
        schema::migrate_sqlite(&mut conn)?;
        Ok(Self {
            engine: Engine::Sqlite(conn),
        })
    }

    /// Connects to a fleet's PostgreSQL database (`postgres://…`) and
    /// brings its schema up to date.
    pub fn connect(url: &str) -> Result<Self, StateError> {
        let connect_error = |source| StateError::Connect {
            url: redacted(url),
            source,
        };
        let pg = Postgres::connect(url).map_err(connect_error)?;
        schema::migrate_postgres(&pg)?;
        Ok(Self {
            engine: Engine::Postgres(pg),
        })
    }

    /// Opens the database `location` names: a home's file, or a fleet's.
    pub fn open_at(location: &StateLocation) -> Result<Self, StateError> {
        match location {
            StateLocation::Sqlite(path) => Self::open(path),
            StateLocation::Postgres(url) => Self::connect(url),
        }
    }

    /// The engine, for statements outside a write transaction.
    fn sql(&self) -> &dyn Sql {
        match &self.engine {
            Engine::Sqlite(conn) => conn,
            Engine::Postgres(pg) => pg,
        }
    }

    /// The database as last checkpointed, read-only and without the WAL's
    /// shared memory (`immutable`), if its schema is this build's.
    fn open_read_only(path: &Path) -> Option<Self> {
        let uri = format!("file:{}?immutable=1", uri_path(path)?);
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI;
        let conn = Connection::open_with_flags(uri, flags).ok()?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .ok()?;
        (version == schema::SCHEMA_VERSION).then_some(Self {
            engine: Engine::Sqlite(conn),
        })
    }

    /// Runs `f` in one write transaction and commits it: on SQLite holding
    /// the write lock from its start, on PostgreSQL serializable, run
    /// again from its start when it lost a race with another writer.
    fn write<T>(
        &mut self,
        what: &'static str,
        mut f: impl FnMut(&dyn Sql) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        match &mut self.engine {
            Engine::Sqlite(conn) => {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(db(what))?;
                let value = f(&*tx)?;
                tx.commit().map_err(db(what))?;
                Ok(value)
            }
            Engine::Postgres(pg) => {
                let mut tries = 0;
                loop {
                    tries += 1;
                    let error = match pg.transaction(&mut f) {
                        Outcome::Done(value) => return Ok(value),
                        Outcome::Failed(StateError::Db { source, .. }) | Outcome::Begin(source) => {
                            source
                        }
                        Outcome::Failed(other) => return Err(other),
                        // The server rolled it back; a lost connection
                        // leaves its outcome unknown, so it is not run again.
                        Outcome::Commit(source) if source.is_retryable() => source,
                        Outcome::Commit(source) => {
                            return Err(StateError::Db {
                                context: "committing (whether it committed is unknown)",
                                source,
                            });
                        }
                    };
                    let again = error.is_retryable() || error.is_connection_lost();
                    if !again || tries >= WRITE_TRIES {
                        return Err(StateError::Db {
                            context: what,
                            source: error,
                        });
                    }
                    // Another host's transaction touched the same rows, or
                    // the server went away (the next try waits for it): a
                    // short, growing pause first.
                    std::thread::sleep(Duration::from_millis(u64::from(tries)));
                }
            }
        }
    }
}

/// Sets a new SQLite connection up as every state connection is.
fn configure(conn: Connection) -> Result<Connection, StateError> {
    // The busy timeout goes first: switching to WAL itself needs a lock
    // that another process may be holding.
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(db("setting the busy timeout"))?;
    let mode = switch_to_wal(&conn)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StateError::NoWal { mode });
    }
    // NORMAL is durable across application crashes in WAL mode; only a
    // power loss can drop the last transactions, never corrupt the file.
    conn.pragma_update(None, "synchronous", "normal")
        .map_err(db("setting synchronous mode"))?;
    conn.pragma_update(None, "foreign_keys", true)
        .map_err(db("enabling foreign keys"))?;
    keep_wal_files(&conn)?;
    Ok(conn)
}

/// Keeps the `-wal` and `-shm` files, emptied, when the last connection
/// closes. A `silo` command is most often the only connection, so
/// otherwise each one created both files on open and deleted them on
/// close: two file creations and two unlinks per command (docs/benchmarks.md).
fn keep_wal_files(conn: &Connection) -> Result<(), StateError> {
    conn.pragma_update(None, "journal_size_limit", 0)
        .map_err(db("limiting the WAL's size"))?;
    let mut persist: std::ffi::c_int = 1;
    // SAFETY: the handle is this open connection's and outlives the
    // call, "main" is a NUL-terminated schema name, and this opcode reads
    // and writes one int through the pointer, which points at a local.
    let code = unsafe {
        rusqlite::ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            rusqlite::ffi::SQLITE_FCNTL_PERSIST_WAL,
            (&raw mut persist).cast(),
        )
    };
    if code == rusqlite::ffi::SQLITE_OK {
        Ok(())
    } else {
        let source = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        Err(db("keeping the WAL's files")(source))
    }
}

/// Sets WAL mode and returns the mode in force. SQLite does not always
/// call the busy handler for this (two processes opening a new database
/// at once can get "database is locked" at once), so a busy answer is
/// retried here within the same timeout.
fn switch_to_wal(conn: &Connection) -> Result<String, StateError> {
    let deadline = Deadline::after(BUSY_TIMEOUT, WAL_RETRY);
    loop {
        let mode = conn.pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0));
        match mode {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) && !deadline.passed() =>
            {
                deadline.pause_blocking();
            }
            other => return other.map_err(db("switching to WAL mode")),
        }
    }
}

/// Milliseconds since the Unix epoch, the unit of every stored timestamp.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Why the state database could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// No live sandbox has this name or id.
    #[error("unknown sandbox {0:?}")]
    UnknownSandbox(String),
    /// No snapshot has this id (or starts with it).
    #[error("unknown snapshot {0:?}; `silo snapshots` lists them")]
    UnknownSnapshot(String),
    /// More than one snapshot starts with this id prefix.
    #[error("{0:?} names more than one snapshot; give more of its id")]
    AmbiguousSnapshot(String),
    /// Another live sandbox already has this name.
    #[error("a sandbox named {0:?} already exists")]
    NameTaken(String),
    /// No pool has this name.
    #[error("unknown pool {0:?}; `silo pool ls` lists them")]
    UnknownPool(String),
    /// Another pool already has this name.
    #[error("a pool named {0:?} already exists; `silo pool rm {0}` removes it")]
    PoolExists(String),
    /// The database file could not be opened.
    #[error("cannot open state database {}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: SqlError,
    },
    /// The fleet's database could not be reached.
    #[error("cannot connect to the state database at {url}")]
    Connect {
        /// Its address, without the password.
        url: String,
        /// Why.
        #[source]
        source: SqlError,
    },
    /// The disk holding the home is full, so the database cannot be opened.
    #[error(
        "the disk holding {} is full, so silo cannot open its state there; free space \
         on it (or point SILO_HOME elsewhere)",
        dir.display()
    )]
    DiskFull {
        /// The home directory.
        dir: PathBuf,
    },
    /// The file system refused WAL mode (e.g. a network file system).
    #[error("state database refused WAL mode (stuck in {mode:?}); keep SILO_HOME on a local disk")]
    NoWal {
        /// The journal mode it kept.
        mode: String,
    },
    /// `SILO_STATE_URL` names no state silo can use.
    #[error("{0}")]
    Location(String),
    /// The database was written by a newer silo.
    #[error(
        "state database has schema version {found}, newer than the {known} this silo knows; \
         upgrade silo"
    )]
    NewerSchema {
        /// The version found in the file.
        found: i64,
        /// The newest version this build can use.
        known: i64,
    },
    /// A stored row cannot be read back.
    #[error("stored record of sandbox {id} is unreadable: {what}")]
    Corrupt {
        /// The sandbox.
        id: String,
        /// What is wrong.
        what: String,
    },
    /// A database operation failed.
    #[error("state database: {context} failed")]
    Db {
        /// What was being done.
        context: &'static str,
        /// The engine's error.
        #[source]
        source: SqlError,
    },
}

/// Where the state lives: `SILO_STATE_URL`, read once by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateLocation {
    /// A SQLite file (the home's `state.db` by default).
    Sqlite(PathBuf),
    /// A PostgreSQL database, by its `postgres://` URL.
    Postgres(String),
}

impl StateLocation {
    /// The location `url` names, the home's file `default` when it is
    /// empty or `sqlite:`; `sqlite:PATH` names another file.
    pub fn parse(url: &str, default: &Path) -> Result<Self, String> {
        let url = url.trim();
        if url.is_empty() || url == "sqlite:" {
            return Ok(Self::Sqlite(default.to_owned()));
        }
        if let Some(path) = url.strip_prefix("sqlite:") {
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Self::Postgres(url.to_owned()));
        }
        Err(format!(
            "SILO_STATE_URL {:?} is neither sqlite:[PATH] nor postgres://…",
            redacted(url)
        ))
    }

    /// Whether it is a fleet's shared database.
    pub fn is_shared(&self) -> bool {
        matches!(self, Self::Postgres(_))
    }
}

impl std::fmt::Display for StateLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Self::Postgres(url) => f.write_str(&redacted(url)),
        }
    }
}

/// A database URL without its password, as it may be shown.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or(user, |(name, _)| name);
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// A path as an SQLite URI path: `%`, `?` and `#` escaped, UTF-8 only.
fn uri_path(path: &Path) -> Option<String> {
    let text = path.to_str()?;
    Some(
        text.replace('%', "%25")
            .replace('?', "%3f")
            .replace('#', "%23"),
    )
}

/// Wraps an engine's error with what was being done.
fn db<E: Into<SqlError>>(context: &'static str) -> impl FnOnce(E) -> StateError {
    move |source| StateError::Db {
        context,
        source: source.into(),
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    /// A database in a fresh temporary directory, kept alive by the returned guard.
    pub fn temp_db() -> (tempfile::TempDir, StateDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = StateDb::open(&dir.path().join("state.db")).unwrap();
        (dir, db)
    }

    /// What keeps a test's database alive: its directory, or its schema
    /// in the test server.
    pub enum Scratch {
        Dir(#[allow(dead_code)] tempfile::TempDir),
        Schema(#[allow(dead_code)] postgres::ScratchSchema),
    }

    /// The test server's URL (`SILO_TEST_POSTGRES_URL`, which
    /// `scripts/fleet.sh up` prints); in CI its absence is an error.
    pub fn test_postgres_url() -> Option<String> {
        match std::env::var("SILO_TEST_POSTGRES_URL") {
            Ok(url) if !url.is_empty() => Some(url),
            _ => {
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "CI=true but SILO_TEST_POSTGRES_URL is not set: `scripts/fleet.sh up` starts \
                     the test PostgreSQL and prints it"
                );
                None
            }
        }
    }

    /// An empty database on each engine this machine has: SQLite always,
    /// PostgreSQL (a schema of its own) when the test server is set.
    pub fn temp_dbs() -> Vec<(Scratch, StateDb)> {
        let (dir, db) = temp_db();
        let mut out = vec![(Scratch::Dir(dir), db)];
        if let Some((scratch, url)) = temp_postgres() {
            out.push((scratch, StateDb::connect(&url).unwrap()));
        }
        out
    }

    /// A fresh schema in the test server and a URL whose connections use
    /// it, if the server is set.
    pub fn temp_postgres() -> Option<(Scratch, String)> {
        let schema = postgres::ScratchSchema::create(&test_postgres_url()?).unwrap();
        let url = schema.url.clone();
        Some((Scratch::Schema(schema), url))
    }

    /// A local sandbox to insert, made from no snapshot.
    pub fn local_sandbox(id: &str, name: &str) -> NewSandbox {
        NewSandbox {
            id: id.into(),
            name: name.into(),
            spec: crate::spec::SandboxSpec::new(crate::spec::BackendKind::Local),
            origin_snapshot: None,
            host: "test-host".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::local_sandbox;
    use super::*;

    #[test]
    fn two_connections_share_one_wal_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let mut a = StateDb::open(&path).unwrap();
        let b = StateDb::open(&path).unwrap();
        let Engine::Sqlite(conn) = &b.engine else {
            unreachable!("opened from a file")
        };
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |row| row.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let made = a
            .insert_sandbox(&local_sandbox("sbx-00000000000a", "a"))
            .unwrap();
        assert_eq!(b.sandbox("a").unwrap(), made);
    }

    #[test]
    fn the_wal_files_outlive_the_last_connection_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let wal = dir.path().join("state.db-wal");
        let mut db = StateDb::open(&path).unwrap();
        let made = db
            .insert_sandbox(&local_sandbox("sbx-00000000000b", "kept"))
            .unwrap();
        assert!(std::fs::metadata(&wal).unwrap().len() > 0);
        drop(db);
        // Checkpointed into the database and emptied, not deleted.
        assert_eq!(std::fs::metadata(&wal).unwrap().len(), 0);
        assert!(dir.path().join("state.db-shm").exists());
        assert_eq!(StateDb::open(&path).unwrap().sandbox("kept").unwrap(), made);
    }

    #[test]
    fn concurrent_writers_all_land() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        drop(StateDb::open(&path).unwrap());
        std::thread::scope(|s| {
            for t in 0..4 {
                let path = &path;
                s.spawn(move || {
                    let mut db = StateDb::open(path).unwrap();
                    for i in 0..10 {
                        let new = local_sandbox(&format!("sbx-{t:06}{i:06}"), &format!("t{t}-{i}"));
                        db.insert_sandbox(&new).unwrap();
                    }
                });
            }
        });
        let db = StateDb::open(&path).unwrap();
        assert_eq!(db.sandboxes().unwrap().len(), 40);
    }

    #[test]
    fn concurrent_migrators_and_writers_on_postgres_all_land() {
        let Some((_scratch, url)) = test_support::temp_postgres() else {
            return;
        };
        // Four hosts find the database new at once: one migrates it.
        std::thread::scope(|s| {
            for t in 0..4 {
                let url = &url;
                s.spawn(move || {
                    let mut db = StateDb::connect(url).unwrap();
                    for i in 0..10 {
                        let new = local_sandbox(&format!("sbx-{t:06}{i:06}"), &format!("t{t}-{i}"));
                        db.insert_sandbox(&new).unwrap();
                    }
                });
            }
        });
        let db = StateDb::connect(&url).unwrap();
        assert_eq!(db.sandboxes().unwrap().len(), 40);
    }

    #[test]
    fn state_locations_and_their_passwords() {
        let home = Path::new("/home/state.db");
        assert_eq!(
            StateLocation::parse("", home).unwrap(),
            StateLocation::Sqlite(home.to_owned())
        );
        assert_eq!(
            StateLocation::parse("sqlite:", home).unwrap(),
            StateLocation::Sqlite(home.to_owned())
        );
        assert_eq!(
            StateLocation::parse("sqlite:/elsewhere.db", home).unwrap(),
            StateLocation::Sqlite("/elsewhere.db".into())
        );
        let pg = StateLocation::parse("postgres://silo:secret@127.0.0.1:5432/silo", home).unwrap();
        assert!(pg.is_shared());
        assert_eq!(pg.to_string(), "postgres://silo:***@127.0.0.1:5432/silo");
        let err = StateLocation::parse("mysql://u:secret@h/db", home).unwrap_err();
        assert!(
            err.contains("mysql://u:***@h/db") && !err.contains("secret"),
            "{err}"
        );
    }
}
