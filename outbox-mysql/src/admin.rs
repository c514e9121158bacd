//! MariaDB's statements for the operators' reads and writes, the backfills, the set-aside of one
//! message, the relays' heartbeats and the inbox: the fields of `Statements` that PostgreSQL's
//! and SQLite's dialects fill the same way, written for MariaDB 10.11.
//!
//! Parameters. MariaDB has only positional `?` placeholders, and the shared body binds each of a
//! statement's parameters once, in the order of the numbers its field documents (with
//! `OBJECT_COLUMNS` = 2, PostgreSQL's numbering). So each statement holds exactly as many `?` as
//! the body binds, in that order. Where a value is needed twice, or before one that comes
//! earlier, the statement takes its parameters once, in order, in a one-row table `p` (a
//! derived table, or a CTE) and names them there.
//!
//! Two things MariaDB 10.11's optimizer does that shape these statements:
//!
//! * A table of parameters JOINED into the query block that orders or limits by an index
//!   (`FROM (SELECT ? AS scope, ...) p JOIN outbox_messages m ON ... ORDER BY m.id LIMIT n`)
//!   makes MariaDB read the whole shard and sort it (EXPLAIN shows `ref const`, ANALYZE a
//!   filesort of every row). Where an index order, a range or a loose index scan matters, a
//!   parameter is read as a scalar subquery of the CTE `p` instead (`param!("scope")`, that
//!   is `(SELECT p.scope FROM p)`): MariaDB evaluates it while optimizing, as a constant.
//! * A correlated subquery never seeks a range of an index (`x.id > outer.id` is a filter on a
//!   scan from the start of the index or of the `ref` prefix): there is no `LATERAL`. The
//!   statements seek only by equality in correlated subqueries, and then by index order with
//!   `LIMIT`/`OFFSET` (the newest row of a shard: `ORDER BY id DESC LIMIT 1`, one index entry).
//!
//! MariaDB only (not MySQL 8): `INSERT ... RETURNING` (`REPLAY_DEAD_LETTERS`, the backfills'
//! `record` and `start`), a `WITH RECURSIVE` CTE naming a CTE defined after it (`DEAD_LETTERS`),
//! `VALUES(col)` in `ON DUPLICATE KEY UPDATE` (deprecated in MySQL 8).
//! `information_schema.TABLES.TABLE_ROWS` is InnoDB's running estimate on MariaDB; MySQL 8
//! caches it for a day (`information_schema_stats_expiry`).
//!
//! Booleans come back as integer expressions, counts as `BIGINT`, sums `CAST(... AS SIGNED)`
//! (a `SUM` is `DECIMAL`, which sqlx's MySQL driver does not decode as an integer).

use outbox_sqlx::{BackfillStatements, InboxStatements, RelayStatements, SetAsideStatements};

/// The estimate of a table's rows by InnoDB (`information_schema.TABLES.TABLE_ROWS`, kept up
/// to date as rows come and go on MariaDB), as a signed `BIGINT`, 0 if unknown.
macro_rules! table_rows {
    ($table:literal) => {
        concat!(
            "CAST(COALESCE((SELECT st.TABLE_ROWS FROM information_schema.TABLES st \
             WHERE st.TABLE_SCHEMA = DATABASE() AND st.TABLE_NAME = '",
            $table,
            "'), 0) AS SIGNED)"
        )
    };
}

pub(crate) const PENDING_MESSAGES: &str = "\
    SELECT id, shard_scope, shard_identifier, destination, category, object_identifier, \
        object_wide, payload, created_at, metadata \
    FROM outbox_messages ORDER BY id LIMIT ?";

pub(crate) const SHARD_STATES: &str = "\
    SELECT shard_scope, shard_identifier, destination, CAST(attempts AS SIGNED), last_error, \
        retry_at, lease_owner, lease_expires_at, lease_token, parked_category \
    FROM outbox_shards ORDER BY shard_scope, shard_identifier, destination";

// The group's rows, copied only while the lease `$1..$4` is current, each once however often
// the list names it (as `= ANY` does).
pub(crate) const DEAD_LETTER: &str = concat!(
    "INSERT INTO outbox_dead_letters (message_id, shard_scope, shard_identifier, destination, \
        category, object_identifier, object_wide, payload, created_at, error, attempts, \
        first_failed_at, dead_lettered_at, lease_token, metadata) \
    SELECT DISTINCT m.id, m.shard_scope, m.shard_identifier, m.destination, m.category, \
        m.object_identifier, m.object_wide, m.payload, m.created_at, p.error, p.attempts, \
        COALESCE(s.first_failed_at, ",
    now!(),
    "), ",
    now!(),
    ", s.lease_token, m.metadata \
    FROM (SELECT ? AS scope, ? AS identifier, ? AS destination, ? AS token, ? AS ids, \
            ? AS error, ? AS attempts) AS p \
        JOIN outbox_shards s ON s.shard_scope = p.scope AND s.shard_identifier = p.identifier \
            AND s.destination = p.destination AND s.lease_token = p.token \
        JOIN ",
    json_ids!("p.ids"),
    " JOIN outbox_messages m ON m.id = j.id AND ",
    same_shard!("m", "s")
);

// The limit (`$7`) comes before parameters the filter needs (`$8..$11`), and MariaDB takes a
// limit only as a `?` of its own: the parameters after it are the CTE `b`, which the limited
// CTE `l` names before it is defined (MariaDB reads a `WITH RECURSIVE` list in any order;
// MySQL 8 does not). The filter reads every parameter as a constant (`param!`-style scalar
// subqueries), so that the primary key's range `$10..$11` is read in order, up to the limit,
// as PostgreSQL reads it.
pub(crate) const DEAD_LETTERS: &str = concat!(
    "WITH RECURSIVE a AS (SELECT ? AS category, ? AS scope, ? AS shard_scope, \
            ? AS shard_identifier, ? AS destination, ? AS age), \
    l AS (SELECT d.message_id, d.shard_scope, d.shard_identifier, d.destination, d.category, \
            d.object_identifier, d.object_wide, d.payload, d.created_at, d.error, \
            CAST(d.attempts AS SIGNED) AS attempts, d.first_failed_at, d.dead_lettered_at, \
            d.lease_token, d.metadata \
        FROM outbox_dead_letters d \
        WHERE ((SELECT a.category FROM a) IS NULL OR d.category = (SELECT a.category FROM a)) \
            AND ((SELECT a.scope FROM a) IS NULL OR d.shard_scope = (SELECT a.scope FROM a)) \
            AND ((SELECT a.shard_scope FROM a) IS NULL \
                OR (d.shard_scope = (SELECT a.shard_scope FROM a) \
                    AND d.shard_identifier = (SELECT a.shard_identifier FROM a) \
                    AND d.destination = (SELECT a.destination FROM a))) \
            AND ((SELECT a.age FROM a) IS NULL \
                OR d.dead_lettered_at <= ",
    now!(),
    " - (SELECT a.age FROM a)) \
            AND ((SELECT b.only_ids FROM b) = 0 OR d.message_id IN ( \
                SELECT j.id FROM b JOIN ",
    json_ids!("b.ids"),
    ")) \
            AND d.message_id BETWEEN (SELECT b.low FROM b) AND (SELECT b.high FROM b) \
        ORDER BY d.message_id LIMIT ?), \
    b AS (SELECT ? AS only_ids, ? AS ids, ? AS low, ? AS high) \
    SELECT * FROM l ORDER BY message_id"
);

// Each letter by its primary key, in the list's order (MariaDB would otherwise lock the age
// index's entries first, and a concurrent purge, which deletes by the key, in the other
// order).
pub(crate) const LOCK_DEAD_LETTERS: &str = concat!(
    "SELECT d.message_id FROM (SELECT DISTINCT j.id FROM ",
    json_ids!("?"),
    ") AS k STRAIGHT_JOIN outbox_dead_letters d FORCE INDEX (PRIMARY) ON d.message_id = k.id \
     FOR UPDATE"
);

pub(crate) const REPLAY_DEAD_LETTERS: &str = concat!(
    "INSERT INTO outbox_messages (shard_scope, shard_identifier, destination, category, \
        object_identifier, object_wide, payload, metadata) \
    SELECT d.shard_scope, d.shard_identifier, d.destination, d.category, d.object_identifier, \
        d.object_wide, d.payload, d.metadata \
    FROM outbox_dead_letters d WHERE d.message_id IN (SELECT j.id FROM ",
    json_ids!("?"),
    ") ORDER BY d.message_id \
    RETURNING id"
);

// A multi-table DELETE: MariaDB 10.11 runs a single-table DELETE's `IN (subquery)` as a scan
// of the table (no semi-join before 11.1); this one reads the list, then the primary key.
pub(crate) const PURGE_DEAD_LETTERS: &str = concat!(
    "DELETE d FROM ",
    json_ids!("?"),
    " JOIN outbox_dead_letters d ON d.message_id = j.id"
);

pub(crate) const PURGE_EXPIRED_DEAD_LETTERS: &str = concat!(
    "DELETE FROM outbox_dead_letters WHERE dead_lettered_at <= ",
    now!(),
    " - ? ORDER BY dead_lettered_at LIMIT ?"
);

// `INSERT IGNORE`, not `ON DUPLICATE KEY UPDATE`: sqlx's MySQL driver sets CLIENT_FOUND_ROWS,
// under which a no-op update counts as a row affected, and the body reads "one row affected" as
// "paused now". (IGNORE also turns an error of a value into a warning: a reason longer than
// TEXT's 65,535 bytes is stored cut, where PostgreSQL stores it whole.)
pub(crate) const PAUSE: &str = concat!(
    "INSERT IGNORE INTO outbox_pauses \
        (kind, shard_scope, shard_identifier, destination, category, reason, paused_at) \
    VALUES (?, ?, ?, ?, ?, ?, ",
    now!(),
    ")"
);

pub(crate) const RESUME: &str = "\
    DELETE FROM outbox_pauses WHERE kind = ? AND shard_scope = ? AND shard_identifier = ? \
        AND destination = ? AND category = ?";

pub(crate) const PAUSES: &str = "\
    SELECT kind, shard_scope, shard_identifier, destination, category, reason, paused_at \
    FROM outbox_pauses ORDER BY paused_at, kind, shard_scope, shard_identifier, destination, \
        category";

// In id order, the first row whose shard is not backing off (with no message newer than its
// failure: its newest id at most the watermark) nor paused.
pub(crate) const OLDEST_DUE_AGE: &str = concat!(
    "SELECT ",
    now!(),
    " - m.created_at \
    FROM outbox_messages m \
    WHERE NOT EXISTS (SELECT 1 FROM outbox_shards s \
            WHERE ",
    same_shard!("s", "m"),
    " AND s.retry_at > ",
    now!(),
    " AND s.watermark >= ",
    newest_of!("m"),
    ") \
        AND NOT ",
    outbox_sqlx::paused!("m.shard_scope", "m.shard_identifier", "m.destination"),
    " ORDER BY m.id LIMIT 1"
);

// The parameters' table is `q`: `paused!` names `outbox_pauses` `p` inside.
pub(crate) const IS_PAUSED: &str = concat!(
    "SELECT ",
    outbox_sqlx::paused!("q.scope", "q.identifier", "q.destination"),
    " FROM (SELECT ? AS scope, ? AS identifier, ? AS destination) AS q"
);

/// The view over the shards of a CTE `k` defined before it (key, `pending`, `oldest`,
/// `newest`, `estimated`): their states and statuses, as CTEs `w` and `v`, each shard ranked
/// deepest first (`rn`). The window function makes MariaDB materialize `v` (it would merge a
/// plain CTE into each query that reads it, and evaluate `paused!`'s subqueries again at each
/// mention of `state`: five times a shard in the status's counts); MariaDB computes a CTE
/// again for each reference, so each statement reads `v` once.
macro_rules! shard_view {
    () => {
        concat!(
            "w AS ( \
                SELECT k.shard_scope, k.shard_identifier, k.destination, k.pending, k.oldest, \
                    k.estimated, COALESCE(s.attempts, 0) AS attempts, s.last_error, s.retry_at, \
                    s.parked_category, \
                    CASE WHEN s.lease_expires_at > ",
            now!(),
            " THEN s.lease_owner END AS lease_owner, \
                    COALESCE(s.lease_expires_at > ",
            now!(),
            ", 0) AS in_flight, \
                    COALESCE(s.retry_at > ",
            now!(),
            " AND k.newest <= s.watermark, 0) AS waiting, ",
            outbox_sqlx::paused!("k.shard_scope", "k.shard_identifier", "k.destination"),
            " AS paused \
                FROM k LEFT JOIN outbox_shards s ON ",
            same_shard!("s", "k"),
            "), \
            v AS (SELECT w.*, ",
            outbox_sqlx::shard_status!(),
            " AS state, ROW_NUMBER() OVER (ORDER BY w.pending DESC, w.shard_scope, \
                w.shard_identifier, w.destination) AS rn FROM w)"
        )
    };
}

/// A shard of the view as `Statements::shards` returns it.
macro_rules! shard_columns {
    () => {
        "shard_scope, shard_identifier, destination, pending, oldest, \
        CAST(attempts AS SIGNED) AS attempts, last_error, \
        CASE WHEN state <> 'parked' THEN retry_at END AS retry_ms, parked_category, lease_owner, \
        paused, state, estimated"
    };
}

/// The columns of `shard_columns!` read from the CTE `d` of `listed!`.
macro_rules! listed_columns {
    () => {
        "d.shard_scope, d.shard_identifier, d.destination, d.pending, d.oldest, d.attempts, \
        d.last_error, d.retry_ms, d.parked_category, d.lease_owner, d.paused, d.state, \
        d.estimated"
    };
}

/// The view's shards that `p.which` keeps (a `ShardFilter`'s name), ranked deepest first
/// (`rn`), as the CTE `d`: the statement keeps `rn <= p.lim`. (The limit is the second
/// parameter and the filter needs the third and fourth: a `LIMIT ?` could not come after them.
/// The shards ranked are few, or counted in full already.)
macro_rules! listed {
    () => {
        concat!(
            "d AS (SELECT ",
            shard_columns!(),
            ", ROW_NUMBER() OVER (ORDER BY pending DESC, shard_scope, shard_identifier, \
                destination) AS rn \
            FROM v WHERE ",
            param!("which"),
            " = 'pending' \
                OR (",
            param!("which"),
            " = 'failing' AND (attempts > 0 OR last_error IS NOT NULL)) \
                OR (",
            param!("which"),
            " = 'paused' AND paused) \
                OR (",
            param!("which"),
            " = 'parked' AND parked_category IS NOT NULL))"
        )
    };
}

/// The columns of `shard_columns!` of the row `r`, all NULL unless `r` is one of the `p.lim`
/// deepest.
macro_rules! deepest_columns {
    () => {
        "CASE WHEN r.rn <= p.lim THEN r.shard_scope END, \
        CASE WHEN r.rn <= p.lim THEN r.shard_identifier END, \
        CASE WHEN r.rn <= p.lim THEN r.destination END, \
        CASE WHEN r.rn <= p.lim THEN r.pending END, \
        CASE WHEN r.rn <= p.lim THEN r.oldest END, \
        CASE WHEN r.rn <= p.lim THEN CAST(r.attempts AS SIGNED) END, \
        CASE WHEN r.rn <= p.lim THEN r.last_error END, \
        CASE WHEN r.rn <= p.lim AND r.state <> 'parked' THEN r.retry_at END, \
        CASE WHEN r.rn <= p.lim THEN r.parked_category END, \
        CASE WHEN r.rn <= p.lim THEN r.lease_owner END, \
        CASE WHEN r.rn <= p.lim THEN r.paused END, \
        CASE WHEN r.rn <= p.lim THEN r.state END, \
        CASE WHEN r.rn <= p.lim THEN r.estimated END"
    };
}

// Every shard counted, by grouping every row (exact, as PostgreSQL's), in one pass: MariaDB
// computes a CTE once per reference, so the figures are window aggregates over the view, on
// each of its rows, and the `$1` deepest are its first rows (`rn`); one row, its shard all
// NULL, if there is none to list (`rn` 1 stands for them, or no shard at all). The oldest
// creation time is a `FIRST_VALUE` in creation order: MariaDB recomputes `MIN(...) OVER ()`
// over the whole partition at each row (49 s over 10,000 shards, against 2.7 s in all).
// (`count(*) FILTER` is not MariaDB's; a `SUM` of conditions would be NULL over no shard.)
pub(crate) const STATUS: &str = concat!(
    "WITH p AS (SELECT ? AS lim), \
    k AS (SELECT shard_scope, shard_identifier, destination, COUNT(*) AS pending, \
            MIN(created_at) AS oldest, MAX(id) AS newest, 0 AS estimated \
        FROM outbox_messages GROUP BY shard_scope, shard_identifier, destination), ",
    shard_view!(),
    ", r AS (SELECT v.*, COUNT(*) OVER () AS shards, SUM(v.pending) OVER () AS messages, \
            FIRST_VALUE(v.oldest) OVER (ORDER BY v.oldest) AS first_created, \
            COUNT(CASE WHEN v.state = 'due' THEN 1 END) OVER () AS due, \
            COUNT(CASE WHEN v.state = 'in flight' THEN 1 END) OVER () AS held, \
            COUNT(CASE WHEN v.state = 'backing off' THEN 1 END) OVER () AS backing_off, \
            COUNT(CASE WHEN v.state = 'parked' THEN 1 END) OVER () AS parked, \
            COUNT(CASE WHEN v.state = 'paused' THEN 1 END) OVER () AS held_by_pause \
        FROM v) \
    SELECT COALESCE(r.shards, 0), CAST(COALESCE(r.messages, 0) AS SIGNED), r.first_created, \
        COALESCE(r.due, 0), COALESCE(r.held, 0), COALESCE(r.backing_off, 0), \
        COALESCE(r.parked, 0), COALESCE(r.held_by_pause, 0), \
        (SELECT COUNT(*) FROM outbox_dead_letters), \
        (SELECT MIN(dead_lettered_at) FROM outbox_dead_letters), ",
    deepest_columns!(),
    " FROM p LEFT JOIN r ON r.rn <= GREATEST(p.lim, 1) \
    ORDER BY r.rn"
);

// The oldest open InnoDB transaction but this one's (its read view holds back purge, which
// removes the rows the outbox deleted), and the history list: undo records waiting for purge.
pub(crate) const HORIZON: &str = "\
    SELECT concat('connection ', t.trx_mysql_thread_id, ' (', coalesce(p.user, '?'), '@', \
            coalesce(p.host, '?'), ', ', coalesce(p.command, '?'), ')'), \
        CAST(unix_timestamp(t.trx_started) * 1000 AS SIGNED), \
        (SELECT CAST(count AS SIGNED) FROM information_schema.innodb_metrics \
            WHERE name = 'trx_rseg_history_len') \
    FROM information_schema.innodb_trx t \
        LEFT JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
    WHERE t.trx_mysql_thread_id <> connection_id() \
    ORDER BY t.trx_started LIMIT 1";

// The gauges above the exact limit: InnoDB's estimate of the rows (never below the limit), the
// first message by id, the shard states (few: shards held, failing or parked), the shard
// pauses, and the dead letters counted up to the limit, exactly below it, and above it
// InnoDB's estimate (never below the count). The limit is bound twice
// (`Dialect::LIMITS_BOUND_AGAIN`): as `p.lim`, and for the count's `LIMIT ?`, as MariaDB's
// `LIMIT` takes only a parameter of its own.
pub(crate) const GAUGES: &str = concat!(
    "WITH p AS (SELECT ? AS lim) \
    SELECT CAST(GREATEST(p.lim, ",
    table_rows!("outbox_messages"),
    ") AS SIGNED), \
        (SELECT fm.created_at FROM outbox_messages fm ORDER BY fm.id LIMIT 1), \
        COUNT(CASE WHEN s.lease_expires_at > ",
    now!(),
    " THEN 1 END), \
        COUNT(CASE WHEN NOT COALESCE(s.lease_expires_at > ",
    now!(),
    ", 0) AND s.retry_at > ",
    now!(),
    " AND s.parked_category IS NULL AND NOT COALESCE(",
    newest_of!("s"),
    " > s.watermark, 0) THEN 1 END), \
        COUNT(CASE WHEN NOT COALESCE(s.lease_expires_at > ",
    now!(),
    ", 0) AND s.retry_at > ",
    now!(),
    " AND s.parked_category IS NOT NULL THEN 1 END), \
        (SELECT COUNT(*) FROM outbox_pauses WHERE kind = 'shard'), \
        (SELECT CAST(CASE WHEN c.n < p.lim THEN c.n \
                ELSE GREATEST(c.n, ",
    table_rows!("outbox_dead_letters"),
    ") END AS SIGNED) \
            FROM (SELECT COUNT(*) AS n FROM ( \
                SELECT 1 FROM outbox_dead_letters LIMIT ?) AS x) AS c), \
        (SELECT fd.dead_lettered_at FROM outbox_dead_letters fd \
            ORDER BY fd.dead_lettered_at LIMIT 1) \
    FROM p LEFT JOIN outbox_shards s ON 1 \
    GROUP BY p.lim"
);

/// The end of a listing whose CTE `k` is being written, over messages `m`: each shard's
/// messages grouped, a shard kept only if it holds a message of `p.category` (any, if NULL),
/// then the view of those shards, ranked, its first `p.lim` (`SHARDS`, `FAILING_SHARDS`).
macro_rules! grouped_listing {
    () => {
        concat!(
            " GROUP BY m.shard_scope, m.shard_identifier, m.destination HAVING ",
            param!("category"),
            " IS NULL OR SUM(m.category = ",
            param!("category"),
            ") > 0), ",
            shard_view!(),
            ", ",
            listed!(),
            " SELECT ",
            listed_columns!(),
            " FROM d WHERE d.rn <= ",
            param!("lim"),
            " ORDER BY d.rn"
        )
    };
}

// Every shard with pending messages (of the scope `$3`, holding a message of category `$4`),
// counted by grouping: run only below the exact limit.
pub(crate) const SHARDS: &str = concat!(
    "WITH p AS (SELECT ? AS which, ? AS lim, ? AS scope, ? AS category), \
    k AS (SELECT m.shard_scope, m.shard_identifier, m.destination, COUNT(*) AS pending, \
            MIN(m.created_at) AS oldest, MAX(m.id) AS newest, 0 AS estimated \
        FROM outbox_messages m \
        WHERE ",
    param!("scope"),
    " IS NULL OR m.shard_scope = ",
    param!("scope"),
    grouped_listing!()
);

// The failing or parked shards: their messages only, found from their state rows.
pub(crate) const FAILING_SHARDS: &str = concat!(
    "WITH p AS (SELECT ? AS which, ? AS lim, ? AS scope, ? AS category), \
    k AS (SELECT m.shard_scope, m.shard_identifier, m.destination, COUNT(*) AS pending, \
            MIN(m.created_at) AS oldest, MAX(m.id) AS newest, 0 AS estimated \
        FROM outbox_shards f JOIN outbox_messages m ON ",
    same_shard!("m", "f"),
    " WHERE ((",
    param!("which"),
    " = 'failing' AND (f.attempts > 0 OR f.last_error IS NOT NULL)) \
                OR (",
    param!("which"),
    " = 'parked' AND f.parked_category IS NOT NULL)) \
            AND (",
    param!("scope"),
    " IS NULL OR f.shard_scope = ",
    param!("scope"),
    ")",
    grouped_listing!()
);

// The shards of a large backlog ranked from a sample, as PostgreSQL's: windows of `$6` ids
// every `$5`th of the id span (`g`, a recursive CTE: MariaDB stops one after 1,000 steps, its
// `max_recursive_iterations`, so at most 1,000 windows), each window read as a range of the
// primary key (a join MariaDB seeks per window, "range checked for each record"; `FORCE
// INDEX`, or MariaDB pushes `seen`'s scope condition into `hit` and reads the whole scope
// once per window instead); each sampled shard guessed at its hits times the span over the
// ids sampled.
//
// Beside the sample's deepest, the candidates are the first `$2` shards of the scope `$3` and,
// for `'paused'`, of each scope paused, and the shards paused on their own. MariaDB has no
// skip-scan by a correlated seek: the shards of the scope `$3` are read by a loose index scan
// of that scope (index dives per shard, never a read of their messages), and for `'paused'`
// those of the scopes paused by a loose index scan of the scopes from the least to the
// greatest paused, each scope's first `$2` kept. NOT MET: the cost is a few dives per shard of
// those scopes, where PostgreSQL's is `$2` dives per scope (ANALYZE, 1,000,000 messages in
// 10,501 shards: 10,501 dives, 73 ms, for a scope of 3,500 shards).
//
// Each candidate's messages are counted up to `$7` and guessed above it (never below `$7`).
// `$7` is both a value of the estimate and the count's `OFFSET`, which in MariaDB takes only a
// `?` of its own: `$8` is `$7` again (`Dialect::LIMITS_BOUND_AGAIN`).
pub(crate) const SAMPLED_SHARDS: &str = concat!(
    "WITH RECURSIVE p AS (SELECT ? AS which, ? AS lim, ? AS scope, ? AS category, \
            ? AS windows, ? AS width, ? AS cap), \
    e AS (SELECT (SELECT fm.id FROM outbox_messages fm ORDER BY fm.id LIMIT 1) AS lo, \
            (SELECT lm.id FROM outbox_messages lm ORDER BY lm.id DESC LIMIT 1) AS hi), \
    b AS (SELECT e.lo, e.hi, GREATEST(p.width, (e.hi - e.lo + 1) DIV p.windows) AS wstep \
        FROM e JOIN p WHERE e.lo IS NOT NULL), \
    g (n, wstart, wstep) AS (SELECT CAST(0 AS SIGNED), b.lo, b.wstep FROM b \
        UNION ALL \
        SELECT g.n + 1, g.wstart + g.wstep, g.wstep FROM g JOIN b JOIN p \
        WHERE g.wstart + g.wstep <= b.hi AND g.n < p.windows), \
    hit AS (SELECT m.shard_scope, m.shard_identifier, m.destination, m.category, g.wstep \
        FROM g JOIN p JOIN outbox_messages m FORCE INDEX (PRIMARY) \
            ON m.id >= g.wstart AND m.id < g.wstart + p.width), \
    seen AS (SELECT y.shard_scope, y.shard_identifier, y.destination, y.guess FROM ( \
            SELECT x.*, ROW_NUMBER() OVER (ORDER BY x.guess DESC, x.shard_scope, \
                x.shard_identifier, x.destination) AS rn \
            FROM (SELECT h.shard_scope, h.shard_identifier, h.destination, \
                    COUNT(*) * MAX(h.wstep) DIV MAX(p.width) AS guess \
                FROM hit h JOIN p WHERE p.scope IS NULL OR h.shard_scope = p.scope \
                GROUP BY h.shard_scope, h.shard_identifier, h.destination \
                HAVING MAX(p.category) IS NULL OR SUM(h.category = p.category) > 0) AS x) AS y \
        WHERE y.rn <= ",
    param!("lim"),
    "), \
    scoped AS (SELECT z.shard_scope, z.shard_identifier, z.destination FROM ( \
            SELECT x.shard_scope, x.shard_identifier, x.destination, \
                ROW_NUMBER() OVER (PARTITION BY x.shard_scope \
                    ORDER BY x.shard_identifier, x.destination) AS rn \
            FROM (SELECT DISTINCT m.shard_scope, m.shard_identifier, m.destination \
                    FROM outbox_messages m FORCE INDEX (outbox_messages_shard) \
                    WHERE ",
    param!("scope"),
    " IS NOT NULL AND m.shard_scope = ",
    param!("scope"),
    " UNION \
                SELECT DISTINCT m.shard_scope, m.shard_identifier, m.destination \
                    FROM outbox_messages m FORCE INDEX (outbox_messages_shard) \
                    WHERE ",
    param!("which"),
    " = 'paused' AND m.shard_scope BETWEEN \
                        (SELECT MIN(o.shard_scope) FROM outbox_pauses o WHERE o.kind = 'scope') \
                        AND (SELECT MAX(o.shard_scope) FROM outbox_pauses o \
                            WHERE o.kind = 'scope')) AS x) AS z \
        WHERE z.rn <= ",
    param!("lim"),
    " AND (z.shard_scope = ",
    param!("scope"),
    " OR z.shard_scope IN (SELECT o.shard_scope FROM outbox_pauses o \
                WHERE o.kind = 'scope' AND ",
    param!("which"),
    " = 'paused'))), \
    c AS (SELECT u.shard_scope, u.shard_identifier, u.destination, MAX(u.guess) AS guess FROM ( \
            SELECT shard_scope, shard_identifier, destination, guess FROM seen \
            UNION ALL SELECT shard_scope, shard_identifier, destination, 0 FROM scoped \
            UNION ALL SELECT o.shard_scope, o.shard_identifier, o.destination, 0 \
                FROM outbox_pauses o JOIN p \
                WHERE p.which = 'paused' AND o.kind = 'shard' \
                    AND (p.scope IS NULL OR o.shard_scope = p.scope)) AS u \
        GROUP BY u.shard_scope, u.shard_identifier, u.destination), \
    n AS (SELECT c.shard_scope, c.shard_identifier, c.destination, c.guess, \
            (SELECT m.id FROM outbox_messages m FORCE INDEX (outbox_messages_shard) WHERE ",
    same_shard!("m", "c"),
    " ORDER BY m.id LIMIT 1 OFFSET ?) AS beyond, \
            (SELECT m.created_at FROM outbox_messages m FORCE INDEX (outbox_messages_shard) \
                WHERE ",
    same_shard!("m", "c"),
    " ORDER BY m.id LIMIT 1) AS oldest, ",
    newest_of!("c"),
    " AS newest \
        FROM c), \
    k AS (SELECT q.shard_scope, q.shard_identifier, q.destination, \
            CAST(CASE WHEN q.counted < q.cap THEN q.counted \
                WHEN q.counted IS NOT NULL THEN GREATEST(q.cap, q.guess) \
                ELSE GREATEST(q.cap, q.guess) END AS SIGNED) AS pending, \
            q.oldest, q.newest, COALESCE(q.counted >= q.cap, 1) AS estimated \
        FROM (SELECT n.*, p.cap, \
                CASE WHEN n.beyond IS NULL THEN (SELECT COUNT(*) FROM outbox_messages m \
                    WHERE ",
    same_shard!("m", "n"),
    ") END AS counted \
            FROM n JOIN p) AS q \
        WHERE q.oldest IS NOT NULL AND (",
    param!("category"),
    " IS NULL OR EXISTS (SELECT 1 FROM outbox_messages m WHERE ",
    same_shard!("m", "q"),
    " AND m.category = ",
    param!("category"),
    "))), ",
    shard_view!(),
    ", ",
    listed!(),
    " SELECT t.sampled, ",
    listed_columns!(),
    " FROM (SELECT COUNT(*) AS sampled FROM hit) AS t \
    LEFT JOIN d ON d.rn <= ",
    param!("lim"),
    " ORDER BY d.rn"
);

// One shard, `$1..$3`: its messages counted up to `$4` (its first `$4` by id, `c`), and above
// it estimated from the density of ids of those (their span, to the next one, `beyond`) over
// the span of all of its ids. `$4` is read once, as the limit of `c`; `beyond` is found by
// reading on from the start of the shard's index (MariaDB does not seek a correlated range),
// at most `$4` + 1 entries.
pub(crate) const SHARD: &str = concat!(
    "WITH p AS (SELECT ? AS scope, ? AS identifier, ? AS destination), \
    h AS (SELECT m.shard_scope, m.shard_identifier, m.destination, m.id, m.created_at \
        FROM outbox_messages m \
        WHERE m.shard_scope = ",
    param!("scope"),
    " AND m.shard_identifier = ",
    param!("identifier"),
    " AND m.destination = ",
    param!("destination"),
    " ORDER BY m.id LIMIT 1), \
    c AS (SELECT COUNT(*) AS counted, MAX(x.id) AS last_id FROM ( \
            SELECT m.id FROM outbox_messages m \
            WHERE m.shard_scope = ",
    param!("scope"),
    " AND m.shard_identifier = ",
    param!("identifier"),
    " AND m.destination = ",
    param!("destination"),
    " ORDER BY m.id LIMIT ?) AS x), \
    n AS (SELECT h.*, c.counted, \
            (SELECT m.id FROM outbox_messages m FORCE INDEX (outbox_messages_shard) WHERE ",
    same_shard!("m", "h"),
    " AND m.id > c.last_id ORDER BY m.id LIMIT 1) AS beyond, ",
    newest_of!("h"),
    " AS newest \
        FROM h JOIN c), \
    k AS (SELECT shard_scope, shard_identifier, destination, \
            CAST(CASE WHEN beyond IS NULL THEN counted \
                ELSE GREATEST(counted + 1, counted * (newest - id + 1) DIV (beyond - id)) END \
                AS SIGNED) AS pending, \
            created_at AS oldest, newest, beyond IS NOT NULL AS estimated FROM n), ",
    shard_view!(),
    " SELECT ",
    shard_columns!(),
    " FROM v"
);

pub(crate) const SHARD_MESSAGES: &str = "\
    SELECT id, shard_scope, shard_identifier, destination, category, object_identifier, \
        object_wide, payload, created_at, metadata \
    FROM outbox_messages \
    WHERE shard_scope = ? AND shard_identifier = ? AND destination = ? \
    ORDER BY id LIMIT ?";

// In paused shards, the rows of the categories `$1` that are neither the oldest nor the newest
// of their group, at most `$2`: `outbox_sqlx::compact_paused!`'s statement, which MariaDB does
// not take as it stands (no `LIMIT` in an `IN` subquery; a single-table DELETE's `IN` is a scan
// of the table). The rows to delete are a derived table joined to the table (MariaDB deletes
// from a table that its own derived tables read); a group's oldest and newest are its first
// and last entry of the group index (the two `EXISTS` of PostgreSQL's, which MariaDB would
// answer by reading the group up to the row). The paused shards' and scopes' rows come
// through the shard index from the (few) pauses; those of category pauses by a scan, which
// runs only while one is in force.
pub(crate) const COMPACT_PAUSED: &str = concat!(
    "DELETE o FROM outbox_messages o JOIN ( \
        SELECT x.id FROM ( \
            SELECT x.id, x.shard_scope, x.shard_identifier, x.destination, x.category, \
                x.object_identifier, x.object_wide \
            FROM outbox_pauses p JOIN outbox_messages x ON ",
    same_shard!("x", "p"),
    " WHERE p.kind = 'shard' \
            UNION ALL \
            SELECT x.id, x.shard_scope, x.shard_identifier, x.destination, x.category, \
                x.object_identifier, x.object_wide \
            FROM outbox_pauses p JOIN outbox_messages x ON x.shard_scope = p.shard_scope \
            WHERE p.kind = 'scope' \
            UNION ALL \
            SELECT x.id, x.shard_scope, x.shard_identifier, x.destination, x.category, \
                x.object_identifier, x.object_wide \
            FROM outbox_messages x \
            WHERE EXISTS (SELECT 1 FROM outbox_pauses WHERE kind = 'category') \
                AND EXISTS (SELECT 1 FROM outbox_pauses p WHERE p.kind = 'category' \
                    AND EXISTS (SELECT 1 FROM outbox_messages pm WHERE ",
    same_shard!("pm", "x"),
    " AND pm.category = p.category)) \
        ) AS x \
        WHERE x.category IN (SELECT j.id FROM ",
    json_ids!("?"),
    ") \
            AND x.id > (SELECT g.id FROM outbox_messages g WHERE ",
    same_shard!("g", "x"),
    " AND g.category = x.category AND g.object_identifier = x.object_identifier \
                AND g.object_wide = x.object_wide ORDER BY g.id LIMIT 1) \
            AND x.id < (SELECT g.id FROM outbox_messages g WHERE ",
    same_shard!("g", "x"),
    " AND g.category = x.category AND g.object_identifier = x.object_identifier \
                AND g.object_wide = x.object_wide ORDER BY g.id DESC LIMIT 1) \
        LIMIT ?) AS doomed ON o.id = doomed.id"
);

/// A watermark's columns (see `BackfillStatements`), its times in milliseconds.
macro_rules! watermark {
    () => {
        "category, model, declared_version, target_version, walking_version, done_version, \
         low_bound, rows_walked, destinations, worker, started_at, updated_at, completed_at, \
         last_error"
    };
}

pub(crate) const BACKFILL: BackfillStatements = BackfillStatements {
    ensure: "INSERT IGNORE INTO outbox_backfills (category, model) VALUES (?, ?)",
    lock: concat!(
        "SELECT ",
        watermark!(),
        " FROM outbox_backfills WHERE category = ? FOR UPDATE SKIP LOCKED"
    ),
    // Never waits on a relay walking a batch (it holds the row): the derived table takes the
    // row with SKIP LOCKED, and the update changes nothing if it was skipped.
    declare: concat!(
        "UPDATE outbox_backfills b JOIN ( \
            SELECT x.category, p.model, p.declared FROM \
                (SELECT ? AS category, ? AS model, ? AS declared) AS p \
                JOIN outbox_backfills x ON x.category = p.category \
            FOR UPDATE SKIP LOCKED) AS d ON d.category = b.category \
        SET b.model = d.model, b.declared_version = d.declared, b.updated_at = ",
        now!()
    ),
    // From the newest row down: once the bound is reached, none of the rows acknowledged
    // before is read.
    backlog: "SELECT COUNT(*) FROM (SELECT 1 FROM outbox_messages ORDER BY id DESC LIMIT ?) AS b",
    // MariaDB has no UPDATE ... RETURNING: the watermark is "inserted" from its own row (so
    // nothing is inserted, and no row comes back, if it is gone), every column computed from
    // the row the batch's transaction holds, and the duplicate key makes it an update; MariaDB
    // returns the row as updated. (`INSERT ... SELECT` from the target table: MariaDB reads
    // the SELECT into a temporary table first.)
    record: concat!(
        "INSERT INTO outbox_backfills (category, model, declared_version, target_version, \
            walking_version, done_version, low_bound, rows_walked, destinations, worker, \
            started_at, updated_at, completed_at, last_error) \
        SELECT w.category, p.model, p.declared, w.target_version, p.walking, p.done, \
            p.low_bound, p.rows_walked, w.destinations, p.worker, \
            CASE WHEN p.started = 1 THEN ",
        now!(),
        " ELSE w.started_at END, ",
        now!(),
        ", CASE WHEN p.completed = 1 THEN ",
        now!(),
        " ELSE w.completed_at END, NULL \
        FROM (SELECT ? AS category, ? AS model, ? AS declared, ? AS walking, ? AS done, \
                ? AS low_bound, ? AS rows_walked, ? AS worker, ? AS started, ? AS completed) AS p \
            JOIN outbox_backfills w ON w.category = p.category \
        ON DUPLICATE KEY UPDATE model = VALUES(model), \
            declared_version = VALUES(declared_version), \
            walking_version = VALUES(walking_version), done_version = VALUES(done_version), \
            low_bound = VALUES(low_bound), rows_walked = VALUES(rows_walked), \
            worker = VALUES(worker), started_at = VALUES(started_at), \
            updated_at = VALUES(updated_at), completed_at = VALUES(completed_at), \
            last_error = NULL \
        RETURNING ",
        watermark!()
    ),
    fail: concat!(
        "UPDATE outbox_backfills b JOIN (SELECT ? AS category, ? AS error) AS p \
            ON b.category = p.category \
        SET b.last_error = p.error, b.updated_at = ",
        now!()
    ),
    list: concat!(
        "SELECT ",
        watermark!(),
        " FROM outbox_backfills ORDER BY category"
    ),
    // Inserted, or updated on the duplicate key; MariaDB returns the row as it is then.
    start: concat!(
        "INSERT INTO outbox_backfills (category, model, target_version, destinations) \
         VALUES (?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE target_version = VALUES(target_version), \
             destinations = VALUES(destinations), updated_at = ",
        now!(),
        ", model = CASE WHEN model = '' THEN VALUES(model) ELSE model END \
         RETURNING ",
        watermark!()
    ),
    pause: concat!(
        "UPDATE outbox_backfills SET target_version = done_version, updated_at = ",
        now!(),
        " WHERE category = ? AND target_version > done_version"
    ),
};

/// The inbox's statements.
pub(crate) const INBOX: InboxStatements = InboxStatements {
    // A duplicate key waits for the transaction that holds the key, then is ignored (0 rows).
    // `INSERT IGNORE`, not `ON DUPLICATE KEY UPDATE`: under CLIENT_FOUND_ROWS (sqlx) the
    // latter reports one row for a duplicate. (IGNORE also stores a consumer name longer than
    // 255 characters cut, with a warning, where PostgreSQL's TEXT takes it whole.)
    record: "INSERT IGNORE INTO outbox_inbox (consumer, message_id) VALUES (?, ?)",
    purge: concat!(
        "DELETE FROM outbox_inbox WHERE consumer = ? AND received_at < ",
        now!(),
        " - ?"
    ),
    purge_all: concat!(
        "DELETE FROM outbox_inbox WHERE received_at < ",
        now!(),
        " - ?"
    ),
    dead_letter: "INSERT INTO outbox_inbox_dead_letters \
                      (consumer, message_id, category, headers, payload, error, attempts) \
                  VALUES (?, ?, ?, ?, ?, ?, ?)",
    dead_letters: concat!(
        "WITH p AS (SELECT ? AS consumer) \
         SELECT id, consumer, message_id, category, headers, payload, error, \
             CAST(attempts AS SIGNED), failed_at \
         FROM outbox_inbox_dead_letters \
         WHERE ",
        param!("consumer"),
        " IS NULL OR consumer = ",
        param!("consumer"),
        " ORDER BY id LIMIT ?"
    ),
};

/// The relays' heartbeats.
pub(crate) const RELAYS: RelayStatements = RelayStatements {
    beat: concat!(
        "INSERT INTO outbox_relays (worker, started_at, seen_at, expires_at, in_flight, \
             waiting, open_breakers) \
         VALUES (?, ?, ",
        now!(),
        ", ",
        now!(),
        " + ?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE started_at = VALUES(started_at), seen_at = VALUES(seen_at), \
             expires_at = VALUES(expires_at), in_flight = VALUES(in_flight), \
             waiting = VALUES(waiting), open_breakers = VALUES(open_breakers)"
    ),
    forget: concat!(
        "DELETE FROM outbox_relays WHERE expires_at < ",
        now!(),
        " - ?"
    ),
    leave: "DELETE FROM outbox_relays WHERE worker = ?",
    list: concat!(
        "SELECT worker, started_at, seen_at, expires_at - seen_at, in_flight, waiting, \
             open_breakers, expires_at > ",
        now!(),
        " FROM outbox_relays WHERE expires_at >= ",
        now!(),
        " - ? ORDER BY worker"
    ),
};

pub(crate) const SET_ASIDE: SetAsideStatements = SetAsideStatements {
    lock_message: "SELECT shard_scope, shard_identifier, destination FROM outbox_messages \
                   WHERE id = ? FOR UPDATE",
    ensure_shard: "INSERT IGNORE INTO outbox_shards (shard_scope, shard_identifier, destination) \
                   VALUES (?, ?, ?)",
    lock_shard: concat!(
        "SELECT CASE WHEN lease_expires_at > ",
        now!(),
        " THEN COALESCE(lease_owner, '') END FROM outbox_shards \
         WHERE shard_scope = ? AND shard_identifier = ? AND destination = ? \
         FOR UPDATE SKIP LOCKED"
    ),
    copy: concat!(
        "INSERT INTO outbox_dead_letters (message_id, shard_scope, shard_identifier, \
             destination, category, object_identifier, object_wide, payload, created_at, \
             error, attempts, first_failed_at, dead_lettered_at, lease_token, metadata) \
         SELECT m.id, m.shard_scope, m.shard_identifier, m.destination, m.category, \
             m.object_identifier, m.object_wide, m.payload, m.created_at, p.error, s.attempts, \
             COALESCE(s.first_failed_at, ",
        now!(),
        "), ",
        now!(),
        ", COALESCE(s.lease_token, 0), m.metadata \
         FROM (SELECT ? AS scope, ? AS identifier, ? AS destination, ? AS id, ? AS error) AS p \
             JOIN outbox_shards s ON s.shard_scope = p.scope \
                 AND s.shard_identifier = p.identifier AND s.destination = p.destination \
             JOIN outbox_messages m ON m.id = p.id"
    ),
    // The shard's parameters match its row, and the row stands for them in the subquery:
    // "no older message" is "its first message is not older" (one index entry; a correlated
    // `m.id < $4` would read the shard from its start).
    clear_failures: concat!(
        "UPDATE outbox_shards s SET s.attempts = 0, s.first_failed_at = NULL, \
             s.last_error = NULL, s.retry_at = NULL, s.parked_category = NULL \
         WHERE s.shard_scope = ? AND s.shard_identifier = ? AND s.destination = ? \
             AND COALESCE((SELECT m.id \
                FROM outbox_messages m FORCE INDEX (outbox_messages_shard) WHERE ",
        same_shard!("m", "s"),
        " ORDER BY m.id LIMIT 1) >= ?, 1)"
    ),
    delete: "DELETE FROM outbox_messages WHERE id = ?",
};
