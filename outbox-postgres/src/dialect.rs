//! PostgreSQL's dialect of the shared body: its SQL, its claims (`FOR UPDATE SKIP LOCKED`), its
//! wake-ups (`LISTEN`) and its error codes.
//!
//! Its rows are decoded without sqlx's second check of each value's type, as
//! [`outbox_sqlx::sql::get`] decodes them on PostgreSQL: the statements cast each column to the
//! type decoded, and a value that does not decode still fails.

use std::collections::HashMap;

use outbox_core::columns::ModelRow;
use outbox_core::replicated::ModelTable;
use outbox_core::store::{ClaimOptions, EmbeddedMigration, GroupKey, HandlerMode, Lease};
use outbox_core::{Error, Id, Message, ShardKey};
use outbox_sqlx::error::database;
use outbox_sqlx::sql::Statement;
pub(crate) use outbox_sqlx::stored::{shard_from_stored, stored_object, stored_shard};
use outbox_sqlx::{
    Ack, BackfillStatements, Claim, Claiming, Dialect, Fault, InboxStatements, RelayStatements,
    SetAsideStatements, Statements,
};
use sqlx::error::DatabaseError;
use sqlx::postgres::{PgQueryResult, PgRow};
use sqlx::{Database, PgPool, Postgres, Row};

use self::arrays::Array;
use self::wakeups::PgWakeups;

/// PostgreSQL, for the shared body of the `sqlx` backends. A store's dialect keeps where the
/// shards it drained begin (see `positions`): its clones share them.
#[derive(Debug, Clone, Default)]
pub struct PgDialect {
    pub(crate) positions: std::sync::Arc<positions::Positions>,
    pub(crate) sweeps: std::sync::Arc<sweeps::Sweeps>,
    pub(crate) leases: std::sync::Arc<leases::Leases>,
    pub(crate) space: std::sync::Arc<space::Space>,
}

pub(crate) mod arrays;
pub(crate) mod leases;
pub(crate) mod positions;
pub(crate) mod space;
pub(crate) mod sweeps;
pub(crate) mod wakeups;

/// The embedded migrations, in order.
const MIGRATIONS: &[EmbeddedMigration] = &[
    EmbeddedMigration {
        version: 1,
        description: "outbox tables",
        sql: include_str!("../migrations/0001_outbox.sql"),
    },
    EmbeddedMigration {
        version: 2,
        description: "identifiers wider than BIGINT",
        sql: include_str!("../migrations/0002_wide_identifiers.sql"),
    },
    EmbeddedMigration {
        version: 3,
        description: "dead letters and pauses",
        sql: include_str!("../migrations/0003_dead_letters_and_pauses.sql"),
    },
    EmbeddedMigration {
        version: 4,
        description: "message metadata",
        sql: include_str!("../migrations/0004_message_metadata.sql"),
    },
    EmbeddedMigration {
        version: 5,
        description: "wake-ups after commit",
        sql: include_str!("../migrations/0005_wake_up_after_commit.sql"),
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
    EmbeddedMigration {
        version: 9,
        description: "the lease log",
        sql: include_str!("../migrations/0009_lease_log.sql"),
    },
];

const INSERT_MESSAGE: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, destination, category, object_identifier, object_wide, \
         payload, metadata) \
    VALUES ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8::text::jsonb) \
    RETURNING id";

// One statement for any number of messages: the columns travel as arrays.
const INSERT_MESSAGES: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, destination, category, object_identifier, object_wide, \
         payload, metadata) \
    SELECT scope, shard, destination, category, object, object_wide, payload::jsonb, \
        metadata::jsonb \
    FROM unnest($1::smallint[], $2::bigint[], $3::text[], $4::integer[], $5::bigint[], \
        $6::bytea[], $7::text[], $8::text[]) \
        AS rows(scope, shard, destination, category, object, object_wide, payload, metadata) \
    RETURNING id";

pub(crate) const FETCH: &str = "\
    SELECT id, category, shard_scope, object_identifier, object_wide, payload::text, \
        (extract(epoch FROM created_at) * 1000000)::bigint, metadata::text \
    FROM outbox_messages \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 \
    ORDER BY id LIMIT $4";

// Each group's rows in `$7 < id <= $8` as one statement sees them (one snapshot): their ids,
// and the newest one whole.
pub(crate) const FETCH_NEWEST: &str = "\
    SELECT m.id, m.category, m.shard_scope, m.object_identifier, m.object_wide, m.payload::text, \
        (extract(epoch FROM m.created_at) * 1000000)::bigint, m.metadata::text, t.ids \
    FROM unnest($4::integer[], $5::bigint[], $6::bytea[]) \
        AS g(category, object_identifier, object_wide) \
    CROSS JOIN LATERAL ( \
        SELECT array_agg(x.id) AS ids, max(x.id) AS newest FROM outbox_messages x \
        WHERE x.shard_scope = $1 AND x.shard_identifier = $2 AND x.destination = $3 \
            AND x.category = g.category AND x.object_identifier = g.object_identifier \
            AND x.object_wide = g.object_wide AND x.id > $7 AND x.id <= $8) t \
    JOIN outbox_messages m ON m.id = t.newest";

// The page's shards in key order after the cursor, found in two ways: the first `$4` rows'
// keys, read in one pass of the shard index (where most shards hold a message or two, that
// is the whole page), then a skip-scan from the last of them for the rest: one index descent
// per shard, never a read of every row of a deep shard. Shards are due when no pause holds
// them, nobody holds a live lease on them and they are not backing off, or have a message
// newer than their failure. Each shard's lowest pending id comes with it (the first entry of
// its key that either way reads): a position above it is lowered (see `positions`).
pub(crate) const DISCOVER: &str = concat!(
    "\
    WITH RECURSIVE near AS ( \
        SELECT shard_scope, shard_identifier, destination, lowest, \
            row_number() OVER (ORDER BY shard_scope, shard_identifier, destination) AS n \
        FROM (SELECT DISTINCT ON (shard_scope, shard_identifier, destination) \
                  shard_scope, shard_identifier, destination, id AS lowest \
              FROM (SELECT shard_scope, shard_identifier, destination, id FROM outbox_messages \
                    WHERE (shard_scope, shard_identifier, destination) \
                        > ($1::integer, $2::bigint, $3::text) \
                    ORDER BY shard_scope, shard_identifier, destination, id LIMIT $4::integer) r \
              ORDER BY shard_scope, shard_identifier, destination, id) d), \
     far(shard_scope, shard_identifier, destination, lowest, n) AS ( \
        (SELECT shard_scope, shard_identifier, destination, lowest, n \
         FROM near ORDER BY n DESC LIMIT 1) \
        UNION ALL \
        SELECT next.shard_scope, next.shard_identifier, next.destination, next.id, k.n + 1 \
        FROM far k CROSS JOIN LATERAL ( \
            SELECT x.shard_scope, x.shard_identifier, x.destination, x.id FROM outbox_messages x \
            WHERE (x.shard_scope, x.shard_identifier, x.destination) \
                > (k.shard_scope, k.shard_identifier, k.destination) \
            ORDER BY x.shard_scope, x.shard_identifier, x.destination, x.id LIMIT 1) next \
        WHERE k.n < $4 \
    ), \
     keys AS ( \
        SELECT * FROM near \
        UNION ALL \
        SELECT * FROM far WHERE n > (SELECT count(*) FROM near)) ",
    due_keys!()
);

// A discovery page's answer: each of the shards `keys` (its key, its lowest pending id if
// known and `n`, its place) with whether it is due: its newest lease row released or lapsed,
// not backing off (or with a message newer than its failure), not paused; then that id. One
// row of six arrays, an element per shard: its place, then the rest (the relay reads a row in
// far more time than an element of an array; unsorted, as PostgreSQL sorts each aggregate's
// input on its own: the relay puts each shard in its place); an empty page answers NULLs.
macro_rules! due_keys {
    () => {
        concat!(
            "\
    SELECT array_agg(d.n), array_agg(d.shard_scope), array_agg(d.shard_identifier), \
        array_agg(d.destination), array_agg(d.due), array_agg(d.lowest) \
    FROM (SELECT k.n, k.shard_scope, k.shard_identifier, k.destination, \
        (h.seq IS NULL OR h.lease_owner IS NULL OR h.lease_expires_at <= now()) \
        AND (s.retry_at IS NULL OR s.retry_at <= now() OR EXISTS ( \
            SELECT 1 FROM outbox_messages m \
            WHERE m.shard_scope = k.shard_scope AND m.shard_identifier = k.shard_identifier \
                AND m.destination = k.destination AND m.id > s.watermark)) \
        AND NOT ",
            outbox_sqlx::paused!("k.shard_scope", "k.shard_identifier", "k.destination"),
            " AS due, k.lowest \
    FROM keys k ",
            leases::head_of!("k"),
            " LEFT JOIN outbox_shards s \
        ON s.shard_scope = k.shard_scope AND s.shard_identifier = k.shard_identifier \
        AND s.destination = k.destination) d"
        )
    };
}
use due_keys;

// A page of a recent sweep (see `sweeps`): as DISCOVER, of the shards with rows above `$5`
// only, found by a range of the primary key (the rows written since the last sweep began)
// rather than a walk of the shard index (every row acknowledged while a horizon is held). It
// says no shard's lowest pending id: it reads the rows above `$5` only.
pub(crate) const DISCOVER_RECENT: &str = concat!(
    "\
    WITH keys AS ( \
        SELECT shard_scope, shard_identifier, destination, NULL::bigint AS lowest, \
            row_number() OVER (ORDER BY shard_scope, shard_identifier, destination) AS n \
        FROM (SELECT DISTINCT shard_scope, shard_identifier, destination \
              FROM outbox_messages \
              WHERE id > $5::bigint AND (shard_scope, shard_identifier, destination) \
                  > ($1::integer, $2::bigint, $3::text) \
              ORDER BY shard_scope, shard_identifier, destination LIMIT $4::integer) d) ",
    due_keys!()
);

const PENDING_MESSAGES: &str = "\
    SELECT id, shard_scope, shard_identifier, destination, category, object_identifier, \
        object_wide, payload::text, (extract(epoch FROM created_at) * 1000)::bigint, \
        metadata::text \
    FROM outbox_messages ORDER BY id LIMIT $1";

const DEAD_LETTER: &str = concat!(
    "INSERT INTO outbox_dead_letters (message_id, shard_scope, shard_identifier, destination, \
        category, object_identifier, object_wide, payload, created_at, error, attempts, \
        first_failed_at, lease_token, metadata) \
    SELECT m.id, m.shard_scope, m.shard_identifier, m.destination, m.category, \
        m.object_identifier, m.object_wide, m.payload, m.created_at, $6, $7, \
        coalesce(s.first_failed_at, now()), l.lease_token, m.metadata \
    FROM outbox_messages m JOIN outbox_leases l \
        ON l.shard_scope = $1 AND l.shard_identifier = $2 AND l.destination = $3 \
            AND l.seq = ",
    leases::newest!("$1", "$2", "$3"),
    " AND l.lease_token = $4 \
        LEFT JOIN outbox_shards s \
        ON s.shard_scope = $1 AND s.shard_identifier = $2 AND s.destination = $3 \
    WHERE m.shard_scope = $1 AND m.shard_identifier = $2 AND m.destination = $3 \
        AND m.id = ANY($5::bigint[])"
);

const DEAD_LETTERS: &str = "\
    SELECT message_id, shard_scope, shard_identifier, destination, category, \
        object_identifier, object_wide, payload::text, \
        (extract(epoch FROM created_at) * 1000)::bigint, error, attempts::bigint, \
        (extract(epoch FROM first_failed_at) * 1000)::bigint, \
        (extract(epoch FROM dead_lettered_at) * 1000)::bigint, lease_token, metadata::text \
    FROM outbox_dead_letters \
    WHERE ($1::integer IS NULL OR category = $1) \
        AND ($2::integer IS NULL OR shard_scope = $2) \
        AND ($3::integer IS NULL \
            OR (shard_scope = $3 AND shard_identifier = $4 AND destination = $5)) \
        AND ($6::bigint IS NULL OR dead_lettered_at <= now() - $6 * interval '1 millisecond') \
        AND ($8::integer = 0 OR message_id = ANY($9::bigint[])) \
        AND message_id BETWEEN $10 AND $11 \
    ORDER BY message_id LIMIT $7";

const REPLAY_DEAD_LETTERS: &str = "\
    INSERT INTO outbox_messages (shard_scope, shard_identifier, destination, category, \
        object_identifier, object_wide, payload, metadata) \
    SELECT shard_scope, shard_identifier, destination, category, object_identifier, \
        object_wide, payload, metadata \
    FROM outbox_dead_letters WHERE message_id = ANY($1::bigint[]) ORDER BY message_id \
    RETURNING id";

const PURGE_EXPIRED_DEAD_LETTERS: &str = "\
    DELETE FROM outbox_dead_letters WHERE message_id IN ( \
        SELECT message_id FROM outbox_dead_letters \
        WHERE dead_lettered_at <= now() - $1::bigint * interval '1 millisecond' \
        ORDER BY dead_lettered_at LIMIT $2)";

const PAUSES: &str = "\
    SELECT kind, shard_scope, shard_identifier, destination, category, reason, \
        (extract(epoch FROM paused_at) * 1000)::bigint \
    FROM outbox_pauses ORDER BY paused_at, kind, shard_scope, shard_identifier, destination, \
        category";

// In id order, the first row whose shard is not backing off (with no message newer than its
// failure) nor paused.
const OLDEST_DUE_AGE: &str = concat!(
    "SELECT (extract(epoch FROM now() - m.created_at) * 1000)::bigint \
    FROM outbox_messages m \
    WHERE NOT EXISTS (SELECT 1 FROM outbox_shards s \
            WHERE s.shard_scope = m.shard_scope AND s.shard_identifier = m.shard_identifier \
                AND s.destination = m.destination AND s.retry_at > now() \
                AND NOT EXISTS (SELECT 1 FROM outbox_messages n \
                    WHERE n.shard_scope = m.shard_scope \
                        AND n.shard_identifier = m.shard_identifier \
                        AND n.destination = m.destination AND n.id > s.watermark)) \
        AND NOT ",
    outbox_sqlx::paused!("m.shard_scope", "m.shard_identifier", "m.destination"),
    " ORDER BY m.id LIMIT 1"
);

/// A watermark's columns (see [`BackfillStatements`]), its times in milliseconds.
macro_rules! watermark {
    () => {
        "category, model, declared_version, target_version, walking_version, done_version, \
         low_bound, rows_walked, destinations, worker, \
         (extract(epoch FROM started_at) * 1000)::bigint, \
         (extract(epoch FROM updated_at) * 1000)::bigint, \
         (extract(epoch FROM completed_at) * 1000)::bigint, last_error"
    };
}

pub(crate) const BACKFILL: BackfillStatements = BackfillStatements {
    ensure: "INSERT INTO outbox_backfills (category, model) VALUES ($1, $2) \
             ON CONFLICT (category) DO NOTHING",
    lock: concat!(
        "SELECT ",
        watermark!(),
        " FROM outbox_backfills WHERE category = $1 FOR UPDATE SKIP LOCKED"
    ),
    // Never waits on a relay walking a batch (it holds the row): skipped then, and recorded
    // at a later tick (a transaction that holds the row itself takes it).
    declare: "UPDATE outbox_backfills SET model = $2, declared_version = $3, updated_at = now() \
              WHERE category = (SELECT category FROM outbox_backfills WHERE category = $1 \
                  FOR UPDATE SKIP LOCKED)",
    // From the newest row down: once the bound is reached, none of the rows acknowledged
    // before (deleted, perhaps not yet vacuumed) is read.
    backlog: "SELECT count(*) FROM (SELECT 1 FROM outbox_messages ORDER BY id DESC LIMIT $1) AS b",
    record: concat!(
        "UPDATE outbox_backfills SET model = $2, declared_version = $3, walking_version = $4, \
             done_version = $5, low_bound = $6, rows_walked = $7, worker = $8, \
             started_at = CASE WHEN $9 = 1 THEN now() ELSE started_at END, \
             completed_at = CASE WHEN $10 = 1 THEN now() ELSE completed_at END, \
             updated_at = now(), last_error = NULL \
         WHERE category = $1 RETURNING ",
        watermark!()
    ),
    fail: "UPDATE outbox_backfills SET last_error = $2, updated_at = now() WHERE category = $1",
    list: concat!(
        "SELECT ",
        watermark!(),
        " FROM outbox_backfills ORDER BY category"
    ),
    start: concat!(
        "INSERT INTO outbox_backfills AS b (category, model, target_version, destinations) \
         VALUES ($1, $2, $3, $4) \
         ON CONFLICT (category) DO UPDATE SET target_version = EXCLUDED.target_version, \
             destinations = EXCLUDED.destinations, updated_at = now(), \
             model = CASE WHEN b.model = '' THEN EXCLUDED.model ELSE b.model END \
         RETURNING ",
        watermark!()
    ),
    pause: "UPDATE outbox_backfills SET target_version = done_version, updated_at = now() \
            WHERE category = $1 AND target_version > done_version",
};

pub(crate) const COMPACT_PAUSED: &str = outbox_sqlx::compact_paused!(
    "x.category = ANY($1)",
    "AND o.object_wide = x.object_wide",
    "$2"
);

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
                    min(created_at) AS oldest, max(id) AS newest, false AS estimated \
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
                    CASE WHEN h.lease_expires_at > now() THEN h.lease_owner END AS lease_owner, \
                    coalesce(h.lease_expires_at > now(), false) AS in_flight, \
                    coalesce(s.retry_at > now() AND k.newest <= s.watermark, false) AS waiting, ",
            outbox_sqlx::paused!("k.shard_scope", "k.shard_identifier", "k.destination"),
            " AS paused \
                FROM k LEFT JOIN outbox_shards s ON s.shard_scope = k.shard_scope \
                    AND s.shard_identifier = k.shard_identifier AND s.destination = k.destination ",
            leases::head_of!("k"),
            "), \
            v AS (SELECT w.*, ",
            outbox_sqlx::shard_status!(),
            " AS state FROM w) "
        )
    };
}

// A shard of the view as `Statements::shards` returns it.
macro_rules! shard_columns {
    () => {
        "shard_scope, shard_identifier, destination, pending, \
        (extract(epoch FROM oldest) * 1000)::bigint AS oldest_ms, attempts::bigint AS attempts, \
        last_error, CASE WHEN state <> 'parked' \
            THEN (extract(epoch FROM retry_at) * 1000)::bigint END AS retry_ms, parked_category, \
        lease_owner, paused, state, estimated"
    };
}

const STATUS: &str = concat!(
    shard_view!(""),
    ", d AS (SELECT ",
    shard_columns!(),
    " FROM v ORDER BY pending DESC, shard_scope, shard_identifier, destination LIMIT $1) \
    SELECT t.*, d.* FROM ( \
        SELECT count(*), coalesce(sum(pending), 0)::bigint, \
            (extract(epoch FROM min(oldest)) * 1000)::bigint, ",
    outbox_sqlx::shard_counts!(),
    ", (SELECT count(*) FROM outbox_dead_letters), \
            (SELECT (extract(epoch FROM min(dead_lettered_at)) * 1000)::bigint \
             FROM outbox_dead_letters) \
        FROM v) t \
    LEFT JOIN d ON true \
    ORDER BY d.pending DESC, d.shard_scope, d.shard_identifier, d.destination"
);

// The view's shards that `$1` keeps (a `ShardFilter`'s name), deepest first, at most `$2`.
macro_rules! listed {
    () => {
        concat!(
            "SELECT ",
            shard_columns!(),
            " FROM v WHERE ($1::text = 'pending' \
                OR ($1 = 'failing' AND (attempts > 0 OR last_error IS NOT NULL)) \
                OR ($1 = 'paused' AND paused) \
                OR ($1 = 'parked' AND parked_category IS NOT NULL))",
            " ORDER BY pending DESC, shard_scope, shard_identifier, destination LIMIT $2"
        )
    };
}

const SHARDS: &str = concat!(
    shard_view!(
        "WHERE ($3::integer IS NULL OR shard_scope = $3::integer)",
        "HAVING $4::integer IS NULL OR count(*) FILTER (WHERE category = $4::integer) > 0"
    ),
    listed!()
);

// The failing or parked shards: their messages only, found from their state rows.
pub(crate) const FAILING_SHARDS: &str = concat!(
    shard_view!(
        "WHERE (shard_scope, shard_identifier, destination) IN ( \
            SELECT shard_scope, shard_identifier, destination FROM outbox_shards \
            WHERE (($1::text = 'failing' AND (attempts > 0 OR last_error IS NOT NULL)) \
                OR ($1 = 'parked' AND parked_category IS NOT NULL)) \
                AND ($3::integer IS NULL OR shard_scope = $3::integer))",
        "HAVING $4::integer IS NULL OR count(*) FILTER (WHERE category = $4::integer) > 0"
    ),
    listed!()
);

// The shards of a large backlog ranked from a sample: windows of `$6` ids every `$5`th of
// the id span (or every `$6`, reading all, if the span is narrower), each sampled shard
// guessed at its hits times the span over the ids sampled. Beside the sample's deepest, the
// candidates are the first `$2` shards of the scope `$3` and, for `'paused'`, of each scope
// paused, and the shards paused on their own: found by index seeks, never by the sample.
// Each candidate's messages are counted up to `$7`, and guessed above it (never below `$7`).
// Returns the number of messages sampled, then the shards as `Statements::shards` (all NULL
// on the one row if none).
pub(crate) const SAMPLED_SHARDS: &str = concat!(
    "WITH RECURSIVE e AS ( \
        SELECT (SELECT id FROM outbox_messages ORDER BY id LIMIT 1) AS lo, \
            (SELECT id FROM outbox_messages ORDER BY id DESC LIMIT 1) AS hi), \
    b AS (SELECT lo, hi, greatest($6::bigint, (hi - lo + 1) / $5::bigint) AS step \
        FROM e WHERE lo IS NOT NULL), \
    g AS (SELECT b.lo + n * b.step AS start, b.step FROM b \
        CROSS JOIN LATERAL (SELECT n FROM generate_series(0::bigint, (b.hi - b.lo) / b.step) AS n \
            LIMIT $5::bigint + 1) n), \
    hit AS MATERIALIZED (SELECT m.shard_scope, m.shard_identifier, m.destination, m.category, \
            g.step \
        FROM g CROSS JOIN LATERAL ( \
            SELECT m.shard_scope, m.shard_identifier, m.destination, m.category \
            FROM outbox_messages m WHERE m.id >= g.start AND m.id < g.start + $6::bigint \
            ORDER BY m.id LIMIT $6::bigint) m), \
    seen AS (SELECT shard_scope, shard_identifier, destination, \
            count(*) * max(step) / $6::bigint AS guess \
        FROM hit WHERE $3::integer IS NULL OR shard_scope = $3::integer \
        GROUP BY shard_scope, shard_identifier, destination \
        HAVING $4::integer IS NULL OR count(*) FILTER (WHERE category = $4::integer) > 0 \
        ORDER BY guess DESC, shard_scope, shard_identifier, destination LIMIT $2), \
    seeds AS (SELECT $3::integer AS scope WHERE $3::integer IS NOT NULL \
        UNION SELECT shard_scope FROM outbox_pauses WHERE $1::text = 'paused' AND kind = 'scope'), \
    scoped(shard_scope, shard_identifier, destination, n) AS ( \
        SELECT f.shard_scope, f.shard_identifier, f.destination, 1 FROM seeds \
        CROSS JOIN LATERAL ( \
            SELECT x.shard_scope, x.shard_identifier, x.destination FROM outbox_messages x \
            WHERE x.shard_scope = seeds.scope \
            ORDER BY x.shard_scope, x.shard_identifier, x.destination LIMIT 1) f \
        UNION ALL \
        SELECT f.shard_scope, f.shard_identifier, f.destination, k.n + 1 FROM scoped k \
        CROSS JOIN LATERAL ( \
            SELECT x.shard_scope, x.shard_identifier, x.destination FROM outbox_messages x \
            WHERE x.shard_scope = k.shard_scope \
                AND (x.shard_scope, x.shard_identifier, x.destination) \
                    > (k.shard_scope, k.shard_identifier, k.destination) \
            ORDER BY x.shard_scope, x.shard_identifier, x.destination LIMIT 1) f \
        WHERE k.n < $2), \
    c AS (SELECT shard_scope, shard_identifier, destination, max(guess) AS guess FROM ( \
            SELECT shard_scope, shard_identifier, destination, guess FROM seen \
            UNION ALL SELECT shard_scope, shard_identifier, destination, 0 FROM scoped \
            UNION ALL SELECT shard_scope, shard_identifier, destination, 0 FROM outbox_pauses \
                WHERE $1 = 'paused' AND kind = 'shard' \
                    AND ($3::integer IS NULL OR shard_scope = $3::integer)) u \
        GROUP BY shard_scope, shard_identifier, destination), ",
    shard_view_of!(
        "SELECT c.shard_scope, c.shard_identifier, c.destination, \
            CASE WHEN n.counted < $7 THEN n.counted ELSE greatest(n.counted, c.guess) END \
                AS pending, \
            (SELECT m.created_at FROM outbox_messages m WHERE m.shard_scope = c.shard_scope \
                AND m.shard_identifier = c.shard_identifier AND m.destination = c.destination \
                ORDER BY m.id LIMIT 1) AS oldest, \
            (SELECT m.id FROM outbox_messages m WHERE m.shard_scope = c.shard_scope \
                AND m.shard_identifier = c.shard_identifier AND m.destination = c.destination \
                ORDER BY m.id DESC LIMIT 1) AS newest, \
            n.counted >= $7 AS estimated \
        FROM c CROSS JOIN LATERAL (SELECT count(*) AS counted FROM ( \
            SELECT 1 FROM outbox_messages m WHERE m.shard_scope = c.shard_scope \
                AND m.shard_identifier = c.shard_identifier AND m.destination = c.destination \
            LIMIT $7::bigint) r) n \
        WHERE n.counted > 0 AND ($4::integer IS NULL OR EXISTS ( \
            SELECT 1 FROM outbox_messages m WHERE m.shard_scope = c.shard_scope \
                AND m.shard_identifier = c.shard_identifier AND m.destination = c.destination \
                AND m.category = $4::integer))"
    ),
    ", d AS (",
    listed!(),
    ") \
    SELECT t.sampled, d.* FROM (SELECT count(*) AS sampled FROM hit) t LEFT JOIN d ON true \
    ORDER BY d.pending DESC, d.shard_scope, d.shard_identifier, d.destination"
);

// The gauges above the exact limit: the statistics' live rows (never below the limit), the
// first message by id, the shards held (the newest rows of the lease log that hold a live
// lease), the failing or parked shards (few), the shard pauses, and the dead letters counted
// up to the limit.
pub(crate) const GAUGES: &str = concat!(
    "SELECT greatest($1, coalesce((SELECT n_live_tup FROM pg_stat_user_tables \
            WHERE relid = 'outbox_messages'::regclass), 0))::bigint, \
        (SELECT (extract(epoch FROM created_at) * 1000)::bigint FROM outbox_messages \
            ORDER BY id LIMIT 1), \
        (SELECT count(*) FROM outbox_leases l \
            WHERE NOT l.superseded AND l.lease_expires_at > now()), \
        count(*) FILTER (WHERE NOT coalesce(h.lease_expires_at > now(), false) \
            AND s.retry_at > now() AND s.parked_category IS NULL \
            AND NOT EXISTS (SELECT 1 FROM outbox_messages m WHERE m.shard_scope = s.shard_scope \
                AND m.shard_identifier = s.shard_identifier AND m.destination = s.destination \
                AND m.id > s.watermark)), \
        count(*) FILTER (WHERE NOT coalesce(h.lease_expires_at > now(), false) \
            AND s.retry_at > now() AND s.parked_category IS NOT NULL), \
        (SELECT count(*) FROM outbox_pauses WHERE kind = 'shard'), \
        (SELECT greatest(count(*), CASE WHEN count(*) < $1 THEN 0 ELSE coalesce(( \
                SELECT n_live_tup FROM pg_stat_user_tables \
                WHERE relid = 'outbox_dead_letters'::regclass), 0) END) \
            FROM (SELECT 1 FROM outbox_dead_letters LIMIT $1) d), \
        (SELECT (extract(epoch FROM dead_lettered_at) * 1000)::bigint \
            FROM outbox_dead_letters ORDER BY dead_lettered_at LIMIT 1) \
    FROM outbox_shards s ",
    leases::head_of!("s")
);

// The oldest holder of the vacuum horizon of this database's tables: a session of this
// database with a snapshot or a transaction id (not an autovacuum worker: a vacuum's snapshot
// holds back no other vacuum), a replication slot or a standby's feedback
// (which hold every database's), or a prepared transaction; by how many transactions it is
// behind (the age of its xmin; xid has no order, so the oldest is the one with the greatest
// age).
const HORIZON: &str = "\
    SELECT holder, since, behind FROM ( \
        SELECT format('session %s (%s%s, %s)', pid, \
                coalesce(nullif(application_name, ''), 'no application name'), \
                coalesce(', ' || host(client_addr), ''), coalesce(state, 'state unknown')) \
                AS holder, \
            (extract(epoch FROM xact_start) * 1000)::bigint AS since, \
            greatest(age(backend_xmin), age(backend_xid))::bigint AS behind \
        FROM pg_stat_activity \
        WHERE datname = current_database() AND pid <> pg_backend_pid() \
            AND backend_type <> 'autovacuum worker' \
            AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) \
        UNION ALL \
        SELECT format('replication slot %s', slot_name), NULL, age(xmin)::bigint \
        FROM pg_replication_slots WHERE xmin IS NOT NULL \
        UNION ALL \
        SELECT format('standby %s (%s)', coalesce(nullif(application_name, ''), 'unnamed'), \
                coalesce(host(client_addr), 'local')), NULL, age(backend_xmin)::bigint \
        FROM pg_stat_replication WHERE backend_xmin IS NOT NULL \
        UNION ALL \
        SELECT format('prepared transaction %s', gid), \
            (extract(epoch FROM prepared) * 1000)::bigint, age(transaction)::bigint \
        FROM pg_prepared_xacts WHERE database = current_database()) h \
    ORDER BY behind DESC NULLS LAST LIMIT 1";

// One shard: its messages counted up to `$4`, and above it estimated from the density of ids
// of its first `$4` (their span) over the span of all of its ids.
const SHARD: &str = concat!(
    "WITH h AS (SELECT shard_scope, shard_identifier, destination, id, created_at \
        FROM outbox_messages WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 \
        ORDER BY id LIMIT 1), \
    n AS (SELECT h.*, \
        (SELECT count(*) FROM (SELECT 1 FROM outbox_messages m WHERE m.shard_scope = h.shard_scope \
            AND m.shard_identifier = h.shard_identifier AND m.destination = h.destination \
            LIMIT $4::bigint) c) AS counted, \
        (SELECT m.id FROM outbox_messages m WHERE m.shard_scope = h.shard_scope \
            AND m.shard_identifier = h.shard_identifier AND m.destination = h.destination \
            ORDER BY m.id DESC LIMIT 1) AS newest, \
        (SELECT m.id FROM outbox_messages m WHERE m.shard_scope = h.shard_scope \
            AND m.shard_identifier = h.shard_identifier AND m.destination = h.destination \
            ORDER BY m.id OFFSET $4::bigint LIMIT 1) AS beyond \
        FROM h), ",
    shard_view_of!(
        "SELECT shard_scope, shard_identifier, destination, \
            CASE WHEN beyond IS NULL THEN counted \
                ELSE greatest(counted + 1, counted * (newest - id + 1) / (beyond - id)) END \
                AS pending, \
            created_at AS oldest, newest, beyond IS NOT NULL AS estimated FROM n"
    ),
    "SELECT ",
    shard_columns!(),
    " FROM v"
);

/// The inbox's statements.
const INBOX: InboxStatements = InboxStatements {
    record: "INSERT INTO outbox_inbox (consumer, message_id) VALUES ($1, $2) \
             ON CONFLICT (consumer, message_id) DO NOTHING",
    purge: "DELETE FROM outbox_inbox \
            WHERE consumer = $1 AND received_at < now() - $2 * interval '1 millisecond'",
    purge_all: "DELETE FROM outbox_inbox WHERE received_at < now() - $1 * interval '1 millisecond'",
    dead_letter: "INSERT INTO outbox_inbox_dead_letters \
                      (consumer, message_id, category, headers, payload, error, attempts) \
                  VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7)",
    dead_letters: "SELECT id, consumer, message_id, category, headers::text, payload, error, \
                       attempts::bigint, (extract(epoch FROM failed_at) * 1000)::bigint \
                   FROM outbox_inbox_dead_letters \
                   WHERE $1::text IS NULL OR consumer = $1 \
                   ORDER BY id LIMIT $2",
};

/// The relays' heartbeats.
const RELAYS: RelayStatements = RelayStatements {
    beat: "INSERT INTO outbox_relays (worker, started_at, seen_at, expires_at, in_flight, \
               waiting, open_breakers, protocol) \
           VALUES ($1, to_timestamp($2::bigint / 1000.0), now(), \
               now() + $3::bigint * interval '1 millisecond', $4, $5, $6, 2) \
           ON CONFLICT (worker) DO UPDATE SET started_at = excluded.started_at, \
               seen_at = excluded.seen_at, expires_at = excluded.expires_at, \
               in_flight = excluded.in_flight, waiting = excluded.waiting, \
               open_breakers = excluded.open_breakers, protocol = excluded.protocol",
    forget: "DELETE FROM outbox_relays \
             WHERE expires_at < now() - $1::bigint * interval '1 millisecond'",
    leave: "DELETE FROM outbox_relays WHERE worker = $1",
    list: "SELECT worker, (extract(epoch FROM started_at) * 1000)::bigint, \
               (extract(epoch FROM seen_at) * 1000)::bigint, \
               (extract(epoch FROM expires_at - seen_at) * 1000)::bigint, in_flight, waiting, \
               open_breakers, expires_at > now() \
           FROM outbox_relays \
           WHERE expires_at >= now() - $1::bigint * interval '1 millisecond' \
           ORDER BY worker",
};

const SET_ASIDE: SetAsideStatements = SetAsideStatements {
    lock_message: "SELECT shard_scope, shard_identifier, destination FROM outbox_messages \
                   WHERE id = $1 FOR UPDATE",
    ensure_shard: leases::ENSURE_CHAIN,
    // The newest row of the shard's chain, locked: claims that would follow it skip it.
    lock_shard: concat!(
        "SELECT CASE WHEN l.lease_expires_at > now() THEN coalesce(l.lease_owner, '') END \
         FROM outbox_leases l \
         WHERE l.shard_scope = $1 AND l.shard_identifier = $2 AND l.destination = $3 \
             AND l.seq = ",
        leases::newest!("$1", "$2", "$3"),
        " FOR UPDATE OF l SKIP LOCKED"
    ),
    copy: "INSERT INTO outbox_dead_letters (message_id, shard_scope, shard_identifier, \
               destination, category, object_identifier, object_wide, payload, created_at, \
               error, attempts, first_failed_at, lease_token, metadata) \
           SELECT m.id, m.shard_scope, m.shard_identifier, m.destination, m.category, \
               m.object_identifier, m.object_wide, m.payload, m.created_at, $5, \
               coalesce(s.attempts, 0), coalesce(s.first_failed_at, now()), \
               coalesce((SELECT l.lease_token FROM outbox_leases l \
                   WHERE l.shard_scope = $1 AND l.shard_identifier = $2 AND l.destination = $3 \
                       AND l.lease_token IS NOT NULL ORDER BY l.seq DESC LIMIT 1), 0), \
               m.metadata \
           FROM outbox_messages m LEFT JOIN outbox_shards s \
               ON s.shard_scope = $1 AND s.shard_identifier = $2 AND s.destination = $3 \
           WHERE m.id = $4",
    clear_failures: "UPDATE outbox_shards SET attempts = 0, first_failed_at = NULL, \
                         last_error = NULL, retry_at = NULL, parked_category = NULL \
                     WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 \
                         AND NOT EXISTS (SELECT 1 FROM outbox_messages m \
                             WHERE m.shard_scope = $1 AND m.shard_identifier = $2 \
                                 AND m.destination = $3 AND m.id < $4)",
    delete: "DELETE FROM outbox_messages WHERE id = $1",
};

const SHARD_MESSAGES: &str = "\
    SELECT id, shard_scope, shard_identifier, destination, category, object_identifier, \
        object_wide, payload::text, (extract(epoch FROM created_at) * 1000)::bigint, \
        metadata::text \
    FROM outbox_messages \
    WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 \
    ORDER BY id LIMIT $4";

/// The answer of [`CLAIM_MANY`]: its one row's arrays, an element per head row read (a
/// claimed shard with none has one, its message columns NULL), in no particular order.
#[derive(Default)]
pub(crate) struct ClaimAnswer {
    pub(crate) ids: Vec<Option<i64>>,
    categories: Vec<Option<i32>>,
    scopes: Vec<Option<i16>>,
    objects: Vec<Option<i64>>,
    wides: Vec<Option<Vec<u8>>>,
    payloads: Vec<Option<String>>,
    created: Vec<Option<i64>>,
    metadata: Vec<Option<String>>,
    shard_scopes: Vec<i16>,
    pub(crate) shard_identifiers: Vec<i64>,
    destinations: Vec<String>,
    pub(crate) tokens: Vec<i64>,
    attempts: Vec<i32>,
    previous_owners: Vec<Option<String>>,
    stale: Vec<bool>,
    pub(crate) seqs: Vec<i64>,
}

/// The array at `index` of `row` (`NULL`, an aggregate of no rows: empty).
fn column<T>(row: &PgRow, index: usize) -> Result<Vec<T>, sqlx::Error>
where
    T: arrays::Element,
    Vec<T>: for<'r> sqlx::Decode<'r, Postgres>,
{
    Ok(maybe_column(row, index)?.unwrap_or_default())
}

/// The array at `index` of `row`, or `None` if it is NULL.
fn maybe_column<T>(row: &PgRow, index: usize) -> Result<Option<Vec<T>>, sqlx::Error>
where
    T: arrays::Element,
    Vec<T>: for<'r> sqlx::Decode<'r, Postgres>,
{
    Ok(row
        .try_get_unchecked::<Option<arrays::Decoded<T>>, _>(index)?
        .map(|column| column.0))
}

impl ClaimAnswer {
    /// The answer in `row` (none: nothing claimed), its elements in order: by claim (in
    /// token order), each claim's rows in id order.
    pub(crate) fn of(row: Option<&PgRow>) -> Result<(Self, Vec<usize>), sqlx::Error> {
        let Some(row) = row else {
            return Ok((Self::default(), Vec::new()));
        };
        let answer = Self {
            ids: column(row, 0)?,
            categories: column(row, 1)?,
            scopes: column(row, 2)?,
            objects: column(row, 3)?,
            wides: column(row, 4)?,
            payloads: column(row, 5)?,
            created: column(row, 6)?,
            metadata: column(row, 7)?,
            shard_scopes: column(row, 8)?,
            shard_identifiers: column(row, 9)?,
            destinations: column(row, 10)?,
            tokens: column(row, 11)?,
            attempts: column(row, 12)?,
            previous_owners: column(row, 13)?,
            stale: column(row, 14)?,
            seqs: column(row, 15)?,
        };
        let count = answer.tokens.len();
        let lengths = [
            answer.ids.len(),
            answer.categories.len(),
            answer.scopes.len(),
            answer.objects.len(),
            answer.wides.len(),
            answer.payloads.len(),
            answer.created.len(),
            answer.metadata.len(),
            answer.shard_scopes.len(),
            answer.shard_identifiers.len(),
            answer.destinations.len(),
            answer.attempts.len(),
            answer.previous_owners.len(),
            answer.stale.len(),
            answer.seqs.len(),
        ];
        if lengths.iter().any(|&length| length != count) {
            return Err(sqlx::Error::Decode(
                "the claim's arrays differ in length".into(),
            ));
        }
        // Sorted with each key beside its place, not looked up in two arrays at every step.
        let mut keyed: Vec<(i64, Option<i64>, usize)> = (answer.tokens.iter())
            .zip(&answer.ids)
            .enumerate()
            .map(|(at, (&token, &id))| (token, id, at))
            .collect();
        keyed.sort_unstable();
        let order = keyed.into_iter().map(|(_, _, at)| at).collect();
        Ok((answer, order))
    }

    /// The claim whose element `at` is (the first met of its claim), with an empty head of
    /// `first_read` rows to fill, and room in it for the `rows` elements the claim has.
    fn claim(
        &mut self,
        at: usize,
        first_read: usize,
        rows: usize,
    ) -> Result<Claim<PgDialect>, sqlx::Error> {
        Ok(Claim {
            lease: Lease {
                shard: shard_from_stored(
                    self.shard_scopes[at],
                    self.shard_identifiers[at],
                    std::mem::take(&mut self.destinations[at]),
                )
                .map_err(|detail| sqlx::Error::Decode(detail.into()))?,
                token: self.tokens[at],
                attempts: u32::try_from(self.attempts[at]).unwrap_or(0),
                previous_owner: self.previous_owners[at].take(),
            },
            claiming: None,
            head: Some((Vec::with_capacity(rows), first_read)),
        })
    }

    /// The message of element `at` (each element taken once), if it has one that decodes.
    fn message(&mut self, at: usize) -> Option<outbox_core::store::StoredMessage> {
        let wide = self.wides[at].take()?;
        let object_identifier =
            outbox_sqlx::stored::object_from_stored(self.objects[at]?, &wide).ok()?;
        Some(outbox_core::store::StoredMessage {
            id: outbox_core::MessageId(self.ids[at]?),
            category: outbox_core::CategoryId(self.categories[at]?),
            scope: outbox_core::ScopeId(self.scopes[at]?),
            object_identifier,
            payload: self.payloads[at].take()?,
            created_at: outbox_sqlx::session::from_micros(self.created[at]?),
            metadata: self.metadata[at].take(),
        })
    }
}

// The shards with failures (`outbox_shards`) or a lease (the newest rows of the log that name
// an owner, live or lapsed); a released chain holds no state.
const SHARD_STATES: &str = "\
    WITH h AS (SELECT DISTINCT ON (shard_scope, shard_identifier, destination) \
            shard_scope, shard_identifier, destination, lease_owner, lease_expires_at, \
            lease_token \
        FROM outbox_leases ORDER BY shard_scope, shard_identifier, destination, seq DESC), \
    leased AS (SELECT * FROM h WHERE lease_owner IS NOT NULL) \
    SELECT coalesce(s.shard_scope, l.shard_scope), \
        coalesce(s.shard_identifier, l.shard_identifier), coalesce(s.destination, l.destination), \
        coalesce(s.attempts, 0)::bigint, s.last_error, \
        (extract(epoch FROM s.retry_at) * 1000)::bigint, l.lease_owner, \
        (extract(epoch FROM l.lease_expires_at) * 1000)::bigint, l.lease_token, \
        s.parked_category \
    FROM outbox_shards s FULL JOIN leased l ON l.shard_scope = s.shard_scope \
        AND l.shard_identifier = s.shard_identifier AND l.destination = s.destination \
    ORDER BY 1, 2, 3";

/// PostgreSQL's `lock_not_available`: a `lock_timeout` that ran out.
pub(crate) fn lock_not_available(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .is_some_and(|code| code == "55P03")
}

/// The columns of `shards` as the arrays the batch statements bind: scopes, identifiers,
/// destinations.
pub(crate) fn shard_arrays<'a>(
    shards: impl ExactSizeIterator<Item = &'a ShardKey>,
) -> (Vec<i16>, Vec<i64>, Vec<String>) {
    let mut scopes = Vec::with_capacity(shards.len());
    let mut identifiers = Vec::with_capacity(shards.len());
    let mut destinations = Vec::with_capacity(shards.len());
    for shard in shards {
        let (identifier, destination) = stored_shard(shard);
        scopes.push(shard.scope.0);
        identifiers.push(identifier);
        destinations.push(destination);
    }
    (scopes, identifiers, destinations)
}

/// What a batch finish does, as its errors name it.
const FINISHING: &str = "acknowledging and releasing drained shards";

/// The arrays a batch finish binds ([`leases::ACK_AND_RELEASE_MANY`]) that are not the rows
/// it acknowledges: one element per shard.
struct Finish {
    scopes: Vec<i16>,
    identifiers: Vec<i64>,
    destinations: Vec<String>,
    tokens: Vec<i64>,
    keep: Vec<bool>,
    seqs: Vec<Option<i64>>,
}

impl Finish {
    /// The shards at `places` alone, in that order.
    fn only(&self, places: &[usize]) -> Self {
        fn pick<T: Clone>(all: &[T], places: &[usize]) -> Vec<T> {
            places.iter().map(|&at| all[at].clone()).collect()
        }
        Self {
            scopes: pick(&self.scopes, places),
            identifiers: pick(&self.identifiers, places),
            destinations: pick(&self.destinations, places),
            tokens: pick(&self.tokens, places),
            keep: pick(&self.keep, places),
            seqs: pick(&self.seqs, places),
        }
    }
}

/// The shards a discovery statement ([`DISCOVER`], [`DISCOVER_RECENT`]) answered, in order:
/// each one's key, whether it is due, and its lowest pending id if the statement read it.
async fn discovered(
    pool: &PgPool,
    query: Statement<'_, Postgres>,
) -> Result<Vec<(ShardKey, bool, Option<i64>)>, Error> {
    const OPERATION: &str = "discovering due shards";
    let Some(row) = outbox_sqlx::store::rows_on::<PgDialect>(pool, query, OPERATION)
        .await?
        .pop()
    else {
        return Ok(Vec::new());
    };
    let decoded = |row: &PgRow| {
        Ok::<_, sqlx::Error>((
            column::<i64>(row, 0)?,
            column::<i16>(row, 1)?,
            column::<i64>(row, 2)?,
            column::<String>(row, 3)?,
            column::<bool>(row, 4)?,
            column::<Option<i64>>(row, 5)?,
        ))
    };
    let (places, scopes, identifiers, destinations, due, lowest) =
        decoded(&row).map_err(database::<PgDialect>(OPERATION))?;
    let shards = places.len();
    if [
        scopes.len(),
        identifiers.len(),
        destinations.len(),
        due.len(),
        lowest.len(),
    ]
    .iter()
    .any(|&len| len != shards)
    {
        return Err(Error::Database {
            operation: OPERATION,
            source: "the page's arrays differ in length".into(),
        });
    }
    let mut page: Vec<_> = places
        .into_iter()
        .zip(scopes)
        .zip(identifiers)
        .zip(destinations)
        .zip(due.into_iter().zip(lowest))
        .collect();
    // Most often in order already, which the sort finds in one pass.
    page.sort_by_key(|((((place, _), _), _), _)| *place);
    page.into_iter()
        .map(|((((_, scope), identifier), destination), (due, lowest))| {
            let shard = shard_from_stored(scope, identifier, destination).map_err(|detail| {
                Error::Undecodable {
                    operation: OPERATION,
                    message_id: None,
                    detail: format!("a shard key is not (SMALLINT, identifier, text): {detail}"),
                }
            })?;
            Ok((shard, due, lowest))
        })
        .collect()
}

/// What a batch finish answered, an element per shard in order: whether its lease was held,
/// the rows it deleted, and the released row's `seq` if the shard's chain stays.
struct Answers {
    held: Vec<bool>,
    deleted: Vec<u64>,
    released: Vec<Option<i64>>,
}

impl Answers {
    /// The answers to a finish of `batch` from what [`leases::ACK_AND_RELEASE_MANY`]
    /// returned: the places of the leases held (`None`: all), the acknowledged ids deleted
    /// (`None`: all those of the leases held), and the places and `seq`s of the released rows
    /// that follow kept chains.
    fn of(
        batch: &[outbox_sqlx::dialect::Finishing],
        held: Option<&[i64]>,
        deleted: Option<Vec<i64>>,
        following: Vec<i64>,
        seqs: Vec<i64>,
    ) -> Result<Self, String> {
        let slot = |place: i64| {
            usize::try_from(place - 1)
                .ok()
                .filter(|&slot| slot < batch.len())
                .ok_or_else(|| format!("place {place} of {} shards", batch.len()))
        };
        let mut answers = Self {
            held: vec![held.is_none(); batch.len()],
            deleted: vec![0; batch.len()],
            released: vec![None; batch.len()],
        };
        for place in held.into_iter().flatten() {
            answers.held[slot(*place)?] = true;
        }
        // Each lease held deleted its acknowledged rows, but for any that another
        // transaction deleted first (an operator's purge).
        let gone: Option<std::collections::HashSet<i64>> =
            deleted.map(|ids| ids.into_iter().collect());
        for (at, (_, _, acks)) in batch.iter().enumerate() {
            if answers.held[at] {
                let ids = acks.iter().flat_map(|ack| &ack.ids);
                answers.deleted[at] = match &gone {
                    None => ids.count(),
                    Some(gone) => ids.filter(|id| gone.contains(&id.0)).count(),
                } as u64;
            }
        }
        if following.len() != seqs.len() {
            return Err(format!(
                "{} released places for {} seqs",
                following.len(),
                seqs.len()
            ));
        }
        for (place, seq) in following.into_iter().zip(seqs) {
            let at = slot(place)?;
            if !answers.held[at] {
                return Err(format!("a release of place {place}, not held"));
            }
            answers.released[at] = Some(seq);
        }
        Ok(answers)
    }
}

impl PgDialect {
    /// A batch finish of `batch` (its shards' arrays in `finish`): its answers, one per shard.
    async fn finish_on(
        &self,
        conn: &mut sqlx::PgConnection,
        finish: &Finish,
        batch: &[outbox_sqlx::dialect::Finishing],
    ) -> Result<Answers, Error> {
        let (mut places, mut ids) = (Vec::new(), Vec::new());
        for (place, (_, _, acks)) in (1_i64..).zip(batch) {
            for id in acks.iter().flat_map(|ack| &ack.ids) {
                places.push(place);
                ids.push(id.0);
            }
        }
        let query = sqlx::query(leases::ACK_AND_RELEASE_MANY)
            .bind(Array(&finish.scopes))
            .bind(Array(&finish.identifiers))
            .bind(Array(&finish.destinations))
            .bind(Array(&finish.tokens))
            .bind(Array(&places))
            .bind(Array(&ids))
            .bind(Array(&finish.keep))
            .bind(Array(&finish.seqs));
        let rows = space::fetch_all(conn, query, self.space.guarded())
            .await
            .map_err(database::<Self>(FINISHING))?;
        let row = rows.first().ok_or_else(|| Error::Database {
            operation: FINISHING,
            source: "no answer".into(),
        })?;
        let decoded = (|| {
            Ok::<_, sqlx::Error>((
                maybe_column::<i64>(row, 0)?,
                maybe_column::<i64>(row, 1)?,
                column::<i64>(row, 2)?,
                column::<i64>(row, 3)?,
            ))
        })();
        let (held, deleted, following, seqs) = decoded.map_err(database::<Self>(FINISHING))?;
        Answers::of(batch, held.as_deref(), deleted, following, seqs).map_err(|problem| {
            Error::Database {
                operation: FINISHING,
                source: problem.into(),
            }
        })
    }

    /// Leased claims of `shards` (the switch to the lease log made), each with the first
    /// `first_read` rows of its head.
    async fn claim_leased(
        &self,
        pool: &PgPool,
        shards: &[ShardKey],
        options: &ClaimOptions,
        first_read: usize,
    ) -> Result<Vec<Claim<Self>>, Error> {
        const OPERATION: &str = "claiming shards";
        let (scopes, identifiers, destinations) = shard_arrays(shards.iter());
        // Positions spare the reads what a held horizon keeps; while none is held, vacuum (or
        // the next scan) removes what drains delete, and heads are read from their start.
        let (settled, afters) = if self.leases.held() {
            self.positions.refresh(pool).await;
            self.positions.before_claim(shards)
        } else {
            (0, vec![0; shards.len()])
        };
        let query = sqlx::query(leases::CLAIM_MANY)
            .bind(Array(&scopes))
            .bind(Array(&identifiers))
            .bind(Array(&destinations))
            .bind(&options.worker)
            .bind(i64::try_from(options.lease.as_millis()).unwrap_or(i64::MAX))
            .bind(i64::try_from(first_read).unwrap_or(i64::MAX))
            .bind(Array(&afters));
        let mut conn = pool.acquire().await.map_err(database::<Self>(OPERATION))?;
        let rows = space::fetch_all(&mut conn, query, self.space.guarded())
            .await
            .map_err(database::<Self>(OPERATION))?;
        let (mut answer, order) =
            ClaimAnswer::of(rows.first()).map_err(database::<Self>(OPERATION))?;
        // By claim (in token order), each claim's rows in id order.
        let mut claims: Vec<Claim<Self>> = Vec::with_capacity(shards.len());
        let mut seqs = Vec::with_capacity(shards.len());
        for (place, &at) in order.iter().enumerate() {
            let token = answer.tokens[at];
            if claims.last().is_none_or(|claim| claim.lease.token != token) {
                // The claim's elements follow it: its head gets room for them at once.
                let rows = order[place..]
                    .iter()
                    .take_while(|&&next| answer.tokens[next] == token)
                    .count();
                claims.push(
                    answer
                        .claim(at, first_read, rows)
                        .map_err(database::<Self>(OPERATION))?,
                );
                seqs.push((token, answer.seqs[at]));
            }
            let (Some(_), Some(claim)) = (answer.ids[at], claims.last_mut()) else {
                continue;
            };
            // A stale read, or a row that does not decode, leaves the claim without its
            // read: the session's first fetch reads again (and meets the row where the relay
            // handles it).
            match (answer.stale[at], answer.message(at), &mut claim.head) {
                (false, Some(message), Some((head, _))) => head.push(message),
                (_, _, head) => *head = None,
            }
        }
        // Where each claim read from (a position, or the shard's start), while positions are
        // kept (a frontier is known).
        if settled > 0 {
            let from: HashMap<&ShardKey, i64> = shards.iter().zip(afters.iter().copied()).collect();
            let leases = claims.iter().map(|claim| {
                let shard = &claim.lease.shard;
                (
                    shard,
                    claim.lease.token,
                    from.get(shard).copied().unwrap_or(0),
                )
            });
            self.positions.claimed(settled, leases);
        }
        self.leases.claimed(seqs.into_iter());
        Ok(claims)
    }
}

impl Dialect for PgDialect {
    type Database = Postgres;
    type Turn = ();
    type Wakeups = PgWakeups;

    const NAME: &'static str = "PostgreSQL";
    const MIGRATIONS: &'static [EmbeddedMigration] = MIGRATIONS;
    const MIGRATIONS_TABLE: &'static str = "CREATE TABLE IF NOT EXISTS _outbox_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
    success BOOLEAN NOT NULL,
    checksum BYTEA NOT NULL,
    execution_time BIGINT NOT NULL
);";
    const BEGIN: &'static str = "BEGIN";
    const WRITES_IN_TRANSACTION: bool = false;
    const MAX_PARAMETERS: usize = 65535;
    const SQL: Statements = Statements {
        insert_message: INSERT_MESSAGE,
        insert_messages: INSERT_MESSAGES,
        fetch: FETCH,
        fetch_newest: FETCH_NEWEST,
        ack: Ack::Combined(leases::ACK),
        ack_and_release: Some(leases::ACK_AND_RELEASE),
        extend_lease: leases::EXTEND_LEASE,
        delete_if_empty: leases::DELETE_IF_EMPTY,
        release: leases::RELEASE,
        release_lease: leases::RELEASE_LEASE,
        fail: leases::FAIL,
        release_interrupted: leases::RELEASE_INTERRUPTED,
        table_exists: "SELECT to_regclass($1) IS NOT NULL",
        discover: DISCOVER,
        unpark: "UPDATE outbox_shards SET parked_category = NULL, retry_at = now() \
                 WHERE parked_category = ANY($1) AND retry_at > now()",
        reschedule: "UPDATE outbox_shards SET retry_at = now() \
                     WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3 \
                        AND retry_at > now()",
        pending_in_shard: "SELECT count(*) FROM outbox_messages \
                           WHERE shard_scope = $1 AND shard_identifier = $2 \
                              AND destination = $3 AND id <= $4",
        pending_messages: PENDING_MESSAGES,
        shard_states: SHARD_STATES,
        dead_letter: DEAD_LETTER,
        dead_letters: DEAD_LETTERS,
        lock_dead_letters: "SELECT message_id FROM outbox_dead_letters \
                            WHERE message_id = ANY($1::bigint[]) FOR UPDATE",
        replay_dead_letters: REPLAY_DEAD_LETTERS,
        purge_dead_letters: "DELETE FROM outbox_dead_letters WHERE message_id = ANY($1::bigint[])",
        purge_expired_dead_letters: PURGE_EXPIRED_DEAD_LETTERS,
        pause: "INSERT INTO outbox_pauses \
                    (kind, shard_scope, shard_identifier, destination, category, reason) \
                VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        resume: "DELETE FROM outbox_pauses WHERE kind = $1 AND shard_scope = $2 \
                    AND shard_identifier = $3 AND destination = $4 AND category = $5",
        pauses: PAUSES,
        compact_paused: COMPACT_PAUSED,
        backfill: BACKFILL,
        oldest_due_age: OLDEST_DUE_AGE,
        is_paused: concat!(
            "SELECT ",
            outbox_sqlx::paused!("$1::smallint", "$2::bigint", "$3::text")
        ),
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
        match error.code().as_deref() {
            // undefined_table, undefined_column, undefined_function
            Some("42P01" | "42703" | "42883") => Fault::SchemaMissing,
            // connection_exception (08xxx), operator_intervention (57xxx: shutdown, terminated
            // session), cannot_connect_now, insufficient_resources (53xxx: too many
            // connections, disk full), invalid_catalog_name (3D000: the database does not
            // exist yet; it can be created, and the relay should be there when it is)
            Some(code)
                if code.starts_with("08")
                    || code.starts_with("57")
                    || code.starts_with("53")
                    || code == "3D000" =>
            {
                Fault::Unavailable
            }
            _ => Fault::Other,
        }
    }

    fn is_missing_table(error: &dyn DatabaseError) -> bool {
        // undefined_table
        error.code().as_deref() == Some("42P01")
    }

    fn binary_literal(hex: &str) -> String {
        format!("'\\x{hex}'")
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }

    fn bind_shard<'q>(query: Statement<'q, Postgres>, shard: &ShardKey) -> Statement<'q, Postgres> {
        let (identifier, destination) = stored_shard(shard);
        query.bind(identifier).bind(destination)
    }

    fn decode_shard(row: &PgRow, index: usize) -> Result<ShardKey, sqlx::Error> {
        shard_from_stored(
            row.try_get_unchecked(index)?,
            row.try_get_unchecked(index + 1)?,
            row.try_get_unchecked(index + 2)?,
        )
        .map_err(|detail| sqlx::Error::Decode(detail.into()))
    }

    const OBJECT_COLUMNS: usize = 2;

    fn bind_object<'q>(query: Statement<'q, Postgres>, object: Id) -> Statement<'q, Postgres> {
        let (identifier, wide) = stored_object(object);
        query.bind(identifier).bind(wide)
    }

    fn decode_object(row: &PgRow, index: usize) -> Result<Id, sqlx::Error> {
        let wide: Vec<u8> = row.try_get_unchecked(index + 1)?;
        outbox_sqlx::stored::object_from_stored(row.try_get_unchecked(index)?, &wide)
    }

    fn bind_ids<'q>(query: Statement<'q, Postgres>, ids: Vec<i64>) -> Statement<'q, Postgres> {
        query.bind(Array(ids))
    }

    fn bind_categories<'q>(
        query: Statement<'q, Postgres>,
        categories: Vec<i32>,
    ) -> Statement<'q, Postgres> {
        query.bind(Array(categories))
    }

    fn bind_groups<'q>(
        query: Statement<'q, Postgres>,
        groups: &[GroupKey],
    ) -> Statement<'q, Postgres> {
        let categories: Vec<i32> = groups.iter().map(|group| group.category.0).collect();
        let (objects, wides): (Vec<i64>, Vec<Vec<u8>>) = groups
            .iter()
            .map(|group| stored_object(group.object_identifier))
            .unzip();
        query
            .bind(Array(categories))
            .bind(Array(objects))
            .bind(Array(wides))
    }

    fn bind_messages<'q>(
        query: Statement<'q, Postgres>,
        messages: &[Message],
    ) -> Statement<'q, Postgres> {
        let mut scopes = Vec::with_capacity(messages.len());
        let mut shards = Vec::with_capacity(messages.len());
        let mut destinations = Vec::with_capacity(messages.len());
        let mut categories = Vec::with_capacity(messages.len());
        let mut objects = Vec::with_capacity(messages.len());
        let mut object_wides = Vec::with_capacity(messages.len());
        let mut payloads = Vec::with_capacity(messages.len());
        let mut metadata = Vec::with_capacity(messages.len());
        for message in messages {
            let shard = message.shard();
            let (shard_identifier, destination) = stored_shard(shard);
            let (object, object_wide) = stored_object(message.object_identifier());
            scopes.push(shard.scope.0);
            shards.push(shard_identifier);
            destinations.push(destination);
            categories.push(message.category().0);
            objects.push(object);
            object_wides.push(object_wide);
            payloads.push(message.payload_json().to_owned());
            metadata.push(message.metadata().to_json());
        }
        query
            .bind(Array(scopes))
            .bind(Array(shards))
            .bind(Array(destinations))
            .bind(Array(categories))
            .bind(Array(objects))
            .bind(Array(object_wides))
            .bind(Array(payloads))
            .bind(Array(metadata))
    }

    fn decode_ids(row: &PgRow, index: usize) -> Result<Vec<i64>, Error> {
        row.try_get_unchecked(index)
            .map_err(database::<Self>("reading a shard"))
    }

    fn load_model_sql(table: &ModelTable, wide: bool) -> String {
        crate::model::load_sql(table, wide)
    }

    fn load_models_sql(table: &ModelTable, wide: bool) -> String {
        crate::model::load_many_sql(table, wide)
    }

    fn bind_keys<'q>(query: Statement<'q, Postgres>, keys: &[Id]) -> Statement<'q, Postgres> {
        match keys.first().and_then(|key| key.as_wide()) {
            Some(_) => query.bind(
                keys.iter()
                    .map(|key| {
                        key.wide_bytes()
                            .map(|bytes| bytes.to_vec())
                            .unwrap_or_default()
                    })
                    .collect::<Vec<Vec<u8>>>(),
            ),
            None => query.bind(
                keys.iter()
                    .map(|key| key.as_integer().unwrap_or_default())
                    .collect::<Vec<i64>>(),
            ),
        }
    }

    fn walk_model_sql(table: &ModelTable, after: Option<bool>) -> String {
        crate::model::walk_sql(table, after)
    }

    fn read_model(row: &<Self::Database as Database>::Row) -> Result<ModelRow, sqlx::Error> {
        crate::model::read(row)
    }

    fn placeholder(index: usize) -> String {
        format!("${index}")
    }

    fn column_accepts(
        field: &<Self::Database as Database>::TypeInfo,
        column: &<Self::Database as Database>::TypeInfo,
        compatible: bool,
    ) -> bool {
        crate::model::accepts(field, column, compatible)
    }

    async fn take_turn(&self) {}

    /// One statement a lease: each locks only its shard's row.
    async fn extend_leases(
        &self,
        pool: &PgPool,
        leases: &[Lease],
        duration: std::time::Duration,
    ) -> Result<Vec<bool>, Error> {
        outbox_sqlx::session::extend_each(self, pool, leases, duration).await
    }

    async fn claim(
        &self,
        pool: &PgPool,
        shard: &ShardKey,
        options: &ClaimOptions,
    ) -> Result<Option<Claim<Self>>, Error> {
        if !self.leases.ready(pool).await? {
            return Ok(None);
        }
        if options.mode == HandlerMode::Leased {
            // One shard of a batch claim, its head left for the session to read.
            let claimed = self
                .claim_leased(pool, std::slice::from_ref(shard), options, 0)
                .await?;
            return Ok(claimed.into_iter().next().map(|claim| Claim {
                head: None,
                ..claim
            }));
        }
        const OPERATION: &str = "claiming a shard";
        outbox_sqlx::session::shard_keyed::<Self>(leases::ENSURE_CHAIN, shard)
            .execute(pool)
            .await
            .map_err(database::<Self>(OPERATION))?;
        let mut tx = pool.begin().await.map_err(database::<Self>(OPERATION))?;
        let (identifier, destination) = stored_shard(shard);
        let claimed = sqlx::query_as::<_, (i64, i32, Option<String>)>(leases::TAKE_LEASE)
            .bind(shard.scope.0)
            .bind(identifier)
            .bind(destination)
            .bind(&options.worker)
            .bind(i64::try_from(options.lease.as_millis()).unwrap_or(i64::MAX))
            .fetch_optional(&mut *tx)
            .await
            .map_err(database::<Self>(OPERATION))?;
        Ok(claimed.map(|(token, attempts, previous_owner)| Claim {
            lease: Lease {
                shard: shard.clone(),
                token,
                attempts: u32::try_from(attempts).unwrap_or(0),
                previous_owner,
            },
            claiming: Some(Claiming { tx, turn: () }),
            head: None,
        }))
    }

    async fn claim_many(
        &self,
        pool: &PgPool,
        shards: &[ShardKey],
        options: &ClaimOptions,
        first_read: usize,
    ) -> Result<Vec<Claim<Self>>, Error> {
        if options.mode == HandlerMode::InTransaction {
            return outbox_sqlx::dialect::claim_each(self, pool, shards, options).await;
        }
        if !self.leases.ready(pool).await? {
            return Ok(Vec::new());
        }
        self.leases.tidy(pool);
        self.claim_leased(pool, shards, options, first_read).await
    }

    fn read_head(rows: Vec<PgRow>) -> Result<Vec<outbox_core::store::StoredMessage>, Error> {
        rows.iter()
            .map(outbox_sqlx::session::stored::<Self>)
            .collect()
    }

    async fn discover(
        &self,
        pool: &PgPool,
        scope: i32,
        cursor: &ShardKey,
        limit: i32,
    ) -> Result<Vec<(ShardKey, bool)>, Error> {
        let first = scope == outbox_sqlx::store::FIRST_PAGE_SCOPE;
        if first {
            self.positions.refresh(pool).await;
            self.space.now_and_then(pool);
        }
        let above = self.sweeps.page(first, self.positions.settled());
        let started = std::time::Instant::now();
        let query = Self::bind_shard(
            sqlx::query(if above.is_some() {
                DISCOVER_RECENT
            } else {
                DISCOVER
            })
            .bind(scope),
            cursor,
        )
        .bind(limit);
        let query = match above {
            Some(above) => query.bind(above),
            None => query,
        };
        let page = discovered(pool, query).await?;
        let last = page.len() < usize::try_from(limit).unwrap_or(usize::MAX);
        self.sweeps.read(started.elapsed(), last);
        self.positions.seen(
            page.iter()
                .filter_map(|(shard, _, lowest)| Some((shard, (*lowest)?))),
        );
        Ok(page
            .into_iter()
            .map(|(shard, due, _)| (shard, due))
            .collect())
    }

    const FINISHES_IN_ONE_STATEMENT: bool = true;

    async fn ack_and_release_on(
        &self,
        conn: &mut sqlx::PgConnection,
        batch: &[outbox_sqlx::dialect::Finishing],
    ) -> Result<Vec<outbox_sqlx::dialect::Finished>, Error> {
        let (scopes, identifiers, destinations) =
            shard_arrays(batch.iter().map(|(lease, _, _)| &lease.shard));
        let tokens: Vec<i64> = batch.iter().map(|(lease, _, _)| lease.token).collect();
        let seqs = self.leases.seqs(tokens.iter().copied());
        let horizon_held = self.leases.held();
        let keep = self
            .leases
            .keep(batch.iter().map(|(lease, _, _)| &lease.shard));
        let finish = Finish {
            scopes,
            identifiers,
            destinations,
            tokens,
            keep,
            seqs,
        };
        let mut answers = self.finish_on(conn, &finish, batch).await?;
        // A lease that its own extension changed beside the statement is no longer where the
        // statement's snapshot saw it, and the finish said it was not held (see
        // `leases::superseded`): such leases are asked for once more, in a new snapshot. A
        // lease taken over is not held then either.
        let missed: Vec<usize> = (0..batch.len()).filter(|&at| !answers.held[at]).collect();
        if !missed.is_empty() {
            let again: Vec<_> = missed.iter().map(|&at| batch[at].clone()).collect();
            let second = self.finish_on(conn, &finish.only(&missed), &again).await?;
            for (answer, at) in missed.into_iter().enumerate() {
                answers.held[at] = second.held[answer];
                answers.deleted[at] = second.deleted[answer];
                answers.released[at] = second.released[answer];
            }
        }
        // Each statement is committed when it returns: the drained shards' positions move, and
        // the chains kept are remembered.
        let mut kept = Vec::new();
        let finished = batch
            .iter()
            .enumerate()
            .map(|(at, (lease, _, acks))| {
                Ok(if !answers.held[at] {
                    Err(Error::LeaseLost {
                        shard: lease.shard.clone(),
                        token: lease.token,
                    })
                } else {
                    let highest = acks.iter().flat_map(|ack| &ack.ids).map(|id| id.0).max();
                    if let Some(highest) = highest.filter(|_| horizon_held) {
                        self.positions.drained(&lease.shard, lease.token, highest);
                    }
                    kept.extend(answers.released[at].map(|seq| (&lease.shard, seq)));
                    Ok((answers.deleted[at], true))
                })
            })
            .collect();
        self.leases.kept(kept);
        finished
    }

    async fn wakeups(pool: &PgPool) -> Result<Option<PgWakeups>, Error> {
        PgWakeups::listen(pool).await.map(Some)
    }

    fn database_key(pool: &PgPool) -> String {
        wakeups::database_key(pool)
    }

    fn announce_elsewhere(pool: &PgPool, database: &str, shards: &[ShardKey]) {
        wakeups::notify(pool, database, shards);
    }
}

impl<'c> outbox_sqlx::model::ModelTarget<'c, 'static, PgDialect> for &'c mut sqlx::PgConnection {
    fn target(self) -> outbox_sqlx::model::Target<'c, 'static, PgDialect> {
        outbox_sqlx::model::Target::Connection(self)
    }
}
