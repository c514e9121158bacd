//! `outbox_mysql::connect`: what it refuses before connecting (never showing a password), what
//! an absent server is, what a migrated database holds, and the isolation level a caller's
//! transaction keeps.

use outbox_core::Error;
use outbox_testkit::mysql::MySqlTestDatabase;

#[tokio::test]
async fn other_schemes_and_unread_passwords_are_refused_without_the_password() {
    for (url, expected) in [
        ("postgres://app:hunter2@db/app", "outbox_postgres::connect"),
        ("sqlite://outbox.db", "outbox_sqlite::connect"),
        ("mysq://root:hunter2@db/app", "`mysql://` or `mariadb://`"),
        ("mysql://root@db/app?password=hunter2", "user-info"),
    ] {
        let error = outbox_mysql::connect(url).await.expect_err(url);
        let shown = error.to_string();
        assert!(
            matches!(error, Error::InvalidDatabaseUrl { .. }),
            "{url}: {error:?}"
        );
        assert!(shown.contains(expected), "{url}: {shown}");
        assert!(!shown.contains("hunter2"), "{url}: {shown}");
    }
}

#[tokio::test]
async fn a_server_that_does_not_answer_is_unavailable() {
    let error = outbox_mysql::connect("mysql://root:hunter2@127.0.0.1:1/app")
        .await
        .expect_err("nothing listens on port 1");
    assert!(error.is_unavailable(), "{error:?}");
    assert!(!error.to_string().contains("hunter2"), "{error}");
}

#[tokio::test]
async fn a_mariadb_url_opens_the_database() {
    let database = MySqlTestDatabase::migrated().await;
    let url = database.url().replacen("mysql://", "mariadb://", 1);
    let pool = outbox_mysql::connect(&url).await.expect("connect");
    let tables: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'outbox\\_%'",
    )
    .fetch_one(&pool)
    .await
    .expect("count the outbox tables");
    assert!(tables >= 8, "{tables} outbox tables");
}

#[tokio::test]
async fn malformed_json_is_refused_at_the_write() {
    let database = MySqlTestDatabase::migrated().await;
    let refused = sqlx::query(
        "INSERT INTO outbox_messages \
            (shard_scope, shard_identifier, category, object_identifier, payload) \
         VALUES (1, 1, 1, 1, '{not json')",
    )
    .execute(database.pool())
    .await
    .expect_err("a CHECK refuses it");
    assert!(
        refused.to_string().contains("outbox_messages_payload_json"),
        "{refused}"
    );
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_messages")
        .fetch_one(database.pool())
        .await
        .expect("count");
    assert_eq!(left, 0);
}

/// A caller's transaction (`outbox_mysql::begin`) runs at its session's isolation level, the
/// server's `REPEATABLE READ` here: it reads one snapshot throughout, and does not see a row
/// another connection commits meanwhile (at the relay's `READ COMMITTED` it would).
#[tokio::test]
async fn a_callers_transaction_keeps_its_sessions_isolation_level() {
    let database = MySqlTestDatabase::migrated().await;
    let pool = outbox_mysql::connect(&database.url())
        .await
        .expect("connect");
    let count = "SELECT COUNT(*) FROM outbox_pauses";
    let mut tx = outbox_mysql::begin(&pool).await.expect("begin");
    let before: i64 = sqlx::query_scalar(count)
        .fetch_one(&mut *tx)
        .await
        .expect("count");
    sqlx::query("INSERT INTO outbox_pauses (kind, shard_scope, paused_at) VALUES ('scope', 7, 0)")
        .execute(database.pool())
        .await
        .expect("another connection commits a row");
    let after: i64 = sqlx::query_scalar(count)
        .fetch_one(&mut *tx)
        .await
        .expect("count again");
    assert_eq!(after, before, "the transaction reads one snapshot");
    tx.commit().await.expect("commit");
}
