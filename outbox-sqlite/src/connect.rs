use std::path::Path;
use std::time::Duration;

use outbox_core::Error;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use outbox_sqlx::error::database;

use crate::dialect::SqliteDialect;

/// Options for a database file suited to the outbox: created if missing, WAL journal (readers
/// never block the writer), `synchronous = NORMAL` (durable at each WAL checkpoint, safe with
/// WAL), and a 10 s busy timeout so concurrent writers wait for each other instead of failing.
pub fn connect_options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(10))
}

/// Opens a pool on the database file at `path` with [`connect_options`].
pub async fn connect(path: &Path) -> Result<SqlitePool, Error> {
    SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(connect_options(path))
        .await
        .map_err(database::<SqliteDialect>("connecting to SQLite"))
}
