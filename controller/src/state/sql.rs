//! The one small interface the state's tables are written against, and the
//! two engines behind it: SQLite (a home's own database) and PostgreSQL (a
//! fleet's shared one).
//!
//! A statement is written once, in the SQL both engines read: numbered
//! parameters (`?1`, rewritten to `$1` for PostgreSQL), text, 64-bit
//! integers and NULL, `INSERT … ON CONFLICT`, no engine's own functions.
//! Where the two must differ (a JSON field, the schema's DDL) the caller
//! asks [`Sql::dialect`]. Rows come back as owned values, read by column
//! index with [`Row::get`], so nothing above this module names an engine.

use std::fmt;

/// Which engine a statement runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

impl Dialect {
    /// The text of `field` in the JSON object held by text column `column`
    /// (NULL when absent).
    pub fn json_text_field(self, column: &str, field: &str) -> String {
        match self {
            Self::Sqlite => format!("json_extract({column}, '$.{field}')"),
            Self::Postgres => format!("(({column})::jsonb ->> '{field}')"),
        }
    }
}

/// One statement parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum Param<'a> {
    /// SQL NULL.
    Null,
    /// A 64-bit integer (booleans are 0 and 1).
    Int(i64),
    /// Text.
    Text(&'a str),
}

/// What can be passed as a [`Param`].
pub trait ToParam {
    /// This value as a parameter.
    fn param(&self) -> Param<'_>;
}

impl ToParam for str {
    fn param(&self) -> Param<'_> {
        Param::Text(self)
    }
}

impl ToParam for String {
    fn param(&self) -> Param<'_> {
        Param::Text(self)
    }
}

impl ToParam for i64 {
    fn param(&self) -> Param<'_> {
        Param::Int(*self)
    }
}

impl ToParam for u32 {
    fn param(&self) -> Param<'_> {
        Param::Int(i64::from(*self))
    }
}

impl ToParam for u64 {
    /// Counts past `i64::MAX` (never reached by a size or a time) are kept
    /// at the largest value the column holds.
    fn param(&self) -> Param<'_> {
        Param::Int(i64::try_from(*self).unwrap_or(i64::MAX))
    }
}

impl ToParam for bool {
    fn param(&self) -> Param<'_> {
        Param::Int(i64::from(*self))
    }
}

impl<T: ToParam + ?Sized> ToParam for &T {
    fn param(&self) -> Param<'_> {
        (**self).param()
    }
}

impl<T: ToParam> ToParam for Option<T> {
    fn param(&self) -> Param<'_> {
        self.as_ref().map_or(Param::Null, ToParam::param)
    }
}

/// A statement's parameters: `args![a, b]` is `&[a.param(), b.param()]`.
macro_rules! args {
    ($($value:expr),* $(,)?) => {
        &[$($crate::state::sql::ToParam::param(&$value)),*][..]
    };
}
pub(crate) use args;

/// One column's value in a row read back.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// An integer.
    Int(i64),
    /// Text.
    Text(String),
}

/// One row read back, its columns in the statement's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub(super) Vec<Value>);

impl Row {
    /// Column `index` as a `T`.
    pub fn get<T: FromValue>(&self, index: usize) -> Result<T, SqlError> {
        let value = self.0.get(index).unwrap_or(&Value::Null);
        T::from_value(value).ok_or_else(|| SqlError::Column {
            index,
            wanted: T::WANTED,
            found: format!("{value:?}"),
        })
    }
}

/// What a column can be read as.
pub trait FromValue: Sized {
    /// What the column must hold, for the error when it does not.
    const WANTED: &'static str;
    /// The value, if it has this type.
    fn from_value(value: &Value) -> Option<Self>;
}

impl FromValue for String {
    const WANTED: &'static str = "text";
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Text(text) => Some(text.clone()),
            _ => None,
        }
    }
}

impl FromValue for i64 {
    const WANTED: &'static str = "an integer";
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }
}

impl FromValue for u32 {
    const WANTED: &'static str = "an integer from 0 to 2^32-1";
    fn from_value(value: &Value) -> Option<Self> {
        i64::from_value(value).and_then(|n| u32::try_from(n).ok())
    }
}

impl FromValue for bool {
    const WANTED: &'static str = "0 or 1";
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Int(0) => Some(false),
            Value::Int(1) => Some(true),
            _ => None,
        }
    }
}

impl<T: FromValue> FromValue for Option<T> {
    const WANTED: &'static str = T::WANTED;
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Null => Some(None),
            other => T::from_value(other).map(Some),
        }
    }
}

/// A connection, or a transaction on one, that runs statements.
pub trait Sql {
    /// The engine, for the few statements written per engine.
    fn dialect(&self) -> Dialect;
    /// Runs a statement; the number of rows it changed.
    fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, SqlError>;
    /// Runs a query; every row it returns.
    fn query(&self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, SqlError>;
    /// Runs statements separated by `;`, without parameters (DDL).
    fn batch(&self, sql: &str) -> Result<(), SqlError>;

    /// Runs a query; its first row, if any.
    fn query_opt(&self, sql: &str, params: &[Param<'_>]) -> Result<Option<Row>, SqlError> {
        Ok(self.query(sql, params)?.into_iter().next())
    }
}

/// Why a statement failed.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    /// SQLite said no.
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL said no, or its connection failed.
    #[error("{}", postgres_message(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// The engine itself could not be started (a thread, a runtime).
    #[error("{0}")]
    Engine(String),
    /// A column held something else than the code reads from it.
    #[error("column {index} holds {found}, not {wanted}")]
    Column {
        /// Its index in the row.
        index: usize,
        /// What was expected.
        wanted: &'static str,
        /// What was there.
        found: String,
    },
}

/// PostgreSQL's own message, with its detail, rather than the driver's
/// bare "db error".
fn postgres_message(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{} ({detail})", db.message()),
            None => db.message().to_owned(),
        },
        None => error.to_string(),
    }
}

impl SqlError {
    /// Whether this is a UNIQUE violation on `table.column`.
    pub fn violates_unique(&self, table: &str, column: &str) -> bool {
        match self {
            Self::Sqlite(rusqlite::Error::SqliteFailure(code, Some(message))) => {
                code.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    && message.contains(&format!("{table}.{column}"))
            }
            Self::Postgres(error) => error.as_db_error().is_some_and(|db| {
                db.code() == &tokio_postgres::error::SqlState::UNIQUE_VIOLATION
                    && db.constraint() == Some(&format!("{table}_{column}_key"))
            }),
            _ => false,
        }
    }

    /// Whether the connection to the server was lost or refused (it went
    /// away, or is restarting): the server is worth waiting for.
    pub fn is_connection_lost(&self) -> bool {
        use tokio_postgres::error::SqlState;
        let Self::Postgres(error) = self else {
            return false;
        };
        match error.code() {
            Some(code) => {
                code == &SqlState::ADMIN_SHUTDOWN
                    || code == &SqlState::CRASH_SHUTDOWN
                    || code == &SqlState::CANNOT_CONNECT_NOW
            }
            None => {
                error.is_closed()
                    || std::error::Error::source(error)
                        .is_some_and(|source| source.downcast_ref::<std::io::Error>().is_some())
            }
        }
    }

    /// Whether the transaction lost a race with another one and may be
    /// run again from its start (PostgreSQL's serializable isolation).
    pub fn is_retryable(&self) -> bool {
        let Self::Postgres(error) = self else {
            return false;
        };
        error.code().is_some_and(|code| {
            code == &tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
                || code == &tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED
        })
    }
}

impl fmt::Display for Param<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Null => f.write_str("NULL"),
            Self::Int(n) => write!(f, "{n}"),
            Self::Text(text) => write!(f, "{text:?}"),
        }
    }
}

// ------------------------------------------------------------------ SQLite

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Self::Null => ValueRef::Null,
            Self::Int(n) => ValueRef::Integer(*n),
            Self::Text(text) => ValueRef::Text(text.as_bytes()),
        }))
    }
}

impl Sql for rusqlite::Connection {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute(&self, sql: &str, params: &[Param<'_>]) -> Result<u64, SqlError> {
        let changed = self.execute(sql, rusqlite::params_from_iter(params))?;
        Ok(u64::try_from(changed).unwrap_or(u64::MAX))
    }

    fn batch(&self, sql: &str) -> Result<(), SqlError> {
        Ok(self.execute_batch(sql)?)
    }

    fn query(&self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, SqlError> {
        let mut stmt = self.prepare_cached(sql)?;
        let columns = stmt.column_count();
        let mut rows = stmt.query(rusqlite::params_from_iter(params))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let mut values = Vec::with_capacity(columns);
            for index in 0..columns {
                use rusqlite::types::ValueRef;
                values.push(match row.get_ref(index)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(n) => Value::Int(n),
                    ValueRef::Text(bytes) => {
                        Value::Text(String::from_utf8_lossy(bytes).into_owned())
                    }
                    ValueRef::Real(x) => Value::Text(x.to_string()),
                    ValueRef::Blob(bytes) => {
                        Value::Text(String::from_utf8_lossy(bytes).into_owned())
                    }
                });
            }
            out.push(Row(values));
        }
        Ok(out)
    }
}
