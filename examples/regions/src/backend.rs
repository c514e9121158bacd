//! The only backend-specific code: where the databases live, and a thin wrapper over each
//! backend's outbox calls (`outbox::sqlite::*` or `outbox::postgres::*`), so that the story and
//! the handlers are written once.
//!
//! The SQL the example runs itself is written once too: both SQLite and PostgreSQL accept
//! `$1` parameters, `BIGINT`/`TEXT` columns and `ON CONFLICT ... DO UPDATE`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox::admin::Admin;
use outbox::postgres::{PgDialect, PgStore};
use outbox::sqlite::{SqliteDialect, SqliteStore, Writable};
use outbox::{BoxError, DrainReport, Error, IntoModelBatch, Message, Registry, Relay, RelayConfig};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::sqlite::SqliteRow;
use sqlx::{
    AssertSqlSafe, Connection, Encode, Executor, FromRow, IntoArguments, PgConnection, PgPool,
    Postgres, Sqlite, SqlitePool, Transaction, Type,
};

/// How long to wait for a PostgreSQL server before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the example's databases live.
pub(crate) enum Backend {
    /// SQLite files in a temporary directory, removed at the end.
    Sqlite {
        /// The directory.
        dir: tempfile::TempDir,
    },
    /// Databases created on a PostgreSQL server, dropped at the end.
    Postgres {
        /// The server (its database is the one connected to for creating and dropping).
        server: Box<PgConnectOptions>,
        /// The prefix of the names of the databases this run creates: unique to the run.
        prefix: String,
        /// The databases created so far.
        created: Vec<String>,
    },
}

impl Backend {
    /// SQLite, in a new temporary directory: no server needed.
    pub(crate) fn sqlite() -> Result<Self, BoxError> {
        Ok(Self::Sqlite {
            dir: tempfile::tempdir()?,
        })
    }

    /// The PostgreSQL server at `url` (`postgres://user@host:port/database`), checked to
    /// answer. The example's databases are created next to `database`, never in it.
    pub(crate) async fn postgres(url: &str) -> Result<Self, BoxError> {
        let server: PgConnectOptions = url
            .parse()
            .map_err(|error| format!("the database URL is not a PostgreSQL URL: {error}"))?;
        let connection = admin_connection(&server).await?;
        connection.close().await?;
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
        Ok(Self::Postgres {
            server: Box::new(server),
            prefix: format!("regions_{}_{nanos:x}", std::process::id()),
            created: Vec::new(),
        })
    }

    /// Where the databases live, for the reader.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Sqlite { dir } => format!("SQLite, files in {}", dir.path().display()),
            Self::Postgres { server, prefix, .. } => format!(
                "PostgreSQL at {}@{}:{}, databases {prefix}_*",
                server.get_username(),
                server.get_host(),
                server.get_port()
            ),
        }
    }

    /// The prefix of the PostgreSQL databases this run creates (`None` on SQLite).
    #[cfg_attr(not(test), expect(dead_code, reason = "the tests check the clean-up"))]
    pub(crate) fn database_prefix(&self) -> Option<&str> {
        match self {
            Self::Sqlite { .. } => None,
            Self::Postgres { prefix, .. } => Some(prefix),
        }
    }

    /// Creates an empty database called `name` (a file `name.db`, or a PostgreSQL database
    /// `<prefix>_name`) and applies the outbox migrations to it.
    pub(crate) async fn create_database(&mut self, name: &str) -> Result<Database, BoxError> {
        let database = match self {
            Self::Sqlite { dir } => {
                let pool = outbox::sqlite::connect(&dir.path().join(format!("{name}.db"))).await?;
                outbox::sqlite::migrate(&pool).await?;
                Database::Sqlite(pool)
            }
            Self::Postgres {
                server,
                prefix,
                created,
            } => {
                let database = format!("{prefix}_{name}");
                let mut admin = admin_connection(server).await?;
                sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{database}\"")))
                    .execute(&mut admin)
                    .await?;
                admin.close().await?;
                created.push(database.clone());
                let pool = PgPoolOptions::new()
                    .max_connections(5)
                    .acquire_timeout(CONNECT_TIMEOUT)
                    .connect_with(server.clone().database(&database))
                    .await?;
                outbox::postgres::migrate(&pool).await?;
                Database::Postgres(pool)
            }
        };
        Ok(database)
    }

    /// Closes `databases` and removes them: the temporary directory goes with `self`, the
    /// PostgreSQL databases are dropped.
    pub(crate) async fn remove(
        self,
        databases: impl IntoIterator<Item = Database>,
    ) -> Result<(), BoxError> {
        for database in databases {
            database.close().await;
        }
        if let Self::Postgres {
            server, created, ..
        } = self
        {
            let mut admin = admin_connection(&server).await?;
            for database in created {
                sqlx::query(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{database}\" WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await?;
            }
            admin.close().await?;
        }
        Ok(())
    }
}

/// A connection to the server's own database, for creating and dropping the example's.
async fn admin_connection(server: &PgConnectOptions) -> Result<PgConnection, BoxError> {
    let at = format!("{}:{}", server.get_host(), server.get_port());
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(server)).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(error)) => Err(format!("cannot connect to PostgreSQL at {at}: {error}").into()),
        Err(_) => {
            Err(format!("no answer from PostgreSQL at {at} within {CONNECT_TIMEOUT:?}").into())
        }
    }
}

/// A value bound to a `$n` parameter of the example's own SQL.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value<'a> {
    /// An integer.
    Int(i64),
    /// A string.
    Text(&'a str),
}

/// Runs `sql` with `values` bound to `$1`, `$2`... on any sqlx executor of either backend.
async fn execute<'c, DB, E>(
    executor: E,
    sql: &'static str,
    values: &[Value<'_>],
) -> Result<(), sqlx::Error>
where
    DB: sqlx::Database,
    E: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
    for<'a> String: Encode<'a, DB> + Type<DB>,
{
    let mut query = sqlx::query::<DB>(sql);
    for value in values {
        query = match *value {
            Value::Int(int) => query.bind(int),
            Value::Text(text) => query.bind(text.to_owned()),
        };
    }
    query.execute(executor).await?;
    Ok(())
}

/// One database of the example, on either backend.
#[derive(Debug, Clone)]
pub(crate) enum Database {
    /// A SQLite database.
    Sqlite(SqlitePool),
    /// A PostgreSQL database.
    Postgres(PgPool),
}

impl Database {
    /// Runs `sql` with `values` bound to `$1`, `$2`....
    pub(crate) async fn execute(
        &self,
        sql: &'static str,
        values: &[Value<'_>],
    ) -> Result<(), sqlx::Error> {
        match self {
            Self::Sqlite(pool) => execute(pool, sql, values).await,
            Self::Postgres(pool) => execute(pool, sql, values).await,
        }
    }

    /// The rows `sql` returns, as `T`s.
    pub(crate) async fn fetch_all<T>(&self, sql: &'static str) -> Result<Vec<T>, sqlx::Error>
    where
        T: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        match self {
            Self::Sqlite(pool) => sqlx::query_as(sql).fetch_all(pool).await,
            Self::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await,
        }
    }

    /// Begins a transaction.
    pub(crate) async fn begin(&self) -> Result<Tx, sqlx::Error> {
        Ok(match self {
            Self::Sqlite(pool) => Tx::Sqlite(pool.begin().await?),
            Self::Postgres(pool) => Tx::Postgres(pool.begin().await?),
        })
    }

    /// How many outbox messages are waiting for the relay.
    pub(crate) async fn pending_messages(&self) -> Result<usize, Error> {
        const LIMIT: usize = 1000;
        Ok(match self {
            Self::Sqlite(pool) => {
                SqliteStore::new(pool.clone())
                    .pending_messages(LIMIT)
                    .await?
            }
            Self::Postgres(pool) => PgStore::new(pool.clone()).pending_messages(LIMIT).await?,
        }
        .len())
    }

    /// Runs a relay on this database's outbox until nothing is due.
    pub(crate) async fn drain(
        &self,
        registry: Registry,
        config: RelayConfig,
    ) -> Result<DrainReport, Error> {
        match self {
            Self::Sqlite(pool) => {
                let store = SqliteStore::new(pool.clone());
                Relay::with_config(store, registry, config).drain().await
            }
            Self::Postgres(pool) => {
                let store = PgStore::new(pool.clone());
                Relay::with_config(store, registry, config).drain().await
            }
        }
    }

    /// Closes the pool.
    async fn close(&self) {
        match self {
            Self::Sqlite(pool) => pool.close().await,
            Self::Postgres(pool) => pool.close().await,
        }
    }
}

/// An open transaction on a [`Database`]: business writes and outbox writes commit, or roll
/// back, together.
#[derive(Debug)]
pub(crate) enum Tx {
    /// On SQLite.
    Sqlite(Transaction<'static, Sqlite>),
    /// On PostgreSQL.
    Postgres(Transaction<'static, Postgres>),
}

impl Tx {
    /// Runs `sql` with `values` bound to `$1`, `$2`....
    pub(crate) async fn execute(
        &mut self,
        sql: &'static str,
        values: &[Value<'_>],
    ) -> Result<(), sqlx::Error> {
        match self {
            Self::Sqlite(tx) => execute(&mut **tx, sql, values).await,
            Self::Postgres(tx) => execute(&mut **tx, sql, values).await,
        }
    }

    /// Writes outbox messages, in one statement.
    pub(crate) async fn write_all(&mut self, messages: &[Message]) -> Result<(), Error> {
        match self {
            Self::Sqlite(tx) => outbox::sqlite::write_all(&mut **tx, messages).await?,
            Self::Postgres(tx) => outbox::postgres::write_all(&mut **tx, messages).await?,
        };
        Ok(())
    }

    /// Inserts models, with their outboxes.
    pub(crate) async fn insert<'a, M: Model>(
        &mut self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        match self {
            Self::Sqlite(tx) => outbox::sqlite::insert(tx, models).await,
            Self::Postgres(tx) => outbox::postgres::insert(tx, models).await,
        }
    }

    /// Updates models, with their outboxes.
    pub(crate) async fn update<'a, M: Model>(
        &mut self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        match self {
            Self::Sqlite(tx) => outbox::sqlite::update(tx, models).await,
            Self::Postgres(tx) => outbox::postgres::update(tx, models).await,
        }
    }

    /// Deletes models, with their outboxes (carrying their tombstones).
    pub(crate) async fn delete<'a, M: Model>(
        &mut self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        match self {
            Self::Sqlite(tx) => outbox::sqlite::delete(tx, models).await,
            Self::Postgres(tx) => outbox::postgres::delete(tx, models).await,
        }
    }

    /// Commits.
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Sqlite(tx) => tx.commit().await,
            Self::Postgres(tx) => tx.commit().await,
        }
    }

    /// Rolls back.
    pub(crate) async fn rollback(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Sqlite(tx) => tx.rollback().await,
            Self::Postgres(tx) => tx.rollback().await,
        }
    }
}

/// A replicated model both backends write.
pub(crate) trait Model: Writable<SqliteDialect> + Writable<PgDialect> {}

impl<M: Writable<SqliteDialect> + Writable<PgDialect>> Model for M {}
