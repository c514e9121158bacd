//! Fresh PostgreSQL databases for tests, and the PostgreSQL [`TestBackend`](crate::TestBackend).
//!
//! The server is found through `DATABASE_URL` (a `postgres://` URL), else the local service at
//! `postgres://postgres@127.0.0.1:5432/postgres`. If none answers, the test fails with a
//! message saying how to provide one: PostgreSQL tests never silently skip.

use outbox_postgres::PgDialect;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool};

use std::future::Future;

use outbox_core::{Error, ModelBatch};
use outbox_sqlx::model::Written;
use outbox_sqlx::{Dialect, Write};
use sqlx::Transaction;

use crate::backend::TestModel;
use crate::sqlx::{Provision, SqlxBackend, SqlxTestDatabase};

/// The server used when `DATABASE_URL` names no PostgreSQL database.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The URL of the server tests create their databases on.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| url.starts_with("postgres://") || url.starts_with("postgresql://"))
        .unwrap_or_else(|| DEFAULT_URL.to_owned())
}

fn server_options() -> PgConnectOptions {
    let url = server_url();
    url.parse().unwrap_or_else(|error| {
        panic!(
            "DATABASE_URL `{}` is not a PostgreSQL URL: {error}",
            outbox_core::redact_url(&url)
        )
    })
}

async fn connect_server() -> PgConnection {
    let url = outbox_core::redact_url(&server_url());
    PgConnection::connect_with(&server_options())
        .await
        .unwrap_or_else(|error| {
            panic!(
                "PostgreSQL tests need a server, and none answered at {url}: {error}\n\
             Set DATABASE_URL=postgres://user@host:port/database to use another server, \
             or start the local one (`pg_ctlcluster --skip-systemctl-redirect \
             $(ls /etc/postgresql) main start`)."
            )
        })
}

/// A database on the PostgreSQL server, created for one test and dropped (`WITH (FORCE)`)
/// with the test database that holds it.
#[derive(Debug)]
pub struct PgDatabase {
    name: String,
}

/// A database created for one test and dropped when this value is dropped.
pub type PgTestDatabase = SqlxTestDatabase<PgDatabase>;

impl Provision for PgDatabase {
    type Dialect = PgDialect;

    async fn provision() -> (Self, PgPool) {
        let name = crate::sqlx::test_database_name();
        let mut server = connect_server().await;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut server)
            .await
            .unwrap_or_else(|error| panic!("cannot create test database {name}: {error}"));
        let _ = server.close().await;
        let database = Self { name };
        let pool = database.connect().await;
        (database, pool)
    }

    async fn connect(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(20)
            .connect_with(server_options().database(&self.name))
            .await
            .unwrap_or_else(|error| {
                panic!("cannot connect to test database {}: {error}", self.name)
            })
    }

    const LOCK_WAITS: Option<(&'static str, &'static str)> = Some((
        "SELECT pg_backend_pid()::bigint",
        "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity \
         WHERE pid::bigint = $1",
    ));

    const REFUSE_BACKFILL_PROGRESS: (&'static [&'static str], &'static [&'static str]) = (
        &[
            "CREATE FUNCTION refuse_backfill_progress() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'the test refuses to move the watermark'; END $$",
            "CREATE TRIGGER refuse_backfill_progress BEFORE UPDATE ON outbox_backfills \
             FOR EACH ROW WHEN (NEW.rows_walked <> OLD.rows_walked \
                 OR NEW.done_version <> OLD.done_version) \
             EXECUTE FUNCTION refuse_backfill_progress()",
        ],
        &[
            "DROP TRIGGER refuse_backfill_progress ON outbox_backfills",
            "DROP FUNCTION refuse_backfill_progress()",
        ],
    );

    fn apply<'t, M: TestModel>(
        tx: &'t mut Transaction<'_, <Self::Dialect as Dialect>::Database>,
        write: Write,
        batch: &'t ModelBatch<'_, M>,
    ) -> impl Future<Output = Result<Written, Error>> + Send + 't {
        outbox_sqlx::model::apply::<PgDialect, M, _>(tx, write, batch)
    }
}

impl SqlxTestDatabase<PgDatabase> {
    /// The database's name.
    pub fn name(&self) -> &str {
        &self.place().name
    }

    /// A `postgres://` URL of the database (the server's URL with this database's name).
    pub fn url(&self) -> String {
        let server = server_url();
        let authority = server.find("://").map_or(0, |at| at + 3);
        let path = server[authority..]
            .find('/')
            .map_or(server.len(), |at| authority + at);
        let query = server[path..]
            .find('?')
            .map_or("", |at| &server[path + at..]);
        format!("{}/{}{query}", &server[..path], self.name())
    }

    /// Options to connect to the database.
    pub fn connect_options(&self) -> PgConnectOptions {
        server_options().database(self.name())
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        // The pool is not closed here: its connections are driven by the test's runtime,
        // which is blocked in this drop on a current-thread runtime. Dropping the database
        // WITH (FORCE) ends them instead.
        crate::sqlx::drop_test_database(std::mem::take(&mut self.name), |name| async move {
            let mut server = PgConnection::connect_with(&server_options()).await?;
            sqlx::query(AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
            )))
            .execute(&mut server)
            .await?;
            // The database is gone: a failure to say goodbye to the server is no leak.
            let _ = server.close().await;
            Ok(())
        });
    }
}

/// The databases whose name begins as every test database's does
/// ([`TEST_DATABASE_PREFIX`](crate::sqlx::TEST_DATABASE_PREFIX)) on the server tests use:
/// those the tests running now hold, and those a run left behind.
pub async fn test_databases() -> Result<Vec<String>, sqlx::Error> {
    let mut server = PgConnection::connect_with(&server_options()).await?;
    let names = sqlx::query_scalar(
        "SELECT datname::text FROM pg_database WHERE starts_with(datname, $1) ORDER BY 1",
    )
    .bind(crate::sqlx::TEST_DATABASE_PREFIX)
    .fetch_all(&mut server)
    .await?;
    server.close().await?;
    Ok(names)
}

/// The PostgreSQL backend under test: a fresh database and its store.
pub type PgBackend = SqlxBackend<PgDatabase>;
