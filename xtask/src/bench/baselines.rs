//! The drain scenarios' baselines: plain SQL that deletes the same rows and returns each one
//! to the client (`RETURNING id, payload`, as a relay must read what it delivers), each over
//! 1, 2 and 4 connections. The ordered loop ([`Strategy::ShardLeased`]: lease shards, read
//! their rows, commit, deliver outside the transaction, delete rows and leases by token) keeps
//! the relay's guarantee and its order per shard: it is the bar the relay is measured against
//! (issue 58). The same-guarantee loop ([`Strategy::Leased`]: the same steps on leased rows)
//! keeps no order per shard; it is reported beside it, and is the bar where no ordered loop
//! runs (issue 32). The deletes that return what they delete in the claiming statement are
//! the physical ceiling, reported too (issue 15).

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
    /// The relay's guarantee with its order per shard, in plain SQL: each connection leases
    /// the shards of the next `batch` rows (one lease row per shard, inserted in key order; a
    /// shard another connection holds is skipped), reads the oldest `per_shard` rows of each
    /// shard it got, all in one committed statement; delivers them outside that transaction;
    /// then deletes the rows and its leases in a second one, fenced by its lease token. No two
    /// connections ever hold one shard, so each shard's rows are delivered in order by one of
    /// them (the row loop above delivers a shard's rows from several connections at once).
    ShardLeased {
        /// Rows whose shards are leased at once.
        batch: i64,
        /// Rows read from each leased shard at most.
        per_shard: i64,
    },
}

impl Strategy {
    /// The deletes that return what they delete: the physical ceiling.
    pub(super) const CEILINGS: [Self; 3] = [Self::SkipLocked, Self::Keyset, Self::PerShard];
    /// The same-guarantee loops that keep no order per shard: the bar where no ordered loop
    /// runs.
    pub(super) const SAME_GUARANTEE: [Self; 2] =
        [Self::Leased { batch: 100 }, Self::Leased { batch: 1_000 }];
    /// The same-guarantee loops that keep order per shard, as the relay does, shaped for small
    /// shards: each lease reads its whole shard.
    pub(super) const ORDERED: [Self; 2] = [
        Self::ShardLeased {
            batch: 100,
            per_shard: BATCH,
        },
        Self::ShardLeased {
            batch: 1_000,
            per_shard: BATCH,
        },
    ];
    /// The ordered loop shaped for shards of many rows: the shards of 10 rows leased at once,
    /// 100 rows read from each, about [`BATCH`] rows a round. (Tried on scenario 2's shape
    /// and slower by 7 to 10 times: the shards of 100 rows, 10 or 100 rows read from each.
    /// A few rows of each shard make every later page walk the index entries of the rows read
    /// ahead of it; 10,000 rows a round make each round's statements slow.)
    pub(super) const ORDERED_DENSE: [Self; 1] = [Self::ShardLeased {
        batch: 10,
        per_shard: 100,
    }];

    pub(super) fn describe(self) -> String {
        match self {
            Self::SkipLocked => "SKIP LOCKED loop".to_owned(),
            Self::Keyset => "keyset ranges of ids".to_owned(),
            Self::PerShard => "per-shard batches".to_owned(),
            Self::Leased { batch } => {
                format!("same-guarantee loop (lease {batch}, commit, deliver, delete by id)")
            }
            Self::ShardLeased { batch, per_shard } if per_shard >= BATCH => format!(
                "ordered loop (lease the shards of {batch} rows, read them, commit, deliver, \
                 delete rows and leases by token)"
            ),
            Self::ShardLeased { batch, per_shard } => format!(
                "ordered loop (lease the shards of {batch} rows, read {per_shard} rows of each, \
                 commit, deliver, delete rows and leases by token)"
            ),
        }
    }

    /// Whether it gives the relay's guarantee (delivery outside the claiming transaction).
    pub(super) fn same_guarantee(self) -> bool {
        matches!(self, Self::Leased { .. })
    }

    /// Whether it also keeps the relay's order per shard (one holder per shard at a time).
    pub(super) fn ordered(self) -> bool {
        matches!(self, Self::ShardLeased { .. })
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
    if let Strategy::ShardLeased { .. } = strategy {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS bench_shard_leases (shard_scope smallint NOT NULL, \
             shard_identifier bigint NOT NULL, destination text NOT NULL, token bigint NOT NULL, \
             expires_at timestamptz NOT NULL, \
             PRIMARY KEY (shard_scope, shard_identifier, destination))",
        )
        .execute(pool)
        .await
        .map_err(failed("creating the ordered loop's lease table"))?;
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
                Strategy::ShardLeased { batch, per_shard } => {
                    shard_leased(&pool, worker, batch, per_shard).await
                }
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

/// The ordered loop of one connection ([`Strategy::ShardLeased`]). Like the row loop, it goes
/// on from the highest id it looked at: the rows below were read by it or by the connection
/// that held their shard. A shard it read `per_shard` rows of may hold more: it goes on from
/// the last of those instead where that is lower, so that it meets the shard's rows left
/// again (they all come after the rows it read). The statement reads in a snapshot taken
/// before its leases: a shard another connection drained and released meanwhile still shows
/// the rows that connection deleted, their `xmax` set; those are left out (the relay reads
/// such a shard again). A deleting transaction that rolled back would leave its rows out too:
/// none does here.
async fn shard_leased(
    pool: &PgPool,
    worker: u64,
    batch: i64,
    per_shard: i64,
) -> Result<u64, String> {
    type Shard = (i16, i64, String);
    let mut rows = 0;
    let mut after = i64::MIN;
    for round in 1_i64.. {
        let token = ((worker as i64) << 40) | round;
        let leased = sqlx::query(
            "WITH page AS ( \
                 SELECT id, shard_scope, shard_identifier, destination FROM outbox_messages \
                 WHERE id > $2 ORDER BY id LIMIT $1), \
              held AS ( \
                 INSERT INTO bench_shard_leases \
                     (shard_scope, shard_identifier, destination, token, expires_at) \
                 SELECT DISTINCT shard_scope, shard_identifier, destination, $3::bigint, \
                     now() + interval '30 seconds' \
                 FROM page ORDER BY 1, 2, 3 \
                 ON CONFLICT DO NOTHING \
                 RETURNING shard_scope, shard_identifier, destination) \
             SELECT m.id, m.payload, (SELECT max(id) FROM page), \
                 h.shard_scope, h.shard_identifier, h.destination \
             FROM (SELECT 1) one LEFT JOIN ( \
                 held h LEFT JOIN LATERAL ( \
                     SELECT x.id, x.payload::text AS payload FROM outbox_messages x \
                     WHERE x.shard_scope = h.shard_scope \
                         AND x.shard_identifier = h.shard_identifier \
                         AND x.destination = h.destination AND x.xmax::text = '0' \
                     ORDER BY x.id LIMIT $4) m ON true) ON true",
        )
        .bind(batch)
        .bind(after)
        .bind(token)
        .bind(per_shard)
        .fetch_all(pool)
        .await
        .map_err(failed("the ordered loop's lease"))?;
        let Some(high) = leased
            .first()
            .map(|row| row.try_get::<Option<i64>, _>(2))
            .transpose()
            .map_err(failed("the page's highest id"))?
            .flatten()
        else {
            return Ok(rows);
        };
        after = high;
        // Every shard leased, with or without rows left to deliver, and the rows read of
        // each: each lease is released.
        let mut shards: std::collections::BTreeMap<Shard, (i64, i64)> = Default::default();
        let mut delivered = Vec::with_capacity(leased.len());
        for row in leased {
            let Some(scope) = row.get::<Option<i16>, _>(3) else {
                continue;
            };
            let read = shards
                .entry((scope, row.get(4), row.get(5)))
                .or_insert((0, i64::MIN));
            if let Some(id) = row.get::<Option<i64>, _>(0) {
                *read = (read.0 + 1, read.1.max(id));
                delivered.push(row);
            }
        }
        if shards.is_empty() {
            continue;
        }
        rows += read(&delivered)?;
        for (count, last) in shards.values() {
            if *count >= per_shard {
                after = after.min(*last);
            }
        }
        let ids: Vec<i64> = delivered.iter().map(|row| row.get(0)).collect();
        let scopes: Vec<i16> = shards.keys().map(|shard| shard.0).collect();
        let identifiers: Vec<i64> = shards.keys().map(|shard| shard.1).collect();
        let destinations: Vec<String> = shards.into_keys().map(|shard| shard.2).collect();
        sqlx::query(
            "WITH released AS ( \
                 DELETE FROM bench_shard_leases l \
                 USING unnest($2::smallint[], $3::bigint[], $4::text[]) \
                     AS k(shard_scope, shard_identifier, destination) \
                 WHERE l.shard_scope = k.shard_scope AND l.shard_identifier = k.shard_identifier \
                     AND l.destination = k.destination AND l.token = $1 \
                 RETURNING l.shard_scope, l.shard_identifier, l.destination) \
             DELETE FROM outbox_messages m USING released r \
             WHERE m.id = ANY($5) AND m.shard_scope = r.shard_scope \
                 AND m.shard_identifier = r.shard_identifier AND m.destination = r.destination",
        )
        .bind(token)
        .bind(&scopes)
        .bind(&identifiers)
        .bind(&destinations)
        .bind(&ids)
        .execute(pool)
        .await
        .map_err(failed("the ordered loop's delete"))?;
    }
    Ok(rows)
}
