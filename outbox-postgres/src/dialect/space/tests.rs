//! The rewrite of the outbox's sparse tables against a real PostgreSQL: the horizon, a reader
//! and a writer stepped in a fixed order on their own connections, with no sleeps.

use outbox_testkit::postgres::PgTestDatabase;
use sqlx::PgPool;

use super::{Rewrites, dead_heavy, rewrite};
use crate::dialect::leases::tests::transactions_pass;
use crate::dialect::positions::tests::{drain, insert, shard, snapshot_held, store};

/// The least size the tests rewrite (the relay's is larger).
const LARGE: i64 = 1 << 20;

/// The size of `table` with its indexes.
async fn total_size(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar("SELECT pg_total_relation_size($1::regclass)")
        .bind(table)
        .fetch_one(pool)
        .await
        .expect("a table's size")
}

async fn vacuum(pool: &PgPool, table: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM {table}")))
        .execute(pool)
        .await
        .expect("vacuum");
}

fn rewrites(rewritten: &[&str], refused: &[&str]) -> Rewrites {
    let names = |names: &[&str]| names.iter().map(|name| (*name).to_owned()).collect();
    Rewrites {
        rewritten: names(rewritten),
        refused: names(refused),
    }
}

/// A lease log that a held horizon left sparse is rewritten once the horizon is released,
/// without waiting for vacuum to remove its dead rows first: not while the horizon holds them
/// (a rewrite would copy them), not while a reader holds a lock on it; its live rows stay, and
/// the statistics no longer count the dead rows after it.
#[tokio::test]
async fn a_sparse_lease_log_is_rewritten_once_the_horizon_is_released() {
    let _horizon = crate::dialect::positions::tests::HORIZON.lock().await;
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let mut conn = pool.acquire().await.expect("connect");
    let mut horizon = snapshot_held(pool, "outbox_relays").await;
    // 20,000 lease rows deleted under the horizon, and one live row after them (vacuum
    // cannot cut the table's empty end off).
    for statement in [
        "INSERT INTO outbox_leases (shard_scope, shard_identifier, destination, seq, first) \
         SELECT 1, n, '', n, false FROM generate_series(1, 20000) AS n",
        "INSERT INTO outbox_leases (shard_scope, shard_identifier, destination, seq, first, \
            lease_owner, lease_token, lease_expires_at) \
         VALUES (1, 0, '', 0, true, 'relay', 7, now() + interval '1 hour')",
        "DELETE FROM outbox_leases WHERE shard_identifier > 0",
        // The counters of this session reach shared memory now, not within the second.
        "SELECT pg_stat_force_next_flush()",
    ] {
        sqlx::query(statement)
            .execute(&mut *conn)
            .await
            .expect(statement);
    }
    transactions_pass(pool).await;
    vacuum(pool, "outbox_leases").await;
    let bloated = total_size(pool, "outbox_leases").await;
    assert!(bloated > LARGE, "{bloated}");
    assert_eq!(
        rewrite(pool, LARGE, 16, LARGE, &[]).await.expect("rewrite"),
        rewrites(&[], &[]),
        "the horizon holds the dead rows"
    );

    sqlx::query("COMMIT")
        .execute(&mut *horizon)
        .await
        .expect("the horizon is released");
    assert!(
        dead_heavy(pool, 1_000).await.expect("dead rows"),
        "vacuum has not removed the dead rows"
    );
    let mut reader = pool.begin().await.expect("begin");
    sqlx::query("SELECT count(*) FROM outbox_leases")
        .execute(&mut *reader)
        .await
        .expect("the reader reads the lease log");
    assert_eq!(
        rewrite(pool, LARGE, 16, LARGE, &[]).await.expect("rewrite"),
        rewrites(&[], &["outbox_leases"])
    );
    reader.commit().await.expect("the reader ends");

    assert_eq!(
        rewrite(pool, LARGE, 16, LARGE, &[]).await.expect("rewrite"),
        rewrites(&["outbox_leases"], &[])
    );
    let rewritten = total_size(pool, "outbox_leases").await;
    assert!(rewritten < 100 << 10, "{rewritten}");
    let token: i64 = sqlx::query_scalar("SELECT lease_token FROM outbox_leases")
        .fetch_one(pool)
        .await
        .expect("the live lease stays");
    assert_eq!(token, 7);
    assert!(
        !dead_heavy(pool, 1_000).await.expect("dead rows"),
        "the statistics count the dead rows the rewrite dropped"
    );
}

/// `outbox_messages` drained under a held horizon is rewritten once the horizon ends (with no
/// vacuum between), but never under a writer whose transaction is open (its lock is refused,
/// and its row is delivered after), nor once the table (its indexes not counted) is larger
/// than the largest size allowed; the pending messages stay, with their ids.
#[tokio::test]
async fn a_sparse_message_table_is_rewritten_without_waiting_on_writers() {
    let _horizon = crate::dialect::positions::tests::HORIZON.lock().await;
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let (store, _) = store(pool);
    let mut conn = pool.acquire().await.expect("connect");
    let mut horizon = snapshot_held(pool, "outbox_relays").await;
    // Every 50th message stays pending: live rows all through the table, so that vacuum
    // cannot cut its end off.
    let mut pending = Vec::new();
    for identifier in 1..=600 {
        let id = insert(&mut conn, identifier, 2_000).await;
        if identifier % 50 == 0 {
            pending.push((identifier, id));
        } else {
            assert_eq!(drain(&store, &shard(identifier)).await, vec![id]);
        }
    }
    sqlx::query("COMMIT")
        .execute(&mut *horizon)
        .await
        .expect("the horizon is released");
    let bloated = total_size(pool, "outbox_messages").await;
    assert!(bloated > LARGE, "{bloated}");

    assert_eq!(
        rewrite(pool, LARGE, 16, LARGE / 2, &[])
            .await
            .expect("rewrite"),
        rewrites(&[], &[]),
        "larger than the largest rewritten"
    );
    let mut writer = pool.begin().await.expect("begin");
    let late = insert(&mut writer, 1_001, 0).await;
    assert_eq!(
        rewrite(pool, LARGE, 16, 1 << 30, &[])
            .await
            .expect("rewrite"),
        rewrites(&[], &["outbox_messages"])
    );
    writer.commit().await.expect("the writer commits");
    let recent = ["outbox_messages".to_owned()];
    assert_eq!(
        rewrite(pool, LARGE, 16, 1 << 30, &recent)
            .await
            .expect("rewrite"),
        rewrites(&[], &[]),
        "rewritten a moment ago"
    );
    // The largest size counts the table, not its indexes, which the rewrite does not read.
    let table: i64 = sqlx::query_scalar("SELECT pg_table_size('outbox_messages')")
        .fetch_one(pool)
        .await
        .expect("the table's size");
    assert!(table < bloated, "{table} {bloated}");
    assert_eq!(
        rewrite(pool, LARGE, 16, table, &[]).await.expect("rewrite"),
        rewrites(&["outbox_messages"], &[])
    );
    assert!(total_size(pool, "outbox_messages").await < bloated / 4);
    for (identifier, id) in pending {
        assert_eq!(drain(&store, &shard(identifier)).await, vec![id]);
    }
    assert_eq!(drain(&store, &shard(1_001)).await, vec![late]);
}

/// The tables are dead-heavy while a horizon holds the rows the drains deleted, and no longer
/// once vacuum has removed them; a statement run under the guard plans with bitmap scans,
/// sequential scans and compilation off, in its own transaction, and the connection keeps its own settings after.
#[tokio::test]
async fn the_batch_statements_are_guarded_while_dead_rows_are_many() {
    let _horizon = crate::dialect::positions::tests::HORIZON.lock().await;
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let mut conn = pool.acquire().await.expect("connect");
    // The statistics' counters of `conn`'s session reach shared memory now, not within the
    // second; then the store's check reads them.
    let heavy = async |conn: &mut sqlx::PgConnection| {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(conn)
            .await
            .expect("flush the statistics");
        dead_heavy(pool, 1_000).await.expect("dead rows")
    };
    assert!(!heavy(&mut conn).await, "an empty outbox");
    let mut horizon = snapshot_held(pool, "outbox_relays").await;
    for statement in [
        "INSERT INTO outbox_messages \
            (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
         SELECT 1, n % 40, '', 1, 1, '{}' FROM generate_series(1, 3000) AS n",
        "DELETE FROM outbox_messages",
    ] {
        sqlx::query(statement)
            .execute(&mut *conn)
            .await
            .expect(statement);
    }
    vacuum(pool, "outbox_messages").await;
    assert!(heavy(&mut conn).await, "3,000 rows held by the horizon");
    sqlx::query("COMMIT")
        .execute(&mut *horizon)
        .await
        .expect("commit");
    vacuum(pool, "outbox_messages").await;
    assert!(!heavy(&mut conn).await, "the rows removed");

    let settings = "SELECT current_setting('enable_bitmapscan') \
        || current_setting('enable_seqscan') || current_setting('jit')";
    for (guarded, expected) in [(true, "offoffoff"), (false, "ononon")] {
        let rows = super::fetch_all(&mut conn, sqlx::query(settings), guarded)
            .await
            .expect("the settings");
        let seen: String = sqlx::Row::get(&rows[0], 0);
        assert_eq!(seen, expected, "guarded: {guarded}");
        assert!(!sqlx::Connection::is_in_transaction(&*conn));
    }
}
