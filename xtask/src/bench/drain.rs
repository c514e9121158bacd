//! Scenarios 2, 3 (and 6): draining a backlog with a no-op handler, against a raw
//! `DELETE … LIMIT 1000 FOR UPDATE SKIP LOCKED` loop over the same rows.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use outbox_core::{Delivery, Registry, Relay, RelayConfig, Store};
use outbox_postgres::PgStore;
use outbox_sqlite::SqliteStore;
use sqlx::{AssertSqlSafe, PgPool, SqlitePool};

use super::BenchArgs;
use super::report::{Row, Target};
use super::setup::{Server, SqliteDatabase, Transferred, failed};

const PAYLOAD: &str = r#"{"account":1,"amount":1}"#;

/// A relay whose handler counts its calls and does nothing else.
pub(crate) fn counting_relay<S: Store>(
    store: S,
    config: RelayConfig,
) -> (Relay<S>, Arc<AtomicU64>) {
    let calls = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&calls);
    let registry = Registry::builder()
        .handle::<Transferred>(move |_: Delivery<Transferred>| {
            counter.fetch_add(1, Ordering::Relaxed);
            async { Ok::<(), std::io::Error>(()) }
        })
        .build()
        .expect("one category");
    (Relay::with_config(store, registry, config), calls)
}

/// Seeds `messages` rows over `shards` shards; each shard's rows fall in `groups_per_shard`
/// objects (0: every row its own object).
pub(crate) async fn seed_pg(
    pool: &PgPool,
    messages: u64,
    shards: u64,
    groups_per_shard: u64,
) -> Result<(), String> {
    let object = if groups_per_shard == 0 {
        "g".to_owned()
    } else {
        format!("(g / {shards}) % {groups_per_shard}")
    };
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO outbox_messages \
            (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
         SELECT 1, g % {shards}, '', 1, {object}, '{PAYLOAD}'::jsonb \
         FROM generate_series(0, {messages} - 1) g"
    )))
    .execute(pool)
    .await
    .map_err(failed("seeding the outbox"))?;
    sqlx::query("VACUUM ANALYZE outbox_messages")
        .execute(pool)
        .await
        .map_err(failed("vacuuming the outbox"))?;
    Ok(())
}

/// The raw loop: rows per second.
async fn raw_loop_pg(pool: &PgPool) -> Result<(u64, f64), String> {
    let started = Instant::now();
    let mut rows = 0;
    loop {
        let done = sqlx::query(
            "DELETE FROM outbox_messages WHERE id IN (SELECT id FROM outbox_messages \
             ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED)",
        )
        .execute(pool)
        .await
        .map_err(failed("the raw delete loop"))?;
        if done.rows_affected() == 0 {
            break;
        }
        rows += done.rows_affected();
    }
    Ok((rows, rows as f64 / started.elapsed().as_secs_f64()))
}

/// Drains with the relay: `(rows, handler calls, seconds)`.
pub(super) async fn relay_pg(pool: &PgPool) -> Result<(u64, u64, f64), String> {
    let (relay, calls) = counting_relay(PgStore::new(pool.clone()), RelayConfig::default());
    let started = Instant::now();
    let report = relay
        .drain()
        .await
        .map_err(failed("draining with the relay"))?;
    let seconds = started.elapsed().as_secs_f64();
    if !report.is_clean() {
        return Err(format!("the relay's drain was not clean: {report:?}"));
    }
    Ok((
        report.rows_acknowledged,
        calls.load(Ordering::Relaxed),
        seconds,
    ))
}

/// Each side twice, interleaved (relay, raw loop, relay, raw loop), on freshly seeded rows: the
/// best rate of each, so that the machine's drift between runs does not decide the ratio.
/// Returns `(relay rows/s, relay groups/s, raw rows/s)`.
async fn compare_pg(
    pool: &PgPool,
    messages: u64,
    shards: u64,
    groups_per_shard: u64,
    calls_expected: u64,
) -> Result<(f64, f64, f64), String> {
    let (mut relay_rate, mut group_rate, mut raw_rate) = (0.0f64, 0.0f64, 0.0f64);
    for _ in 0..2 {
        seed_pg(pool, messages, shards, groups_per_shard).await?;
        let (rows, calls, seconds) = relay_pg(pool).await?;
        check(rows, messages, "rows drained")?;
        check(calls, calls_expected, "handler calls")?;
        relay_rate = relay_rate.max(rows as f64 / seconds);
        group_rate = group_rate.max(calls as f64 / seconds);
        seed_pg(pool, messages, shards, groups_per_shard).await?;
        let (raw_rows, rate) = raw_loop_pg(pool).await?;
        check(raw_rows, messages, "rows deleted by the raw loop")?;
        raw_rate = raw_rate.max(rate);
    }
    Ok((relay_rate, group_rate, raw_rate))
}

/// Scenario 2: 1,000,000 pending messages over 10,000 shards, no coalescing.
pub(crate) async fn plain(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let (messages, shards) = (args.sized(1_000_000, 10_000), args.sized(10_000, 100));
    let database = server.database(20).await?;
    let (relay, _, raw) = compare_pg(&database.pool, messages, shards, 0, messages).await?;
    database.drop_database().await?;
    Ok(vec![Row::compared(
        &format!("2. drain, no coalescing: {messages} messages, {shards} shards (PostgreSQL)"),
        "messages/s",
        relay,
        raw,
        Target::Ratio(0.5),
    )])
}

/// Scenario 3: 1,000,000 messages in 100,000 groups over 10,000 shards: one handler call per
/// group (checked: the run fails otherwise).
pub(crate) async fn coalescing(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let (messages, shards) = (args.sized(1_000_000, 10_000), args.sized(10_000, 100));
    let groups = shards * 10;
    let database = server.database(20).await?;
    let (relay, group_rate, raw) = compare_pg(&database.pool, messages, shards, 10, groups).await?;
    database.drop_database().await?;
    Ok(vec![
        Row::compared(
            &format!(
                "3. drain, coalescing: {messages} messages, {groups} groups, {shards} shards \
                 (PostgreSQL)"
            ),
            "rows/s",
            relay,
            raw,
            Target::Ratio(0.5),
        ),
        Row::measured(
            &format!(
                "3. drain, coalescing: handler calls per group ({groups} groups; the run fails unless every group has exactly one)"
            ),
            "calls/group",
            1.0,
            Target::Exactly(1.0),
        ),
        Row::measured(
            "3. drain, coalescing: groups delivered",
            "groups/s",
            group_rate,
            Target::None,
        ),
    ])
}

fn check(found: u64, expected: u64, what: &str) -> Result<(), String> {
    if found == expected {
        Ok(())
    } else {
        Err(format!("{what}: expected {expected}, found {found}"))
    }
}

async fn seed_sqlite(pool: &SqlitePool, messages: u64, shards: u64) -> Result<(), String> {
    sqlx::query(AssertSqlSafe(format!(
        "WITH RECURSIVE n(g) AS (SELECT 0 UNION ALL SELECT g + 1 FROM n WHERE g < {messages} - 1) \
         INSERT INTO outbox_messages \
            (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
         SELECT 1, g % {shards}, '', 1, g, '{PAYLOAD}' FROM n"
    )))
    .execute(pool)
    .await
    .map_err(failed("seeding the outbox"))?;
    Ok(())
}

/// Scenario 6: scenario 2 on SQLite, at 100,000 messages over 1,000 shards.
pub(crate) async fn sqlite(args: &BenchArgs) -> Result<Vec<Row>, String> {
    let (messages, shards) = (args.sized(100_000, 2_000), args.sized(1_000, 20));
    let database = SqliteDatabase::new().await?;
    let pool = &database.pool;
    seed_sqlite(pool, messages, shards).await?;
    let (relay, calls) = counting_relay(SqliteStore::new(pool.clone()), RelayConfig::default());
    let started = Instant::now();
    let report = relay
        .drain()
        .await
        .map_err(failed("draining with the relay"))?;
    let seconds = started.elapsed().as_secs_f64();
    check(report.rows_acknowledged, messages, "rows drained")?;
    check(calls.load(Ordering::Relaxed), messages, "handler calls")?;

    seed_sqlite(pool, messages, shards).await?;
    let started = Instant::now();
    let mut rows = 0;
    loop {
        let done = sqlx::query(
            "DELETE FROM outbox_messages WHERE id IN \
             (SELECT id FROM outbox_messages ORDER BY id LIMIT 1000)",
        )
        .execute(pool)
        .await
        .map_err(failed("the raw delete loop"))?;
        if done.rows_affected() == 0 {
            break;
        }
        rows += done.rows_affected();
    }
    let raw_rate = rows as f64 / started.elapsed().as_secs_f64();
    check(rows, messages, "rows deleted by the raw loop")?;
    Ok(vec![Row::compared(
        &format!("6. SQLite drain, no coalescing: {messages} messages, {shards} shards"),
        "messages/s",
        messages as f64 / seconds,
        raw_rate,
        Target::None,
    )])
}
