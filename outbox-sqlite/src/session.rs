use std::any::Any;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use outbox_core::store::{
    Acknowledgement, GroupKey, GroupTail, Lease, Outcome, ShardSession, StoredMessage,
    ack_then_finish,
};
use outbox_core::{CategoryId, Error, MessageId, ModelTable, ScopeId, ShardKey};
use sqlx::pool::PoolConnection;
use sqlx::query::Query;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{AssertSqlSafe, Row, Sqlite, SqliteConnection, SqlitePool, Transaction};
use tokio::sync::{MutexGuard, OwnedMutexGuard};

use crate::error::{database, on_table};
use crate::model::load_sql;
use crate::store::WriteLock;
use crate::store::{duration_ms, now_ms};

/// A claimed shard on SQLite: under a lease, or inside the claiming `BEGIN IMMEDIATE`
/// transaction in in-transaction handler mode.
#[derive(Debug)]
pub struct SqliteSession {
    pool: SqlitePool,
    writes: WriteLock,
    lease: Lease,
    lease_duration: Duration,
    tx: Option<Transaction<'static, Sqlite>>,
    /// The turn a session in transaction mode holds with its transaction.
    _turn: Option<OwnedMutexGuard<()>>,
}

enum Conn<'a> {
    Pooled(PoolConnection<Sqlite>),
    Claiming(&'a mut SqliteConnection),
}

impl Deref for Conn<'_> {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::Claiming(conn) => conn,
        }
    }
}

impl DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::Claiming(conn) => conn,
        }
    }
}

macro_rules! fetch {
    () => {
        "SELECT id, category, shard_scope, object_identifier, payload FROM outbox_messages \
         WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 \
         ORDER BY id LIMIT ?4"
    };
}

/// A shard's oldest rows.
#[cfg(test)]
pub(crate) const FETCH: &str = fetch!();

// FETCH as one row, a JSON array of rows: sqlx hands each SQLite row over from the
// connection's thread on its own, and a shard's head is read at every claim.
const FETCH_JSON: &str = concat!(
    "SELECT json_group_array(json_array(id, category, shard_scope, object_identifier, payload)) \
     FROM (",
    fetch!(),
    ")"
);

// Each group's rows in `?5 < id <= ?6`: the newest whole, and the ids of all of them.
pub(crate) const FETCH_NEWEST: &str = "\
    SELECT m.id, m.category, m.shard_scope, m.object_identifier, m.payload, ( \
        SELECT json_group_array(x.id) FROM outbox_messages x \
        WHERE x.shard_scope = ?1 AND x.shard_identifier = ?2 AND x.destination = ?3 \
            AND x.category = m.category AND x.object_identifier = m.object_identifier \
            AND x.id > ?5 AND x.id <= m.id) \
    FROM json_each(?4) g JOIN outbox_messages m ON m.id = ( \
        SELECT x.id FROM outbox_messages x \
        WHERE x.shard_scope = ?1 AND x.shard_identifier = ?2 AND x.destination = ?3 \
            AND x.category = g.value ->> 0 AND x.object_identifier = g.value ->> 1 \
            AND x.id > ?5 AND x.id <= ?6 \
        ORDER BY x.id DESC LIMIT 1)";

pub(crate) const EXTEND_LEASE: &str = "\
    UPDATE outbox_shards SET lease_expires_at = ?5 \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4";

// An acknowledgement proves and extends the lease, and the head it moved past takes its
// attempts with it.
const ACK_LEASE: &str = "\
    UPDATE outbox_shards SET lease_expires_at = ?5, attempts = 0 \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4";

// Exactly the rows the relay read and delivered go, by id (one seek each).
pub(crate) const ACK: &str = "\
    DELETE FROM outbox_messages \
    WHERE id IN (SELECT value FROM json_each(?4)) \
        AND shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3";

pub(crate) const DELETE_IF_EMPTY: &str = "\
    DELETE FROM outbox_shards \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4 \
        AND NOT EXISTS (SELECT 1 FROM outbox_messages m \
            WHERE m.shard_scope = ?1 AND m.shard_identifier = ?2 AND m.destination = ?3)";

const RELEASE: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL, attempts = 0, \
        last_error = NULL, retry_at = NULL, parked_category = NULL \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4";

const RELEASE_LEASE: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4";

const FAIL: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL, attempts = ?5, \
        last_error = ?6, retry_at = ?7, watermark = ?8, parked_category = ?9 \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4";

/// One row of a shard's head, read as JSON `[id, category, scope, object, payload]`: a row that
/// does not have the schema's form (written around its checks) is a typed error naming it.
fn decode(row: &[serde_json::Value]) -> Result<StoredMessage, Error> {
    let id = row.first().and_then(serde_json::Value::as_i64);
    let undecodable = |detail: String| Error::Undecodable {
        operation: "reading a shard",
        message_id: id.map(MessageId),
        detail,
    };
    let field = |index: usize, name: &str| {
        row.get(index)
            .ok_or_else(|| undecodable(format!("{name} is missing")))
    };
    let integer = |index: usize, name: &str| {
        let value = field(index, name)?;
        value
            .as_i64()
            .ok_or_else(|| undecodable(format!("{name} is {value}, not an integer")))
    };
    let id = integer(0, "id")?;
    let category = integer(1, "category")?;
    let scope = integer(2, "shard_scope")?;
    let object_identifier = integer(3, "object_identifier")?;
    let payload = field(4, "payload")?;
    Ok(StoredMessage {
        id: MessageId(id),
        category: CategoryId(
            i32::try_from(category)
                .map_err(|_| undecodable(format!("category {category} is not an INTEGER")))?,
        ),
        scope: ScopeId(
            i16::try_from(scope)
                .map_err(|_| undecodable(format!("shard_scope {scope} is not a SMALLINT")))?,
        ),
        object_identifier,
        payload: payload
            .as_str()
            .ok_or_else(|| undecodable(format!("payload is {payload}, not JSON text")))?
            .to_owned(),
    })
}

/// Binds a shard's key as `?1..?3` of a statement.
fn shard_keyed(sql: &'static str, shard: &ShardKey) -> Query<'static, Sqlite, SqliteArguments> {
    sqlx::query(sql)
        .bind(shard.scope.0)
        .bind(shard.shard_identifier)
        .bind(shard.destination_str().to_owned())
}

/// Binds a lease's shard key and fencing token as `?1..?4` of a statement: one that acts only
/// while the lease is current.
pub(crate) fn fenced(sql: &'static str, lease: &Lease) -> Query<'static, Sqlite, SqliteArguments> {
    shard_keyed(sql, &lease.shard).bind(lease.token)
}

fn stored(row: &SqliteRow) -> StoredMessage {
    StoredMessage {
        id: MessageId(row.get(0)),
        category: CategoryId(row.get(1)),
        scope: ScopeId(row.get(2)),
        object_identifier: row.get(3),
        payload: row.get(4),
    }
}

impl SqliteSession {
    pub(crate) fn new(
        pool: SqlitePool,
        writes: WriteLock,
        lease: Lease,
        lease_duration: Duration,
        claimed: Option<(Transaction<'static, Sqlite>, OwnedMutexGuard<()>)>,
    ) -> Self {
        let (tx, turn) = claimed.unzip();
        Self {
            pool,
            writes,
            lease,
            lease_duration,
            tx,
            _turn: turn,
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

    /// The relay's turn, then a write transaction (leased mode).
    async fn write_transaction(
        &self,
        operation: &'static str,
    ) -> Result<(MutexGuard<'_, ()>, Transaction<'static, Sqlite>), Error> {
        let turn = self.writes.lock().await;
        let tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(database(operation))?;
        Ok((turn, tx))
    }

    /// Binds the shard key as `?1..?3` of a statement.
    fn keyed_without_token(&self, sql: &'static str) -> Query<'static, Sqlite, SqliteArguments> {
        shard_keyed(sql, &self.lease.shard)
    }

    /// Binds the shard key and fencing token as `?1..?4` of a statement.
    fn keyed(&self, sql: &'static str) -> Query<'static, Sqlite, SqliteArguments> {
        fenced(sql, &self.lease)
    }

    /// Extends the lease, proving it is still ours, then deletes the acknowledged rows.
    async fn ack_on(
        &self,
        conn: &mut SqliteConnection,
        acks: &[Acknowledgement],
    ) -> Result<u64, Error> {
        let extended = self
            .keyed(ACK_LEASE)
            .bind(now_ms().saturating_add(duration_ms(self.lease_duration)))
            .execute(&mut *conn)
            .await
            .map_err(database("acknowledging messages"))?;
        if extended.rows_affected() == 0 {
            return Err(Error::LeaseLost {
                shard: self.lease.shard.clone(),
                token: self.lease.token,
            });
        }
        // By id: each row is a seek of the table's own b-tree.
        let ids: Vec<i64> = acks
            .iter()
            .flat_map(|ack| ack.ids.iter().map(|id| id.0))
            .collect();
        let deleted = self
            .keyed_without_token(ACK)
            .bind(serde_json::to_string(&ids).unwrap_or_default())
            .execute(&mut *conn)
            .await
            .map_err(database("acknowledging messages"))?;
        Ok(deleted.rows_affected())
    }

    async fn finish_on(
        &self,
        conn: &mut SqliteConnection,
        outcome: &Outcome,
    ) -> Result<u64, Error> {
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
                    .bind(i64::from(failure.attempts))
                    .bind(failure.error.clone())
                    .bind(now_ms().saturating_add(duration_ms(failure.retry_in)))
                    .bind(failure.watermark.0)
                    .bind(failure.parked_category.map(|category| category.0))
                    .execute(&mut *conn)
                    .await
            }
        };
        Ok(done.map_err(database("releasing a shard"))?.rows_affected())
    }
}

impl ShardSession for SqliteSession {
    fn lease(&self) -> &Lease {
        &self.lease
    }

    async fn fetch(&mut self, limit: usize) -> Result<Vec<StoredMessage>, Error> {
        let query = self
            .keyed_without_token(FETCH_JSON)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX));
        let mut conn = self.conn().await?;
        let json: String = query
            .fetch_one(&mut *conn)
            .await
            .map_err(database("reading a shard"))?
            .get(0);
        let rows: Vec<Vec<serde_json::Value>> =
            serde_json::from_str(&json).map_err(|source| Error::Database {
                operation: "reading a shard",
                source: Box::new(source),
            })?;
        let mut messages = rows
            .iter()
            .map(|row| decode(row))
            .collect::<Result<Vec<_>, _>>()?;
        messages.sort_unstable_by_key(|message| message.id);
        Ok(messages)
    }

    async fn fetch_newest(
        &mut self,
        groups: &[GroupKey],
        after: MessageId,
        up_to: MessageId,
    ) -> Result<Vec<GroupTail>, Error> {
        let groups: Vec<[i64; 2]> = groups
            .iter()
            .map(|group| [i64::from(group.category.0), group.object_identifier])
            .collect();
        let query = self
            .keyed_without_token(FETCH_NEWEST)
            .bind(serde_json::to_string(&groups).unwrap_or_default())
            .bind(after.0)
            .bind(up_to.0);
        let mut conn = self.conn().await?;
        let rows = query
            .fetch_all(&mut *conn)
            .await
            .map_err(database("reading a shard"))?;
        rows.iter()
            .map(|row| {
                let ids: Vec<i64> =
                    serde_json::from_str(row.get::<&str, _>(5)).map_err(|source| {
                        Error::Database {
                            operation: "reading a shard",
                            source: Box::new(source),
                        }
                    })?;
                Ok(GroupTail {
                    newest: stored(row),
                    ids: ids.into_iter().map(MessageId).collect(),
                })
            })
            .collect()
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
        let conn: &mut SqliteConnection = self.tx.as_deref_mut()?;
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
        if let Some(mut tx) = self.tx.take() {
            let result = self.ack_on(&mut tx, acks).await;
            self.tx = Some(tx);
            return result;
        }
        let (_turn, mut tx) = self.write_transaction("acknowledging messages").await?;
        let deleted = self.ack_on(&mut tx, acks).await?;
        tx.commit()
            .await
            .map_err(database("acknowledging messages"))?;
        Ok(deleted)
    }

    async fn ack_and_finish(
        self,
        acks: &[Acknowledgement],
        outcome: Outcome,
    ) -> Result<(u64, bool), Error> {
        if self.tx.is_some() {
            return ack_then_finish(self, acks, outcome).await;
        }
        // One write transaction for both, instead of two.
        let (_turn, mut tx) = self.write_transaction("acknowledging messages").await?;
        let deleted = self.ack_on(&mut tx, acks).await?;
        let released = self.finish_on(&mut tx, &outcome).await?;
        tx.commit()
            .await
            .map_err(database("acknowledging messages"))?;
        Ok((deleted, released > 0))
    }

    async fn finish(mut self, outcome: Outcome) -> Result<(), Error> {
        // In transaction mode the session holds the turn with its transaction.
        let (_turn, mut tx) = match self.tx.take() {
            Some(tx) => (None, tx),
            None => {
                let (turn, tx) = self.write_transaction("releasing a shard").await?;
                (Some(turn), tx)
            }
        };
        let updated = self.finish_on(&mut tx, &outcome).await?;
        tx.commit().await.map_err(database("releasing a shard"))?;
        if updated == 0 {
            return Err(Error::LeaseLost {
                shard: self.lease.shard.clone(),
                token: self.lease.token,
            });
        }
        Ok(())
    }
}
