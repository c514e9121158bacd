//! What a backend supplies: its SQL, its claim strategy, its wake-ups, how its errors read.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use outbox_core::columns::ModelRow;
use outbox_core::replicated::ModelTable;
use outbox_core::store::{
    Acknowledgement, ClaimOptions, EmbeddedMigration, GroupKey, Lease, StoredMessage, WakeupStream,
};
use outbox_core::{Error, Id, Message, ShardKey};
use sqlx::error::DatabaseError;
use sqlx::{Database, Pool, Transaction};

use crate::model_sql::Write;
use crate::sql::{Sql, Statement};

/// How a driver error reads, for the outbox's typed errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The database cannot be reached, or is shutting down: [`Error::Unavailable`].
    Unavailable,
    /// An outbox table, column or function is missing: [`Error::MigrationMissing`].
    SchemaMissing,
    /// The connection is configured in a way that cannot work (TLS asked for on a build
    /// without it, options the driver refuses): [`Error::InvalidConfig`], never retried.
    Configuration,
    /// The database lacks what the outbox's statements use (a built-in function of a newer
    /// release): [`Error::Unsupported`], never retried.
    Unsupported {
        /// Which store.
        store: &'static str,
        /// What the statements need.
        feature: &'static str,
    },
    /// Anything else: [`Error::Database`].
    Other,
}

/// How an acknowledgement runs.
///
/// Both forms act only while the lease is current: they extend it, reset the shard's attempts
/// (the head moved) and delete exactly the acknowledged ids, or, if another worker holds the
/// shard now, delete nothing.
#[derive(Debug, Clone, Copy)]
pub enum Ack {
    /// One statement: `$1..$4` the lease (scope, shard, destination, token), `$5` the lease's
    /// new duration in milliseconds, `$6` and `$7` the lowest and highest id, `$8` the ids
    /// (bound with [`Dialect::bind_ids`]). Returns one row: the leases it held (0 or 1), the
    /// rows it deleted.
    Combined(&'static str),
    /// Two statements in one write transaction: `lease` (`$1..$4` the lease, `$5` the new
    /// duration in milliseconds; it affects one row if the lease is held), then `delete`
    /// (`$1..$3` the shard, `$4` the ids, bound with [`Dialect::bind_ids`]).
    Separate {
        /// Proves and extends the lease.
        lease: &'static str,
        /// Deletes the rows.
        delete: &'static str,
    },
}

/// The relay's statements in a backend's SQL.
///
/// Parameters are numbered as documented at each field for a dialect whose object identifiers
/// take one parameter ([`Dialect::OBJECT_COLUMNS`] = 1); where they take two, an object
/// identifier takes the next number too and the numbers after it move up by one. `$1..$3` are
/// always a shard's key (scope `i16`, then the shard identifier and destination as
/// [`Dialect::bind_shard`] stores them: [`shard_keyed`](crate::session::shard_keyed)), `$4` a
/// lease's fencing token where the statement acts only while the lease is current
/// ([`fenced`](crate::session::fenced)). Durations travel as milliseconds (`i64`): the
/// database adds them to its own clock.
#[derive(Debug, Clone, Copy)]
pub struct Statements {
    /// One message: `$1..$3` its shard, `$4` category (`i32`), `$5` object identifier, `$6`
    /// payload (JSON text); returns its id.
    pub insert_message: &'static str,
    /// Many messages in one statement, bound with [`Dialect::bind_messages`]; returns their
    /// ids.
    pub insert_messages: &'static str,
    /// A shard's oldest rows: `$1..$3` the shard, `$4` the limit. Read with
    /// [`Dialect::read_head`].
    pub fetch: &'static str,
    /// The newest row and all ids of groups: `$1..$3` the shard, then the groups (bound with
    /// [`Dialect::bind_groups`]), then the bounds `after < id <= up_to`. Returns the newest
    /// row (id, category, scope, object, payload) and the ids ([`Dialect::decode_ids`]).
    pub fetch_newest: &'static str,
    /// An acknowledgement.
    pub ack: Ack,
    /// A drained shard's last acknowledgement and its release in one statement, if the
    /// backend has one: `$1..$4` the lease, `$5`, `$6` the lowest and highest id, `$7` the
    /// ids. Returns the leases held, the rows deleted, the shards released.
    pub ack_and_release: Option<&'static str>,
    /// Extends a held lease: `$1..$4` the lease, `$5` milliseconds from now.
    pub extend_lease: &'static str,
    /// Deletes a held shard's state row if the shard has no message left: `$1..$4`.
    pub delete_if_empty: &'static str,
    /// Releases a held lease and clears the shard's failures: `$1..$4`.
    pub release: &'static str,
    /// Releases a held lease and leaves the shard's failures as they were: `$1..$4`.
    pub release_lease: &'static str,
    /// Records a failure and releases: `$1..$4`, `$5` attempts (`i32`), `$6` error, `$7`
    /// milliseconds until due, `$8` watermark (`i64`), `$9` parked category (`Option<i32>`).
    pub fail: &'static str,
    /// Makes a held lease lapse now: `$1..$4`.
    pub release_interrupted: &'static str,
    /// Whether a table exists: `$1` its name; returns a boolean.
    pub table_exists: &'static str,
    /// Discovery: `$1` the scope after which to start (`i32`), `$2` shard identifier, `$3`
    /// destination, `$4` the limit (`i32`). Returns each shard's key and whether it is due.
    pub discover: &'static str,
    /// Makes shards parked on known categories due: `$1` the categories
    /// ([`Dialect::bind_categories`]).
    pub unpark: &'static str,
    /// Makes a shard in backoff due now: `$1..$3`.
    pub reschedule: &'static str,
    /// Counts a shard's rows up to an id: `$1..$3`, `$4` the id.
    pub pending_in_shard: &'static str,
    /// Pending messages in id order: `$1` the limit (`i64`). Returns id, scope, shard
    /// identifier, destination, category, object identifier, payload, and the creation time
    /// in milliseconds since the Unix epoch.
    pub pending_messages: &'static str,
    /// Every shard state in key order: scope, shard identifier, destination, attempts
    /// (`i64`), last error, retry time (ms since the epoch), lease owner, lease expiry (ms),
    /// lease token, parked category.
    pub shard_states: &'static str,
    /// Copies a failing group's rows to the dead letters, in the transaction whose
    /// acknowledgement ([`Statements::ack`]) then deletes them: `$1..$4` the lease, `$5` the
    /// ids ([`Dialect::bind_ids`]), `$6` the error, `$7` the attempts (`i32`). Copies nothing
    /// unless the lease is current; records the shard's `first_failed_at` (now, if it has
    /// none) and the lease's token.
    pub dead_letter: &'static str,
    /// Dead letters in message id order: `$1` category (`Option<i32>`), `$2` scope
    /// (`Option<i32>`), `$3` a shard's scope (`Option<i32>`; no shard condition if null), `$4`
    /// and `$5` its identifier and destination ([`Dialect::bind_shard`]), `$6` the least age
    /// in milliseconds (`Option<i64>`), `$7` the limit (`i64`), `$8` whether to keep only the
    /// ids `$9` (`i32`, 0 or 1; the ids bound with [`Dialect::bind_ids`]), `$10` and `$11`
    /// the least and greatest id kept (`i64`; the whole range without ids), so that a lookup
    /// by id reads its range of the primary key. Returns the message id, the
    /// shard's key, category, object ([`Dialect::OBJECT_COLUMNS`]), payload, creation time
    /// (ms), error, attempts (`i64`), first failure (ms), set aside (ms), lease token.
    pub dead_letters: &'static str,
    /// Locks the dead letters to replay, in a transaction: `$1` ids; returns those found.
    pub lock_dead_letters: &'static str,
    /// Writes dead letters back as new messages in message id order: `$1` ids; returns the
    /// new ids.
    pub replay_dead_letters: &'static str,
    /// Deletes dead letters: `$1` ids.
    pub purge_dead_letters: &'static str,
    /// Deletes the oldest dead letters set aside at least `$1` milliseconds ago (`i64`), at
    /// most `$2` (`i64`).
    pub purge_expired_dead_letters: &'static str,
    /// Records a pause unless it exists: `$1` kind (`'shard'`, `'scope'`, `'category'`),
    /// `$2` scope, `$3` and `$4` the shard's identifier and destination
    /// ([`Dialect::bind_shard`]), `$5` category, `$6` reason (`Option<String>`); the columns
    /// a kind does not use take 0 and `''`.
    pub pause: &'static str,
    /// Deletes a pause: `$1..$5` as for [`Statements::pause`].
    pub resume: &'static str,
    /// Every pause: kind, scope, identifier, destination, category, reason, since (ms).
    pub pauses: &'static str,
    /// The age in milliseconds (`i64`) of the oldest pending message whose shard is not
    /// backing off (with no message newer than its failure) nor paused; no row if there is
    /// none. Reads in id order.
    pub oldest_due_age: &'static str,
    /// Whether a pause holds a shard: `$1..$3` the shard; returns a boolean.
    pub is_paused: &'static str,
    /// The outbox at a glance, in one statement, `$1` the number of deepest shards (`i64`):
    /// on every row, shards with pending messages, pending messages, the oldest's creation
    /// time (ms), then the shards due, in flight, backing off, parked and paused by their
    /// [`shard_status!`](crate::shard_status) (each `i64`), the dead letters and the oldest's
    /// time set aside (ms); then one of the deepest shards with the columns of
    /// [`Statements::shards`], deepest first (all `NULL` on the one row if there is none).
    pub status: &'static str,
    /// The gauges' estimate of a backlog of at least `$1` messages (`i64`), in one row that
    /// reads no more than an index descent per table and the shard states: pending messages
    /// (`i64`, at least `$1`), the oldest's creation time (ms; the first by id), the shards in
    /// flight, backing off and parked (by the shard states), the shards a pause of their own
    /// holds, the dead letters (`i64`, exact up to `$1`, estimated above) and the oldest's time
    /// set aside (ms).
    pub gauges: &'static str,
    /// The oldest holder of the database's cleanup horizon ([`Horizon`](outbox_core::admin::Horizon)):
    /// one row or none, of who holds it (text), since when (ms, or `NULL`) and how far behind
    /// (`i64`, or `NULL`); empty for a backend that cannot tell. Read best effort: a failure
    /// (a user without the privilege) leaves the status without it.
    pub horizon: &'static str,
    /// Shards with pending messages, deepest first, every one ranked: `$1` which
    /// (`'pending'`, `'failing'`, `'paused'`, `'parked'`), `$2` the limit (`i64`), `$3` only
    /// this scope (`i32` or `NULL`), `$4` only shards with a message of this category (`i32`
    /// or `NULL`). Returns the shard's key, pending messages (`i64`), the oldest's creation
    /// time (ms), attempts (`i64`), last error, retry time (ms), parked category, the holder
    /// of a live lease, paused (`bool`), the status ([`shard_status!`](crate::shard_status),
    /// a `ShardStatus` label), and whether the pending count is an estimate (`bool`).
    pub shards: &'static str,
    /// The shards of [`Statements::shards`] whose state says they fail (`$1` `'failing'`:
    /// attempts or an error recorded) or are parked (`$1` `'parked'`), with its parameters:
    /// read from the few shard states and their own messages, never by ranking every shard
    /// of a large backlog.
    pub failing_shards: &'static str,
    /// The shards of [`Statements::shards`] (`$1` `'pending'` or `'paused'`, `$2..$4` as
    /// there) ranked from a sample, at a cost that does not grow with the backlog: windows
    /// of `$6` ids (`i64`) spread over the id span, at most `$5` (`i64`) of them; beside the
    /// sample's deepest shards, the first `$2` of the scope `$3` (and, for `'paused'`, of
    /// each scope paused) and the shards paused one by one; each counted up to `$7` (`i64`)
    /// and estimated from the sample above. Returns the number of messages sampled (`i64`),
    /// then the columns of [`Statements::shards`] (all `NULL`, on the one row, if none).
    pub sampled_shards: &'static str,
    /// One shard, `$1..$3`, with the columns of [`Statements::shards`]; no row if it has no
    /// pending message. Its messages are counted up to `$4` (`i64`), and estimated above it
    /// from the density of the ids its first `$4` span; its oldest is its first by id.
    pub shard: &'static str,
    /// A shard's pending messages in id order: `$1..$3` the shard, `$4` the limit (`i64`);
    /// the columns of [`Statements::pending_messages`].
    pub shard_messages: &'static str,
    /// In paused shards, deletes the rows of the categories `$1`
    /// ([`Dialect::bind_categories`]) that are neither the oldest nor the newest row of their
    /// group, at most `$2` (`i64`).
    pub compact_paused: &'static str,
    /// The backfills' statements.
    pub backfill: BackfillStatements,
    /// An operator's set-aside of one message.
    pub set_aside: SetAsideStatements,
    /// The relays' heartbeats.
    pub relays: RelayStatements,
    /// The inbox's ([`Inbox`](outbox_core::inbox::Inbox)).
    pub inbox: InboxStatements,
}

/// The statements of a consumer's inbox ([`Inbox`](outbox_core::inbox::Inbox)).
#[derive(Debug, Clone, Copy)]
pub struct InboxStatements {
    /// Records a message unless it is recorded: `$1` consumer, `$2` message id (`i64`); one
    /// row affected if it was new. Waits for an open transaction that recorded it.
    pub record: &'static str,
    /// Deletes a consumer's records older than `$2` milliseconds (`i64`): `$1` consumer.
    pub purge: &'static str,
    /// Deletes every consumer's records older than `$1` milliseconds (`i64`).
    pub purge_all: &'static str,
    /// Records a consumer's dead letter: `$1` consumer, `$2` message id (`Option<i64>`), `$3`
    /// category (`Option<String>`), `$4` headers (a JSON object as text), `$5` payload
    /// (bytes), `$6` error, `$7` attempts (`i64`).
    pub dead_letter: &'static str,
    /// Dead letters, oldest first: `$1` the consumer (`Option<String>`: every consumer's if
    /// null), `$2` the limit. Returns id, consumer, message id, category, headers (text),
    /// payload, error, attempts (`i64`), when it was recorded (ms since the epoch).
    pub dead_letters: &'static str,
}

/// The statements of the relays' heartbeats ([`Store::beat`](outbox_core::store::Store::beat),
/// [`Admin::relays`](outbox_core::admin::Admin::relays)).
#[derive(Debug, Clone, Copy)]
pub struct RelayStatements {
    /// Writes a relay's row anew: `$1` worker, `$2` when it started (ms since the epoch),
    /// `$3` milliseconds until it expires, `$4` shards in flight, `$5` shards waiting (`i64`),
    /// `$6` the open breakers' names (a JSON array). Seen now, by the database's clock.
    pub beat: &'static str,
    /// Deletes the rows that expired more than `$1` milliseconds ago.
    pub forget: &'static str,
    /// Deletes a relay's row: `$1` worker.
    pub leave: &'static str,
    /// The rows that expired no more than `$1` milliseconds ago, by worker: worker, started
    /// and seen (ms since the epoch), how long the row stands after it was seen (ms), shards
    /// in flight and waiting (`i64`), open breakers (a JSON array), and whether it is live
    /// (not expired; a boolean).
    pub list: &'static str,
}

/// The statements that set one pending message aside as a dead letter, run in this
/// order in one write transaction.
#[derive(Debug, Clone, Copy)]
pub struct SetAsideStatements {
    /// Locks the message: `$1` its id (`i64`). Returns its shard's key; no row if it is not
    /// pending.
    pub lock_message: &'static str,
    /// Records the shard's state row unless it exists: `$1..$3`.
    pub ensure_shard: &'static str,
    /// Locks the shard's state row: `$1..$3`. Returns the owner of a live lease on it
    /// (`Option<String>`, `''` for one without a name); no row if another transaction holds
    /// the row (a claim, or a drain in the claiming transaction: PostgreSQL's `SKIP LOCKED`).
    pub lock_shard: &'static str,
    /// Copies the message to the dead letters with the shard's attempts, first failure and
    /// token: `$1..$3` the shard, `$4` the id (`i64`), `$5` the error (text).
    pub copy: &'static str,
    /// Clears the shard's failures if the message is its head (no older message in it):
    /// `$1..$3` the shard, `$4` the id.
    pub clear_failures: &'static str,
    /// Deletes the message: `$1` the id.
    pub delete: &'static str,
}

/// The statements of the backfills in a backend's SQL. A watermark's columns, as
/// [`BackfillStatements::lock`], [`record`](BackfillStatements::record),
/// [`list`](BackfillStatements::list) and [`start`](BackfillStatements::start) return them:
/// category (`i32`), model, declared, target, walking and done versions (`i32`), low bound
/// (`Option<String>`), rows walked (`i64`), destinations (`Option<String>`, a JSON array),
/// worker (`Option<String>`), started, updated and completed times (ms since the epoch,
/// `Option<i64>`), last error (`Option<String>`).
#[derive(Debug, Clone, Copy)]
pub struct BackfillStatements {
    /// Records a model's watermark unless it exists: `$1` category (`i32`), `$2` model name.
    pub ensure: &'static str,
    /// Takes a model's watermark for a batch, in the batch's transaction: `$1` category.
    /// Returns its columns; no row if another transaction holds it (PostgreSQL's `FOR UPDATE
    /// SKIP LOCKED`; SQLite's write transaction holds the whole database already).
    pub lock: &'static str,
    /// Records what a relay declares of a model: `$1` category, `$2` model name, `$3` the
    /// declared version (`i32`). Never waits on another transaction that holds the
    /// watermark (PostgreSQL: `SKIP LOCKED`; it records nothing then).
    pub declare: &'static str,
    /// The backlog, counted up to a bound: `$1` the bound (`i64`); returns the count (`i64`).
    pub backlog: &'static str,
    /// Moves a watermark after a batch: `$1` category, `$2` model name, `$3` declared,
    /// `$4` walking and `$5` done versions (`i32`), `$6` low bound (`Option<String>`), `$7`
    /// rows walked (`i64`), `$8` worker, `$9` whether the walk started now, `$10` whether it
    /// completed now (`i32`, 0 or 1). Clears the last error; returns the columns.
    pub record: &'static str,
    /// Records a failed batch: `$1` category, `$2` the error.
    pub fail: &'static str,
    /// Every watermark, by category.
    pub list: &'static str,
    /// Starts a backfill: `$1` category, `$2` model name (`''` if unknown), `$3` target
    /// version (`i32`), `$4` destinations (`Option<String>`). Returns the columns.
    pub start: &'static str,
    /// Pauses a backfill, lowering its target to the version done: `$1` category.
    pub pause: &'static str,
}

/// A shard's [`ShardStatus`](outbox_core::admin::ShardStatus) label, from the columns `paused`,
/// `in_flight`, `parked_category` and `waiting` (its retry time is ahead and nothing arrived
/// since its failure) of a dialect's shard view: the first that applies, as
/// [`ShardStatus::of`](outbox_core::admin::ShardStatus::of) decides. One expression, so the counts
/// and the listings of both backends cannot disagree.
#[macro_export]
macro_rules! shard_status {
    () => {
        "CASE WHEN paused THEN 'paused' WHEN in_flight THEN 'in flight' \
         WHEN waiting AND parked_category IS NOT NULL THEN 'parked' \
         WHEN waiting THEN 'backing off' ELSE 'due' END"
    };
}

/// The shards of a shard view counted by their [`shard_status!`], in the order of
/// [`Statements::status`]'s counts: due, in flight, backing off, parked, paused.
#[macro_export]
macro_rules! shard_counts {
    () => {
        "count(*) FILTER (WHERE state = 'due'), \
         count(*) FILTER (WHERE state = 'in flight'), \
         count(*) FILTER (WHERE state = 'backing off'), \
         count(*) FILTER (WHERE state = 'parked'), \
         count(*) FILTER (WHERE state = 'paused')"
    };
}

/// The SQL condition that a pause holds the shard whose scope, identifier and destination
/// are the columns or parameters named (as string literals) by the arguments: a pause of the
/// shard, of its scope, or of a category of which it holds a message. It reads
/// `outbox_pauses` once, and nothing more, when nothing is paused. For use in `concat!` by a
/// dialect's statements (the text is the same in PostgreSQL's SQL and SQLite's).
#[macro_export]
macro_rules! paused {
    ($scope:literal, $identifier:literal, $destination:literal) => {
        concat!(
            "(EXISTS (SELECT 1 FROM outbox_pauses) AND EXISTS (SELECT 1 FROM outbox_pauses p \
              WHERE (p.kind = 'scope' AND p.shard_scope = ",
            $scope,
            ") \
                 OR (p.kind = 'shard' AND p.shard_scope = ",
            $scope,
            " AND p.shard_identifier = ",
            $identifier,
            " AND p.destination = ",
            $destination,
            ") \
                 OR (p.kind = 'category' AND EXISTS (SELECT 1 FROM outbox_messages pm \
                     WHERE pm.shard_scope = ",
            $scope,
            " AND pm.shard_identifier = ",
            $identifier,
            " AND pm.destination = ",
            $destination,
            " AND pm.category = p.category))))"
        )
    };
}

/// The statement of [`Statements::compact_paused`], in the SQL both backends share: in paused
/// shards, deletes the rows of coalescing groups that have an older and a newer row. The rows
/// of paused shards and scopes are found through the shard index from the (few) pauses; those
/// of category pauses by a scan, which runs only while one is in force. `$categories` is the
/// condition that `x.category` is one of the categories given (in the dialect's way of binding
/// a list), `$same_object` what more than `object_identifier` rows `o` and `x` share to hold
/// the same object ("" if nothing), `$limit` the limit's parameter.
///
/// Without a pause, the statement reads nothing: the pauses are looked at first, once. A
/// plan that read `outbox_messages` before finding no pause took 15 s in a 15-minute held
/// horizon (every row the hold kept, for each live row).
#[macro_export]
macro_rules! compact_paused {
    ($categories:literal, $same_object:literal, $limit:literal) => {
        concat!(
            "DELETE FROM outbox_messages WHERE EXISTS (SELECT 1 FROM outbox_pauses) AND id IN ( \
                SELECT x.id FROM ( \
                    SELECT x.* FROM outbox_pauses p JOIN outbox_messages x \
                        ON x.shard_scope = p.shard_scope \
                        AND x.shard_identifier = p.shard_identifier \
                        AND x.destination = p.destination \
                    WHERE p.kind = 'shard' \
                    UNION ALL \
                    SELECT x.* FROM outbox_pauses p JOIN outbox_messages x \
                        ON x.shard_scope = p.shard_scope \
                    WHERE p.kind = 'scope' \
                    UNION ALL \
                    SELECT x.* FROM outbox_messages x \
                    WHERE EXISTS (SELECT 1 FROM outbox_pauses WHERE kind = 'category') \
                        AND EXISTS (SELECT 1 FROM outbox_pauses p WHERE p.kind = 'category' \
                            AND EXISTS (SELECT 1 FROM outbox_messages pm \
                                WHERE pm.shard_scope = x.shard_scope \
                                    AND pm.shard_identifier = x.shard_identifier \
                                    AND pm.destination = x.destination \
                                    AND pm.category = p.category)) \
                ) x \
                WHERE ",
            $categories,
            " \
                    AND EXISTS (SELECT 1 FROM outbox_messages o \
                        WHERE o.shard_scope = x.shard_scope \
                            AND o.shard_identifier = x.shard_identifier \
                            AND o.destination = x.destination AND o.category = x.category \
                            AND o.object_identifier = x.object_identifier ",
            $same_object,
            " AND o.id < x.id) \
                    AND EXISTS (SELECT 1 FROM outbox_messages o \
                        WHERE o.shard_scope = x.shard_scope \
                            AND o.shard_identifier = x.shard_identifier \
                            AND o.destination = x.destination AND o.category = x.category \
                            AND o.object_identifier = x.object_identifier ",
            $same_object,
            " AND o.id > x.id) \
                LIMIT ",
            $limit,
            ")"
        )
    };
}

/// A shard claim, as a backend's [`Dialect::claim`] makes it.
#[derive(Debug)]
pub struct Claim<D: Dialect> {
    /// The lease.
    pub lease: Lease,
    /// In in-transaction handler mode, the claiming transaction (and the backend's turn, held
    /// as long as the transaction).
    pub claiming: Option<Claiming<D>>,
    /// The shard's head as the claim read it, with how many rows it asked for, if it read it
    /// (see [`Store::claim_many`](outbox_core::store::Store::claim_many)): what the session's first
    /// fetch of that many rows answers.
    pub head: Option<(Vec<StoredMessage>, usize)>,
}

/// Claims those of `shards` that are due and free with [`Dialect::claim`], one at a time:
/// the default [`Dialect::claim_many`], and what a backend's own falls back to where it has
/// no single statement.
pub async fn claim_each<D: Dialect>(
    dialect: &D,
    pool: &Pool<D::Database>,
    shards: &[ShardKey],
    options: &ClaimOptions,
) -> Result<Vec<Claim<D>>, Error> {
    let mut claims = Vec::with_capacity(shards.len());
    for shard in shards {
        claims.extend(dialect.claim(pool, shard, options).await?);
    }
    Ok(claims)
}

/// A claiming transaction that the session keeps for its handlers.
#[derive(Debug)]
pub struct Claiming<D: Dialect> {
    /// The transaction holding the claim.
    pub tx: Transaction<'static, D::Database>,
    /// The backend's turn, if it serialises its writes.
    pub turn: D::Turn,
}

/// What a `sqlx` backend supplies to the shared body: the SQL text, the claim strategy, the
/// wake-up stream and error classification. Everything else (transactions, model and message
/// writes, migrations, sessions, stores) is written once, in this crate, over it.
///
/// A value of the dialect travels with the store and its sessions: a backend keeps there what
/// it shares between them (SQLite's in-process turn for writes).
pub trait Dialect: Clone + Debug + Send + Sync + 'static {
    /// The `sqlx` database.
    type Database: Sql;
    /// What the backend's relay writes hold while they run (`()` if they take no turn).
    type Turn: Debug + Send + Sync + 'static;
    /// Wake-ups on commit ([`outbox_core::store::NoWakeups`] if the backend has none).
    type Wakeups: WakeupStream;

    /// The database's name, for messages.
    const NAME: &'static str;
    /// The embedded migrations, in order.
    const MIGRATIONS: &'static [EmbeddedMigration];
    /// The migrations table (`_outbox_migrations`) as `sqlx`'s migrator creates it on this
    /// database: what a migration script for a tool of the user's own begins with.
    const MIGRATIONS_TABLE: &'static str;
    /// The relay's statements.
    const SQL: Statements;
    /// A read of whether a shard has no message left (`$1..$3`; returns a boolean) that takes
    /// no lock, for a database whose `DELETE` locks the rows its subqueries read (InnoDB: in a
    /// relay's finish, the first index entry past an empty shard is often another shard's row
    /// that its own holder is deleting, and two such waits make a deadlock). Where it is
    /// given, a finish reads it first and runs [`Statements::delete_if_empty`], then without
    /// a subquery of its own, only if the shard was empty: a message committed in between is
    /// found by the next sweep, its shard having no state row. `None` by default.
    const SHARD_IS_EMPTY: Option<&'static str> = None;
    /// Whether the statements that read a bound both as a value and as a `LIMIT` or `OFFSET`
    /// take it a second time, as their last parameter: [`Statements::gauges`] its exact limit,
    /// [`Statements::sampled_shards`] its cap of a candidate's count. For a database whose
    /// `LIMIT` takes only a parameter of its own (MariaDB); `false` by default (`$1` and `$7`
    /// serve both).
    const LIMITS_BOUND_AGAIN: bool = false;

    /// The statement that begins a writing transaction (`BEGIN`; SQLite's `BEGIN IMMEDIATE`
    /// takes the write lock at once, so that the transaction never fails to upgrade).
    const BEGIN: &'static str;
    /// The statement that begins a caller's transaction ([`crate::begin`], a consumer's inbox
    /// transaction): [`Dialect::BEGIN`] by default. A backend whose `BEGIN` sets what only the
    /// relay's own transactions need (MariaDB's sets `READ COMMITTED`) begins a caller's
    /// transaction plainly, at the isolation level the caller's session has.
    const BEGIN_CALLER: &'static str = Self::BEGIN;
    /// Whether the relay's writes outside a claiming transaction (acknowledgements,
    /// releases) run in a transaction under the backend's turn, rather than one statement at
    /// a time on a pooled connection.
    const WRITES_IN_TRANSACTION: bool;

    /// How a database error reads: connectivity, a missing outbox table, or anything else.
    /// (Errors of the connection itself, such as I/O, are unavailability already.)
    fn classify(error: &dyn DatabaseError) -> Fault;

    /// A statement that brings the connection's view of the schema up to date, run before a
    /// model's table is described (SQLite describes a statement with the schema it last
    /// read, which another connection may have changed since). None by default.
    const REFRESH_SCHEMA: Option<&'static str> = None;

    /// Whether `error` says that a table does not exist (any table: a replicated model's).
    fn is_missing_table(error: &dyn DatabaseError) -> bool;

    /// A binary literal of the bytes whose hex digits are `hex` (`X'…'` in SQLite).
    fn binary_literal(hex: &str) -> String;

    /// The rows a statement affected.
    fn rows_affected(result: &<Self::Database as Database>::QueryResult) -> u64;

    /// Binds a shard's identifier and destination as the backend stores them (two
    /// parameters; the scope is bound before them).
    fn bind_shard<'q>(
        query: Statement<'q, Self::Database>,
        shard: &ShardKey,
    ) -> Statement<'q, Self::Database>;

    /// The shard key in columns `index..index + 3` of `row`: scope, identifier, destination
    /// as [`Dialect::bind_shard`] stores them.
    fn decode_shard(
        row: &<Self::Database as Database>::Row,
        index: usize,
    ) -> Result<ShardKey, sqlx::Error>;

    /// The columns (and parameters) an object identifier takes: 1 where one column holds an
    /// integer or a wide identifier's 16 bytes (SQLite), 2 where the 16 bytes have a column of
    /// their own beside the `BIGINT` (PostgreSQL).
    const OBJECT_COLUMNS: usize;

    /// Binds an object identifier: [`Dialect::OBJECT_COLUMNS`] parameters.
    fn bind_object<'q>(
        query: Statement<'q, Self::Database>,
        object: Id,
    ) -> Statement<'q, Self::Database>;

    /// The object identifier in columns `index..index + OBJECT_COLUMNS` of `row`.
    fn decode_object(
        row: &<Self::Database as Database>::Row,
        index: usize,
    ) -> Result<Id, sqlx::Error>;

    /// Binds message ids as one parameter (an array, or a JSON array).
    fn bind_ids<'q>(
        query: Statement<'q, Self::Database>,
        ids: Vec<i64>,
    ) -> Statement<'q, Self::Database>;

    /// Binds category ids as one parameter.
    fn bind_categories<'q>(
        query: Statement<'q, Self::Database>,
        categories: Vec<i32>,
    ) -> Statement<'q, Self::Database>;

    /// Binds coalescing groups (category, object) for [`Statements::fetch_newest`].
    fn bind_groups<'q>(
        query: Statement<'q, Self::Database>,
        groups: &[GroupKey],
    ) -> Statement<'q, Self::Database>;

    /// Binds messages for [`Statements::insert_messages`].
    fn bind_messages<'q>(
        query: Statement<'q, Self::Database>,
        messages: &[Message],
    ) -> Statement<'q, Self::Database>;

    /// Decodes the ids column of [`Statements::fetch_newest`].
    fn decode_ids(row: &<Self::Database as Database>::Row, index: usize)
    -> Result<Vec<i64>, Error>;

    /// The rows [`Statements::fetch`] returned, as messages in id order
    /// ([`crate::session::stored`] reads one row of (id, category, scope, object, payload,
    /// created, metadata)).
    fn read_head(rows: Vec<<Self::Database as Database>::Row>)
    -> Result<Vec<StoredMessage>, Error>;

    /// The most parameters one statement takes: a model write binds as many rows per
    /// statement as fit.
    const MAX_PARAMETERS: usize;

    /// Parameter `index` (from 1) in the model statements: `$1`, `?1`.
    fn placeholder(index: usize) -> String;

    /// Whether a column of type `column` holds a field whose values encode as `field`, and
    /// reads them back as they were; `compatible` is the driver's own answer (the field type's
    /// `sqlx::Type::compatible`), which a dialect may widen (an `i32` field in a `BIGINT`
    /// column) or excuse where the database's types say little.
    fn column_accepts(
        field: &<Self::Database as Database>::TypeInfo,
        column: &<Self::Database as Database>::TypeInfo,
        compatible: bool,
    ) -> bool {
        let _ = (field, column);
        compatible
    }

    /// The statement for `write` of `rows` of `table`'s models, each model's columns its
    /// parameters in row order (see [`crate::model_sql::model_sql`], the default: standard SQL with
    /// double-quoted identifiers, `ON CONFLICT` and `UPDATE … FROM`).
    fn model_sql(write: Write, table: &ModelTable, rows: usize) -> String {
        crate::model_sql::model_sql(write, table, rows, Self::placeholder)
    }

    /// The rows a statement of [`Dialect::model_sql`] for `write` of `given` models wrote, by
    /// the rows it `affected` as [`Dialect::rows_affected`] counts them (by default, those:
    /// a database that counts an upsert's update twice says otherwise).
    fn model_rows_written(write: Write, given: usize, affected: u64) -> u64 {
        let _ = (write, given);
        affected
    }

    /// The statement that reads `table`'s columns, every one of them, as one row of `NULL`s
    /// (see [`crate::model_sql::columns_sql`], the default).
    fn columns_sql(table: &ModelTable) -> String {
        crate::model_sql::columns_sql(table)
    }

    /// The statement that reads one model's row (`$1` its key: an `i64` for an integer
    /// identifier, the 16 bytes of a wide one), decoded by [`Dialect::read_model`].
    fn load_model_sql(table: &ModelTable, wide: bool) -> String;

    /// The statement that reads the rows of many of a model's objects at once: `$1` their
    /// keys (bound by [`Dialect::bind_keys`]; all integers, or all wide if `wide`). Each row
    /// found as [`Dialect::read_model`] reads it, then, as its last column (which
    /// `read_model` does not take for the model's), the position of its key among the keys,
    /// from 1, as an `i64`.
    fn load_models_sql(table: &ModelTable, wide: bool) -> String;

    /// Binds the keys of [`Dialect::load_models_sql`].
    fn bind_keys<'q>(
        query: Statement<'q, Self::Database>,
        keys: &[Id],
    ) -> Statement<'q, Self::Database>;

    /// The statement that reads a batch of a model's rows for a backfill, in key order, as
    /// [`Dialect::read_model`] reads them: `$1` the low bound (an `i64`, or a wide key's 16
    /// bytes if `after` is `Some(true)`) and `$2` the limit (`i64`); without a low bound
    /// (`after` is `None`), `$1` the limit.
    fn walk_model_sql(table: &ModelTable, after: Option<bool>) -> String;

    /// A row of [`Dialect::load_model_sql`]: each column with its value, in the form its
    /// type has in serde's data model (bytes as bytes, not text).
    fn read_model(row: &<Self::Database as Database>::Row) -> Result<ModelRow, sqlx::Error>;

    /// Waits for the turn of the backend's relay writes (at once, if it takes none).
    fn take_turn(&self) -> impl Future<Output = Self::Turn> + Send;

    /// Extends each of `leases` by `duration` from now if it is still held, as
    /// [`Statements::extend_lease`] extends one: whether each was held, in order
    /// ([`Store::extend_leases`](outbox_core::store::Store::extend_leases)). A backend that
    /// orders its writes takes this one before the others it has queued; one that does not
    /// may run [`extend_each`](crate::session::extend_each).
    fn extend_leases<'a>(
        &'a self,
        pool: &'a Pool<Self::Database>,
        leases: &'a [Lease],
        duration: Duration,
    ) -> impl Future<Output = Result<Vec<bool>, Error>> + Send + 'a;

    /// Claims `shard` if it is due and nobody holds it, with a fencing token greater than any
    /// before: the backend's claim strategy.
    fn claim(
        &self,
        pool: &Pool<Self::Database>,
        shard: &ShardKey,
        options: &ClaimOptions,
    ) -> impl Future<Output = Result<Option<Claim<Self>>, Error>> + Send;

    /// Claims those of `shards` that are due and free, as [`Dialect::claim`] claims each, in
    /// one round trip if the backend can, reading up to `first_read` rows of each claimed
    /// shard's head with it if it can ([`Claim::head`]). The default claims them one at a
    /// time.
    fn claim_many(
        &self,
        pool: &Pool<Self::Database>,
        shards: &[ShardKey],
        options: &ClaimOptions,
        first_read: usize,
    ) -> impl Future<Output = Result<Vec<Claim<Self>>, Error>> + Send {
        let _ = first_read;
        claim_each(self, pool, shards, options)
    }

    /// Up to `limit` shards with pending rows after `cursor`, in key order (`scope` is the
    /// cursor's scope, or one below every scope for the first page), each with whether it is
    /// due: the rows of [`Statements::discover`] ([`crate::store::discover_rows`] reads them
    /// row by row; a backend may have them come back otherwise).
    fn discover(
        &self,
        pool: &Pool<Self::Database>,
        scope: i32,
        cursor: &ShardKey,
        limit: i32,
    ) -> impl Future<Output = Result<Vec<(ShardKey, bool)>, Error>> + Send;

    /// Whether [`Dialect::ack_and_release_on`] is one statement: then it runs on a pooled
    /// connection, as its own transaction, rather than in one the caller begins and commits.
    const FINISHES_IN_ONE_STATEMENT: bool = false;

    /// Acknowledges and releases drained shards on `conn`, a write transaction the caller
    /// commits (or, with [`Dialect::FINISHES_IN_ONE_STATEMENT`], a pooled connection): for
    /// each of `batch` (a lease, its duration, the rows it acknowledges), the rows deleted and
    /// whether the release found the lease, or [`Error::LeaseLost`] if the lease was not held
    /// (nothing of that shard changed). An error is the batch's: its transaction must not
    /// commit. [`crate::session::ack_and_release_each`] runs each shard's statements in turn;
    /// a backend may do them all in one statement.
    fn ack_and_release_on<'c>(
        &'c self,
        conn: &'c mut <Self::Database as Database>::Connection,
        batch: &'c [Finishing],
    ) -> impl Future<Output = Result<Vec<Finished>, Error>> + Send + 'c;

    /// A stream of the wake-ups that other processes' commits send, if the backend has one
    /// (the relay hears this process's own commits directly: see [`crate::wake`]).
    fn wakeups(
        pool: &Pool<Self::Database>,
    ) -> impl Future<Output = Result<Option<Self::Wakeups>, Error>> + Send;

    /// The identity of the database `pool` connects to (PostgreSQL's host, port and
    /// database; SQLite's file): the relays of this process on the same database hear the
    /// commits made on `pool` ([`crate::wake`]).
    fn database_key(pool: &Pool<Self::Database>) -> String;

    /// Tells the relays of other processes, after the commit and outside it, that `shards`
    /// were committed on `pool` (whose [`database_key`](Self::database_key) is `database`).
    /// PostgreSQL sends a `NOTIFY`, coalesced with the others this process makes while one is
    /// in flight; by default, nothing (the relays' polling finds the messages).
    fn announce_elsewhere(pool: &Pool<Self::Database>, database: &str, shards: &[ShardKey]) {
        let _ = (pool, database, shards);
    }

    /// Checks beyond the migrations, once the schema is known to be current (say, rows set
    /// aside by a migration that an operator should look at). None by default.
    fn check_schema(pool: &Pool<Self::Database>) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = pool;
        async { Ok(()) }
    }
}

/// A drained shard to finish: its lease, the lease's duration, and the rows it acknowledges.
pub type Finishing = (Lease, Duration, Vec<Acknowledgement>);

/// How a drained shard's finish went: the rows it deleted and whether the release found the
/// lease, or [`Error::LeaseLost`].
pub type Finished = Result<(u64, bool), Error>;
