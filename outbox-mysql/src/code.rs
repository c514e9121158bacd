//! MariaDB's error numbers the outbox reads, and how it reads one.

use sqlx::error::DatabaseError;
use sqlx::mysql::MySqlDatabaseError;

/// `ER_NO_SUCH_TABLE`.
pub(crate) const NO_SUCH_TABLE: u16 = 1146;
/// `ER_BAD_FIELD_ERROR`: an unknown column.
pub(crate) const BAD_FIELD: u16 = 1054;
/// `ER_UNKNOWN_SEQUENCES`: the lease tokens' sequence is missing.
pub(crate) const UNKNOWN_SEQUENCE: u16 = 4091;
/// `ER_DUP_ENTRY`: another claim created the shard's state row first.
pub(crate) const DUPLICATE: u16 = 1062;
/// `ER_LOCK_WAIT_TIMEOUT`: another transaction holds the row a claim would create, or the
/// metadata lock a rebuild waits for (see `space`).
pub(crate) const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// `ER_BAD_DB_ERROR`: the database does not exist (yet).
pub(crate) const BAD_DB: u16 = 1049;
/// `ER_CON_COUNT_ERROR`, `ER_SERVER_SHUTDOWN`, `ER_QUERY_INTERRUPTED`,
/// `ER_CONNECTION_KILLED`: the server is full or going away.
pub(crate) const GOING_AWAY: [u16; 4] = [1040, 1053, 1317, 1927];

/// The error number of a MariaDB error.
pub(crate) fn number(error: &dyn DatabaseError) -> Option<u16> {
    error
        .try_downcast_ref::<MySqlDatabaseError>()
        .map(MySqlDatabaseError::number)
}
