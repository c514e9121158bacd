//! # Orders and billing: effectively once, end to end
//!
//! Two services, each with its own SQLite database, and the categories they share (this
//! library: in a real system, a crate both depend on).
//!
//! - **Orders** writes each order and its `OrderPlaced` outbox message in one transaction;
//!   its relay publishes the messages to NATS JetStream and deletes each once JetStream
//!   acknowledged it.
//! - **Billing** reads the stream through a durable consumer and charges each order in its
//!   own database. The charge and the inbox record of the message commit in one transaction,
//!   and JetStream is acknowledged only after that commit: a message delivered again (the
//!   relay restarted before its acknowledgement, billing crashed before its own) is found in
//!   the inbox and charged no second time.
//!
//! ```text
//! cargo run -p orders-billing --bin orders -- --orders 20    # NATS with JetStream on 127.0.0.1:4222
//! cargo run -p orders-billing --bin billing                  # charges them, stops when idle
//! ```

use std::path::Path;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use outbox::handler::with_connection;
use outbox::inbox::{ConsumeReport, Consumer, Inbox};
use outbox::nats::{NatsConsumer, NatsSink};
use outbox::sqlite::SqliteStore;
use outbox::{BoxError, Delivery, Message, Registry, Relay, outbox_category, outbox_scope};
use serde::{Deserialize, Serialize};
use sqlx::{SqliteConnection, SqlitePool};

/// Orders are sharded by customer: one customer's orders are published, and charged, in
/// order.
#[outbox_scope(id = 1)]
pub struct Customer;

/// An order was placed: billing charges it. Every one is published (`coalesce = false`).
#[outbox_category(scope = Customer, id = 1, coalesce = false)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderPlaced {
    /// The order.
    pub order: i64,
    /// Who placed it.
    pub customer: i64,
    /// What to charge, in cents.
    pub total_cents: i64,
}

/// Where the services meet: the JetStream stream `stream`, capturing subjects `stream.>`.
#[derive(Debug, Clone, clap::Args)]
pub struct Broker {
    /// The NATS server.
    #[arg(
        long,
        env = "NATS_URL",
        hide_env_values = true,
        default_value = "nats://127.0.0.1:4222"
    )]
    pub url: String,
    /// The JetStream stream, created if missing.
    #[arg(long, default_value = "orders")]
    pub stream: String,
}

impl Broker {
    /// A client of the server, the stream created if it does not exist.
    pub async fn connect(&self) -> Result<async_nats::Client, BoxError> {
        let client = outbox::nats::connect(&self.url, async_nats::ConnectOptions::new()).await?;
        jetstream::new(client.clone())
            .get_or_create_stream(stream::Config {
                name: self.stream.clone(),
                subjects: vec![format!("{}.>", self.stream)],
                ..Default::default()
            })
            .await?;
        Ok(client)
    }

    /// Deletes the stream (a test's clean-up).
    pub async fn delete_stream(&self) -> Result<(), BoxError> {
        let client = outbox::nats::connect(&self.url, async_nats::ConnectOptions::new()).await?;
        jetstream::new(client).delete_stream(&self.stream).await?;
        Ok(())
    }
}

/// Opens (creating it if missing) a service's SQLite database, with the outbox migrations
/// (the inbox's table among them) and the service's own table.
pub async fn open(path: &Path, table: &'static str) -> Result<SqlitePool, BoxError> {
    let pool = outbox::sqlite::connect(path).await?;
    outbox::sqlite::migrate(&pool).await?;
    sqlx::query(table).execute(&pool).await?;
    Ok(pool)
}

/// The orders service's database.
pub async fn orders_database(path: &Path) -> Result<SqlitePool, BoxError> {
    open(
        path,
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, customer INTEGER NOT NULL, \
         total_cents INTEGER NOT NULL)",
    )
    .await
}

/// The billing service's database: one `charges` row per charge.
pub async fn billing_database(path: &Path) -> Result<SqlitePool, BoxError> {
    open(
        path,
        "CREATE TABLE IF NOT EXISTS charges (order_id INTEGER NOT NULL, customer INTEGER NOT \
         NULL, cents INTEGER NOT NULL)",
    )
    .await
}

/// Places `count` new orders over `customers` customers: each order and its outbox message
/// in one transaction.
pub async fn place_orders(pool: &SqlitePool, count: i64, customers: i64) -> Result<(), BoxError> {
    let last: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM orders")
        .fetch_one(pool)
        .await?;
    for order in last + 1..=last + count {
        let placed = OrderPlaced {
            order,
            customer: order % customers.max(1),
            total_cents: 1_000 + order,
        };
        let mut tx = pool.begin().await?;
        sqlx::query("INSERT INTO orders (id, customer, total_cents) VALUES (?1, ?2, ?3)")
            .bind(placed.order)
            .bind(placed.customer)
            .bind(placed.total_cents)
            .execute(&mut *tx)
            .await?;
        let message = Message::new::<OrderPlaced>(placed.customer, placed.order, &placed)?;
        outbox::sqlite::write(&mut *tx, &message).await?;
        tx.commit().await?;
    }
    Ok(())
}

/// Publishes every pending order to the stream: drains the orders' outbox through a
/// `NatsSink`. Returns how many messages JetStream acknowledged.
pub async fn publish(pool: &SqlitePool, broker: &Broker) -> Result<u64, BoxError> {
    let sink = NatsSink::new(broker.connect().await?).with_subject_prefix(&broker.stream);
    let registry = Registry::builder().sink::<OrderPlaced, _>(sink).build()?;
    let report = Relay::new(SqliteStore::new(pool.clone()), registry)
        .drain()
        .await?;
    if let Some(failure) = report.failures.first() {
        return Err(format!("publishing failed: {failure:?}").into());
    }
    Ok(report.deliveries)
}

/// Billing's consumer on its database: each `OrderPlaced` charged in the transaction that
/// records it in the inbox `billing`.
pub fn billing(pool: &SqlitePool) -> Result<Consumer, BoxError> {
    let charge = with_connection(
        |placed: Delivery<OrderPlaced>, conn: &mut SqliteConnection| {
            Box::pin(async move {
                let order = placed.payload;
                sqlx::query("INSERT INTO charges (order_id, customer, cents) VALUES (?1, ?2, ?3)")
                    .bind(order.order)
                    .bind(order.customer)
                    .bind(order.total_cents)
                    .execute(conn)
                    .await?;
                Ok::<_, BoxError>(())
            })
        },
    );
    let consumer = Consumer::builder(Inbox::new("billing"), SqliteStore::new(pool.clone()))
        .handle::<OrderPlaced, _>(charge)
        .retention(Duration::from_secs(7 * 24 * 3600))
        .build()?;
    Ok(consumer)
}

/// Charges what the stream holds for billing's durable consumer `durable`, until no message
/// came for `idle` (or `stop` resolves).
pub async fn charge(
    pool: &SqlitePool,
    broker: &Broker,
    durable: &str,
    idle: Duration,
) -> Result<ConsumeReport, BoxError> {
    let client = broker.connect().await?;
    let counted = pool.clone();
    let stop = async move {
        // Idle: the charges stopped growing for `idle`.
        let mut seen = -1;
        loop {
            tokio::time::sleep(idle).await;
            let now: i64 = sqlx::query_scalar("SELECT count(*) FROM charges")
                .fetch_one(&counted)
                .await
                .unwrap_or(seen);
            if now == seen {
                return;
            }
            seen = now;
        }
    };
    let report = NatsConsumer::new(billing(pool)?, &broker.stream, durable)
        .run(client, stop)
        .await?;
    Ok(report)
}

/// Billing's charges: (order, cents), in the order charged.
pub async fn charges(pool: &SqlitePool) -> Result<Vec<(i64, i64)>, BoxError> {
    Ok(
        sqlx::query_as("SELECT order_id, cents FROM charges ORDER BY rowid")
            .fetch_all(pool)
            .await?,
    )
}
