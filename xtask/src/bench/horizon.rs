//! Scenario 13: a long transaction. Live messages at about 800/s while another connection
//! holds a `REPEATABLE READ` transaction open for three minutes: its snapshot is a horizon no
//! vacuum can pass, so every row the relay deletes (messages, shard states) stays behind as a
//! dead tuple until it ends. Measures the live latency, the dead tuples and the size of the
//! outbox's tables before, during and after. No target yet: a report of what such a
//! transaction costs a delete-based outbox (PgQue's benchmark of delete-based queues).

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use outbox_core::{Relay, RelayConfig};
use outbox_postgres::PgStore;
use sqlx::{PgPool, Row as _};

use super::BenchArgs;
use super::latency::{
    Instants, delivered, latencies, noting_registry, percentile, run_relay, start_live, stopped,
};
use super::report::{Row, Target};
use super::setup::{Server, failed};

const RATE: u64 = 800;
const WRITERS: u64 = 4;

/// The outbox's tables at one moment: dead tuples, and size in MiB (indexes included).
async fn tables(pool: &PgPool) -> Result<(f64, f64), String> {
    // The statistics' counters are flushed to shared memory about once a second.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let row = sqlx::query(
        "SELECT coalesce(sum(n_dead_tup), 0)::float8, \
            (pg_total_relation_size('outbox_messages') \
                + pg_total_relation_size('outbox_shards'))::float8 / 1048576 \
         FROM pg_stat_user_tables WHERE relname IN ('outbox_messages', 'outbox_shards')",
    )
    .fetch_one(pool)
    .await
    .map_err(failed("reading the tables' statistics"))?;
    Ok((row.get(0), row.get(1)))
}

/// The first object not committed yet.
fn boundary(committed: &Instants) -> i64 {
    let committed = committed.lock().unwrap_or_else(PoisonError::into_inner);
    committed.keys().max().copied().unwrap_or(-1) + 1
}

pub(crate) async fn run(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let (quiet, held) = (args.seconds(30, 3), args.seconds(180, 6));
    let database = server.database(WRITERS as u32 + 20).await?;
    let pool = &database.pool;
    let committed: Instants = Arc::default();
    let started: Instants = Arc::default();
    let registry = noting_registry(&started)?;
    let relay = Relay::with_config(PgStore::new(pool.clone()), registry, RelayConfig::default());
    let (stop_relay, running) = run_relay(&relay);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (stop_live, live) = start_live(pool, &committed, RATE, WRITERS);
    tokio::time::sleep(quiet).await;
    let mut phases = vec![(boundary(&committed), tables(pool).await?)];

    let mut long = pool.acquire().await.map_err(failed("connecting"))?;
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *long)
        .await
        .map_err(failed("beginning the long transaction"))?;
    // Its snapshot is taken by its first statement, and held to its end.
    sqlx::query("SELECT count(*) FROM outbox_messages")
        .execute(&mut *long)
        .await
        .map_err(failed("reading in the long transaction"))?;
    tokio::time::sleep(held).await;
    phases.push((boundary(&committed), tables(pool).await?));
    sqlx::query("COMMIT")
        .execute(&mut *long)
        .await
        .map_err(failed("ending the long transaction"))?;
    drop(long);
    // What autovacuum would do at its next round (a server may run with it off, as the
    // machine of these benchmarks does): the dead tuples the horizon kept can go now.
    sqlx::query("VACUUM outbox_messages, outbox_shards")
        .execute(pool)
        .await
        .map_err(failed("vacuuming after the long transaction"))?;
    tokio::time::sleep(quiet).await;
    phases.push((boundary(&committed), tables(pool).await?));

    let _ = stop_live.send(true);
    let written = live.await.map_err(failed("the live traffic"))??;
    delivered(&started, written as usize, Duration::from_secs(60)).await?;
    stopped(stop_relay, running).await?;
    database.drop_database().await?;

    let held_for = held.as_secs();
    let whens = [
        "before".to_owned(),
        format!("during (a REPEATABLE READ transaction open for {held_for} s)"),
        "after (it committed, then a VACUUM)".to_owned(),
    ];
    let committed = committed.lock().unwrap_or_else(PoisonError::into_inner);
    let started = started.lock().unwrap_or_else(PoisonError::into_inner);
    let mut rows = Vec::new();
    let mut from = 0;
    let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
    for ((until, (dead, mib)), when) in phases.into_iter().zip(&whens) {
        let sorted = latencies(&committed, &started, from..until);
        from = until;
        if sorted.is_empty() {
            return Err(format!("no live message measured {when}"));
        }
        let scenario =
            format!("13. long transaction, ~{RATE}/s live from {WRITERS} writers, {when}");
        for (what, p) in [("p50", 0.5), ("p99", 0.99)] {
            rows.push(Row::measured(
                &format!(
                    "{scenario}: live latency {what} ({} messages)",
                    sorted.len()
                ),
                "ms",
                ms(percentile(&sorted, p)),
                Target::None,
            ));
        }
        rows.push(Row::measured(
            &format!("{scenario}: dead tuples in outbox_messages and outbox_shards, at its end"),
            "tuples",
            dead,
            Target::None,
        ));
        rows.push(Row::measured(
            &format!(
                "{scenario}: outbox_messages and outbox_shards with their indexes, at its end"
            ),
            "MiB",
            mib,
            Target::None,
        ));
    }
    Ok(rows)
}
