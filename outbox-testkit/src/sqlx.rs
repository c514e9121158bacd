//! The conformance suite's backend for any `sqlx` backend built on `outbox-sqlx`: written
//! once over the test database of each ([`SqlxTestDatabase`]).

use std::future::Future;

use outbox_core::{
    BoxError, Error, HandlerContext, Message, MessageId, ModelBatch, ReplicatedModel, ShardKey,
    WrittenShards,
};
use outbox_sqlx::model::apply;
use outbox_sqlx::sql::{Executes, Runner, With, get};
use outbox_sqlx::{Dialect, OutboxTransaction, SqlxStore, Write};
use sqlx::{Database, Pool};

use crate::backend::{ModelWrite, Scoped, TestBackend};
use crate::counting::CountingExecutor;
use crate::database::TestDatabase;

/// A test database of a `sqlx` backend: what [`SqlxBackend`] needs of it.
pub trait SqlxTestDatabase: TestDatabase + Send + Sync + 'static {
    /// The backend's dialect.
    type Dialect: Dialect + Default;

    /// A pool on the database.
    fn pool(&self) -> &Pool<<Self::Dialect as Dialect>::Database>;

    /// A new pool on the database, separate from [`SqlxTestDatabase::pool`], as another
    /// process would have.
    fn connect(&self) -> impl Future<Output = Pool<<Self::Dialect as Dialect>::Database>> + Send;

    /// Runs statements of the test's own, failing the test if they fail.
    fn execute(&self, sql: &str) -> impl Future<Output = ()> + Send;
}

/// The backend under test for a `sqlx` backend: a fresh database of `T` and its store.
#[derive(Debug)]
pub struct SqlxBackend<T> {
    database: T,
}

type Db<T> = <<T as SqlxTestDatabase>::Dialect as Dialect>::Database;

impl<T: SqlxTestDatabase> SqlxBackend<T> {
    /// The test database.
    pub fn database(&self) -> &T {
        &self.database
    }

    async fn new(migrated: bool) -> Self {
        let database = T::create().await;
        database
            .execute("CREATE TABLE business_rows (id BIGINT PRIMARY KEY)")
            .await;
        if migrated {
            outbox_sqlx::migrate::<T::Dialect>(database.pool())
                .await
                .expect("apply the outbox migrations");
        }
        Self { database }
    }

    async fn begin(&self) -> sqlx::Transaction<'static, Db<T>> {
        self.database
            .pool()
            .begin_with(T::Dialect::BEGIN)
            .await
            .expect("begin")
    }
}

impl<T: SqlxTestDatabase> TestBackend for SqlxBackend<T> {
    type Store = SqlxStore<T::Dialect>;
    const NAME: &'static str = <T::Dialect as Dialect>::NAME;

    async fn create() -> Self {
        Self::new(true).await
    }

    async fn create_unmigrated() -> Self {
        Self::new(false).await
    }

    async fn migrate(&self) -> Result<(), Error> {
        outbox_sqlx::migrate::<T::Dialect>(self.database.pool()).await
    }

    fn store(&self) -> Self::Store {
        SqlxStore::new(self.database.pool().clone())
    }

    async fn connect_store(&self) -> Self::Store {
        SqlxStore::new(self.database.connect().await)
    }

    async fn write_in_transaction(
        &self,
        business_id: i64,
        messages: &[Message],
        commit: bool,
    ) -> Result<Vec<MessageId>, Error> {
        let mut tx = self.begin().await;
        sqlx::query("INSERT INTO business_rows (id) VALUES ($1)")
            .with(business_id)
            .execute(Db::<T>::on(&mut tx))
            .await
            .expect("insert a business row");
        let mut ids = Vec::with_capacity(messages.len());
        for message in messages {
            ids.push(outbox_sqlx::write::<T::Dialect, _>(Db::<T>::on(&mut tx), message).await?);
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
        let ids = outbox_sqlx::write_all::<T::Dialect, _>(counting.executor(), messages).await?;
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
        // The backend's own single-row insert, with none of the typed API's checks before it.
        let mut conn = self.database.pool().acquire().await.expect("a connection");
        let row = sqlx::query(<T::Dialect as Dialect>::SQL.insert_message)
            .with(shard.scope.0)
            .with(shard.shard_identifier)
            .with(shard.destination_str())
            .with(category)
            .with(object)
            .with(payload)
            .fetch_one(Db::<T>::on(&mut conn))
            .await
            .expect("insert a raw outbox row");
        MessageId(get::<Db<T>, i64>(&row, 0).expect("the row's id"))
    }

    async fn write_scoped(&self, script: Scoped<'_>, commit: bool) -> Result<WrittenShards, Error> {
        let mut tx: OutboxTransaction<'static, T::Dialect> =
            outbox_sqlx::begin::<T::Dialect>(self.database.pool()).await?;
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
        let write = match write {
            ModelWrite::Insert => Write::Insert,
            ModelWrite::Update => Write::Update,
            ModelWrite::Save => Write::Save,
            ModelWrite::Delete => Write::Delete,
        };
        let mut tx = self.begin().await;
        let written = apply::<T::Dialect, M, _>(&mut tx, write, &models).await?;
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("roll back");
        }
        Ok(written.rows)
    }

    async fn business_row_exists(&self, id: i64) -> bool {
        let mut conn = self.database.pool().acquire().await.expect("a connection");
        let row = sqlx::query("SELECT count(*) FROM business_rows WHERE id = $1")
            .with(id)
            .fetch_one(Db::<T>::on(&mut conn))
            .await
            .expect("read business_rows");
        get::<Db<T>, i64>(&row, 0).expect("a count") > 0
    }

    async fn insert_business_row_in(cx: &mut HandlerContext<'_>, id: i64) -> Result<(), BoxError> {
        let conn = cx
            .connection::<<Db<T> as Database>::Connection>()
            .ok_or("the handler is not running in the claiming transaction")?;
        sqlx::query("INSERT INTO business_rows (id) VALUES ($1)")
            .with(id)
            .execute(Db::<T>::on(conn))
            .await?;
        Ok(())
    }
}
