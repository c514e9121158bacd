//! SQLite keeps any value in any column: rows that no relay could deliver (a scope outside
//! SMALLINT, a text shard identifier, a payload that is not JSON) are refused by the schema,
//! set aside by the migration that added the checks, and, should one be written around them,
//! stop only their own shard with a typed error naming the row.

use std::borrow::Cow;

use outbox_core::admin::Admin;
use outbox_core::error::error_chain;
use outbox_core::store::Store;
use outbox_core::{DeliveryError, Error};
use outbox_sqlite::SqliteStore;
use outbox_testkit::fixtures::{OrgUpdate, Recorder, note, org_shard};
use outbox_testkit::sqlite::SqliteTestDatabase;
use sqlx::{Row, SqlitePool};

const ODD_ROWS: [(&str, &str); 5] = [
    ("scope above SMALLINT", "70000, 1, '', 1, 1, '{}'"),
    ("text shard identifier", "1, 'abc', '', 1, 1, '{}'"),
    ("text category", "1, 2, '', 'x', 1, '{}'"),
    ("payload not JSON", "1, 3, '', 1, 1, 'not json'"),
    ("blob destination", "1, 4, x'00', 1, 1, '{}'"),
];

fn insert(values: &str) -> String {
    format!(
        "INSERT INTO outbox_messages \
            (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
         VALUES ({values})"
    )
}

/// Runs `sql` with the schema's CHECK constraints off: a row written around them.
async fn around_the_checks(pool: &SqlitePool, sql: &str) {
    let mut conn = pool.acquire().await.expect("connection");
    sqlx::query("PRAGMA ignore_check_constraints = ON")
        .execute(&mut *conn)
        .await
        .expect("pragma");
    sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut *conn)
        .await
        .expect("insert around the checks");
    sqlx::query("PRAGMA ignore_check_constraints = OFF")
        .execute(&mut *conn)
        .await
        .expect("pragma");
}

#[tokio::test]
async fn the_schema_refuses_rows_no_relay_can_deliver() {
    let database = SqliteTestDatabase::migrated().await;
    for (what, values) in ODD_ROWS {
        let error = sqlx::query(sqlx::AssertSqlSafe(insert(values)))
            .execute(database.pool())
            .await
            .expect_err(what);
        assert!(
            error.to_string().contains("CHECK constraint failed"),
            "{what}: {error}"
        );
    }
    sqlx::query(sqlx::AssertSqlSafe(insert("1, 1, '', 1, 1, '{}'")))
        .execute(database.pool())
        .await
        .expect("a well-formed row");
}

#[tokio::test]
async fn migrating_sets_aside_rows_no_relay_can_deliver_and_keeps_the_ids_rising() {
    let database = SqliteTestDatabase::create().await;
    let pool = database.pool();
    let mut first = outbox_sqlite::migrator();
    first.migrations = Cow::Owned(first.migrations[..1].to_vec());
    first.run(pool).await.expect("migration 1 alone");
    // Two good rows (the second then delivered), and one of each odd kind.
    for shard in [1, 2] {
        sqlx::query(sqlx::AssertSqlSafe(insert(&format!(
            "1, {shard}, '', 1, 10, '{{\"seq\": {shard}, \"text\": \"\"}}'"
        ))))
        .execute(pool)
        .await
        .expect("good row");
    }
    for (_, values) in ODD_ROWS {
        // Migration 1 checked only that the payload is JSON.
        around_the_checks(pool, &insert(values)).await;
    }
    let newest: i64 = sqlx::query_scalar("SELECT max(id) FROM outbox_messages")
        .fetch_one(pool)
        .await
        .expect("max id");
    sqlx::query("DELETE FROM outbox_messages WHERE id = 2")
        .execute(pool)
        .await
        .expect("deliver the second");

    outbox_sqlite::migrate(pool).await.expect("migration 2");
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_messages ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("rows");
    assert_eq!(left, [1], "the good row stays, with its id");
    let rejected = sqlx::query("SELECT id, reason FROM outbox_rejected_messages ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("rejected rows");
    let rejected: Vec<(i64, String)> = rejected
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        rejected.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        (3..=newest).collect::<Vec<_>>(),
        "every odd row is kept, with its id"
    );
    for ((what, _), (_, reason)) in ODD_ROWS.iter().zip(&rejected) {
        assert!(
            reason.starts_with("no relay can deliver it: "),
            "{what}: {reason}"
        );
    }
    assert!(rejected[0].1.contains("shard_scope"), "{:?}", rejected[0]);
    assert!(
        rejected[1].1.contains("shard_identifier"),
        "{:?}",
        rejected[1]
    );
    assert!(rejected[3].1.contains("payload"), "{:?}", rejected[3]);

    let mut tx = pool.begin().await.expect("begin");
    let id = outbox_sqlite::write(&mut *tx, &note::<OrgUpdate>(3, 30, 3))
        .await
        .expect("write after the migration");
    tx.commit().await.expect("commit");
    assert!(id.0 > newest, "ids keep rising past every id issued");

    let recorder = Recorder::new();
    let relay = database.relay(recorder.registry());
    let report = relay
        .drain()
        .await
        .expect("the relay runs on the checked schema");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(recorder.seen().len(), 2);
}

#[tokio::test]
async fn an_undecodable_row_stops_only_its_shard_with_a_typed_error() {
    let database = SqliteTestDatabase::migrated().await;
    let pool = database.pool();
    around_the_checks(pool, &insert("1, 1, '', 1, 'abc', '{}'")).await;
    let odd: i64 = sqlx::query_scalar("SELECT max(id) FROM outbox_messages")
        .fetch_one(pool)
        .await
        .expect("id");
    let mut tx = pool.begin().await.expect("begin");
    outbox_sqlite::write(&mut *tx, &note::<OrgUpdate>(2, 20, 2))
        .await
        .expect("a good row in another shard");
    tx.commit().await.expect("commit");

    let recorder = Recorder::new();
    let relay = database.relay(recorder.registry());
    let report = relay.drain().await.expect("the relay carries on");
    assert_eq!(recorder.triples(), [("org_update", 20, 2)], "shard 2 flows");
    assert_eq!(report.failures.len(), 1);
    let failure = &report.failures[0];
    assert_eq!(failure.shard, org_shard(1));
    assert!(
        matches!(failure.error, DeliveryError::Undecodable { .. }),
        "{:?}",
        failure.error
    );
    let chain = error_chain(&failure.error);
    assert!(
        chain.contains(&format!("outbox row {odd} cannot be read"))
            && chain.contains("object_identifier is \"abc\", not an identifier"),
        "{chain}"
    );
    let still: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_messages WHERE id = ?")
        .bind(odd)
        .fetch_one(pool)
        .await
        .expect("count");
    assert_eq!(still, 1, "the odd row is never deleted");
    let state = SqliteStore::new(pool.clone())
        .shard_states()
        .await
        .expect("states")
        .into_iter()
        .find(|state| state.shard == org_shard(1))
        .expect("shard 1 has a state");
    assert!(state.retry_at.is_some(), "shard 1 backs off: {state:?}");
    assert!(
        state
            .last_error
            .as_deref()
            .is_some_and(|error| error.contains(&format!("outbox row {odd}"))),
        "{state:?}"
    );
}

#[tokio::test]
async fn discovering_an_undecodable_shard_key_is_a_typed_error() {
    let database = SqliteTestDatabase::migrated().await;
    around_the_checks(database.pool(), &insert("70000, 1, '', 1, 1, '{}'")).await;
    let error = SqliteStore::new(database.pool().clone())
        .discover(None, 10)
        .await
        .expect_err("a scope above SMALLINT");
    assert!(matches!(error, Error::Undecodable { .. }), "{error:?}");
}
