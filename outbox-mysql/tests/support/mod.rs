//! What the tests of MariaDB's batched statements share: shard keys, a pool of one
//! connection, and the index entries that connection reads.

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
/// [`one_connection`]) read while it ran, by the server's handler counters.
pub(crate) async fn index_reads<T>(pool: &MySqlPool, work: impl Future<Output = T>) -> (i64, T) {
    sqlx::query("FLUSH STATUS")
        .execute(pool)
        .await
        .expect("reset the counters");
    let done = work.await;
    let counters: Vec<(String, String)> = sqlx::query_as(
        "SHOW SESSION STATUS WHERE Variable_name IN \
         ('Handler_read_key', 'Handler_read_next', 'Handler_read_rnd_next', 'Handler_read_first')",
    )
    .fetch_all(pool)
    .await
    .expect("the counters");
    let reads = counters
        .iter()
        .map(|(_, value)| value.parse::<i64>().expect("a count"))
        .sum();
    (reads, done)
}
