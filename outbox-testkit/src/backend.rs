//! What a backend provides so the conformance suite can run against it: [`StoreBackend`] for
//! the relay and store behaviours (what any [`Store`] can pass, the in-memory one included),
//! [`TestBackend`] for the rest, which needs a SQL database (the caller's transactions, model
//! tables, migrations), of which `StoreBackend` is the part without SQL.

use std::future::Future;

use outbox_core::{
    BoxError, Error, Id, Message, MessageId, ModelBatch, ReplicatedModel, ShardKey, WrittenShards,
};

use outbox_core::handler::HandlerContext;

use outbox_core::store::Store;

/// What a scripted outbox transaction ([`TestBackend::write_scoped`]) writes, and where.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scoped<'a> {
    /// Written at the top level of the flushing transaction.
    pub top: &'a [Message],
    /// Written in a nested scope that commits and flushes with its parent.
    pub nested: &'a [Message],
    /// Written in a nested deferred scope: left to the relay.
    pub deferred: &'a [Message],
    /// Written in a nested scope that rolls back.
    pub rolled_back: &'a [Message],
}

/// A model write of the backends: `insert`, `update`, `save` or `delete`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelWrite {
    /// Insert new rows.
    Insert,
    /// Update existing rows.
    Update,
    /// Insert or update.
    Save,
    /// Delete.
    Delete,
}

/// A fresh store of one backend, with what the relay and store behaviours of the conformance
/// suite need to drive it: run them with
/// [`store_conformance_tests!`](crate::store_conformance_tests).
///
/// Implemented by [`MemoryBackend`](crate::memory::MemoryBackend), and by every
/// [`TestBackend`], of which it is the part without SQL.
pub trait StoreBackend: Send + Sync + Sized + 'static {
    /// The backend's store.
    type Store: Store + outbox_core::admin::Admin;

    /// The backend's name, for messages.
    const NAME: &'static str;

    /// A fresh, empty store, ready for the relay.
    fn create() -> impl Future<Output = Self> + Send;

    /// A store on this backend's data.
    fn store(&self) -> Self::Store;

    /// A store on this backend's data with connections of its own, as another process would
    /// have.
    fn connect_store(&self) -> impl Future<Output = Self::Store> + Send;

    /// Writes `messages` and commits them together; returns their ids.
    fn write(
        &self,
        messages: &[Message],
    ) -> impl Future<Output = Result<Vec<MessageId>, Error>> + Send;

    /// Writes `messages` and commits them together; returns what the commit gives to
    /// [`Relay::flush`](outbox_core::Relay::flush).
    fn commit(
        &self,
        messages: &[Message],
    ) -> impl Future<Output = Result<WrittenShards, Error>> + Send;

    /// Inserts an outbox row directly, bypassing every check of the typed API.
    fn insert_raw(
        &self,
        shard: &ShardKey,
        category: i32,
        object_identifier: Id,
        payload_json: &str,
    ) -> impl Future<Output = MessageId> + Send;
}

/// A fresh database of one backend, with what the conformance suite needs to drive it.
///
/// Implemented for PostgreSQL, MariaDB and SQLite in this crate; a third-party backend implements it to
/// run [`conformance_tests!`](crate::conformance_tests) (and is a [`StoreBackend`] with it).
pub trait TestBackend: StoreBackend {
    // `StoreBackend::create` makes a fresh, empty database with the outbox migrations applied
    // and a `business_rows` table (`id` primary key) standing for the application's own data.

    /// A fresh database without the outbox migrations (but with `business_rows`).
    fn create_unmigrated() -> impl Future<Output = Self> + Send;

    /// Applies the outbox migrations.
    fn migrate(&self) -> impl Future<Output = Result<(), Error>> + Send;

    /// In one transaction: inserts business row `business_id`, writes `messages` one at a time,
    /// then commits, or rolls back if `commit` is false.
    fn write_in_transaction(
        &self,
        business_id: i64,
        messages: &[Message],
        commit: bool,
    ) -> impl Future<Output = Result<Vec<MessageId>, Error>> + Send;

    /// Writes `messages` with the bulk write in one transaction; returns their ids and how many
    /// statements the bulk write executed.
    fn write_all_counted(
        &self,
        messages: &[Message],
    ) -> impl Future<Output = Result<(Vec<MessageId>, usize), Error>> + Send;

    /// With the backend's flushing outbox transaction: writes `script` (each message with its
    /// own write), then commits, or rolls back if `commit` is false. Returns what the commit
    /// gave to flush (nothing after a rollback).
    fn write_scoped(
        &self,
        script: Scoped<'_>,
        commit: bool,
    ) -> impl Future<Output = Result<WrittenShards, Error>> + Send;

    /// Runs a statement of the application's own: creating a table, or changing a row behind
    /// the outbox's back.
    fn execute(&self, sql: &str) -> impl Future<Output = ()> + Send;

    /// In one transaction, applies the backend's model write `write` to `models`, then commits,
    /// or rolls back if `commit` is false. Returns the rows the write affected.
    fn write_models<M: TestModel>(
        &self,
        write: ModelWrite,
        models: ModelBatch<'_, M>,
        commit: bool,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Makes the database refuse (or accept again) every write that moves a backfill's
    /// watermark forward (a trigger raising an error): what a failed watermark write looks
    /// like. Recording a batch's error on the watermark still succeeds.
    fn refuse_backfill_progress(&self, refuse: bool) -> impl Future<Output = ()> + Send;

    /// Whether business row `id` exists.
    fn business_row_exists(&self, id: i64) -> impl Future<Output = bool> + Send;

    /// Inserts business row `id` with the claiming transaction lent to an in-transaction
    /// handler.
    fn insert_business_row_in(
        cx: &mut HandlerContext<'_>,
        id: i64,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// A replicated model the test kit writes: one that every backend built in writes.
pub trait TestModel: ReplicatedModel + PgWritable + MySqlWritable + SqliteWritable {}

impl<M: ReplicatedModel + PgWritable + MySqlWritable + SqliteWritable> TestModel for M {}

/// Declares `$name`: a model the backend of the feature `$feature` writes (any model, without
/// the feature), documented as `$doc`.
macro_rules! writable_by {
    ($name:ident, $feature:literal, $dialect:ty, $doc:literal) => {
        #[doc = $doc]
        #[cfg(feature = $feature)]
        pub trait $name: outbox_sqlx::Writable<$dialect> {}

        #[cfg(feature = $feature)]
        impl<M: outbox_sqlx::Writable<$dialect>> $name for M {}

        #[doc = $doc]
        #[cfg(not(feature = $feature))]
        pub trait $name {}

        #[cfg(not(feature = $feature))]
        impl<M> $name for M {}
    };
}

writable_by!(
    PgWritable,
    "postgres",
    outbox_postgres::PgDialect,
    "A model the PostgreSQL backend writes (any model, without the `postgres` feature)."
);
writable_by!(
    MySqlWritable,
    "mysql",
    outbox_mysql::MySqlDialect,
    "A model the MariaDB backend writes (any model, without the `mysql` feature)."
);
writable_by!(
    SqliteWritable,
    "sqlite",
    outbox_sqlite::SqliteDialect,
    "A model the SQLite backend writes (any model, without the `sqlite` feature)."
);
