//! Scenario 11: what the relay's gauges cost at a large backlog. Every relay reads them at
//! every gauge interval (`Store::gauges`), so their cost must not grow with the backlog. The
//! backlog: 10,000,000 pending messages over 1,000 shards at full scale, written with one
//! `INSERT … SELECT generate_series`; then the gauges (estimated above
//! `outbox_sqlx::EXACT_GAUGES_UP_TO` pending) against the exact count of `Admin::status(0)`
//! (what the gauges read before), each the median of a few reads.

use std::time::{Duration, Instant};

use outbox_core::admin::Admin;

use outbox_core::store::Store;
use outbox_postgres::PgStore;

use super::BenchArgs;
use super::report::{Row, Target};
use super::setup::{Server, failed};

/// The median time of `reads` runs of `read`.
async fn median<F, Fut, T>(reads: usize, mut read: F) -> Result<Duration, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, outbox_core::Error>>,
{
    let mut times = Vec::with_capacity(reads);
    for _ in 0..reads {
        let started = Instant::now();
        read()
            .await
            .map_err(|error| outbox_core::error::error_chain(&error))?;
        times.push(started.elapsed());
    }
    times.sort_unstable();
    Ok(times[times.len() / 2])
}

/// Scenario 11 on PostgreSQL.
pub(crate) async fn run(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let pending = args.sized(10_000_000, 20_000);
    let database = server.database(4).await?;
    let pool = database.pool.clone();
    sqlx::query(
        "INSERT INTO outbox_messages (shard_scope, shard_identifier, destination, category, \
             object_identifier, payload) \
         SELECT 1, g % 1000, '', 1, g, '{}'::jsonb FROM generate_series(1, $1) g",
    )
    .bind(i64::try_from(pending).unwrap_or(i64::MAX))
    .execute(&pool)
    .await
    .map_err(failed("writing the backlog"))?;
    sqlx::query("ANALYZE outbox_messages")
        .execute(&pool)
        .await
        .map_err(failed("analyzing the backlog"))?;
    let store = PgStore::new(pool.clone());
    let gauges = median(5, || store.gauges()).await?;
    let exact = median(3, || store.status(0)).await?;
    let read = store
        .gauges()
        .await
        .map_err(|error| outbox_core::error::error_chain(&error))?;
    database.drop_database().await?;
    let ms = |time: Duration| time.as_secs_f64() * 1_000.0;
    let backlog = format!("{pending} pending over 1,000 shards");
    Ok(vec![
        Row::measured(
            &format!("11. gauges (estimated: {}), {backlog}", read.estimated),
            "ms",
            ms(gauges),
            Target::Below(50.0),
        ),
        Row::measured(
            &format!("11. exact status (the gauges' read before), {backlog}"),
            "ms",
            ms(exact),
            Target::None,
        ),
    ])
}
