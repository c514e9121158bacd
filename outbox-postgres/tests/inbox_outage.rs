//! A consumer whose database connections are killed while it applies a message (the server
//! terminating them, as a failover or an administrator does): the open transaction is lost
//! with its inbox record, the message is applied again on a new connection, and every
//! message is applied exactly once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::handler::{FromContext, Handler, HandlerContext};
use outbox_core::inbox::{Consumer, Inbox, Incoming, Settled};
use outbox_core::{Backoff, BoxError, Connection, Delivery, Registry};
use outbox_postgres::PgStore;
use outbox_testkit::fixtures::{AuditEvent, note};
use outbox_testkit::postgres::PgTestDatabase;
use outbox_testkit::sink::MemorySink;
use sqlx::{PgConnection, PgPool};

/// Charges the order (its seq) in the consumer's transaction; charging order `kill_on` the
/// first time, it has the server terminate every other connection to the database, its own
/// included, then goes on with its transaction.
struct KillingCharge {
    admin: PgPool,
    kill_on: u64,
    killed: AtomicBool,
    attempts: Arc<Mutex<Vec<(u64, u32)>>>,
}

impl Handler<Delivery<AuditEvent>> for KillingCharge {
    async fn call(
        &self,
        delivery: Delivery<AuditEvent>,
        cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        let seq = delivery.payload.seq;
        self.attempts
            .lock()
            .expect("attempts")
            .push((seq, delivery.attempt));
        let mut conn = Connection::<PgConnection>::from_context(cx)?;
        sqlx::query("INSERT INTO charges (order_id) VALUES ($1)")
            .bind(i64::try_from(seq)?)
            .execute(&mut *conn)
            .await?;
        if seq == self.kill_on && !self.killed.swap(true, Ordering::SeqCst) {
            let killed: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM ( \
                    SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                    WHERE datname = current_database() AND pid <> pg_backend_pid() \
                 ) AS killed",
            )
            .fetch_one(&self.admin)
            .await?;
            assert!(killed >= 1, "the consumer's connection was among them");
            // The transaction's connection is gone: this fails, and so does the attempt.
            sqlx::query("SELECT 1").execute(&mut *conn).await?;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_whose_connections_are_killed_applies_each_message_once() {
    let database = PgTestDatabase::migrated().await;
    database
        .execute("CREATE TABLE charges (order_id BIGINT NOT NULL)")
        .await;
    let messages: Vec<_> = (1..=5).map(|seq| note::<AuditEvent>(7, seq, seq)).collect();
    database.write_messages(&messages).await;
    let sink = MemorySink::new();
    let registry = Registry::builder()
        .sink::<AuditEvent, _>(sink.clone())
        .build()
        .expect("a registry");
    database.relay(registry).drain().await.expect("drain");

    let attempts = Arc::new(Mutex::new(Vec::new()));
    let charge = KillingCharge {
        admin: database.connect().await,
        kill_on: 3,
        killed: AtomicBool::new(false),
        attempts: Arc::clone(&attempts),
    };
    let consumer = Consumer::builder(
        Inbox::new("billing"),
        PgStore::new(database.connect().await),
    )
    .handle::<AuditEvent, _>(charge)
    .backoff(Backoff::new(
        Duration::from_millis(10),
        Duration::from_millis(100),
    ))
    .build()
    .expect("a consumer");
    for envelope in sink.published() {
        let settled = consumer
            .process(
                &Incoming::from(&envelope),
                || async {},
                std::future::pending(),
            )
            .await;
        assert_eq!(settled, Some(Settled::Applied));
    }

    let charges: Vec<i64> = sqlx::query_scalar("SELECT order_id FROM charges ORDER BY order_id")
        .fetch_all(database.pool())
        .await
        .expect("charges");
    assert_eq!(charges, vec![1, 2, 3, 4, 5], "each order charged once");
    let attempts = attempts.lock().expect("attempts").clone();
    assert_eq!(
        attempts,
        vec![(1, 1), (2, 1), (3, 1), (3, 2), (4, 1), (5, 1)],
        "order 3 applied again after its connection was killed"
    );
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_inbox")
        .fetch_one(database.pool())
        .await
        .expect("the inbox");
    assert_eq!(recorded, 5);
}
