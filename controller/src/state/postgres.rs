//! The PostgreSQL engine: a fleet's shared state, reached over one
//! connection per process.
//!
//! The state's methods are synchronous (SQLite is a local file), and they
//! are called from inside async tasks, where a runtime may not be started
//! again. So the connection is driven by a thread of its own, on its own
//! small runtime, and a statement is a request sent to it: the caller
//! waits for the answer with a plain executor, on whichever thread it is.
//!
//! A lost connection (the server restarted) is made again, the server
//! waited for up to [`RECONNECT_WAIT`]: a statement outside a transaction
//! is sent again on the new connection, and a transaction that lost its
//! connection before its commit was sent (the server rolled it back) is
//! run again from its start. One that lost it during the commit fails:
//! whether it committed cannot be known, so it is not run twice.
//! Transactions are `SERIALIZABLE`, so what SQLite's single writer gives
//! (read, decide, write) holds across hosts too; one that loses a race
//! fails with a retryable error and is run again from its start
//! (`StateDb::write`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{Client, NoTls, Statement};

use super::sql::{Dialect, Param, Row, Sql, SqlError, Value};

/// How long connecting may take before it is an error.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a server that went away is waited for: a restart takes a
/// second or two.
pub const RECONNECT_WAIT: Duration = Duration::from_secs(15);
/// Pause between tries to reach it again.
const RECONNECT_POLL: Duration = Duration::from_millis(100);

/// How a transaction ended.
pub enum Outcome<T> {
    /// Committed.
    Done(T),
    /// Its work failed, and it was rolled back.
    Failed(super::StateError),
    /// It could not begin.
    Begin(SqlError),
    /// Its commit failed: rolled back when the server said so, unknown
    /// when the connection went.
    Commit(SqlError),
}

/// A fleet's database: its address, and the connection when one is open.
pub struct Postgres {
    config: tokio_postgres::Config,
    live: Mutex<Option<Arc<Connection>>>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("hosts", &self.config.get_hosts())
            .field("dbname", &self.config.get_dbname())
            .finish_non_exhaustive()
    }
}

/// One open connection and the statements prepared on it.
struct Connection {
    client: Client,
    prepared: Mutex<HashMap<String, Statement>>,
}

impl Postgres {
    /// Connects to the database `url` names (`postgres://user:pass@host/db`).
    pub fn connect(url: &str) -> Result<Self, SqlError> {
        let mut config: tokio_postgres::Config = url.parse()?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.application_name("silo");
        let db = Self {
            config,
            live: Mutex::new(None),
        };
        db.connection()?;
        Ok(db)
    }

    /// The open connection, made again if it was lost: the first one is
    /// made at once or not at all (a wrong address is said at once), a
    /// lost one is waited for.
    fn connection(&self) -> Result<Arc<Connection>, SqlError> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(conn) = live.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(Arc::clone(conn));
        }
        let wait = if live.is_some() {
            RECONNECT_WAIT
        } else {
            Duration::ZERO
        };
        self.open_into(&mut live, wait)
    }

    /// A new connection in place of `lost`, which a statement found gone
    /// (its client may not say it is closed yet): the server waited for up
    /// to [`RECONNECT_WAIT`]. One another caller made meanwhile is taken.
    fn reconnect(&self, lost: &Arc<Connection>) -> Result<Arc<Connection>, SqlError> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(conn) = live
            .as_ref()
            .filter(|c| !Arc::ptr_eq(c, lost) && !c.client.is_closed())
        {
            return Ok(Arc::clone(conn));
        }
        self.open_into(&mut live, RECONNECT_WAIT)
    }

    /// Opens a connection into `live`, trying for `wait` while the server
    /// cannot be reached.
    fn open_into(
        &self,
        live: &mut Option<Arc<Connection>>,
        wait: Duration,
    ) -> Result<Arc<Connection>, SqlError> {
        let deadline = Instant::now() + wait;
        let conn = loop {
            match open(self.config.clone()) {
                Ok(conn) => break Arc::new(conn),
                Err(error) if error.is_connection_lost() && Instant::now() < deadline => {
                    std::thread::sleep(RECONNECT_POLL);
                }
                Err(error) => return Err(error),
            }
        };
        *live = Some(Arc::clone(&conn));
        Ok(conn)
    }

    /// `statement` on the connection, sent again on a new one when the
    /// old one turns out lost (a read, or DDL that is all or nothing).
    fn again_if_lost<T>(
        &self,
        statement: impl Fn(&Connection) -> Result<T, SqlError>,
    ) -> Result<T, SqlError> {
        let conn = self.connection()?;
        match statement(conn.as_ref()) {
            Err(error) if error.is_connection_lost() => statement(self.reconnect(&conn)?.as_ref()),
            outcome => outcome,
        }
    }

    /// Runs `f` in one serializable transaction on one connection.
    pub fn transaction<T>(
        &self,
        f: impl FnOnce(&dyn Sql) -> Result<T, super::StateError>,
    ) -> Outcome<T> {
        // A connection found lost at BEGIN has run nothing: made again,
        // and begun on.
        let begin = |conn: Arc<Connection>| {
            conn.batch("BEGIN ISOLATION LEVEL SERIALIZABLE")
                .map(|()| Arc::clone(&conn))
                .map_err(|error| (error, conn))
        };
        let begun = self.connection().and_then(|conn| match begin(conn) {
            Err((error, lost)) if error.is_connection_lost() => {
                begin(self.reconnect(&lost)?).map_err(|(error, _)| error)
            }
            other => other.map_err(|(error, _)| error),
        });
        let conn = match begun {
            Ok(conn) => conn,
            Err(error) => return Outcome::Begin(error),
        };
        let tx = Transaction(&conn);
        match f(&tx) {
            Ok(value) => match conn.batch("COMMIT") {
                Ok(()) => Outcome::Done(value),
                Err(error) => Outcome::Commit(error),
            },
            Err(error) => {
                // A connection gone takes its transaction with it; nothing
                // else is left to undo.
                let _ = conn.batch("ROLLBACK");
                Outcome::Failed(error)
            }
        }
    }
}

/// A schema of its own in a PostgreSQL database, for one test's state:
/// `url` is the database's URL with its connections put in the schema,
/// and dropping this drops the schema with everything in it.
#[derive(Debug)]
pub struct ScratchSchema {
    admin: String,
    schema: String,
    /// The URL whose connections use the schema.
    pub url: String,
}

impl ScratchSchema {
    /// A new, empty schema in the database `admin` names.
    pub fn create(admin: &str) -> Result<Self, SqlError> {
        let mut bytes = [0u8; 6];
        getrandom::fill(&mut bytes)
            .map_err(|e| SqlError::Engine(format!("no randomness for a schema name: {e}")))?;
        let schema = format!("silo_test_{}", hex::encode(bytes));
        Postgres::connect(admin)?.batch(&format!("CREATE SCHEMA {schema}"))?;
        let joiner = if admin.contains('?') { '&' } else { '?' };
        Ok(Self {
            url: format!("{admin}{joiner}options=-csearch_path%3D{schema}"),
            admin: admin.to_owned(),
            schema,
        })
    }
}

impl ScratchSchema {
    /// The schema's name (unique: it serves as a test's prefix elsewhere).
    pub fn name(&self) -> &str {
        &self.schema
    }
}

impl Drop for ScratchSchema {
    fn drop(&mut self) {
        if let Ok(pg) = Postgres::connect(&self.admin) {
            let _ = pg.batch(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
        }
    }
}

/// Connects on a thread of its own that then drives the connection until
/// the client is dropped.
fn open(config: tokio_postgres::Config) -> Result<Connection, SqlError> {
    let (ready, answer) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("silo-postgres".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = ready.send(Err(Failure::Runtime(error.to_string())));
                    return;
                }
            };
            runtime.block_on(async move {
                match config.connect(NoTls).await {
                    Ok((client, connection)) => {
                        let _ = ready.send(Ok(client));
                        // Ends with an error when the server goes away;
                        // the client then reports itself closed.
                        let _ = connection.await;
                    }
                    Err(error) => {
                        let _ = ready.send(Err(Failure::Connect(error)));
                    }
                }
            });
        });
    if let Err(error) = spawned {
        return Err(SqlError::Engine(format!(
            "cannot start the PostgreSQL connection's thread: {error}"
        )));
    }
    match answer.recv() {
        Ok(Ok(client)) => Ok(Connection {
            client,
            prepared: Mutex::new(HashMap::new()),
        }),
        Ok(Err(Failure::Connect(error))) => Err(SqlError::Postgres(error)),
        Ok(Err(Failure::Runtime(error))) => Err(SqlError::Engine(format!(
            "cannot start the PostgreSQL connection's runtime: {error}"
        ))),
        Err(_) => Err(SqlError::Engine(
            "the PostgreSQL connection's thread ended before connecting".into(),
        )),
    }
}

/// Why the connection's thread could not hand over a client.
enum Failure {
    Connect(tokio_postgres::Error),
    Runtime(String),
}

/// Waits for a request to the connection's thread.
fn wait<T>(request: impl Future<Output = T>) -> T {
    futures_executor::block_on(request)
}

impl Connection {
    /// `sql` prepared once per connection (its `?N` as `$N`).
    fn statement(&self, sql: &str) -> Result<Statement, SqlError> {
        if let Some(statement) = self
            .prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sql)
        {
            return Ok(statement.clone());
        }
        let statement = wait(self.client.prepare(&numbered(sql)))?;
        self.prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, SqlError> {
        let statement = self.statement(sql)?;
        Ok(wait(self.client.execute(&statement, &as_sql(params)))?)
    }

    fn query(&self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, SqlError> {
        let statement = self.statement(sql)?;
        let rows = wait(self.client.query(&statement, &as_sql(params)))?;
        rows.iter().map(read_row).collect()
    }

    fn batch(&self, sql: &str) -> Result<(), SqlError> {
        Ok(wait(self.client.batch_execute(sql))?)
    }
}

/// Outside a transaction the state only reads (and migrates, all or
/// nothing), so a statement whose connection was lost is sent again.
impl Sql for Postgres {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, SqlError> {
        self.again_if_lost(|conn| conn.execute(sql, params))
    }

    fn query(&self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, SqlError> {
        self.again_if_lost(|conn| conn.query(sql, params))
    }

    fn batch(&self, sql: &str) -> Result<(), SqlError> {
        self.again_if_lost(|conn| conn.batch(sql))
    }
}

/// Statements inside a transaction: always on the connection it began on.
struct Transaction<'a>(&'a Connection);

impl Sql for Transaction<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, SqlError> {
        self.0.execute(sql, params)
    }

    fn query(&self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, SqlError> {
        self.0.query(sql, params)
    }

    fn batch(&self, sql: &str) -> Result<(), SqlError> {
        self.0.batch(sql)
    }
}

/// SQLite's `?N` parameters as PostgreSQL's `$N`. The state's statements
/// hold no `?` of their own (no string literal, no JSON operator has one).
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('$');
        } else {
            out.push(c);
        }
    }
    out
}

fn as_sql<'a>(params: &'a [Param<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

fn read_row(row: &tokio_postgres::Row) -> Result<Row, SqlError> {
    let mut values = Vec::with_capacity(row.len());
    for (index, column) in row.columns().iter().enumerate() {
        let ty = column.type_();
        let value = if *ty == Type::INT8 {
            row.try_get::<_, Option<i64>>(index)?.map(Value::Int)
        } else if *ty == Type::INT4 {
            row.try_get::<_, Option<i32>>(index)?
                .map(|n| Value::Int(i64::from(n)))
        } else if *ty == Type::INT2 {
            row.try_get::<_, Option<i16>>(index)?
                .map(|n| Value::Int(i64::from(n)))
        } else if *ty == Type::BOOL {
            row.try_get::<_, Option<bool>>(index)?
                .map(|b| Value::Int(i64::from(b)))
        } else {
            row.try_get::<_, Option<String>>(index)?.map(Value::Text)
        };
        values.push(value.unwrap_or(Value::Null));
    }
    Ok(Row(values))
}

impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Self::Null => Ok(IsNull::Yes),
            Self::Text(text) => text.to_sql(ty, out),
            Self::Int(n) if *ty == Type::INT8 => n.to_sql(ty, out),
            Self::Int(n) if *ty == Type::INT4 => i32::try_from(*n)?.to_sql(ty, out),
            Self::Int(n) if *ty == Type::INT2 => i16::try_from(*n)?.to_sql(ty, out),
            Self::Int(n) if *ty == Type::BOOL => (*n != 0).to_sql(ty, out),
            Self::Int(n) => Err(format!("the integer {n} given for a {ty} parameter").into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        // Checked per value in `to_sql`: a parameter's type is the column's.
        true
    }

    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::numbered;

    #[test]
    fn parameters_are_numbered_the_postgres_way() {
        assert_eq!(
            numbered("SELECT a FROM t WHERE b = ?1 AND c IN (?2, ?10)"),
            "SELECT a FROM t WHERE b = $1 AND c IN ($2, $10)"
        );
        assert_eq!(numbered("SELECT '?' || x"), "SELECT '?' || x");
    }
}
