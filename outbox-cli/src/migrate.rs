//! Opening the database a URL names, and `outbox migrate`: applying the migrations, or
//! printing their SQL for a migration tool of the user's own.

use std::fmt::Write as _;
use std::io::Write;
use std::str::FromStr;

use outbox_core::Error;
use outbox_core::store::MIGRATIONS_TABLE;
use outbox_postgres::PgDialect;
use outbox_sqlite::SqliteDialect;
use outbox_sqlx::Dialect;
use outbox_sqlx::migrate::migrate_error;
use sqlx::migrate::Migrate;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{PgPool, SqlitePool};

use crate::CliError;
use crate::output::Printer;

/// The two backends a URL can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    fn of(url: &str) -> Result<Self, CliError> {
        let scheme = url
            .split(':')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        match scheme.as_str() {
            "postgres" | "postgresql" => Ok(Self::Postgres),
            "sqlite" => Ok(Self::Sqlite),
            _ => Err(
                Error::invalid_database_url(url, "expected a `postgres://` or `sqlite:` URL")
                    .into(),
            ),
        }
    }
}

/// An open database.
#[derive(Debug)]
pub(crate) enum Database {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

impl Database {
    /// Opens the database `url` names. A SQLite file must exist, except for `migrate`
    /// (`create`), which creates it.
    async fn connect(url: &str, create: bool) -> Result<Self, CliError> {
        match Backend::of(url)? {
            Backend::Postgres => Ok(Self::Postgres(outbox_postgres::connect(url).await?)),
            Backend::Sqlite => {
                let options = SqliteConnectOptions::from_str(url)
                    .map_err(|error| Error::invalid_database_url(url, error.to_string()))?;
                let file = options.get_filename();
                if !create && !file.exists() {
                    return Err(CliError::Unreachable(format!(
                        "no database file at {}: check the URL (`outbox migrate` creates one)",
                        file.display()
                    )));
                }
                let pool = outbox_sqlite::connect(std::path::Path::new(url)).await?;
                Ok(Self::Sqlite(pool))
            }
        }
    }

    /// Opens the database `url` names, which must exist.
    pub(crate) async fn open(url: &str) -> Result<Self, CliError> {
        Self::connect(url, false).await
    }

    pub(crate) async fn close(&self) {
        match self {
            Self::Postgres(pool) => pool.close().await,
            Self::Sqlite(pool) => pool.close().await,
        }
    }

    /// The versions of the outbox migrations the database has applied.
    async fn applied(&self) -> Result<Vec<i64>, Error> {
        match self {
            Self::Postgres(pool) => {
                let failed = migrate_error::<PgDialect>;
                let mut conn = pool.acquire().await.map_err(|e| failed(e.into()))?;
                applied(&mut *conn).await.map_err(failed)
            }
            Self::Sqlite(pool) => {
                let failed = migrate_error::<SqliteDialect>;
                let mut conn = pool.acquire().await.map_err(|e| failed(e.into()))?;
                applied(&mut *conn).await.map_err(failed)
            }
        }
    }
}

/// The applied versions, none if the table does not exist yet.
async fn applied(conn: &mut impl Migrate) -> Result<Vec<i64>, sqlx::migrate::MigrateError> {
    conn.ensure_migrations_table(MIGRATIONS_TABLE).await?;
    let mut versions: Vec<i64> = conn
        .list_applied_migrations(MIGRATIONS_TABLE)
        .await?
        .into_iter()
        .map(|migration| migration.version)
        .collect();
    versions.sort_unstable();
    Ok(versions)
}

/// What `outbox migrate` did.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Migrated {
    /// The versions applied before.
    pub(crate) before: Vec<i64>,
    /// The versions applied after.
    pub(crate) after: Vec<i64>,
}

/// `outbox migrate [--print]`.
pub(crate) async fn run(
    url: &str,
    print: bool,
    printer: &Printer<'_>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let backend = Backend::of(url)?;
    if print {
        let sql = match backend {
            Backend::Postgres => {
                script::<PgDialect>(POSTGRES_TABLE, |bytes| format!("'\\x{bytes}'"))
            }
            Backend::Sqlite => script::<SqliteDialect>(SQLITE_TABLE, |bytes| format!("X'{bytes}'")),
        };
        return printer.sql(out, &sql);
    }
    let database = Database::connect(url, true).await?;
    let result = async {
        let before = database.applied().await?;
        match &database {
            Database::Postgres(pool) => outbox_postgres::migrate(pool).await?,
            Database::Sqlite(pool) => outbox_sqlite::migrate(pool).await?,
        }
        let after = database.applied().await?;
        Ok::<_, CliError>(Migrated { before, after })
    }
    .await;
    database.close().await;
    printer.migrated(out, &result?)
}

/// The migrations table as the library's migrator (sqlx's) creates it, on each backend.
const POSTGRES_TABLE: &str = "CREATE TABLE IF NOT EXISTS _outbox_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
    success BOOLEAN NOT NULL,
    checksum BYTEA NOT NULL,
    execution_time BIGINT NOT NULL
);";

const SQLITE_TABLE: &str = "CREATE TABLE IF NOT EXISTS _outbox_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
);";

/// Every migration of dialect `D` as SQL, each in a transaction with the row that records it
/// in the migrations table (created by `table`) as the library's migrator would, checksum
/// included: applied by a tool of the user's own, the relay's start-up check finds them.
/// `bytes` writes a checksum's hex digits as the dialect's binary literal.
fn script<D: Dialect>(table: &str, bytes: impl Fn(&str) -> String) -> String {
    let mut sql = format!(
        "-- The outbox migrations for {}, each recorded in {MIGRATIONS_TABLE} as the outbox's\n\
         -- own migrator records it. Apply those the database lacks, in order.\n\n{table}\n",
        D::NAME,
    );
    for migration in outbox_sqlx::migrate::migrator::<D>().iter() {
        let checksum: String = migration
            .checksum
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let _ = write!(
            sql,
            "\n-- Migration {}: {}\nBEGIN;\n{}\nINSERT INTO {MIGRATIONS_TABLE} (version, \
             description, success, checksum, execution_time)\nVALUES ({}, '{}', TRUE, {}, 0);\n\
             COMMIT;\n",
            migration.version,
            migration.description,
            migration.sql.as_str().trim_end(),
            migration.version,
            migration.description.replace('\'', "''"),
            bytes(&checksum),
        );
    }
    sql
}
