//! Temporary SQLite databases for tests, and the SQLite [`TestBackend`](crate::TestBackend).

use std::path::{Path, PathBuf};

use outbox_sqlite::SqliteDialect;
use sqlx::SqlitePool;
use tempfile::TempDir;

use std::future::Future;

use outbox_core::{Error, ModelBatch};
use outbox_sqlx::model::Written;
use outbox_sqlx::{Dialect, Write};
use sqlx::Transaction;

use crate::backend::TestModel;
use crate::sqlx::{Provision, SqlxBackend, SqlxTestDatabase};

/// A database file in a temporary directory of its own, removed with the test database that
/// holds it.
#[derive(Debug)]
pub struct SqliteFile {
    path: PathBuf,
    _dir: TempDir,
}

/// A database file in a temporary directory, removed when this value is dropped.
pub type SqliteTestDatabase = SqlxTestDatabase<SqliteFile>;

impl Provision for SqliteFile {
    type Dialect = SqliteDialect;

    async fn provision() -> (Self, SqlitePool) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = Self {
            path: dir.path().join("outbox-test.db"),
            _dir: dir,
        };
        let pool = file.connect().await;
        (file, pool)
    }

    async fn connect(&self) -> SqlitePool {
        outbox_sqlite::connect(&self.path)
            .await
            .expect("open the test database")
    }

    const REFUSE_BACKFILL_PROGRESS: (&'static [&'static str], &'static [&'static str]) = (
        &[
            "CREATE TRIGGER refuse_backfill_progress BEFORE UPDATE ON outbox_backfills \
           WHEN NEW.rows_walked <> OLD.rows_walked OR NEW.done_version <> OLD.done_version \
           BEGIN SELECT RAISE(ABORT, 'the test refuses to move the watermark'); END",
        ],
        &["DROP TRIGGER refuse_backfill_progress"],
    );

    fn apply<'t, M: TestModel>(
        tx: &'t mut Transaction<'_, <Self::Dialect as Dialect>::Database>,
        write: Write,
        batch: &'t ModelBatch<'_, M>,
    ) -> impl Future<Output = Result<Written, Error>> + Send + 't {
        outbox_sqlx::model::apply::<SqliteDialect, M, _>(tx, write, batch)
    }
}

impl SqlxTestDatabase<SqliteFile> {
    /// The database file.
    pub fn path(&self) -> &Path {
        &self.place().path
    }
}

/// The SQLite backend under test: a temporary database file and its store.
pub type SqliteBackend = SqlxBackend<SqliteFile>;
