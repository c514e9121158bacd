//! Scenario 10: a backfill (S11) of 1,000,000 existing rows of a replicated model.
//!
//! - **Batches**: the walk alone, one batch of 1,000 rows per tick (read the rows above the
//!   low bound, write their outboxes, move the watermark, in one transaction), against the
//!   best plain SQL for the same work: one `INSERT … SELECT` per batch in keyset order and the
//!   watermark's `UPDATE`, in one transaction. After each batch both sides delete the outboxes
//!   it wrote, so that the backlog (which throttles the engine's walk) stays empty.
//! - **Beside live traffic** (on a private server with autovacuum on, as production runs): a
//!   running relay walks the whole table (its backfill ticking every 10 ms, paced by the live
//!   latency it measures, at most 2,000 rows per tick less the backlog) and delivers every
//!   outbox to the model's replication handler (each reads its row), while 4 writers commit ~1,000 live
//!   messages/s; the walk's rate from start to done, and the live messages' commit-to-handler
//!   latency during the walk and, for comparison, in the 10 s before it (target: p99 during
//!   within 2× of before).

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use outbox_core::admin::Admin;
use outbox_core::backfill::{BackfillModel, BackfillOptions, BackfillOutcome, BackfillStart};
use outbox_core::store::Store;
use outbox_core::{Category, Deletion, Registry, Relay, RelayConfig, Replication};
use outbox_postgres::PgStore;
use sqlx::PgPool;

use super::BenchArgs;
use super::latency::{Instants, latencies, noting, percentile, run_relay, start_live, stopped};
use super::models::Project;
use super::report::{Row, Target};
use super::setup::{Server, Transferred, failed};
use crate::chaos::cluster::Cluster;

const BATCH: usize = 1_000;
const LIVE_WRITERS: u64 = 4;
const LIVE_RATE: u64 = 1_000;

/// The projects table with `rows` rows, ids 1 to `rows`, over 1,000 organizations.
async fn projects(pool: &PgPool, rows: u64) -> Result<(), String> {
    sqlx::raw_sql(
        "CREATE TABLE projects (id BIGINT PRIMARY KEY, organization_id BIGINT NOT NULL, \
         name TEXT NOT NULL, archived BOOLEAN NOT NULL)",
    )
    .execute(pool)
    .await
    .map_err(failed("creating the projects"))?;
    sqlx::query(
        "INSERT INTO projects SELECT g, g % 1000, 'project ' || g, g % 2 = 0 \
         FROM generate_series(1, $1) AS g",
    )
    .bind(i64::try_from(rows).unwrap_or(i64::MAX))
    .execute(pool)
    .await
    .map_err(failed("filling the projects"))?;
    sqlx::raw_sql("VACUUM ANALYZE projects")
        .execute(pool)
        .await
        .map_err(failed("analyzing the projects"))?;
    Ok(())
}

pub(crate) async fn run(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let total = args.sized(1_000_000, 10_000);
    let database = server.database(24).await?;
    let pool = database.pool.clone();
    projects(&pool, total).await?;
    let mut rows = batches(&pool, args.sized(200_000, 5_000).min(total)).await?;
    database.drop_database().await?;
    // Beside live traffic, on a private server configured as production runs (autovacuum
    // on): on the shared server (autovacuum off), a walk's million acknowledged rows and the
    // live traffic's stay in the tables as dead rows, and every claim walks them, however
    // slowly the walk goes.
    let cluster = Cluster::start_with(super::horizon::PRODUCTION)?;
    let private = Server::new(&cluster.url()).await?;
    let database = private.database(24).await?;
    projects(&database.pool, total).await?;
    rows.extend(beside_live_traffic(&database.pool, total, args.seconds(10, 2)).await?);
    database.drop_database().await?;
    Ok(rows)
}

/// The walk alone, batch by batch, against plain SQL.
async fn batches(pool: &PgPool, walked: u64) -> Result<Vec<Row>, String> {
    const CLEAR: &str = "DELETE FROM outbox_messages";
    let store = PgStore::new(pool.clone());
    let model = BackfillModel::of::<Project>();
    let options = BackfillOptions {
        worker: "bench".to_owned(),
        budget: BATCH,
    };
    // The engine walks the first `walked` rows (its version 1, started here).
    store
        .start_backfill(&BackfillStart::new(Project::ID, 1))
        .await
        .map_err(failed("starting the backfill"))?;
    let started = Instant::now();
    let mut done = 0u64;
    while done < walked {
        let batch = store
            .backfill(&model, &options)
            .await
            .map_err(failed("a backfill batch"))?;
        match batch.outcome {
            BackfillOutcome::Walked { rows, .. } => done += rows as u64,
            other => return Err(format!("the backfill did not walk: {other:?}")),
        }
        sqlx::query(CLEAR)
            .execute(pool)
            .await
            .map_err(failed("clearing"))?;
    }
    let engine = done as f64 / started.elapsed().as_secs_f64();
    // The engine's walk stops here: pause it, so that the relay of the next part starts anew.
    store
        .pause_backfill(Project::ID)
        .await
        .map_err(failed("pausing the backfill"))?;

    sqlx::raw_sql(
        "CREATE TABLE plain_watermark (model INTEGER PRIMARY KEY, low_bound BIGINT NOT NULL); \
         INSERT INTO plain_watermark VALUES (2, 0)",
    )
    .execute(pool)
    .await
    .map_err(failed("the plain watermark"))?;
    let started = Instant::now();
    let mut done = 0u64;
    while done < walked {
        let mut tx = pool.begin().await.map_err(failed("begin"))?;
        let low: i64 =
            sqlx::query_scalar("SELECT low_bound FROM plain_watermark WHERE model = 2 FOR UPDATE")
                .fetch_one(&mut *tx)
                .await
                .map_err(failed("the plain watermark"))?;
        let (rows, high): (i64, Option<i64>) = sqlx::query_as(
            "WITH w AS (INSERT INTO outbox_messages \
                 (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
                 SELECT 1, organization_id, '', 2, id, 'null'::jsonb FROM projects \
                 WHERE id > $1 ORDER BY id LIMIT $2 RETURNING object_identifier) \
             SELECT count(*), max(object_identifier) FROM w",
        )
        .bind(low)
        .bind(BATCH as i64)
        .fetch_one(&mut *tx)
        .await
        .map_err(failed("a plain batch"))?;
        sqlx::query("UPDATE plain_watermark SET low_bound = $1 WHERE model = 2")
            .bind(high.unwrap_or(low))
            .execute(&mut *tx)
            .await
            .map_err(failed("the plain watermark"))?;
        tx.commit().await.map_err(failed("commit"))?;
        done += rows as u64;
        sqlx::query(CLEAR)
            .execute(pool)
            .await
            .map_err(failed("clearing"))?;
        if rows == 0 {
            break;
        }
    }
    let baseline = done as f64 / started.elapsed().as_secs_f64();
    Ok(vec![Row::compared(
        &format!(
            "10. backfill batches of {BATCH} rows (read, outboxes, watermark; one transaction), {walked} rows, 1 connection (PostgreSQL)"
        ),
        "rows/s",
        engine,
        baseline,
        Target::None,
    )])
}

/// A running relay walks the whole table beside live traffic.
async fn beside_live_traffic(
    pool: &PgPool,
    total: u64,
    before: Duration,
) -> Result<Vec<Row>, String> {
    let committed: Instants = Arc::default();
    let started: Instants = Arc::default();
    let replicated = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let registry = Registry::builder()
        .handle::<Transferred>(noting(&started))
        .replication::<Project>({
            let replicated = Arc::clone(&replicated);
            move |_: Replication<Project>| {
                replicated.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                async { Ok::<(), std::io::Error>(()) }
            }
        })
        .deletion::<Project>(|_: Deletion<Project>| async { Ok::<(), std::io::Error>(()) })
        .build()
        .map_err(failed("the registry"))?;
    let config = RelayConfig::builder()
        .backfill_interval(Some(Duration::from_millis(10)))
        .backfill_budget(2_000)
        .build()
        .map_err(failed("the relay configuration"))?;
    let store = PgStore::new(pool.clone());
    let relay = Relay::with_config(store.clone(), registry, config);
    let (stop_relay, running) = run_relay(&relay);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Live traffic alone, then with the walk, to its end.
    let (stop_live, live) = start_live(pool, &committed, LIVE_RATE, LIVE_WRITERS);
    tokio::time::sleep(before).await;
    let boundary = {
        let committed = committed.lock().unwrap_or_else(PoisonError::into_inner);
        committed.keys().max().copied().unwrap_or(0) + 1
    };
    // Version 2 (the first part walked version 1): the whole table again.
    store
        .start_backfill(&BackfillStart::new(Project::ID, 2))
        .await
        .map_err(failed("starting the backfill"))?;
    let walk_started = Instant::now();
    let code = BackfillModel::of::<Project>().version;
    if code < 2 {
        return Err("the benchmark model must declare replication version 2".to_owned());
    }
    let deadline = Instant::now() + Duration::from_secs(3_600);
    let walked = loop {
        let states = store.backfills().await.map_err(failed("backfills"))?;
        let state = states
            .into_iter()
            .find(|state| state.category == Project::ID)
            .ok_or("the model has no watermark")?;
        if state.done_version >= 2 {
            break walk_started.elapsed();
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the backfill did not end within an hour: {state:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let during_end = {
        let committed = committed.lock().unwrap_or_else(PoisonError::into_inner);
        committed.keys().max().copied().unwrap_or(0) + 1
    };
    let _ = stop_live.send(true);
    let written = live.await.map_err(failed("the live traffic"))??;
    let deadline = Instant::now() + Duration::from_secs(60);
    while started.lock().unwrap_or_else(PoisonError::into_inner).len() < written as usize
        || replicated.load(std::sync::atomic::Ordering::Relaxed) < total
    {
        if Instant::now() > deadline {
            return Err("the relay did not deliver everything within 60 s".to_owned());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stopped(stop_relay, running).await?;

    let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
    let (quiet, busy) = {
        let committed = committed.lock().unwrap_or_else(PoisonError::into_inner);
        let started = started.lock().unwrap_or_else(PoisonError::into_inner);
        (
            latencies(&committed, &started, 0..boundary),
            latencies(&committed, &started, boundary..during_end),
        )
    };
    if quiet.is_empty() || busy.is_empty() {
        return Err("no live message measured".to_owned());
    }
    let mut rows = vec![Row::measured(
        &format!(
            "10. backfill of {total} rows by a running relay (paced by live latency: at most 2,000 rows per 10 ms tick, less the backlog), each delivered to the model's handler, beside ~{LIVE_RATE}/s live messages: walk start to done"
        ),
        "rows/s",
        total as f64 / walked.as_secs_f64(),
        Target::None,
    )];
    let p99 = |sorted: &[Duration]| ms(percentile(sorted, 0.99));
    let during_before = p99(&busy) / p99(&quiet);
    for (when, sorted) in [
        ("before the backfill", &quiet),
        ("during the backfill", &busy),
    ] {
        for (what, p) in [("p50", 0.5), ("p99", 0.99)] {
            rows.push(Row::measured(
                &format!(
                    "10. live latency, commit to handler, {} messages at ~{LIVE_RATE}/s from {LIVE_WRITERS} writers, {when}: {what}",
                    sorted.len()
                ),
                "ms",
                ms(percentile(sorted, p)),
                Target::None,
            ));
        }
    }
    rows.push(Row::measured(
        &format!("10. live latency, commit to handler, at ~{LIVE_RATE}/s: p99 during the backfill ÷ before"),
        "×",
        during_before,
        Target::Below(2.0),
    ));
    Ok(rows)
}
