//! A transaction that remembers the outboxes it writes, so that they can be delivered as soon
//! as it commits, and whose nested scopes can defer theirs to the relay.

use std::collections::BTreeSet;
use std::ops::{Deref, DerefMut};

use outbox_core::{Error, IntoModelBatch, Message, MessageId, ShardKey, WrittenShards};
use sqlx::{Acquire, Database, Pool, Transaction};

use crate::dialect::Dialect;
use crate::error::database;
use crate::model::{Writable, Write, Written, apply};
use crate::sql::Executes;
use crate::write::{write, write_all};

/// Begins a flushing transaction on `pool` (with [`Dialect::BEGIN_CALLER`]).
pub async fn begin<D: Dialect>(
    pool: &Pool<D::Database>,
) -> Result<OutboxTransaction<'static, D>, Error> {
    let tx = pool
        .begin_with(D::BEGIN_CALLER)
        .await
        .map_err(database::<D>("beginning a transaction"))?;
    let mut tx = OutboxTransaction::new(tx);
    tx.pool = Some(pool.clone());
    Ok(tx)
}

/// A transaction that remembers the shards its outboxes went to.
///
/// It dereferences to the connection, so the business change runs on it as on a
/// `sqlx::Transaction` (`.execute(&mut *tx)`). [`commit`](Self::commit) returns what it wrote
/// in flushing scopes, for [`Relay::flush`](outbox_core::Relay::flush) to deliver at once.
/// Nested scopes are savepoints: [`nested`](Self::nested) flushes with its parent,
/// [`deferred`](Self::deferred) leaves its writes to the background relay; a scope rolled
/// back (or dropped) forgets what it wrote.
///
/// Once the outermost transaction commits, it wakes the relays on the shards it wrote (all
/// of them, flushed or deferred): directly those of this process, and, when it was begun
/// from a pool ([`begin`]), those of other processes through the backend (see
/// [`crate::wake`]). Nothing is sent inside the transaction: the wake-up adds nothing to the
/// commit.
///
/// ```
/// use outbox_core::{BoxError, Delivery, Message, Registry, Relay};
/// use outbox_core::{outbox_category, outbox_handler, outbox_scope};
/// use serde::{Deserialize, Serialize};
///
/// #[outbox_scope(id = 1)]
/// struct Team;
///
/// #[outbox_category(scope = Team, id = 1)]
/// #[derive(Serialize, Deserialize)]
/// struct TeamRenamed {
///     name: String,
/// }
///
/// #[outbox_handler]
/// async fn announce(delivery: Delivery<TeamRenamed>) -> Result<(), BoxError> {
///     assert_eq!(delivery.payload.name, "platform");
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let pool = outbox_sqlite::connect(&dir.path().join("app.db")).await?;
/// outbox_sqlite::migrate(&pool).await?;
/// sqlx::query("CREATE TABLE teams (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
///     .execute(&pool)
///     .await?;
/// let relay = Relay::new(outbox_sqlite::SqliteStore::new(pool.clone()), Registry::discover()?);
///
/// // The data change and its message commit together, or neither does.
/// let mut tx = outbox_sqlite::begin(&pool).await?;
/// sqlx::query("INSERT INTO teams (id, name) VALUES (7, 'platform')")
///     .execute(&mut *tx)
///     .await?;
/// let renamed = TeamRenamed { name: "platform".into() };
/// tx.write(&Message::new::<TeamRenamed>(7, 7, &renamed)?).await?;
/// let written = tx.commit().await?;
///
/// // Delivered before the caller is answered; what fails is left to the background relay.
/// let report = relay.flush(&written).await?;
/// assert_eq!(report.rows_acknowledged, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct OutboxTransaction<'c, D: Dialect> {
    tx: Transaction<'c, D::Database>,
    recorded: Recorded,
    flush: bool,
    parent: Option<&'c mut Recorded>,
    /// The pool it was begun from, through which other processes' relays are woken.
    pool: Option<Pool<D::Database>>,
}

/// What a scope wrote: the shards to flush, and every shard to wake relays on.
#[derive(Debug, Default)]
struct Recorded {
    flush: WrittenShards,
    touched: BTreeSet<ShardKey>,
}

impl Recorded {
    fn merge(&mut self, other: Self) {
        self.flush.merge(other.flush);
        self.touched.extend(other.touched);
    }
}

impl<'c, D: Dialect> OutboxTransaction<'c, D> {
    /// Wraps a transaction of the caller's: its outbox writes will be flushed.
    pub fn new(tx: Transaction<'c, D::Database>) -> Self {
        Self {
            tx,
            recorded: Recorded::default(),
            flush: true,
            parent: None,
            pool: None,
        }
    }

    /// Wraps a transaction whose outbox writes are left to the relay.
    pub fn deferring(tx: Transaction<'c, D::Database>) -> Self {
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
    pub async fn nested(&mut self) -> Result<OutboxTransaction<'_, D>, Error> {
        let flush = self.flush;
        self.scope(flush).await
    }

    /// A nested scope (a savepoint) whose writes are left to the background relay, even
    /// inside a flushing transaction.
    pub async fn deferred(&mut self) -> Result<OutboxTransaction<'_, D>, Error> {
        self.scope(false).await
    }

    async fn scope(&mut self, flush: bool) -> Result<OutboxTransaction<'_, D>, Error> {
        let tx = self
            .tx
            .begin()
            .await
            .map_err(database::<D>("opening a savepoint"))?;
        Ok(OutboxTransaction {
            tx,
            recorded: Recorded::default(),
            flush,
            parent: Some(&mut self.recorded),
            pool: None,
        })
    }

    fn record(&mut self, message: &Message, id: MessageId) {
        if self.flush {
            self.recorded.flush.record(message.shard(), id);
        }
        self.touch([message]);
    }

    fn touch<'m>(&mut self, messages: impl IntoIterator<Item = &'m Message>) {
        for message in messages {
            if !self.recorded.touched.contains(message.shard()) {
                self.recorded.touched.insert(message.shard().clone());
            }
        }
    }

    /// Writes one outbox message in this transaction.
    pub async fn write(&mut self, message: &Message) -> Result<MessageId, Error> {
        let id = write::<D, _>(D::Database::on(&mut self.tx), message).await?;
        self.record(message, id);
        Ok(id)
    }

    /// Writes many outbox messages in one statement.
    pub async fn write_all(&mut self, messages: &[Message]) -> Result<Vec<MessageId>, Error> {
        let ids = write_all::<D, _>(D::Database::on(&mut self.tx), messages).await?;
        if self.flush {
            self.recorded.flush.record_all(messages, &ids);
        }
        self.touch(messages);
        Ok(ids)
    }

    async fn models<'a, M: Writable<D>>(
        &mut self,
        write: Write,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        let batch = models.into_batch();
        let Written {
            rows,
            messages,
            ids,
        } = apply::<D, M, _>(&mut self.tx, write, &batch).await?;
        if self.flush {
            self.recorded.flush.record_all(&messages, &ids);
        }
        self.touch(&messages);
        Ok(rows)
    }

    /// an insert ([`Write::Insert`]) in this transaction.
    pub async fn insert<'a, M: Writable<D>>(
        &mut self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        self.models(Write::Insert, models).await
    }

    /// an update ([`Write::Update`]) in this transaction.
    pub async fn update<'a, M: Writable<D>>(
        &mut self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        self.models(Write::Update, models).await
    }

    /// a save ([`Write::Save`]) in this transaction.
    pub async fn save<'a, M: Writable<D>>(
        &mut self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        self.models(Write::Save, models).await
    }

    /// a deletion ([`Write::Delete`]) in this transaction.
    pub async fn delete<'a, M: Writable<D>>(
        &mut self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<u64, Error> {
        self.models(Write::Delete, models).await
    }

    /// The shards this scope has written to so far, for inspection. What to flush comes only
    /// from [`commit`](Self::commit): the shards of a transaction that has not committed
    /// cannot be flushed.
    pub fn shards_written(&self) -> impl Iterator<Item = &ShardKey> {
        self.recorded.flush.iter().map(|(shard, _)| shard)
    }

    /// Commits. The outermost transaction returns what its flushing scopes wrote, for
    /// [`Relay::flush`](outbox_core::Relay::flush); a nested scope hands it to its parent
    /// and returns nothing. The outermost commit then wakes the relays on every shard written
    /// (see the type's documentation).
    pub async fn commit(self) -> Result<WrittenShards, Error> {
        let Self {
            tx,
            recorded,
            parent,
            pool,
            ..
        } = self;
        tx.commit()
            .await
            .map_err(database::<D>("committing a transaction"))?;
        match parent {
            Some(parent) => {
                parent.merge(recorded);
                Ok(WrittenShards::new())
            }
            None => {
                if !recorded.touched.is_empty() {
                    let touched: Vec<ShardKey> = recorded.touched.into_iter().collect();
                    crate::wake::committed::<D>(pool.as_ref(), &touched);
                }
                Ok(recorded.flush)
            }
        }
    }

    /// Rolls back: no rows, nothing to flush.
    pub async fn rollback(self) -> Result<(), Error> {
        self.tx
            .rollback()
            .await
            .map_err(database::<D>("rolling back a transaction"))
    }
}

impl<D: Dialect> Deref for OutboxTransaction<'_, D> {
    type Target = <D::Database as Database>::Connection;

    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl<D: Dialect> DerefMut for OutboxTransaction<'_, D> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}
