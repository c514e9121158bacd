//! # outbox in a service
//!
//! An HTTP service on PostgreSQL that runs the relay beside its API:
//!
//! - `POST /orders` (`{"total_cents": 1250}`) inserts an order and, in the same transaction,
//!   an `OrderPlaced` outbox message; the relay delivers it after commit to a handler that
//!   books the shipment (a row in `shipments`).
//! - `GET /healthz` is the liveness probe (200 while the relay's loop runs) and `GET /readyz`
//!   the readiness probe (200 while it runs and the database answers), each with the
//!   relay's `Health` as JSON.
//! - SIGTERM (or Ctrl-C) stops both gracefully: the server finishes its requests, the relay
//!   its shards in flight, and the process exits 0.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1/shop cargo run -p service -- --listen 127.0.0.1:8080
//! curl -X POST -H 'content-type: application/json' -d '{"total_cents":1250}' localhost:8080/orders
//! curl localhost:8080/readyz
//! ```

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State as Extract;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use outbox_core::{
    BoxError, Delivery, Health, Message, Registry, Relay, State, outbox_category, outbox_handler,
    outbox_scope, shutdown_signal,
};
use outbox_postgres::PgStore;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::watch;

/// The service's settings.
#[derive(Debug, Parser)]
struct Args {
    /// The PostgreSQL database.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Where to serve HTTP.
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
}

/// Orders are sharded by customer; here, every order is its own shard.
#[outbox_scope(id = 1)]
struct Orders;

/// An order was placed: book its shipment.
#[outbox_category(scope = Orders, id = 1, max_attempts = 10)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrderPlaced {
    total_cents: i64,
}

/// Books the shipment of a placed order, once however often it is delivered.
#[outbox_handler]
async fn book_shipment(
    delivery: Delivery<OrderPlaced>,
    State(pool): State<PgPool>,
) -> Result<(), BoxError> {
    let order_id = i64::try_from(delivery.object_identifier)?;
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
}

#[derive(Debug, Deserialize)]
struct NewOrder {
    total_cents: i64,
}

/// Inserts the order and its outbox message in one transaction: both, or neither.
async fn place_order(
    Extract(app): Extract<App>,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<Value>), (StatusCode, String)> {
    let failed =
        |error: &dyn std::fmt::Display| (StatusCode::INTERNAL_SERVER_ERROR, error.to_string());
    let mut tx = app.pool.begin().await.map_err(|e| failed(&e))?;
    let (id,): (i64,) = sqlx::query_as("INSERT INTO orders (total_cents) VALUES ($1) RETURNING id")
        .bind(order.total_cents)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| failed(&e))?;
    let placed = OrderPlaced {
        total_cents: order.total_cents,
    };
    let message = Message::new::<OrderPlaced>(id, id, &placed).map_err(|e| failed(&e))?;
    outbox_postgres::write(&mut *tx, &message)
        .await
        .map_err(|e| failed(&e))?;
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
        "database_reachable": health.database_reachable,
        "database_error": health.database_error,
        "shards_in_flight": health.shards_in_flight,
        "last_claim_at": seconds(health.last_claim_at),
        "last_ack_at": seconds(health.last_ack_at),
        "oldest_due_lag_ms": health.oldest_due_lag.map(|lag| lag.as_millis()),
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

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let args = Args::parse();
    let pool = outbox_postgres::connect(&args.database_url).await?;
    outbox_postgres::migrate(&pool).await?;
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
    let relay = Relay::new(PgStore::new(pool.clone()), registry);

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
        .with_state(App {
            pool: pool.clone(),
            relay,
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
