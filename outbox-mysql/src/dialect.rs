//! MariaDB's dialect of the shared body: its SQL, its claims (`FOR UPDATE SKIP LOCKED` on the
//! shard's state row, then the lease), its error codes. MariaDB has no notifications: relays
//! poll.

use outbox_core::columns::ModelRow;
use outbox_core::replicated::ModelTable;
use outbox_core::store::{
    ClaimOptions, EmbeddedMigration, GroupKey, HandlerMode, Lease, NoWakeups, StoredMessage,
};
use outbox_core::{Error, Id, Message, ShardKey};
use outbox_sqlx::dialect::{Finished, Finishing};
use outbox_sqlx::error::database;
use outbox_sqlx::sql::Statement;
use outbox_sqlx::stored::{shard_from_stored, stored_object, stored_shard};
use outbox_sqlx::{Ack, Claim, Claiming, Dialect, Fault, Statements, Write};
use sqlx::error::DatabaseError;
use sqlx::mysql::{MySqlQueryResult, MySqlRow, MySqlTypeInfo};
use sqlx::{AssertSqlSafe, Connection, MySql, MySqlConnection, MySqlPool, Row};
use std::collections::{HashMap, HashSet};

use crate::code::{self, number};

use crate::admin::*;
use crate::relay::*;

/// MariaDB (10.6 and later), for the shared body of the `sqlx` backends.
///
/// The relay's transactions run at `READ COMMITTED` ([`Dialect::BEGIN`]): a claim locks only
/// the state row it finds, never a gap of the index, and each statement reads what is
/// committed when it runs.
///
/// A store's dialect keeps when it last rebuilt the outbox's tables to give back the space a
/// long transaction left (see `space`): its clones share it.
#[derive(Debug, Clone, Default)]
pub struct MySqlDialect {
    space: crate::space::Space,
}

/// The embedded migrations, in order.
pub(crate) const MIGRATIONS: &[EmbeddedMigration] = &[EmbeddedMigration {
    version: 1,
    description: "outbox tables",
    sql: include_str!("../migrations/0001_outbox.sql"),
}];

/// The keys of `shards` as the JSON array the batched claim's statements take, each
/// `[scope, identifier, destination]` followed by `extra(i)`'s values. Written straight into
/// the text: a claim or a finish makes one per batch of hundreds of shards.
fn shard_list<const N: usize>(shards: &[&ShardKey], extra: impl Fn(usize) -> [i64; N]) -> String {
    use std::fmt::Write as _;
    let mut list = String::with_capacity(2 + shards.len() * (24 + 21 * N));
    list.push('[');
    for (at, shard) in shards.iter().enumerate() {
        if at > 0 {
            list.push(',');
        }
        let (identifier, destination) = stored_shard(shard);
        // Writing to a `String` cannot fail; the destination is quoted and escaped by
        // `serde_json` (a wide shard's starts with a control character).
        let destination = serde_json::Value::String(destination);
        let _ = write!(list, "[{},{identifier},{destination}", shard.scope.0);
        for value in extra(at) {
            let _ = write!(list, ",{value}");
        }
        list.push(']');
    }
    list.push(']');
    list
}

/// The lease of `options` in milliseconds, as the claim statements take it.
fn lease_ms(options: &ClaimOptions) -> i64 {
    i64::try_from(options.lease.as_millis()).unwrap_or(i64::MAX)
}

/// The index in a list of `len` of the place `n` (from 1) that a statement over a JSON list
/// (`k.n`) answers with; `None` if it is not one of them.
fn place(n: i64, len: usize) -> Option<usize> {
    usize::try_from(n - 1).ok().filter(|&at| at < len)
}

/// A row of `LOCK_STATES`: the key's place in the list (from 1), the state row's lease
/// owner, whether its lease lapsed, whether the shard is due and free, a token, the attempts.
type Locked = (i64, Option<String>, bool, bool, i64, i64);

/// Claims those of `shards` that are due and free on `tx` (a transaction at `READ
/// COMMITTED`), in one to three statements however many they are: the state rows of the
/// shards that have none, created with their leases (`CREATE_LEASES`), then of the others the
/// state rows locked (`LOCK_STATES`, skipping those another transaction holds) and the due
/// ones leased (`TAKE_LEASES`). Creating first makes the claim of new shards (most shards,
/// where each holds a message or two) one statement. If another transaction is creating one
/// of those rows, the shards are created one at a time, so that that shard alone is left to
/// the other claim. A shard asked for twice is claimed once.
async fn claim_on(
    tx: &mut MySqlConnection,
    shards: &[ShardKey],
    options: &ClaimOptions,
) -> Result<Vec<Lease>, Error> {
    let mut seen = HashSet::new();
    let shards: Vec<&ShardKey> = shards.iter().filter(|shard| seen.insert(*shard)).collect();
    let mut leases = match create_leases(tx, &shards, options).await? {
        Some(created) => created,
        None => {
            let mut created = Vec::new();
            for shard in &shards {
                let one = create_leases(tx, std::slice::from_ref(shard), options).await?;
                created.extend(one.unwrap_or_default());
            }
            created
        }
    };
    // The shards not created: those with a state row (or paused).
    let others: Vec<&ShardKey> = {
        let made: HashSet<&ShardKey> = leases.iter().map(|lease| &lease.shard).collect();
        shards
            .into_iter()
            .filter(|shard| !made.contains(shard))
            .collect()
    };
    if !others.is_empty() {
        leases.extend(lock_and_lease(tx, &others, options).await?);
    }
    Ok(leases)
}

/// A claim's steps for shards with a state row (`LOCK_STATES`, `TAKE_LEASES`): the leases of
/// those of `shards` whose state row it locked and found due.
async fn lock_and_lease(
    tx: &mut MySqlConnection,
    shards: &[&ShardKey],
    options: &ClaimOptions,
) -> Result<Vec<Lease>, Error> {
    let failed = || database::<MySqlDialect>("claiming shards");
    let locked: Vec<Locked> = sqlx::query_as(LOCK_STATES)
        .bind(shard_list(shards, |_| []))
        .fetch_all(&mut *tx)
        .await
        .map_err(failed())?;
    let mut leases = Vec::new();
    let mut lapsed_at = Vec::new();
    for (n, owner, lapsed, due, token, attempts) in locked {
        let Some(at) = place(n, shards.len()) else {
            continue;
        };
        if due {
            lapsed_at.push(lapsed);
            leases.push(Lease {
                shard: shards[at].clone(),
                token,
                attempts: u32::try_from(attempts + i64::from(lapsed)).unwrap_or(u32::MAX),
                previous_owner: owner.filter(|_| lapsed),
            });
        }
    }
    if !leases.is_empty() {
        let keys: Vec<&ShardKey> = leases.iter().map(|lease| &lease.shard).collect();
        let list = shard_list(&keys, |at| [leases[at].token, i64::from(lapsed_at[at])]);
        sqlx::query(TAKE_LEASES)
            .bind(list)
            .bind(&options.worker)
            .bind(lease_ms(options))
            .execute(&mut *tx)
            .await
            .map_err(failed())?;
    }
    Ok(leases)
}

/// A claim's first step (`CREATE_LEASES`): the state rows of those of `shards` that have
/// none, with their leases (none for a paused shard); `None` if another transaction is
/// creating one of them (the statement changed nothing).
async fn create_leases(
    tx: &mut MySqlConnection,
    shards: &[&ShardKey],
    options: &ClaimOptions,
) -> Result<Option<Vec<Lease>>, Error> {
    let failed = || database::<MySqlDialect>("claiming shards");
    if shards.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let created = sqlx::query(CREATE_LEASES)
        .bind(shard_list(shards, |_| []))
        .bind(&options.worker)
        .bind(lease_ms(options))
        .fetch_all(&mut *tx)
        .await;
    match created {
        Ok(rows) => rows
            .iter()
            .map(|row| {
                Ok(Lease {
                    shard: MySqlDialect::decode_shard(row, 0)?,
                    token: row.try_get(3)?,
                    attempts: u32::try_from(row.try_get::<i64, _>(4)?).unwrap_or(u32::MAX),
                    previous_owner: None,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map(Some)
            .map_err(failed()),
        // The row exists and another transaction holds it, or another claim created it first.
        Err(sqlx::Error::Database(error))
            if matches!(
                number(error.as_ref()),
                Some(code::DUPLICATE | code::LOCK_WAIT_TIMEOUT)
            ) =>
        {
            Ok(None)
        }
        Err(error) => Err(failed()(error)),
    }
}

/// The rows of each claimed shard of `leases` that has at most `first_read` (its head, as
/// [`Claim::head`] holds it), in one statement however many they are (`HEADS`). A shard with
/// more rows has no head: its session's first fetch reads it, and that read is one of many
/// that drain it. Nor has a shard whose rows do not decode: its session's first fetch reads
/// it again, and meets the row where the relay handles it.
async fn read_heads(
    conn: &mut MySqlConnection,
    leases: &[Lease],
    first_read: usize,
) -> Result<Vec<Option<(Vec<StoredMessage>, usize)>>, Error> {
    let failed = || database::<MySqlDialect>("reading the heads of claimed shards");
    if first_read == 0 || leases.is_empty() {
        return Ok(leases.iter().map(|_| None).collect());
    }
    let keys: Vec<&ShardKey> = leases.iter().map(|lease| &lease.shard).collect();
    let rows = sqlx::query(HEADS)
        .bind(shard_list(&keys, |_| []))
        .bind(i64::try_from(first_read).unwrap_or(i64::MAX))
        .fetch_all(&mut *conn)
        .await
        .map_err(failed())?;
    // No row: a shard with more rows than `first_read`. A row with no message: an empty
    // shard.
    let mut heads: Vec<Option<Vec<StoredMessage>>> = vec![None; leases.len()];
    let mut undecodable = vec![false; leases.len()];
    for row in &rows {
        let Some(at) = place(row.try_get(HEADS_PLACE).map_err(failed())?, leases.len()) else {
            continue;
        };
        let head = heads[at].get_or_insert_with(Vec::new);
        if row
            .try_get::<Option<i64>, _>(0)
            .map_err(failed())?
            .is_none()
        {
            continue;
        }
        match outbox_sqlx::session::stored::<MySqlDialect>(row) {
            Ok(message) => head.push(message),
            Err(_) => undecodable[at] = true,
        }
    }
    Ok(heads
        .into_iter()
        .zip(undecodable)
        .map(|(head, undecodable)| {
            let mut head = head.filter(|_| !undecodable)?;
            head.sort_by_key(|message| message.id);
            head.truncate(first_read);
            Some((head, first_read))
        })
        .collect())
}

/// The most shards one [`DELETE_DRAINED`] names (four parameters each).
const DRAINED_CHUNK: usize = 1024;

/// [`DELETE_DRAINED`] for `keys` shards. The list is padded to a power of two (its last key
/// repeated), so that a connection prepares a few statements, not one per batch size.
fn delete_drained(keys: usize) -> String {
    let padded = keys.next_power_of_two();
    let mut sql = String::with_capacity(
        DELETE_DRAINED[0].len() + DELETE_DRAINED[1].len() + padded * (DRAINED_KEY.len() + 1),
    );
    sql.push_str(DELETE_DRAINED[0]);
    for at in 0..padded {
        if at > 0 {
            sql.push(',');
        }
        sql.push_str(DRAINED_KEY);
    }
    sql.push_str(DELETE_DRAINED[1]);
    sql
}

/// Acknowledges and releases the drained shards of `batch` on `conn` (a transaction the
/// caller commits), in two statements however many they are (up to [`DRAINED_CHUNK`]): the
/// state rows whose lease still holds deleted, locked in key order ([`DELETE_DRAINED`], which
/// returns their tokens), then those shards' acknowledged rows deleted by id. A shard whose
/// lease was lost changes nothing.
async fn finish_all_on(
    conn: &mut MySqlConnection,
    batch: &[Finishing],
) -> Result<Vec<Finished>, Error> {
    let failed = || database::<MySqlDialect>("acknowledging and releasing drained shards");
    let place_of: HashMap<i64, usize> = batch
        .iter()
        .enumerate()
        .map(|(at, (lease, ..))| (lease.token, at))
        .collect();
    let mut is_held = vec![false; batch.len()];
    // In key order: a batch of several lists locks them one after the other.
    let mut order: Vec<usize> = (0..batch.len()).collect();
    order.sort_by_cached_key(|&at| {
        let shard = &batch[at].0.shard;
        (shard.scope.0, stored_shard(shard))
    });
    for chunk in order.chunks(DRAINED_CHUNK) {
        let last = chunk.len() - 1;
        let mut query = sqlx::query(AssertSqlSafe(delete_drained(chunk.len())));
        for key in 0..chunk.len().next_power_of_two() {
            let lease = &batch[chunk[key.min(last)]].0;
            let (identifier, destination) = stored_shard(&lease.shard);
            query = query
                .bind(lease.shard.scope.0)
                .bind(identifier)
                .bind(destination)
                .bind(lease.token);
        }
        let tokens: Vec<i64> = query
            .fetch_all(&mut *conn)
            .await
            .map_err(failed())?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(failed())?;
        for token in tokens {
            if let Some(&at) = place_of.get(&token) {
                is_held[at] = true;
            }
        }
    }
    let mut deleted = vec![0u64; batch.len()];
    let owners: HashMap<i64, usize> = batch
        .iter()
        .enumerate()
        .filter(|&(at, _)| is_held[at])
        .flat_map(|(at, (_, _, acks))| {
            acks.iter()
                .flat_map(move |ack| ack.ids.iter().map(move |id| (id.0, at)))
        })
        .collect();
    if !owners.is_empty() {
        // Exactly the ids read and delivered: a literal list, one seek of the primary key
        // each, and what went with them.
        let ids: Vec<String> = owners.keys().map(i64::to_string).collect();
        let gone = sqlx::raw_sql(AssertSqlSafe(format!(
            "DELETE FROM outbox_messages WHERE id IN ({}) RETURNING id",
            ids.join(",")
        )))
        .fetch_all(&mut *conn)
        .await
        .map_err(failed())?;
        for row in gone {
            let id: i64 = row.try_get(0).map_err(failed())?;
            if let Some(&at) = owners.get(&id) {
                deleted[at] += 1;
            }
        }
    }
    Ok(batch
        .iter()
        .enumerate()
        .map(|(at, (lease, ..))| {
            if is_held[at] {
                Ok((deleted[at], true))
            } else {
                Err(Error::LeaseLost {
                    shard: lease.shard.clone(),
                    token: lease.token,
                })
            }
        })
        .collect())
}

impl Dialect for MySqlDialect {
    type Database = MySql;
    type Turn = ();
    type Wakeups = NoWakeups;

    const NAME: &'static str = "MariaDB";
    const MIGRATIONS: &'static [EmbeddedMigration] = MIGRATIONS;
    const MIGRATIONS_TABLE: &'static str = "CREATE TABLE IF NOT EXISTS _outbox_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
);";
    const BEGIN: &'static str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";
    // A caller's transaction keeps the isolation level of its session.
    const BEGIN_CALLER: &'static str = "START TRANSACTION";
    // An acknowledgement proves the lease and deletes in two statements: one transaction.
    const WRITES_IN_TRANSACTION: bool = true;
    const MAX_PARAMETERS: usize = 65535;
    const SHARD_IS_EMPTY: Option<&'static str> = Some(SHARD_IS_EMPTY);
    // `GAUGES` reads its limit as `p.lim` and as its count's `LIMIT ?`, `SAMPLED_SHARDS` its
    // cap as `p.cap` and as its count's `OFFSET ?`.
    const LIMITS_BOUND_AGAIN: bool = true;
    const OBJECT_COLUMNS: usize = 2;
    const SQL: Statements = Statements {
        insert_message: INSERT_MESSAGE,
        insert_messages: INSERT_MESSAGES,
        fetch: FETCH,
        fetch_newest: FETCH_NEWEST,
        ack: Ack::Separate {
            lease: ACK_LEASE,
            delete: ACK,
        },
        ack_and_release: None,
        extend_lease: EXTEND_LEASE,
        delete_if_empty: DELETE_IF_EMPTY,
        release: RELEASE,
        release_lease: RELEASE_LEASE,
        fail: FAIL,
        release_interrupted: RELEASE_INTERRUPTED,
        table_exists: TABLE_EXISTS,
        discover: DISCOVER,
        unpark: UNPARK,
        reschedule: RESCHEDULE,
        pending_in_shard: PENDING_IN_SHARD,
        pending_messages: PENDING_MESSAGES,
        shard_states: SHARD_STATES,
        dead_letter: DEAD_LETTER,
        dead_letters: DEAD_LETTERS,
        lock_dead_letters: LOCK_DEAD_LETTERS,
        replay_dead_letters: REPLAY_DEAD_LETTERS,
        purge_dead_letters: PURGE_DEAD_LETTERS,
        purge_expired_dead_letters: PURGE_EXPIRED_DEAD_LETTERS,
        pause: PAUSE,
        resume: RESUME,
        pauses: PAUSES,
        compact_paused: COMPACT_PAUSED,
        backfill: BACKFILL,
        oldest_due_age: OLDEST_DUE_AGE,
        is_paused: IS_PAUSED,
        status: STATUS,
        shards: SHARDS,
        failing_shards: FAILING_SHARDS,
        sampled_shards: SAMPLED_SHARDS,
        shard: SHARD,
        gauges: GAUGES,
        horizon: HORIZON,
        set_aside: SET_ASIDE,
        relays: RELAYS,
        inbox: INBOX,
        shard_messages: SHARD_MESSAGES,
    };

    fn classify(error: &dyn DatabaseError) -> Fault {
        match number(error) {
            Some(code::NO_SUCH_TABLE | code::BAD_FIELD | code::UNKNOWN_SEQUENCE) => {
                Fault::SchemaMissing
            }
            Some(code::BAD_DB) => Fault::Unavailable,
            Some(other) if code::GOING_AWAY.contains(&other) => Fault::Unavailable,
            _ => Fault::Other,
        }
    }

    fn is_missing_table(error: &dyn DatabaseError) -> bool {
        number(error) == Some(code::NO_SUCH_TABLE)
    }

    fn binary_literal(hex: &str) -> String {
        format!("X'{hex}'")
    }

    fn rows_affected(result: &MySqlQueryResult) -> u64 {
        result.rows_affected()
    }

    fn bind_shard<'q>(query: Statement<'q, MySql>, shard: &ShardKey) -> Statement<'q, MySql> {
        let (identifier, destination) = stored_shard(shard);
        query.bind(identifier).bind(destination)
    }

    fn decode_shard(row: &MySqlRow, index: usize) -> Result<ShardKey, sqlx::Error> {
        shard_from_stored(
            row.try_get(index)?,
            row.try_get(index + 1)?,
            row.try_get(index + 2)?,
        )
        .map_err(|detail| sqlx::Error::Decode(detail.into()))
    }

    fn bind_object<'q>(query: Statement<'q, MySql>, object: Id) -> Statement<'q, MySql> {
        let (identifier, wide) = stored_object(object);
        query.bind(identifier).bind(wide)
    }

    fn decode_object(row: &MySqlRow, index: usize) -> Result<Id, sqlx::Error> {
        let wide: Vec<u8> = row.try_get(index + 1)?;
        outbox_sqlx::stored::object_from_stored(row.try_get(index)?, &wide)
    }

    fn bind_ids<'q>(query: Statement<'q, MySql>, ids: Vec<i64>) -> Statement<'q, MySql> {
        query.bind(serde_json::Value::from(ids).to_string())
    }

    fn bind_categories<'q>(
        query: Statement<'q, MySql>,
        categories: Vec<i32>,
    ) -> Statement<'q, MySql> {
        query.bind(serde_json::Value::from(categories).to_string())
    }

    fn bind_groups<'q>(query: Statement<'q, MySql>, groups: &[GroupKey]) -> Statement<'q, MySql> {
        let groups: Vec<serde_json::Value> = groups
            .iter()
            .map(|group| {
                let (object, wide) = stored_object(group.object_identifier);
                serde_json::json!([group.category.0, object, hex(&wide)])
            })
            .collect();
        query.bind(serde_json::Value::Array(groups).to_string())
    }

    fn bind_messages<'q>(
        query: Statement<'q, MySql>,
        messages: &[Message],
    ) -> Statement<'q, MySql> {
        let rows: Vec<serde_json::Value> = messages
            .iter()
            .map(|message| {
                let shard = message.shard();
                let (identifier, destination) = stored_shard(shard);
                let (object, wide) = stored_object(message.object_identifier());
                serde_json::json!([
                    shard.scope.0,
                    identifier,
                    destination,
                    message.category().0,
                    object,
                    hex(&wide),
                    message.payload_json(),
                    message.metadata().to_json(),
                ])
            })
            .collect();
        query.bind(serde_json::Value::Array(rows).to_string())
    }

    fn decode_ids(row: &MySqlRow, index: usize) -> Result<Vec<i64>, Error> {
        let json: String = row
            .try_get(index)
            .map_err(database::<Self>("reading a shard"))?;
        serde_json::from_str(&json).map_err(|source| Error::Database {
            operation: "reading a shard",
            source: Box::new(source),
        })
    }

    fn read_head(rows: Vec<MySqlRow>) -> Result<Vec<StoredMessage>, Error> {
        rows.iter()
            .map(outbox_sqlx::session::stored::<Self>)
            .collect()
    }

    fn placeholder(_index: usize) -> String {
        "?".to_owned()
    }

    fn model_sql(write: Write, table: &ModelTable, rows: usize) -> String {
        crate::model::model_sql(write, table, rows)
    }

    // An upsert that updates a row counts it twice (`CLIENT_FOUND_ROWS`): every model given
    // to a save is written, inserted or updated.
    fn model_rows_written(write: Write, given: usize, affected: u64) -> u64 {
        match write {
            Write::Save => u64::try_from(given).unwrap_or(u64::MAX),
            _ => affected,
        }
    }

    fn columns_sql(table: &ModelTable) -> String {
        crate::model::columns_sql(table)
    }

    fn column_accepts(field: &MySqlTypeInfo, column: &MySqlTypeInfo, compatible: bool) -> bool {
        crate::model::accepts(field, column, compatible)
    }

    fn load_model_sql(table: &ModelTable, _wide: bool) -> String {
        crate::model::load_sql(table)
    }

    fn load_models_sql(table: &ModelTable, _wide: bool) -> String {
        crate::model::load_many_sql(table)
    }

    fn bind_keys<'q>(query: Statement<'q, MySql>, keys: &[Id]) -> Statement<'q, MySql> {
        let keys: Vec<serde_json::Value> = keys
            .iter()
            .map(|key| match key.wide_bytes() {
                Some(bytes) => hex(&bytes).into(),
                None => key.as_integer().unwrap_or_default().into(),
            })
            .collect();
        query.bind(serde_json::Value::Array(keys).to_string())
    }

    fn walk_model_sql(table: &ModelTable, after: Option<bool>) -> String {
        crate::model::walk_sql(table, after.is_some())
    }

    fn read_model(row: &MySqlRow) -> Result<ModelRow, sqlx::Error> {
        crate::model::read(row)
    }

    async fn take_turn(&self) {}

    /// One statement a lease: each locks only its shard's row.
    async fn extend_leases(
        &self,
        pool: &MySqlPool,
        leases: &[Lease],
        duration: std::time::Duration,
    ) -> Result<Vec<bool>, Error> {
        outbox_sqlx::session::extend_each(self, pool, leases, duration).await
    }

    async fn claim(
        &self,
        pool: &MySqlPool,
        shard: &ShardKey,
        options: &ClaimOptions,
    ) -> Result<Option<Claim<Self>>, Error> {
        let failed = || database::<Self>("claiming a shard");
        let mut tx = pool.begin_with(Self::BEGIN).await.map_err(failed())?;
        let Some(lease) = claim_on(&mut tx, std::slice::from_ref(shard), options)
            .await?
            .pop()
        else {
            tx.rollback().await.map_err(failed())?;
            return Ok(None);
        };
        // In transaction mode the session keeps the claiming transaction, and with it the
        // state row's lock.
        let claiming = match options.mode {
            HandlerMode::Leased => {
                tx.commit().await.map_err(failed())?;
                None
            }
            HandlerMode::InTransaction => Some(Claiming { tx, turn: () }),
        };
        Ok(Some(Claim {
            lease,
            claiming,
            head: None,
        }))
    }

    async fn claim_many(
        &self,
        pool: &MySqlPool,
        shards: &[ShardKey],
        options: &ClaimOptions,
        first_read: usize,
    ) -> Result<Vec<Claim<Self>>, Error> {
        // A claiming transaction kept for the handlers holds one shard.
        if options.mode == HandlerMode::InTransaction {
            return outbox_sqlx::dialect::claim_each(self, pool, shards, options).await;
        }
        let failed = || database::<Self>("claiming shards");
        let mut conn = pool.acquire().await.map_err(failed())?;
        let mut tx = conn.begin_with(Self::BEGIN).await.map_err(failed())?;
        let leases = claim_on(&mut tx, shards, options).await?;
        tx.commit().await.map_err(failed())?;
        // The heads are read once the leases are committed, on the same connection.
        let heads = read_heads(&mut conn, &leases, first_read).await?;
        Ok(leases
            .into_iter()
            .zip(heads)
            .map(|(lease, head)| Claim {
                lease,
                claiming: None,
                head,
            })
            .collect())
    }

    async fn discover(
        &self,
        pool: &MySqlPool,
        scope: i32,
        cursor: &ShardKey,
        limit: i32,
    ) -> Result<Vec<(ShardKey, bool)>, Error> {
        const OPERATION: &str = "discovering due shards";
        if scope == outbox_sqlx::store::FIRST_PAGE_SCOPE {
            self.space.now_and_then(pool);
        }
        let (identifier, destination) = stored_shard(cursor);
        let rows = sqlx::query(DISCOVER)
            .bind(scope)
            .bind(scope)
            .bind(identifier)
            .bind(identifier)
            .bind(destination)
            .bind(limit)
            .fetch_all(pool)
            .await
            .map_err(database::<Self>(OPERATION))?;
        rows.iter()
            .map(|row| Ok((Self::decode_shard(row, 0)?, row.try_get(3)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(database::<Self>(OPERATION))
    }

    async fn ack_and_release_on(
        &self,
        conn: &mut MySqlConnection,
        batch: &[Finishing],
    ) -> Result<Vec<Finished>, Error> {
        finish_all_on(conn, batch).await
    }

    async fn wakeups(_pool: &MySqlPool) -> Result<Option<NoWakeups>, Error> {
        Ok(None)
    }

    fn database_key(pool: &MySqlPool) -> String {
        let options = pool.connect_options();
        format!(
            "mysql://{}:{}/{}",
            options.get_host(),
            options.get_port(),
            options.get_database().unwrap_or_default()
        )
    }
}

/// Bytes as hex digits, as `UNHEX` reads them back.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl<'c> outbox_sqlx::model::ModelTarget<'c, 'static, MySqlDialect> for &'c mut MySqlConnection {
    fn target(self) -> outbox_sqlx::model::Target<'c, 'static, MySqlDialect> {
        outbox_sqlx::model::Target::Connection(self)
    }
}

#[cfg(test)]
mod tests {
    use outbox_core::{Destination, ScopeId, ShardKey};

    use super::shard_list;

    /// The list as the statements' `JSON_TABLE` reads it: what `serde_json` writes for the same
    /// keys, whatever the stored destination holds (quotes, backslashes, text beyond ASCII, a
    /// wide shard's control-character marker).
    #[test]
    fn a_shard_list_is_the_json_of_its_keys() {
        let destination = Destination::new("say \"hi\"\\ é😀").expect("a destination");
        let shards = [
            ShardKey::local(ScopeId(1), 42),
            ShardKey::fan_out(ScopeId(-3), -7, destination.clone()),
            ShardKey::fan_out(ScopeId(2), 0xfeed_u128, destination),
        ];
        let keys: Vec<&ShardKey> = shards.iter().collect();
        let list = shard_list(&keys, |at| [at as i64 * 10, -1]);
        let parsed: serde_json::Value = serde_json::from_str(&list).expect("valid JSON");
        let expected: Vec<serde_json::Value> = shards
            .iter()
            .enumerate()
            .map(|(at, shard)| {
                let (identifier, destination) = outbox_sqlx::stored::stored_shard(shard);
                serde_json::json!([shard.scope.0, identifier, destination, at as i64 * 10, -1])
            })
            .collect();
        assert_eq!(parsed, serde_json::Value::Array(expected));
        assert_eq!(shard_list(&[], |_| []), "[]");
    }
}
