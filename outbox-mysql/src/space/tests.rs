//! The rebuild of the outbox's sparse tables against a real MariaDB: a long transaction and
//! the rebuild stepped in a fixed order on their own connections, with no sleeps.

use outbox_testkit::mysql::MySqlTestDatabase;
use sqlx::{Connection, MySqlConnection, MySqlPool};

use super::{Rewrites, rebuild};

/// The least size the test rebuilds (the relay's is larger).
const LARGE: i64 = 1 << 20;

/// The size `outbox_messages` takes on disk.
async fn allocated(pool: &MySqlPool) -> i64 {
    sqlx::query_scalar(
        "SELECT CAST(s.ALLOCATED_SIZE AS SIGNED) FROM information_schema.INNODB_SYS_TABLESPACES s \
         WHERE s.NAME = CONCAT(DATABASE(), '/outbox_messages')",
    )
    .fetch_one(pool)
    .await
    .expect("the tablespace's size")
}

/// Waits until InnoDB lists no open transaction but the reader's own. It shows a list it
/// refreshes only when it was last read more than 100 ms before: read again and again, it
/// would still name a transaction that ended.
async fn until_no_transaction_is_listed(pool: &MySqlPool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.INNODB_TRX \
             WHERE trx_mysql_thread_id <> connection_id()",
        )
        .fetch_one(pool)
        .await
        .expect("the open transactions");
        assert!(
            open == 0 || std::time::Instant::now() < deadline,
            "{open} transactions still open"
        );
        if open == 0 {
            return;
        }
    }
}

fn rebuilds(rebuilt: &[&str], refused: &[&str]) -> Rewrites {
    let names = |names: &[&str]| names.iter().map(|name| (*name).to_owned()).collect();
    Rewrites {
        rewritten: names(rebuilt),
        refused: names(refused),
    }
}

/// `outbox_messages` that grew while a long transaction held back purge is rebuilt once it
/// ends, not while it is open (it read the table, as a dump does); not once larger than the
/// largest size allowed, nor again when rebuilt a moment ago; its pending messages stay.
#[tokio::test]
async fn a_sparse_message_table_is_rebuilt_once_no_long_transaction_is_open() {
    let database = MySqlTestDatabase::migrated().await;
    let pool = database.pool();
    let mut dump = MySqlConnection::connect(&database.url())
        .await
        .expect("connect");
    for statement in [
        "START TRANSACTION WITH CONSISTENT SNAPSHOT",
        "SELECT count(*) FROM outbox_messages",
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut dump)
            .await
            .expect(statement);
    }
    // 20,000 messages of a kilobyte each, acknowledged (deleted) while the dump is open, and
    // three pending after them.
    let insert = "INSERT INTO outbox_messages \
            (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
        SELECT 1, seq, '', 1, seq, JSON_OBJECT('text', REPEAT('x', 1000)) FROM seq_1_to_20000";
    sqlx::query(insert).execute(pool).await.expect(insert);
    let mut pending = Vec::new();
    for object in 1..=3_i64 {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO outbox_messages \
                (shard_scope, shard_identifier, destination, category, object_identifier, \
                 payload) \
             VALUES (1, 0, '', 1, ?, '{}') RETURNING id",
        )
        .bind(object)
        .fetch_one(pool)
        .await
        .expect("a pending message");
        pending.push(id);
    }
    sqlx::query("DELETE FROM outbox_messages WHERE shard_identifier > 0")
        .execute(pool)
        .await
        .expect("the messages are acknowledged");
    let grown = allocated(pool).await;
    assert!(grown > 16 * LARGE, "{grown}");

    assert_eq!(
        rebuild(pool, LARGE, 16, 1 << 40, 0, &[])
            .await
            .expect("rebuild"),
        rebuilds(&[], &["outbox_messages"]),
        "a transaction is open"
    );
    assert_eq!(
        rebuild(pool, LARGE, 16, LARGE, 0, &[])
            .await
            .expect("rebuild"),
        rebuilds(&[], &[]),
        "larger than the largest rebuilt"
    );
    let recent = ["outbox_messages".to_owned()];
    assert_eq!(
        rebuild(pool, LARGE, 16, 1 << 40, 0, &recent)
            .await
            .expect("rebuild"),
        rebuilds(&[], &[]),
        "rebuilt a moment ago"
    );
    sqlx::raw_sql("COMMIT")
        .execute(&mut dump)
        .await
        .expect("the dump ends");
    until_no_transaction_is_listed(pool).await;
    assert_eq!(
        rebuild(pool, LARGE, 16, 1 << 40, 0, &[])
            .await
            .expect("rebuild"),
        rebuilds(&["outbox_messages"], &[])
    );
    let rebuilt = allocated(pool).await;
    assert!(rebuilt < grown / 4, "{rebuilt} of {grown}");
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_messages ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("the pending messages");
    assert_eq!(left, pending);
}
