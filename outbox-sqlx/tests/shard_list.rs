//! Listing shards costs the same whatever the backlog: every shard ranked below the store's
//! exact limit ([`SqlxStore::exact_gauges_up_to`]); above it, ranked from windows of ids
//! spread over the id span, with a scope's first shards and the paused ones found by their
//! own rows, and each shard counted up to a cap, estimated beyond.

use outbox_core::admin::{Admin, PauseTarget, ShardFilter, ShardList, ShardQuery};
use outbox_core::store::Store;
use outbox_core::{Category, Scope, ShardKey};
use outbox_sqlx::SqlxStore;
use outbox_testkit::fixtures::{OrgScope, OrgUpdate, ProjectUpdate, UserScope, UserUpdate, note};
use outbox_testkit::postgres::PgDatabase;
use outbox_testkit::sqlite::SqliteFile;
use outbox_testkit::sqlx::{Provision, SqlxTestDatabase};

/// Each shard listed: its scope, identifier, pending count and whether it is an estimate.
fn listed(list: &ShardList) -> Vec<(i16, String, u64, bool)> {
    list.shards
        .iter()
        .map(|info| {
            (
                info.shard.scope.0,
                info.shard.shard_identifier.to_string(),
                info.pending,
                info.pending_estimated,
            )
        })
        .collect()
}

fn org(shard: i64, pending: u64, estimated: bool) -> (i16, String, u64, bool) {
    (OrgScope::ID.0, shard.to_string(), pending, estimated)
}

fn user(shard: i64, pending: u64, estimated: bool) -> (i16, String, u64, bool) {
    (UserScope::ID.0, shard.to_string(), pending, estimated)
}

/// `restart(id)` is the dialect's statement that makes the next message's id `id`.
async fn shards_are_ranked_whole_below_the_limit_and_sampled_above<P: Provision>(
    restart: fn(i64) -> String,
) where
    SqlxStore<P::Dialect>: Store + Admin,
{
    let database = SqlxTestDatabase::<P>::migrated().await;
    // Ids from 1 to 20: org shard 1 with 6 messages (one a ProjectUpdate), 2 with 13, 3
    // with 1.
    let mut messages = Vec::new();
    for object in 1..=5 {
        messages.push(note::<OrgUpdate>(1, object, object as u64));
    }
    messages.push(note::<ProjectUpdate>(1, 9, 6));
    for object in 1..=13 {
        messages.push(note::<OrgUpdate>(2, object, 10 + object as u64));
    }
    messages.push(note::<OrgUpdate>(3, 1, 20));
    database.write_messages(&messages).await;
    let store = SqlxStore::<P::Dialect>::new(database.pool().clone());
    let query = |filter| ShardQuery::new(filter, 10);

    // Below the limit every shard is ranked and counted.
    let whole = store
        .shards(&query(ShardFilter::Pending))
        .await
        .expect("shards");
    assert_eq!(whole.sampled, None);
    assert_eq!(
        listed(&whole),
        [org(2, 13, false), org(1, 6, false), org(3, 1, false)]
    );

    // Above it (a limit of 4: a cap of 1 message per shard), on a span narrower than the
    // sample's, every id is read: the same shards, counted up to the cap and estimated
    // (here exactly) above it.
    let sampling = store.clone().exact_gauges_up_to(4);
    let sampled = sampling
        .shards(&query(ShardFilter::Pending))
        .await
        .expect("shards");
    assert_eq!(sampled.sampled, Some(20), "{sampled:?}");
    assert_eq!(
        listed(&sampled),
        [org(2, 13, true), org(1, 6, true), org(3, 1, true)]
    );
    let sampling = store.clone().exact_gauges_up_to(20);
    let list = |query: ShardQuery| {
        let sampling = sampling.clone();
        async move { sampling.shards(&query).await.expect("shards") }
    };
    assert_eq!(
        listed(&list(query(ShardFilter::Pending)).await),
        [org(2, 13, true), org(1, 6, true), org(3, 1, false)],
        "a cap of 2"
    );
    assert_eq!(
        listed(&list(query(ShardFilter::Pending).category(ProjectUpdate::ID)).await),
        [org(1, 6, true)],
        "a shard with a message of the category, all its messages counted"
    );

    // A wide span: windows of 100 ids every 10,000th. A hot shard whose messages fill a
    // window is estimated from it; a user shard between two windows is missed by the sample,
    // and found when its scope is asked for, or paused.
    database.execute(&restart(1_000_001)).await;
    let hot: Vec<_> = (1..=300)
        .map(|object| note::<OrgUpdate>(7, object, 1_000 + object as u64))
        .collect();
    database.write_messages(&hot).await;
    database.execute(&restart(1_505_001)).await;
    database
        .write_messages(&[
            note::<UserUpdate>(9, 1, 2_000),
            note::<UserUpdate>(9, 2, 2_001),
        ])
        .await;
    database.execute(&restart(2_000_001)).await;
    database
        .write_messages(&[note::<OrgUpdate>(8, 1, 3_000)])
        .await;
    // One shard: counted up to the limit, estimated beyond from the density of its ids.
    let hot_shard = ShardKey::local(OrgScope::ID, 7);
    let counted = store
        .shard(&hot_shard)
        .await
        .expect("a shard")
        .expect("pending");
    assert_eq!((counted.pending, counted.pending_estimated), (300, false));
    let estimated = sampling
        .shard(&hot_shard)
        .await
        .expect("a shard")
        .expect("pending");
    assert_eq!(
        (estimated.pending, estimated.pending_estimated),
        (300, true),
        "its first 20 messages hold 20 ids of the 300 it spans: {estimated:?}"
    );
    assert_eq!(estimated.oldest_pending_at, counted.oldest_pending_at);
    let small = sampling
        .shard(&ShardKey::local(OrgScope::ID, 1))
        .await
        .expect("a shard")
        .expect("pending");
    assert_eq!((small.pending, small.pending_estimated), (6, false));

    let wide = list(query(ShardFilter::Pending)).await;
    let first = listed(&wide);
    assert_eq!(
        first[0],
        org(7, 10_000, true),
        "100 hits, each standing for 100 ids: {wide:?}"
    );
    assert_eq!(
        first[1..],
        [
            org(2, 1_300, true),
            org(1, 600, true),
            org(3, 1, false),
            org(8, 1, false)
        ],
        "the first window, each hit standing for 100 ids, and the last: {wide:?}"
    );
    assert!(
        !first.iter().any(|shard| shard.0 == UserScope::ID.0),
        "the sample misses the user shard: {wide:?}"
    );
    assert_eq!(wide.sampled, Some(121), "the three windows' messages");
    assert_eq!(
        listed(&list(query(ShardFilter::Pending).scope(UserScope::ID)).await),
        [user(9, 2, true)],
        "a scope's first shards are found by their own rows"
    );
    assert!(
        list(query(ShardFilter::Paused)).await.shards.is_empty(),
        "nothing paused"
    );
    store
        .pause(&PauseTarget::Scope(UserScope::ID), None)
        .await
        .expect("pause");
    store
        .pause(&PauseTarget::Shard(ShardKey::local(OrgScope::ID, 3)), None)
        .await
        .expect("pause");
    assert_eq!(
        listed(&list(query(ShardFilter::Paused)).await),
        [user(9, 2, true), org(3, 1, false)],
        "paused scopes' and shards' are found by their own rows"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_shards_are_ranked_whole_below_the_limit_and_sampled_above() {
    shards_are_ranked_whole_below_the_limit_and_sampled_above::<PgDatabase>(|id| {
        format!("ALTER TABLE outbox_messages ALTER COLUMN id RESTART WITH {id}")
    })
    .await;
}

#[tokio::test]
async fn sqlite_shards_are_ranked_whole_below_the_limit_and_sampled_above() {
    shards_are_ranked_whole_below_the_limit_and_sampled_above::<SqliteFile>(|id| {
        format!(
            "UPDATE sqlite_sequence SET seq = {} WHERE name = 'outbox_messages'",
            id - 1
        )
    })
    .await;
}
