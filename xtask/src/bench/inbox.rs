//! Scenario 15: a consumer through the inbox. 20,000 messages wait in a NATS JetStream stream,
//! as the NATS sink publishes them (its headers, the category's JSON); a consumer applies each
//! into a PostgreSQL database (an `INSERT` of the transfer), one transaction per message, and
//! acknowledges it (a double ack) after the commit. The engine is `NatsConsumer` with an
//! outbox `Consumer`: the handler's insert and the inbox record in that transaction, the
//! message decoded into the category's `Delivery`. The baseline is a hand-written loop with
//! the same client, the same pull batch and the same guarantee but the inbox's: it decodes the
//! payload, inserts, commits, acknowledges. Each runs twice, alternated, over a durable
//! consumer of its own; the best run of each counts. What the inbox costs a message is the
//! difference of their times per message.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, stream};
use futures_util::StreamExt;
use outbox_core::handler::with_connection;
use outbox_core::inbox::{Consumer, Inbox};
use outbox_core::sink::headers;
use outbox_core::{BoxError, Delivery};
use outbox_nats::NatsConsumer;
use outbox_postgres::PgStore;
use sqlx::{PgConnection, PgPool};
use tokio::sync::Notify;

use super::BenchArgs;
use super::report::{Row, Target};
use super::setup::{Server, Transfer, Transferred, failed};
use super::sinks::Pending;

const NATS: &str = "nats://127.0.0.1:4222";

/// The pull batch of both sides.
const BATCH: usize = 20;

/// Runs the scenario.
pub(crate) async fn run(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let messages = args.sized(20_000, 500);
    let database = server.database(8).await?;
    let pool = database.pool.clone();
    sqlx::query(
        "CREATE TABLE transfers (message_id BIGINT NOT NULL, account BIGINT NOT NULL, \
         amount BIGINT NOT NULL)",
    )
    .execute(&pool)
    .await
    .map_err(failed("creating the transfers"))?;
    let client = async_nats::connect(NATS)
        .await
        .map_err(failed("connecting to NATS"))?;
    let jetstream = jetstream::new(client.clone());
    let name = format!("outbox_bench_inbox_{}", std::process::id());
    jetstream
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            ..Default::default()
        })
        .await
        .map_err(failed("creating the stream"))?;
    let outcome = measure(&jetstream, &client, &name, &pool, messages).await;
    let _ = jetstream.delete_stream(&name).await;
    database.drop_database().await?;
    let (engine, baseline) = outcome?;
    let per_message = |seconds: f64| seconds / messages as f64 * 1e6;
    Ok(vec![
        Row::compared(
            "15. inbox: consumer, NATS → PostgreSQL",
            "messages/s",
            messages as f64 / engine,
            messages as f64 / baseline,
            Target::Ratio(0.8),
        ),
        Row::measured(
            "15. inbox: its cost per message",
            "µs",
            per_message(engine) - per_message(baseline),
            Target::None,
        ),
    ])
}

/// Publishes the messages, then runs each side twice, alternated: the best seconds of the
/// engine and of the baseline.
async fn measure(
    jetstream: &jetstream::Context,
    client: &async_nats::Client,
    stream: &str,
    pool: &PgPool,
    messages: u64,
) -> Result<(f64, f64), String> {
    publish(jetstream, stream, messages).await?;
    let (mut engine, mut baseline) = (f64::MAX, f64::MAX);
    for round in 0..2 {
        baseline = baseline
            .min(plain(jetstream, stream, &format!("plain-{round}"), pool, messages).await?);
        engine =
            engine.min(inbox(client, stream, &format!("inbox-{round}"), pool, messages).await?);
    }
    Ok((engine, baseline))
}

/// `messages` transfers as the NATS sink publishes them, each under its own message id.
async fn publish(
    jetstream: &jetstream::Context,
    stream: &str,
    messages: u64,
) -> Result<(), String> {
    let subject = format!("{stream}.transferred");
    let mut acks = Vec::with_capacity(1_000);
    for id in 1..=messages {
        let id = id as i64;
        let transfer = Transfer {
            account: id % 1_000,
            amount: id,
        };
        let pending = Pending {
            id,
            shard: id % 1_000,
            object: id,
            payload: serde_json::to_string(&transfer).map_err(failed("encoding a transfer"))?,
            created_at: "2026-11-28T12:00:00.000000Z".to_owned(),
        };
        let mut map = HeaderMap::new();
        for (name, value) in pending.headers() {
            map.insert(name, value.as_str());
        }
        let payload = pending.payload.into_bytes();
        acks.push(
            jetstream
                .publish_with_headers(subject.clone(), map, payload.into())
                .await
                .map_err(failed("publishing"))?,
        );
        if acks.len() == 1_000 || id == messages as i64 {
            for ack in acks.drain(..) {
                ack.await.map_err(failed("a publish's ack"))?;
            }
        }
    }
    Ok(())
}

/// The inbox's side: seconds to apply every message.
async fn inbox(
    client: &async_nats::Client,
    stream: &str,
    durable: &str,
    pool: &PgPool,
    messages: u64,
) -> Result<f64, String> {
    let applied = Arc::new((AtomicU64::new(0), Notify::new()));
    let counted = Arc::clone(&applied);
    let insert = with_connection(
        move |delivery: Delivery<Transferred>, conn: &mut PgConnection| {
            let counted = Arc::clone(&counted);
            Box::pin(async move {
                sqlx::query(
                    "INSERT INTO transfers (message_id, account, amount) VALUES ($1, $2, $3)",
                )
                .bind(delivery.message_id.0)
                .bind(delivery.payload.account)
                .bind(delivery.payload.amount)
                .execute(conn)
                .await?;
                // Counted before the commit: the loop stops at the next message, after this one's
                // commit and acknowledgement.
                counted.0.fetch_add(1, Ordering::Relaxed);
                counted.1.notify_one();
                Ok::<_, BoxError>(())
            })
        },
    );
    let consumer = Consumer::builder(Inbox::new(durable.to_owned()), PgStore::new(pool.clone()))
        .handle::<Transferred, _>(insert)
        .build()
        .map_err(failed("the consumer"))?;
    let started = Instant::now();
    let stop = async move {
        while applied.0.load(Ordering::Relaxed) < messages {
            applied.1.notified().await;
        }
    };
    let report = NatsConsumer::new(consumer, stream, durable)
        .batch(BATCH)
        .run(client.clone(), stop)
        .await
        .map_err(failed("the consumer"))?;
    let seconds = started.elapsed().as_secs_f64();
    if report.applied != messages {
        return Err(format!(
            "the inbox's consumer applied {} of {messages}",
            report.applied
        ));
    }
    Ok(seconds)
}

/// The baseline: a hand-written loop with the same client and batch, committing then
/// acknowledging each message.
async fn plain(
    jetstream: &jetstream::Context,
    stream: &str,
    durable: &str,
    pool: &PgPool,
    messages: u64,
) -> Result<f64, String> {
    let consumer: jetstream::consumer::PullConsumer = jetstream
        .get_stream(stream)
        .await
        .map_err(failed("the stream"))?
        .create_consumer(pull::Config {
            durable_name: Some(durable.to_owned()),
            ack_policy: AckPolicy::Explicit,
            ..pull::Config::default()
        })
        .await
        .map_err(failed("the durable consumer"))?;
    let started = Instant::now();
    let mut deliveries = consumer
        .stream()
        .max_messages_per_batch(BATCH)
        .messages()
        .await
        .map_err(failed("the messages"))?;
    for _ in 0..messages {
        let message = deliveries
            .next()
            .await
            .ok_or("the messages ended")?
            .map_err(failed("a message"))?;
        let id: i64 = message
            .headers
            .as_ref()
            .and_then(|map| map.get(headers::MESSAGE_ID))
            .and_then(|value| value.as_str().parse().ok())
            .ok_or("a message without its id")?;
        let transfer: Transfer =
            serde_json::from_slice(&message.payload).map_err(failed("a transfer"))?;
        let mut tx = pool.begin().await.map_err(failed("beginning"))?;
        sqlx::query("INSERT INTO transfers (message_id, account, amount) VALUES ($1, $2, $3)")
            .bind(id)
            .bind(transfer.account)
            .bind(transfer.amount)
            .execute(&mut *tx)
            .await
            .map_err(failed("inserting"))?;
        tx.commit().await.map_err(failed("committing"))?;
        message
            .double_ack()
            .await
            .map_err(failed("acknowledging"))?;
    }
    Ok(started.elapsed().as_secs_f64())
}
