//! A relay's leases on SQLite while another connection holds the database's write lock
//! nearly all the time (as other processes' writers and relays do under load): its handlers
//! run longer than the lease, and no lease lapses before they end. The relay extends the
//! leases of all its running handlers in one statement, ahead of its other writes, and polls
//! for the write lock instead of sleeping in SQLite's busy handler, whose sleeps grow to
//! 100 ms and miss the moments the lock is free.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    BoxError, Delivery, Message, Registry, Relay, RelayConfig, outbox_category, outbox_scope,
};
use outbox_sqlite::SqliteStore;
use outbox_testkit::sqlite::SqliteTestDatabase;
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;
use tokio::sync::{Semaphore, mpsc};

#[outbox_scope(id = 1)]
struct Streams;

#[outbox_category(scope = Streams, id = 1)]
#[derive(Serialize, Deserialize)]
struct Step;

const SHARDS: usize = 8;
const LEASE: Duration = Duration::from_millis(1_500);
/// How long the other connection holds the write lock each time, and how long it leaves it
/// free before it asks again.
const HOLD: Duration = Duration::from_millis(200);
const FREE: Duration = Duration::from_millis(10);

/// Holds the write lock for [`HOLD`], `pulses` times, [`FREE`] apart; at the end of each hold
/// (when a lease waiting for the lock is the nearest to its end) counts the relay's leases
/// that have run out. Returns the most it saw at once.
async fn hold_the_write_lock(pool: &SqlitePool, pulses: u32) -> i64 {
    let mut most = 0;
    for _ in 0..pulses {
        let mut tx = pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("take the write lock");
        tokio::time::sleep(HOLD).await;
        let lapsed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_shards WHERE lease_owner = 'kept' \
             AND lease_expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        )
        .fetch_one(&mut *tx)
        .await
        .expect("count lapsed leases");
        most = most.max(lapsed);
        tx.commit().await.expect("release the write lock");
        tokio::time::sleep(FREE).await;
    }
    most
}

#[tokio::test]
async fn leases_hold_while_another_connection_keeps_the_write_lock_nearly_all_the_time() {
    let database = SqliteTestDatabase::migrated().await;
    let messages: Vec<Message> = (0..SHARDS as u64)
        .map(|shard| Message::new::<Step>(shard, 1, &Step).expect("a message"))
        .collect();
    database.write_messages(&messages).await;

    // Every handler runs until the test lets them all end.
    let (started, mut handlers_started) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let registry = {
        let gate = Arc::clone(&gate);
        Registry::builder()
            .handle::<Step>(move |_: Delivery<Step>| {
                let (started, gate) = (started.clone(), Arc::clone(&gate));
                async move {
                    let _ = started.send(());
                    gate.acquire().await?.forget();
                    Ok::<_, BoxError>(())
                }
            })
            .build()
            .expect("registry")
    };
    let config = RelayConfig::builder()
        .worker_id("kept")
        .lease(LEASE)
        .max_concurrent_shards(SHARDS)
        .build()
        .expect("config");
    let relay = Relay::with_config(SqliteStore::new(database.pool().clone()), registry, config);
    let drain = tokio::spawn(async move { relay.drain().await });
    for _ in 0..SHARDS {
        handlers_started
            .recv()
            .await
            .expect("every shard's handler starts");
    }

    // Another process's connection takes the write lock and keeps it for three leases,
    // leaving it free for 10 ms in every 210.
    let other = database.connect().await;
    let pulses = (3 * LEASE.as_millis() / (HOLD + FREE).as_millis()) as u32;
    let most_lapsed = hold_the_write_lock(&other, pulses).await;
    let lapsed_at_the_end = hold_the_write_lock(&other, 1).await;

    gate.add_permits(SHARDS);
    let report = drain.await.expect("the drain's task").expect("the drain");
    assert_eq!(
        (most_lapsed, lapsed_at_the_end),
        (0, 0),
        "no lease ran out while its handler ran"
    );
    assert_eq!(report.deliveries, SHARDS as u64, "{report:?}");
    assert!(report.failures.is_empty(), "{report:?}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_messages")
        .fetch_one(database.pool())
        .await
        .expect("count messages");
    assert_eq!(left, 0, "every message acknowledged under its lease");
}
