//! The conformance suite's backend for any `sqlx` backend built on `outbox-sqlx`: written
//! once over the test database of each ([`SqlxTestDatabase`]).

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};

use outbox_core::{
    BoxError, Connection, Error, Id, Message, MessageId, ModelBatch, ShardKey, WrittenShards,
};

use outbox_core::handler::{FromContext, HandlerContext};
use outbox_core::{Registry, Relay};
use outbox_sqlx::model::Written;
use outbox_sqlx::sql::{Executes, Runner, With, get};
use outbox_sqlx::{Dialect, OutboxTransaction, SqlxStore, Write};
use sqlx::{AssertSqlSafe, Database, Pool, Transaction};

use crate::backend::{ModelWrite, Scoped, StoreBackend, TestBackend, TestModel};
use crate::counting::CountingExecutor;
use crate::database::TestDatabase;

/// How the name of every database a test creates on a shared server begins (see
/// `postgres::test_databases` and `mysql::test_databases`).
pub const TEST_DATABASE_PREFIX: &str = "outbox_test_";

/// A name for a test's database on a shared server, unique across the processes and tests
/// that run at once: `outbox_test_{process}_{counter}_{random}`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn test_database_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{TEST_DATABASE_PREFIX}{}_{}_{:08x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    )
}

/// Drops the test database `name` on a thread and a runtime of its own with `drop` (a drop
/// runs outside any runtime guarantee, and the test's own runtime may be blocked in it), and
/// fails loudly if it could not: a panic that fails the test holding the database (a message
/// only, if that test is failing already), never a database silently left on the server.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn drop_test_database<F>(name: String, drop: impl FnOnce(String) -> F + Send + 'static)
where
    F: Future<Output = Result<(), ::sqlx::Error>>,
{
    let shown = name.clone();
    let cleanup = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| format!("no runtime to drop it on: {error}"))?
            .block_on(drop(name))
            .map_err(|error| error.to_string())
    });
    let error = match cleanup.join() {
        Ok(Ok(())) => return,
        Ok(Err(error)) => error,
        Err(_) => "the thread dropping it panicked".to_owned(),
    };
    let message = format!("cannot drop the test database {shown}: {error}");
    if std::thread::panicking() {
        // A second panic would abort the test binary: the message goes to the failing test's
        // captured output instead.
        #[allow(clippy::print_stderr)]
        {
            eprintln!("{message}");
        }
    } else {
        panic!("{message}");
    }
}

/// A test's statement `sql`, whose one parameter is written `$1`, in the dialect's own
/// placeholder (`$1`, `?1`, `?`).
fn with_placeholder<D: Dialect>(sql: &'static str) -> AssertSqlSafe<String> {
    AssertSqlSafe(sql.replace("$1", &D::placeholder(1)))
}

/// Where a test database of a `sqlx` backend lives, and how it is made and removed: a
/// database on a server ([`PgDatabase`](crate::postgres::PgDatabase)), a temporary file
/// ([`SqliteFile`](crate::sqlite::SqliteFile)).
pub trait Provision: std::fmt::Debug + Send + Sync + Sized + 'static {
    /// The backend's dialect.
    type Dialect: Dialect + Default;

    /// Makes an empty database, and a pool on it. Removing it is `Drop`'s job.
    fn provision() -> impl Future<Output = (Self, Pool<<Self::Dialect as Dialect>::Database>)> + Send;

    /// A new pool on the database.
    fn connect(&self) -> impl Future<Output = Pool<<Self::Dialect as Dialect>::Database>> + Send;

    /// For tests that step two connections through a lock wait
    /// ([`commit_order`](crate::commit_order)): a statement returning the server's id of the
    /// connection it runs on (`i64`), and one returning whether the connection of id `$1`
    /// (`i64`) waits for a lock (a boolean). `None` where one connection writes at a time
    /// (SQLite).
    const LOCK_WAITS: Option<(&'static str, &'static str)> = None;

    /// The statements that make the database refuse to move a backfill's watermark forward
    /// (see [`TestBackend::refuse_backfill_progress`]), and those that undo them.
    const REFUSE_BACKFILL_PROGRESS: (&'static [&'static str], &'static [&'static str]);

    /// The backend's model write `write` of `batch` in `tx`.
    fn apply<'t, M: TestModel>(
        tx: &'t mut Transaction<'_, <Self::Dialect as Dialect>::Database>,
        write: Write,
        batch: &'t ModelBatch<'_, M>,
    ) -> impl Future<Output = Result<Written, Error>> + Send + 't;
}

/// A database created for one test, removed when the value is dropped:
/// [`PgTestDatabase`](crate::postgres::PgTestDatabase) and
/// [`SqliteTestDatabase`](crate::sqlite::SqliteTestDatabase).
#[derive(Debug)]
pub struct SqlxTestDatabase<P: Provision> {
    // Declared first, dropped first: the pool closes before the database goes.
    pool: Pool<<P::Dialect as Dialect>::Database>,
    place: P,
}

impl<P: Provision> SqlxTestDatabase<P> {
    /// Creates an empty database.
    pub async fn create() -> Self {
        let (place, pool) = P::provision().await;
        Self { pool, place }
    }

    /// Creates a database and applies the outbox migrations to it: what
    /// `#[outbox_testkit::test]` hands a test.
    pub async fn migrated() -> Self {
        let database = Self::create().await;
        outbox_sqlx::migrate::<P::Dialect>(database.pool())
            .await
            .unwrap_or_else(|error| {
                panic!(
                    "cannot apply the outbox migrations to test database {:?}: {error}",
                    database.place
                )
            });
        database
    }

    /// A pool on the database.
    pub fn pool(&self) -> &Pool<<P::Dialect as Dialect>::Database> {
        &self.pool
    }

    /// A new pool on the database, separate from [`pool`](Self::pool), as another process
    /// would have.
    pub async fn connect(&self) -> Pool<<P::Dialect as Dialect>::Database> {
        self.place.connect().await
    }

    /// Where the database is.
    pub fn place(&self) -> &P {
        &self.place
    }

    /// A relay over this database, delivering to `registry`'s handlers.
    pub fn relay(&self, registry: Registry) -> Relay<SqlxStore<P::Dialect>> {
        Relay::new(SqlxStore::new(self.pool.clone()), registry)
    }

    /// Writes `messages` in a transaction of their own and commits them, failing the test if
    /// that fails; returns their ids.
    pub async fn write_messages(&self, messages: &[Message]) -> Vec<MessageId> {
        let mut tx = outbox_sqlx::transaction::begin::<P::Dialect>(&self.pool)
            .await
            .expect("begin");
        let ids = tx.write_all(messages).await.expect("write the messages");
        tx.commit().await.expect("commit");
        ids
    }

    /// Runs statements of the test's own (creating its tables, say), failing the test if
    /// they fail.
    pub async fn execute(&self, sql: &str) {
        let mut conn = self.pool.acquire().await.expect("a connection");
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(Db::<P>::on(&mut conn))
            .await
            .unwrap_or_else(|error| panic!("run `{sql}`: {error}"));
    }
}

impl<P: Provision> TestDatabase for SqlxTestDatabase<P> {
    fn create() -> impl Future<Output = Self> + Send {
        Self::create()
    }

    fn migrated() -> impl Future<Output = Self> + Send {
        Self::migrated()
    }
}

/// The backend under test for a `sqlx` backend: a fresh database and its store.
#[derive(Debug)]
pub struct SqlxBackend<P: Provision> {
    database: SqlxTestDatabase<P>,
}

type Db<P> = <<P as Provision>::Dialect as Dialect>::Database;

impl<P: Provision> SqlxBackend<P> {
    /// The test database.
    pub fn database(&self) -> &SqlxTestDatabase<P> {
        &self.database
    }

    async fn new(migrated: bool) -> Self {
        let database = SqlxTestDatabase::<P>::create().await;
        database
            .execute("CREATE TABLE business_rows (id BIGINT PRIMARY KEY)")
            .await;
        if migrated {
            outbox_sqlx::migrate::<P::Dialect>(database.pool())
                .await
                .expect("apply the outbox migrations");
        }
        Self { database }
    }

    async fn begin(&self) -> Transaction<'static, Db<P>> {
        self.database
            .pool()
            .begin_with(P::Dialect::BEGIN)
            .await
            .expect("begin")
    }
}

/// The business rows that [`StoreBackend::write`] inserts beside its messages: distinct
/// across a test binary.
static BUSINESS_IDS: AtomicI64 = AtomicI64::new(1);

impl<P: Provision> StoreBackend for SqlxBackend<P> {
    type Store = SqlxStore<P::Dialect>;
    const NAME: &'static str = <P::Dialect as Dialect>::NAME;

    async fn create() -> Self {
        Self::new(true).await
    }

    fn store(&self) -> Self::Store {
        SqlxStore::new(self.database.pool().clone())
    }

    async fn connect_store(&self) -> Self::Store {
        SqlxStore::new(self.database.connect().await)
    }

    /// In one transaction with a business row, each message with its own write.
    async fn write(&self, messages: &[Message]) -> Result<Vec<MessageId>, Error> {
        let business_id = BUSINESS_IDS.fetch_add(1, Ordering::Relaxed);
        self.write_in_transaction(business_id, messages, true).await
    }

    /// With the backend's flushing outbox transaction, at its top level.
    async fn commit(&self, messages: &[Message]) -> Result<WrittenShards, Error> {
        let script = Scoped {
            top: messages,
            ..Scoped::default()
        };
        self.write_scoped(script, true).await
    }

    async fn insert_raw(
        &self,
        shard: &ShardKey,
        category: i32,
        object: Id,
        payload: &str,
    ) -> MessageId {
        // The backend's own single-row insert, with none of the typed API's checks before it.
        let mut conn = self.database.pool().acquire().await.expect("a connection");
        let query = <P::Dialect as Dialect>::bind_shard(
            sqlx::query(<P::Dialect as Dialect>::SQL.insert_message).with(shard.scope.0),
            shard,
        )
        .with(category);
        let row = <P::Dialect as Dialect>::bind_object(query, object)
            .with(payload)
            .with(None::<String>)
            .fetch_one(Db::<P>::on(&mut conn))
            .await
            .expect("insert a raw outbox row");
        MessageId(get::<Db<P>, i64>(&row, 0).expect("the row's id"))
    }
}

impl<P: Provision> TestBackend for SqlxBackend<P> {
    async fn create_unmigrated() -> Self {
        Self::new(false).await
    }

    async fn migrate(&self) -> Result<(), Error> {
        outbox_sqlx::migrate::<P::Dialect>(self.database.pool()).await
    }

    async fn write_in_transaction(
        &self,
        business_id: i64,
        messages: &[Message],
        commit: bool,
    ) -> Result<Vec<MessageId>, Error> {
        let mut tx = self.begin().await;
        sqlx::query(with_placeholder::<P::Dialect>(
            "INSERT INTO business_rows (id) VALUES ($1)",
        ))
        .with(business_id)
        .execute(Db::<P>::on(&mut tx))
        .await
        .expect("insert a business row");
        let mut ids = Vec::with_capacity(messages.len());
        for message in messages {
            ids.push(outbox_sqlx::write::<P::Dialect, _>(Db::<P>::on(&mut tx), message).await?);
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
        let mut tx = self.begin().await;
        let mut counting = CountingExecutor::new(&mut tx);
        let ids = outbox_sqlx::write_all::<P::Dialect, _>(counting.executor(), messages).await?;
        let statements = counting.statements();
        tx.commit().await.expect("commit");
        Ok((ids, statements))
    }

    async fn write_scoped(&self, script: Scoped<'_>, commit: bool) -> Result<WrittenShards, Error> {
        let mut tx: OutboxTransaction<'static, P::Dialect> =
            outbox_sqlx::begin::<P::Dialect>(self.database.pool()).await?;
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

    async fn write_models<M: TestModel>(
        &self,
        write: ModelWrite,
        models: ModelBatch<'_, M>,
        commit: bool,
    ) -> Result<u64, Error> {
        let write = match write {
            ModelWrite::Insert => Write::Insert,
            ModelWrite::Update => Write::Update,
            ModelWrite::Save => Write::Save,
            ModelWrite::Delete => Write::Delete,
        };
        let mut tx = self.begin().await;
        let written = P::apply(&mut tx, write, &models).await?;
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("roll back");
        }
        Ok(written.rows)
    }

    async fn refuse_backfill_progress(&self, refuse: bool) {
        let (refusing, accepting) = P::REFUSE_BACKFILL_PROGRESS;
        for sql in if refuse { refusing } else { accepting } {
            self.execute(sql).await;
        }
    }

    async fn business_row_exists(&self, id: i64) -> bool {
        let mut conn = self.database.pool().acquire().await.expect("a connection");
        let row = sqlx::query(with_placeholder::<P::Dialect>(
            "SELECT count(*) FROM business_rows WHERE id = $1",
        ))
        .with(id)
        .fetch_one(Db::<P>::on(&mut conn))
        .await
        .expect("read business_rows");
        get::<Db<P>, i64>(&row, 0).expect("a count") > 0
    }

    async fn insert_business_row_in(cx: &mut HandlerContext<'_>, id: i64) -> Result<(), BoxError> {
        let mut conn = Connection::<<Db<P> as Database>::Connection>::from_context(cx)?;
        sqlx::query(with_placeholder::<P::Dialect>(
            "INSERT INTO business_rows (id) VALUES ($1)",
        ))
        .with(id)
        .execute(Db::<P>::on(&mut conn))
        .await?;
        Ok(())
    }
}
