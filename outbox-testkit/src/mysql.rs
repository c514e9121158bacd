//! Fresh MariaDB databases for tests, and the MariaDB [`TestBackend`](crate::TestBackend).
//!
//! The server is found through `MYSQL_URL` (a `mysql://` URL), else the local service at
//! `mysql://root@127.0.0.1:3306`. If none answers, the test fails with a message saying how to
//! provide one: MariaDB tests never silently skip.

use std::future::Future;

use outbox_core::{Error, ModelBatch};
use outbox_mysql::MySqlDialect;
use outbox_sqlx::model::Written;
use outbox_sqlx::{Dialect, Write};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, MySqlPool, Transaction};

use crate::backend::TestModel;
use crate::sqlx::{Provision, SqlxBackend, SqlxTestDatabase};

/// The server used when `MYSQL_URL` names none.
pub const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306";

/// The URL of the server tests create their databases on.
pub fn server_url() -> String {
    std::env::var("MYSQL_URL")
        .ok()
        .filter(|url| url.starts_with("mysql://") || url.starts_with("mariadb://"))
        .map(|url| url.replacen("mariadb://", "mysql://", 1))
        .unwrap_or_else(|| DEFAULT_URL.to_owned())
}

fn server_options() -> MySqlConnectOptions {
    let url = server_url();
    url.parse().unwrap_or_else(|error| {
        panic!(
            "MYSQL_URL `{}` is not a MariaDB URL: {error}",
            outbox_core::redact_url(&url)
        )
    })
}

async fn connect_server() -> MySqlConnection {
    let url = outbox_core::redact_url(&server_url());
    MySqlConnection::connect_with(&server_options())
        .await
        .unwrap_or_else(|error| {
            panic!(
                "MariaDB tests need a server, and none answered at {url}: {error}\n\
                 Set MYSQL_URL=mysql://user:password@host:port to use another server, or start \
                 the local one (`service mariadb start`)."
            )
        })
}

/// A database on the MariaDB server, created for one test and dropped with the test database
/// that holds it.
#[derive(Debug)]
pub struct MySqlDatabase {
    name: String,
}

/// A database created for one test and dropped when this value is dropped.
pub type MySqlTestDatabase = SqlxTestDatabase<MySqlDatabase>;

impl Provision for MySqlDatabase {
    type Dialect = MySqlDialect;

    async fn provision() -> (Self, MySqlPool) {
        let name = crate::sqlx::test_database_name();
        let mut server = connect_server().await;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE DATABASE `{name}` CHARACTER SET utf8mb4"
        )))
        .execute(&mut server)
        .await
        .unwrap_or_else(|error| panic!("cannot create test database {name}: {error}"));
        let _ = server.close().await;
        let database = Self { name };
        let pool = database.connect().await;
        (database, pool)
    }

    async fn connect(&self) -> MySqlPool {
        MySqlPoolOptions::new()
            .max_connections(20)
            .connect_with(server_options().database(&self.name))
            .await
            .unwrap_or_else(|error| {
                panic!("cannot connect to test database {}: {error}", self.name)
            })
    }

    const LOCK_WAITS: Option<(&'static str, &'static str)> = Some((
        "SELECT CAST(CONNECTION_ID() AS SIGNED)",
        "SELECT EXISTS (SELECT 1 FROM information_schema.INNODB_TRX \
         WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT')",
    ));

    const REFUSE_BACKFILL_PROGRESS: (&'static [&'static str], &'static [&'static str]) = (
        &[
            "CREATE TRIGGER refuse_backfill_progress BEFORE UPDATE ON outbox_backfills \
           FOR EACH ROW BEGIN \
             IF NEW.rows_walked <> OLD.rows_walked OR NEW.done_version <> OLD.done_version THEN \
               SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'the test refuses to move the watermark'; \
             END IF; \
           END",
        ],
        &["DROP TRIGGER refuse_backfill_progress"],
    );

    fn apply<'t, M: TestModel>(
        tx: &'t mut Transaction<'_, <Self::Dialect as Dialect>::Database>,
        write: Write,
        batch: &'t ModelBatch<'_, M>,
    ) -> impl Future<Output = Result<Written, Error>> + Send + 't {
        outbox_sqlx::model::apply::<MySqlDialect, M, _>(tx, write, batch)
    }
}

impl SqlxTestDatabase<MySqlDatabase> {
    /// The database's name.
    pub fn name(&self) -> &str {
        &self.place().name
    }

    /// A `mysql://` URL of the database (the server's URL with this database's name).
    pub fn url(&self) -> String {
        format!("{}/{}", server_url().trim_end_matches('/'), self.name())
    }

    /// Options to connect to the database.
    pub fn connect_options(&self) -> MySqlConnectOptions {
        server_options().database(self.name())
    }
}

impl Drop for MySqlDatabase {
    fn drop(&mut self) {
        // Dropping the database waits for the metadata locks of open transactions on its
        // tables: the test's own connections are killed first.
        crate::sqlx::drop_test_database(std::mem::take(&mut self.name), |name| async move {
            let mut server = MySqlConnection::connect_with(&server_options()).await?;
            // (`PROCESSLIST.ID` is a signed BIGINT: read as `u64`, it would not decode, and
            // no connection would be killed.)
            let ids: Vec<i64> =
                sqlx::query_scalar("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ?")
                    .bind(&name)
                    .fetch_all(&mut server)
                    .await?;
            for id in ids {
                // A connection that ended meanwhile is no longer there to kill.
                let _ = sqlx::raw_sql(AssertSqlSafe(format!("KILL {id}")))
                    .execute(&mut server)
                    .await;
            }
            // A lock some other connection still holds fails the drop after a while rather
            // than hanging the test run.
            sqlx::raw_sql(AssertSqlSafe(format!(
                "SET SESSION lock_wait_timeout = 30; DROP DATABASE IF EXISTS `{name}`"
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
    let mut server = MySqlConnection::connect_with(&server_options()).await?;
    let names = sqlx::query_scalar(
        "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA \
         WHERE LEFT(SCHEMA_NAME, CHAR_LENGTH(?)) = ? ORDER BY 1",
    )
    .bind(crate::sqlx::TEST_DATABASE_PREFIX)
    .bind(crate::sqlx::TEST_DATABASE_PREFIX)
    .fetch_all(&mut server)
    .await?;
    server.close().await?;
    Ok(names)
}

/// The MariaDB backend under test: a fresh database and its store.
pub type MySqlBackend = SqlxBackend<MySqlDatabase>;
