//! The inbox (S10b) on both backends: a message is `First` once per consumer, in the
//! consumer's own transaction, and its record commits or rolls back with the effect; two
//! transactions racing on one id never both see `First`; retention deletes a consumer's old
//! records only.

use std::time::Duration;

use outbox_core::MessageId;
use outbox_core::inbox::{Inbox, Received};
use outbox_testkit::postgres::PgDatabase;
use outbox_testkit::sqlite::SqliteFile;
use outbox_testkit::sqlx::SqlxTestDatabase;

macro_rules! inbox_tests {
    ($module:ident, $provision:ty, age_the_first_records: $age:literal) => {
        mod $module {
            use super::*;

            type Database = SqlxTestDatabase<$provision>;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_message_is_first_once_per_consumer() {
                let database = Database::migrated().await;
                let billing = Inbox::new("billing");
                let mut tx = database.pool().begin().await.expect("begin");
                assert_eq!(
                    billing
                        .receive(&mut tx, MessageId(1))
                        .await
                        .expect("receive"),
                    Received::First
                );
                assert_eq!(
                    billing
                        .receive(&mut tx, MessageId(1))
                        .await
                        .expect("receive"),
                    Received::Duplicate,
                    "in its own transaction too"
                );
                tx.commit().await.expect("commit");

                let mut connection = database.pool().acquire().await.expect("a connection");
                assert_eq!(
                    billing
                        .receive(&mut *connection, MessageId(1))
                        .await
                        .expect("receive"),
                    Received::Duplicate
                );
                assert_eq!(
                    billing
                        .receive(&mut *connection, MessageId(2))
                        .await
                        .expect("receive"),
                    Received::First
                );
                assert_eq!(
                    Inbox::new("search")
                        .receive(&mut *connection, MessageId(1))
                        .await
                        .expect("receive"),
                    Received::First,
                    "each consumer has an inbox of its own"
                );
            }

            /// A handler that fails rolls its transaction back: the record goes with the
            /// effect, and the message is `First` again when it is delivered again.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_record_rolls_back_with_the_effect() {
                let database = Database::migrated().await;
                database
                    .execute("CREATE TABLE charges (order_id BIGINT PRIMARY KEY)")
                    .await;
                let billing = Inbox::new("billing");
                let apply = |fail: bool| {
                    let pool = database.pool().clone();
                    let billing = billing.clone();
                    async move {
                        let mut tx = pool.begin().await.expect("begin");
                        if billing
                            .receive(&mut tx, MessageId(9))
                            .await
                            .expect("receive")
                            == Received::Duplicate
                        {
                            return Received::Duplicate;
                        }
                        sqlx::query("INSERT INTO charges (order_id) VALUES (9)")
                            .execute(&mut *tx)
                            .await
                            .expect("the effect");
                        if fail {
                            tx.rollback().await.expect("rollback");
                        } else {
                            tx.commit().await.expect("commit");
                        }
                        Received::First
                    }
                };
                assert_eq!(
                    apply(true).await,
                    Received::First,
                    "applied, then rolled back"
                );
                assert_eq!(
                    apply(false).await,
                    Received::First,
                    "delivered again: applied"
                );
                assert_eq!(apply(false).await, Received::Duplicate, "and only once");
                let charges: i64 = sqlx::query_scalar("SELECT count(*) FROM charges")
                    .fetch_one(database.pool())
                    .await
                    .expect("count");
                assert_eq!(charges, 1);
            }

            /// Two transactions record one id: the second waits for the first, then sees
            /// `Duplicate` if it committed, `First` if it rolled back.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_transactions_on_one_id_never_both_see_first() {
                for commit in [true, false] {
                    let database = Database::migrated().await;
                    let inbox = Inbox::new("billing");
                    let mut first = database.pool().begin().await.expect("begin");
                    assert_eq!(
                        inbox
                            .receive(&mut first, MessageId(7))
                            .await
                            .expect("receive"),
                        Received::First
                    );
                    let mut second = database.pool().begin().await.expect("begin");
                    let racing = {
                        let inbox = inbox.clone();
                        tokio::spawn(async move {
                            let received = inbox.receive(&mut second, MessageId(7)).await;
                            (received, second)
                        })
                    };
                    super::Waiting::until_waiting(&database).await;
                    if commit {
                        first.commit().await.expect("commit");
                    } else {
                        first.rollback().await.expect("rollback");
                    }
                    let (received, second) = racing.await.expect("the second transaction");
                    assert_eq!(
                        received.expect("receive"),
                        if commit {
                            Received::Duplicate
                        } else {
                            Received::First
                        },
                        "the first transaction committed: {commit}"
                    );
                    second.commit().await.expect("commit");
                    let records: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_inbox")
                        .fetch_one(database.pool())
                        .await
                        .expect("count");
                    assert_eq!(records, 1);
                }
            }

            /// Retention deletes a consumer's records older than its window, and only its
            /// own; a message delivered again after its record is gone is applied again.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retention_deletes_a_consumers_old_records() {
                let database = Database::migrated().await;
                let billing = Inbox::new("billing");
                let search = Inbox::new("search");
                let mut connection = database.pool().acquire().await.expect("a connection");
                for (inbox, id) in [(&billing, 1), (&billing, 2), (&search, 1)] {
                    assert_eq!(
                        inbox
                            .receive(&mut *connection, MessageId(id))
                            .await
                            .expect("receive"),
                        Received::First
                    );
                }
                // Message 1's records were received two hours ago.
                database.execute($age).await;
                let purged = billing
                    .purge_older_than(&mut *connection, Duration::from_secs(3_600))
                    .await
                    .expect("purge");
                assert_eq!(purged, 1, "billing's record of message 1 only");
                let received = |inbox: &Inbox, id: i64| {
                    let inbox = inbox.clone();
                    let pool = database.pool().clone();
                    async move {
                        let mut connection = pool.acquire().await.expect("a connection");
                        inbox
                            .receive(&mut *connection, MessageId(id))
                            .await
                            .expect("receive")
                    }
                };
                assert_eq!(received(&billing, 2).await, Received::Duplicate);
                assert_eq!(
                    received(&search, 1).await,
                    Received::Duplicate,
                    "search's own window"
                );
                assert_eq!(
                    received(&billing, 1).await,
                    Received::First,
                    "after its window, a message is applied again: the window must outlast \
                     redelivery"
                );
            }
        }
    };
}

inbox_tests!(postgres, PgDatabase, age_the_first_records:
    "UPDATE outbox_inbox SET received_at = now() - interval '2 hours' WHERE message_id = 1");
inbox_tests!(sqlite, SqliteFile, age_the_first_records:
    "UPDATE outbox_inbox SET received_at = received_at - 7200000 WHERE message_id = 1");

/// Waits until a second transaction waits for the first one's record: on PostgreSQL, until
/// the server reports it waiting for a lock; on SQLite, whose writers take the database's one
/// write lock in turn, there is nothing to observe.
trait Waiting {
    async fn until_waiting(&self);
}

impl Waiting for SqlxTestDatabase<PgDatabase> {
    async fn until_waiting(&self) {
        for _ in 0..500 {
            let waiting: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock' \
                    AND query LIKE 'INSERT INTO outbox_inbox%')",
            )
            .fetch_one(self.pool())
            .await
            .expect("pg_stat_activity");
            if waiting {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the second transaction never waited for the first");
    }
}

impl Waiting for SqlxTestDatabase<SqliteFile> {
    async fn until_waiting(&self) {
        // Nothing to observe: SQLite does not report a connection waiting on its busy
        // handler. Whether the second statement ran before the first transaction ends or
        // after, it must not see `First` while the first's record commits.
        tokio::task::yield_now().await;
    }
}

/// Each receive is counted for its consumer, and each duplicate too.
#[test]
fn receives_and_duplicates_are_counted_per_consumer() {
    let ((), telemetry) = outbox_testkit::telemetry::capture(|_| async {
        let database = SqlxTestDatabase::<SqliteFile>::migrated().await;
        let mut connection = database.pool().acquire().await.expect("a connection");
        for (consumer, id) in [
            ("billing", 1),
            ("billing", 1),
            ("billing", 2),
            ("search", 1),
        ] {
            let _ = Inbox::new(consumer)
                .receive(&mut *connection, MessageId(id))
                .await
                .expect("receive");
        }
    });
    let count = |name, consumer| telemetry.counter(name, &[("consumer", consumer)]);
    use outbox_core::telemetry::{INBOX_DUPLICATES, INBOX_RECEIVED};
    assert_eq!(count(INBOX_RECEIVED, "billing"), 3);
    assert_eq!(count(INBOX_DUPLICATES, "billing"), 1);
    assert_eq!(count(INBOX_RECEIVED, "search"), 1);
    assert_eq!(count(INBOX_DUPLICATES, "search"), 0);
}
