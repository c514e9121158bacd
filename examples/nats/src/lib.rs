//! # Orders to NATS
//!
//! A shop writes each order and its `OrderPlaced` outbox message in one SQLite transaction;
//! the relay publishes the messages to NATS JetStream through `outbox-nats` and deletes each
//! only once JetStream acknowledged it. A consumer reads the stream and prints what it
//! receives: the order, and the headers every sink sends.
//!
//! ```text
//! cargo run -p nats-orders --bin publisher -- --orders 20   # NATS with JetStream on 127.0.0.1:4222
//! cargo run -p nats-orders --bin consumer                   # prints them, stops when idle
//! ```

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;
use outbox_core::sink::headers;
use outbox_core::{BoxError, DrainReport, Message, Registry, Relay, outbox_category, outbox_scope};
use outbox_nats::NatsSink;
use outbox_sqlite::SqliteStore;
use serde::{Deserialize, Serialize};

/// Orders are sharded by customer: one customer's orders are published in order.
#[outbox_scope(id = 1)]
pub struct Customer;

/// An order was placed. Every one is published (`coalesce = false`), in order per customer,
/// by the `NatsSink` given to the registry (`sink = NatsSink`).
#[outbox_category(scope = Customer, id = 1, coalesce = false, sink = NatsSink)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderPlaced {
    /// The order.
    pub order: i64,
    /// What it costs, in cents.
    pub total_cents: i64,
}

/// Where the example publishes: the stream `stream`, capturing subjects `stream.>`; the
/// orders go to `stream.order_placed`.
#[derive(Debug, Clone)]
pub struct Target {
    /// The NATS server.
    pub url: String,
    /// The stream's name, and its subjects' prefix.
    pub stream: String,
}

impl Target {
    /// JetStream, after creating the stream if it does not exist.
    pub async fn jetstream(&self) -> Result<jetstream::Context, BoxError> {
        let client = async_nats::connect(&self.url).await?;
        let jetstream = jetstream::new(client);
        jetstream
            .get_or_create_stream(stream::Config {
                name: self.stream.clone(),
                subjects: vec![format!("{}.>", self.stream)],
                ..Default::default()
            })
            .await?;
        Ok(jetstream)
    }
}

/// Writes `orders` orders for `customers` customers, each with its outbox message in the
/// same transaction, into a SQLite database in a temporary directory; then delivers them to
/// NATS with the relay, each acknowledged by JetStream before it is deleted.
pub async fn publish(
    target: &Target,
    orders: i64,
    customers: i64,
) -> Result<DrainReport, BoxError> {
    target.jetstream().await?;
    let dir = tempfile::tempdir()?;
    let pool = outbox_sqlite::connect(&dir.path().join("shop.db")).await?;
    outbox_sqlite::migrate(&pool).await?;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER NOT NULL, total_cents INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    for order in 1..=orders {
        let customer = order % customers.max(1) + 1;
        let placed = OrderPlaced {
            order,
            total_cents: 1_000 + order,
        };
        let mut tx = outbox_sqlite::begin(&pool).await?;
        sqlx::query("INSERT INTO orders (id, customer, total_cents) VALUES (?, ?, ?)")
            .bind(order)
            .bind(customer)
            .bind(placed.total_cents)
            .execute(&mut *tx)
            .await?;
        tx.write(&Message::new::<OrderPlaced>(customer, order, &placed)?)
            .await?;
        tx.commit().await?;
    }
    let client = async_nats::connect(&target.url).await?;
    let sink = NatsSink::new(client).with_subject_prefix(&target.stream);
    let registry = Registry::builder().discovered().state(sink).build()?;
    let relay = Relay::new(SqliteStore::new(pool.clone()), registry);
    let report = relay.drain().await?;
    pool.close().await;
    Ok(report)
}

/// One message as the consumer received it.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    /// The order.
    pub order: OrderPlaced,
    /// Its customer's shard (`Outbox-Shard`: `1:<customer>`).
    pub shard: String,
    /// The outbox message id (`Outbox-Message-Id`, also JetStream's `Nats-Msg-Id`).
    pub message_id: String,
}

/// Reads the stream from its start with an ephemeral consumer, calling `each` on every
/// message, until none has come for `idle`.
pub async fn consume(
    target: &Target,
    idle: Duration,
    mut each: impl FnMut(&Received),
) -> Result<Vec<Received>, BoxError> {
    let jetstream = target.jetstream().await?;
    let stream = jetstream.get_stream(&target.stream).await?;
    let consumer = stream
        .create_consumer(consumer::pull::Config {
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let mut received = Vec::new();
    while let Ok(Some(message)) = tokio::time::timeout(idle, messages.next()).await {
        let message = message?;
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|map| map.get(name))
                .map(|value| value.as_str().to_owned())
                .unwrap_or_default()
        };
        let one = Received {
            order: serde_json::from_slice(&message.payload)?,
            shard: header(headers::SHARD),
            message_id: header(headers::MESSAGE_ID),
        };
        each(&one);
        received.push(one);
        message.ack().await?;
    }
    Ok(received)
}
