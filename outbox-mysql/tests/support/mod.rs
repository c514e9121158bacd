//! What the tests of MariaDB's batched statements share: shard keys, a pool of one
//! connection, and the index entries or rows that connection reads.

#![allow(dead_code, reason = "each test file uses a part")]

use outbox_core::{ScopeId, ShardKey};
use outbox_testkit::mysql::MySqlTestDatabase;
use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;

/// Shard `identifier` of scope 1, with no destination.
pub(crate) fn shard(identifier: i64) -> ShardKey {
    ShardKey::local(ScopeId(1), identifier)
}

/// A pool of one connection on `database`: the server's session counters are then those of
/// every statement the pool runs.
pub(crate) async fn one_connection(database: &MySqlTestDatabase) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&database.url())
        .await
        .expect("connect")
}

/// What `work` returns, and the index entries the one connection of `pool` (see
/// [`one_connection`]) read while it ran, by the server's handler counters (which count the
/// entries of a statement's temporary tables too).
pub(crate) async fn index_reads<T>(pool: &MySqlPool, work: impl Future<Output = T>) -> (i64, T) {
    counted(
        pool,
        "'Handler_read_key', 'Handler_read_next', 'Handler_read_rnd_next', 'Handler_read_first'",
        work,
    )
    .await
}

/// What `work` returns, and the rows of tables (not of temporary tables) the one connection
/// of `pool` (see [`one_connection`]) read while it ran, by the server's `Rows_read`.
pub(crate) async fn rows_read<T>(pool: &MySqlPool, work: impl Future<Output = T>) -> (i64, T) {
    counted(pool, "'Rows_read'", work).await
}

/// What `work` returns, and the sum of the session's status `counters` (a list of quoted
/// names) over its run.
async fn counted<T>(pool: &MySqlPool, counters: &str, work: impl Future<Output = T>) -> (i64, T) {
    sqlx::query("FLUSH STATUS")
        .execute(pool)
        .await
        .expect("reset the counters");
    let done = work.await;
    let counters: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SHOW SESSION STATUS WHERE Variable_name IN ({counters})"
    )))
    .fetch_all(pool)
    .await
    .expect("the counters");
    let reads = counters
        .iter()
        .map(|(_, value)| value.parse::<i64>().expect("a count"))
        .sum();
    (reads, done)
}

/// Runs `statement` (rows written for a test) on `pool`, then refreshes the outbox tables'
/// statistics, which MariaDB's plans follow.
pub(crate) async fn seed(pool: &MySqlPool, statement: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|error| panic!("{statement}: {error}"));
    sqlx::raw_sql("ANALYZE TABLE outbox_messages, outbox_shards")
        .execute(pool)
        .await
        .expect("analyze");
}
