//! Temporary SQLite databases for tests, and the SQLite [`TestBackend`].

use outbox_core::{
    BoxError, Error, HandlerContext, Message, MessageId, ModelBatch, Registry, Relay,
    ReplicatedModel, ShardKey, WrittenShards,
};
use outbox_sqlite::SqliteStore;
use sqlx::{AssertSqlSafe, SqliteConnection, SqlitePool};
use tempfile::TempDir;

use crate::backend::{ModelWrite, Scoped, TestBackend};
use crate::counting::CountingExecutor;
use crate::database::TestDatabase;

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

/// The SQLite backend under test: a temporary database file and its store.
#[derive(Debug)]
pub struct SqliteBackend {
    database: SqliteTestDatabase,
}

impl SqliteBackend {
    /// The test database.
    pub fn database(&self) -> &SqliteTestDatabase {
        &self.database
    }

    async fn new(migrated: bool) -> Self {
        let database = SqliteTestDatabase::create().await;
        sqlx::query("CREATE TABLE business_rows (id INTEGER PRIMARY KEY)")
            .execute(database.pool())
            .await
            .expect("create business_rows");
        if migrated {
            outbox_sqlite::migrate(database.pool())
                .await
                .expect("apply the outbox migrations");
        }
        Self { database }
    }
}

impl TestBackend for SqliteBackend {
    type Store = SqliteStore;
    const NAME: &'static str = "sqlite";

    async fn create() -> Self {
        Self::new(true).await
    }

    async fn create_unmigrated() -> Self {
        Self::new(false).await
    }

    async fn migrate(&self) -> Result<(), Error> {
        outbox_sqlite::migrate(self.database.pool()).await
    }

    fn store(&self) -> SqliteStore {
        SqliteStore::new(self.database.pool().clone())
    }

    async fn connect_store(&self) -> SqliteStore {
        SqliteStore::new(self.database.connect().await)
    }

    async fn write_in_transaction(
        &self,
        business_id: i64,
        messages: &[Message],
        commit: bool,
    ) -> Result<Vec<MessageId>, Error> {
        let mut tx = self
            .database
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("begin");
        sqlx::query("INSERT INTO business_rows (id) VALUES (?1)")
            .bind(business_id)
            .execute(&mut *tx)
            .await
            .expect("insert a business row");
        let mut ids = Vec::with_capacity(messages.len());
        for message in messages {
            ids.push(outbox_sqlite::write(&mut *tx, message).await?);
        }
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("roll back");
        }
        Ok(ids)
    }

    async fn write_all_counted(
        &self,
        messages: &[Message],
    ) -> Result<(Vec<MessageId>, usize), Error> {
        let mut tx = self
            .database
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("begin");
        let mut counting = CountingExecutor::new(&mut *tx);
        let ids = outbox_sqlite::write_all(&mut counting, messages).await?;
        let statements = counting.statements();
        tx.commit().await.expect("commit");
        Ok((ids, statements))
    }

    async fn insert_raw(
        &self,
        shard: &ShardKey,
        category: i32,
        object: i64,
        payload: &str,
    ) -> MessageId {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO outbox_messages \
                (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING id",
        )
        .bind(shard.scope.0)
        .bind(shard.shard_identifier)
        .bind(shard.destination_str())
        .bind(category)
        .bind(object)
        .bind(payload)
        .fetch_one(self.database.pool())
        .await
        .expect("insert a raw outbox row");
        MessageId(id)
    }

    async fn write_scoped(&self, script: Scoped<'_>, commit: bool) -> Result<WrittenShards, Error> {
        let mut tx = outbox_sqlite::begin(self.database.pool()).await?;
        for message in script.top {
            tx.write(message).await?;
        }
        let mut nested = tx.nested().await?;
        for message in script.nested {
            nested.write(message).await?;
        }
        nested.commit().await?;
        let mut deferred = tx.deferred().await?;
        for message in script.deferred {
            deferred.write(message).await?;
        }
        deferred.commit().await?;
        let mut doomed = tx.nested().await?;
        for message in script.rolled_back {
            doomed.write(message).await?;
        }
        doomed.rollback().await?;
        if commit {
            tx.commit().await
        } else {
            tx.rollback().await?;
            Ok(WrittenShards::new())
        }
    }

    async fn execute(&self, sql: &str) {
        self.database.execute(sql).await;
    }

    async fn write_models<M: ReplicatedModel>(
        &self,
        write: ModelWrite,
        models: ModelBatch<'_, M>,
        commit: bool,
    ) -> Result<u64, Error> {
        let mut tx = self
            .database
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("begin");
        let rows = match write {
            ModelWrite::Insert => outbox_sqlite::insert(&mut tx, models).await?,
            ModelWrite::Update => outbox_sqlite::update(&mut tx, models).await?,
            ModelWrite::Save => outbox_sqlite::save(&mut tx, models).await?,
            ModelWrite::Delete => outbox_sqlite::delete(&mut tx, models).await?,
        };
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("roll back");
        }
        Ok(rows)
    }

    async fn business_row_exists(&self, id: i64) -> bool {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM business_rows WHERE id = ?1)")
            .bind(id)
            .fetch_one(self.database.pool())
            .await
            .expect("read business_rows")
    }

    async fn insert_business_row_in(cx: &mut HandlerContext<'_>, id: i64) -> Result<(), BoxError> {
        let conn = cx
            .connection::<SqliteConnection>()
            .ok_or("the handler is not running in the claiming transaction")?;
        sqlx::query("INSERT INTO business_rows (id) VALUES (?1)")
            .bind(id)
            .execute(conn)
            .await?;
        Ok(())
    }
}
