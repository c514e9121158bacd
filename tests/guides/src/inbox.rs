//! `docs/inbox.md`: a consumer's inbox.

use std::time::Duration;

use outbox::{BoxError, Delivery, outbox_category, outbox_scope};
use outbox::sqlite::SqliteStore;
use sqlx::{SqliteConnection, SqlitePool};

#[outbox_scope(id = 2)]
struct Shop;

#[outbox_category(scope = Shop, id = 10)]
#[derive(serde::Serialize, serde::Deserialize)]
struct OrderPlaced {
    order: i64,
    total_cents: i64,
}

async fn charge(_tx: &mut SqliteConnection, _order: &OrderPlaced) -> Result<(), BoxError> {
    Ok(())
}

/// Receiving by hand: the inbox in the consumer's transaction.
async fn receive(
    pool: SqlitePool,
    message_id: outbox::MessageId,
    order: OrderPlaced,
) -> Result<(), BoxError> {
    use outbox::inbox::{Inbox, Received};

    let mut tx = pool.begin().await?;
    if Inbox::new("billing").receive(&mut tx, message_id).await? == Received::First {
        charge(&mut tx, &order).await?;
    }
    tx.commit().await?;   // then, and only then, acknowledge the broker
    Ok(())
}

/// A consumer of NATS, its handler on the consumer's connection.
async fn consume(pool: SqlitePool, client: async_nats::Client) -> Result<(), BoxError> {
    use outbox::handler::with_connection;
    use outbox::inbox::{Consumer, Inbox};
    use outbox::nats::NatsConsumer;

    let charge = with_connection(|placed: Delivery<OrderPlaced>, conn: &mut SqliteConnection| {
        Box::pin(async move {
            sqlx::query("INSERT INTO charges (order_id, cents) VALUES (?1, ?2)")
                .bind(placed.payload.order)
                .bind(placed.payload.total_cents)
                .execute(conn)
                .await?;
            Ok::<_, BoxError>(())
        })
    });
    let billing = Consumer::builder(Inbox::new("billing"), SqliteStore::new(pool))
        .handle::<OrderPlaced, _>(charge)
        .max_attempts(10)
        .retention(Duration::from_secs(7 * 24 * 3600))
        .build()?;
    NatsConsumer::new(billing, "ORDERS", "billing")
        .run(client, outbox::shutdown_signal())
        .await?;
    Ok(())
}
