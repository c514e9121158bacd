//! Giving back the space a long transaction leaves behind on MariaDB.
//!
//! While a transaction is open, InnoDB's purge removes no row deleted after its read view
//! began: the rows the relay acknowledges stay delete-marked in `outbox_messages` and its
//! indexes, and the table grows with the traffic. Once it ends, purge removes them, but the
//! pages go back to the table, not to the disk: the tablespace keeps the size the hold grew it
//! to (41 times its size before, after a 3-minute hold at 800 messages a second). Yet what it
//! holds alive is little: the messages not yet delivered, a state row per shard being drained
//! or failing.
//!
//! So a relay, at most every [`EVERY`](outbox_sqlx::space::EVERY) (from the first page of a
//! discovery sweep, in a task of its own), rebuilds a table of the outbox online (`ALTER TABLE
//! … FORCE, ALGORITHM = INPLACE, LOCK = NONE`: writers and the relay go on while it copies the
//! live rows) when all of these hold:
//!
//! - its tablespace is at least [`BLOATED`] and more than [`SPARSE`] times the size of its
//!   live rows (InnoDB's count, at most 256 bytes a row);
//! - `outbox_messages`' tablespace is at most [`LARGEST_MESSAGES`];
//! - no transaction on the server began a second ago or more ([`OLD`]): the rebuild's end
//!   waits for every transaction that read the table, and writers queue behind it meanwhile;
//!   and a transaction with an older read view that read the table after the rebuild would
//!   fail ("table definition has changed"), `mysqldump --single-transaction` among them;
//! - its lock is granted within a second (`lock_wait_timeout`): else the rebuild gives up,
//!   and the next pass tries again;
//! - this store has not rebuilt it within
//!   [`REWRITE_EVERY`](outbox_sqlx::space::REWRITE_EVERY): a table that a high rate makes this
//!   large in its steady state is not rebuilt again and again.
//!
//! The tablespace is found by its name, the database's and the table's joined by `/`: a
//! database whose name MariaDB encodes in file names (one with characters other than letters,
//! digits and `_`) has none found, and its tables are not rebuilt.

use std::sync::Arc;

use outbox_sqlx::space::{Passes, Rewrites};
use sqlx::{AssertSqlSafe, MySqlPool};

use crate::code::{self, number};

/// A tablespace this many times larger than its table's live rows, and at least [`BLOATED`],
/// is rebuilt.
pub(crate) const SPARSE: i64 = 16;

/// The least tablespace worth a rebuild.
pub(crate) const BLOATED: i64 = 8 << 20;

/// The largest tablespace of `outbox_messages` that is rebuilt: the rebuild reads it whole.
pub(crate) const LARGEST_MESSAGES: i64 = 1 << 30;

/// A transaction on the server that began this many seconds ago or more keeps the tables from
/// being rebuilt.
const OLD: i64 = 1;

/// The tables of the outbox sparse enough to be rebuilt ([module documentation](self)), each
/// with whether a transaction on the server (other than this session's) began that many
/// seconds ago or more. `?`: the least size, in bytes; how many times its live rows' size; the
/// largest `outbox_messages`; the seconds.
const SPARSE_TABLES: &str = "\
    SELECT t.TABLE_NAME, EXISTS (SELECT 1 FROM information_schema.INNODB_TRX x \
            WHERE x.trx_mysql_thread_id <> connection_id() \
                AND x.trx_started <= NOW() - INTERVAL p.old SECOND) \
    FROM (SELECT ? AS large, ? AS sparse, ? AS largest, ? AS old) AS p \
        JOIN information_schema.TABLES t \
        JOIN information_schema.INNODB_SYS_TABLESPACES s \
            ON s.NAME = CONCAT(t.TABLE_SCHEMA, '/', t.TABLE_NAME) \
    WHERE t.TABLE_SCHEMA = DATABASE() \
        AND t.TABLE_NAME IN ('outbox_messages', 'outbox_shards') \
        AND s.ALLOCATED_SIZE >= p.large \
        AND s.ALLOCATED_SIZE > p.sparse * (t.TABLE_ROWS + 100) * 256 \
        AND (t.TABLE_NAME <> 'outbox_messages' OR s.ALLOCATED_SIZE <= p.largest) \
    ORDER BY t.TABLE_NAME";

/// The giving back of one store (its clones share it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Space {
    passes: Arc<Passes>,
}

impl Space {
    /// Starts a pass in a task of its own, unless one ran within
    /// [`EVERY`](outbox_sqlx::space::EVERY) or is running.
    pub(crate) fn now_and_then(&self, pool: &MySqlPool) {
        let pool = pool.clone();
        self.passes.now_and_then(
            "the relay's user needs the ALTER privilege on outbox_messages and outbox_shards \
             to rebuild them",
            async move |recent| {
                rebuild(&pool, BLOATED, SPARSE, LARGEST_MESSAGES, OLD, &recent).await
            },
        );
    }
}

/// Rebuilds the tables of the outbox that are sparse ([module documentation](self)): a
/// tablespace of at least `large` bytes, more than `sparse` times their live rows, and
/// `outbox_messages`' at most `largest_messages`; not those in `recent`, and none while a
/// transaction that began `old` seconds ago or more is open.
pub(crate) async fn rebuild(
    pool: &MySqlPool,
    large: i64,
    sparse: i64,
    largest_messages: i64,
    old: i64,
    recent: &[String],
) -> Result<Rewrites, sqlx::Error> {
    let candidates: Vec<(String, bool)> = sqlx::query_as(SPARSE_TABLES)
        .bind(large)
        .bind(sparse)
        .bind(largest_messages)
        .bind(old)
        .fetch_all(pool)
        .await?;
    let mut rebuilds = Rewrites::default();
    for (table, held) in candidates {
        if recent.contains(&table) {
            continue;
        }
        if held {
            rebuilds.refused.push(table);
            continue;
        }
        // The name is one of the two in the statement above, from the catalog.
        let done = sqlx::query(AssertSqlSafe(format!(
            "SET STATEMENT lock_wait_timeout = 1 FOR \
             ALTER TABLE `{table}` FORCE, ALGORITHM = INPLACE, LOCK = NONE"
        )))
        .execute(pool)
        .await;
        match done {
            Ok(_) => rebuilds.rewritten.push(table),
            Err(error) if timed_out(&error) => rebuilds.refused.push(table),
            Err(error) => return Err(error),
        }
    }
    Ok(rebuilds)
}

/// Whether `error` is a lock wait that timed out (a metadata lock's too).
fn timed_out(error: &sqlx::Error) -> bool {
    error.as_database_error().and_then(number) == Some(code::LOCK_WAIT_TIMEOUT)
}

#[cfg(test)]
mod tests;
