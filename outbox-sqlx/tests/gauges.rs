//! The relay's gauges cost the same whatever the backlog: counted exactly below the store's
//! limit ([`SqlxStore::exact_gauges_up_to`]), estimated above it from an index descent per
//! table, the shard states and one page of discovery.

use std::time::Duration;

use outbox_core::admin::Admin;
use outbox_core::store::Store;
use outbox_core::store::{ClaimOptions, Failure, Outcome, ShardSession};
use outbox_core::{CategoryId, HandlerMode, MessageId};
use outbox_sqlx::SqlxStore;
use outbox_testkit::fixtures::{OrgUpdate, note, org_shard};
use outbox_testkit::postgres::PgDatabase;
use outbox_testkit::sqlite::SqliteFile;
use outbox_testkit::sqlx::{Provision, SqlxTestDatabase};

fn claiming(worker: &str) -> ClaimOptions {
    ClaimOptions {
        worker: worker.to_owned(),
        lease: Duration::from_secs(60),
        mode: HandlerMode::Leased,
    }
}

/// Shards 1 to 5 with three messages each: 1 backing off, 2 held by a relay, 3 parked, 4 and
/// 5 due. Exact and estimated gauges agree on the shards; the estimate says it is one.
async fn gauges_are_exact_below_the_limit_and_estimated_above<P: Provision>()
where
    SqlxStore<P::Dialect>: Store + Admin,
{
    let database = SqlxTestDatabase::<P>::migrated().await;
    let mut messages = Vec::new();
    for shard in 1..=5 {
        for object in 1..=3 {
            messages.push(note::<OrgUpdate>(shard, object, shard * 10 + object));
        }
    }
    database.write_messages(&messages).await;
    let store = SqlxStore::<P::Dialect>::new(database.pool().clone());
    let newest: MessageId = store
        .newest_message_id()
        .await
        .expect("newest")
        .expect("messages");
    let fail = |parked_category| Failure {
        error: "refused".to_owned(),
        attempts: 1,
        retry_in: Duration::from_secs(600),
        watermark: newest,
        parked_category,
    };
    for (shard, parked) in [(1, None), (3, Some(CategoryId(99)))] {
        let session = store
            .claim(&org_shard(shard), &claiming("failing"))
            .await
            .expect("claim")
            .expect("due");
        session
            .finish(Outcome::Failed(fail(parked)))
            .await
            .expect("fail");
    }
    let _held = store
        .claim(&org_shard(2), &claiming("holder"))
        .await
        .expect("claim")
        .expect("due");

    let gauges_up_to = |limit| {
        let store = store.clone().exact_gauges_up_to(limit);
        async move { store.gauges().await.expect("gauges") }
    };
    let exact = gauges_up_to(100).await;
    assert!(!exact.estimated, "{exact:?}");
    assert_eq!(exact, store.status(0).await.expect("status"));
    let shards = |status: &outbox_core::admin::OutboxStatus| {
        (
            status.shards,
            status.shards_due,
            status.shards_in_flight,
            status.shards_in_backoff,
            status.shards_parked,
            status.shards_paused,
        )
    };
    assert_eq!(shards(&exact), (5, 2, 1, 1, 1, 0));
    assert_eq!(exact.pending_messages, 15);

    let estimated = gauges_up_to(5).await;
    assert!(estimated.estimated, "{estimated:?}");
    assert_eq!(shards(&estimated), shards(&exact), "{estimated:?}");
    assert!(
        (5..=15).contains(&estimated.pending_messages),
        "at least the limit, at most the span of the ids: {estimated:?}"
    );
    assert_eq!(estimated.oldest_pending_at, exact.oldest_pending_at);

    // A message newer than shard 1's failure makes it due (S19), in the estimate too.
    database
        .write_messages(&[note::<OrgUpdate>(1, 4, 99)])
        .await;
    let estimated = gauges_up_to(5).await;
    assert_eq!(
        (estimated.shards_due, estimated.shards_in_backoff),
        (3, 0),
        "{estimated:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_gauges_are_exact_below_the_limit_and_estimated_above() {
    gauges_are_exact_below_the_limit_and_estimated_above::<PgDatabase>().await;
}

#[tokio::test]
async fn sqlite_gauges_are_exact_below_the_limit_and_estimated_above() {
    gauges_are_exact_below_the_limit_and_estimated_above::<SqliteFile>().await;
}
