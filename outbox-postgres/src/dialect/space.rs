//! Giving back the space a held vacuum horizon leaves behind.
//!
//! While a horizon is held (a long transaction, `pg_dump`, a replica's feedback, a slot),
//! every row deleted since it began stays, and once it ends vacuum removes them but gives the
//! space back to the table, not to the disk: the outbox's tables keep the size the hold grew
//! them to, and their indexes too. Yet what they hold alive is little: the messages not yet
//! delivered, a lease per shard being drained, a state per failing shard.
//!
//! So a relay, at most every [`EVERY`](outbox_sqlx::space::EVERY) (from the first page of a
//! discovery sweep, in a task of its own), rewrites a table of the outbox with `VACUUM FULL`
//! when all of these hold:
//!
//! - it is at least [`BLOATED`] (table and indexes) and more than [`SPARSE`] times the size of
//!   its live rows (counted by the statistics, at most 256 bytes a row);
//! - the horizon is not held ([`HELD_BEHIND`](super::leases::HELD_BEHIND)): the rows deleted
//!   before the last thousand transactions can be dropped, and the rewrite copies only the
//!   live ones. It does not wait for vacuum to remove them first: after a long hold, vacuum
//!   (throttled, and beginning again from the start of each table once the pass it began
//!   during the hold is over) took minutes, and the rewrite drops them as it copies;
//! - `outbox_messages` is at most [`LARGEST_MESSAGES`] without its indexes: writers wait
//!   while it is rewritten, and the rewrite reads the whole table (its indexes are built anew
//!   from the live rows, not read);
//! - no transaction that began more than a second ago holds a lock on it (`pg_dump`, a report
//!   that read the outbox): the rewrite never queues behind them, and tries again later. An
//!   autovacuum worker's lock is not such a reader's: the pass first asks for a lock that
//!   writers do not wait behind (`SHARE UPDATE EXCLUSIVE`, for at most [`VACUUM_TIMEOUT`]),
//!   which makes the server cancel that worker after `deadlock_timeout`;
//! - its lock is granted within [`LOCK_TIMEOUT`]: the statements that queue behind the
//!   request wait at most that long if it is not;
//! - this store has not rewritten it within
//!   [`REWRITE_EVERY`](outbox_sqlx::space::REWRITE_EVERY): a table that a high rate and
//!   vacuums far apart make this large in its steady state is not rewritten again and again.
//!
//! The rewrite holds its lock for as long as it reads the table: tens of milliseconds for tens
//! of megabytes, once after a hold; 0.26 to 0.36 s for the 256 MiB that a 15-minute hold at 2,000
//! messages a second leaves (measured on a two-core machine, the table in memory). A plain
//! `VACUUM` of the rewritten table follows: it costs next to nothing then, and it sets the
//! statistics' count of dead rows, which a rewrite leaves as it was, so that the relay stops
//! treating the tables as dead-heavy ([`DEAD_HEAVY`]) at once.
//!
//! The same pass tells the store whether the tables hold many rows deleted but not yet
//! removed ([`DEAD_HEAVY`] or more in `outbox_messages` or `outbox_leases`): while they do,
//! the batch claim and the batch acknowledgement run under the planner's [`GUARD`]. Their
//! statements seek each shard's newest lease row and its head through the indexes, in index
//! order, and stop at the first rows they need; the planner, which estimates a shard's key at a
//! row or two, may instead gather every index entry of the key (a bitmap scan) or read the
//! whole table, and under a held horizon every row the shard's earlier drains deleted is such
//! an entry. Such plans made claims of a few hundred shards take 3 to 5 s in the 15-minute
//! hold. The guard costs two round trips a batch, so it is used only then.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, Postgres};

use outbox_sqlx::space::{Passes, Rewrites};

use super::lock_not_available;

/// A table this many times larger than its live rows, and at least [`BLOATED`], is rewritten.
pub(crate) const SPARSE: i64 = 16;

/// The least size (table and indexes) worth a rewrite.
pub(crate) const BLOATED: i64 = 8 << 20;

/// The largest `outbox_messages` (without its indexes, which the rewrite builds anew rather
/// than reads) that is rewritten: its writers wait for the rewrite, which reads it whole.
pub(crate) const LARGEST_MESSAGES: i64 = 384 << 20;

/// Dead rows in `outbox_messages` or `outbox_leases` (beyond four times their live rows) from
/// which the batch statements run under the [`GUARD`].
pub(crate) const DEAD_HEAVY: i64 = 50_000;

/// How the batch statements' transaction begins while the tables are dead-heavy: the planner
/// may not gather an index's entries into a bitmap, nor read a table whole, nor compile the
/// plan (the estimates of a dead-heavy table can pass `jit_above_cost`, and compiling costs
/// tens of milliseconds).
///
/// Every read of these statements has an index condition (each shard's key, each message's
/// id looked up as one array), so with sequential scans off the planner seeks. With them on,
/// statistics gathered under the hold (an index of tens of thousands of pages counted at a few
/// hundred rows) once priced each head's seek above reading `outbox_messages` whole: a claim of
/// 508 shards read the table once per shard (9.6 million buffers, 49 s) in the 15-minute hold.
/// (When the acknowledgement still joined its targets to the table, sequential scans off made
/// it read the shard index whole instead; it looks its ids up as an array now.)
pub(crate) const GUARD: &str = "BEGIN; SET LOCAL enable_bitmapscan = off; \
    SET LOCAL enable_seqscan = off; SET LOCAL jit = off";

/// Whether `outbox_messages` or `outbox_leases` holds more than `$1` dead rows beyond four
/// times its live ones (statistics).
const DEAD_ROWS: &str = "\
    SELECT coalesce(bool_or(n_dead_tup > $1 + 4 * n_live_tup), false) FROM pg_stat_user_tables \
    WHERE relid IN ('outbox_messages'::regclass, 'outbox_leases'::regclass)";

/// How long a rewrite waits for its lock.
const LOCK_TIMEOUT: &str = "50ms";

/// How the transaction begins that waits for the lock that makes an autovacuum worker on a
/// table give way, and how long it waits: the server cancels the worker after
/// `deadlock_timeout` (1 s by default); an anti-wraparound vacuum is never cancelled, and the
/// pass tries again later.
const VACUUM_TIMEOUT: &str = "BEGIN; SET LOCAL lock_timeout = '3s'";

/// The tables of the outbox sparse enough to be rewritten ([module documentation](self)),
/// each with whether a transaction older than a second (other than this session's and an
/// autovacuum worker's) holds a lock on it, and whether an autovacuum worker does. `$1`: the
/// least size, in bytes; `$2`: how many times its live rows' size; `$3`: the largest
/// `outbox_messages` without its indexes.
const SPARSE_TABLES: &str = "\
    SELECT c.oid::regclass::text, \
        coalesce(bool_or(a.backend_type <> 'autovacuum worker' \
            AND a.xact_start < clock_timestamp() - interval '1 second'), false), \
        coalesce(bool_or(a.backend_type = 'autovacuum worker'), false) \
    FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid \
        LEFT JOIN pg_locks l ON l.locktype = 'relation' AND l.relation = c.oid AND l.granted \
            AND l.pid <> pg_backend_pid() \
        LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
    WHERE c.oid IN ('outbox_messages'::regclass, 'outbox_leases'::regclass, \
            'outbox_shards'::regclass) \
        AND pg_total_relation_size(c.oid) >= $1 \
        AND pg_total_relation_size(c.oid) > $2 * (s.n_live_tup + 100) * 256 \
        AND (c.oid <> 'outbox_messages'::regclass OR pg_table_size(c.oid) <= $3) \
    GROUP BY c.oid \
    ORDER BY 1";

/// The giving back of one store.
#[derive(Debug, Default)]
pub(crate) struct Space {
    passes: Arc<Passes>,
    /// The tables are dead-heavy: the batch statements run under the [`GUARD`].
    guarded: AtomicBool,
}

impl Space {
    /// Starts a pass in a task of its own, unless one ran within
    /// [`EVERY`](outbox_sqlx::space::EVERY) or is running.
    pub(crate) fn now_and_then(self: &Arc<Self>, pool: &PgPool) {
        let (this, pool) = (Arc::clone(self), pool.clone());
        self.passes.now_and_then(
            "the relay's role needs to own outbox_messages, outbox_leases and outbox_shards to \
             rewrite them",
            async move |recent| {
                if let Ok(heavy) = dead_heavy(&pool, DEAD_HEAVY).await {
                    this.guard(heavy);
                }
                rewrite(&pool, BLOATED, SPARSE, LARGEST_MESSAGES, &recent).await
            },
        );
    }

    /// Whether the batch statements run under the [`GUARD`].
    pub(crate) fn guarded(&self) -> bool {
        self.guarded.load(Ordering::Relaxed)
    }

    /// Runs the batch statements under the [`GUARD`] from now on, or no longer; says so when
    /// it changes.
    pub(crate) fn guard(&self, heavy: bool) {
        if self.guarded.swap(heavy, Ordering::Relaxed) != heavy {
            let (tables, statements) = if heavy {
                ("hold", "run under")
            } else {
                ("no longer hold", "no longer run under")
            };
            tracing::info!(
                guarded = heavy,
                "the outbox's tables {tables} many deleted rows not yet removed (a held vacuum \
                 horizon): the relay's batch statements {statements} the planner's guard"
            );
        }
    }
}

/// Whether `outbox_messages` or `outbox_leases` holds more than `dead` rows deleted and not
/// yet removed, beyond four times its live rows.
pub(crate) async fn dead_heavy(pool: &PgPool, dead: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(DEAD_ROWS)
        .bind(dead)
        .fetch_one(pool)
        .await
}

/// The rows of `query` on `conn`: in a transaction of its own under the [`GUARD`] if
/// `guarded` (and `conn` is in no transaction), else as it is.
pub(crate) async fn fetch_all(
    conn: &mut PgConnection,
    query: sqlx::query::Query<'_, Postgres, PgArguments>,
    guarded: bool,
) -> Result<Vec<PgRow>, sqlx::Error> {
    if !guarded || conn.is_in_transaction() {
        return query.fetch_all(conn).await;
    }
    let mut tx = conn.begin_with(GUARD).await?;
    let rows = query.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(rows)
}

/// Rewrites the tables of the outbox that are sparse ([module documentation](self)): at least
/// `large` bytes, more than `sparse` times their live rows, and `outbox_messages` at most
/// `largest_messages` without its indexes; not those in `recent`, and none while the horizon
/// is held.
pub(crate) async fn rewrite(
    pool: &PgPool,
    large: i64,
    sparse: i64,
    largest_messages: i64,
    recent: &[String],
) -> Result<Rewrites, sqlx::Error> {
    if super::leases::horizon_held(pool).await? {
        return Ok(Rewrites::default());
    }
    let candidates: Vec<(String, bool, bool)> = sqlx::query_as(SPARSE_TABLES)
        .bind(large)
        .bind(sparse)
        .bind(largest_messages)
        .fetch_all(pool)
        .await?;
    let mut rewrites = Rewrites::default();
    for (relation, held, vacuumed) in candidates {
        if recent.contains(&relation) {
            continue;
        }
        if held {
            rewrites.refused.push(relation);
            continue;
        }
        let mut conn = pool.acquire().await?;
        if vacuumed {
            // Waiting for this lock, the session has the worker cancelled; writers do not
            // queue behind it. Taken and let go at once: the rewrite follows.
            let mut tx = conn.begin_with(VACUUM_TIMEOUT).await?;
            let taken = sqlx::query(AssertSqlSafe(format!(
                "LOCK TABLE {relation} IN SHARE UPDATE EXCLUSIVE MODE"
            )))
            .execute(&mut *tx)
            .await;
            match taken {
                Ok(_) => tx.commit().await?,
                Err(error) if lock_not_available(&error) => {
                    rewrites.refused.push(relation);
                    continue;
                }
                Err(error) => return Err(error),
            }
        }
        // `VACUUM` runs outside a transaction: the timeout is the connection's while it runs.
        // The relation's name comes from the catalog (`regclass::text`, quoted as needed).
        sqlx::query(AssertSqlSafe(format!(
            "SET lock_timeout = '{LOCK_TIMEOUT}'"
        )))
        .execute(&mut *conn)
        .await?;
        let done = sqlx::query(AssertSqlSafe(format!("VACUUM FULL {relation}")))
            .execute(&mut *conn)
            .await;
        if sqlx::query("RESET lock_timeout")
            .execute(&mut *conn)
            .await
            .is_err()
        {
            // Not returned to the pool with a timeout of its own.
            drop(conn.detach());
        }
        match done {
            Ok(_) => {
                // The statistics' dead rows, which the rewrite leaves as they were.
                sqlx::query(AssertSqlSafe(format!("VACUUM {relation}")))
                    .execute(pool)
                    .await?;
                rewrites.rewritten.push(relation);
            }
            Err(error) if lock_not_available(&error) => rewrites.refused.push(relation),
            Err(error) => return Err(error),
        }
    }
    Ok(rewrites)
}

#[cfg(test)]
mod tests;
