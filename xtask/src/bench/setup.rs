//! Databases for the benchmarks: a fresh PostgreSQL database per scenario (dropped at the
//! end), a SQLite file in a temporary directory; and the category the scenarios write.

use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};

use outbox_core::{Category, CategoryId, Scope, ScopeId};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, SqlitePool};

/// Turns any error into the bench's error: what was being done, and why it failed.
pub(crate) fn failed<E: Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |error| format!("{what}: {error}")
}

/// The PostgreSQL server the benchmark databases are created on.
pub(crate) struct Server {
    options: PgConnectOptions,
    /// `SELECT version()`.
    pub(crate) version: String,
}

impl Server {
    pub(crate) async fn new(url: &str) -> Result<Self, String> {
        let options: PgConnectOptions = url
            .parse()
            .map_err(failed("the database URL is not a PostgreSQL URL"))?;
        let mut connection = PgConnection::connect_with(&options)
            .await
            .map_err(|error| {
                format!(
                    "no PostgreSQL server answers at {}: {error}",
                    outbox_core::redact_url(url)
                )
            })?;
        let version: String = sqlx::query_scalar("SELECT version()")
            .fetch_one(&mut connection)
            .await
            .map_err(failed("reading the server version"))?;
        connection.close().await.ok();
        Ok(Self { options, version })
    }

    /// A fresh, migrated database; dropped with the returned value's `drop_database`.
    pub(crate) async fn database(&self, connections: u32) -> Result<PgDatabase, String> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "outbox_bench_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut admin = PgConnection::connect_with(&self.options)
            .await
            .map_err(failed("connecting to the server"))?;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut admin)
            .await
            .map_err(failed("creating a benchmark database"))?;
        admin.close().await.ok();
        let options = self.options.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .connect_with(options)
            .await
            .map_err(failed("connecting to the benchmark database"))?;
        outbox_postgres::migrate(&pool)
            .await
            .map_err(failed("migrating the benchmark database"))?;
        Ok(PgDatabase {
            name,
            server: self.options.clone(),
            pool,
        })
    }
}

/// A benchmark database on the PostgreSQL server.
pub(crate) struct PgDatabase {
    name: String,
    server: PgConnectOptions,
    /// A pool on it.
    pub(crate) pool: PgPool,
}

impl PgDatabase {
    /// Its URL, for a child process.
    pub(crate) fn url(&self) -> String {
        format!(
            "postgres://{}@{}:{}/{}",
            self.server.get_username(),
            self.server.get_host(),
            self.server.get_port(),
            self.name
        )
    }

    /// Drops the database.
    pub(crate) async fn drop_database(self) -> Result<(), String> {
        self.pool.close().await;
        let mut admin = PgConnection::connect_with(&self.server)
            .await
            .map_err(failed("connecting to the server"))?;
        sqlx::query(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        )))
        .execute(&mut admin)
        .await
        .map_err(failed("dropping a benchmark database"))?;
        admin.close().await.ok();
        Ok(())
    }
}

/// A SQLite benchmark database in a temporary directory, removed when dropped.
pub(crate) struct SqliteDatabase {
    _dir: tempfile::TempDir,
    /// A pool on it.
    pub(crate) pool: SqlitePool,
}

impl SqliteDatabase {
    pub(crate) async fn new() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(failed("creating a temporary directory"))?;
        let pool = outbox_sqlite::connect(&dir.path().join("bench.db"))
            .await
            .map_err(failed("opening the SQLite database"))?;
        outbox_sqlite::migrate(&pool)
            .await
            .map_err(failed("migrating the SQLite database"))?;
        Ok(Self { _dir: dir, pool })
    }
}

/// The scope of the benchmark messages.
pub(crate) struct Accounts;

impl Scope for Accounts {
    const ID: ScopeId = ScopeId(1);
    const NAME: &'static str = "accounts";
}

/// What every benchmark message carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Transfer {
    /// The account changed.
    pub(crate) account: i64,
    /// By how much.
    pub(crate) amount: i64,
}

/// The benchmark category: coalescing, as most are.
pub(crate) struct Transferred;

impl Category for Transferred {
    type Scope = Accounts;
    type Payload = Transfer;
    const ID: CategoryId = CategoryId(1);
    const NAME: &'static str = "transferred";
}
