//! What a discovery page reads on MariaDB, counted by the server's handler counters: the shards
//! after its cursor, never the index before it, and one descent per shard where shards hold
//! many rows; a whole sweep over busy shards among sparse ones reads each entry at most once.

use outbox_core::ShardKey;
use outbox_core::store::Store;
use outbox_mysql::{MySqlDialect, MySqlStore};
use outbox_sqlx::Dialect;
use outbox_testkit::mysql::MySqlTestDatabase;
use sqlx::MySqlPool;

mod support;
use support::{index_reads, one_connection, seed, shard};

/// Index entries the one connection of `pool` read during a discovery of `limit` shards after
/// `cursor`, and the shards found.
async fn discovery_reads(pool: &MySqlPool, cursor: i64, limit: i32) -> (i64, Vec<ShardKey>) {
    let (reads, found) = index_reads(
        pool,
        MySqlDialect::default().discover(pool, 1, &shard(cursor), limit),
    )
    .await;
    let found = found.expect("discover");
    (reads, found.into_iter().map(|(shard, _)| shard).collect())
}

/// A pool of one connection on a migrated database holding `rows_per_shard` messages in each
/// of shards 0 to `shards - 1`.
async fn seeded(database: &MySqlTestDatabase, shards: i64, rows_per_shard: i64) -> MySqlPool {
    let pool = one_connection(database).await;
    let last = shards * rows_per_shard - 1;
    seed(
        &pool,
        &format!(
            "INSERT INTO outbox_messages (shard_scope, shard_identifier, category, \
             object_identifier, payload) SELECT 1, seq % {shards}, 1, seq, '{{}}' \
             FROM seq_0_to_{last}"
        ),
    )
    .await;
    pool
}

#[tokio::test]
async fn a_page_of_sparse_shards_reads_only_the_shards_after_its_cursor() {
    let database = MySqlTestDatabase::migrated().await;
    let pool = seeded(&database, 20_000, 1).await;
    let (reads, found) = discovery_reads(&pool, 15_000, 100).await;
    let expected: Vec<ShardKey> = (15_001..=15_100).map(shard).collect();
    assert_eq!(found, expected);
    assert!(
        reads < 1_000,
        "{reads} index entries read for 100 shards after 15,000 others"
    );
}

#[tokio::test]
async fn a_page_of_dense_shards_reads_one_entry_per_shard() {
    let database = MySqlTestDatabase::migrated().await;
    let pool = seeded(&database, 200, 500).await;
    let (reads, found) = discovery_reads(&pool, 99, 50).await;
    let expected: Vec<ShardKey> = (100..150).map(shard).collect();
    assert_eq!(found, expected);
    assert!(
        reads < 1_000,
        "{reads} index entries read for 50 shards of 500 rows each"
    );
}

/// Busy shards among many sparse ones (200 of 500 rows, then 20,000 of one: 6 rows a shard on
/// average): MariaDB reads such a table's shards row by row, not by a descent each (see
/// `DISCOVER`), so one page may read the busy shards' rows whole; a whole sweep still reads
/// each index entry at most once, never again at each page, and finds every shard in order.
#[tokio::test]
async fn a_sweep_over_busy_and_sparse_shards_reads_the_table_at_most_once() {
    let database = MySqlTestDatabase::migrated().await;
    let pool = seeded(&database, 200, 500).await;
    seed(
        &pool,
        "INSERT INTO outbox_messages (shard_scope, shard_identifier, category, \
         object_identifier, payload) SELECT 1, 200 + seq, 1, seq, '{}' FROM seq_0_to_19999",
    )
    .await;
    let store = MySqlStore::new(pool.clone());
    let (reads, found) = index_reads(&pool, async {
        let mut found = Vec::new();
        let mut after = None;
        loop {
            let page = store.discover(after.as_ref(), 512).await.expect("discover");
            found.extend(page.due);
            match page.next {
                Some(next) => after = Some(next),
                None => return found,
            }
        }
    })
    .await;
    let expected: Vec<ShardKey> = (0..20_200).map(shard).collect();
    assert!(found == expected, "{} shards found", found.len());
    // Each message's entry once, and for each shard its state row's and its pauses' lookups.
    let rows = 200 * 500 + 20_000;
    assert!(
        reads < rows + 3 * 20_200,
        "{reads} index entries read in a sweep of {rows} messages in 20,200 shards"
    );
}
