//! What the console's and the operators' reads cost on MariaDB, over a backlog above the exact
//! limit (100,000 then 200,000 messages, in shards of 50, one shard failing, one parked),
//! counted by the rows the server reads: each reads the rows of the shards it names, a sample,
//! or a discovery page, never every message. (`Admin::status`, which counts exactly, is the
//! one read that walks them all.)

use outbox_core::admin::{ShardFilter, ShardQuery};
use outbox_core::store::{Admin, Store};
use outbox_core::{CategoryId, ScopeId};
use outbox_mysql::MySqlStore;
use outbox_testkit::mysql::MySqlTestDatabase;
use sqlx::{Connection, MySqlPool};

mod support;
use support::{one_connection, rows_read, seed, shard};

/// Adds `shards` shards of 50 messages each after the shards there are (shard `n` holds
/// messages over 10 objects, of categories 1 to 3), and refreshes the statistics.
async fn add_shards(pool: &MySqlPool, first: i64, shards: i64) {
    let rows = shards * 50;
    seed(
        pool,
        &format!(
            "INSERT INTO outbox_messages (shard_scope, shard_identifier, category, \
             object_identifier, payload) \
             SELECT 1, {first} + seq % {shards}, 1 + seq % 3, seq % 10, JSON_OBJECT('n', seq) \
             FROM seq_1_to_{rows}"
        ),
    )
    .await;
}

/// A pool of one connection on a migrated database holding 2,000 shards of 50 messages (ids
/// 1 to 100,000); shard 7 backs off after 3 failures and shard 8 is parked on category 9,
/// both since the newest message.
async fn populated(database: &MySqlTestDatabase) -> MySqlPool {
    let pool = one_connection(database).await;
    sqlx::raw_sql(
        "INSERT INTO outbox_shards (shard_scope, shard_identifier, destination, attempts, \
         last_error, retry_at, watermark, first_failed_at) \
         VALUES (1, 7, '', 3, 'refused', 9999999999999, 100000, 0), \
            (1, 8, '', 1, 'unknown category', 9999999999999, 100000, 0)",
    )
    .execute(&pool)
    .await
    .expect("the failing shards");
    sqlx::raw_sql("UPDATE outbox_shards SET parked_category = 9 WHERE shard_identifier = 8")
        .execute(&pool)
        .await
        .expect("park shard 8");
    add_shards(&pool, 0, 2_000).await;
    pool
}

/// The rows each of the console's and the operators' reads takes (by name), and checks what
/// they return: the shards pending are `shards`, two of them failing.
async fn console_reads(pool: &MySqlPool, shards: u64) -> Vec<(String, i64)> {
    let store = MySqlStore::new(pool.clone());
    let mut reads = Vec::new();

    // The gauges above the exact limit: estimates.
    let (read, gauges) = rows_read(pool, Store::gauges(&store)).await;
    let gauges = gauges.expect("gauges");
    assert!(gauges.estimated, "{gauges:?}");
    assert!(gauges.pending_messages >= 10_000, "{gauges:?}");
    assert_eq!(
        (
            gauges.shards_due,
            gauges.shards_in_backoff,
            gauges.shards_parked
        ),
        (shards - 2, 1, 1),
        "{gauges:?}"
    );
    reads.push(("the gauges".to_owned(), read));

    // The failing shards (backing off or parked) and the parked ones, found from their state
    // rows.
    for (filter, expected) in [
        (ShardFilter::Failing, &[7, 8][..]),
        (ShardFilter::Parked, &[8]),
    ] {
        let (read, listed) =
            rows_read(pool, Admin::shards(&store, &ShardQuery::new(filter, 100))).await;
        let listed = listed.expect("list");
        let keys: Vec<_> = listed
            .shards
            .iter()
            .map(|info| info.shard.clone())
            .collect();
        let expected: Vec<_> = expected.iter().copied().map(shard).collect();
        assert_eq!(keys, expected, "{filter:?}");
        assert_eq!(listed.sampled, None, "{filter:?}");
        reads.push((format!("{filter:?} shards"), read));
    }

    // The pending and paused shards of a backlog above the limit, ranked from a sample.
    for query in [
        ShardQuery::new(ShardFilter::Pending, 100),
        ShardQuery::new(ShardFilter::Pending, 100).category(CategoryId(2)),
        ShardQuery::new(ShardFilter::Paused, 100),
        ShardQuery::new(ShardFilter::Pending, 100).scope(ScopeId(1)),
    ] {
        let (read, listed) = rows_read(pool, Admin::shards(&store, &query)).await;
        let listed = listed.expect("list");
        assert!(listed.sampled.is_some(), "{query:?}");
        if query.filter == ShardFilter::Pending {
            assert_eq!(listed.shards.len(), 100, "{query:?}");
        }
        reads.push((format!("{query:?}"), read));
    }

    // One shard, and a page of its messages.
    let (read, info) = rows_read(pool, Admin::shard(&store, &shard(7))).await;
    let info = info.expect("shard").expect("shard 7 exists");
    assert_eq!((info.pending, info.attempts), (50, 3), "{info:?}");
    reads.push(("a shard".to_owned(), read));
    let (read, messages) = rows_read(pool, Admin::shard_messages(&store, &shard(7), 20)).await;
    assert_eq!(messages.expect("messages").len(), 20);
    reads.push(("a shard's messages".to_owned(), read));

    // The oldest due message: the first by id whose shard is not backing off.
    let (read, age) = rows_read(pool, Store::oldest_due_age(&store)).await;
    assert!(age.expect("age").is_some());
    reads.push(("the oldest due message".to_owned(), read));
    reads
}

/// The console's and the operators' reads over a backlog above the exact limit cost what the
/// shards they name, a sample, or a page cost, not what the backlog does: on a backlog twice
/// as large (2,000 more shards of 50 messages) each reads no more rows, save the two whose
/// cost follows the shards (by design, never their messages): the gauges' discovery page (up
/// to the limit's 10,000 shards) and a scope's listing (a loose index scan of the scope), which
/// read at most a few index entries more per shard added. Rows of tables, by the server's
/// `Rows_read` (temporary tables not counted).
#[tokio::test]
async fn the_consoles_reads_do_not_grow_with_the_backlog() {
    let database = MySqlTestDatabase::migrated().await;
    let pool = populated(&database).await;
    let before = console_reads(&pool, 2_000).await;
    add_shards(&pool, 2_000, 2_000).await;
    let after = console_reads(&pool, 4_000).await;
    for ((what, before), (_, after)) in before.iter().zip(&after) {
        let (before, after) = (*before, *after);
        let per_shard = what == "the gauges" || what.contains("scope: Some");
        if per_shard {
            assert!(
                after - before <= 5 * 2_000,
                "{what}: {before} rows read over 2,000 shards, {after} over 4,000 \
                 (each of 50 messages)"
            );
        } else {
            assert!(
                after <= before + before / 5 + 100,
                "{what}: {before} rows read over 100,000 messages, {after} over 200,000"
            );
        }
        assert!(
            after < 100_000,
            "{what}: {after} rows read over 200,000 messages"
        );
    }
}

/// An insert of `count` dead letters, their ids after `first`, over 7 shards of scope 1.
fn dead_letters(first: i64, count: i64) -> String {
    format!(
        "INSERT INTO outbox_dead_letters (message_id, shard_scope, shard_identifier, \
         destination, category, object_identifier, payload, created_at, error, attempts, \
         first_failed_at, dead_lettered_at, lease_token) \
         SELECT {first} + seq, 1, seq % 7, '', 1, seq, '{{}}', 0, 'refused', 3, 0, seq, 1 \
         FROM seq_1_to_{count}"
    )
}

/// The gauges count the dead letters exactly below the exact limit, whatever it is set to
/// (here 15,000, above the body's default), not from InnoDB's estimate: 11,000 letters beside
/// a backlog of 15,000, and another transaction's letters not yet committed.
#[tokio::test]
async fn the_gauges_count_dead_letters_exactly_below_a_raised_limit() {
    let database = MySqlTestDatabase::migrated().await;
    let pool = one_connection(&database).await;
    seed(
        &pool,
        "INSERT INTO outbox_messages (shard_scope, shard_identifier, category, \
         object_identifier, payload) SELECT 1, seq % 100, 1, seq, '{}' FROM seq_1_to_15000",
    )
    .await;
    seed(&pool, &dead_letters(100_000, 12_000)).await;
    sqlx::query("DELETE FROM outbox_dead_letters WHERE message_id > 111000")
        .execute(&pool)
        .await
        .expect("purge");
    // Another transaction's 500 letters, not committed: InnoDB's estimate of the table's rows
    // counts them.
    let mut other = sqlx::MySqlConnection::connect(&database.url())
        .await
        .expect("connect");
    let mut uncommitted = other.begin().await.expect("begin");
    sqlx::raw_sql(sqlx::AssertSqlSafe(dead_letters(200_000, 500)))
        .execute(&mut *uncommitted)
        .await
        .expect("uncommitted letters");
    let store = MySqlStore::new(pool).exact_gauges_up_to(15_000);
    let gauges = Store::gauges(&store).await.expect("gauges");
    assert!(gauges.estimated, "above the limit: {gauges:?}");
    assert_eq!(gauges.dead_letters, 11_000, "{gauges:?}");
    uncommitted.rollback().await.expect("roll back");
}

/// A sampled listing counts each candidate's messages up to its cap, whatever the cap (a tenth
/// of the exact limit: here 2,000, above the body's default): a shard of 1,500 messages among
/// 100 of 240 is counted, not estimated.
#[tokio::test]
async fn a_sampled_listing_counts_a_deep_shard_up_to_a_raised_cap() {
    let database = MySqlTestDatabase::migrated().await;
    let pool = one_connection(&database).await;
    seed(
        &pool,
        "INSERT INTO outbox_messages (shard_scope, shard_identifier, category, \
         object_identifier, payload) SELECT 1, 0, 1, seq, '{}' FROM seq_1_to_1500; \
         INSERT INTO outbox_messages (shard_scope, shard_identifier, category, \
         object_identifier, payload) SELECT 1, 1 + seq % 100, 1, seq, '{}' \
         FROM seq_1_to_24000",
    )
    .await;
    let store = MySqlStore::new(pool).exact_gauges_up_to(20_000);
    let listed = Admin::shards(&store, &ShardQuery::new(ShardFilter::Pending, 10))
        .await
        .expect("list");
    assert!(listed.sampled.is_some(), "above the limit: {listed:?}");
    let deepest = listed.shards.first().expect("a shard");
    assert_eq!(deepest.shard, shard(0), "{listed:?}");
    assert_eq!(
        (deepest.pending, deepest.pending_estimated),
        (1_500, false),
        "{deepest:?}"
    );
}
