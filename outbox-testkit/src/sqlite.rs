//! Temporary SQLite databases for tests, and the SQLite [`TestBackend`].

use outbox_core::{Registry, Relay};
use outbox_sqlite::{SqliteDialect, SqliteStore};
use sqlx::{AssertSqlSafe, SqlitePool};
use tempfile::TempDir;

use crate::database::TestDatabase;
use crate::sqlx::{SqlxBackend, SqlxTestDatabase};

/// A database file in a temporary directory, removed when this value is dropped.
#[derive(Debug)]
pub struct SqliteTestDatabase {
    pool: SqlitePool,
    path: std::path::PathBuf,
    _dir: TempDir,
}

impl SqliteTestDatabase {
    /// A relay over this database, delivering to `registry`'s handlers.
    pub fn relay(&self, registry: Registry) -> Relay<SqliteStore> {
        Relay::new(SqliteStore::new(self.pool().clone()), registry)
    }

    /// Runs statements of the test's own (creating its tables, say), failing the test if
    /// they fail.
    pub async fn execute(&self, sql: &str) {
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(self.pool())
            .await
            .unwrap_or_else(|error| panic!("run `{sql}`: {error}"));
    }

    /// Creates an empty database file.
    pub async fn create() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("outbox-test.db");
        let pool = outbox_sqlite::connect(&path)
            .await
            .expect("open the test database");
        Self {
            pool,
            path,
            _dir: dir,
        }
    }

    /// Creates a database file and applies the outbox migrations to it: what
    /// `#[outbox_testkit::test]` hands a test taking a `SqliteTestDatabase`.
    pub async fn migrated() -> Self {
        let database = Self::create().await;
        outbox_sqlite::migrate(database.pool())
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "cannot apply the outbox migrations to test database {}: {error}",
                    database.path.display()
                )
            });
        database
    }

    /// A pool on the database.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The database file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// A new pool on the same file, separate from [`SqliteTestDatabase::pool`].
    pub async fn connect(&self) -> SqlitePool {
        outbox_sqlite::connect(&self.path)
            .await
            .expect("open the test database")
    }
}

impl TestDatabase for SqliteTestDatabase {
    fn create() -> impl Future<Output = Self> + Send {
        SqliteTestDatabase::create()
    }

    fn migrated() -> impl Future<Output = Self> + Send {
        SqliteTestDatabase::migrated()
    }
}

/// The SQLite backend under test: a fresh database and its store.
pub type SqliteBackend = SqlxBackend<SqliteTestDatabase>;

impl SqlxTestDatabase for SqliteTestDatabase {
    type Dialect = SqliteDialect;

    fn pool(&self) -> &SqlitePool {
        SqliteTestDatabase::pool(self)
    }

    fn connect(&self) -> impl Future<Output = SqlitePool> + Send {
        SqliteTestDatabase::connect(self)
    }

    fn execute(&self, sql: &str) -> impl Future<Output = ()> + Send {
        SqliteTestDatabase::execute(self, sql)
    }
}
