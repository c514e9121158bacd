//! `cargo xtask chaos --inbox`: effectively once, end to end through a broker. Orders are
//! written to an orders database while its relay (a child process) publishes them to a
//! broker, and billing's consumers (two child processes) charge each order in billing's own
//! database through its inbox. Relays and consumers are killed with SIGKILL at random, and
//! the broker connection (a proxy every child goes through) is cut and restored. At the end
//! every order must be charged exactly once: none missing, none doubled, no dead letter.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use outbox_core::handler::{FromContext, Handler, HandlerContext};
use outbox_core::inbox::{Consumer, Inbox, InboxDatabase};
use outbox_core::{
    Backoff, BoxError, Category, CategoryId, Connection, Delivery, Message, Registry, Relay,
    RelayConfig,
};
use outbox_testkit::proxy::TcpProxy;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use sqlx::{SqliteConnection, SqlitePool};

use super::child::Processes;
use super::{Streams, pause};

/// The brokers the scenario runs through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Broker {
    /// NATS JetStream on 127.0.0.1:4222 (a durable pull consumer).
    Nats,
    /// Redis Streams on 127.0.0.1:6379 (a consumer group).
    Redis,
}

impl Broker {
    fn name(self) -> &'static str {
        match self {
            Self::Nats => "NATS JetStream",
            Self::Redis => "Redis Streams",
        }
    }

    fn address(self) -> &'static str {
        match self {
            Self::Nats => "127.0.0.1:4222",
            Self::Redis => "127.0.0.1:6379",
        }
    }

    fn arg(self) -> &'static str {
        match self {
            Self::Nats => "nats",
            Self::Redis => "redis",
        }
    }
}

/// An order placed: what billing charges.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Order {
    /// The order's number: 0, 1, 2…
    pub(crate) order: i64,
}

/// The orders' category.
pub(crate) struct OrderPlaced;

impl Category for OrderPlaced {
    type Scope = Streams;
    type Payload = Order;
    const ID: CategoryId = CategoryId(3);
    const NAME: &'static str = "order_placed";
    const COALESCE: bool = false;
}

/// The settings of one run.
pub(crate) struct InboxSettings {
    pub(crate) orders: i64,
    pub(crate) shards: i64,
    pub(crate) consumers: usize,
    /// How long the orders take to be written.
    pub(crate) window: Duration,
    /// Seconds between faults: uniform in this range.
    pub(crate) fault_every: (f64, f64),
    /// How long faults go on after the last order is written; then the system must settle
    /// before the deadline.
    pub(crate) faults_after_writes: Duration,
    pub(crate) deadline: Duration,
}

impl InboxSettings {
    pub(crate) fn new(short: bool, orders: u64) -> Self {
        let orders = if short { 2_000 } else { orders };
        let orders = i64::try_from(orders).unwrap_or(i64::MAX);
        Self {
            orders,
            shards: 200,
            consumers: 2,
            window: if short {
                Duration::from_secs(4)
            } else {
                Duration::from_secs(20)
            },
            fault_every: if short { (0.3, 1.0) } else { (0.5, 2.0) },
            faults_after_writes: Duration::from_secs(if short { 3 } else { 10 }),
            deadline: Duration::from_secs(90 + u64::try_from(orders / 100).unwrap_or(0)),
        }
    }
}

/// What a run on one broker came to.
#[derive(Debug)]
pub(crate) struct InboxOutcome {
    broker: Broker,
    orders: i64,
    charged: i64,
    missing: i64,
    doubled: i64,
    dead_letters: usize,
    /// Orders still in the orders outbox at the end: never published.
    unpublished: i64,
    /// Where the children's logs are, kept when the run failed.
    logs: Option<PathBuf>,
    relay_kills: u64,
    consumer_kills: u64,
    cuts: u64,
    crashes: Vec<String>,
    drain: Duration,
}

impl InboxOutcome {
    pub(crate) fn passed(&self) -> bool {
        self.missing == 0 && self.doubled == 0 && self.dead_letters == 0 && self.crashes.is_empty()
    }

    /// The outcome as a plain-text table, its verdict last.
    pub(crate) fn render(&self, seed: u64) -> String {
        let rows = [
            ("broker", self.broker.name().to_owned()),
            (
                "orders",
                format!(
                    "{}, all charged {:.1} s after the first was written",
                    self.orders,
                    self.drain.as_secs_f64()
                ),
            ),
            ("charges", self.charged.to_string()),
            ("relay kills", format!("{} (SIGKILL)", self.relay_kills)),
            (
                "consumer kills",
                format!("{} (SIGKILL)", self.consumer_kills),
            ),
            ("broker cuts", self.cuts.to_string()),
            ("missing", self.missing.to_string()),
            ("charged twice", self.doubled.to_string()),
            ("dead letters", self.dead_letters.to_string()),
            ("unpublished", self.unpublished.to_string()),
            ("crashes", self.crashes.len().to_string()),
            ("seed", seed.to_string()),
            (
                "verdict",
                if self.passed() {
                    "every order charged exactly once".to_owned()
                } else {
                    "FAILED".to_owned()
                },
            ),
        ];
        let mut text = String::from("\n");
        for (name, value) in rows {
            text.push_str(&format!("  {name:<16} {value}\n"));
        }
        for crash in &self.crashes {
            text.push_str(&format!("  crash: {crash}\n"));
        }
        if let Some(logs) = &self.logs {
            text.push_str(&format!("  logs kept in  {}\n", logs.display()));
        }
        text
    }
}

/// Options of the relay and consumer children.
#[derive(Debug, Clone, Args)]
pub(crate) struct InboxChildArgs {
    /// The broker.
    #[arg(long, value_enum)]
    broker: Broker,
    /// The broker's address, as the child reaches it (the proxy).
    #[arg(long)]
    address: String,
    /// The stream (NATS) or key prefix (Redis) of the run.
    #[arg(long)]
    stream: String,
    /// The SQLite file: orders' (relay) or billing's (consumer).
    #[arg(long)]
    database: PathBuf,
    /// Which member of the consumer group (consumers only).
    #[arg(long, default_value_t = 0)]
    slot: u32,
}

/// The SIGTERM every child stops on.
fn terminated() -> Result<impl Future<Output = ()> + Send, String> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|error| format!("cannot listen for SIGTERM: {error}"))?;
    Ok(async move {
        terminate.recv().await;
    })
}

fn log_to_stderr() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .init();
}

/// Opens a SQLite file of the run, retrying while another process holds it busy.
async fn open(path: &Path) -> Result<SqlitePool, String> {
    outbox_sqlite::connect(path)
        .await
        .map_err(|error| format!("opening {}: {error}", path.display()))
}

/// A NATS client through `address`, reconnecting quickly, connecting even while the proxy is
/// cut.
async fn nats(address: &str) -> Result<async_nats::Client, String> {
    async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .reconnect_delay_callback(|_| Duration::from_millis(100))
        .connect(address)
        .await
        .map_err(|error| format!("connecting to NATS: {error}"))
}

fn redis_client(address: &str) -> Result<redis::Client, String> {
    redis::Client::open(format!("redis://{address}"))
        .map_err(|error| format!("a Redis client: {error}"))
}

/// The orders relay child: publishes the orders to the broker until SIGTERM.
pub(crate) async fn relay(args: InboxChildArgs) -> Result<String, String> {
    log_to_stderr();
    let stop = terminated()?;
    let store = outbox_sqlite::SqliteStore::new(open(&args.database).await?);
    let registry = match args.broker {
        Broker::Nats => {
            let sink = outbox_nats::NatsSink::new(nats(&args.address).await?)
                .with_subject_prefix(&args.stream);
            Registry::builder().sink::<OrderPlaced, _>(sink)
        }
        Broker::Redis => {
            let client = redis_client(&args.address)?;
            let started = Instant::now();
            let sink = loop {
                match outbox_redis::RedisSink::connect(client.clone()).await {
                    Ok(sink) => break sink,
                    Err(error) if started.elapsed() < Duration::from_secs(30) => {
                        eprintln!("connecting to Redis: {error}; retrying");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(error) => return Err(format!("connecting to Redis: {error}")),
                }
            };
            Registry::builder().sink::<OrderPlaced, _>(sink.with_key_prefix(&args.stream))
        }
    }
    .build()
    .map_err(|error| format!("the registry: {error}"))?;
    let config = RelayConfig::builder()
        .worker_id(format!("inbox-relay-{}", std::process::id()))
        .lease(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(100))
        .max_concurrent_shards(4)
        .shutdown_deadline(Duration::from_secs(5))
        .build()
        .map_err(|error| format!("the relay configuration: {error}"))?;
    let report = Relay::with_config(store, registry, config)
        .run(stop)
        .await
        .map_err(|error| {
            format!(
                "the relay failed: {}",
                outbox_core::error::error_chain(&error)
            )
        })?;
    Ok(format!("{report:?}"))
}

/// Billing's handler: charges the order in the consumer's transaction (one row per charge),
/// pausing now and then so that kills land inside handlers too.
struct Charge {
    rng: std::sync::Mutex<StdRng>,
}

impl Handler<Delivery<OrderPlaced>> for Charge {
    async fn call(
        &self,
        delivery: Delivery<OrderPlaced>,
        cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        let mut conn = Connection::<SqliteConnection>::from_context(cx)?;
        sqlx::query("INSERT INTO charges (order_id, pid) VALUES (?1, ?2)")
            .bind(delivery.payload.order)
            .bind(i64::from(std::process::id()))
            .execute(&mut *conn)
            .await?;
        let pause = {
            let mut rng = self
                .rng
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            rng.random_ratio(1, 20)
                .then(|| Duration::from_micros(rng.random_range(0..3_000)))
        };
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        Ok(())
    }
}

/// A billing consumer child: charges orders until SIGTERM.
pub(crate) async fn consumer(args: InboxChildArgs) -> Result<String, String> {
    log_to_stderr();
    let stop = terminated()?;
    let store = outbox_sqlite::SqliteStore::new(open(&args.database).await?);
    let consumer = Consumer::builder(Inbox::new("billing"), store)
        .handle::<OrderPlaced, _>(Charge {
            rng: std::sync::Mutex::new(StdRng::seed_from_u64(u64::from(std::process::id()))),
        })
        .backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(500),
        ))
        .build()
        .map_err(|error| format!("the consumer: {error}"))?;
    let report = match args.broker {
        Broker::Nats => outbox_nats::NatsConsumer::new(consumer, &args.stream, "billing")
            .ack_wait(Duration::from_secs(2))
            .run(nats(&args.address).await?, stop)
            .await
            .map_err(|error| {
                format!("the consumer: {}", outbox_core::error::error_chain(&error))
            })?,
        Broker::Redis => outbox_redis::RedisConsumer::new(
            consumer,
            format!("{}:{}", args.stream, OrderPlaced::NAME),
            "billing",
            format!("billing-{}", args.slot),
        )
        .claim_after(Duration::from_secs(2))
        .run(redis_client(&args.address)?, stop)
        .await
        .map_err(|error| format!("the consumer: {error}"))?,
    };
    Ok(format!("{report:?}"))
}

/// The broker's side of a run: its stream, made for the run and deleted after it.
enum Stream {
    Nats(async_nats::jetstream::Context, String),
    Redis(redis::aio::MultiplexedConnection, String),
}

impl Stream {
    async fn create(broker: Broker, name: &str) -> Result<Self, String> {
        Ok(match broker {
            Broker::Nats => {
                let client = async_nats::connect(broker.address())
                    .await
                    .map_err(|error| format!("NATS on {}: {error}", broker.address()))?;
                let jetstream = async_nats::jetstream::new(client);
                jetstream
                    .create_stream(async_nats::jetstream::stream::Config {
                        name: name.to_owned(),
                        subjects: vec![format!("{name}.>")],
                        ..Default::default()
                    })
                    .await
                    .map_err(|error| format!("creating the stream: {error}"))?;
                Self::Nats(jetstream, name.to_owned())
            }
            Broker::Redis => {
                let connection = redis_client(broker.address())?
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|error| format!("Redis on {}: {error}", broker.address()))?;
                Self::Redis(connection, format!("{name}:{}", OrderPlaced::NAME))
            }
        })
    }

    async fn remove(self) {
        match self {
            Self::Nats(jetstream, name) => {
                let _ = jetstream.delete_stream(&name).await;
            }
            Self::Redis(mut connection, key) => {
                let _: Result<(), _> = redis::cmd("DEL")
                    .arg(&key)
                    .query_async(&mut connection)
                    .await;
            }
        }
    }
}

/// One run through `broker`.
pub(crate) async fn run(
    broker: Broker,
    settings: &InboxSettings,
    seed: u64,
) -> Result<InboxOutcome, String> {
    let work = tempfile::Builder::new()
        .prefix("outbox-chaos-inbox-")
        .tempdir()
        .map_err(|error| format!("cannot create a temporary directory: {error}"))?;
    let orders_file = work.path().join("orders.db");
    let billing_file = work.path().join("billing.db");
    let orders = open(&orders_file).await?;
    let billing = open(&billing_file).await?;
    for pool in [&orders, &billing] {
        outbox_sqlite::migrate(pool)
            .await
            .map_err(|error| format!("migrating: {error}"))?;
    }
    sqlx::query("CREATE TABLE charges (order_id INTEGER NOT NULL, pid INTEGER NOT NULL)")
        .execute(&billing)
        .await
        .map_err(|error| format!("creating the charges: {error}"))?;

    let name = format!("chaos_inbox_{}_{}", broker.arg(), std::process::id());
    let stream = Stream::create(broker, &name).await?;
    let proxy = TcpProxy::start(broker.address())
        .await
        .map_err(|error| format!("starting the proxy: {error}"))?;
    let address = proxy.addr().to_string();
    let child = |command: &'static str, database: PathBuf| {
        let address = address.clone();
        let name = name.clone();
        move |_: u32, slot: u32| -> Vec<OsString> {
            let mut args: Vec<OsString> = [
                command,
                "--broker",
                broker.arg(),
                "--address",
                &address,
                "--stream",
                &name,
                "--slot",
                &slot.to_string(),
                "--database",
            ]
            .map(Into::into)
            .to_vec();
            args.push(database.clone().into());
            args
        }
    };
    let logs = work.path().to_path_buf();
    let mut relays = Processes::new(
        "relay",
        logs.clone(),
        child("chaos-inbox-relay", orders_file),
    )?;
    let mut consumers = Processes::new(
        "consumer",
        logs,
        child("chaos-inbox-consumer", billing_file),
    )?;
    relays.spawn()?;
    for _ in 0..settings.consumers {
        consumers.spawn()?;
    }

    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let deadline = started + settings.deadline;
    let writer = tokio::spawn(write_orders(
        orders.clone(),
        settings.orders,
        settings.shards,
        settings.window,
    ));
    let proxy = Arc::new(proxy);
    let (mut relay_kills, mut consumer_kills, mut cuts) = (0, 0, 0);
    let mut next_fault = Instant::now() + pause(&mut rng, settings.fault_every);
    let mut written = false;
    let mut faults_until = None;
    let mut next_progress = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        relays.respawn_crashed()?;
        consumers.respawn_crashed()?;
        if !written && writer.is_finished() {
            written = true;
            faults_until = Some(Instant::now() + settings.faults_after_writes);
        }
        let charged = charged_orders(&billing).await?;
        if written && charged >= settings.orders {
            break;
        }
        if Instant::now() >= next_progress {
            next_progress = Instant::now() + Duration::from_secs(5);
            let unpublished = unpublished(&orders).await.unwrap_or(-1);
            eprintln!("chaos:   {charged} orders charged, {unpublished} not yet published");
        }
        if Instant::now() >= deadline {
            break;
        }
        if Instant::now() < next_fault || faults_until.is_some_and(|until| Instant::now() > until) {
            continue;
        }
        match rng.random_range(0..3) {
            0 => {
                relays.kill_one(&mut rng)?;
                relays.spawn()?;
                relay_kills += 1;
            }
            1 => {
                consumers.kill_one(&mut rng)?;
                consumers.spawn()?;
                consumer_kills += 1;
            }
            _ => {
                let away = Duration::from_millis(rng.random_range(200..1_500));
                eprintln!("chaos:   cutting the broker connection for {away:?}");
                proxy.cut();
                let proxy = Arc::clone(&proxy);
                tokio::spawn(async move {
                    tokio::time::sleep(away).await;
                    proxy.restore();
                });
                cuts += 1;
            }
        }
        next_fault = Instant::now() + pause(&mut rng, settings.fault_every);
    }
    let drain = started.elapsed();
    proxy.restore();
    // Late redeliveries (an ack lost to a kill) come within the ack wait: give them time to
    // show as charges if the inbox let them through.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut crashes = relays.shutdown(Duration::from_secs(15)).await?;
    crashes.extend(consumers.shutdown(Duration::from_secs(15)).await?);
    writer
        .await
        .map_err(|error| format!("the writer panicked: {error}"))??;
    let per_order: Vec<(i64, i64)> =
        sqlx::query_as("SELECT order_id, count(*) FROM charges GROUP BY order_id")
            .fetch_all(&billing)
            .await
            .map_err(|error| format!("reading the charges: {error}"))?;
    let counts: HashMap<i64, i64> = per_order.into_iter().collect();
    let store = outbox_sqlite::SqliteStore::new(billing.clone());
    let dead_letters = store
        .dead_letters(None, 1_000)
        .await
        .map_err(|error| format!("reading the dead letters: {error}"))?
        .len();
    let unpublished = unpublished(&orders).await?;
    stream.remove().await;
    let mut outcome = InboxOutcome {
        broker,
        orders: settings.orders,
        charged: counts.values().sum(),
        missing: (0..settings.orders)
            .filter(|order| !counts.contains_key(order))
            .count() as i64,
        doubled: counts.values().filter(|count| **count > 1).count() as i64,
        dead_letters,
        unpublished,
        logs: None,
        relay_kills,
        consumer_kills,
        cuts,
        crashes,
        drain,
    };
    outcome.logs = super::kept_unless(outcome.passed(), work);
    Ok(outcome)
}

/// How many orders wait in the orders outbox, not yet published.
async fn unpublished(orders: &SqlitePool) -> Result<i64, String> {
    sqlx::query_scalar("SELECT count(*) FROM outbox_messages")
        .fetch_one(orders)
        .await
        .map_err(|error| format!("counting the unpublished orders: {error}"))
}

/// How many distinct orders billing has charged.
async fn charged_orders(billing: &SqlitePool) -> Result<i64, String> {
    sqlx::query_scalar("SELECT count(DISTINCT order_id) FROM charges")
        .fetch_one(billing)
        .await
        .map_err(|error| format!("counting the charges: {error}"))
}

/// Writes orders 0..`orders` over `shards` shards, in transactions of 20, spread over
/// `window`.
async fn write_orders(
    pool: SqlitePool,
    orders: i64,
    shards: i64,
    window: Duration,
) -> Result<(), String> {
    const BATCH: i64 = 20;
    let batches = (orders + BATCH - 1) / BATCH;
    let pause = window / u32::try_from(batches.max(1)).unwrap_or(u32::MAX);
    for batch in 0..batches {
        let messages: Vec<Message> = (batch * BATCH..((batch + 1) * BATCH).min(orders))
            .map(|order| {
                Message::new::<OrderPlaced>(order % shards, order, &Order { order })
                    .map_err(|error| format!("an order: {error}"))
            })
            .collect::<Result<_, _>>()?;
        let mut tx = outbox_sqlite::begin(&pool)
            .await
            .map_err(|error| format!("beginning: {error}"))?;
        outbox_sqlite::write_all(&mut *tx, &messages)
            .await
            .map_err(|error| format!("writing orders: {error}"))?;
        tx.commit()
            .await
            .map_err(|error| format!("committing orders: {error}"))?;
        tokio::time::sleep(pause).await;
    }
    Ok(())
}
