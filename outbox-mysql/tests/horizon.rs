//! What holds back InnoDB's purge of the rows the outbox deleted: the oldest open transaction,
//! named by the status with since when, and the undo records waiting (the history list).

use std::time::{Duration, Instant};

use outbox_core::admin::{Admin, Horizon};
use outbox_mysql::MySqlStore;
use outbox_testkit::mysql::MySqlTestDatabase;
use sqlx::{Connection, MySqlConnection};

/// The horizon the status reports once `wanted` holds of it, or the last one read after 30 s.
///
/// Purge is the server's: another test's transaction, begun in the same second (the start
/// times' resolution), may be named first until it ends; and InnoDB shows a cached list of
/// transactions, refreshed only when it was last read more than 100 ms before (read more
/// often, it is never refreshed).
async fn horizon_once(
    store: &MySqlStore,
    wanted: impl Fn(&Option<Horizon>) -> bool,
) -> Option<Horizon> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let horizon = store.status(0).await.expect("status").horizon;
        if wanted(&horizon) || Instant::now() > deadline {
            return horizon;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A transaction with a consistent snapshot (as `mysqldump --single-transaction` takes) is
/// named by the status, and no longer once it commits.
#[tokio::test]
async fn status_names_the_oldest_open_transaction() {
    let database = MySqlTestDatabase::migrated().await;
    let store = MySqlStore::new(database.pool().clone());
    let mut report = MySqlConnection::connect(&database.url())
        .await
        .expect("connect");
    let id: u64 = sqlx::query_scalar("SELECT connection_id()")
        .fetch_one(&mut report)
        .await
        .expect("connection id");
    for statement in [
        "START TRANSACTION WITH CONSISTENT SNAPSHOT",
        "SELECT count(*) FROM outbox_messages",
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut report)
            .await
            .expect(statement);
    }
    let named = format!("connection {id} (");
    let ours = |horizon: &Option<Horizon>| {
        horizon
            .as_ref()
            .is_some_and(|horizon| horizon.holder.starts_with(&named))
    };
    let horizon = horizon_once(&store, ours)
        .await
        .expect("the oldest transaction");
    assert!(horizon.holder.starts_with(&named), "{horizon:?}");
    assert!(horizon.since.is_some(), "{horizon:?}");

    sqlx::raw_sql("COMMIT")
        .execute(&mut report)
        .await
        .expect("commit");
    let horizon = horizon_once(&store, |horizon| !ours(horizon)).await;
    assert!(!ours(&horizon), "{horizon:?}");
}
