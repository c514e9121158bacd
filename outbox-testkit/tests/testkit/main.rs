//! Tests of the test kit itself: each fault, recorder and assertion does what it says, and an
//! assertion fails, saying what it found, when it should. Deliveries run through a real relay
//! on a temporary SQLite database.

mod faults;
mod inspect;
mod recorder;

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use outbox_core::admin::Admin;
use outbox_core::{
    Backoff, DrainReport, Message, Registry, Relay, RelayConfig, RelayConfigBuilder, ShardKey,
};
use outbox_sqlite::SqliteStore;
use outbox_testkit::fixtures::MODEL_TABLES;
use outbox_testkit::sqlite::SqliteTestDatabase;

/// A migrated temporary database, with the test models' tables, and its store.
struct Db {
    database: SqliteTestDatabase,
    store: SqliteStore,
}

impl Db {
    async fn new() -> Self {
        let database = SqliteTestDatabase::create().await;
        outbox_sqlite::migrate(database.pool())
            .await
            .expect("apply the outbox migrations");
        for ddl in MODEL_TABLES {
            sqlx::raw_sql(ddl)
                .execute(database.pool())
                .await
                .expect("create a model table");
        }
        let store = SqliteStore::new(database.pool().clone());
        Self { database, store }
    }

    /// Writes `messages` in one committed transaction.
    async fn write(&self, messages: &[Message]) {
        let mut tx = self.database.pool().begin().await.expect("begin");
        outbox_sqlite::write_all(&mut *tx, messages)
            .await
            .expect("write outbox messages");
        tx.commit().await.expect("commit");
    }

    /// A relay on this database: quick polling, a 2 s backoff (failed shards are retried by
    /// [`Db::retry`], never by waiting).
    fn relay(&self, registry: Registry) -> Relay<SqliteStore> {
        self.relay_with(registry, |config| config)
    }

    fn relay_with(
        &self,
        registry: Registry,
        configure: impl FnOnce(RelayConfigBuilder) -> RelayConfigBuilder,
    ) -> Relay<SqliteStore> {
        let builder = RelayConfig::builder()
            .worker_id("testkit")
            .poll_interval(Duration::from_millis(20))
            .backoff(Backoff::new(
                Duration::from_secs(2),
                Duration::from_secs(60),
            ))
            .shutdown_deadline(Duration::from_secs(5));
        let config = configure(builder)
            .build()
            .expect("a valid relay configuration");
        Relay::with_config(self.store.clone(), registry, config)
    }

    /// Makes `shard` (in backoff) due now, and drains.
    async fn retry(&self, relay: &Relay<SqliteStore>, shard: &ShardKey) -> DrainReport {
        assert!(
            self.store.reschedule(shard).await.expect("reschedule"),
            "{shard} was not in backoff"
        );
        relay.drain().await.expect("drain")
    }
}

/// The message of the panic `test` raises; fails the test if it does not panic.
async fn panic_message(test: impl Future<Output = ()>) -> String {
    match AssertUnwindSafe(test).catch_unwind().await {
        Ok(()) => panic!("expected a panic, and there was none"),
        Err(payload) => message_of(payload.as_ref()),
    }
}

/// The message of the panic `test` raises; fails the test if it does not panic.
fn sync_panic_message(test: impl FnOnce()) -> String {
    match std::panic::catch_unwind(AssertUnwindSafe(test)) {
        Ok(()) => panic!("expected a panic, and there was none"),
        Err(payload) => message_of(payload.as_ref()),
    }
}

fn message_of(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|message| (*message).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}
