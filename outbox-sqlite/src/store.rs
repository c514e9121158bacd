use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::store::{
    ClaimOptions, DiscoveryPage, HandlerMode, Lease, MIGRATIONS_TABLE, NoWakeups, PendingMessage,
    ShardState, check_migrations,
};
use outbox_core::{CategoryId, Error, MessageId, ShardKey, Store};
use sqlx::{Row, SqlitePool};

use crate::error::database;
use crate::migrate::MIGRATIONS;
use crate::session::{EXTEND_LEASE, SqliteSession, fenced};

/// The outbox store on a SQLite database.
///
/// The relay's write transactions (claims, acknowledgements, releases) take turns on an
/// in-process lock shared by the store's clones before they ask SQLite for its write lock: the
/// relay's concurrent shards queue for it at once instead of sleeping in SQLite's busy handler.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    writes: WriteLock,
}

/// The in-process turn of the relay's write transactions.
pub(crate) type WriteLock = Arc<tokio::sync::Mutex<()>>;

impl SqliteStore {
    /// A store on `pool`. Apply the migrations first ([`crate::migrate`]).
    pub fn new(pool: SqlitePool) -> Self {
        Self {
            pool,
            writes: WriteLock::default(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// Milliseconds since the Unix epoch: how the SQLite tables store time.
pub(crate) fn now_ms() -> i64 {
    to_ms(SystemTime::now())
}

pub(crate) fn to_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    })
}

pub(crate) fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn from_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

// Skip-scan: one index seek per shard with pending rows, never a read of every row. Each step
// finds the first row of the next shard in key order: in the same shard identifier (a later
// destination), else a later shard identifier, else a later scope. (SQLite seeks a row value
// compared with bound parameters, but one compared with the columns of the recursive step only
// on its first column: that would read every row of the scope before the next shard.) Shards are due when nobody holds a live
// lease on them and they are not backing off, or have a message newer than their failure.
pub(crate) const DISCOVER: &str = "\
    WITH RECURSIVE keys(shard_scope, shard_identifier, destination, n) AS ( \
        SELECT * FROM ( \
            SELECT shard_scope, shard_identifier, destination, 1 FROM outbox_messages \
            WHERE (shard_scope, shard_identifier, destination) > (?1, ?2, ?3) \
            ORDER BY shard_scope, shard_identifier, destination LIMIT 1) \
        UNION ALL \
        SELECT m.shard_scope, m.shard_identifier, m.destination, k.n + 1 \
        FROM keys k JOIN outbox_messages m ON m.id = coalesce( \
            (SELECT x.id FROM outbox_messages x \
             WHERE x.shard_scope = k.shard_scope AND x.shard_identifier = k.shard_identifier \
                AND x.destination > k.destination \
             ORDER BY x.destination LIMIT 1), \
            (SELECT x.id FROM outbox_messages x \
             WHERE x.shard_scope = k.shard_scope AND x.shard_identifier > k.shard_identifier \
             ORDER BY x.shard_identifier, x.destination LIMIT 1), \
            (SELECT x.id FROM outbox_messages x \
             WHERE x.shard_scope > k.shard_scope \
             ORDER BY x.shard_scope, x.shard_identifier, x.destination LIMIT 1)) \
        WHERE k.n < ?4 \
    ) \
    SELECT k.shard_scope, k.shard_identifier, k.destination, \
        s.shard_scope IS NULL OR ( \
            (s.lease_expires_at IS NULL OR s.lease_expires_at <= ?5) \
            AND (s.retry_at IS NULL OR s.retry_at <= ?5 OR EXISTS ( \
                SELECT 1 FROM outbox_messages m \
                WHERE m.shard_scope = k.shard_scope AND m.shard_identifier = k.shard_identifier \
                    AND m.destination = k.destination AND m.id > s.watermark))) AS due \
    FROM keys k LEFT JOIN outbox_shards s \
        ON s.shard_scope = k.shard_scope AND s.shard_identifier = k.shard_identifier \
        AND s.destination = k.destination \
    ORDER BY k.n";

const NEXT_TOKEN: &str =
    "UPDATE outbox_sequences SET value = value + 1 WHERE name = 'lease_token' RETURNING value";

// Takes the lease if the shard is due and unleased, creating its state row if it has none. A
// lease that lapsed without a release (its holder died mid-drain, having perhaps delivered the
// head) counts as an attempt at the head.
pub(crate) const CLAIM: &str = "\
    INSERT INTO outbox_shards \
        (shard_scope, shard_identifier, destination, lease_owner, lease_token, lease_expires_at) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
    ON CONFLICT (shard_scope, shard_identifier, destination) DO UPDATE SET \
        lease_owner = excluded.lease_owner, \
        lease_token = excluded.lease_token, \
        lease_expires_at = excluded.lease_expires_at, \
        attempts = outbox_shards.attempts + (outbox_shards.lease_owner IS NOT NULL) \
    WHERE (outbox_shards.lease_expires_at IS NULL OR outbox_shards.lease_expires_at <= ?7) \
        AND (outbox_shards.retry_at IS NULL OR outbox_shards.retry_at <= ?7 OR EXISTS ( \
            SELECT 1 FROM outbox_messages m \
            WHERE m.shard_scope = ?1 AND m.shard_identifier = ?2 AND m.destination = ?3 \
                AND m.id > outbox_shards.watermark)) \
    RETURNING attempts";

/// A shard key as discovery reads it: a key that does not have the schema's form (written
/// around its checks) is a typed error, never a panic.
fn shard_key(row: &sqlx::sqlite::SqliteRow) -> Result<ShardKey, Error> {
    let undecodable = |error: sqlx::Error| Error::Undecodable {
        operation: "discovering due shards",
        message_id: None,
        detail: format!("a shard key is not (SMALLINT, integer, text): {error}"),
    };
    Ok(ShardKey::from_stored(
        row.try_get(0).map_err(undecodable)?,
        row.try_get(1).map_err(undecodable)?,
        row.try_get(2).map_err(undecodable)?,
    ))
}

// The holder of a lease that lapsed without a release, if the shard has one.
const LAPSED_OWNER: &str = "\
    SELECT lease_owner FROM outbox_shards \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 \
        AND lease_owner IS NOT NULL AND lease_expires_at <= ?4";

// A lease given up after an interrupted drain: it lapses now, so the shard is due at once and
// its next claim counts as a takeover (an attempt more at the head, whose messages the
// interrupted drain may have delivered).
const RELEASE_INTERRUPTED: &str = "\
    UPDATE outbox_shards SET lease_expires_at = ?5 \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4";

impl Store for SqliteStore {
    type Session = SqliteSession;
    type Wakeups = NoWakeups;

    async fn check_schema(&self) -> Result<(), Error> {
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        )
        .bind(MIGRATIONS_TABLE)
        .fetch_one(&self.pool)
        .await
        .map_err(database("checking the outbox schema"))?;
        if !exists {
            return Err(Error::MigrationMissing {
                detail: format!("table `{MIGRATIONS_TABLE}` does not exist"),
            });
        }
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _outbox_migrations WHERE success")
                .fetch_all(&self.pool)
                .await
                .map_err(database("checking the outbox schema"))?;
        check_migrations(&applied, MIGRATIONS)?;
        let rejected: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_rejected_messages")
            .fetch_one(&self.pool)
            .await
            .map_err(database("checking the outbox schema"))?;
        if rejected > 0 {
            tracing::warn!(
                rejected,
                "outbox rows that no relay can deliver were set aside by migration 2 in the \
                 table outbox_rejected_messages; inspect them there"
            );
        }
        Ok(())
    }

    async fn discover(
        &self,
        after: Option<&ShardKey>,
        limit: usize,
    ) -> Result<DiscoveryPage, Error> {
        let (scope, shard, destination) = match after {
            Some(key) => (
                i64::from(key.scope.0),
                key.shard_identifier,
                key.destination_str(),
            ),
            None => (i64::MIN, i64::MIN, ""),
        };
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let rows = sqlx::query(DISCOVER)
            .bind(scope)
            .bind(shard)
            .bind(destination)
            .bind(limit)
            .bind(now_ms())
            .fetch_all(&self.pool)
            .await
            .map_err(database("discovering due shards"))?;
        let mut page = DiscoveryPage::default();
        let visited = rows.len();
        for (index, row) in rows.into_iter().enumerate() {
            let key = shard_key(&row)?;
            if index + 1 == visited && i64::try_from(visited).unwrap_or(i64::MAX) == limit {
                page.next = Some(key.clone());
            }
            if row.try_get::<bool, _>(3).unwrap_or(false) {
                page.due.push(key);
            }
        }
        Ok(page)
    }

    async fn claim(
        &self,
        shard: &ShardKey,
        options: &ClaimOptions,
    ) -> Result<Option<SqliteSession>, Error> {
        let turn = Arc::clone(&self.writes).lock_owned().await;
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(database("claiming a shard"))?;
        let token: i64 = sqlx::query_scalar(NEXT_TOKEN)
            .fetch_one(&mut *tx)
            .await
            .map_err(database("claiming a shard"))?;
        let now = now_ms();
        let previous_owner: Option<String> = sqlx::query_scalar(LAPSED_OWNER)
            .bind(shard.scope.0)
            .bind(shard.shard_identifier)
            .bind(shard.destination_str())
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(database("claiming a shard"))?;
        let attempts: Option<i64> = sqlx::query_scalar(CLAIM)
            .bind(shard.scope.0)
            .bind(shard.shard_identifier)
            .bind(shard.destination_str())
            .bind(&options.worker)
            .bind(token)
            .bind(now.saturating_add(duration_ms(options.lease)))
            .bind(now)
            .fetch_optional(&mut *tx)
            .await
            .map_err(database("claiming a shard"))?;
        let Some(attempts) = attempts else {
            tx.rollback().await.map_err(database("claiming a shard"))?;
            return Ok(None);
        };
        let lease = Lease {
            shard: shard.clone(),
            token,
            attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
            previous_owner,
        };
        // In transaction mode the session keeps the turn as long as it keeps the transaction.
        let claimed = match options.mode {
            HandlerMode::Leased => {
                tx.commit().await.map_err(database("claiming a shard"))?;
                None
            }
            HandlerMode::InTransaction => Some((tx, turn)),
        };
        Ok(Some(SqliteSession::new(
            self.pool.clone(),
            Arc::clone(&self.writes),
            lease,
            options.lease,
            claimed,
        )))
    }

    async fn wakeups(&self) -> Result<Option<NoWakeups>, Error> {
        Ok(None)
    }

    async fn extend_lease(&self, lease: &Lease, duration: Duration) -> Result<bool, Error> {
        let _turn = self.writes.lock().await;
        let extended = fenced(EXTEND_LEASE, lease)
            .bind(now_ms().saturating_add(duration_ms(duration)))
            .execute(&self.pool)
            .await
            .map_err(database("extending a lease"))?;
        Ok(extended.rows_affected() > 0)
    }

    async fn release(&self, lease: &Lease) -> Result<bool, Error> {
        let _turn = self.writes.lock().await;
        let released = fenced(RELEASE_INTERRUPTED, lease)
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(database("releasing a lease"))?;
        Ok(released.rows_affected() > 0)
    }

    async fn unpark(&self, known: &[CategoryId]) -> Result<u64, Error> {
        let known: Vec<i32> = known.iter().map(|category| category.0).collect();
        let result = sqlx::query(
            "UPDATE outbox_shards SET retry_at = ?1 \
             WHERE parked_category IN (SELECT value FROM json_each(?2)) AND retry_at > ?1",
        )
        .bind(now_ms())
        .bind(serde_json::to_string(&known).unwrap_or_default())
        .execute(&self.pool)
        .await
        .map_err(database("resuming parked shards"))?;
        Ok(result.rows_affected())
    }

    async fn reschedule(&self, shard: &ShardKey) -> Result<bool, Error> {
        let result = sqlx::query(
            "UPDATE outbox_shards SET retry_at = ?4 \
             WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 \
                AND retry_at > ?4",
        )
        .bind(shard.scope.0)
        .bind(shard.shard_identifier)
        .bind(shard.destination_str())
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(database("rescheduling a shard"))?;
        Ok(result.rows_affected() > 0)
    }

    async fn newest_message_id(&self) -> Result<Option<MessageId>, Error> {
        let newest: Option<i64> = sqlx::query_scalar("SELECT max(id) FROM outbox_messages")
            .fetch_one(&self.pool)
            .await
            .map_err(database("reading the newest message id"))?;
        Ok(newest.map(MessageId))
    }

    async fn pending_in_shard(&self, shard: &ShardKey, up_to: MessageId) -> Result<u64, Error> {
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_messages \
             WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND id <= ?4",
        )
        .bind(shard.scope.0)
        .bind(shard.shard_identifier)
        .bind(shard.destination_str())
        .bind(up_to.0)
        .fetch_one(&self.pool)
        .await
        .map_err(database("counting a shard's pending messages"))?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn pending_messages(&self, limit: usize) -> Result<Vec<PendingMessage>, Error> {
        let rows = sqlx::query(
            "SELECT id, shard_scope, shard_identifier, destination, category, \
                object_identifier, payload, created_at \
             FROM outbox_messages ORDER BY id LIMIT ?1",
        )
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(database("listing pending messages"))?;
        Ok(rows
            .into_iter()
            .map(|row| {
                PendingMessage::new(
                    MessageId(row.get(0)),
                    ShardKey::from_stored(row.get(1), row.get(2), row.get(3)),
                    CategoryId(row.get(4)),
                    row.get(5),
                    row.get(6),
                    from_ms(row.get(7)),
                )
            })
            .collect())
    }

    async fn shard_states(&self) -> Result<Vec<ShardState>, Error> {
        let rows = sqlx::query(
            "SELECT shard_scope, shard_identifier, destination, attempts, last_error, retry_at, \
                lease_owner, lease_expires_at, lease_token, parked_category \
             FROM outbox_shards ORDER BY shard_scope, shard_identifier, destination",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(database("listing shard states"))?;
        Ok(rows
            .into_iter()
            .map(|row| {
                ShardState::new(
                    ShardKey::from_stored(row.get(0), row.get(1), row.get(2)),
                    u32::try_from(row.get::<i64, _>(3)).unwrap_or(u32::MAX),
                    row.get(4),
                    row.get::<Option<i64>, _>(5).map(from_ms),
                    row.get(6),
                    row.get::<Option<i64>, _>(7).map(from_ms),
                    row.get(8),
                    row.get::<Option<i32>, _>(9).map(CategoryId),
                )
            })
            .collect())
    }
}
