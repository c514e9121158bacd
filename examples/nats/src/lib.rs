//! # Orders to NATS
//!
//! A shop writes each order and its `OrderPlaced` outbox message in one SQLite transaction;
//! the relay publishes the messages to NATS JetStream through `outbox::nats` and deletes each
//! only once JetStream acknowledged it. A consumer reads the stream and prints what it
//! receives: the order, and the headers every sink sends.
//!
//! ```text
//! cargo run -p nats-orders --bin publisher -- --orders 20   # NATS with JetStream on 127.0.0.1:4222
//! cargo run -p nats-orders --bin consumer                   # prints them, stops when idle
//! ```
//!
//! Each run of the publisher is a new shop database (in a temporary directory), whose outbox
//! message ids start at 1 again: the publisher gives its sink a de-duplication prefix of its
//! own (the run's first order id), as several outbox databases publishing to one stream must,
//! or JetStream would take a second run's messages, within its duplicate window, for
//! redeliveries of the first run's and drop them.

use std::ops::RangeInclusive;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;
use outbox::nats::NatsSink;
use outbox::sink::{Publisher, headers};
use outbox::sqlite::SqliteStore;
use outbox::{BoxError, DrainReport, Message, Registry, Relay, outbox_category, outbox_scope};
use serde::{Deserialize, Serialize};

/// Orders are sharded by customer: one customer's orders are published in order.
#[outbox_scope(id = 1)]
pub struct Customer;

/// An order was placed. Every one is published (`coalesce = false`), in order per customer,
/// by the `NatsSink` [`publish`] registers for it, behind the run's de-duplication prefix.
#[outbox_category(scope = Customer, id = 1, coalesce = false)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderPlaced {
    /// The order.
    pub order: i64,
    /// What it costs, in cents.
    pub total_cents: i64,
}

/// Where the example publishes: the stream `stream`, capturing subjects `stream.>`; the
/// orders go to `stream.order_placed`. Both programs take it on their command line.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The NATS server.
    #[arg(
        long,
        env = "NATS_URL",
        hide_env_values = true,
        default_value = "nats://127.0.0.1:4222"
    )]
    pub url: String,
    /// The JetStream stream, created if missing, capturing the subjects `<STREAM>.>`.
    #[arg(long, default_value = "orders")]
    pub stream: String,
}

impl Target {
    /// JetStream, after creating the stream if it does not exist.
    pub async fn jetstream(&self) -> Result<jetstream::Context, BoxError> {
        let client = outbox::nats::connect(&self.url, async_nats::ConnectOptions::new()).await?;
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

    /// Deletes the stream and what it stored (a test's clean-up).
    pub async fn delete_stream(&self) -> Result<(), BoxError> {
        self.jetstream().await?.delete_stream(&self.stream).await?;
        Ok(())
    }

    /// The stream's last sequence number: how many messages it has stored, ever.
    pub async fn last_sequence(&self, jetstream: &jetstream::Context) -> Result<u64, BoxError> {
        let stream = jetstream.get_stream(&self.stream).await?;
        Ok(stream.cached_info().state.last_sequence)
    }
}

/// What one run of [`publish`] did.
#[derive(Debug)]
pub struct Published {
    /// The ids of the orders written, unique across runs (see [`publish`]).
    pub orders: RangeInclusive<i64>,
    /// The orders' messages JetStream acknowledged, over every drain of the run.
    pub deliveries: u64,
    /// The outbox rows deleted after JetStream's ack.
    pub rows_acknowledged: u64,
    /// How far the stream's last sequence advanced during the run: the messages JetStream
    /// stored. Fewer than [`deliveries`](Self::deliveries) means it dropped some as
    /// duplicates of message ids it had seen within its duplicate window; more, that another
    /// publisher wrote to the stream meanwhile.
    pub stored: u64,
    /// The run's last drain: its failures are why orders were left unpublished.
    pub last_drain: DrainReport,
}

impl Published {
    /// How many orders were written.
    pub fn written(&self) -> u64 {
        (self.orders.end() - self.orders.start() + 1).unsigned_abs()
    }

    /// Whether every order was published and JetStream stored as many messages.
    pub fn is_complete(&self) -> bool {
        self.last_drain.is_clean()
            && self.rows_acknowledged == self.written()
            && self.stored >= self.deliveries
    }
}

/// Writes `orders` orders for `customers` customers, each with its outbox message in the
/// same transaction, into a SQLite database in a temporary directory; then delivers them to
/// NATS with the relay, each acknowledged by JetStream before it is deleted, draining until
/// none is left or a drain fails.
///
/// The orders are numbered from the microseconds since the UNIX epoch when the run starts, and
/// the run ends only once the clock has passed its last number: a run that follows starts
/// above it (runs at the same time may overlap). The run's first order id is also its sink's
/// de-duplication prefix, so that JetStream tells its messages from another run's.
pub async fn publish(target: &Target, orders: u32, customers: u32) -> Result<Published, BoxError> {
    let jetstream = target.jetstream().await?;
    let sequence_before = target.last_sequence(&jetstream).await?;
    let dir = tempfile::tempdir()?;
    let pool = outbox::sqlite::connect(&dir.path().join("shop.db")).await?;
    outbox::sqlite::migrate(&pool).await?;
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER NOT NULL, total_cents INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    let first = now_micros()?;
    let ids = first..=first + i64::from(orders) - 1;
    for (n, order) in (1..).zip(ids.clone()) {
        let customer = order % i64::from(customers.max(1)) + 1;
        let placed = OrderPlaced {
            order,
            total_cents: 1_000 + n,
        };
        let mut tx = outbox::sqlite::begin(&pool).await?;
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
    while now_micros()? <= *ids.end() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    let client = outbox::nats::connect(&target.url, async_nats::ConnectOptions::new()).await?;
    let sink = NatsSink::new(client).with_subject_prefix(&target.stream);
    let publisher = Publisher::<OrderPlaced, _>::new(sink).dedup_prefix(format!("{first}-"));
    let registry = Registry::builder()
        .discovered()
        .publish(publisher)
        .build()?;
    let relay = Relay::new(SqliteStore::new(pool.clone()), registry);
    let (mut deliveries, mut rows_acknowledged) = (0, 0);
    let last_drain = loop {
        let report = relay.drain().await?;
        deliveries += report.deliveries;
        rows_acknowledged += report.rows_acknowledged;
        // A shard that used up its budget yields with rows left: drain again.
        if !report.rows_remain() || !report.is_clean() || report.deliveries == 0 {
            break report;
        }
    };
    pool.close().await;
    let stored = target
        .last_sequence(&jetstream)
        .await?
        .saturating_sub(sequence_before);
    Ok(Published {
        orders: ids,
        deliveries,
        rows_acknowledged,
        stored,
        last_drain,
    })
}

/// The microseconds since the UNIX epoch.
fn now_micros() -> Result<i64, BoxError> {
    Ok(i64::try_from(
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros(),
    )?)
}

/// One message as the consumer received it.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    /// The order.
    pub order: OrderPlaced,
    /// Its customer's shard (`Outbox-Shard`: `1:<customer>`).
    pub shard: String,
    /// The de-duplication key (`Outbox-Message-Id`, also JetStream's `Nats-Msg-Id`): the
    /// publisher run's prefix, then the outbox message id.
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
