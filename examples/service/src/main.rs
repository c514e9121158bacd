//! # outbox in a service
//!
//! An HTTP service on PostgreSQL that runs the relay beside its API:
//!
//! - `POST /orders` (`{"total_cents": 1250}`) inserts an order and, in the same transaction,
//!   an `OrderPlaced` outbox message; the relay delivers it after commit to a handler that
//!   books the shipment (a row in `shipments`).
//! - The carrier insures parcels up to $10,000: the handler refuses an order above that
//!   (`{"total_cents": 1500000}`). The relay retries it with backoff (from
//!   `--backoff-initial-ms`, doubling; a retry is picked up at the next poll,
//!   `--poll-interval-ms`) and after 3 failed attempts (`max_attempts = 3`) sets it aside as
//!   a dead letter (`outbox dead-letters list`), while the other orders' shards flow.
//! - `GET /metrics` is the Prometheus scrape: the outbox's metrics
//!   ([`outbox::telemetry`]) through `metrics-exporter-prometheus`, its histograms as
//!   Prometheus histograms (`_bucket` series), its gauges refreshed at each scrape.
//!   `docs/grafana/outbox.json` is a Grafana dashboard over them (`docs/grafana/README.md`
//!   describes its panels).
//! - `GET /healthz` is the liveness probe (200 while the relay's loop runs) and `GET /readyz`
//!   the readiness probe (200 while it runs and the database answers), each with the
//!   relay's `Health` as JSON.
//! - SIGTERM (or Ctrl-C) stops both gracefully: the server finishes its requests, the relay
//!   its shards in flight, and the process exits 0.
//!
//! - `service outbox …` is the `outbox` command ([`outbox::cli`]) built into the service: it
//!   knows the service's names (`service outbox dead-letters list --category order_placed`).
//!
//! ```text
//! createdb -h 127.0.0.1 -U postgres shop
//! DATABASE_URL=postgres://postgres@127.0.0.1/shop cargo run -p service -- --listen 127.0.0.1:8080
//! curl -X POST -H 'content-type: application/json' -d '{"total_cents":1250}' localhost:8080/orders
//! curl localhost:8080/readyz
//! curl localhost:8080/metrics
//! DATABASE_URL=postgres://postgres@127.0.0.1/shop cargo run -p service -- outbox status
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State as Extract;
use axum::http::{StatusCode, header};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use outbox::postgres::PgStore;
use outbox::relay::Health;
use outbox::telemetry;
use outbox::{
    Backoff, BoxError, Delivery, Message, Registry, Relay, RelayConfig, State, outbox_category,
    outbox_handler, outbox_scope, shutdown_signal,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::watch;

/// The service's settings.
#[derive(Debug, Parser)]
#[command(
    name = "service",
    about = "An HTTP service that writes orders with their outbox and runs the relay",
    after_help = "The outbox command, knowing this service's names: `service outbox <COMMAND>` \
                  (`service outbox --help`)."
)]
struct Args {
    /// The PostgreSQL database (`postgres://user@host/database`).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Where to serve HTTP.
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// How long a shard whose delivery failed waits before its first retry, in milliseconds
    /// (doubling at each failure, up to an hour).
    #[arg(long, env = "BACKOFF_INITIAL_MS", default_value_t = 2_000)]
    backoff_initial_ms: u64,
    /// How often the relay looks for due shards when no commit woke it (retries after a
    /// backoff are found this way), in milliseconds.
    #[arg(long, env = "POLL_INTERVAL_MS", default_value_t = 1_000)]
    poll_interval_ms: u64,
}

/// Orders are sharded by customer; here, every order is its own shard.
#[outbox_scope(id = 1)]
struct Orders;

/// An order was placed: book its shipment. A delivery the carrier refuses is retried with
/// backoff, and set aside as a dead letter after its third failure.
#[outbox_category(scope = Orders, id = 1, max_attempts = 3)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrderPlaced {
    total_cents: i64,
}

/// The most the carrier insures a parcel for: $10,000.
const INSURED_UP_TO_CENTS: i64 = 1_000_000;

/// Books the shipment of a placed order, once however often it is delivered; fails for an
/// order worth more than the carrier insures.
#[outbox_handler]
async fn book_shipment(
    delivery: Delivery<OrderPlaced>,
    State(pool): State<PgPool>,
) -> Result<(), BoxError> {
    let order_id = i64::try_from(delivery.object_identifier)?;
    let total = delivery.payload.total_cents;
    if total > INSURED_UP_TO_CENTS {
        let limit = INSURED_UP_TO_CENTS;
        return Err(format!(
            "the carrier insures up to {limit} cents, not order {order_id}'s {total}"
        )
        .into());
    }
    sqlx::query(
        "INSERT INTO shipments (order_id, total_cents) VALUES ($1, $2) \
         ON CONFLICT (order_id) DO NOTHING",
    )
    .bind(order_id)
    .bind(delivery.payload.total_cents)
    .execute(&pool)
    .await?;
    Ok(())
}

/// What the handlers of the HTTP routes share.
#[derive(Clone)]
struct App {
    pool: PgPool,
    relay: Relay<PgStore>,
    metrics: PrometheusHandle,
}

#[derive(Debug, Deserialize)]
struct NewOrder {
    total_cents: i64,
}

/// Inserts the order and its outbox message in one transaction: both, or neither. The
/// transaction is an `OutboxTransaction`: its commit wakes the relay on the order's shard.
async fn place_order(
    Extract(app): Extract<App>,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<Value>), (StatusCode, String)> {
    let failed =
        |error: &dyn std::fmt::Display| (StatusCode::INTERNAL_SERVER_ERROR, error.to_string());
    let mut tx = outbox::postgres::begin(&app.pool)
        .await
        .map_err(|e| failed(&e))?;
    let (id,): (i64,) = sqlx::query_as("INSERT INTO orders (total_cents) VALUES ($1) RETURNING id")
        .bind(order.total_cents)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| failed(&e))?;
    let placed = OrderPlaced {
        total_cents: order.total_cents,
    };
    let message = Message::new::<OrderPlaced>(id, id, &placed).map_err(|e| failed(&e))?;
    tx.write(&message).await.map_err(|e| failed(&e))?;
    tx.commit().await.map_err(|e| failed(&e))?;
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

fn seconds(at: Option<SystemTime>) -> Value {
    at.and_then(|at| at.duration_since(UNIX_EPOCH).ok())
        .map_or(Value::Null, |since| json!(since.as_secs()))
}

/// The relay's health as the probes' JSON body.
fn body(health: &Health) -> Json<Value> {
    Json(json!({
        "live": health.is_live(),
        "ready": health.is_ready(),
        "started": health.started,
        "database_reachable": health.database_reachable,
        "database_error": health.database_error,
        "shards_in_flight": health.shards_in_flight,
        "last_claim_at": seconds(health.last_claim_at),
        "last_ack_at": seconds(health.last_ack_at),
        "oldest_due_lag_ms": health.oldest_due_lag.map(|lag| lag.as_millis()),
        "open_breakers": health.open_breakers,
    }))
}

fn status(ok: bool) -> StatusCode {
    if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn healthz(Extract(app): Extract<App>) -> (StatusCode, Json<Value>) {
    let health = app.relay.health().await;
    (status(health.is_live()), body(&health))
}

async fn readyz(Extract(app): Extract<App>) -> (StatusCode, Json<Value>) {
    let health = app.relay.health().await;
    (status(health.is_ready()), body(&health))
}

/// The Prometheus scrape, its gauges read from the database just before: never staler than
/// the scrape. A failed read is logged and the last values are served.
async fn scrape(Extract(app): Extract<App>) -> ([(header::HeaderName, &'static str); 1], String) {
    if let Err(error) = app.relay.refresh_gauges().await {
        let error = outbox::error::error_chain(&error);
        tracing::warn!(%error, "refreshing the outbox's gauges failed; serving the last values");
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.render(),
    )
}

/// Seconds, from a millisecond up to an hour: handler durations, delivery lag (which grows
/// with a backlog or a backoff) and drain durations.
const SECONDS_BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];

/// Rows one drain acknowledged: none (a drain that failed or found its rows taken) up to the
/// shard row budget (1,000 by default).
const ROWS_BUCKETS: [f64; 11] = [
    0.0, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0,
];

/// Installs the Prometheus recorder, with buckets for the outbox's histograms (so that they
/// are Prometheus histograms, `_bucket` series that aggregate across instances, rather than
/// summaries), and gives it the metrics' descriptions.
fn install_metrics() -> Result<PrometheusHandle, BoxError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(telemetry::DRAIN_ROWS.into()), &ROWS_BUCKETS)?
        .install_recorder()?;
    telemetry::describe();
    Ok(handle)
}

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    if let Some(command) = args.nth(1)
        && command == "outbox"
    {
        // `service outbox …`: the outbox command, with the names this binary declares.
        return outbox::cli::main_from(
            std::iter::once("service outbox".into()).chain(args),
            &outbox::admin::Catalog::discovered(),
        );
    }
    let args = Args::parse();
    tracing_subscriber::fmt().with_env_filter("info").init();
    let served = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BoxError::from)
        .and_then(|runtime| runtime.block_on(serve(args)));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line: what failed and why, never a Debug dump (nor a password: the outbox's
            // errors show URLs redacted).
            tracing::error!("{}", outbox::error::error_chain(error.as_ref()));
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> Result<(), BoxError> {
    let prometheus = install_metrics()?;
    let pool = outbox::postgres::connect(&args.database_url).await?;
    outbox::postgres::migrate(&pool).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS orders (id BIGSERIAL PRIMARY KEY, total_cents BIGINT NOT NULL);
         CREATE TABLE IF NOT EXISTS shipments (order_id BIGINT PRIMARY KEY, total_cents BIGINT NOT NULL);",
    )
    .execute(&pool)
    .await?;
    let registry = Registry::builder()
        .discovered()
        .state(pool.clone())
        .build()?;
    let config = RelayConfig::builder()
        .backoff(Backoff::new(
            Duration::from_millis(args.backoff_initial_ms),
            Backoff::default().max,
        ))
        .poll_interval(Duration::from_millis(args.poll_interval_ms))
        .build()?;
    let relay = Relay::with_config(PgStore::new(pool.clone()), registry, config);

    // The recorder's upkeep: folds histogram samples into their buckets between scrapes.
    let upkeep = prometheus.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });

    // One signal, heard by the relay and the server.
    let (stop, stopping) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let stopped = |mut stopping: watch::Receiver<bool>| async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    };

    let background = relay.clone();
    let relay_task = tokio::spawn({
        let stopping = stopping.clone();
        async move { background.run(stopped(stopping)).await }
    });
    let app = Router::new()
        .route("/orders", post(place_order))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(scrape))
        .with_state(App {
            pool: pool.clone(),
            relay,
            metrics: prometheus,
        });
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(address = %args.listen, "serving");
    axum::serve(listener, app)
        .with_graceful_shutdown(stopped(stopping))
        .await?;
    let report = relay_task.await??;
    tracing::info!(?report, "stopped");
    pool.close().await;
    Ok(())
}
