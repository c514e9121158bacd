//! The lease log: shards' leases as rows inserted and deleted, never updated in place.
//!
//! While something holds the vacuum horizon (a long transaction, `pg_dump`, a replica's
//! feedback), every version of a row stays. When each drain inserts and deletes a shard's
//! state row, every later lookup of that shard's key walks one dead version per earlier drain:
//! claims that took a millisecond take seconds, then minutes. Here a shard's lease is the
//! newest row of its key in `outbox_leases`, found by a backward seek of the primary key: the
//! seek reads the newest entry first and never visits the older, deleted ones.
//!
//! - *A change of hands* (a claim, a release, a failure) locks the newest row, deletes it and
//!   inserts the next, with a greater `seq`. Two workers that read the same newest row both
//!   lock it: the second finds it gone (or, for a chain's first row, marked superseded) and
//!   changes nothing. That is the fence.
//! - *An extension* updates the holder's row in place: a release that waits on it then finds
//!   the row still its own. A lease is extended a few times in its life, and each claim starts
//!   a new row, so a row's versions do not grow with the hold.
//! - *A chain's first row* has `seq` 0 and is not deleted when another follows it, only
//!   marked superseded: two claimers that both found no row conflict on it in the primary key.
//! - *A drain* ends its chain: its claim inserts one row (the first) and its release deletes
//!   it (with the chain's first row, if another). While the vacuum horizon is held, a shard
//!   drained again within [`HOT`] keeps its chain instead, two live rows, and its idle chain
//!   is deleted later: a chain ended at every drain would then give each claim of a busy shard
//!   a walk of the first rows of all its earlier chains, dead but not removable. A kept chain
//!   costs each drain two writes more, so chains are kept only then
//!   ([`Leases::watch_horizon`]).
//!
//! Failures, backoff and parking stay in `outbox_shards`, which a shard that never fails no
//! longer touches.
//!
//! Relays from before the log keep leases in `outbox_shards`. A relay of this version waits
//! (claims nothing) until no live relay of the older protocol is left, then makes the one-way
//! switch: the live leases move into the log, and a trigger refuses leases in `outbox_shards`
//! from then on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use outbox_core::{Error, ShardKey};
use outbox_sqlx::error::database;
use sqlx::PgPool;

use super::{PgDialect, lock_not_available, shard_arrays};

/// While the horizon is held, a shard released again within this time of its last release
/// keeps its chain.
pub(crate) const HOT: Duration = Duration::from_secs(10);

/// The horizon is held while its oldest holder is at least this many transactions behind.
/// A chain ended then leaves its first row dead in the primary key, where the next first row
/// of the same shard looks for a conflict: at most this many such rows a shard before chains
/// are kept.
pub(crate) const HELD_BEHIND: i64 = 1_000;

/// How often a store looks whether the horizon is held (at most).
const HORIZON_EVERY: Duration = Duration::from_secs(2);

/// A kept chain idle this long is deleted by the relay that kept it.
pub(crate) const IDLE: Duration = Duration::from_secs(30);

/// How often a store deletes the idle chains it kept.
const TIDY_EVERY: Duration = Duration::from_secs(10);

/// How often a store looks for idle chains that no live relay remembers (their relay
/// stopped), and how long such a chain has been idle.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// The most shards a store remembers releasing.
const REMEMBERED: usize = 200_000;

/// The index entries of one shard's key in an index of `$t` on the key's columns and then
/// `$column`, from `$low` (compared by `$op`) to the key's end: the scope compared for
/// equality, the rest by two row comparisons.
///
/// - The planner estimates a row comparison by its first column alone, so it expects many
///   rows, and reads in index order to stop at the `LIMIT`. With the key compared for
///   equality it expects a row or two, and may gather every entry of the key instead (a
///   bitmap scan, then a sort): under a held vacuum horizon, every row the shard's earlier
///   drains deleted.
/// - No other index serves the comparison in order (a bound on `$column` alone would let the
///   planner walk the primary key through every shard's rows).
/// - An index scan starts at the lower (or, backward, the upper) row and ends where the
///   shard identifier leaves the key's: past the key, it reads at most the same identifier's
///   other destinations.
macro_rules! of_key {
    ($t:literal, $column:literal, $scope:expr, $identifier:expr, $destination:expr,
     $op:literal, $low:expr) => {
        concat!(
            $t,
            ".shard_scope = ",
            $scope,
            " AND ",
            $crate::dialect::leases::key_row!($t, $column),
            " ",
            $op,
            " (",
            $identifier,
            ", ",
            $destination,
            ", ",
            $low,
            ") AND ",
            $crate::dialect::leases::key_row!($t, $column),
            " <= (",
            $identifier,
            ", ",
            $destination,
            ", 9223372036854775807)"
        )
    };
}
pub(crate) use of_key;

/// The row `of_key!` compares: `$t`'s shard identifier, destination and `$column`.
macro_rules! key_row {
    ($t:literal, $column:literal) => {
        concat!(
            "(",
            $t,
            ".shard_identifier, ",
            $t,
            ".destination, ",
            $t,
            ".",
            $column,
            ")"
        )
    };
}
pub(crate) use key_row;

/// The newest row of a shard (three column expressions) as a query of `$t`'s `$columns`: a
/// backward seek that reads the newest entry first and stops there.
macro_rules! newest_row {
    ($columns:literal, $t:literal, $scope:expr, $identifier:expr, $destination:expr) => {
        concat!(
            "SELECT ",
            $columns,
            " FROM outbox_leases ",
            $t,
            " WHERE ",
            $crate::dialect::leases::of_key!(
                $t,
                "seq",
                $scope,
                $identifier,
                $destination,
                ">=",
                "0"
            ),
            " ORDER BY ",
            $t,
            ".shard_scope DESC, ",
            $t,
            ".shard_identifier DESC, ",
            $t,
            ".destination DESC, ",
            $t,
            ".seq DESC LIMIT 1"
        )
    };
}
pub(crate) use newest_row;

/// The newest row of a shard (three column expressions): its `seq`.
macro_rules! newest {
    ($scope:literal, $identifier:literal, $destination:literal) => {
        concat!(
            "(",
            $crate::dialect::leases::newest_row!("x.seq", "x", $scope, $identifier, $destination),
            ")"
        )
    };
}
pub(crate) use newest;

/// The newest row of the shard `k` as a lateral join `h` (its lease columns, and `at`: where
/// the row is).
macro_rules! head_of {
    ($k:literal) => {
        concat!(
            "LEFT JOIN LATERAL (",
            $crate::dialect::leases::newest_row!(
                "l.seq, l.lease_owner, l.lease_token, l.lease_expires_at, l.ctid AS at",
                "l",
                concat!($k, ".shard_scope"),
                concat!($k, ".shard_identifier"),
                concat!($k, ".destination")
            ),
            ") h ON true"
        )
    };
}
pub(crate) use head_of;

/// The lease of `$1..$3` with token `$4`, if it is the shard's newest row (`mine`, locked).
/// `$extra` adds a condition.
macro_rules! held_lease {
    ($extra:literal) => {
        concat!(
            "mine AS MATERIALIZED ( \
                SELECT l.shard_scope, l.shard_identifier, l.destination, l.seq, l.first, \
                    l.lease_owner, l.lease_token \
                FROM outbox_leases l \
                WHERE l.shard_scope = $1 AND l.shard_identifier = $2 AND l.destination = $3 \
                    AND l.seq = ",
            newest!("$1", "$2", "$3"),
            " AND l.lease_token = $4 AND l.lease_owner IS NOT NULL AND NOT l.superseded ",
            $extra,
            " FOR UPDATE OF l)"
        )
    };
}

/// The held lease (`held_lease!`) and its end: deleted, or marked superseded if it is the
/// chain's first row (the chain stays, for a released row to follow).
macro_rules! mine {
    ($extra:literal) => {
        concat!(held_lease!($extra), ", ", superseded!("mine"))
    };
}

/// The held lease (`held_lease!`), deleted (as a statement: its count says whether the lease
/// was held): a chain of that one row ends there; a row that follows a first row is followed
/// in turn by a released row (`released_after!`).
macro_rules! ended {
    () => {
        "DELETE FROM outbox_leases l USING mine m \
        WHERE l.shard_scope = m.shard_scope AND l.shard_identifier = m.shard_identifier \
            AND l.destination = m.destination AND l.seq = m.seq"
    };
}

/// The next row of `mine` (ended by `ended!`) if it followed its chain's first row: released.
/// A chain of one row ends with it.
macro_rules! released_after {
    () => {
        concat!(released!("mine"), " WHERE NOT m.first")
    };
}

/// A lease released without an acknowledgement: the held lease (`held_lease!`, with
/// `$extra`), the CTE `$step` if given, the next row (`released_after!`), and its end
/// (`ended!`, whose count says whether the lease was held).
macro_rules! release {
    ($extra:literal $(, $step:expr)?) => {
        concat!(
            "WITH ",
            held_lease!($extra),
            $(", ", $step,)?
            ", released AS (",
            released_after!(),
            ") ",
            ended!()
        )
    };
}

/// The end of the rows `$rows` names (its columns: the key, `seq` and `first`): deleted, or
/// a chain's first row, which stays, marked superseded. Each row `l` of the log is found by
/// `$found` (by default its whole key, `m` being the row of `$rows`).
macro_rules! superseded {
    ($rows:literal) => {
        superseded!(
            $rows,
            "l.shard_scope = m.shard_scope AND l.shard_identifier = m.shard_identifier \
                AND l.destination = m.destination"
        )
    };
    ($rows:literal, $found:literal) => {
        concat!(
            "gone AS (DELETE FROM outbox_leases l USING ",
            $rows,
            " m WHERE ",
            $found,
            " AND l.seq = m.seq AND NOT m.first), \
             marked AS (UPDATE outbox_leases l SET superseded = true FROM ",
            $rows,
            " m WHERE ",
            $found,
            " AND l.seq = m.seq AND m.first)"
        )
    };
}

// How the batch statements reach the lease rows they end or take over: a lateral seek by the
// row's whole key (with `LIMIT 1`, so that the planner cannot flatten it into a join) says
// where the row is in the statement's snapshot (its `ctid`), and the change reaches it there
// (a TID scan), never by joining the batch to the log by the key.
//
// - The log churns: statistics gathered while it held no live row (a quiet moment, a relay
//   just started) estimate it at one row, however many it holds. A join by the key then read
//   the whole log (or its primary key) once, and the batch once for each of its rows: a
//   finish of 1,024 shards visited two million rows (360 ms, against 4 ms for the seeks),
//   and the sparse drain ran at a tenth of its pace.
// - A row that another transaction changed after the snapshot (a lease extended, or
//   superseded by a taker) is no longer where the snapshot saw it. Current releases of
//   PostgreSQL recheck a TID scan's row and skip it; older ones followed it to its new
//   version and checked the statement's other conditions there. A claim then leaves the
//   shard for a later round; a finish says the lease was not held, and the store asks once
//   more for such leases, which finds a lease extended beside its finish where it is now.

/// The columns of a new row of the log.
macro_rules! log_columns {
    () => {
        "INSERT INTO outbox_leases (shard_scope, shard_identifier, destination, seq, first, \
            lease_owner, lease_token, lease_expires_at) "
    };
}

/// The lease of `$1..$3` with token `$4`, if it is the shard's newest row, made to end at
/// `$expires`: updated in place, so that a release or an acknowledgement that waits on it
/// finds it still its own (a lease is extended a few times in its life; each drain of the
/// shard starts a new row).
macro_rules! extended {
    ($expires:literal) => {
        concat!(
            "UPDATE outbox_leases l SET lease_expires_at = ",
            $expires,
            " WHERE l.shard_scope = $1 AND l.shard_identifier = $2 AND l.destination = $3 \
                AND l.seq = ",
            newest!("$1", "$2", "$3"),
            " AND l.lease_token = $4 AND l.lease_owner IS NOT NULL AND NOT l.superseded"
        )
    };
}

/// The next row of the rows `$rows`: released.
macro_rules! released {
    ($rows:literal) => {
        concat!(
            log_columns!(),
            "SELECT m.shard_scope, m.shard_identifier, m.destination, \
                nextval('outbox_lease_tokens'), false, NULL, NULL, NULL FROM ",
            $rows,
            " m"
        )
    };
}

/// The failures the release of `mine` forgets.
macro_rules! reset {
    () => {
        "reset AS (DELETE FROM outbox_shards s USING mine m \
            WHERE s.shard_scope = m.shard_scope AND s.shard_identifier = m.shard_identifier \
                AND s.destination = m.destination)"
    };
}

/// The acknowledged rows of `$1..$3` deleted (`acked`, one row each) if the CTE `$fence` holds
/// the lease: the ids in `$ids` between `$lowest` and `$highest`.
macro_rules! acked {
    ($fence:literal, $lowest:literal, $highest:literal, $ids:literal) => {
        concat!(
            "acked AS (DELETE FROM outbox_messages o WHERE EXISTS (SELECT 1 FROM ",
            $fence,
            ") AND o.shard_scope = $1 AND o.shard_identifier = $2 AND o.destination = $3 \
                AND o.id BETWEEN ",
            $lowest,
            " AND ",
            $highest,
            " AND o.id = ANY(",
            $ids,
            "::bigint[]) RETURNING 1)"
        )
    };
}

/// A lease extended from beside a running handler (`$5` milliseconds from now).
pub(crate) const EXTEND_LEASE: &str = extended!("now() + $5::bigint * interval '1 millisecond'");

/// A lease given up after an interrupted drain: it lapses now, so the shard is due at once and
/// its next claim counts as a takeover (an attempt more at the head, whose messages the
/// interrupted drain may have delivered).
pub(crate) const RELEASE_INTERRUPTED: &str = extended!("now()");

/// A lease released, the shard's failures kept.
pub(crate) const RELEASE_LEASE: &str = release!("");

/// A lease released, the shard's failures forgotten.
pub(crate) const RELEASE: &str = release!("", reset!());

/// RELEASE, if the shard has no message.
pub(crate) const DELETE_IF_EMPTY: &str = release!(
    "AND NOT EXISTS (SELECT 1 FROM outbox_messages o \
        WHERE o.shard_scope = $1 AND o.shard_identifier = $2 AND o.destination = $3)",
    reset!()
);

// A first failure (attempt 1, or none recorded) starts the failures' clock. A park (S26)
// waits for no time and no message: its retry time is the end of year 9999 and its watermark
// the highest id, until a relay that knows the category unparks it.
pub(crate) const FAIL: &str = concat!(
    "WITH ",
    mine!(""),
    ", failed AS ( \
        INSERT INTO outbox_shards AS s (shard_scope, shard_identifier, destination, attempts, \
            first_failed_at, last_error, retry_at, watermark, parked_category) \
        SELECT m.shard_scope, m.shard_identifier, m.destination, $5, now(), $6, \
            CASE WHEN $9::integer IS NULL \
                THEN now() + $7::bigint * interval '1 millisecond' \
                ELSE timestamptz '9999-12-31 23:59:59+00' END, \
            CASE WHEN $9::integer IS NULL THEN $8 ELSE 9223372036854775807 END, $9 \
        FROM mine m \
        ON CONFLICT (shard_scope, shard_identifier, destination) DO UPDATE SET \
            attempts = excluded.attempts, \
            first_failed_at = CASE WHEN $5 <= 1 OR s.first_failed_at IS NULL THEN now() \
                ELSE s.first_failed_at END, \
            last_error = excluded.last_error, retry_at = excluded.retry_at, \
            watermark = excluded.watermark, parked_category = excluded.parked_category) ",
    released!("mine")
);

// The acknowledgement proves and extends the lease: if another worker holds the newest row,
// it waits for it and then finds the row gone, and nothing is deleted. The head it moved past
// takes its attempts with it. Exactly the rows the relay read and delivered go, by id: a range
// of ids could hold a row that committed after the read.
pub(crate) const ACK: &str = concat!(
    "WITH lease AS (",
    extended!("now() + $5::bigint * interval '1 millisecond'"),
    " RETURNING 1), \
     cleared AS (UPDATE outbox_shards s SET attempts = 0, first_failed_at = NULL \
        WHERE EXISTS (SELECT 1 FROM lease) \
            AND s.shard_scope = $1 AND s.shard_identifier = $2 AND s.destination = $3), \
     ",
    acked!("lease", "$6", "$7", "$8"),
    " SELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM acked)"
);

// A drained shard's last acknowledgement and its release, in one statement. A drained shard's
// failures are all reset (no attempts, no backoff, not parked).
pub(crate) const ACK_AND_RELEASE: &str = concat!(
    "WITH ",
    held_lease!(""),
    ", gone AS (",
    ended!(),
    "), ",
    reset!(),
    ", released AS (",
    released_after!(),
    "), ",
    acked!("mine", "$5", "$6", "$7"),
    " SELECT (SELECT count(*) FROM mine), (SELECT count(*) FROM acked), \
        (SELECT count(*) FROM mine)"
);

/// The lease row `l` that the place `t` of `tops` holds: the shard's newest row, with its
/// token, not released and not superseded.
macro_rules! held_by_top {
    () => {
        concat!(
            "l.shard_scope = t.shard_scope AND l.shard_identifier = t.shard_identifier \
                AND l.destination = t.destination AND l.seq = t.seq AND ",
            still_held!()
        )
    };
}

/// The lease row `l` still held with the token of `t`: not released and not superseded.
macro_rules! still_held {
    () => {
        "l.lease_token = t.lease_token AND l.lease_owner IS NOT NULL AND NOT l.superseded"
    };
}

/// What the end of a held row returns: its place, whether its chain stays and where its
/// chain's first row is if the chain ends with it, its key, `seq` and `first`.
macro_rules! held_columns {
    () => {
        "t.n, t.keep, t.first_at, l.shard_scope, l.shard_identifier, l.destination, l.seq, \
            l.first"
    };
}

// Drained shards' acknowledgements and releases in one statement: ACK_AND_RELEASE for each
// lease of `$1..$4` (arrays: scope, identifier, destination, token), numbered by its place,
// `$7` whether its chain stays (see `HOT`), `$8` the `seq` of its row if known (the claim
// said it; NULL: the shard's newest row is sought); `$6` the acknowledged ids and `$5` the
// place of the lease each belongs to. Each shard's part is fenced by its own token: a lease
// no longer held deletes nothing of its shard, and takes nothing from the others.
//
// The answer is one row that says only what the relay cannot know: the places of the leases
// held (NULL when all were, as nearly always), the acknowledged ids deleted (NULL when all
// those of the leases held were: only a row another transaction deleted first makes it
// otherwise), and the places and `seq`s of the released rows that follow kept chains. Each
// lease's count of rows deleted follows from its own ids. An answer per lease, counted by
// grouping the deletions and joined back to the leases, cost a fifth of the statement
// (1.5 ms of 7.5 for 770 one-message shards). Nor are the acknowledged ids joined to the
// leases held when all were: the array bound is then the array deleted.
//
// A chain that does not stay ends here: its held row goes, and so does its first row (`seq`
// 0) if that is another, superseded row.
//
// Each lease row is sought by its whole key (`tops` seeks each shard's newest `seq` where the
// claim's is not known: a held row with its token and not superseded is the newest, as
// whoever follows a row deletes it or marks it superseded) and ended where the statement's
// snapshot found it (`found`, and its chain's first row if the chain ends with it; see
// `superseded`), and the acknowledged rows by their ids alone, looked up as one array in the
// primary key: the ids of the leases still held (`targets`: one row, the array), each read by
// the lease's claim from its shard (an id is never reused and a message never changes shard,
// so its id alone names it), so that no join pairs each deleted row with each acknowledged
// id. The delete joins only the one row that holds the array, so no plan
// can walk more than it deletes (the array is gathered before the primary key is read): a
// join by the shard's key alone read every row of the shard that the earlier drains
// deleted, which a held vacuum horizon keeps; one that looked an id up in the shard index
// without the key walked the whole index for each (13 s for 388 shards in the 15-minute
// hold); a generic plan made while the table held few live rows joined the targets to a read
// of the whole primary key (900,000 buffers for 3 shards); and a nested loop that paired each
// target with the array's rows stepped through the whole array once per target (a batch's
// thousands of ids).
//
// The arrays are read through sub-selects, as the claim's are: the generic plan is then kept
// instead of the statement being planned anew at each batch (as long as it runs, for a batch
// of one shard).
//
// A held row is deleted (or, a kept chain's first row, marked) by the statement that fences
// it, with no lock taken first: a delete that waits for another transaction's change checks
// its conditions again on the row that change left, as the lock did, and a lock then a
// delete wrote the row twice (the acknowledgement cost 17.6 us a shard against 7.0 before the
// lease log). No other statement waits on two lease rows at once (extensions go one
// statement each; claims skip locked rows), so the order the rows are taken in cannot make
// two statements wait on each other.
pub(crate) const ACK_AND_RELEASE_MANY: &str = concat!(
    "WITH want AS ( \
        SELECT * FROM unnest((SELECT $1::smallint[]), (SELECT $2::bigint[]), \
                (SELECT $3::text[]), (SELECT $4::bigint[]), (SELECT $7::boolean[]), \
                (SELECT $8::bigint[])) \
            WITH ORDINALITY AS w(shard_scope, shard_identifier, destination, lease_token, keep, \
                seq, n)), \
     tops AS MATERIALIZED ( \
        SELECT w.n, w.keep, w.shard_scope, w.shard_identifier, w.destination, w.lease_token, \
            coalesce(w.seq, ",
    newest!("w.shard_scope", "w.shard_identifier", "w.destination"),
    ") AS seq FROM want w), \
     found AS MATERIALIZED ( \
        SELECT t.n, t.keep, t.lease_token, x.at, f.at AS first_at \
        FROM tops t \
            CROSS JOIN LATERAL (SELECT l.ctid AS at, l.first FROM outbox_leases l WHERE ",
    held_by_top!(),
    " LIMIT 1) x \
            LEFT JOIN LATERAL (SELECT l.ctid AS at FROM outbox_leases l \
                WHERE NOT t.keep AND NOT x.first AND l.shard_scope = t.shard_scope \
                    AND l.shard_identifier = t.shard_identifier \
                    AND l.destination = t.destination AND l.seq = 0 LIMIT 1) f ON true), \
     gone AS (DELETE FROM outbox_leases l USING found t WHERE l.ctid = t.at AND ",
    still_held!(),
    " AND NOT (l.first AND t.keep) RETURNING ",
    held_columns!(),
    "), \
     marked AS (UPDATE outbox_leases l SET superseded = true FROM found t \
        WHERE l.ctid = t.at AND ",
    still_held!(),
    " AND l.first AND t.keep RETURNING ",
    held_columns!(),
    "), \
     held AS MATERIALIZED (SELECT * FROM gone UNION ALL SELECT * FROM marked), \
     ended AS (DELETE FROM outbox_leases l USING held h WHERE h.first_at IS NOT NULL \
        AND l.ctid = h.first_at AND l.seq = 0), \
     following AS MATERIALIZED (SELECT h.n, h.shard_scope, h.shard_identifier, \
        h.destination, nextval('outbox_lease_tokens') AS seq FROM held h WHERE h.keep), \
     released AS (",
    log_columns!(),
    "SELECT f.shard_scope, f.shard_identifier, f.destination, f.seq, false, NULL, NULL, NULL \
        FROM following f), \
     reset AS (DELETE FROM outbox_shards s USING held m \
        WHERE s.shard_scope = m.shard_scope AND s.shard_identifier = m.shard_identifier \
            AND s.destination = m.destination), \
     all_held AS MATERIALIZED (SELECT (SELECT count(*) FROM held) \
        = cardinality((SELECT $4::bigint[])) AS yes), \
     targets AS MATERIALIZED ( \
        SELECT CASE WHEN (SELECT yes FROM all_held) THEN (SELECT $6::bigint[]) \
            ELSE ARRAY(SELECT a.id FROM held h \
                JOIN unnest((SELECT $5::bigint[]), (SELECT $6::bigint[])) AS a(n, id) \
                ON a.n = h.n) END AS ids), \
     acked AS ( \
        DELETE FROM outbox_messages o USING targets t WHERE o.id = ANY (t.ids) \
        RETURNING o.id) \
    SELECT CASE WHEN (SELECT yes FROM all_held) THEN NULL \
            ELSE (SELECT coalesce(array_agg(h.n), '{}') FROM held h) END, \
        CASE WHEN (SELECT count(*) FROM acked) = cardinality((SELECT ids FROM targets)) \
            THEN NULL ELSE (SELECT coalesce(array_agg(a.id), '{}') FROM acked a) END, \
        (SELECT coalesce(array_agg(f.n), '{}') FROM following f), \
        (SELECT coalesce(array_agg(f.seq), '{}') FROM following f)"
);

/// Of the shards `want` (its key columns), those due (`due`: the newest row's `seq`, NULL if
/// none, and the failed attempts), the newest rows to take over (`based`, locked; a row
/// another transaction holds is skipped, never waited for), their end, the leases that
/// follow them (`taken`) and the takeovers counted (`counted`): a lease that lapsed without a
/// release (its holder died mid-drain, having perhaps delivered the head) counts as an
/// attempt at the head.
macro_rules! take_over {
    () => {
        concat!(
            "due AS MATERIALIZED ( \
                SELECT w.shard_scope, w.shard_identifier, w.destination, w.after, h.seq, h.at, \
                    coalesce(s.attempts, 0) AS attempts \
                FROM want w ",
            head_of!("w"),
            " LEFT JOIN LATERAL (SELECT s.attempts, s.retry_at, s.watermark \
                    FROM outbox_shards s WHERE s.shard_scope = w.shard_scope \
                        AND s.shard_identifier = w.shard_identifier \
                        AND s.destination = w.destination LIMIT 1) s ON true \
                WHERE (h.seq IS NULL OR h.lease_owner IS NULL OR h.lease_expires_at <= now()) \
                    AND (s.retry_at IS NULL OR s.retry_at <= now() OR EXISTS ( \
                        SELECT 1 FROM outbox_messages o \
                        WHERE o.shard_scope = w.shard_scope \
                            AND o.shard_identifier = w.shard_identifier \
                            AND o.destination = w.destination AND o.id > s.watermark)) \
                    AND NOT ",
            outbox_sqlx::paused!("w.shard_scope", "w.shard_identifier", "w.destination"),
            "), \
             based AS MATERIALIZED ( \
                SELECT l.shard_scope, l.shard_identifier, l.destination, l.seq, l.first, \
                    l.lease_owner, d.at, d.attempts, d.after, \
                    nextval('outbox_lease_tokens') AS token \
                FROM due d JOIN outbox_leases l ON l.ctid = d.at AND l.seq = d.seq \
                WHERE NOT l.superseded \
                    AND (l.lease_owner IS NULL OR l.lease_expires_at <= now()) \
                ORDER BY l.shard_scope, l.shard_identifier, l.destination \
                FOR UPDATE OF l SKIP LOCKED), ",
            superseded!("based", "l.ctid = m.at"),
            ", taken AS (",
            log_columns!(),
            "SELECT b.shard_scope, b.shard_identifier, b.destination, b.token, false, $4::text, \
                    b.token, now() + $5::bigint * interval '1 millisecond' \
                FROM based b ORDER BY b.shard_scope, b.shard_identifier, b.destination), \
             counted AS ( \
                INSERT INTO outbox_shards AS s (shard_scope, shard_identifier, destination, \
                    attempts) \
                SELECT b.shard_scope, b.shard_identifier, b.destination, 1 \
                FROM based b WHERE b.lease_owner IS NOT NULL \
                ON CONFLICT (shard_scope, shard_identifier, destination) \
                    DO UPDATE SET attempts = s.attempts + 1 \
                RETURNING shard_scope, shard_identifier, destination, attempts)"
        )
    };
}

/// The columns joining a claimed shard `c` to the rows `$r` of the same key.
macro_rules! same_key {
    ($c:literal, $r:literal) => {
        concat!(
            $r,
            ".shard_scope = ",
            $c,
            ".shard_scope AND ",
            $r,
            ".shard_identifier = ",
            $c,
            ".shard_identifier AND ",
            $r,
            ".destination = ",
            $c,
            ".destination"
        )
    };
}

// Leased mode, several shards at once: the keys `$1..$3` (arrays) claimed for `$4` for `$5`
// milliseconds, with the first `$6` rows of each claimed shard's head (NULL message columns
// for a shard with none), read from each shard's position (`$7`: nothing of the shard at or
// below it is pending; see `positions`), so that the read never walks the rows earlier drains
// acknowledged. A shard with no row in the log gets its chain's first row (in key order, so
// that two relays claiming overlapping sets never wait on each other's inserts in a cycle);
// the others follow their newest row (`take_over`).
//
// The rows are read in the statement's snapshot, taken before its claims: a worker that
// held a shard may have acknowledged (deleted) rows of it and released it since, the claim
// then finding its newest row changed. Such a row is still visible here, but its `xmax` (the
// deleting transaction) is set: each row says whether it is `stale`, and a head with a stale
// row is read again by the session. Once claimed, nobody else deletes rows of the shard.
//
// What the steps produced is gathered by key in one grouping (`claimed`), never by joining
// two steps: the planner estimates a step at a row or two, and a nested loop over one step
// inside another made a claim of 313 shards read 30 million rows (13 s) while a horizon was
// held. A claimed shard's head is read once, from `claimed`.
//
// The answer is one row of arrays, an element per head row read (a claimed shard with none
// has one, its message columns NULL), in no particular order (PostgreSQL sorts the input of
// each aggregate with an ORDER BY on its own): see `ClaimAnswer`. The relay reads a row in
// far more time than an element of an array.
//
// Each shard's newest lease row and its head are read in index order from where they begin
// (`of_key`), never by gathering every entry of the shard's key.
//
// The arrays and the head's limit are read through sub-selects, which the planner cannot see
// into: a custom plan then estimates what a generic one does, so after its first executions
// PostgreSQL keeps the generic plan of the prepared statement instead of planning this
// statement anew at every claim.
//
// A first row has `seq` 0: two claimers that both found no row conflict on it in the
// primary key, the table's one index (a second, unique index of the first rows cost each
// claim's insert a third more).
pub(crate) const CLAIM_MANY: &str = concat!(
    "WITH want AS ( \
        SELECT DISTINCT w.shard_scope, w.shard_identifier, w.destination, w.after \
        FROM unnest((SELECT $1::smallint[]), (SELECT $2::bigint[]), (SELECT $3::text[]), \
                (SELECT $7::bigint[])) \
            AS w(shard_scope, shard_identifier, destination, after)), ",
    take_over!(),
    ", fresh AS (",
    log_columns!(),
    "SELECT n.shard_scope, n.shard_identifier, n.destination, 0, true, $4::text, \
            n.token, now() + $5::bigint * interval '1 millisecond' \
        FROM (SELECT d.shard_scope, d.shard_identifier, d.destination, \
                nextval('outbox_lease_tokens') AS token \
            FROM due d WHERE d.seq IS NULL \
            ORDER BY d.shard_scope, d.shard_identifier, d.destination) n \
        ON CONFLICT (shard_scope, shard_identifier, destination, seq) DO NOTHING \
        RETURNING shard_scope, shard_identifier, destination, lease_token), \
     claimed AS MATERIALIZED ( \
        SELECT u.shard_scope, u.shard_identifier, u.destination, max(u.token) AS lease_token, \
            max(u.previous_owner) AS previous_owner, \
            coalesce(max(u.counted), max(u.attempts)) AS attempts, max(u.after) AS after, \
            max(u.seq) AS seq \
        FROM ( \
            SELECT f.shard_scope, f.shard_identifier, f.destination, f.lease_token AS token, \
                NULL::text AS previous_owner, NULL::integer AS attempts, NULL::bigint AS after, \
                NULL::integer AS counted, 0::bigint AS seq \
            FROM fresh f \
            UNION ALL \
            SELECT d.shard_scope, d.shard_identifier, d.destination, NULL, NULL, d.attempts, \
                d.after, NULL, NULL \
            FROM due d WHERE d.seq IS NULL \
            UNION ALL \
            SELECT b.shard_scope, b.shard_identifier, b.destination, b.token, b.lease_owner, \
                b.attempts, b.after, NULL, b.token \
            FROM based b \
            UNION ALL \
            SELECT k.shard_scope, k.shard_identifier, k.destination, NULL, NULL, NULL, NULL, \
                k.attempts, NULL \
            FROM counted k) u \
        GROUP BY u.shard_scope, u.shard_identifier, u.destination \
        HAVING max(u.token) IS NOT NULL) \
    SELECT array_agg(h.id), array_agg(h.category), array_agg(h.shard_scope), \
        array_agg(h.object_identifier), array_agg(h.object_wide), array_agg(h.payload), \
        array_agg(h.created), array_agg(h.metadata), array_agg(c.shard_scope), \
        array_agg(c.shard_identifier), array_agg(c.destination), array_agg(c.lease_token), \
        array_agg(c.attempts), array_agg(c.previous_owner), \
        array_agg(coalesce(h.stale, false)), array_agg(c.seq) \
    FROM claimed c LEFT JOIN LATERAL ( \
        SELECT m.id, m.category, m.shard_scope, m.object_identifier, m.object_wide, \
            m.payload::text AS payload, \
            (extract(epoch FROM m.created_at) * 1000000)::bigint AS created, \
            m.metadata::text AS metadata, m.xmax::text <> '0' AS stale \
        FROM outbox_messages m WHERE ",
    of_key!(
        "m",
        "id",
        "c.shard_scope",
        "c.shard_identifier",
        "c.destination",
        ">",
        "c.after"
    ),
    " ORDER BY m.shard_scope, m.shard_identifier, m.destination, m.id LIMIT (SELECT $6)) h \
        ON true"
);

// In-transaction mode: the shard's chain is made first (ENSURE_CHAIN, committed), so that the
// long claiming transaction only follows a newest row and never holds an uncommitted first
// row that other claimers would wait on. Returns the token, the attempts and the previous
// owner.
pub(crate) const TAKE_LEASE: &str = concat!(
    "WITH want AS (SELECT $1::smallint AS shard_scope, $2::bigint AS shard_identifier, \
        $3::text AS destination, 0::bigint AS after), ",
    take_over!(),
    " SELECT b.token, coalesce(k.attempts, b.attempts), b.lease_owner \
    FROM based b LEFT JOIN counted k ON ",
    same_key!("b", "k")
);

/// A released chain for the shard if it has none (its first row).
pub(crate) const ENSURE_CHAIN: &str = concat!(
    log_columns!(),
    "SELECT $1::smallint, $2::bigint, $3::text, 0, true, NULL, NULL, NULL \
    WHERE NOT EXISTS (SELECT 1 FROM outbox_leases \
        WHERE shard_scope = $1 AND shard_identifier = $2 AND destination = $3) \
    ON CONFLICT DO NOTHING"
);

/// The chains of the released newest rows `idle` (their keys and `seq`), deleted: those rows
/// and their chains' first rows.
macro_rules! chains_deleted {
    () => {
        "newest AS (DELETE FROM outbox_leases l USING idle i \
            WHERE l.shard_scope = i.shard_scope AND l.shard_identifier = i.shard_identifier \
                AND l.destination = i.destination AND l.seq = i.seq) \
        DELETE FROM outbox_leases l USING idle i \
        WHERE l.shard_scope = i.shard_scope AND l.shard_identifier = i.shard_identifier \
            AND l.destination = i.destination AND l.first AND l.seq <> i.seq"
    };
}

// The chains of the shards `$1..$3` (arrays) whose newest row is still the released row
// `$4` (the `seq` this store's release wrote), deleted: that row and the chain's first.
const TIDY: &str = concat!(
    "WITH idle AS MATERIALIZED ( \
        SELECT l.shard_scope, l.shard_identifier, l.destination, l.seq \
        FROM unnest($1::smallint[], $2::bigint[], $3::text[], $4::bigint[]) \
            AS w(shard_scope, shard_identifier, destination, seq) \
        JOIN outbox_leases l ON l.shard_scope = w.shard_scope \
            AND l.shard_identifier = w.shard_identifier AND l.destination = w.destination \
            AND l.seq = w.seq \
        WHERE l.lease_owner IS NULL AND NOT l.superseded \
        FOR UPDATE OF l SKIP LOCKED), ",
    chains_deleted!()
);

// Up to `$2` chains released and idle for `$1` milliseconds, whoever released them (a relay
// that stopped forgets its own): the released newest rows, and their chains' first rows.
const SWEEP: &str = concat!(
    "WITH idle AS MATERIALIZED ( \
        SELECT l.shard_scope, l.shard_identifier, l.destination, l.seq FROM outbox_leases l \
        WHERE l.lease_owner IS NULL AND NOT l.superseded \
            AND l.written_at < now() - $1::bigint * interval '1 millisecond' \
        LIMIT $2 FOR UPDATE OF l SKIP LOCKED), ",
    chains_deleted!()
);

// The switch to the log, in one transaction: no live relay of protocol 1 (the heartbeats), then
// the live leases of `outbox_shards` copied into the log (as their chains' first rows) and
// cleared there, so that a relay from before the switch finds its lease gone, and its next
// claim refused by the trigger.
const SWITCH: &str = "\
    INSERT INTO outbox_protocol (version) \
    SELECT 2 WHERE NOT EXISTS (SELECT 1 FROM outbox_relays \
        WHERE protocol < 2 AND expires_at > now()) \
    ON CONFLICT DO NOTHING RETURNING version";
const MOVE_LEASES: &str = "\
    INSERT INTO outbox_leases (shard_scope, shard_identifier, destination, seq, first, \
        lease_owner, lease_token, lease_expires_at) \
    SELECT shard_scope, shard_identifier, destination, 0, true, lease_owner, lease_token, \
        lease_expires_at \
    FROM outbox_shards WHERE lease_owner IS NOT NULL AND lease_token IS NOT NULL \
    ON CONFLICT DO NOTHING";
const DROP_LEASE_ROWS: &str = "\
    DELETE FROM outbox_shards \
    WHERE attempts = 0 AND last_error IS NULL AND retry_at IS NULL AND parked_category IS NULL";
const CLEAR_LEASES: &str = "\
    UPDATE outbox_shards SET lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL \
    WHERE lease_owner IS NOT NULL OR lease_token IS NOT NULL OR lease_expires_at IS NOT NULL";

/// How often a relay waiting for the switch looks again.
const SWITCH_EVERY: Duration = Duration::from_secs(1);

/// A store's lease log: whether the switch is made, and the shards it released lately.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    switched: AtomicBool,
    /// The vacuum horizon is held: busy shards keep their chains.
    held: Arc<AtomicBool>,
    /// A look at the horizon is running.
    looking: Arc<AtomicBool>,
    /// When it last looked for the switch.
    looked: tokio::sync::Mutex<Option<Instant>>,
    state: Mutex<State>,
}

/// The maps of [`State`], hashed with `foldhash`'s fast hasher: each claim and finish of the
/// relay's hot path looks up its shards and tokens (keys the outbox's own tables hold).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Debug, Default)]
struct State {
    /// When it last released each shard.
    released: HashMap<ShardKey, Instant>,
    /// The chains it kept: the released row's `seq`, and when.
    kept: HashMap<ShardKey, (i64, Instant)>,
    /// When it last deleted its idle chains, and everyone's.
    tidied: Option<Instant>,
    swept: Option<Instant>,
    /// When it last looked whether the horizon is held.
    probed: Option<Instant>,
    /// The `seq` of the row each of its claims holds, by token, until its acknowledgement.
    seqs: HashMap<i64, i64>,
}

impl Leases {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this store may claim: the switch to the log is made (making it if no live
    /// relay speaks the older protocol). Until then it claims nothing, and looks again at
    /// most every second.
    pub(crate) async fn ready(&self, pool: &PgPool) -> Result<bool, Error> {
        if self.switched.load(Ordering::Acquire) {
            return Ok(true);
        }
        // One look at a time: claims that come meanwhile wait for its answer.
        let mut looked = self.looked.lock().await;
        if self.switched.load(Ordering::Acquire) {
            return Ok(true);
        }
        if looked.is_some_and(|looked| looked.elapsed() < SWITCH_EVERY) {
            return Ok(false);
        }
        *looked = Some(Instant::now());
        let switched = switch(pool)
            .await
            .map_err(database::<PgDialect>("switching to the lease log"))?;
        if switched {
            self.switched.store(true, Ordering::Release);
        } else {
            tracing::info!(
                "a relay of an earlier version is running: this relay claims nothing until it \
                 stops (leases move to outbox_leases then)"
            );
        }
        Ok(switched)
    }

    /// Whether the vacuum horizon is held, or was and the rows it kept are not yet removed,
    /// as last seen ([`Leases::watch_horizon`]).
    pub(crate) fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Whether the chain of each of `shards`, drained now, stays: the horizon is held and
    /// the shard was released within [`HOT`] (releases are remembered only while it is).
    pub(crate) fn keep<'a>(&self, shards: impl Iterator<Item = &'a ShardKey>) -> Vec<bool> {
        if !self.held() {
            return shards.map(|_| false).collect();
        }
        let now = Instant::now();
        let mut state = self.state();
        if state.released.len() >= REMEMBERED {
            state.released.retain(|_, at| now.duration_since(*at) < HOT);
        }
        shards
            .map(|shard| {
                let last = state.released.insert(shard.clone(), now);
                last.is_some_and(|last| now.duration_since(last) < HOT)
            })
            .collect()
    }

    /// Claims were made: each token's row has this `seq`.
    pub(crate) fn claimed(&self, rows: impl Iterator<Item = (i64, i64)>) {
        let mut state = self.state();
        if state.seqs.len() >= REMEMBERED {
            // Claims that ended otherwise than by a batch acknowledgement (a release, a
            // failure, a lost lease): their rows are sought instead.
            state.seqs.clear();
        }
        state.seqs.extend(rows);
    }

    /// The `seq` of the row each of these tokens' claims holds, where known; forgotten.
    pub(crate) fn seqs(&self, tokens: impl Iterator<Item = i64>) -> Vec<Option<i64>> {
        let mut state = self.state();
        tokens.map(|token| state.seqs.remove(&token)).collect()
    }

    /// The chains of these shards were kept, each with its released row's `seq`.
    pub(crate) fn kept(&self, chains: Vec<(&ShardKey, i64)>) {
        if chains.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut state = self.state();
        for (shard, seq) in chains {
            if state.kept.len() < REMEMBERED {
                state.kept.insert(shard.clone(), (seq, now));
            }
        }
    }

    /// Deletes, in a task of its own, the chains this store kept that stayed idle for
    /// [`IDLE`] (every [`TIDY_EVERY`]), and every chain idle for [`SWEEP_EVERY`] (that
    /// often).
    pub(crate) fn tidy(&self, pool: &PgPool) {
        let now = Instant::now();
        self.watch_horizon(pool, now);
        let (idle, sweep) = {
            let mut state = self.state();
            if !due(&mut state.tidied, now, TIDY_EVERY) {
                return;
            }
            let mut idle = Vec::new();
            state.kept.retain(|shard, (seq, at)| {
                let stays = now.duration_since(*at) < IDLE;
                if !stays {
                    idle.push((shard.clone(), *seq));
                }
                stays
            });
            let sweep = state
                .swept
                .is_none_or(|swept| now.duration_since(swept) >= SWEEP_EVERY);
            if sweep {
                state.swept = Some(now);
            }
            (idle, sweep)
        };
        let pool = pool.clone();
        tokio::spawn(async move {
            if let Err(error) = delete_idle(&pool, idle, sweep).await {
                tracing::debug!(%error, "deleting idle lease chains failed; the next pass retries");
            }
        });
    }

    /// Looks, in a task of its own and at most every [`HORIZON_EVERY`], whether the vacuum
    /// horizon is held.
    ///
    /// While it is not, every drain ends its shard's chain: the claim inserts one row and
    /// the release deletes it, which vacuum (or the next insert into the same index page)
    /// removes at once. While it is, a chain ended and begun anew at every drain of a busy
    /// shard would leave its first rows dead under the shard's key, each walked by the next
    /// claim's conflict check and newest-row seek: busy shards keep their chains then (two
    /// writes more a drain), and after it until vacuum has removed the rows it kept
    /// ([`still_held`]).
    fn watch_horizon(&self, pool: &PgPool, now: Instant) {
        if !due(&mut self.state().probed, now, HORIZON_EVERY) {
            return;
        }
        if self.looking.swap(true, Ordering::AcqRel) {
            return;
        }
        let (pool, held, looking) = (
            pool.clone(),
            Arc::clone(&self.held),
            Arc::clone(&self.looking),
        );
        tokio::spawn(async move {
            let was = held.load(Ordering::Acquire);
            match still_held(&pool, was, super::space::DEAD_HEAVY).await {
                Ok(now_held) => held.store(now_held, Ordering::Release),
                Err(error) => {
                    tracing::debug!(%error, "could not read the vacuum horizon; chains are kept");
                    held.store(true, Ordering::Release);
                }
            }
            looking.store(false, Ordering::Release);
        });
    }
}

/// Whether a pass done `every` so often, last at `last`, is due `now`; if so, it is done now.
fn due(last: &mut Option<Instant>, now: Instant, every: Duration) -> bool {
    if last.is_some_and(|at| now.duration_since(at) < every) {
        return false;
    }
    *last = Some(now);
    true
}

/// Whether the oldest holder of the vacuum horizon is [`HELD_BEHIND`] transactions behind or
/// more.
pub(crate) async fn horizon_held(pool: &PgPool) -> Result<bool, sqlx::Error> {
    let oldest: Option<(String, Option<i64>, Option<i64>)> =
        sqlx::query_as(super::HORIZON).fetch_optional(pool).await?;
    Ok(oldest.is_some_and(|(_, _, behind)| behind.is_some_and(|behind| behind >= HELD_BEHIND)))
}

/// Whether the horizon is held ([`horizon_held`]), or was (`was`) and the outbox's tables
/// still hold more than `dead` rows it kept (beyond four times their live ones): until
/// vacuum has removed them, the first scans to meet them would walk each one, so chains and
/// positions stay as they were during the hold. After a 15-minute hold, claims made in the
/// seconds after its end walked millions of them (2.4 s for 342 shards).
async fn still_held(pool: &PgPool, was: bool, dead: i64) -> Result<bool, sqlx::Error> {
    if horizon_held(pool).await? {
        return Ok(true);
    }
    if !was {
        return Ok(false);
    }
    super::space::dead_heavy(pool, dead).await
}

#[cfg(test)]
impl Leases {
    /// Looks whether the horizon is held now (or its dead rows are more than `dead`, if it
    /// was: [`still_held`]), once a look already running has ended, and stops looking by
    /// itself for an hour.
    pub(crate) async fn look_at_horizon_counting(&self, pool: &PgPool, dead: i64) {
        self.stop_looking().await;
        let held = still_held(pool, self.held(), dead)
            .await
            .expect("the horizon");
        self.held.store(held, Ordering::Release);
    }

    /// As [`Leases::look_at_horizon_counting`], with the relay's own count of dead rows.
    pub(crate) async fn look_at_horizon(&self, pool: &PgPool) {
        self.look_at_horizon_counting(pool, super::space::DEAD_HEAVY)
            .await;
    }

    /// Takes the horizon as held from here on, without looking: for tests of what a store
    /// does then that need no holder.
    pub(crate) async fn assume_held(&self) {
        self.stop_looking().await;
        self.held.store(true, Ordering::Release);
    }

    /// Stops looking by itself for an hour, once a look already running has ended.
    async fn stop_looking(&self) {
        self.state().probed = Some(Instant::now() + Duration::from_secs(3600));
        while self.looking.load(Ordering::Acquire) {
            tokio::task::yield_now().await;
        }
    }

    /// Looks for the switch at the next claim, however recently it looked.
    pub(crate) async fn look_again(&self) {
        *self.looked.lock().await = None;
    }

    /// Deletes now the chains this store kept, as [`Leases::tidy`] does once they are idle.
    pub(crate) async fn tidy_now(&self, pool: &PgPool) -> Result<(), sqlx::Error> {
        let idle: Vec<(ShardKey, i64)> = self
            .state()
            .kept
            .drain()
            .map(|(shard, (seq, _))| (shard, seq))
            .collect();
        delete_idle(pool, idle, false).await
    }
}

async fn delete_idle(
    pool: &PgPool,
    idle: Vec<(ShardKey, i64)>,
    sweep: bool,
) -> Result<(), sqlx::Error> {
    if !idle.is_empty() {
        let (scopes, identifiers, destinations) = shard_arrays(idle.iter().map(|(shard, _)| shard));
        let seqs: Vec<i64> = idle.iter().map(|(_, seq)| *seq).collect();
        sqlx::query(TIDY)
            .bind(scopes)
            .bind(identifiers)
            .bind(destinations)
            .bind(seqs)
            .execute(pool)
            .await?;
    }
    if sweep {
        let idle_ms = i64::try_from(SWEEP_EVERY.as_millis()).unwrap_or(i64::MAX);
        sqlx::query(SWEEP)
            .bind(idle_ms)
            .bind(10_000_i64)
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// Makes the switch to the log if no live relay speaks protocol 1: whether it is made (now or
/// before).
async fn switch(pool: &PgPool) -> Result<bool, sqlx::Error> {
    let made: Option<i32> = sqlx::query_scalar("SELECT version FROM outbox_protocol")
        .fetch_optional(pool)
        .await?;
    if made.is_some_and(|version| version >= 2) {
        return Ok(true);
    }
    let mut tx = pool.begin().await?;
    // Never queue behind a long transaction of an older relay: the next look retries.
    sqlx::query("SET LOCAL lock_timeout = '2s'")
        .execute(&mut *tx)
        .await?;
    // Older relays' claims wait until the switch commits, then find it.
    let locked = sqlx::query("LOCK TABLE outbox_shards IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await;
    if let Err(error) = locked {
        if lock_not_available(&error) {
            return Ok(false);
        }
        return Err(error);
    }
    let switched = sqlx::query(SWITCH)
        .fetch_optional(&mut *tx)
        .await?
        .is_some();
    if !switched {
        // Made meanwhile by another relay (whose lock this one waited for), or not yet.
        let made: Option<i32> = sqlx::query_scalar("SELECT version FROM outbox_protocol")
            .fetch_optional(&mut *tx)
            .await?;
        return Ok(made.is_some_and(|version| version >= 2));
    }
    for sql in [MOVE_LEASES, DROP_LEASE_ROWS, CLEAR_LEASES] {
        sqlx::query(sql).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(true)
}

#[cfg(test)]
pub(crate) mod tests;
