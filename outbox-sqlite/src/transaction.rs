//! A transaction that remembers the outboxes it writes, so that they can be delivered as soon
//! as it commits (S2), and whose nested scopes can defer theirs to the relay (S3).

use std::ops::{Deref, DerefMut};

use outbox_core::{
    Error, IntoModelBatch, Message, MessageId, ReplicatedModel, ShardKey, WrittenShards,
};
use sqlx::{Acquire, Sqlite, SqliteConnection, SqlitePool, Transaction};

use crate::error::database;
use crate::model::{Write, Written, apply};
use crate::write::{write, write_all};

/// Begins a flushing transaction on `pool` (`BEGIN IMMEDIATE`: it is a writing transaction).
///
/// ```
/// # use outbox_core::{Category, CategoryId, Message, Registry, Relay, Scope, ScopeId};
/// # struct Org;
/// # impl Scope for Org { const ID: ScopeId = ScopeId(1); const NAME: &'static str = "org"; }
/// # struct Renamed;
/// # impl Category for Renamed {
/// #     type Scope = Org; type Payload = String;
/// #     const ID: CategoryId = CategoryId(1); const NAME: &'static str = "renamed";
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let pool = outbox_sqlite::connect(&dir.path().join("app.db")).await?;
/// # outbox_sqlite::migrate(&pool).await?;
/// # let registry = Registry::builder()
/// #     .handle::<Renamed>(|_: outbox_core::Delivery<Renamed>| async { Ok::<_, std::io::Error>(()) })
/// #     .build()?;
/// let relay = Relay::new(outbox_sqlite::SqliteStore::new(pool.clone()), registry);
///
/// let mut tx = outbox_sqlite::begin(&pool).await?;
/// // ... the business change, with `&mut *tx` as the executor ...
/// tx.write(&Message::new::<Renamed>(1, 1, &"Acme".to_owned())?).await?;
/// let written = tx.commit().await?; // the data is committed
/// relay.flush(&written).await?; // and delivered now: Err(_) if a handler failed
/// # Ok(())
/// # }
/// ```
pub async fn begin(pool: &SqlitePool) -> Result<OutboxTransaction<'static>, Error> {
    let tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(database("beginning a transaction"))?;
    Ok(OutboxTransaction::new(tx))
}

/// A transaction that remembers the shards its outboxes went to.
///
/// It dereferences to the connection, so the business change runs on it as on a
/// `sqlx::Transaction` (`.execute(&mut *tx)`). [`commit`](Self::commit) returns what it wrote
/// in flushing scopes, for [`Relay::flush`](outbox_core::Relay::flush) to deliver at once.
/// Nested scopes are savepoints: [`nested`](Self::nested) flushes with its parent,
/// [`deferred`](Self::deferred) leaves its writes to the background relay; a scope rolled
/// back (or dropped) forgets what it wrote.
#[derive(Debug)]
pub struct OutboxTransaction<'c> {
    tx: Transaction<'c, Sqlite>,
    written: WrittenShards,
    flush: bool,
    parent: Option<&'c mut WrittenShards>,
}

impl<'c> OutboxTransaction<'c> {
    /// Wraps a transaction of the caller's: its outbox writes will be flushed.
    pub fn new(tx: Transaction<'c, Sqlite>) -> Self {
        Self {
            tx,
            written: WrittenShards::new(),
            flush: true,
            parent: None,
        }
    }

    /// Wraps a transaction whose outbox writes are left to the relay (S3).
    pub fn deferring(tx: Transaction<'c, Sqlite>) -> Self {
        Self {
            flush: false,
            ..Self::new(tx)
        }
    }

    /// Whether this scope's writes will be flushed after the outermost commit.
    pub fn flushes(&self) -> bool {
        self.flush
    }

    /// A nested scope (a savepoint) whose writes flush with this scope's.
    pub async fn nested(&mut self) -> Result<OutboxTransaction<'_>, Error> {
        let flush = self.flush;
        self.scope(flush).await
    }

    /// A nested scope (a savepoint) whose writes are left to the background relay, even
    /// inside a flushing transaction.
    pub async fn deferred(&mut self) -> Result<OutboxTransaction<'_>, Error> {
        self.scope(false).await
    }

    async fn scope(&mut self, flush: bool) -> Result<OutboxTransaction<'_>, Error> {
        let tx = self
            .tx
            .begin()
            .await
            .map_err(database("opening a savepoint"))?;
        Ok(OutboxTransaction {
            tx,
            written: WrittenShards::new(),
            flush,
            parent: Some(&mut self.written),
        })
    }

    fn record(&mut self, message: &Message, id: MessageId) {
        if self.flush {
            self.written.record(message.shard(), id);
        }
    }

    /// Writes one outbox message in this transaction.
    pub async fn write(&mut self, message: &Message) -> Result<MessageId, Error> {
        let id = write(&mut *self.tx, message).await?;
        self.record(message, id);
        Ok(id)
    }

    /// Writes many outbox messages in one statement.
    pub async fn write_all(&mut self, messages: &[Message]) -> Result<Vec<MessageId>, Error> {
        let ids = write_all(&mut *self.tx, messages).await?;
        if self.flush {
            self.written.record_all(messages, &ids);
        }
        Ok(ids)
    }

    async fn models<'a, M: ReplicatedModel>(
        &mut self,
        write: Write,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        let batch = models.into_batch();
        let Written {
            rows,
            messages,
            ids,
        } = apply::<M, SqliteConnection>(&mut self.tx, write, &batch).await?;
        if self.flush {
            self.written.record_all(&messages, &ids);
        }
        Ok(rows)
    }

    /// [`insert`](crate::insert) in this transaction.
    pub async fn insert<'a, M: ReplicatedModel>(
        &mut self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        self.models(Write::Insert, models).await
    }

    /// [`update`](crate::update) in this transaction.
    pub async fn update<'a, M: ReplicatedModel>(
        &mut self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        self.models(Write::Update, models).await
    }

    /// [`save`](crate::save) in this transaction.
    pub async fn save<'a, M: ReplicatedModel>(
        &mut self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        self.models(Write::Save, models).await
    }

    /// [`delete`](crate::delete) in this transaction.
    pub async fn delete<'a, M: ReplicatedModel>(
        &mut self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        self.models(Write::Delete, models).await
    }

    /// The shards this scope has written to so far, for inspection. What to flush comes only
    /// from [`commit`](Self::commit): the shards of a transaction that has not committed
    /// cannot be flushed.
    ///
    /// ```compile_fail,E0308
    /// # async fn before_commit(relay: outbox_core::Relay<outbox_sqlite::SqliteStore>, tx: outbox_sqlite::OutboxTransaction<'_>) {
    /// // Does not compile: what is written before the commit is not something to flush.
    /// relay.flush(tx.shards_written()).await;
    /// # }
    /// ```
    pub fn shards_written(&self) -> impl Iterator<Item = &ShardKey> {
        self.written.iter().map(|(shard, _)| shard)
    }

    /// Commits. The outermost transaction returns what its flushing scopes wrote, for
    /// [`Relay::flush`](outbox_core::Relay::flush); a nested scope hands it to its parent
    /// and returns nothing.
    pub async fn commit(self) -> Result<WrittenShards, Error> {
        let Self {
            tx,
            written,
            parent,
            ..
        } = self;
        tx.commit()
            .await
            .map_err(database("committing a transaction"))?;
        match parent {
            Some(parent) => {
                parent.merge(written);
                Ok(WrittenShards::new())
            }
            None => Ok(written),
        }
    }

    /// Rolls back: no rows, nothing to flush.
    pub async fn rollback(self) -> Result<(), Error> {
        self.tx
            .rollback()
            .await
            .map_err(database("rolling back a transaction"))
    }
}

impl Deref for OutboxTransaction<'_> {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.tx
    }
}

impl DerefMut for OutboxTransaction<'_> {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }
}
