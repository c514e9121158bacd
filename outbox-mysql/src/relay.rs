//! The relay's statements on MariaDB: writes, a claimed shard's reads, acknowledgements and
//! releases, discovery.
//!
//! MariaDB takes positional `?` parameters only, and the shared body binds each statement's
//! parameters once, in the order `outbox_sqlx::Statements` numbers them. A statement that needs
//! a parameter twice, or out of order, takes them all at its start in a one-row derived table
//! `p` (`(SELECT ? AS scope, ? AS identifier, …) AS p`), which MariaDB reads as constants.

pub(crate) const INSERT_MESSAGE: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, destination, category, object_identifier, object_wide, \
         payload, metadata) \
    VALUES (?, ?, ?, ?, ?, ?, ?, ?) \
    RETURNING id";

// One statement for any number of messages: the rows travel as one JSON array, each
// `[scope, identifier, destination, category, object, object's wide bytes in hex, payload
// text, metadata text or null]`, inserted in their order (so their ids ascend in it).
pub(crate) const INSERT_MESSAGES: &str = "\
    INSERT INTO outbox_messages \
        (shard_scope, shard_identifier, destination, category, object_identifier, object_wide, \
         payload, metadata) \
    SELECT j.scope, j.identifier, j.destination, j.category, j.object, UNHEX(j.wide), \
        j.payload, j.metadata \
    FROM JSON_TABLE(?, '$[*]' COLUMNS ( \
        n FOR ORDINALITY, \
        scope SMALLINT PATH '$[0]', \
        identifier BIGINT PATH '$[1]', \
        destination VARCHAR(255) CHARACTER SET utf8mb4 PATH '$[2]', \
        category INT PATH '$[3]', \
        object BIGINT PATH '$[4]', \
        wide VARCHAR(32) CHARACTER SET ascii PATH '$[5]', \
        payload LONGTEXT CHARACTER SET utf8mb4 PATH '$[6]', \
        metadata LONGTEXT CHARACTER SET utf8mb4 PATH '$[7]' NULL ON EMPTY)) AS j \
    ORDER BY j.n \
    RETURNING id";

/// The columns of messages `$m` as `outbox_sqlx::session::stored` reads a row: id, category,
/// scope, object (two columns), payload, created (microseconds), metadata.
macro_rules! stored_columns {
    ($m:literal) => {
        concat!(
            $m,
            ".id, ",
            $m,
            ".category, ",
            $m,
            ".shard_scope, ",
            $m,
            ".object_identifier, ",
            $m,
            ".object_wide, ",
            $m,
            ".payload, ",
            $m,
            ".created_at * 1000, ",
            $m,
            ".metadata"
        )
    };
}

pub(crate) const FETCH: &str = concat!(
    "SELECT ",
    stored_columns!("m"),
    " FROM outbox_messages m \
    WHERE m.shard_scope = ? AND m.shard_identifier = ? AND m.destination = ? \
    ORDER BY m.id LIMIT ?"
);

// Each group's rows in `after < id <= up_to`: their ids, and the newest one whole. The groups
// travel as one JSON array of `[category, object, object's wide bytes in hex]`.
pub(crate) const FETCH_NEWEST: &str = concat!(
    "SELECT ",
    stored_columns!("m"),
    ", t.ids \
    FROM ( \
        SELECT JSON_ARRAYAGG(x.id) AS ids, MAX(x.id) AS newest \
        FROM (SELECT ? AS scope, ? AS identifier, ? AS destination, ? AS `groups`, \
                ? AS after_id, ? AS up_to) AS p \
            JOIN JSON_TABLE(p.`groups`, '$[*]' COLUMNS ( \
                n FOR ORDINALITY, \
                category INT PATH '$[0]', \
                object BIGINT PATH '$[1]', \
                wide VARCHAR(32) CHARACTER SET ascii PATH '$[2]')) AS g \
            JOIN outbox_messages x \
                ON x.shard_scope = p.scope AND x.shard_identifier = p.identifier \
                AND x.destination = p.destination AND x.category = g.category \
                AND x.object_identifier = g.object AND x.object_wide = UNHEX(g.wide) \
                AND x.id > p.after_id AND x.id <= p.up_to \
        GROUP BY g.n) AS t \
    JOIN outbox_messages m ON m.id = t.newest"
);

// An acknowledgement proves and extends the lease, and the head it moved past takes its
// attempts with it.
pub(crate) const ACK_LEASE: &str = concat!(
    "UPDATE outbox_shards s JOIN ",
    fenced_params!("ms"),
    " ON ",
    held_by_p!("s"),
    " SET s.lease_expires_at = ",
    now!(),
    " + p.ms, s.attempts = 0, s.first_failed_at = NULL"
);

// Exactly the rows the relay read and delivered go, by id (one seek of the primary key each,
// in the list's order: joined the other way, MariaDB would read every row of the shard): a
// range of ids could hold a row that committed after the read.
pub(crate) const ACK: &str = "\
    DELETE m FROM (SELECT ? AS scope, ? AS identifier, ? AS destination, ? AS ids) AS p \
        STRAIGHT_JOIN JSON_TABLE(p.ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS j \
        STRAIGHT_JOIN outbox_messages m ON m.id = j.id \
    WHERE m.shard_scope = p.scope AND m.shard_identifier = p.identifier \
        AND m.destination = p.destination";

pub(crate) const EXTEND_LEASE: &str = concat!(
    "UPDATE outbox_shards s JOIN ",
    fenced_params!("ms"),
    " ON ",
    held_by_p!("s"),
    " SET s.lease_expires_at = ",
    now!(),
    " + p.ms"
);

// Whether the shard has no message: a plain read, which takes no lock (see
// `Dialect::SHARD_IS_EMPTY`).
pub(crate) const SHARD_IS_EMPTY: &str = "\
    SELECT NOT EXISTS (SELECT 1 FROM outbox_messages \
        WHERE shard_scope = ? AND shard_identifier = ? AND destination = ?)";

// Run only once `SHARD_IS_EMPTY` found the shard empty: InnoDB would lock the rows a subquery
// of a `DELETE` reads, the first of them often another shard's.
pub(crate) const DELETE_IF_EMPTY: &str = "\
    DELETE FROM outbox_shards \
    WHERE shard_scope = ? AND shard_identifier = ? AND destination = ? AND lease_token = ?";

pub(crate) const RELEASE: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL, attempts = 0, \
        first_failed_at = NULL, last_error = NULL, retry_at = NULL, parked_category = NULL \
    WHERE shard_scope = ? AND shard_identifier = ? AND destination = ? AND lease_token = ?";

pub(crate) const RELEASE_LEASE: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_expires_at = NULL \
    WHERE shard_scope = ? AND shard_identifier = ? AND destination = ? AND lease_token = ?";

// A first failure (attempt 1, or none recorded) starts the failures' clock. A park (S26)
// waits for no time and no message: its retry time is the end of year 9999 (ms) and its
// watermark the highest id, until a relay that knows the category unparks it. (MariaDB
// assigns a multi-table UPDATE's columns in no set order: no assignment reads a column
// another one sets.)
pub(crate) const FAIL: &str = concat!(
    "UPDATE outbox_shards s JOIN ",
    fenced_params!("attempts", "error", "retry_ms", "watermark", "parked"),
    " ON ",
    held_by_p!("s"),
    " SET s.lease_owner = NULL, s.lease_expires_at = NULL, s.attempts = p.attempts, \
        s.first_failed_at = CASE WHEN p.attempts <= 1 OR s.first_failed_at IS NULL THEN ",
    now!(),
    " ELSE s.first_failed_at END, \
        s.last_error = p.error, \
        s.retry_at = CASE WHEN p.parked IS NULL THEN ",
    now!(),
    " + p.retry_ms ELSE 253402300799000 END, \
        s.watermark = CASE WHEN p.parked IS NULL THEN p.watermark \
            ELSE 9223372036854775807 END, \
        s.parked_category = p.parked"
);

// A lease given up after an interrupted drain: it lapses now, so the shard is due at once and
// its next claim counts as a takeover.
pub(crate) const RELEASE_INTERRUPTED: &str = concat!(
    "UPDATE outbox_shards SET lease_expires_at = ",
    now!(),
    " WHERE shard_scope = ? AND shard_identifier = ? AND destination = ? AND lease_token = ?"
);

pub(crate) const TABLE_EXISTS: &str = "\
    SELECT EXISTS (SELECT 1 FROM information_schema.TABLES \
        WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?)";

pub(crate) const UNPARK: &str = concat!(
    "UPDATE outbox_shards SET parked_category = NULL, retry_at = ",
    now!(),
    " WHERE parked_category IN (SELECT c FROM JSON_TABLE(?, '$[*]' COLUMNS (c INT PATH '$')) \
        AS j) AND retry_at > ",
    now!()
);

pub(crate) const RESCHEDULE: &str = concat!(
    "UPDATE outbox_shards SET retry_at = ",
    now!(),
    " WHERE shard_scope = ? AND shard_identifier = ? AND destination = ? AND retry_at > ",
    now!()
);

pub(crate) const PENDING_IN_SHARD: &str = "\
    SELECT COUNT(*) FROM outbox_messages \
    WHERE shard_scope = ? AND shard_identifier = ? AND destination = ? AND id <= ?";

/// Whether the shard of state row `s` is due: no live lease on it, and not backing off or
/// with a message newer than its failure (its newest id past the watermark: one index entry).
/// `s` may be the NULL side of an outer join: a shard with no state row is due.
macro_rules! due {
    ($s:literal) => {
        concat!(
            "(",
            $s,
            ".shard_scope IS NULL OR ((",
            $s,
            ".lease_expires_at IS NULL OR ",
            $s,
            ".lease_expires_at <= ",
            now!(),
            ") AND (",
            $s,
            ".retry_at IS NULL OR ",
            $s,
            ".retry_at <= ",
            now!(),
            " OR ",
            newest_of!($s),
            " > ",
            $s,
            ".watermark)))"
        )
    };
}

// Discovery: the first `$6` shards after the cursor, each with whether it is due. The cursor
// is bound as the comparison needs it, each value where it is read (`MySqlDialect::discover`):
// `$1` its scope, `$2` the scope again, `$3` its shard identifier, `$4` the identifier again,
// `$5` its destination. Bound values are constants to the optimizer, so the cursor is a range
// of the shard index, and MariaDB reads the shards after it by a loose index scan (one
// descent per shard) where shards hold many rows, or reads their few rows in order where they
// hold few. (A skip-scan by a recursive CTE does not serve: its step, a correlated subquery,
// cannot seek a range, and read the index from the start of the scope at every shard.)
//
// MariaDB chooses between the two by the table's average of rows per shard, not the page's:
// busy shards among many sparse ones (200 of 500 rows beside 20,000 of one: 6 on average)
// are read row by row. NOT MET there, the trait's "never every row": a sweep then reads the
// table once (120,080 index entries for its 20,200 shards, in 40 pages; the page across the
// busy shards 100,313 entries and 14 ms, a sparse page 0.4 ms), about twice the time of a
// descent per shard. The cost stays within the average times the shards: where the average
// is high, MariaDB scans loosely. `FORCE INDEX` (for `GROUP BY` too) does not change the
// choice.
pub(crate) const DISCOVER: &str = concat!(
    "SELECT k.shard_scope, k.shard_identifier, k.destination, ",
    due!("s"),
    " AND NOT ",
    outbox_sqlx::paused!("k.shard_scope", "k.shard_identifier", "k.destination"),
    " AS due \
    FROM (SELECT m.shard_scope, m.shard_identifier, m.destination \
        FROM outbox_messages m \
        WHERE m.shard_scope > ? OR (m.shard_scope = ? AND (m.shard_identifier > ? \
            OR (m.shard_identifier = ? AND m.destination > ?))) \
        GROUP BY m.shard_scope, m.shard_identifier, m.destination \
        ORDER BY m.shard_scope, m.shard_identifier, m.destination LIMIT ?) AS k \
    LEFT JOIN outbox_shards s ON ",
    same_shard!("s", "k"),
    " ORDER BY k.shard_scope, k.shard_identifier, k.destination"
);

/// A list parameter of shard keys (a JSON array of `[scope, identifier, destination]`, extra
/// columns after them as given) as a table `k` whose key columns are named as the tables
/// name them (`same_shard!` compares them), with each key's place `n` (from 1).
macro_rules! json_shards {
    ($($extra:literal),*) => {
        concat!(
            "JSON_TABLE(?, '$[*]' COLUMNS (n FOR ORDINALITY, shard_scope SMALLINT PATH '$[0]', \
             shard_identifier BIGINT PATH '$[1]', \
             destination VARCHAR(255) CHARACTER SET utf8mb4 PATH '$[2]'"
            $(, ", ", $extra)*,
            ")) AS k"
        )
    };
}

// The heads of claimed shards (`read_heads`): of each shard of `$1` (a JSON array of keys)
// with at most `$2` rows, its rows as `FETCH` reads them, then its key's place `n` (column
// `HEADS_PLACE`), or one row of NULLs and its place if it has none; no row for a shard with
// more. The keys drive the join: a shard's rows are one read of the shard index, and a busy
// shard is left after `$2 + 1` of its index entries, never read whole. (One read per shard
// in a `UNION ALL` says the same, at several times the cost: MariaDB plans and runs each
// branch as a query of its own.)
pub(crate) const HEADS: &str = concat!(
    "SELECT ",
    stored_columns!("m"),
    ", k.n FROM ",
    json_shards!(),
    " LEFT JOIN outbox_messages m FORCE INDEX (outbox_messages_shard) ON ",
    same_shard!("m", "k"),
    " WHERE (SELECT x.id FROM outbox_messages x WHERE ",
    same_shard!("x", "k"),
    " ORDER BY x.id LIMIT 1 OFFSET ?) IS NULL"
);

/// The column of `HEADS` that holds the key's place.
pub(crate) const HEADS_PLACE: usize = 8;

// A claim of shards with a state row, first step: the state rows of the shards of `$1` (a JSON
// array of keys), each locked unless another transaction holds it (then no row: a claim never
// waits), each row led by its key's place `n`: its lease's owner, whether that lease lapsed
// without a release, whether the shard is due and free, a fencing token, and its attempts. A
// shard with no state row has no row either. The keys drive the join: each state row is one
// primary-key lookup (as in `TAKE_LEASES`).
pub(crate) const LOCK_STATES: &str = concat!(
    "SELECT k.n, s.lease_owner, s.lease_owner IS NOT NULL AND s.lease_expires_at <= ",
    now!(),
    " AS lapsed, ",
    due!("s"),
    " AND NOT ",
    outbox_sqlx::paused!("s.shard_scope", "s.shard_identifier", "s.destination"),
    " AS due, NEXTVAL(outbox_lease_tokens) AS token, s.attempts \
    FROM ",
    json_shards!(),
    " STRAIGHT_JOIN outbox_shards s FORCE INDEX (PRIMARY) ON ",
    same_shard!("s", "k"),
    " FOR UPDATE SKIP LOCKED"
);

// A claim, the leases of the state rows `LOCK_STATES` locked and found due: `$1` a JSON array
// of `[scope, identifier, destination, token, 1 if a lapsed lease is taken over (an attempt
// more at the head)]`, `$2` the worker, `$3` the lease in milliseconds.
// The keys drive the join, each state row one primary-key lookup (`STRAIGHT_JOIN`, `FORCE
// INDEX`): on a small table MariaDB would rather scan the state rows, and wait on the lock of
// every row it reads, another claim's too.
pub(crate) const TAKE_LEASES: &str = concat!(
    "UPDATE ",
    json_shards!("token BIGINT PATH '$[3]'", "lapsed INT PATH '$[4]'"),
    " STRAIGHT_JOIN outbox_shards s FORCE INDEX (PRIMARY) ON ",
    same_shard!("s", "k"),
    " SET s.lease_owner = ?, s.lease_token = k.token, s.lease_expires_at = ",
    now!(),
    " + ?, s.attempts = s.attempts + k.lapsed"
);

// A claim, first step: the state rows of the shards of `$1` (a JSON array of keys) that have
// none, with their leases (`$2` the worker, `$3` the lease in milliseconds), but of no shard a
// pause holds. Run with no wait for locks: at `READ COMMITTED`, an `INSERT … SELECT` reads
// `outbox_shards` without locking it, so a committed row is left out, and a row another
// transaction is creating makes the statement fail at once (a duplicate key or a lock wait),
// changing nothing; the claim then takes the shards one by one, and that shard is another
// worker's. (The parameters are `q`: `paused!` names the pauses `p`.)
pub(crate) const CREATE_LEASES: &str = concat!(
    "SET STATEMENT innodb_lock_wait_timeout = 0 FOR \
    INSERT INTO outbox_shards \
        (shard_scope, shard_identifier, destination, lease_owner, lease_token, lease_expires_at) \
    SELECT k.shard_scope, k.shard_identifier, k.destination, q.worker, \
        NEXTVAL(outbox_lease_tokens), ",
    now!(),
    " + q.ms \
    FROM ",
    json_shards!(),
    " JOIN (SELECT ? AS worker, ? AS ms) AS q \
    WHERE NOT EXISTS (SELECT 1 FROM outbox_shards s WHERE ",
    same_shard!("s", "k"),
    ") AND NOT ",
    outbox_sqlx::paused!("k.shard_scope", "k.shard_identifier", "k.destination"),
    " ORDER BY k.n \
    RETURNING shard_scope, shard_identifier, destination, lease_token, attempts"
);

// A finish of many drained shards, first step: the state rows of those whose lease the token
// still holds, deleted, and their tokens returned (`DRAINED_KEY` once per shard, joined by
// commas, between the two halves). A drained shard keeps no state row: a released row and no
// row say the same (due, no attempts, no error), also when a message came after the relay's
// last read.
//
// The keys are a list of row constructors, not a `JSON_TABLE`: MariaDB reads such a list as
// one range of the primary key per key, in the index's order, so that two relays' finishes
// lock their rows in one order and never wait on each other in a cycle. (A single-table
// `DELETE` takes no join, and its `IN (SELECT … FROM JSON_TABLE(…))` is not a semi-join on
// 10.11: it read every state row once per key, 71 s for 500 keys among 100,000 rows.)
pub(crate) const DELETE_DRAINED: [&str; 2] = [
    "DELETE FROM outbox_shards \
    WHERE (shard_scope, shard_identifier, destination, lease_token) IN (",
    ") RETURNING lease_token",
];

/// One shard's key and token in [`DELETE_DRAINED`]'s list.
pub(crate) const DRAINED_KEY: &str = "(?, ?, ?, ?)";
