use std::any::Any;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use outbox_core::store::{
    Acknowledgement, GroupKey, GroupTail, Lease, Outcome, ShardSession, StoredMessage,
    ack_then_finish,
};
use outbox_core::{CategoryId, Error, MessageId, ModelTable, ScopeId, ShardKey};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Postgres, Row, Transaction};

use crate::error::{database, on_table};
use crate::model::load_sql;
use crate::store::duration_ms;

/// A claimed shard on PostgreSQL: under a lease, or inside the claiming transaction (which
/// holds the shard's state row locked) in in-transaction handler mode.
#[derive(Debug)]
pub struct PgSession {
    pool: PgPool,
    lease: Lease,
    lease_duration: Duration,
    tx: Option<Transaction<'static, Postgres>>,
}

enum Conn<'a> {
    Pooled(PoolConnection<Postgres>),
    Claiming(&'a mut PgConnection),
}

impl Deref for Conn<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::Claiming(conn) => conn,
        }
    }
}

impl DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::Claiming(conn) => conn,
        }
    }
}

pub(crate) const FETCH: &str = "\
    SELECT id, category, shard_scope, object_identifier, payload::text FROM outbox_messages \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 \
    ORDER BY id LIMIT $4";

// Each group's rows in `$6 < id <= $7` as one statement sees them (one snapshot): their ids,
// and the newest one whole.
pub(crate) const FETCH_NEWEST: &str = "\
    SELECT m.id, m.category, m.shard_scope, m.object_identifier, m.payload::text, t.ids \
    FROM unnest($4::integer[], $5::bigint[]) AS g(category, object_identifier) \
    CROSS JOIN LATERAL ( \
        SELECT array_agg(x.id) AS ids, max(x.id) AS newest FROM outbox_messages x \
        WHERE x.shard_scope = $1 AND x.shard_identifier = $2 AND x.destination = $3 \
            AND x.category = g.category AND x.object_identifier = g.object_identifier \
            AND x.id > $6 AND x.id <= $7) t \
    JOIN outbox_messages m ON m.id = t.newest";

// The lease update proves (and extends) the lease: if another worker holds the row, it waits
// for it and then finds the token changed, and nothing is deleted. The head it moved past takes
// its attempts with it. Exactly the rows the relay
// read and delivered go, by id: a range of ids could hold a row that committed after the read.
pub(crate) const ACK: &str = "\
    WITH lease AS ( \
        UPDATE outbox_shards SET lease_expires_at = now() + $5::bigint * interval '1 millisecond', \
            attempts = 0 \
        WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 AND lease_token = $4 \
        RETURNING 1), \
     acked AS ( \
        DELETE FROM outbox_messages m \
        WHERE EXISTS (SELECT 1 FROM lease) \
            AND m.shard_scope = $1 AND m.shard_identifier = $2 AND m.destination = $3 \
            AND m.id BETWEEN $6 AND $7 AND m.id = ANY($8::bigint[]) \
        RETURNING 1) \
    SELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM acked)";

// A drained shard's last acknowledgement and its release, in one statement. The shard's state
// row goes if no row is left besides those acknowledged (a row written meanwhile keeps it, and
// it is released, still due).
pub(crate) const ACK_AND_RELEASE: &str = "\
    WITH held AS ( \
        SELECT 1 FROM outbox_shards \
        WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 AND lease_token = $4 \
        FOR UPDATE), \
     acked AS ( \
        DELETE FROM outbox_messages m \
        WHERE EXISTS (SELECT 1 FROM held) \
            AND m.shard_scope = $1 AND m.shard_identifier = $2 AND m.destination = $3 \
            AND m.id BETWEEN $5 AND $6 AND m.id = ANY($7::bigint[]) \
        RETURNING m.id), \
     gone AS ( \
        DELETE FROM outbox_shards \
        WHERE EXISTS (SELECT 1 FROM held) \
            AND shard_scope = $1 AND shard_identifier = $2 AND destination = $3 \
            AND lease_token = $4 \
            AND NOT EXISTS (SELECT 1 FROM outbox_messages x \
                WHERE x.shard_scope = $1 AND x.shard_identifier = $2 AND x.destination = $3 \
                    AND x.id NOT IN (SELECT id FROM acked)) \
        RETURNING 1), \
     released AS ( \
        UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL, attempts = 0, \
            last_error = NULL, retry_at = NULL, parked_category = NULL \
        WHERE EXISTS (SELECT 1 FROM held) AND NOT EXISTS (SELECT 1 FROM gone) \
            AND shard_scope = $1 AND shard_identifier = $2 AND destination = $3 \
            AND lease_token = $4 \
        RETURNING 1) \
    SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM acked), \
        (SELECT count(*) FROM gone) + (SELECT count(*) FROM released)";

// A lease extended from beside a running handler.
pub(crate) const EXTEND_LEASE: &str = "\
    UPDATE outbox_shards SET lease_expires_at = now() + $5::bigint * interval '1 millisecond' \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 AND lease_token = $4";

pub(crate) const DELETE_IF_EMPTY: &str = "\
    DELETE FROM outbox_shards \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 AND lease_token = $4 \
        AND NOT EXISTS (SELECT 1 FROM outbox_messages m \
            WHERE m.shard_scope = $1 AND m.shard_identifier = $2 AND m.destination = $3)";

const RELEASE: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL, attempts = 0, \
        last_error = NULL, retry_at = NULL, parked_category = NULL \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 AND lease_token = $4";

const RELEASE_LEASE: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 AND lease_token = $4";

const FAIL: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL, attempts = $5, \
        last_error = $6, retry_at = now() + $7::bigint * interval '1 millisecond', \
        watermark = $8, parked_category = $9 \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 AND lease_token = $4";

/// Binds what to acknowledge: the span of the ids (lowest, highest), then every id.
fn acknowledged<'q>(
    query: Query<'q, Postgres, PgArguments>,
    acknowledged: &[Acknowledgement],
) -> Query<'q, Postgres, PgArguments> {
    let ids: Vec<i64> = acknowledged
        .iter()
        .flat_map(|ack| ack.ids.iter().map(|id| id.0))
        .collect();
    let lowest = ids.iter().copied().min().unwrap_or(0);
    let highest = ids.iter().copied().max().unwrap_or(-1);
    query.bind(lowest).bind(highest).bind(ids)
}

/// Binds a shard's key as `$1..$3` of a statement.
fn shard_keyed(sql: &'static str, shard: &ShardKey) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(sql)
        .bind(shard.scope.0)
        .bind(shard.shard_identifier)
        .bind(shard.destination_str().to_owned())
}

/// Binds a lease's shard key and fencing token as `$1..$4` of a statement: one that acts only
/// while the lease is current.
pub(crate) fn fenced(sql: &'static str, lease: &Lease) -> Query<'static, Postgres, PgArguments> {
    shard_keyed(sql, &lease.shard).bind(lease.token)
}

fn stored(row: &PgRow) -> StoredMessage {
    StoredMessage {
        id: MessageId(row.get(0)),
        category: CategoryId(row.get(1)),
        scope: ScopeId(row.get(2)),
        object_identifier: row.get(3),
        payload: row.get(4),
    }
}

impl PgSession {
    pub(crate) fn new(
        pool: PgPool,
        lease: Lease,
        lease_duration: Duration,
        tx: Option<Transaction<'static, Postgres>>,
    ) -> Self {
        Self {
            pool,
            lease,
            lease_duration,
            tx,
        }
    }

    async fn conn(&mut self) -> Result<Conn<'_>, Error> {
        match &mut self.tx {
            Some(tx) => Ok(Conn::Claiming(&mut *tx)),
            None => self
                .pool
                .acquire()
                .await
                .map(Conn::Pooled)
                .map_err(database("reading a shard")),
        }
    }

    /// Binds the shard key and fencing token as `$1..$4` of a statement.
    fn keyed(&self, sql: &'static str) -> Query<'static, Postgres, PgArguments> {
        fenced(sql, &self.lease)
    }

    async fn finish_on(&self, conn: &mut PgConnection, outcome: &Outcome) -> Result<u64, Error> {
        let done = match outcome {
            // A shard left empty keeps no state row, however its drain ended: the table holds
            // only shards with messages, leases or failures.
            Outcome::Drained | Outcome::Yielded | Outcome::Released => {
                let deleted = self
                    .keyed(DELETE_IF_EMPTY)
                    .execute(&mut *conn)
                    .await
                    .map_err(database("releasing a shard"))?;
                if deleted.rows_affected() > 0 {
                    return Ok(1);
                }
                let release = if *outcome == Outcome::Released {
                    RELEASE_LEASE
                } else {
                    RELEASE
                };
                self.keyed(release).execute(&mut *conn).await
            }
            Outcome::Failed(failure) => {
                self.keyed(FAIL)
                    .bind(i32::try_from(failure.attempts).unwrap_or(i32::MAX))
                    .bind(failure.error.clone())
                    .bind(duration_ms(failure.retry_in))
                    .bind(failure.watermark.0)
                    .bind(failure.parked_category.map(|category| category.0))
                    .execute(&mut *conn)
                    .await
            }
        };
        Ok(done.map_err(database("releasing a shard"))?.rows_affected())
    }
}

impl ShardSession for PgSession {
    fn lease(&self) -> &Lease {
        &self.lease
    }

    async fn fetch(&mut self, limit: usize) -> Result<Vec<StoredMessage>, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let query = self.keyed_without_token(FETCH).bind(limit);
        let mut conn = self.conn().await?;
        let rows = query
            .fetch_all(&mut *conn)
            .await
            .map_err(database("reading a shard"))?;
        Ok(rows.iter().map(stored).collect())
    }

    async fn fetch_newest(
        &mut self,
        groups: &[GroupKey],
        after: MessageId,
        up_to: MessageId,
    ) -> Result<Vec<GroupTail>, Error> {
        let categories: Vec<i32> = groups.iter().map(|group| group.category.0).collect();
        let objects: Vec<i64> = groups.iter().map(|group| group.object_identifier).collect();
        let query = self
            .keyed_without_token(FETCH_NEWEST)
            .bind(categories)
            .bind(objects)
            .bind(after.0)
            .bind(up_to.0);
        let mut conn = self.conn().await?;
        let rows = query
            .fetch_all(&mut *conn)
            .await
            .map_err(database("reading a shard"))?;
        Ok(rows
            .iter()
            .map(|row| GroupTail {
                newest: stored(row),
                ids: row
                    .get::<Vec<i64>, _>(5)
                    .into_iter()
                    .map(MessageId)
                    .collect(),
            })
            .collect())
    }

    async fn load_model(&mut self, table: &ModelTable, key: i64) -> Result<Option<String>, Error> {
        let query = sqlx::query_scalar(AssertSqlSafe(load_sql(table))).bind(key);
        let mut conn = self.conn().await?;
        query
            .fetch_optional(&mut *conn)
            .await
            .map_err(on_table("reading a replicated model"))
    }

    fn handler_connection(&mut self) -> Option<&mut (dyn Any + Send)> {
        let conn: &mut PgConnection = self.tx.as_deref_mut()?;
        Some(conn)
    }

    async fn before_handler(&mut self) -> Result<(), Error> {
        if let Some(tx) = &mut self.tx {
            sqlx::query("SAVEPOINT outbox_handler")
                .execute(&mut **tx)
                .await
                .map_err(database("opening a handler savepoint"))?;
        }
        Ok(())
    }

    async fn after_handler(&mut self, succeeded: bool) -> Result<(), Error> {
        if let Some(tx) = &mut self.tx {
            if !succeeded {
                sqlx::query("ROLLBACK TO SAVEPOINT outbox_handler")
                    .execute(&mut **tx)
                    .await
                    .map_err(database("rolling back a failed handler"))?;
            }
            sqlx::query("RELEASE SAVEPOINT outbox_handler")
                .execute(&mut **tx)
                .await
                .map_err(database("closing a handler savepoint"))?;
        }
        Ok(())
    }

    async fn ack(&mut self, acks: &[Acknowledgement]) -> Result<u64, Error> {
        let query = acknowledged(self.keyed(ACK).bind(duration_ms(self.lease_duration)), acks);
        let lease = self.lease.clone();
        let mut conn = self.conn().await?;
        let (held, deleted): (i64, i64) = query
            .try_map(|row: PgRow| Ok((row.try_get(0)?, row.try_get(1)?)))
            .fetch_one(&mut *conn)
            .await
            .map_err(database("acknowledging messages"))?;
        if held == 0 {
            return Err(Error::LeaseLost {
                shard: lease.shard,
                token: lease.token,
            });
        }
        Ok(u64::try_from(deleted).unwrap_or(0))
    }

    async fn ack_and_finish(
        mut self,
        acks: &[Acknowledgement],
        outcome: Outcome,
    ) -> Result<(u64, bool), Error> {
        if self.tx.is_some() || outcome != Outcome::Drained {
            return ack_then_finish(self, acks, outcome).await;
        }
        let query = acknowledged(self.keyed(ACK_AND_RELEASE), acks);
        let mut conn = self.conn().await?;
        let (held, deleted, released): (i64, i64, i64) = query
            .try_map(|row: PgRow| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
            .fetch_one(&mut *conn)
            .await
            .map_err(database("acknowledging and releasing a shard"))?;
        if held == 0 {
            return Err(Error::LeaseLost {
                shard: self.lease.shard.clone(),
                token: self.lease.token,
            });
        }
        Ok((u64::try_from(deleted).unwrap_or(0), released > 0))
    }

    async fn finish(mut self, outcome: Outcome) -> Result<(), Error> {
        let updated = match self.tx.take() {
            Some(mut tx) => {
                let updated = self.finish_on(&mut tx, &outcome).await?;
                tx.commit().await.map_err(database("releasing a shard"))?;
                updated
            }
            None => {
                let mut conn = self
                    .pool
                    .acquire()
                    .await
                    .map_err(database("releasing a shard"))?;
                self.finish_on(&mut conn, &outcome).await?
            }
        };
        if updated == 0 {
            return Err(Error::LeaseLost {
                shard: self.lease.shard.clone(),
                token: self.lease.token,
            });
        }
        Ok(())
    }
}

impl PgSession {
    /// Binds the shard key as `$1..$3` of a statement.
    fn keyed_without_token(&self, sql: &'static str) -> Query<'static, Postgres, PgArguments> {
        shard_keyed(sql, &self.lease.shard)
    }
}
