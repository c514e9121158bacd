use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::store::{
    ClaimOptions, DiscoveryPage, HandlerMode, Lease, MIGRATIONS_TABLE, PendingMessage, ShardState,
    Wakeup, WakeupStream, check_migrations,
};
use outbox_core::{CategoryId, Error, MessageId, ShardKey, Store};
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Row};

use crate::error::database;
use crate::migrate::MIGRATIONS;
use crate::session::{EXTEND_LEASE, PgSession, fenced};

/// The channel on which the outbox trigger notifies relays of committed messages.
pub const NOTIFY_CHANNEL: &str = "outbox_messages";

/// The outbox store on a PostgreSQL database.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    /// A store on `pool`. Apply the migrations first ([`crate::migrate`]).
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

pub(crate) fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn from_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

// Skip-scan: one index descent per shard with pending rows, never a read of every row. Each
// step finds the first row of the next shard in key order. Shards are due when nobody holds a
// live lease on them and they are not backing off, or have a message newer than their failure.
pub(crate) const DISCOVER: &str = "\
    WITH RECURSIVE keys(shard_scope, shard_identifier, destination, n) AS ( \
        (SELECT shard_scope, shard_identifier, destination, 1 FROM outbox_messages \
         WHERE (shard_scope, shard_identifier, destination) > ($1::integer, $2::bigint, $3::text) \
         ORDER BY shard_scope, shard_identifier, destination LIMIT 1) \
        UNION ALL \
        SELECT next.shard_scope, next.shard_identifier, next.destination, k.n + 1 \
        FROM keys k CROSS JOIN LATERAL ( \
            SELECT x.shard_scope, x.shard_identifier, x.destination FROM outbox_messages x \
            WHERE (x.shard_scope, x.shard_identifier, x.destination) \
                > (k.shard_scope, k.shard_identifier, k.destination) \
            ORDER BY x.shard_scope, x.shard_identifier, x.destination LIMIT 1) next \
        WHERE k.n < $4 \
    ) \
    SELECT k.shard_scope, k.shard_identifier, k.destination, \
        s.shard_scope IS NULL OR ( \
            (s.lease_expires_at IS NULL OR s.lease_expires_at <= now()) \
            AND (s.retry_at IS NULL OR s.retry_at <= now() OR EXISTS ( \
                SELECT 1 FROM outbox_messages m \
                WHERE m.shard_scope = k.shard_scope AND m.shard_identifier = k.shard_identifier \
                    AND m.destination = k.destination AND m.id > s.watermark))) AS due \
    FROM keys k LEFT JOIN outbox_shards s \
        ON s.shard_scope = k.shard_scope AND s.shard_identifier = k.shard_identifier \
        AND s.destination = k.destination \
    ORDER BY k.n";

// Takes the lease on an existing state row if the shard is due and nobody holds it; a row
// another transaction has locked is skipped, never waited for. A lease that lapsed without a
// release (its holder died mid-drain, having perhaps delivered the head) counts as an attempt
// at the head.
macro_rules! take_lease {
    () => {
        "UPDATE outbox_shards s SET lease_owner = $4, lease_token = nextval('outbox_lease_tokens'), \
            lease_expires_at = now() + $5::bigint * interval '1 millisecond', \
            attempts = s.attempts + (due.previous_owner IS NOT NULL)::integer \
         FROM (SELECT shard_scope, shard_identifier, destination, lease_owner AS previous_owner \
               FROM outbox_shards \
               WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 \
                 AND (lease_expires_at IS NULL OR lease_expires_at <= now()) \
                 AND (retry_at IS NULL OR retry_at <= now() OR EXISTS ( \
                     SELECT 1 FROM outbox_messages m \
                     WHERE m.shard_scope = $1 AND m.shard_identifier = $2 \
                         AND m.destination = $3 AND m.id > outbox_shards.watermark)) \
               FOR UPDATE SKIP LOCKED) due \
         WHERE s.shard_scope = due.shard_scope AND s.shard_identifier = due.shard_identifier \
            AND s.destination = due.destination \
         RETURNING s.lease_token, s.attempts, due.previous_owner"
    };
}

// Leased mode: one statement creates the state row with the lease if the shard has none, or
// takes the lease on the existing row.
pub(crate) const CLAIM: &str = concat!(
    "WITH fresh AS ( \
        INSERT INTO outbox_shards (shard_scope, shard_identifier, destination, lease_owner, \
            lease_token, lease_expires_at) \
        VALUES ($1, $2, $3, $4, nextval('outbox_lease_tokens'), \
            now() + $5::bigint * interval '1 millisecond') \
        ON CONFLICT DO NOTHING \
        RETURNING lease_token, attempts, NULL::text AS previous_owner), \
     taken AS (",
    take_lease!(),
    ") SELECT * FROM fresh UNION ALL SELECT * FROM taken"
);

// In-transaction mode: the state row is created (committed) first, so the long claiming
// transaction never holds an uncommitted insert that other claimers would wait on.
const ENSURE_STATE: &str = "\
    INSERT INTO outbox_shards (shard_scope, shard_identifier, destination) VALUES ($1, $2, $3) \
    ON CONFLICT DO NOTHING";

const TAKE_LEASE: &str = take_lease!();

// A lease given up after an interrupted drain: it lapses now, so the shard is due at once and
// its next claim counts as a takeover (an attempt more at the head, whose messages the
// interrupted drain may have delivered).
const RELEASE_INTERRUPTED: &str = "\
    UPDATE outbox_shards SET lease_expires_at = now() \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 AND lease_token = $4";

impl Store for PgStore {
    type Session = PgSession;
    type Wakeups = PgWakeups;

    async fn check_schema(&self) -> Result<(), Error> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
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
        check_migrations(&applied, MIGRATIONS)
    }

    async fn discover(
        &self,
        after: Option<&ShardKey>,
        limit: usize,
    ) -> Result<DiscoveryPage, Error> {
        // Below every SMALLINT scope, so the first page starts at the first shard.
        let (scope, shard, destination) = match after {
            Some(key) => (
                i32::from(key.scope.0),
                key.shard_identifier,
                key.destination_str(),
            ),
            None => (i32::from(i16::MIN) - 1, i64::MIN, ""),
        };
        let limit = i32::try_from(limit.max(1)).unwrap_or(i32::MAX);
        let rows = sqlx::query(DISCOVER)
            .bind(scope)
            .bind(shard)
            .bind(destination)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(database("discovering due shards"))?;
        let full = rows.len() == usize::try_from(limit).unwrap_or(usize::MAX);
        let mut page = DiscoveryPage::default();
        let visited = rows.len();
        for (index, row) in rows.into_iter().enumerate() {
            let key = ShardKey::from_stored(row.get(0), row.get(1), row.get(2));
            if full && index + 1 == visited {
                page.next = Some(key.clone());
            }
            if row.get::<bool, _>(3) {
                page.due.push(key);
            }
        }
        Ok(page)
    }

    async fn claim(
        &self,
        shard: &ShardKey,
        options: &ClaimOptions,
    ) -> Result<Option<PgSession>, Error> {
        let lease_ms = duration_ms(options.lease);
        let (claimed, tx) = match options.mode {
            HandlerMode::Leased => {
                let claimed: Option<(i64, i32, Option<String>)> = sqlx::query_as(CLAIM)
                    .bind(shard.scope.0)
                    .bind(shard.shard_identifier)
                    .bind(shard.destination_str())
                    .bind(&options.worker)
                    .bind(lease_ms)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(database("claiming a shard"))?;
                (claimed, None)
            }
            HandlerMode::InTransaction => {
                sqlx::query(ENSURE_STATE)
                    .bind(shard.scope.0)
                    .bind(shard.shard_identifier)
                    .bind(shard.destination_str())
                    .execute(&self.pool)
                    .await
                    .map_err(database("claiming a shard"))?;
                let mut tx = self
                    .pool
                    .begin()
                    .await
                    .map_err(database("claiming a shard"))?;
                let claimed: Option<(i64, i32, Option<String>)> = sqlx::query_as(TAKE_LEASE)
                    .bind(shard.scope.0)
                    .bind(shard.shard_identifier)
                    .bind(shard.destination_str())
                    .bind(&options.worker)
                    .bind(lease_ms)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(database("claiming a shard"))?;
                (claimed, Some(tx))
            }
        };
        let Some((token, attempts, previous_owner)) = claimed else {
            return Ok(None);
        };
        let lease = Lease {
            shard: shard.clone(),
            token,
            attempts: u32::try_from(attempts).unwrap_or(0),
            previous_owner,
        };
        Ok(Some(PgSession::new(
            self.pool.clone(),
            lease,
            options.lease,
            tx,
        )))
    }

    async fn wakeups(&self) -> Result<Option<PgWakeups>, Error> {
        let mut listener = PgListener::connect_with(&self.pool)
            .await
            .map_err(database("listening for commits"))?;
        listener
            .listen(NOTIFY_CHANNEL)
            .await
            .map_err(database("listening for commits"))?;
        Ok(Some(PgWakeups { listener }))
    }

    async fn extend_lease(&self, lease: &Lease, duration: Duration) -> Result<bool, Error> {
        let extended = fenced(EXTEND_LEASE, lease)
            .bind(duration_ms(duration))
            .execute(&self.pool)
            .await
            .map_err(database("extending a lease"))?;
        Ok(extended.rows_affected() > 0)
    }

    async fn release(&self, lease: &Lease) -> Result<bool, Error> {
        let released = fenced(RELEASE_INTERRUPTED, lease)
            .execute(&self.pool)
            .await
            .map_err(database("releasing a lease"))?;
        Ok(released.rows_affected() > 0)
    }

    async fn unpark(&self, known: &[CategoryId]) -> Result<u64, Error> {
        let known: Vec<i32> = known.iter().map(|category| category.0).collect();
        let result = sqlx::query(
            "UPDATE outbox_shards SET retry_at = now() \
             WHERE parked_category = ANY($1) AND retry_at > now()",
        )
        .bind(known)
        .execute(&self.pool)
        .await
        .map_err(database("resuming parked shards"))?;
        Ok(result.rows_affected())
    }

    async fn reschedule(&self, shard: &ShardKey) -> Result<bool, Error> {
        let result = sqlx::query(
            "UPDATE outbox_shards SET retry_at = now() \
             WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 \
                AND retry_at > now()",
        )
        .bind(shard.scope.0)
        .bind(shard.shard_identifier)
        .bind(shard.destination_str())
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
             WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 AND id <= $4",
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
            "SELECT id, shard_scope, shard_identifier, destination, category, object_identifier, \
                payload::text, (extract(epoch FROM created_at) * 1000)::bigint \
             FROM outbox_messages ORDER BY id LIMIT $1",
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
            "SELECT shard_scope, shard_identifier, destination, attempts, last_error, \
                (extract(epoch FROM retry_at) * 1000)::bigint, lease_owner, \
                (extract(epoch FROM lease_expires_at) * 1000)::bigint, lease_token, \
                parked_category \
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
                    u32::try_from(row.get::<i32, _>(3)).unwrap_or(0),
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

/// Commit notifications from the outbox trigger, through `LISTEN`.
#[derive(Debug)]
pub struct PgWakeups {
    listener: PgListener,
}

impl WakeupStream for PgWakeups {
    async fn next(&mut self) -> Result<Wakeup, Error> {
        match self.listener.try_recv().await {
            Ok(Some(notification)) => Ok(parse_wakeup(notification.payload())),
            // The connection was lost and has been re-established (listening again):
            // commits in between went unannounced, so the relay should look for itself.
            Ok(None) => Ok(Wakeup::Any),
            Err(error) => Err(database("listening for commits")(error)),
        }
    }
}

/// Parses the trigger's payload: one `scope:shard:destination` per line, or `*`.
fn parse_wakeup(payload: &str) -> Wakeup {
    let mut shards = Vec::new();
    for line in payload.lines() {
        let mut parts = line.splitn(3, ':');
        let parsed = match (parts.next(), parts.next(), parts.next()) {
            (Some(scope), Some(shard), Some(destination)) => scope
                .parse::<i16>()
                .ok()
                .zip(shard.parse::<i64>().ok())
                .map(|(scope, shard)| ShardKey::from_stored(scope, shard, destination.to_owned())),
            _ => None,
        };
        match parsed {
            Some(key) => shards.push(key),
            None => return Wakeup::Any,
        }
    }
    if shards.is_empty() {
        Wakeup::Any
    } else {
        Wakeup::Shards(shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::{Destination, ScopeId};

    #[test]
    fn parses_notification_payloads() {
        assert_eq!(parse_wakeup("*"), Wakeup::Any);
        assert_eq!(parse_wakeup(""), Wakeup::Any);
        assert_eq!(
            parse_wakeup("1:42:\n2:-7:eu:west"),
            Wakeup::Shards(vec![
                ShardKey::local(ScopeId(1), 42),
                ShardKey::fan_out(ScopeId(2), -7, Destination::new("eu:west").unwrap()),
            ])
        );
        assert_eq!(parse_wakeup("1:not-a-number:"), Wakeup::Any);
    }
}
