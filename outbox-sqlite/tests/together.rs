//! SQLite claims a batch of shards in one write transaction and reads their heads with one
//! statement: each session's first read is answered from it, shard by shard.

use std::time::Duration;

use outbox_core::store::{ClaimOptions, HandlerMode, ShardSession, Store};
use outbox_core::{Destination, Id, Scope, ShardKey};
use outbox_sqlite::SqliteStore;
use outbox_testkit::fixtures::{OrgScope, OrgUpdate, note, org_shard};
use outbox_testkit::sqlite::SqliteTestDatabase;

fn options() -> ClaimOptions {
    ClaimOptions {
        worker: "together".to_owned(),
        lease: Duration::from_secs(30),
        mode: HandlerMode::Leased,
    }
}

#[tokio::test]
async fn a_batch_of_claims_reads_every_claimed_head_at_once() {
    let database = SqliteTestDatabase::migrated().await;
    let uuid = Id::wide(0x0123_4567_89ab_4def_8123_4567_89ab_cdef);
    let west = Destination::new("eu:west").expect("a destination");
    let fan_out = ShardKey::fan_out(OrgScope::ID, uuid, west.clone());
    let ids = database
        .write_messages(&[
            note::<OrgUpdate>(1, 10, 1),
            note::<OrgUpdate>(uuid, uuid, 2),
            note::<OrgUpdate>(1, 11, 3),
            note::<OrgUpdate>(uuid, 5, 4).with_destination(west),
            note::<OrgUpdate>(1, 12, 5),
            note::<OrgUpdate>(2, 20, 6),
        ])
        .await;
    let store = SqliteStore::new(database.pool().clone());
    // Shard 3 has no rows: claimed, with an empty head.
    let wanted = [org_shard(1), org_shard(uuid), fan_out.clone(), org_shard(3)];
    let mut sessions = store
        .claim_many(&wanted, &options(), 2)
        .await
        .expect("claim");
    assert_eq!(
        sessions
            .iter()
            .map(|session| session.lease().shard.clone())
            .collect::<Vec<_>>(),
        wanted,
        "every shard claimed, in the order of their tokens"
    );
    // Gone behind the claims' backs: only a read made with the claim still holds them.
    database.execute("DELETE FROM outbox_messages").await;
    let mut heads = Vec::new();
    for session in &mut sessions {
        let head = session.fetch(2).await.expect("fetch");
        heads.push(head.iter().map(|row| row.id).collect::<Vec<_>>());
    }
    assert_eq!(
        heads,
        [vec![ids[0], ids[2]], vec![ids[1]], vec![ids[3]], vec![]],
        "each shard's first two rows, as the claim read them"
    );
    for session in &mut sessions {
        assert!(
            session.fetch(2).await.expect("fetch").is_empty(),
            "a second read is the session's own"
        );
    }
}
