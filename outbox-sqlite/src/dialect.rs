//! SQLite's dialect of the shared body: its SQL, its claims (`BEGIN IMMEDIATE`, behind an
//! in-process turn), its error messages. SQLite has no notifications: relays poll.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::columns::ModelRow;
use outbox_core::replicated::ModelTable;
use outbox_core::store::{
    ClaimOptions, EmbeddedMigration, GroupKey, HandlerMode, Lease, NoWakeups, StoredMessage,
};
use outbox_core::{CategoryId, Error, Id, Message, MessageId, ScopeId, ShardKey};
use outbox_sqlx::error::database;
use outbox_sqlx::session::shard_keyed;
use outbox_sqlx::sql::Statement;
use outbox_sqlx::{
    Ack, BackfillStatements, Claim, Claiming, Dialect, Fault, InboxStatements, RelayStatements,
    SetAsideStatements, Statements,
};
use sqlx::error::DatabaseError;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteQueryResult, SqliteRow};
use sqlx::{AssertSqlSafe, Database, Row, Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::{Mutex, OwnedMutexGuard};

/// SQLite, for the shared body of the `sqlx` backends.
///
/// The relay's write transactions (claims, acknowledgements, releases) take turns on an
/// in-process lock shared by the clones of a store and its sessions before they ask SQLite
/// for its write lock: the relay's concurrent shards queue for it at once instead of sleeping
/// in SQLite's busy handler. Lease extensions go before every other write queued: they wait
/// for the one running at most.
#[derive(Debug, Clone, Default)]
pub struct SqliteDialect {
    /// Held by the write running.
    writes: Arc<Mutex<()>>,
    /// Held by the write running or next, of those that are not lease extensions: while one
    /// of them runs, the others wait here, so an extension that asks for `writes` is next.
    queue: Arc<Mutex<()>>,
}

/// A turn of the relay's writes on SQLite ([`Dialect::take_turn`]): while it is held, no
/// other write of the process's relay runs.
#[derive(Debug)]
pub struct SqliteTurn {
    // Declared first, dropped first: a lease extension waiting is the next to write.
    _write: OwnedMutexGuard<()>,
    _queue: Option<OwnedMutexGuard<()>>,
}

impl SqliteDialect {
    /// A turn that comes before those already queued: only the write running ends first (and,
    /// if that is another extension, the one write that was next).
    async fn take_turn_first(&self) -> SqliteTurn {
        SqliteTurn {
            _write: Arc::clone(&self.writes).lock_owned().await,
            _queue: None,
        }
    }
}

/// How long a lease extension waits between two tries of SQLite's write lock: it polls
/// instead of sleeping in SQLite's busy handler, whose sleeps grow to 100 ms and so lose the
/// lock, under contention, to every writer that asks after them.
const EXTENSION_POLL: Duration = Duration::from_millis(1);

/// Whether `error` is SQLite's "database is locked" (`SQLITE_BUSY`, any of its extended codes).
fn is_busy(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == 5)
}

/// A pooled connection whose busy timeout is turned off while a lease extension polls for the
/// write lock; dropped before [`NoBusyHandler::restore`] (its future cancelled), it is closed
/// rather than returned to the pool without a busy timeout.
struct NoBusyHandler {
    conn: Option<PoolConnection<Sqlite>>,
    /// The connection's busy timeout, in milliseconds.
    timeout_ms: u64,
}

impl NoBusyHandler {
    async fn acquire(pool: &SqlitePool) -> Result<Self, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        let timeout_ms: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(&mut *conn)
            .await?;
        sqlx::query("PRAGMA busy_timeout = 0")
            .execute(&mut *conn)
            .await?;
        Ok(Self {
            conn: Some(conn),
            timeout_ms: u64::try_from(timeout_ms).unwrap_or(0),
        })
    }

    fn conn(&mut self) -> &mut SqliteConnection {
        self.conn
            .as_mut()
            .expect("the connection is held until restored")
    }

    /// Gives the connection its busy timeout back, and back to the pool.
    async fn restore(mut self) -> Result<(), sqlx::Error> {
        let timeout = format!("PRAGMA busy_timeout = {}", self.timeout_ms);
        sqlx::query(AssertSqlSafe(timeout))
            .execute(self.conn())
            .await?;
        self.conn = None;
        Ok(())
    }
}

impl Drop for NoBusyHandler {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.conn {
            conn.close_on_drop();
        }
    }
}

/// The database's clock, in milliseconds since the Unix epoch: how the SQLite tables store
/// time (the same expression as the columns' defaults).
macro_rules! now {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

/// An identifier column as JSON, as [`id_from_json`] reads it back: an integer as a number, a
/// wide one's 16 bytes (a BLOB) as `{"wide": hex digits}` (JSON has no bytes).
macro_rules! id_json {
    ($column:literal) => {
        concat!(
            "iif(typeof(",
            $column,
            ") = 'blob', json_object('wide', hex(",
            $column,
            ")), ",
            $column,
            ")"
        )
    };
}

/// The embedded migrations, in order.
pub(crate) const MIGRATIONS: &[EmbeddedMigration] = &[
    EmbeddedMigration {
        version: 1,
        description: "outbox tables",
        sql: include_str!("../migrations/0001_outbox.sql"),
    },
    EmbeddedMigration {
        version: 2,
        description: "outbox rows checked at write time",
        sql: include_str!("../migrations/0002_checked_messages.sql"),
    },
    EmbeddedMigration {
        version: 3,
        description: "identifiers wider than an INTEGER",
        sql: include_str!("../migrations/0003_wide_identifiers.sql"),
    },
    EmbeddedMigration {
        version: 4,
        description: "dead letters and pauses",
        sql: include_str!("../migrations/0004_dead_letters_and_pauses.sql"),
    },
    EmbeddedMigration {
        version: 5,
        description: "message metadata",
        sql: include_str!("../migrations/0005_message_metadata.sql"),
    },
    EmbeddedMigration {
        version: 6,
        description: "backfill watermarks",
        sql: include_str!("../migrations/0006_backfills.sql"),
    },
    EmbeddedMigration {
        version: 7,
        description: "relays' heartbeats",
        sql: include_str!("../migrations/0007_relays.sql"),
    },
    EmbeddedMigration {
        version: 8,
        description: "the inbox",
        sql: include_str!("../migrations/0008_inbox.sql"),
    },
];

/// A wide identifier in a JSON parameter: its 32 hex digits (JSON holds no bytes), which
/// `unhex` turns back into the BLOB; an integer is a JSON number.
fn id_json(id: Id) -> serde_json::Value {
    match id.as_wide() {
        Some(wide) => format!("{wide:032x}").into(),
        None => id.as_integer().into(),
    }
}

/// An identifier from a JSON number, or from a wide one's hex digits as `{"wide": digits}`
/// (what a head read makes of a BLOB: text in the column is no identifier).
fn id_from_json(value: &serde_json::Value) -> Option<Id> {
    if let Some(integer) = value.as_i64() {
        return Some(Id::integer(integer));
    }
    let digits = value.get("wide")?.as_str()?;
    (digits.len() == 32)
        .then(|| u128::from_str_radix(digits, 16).ok())
        .flatten()
        .map(Id::wide)
}

const INSERT_MESSAGE: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, destination, category, object_identifier, payload, \
         metadata) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
    RETURNING id";

// One statement for any number of messages: the rows travel as one JSON array parameter.
const INSERT_MESSAGES: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, destination, category, object_identifier, payload, \
         metadata) \
    SELECT value ->> 0, iif(json_type(value, '$[1]') = 'text', unhex(value ->> 1), value ->> 1), \
        value ->> 2, value ->> 3, \
        iif(json_type(value, '$[4]') = 'text', unhex(value ->> 4), value ->> 4), value ->> 5, \
        value ->> 6 \
    FROM jsonb_each(?1) ORDER BY key \
    RETURNING id";

macro_rules! fetch {
    () => {
        "SELECT id, category, shard_scope, object_identifier, payload, \
            created_at * 1000 AS created_us, metadata FROM outbox_messages \
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
    "SELECT json_group_array(json_array(id, category, shard_scope, ",
    id_json!("object_identifier"),
    ", payload, created_us, metadata)) \
     FROM (",
    fetch!(),
    ")"
);

// Each group's rows in `?5 < id <= ?6`: the newest whole, and the ids of all of them.
pub(crate) const FETCH_NEWEST: &str = "\
    SELECT m.id, m.category, m.shard_scope, m.object_identifier, m.payload, \
        m.created_at * 1000, m.metadata, ( \
        SELECT json_group_array(x.id) FROM outbox_messages x \
        WHERE x.shard_scope = ?1 AND x.shard_identifier = ?2 AND x.destination = ?3 \
            AND x.category = m.category AND x.object_identifier = m.object_identifier \
            AND x.id > ?5 AND x.id <= m.id) \
    FROM jsonb_each(?4) g JOIN outbox_messages m ON m.id = ( \
        SELECT x.id FROM outbox_messages x \
        WHERE x.shard_scope = ?1 AND x.shard_identifier = ?2 AND x.destination = ?3 \
            AND x.category = g.value ->> 0 \
            AND x.object_identifier \
                = iif(json_type(g.value, '$[1]') = 'text', unhex(g.value ->> 1), g.value ->> 1) \
            AND x.id > ?5 AND x.id <= ?6 \
        ORDER BY x.id DESC LIMIT 1)";

pub(crate) const EXTEND_LEASE: &str = concat!(
    "UPDATE outbox_shards SET lease_expires_at = ",
    now!(),
    " + ?5 \
     WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4"
);

// An acknowledgement proves and extends the lease, and the head it moved past takes its
// attempts with it.
const ACK_LEASE: &str = concat!(
    "UPDATE outbox_shards SET lease_expires_at = ",
    now!(),
    " + ?5, attempts = 0, first_failed_at = NULL \
     WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4"
);

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
        first_failed_at = NULL, last_error = NULL, retry_at = NULL, parked_category = NULL \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4";

const RELEASE_LEASE: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4";

// A first failure (attempt 1, or none recorded) starts the failures' clock. A park (S26)
// waits for no time and no message: its retry time is the end of year 9999 (ms) and its
// watermark the highest id, until a relay that knows the category unparks it.
const FAIL: &str = concat!(
    "UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL, attempts = ?5, \
        first_failed_at = iif(?5 <= 1 OR first_failed_at IS NULL, ",
    now!(),
    ", first_failed_at), \
        last_error = ?6, retry_at = iif(?9 IS NULL, ",
    now!(),
    " + ?7, 253402300799000), watermark = iif(?9 IS NULL, ?8, 9223372036854775807), \
        parked_category = ?9 \
     WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND lease_token = ?4"
);

// A lease given up after an interrupted drain: it lapses now, so the shard is due at once and
// its next claim counts as a takeover (an attempt more at the head, whose messages the
// interrupted drain may have delivered).
const RELEASE_INTERRUPTED: &str = concat!(
    "UPDATE outbox_shards SET lease_expires_at = ",
    now!(),
    " WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 \
        AND lease_token = ?4"
);

// The id of the first row of the shard after `k`'s in `k`'s scope, by key (NULL past the
// scope's last): the two index seeks of the skip-scans.
macro_rules! next_in_scope {
    () => {
        "(SELECT x.id FROM outbox_messages x \
             WHERE x.shard_scope = k.shard_scope AND x.shard_identifier = k.shard_identifier \
                AND x.destination > k.destination \
             ORDER BY x.destination LIMIT 1), \
            (SELECT x.id FROM outbox_messages x \
             WHERE x.shard_scope = k.shard_scope AND x.shard_identifier > k.shard_identifier \
             ORDER BY x.shard_identifier, x.destination LIMIT 1)"
    };
}

// Skip-scan: one index seek per shard with pending rows, never a read of every row. Each step
// finds the first row of the next shard in key order: in the same shard identifier (a later
// destination), else a later shard identifier, else a later scope. (SQLite seeks a row value
// compared with bound parameters, but one compared with the columns of the recursive step only
// on its first column: that would read every row of the scope before the next shard.) Shards are due when nobody holds a live
// lease on them and they are not backing off, or have a message newer than their failure.
macro_rules! discover {
    () => {
concat!(
    "\
    WITH RECURSIVE keys(shard_scope, shard_identifier, destination, n) AS ( \
        SELECT * FROM ( \
            SELECT shard_scope, shard_identifier, destination, 1 FROM outbox_messages \
            WHERE (shard_scope, shard_identifier, destination) > (?1, ?2, ?3) \
            ORDER BY shard_scope, shard_identifier, destination LIMIT 1) \
        UNION ALL \
        SELECT m.shard_scope, m.shard_identifier, m.destination, k.n + 1 \
        FROM keys k JOIN outbox_messages m ON m.id = coalesce(",
    next_in_scope!(),
    ", \
            (SELECT x.id FROM outbox_messages x \
             WHERE x.shard_scope > k.shard_scope \
             ORDER BY x.shard_scope, x.shard_identifier, x.destination LIMIT 1)) \
        WHERE k.n < ?4 \
    ) \
    SELECT k.shard_scope, k.shard_identifier, k.destination, \
        (s.shard_scope IS NULL OR ( \
            (s.lease_expires_at IS NULL OR s.lease_expires_at <= ",
    now!(),
    ") \
            AND (s.retry_at IS NULL OR s.retry_at <= ",
    now!(),
    " OR EXISTS ( \
                SELECT 1 FROM outbox_messages m \
                WHERE m.shard_scope = k.shard_scope AND m.shard_identifier = k.shard_identifier \
                    AND m.destination = k.destination AND m.id > s.watermark)))) \
        AND NOT ",
    outbox_sqlx::paused!("k.shard_scope", "k.shard_identifier", "k.destination"),
    " AS due, k.n \
    FROM keys k LEFT JOIN outbox_shards s \
        ON s.shard_scope = k.shard_scope AND s.shard_identifier = k.shard_identifier \
        AND s.destination = k.destination \
    ORDER BY k.n"
)
    };
}
pub(crate) const DISCOVER: &str = discover!();

// DISCOVER's rows as one JSON array, each `[scope, identifier, destination, due]` (a wide
// identifier as `{"wide": digits}`), in key order: `sqlx` hands each row over on its own.
pub(crate) const DISCOVER_JSON: &str = concat!(
    "SELECT json_group_array(json_array(d.shard_scope, ",
    id_json!("d.shard_identifier"),
    ", d.destination, d.due) ORDER BY d.n) FROM (",
    discover!(),
    ") d"
);

const NEXT_TOKEN: &str =
    "UPDATE outbox_sequences SET value = value + 1 WHERE name = 'lease_token' RETURNING value";

// A claim's upsert of the state row `excluded` would insert: the lease taken if the shard
// is due (not leased, not backing off or with a message newer than its failure), an attempt
// more if a lapsed lease is taken over.
macro_rules! claim_upsert {
    () => {
        concat!(
            "ON CONFLICT (shard_scope, shard_identifier, destination) DO UPDATE SET \
                lease_owner = excluded.lease_owner, \
                lease_token = excluded.lease_token, \
                lease_expires_at = excluded.lease_expires_at, \
                attempts = outbox_shards.attempts + (outbox_shards.lease_owner IS NOT NULL) \
             WHERE (outbox_shards.lease_expires_at IS NULL \
                    OR outbox_shards.lease_expires_at <= ",
            now!(),
            ") \
                AND (outbox_shards.retry_at IS NULL OR outbox_shards.retry_at <= ",
            now!(),
            " OR EXISTS ( \
                    SELECT 1 FROM outbox_messages m \
                    WHERE m.shard_scope = excluded.shard_scope \
                        AND m.shard_identifier = excluded.shard_identifier \
                        AND m.destination = excluded.destination \
                        AND m.id > outbox_shards.watermark)) "
        )
    };
}

pub(crate) mod together;

// Takes the lease if the shard is due, unleased and not paused, creating its state row if it
// has none. A lease that lapsed without a release (its holder died mid-drain, having perhaps
// delivered the head) counts as an attempt at the head.
pub(crate) const CLAIM: &str = concat!(
    "\
    INSERT INTO outbox_shards \
        (shard_scope, shard_identifier, destination, lease_owner, lease_token, lease_expires_at) \
    SELECT ?1, ?2, ?3, ?4, ?5, ",
    now!(),
    " + ?6 \
    WHERE NOT ",
    outbox_sqlx::paused!("?1", "?2", "?3"),
    " ",
    claim_upsert!(),
    "RETURNING attempts"
);

// The holder of the shard's lease, if it has one. Read before the claim in its write
// transaction: if the claim then takes the shard, the lease had lapsed, and the claim counts
// the takeover (an attempt more) by the same row.
const HOLDER: &str = "\
    SELECT lease_owner FROM outbox_shards \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 \
        AND lease_owner IS NOT NULL";

const UNPARK: &str = concat!(
    "UPDATE outbox_shards SET parked_category = NULL, retry_at = ",
    now!(),
    " WHERE parked_category IN (SELECT value FROM json_each(?1)) AND retry_at > ",
    now!()
);

const RESCHEDULE: &str = concat!(
    "UPDATE outbox_shards SET retry_at = ",
    now!(),
    " WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND retry_at > ",
    now!()
);

const PENDING_MESSAGES: &str = "\
    SELECT id, shard_scope, shard_identifier, destination, category, object_identifier, \
        payload, created_at, metadata \
    FROM outbox_messages ORDER BY id LIMIT ?1";

const DEAD_LETTER: &str = concat!(
    "\
    INSERT INTO outbox_dead_letters (message_id, shard_scope, shard_identifier, destination, \
        category, object_identifier, payload, created_at, error, attempts, first_failed_at, \
        dead_lettered_at, lease_token, metadata) \
    SELECT m.id, m.shard_scope, m.shard_identifier, m.destination, m.category, \
        m.object_identifier, m.payload, m.created_at, ?6, ?7, coalesce(s.first_failed_at, ",
    now!(),
    "), ",
    now!(),
    ", s.lease_token, m.metadata \
    FROM outbox_messages m JOIN outbox_shards s \
        ON s.shard_scope = ?1 AND s.shard_identifier = ?2 AND s.destination = ?3 \
            AND s.lease_token = ?4 \
    WHERE m.id IN (SELECT value FROM json_each(?5)) \
        AND m.shard_scope = ?1 AND m.shard_identifier = ?2 AND m.destination = ?3"
);

pub(crate) const DEAD_LETTERS: &str = concat!(
    "\
    SELECT message_id, shard_scope, shard_identifier, destination, category, \
        object_identifier, payload, created_at, error, attempts, first_failed_at, \
        dead_lettered_at, lease_token, metadata \
    FROM outbox_dead_letters \
    WHERE (?1 IS NULL OR category = ?1) \
        AND (?2 IS NULL OR shard_scope = ?2) \
        AND (?3 IS NULL OR (shard_scope = ?3 AND shard_identifier = ?4 AND destination = ?5)) \
        AND (?6 IS NULL OR dead_lettered_at <= ",
    now!(),
    " - ?6) \
        AND (?8 = 0 OR message_id IN (SELECT value FROM json_each(?9))) \
        AND message_id BETWEEN ?10 AND ?11 \
    ORDER BY message_id LIMIT ?7"
);

const REPLAY_DEAD_LETTERS: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, destination, category, object_identifier, payload, \
         metadata) \
    SELECT shard_scope, shard_identifier, destination, category, object_identifier, payload, \
        metadata \
    FROM outbox_dead_letters WHERE message_id IN (SELECT value FROM json_each(?1)) \
    ORDER BY message_id \
    RETURNING id";

const PURGE_EXPIRED_DEAD_LETTERS: &str = concat!(
    "\
    DELETE FROM outbox_dead_letters WHERE message_id IN ( \
        SELECT message_id FROM outbox_dead_letters WHERE dead_lettered_at <= ",
    now!(),
    " - ?1 \
        ORDER BY dead_lettered_at LIMIT ?2)"
);

const PAUSE: &str = concat!(
    "\
    INSERT INTO outbox_pauses \
        (kind, shard_scope, shard_identifier, destination, category, reason, paused_at) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ",
    now!(),
    ") ON CONFLICT DO NOTHING"
);

const PAUSES: &str = "\
    SELECT kind, shard_scope, shard_identifier, destination, category, reason, paused_at \
    FROM outbox_pauses ORDER BY paused_at, kind, shard_scope, shard_identifier, destination, \
        category";

// In id order, the first row whose shard is not backing off (with no message newer than its
// failure) nor paused.
const OLDEST_DUE_AGE: &str = concat!(
    "SELECT ",
    now!(),
    " - m.created_at \
    FROM outbox_messages m \
    WHERE NOT EXISTS (SELECT 1 FROM outbox_shards s \
            WHERE s.shard_scope = m.shard_scope AND s.shard_identifier = m.shard_identifier \
                AND s.destination = m.destination AND s.retry_at > ",
    now!(),
    " AND NOT EXISTS (SELECT 1 FROM outbox_messages n \
                    WHERE n.shard_scope = m.shard_scope \
                        AND n.shard_identifier = m.shard_identifier \
                        AND n.destination = m.destination AND n.id > s.watermark)) \
        AND NOT ",
    outbox_sqlx::paused!("m.shard_scope", "m.shard_identifier", "m.destination"),
    " ORDER BY m.id LIMIT 1"
);

/// A watermark's columns (see [`BackfillStatements`]).
macro_rules! watermark {
    () => {
        "category, model, declared_version, target_version, walking_version, done_version, \
         low_bound, rows_walked, destinations, worker, started_at, updated_at, completed_at, \
         last_error"
    };
}

// The batch's write transaction holds the database: `lock` needs no row lock.
const BACKFILL: BackfillStatements = BackfillStatements {
    ensure: "INSERT INTO outbox_backfills (category, model) VALUES (?1, ?2) \
             ON CONFLICT (category) DO NOTHING",
    lock: concat!(
        "SELECT ",
        watermark!(),
        " FROM outbox_backfills WHERE category = ?1"
    ),
    declare: concat!(
        "UPDATE outbox_backfills SET model = ?2, declared_version = ?3, updated_at = ",
        now!(),
        " WHERE category = ?1"
    ),
    backlog: "SELECT count(*) FROM (SELECT 1 FROM outbox_messages LIMIT ?1)",
    record: concat!(
        "UPDATE outbox_backfills SET model = ?2, declared_version = ?3, walking_version = ?4, \
             done_version = ?5, low_bound = ?6, rows_walked = ?7, worker = ?8, \
             started_at = CASE WHEN ?9 = 1 THEN ",
        now!(),
        " ELSE started_at END, completed_at = CASE WHEN ?10 = 1 THEN ",
        now!(),
        " ELSE completed_at END, updated_at = ",
        now!(),
        ", last_error = NULL WHERE category = ?1 RETURNING ",
        watermark!()
    ),
    fail: concat!(
        "UPDATE outbox_backfills SET last_error = ?2, updated_at = ",
        now!(),
        " WHERE category = ?1"
    ),
    list: concat!(
        "SELECT ",
        watermark!(),
        " FROM outbox_backfills ORDER BY category"
    ),
    start: concat!(
        "INSERT INTO outbox_backfills AS b (category, model, target_version, destinations) \
         VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (category) DO UPDATE SET target_version = excluded.target_version, \
             destinations = excluded.destinations, updated_at = ",
        now!(),
        ", model = CASE WHEN b.model = '' THEN excluded.model ELSE b.model END RETURNING ",
        watermark!()
    ),
    pause: concat!(
        "UPDATE outbox_backfills SET target_version = done_version, updated_at = ",
        now!(),
        " WHERE category = ?1 AND target_version > done_version"
    ),
};

const COMPACT_PAUSED: &str =
    outbox_sqlx::compact_paused!("x.category IN (SELECT value FROM json_each(?1))", "", "?2");

// Each shard with pending messages (of the shards `$filter` and `$having` keep), counted by
// grouping its rows, with its state and its status: what operators list and count.
macro_rules! shard_view {
    ($filter:literal) => {
        shard_view!($filter, "")
    };
    ($filter:literal, $having:literal) => {
        concat!(
            "WITH ",
            shard_view_of!(
                "SELECT shard_scope, shard_identifier, destination, count(*) AS pending, \
                    min(created_at) AS oldest, max(id) AS newest, 0 AS estimated \
                FROM outbox_messages ",
                $filter,
                " GROUP BY shard_scope, shard_identifier, destination ",
                $having
            )
        )
    };
}

// The view over the shards `k` (its body the tokens given) lists with their pending messages
// (`pending`, `estimated`), oldest creation time and newest id: their states and statuses.
macro_rules! shard_view_of {
    ($($k:tt)*) => {
        concat!(
            "k AS (",
            $($k)*,
            "), \
            w AS ( \
                SELECT k.shard_scope, k.shard_identifier, k.destination, k.pending, k.oldest, \
                    k.estimated, coalesce(s.attempts, 0) AS attempts, s.last_error, s.retry_at, \
                    s.parked_category, \
                    iif(s.lease_expires_at > ",
            now!(),
            ", s.lease_owner, NULL) AS lease_owner, \
                    coalesce(s.lease_expires_at > ",
            now!(),
            ", 0) AS in_flight, \
                    coalesce(s.retry_at > ",
            now!(),
            " AND k.newest <= s.watermark, 0) AS waiting, ",
            outbox_sqlx::paused!("k.shard_scope", "k.shard_identifier", "k.destination"),
            " AS paused \
                FROM k LEFT JOIN outbox_shards s ON s.shard_scope = k.shard_scope \
                    AND s.shard_identifier = k.shard_identifier AND s.destination = k.destination), \
            v AS (SELECT w.*, ",
            outbox_sqlx::shard_status!(),
            " AS state FROM w) "
        )
    };
}

// A shard of the view as `Statements::shards` returns it.
macro_rules! shard_columns {
    () => {
        "shard_scope, shard_identifier, destination, pending, oldest, attempts, last_error, \
        iif(state = 'parked', NULL, retry_at), parked_category, lease_owner, paused, state, \
        estimated"
    };
}

const STATUS: &str = concat!(
    shard_view!(""),
    ", d AS (SELECT ",
    shard_columns!(),
    " FROM v ORDER BY pending DESC, shard_scope, shard_identifier, destination LIMIT ?1) \
    SELECT t.*, d.* FROM ( \
        SELECT count(*), coalesce(sum(pending), 0), min(oldest), ",
    outbox_sqlx::shard_counts!(),
    ", (SELECT count(*) FROM outbox_dead_letters), \
            (SELECT min(dead_lettered_at) FROM outbox_dead_letters) \
        FROM v) t \
    LEFT JOIN d ON 1 \
    ORDER BY d.pending DESC, d.shard_scope, d.shard_identifier, d.destination"
);

// The view's shards that `?1` keeps (a `ShardFilter`'s name), deepest first, at most `?2`.
macro_rules! listed {
    () => {
        concat!(
            "SELECT ",
            shard_columns!(),
            " FROM v WHERE (?1 = 'pending' \
                OR (?1 = 'failing' AND (attempts > 0 OR last_error IS NOT NULL)) \
                OR (?1 = 'paused' AND paused) \
                OR (?1 = 'parked' AND parked_category IS NOT NULL))",
            " ORDER BY pending DESC, shard_scope, shard_identifier, destination LIMIT ?2"
        )
    };
}

const SHARDS: &str = concat!(
    shard_view!(
        "WHERE (?3 IS NULL OR shard_scope = ?3)",
        "HAVING ?4 IS NULL OR sum(category = ?4) > 0"
    ),
    listed!()
);

// The failing or parked shards: their messages only, found from their state rows.
pub(crate) const FAILING_SHARDS: &str = concat!(
    shard_view!(
        "WHERE (shard_scope, shard_identifier, destination) IN ( \
            SELECT shard_scope, shard_identifier, destination FROM outbox_shards \
            WHERE ((?1 = 'failing' AND (attempts > 0 OR last_error IS NOT NULL)) \
                OR (?1 = 'parked' AND parked_category IS NOT NULL)) \
                AND (?3 IS NULL OR shard_scope = ?3))",
        "HAVING ?4 IS NULL OR sum(category = ?4) > 0"
    ),
    listed!()
);

// The shards of a large backlog ranked from a sample, as PostgreSQL's (see there): windows
// of `?6` ids every `?5`th of the id span, the candidates' messages counted up to `?7`.
pub(crate) const SAMPLED_SHARDS: &str = concat!(
    "WITH RECURSIVE b AS ( \
        SELECT lo, hi, max(?6, (hi - lo + 1) / ?5) AS step FROM ( \
            SELECT (SELECT min(id) FROM outbox_messages) AS lo, \
                (SELECT max(id) FROM outbox_messages) AS hi) \
        WHERE lo IS NOT NULL), \
    g(start, step) AS (SELECT lo, step FROM b \
        UNION ALL SELECT g.start + g.step, g.step FROM g JOIN b WHERE g.start + g.step <= b.hi), \
    hit AS MATERIALIZED (SELECT m.shard_scope, m.shard_identifier, m.destination, m.category, \
            g.step \
        FROM g JOIN outbox_messages m ON m.id >= g.start AND m.id < g.start + ?6), \
    seen AS (SELECT shard_scope, shard_identifier, destination, \
            count(*) * max(step) / ?6 AS guess \
        FROM hit WHERE ?3 IS NULL OR shard_scope = ?3 \
        GROUP BY shard_scope, shard_identifier, destination \
        HAVING ?4 IS NULL OR sum(category = ?4) > 0 \
        ORDER BY guess DESC, shard_scope, shard_identifier, destination LIMIT ?2), \
    seeds(scope) AS (SELECT ?3 WHERE ?3 IS NOT NULL \
        UNION SELECT shard_scope FROM outbox_pauses WHERE ?1 = 'paused' AND kind = 'scope'), \
    scoped(shard_scope, shard_identifier, destination, n) AS ( \
        SELECT m.shard_scope, m.shard_identifier, m.destination, 1 \
        FROM seeds JOIN outbox_messages m ON m.id = ( \
            SELECT x.id FROM outbox_messages x WHERE x.shard_scope = seeds.scope \
            ORDER BY x.shard_scope, x.shard_identifier, x.destination LIMIT 1) \
        UNION ALL \
        SELECT m.shard_scope, m.shard_identifier, m.destination, k.n + 1 \
        FROM scoped k JOIN outbox_messages m ON m.id = coalesce(",
    next_in_scope!(),
    ") \
        WHERE k.n < ?2), \
    c AS (SELECT shard_scope, shard_identifier, destination, max(guess) AS guess, \
            (SELECT count(*) FROM (SELECT 1 FROM outbox_messages m \
                WHERE m.shard_scope = u.shard_scope AND m.shard_identifier = u.shard_identifier \
                    AND m.destination = u.destination LIMIT ?7)) AS counted \
        FROM ( \
            SELECT shard_scope, shard_identifier, destination, guess FROM seen \
            UNION ALL SELECT shard_scope, shard_identifier, destination, 0 FROM scoped \
            UNION ALL SELECT shard_scope, shard_identifier, destination, 0 FROM outbox_pauses \
                WHERE ?1 = 'paused' AND kind = 'shard' AND (?3 IS NULL OR shard_scope = ?3)) u \
        GROUP BY shard_scope, shard_identifier, destination), ",
    shard_view_of!(
        "SELECT c.shard_scope, c.shard_identifier, c.destination, \
            iif(c.counted < ?7, c.counted, max(c.counted, c.guess)) AS pending, \
            (SELECT m.created_at FROM outbox_messages m WHERE m.shard_scope = c.shard_scope \
                AND m.shard_identifier = c.shard_identifier AND m.destination = c.destination \
                ORDER BY m.id LIMIT 1) AS oldest, \
            (SELECT m.id FROM outbox_messages m WHERE m.shard_scope = c.shard_scope \
                AND m.shard_identifier = c.shard_identifier AND m.destination = c.destination \
                ORDER BY m.id DESC LIMIT 1) AS newest, \
            c.counted >= ?7 AS estimated \
        FROM c WHERE c.counted > 0 AND (?4 IS NULL OR EXISTS ( \
            SELECT 1 FROM outbox_messages m WHERE m.shard_scope = c.shard_scope \
                AND m.shard_identifier = c.shard_identifier AND m.destination = c.destination \
                AND m.category = ?4))"
    ),
    ", d AS (",
    listed!(),
    ") \
    SELECT t.sampled, d.* FROM (SELECT count(*) AS sampled FROM hit) t LEFT JOIN d ON 1 \
    ORDER BY d.pending DESC, d.shard_scope, d.shard_identifier, d.destination"
);

// The gauges above the exact limit: the span of the message ids (an upper bound, never below
// the limit), the first message by id, the shard states (few: shards held, failing or
// parked), the shard pauses, and the dead letters counted up to the limit (their id span
// above it).
pub(crate) const GAUGES: &str = concat!(
    "SELECT max(?1, coalesce((SELECT max(id) FROM outbox_messages) \
            - (SELECT min(id) FROM outbox_messages) + 1, 0)), \
        (SELECT created_at FROM outbox_messages \
            WHERE id = (SELECT min(id) FROM outbox_messages)), \
        count(*) FILTER (WHERE s.lease_expires_at > ",
    now!(),
    "), \
        count(*) FILTER (WHERE NOT coalesce(s.lease_expires_at > ",
    now!(),
    ", 0) AND s.retry_at > ",
    now!(),
    " AND s.parked_category IS NULL \
            AND NOT EXISTS (SELECT 1 FROM outbox_messages m WHERE m.shard_scope = s.shard_scope \
                AND m.shard_identifier = s.shard_identifier AND m.destination = s.destination \
                AND m.id > s.watermark)), \
        count(*) FILTER (WHERE NOT coalesce(s.lease_expires_at > ",
    now!(),
    ", 0) AND s.retry_at > ",
    now!(),
    " AND s.parked_category IS NOT NULL), \
        (SELECT count(*) FROM outbox_pauses WHERE kind = 'shard'), \
        (SELECT iif(count(*) < ?1, count(*), \
                max(count(*), (SELECT max(message_id) FROM outbox_dead_letters) \
                    - (SELECT min(message_id) FROM outbox_dead_letters) + 1)) \
            FROM (SELECT 1 FROM outbox_dead_letters LIMIT ?1)), \
        (SELECT dead_lettered_at FROM outbox_dead_letters ORDER BY dead_lettered_at LIMIT 1) \
    FROM outbox_shards s"
);

// One shard, as PostgreSQL's (see there): counted up to `?4`, estimated above it.
const SHARD: &str = concat!(
    "WITH h AS (SELECT shard_scope, shard_identifier, destination, id, created_at \
        FROM outbox_messages WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 \
        ORDER BY id LIMIT 1), \
    n AS (SELECT h.*, \
        (SELECT count(*) FROM (SELECT 1 FROM outbox_messages m WHERE m.shard_scope = h.shard_scope \
            AND m.shard_identifier = h.shard_identifier AND m.destination = h.destination \
            LIMIT ?4)) AS counted, \
        (SELECT m.id FROM outbox_messages m WHERE m.shard_scope = h.shard_scope \
            AND m.shard_identifier = h.shard_identifier AND m.destination = h.destination \
            ORDER BY m.id DESC LIMIT 1) AS newest, \
        (SELECT m.id FROM outbox_messages m WHERE m.shard_scope = h.shard_scope \
            AND m.shard_identifier = h.shard_identifier AND m.destination = h.destination \
            ORDER BY m.id LIMIT 1 OFFSET ?4) AS beyond \
        FROM h), ",
    shard_view_of!(
        "SELECT shard_scope, shard_identifier, destination, \
            iif(beyond IS NULL, counted, \
                max(counted + 1, counted * (newest - id + 1) / (beyond - id))) AS pending, \
            created_at AS oldest, newest, beyond IS NOT NULL AS estimated FROM n"
    ),
    "SELECT ",
    shard_columns!(),
    " FROM v"
);

/// The inbox's statements.
const INBOX: InboxStatements = InboxStatements {
    record: "INSERT INTO outbox_inbox (consumer, message_id) VALUES (?1, ?2) \
             ON CONFLICT (consumer, message_id) DO NOTHING",
    purge: concat!(
        "DELETE FROM outbox_inbox WHERE consumer = ?1 AND received_at < ",
        now!(),
        " - ?2"
    ),
    purge_all: concat!(
        "DELETE FROM outbox_inbox WHERE received_at < ",
        now!(),
        " - ?1"
    ),
    dead_letter: "INSERT INTO outbox_inbox_dead_letters \
                      (consumer, message_id, category, headers, payload, error, attempts) \
                  VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    dead_letters: "SELECT id, consumer, message_id, category, headers, payload, error, attempts, \
                       failed_at \
                   FROM outbox_inbox_dead_letters \
                   WHERE ?1 IS NULL OR consumer = ?1 \
                   ORDER BY id LIMIT ?2",
};

/// The relays' heartbeats.
const RELAYS: RelayStatements = RelayStatements {
    beat: concat!(
        "INSERT INTO outbox_relays (worker, started_at, seen_at, expires_at, in_flight, \
             waiting, open_breakers) \
         VALUES (?1, ?2, ",
        now!(),
        ", ",
        now!(),
        " + ?3, ?4, ?5, ?6) \
         ON CONFLICT (worker) DO UPDATE SET started_at = excluded.started_at, \
             seen_at = excluded.seen_at, expires_at = excluded.expires_at, \
             in_flight = excluded.in_flight, waiting = excluded.waiting, \
             open_breakers = excluded.open_breakers"
    ),
    forget: concat!(
        "DELETE FROM outbox_relays WHERE expires_at < ",
        now!(),
        " - ?1"
    ),
    leave: "DELETE FROM outbox_relays WHERE worker = ?1",
    list: concat!(
        "SELECT worker, started_at, seen_at, expires_at - seen_at, in_flight, waiting, \
             open_breakers, expires_at > ",
        now!(),
        " FROM outbox_relays WHERE expires_at >= ",
        now!(),
        " - ?1 ORDER BY worker"
    ),
};

const SET_ASIDE: SetAsideStatements = SetAsideStatements {
    lock_message: "SELECT shard_scope, shard_identifier, destination FROM outbox_messages \
                   WHERE id = ?1",
    ensure_shard: "INSERT INTO outbox_shards (shard_scope, shard_identifier, destination) \
                   VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
    lock_shard: concat!(
        "SELECT iif(lease_expires_at > ",
        now!(),
        ", coalesce(lease_owner, ''), NULL) FROM outbox_shards \
         WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3"
    ),
    copy: concat!(
        "INSERT INTO outbox_dead_letters (message_id, shard_scope, shard_identifier, \
             destination, category, object_identifier, payload, created_at, error, attempts, \
             first_failed_at, dead_lettered_at, lease_token, metadata) \
         SELECT m.id, m.shard_scope, m.shard_identifier, m.destination, m.category, \
             m.object_identifier, m.payload, m.created_at, ?5, s.attempts, \
             coalesce(s.first_failed_at, ",
        now!(),
        "), ",
        now!(),
        ", coalesce(s.lease_token, 0), m.metadata \
         FROM outbox_messages m JOIN outbox_shards s \
             ON s.shard_scope = ?1 AND s.shard_identifier = ?2 AND s.destination = ?3 \
         WHERE m.id = ?4"
    ),
    clear_failures: "UPDATE outbox_shards SET attempts = 0, first_failed_at = NULL, \
                         last_error = NULL, retry_at = NULL, parked_category = NULL \
                     WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 \
                         AND NOT EXISTS (SELECT 1 FROM outbox_messages m \
                             WHERE m.shard_scope = ?1 AND m.shard_identifier = ?2 \
                                 AND m.destination = ?3 AND m.id < ?4)",
    delete: "DELETE FROM outbox_messages WHERE id = ?1",
};

const SHARD_MESSAGES: &str = "\
    SELECT id, shard_scope, shard_identifier, destination, category, object_identifier, \
        payload, created_at, metadata \
    FROM outbox_messages \
    WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 \
    ORDER BY id LIMIT ?4";

const SHARD_STATES: &str = "\
    SELECT shard_scope, shard_identifier, destination, attempts, last_error, retry_at, \
        lease_owner, lease_expires_at, lease_token, parked_category \
    FROM outbox_shards ORDER BY shard_scope, shard_identifier, destination";

/// One row of a shard's head, read as JSON `[id, category, scope, object, payload, created_at
/// (µs), metadata]`: a row that
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
    let object = field(3, "object_identifier")?;
    let object_identifier = id_from_json(object)
        .ok_or_else(|| undecodable(format!("object_identifier is {object}, not an identifier")))?;
    let payload = field(4, "payload")?;
    let created_at = integer(5, "created_at")?;
    let metadata = match field(6, "metadata")? {
        serde_json::Value::Null => None,
        serde_json::Value::String(text) => Some(text.clone()),
        other => return Err(undecodable(format!("metadata is {other}, not JSON text"))),
    };
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
        created_at: outbox_sqlx::session::from_micros(created_at),
        metadata,
    })
}

fn json_error(source: serde_json::Error) -> Error {
    Error::Database {
        operation: "reading a shard",
        source: Box::new(source),
    }
}

/// Claims `shard` in the write transaction `tx` if it is due and free: its lease.
async fn claim_on(
    tx: &mut SqliteConnection,
    shard: &ShardKey,
    options: &ClaimOptions,
) -> Result<Option<Lease>, Error> {
    let failed = || database::<SqliteDialect>("claiming a shard");
    let token: i64 = sqlx::query_scalar(NEXT_TOKEN)
        .fetch_one(&mut *tx)
        .await
        .map_err(failed())?;
    let holder: Option<String> = shard_keyed::<SqliteDialect>(HOLDER, shard)
        .fetch_optional(&mut *tx)
        .await
        .map_err(failed())?
        .map(|row| row.try_get(0))
        .transpose()
        .map_err(failed())?;
    let attempts: Option<i64> = shard_keyed::<SqliteDialect>(CLAIM, shard)
        .bind(options.worker.clone())
        .bind(token)
        .bind(i64::try_from(options.lease.as_millis()).unwrap_or(i64::MAX))
        .fetch_optional(&mut *tx)
        .await
        .map_err(failed())?
        .map(|row| row.try_get(0))
        .transpose()
        .map_err(failed())?;
    // Not read with a time of its own: two readings of the clock could disagree at the
    // lease's end, and a takeover the claim counted would go unmarked.
    Ok(attempts.map(|attempts| Lease {
        shard: shard.clone(),
        token,
        attempts: u32::try_from(attempts).unwrap_or(u32::MAX),
        previous_owner: holder,
    }))
}

/// Whether the SQLite this process links is recent enough ([`recent_enough`]), read once
/// (through `pool`) for the process's life: [`Error::Unsupported`] if not.
pub(crate) async fn recent_enough_on(pool: &SqlitePool) -> Result<(), Error> {
    static RECENT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let too_old = match RECENT.get() {
        Some(too_old) => too_old.clone(),
        None => {
            let version: String = sqlx::query_scalar("SELECT sqlite_version()")
                .fetch_one(pool)
                .await
                .map_err(database::<SqliteDialect>("reading SQLite's version"))?;
            let too_old = (!recent_enough(&version)).then_some(version);
            RECENT.get_or_init(|| too_old).clone()
        }
    };
    match too_old {
        None => Ok(()),
        Some(version) => {
            tracing::error!(
                version,
                "the outbox's statements need SQLite 3.45 or newer; this process links SQLite {version}"
            );
            Err(Error::Unsupported {
                store: "SQLite",
                feature: NEEDS,
            })
        }
    }
}

/// What the outbox's statements need of SQLite, as [`Error::Unsupported`] says it.
pub(crate) const NEEDS: &str = concat!(
    "the outbox's statements, which need SQLite 3.45 or newer ",
    "(sqlx's bundled SQLite is recent enough)"
);

/// Whether SQLite `version` (`major.minor.patch`) has what the statements use: `jsonb_each`
/// (3.45) and `json_group_array(... ORDER BY ...)` (3.44).
fn recent_enough(version: &str) -> bool {
    let mut parts = version.split('.').map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= (3, 45),
        _ => false,
    }
}

impl Dialect for SqliteDialect {
    type Database = Sqlite;
    type Turn = SqliteTurn;
    type Wakeups = NoWakeups;

    const NAME: &'static str = "SQLite";
    const MIGRATIONS: &'static [EmbeddedMigration] = MIGRATIONS;
    const MIGRATIONS_TABLE: &'static str = "CREATE TABLE IF NOT EXISTS _outbox_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
);";
    const BEGIN: &'static str = "BEGIN IMMEDIATE";
    const WRITES_IN_TRANSACTION: bool = true;
    const MAX_PARAMETERS: usize = 32766;
    const REFRESH_SCHEMA: Option<&'static str> = Some("SELECT count(*) FROM sqlite_schema");
    const SQL: Statements = Statements {
        insert_message: INSERT_MESSAGE,
        insert_messages: INSERT_MESSAGES,
        fetch: FETCH_JSON,
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
        table_exists: "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        discover: DISCOVER,
        unpark: UNPARK,
        reschedule: RESCHEDULE,
        pending_in_shard: "SELECT count(*) FROM outbox_messages \
            WHERE shard_scope = ?1 AND shard_identifier = ?2 AND destination = ?3 AND id <= ?4",
        pending_messages: PENDING_MESSAGES,
        shard_states: SHARD_STATES,
        dead_letter: DEAD_LETTER,
        dead_letters: DEAD_LETTERS,
        lock_dead_letters: "SELECT message_id FROM outbox_dead_letters \
                            WHERE message_id IN (SELECT value FROM json_each(?1))",
        replay_dead_letters: REPLAY_DEAD_LETTERS,
        purge_dead_letters: "DELETE FROM outbox_dead_letters \
                             WHERE message_id IN (SELECT value FROM json_each(?1))",
        purge_expired_dead_letters: PURGE_EXPIRED_DEAD_LETTERS,
        pause: PAUSE,
        resume: "DELETE FROM outbox_pauses WHERE kind = ?1 AND shard_scope = ?2 \
                    AND shard_identifier = ?3 AND destination = ?4 AND category = ?5",
        pauses: PAUSES,
        compact_paused: COMPACT_PAUSED,
        backfill: BACKFILL,
        oldest_due_age: OLDEST_DUE_AGE,
        is_paused: concat!("SELECT ", outbox_sqlx::paused!("?1", "?2", "?3")),
        status: STATUS,
        shards: SHARDS,
        failing_shards: FAILING_SHARDS,
        sampled_shards: SAMPLED_SHARDS,
        shard: SHARD,
        gauges: GAUGES,
        // One writer, and a reader never keeps a row from being removed: SQLite has no
        // cleanup horizon to hold (a long reader in WAL mode holds back checkpoints instead).
        horizon: "",
        set_aside: SET_ASIDE,
        relays: RELAYS,
        inbox: INBOX,
        shard_messages: SHARD_MESSAGES,
    };

    fn classify(error: &dyn DatabaseError) -> Fault {
        let message = error.message();
        if message.starts_with("no such table: outbox_") || message.starts_with("no such column") {
            Fault::SchemaMissing
        } else if message.starts_with("no such function: ") {
            // The outbox's statements call only SQLite's own functions: one that is missing
            // is one that this SQLite is too old for (`jsonb_each`, `unhex`...).
            Fault::Unsupported {
                store: "SQLite",
                feature: NEEDS,
            }
        } else {
            Fault::Other
        }
    }

    fn is_missing_table(error: &dyn DatabaseError) -> bool {
        error.message().starts_with("no such table")
    }

    fn binary_literal(hex: &str) -> String {
        format!("X'{hex}'")
    }

    fn rows_affected(result: &SqliteQueryResult) -> u64 {
        result.rows_affected()
    }

    fn bind_shard<'q>(query: Statement<'q, Sqlite>, shard: &ShardKey) -> Statement<'q, Sqlite> {
        Self::bind_object(query, shard.shard_identifier).bind(shard.destination_str().to_owned())
    }

    fn decode_shard(row: &SqliteRow, index: usize) -> Result<ShardKey, sqlx::Error> {
        Ok(ShardKey::from_stored(
            row.try_get(index)?,
            Self::decode_object(row, index + 1)?,
            row.try_get(index + 2)?,
        ))
    }

    // One column holds an integer, or a wide identifier's 16 bytes as a BLOB.
    const OBJECT_COLUMNS: usize = 1;

    fn bind_object<'q>(query: Statement<'q, Sqlite>, object: Id) -> Statement<'q, Sqlite> {
        match object.wide_bytes() {
            Some(bytes) => query.bind(bytes.to_vec()),
            None => query.bind(object.as_integer()),
        }
    }

    fn decode_object(row: &SqliteRow, index: usize) -> Result<Id, sqlx::Error> {
        if let Ok(integer) = row.try_get::<i64, _>(index) {
            return Ok(Id::integer(integer));
        }
        let bytes: Vec<u8> = row.try_get(index)?;
        outbox_sqlx::sql::wide_id(&bytes)
    }

    fn bind_ids<'q>(query: Statement<'q, Sqlite>, ids: Vec<i64>) -> Statement<'q, Sqlite> {
        query.bind(serde_json::Value::from(ids).to_string())
    }

    fn bind_categories<'q>(
        query: Statement<'q, Sqlite>,
        categories: Vec<i32>,
    ) -> Statement<'q, Sqlite> {
        query.bind(serde_json::Value::from(categories).to_string())
    }

    fn bind_groups<'q>(query: Statement<'q, Sqlite>, groups: &[GroupKey]) -> Statement<'q, Sqlite> {
        let groups: Vec<[serde_json::Value; 2]> = groups
            .iter()
            .map(|group| [group.category.0.into(), id_json(group.object_identifier)])
            .collect();
        query.bind(serde_json::to_string(&groups).unwrap_or_default())
    }

    fn bind_messages<'q>(
        query: Statement<'q, Sqlite>,
        messages: &[Message],
    ) -> Statement<'q, Sqlite> {
        let rows: Vec<serde_json::Value> = messages
            .iter()
            .map(|message| {
                let shard = message.shard();
                serde_json::json!([
                    shard.scope.0,
                    id_json(shard.shard_identifier),
                    shard.destination_str(),
                    message.category().0,
                    id_json(message.object_identifier()),
                    message.payload_json(),
                    message.metadata().to_json(),
                ])
            })
            .collect();
        query.bind(serde_json::Value::Array(rows).to_string())
    }

    fn decode_ids(row: &SqliteRow, index: usize) -> Result<Vec<i64>, Error> {
        let json: &str = row
            .try_get(index)
            .map_err(database::<Self>("reading a shard"))?;
        serde_json::from_str(json).map_err(json_error)
    }

    fn read_head(rows: Vec<SqliteRow>) -> Result<Vec<StoredMessage>, Error> {
        let Some(row) = rows.first() else {
            return Ok(Vec::new());
        };
        let json: &str = row
            .try_get(0)
            .map_err(database::<Self>("reading a shard"))?;
        let rows: Vec<Vec<serde_json::Value>> = serde_json::from_str(json).map_err(json_error)?;
        let mut messages = rows
            .iter()
            .map(|row| decode(row))
            .collect::<Result<Vec<_>, _>>()?;
        messages.sort_unstable_by_key(|message| message.id);
        Ok(messages)
    }

    fn load_model_sql(table: &ModelTable, _wide: bool) -> String {
        crate::model::load_sql(table)
    }

    fn load_models_sql(table: &ModelTable, _wide: bool) -> String {
        crate::model::load_many_sql(table)
    }

    fn bind_keys<'q>(query: Statement<'q, Sqlite>, keys: &[Id]) -> Statement<'q, Sqlite> {
        let keys: Vec<serde_json::Value> = keys.iter().copied().map(id_json).collect();
        query.bind(serde_json::to_string(&keys).unwrap_or_default())
    }

    fn walk_model_sql(table: &ModelTable, after: Option<bool>) -> String {
        crate::model::walk_sql(table, after.is_some())
    }

    fn read_model(row: &<Self::Database as Database>::Row) -> Result<ModelRow, sqlx::Error> {
        crate::model::read(row)
    }

    fn placeholder(index: usize) -> String {
        format!("?{index}")
    }

    fn column_accepts(
        field: &<Self::Database as Database>::TypeInfo,
        column: &<Self::Database as Database>::TypeInfo,
        compatible: bool,
    ) -> bool {
        crate::model::accepts(field, column, compatible)
    }

    async fn take_turn(&self) -> SqliteTurn {
        let queue = Arc::clone(&self.queue).lock_owned().await;
        SqliteTurn {
            _write: Arc::clone(&self.writes).lock_owned().await,
            _queue: Some(queue),
        }
    }

    /// One statement, ahead of the relay's other queued writes, polling for SQLite's write
    /// lock every millisecond for as long as the connection's busy timeout.
    async fn extend_leases(
        &self,
        pool: &SqlitePool,
        leases: &[Lease],
        duration: Duration,
    ) -> Result<Vec<bool>, Error> {
        let failed = || database::<Self>("extending leases");
        let _turn = self.take_turn_first().await;
        let mut conn = NoBusyHandler::acquire(pool).await.map_err(failed())?;
        let lease_ms = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        let until = Instant::now() + Duration::from_millis(conn.timeout_ms);
        let held = loop {
            match together::extend_held(conn.conn(), leases, lease_ms).await {
                Err(error) if is_busy(&error) && Instant::now() < until => {
                    tokio::time::sleep(EXTENSION_POLL).await;
                }
                held => break held,
            }
        };
        conn.restore().await.map_err(failed())?;
        held.map_err(failed())?
    }

    async fn claim(
        &self,
        pool: &SqlitePool,
        shard: &ShardKey,
        options: &ClaimOptions,
    ) -> Result<Option<Claim<Self>>, Error> {
        let failed = || database::<Self>("claiming a shard");
        let turn = self.take_turn().await;
        let mut tx = pool.begin_with(Self::BEGIN).await.map_err(failed())?;
        let Some(lease) = claim_on(&mut tx, shard, options).await? else {
            tx.rollback().await.map_err(failed())?;
            return Ok(None);
        };
        // In transaction mode the session keeps the turn as long as it keeps the transaction.
        let claiming = match options.mode {
            HandlerMode::Leased => {
                tx.commit().await.map_err(failed())?;
                None
            }
            HandlerMode::InTransaction => Some(Claiming { tx, turn }),
        };
        Ok(Some(Claim {
            lease,
            claiming,
            head: None,
        }))
    }

    /// Leased claims of several shards in one write transaction (one commit) of four
    /// statements, then their heads in one read; in transaction mode each claim keeps a
    /// transaction of its own.
    async fn claim_many(
        &self,
        pool: &SqlitePool,
        shards: &[ShardKey],
        options: &ClaimOptions,
        first_read: usize,
    ) -> Result<Vec<Claim<Self>>, Error> {
        if options.mode == HandlerMode::InTransaction || shards.len() < 2 {
            return outbox_sqlx::dialect::claim_each(self, pool, shards, options).await;
        }
        let failed = || database::<Self>("claiming shards");
        let leases = {
            let _turn = self.take_turn().await;
            let mut tx = pool.begin_with(Self::BEGIN).await.map_err(failed())?;
            let leases = together::claim_all(&mut tx, shards, options).await?;
            tx.commit().await.map_err(failed())?;
            leases
        };
        // The claims stand once committed: if their heads cannot be read together, each
        // session reads its own.
        let mut heads = match first_read {
            0 => None,
            _ if leases.is_empty() => None,
            _ => together::heads(pool, &leases, first_read)
                .await
                .inspect_err(|error| {
                    tracing::debug!(error = %error, "reading the claimed shards' heads failed");
                })
                .ok(),
        }
        .map(Vec::into_iter);
        Ok(leases
            .into_iter()
            .map(|lease| Claim {
                lease,
                claiming: None,
                head: heads
                    .as_mut()
                    .and_then(Iterator::next)
                    .map(|head| (head, first_read)),
            })
            .collect())
    }

    async fn discover(
        &self,
        pool: &SqlitePool,
        scope: i32,
        cursor: &ShardKey,
        limit: i32,
    ) -> Result<Vec<(ShardKey, bool)>, Error> {
        const OPERATION: &str = "discovering due shards";
        let row = Self::bind_shard(sqlx::query(DISCOVER_JSON).bind(scope), cursor)
            .bind(limit)
            .fetch_one(pool)
            .await
            .map_err(database::<Self>(OPERATION))?;
        let json: String = row.try_get(0).map_err(database::<Self>(OPERATION))?;
        let shards: Vec<(i64, serde_json::Value, String, i64)> =
            serde_json::from_str(&json).map_err(json_error)?;
        shards
            .into_iter()
            .map(|(scope, identifier, destination, due)| {
                let undecodable = || Error::Undecodable {
                    operation: OPERATION,
                    message_id: None,
                    detail: format!(
                        "a shard key is not (SMALLINT, identifier, text): \
                         ({scope}, {identifier}, {destination:?})"
                    ),
                };
                let key = ShardKey::from_stored(
                    i16::try_from(scope).map_err(|_| undecodable())?,
                    id_from_json(&identifier).ok_or_else(undecodable)?,
                    destination,
                );
                Ok((key, due != 0))
            })
            .collect()
    }

    async fn ack_and_release_on(
        &self,
        conn: &mut SqliteConnection,
        batch: &[outbox_sqlx::dialect::Finishing],
    ) -> Result<Vec<outbox_sqlx::dialect::Finished>, Error> {
        together::finish_all(conn, batch).await
    }

    async fn wakeups(_pool: &SqlitePool) -> Result<Option<NoWakeups>, Error> {
        Ok(None)
    }

    fn database_key(pool: &SqlitePool) -> String {
        pool.connect_options().get_filename().display().to_string()
    }

    async fn check_schema(pool: &SqlitePool) -> Result<(), Error> {
        recent_enough_on(pool).await?;
        let rejected: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_rejected_messages")
            .fetch_one(pool)
            .await
            .map_err(database::<Self>("checking the outbox schema"))?;
        if rejected > 0 {
            tracing::warn!(
                rejected,
                "outbox rows that no relay can deliver were set aside by migration 2 in the \
                 table outbox_rejected_messages; inspect them there"
            );
        }
        Ok(())
    }
}

impl<'c> outbox_sqlx::model::ModelTarget<'c, 'static, SqliteDialect> for &'c mut SqliteConnection {
    fn target(self) -> outbox_sqlx::model::Target<'c, 'static, SqliteDialect> {
        outbox_sqlx::model::Target::Connection(self)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use outbox_sqlx::Dialect;

    use super::{SqliteDialect, recent_enough};

    /// Writes queued behind the running one, then a lease extension: the extension goes
    /// next.
    #[tokio::test]
    async fn a_lease_extension_goes_before_the_writes_queued() {
        let dialect = SqliteDialect::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        let running = dialect.take_turn().await;
        let mut waiting = Vec::new();
        for (write, first) in [("claim", false), ("finish", false), ("extension", true)] {
            let (dialect, order) = (dialect.clone(), Arc::clone(&order));
            waiting.push(tokio::spawn(async move {
                let _turn = if first {
                    dialect.take_turn_first().await
                } else {
                    dialect.take_turn().await
                };
                order.lock().expect("order").push(write);
            }));
            // Each asks before the next (the runtime runs the task up to its wait).
            tokio::task::yield_now().await;
        }
        drop(running);
        for task in waiting {
            task.await.expect("a write");
        }
        assert_eq!(
            *order.lock().expect("order"),
            ["extension", "claim", "finish"],
            "the extension waits for the running write only"
        );
    }

    #[test]
    fn sqlite_older_than_3_45_is_not_enough() {
        for (version, enough) in [
            ("3.44.2", false),
            ("3.45.0", true),
            ("3.51.3", true),
            ("4.0.0", true),
            ("2.99.0", false),
            ("3", false),
            ("three.45", false),
        ] {
            assert_eq!(recent_enough(version), enough, "{version}");
        }
    }

    /// A statement that meets a function this SQLite lacks (as a write's `jsonb_each` or
    /// `unhex` would on one older than 3.45) is `Error::Unsupported`, saying what the outbox
    /// needs, not the database's "no such function" nor a missing migration; and `begin`
    /// checks the version on this SQLite, recent enough, and writes.
    #[tokio::test]
    async fn a_function_sqlite_lacks_is_unsupported_not_an_sql_error() {
        let dir = tempfile::tempdir().expect("a directory");
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("old.db"))
            .create_if_missing(true);
        let pool = sqlx::SqlitePool::connect_with(options)
            .await
            .expect("a pool");
        let error = sqlx::query("SELECT jsonb_each_of_a_later_release(?1)")
            .bind("[]")
            .execute(&pool)
            .await
            .expect_err("no such function");
        let error =
            outbox_sqlx::error::database::<SqliteDialect>("writing an outbox message")(error);
        match &error {
            outbox_core::Error::Unsupported { store, feature } => {
                assert_eq!(*store, "SQLite");
                assert!(feature.contains("SQLite 3.45 or newer"), "{feature}");
            }
            other => panic!("not Unsupported: {other:?}"),
        }
        assert!(error.to_string().contains("3.45"), "{error}");

        crate::migrate(&pool).await.expect("migrate");
        super::recent_enough_on(&pool)
            .await
            .expect("the bundled SQLite is recent enough");
        let tx = crate::begin(&pool).await.expect("begin");
        tx.commit().await.expect("commit");
    }
}
