//! An `#[outbox_handler]` taking the claiming transaction's connection
//! (`Connection<'_, SqliteConnection>`) and a state, in `HandlerMode::InTransaction`: its write
//! commits with the acknowledgement, and a failing handler's write rolls back with it.

use outbox_core::{
    BoxError, Connection, Delivery, HandlerMode, Message, Registry, Relay, RelayConfig, State,
    outbox_category, outbox_handler, outbox_scope,
};
use outbox_sqlite::SqliteStore;
use outbox_testkit::sqlite::SqliteTestDatabase;
use serde::{Deserialize, Serialize};
use sqlx::SqliteConnection;

#[outbox_scope(id = 1)]
struct Organization;

#[outbox_category(scope = Organization, id = 1)]
#[derive(Serialize, Deserialize)]
struct Paid {
    amount: i64,
}

/// The payment whose handler fails after writing.
#[derive(Clone)]
struct FailOn(i64);

#[outbox_handler]
async fn record_payment(
    paid: Delivery<Paid>,
    mut conn: Connection<'_, SqliteConnection>,
    State(fail_on): State<FailOn>,
) -> Result<(), BoxError> {
    sqlx::query("INSERT INTO payments (id, amount) VALUES (?, ?)")
        .bind(i64::try_from(paid.object_identifier)?)
        .bind(paid.payload.amount)
        .execute(&mut *conn)
        .await?;
    if paid.object_identifier == fail_on.0 {
        return Err("failing after writing: the write rolls back".into());
    }
    Ok(())
}

#[tokio::test]
async fn the_connection_argument_writes_in_the_claiming_transaction() {
    let database = SqliteTestDatabase::migrated().await;
    let pool = database.pool();
    sqlx::query("CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
        .execute(pool)
        .await
        .expect("create payments");
    for (object, amount) in [(1, 10), (2, 20)] {
        outbox_sqlite::write(
            pool,
            &Message::new::<Paid>(5, object, &Paid { amount }).unwrap(),
        )
        .await
        .expect("write");
    }
    let registry = Registry::builder()
        .discovered()
        .state(FailOn(2))
        .build()
        .expect("registry");
    let config = RelayConfig::builder()
        .handler_mode(HandlerMode::InTransaction)
        .build()
        .expect("config");
    let report = Relay::with_config(SqliteStore::new(pool.clone()), registry, config)
        .drain()
        .await
        .expect("drain");
    assert_eq!(report.deliveries, 1, "{report:?}");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    let payments: Vec<(i64, i64)> = sqlx::query_as("SELECT id, amount FROM payments ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("read payments");
    assert_eq!(
        payments,
        [(1, 10)],
        "the first write committed, the failed one rolled back"
    );
}
