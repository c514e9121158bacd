//! SQLite claims a batch of shards in one write transaction and reads their heads with one
//! statement: each session's first read is answered from it, shard by shard, unless the
//! head was cut short of the read.

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
    database
        .execute(&format!(
            "DELETE FROM outbox_messages WHERE id IN ({}, {})",
            ids[1].0, ids[3].0
        ))
        .await;
    // Shard 1's head filled its read of two: a batch of 500 reads the shard again (its third
    // row was not read with the claim). The UUID shard's head found fewer rows than it read:
    // it answers a batch of any size.
    let mut heads = Vec::new();
    for (session, limit) in sessions.iter_mut().zip([500, 500, 2, 500]) {
        let head = session.fetch(limit).await.expect("fetch");
        heads.push(head.iter().map(|row| row.id).collect::<Vec<_>>());
    }
    assert_eq!(
        heads,
        [
            vec![ids[0], ids[2], ids[4]],
            vec![ids[1]],
            vec![ids[3]],
            vec![]
        ],
        "each shard's head as the claim read it, or the whole shard where the head was cut short"
    );
    for session in &mut sessions[1..] {
        assert!(
            session.fetch(500).await.expect("fetch").is_empty(),
            "a second read is the session's own"
        );
    }
}
