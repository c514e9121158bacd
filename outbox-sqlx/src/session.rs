//! A claimed shard: its reads, acknowledgements and release.

use std::any::Any;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use outbox_core::columns::ModelRow;
use outbox_core::replicated::ModelTable;
use outbox_core::store::{
    Acknowledgement, DeadLettering, GroupKey, GroupTail, Lease, Outcome, ShardSession,
    StoredMessage, ack_then_finish,
};
use outbox_core::{CategoryId, Error, Id, MessageId, ScopeId, ShardKey};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Database, Pool, Transaction};

use crate::dialect::{Ack, Claiming, Dialect, Finished, Finishing};
use crate::error::{database, on_table};
use crate::sql::{Executes, Sql, Statement, With, get};

/// Milliseconds in `duration`, as the statements take them.
pub(crate) fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Binds a shard's key as `$1..$3` of a statement: scope, identifier, destination (the last
/// two as [`Dialect::bind_shard`] stores them).
pub fn shard_keyed<D: Dialect>(
    sql: &'static str,
    shard: &ShardKey,
) -> Statement<'static, D::Database> {
    D::bind_shard(sqlx::query(sql).with(shard.scope.0), shard)
}

/// Binds a lease's shard key and then its fencing token as the first parameters of a
/// statement: one that acts only while the lease is current.
pub fn fenced<D: Dialect>(sql: &'static str, lease: &Lease) -> Statement<'static, D::Database> {
    shard_keyed::<D>(sql, &lease.shard).with(lease.token)
}

/// A row (id, category, scope, object, payload, creation time in µs, metadata) as a message, the object taking
/// [`Dialect::OBJECT_COLUMNS`] columns; a row that does not have the schema's form (written
/// around its checks) is a typed error naming it.
pub fn stored<D: Dialect>(row: &<D::Database as Database>::Row) -> Result<StoredMessage, Error> {
    type DB<D> = <D as Dialect>::Database;
    let id = get::<DB<D>, i64>(row, 0).ok();
    let undecodable = |error: sqlx::Error| Error::Undecodable {
        operation: "reading a shard",
        message_id: id.map(MessageId),
        detail: error.to_string(),
    };
    Ok(StoredMessage {
        id: MessageId(get::<DB<D>, i64>(row, 0).map_err(undecodable)?),
        category: CategoryId(get::<DB<D>, i32>(row, 1).map_err(undecodable)?),
        scope: ScopeId(get::<DB<D>, i16>(row, 2).map_err(undecodable)?),
        object_identifier: D::decode_object(row, 3).map_err(undecodable)?,
        payload: get::<DB<D>, String>(row, 3 + D::OBJECT_COLUMNS).map_err(undecodable)?,
        created_at: from_micros(
            get::<DB<D>, i64>(row, 4 + D::OBJECT_COLUMNS).map_err(undecodable)?,
        ),
        metadata: get::<DB<D>, Option<String>>(row, 5 + D::OBJECT_COLUMNS).map_err(undecodable)?,
    })
}

/// A time as the head's rows carry it: microseconds since the Unix epoch.
pub fn from_micros(micros: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).unwrap_or(0))
}

/// The ids acknowledged, their lowest and their highest.
fn acknowledged(acks: &[Acknowledgement]) -> (Vec<i64>, i64, i64) {
    let ids: Vec<i64> = acks
        .iter()
        .flat_map(|ack| ack.ids.iter().map(|id| id.0))
        .collect();
    let lowest = ids.iter().copied().min().unwrap_or(0);
    let highest = ids.iter().copied().max().unwrap_or(-1);
    (ids, lowest, highest)
}

fn lease_lost(lease: &Lease) -> Error {
    Error::LeaseLost {
        shard: lease.shard.clone(),
        token: lease.token,
    }
}

/// `query` with a model's key bound as the model statements take one
/// ([`Dialect::load_model_sql`], [`Dialect::walk_model_sql`]): a wide key's 16 bytes, or an
/// integer.
pub(crate) fn with_key<DB: Sql>(query: Statement<'_, DB>, key: Id) -> Statement<'_, DB> {
    match key.wide_bytes() {
        Some(bytes) => query.with(bytes.to_vec()),
        None => query.with(key.as_integer().unwrap_or_default()),
    }
}

/// Where the relay's writes outside a claiming transaction run: one statement at a time on a
/// pooled connection, or in a transaction under the backend's turn
/// ([`Dialect::WRITES_IN_TRANSACTION`]).
pub(crate) enum Writer<D: Dialect> {
    Pooled(PoolConnection<D::Database>),
    InTransaction(Transaction<'static, D::Database>, D::Turn),
}

impl<D: Dialect> Writer<D> {
    async fn open(
        dialect: &D,
        pool: &Pool<D::Database>,
        operation: &'static str,
    ) -> Result<Self, Error> {
        if D::WRITES_IN_TRANSACTION {
            Self::begin(dialect, pool, operation).await
        } else {
            let conn = pool.acquire().await.map_err(database::<D>(operation))?;
            Ok(Writer::Pooled(conn))
        }
    }

    /// A write transaction, under the backend's turn, whatever the backend.
    pub(crate) async fn begin(
        dialect: &D,
        pool: &Pool<D::Database>,
        operation: &'static str,
    ) -> Result<Self, Error> {
        let turn = dialect.take_turn().await;
        let tx = pool
            .begin_with(D::BEGIN)
            .await
            .map_err(database::<D>(operation))?;
        Ok(Writer::InTransaction(tx, turn))
    }

    pub(crate) fn conn(&mut self) -> &mut <D::Database as Database>::Connection {
        match self {
            Writer::Pooled(conn) => conn,
            Writer::InTransaction(tx, _) => tx,
        }
    }

    pub(crate) async fn commit(self, operation: &'static str) -> Result<(), Error> {
        match self {
            Writer::Pooled(_) => Ok(()),
            Writer::InTransaction(tx, _turn) => tx.commit().await.map_err(database::<D>(operation)),
        }
    }
}

/// A claimed shard: under a lease, or inside the claiming transaction (which holds the shard's
/// state row, or the database's write lock) in in-transaction handler mode.
#[derive(Debug)]
pub struct SqlxSession<D: Dialect> {
    pool: Pool<D::Database>,
    dialect: D,
    lease: Lease,
    lease_duration: Duration,
    claiming: Option<Claiming<D>>,
    /// The head as the claim read it, and how many rows it asked for: the first fetch.
    head: Option<(Vec<StoredMessage>, usize)>,
}

/// A connection to read on: the claiming transaction's, or one from the pool.
enum Reader<'a, DB: Database> {
    Pooled(PoolConnection<DB>),
    Claiming(&'a mut DB::Connection),
}

impl<DB: Database> Reader<'_, DB> {
    fn conn(&mut self) -> &mut DB::Connection {
        match self {
            Reader::Pooled(conn) => conn,
            Reader::Claiming(conn) => conn,
        }
    }
}

impl<D: Dialect> SqlxSession<D> {
    /// A session on a claim.
    pub fn new(
        pool: Pool<D::Database>,
        dialect: D,
        lease: Lease,
        lease_duration: Duration,
        claiming: Option<Claiming<D>>,
    ) -> Self {
        Self {
            pool,
            dialect,
            lease,
            lease_duration,
            claiming,
            head: None,
        }
    }

    /// This session answering its first fetch of `head.1` rows with `head.0`, the shard's
    /// head as its claim read it (see [`Claim::head`](crate::dialect::Claim::head)).
    #[must_use]
    pub fn with_head(mut self, head: Option<(Vec<StoredMessage>, usize)>) -> Self {
        self.head = head;
        self
    }

    async fn reader(&mut self) -> Result<Reader<'_, D::Database>, Error> {
        match &mut self.claiming {
            Some(claiming) => Ok(Reader::Claiming(&mut *claiming.tx)),
            None => self
                .pool
                .acquire()
                .await
                .map(Reader::Pooled)
                .map_err(database::<D>("reading a shard")),
        }
    }

    /// Acknowledges and releases drained shards together ([`Store::ack_and_finish_many`]):
    /// one alone as [`ShardSession::ack_and_finish`] does (unless the backend finishes in one
    /// statement, [`Dialect::FINISHES_IN_ONE_STATEMENT`]); several in one write transaction,
    /// in shard key order (two relays' batches lock their rows in one order), each fenced by
    /// its own lease. A lease no longer held deletes nothing of its shard and is
    /// [`Error::LeaseLost`] for it; a statement or commit that fails writes nothing of the
    /// batch, and is the error of each. Sessions claimed in a transaction finish alone.
    ///
    /// [`Store::ack_and_finish_many`]: outbox_core::store::Store::ack_and_finish_many
    pub(crate) async fn ack_and_finish_together(
        pool: &Pool<D::Database>,
        dialect: &D,
        finishing: Vec<(Self, Vec<Acknowledgement>)>,
    ) -> Vec<Finished> {
        const OPERATION: &str = "acknowledging and releasing drained shards";
        let mut results: Vec<Option<Finished>> = finishing.iter().map(|_| None).collect();
        let mut together = Vec::with_capacity(finishing.len());
        for (at, (session, acks)) in finishing.into_iter().enumerate() {
            if session.claiming.is_some() {
                results[at] = Some(session.ack_and_finish(&acks, Outcome::Drained).await);
            } else {
                together.push(Some((at, session, acks)));
            }
        }
        // A backend that finishes a batch in one statement finishes one shard with it too.
        if together.len() == 1 && !D::FINISHES_IN_ONE_STATEMENT {
            if let Some((at, session, acks)) = together.pop().flatten() {
                results[at] = Some(session.ack_and_finish(&acks, Outcome::Drained).await);
            }
        } else if !together.is_empty() {
            // Sorted by index: a session is large, and a sort moves its elements many times.
            let mut order: Vec<usize> = (0..together.len()).collect();
            order.sort_unstable_by(|&a, &b| {
                let shard = |index: usize| {
                    together[index]
                        .as_ref()
                        .map(|(_, session, _)| &session.lease.shard)
                };
                shard(a).cmp(&shard(b))
            });
            let mut places = Vec::with_capacity(together.len());
            let mut batch = Vec::with_capacity(together.len());
            for (at, session, acks) in order.into_iter().filter_map(|index| together[index].take())
            {
                places.push(at);
                batch.push((session.lease, session.lease_duration, acks));
            }
            match Self::finish_in_one_transaction(pool, dialect, batch, OPERATION).await {
                Ok(finished) => {
                    for (at, result) in places.into_iter().zip(finished) {
                        results[at] = Some(result);
                    }
                }
                Err(error) => {
                    let errors = error.shared_by(places.len(), OPERATION);
                    for (at, error) in places.into_iter().zip(errors) {
                        results[at] = Some(Err(error));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(Error::Unavailable {
                        source: "the shard was left out of its batch".into(),
                    })
                })
            })
            .collect()
    }

    /// The batch of [`SqlxSession::ack_and_finish_together`], in one write transaction: each
    /// session's result, or the error that wrote nothing.
    async fn finish_in_one_transaction(
        pool: &Pool<D::Database>,
        dialect: &D,
        batch: Vec<Finishing>,
        operation: &'static str,
    ) -> Result<Vec<Finished>, Error> {
        if D::FINISHES_IN_ONE_STATEMENT {
            // One statement is a transaction of its own: no BEGIN and COMMIT round trips.
            let mut conn = pool.acquire().await.map_err(database::<D>(operation))?;
            return dialect.ack_and_release_on(&mut conn, &batch).await;
        }
        let mut writer = Writer::begin(dialect, pool, operation).await?;
        let finished = dialect.ack_and_release_on(writer.conn(), &batch).await?;
        writer.commit(operation).await?;
        Ok(finished)
    }

    fn lease_lost(&self) -> Error {
        lease_lost(&self.lease)
    }

    async fn execute(
        conn: &mut <D::Database as Database>::Connection,
        query: Statement<'static, D::Database>,
        operation: &'static str,
    ) -> Result<u64, Error> {
        let done = query
            .execute(D::Database::on(conn))
            .await
            .map_err(database::<D>(operation))?;
        Ok(D::rows_affected(&done))
    }

    /// Proves and extends the lease and deletes the acknowledged rows, on `conn`: the rows
    /// deleted, or [`Error::LeaseLost`] (and nothing deleted).
    pub(crate) async fn ack_on(
        lease: &Lease,
        lease_duration: Duration,
        conn: &mut <D::Database as Database>::Connection,
        acks: &[Acknowledgement],
    ) -> Result<u64, Error> {
        const OPERATION: &str = "acknowledging messages";
        let (ids, lowest, highest) = acknowledged(acks);
        let lease_ms = duration_ms(lease_duration);
        match D::SQL.ack {
            Ack::Combined(sql) => {
                let query = fenced::<D>(sql, lease)
                    .with(lease_ms)
                    .with(lowest)
                    .with(highest);
                let row = D::bind_ids(query, ids)
                    .fetch_one(D::Database::on(conn))
                    .await
                    .map_err(database::<D>(OPERATION))?;
                let held = get::<D::Database, i64>(&row, 0).map_err(database::<D>(OPERATION))?;
                if held == 0 {
                    return Err(lease_lost(lease));
                }
                let deleted = get::<D::Database, i64>(&row, 1).map_err(database::<D>(OPERATION))?;
                Ok(u64::try_from(deleted).unwrap_or(0))
            }
            Ack::Separate {
                lease: extend,
                delete,
            } => {
                let extend = fenced::<D>(extend, lease).with(lease_ms);
                if Self::execute(conn, extend, OPERATION).await? == 0 {
                    return Err(lease_lost(lease));
                }
                let query = D::bind_ids(shard_keyed::<D>(delete, &lease.shard), ids);
                Self::execute(conn, query, OPERATION).await
            }
        }
    }

    /// Records `outcome` on `conn`: the state rows it changed (0 if the lease was lost).
    pub(crate) async fn finish_on(
        lease: &Lease,
        conn: &mut <D::Database as Database>::Connection,
        outcome: &Outcome,
    ) -> Result<u64, Error> {
        const OPERATION: &str = "releasing a shard";
        let sql = &D::SQL;
        match outcome {
            // A shard left empty keeps no state row, however its drain ended: the table holds
            // only shards with messages, leases or failures.
            Outcome::Drained | Outcome::Yielded | Outcome::Released => {
                let empty = match D::SHARD_IS_EMPTY {
                    None => true,
                    Some(read) => {
                        let row = shard_keyed::<D>(read, &lease.shard)
                            .fetch_one(D::Database::on(conn))
                            .await
                            .map_err(database::<D>(OPERATION))?;
                        get::<D::Database, bool>(&row, 0).map_err(database::<D>(OPERATION))?
                    }
                };
                let delete = fenced::<D>(sql.delete_if_empty, lease);
                if empty && Self::execute(conn, delete, OPERATION).await? > 0 {
                    return Ok(1);
                }
                let release = if *outcome == Outcome::Released {
                    sql.release_lease
                } else {
                    sql.release
                };
                Self::execute(conn, fenced::<D>(release, lease), OPERATION).await
            }
            Outcome::Failed(failure) => {
                let query = fenced::<D>(sql.fail, lease)
                    .with(i32::try_from(failure.attempts).unwrap_or(i32::MAX))
                    .with(failure.error.clone())
                    .with(duration_ms(failure.retry_in))
                    .with(failure.watermark.0)
                    .with(failure.parked_category.map(|category| category.0));
                Self::execute(conn, query, OPERATION).await
            }
        }
    }

    /// Copies a failing group's rows to the dead letters and acknowledges them, on `conn` (in
    /// a transaction): the rows moved, or [`Error::LeaseLost`].
    async fn dead_letter_on(
        lease: &Lease,
        lease_duration: Duration,
        conn: &mut <D::Database as Database>::Connection,
        letter: &DeadLettering,
    ) -> Result<u64, Error> {
        const OPERATION: &str = "setting a group aside as dead letters";
        let ids = letter.rows.ids.iter().map(|id| id.0).collect();
        let copy = D::bind_ids(fenced::<D>(D::SQL.dead_letter, lease), ids)
            .with(letter.error.clone())
            .with(i32::try_from(letter.attempts).unwrap_or(i32::MAX));
        let copied = Self::execute(conn, copy, OPERATION).await?;
        Self::ack_on(
            lease,
            lease_duration,
            conn,
            std::slice::from_ref(&letter.rows),
        )
        .await?;
        Ok(copied)
    }

    async fn savepoint(&mut self, sql: &'static str, operation: &'static str) -> Result<(), Error> {
        if let Some(claiming) = &mut self.claiming {
            // Boxed: a leased drain takes no savepoint, and need not carry the statement.
            Box::pin(sqlx::query::<D::Database>(sql).execute(D::Database::on(&mut claiming.tx)))
                .await
                .map_err(database::<D>(operation))?;
        }
        Ok(())
    }

    /// Reads the first `limit` rows of the shard's head.
    async fn read_head(&mut self, limit: usize) -> Result<Vec<StoredMessage>, Error> {
        let query = shard_keyed::<D>(D::SQL.fetch, &self.lease.shard)
            .with(i64::try_from(limit).unwrap_or(i64::MAX));
        let mut reader = self.reader().await?;
        let rows = query
            .fetch_all(D::Database::on(reader.conn()))
            .await
            .map_err(database::<D>("reading a shard"))?;
        D::read_head(rows)
    }
}

impl<D: Dialect> ShardSession for SqlxSession<D> {
    fn lease(&self) -> &Lease {
        &self.lease
    }

    async fn fetch(&mut self, limit: usize) -> Result<Vec<StoredMessage>, Error> {
        // The claim's read answers the first fetch if it read as many rows as asked for, or
        // found fewer than it read (every row the shard then had: the first `limit` of them
        // answer). A head that filled a smaller read is not the answer: the rows after it
        // were not read, and a short answer would say there are none.
        if let Some((mut head, read)) = self.head.take()
            && (read == limit || head.len() < read)
        {
            head.truncate(limit);
            return Ok(head);
        }
        // Boxed: most drains are answered by the claim's read, and need not carry the
        // statement's future.
        Box::pin(self.read_head(limit)).await
    }

    async fn fetch_newest(
        &mut self,
        groups: &[GroupKey],
        after: MessageId,
        up_to: MessageId,
    ) -> Result<Vec<GroupTail>, Error> {
        let query = shard_keyed::<D>(D::SQL.fetch_newest, &self.lease.shard);
        let query = D::bind_groups(query, groups).with(after.0).with(up_to.0);
        let mut reader = self.reader().await?;
        let rows = query
            .fetch_all(D::Database::on(reader.conn()))
            .await
            .map_err(database::<D>("reading a shard"))?;
        rows.iter()
            .map(|row| {
                Ok(GroupTail {
                    newest: stored::<D>(row)?,
                    ids: D::decode_ids(row, 6 + D::OBJECT_COLUMNS)?
                        .into_iter()
                        .map(MessageId)
                        .collect(),
                })
            })
            .collect()
    }

    async fn load_model(&mut self, table: &ModelTable, key: Id) -> Result<Option<ModelRow>, Error> {
        const OPERATION: &str = "reading a replicated model";
        let sql = AssertSqlSafe(D::load_model_sql(table, key.as_wide().is_some()));
        let query = with_key(sqlx::query(sql), key);
        let mut reader = self.reader().await?;
        let row = query
            .fetch_optional(D::Database::on(reader.conn()))
            .await
            .map_err(on_table::<D>(OPERATION))?;
        row.map(|row| D::read_model(&row))
            .transpose()
            .map_err(on_table::<D>(OPERATION))
    }

    fn handler_connection(&mut self) -> Option<&mut (dyn Any + Send)> {
        let conn: &mut <D::Database as Database>::Connection = &mut self.claiming.as_mut()?.tx;
        Some(conn)
    }

    async fn before_handler(&mut self) -> Result<(), Error> {
        self.savepoint("SAVEPOINT outbox_handler", "opening a handler savepoint")
            .await
    }

    async fn after_handler(&mut self, succeeded: bool) -> Result<(), Error> {
        if !succeeded {
            self.savepoint(
                "ROLLBACK TO SAVEPOINT outbox_handler",
                "rolling back a failed handler",
            )
            .await?;
        }
        self.savepoint(
            "RELEASE SAVEPOINT outbox_handler",
            "closing a handler savepoint",
        )
        .await
    }

    async fn ack(&mut self, acks: &[Acknowledgement]) -> Result<u64, Error> {
        if let Some(mut claiming) = self.claiming.take() {
            let result =
                Self::ack_on(&self.lease, self.lease_duration, &mut claiming.tx, acks).await;
            self.claiming = Some(claiming);
            return result;
        }
        let mut writer = Writer::open(&self.dialect, &self.pool, "acknowledging messages").await?;
        let deleted = Self::ack_on(&self.lease, self.lease_duration, writer.conn(), acks).await?;
        writer.commit("acknowledging messages").await?;
        Ok(deleted)
    }

    async fn dead_letter(&mut self, letter: &DeadLettering) -> Result<u64, Error> {
        const OPERATION: &str = "setting a group aside as dead letters";
        if let Some(mut claiming) = self.claiming.take() {
            let result =
                Self::dead_letter_on(&self.lease, self.lease_duration, &mut claiming.tx, letter)
                    .await;
            self.claiming = Some(claiming);
            return result;
        }
        // The copy and the delete commit together, or (the lease lost) neither does.
        let mut writer = Writer::begin(&self.dialect, &self.pool, OPERATION).await?;
        let moved =
            Self::dead_letter_on(&self.lease, self.lease_duration, writer.conn(), letter).await?;
        writer.commit(OPERATION).await?;
        Ok(moved)
    }

    async fn ack_and_finish(
        self,
        acks: &[Acknowledgement],
        outcome: Outcome,
    ) -> Result<(u64, bool), Error> {
        const OPERATION: &str = "acknowledging and releasing a shard";
        if self.claiming.is_some() {
            return ack_then_finish(self, acks, outcome).await;
        }
        if let (Some(sql), Outcome::Drained) = (D::SQL.ack_and_release, &outcome) {
            // One round trip for both.
            let mut conn = self
                .pool
                .acquire()
                .await
                .map_err(database::<D>(OPERATION))?;
            return ack_and_release_with::<D>(sql, &self.lease, acks, &mut conn, OPERATION)
                .await
                .and_then(|finished| finished);
        }
        if !D::WRITES_IN_TRANSACTION {
            return ack_then_finish(self, acks, outcome).await;
        }
        // One write transaction for both, instead of two.
        let mut writer = Writer::open(&self.dialect, &self.pool, OPERATION).await?;
        let deleted = Self::ack_on(&self.lease, self.lease_duration, writer.conn(), acks).await?;
        let released = Self::finish_on(&self.lease, writer.conn(), &outcome).await?;
        writer.commit(OPERATION).await?;
        Ok((deleted, released > 0))
    }

    async fn finish(mut self, outcome: Outcome) -> Result<(), Error> {
        const OPERATION: &str = "releasing a shard";
        let updated = match self.claiming.take() {
            // The turn, if any, goes with the transaction.
            Some(mut claiming) => {
                let updated = Self::finish_on(&self.lease, &mut claiming.tx, &outcome).await?;
                claiming
                    .tx
                    .commit()
                    .await
                    .map_err(database::<D>(OPERATION))?;
                updated
            }
            None => {
                let mut writer = Writer::open(&self.dialect, &self.pool, OPERATION).await?;
                let updated = Self::finish_on(&self.lease, writer.conn(), &outcome).await?;
                writer.commit(OPERATION).await?;
                updated
            }
        };
        if updated == 0 {
            return Err(self.lease_lost());
        }
        Ok(())
    }
}

/// Extends each of `leases` by `duration` with
/// [`Statements::extend_lease`](crate::Statements::extend_lease), one statement each in turn on
/// one pooled connection, under the backend's turn: the [`Dialect::extend_leases`] of a
/// backend that does not order its writes.
pub async fn extend_each<D: Dialect>(
    dialect: &D,
    pool: &Pool<D::Database>,
    leases: &[Lease],
    duration: Duration,
) -> Result<Vec<bool>, Error> {
    const OPERATION: &str = "extending leases";
    let _turn = dialect.take_turn().await;
    let mut conn = pool.acquire().await.map_err(database::<D>(OPERATION))?;
    let mut held = Vec::with_capacity(leases.len());
    for lease in leases {
        let query = fenced::<D>(D::SQL.extend_lease, lease).with(duration_ms(duration));
        let done = query
            .execute(D::Database::on(&mut conn))
            .await
            .map_err(database::<D>(OPERATION))?;
        held.push(D::rows_affected(&done) > 0);
    }
    Ok(held)
}

/// [`Dialect::ack_and_release_on`]'s default: each shard's acknowledgement and release in
/// turn, one or two statements each, on `conn`.
pub async fn ack_and_release_each<D: Dialect>(
    conn: &mut <D::Database as Database>::Connection,
    batch: &[Finishing],
) -> Result<Vec<Finished>, Error> {
    const OPERATION: &str = "acknowledging and releasing drained shards";
    let mut finished = Vec::with_capacity(batch.len());
    for (lease, lease_duration, acks) in batch {
        let result = match D::SQL.ack_and_release {
            Some(sql) => ack_and_release_with::<D>(sql, lease, acks, conn, OPERATION).await?,
            None => match SqlxSession::<D>::ack_on(lease, *lease_duration, conn, acks).await {
                Ok(deleted) => {
                    let released =
                        SqlxSession::<D>::finish_on(lease, conn, &Outcome::Drained).await?;
                    Ok((deleted, released > 0))
                }
                Err(lost @ Error::LeaseLost { .. }) => Err(lost),
                Err(error) => return Err(error),
            },
        };
        finished.push(result);
    }
    Ok(finished)
}

/// The one-statement acknowledgement and release `sql` ([`Statements::ack_and_release`]) of
/// `lease`'s `acks`, on `conn`: the rows deleted and whether the release found the lease, or
/// [`Error::LeaseLost`] (nothing changed). The outer error is the statement's.
///
/// [`Statements::ack_and_release`]: crate::Statements::ack_and_release
async fn ack_and_release_with<D: Dialect>(
    sql: &'static str,
    lease: &Lease,
    acks: &[Acknowledgement],
    conn: &mut <D::Database as Database>::Connection,
    operation: &'static str,
) -> Result<Finished, Error> {
    let (ids, lowest, highest) = acknowledged(acks);
    let query = D::bind_ids(fenced::<D>(sql, lease).with(lowest).with(highest), ids);
    let row = query
        .fetch_one(D::Database::on(conn))
        .await
        .map_err(database::<D>(operation))?;
    let column = |index| get::<D::Database, i64>(&row, index).map_err(database::<D>(operation));
    Ok(if column(0)? == 0 {
        Err(lease_lost(lease))
    } else {
        Ok((u64::try_from(column(1)?).unwrap_or(0), column(2)? > 0))
    })
}
