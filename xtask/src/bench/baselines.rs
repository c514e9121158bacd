//! The drain scenarios' baselines: plain SQL that deletes the same rows and returns each one
//! to the client (`RETURNING id, payload`, as a relay must read what it delivers), each over
//! 1, 2 and 4 connections. The same-guarantee loop ([`Strategy::Leased`]: lease, commit,
//! deliver outside the transaction, delete by id) is the bar the relay is measured against
//! (issue 32); the deletes that return what they delete in the claiming statement are the
//! physical ceiling, reported beside it (issue 15).

use std::time::Instant;

use sqlx::{PgPool, Row as _};

use super::setup::failed;

/// Rows one statement deletes at most.
const BATCH: i64 = 1_000;

/// A way of deleting a backlog with plain SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Strategy {
    /// Each connection loops on the oldest 1,000 unlocked rows:
    /// `DELETE … WHERE id IN (SELECT … LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING …`.
    SkipLocked,
    /// The id range split between the connections, each deleting 1,000 ids at a time.
    Keyset,
    /// The shards split between the connections, each deleting whole shards, as many at a
    /// time as hold about 1,000 rows.
    PerShard,
    /// The same guarantee as the relay's: each connection leases up to `batch` unleased rows
    /// across shards in one committed statement (`FOR UPDATE SKIP LOCKED`, a lease time on
    /// each row, its id and payload returned), delivers them outside that transaction (reads
    /// them), and deletes them by id in a second one. A worker that dies mid-batch leaves its
    /// rows leased until the lease lapses, as the relay's shards are.
    Leased {
        /// Rows leased at once.
        batch: i64,
    },
}

impl Strategy {
    /// The deletes that return what they delete: the physical ceiling.
    pub(super) const CEILINGS: [Self; 3] = [Self::SkipLocked, Self::Keyset, Self::PerShard];
    /// The same-guarantee loops: the bar.
    pub(super) const SAME_GUARANTEE: [Self; 2] =
        [Self::Leased { batch: 100 }, Self::Leased { batch: 1_000 }];

    pub(super) fn describe(self) -> String {
        match self {
            Self::SkipLocked => "SKIP LOCKED loop".to_owned(),
            Self::Keyset => "keyset ranges of ids".to_owned(),
            Self::PerShard => "per-shard batches".to_owned(),
            Self::Leased { batch } => {
                format!("same-guarantee loop (lease {batch}, commit, deliver, delete by id)")
            }
        }
    }

    /// Whether it gives the relay's guarantee (delivery outside the claiming transaction).
    pub(super) fn same_guarantee(self) -> bool {
        matches!(self, Self::Leased { .. })
    }
}

/// Deletes every row of the outbox with `strategy` over `connections` connections, reading
/// each row's id and payload; returns `(rows, rows/s)`. `shards` and `rows_per_shard` size the
/// per-shard batches.
pub(super) async fn drain(
    pool: &PgPool,
    strategy: Strategy,
    connections: u64,
    shards: u64,
    rows_per_shard: u64,
) -> Result<(u64, f64), String> {
    let bounds =
        sqlx::query("SELECT coalesce(min(id), 0), coalesce(max(id), -1) FROM outbox_messages")
            .fetch_one(pool)
            .await
            .map_err(failed("reading the id range"))?;
    let (low, high): (i64, i64) = (bounds.get(0), bounds.get(1));
    if let Strategy::Leased { .. } = strategy {
        sqlx::query(
            "ALTER TABLE outbox_messages ADD COLUMN IF NOT EXISTS leased_until timestamptz",
        )
        .execute(pool)
        .await
        .map_err(failed("adding the baseline's lease column"))?;
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..connections {
        let pool = pool.clone();
        tasks.spawn(async move {
            match strategy {
                Strategy::SkipLocked => skip_locked(&pool).await,
                Strategy::Keyset => {
                    let span = (high - low + connections as i64) / connections as i64;
                    let from = low + span * worker as i64;
                    keyset(&pool, from, (from + span).min(high + 1)).await
                }
                Strategy::PerShard => {
                    let step = (BATCH as u64 / rows_per_shard.max(1)).max(1);
                    per_shard(&pool, worker, connections, shards, step).await
                }
                Strategy::Leased { batch } => leased(&pool, batch).await,
            }
        });
    }
    let mut rows = 0;
    while let Some(done) = tasks.join_next().await {
        rows += done.map_err(failed("a baseline worker"))??;
    }
    Ok((rows, rows as f64 / started.elapsed().as_secs_f64()))
}

/// Reads what a statement returned, as a relay would: every id and payload.
pub(super) fn read<R: sqlx::Row>(returned: &[R]) -> Result<u64, String>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let mut bytes = 0usize;
    for row in returned {
        let _: i64 = row.try_get(0).map_err(failed("an id"))?;
        let payload: String = row.try_get(1).map_err(failed("a payload"))?;
        bytes += payload.len();
    }
    std::hint::black_box(bytes);
    Ok(returned.len() as u64)
}

async fn skip_locked(pool: &PgPool) -> Result<u64, String> {
    let mut rows = 0;
    loop {
        let returned = sqlx::query(
            "DELETE FROM outbox_messages WHERE id IN (SELECT id FROM outbox_messages \
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id, payload::text",
        )
        .bind(BATCH)
        .fetch_all(pool)
        .await
        .map_err(failed("the SKIP LOCKED loop"))?;
        if returned.is_empty() {
            return Ok(rows);
        }
        rows += read(&returned)?;
    }
}

async fn keyset(pool: &PgPool, from: i64, to: i64) -> Result<u64, String> {
    let mut rows = 0;
    let mut low = from;
    while low < to {
        let high = (low + BATCH).min(to);
        let returned = sqlx::query(
            "DELETE FROM outbox_messages WHERE id >= $1 AND id < $2 RETURNING id, payload::text",
        )
        .bind(low)
        .bind(high)
        .fetch_all(pool)
        .await
        .map_err(failed("the keyset deletes"))?;
        rows += read(&returned)?;
        low = high;
    }
    Ok(rows)
}

async fn per_shard(
    pool: &PgPool,
    worker: u64,
    connections: u64,
    shards: u64,
    step: u64,
) -> Result<u64, String> {
    let mut rows = 0;
    // Worker k takes the shard ranges k, k + n, k + 2n, … (ranges of `step` shards).
    let mut first = worker * step;
    while first < shards {
        let returned = sqlx::query(
            "DELETE FROM outbox_messages WHERE shard_scope = 1 AND shard_identifier >= $1 \
             AND shard_identifier < $2 AND destination = '' RETURNING id, payload::text",
        )
        .bind(first as i64)
        .bind((first + step) as i64)
        .fetch_all(pool)
        .await
        .map_err(failed("the per-shard deletes"))?;
        rows += read(&returned)?;
        first += step * connections;
    }
    Ok(rows)
}

/// The same-guarantee loop of one connection. It goes on from the highest id it leased (the
/// rows below were leased by it or by another connection), so that it never walks the index
/// entries of the rows deleted before: the best plain SQL does. (A worker that dies leaves
/// rows behind the others' cursors; a real loop would sweep from the start now and then. No
/// worker dies here.)
async fn leased(pool: &PgPool, batch: i64) -> Result<u64, String> {
    let mut rows = 0;
    let mut after = i64::MIN;
    loop {
        let leased = sqlx::query(
            "UPDATE outbox_messages SET leased_until = now() + interval '30 seconds' \
             WHERE id IN (SELECT id FROM outbox_messages \
                 WHERE id > $2 AND (leased_until IS NULL OR leased_until < now()) \
                 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
             RETURNING id, payload::text",
        )
        .bind(batch)
        .bind(after)
        .fetch_all(pool)
        .await
        .map_err(failed("the same-guarantee loop's lease"))?;
        if leased.is_empty() {
            return Ok(rows);
        }
        rows += read(&leased)?;
        let ids: Vec<i64> = leased.iter().map(|row| row.get(0)).collect();
        after = ids.iter().copied().max().unwrap_or(after);
        sqlx::query("DELETE FROM outbox_messages WHERE id = ANY($1)")
            .bind(&ids)
            .execute(pool)
            .await
            .map_err(failed("the same-guarantee loop's delete"))?;
    }
}
