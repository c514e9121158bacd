//! The outbox store on a `sqlx` pool.

use std::time::{Duration, SystemTime};

use outbox_core::backfill::{
    BackfillBatch, BackfillModel, BackfillOptions, BackfillStart, BackfillState,
};
use outbox_core::columns::ModelRow;
use outbox_core::replicated::ModelTable;
use outbox_core::store::Store;
use outbox_core::store::{
    Acknowledgement, Admin, ClaimOptions, DeadLetter, DeadLetterFilter, DiscoveryPage,
    FORGET_RELAYS_AFTER, Heartbeat, Horizon, Lease, MIGRATIONS_TABLE, OutboxStatus, Pause,
    PauseTarget, PendingMessage, RelayInfo, ShardFilter, ShardInfo, ShardList, ShardQuery,
    ShardState, ShardStatus, check_migrations,
};
use outbox_core::{CategoryId, Error, Id, MessageId, ScopeId, ShardKey};
use sqlx::{AssertSqlSafe, Database, Pool, Row};

use crate::dialect::{Claim, Dialect};
use crate::error::{database, on_table};
use crate::session::{SqlxSession, Writer, duration_ms, fenced, shard_keyed};
use crate::sql::{Executes, Statement, With, get};
use crate::wake::SqlxWakeups;

const APPLIED_MIGRATIONS: &str = "SELECT version FROM _outbox_migrations WHERE success";
const NEWEST_MESSAGE: &str = "SELECT max(id) FROM outbox_messages";

/// The outbox store on a database of a `sqlx` backend.
#[derive(Debug)]
pub struct SqlxStore<D: Dialect> {
    pub(crate) pool: Pool<D::Database>,
    pub(crate) dialect: D,
    /// Up to how many pending messages the gauges are counted exactly.
    exact_gauges_up_to: usize,
}

impl<D: Dialect> Clone for SqlxStore<D> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            dialect: self.dialect.clone(),
            exact_gauges_up_to: self.exact_gauges_up_to,
        }
    }
}

/// How many windows of ids a listing of shards samples above the exact backlog.
const SAMPLE_WINDOWS: i64 = 200;
/// How many ids each window spans: [`SAMPLE_WINDOWS`] times this is the most messages read.
const SAMPLE_WIDTH: i64 = 100;

/// Up to how many pending messages a store's gauges are exact, by default.
pub const EXACT_GAUGES_UP_TO: usize = 10_000;

impl<D: Dialect + Default> SqlxStore<D> {
    /// A store on `pool`. Apply the migrations first.
    pub fn new(pool: Pool<D::Database>) -> Self {
        Self::with_dialect(pool, D::default())
    }
}

impl<D: Dialect> SqlxStore<D> {
    /// A store on `pool` with a dialect value of the caller's.
    pub fn with_dialect(pool: Pool<D::Database>, dialect: D) -> Self {
        Self {
            pool,
            dialect,
            exact_gauges_up_to: EXACT_GAUGES_UP_TO,
        }
    }

    /// Counts the gauges ([`Store::gauges`]) exactly while fewer than `limit` messages are
    /// pending ([`EXACT_GAUGES_UP_TO`] by default), and estimates them above: then they read
    /// an index descent per table, the shard states (the shards held, failing or parked) and
    /// one page of due-shard discovery of at most `limit` shards, whatever the backlog.
    /// Pending messages are then PostgreSQL's statistics of live rows (SQLite: the span of
    /// the ids, an upper bound), never below `limit`; shards due are counted up to `limit`;
    /// shards paused are those paused one by one. [`Admin::status`] always counts exactly.
    ///
    /// [`Admin::shard`] counts a shard's messages up to the same limit, and above it
    /// estimates them from how densely its first `limit` messages hold the ids they span.
    /// [`Admin::shards`] ranks every shard below the same limit, and above it ranks them from
    /// a sample of at most 20,000 ids ([`ShardList::sampled`]), each listed shard's messages
    /// counted up to a tenth of `limit` and estimated from the sample beyond.
    #[must_use]
    pub fn exact_gauges_up_to(mut self, limit: usize) -> Self {
        self.exact_gauges_up_to = limit.max(1);
        self
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<D::Database> {
        &self.pool
    }

    /// The session on `claim`.
    fn session(&self, claim: Claim<D>, options: &ClaimOptions) -> SqlxSession<D> {
        SqlxSession::new(
            self.pool.clone(),
            self.dialect.clone(),
            claim.lease,
            options.lease,
            claim.claiming,
        )
        .with_head(claim.head)
    }

    /// Runs `query` on a pooled connection: its rows.
    pub(crate) async fn rows(
        &self,
        query: Statement<'static, D::Database>,
        operation: &'static str,
    ) -> Result<Vec<<D::Database as Database>::Row>, Error> {
        rows_on::<D>(&self.pool, query, operation).await
    }

    /// Runs `query` on a pooled connection, under the backend's turn: the rows it affected.
    pub(crate) async fn write(
        &self,
        query: Statement<'static, D::Database>,
        operation: &'static str,
    ) -> Result<u64, Error> {
        let _turn = self.dialect.take_turn().await;
        self.execute(query, operation).await
    }

    /// Runs `query` on a pooled connection: the rows it affected.
    async fn execute(
        &self,
        query: Statement<'static, D::Database>,
        operation: &'static str,
    ) -> Result<u64, Error> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(database::<D>(operation))?;
        let done = query
            .execute(D::Database::on(&mut conn))
            .await
            .map_err(database::<D>(operation))?;
        Ok(D::rows_affected(&done))
    }

    /// Runs `query` on a pooled connection: the first column of its one row.
    async fn scalar<T>(
        &self,
        query: Statement<'static, D::Database>,
        operation: &'static str,
    ) -> Result<T, Error>
    where
        D::Database: crate::sql::Decodes<T>,
    {
        let rows = self.rows(query, operation).await?;
        get::<D::Database, T>(first_row(&rows, operation)?, 0).map_err(database::<D>(operation))
    }
}

/// The first of `rows`, or the error of a statement that returned none.
fn first_row<'r, R>(rows: &'r [R], operation: &'static str) -> Result<&'r R, Error> {
    rows.first().ok_or_else(|| Error::Database {
        operation,
        source: "the statement returned no row".into(),
    })
}

/// The figures of one row, read while `operation` runs: counts (`i64`) and times (ms since
/// the epoch).
struct Figures<'r, D: Dialect> {
    row: &'r <D::Database as Database>::Row,
    operation: &'static str,
}

impl<D: Dialect> Figures<'_, D> {
    fn number(&self, index: usize) -> Result<u64, Error> {
        get::<D::Database, i64>(self.row, index)
            .map(count)
            .map_err(database::<D>(self.operation))
    }

    fn time(&self, index: usize) -> Result<Option<SystemTime>, Error> {
        get::<D::Database, Option<i64>>(self.row, index)
            .map(|ms| ms.map(from_ms))
            .map_err(database::<D>(self.operation))
    }
}

impl<D: Dialect> SqlxStore<D> {
    /// The oldest holder of the database's cleanup horizon, best effort: a backend that cannot
    /// tell, or a failure (a user the database does not show other sessions to), gives `None`.
    async fn horizon(&self) -> Option<Horizon> {
        const OPERATION: &str = "reading what holds the cleanup horizon";
        if D::SQL.horizon.is_empty() {
            return None;
        }
        let read = async {
            let rows = self.rows(sqlx::query(D::SQL.horizon), OPERATION).await?;
            let Some(row) = rows.first() else {
                return Ok(None);
            };
            let figures = Figures::<D> {
                row,
                operation: OPERATION,
            };
            let holder = get::<D::Database, String>(row, 0).map_err(database::<D>(OPERATION))?;
            let behind = get::<D::Database, Option<i64>>(row, 2)
                .map_err(database::<D>(OPERATION))?
                .map(count);
            Ok::<_, Error>(Some(Horizon::new(holder, figures.time(1)?, behind)))
        };
        read.await.unwrap_or_else(|error| {
            tracing::debug!(error = %outbox_core::error::error_chain(&error), "{OPERATION} failed");
            None
        })
    }
}

pub(crate) fn from_ms(ms: i64) -> SystemTime {
    crate::session::from_micros(ms.saturating_mul(1_000))
}

/// A row of [`Statements::pending_messages`](crate::Statements::pending_messages) (id, the
/// shard's key, category, object, payload, creation time in ms, metadata) as a message.
fn pending_message<D: Dialect>(
    row: &<D::Database as Database>::Row,
) -> Result<PendingMessage, sqlx::Error> {
    let category = 1 + KEY_COLUMNS;
    let payload = category + 1 + D::OBJECT_COLUMNS;
    Ok(PendingMessage::new(
        MessageId(get::<D::Database, _>(row, 0)?),
        D::decode_shard(row, 1)?,
        CategoryId(get::<D::Database, _>(row, category)?),
        D::decode_object(row, category + 1)?,
        get::<D::Database, _>(row, payload)?,
        from_ms(get::<D::Database, _>(row, payload + 1)?),
    )
    .with_metadata(get::<D::Database, _>(row, payload + 2)?))
}

/// `query` with `bound` as its next parameter too, where the dialect takes a bound read as a
/// `LIMIT` again ([`Dialect::LIMITS_BOUND_AGAIN`]).
fn again<D: Dialect>(query: Statement<'_, D::Database>, bound: i64) -> Statement<'_, D::Database> {
    if D::LIMITS_BOUND_AGAIN {
        query.with(bound)
    } else {
        query
    }
}

/// A count as the statements return it.
fn count(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// The ids as the statements bind them.
fn raw_ids(ids: &[MessageId]) -> Vec<i64> {
    ids.iter().map(|id| id.0).collect()
}

/// A pause's target as `outbox_pauses` stores it: kind, then the shard key (scope, identifier,
/// destination as [`Dialect::bind_shard`] stores them) and category, 0 and `''` where the kind
/// does not use them.
fn pause_keyed<D: Dialect>(
    sql: &'static str,
    target: &PauseTarget,
) -> Statement<'static, D::Database> {
    let unused = |scope| ShardKey::local(scope, 0);
    let (kind, shard, category) = match target {
        PauseTarget::Shard(shard) => ("shard", shard.clone(), 0),
        PauseTarget::Scope(scope) => ("scope", unused(*scope), 0),
        PauseTarget::Category(category) => ("category", unused(ScopeId(0)), category.0),
    };
    let query = sqlx::query(sql).with(kind).with(shard.scope.0);
    D::bind_shard(query, &shard).with(category)
}

/// The columns a shard key takes: scope, identifier, destination.
const KEY_COLUMNS: usize = 3;

/// A shard key as the statements return it from column `first` on: a key that does not have
/// the schema's form (written around its checks) is a typed error, never a panic.
fn shard_key<D: Dialect>(
    row: &<D::Database as Database>::Row,
    first: usize,
    operation: &'static str,
) -> Result<ShardKey, Error> {
    D::decode_shard(row, first).map_err(|error| Error::Undecodable {
        operation,
        message_id: None,
        detail: format!("a shard key is not (SMALLINT, identifier, text): {error}"),
    })
}

/// Runs `query` on a connection of `pool`: its rows.
pub async fn rows_on<'q, D: Dialect>(
    pool: &Pool<D::Database>,
    query: Statement<'q, D::Database>,
    operation: &'static str,
) -> Result<Vec<<D::Database as Database>::Row>, Error> {
    let mut conn = pool.acquire().await.map_err(database::<D>(operation))?;
    query
        .fetch_all(D::Database::on(&mut conn))
        .await
        .map_err(database::<D>(operation))
}

/// The scope [`Dialect::discover`] is given for the first page of a sweep: one below every
/// `SMALLINT` scope, so that the page starts at the first shard.
pub const FIRST_PAGE_SCOPE: i32 = -32_769;

/// [`Dialect::discover`] as most backends answer it: the rows of
/// [`Statements::discover`](crate::Statements), read row by row on a pooled connection.
pub async fn discover_rows<D: Dialect>(
    pool: &Pool<D::Database>,
    scope: i32,
    cursor: &ShardKey,
    limit: i32,
) -> Result<Vec<(ShardKey, bool)>, Error> {
    let query = D::bind_shard(sqlx::query(D::SQL.discover).with(scope), cursor).with(limit);
    discovered::<D>(pool, query).await
}

/// The rows of a discovery statement, bound and ready (each a shard's key, then whether it
/// is due), read row by row on a pooled connection.
pub async fn discovered<D: Dialect>(
    pool: &Pool<D::Database>,
    query: Statement<'_, D::Database>,
) -> Result<Vec<(ShardKey, bool)>, Error> {
    const OPERATION: &str = "discovering due shards";
    let rows = rows_on::<D>(pool, query, OPERATION).await?;
    rows.iter()
        .map(|row| {
            let key = shard_key::<D>(row, 0, OPERATION)?;
            let due =
                get::<D::Database, bool>(row, KEY_COLUMNS).map_err(database::<D>(OPERATION))?;
            Ok((key, due))
        })
        .collect()
}

impl<D: Dialect> Store for SqlxStore<D> {
    type Session = SqlxSession<D>;
    type Wakeups = SqlxWakeups<D>;

    async fn check_schema(&self) -> Result<(), Error> {
        const OPERATION: &str = "checking the outbox schema";
        let exists: bool = self
            .scalar(
                sqlx::query(D::SQL.table_exists).with(MIGRATIONS_TABLE),
                OPERATION,
            )
            .await?;
        if !exists {
            return Err(Error::MigrationMissing {
                detail: format!("table `{MIGRATIONS_TABLE}` does not exist"),
            });
        }
        let applied = self
            .rows(sqlx::query(APPLIED_MIGRATIONS), OPERATION)
            .await?
            .iter()
            .map(|row| get::<D::Database, i64>(row, 0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(database::<D>(OPERATION))?;
        check_migrations(&applied, D::MIGRATIONS)?;
        crate::migrate::note_newer_schema::<D>(&applied);
        D::check_schema(&self.pool).await
    }

    async fn discover(
        &self,
        after: Option<&ShardKey>,
        limit: usize,
    ) -> Result<DiscoveryPage, Error> {
        // Below every SMALLINT scope, so the first page starts at the first shard.
        let first = ShardKey::local(ScopeId(0), Id::integer(i64::MIN));
        let (scope, cursor) = match after {
            Some(key) => (i32::from(key.scope.0), key),
            None => (FIRST_PAGE_SCOPE, &first),
        };
        let limit = i32::try_from(limit.max(1)).unwrap_or(i32::MAX);
        let shards = self
            .dialect
            .discover(&self.pool, scope, cursor, limit)
            .await?;
        let full = shards.len() == usize::try_from(limit).unwrap_or(usize::MAX);
        let mut page = DiscoveryPage::default();
        let visited = shards.len();
        for (index, (key, due)) in shards.into_iter().enumerate() {
            if full && index + 1 == visited {
                page.next = Some(key.clone());
            }
            if due {
                page.due.push(key);
            }
        }
        Ok(page)
    }

    async fn load_models(
        &self,
        table: &ModelTable,
        keys: &[Id],
    ) -> Result<Vec<Option<ModelRow>>, Error> {
        const OPERATION: &str = "reading a replicated model";
        let mut answers = vec![None; keys.len()];
        // A model's keys are all of one kind; keys of the other kind find no row either way.
        for wide in [false, true] {
            let (places, of_kind): (Vec<usize>, Vec<Id>) = keys
                .iter()
                .enumerate()
                .filter(|(_, key)| key.as_wide().is_some() == wide)
                .map(|(place, key)| (place, *key))
                .unzip();
            if of_kind.is_empty() {
                continue;
            }
            let sql = AssertSqlSafe(D::load_models_sql(table, wide));
            let query = D::bind_keys(sqlx::query(sql), &of_kind);
            let mut conn = self
                .pool
                .acquire()
                .await
                .map_err(on_table::<D>(OPERATION))?;
            let rows = query
                .fetch_all(D::Database::on(&mut conn))
                .await
                .map_err(on_table::<D>(OPERATION))?;
            for row in &rows {
                let position = get::<D::Database, i64>(row, row.len() - 1)
                    .map_err(on_table::<D>(OPERATION))?;
                let place = usize::try_from(position)
                    .ok()
                    .and_then(|position| places.get(position.checked_sub(1)?))
                    .ok_or_else(|| Error::Undecodable {
                        operation: OPERATION,
                        message_id: None,
                        detail: format!("a row's key position {position} is not among the keys"),
                    })?;
                answers[*place] = Some(D::read_model(row).map_err(on_table::<D>(OPERATION))?);
            }
        }
        Ok(answers)
    }

    async fn claim(
        &self,
        shard: &ShardKey,
        options: &ClaimOptions,
    ) -> Result<Option<SqlxSession<D>>, Error> {
        let claim = self.dialect.claim(&self.pool, shard, options).await?;
        Ok(claim.map(|claim| self.session(claim, options)))
    }

    async fn claim_many(
        &self,
        shards: &[ShardKey],
        options: &ClaimOptions,
        first_read: usize,
    ) -> Result<Vec<SqlxSession<D>>, Error> {
        let claims = (self.dialect)
            .claim_many(&self.pool, shards, options, first_read)
            .await?;
        Ok(claims
            .into_iter()
            .map(|claim| self.session(claim, options))
            .collect())
    }

    async fn wakeups(&self, other_processes: bool) -> Result<Option<SqlxWakeups<D>>, Error> {
        SqlxWakeups::open(&self.pool, other_processes)
            .await
            .map(Some)
    }

    async fn extend_lease(&self, lease: &Lease, duration: Duration) -> Result<bool, Error> {
        let held = (self.dialect)
            .extend_leases(&self.pool, std::slice::from_ref(lease), duration)
            .await?;
        Ok(held.first().copied().unwrap_or(false))
    }

    async fn extend_leases(
        &self,
        leases: &[Lease],
        duration: Duration,
    ) -> Result<Vec<bool>, Error> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        self.dialect
            .extend_leases(&self.pool, leases, duration)
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<bool, Error> {
        let _turn = self.dialect.take_turn().await;
        let query = fenced::<D>(D::SQL.release_interrupted, lease);
        Ok(self.execute(query, "releasing a lease").await? > 0)
    }

    async fn unpark(&self, known: &[CategoryId]) -> Result<u64, Error> {
        let known: Vec<i32> = known.iter().map(|category| category.0).collect();
        let query = D::bind_categories(sqlx::query(D::SQL.unpark), known);
        self.execute(query, "resuming parked shards").await
    }

    async fn newest_message_id(&self) -> Result<Option<MessageId>, Error> {
        let newest: Option<i64> = self
            .scalar(sqlx::query(NEWEST_MESSAGE), "reading the newest message id")
            .await?;
        Ok(newest.map(MessageId))
    }

    async fn pending_in_shard(&self, shard: &ShardKey, up_to: MessageId) -> Result<u64, Error> {
        let query = shard_keyed::<D>(D::SQL.pending_in_shard, shard).with(up_to.0);
        let count: i64 = self
            .scalar(query, "counting a shard's pending messages")
            .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn oldest_due_age(&self) -> Result<Option<Duration>, Error> {
        const OPERATION: &str = "reading the oldest due message";
        let rows = self
            .rows(sqlx::query(D::SQL.oldest_due_age), OPERATION)
            .await?;
        rows.first()
            .map(|row| get::<D::Database, i64>(row, 0))
            .transpose()
            .map(|ms| ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
            .map_err(database::<D>(OPERATION))
    }

    async fn gauges(&self) -> Result<OutboxStatus, Error> {
        const OPERATION: &str = "reading the gauges";
        let limit = i64::try_from(self.exact_gauges_up_to).unwrap_or(i64::MAX);
        let counted: i64 = self
            .scalar(sqlx::query(D::SQL.backfill.backlog).with(limit), OPERATION)
            .await?;
        if counted < limit {
            // The view reads fewer rows than the limit: exact, at a bounded cost.
            return Admin::status(self, 0).await;
        }
        let gauges = again::<D>(sqlx::query(D::SQL.gauges).with(limit), limit);
        let rows = self.rows(gauges, OPERATION).await?;
        let row = Figures::<D> {
            row: first_row(&rows, OPERATION)?,
            operation: OPERATION,
        };
        let mut status = OutboxStatus::default();
        status.estimated = true;
        status.pending_messages = row.number(0)?;
        status.oldest_pending_at = row.time(1)?;
        status.shards_in_flight = row.number(2)?;
        status.shards_in_backoff = row.number(3)?;
        status.shards_parked = row.number(4)?;
        status.shards_paused = row.number(5)?;
        status.dead_letters = row.number(6)?;
        status.oldest_dead_letter_at = row.time(7)?;
        let discovered = self
            .discover(None, self.exact_gauges_up_to.min(i32::MAX as usize))
            .await?;
        status.shards_due = discovered.due.len() as u64;
        status.shards = status.shards_due
            + status.shards_in_flight
            + status.shards_in_backoff
            + status.shards_parked
            + status.shards_paused;
        status.horizon = self.horizon().await;
        Ok(status)
    }

    async fn is_paused(&self, shard: &ShardKey) -> Result<bool, Error> {
        let query = shard_keyed::<D>(D::SQL.is_paused, shard);
        self.scalar(query, "reading a shard's pauses").await
    }

    async fn compact_paused(&self, coalescing: &[CategoryId], limit: usize) -> Result<u64, Error> {
        let categories = coalescing.iter().map(|category| category.0).collect();
        let query = D::bind_categories(sqlx::query(D::SQL.compact_paused), categories)
            .with(i64::try_from(limit).unwrap_or(i64::MAX));
        self.write(query, "compacting paused shards").await
    }

    async fn backfill(
        &self,
        model: &BackfillModel,
        options: &BackfillOptions,
    ) -> Result<BackfillBatch, Error> {
        self.backfill_tick(model, options).await
    }

    async fn purge_dead_letters_older_than(
        &self,
        age: Duration,
        limit: usize,
    ) -> Result<u64, Error> {
        let query = sqlx::query(D::SQL.purge_expired_dead_letters)
            .with(duration_ms(age))
            .with(i64::try_from(limit).unwrap_or(i64::MAX));
        self.write(query, "purging expired dead letters").await
    }

    async fn ack_and_finish_many(
        &self,
        finishing: Vec<(SqlxSession<D>, Vec<Acknowledgement>)>,
    ) -> Vec<Result<(u64, bool), Error>> {
        SqlxSession::ack_and_finish_together(&self.pool, &self.dialect, finishing).await
    }

    async fn beat(&self, heartbeat: &Heartbeat) -> Result<(), Error> {
        const OPERATION: &str = "recording the relay's heartbeat";
        let started_ms = heartbeat
            .started_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, duration_ms);
        // A list of strings always serialises.
        let breakers =
            serde_json::to_string(&heartbeat.open_breakers).unwrap_or_else(|_| "[]".to_owned());
        let query = sqlx::query(D::SQL.relays.beat)
            .with(heartbeat.worker.clone())
            .with(started_ms)
            .with(duration_ms(heartbeat.expires_in))
            .with(i64::try_from(heartbeat.shards_in_flight).unwrap_or(i64::MAX))
            .with(i64::try_from(heartbeat.shards_waiting).unwrap_or(i64::MAX))
            .with(breakers);
        self.write(query, OPERATION).await?;
        let forget = sqlx::query(D::SQL.relays.forget).with(duration_ms(FORGET_RELAYS_AFTER));
        self.write(forget, OPERATION).await?;
        Ok(())
    }

    async fn leave(&self, worker: &str) -> Result<(), Error> {
        let query = sqlx::query(D::SQL.relays.leave).with(worker.to_owned());
        self.write(query, "deleting the relay's heartbeat")
            .await
            .map(drop)
    }
}

/// A shard as [`Statements::shards`](crate::Statements::shards) returns it, its columns from
/// `at` on.
fn shard_info<D: Dialect>(
    row: &<D::Database as Database>::Row,
    at: usize,
) -> Result<ShardInfo, sqlx::Error> {
    let column = |index: usize| at + KEY_COLUMNS + index;
    let time =
        |index| get::<D::Database, Option<i64>>(row, column(index)).map(|ms| ms.map(from_ms));
    let label: String = get::<D::Database, _>(row, column(8))?;
    let status = ShardStatus::from_label(&label)
        .ok_or_else(|| sqlx::Error::Decode(format!("{label:?} is not a shard status").into()))?;
    Ok(ShardInfo::new(
        D::decode_shard(row, at)?,
        count(get::<D::Database, i64>(row, column(0))?),
        time(1)?,
        u32::try_from(get::<D::Database, i64>(row, column(2))?).unwrap_or(u32::MAX),
        get::<D::Database, _>(row, column(3))?,
        time(4)?,
        get::<D::Database, Option<i32>>(row, column(5))?.map(CategoryId),
        get::<D::Database, _>(row, column(6))?,
        get::<D::Database, bool>(row, column(7))?,
        status,
    )
    .with_pending_estimated(get::<D::Database, bool>(row, column(9))?))
}

/// The shards of rows whose figures come first and whose shard, left-joined to them, starts
/// at column `at`: one per row, none if there is none (one row whose shard is all `NULL`).
fn shards_joined<D: Dialect>(
    rows: &[<D::Database as Database>::Row],
    at: usize,
) -> Result<Vec<ShardInfo>, sqlx::Error> {
    let mut shards = Vec::new();
    for row in rows {
        let pending: Option<i64> = get::<D::Database, _>(row, at + KEY_COLUMNS)?;
        if pending.is_some() {
            shards.push(shard_info::<D>(row, at)?);
        }
    }
    Ok(shards)
}

impl<D: Dialect> Admin for SqlxStore<D> {
    async fn reschedule(&self, shard: &ShardKey) -> Result<bool, Error> {
        let query = shard_keyed::<D>(D::SQL.reschedule, shard);
        Ok(self.execute(query, "rescheduling a shard").await? > 0)
    }

    async fn pending_messages(&self, limit: usize) -> Result<Vec<PendingMessage>, Error> {
        const OPERATION: &str = "listing pending messages";
        let query =
            sqlx::query(D::SQL.pending_messages).with(i64::try_from(limit).unwrap_or(i64::MAX));
        let rows = self.rows(query, OPERATION).await?;
        rows.iter()
            .map(|row| pending_message::<D>(row).map_err(database::<D>(OPERATION)))
            .collect()
    }

    async fn shard_states(&self) -> Result<Vec<ShardState>, Error> {
        const OPERATION: &str = "listing shard states";
        let rows = self
            .rows(sqlx::query(D::SQL.shard_states), OPERATION)
            .await?;
        let state = |row: &<D::Database as Database>::Row| -> Result<ShardState, sqlx::Error> {
            // The columns after the key, counted from the key's end.
            let at = |index: usize| KEY_COLUMNS + index;
            let time =
                |index| get::<D::Database, Option<i64>>(row, at(index)).map(|ms| ms.map(from_ms));
            Ok(ShardState::new(
                D::decode_shard(row, 0)?,
                u32::try_from(get::<D::Database, i64>(row, at(0))?).unwrap_or(u32::MAX),
                get::<D::Database, _>(row, at(1))?,
                time(2)?,
                get::<D::Database, _>(row, at(3))?,
                time(4)?,
                get::<D::Database, _>(row, at(5))?,
                get::<D::Database, Option<i32>>(row, at(6))?.map(CategoryId),
            ))
        };
        rows.iter()
            .map(|row| state(row).map_err(database::<D>(OPERATION)))
            .collect()
    }

    async fn status(&self, deepest: usize) -> Result<OutboxStatus, Error> {
        const OPERATION: &str = "reading the outbox's status";
        let query = sqlx::query(D::SQL.status).with(i64::try_from(deepest).unwrap_or(i64::MAX));
        let rows = self.rows(query, OPERATION).await?;
        let row = Figures::<D> {
            row: first_row(&rows, OPERATION)?,
            operation: OPERATION,
        };
        let mut status = OutboxStatus::default();
        status.shards = row.number(0)?;
        status.pending_messages = row.number(1)?;
        status.oldest_pending_at = row.time(2)?;
        status.shards_due = row.number(3)?;
        status.shards_in_flight = row.number(4)?;
        status.shards_in_backoff = row.number(5)?;
        status.shards_parked = row.number(6)?;
        status.shards_paused = row.number(7)?;
        status.dead_letters = row.number(8)?;
        status.oldest_dead_letter_at = row.time(9)?;
        // The deepest shards, on the same rows.
        status.deepest = shards_joined::<D>(&rows, 10).map_err(database::<D>(OPERATION))?;
        status.horizon = self.horizon().await;
        Ok(status)
    }

    async fn shard(&self, shard: &ShardKey) -> Result<Option<ShardInfo>, Error> {
        const OPERATION: &str = "reading a shard";
        let counted = i64::try_from(self.exact_gauges_up_to).unwrap_or(i64::MAX);
        let rows = self
            .rows(
                shard_keyed::<D>(D::SQL.shard, shard).with(counted),
                OPERATION,
            )
            .await?;
        rows.first()
            .map(|row| shard_info::<D>(row, 0))
            .transpose()
            .map_err(database::<D>(OPERATION))
    }

    async fn shards(&self, query: &ShardQuery) -> Result<ShardList, Error> {
        const OPERATION: &str = "listing shards";
        let which = match query.filter {
            ShardFilter::Pending => "pending",
            ShardFilter::Failing => "failing",
            ShardFilter::Paused => "paused",
            ShardFilter::Parked => "parked",
        };
        let exact = i64::try_from(self.exact_gauges_up_to).unwrap_or(i64::MAX);
        let ranked = match query.filter {
            // Found from their few state rows, whatever the backlog.
            ShardFilter::Failing | ShardFilter::Parked => Some(D::SQL.failing_shards),
            ShardFilter::Pending | ShardFilter::Paused => {
                let counted: i64 = self
                    .scalar(sqlx::query(D::SQL.backfill.backlog).with(exact), OPERATION)
                    .await?;
                (counted < exact).then_some(D::SQL.shards)
            }
        };
        let query_of = |sql| {
            sqlx::query(sql)
                .with(which)
                .with(i64::try_from(query.limit).unwrap_or(i64::MAX))
                .with(query.scope.map(|scope| i32::from(scope.0)))
                .with(query.category.map(|category| category.0))
        };
        if let Some(sql) = ranked {
            let rows = self.rows(query_of(sql), OPERATION).await?;
            let shards = rows
                .iter()
                .map(|row| shard_info::<D>(row, 0).map_err(database::<D>(OPERATION)))
                .collect::<Result<_, _>>()?;
            return Ok(ShardList::ranked(shards));
        }
        let cap = (exact / 10).max(1);
        let sampled = query_of(D::SQL.sampled_shards)
            .with(SAMPLE_WINDOWS)
            .with(SAMPLE_WIDTH)
            .with(cap);
        let sampled = again::<D>(sampled, cap);
        let rows = self.rows(sampled, OPERATION).await?;
        let messages = count(
            get::<D::Database, i64>(first_row(&rows, OPERATION)?, 0)
                .map_err(database::<D>(OPERATION))?,
        );
        let shards = shards_joined::<D>(&rows, 1).map_err(database::<D>(OPERATION))?;
        Ok(ShardList::sampled(shards, messages))
    }

    async fn shard_messages(
        &self,
        shard: &ShardKey,
        limit: usize,
    ) -> Result<Vec<PendingMessage>, Error> {
        const OPERATION: &str = "listing a shard's messages";
        let query = shard_keyed::<D>(D::SQL.shard_messages, shard)
            .with(i64::try_from(limit).unwrap_or(i64::MAX));
        let rows = self.rows(query, OPERATION).await?;
        rows.iter()
            .map(|row| pending_message::<D>(row).map_err(database::<D>(OPERATION)))
            .collect()
    }

    async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>, Error> {
        const OPERATION: &str = "listing dead letters";
        let no_shard = ShardKey::local(ScopeId(0), 0);
        let query = sqlx::query(D::SQL.dead_letters)
            .with(filter.category.map(|category| category.0))
            .with(filter.scope.map(|scope| i32::from(scope.0)))
            .with(filter.shard.as_ref().map(|shard| i32::from(shard.scope.0)));
        let query = D::bind_shard(query, filter.shard.as_ref().unwrap_or(&no_shard))
            .with(filter.older_than.map(duration_ms))
            .with(
                filter
                    .limit
                    .map_or(i64::MAX, |limit| i64::try_from(limit).unwrap_or(i64::MAX)),
            )
            .with(i32::from(filter.ids.is_some()));
        let ids = raw_ids(filter.ids.as_deref().unwrap_or_default());
        // The range of the ids asked for, so that the primary key narrows the read to it.
        let (low, high) = match (ids.iter().min(), ids.iter().max()) {
            (Some(low), Some(high)) => (*low, *high),
            _ => (i64::MIN, i64::MAX),
        };
        let query = D::bind_ids(query, ids).with(low).with(high);
        let rows = self.rows(query, OPERATION).await?;
        let letter = |row: &<D::Database as Database>::Row| -> Result<DeadLetter, sqlx::Error> {
            let category = 1 + KEY_COLUMNS;
            let payload = category + 1 + D::OBJECT_COLUMNS;
            let time = |index| get::<D::Database, i64>(row, index).map(from_ms);
            let message = PendingMessage::new(
                MessageId(get::<D::Database, _>(row, 0)?),
                D::decode_shard(row, 1)?,
                CategoryId(get::<D::Database, _>(row, category)?),
                D::decode_object(row, category + 1)?,
                get::<D::Database, _>(row, payload)?,
                time(payload + 1)?,
            )
            .with_metadata(get::<D::Database, _>(row, payload + 7)?);
            Ok(DeadLetter::new(
                message,
                get::<D::Database, _>(row, payload + 2)?,
                u32::try_from(get::<D::Database, i64>(row, payload + 3)?).unwrap_or(u32::MAX),
                time(payload + 4)?,
                time(payload + 5)?,
                get::<D::Database, _>(row, payload + 6)?,
            ))
        };
        rows.iter()
            .map(|row| letter(row).map_err(database::<D>(OPERATION)))
            .collect()
    }

    async fn replay_dead_letters(&self, ids: &[MessageId]) -> Result<Vec<MessageId>, Error> {
        const OPERATION: &str = "replaying dead letters";
        let mut wanted = raw_ids(ids);
        wanted.sort_unstable();
        wanted.dedup();
        let mut writer = Writer::begin(&self.dialect, &self.pool, OPERATION).await?;
        // Locked first: a replay running beside this one finds them gone, and replays nothing.
        let found = D::bind_ids(sqlx::query(D::SQL.lock_dead_letters), wanted.clone())
            .fetch_all(D::Database::on(writer.conn()))
            .await
            .map_err(database::<D>(OPERATION))?
            .iter()
            .map(|row| get::<D::Database, i64>(row, 0))
            .collect::<Result<Vec<i64>, _>>()
            .map_err(database::<D>(OPERATION))?;
        let missing: Vec<MessageId> = wanted
            .iter()
            .filter(|id| !found.contains(id))
            .map(|id| MessageId(*id))
            .collect();
        if !missing.is_empty() {
            return Err(Error::NoSuchDeadLetter { ids: missing });
        }
        let mut replayed = D::bind_ids(sqlx::query(D::SQL.replay_dead_letters), wanted.clone())
            .fetch_all(D::Database::on(writer.conn()))
            .await
            .map_err(database::<D>(OPERATION))?
            .iter()
            .map(|row| get::<D::Database, i64>(row, 0).map(MessageId))
            .collect::<Result<Vec<_>, _>>()
            .map_err(database::<D>(OPERATION))?;
        replayed.sort_unstable();
        D::bind_ids(sqlx::query(D::SQL.purge_dead_letters), wanted)
            .execute(D::Database::on(writer.conn()))
            .await
            .map_err(database::<D>(OPERATION))?;
        writer.commit(OPERATION).await?;
        crate::wake::committed::<D>(Some(&self.pool), &[]);
        Ok(replayed)
    }

    async fn set_aside(&self, id: MessageId, reason: &str) -> Result<DeadLetter, Error> {
        const OPERATION: &str = "setting a message aside";
        let sql = &D::SQL.set_aside;
        let mut writer = Writer::begin(&self.dialect, &self.pool, OPERATION).await?;
        let found = sqlx::query(sql.lock_message)
            .with(id.0)
            .fetch_optional(D::Database::on(writer.conn()))
            .await
            .map_err(database::<D>(OPERATION))?;
        let Some(row) = found else {
            return Err(Error::NoSuchMessage { id });
        };
        let shard = D::decode_shard(&row, 0).map_err(database::<D>(OPERATION))?;
        shard_keyed::<D>(sql.ensure_shard, &shard)
            .execute(D::Database::on(writer.conn()))
            .await
            .map_err(database::<D>(OPERATION))?;
        // Held by a transaction (SKIP LOCKED found no row), or by a live lease.
        let holder = shard_keyed::<D>(sql.lock_shard, &shard)
            .fetch_optional(D::Database::on(writer.conn()))
            .await
            .map_err(database::<D>(OPERATION))?;
        let owner: Option<Option<String>> = match &holder {
            None => Some(None),
            Some(row) => get::<D::Database, Option<String>>(row, 0)
                .map_err(database::<D>(OPERATION))?
                .map(|owner| Some(owner).filter(|owner| !owner.is_empty())),
        };
        if let Some(owner) = owner {
            return Err(Error::ShardHeld { shard, owner });
        }
        // Copied with the shard's attempts before a head's failures are cleared.
        let copy = shard_keyed::<D>(sql.copy, &shard)
            .with(id.0)
            .with(reason.to_owned());
        let clear = shard_keyed::<D>(sql.clear_failures, &shard).with(id.0);
        let delete = sqlx::query(sql.delete).with(id.0);
        for query in [copy, clear, delete] {
            query
                .execute(D::Database::on(writer.conn()))
                .await
                .map_err(database::<D>(OPERATION))?;
        }
        writer.commit(OPERATION).await?;
        crate::wake::committed::<D>(Some(&self.pool), std::slice::from_ref(&shard));
        let letters = self
            .dead_letters(&DeadLetterFilter::all().ids(vec![id]))
            .await?;
        letters.into_iter().next().ok_or_else(|| Error::Database {
            operation: OPERATION,
            source: "the dead letter was not found after its commit".into(),
        })
    }

    async fn purge_dead_letters(&self, ids: &[MessageId]) -> Result<u64, Error> {
        let query = D::bind_ids(sqlx::query(D::SQL.purge_dead_letters), raw_ids(ids));
        self.write(query, "purging dead letters").await
    }

    async fn pause(&self, target: &PauseTarget, reason: Option<&str>) -> Result<bool, Error> {
        let query = pause_keyed::<D>(D::SQL.pause, target).with(reason.map(str::to_owned));
        Ok(self.write(query, "pausing").await? > 0)
    }

    async fn resume(&self, target: &PauseTarget) -> Result<bool, Error> {
        let query = pause_keyed::<D>(D::SQL.resume, target);
        Ok(self.write(query, "resuming").await? > 0)
    }

    async fn pauses(&self) -> Result<Vec<Pause>, Error> {
        const OPERATION: &str = "listing pauses";
        let rows = self.rows(sqlx::query(D::SQL.pauses), OPERATION).await?;
        let pause = |row: &<D::Database as Database>::Row| -> Result<Pause, sqlx::Error> {
            let kind: String = get::<D::Database, _>(row, 0)?;
            let shard = D::decode_shard(row, 1)?;
            let category = CategoryId(get::<D::Database, _>(row, 1 + KEY_COLUMNS)?);
            let target = match kind.as_str() {
                "shard" => PauseTarget::Shard(shard),
                "scope" => PauseTarget::Scope(shard.scope),
                "category" => PauseTarget::Category(category),
                other => {
                    return Err(sqlx::Error::Decode(
                        format!("{other:?} is not a kind of pause").into(),
                    ));
                }
            };
            Ok(Pause::new(
                target,
                get::<D::Database, _>(row, 2 + KEY_COLUMNS)?,
                from_ms(get::<D::Database, _>(row, 3 + KEY_COLUMNS)?),
            ))
        };
        rows.iter()
            .map(|row| pause(row).map_err(database::<D>(OPERATION)))
            .collect()
    }

    async fn backfills(&self) -> Result<Vec<BackfillState>, Error> {
        self.backfill_states().await
    }

    async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        const OPERATION: &str = "listing the relays";
        let query = sqlx::query(D::SQL.relays.list).with(duration_ms(FORGET_RELAYS_AFTER));
        let rows = self.rows(query, OPERATION).await?;
        let relay = |row: &<D::Database as Database>::Row| -> Result<RelayInfo, sqlx::Error> {
            let count = |index| {
                get::<D::Database, i64>(row, index).map(|count| u64::try_from(count).unwrap_or(0))
            };
            let breakers: String = get::<D::Database, _>(row, 6)?;
            let breakers: Vec<String> = serde_json::from_str(&breakers)
                .map_err(|error| sqlx::Error::Decode(Box::new(error)))?;
            let stands = get::<D::Database, i64>(row, 3)?;
            let heartbeat = Heartbeat::new(
                get::<D::Database, String>(row, 0)?,
                from_ms(get::<D::Database, _>(row, 1)?),
                Duration::from_millis(u64::try_from(stands).unwrap_or(0)),
            )
            .with_shards(count(4)?, count(5)?, breakers);
            let seen = from_ms(get::<D::Database, _>(row, 2)?);
            Ok(RelayInfo::new(
                heartbeat,
                seen,
                get::<D::Database, bool>(row, 7)?,
            ))
        };
        rows.iter()
            .map(|row| relay(row).map_err(database::<D>(OPERATION)))
            .collect()
    }

    async fn start_backfill(&self, start: &BackfillStart) -> Result<BackfillState, Error> {
        self.begin_backfill(start).await
    }

    async fn pause_backfill(&self, category: CategoryId) -> Result<bool, Error> {
        self.halt_backfill(category).await
    }
}

/// A `sqlx` store opened by an operator's tool: its operations, and its migrations run on its
/// pool.
impl<D: Dialect> outbox_core::admin::Database for SqlxStore<D> {
    fn applied_migrations(&self) -> outbox_core::handler::BoxFuture<'_, Result<Vec<i64>, Error>> {
        Box::pin(crate::migrate::applied::<D>(&self.pool))
    }

    fn migrate(&self) -> outbox_core::handler::BoxFuture<'_, Result<(), Error>> {
        Box::pin(crate::migrate::migrate::<D>(&self.pool))
    }

    fn close(&self) -> outbox_core::handler::BoxFuture<'_, ()> {
        Box::pin(self.pool.close())
    }

    fn inbox(&self) -> Option<&dyn outbox_core::inbox::InboxDatabase> {
        Some(self)
    }
}
