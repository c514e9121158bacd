//! An upgrade to the wide-identifier migration (PostgreSQL 2, SQLite 3, which rebuilds the
//! outbox table) keeps what the database held: pending rows with their ids, shards, objects
//! and payloads, the shards' state, and the id sequence past deleted rows. And what a binary
//! from before it does keeps working beside the new relay: rows written without the new
//! columns, and its claim of a shard's state row.

use outbox_core::store::Admin;
use outbox_core::{Category, Id, Scope};
use outbox_sqlx::migrate::{migrate, migrator_up_to};
use outbox_sqlx::sql::{Executes, get};
use outbox_sqlx::{Dialect, SqlxStore};
use outbox_testkit::fixtures::{OrgScope, OrgUpdate, Recorder, note, org_shard};
use outbox_testkit::postgres::PgDatabase;
use outbox_testkit::sqlite::SqliteFile;
use outbox_testkit::sqlx::{Provision, SqlxTestDatabase};

type Db<P> = <<P as Provision>::Dialect as Dialect>::Database;

fn postgres<P: Provision>() -> bool {
    P::Dialect::NAME == "PostgreSQL"
}

/// An outbox row as a binary from before the migration writes it: without the new columns.
fn old_insert(shard: i64, object: i64, seq: u64) -> String {
    format!(
        "INSERT INTO outbox_messages \
            (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
         VALUES ({}, {shard}, '', {}, {object}, '{{\"seq\":{seq},\"text\":\"old\"}}')",
        OrgScope::ID.0,
        OrgUpdate::ID.0
    )
}

/// The claim of a binary from before the migration, creating or taking a shard's state row:
/// SQLite's names its conflict target, the key of `outbox_shards` before the migration.
fn old_claim<P: Provision>(shard: i64, token: i64) -> String {
    let conflict = if postgres::<P>() {
        "ON CONFLICT DO NOTHING"
    } else {
        "ON CONFLICT (shard_scope, shard_identifier, destination) DO UPDATE SET \
            lease_owner = excluded.lease_owner, lease_token = excluded.lease_token"
    };
    format!(
        "INSERT INTO outbox_shards \
            (shard_scope, shard_identifier, destination, lease_owner, lease_token) \
         VALUES ({}, {shard}, '', 'old-binary', {token}) {conflict}",
        OrgScope::ID.0
    )
}

/// The outbox rows, in columns every version of the schema has.
async fn rows<P: Provision>(database: &SqlxTestDatabase<P>) -> Vec<(i64, i64, i64, String)> {
    let mut conn = database.pool().acquire().await.expect("a connection");
    let rows = sqlx::query(
        "SELECT id, shard_identifier, object_identifier, CAST(payload AS TEXT) \
         FROM outbox_messages ORDER BY id",
    )
    .fetch_all(Db::<P>::on(&mut conn))
    .await
    .expect("the outbox rows");
    rows.iter()
        .map(|row| {
            (
                get::<Db<P>, i64>(row, 0).expect("id"),
                get::<Db<P>, i64>(row, 1).expect("shard"),
                get::<Db<P>, i64>(row, 2).expect("object"),
                get::<Db<P>, String>(row, 3).expect("payload"),
            )
        })
        .collect()
}

async fn an_upgrade_keeps_rows_state_and_the_id_sequence<P: Provision>() {
    let database = SqlxTestDatabase::<P>::create().await;
    let wide = P::Dialect::MIGRATIONS.last().expect("migrations").version;
    migrator_up_to::<P::Dialect>(wide - 1)
        .run(database.pool())
        .await
        .expect("the migrations before it");
    for (shard, object, seq) in [(1, 10, 1), (1, 11, 2), (2, 20, 3), (3, 30, 4)] {
        database.execute(&old_insert(shard, object, seq)).await;
    }
    // Shard 3's row was delivered: its id is never issued again.
    database
        .execute("DELETE FROM outbox_messages WHERE shard_identifier = 3")
        .await;
    let in_an_hour = if postgres::<P>() {
        "now() + interval '1 hour'"
    } else {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER) + 3600000"
    };
    database
        .execute(&format!(
            "INSERT INTO outbox_shards \
                (shard_scope, shard_identifier, destination, attempts, last_error, retry_at, \
                 watermark) \
             VALUES ({}, 2, '', 3, 'down', {in_an_hour}, \
                 (SELECT max(id) FROM outbox_messages))",
            OrgScope::ID.0
        ))
        .await;
    let before = rows::<P>(&database).await;

    migrate::<P::Dialect>(database.pool())
        .await
        .expect("the upgrade");

    assert_eq!(
        rows::<P>(&database).await,
        before,
        "every pending row, as it was"
    );
    let store = SqlxStore::<P::Dialect>::new(database.pool().clone());
    let after = store.pending_messages(100).await.expect("pending");
    assert_eq!(
        after
            .iter()
            .map(|row| (row.shard.clone(), row.object_identifier))
            .collect::<Vec<_>>(),
        [
            (org_shard(1), Id::integer(10)),
            (org_shard(1), Id::integer(11)),
            (org_shard(2), Id::integer(20)),
        ]
    );
    let states = store.shard_states().await.expect("states");
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].shard, org_shard(2));
    assert_eq!(states[0].attempts, 3, "the backoff is kept");

    // A binary from before the migration writes and claims beside the new one.
    database.execute(&old_insert(1, 12, 5)).await;
    database.execute(&old_claim::<P>(4, 1)).await;
    database.execute(&old_claim::<P>(4, 2)).await;

    let newest_old = after.iter().map(|row| row.id).max().expect("rows");
    let recorder = Recorder::new();
    let relay = database.relay(recorder.registry());
    let mut conn = database.pool().acquire().await.expect("a connection");
    let new = outbox_sqlx::write::write::<P::Dialect, _>(
        Db::<P>::on(&mut conn),
        &note::<OrgUpdate>(u64::MAX, 40, 6),
    )
    .await
    .expect("a new binary's wide shard");
    drop(conn);
    assert!(
        new.0 > newest_old.0 + 1,
        "ids continue past the deleted row's ({new:?} after {newest_old:?})"
    );
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    let mut delivered = recorder.triples();
    delivered.sort_unstable_by_key(|(_, _, seq)| *seq);
    assert_eq!(
        delivered,
        [
            ("org_update", 10, 1),
            ("org_update", 11, 2),
            ("org_update", 12, 5),
            ("org_update", 40, 6)
        ],
        "shard 2 still backs off; the others deliver"
    );
    assert_eq!(
        recorder
            .in_shard(&org_shard(u64::MAX))
            .iter()
            .map(|seen| seen.seq)
            .collect::<Vec<_>>(),
        [6]
    );
    let left = store.pending_messages(100).await.expect("pending");
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].shard, org_shard(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_upgrade_keeps_rows_state_and_the_id_sequence() {
    an_upgrade_keeps_rows_state_and_the_id_sequence::<PgDatabase>().await;
}

#[tokio::test]
async fn sqlite_an_upgrade_keeps_rows_state_and_the_id_sequence() {
    an_upgrade_keeps_rows_state_and_the_id_sequence::<SqliteFile>().await;
}
