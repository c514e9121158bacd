//! Scenario 13: a held vacuum horizon. Live messages from four writers while another
//! connection holds a `REPEATABLE READ` transaction that has read the outbox's tables (as
//! `pg_dump` does): its snapshot is a horizon no vacuum can pass, so every row deleted or
//! updated after it began stays behind as a dead tuple until it ends.
//!
//! It runs on a private server started in a temporary directory and configured as production
//! runs one (autovacuum on at its defaults, `autovacuum_naptime = 10s`, fsync on), not on the
//! shared server, which runs with autovacuum off. Beside the relay, in the same database and
//! the same run, a plain `SKIP LOCKED` delete queue does the same work at the same rate: the
//! baseline every PostgreSQL queue is. Each phase (before; each minute of the hold; the two
//! minutes after it is released, left to autovacuum) reports both systems' live latency
//! (commit to handler), their delivered share of what was offered, and their tables' dead
//! tuples and size at its end.
//!
//! Two runs: 800 messages/s with the horizon held for 3 minutes (`horizon`), and 2,000/s held
//! for 15 minutes (`horizon-long`).

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use outbox_core::{Relay, RelayConfig};
use outbox_postgres::PgStore;
use sqlx::PgPool;
use tokio::sync::{Notify, watch};

use super::BenchArgs;
use super::latency::{
    Instants, SHARDS, delivered, latencies_where, live_traffic_with, note, noting_registry,
    percentile, run_relay, start_live, stopped,
};
use super::report::{Row, Target};
use super::setup::{Server, failed};
use crate::chaos::cluster::Cluster;

/// Writers of each system.
const WRITERS: u64 = 4;

/// The private server's settings: production's defaults where the shared server departs from
/// them, and a naptime short enough that autovacuum visits the tables during every minute.
pub(super) const PRODUCTION: &str = "\
    fsync = on\n\
    full_page_writes = on\n\
    autovacuum = on\n\
    autovacuum_naptime = 10s\n\
    shared_preload_libraries = 'pg_stat_statements'\n";

/// The baseline: a plain delete queue, its rows taken with `FOR UPDATE SKIP LOCKED`.
const QUEUE: &str = "\
    CREATE TABLE plain_queue ( \
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
        shard BIGINT NOT NULL, \
        object BIGINT NOT NULL, \
        payload JSONB NOT NULL, \
        created_at TIMESTAMPTZ NOT NULL DEFAULT now())";

/// The baseline's consumer takes (and deletes) up to this many rows a transaction.
const QUEUE_BATCH: i64 = 100;

/// One run of the scenario.
struct Hold {
    /// Its number in the table.
    number: &'static str,
    /// Live messages a second, to each system.
    rate: u64,
    /// Minutes the horizon is held.
    minutes: u64,
}

/// 800 messages/s, the horizon held for 3 minutes.
pub(crate) async fn short(args: &BenchArgs, _: &Server) -> Result<Vec<Row>, String> {
    run(
        args,
        &Hold {
            number: "13",
            rate: 800,
            minutes: 3,
        },
    )
    .await
}

/// 2,000 messages/s, the horizon held for 15 minutes.
pub(crate) async fn long(args: &BenchArgs, _: &Server) -> Result<Vec<Row>, String> {
    run(
        args,
        &Hold {
            number: "13b",
            rate: 2_000,
            minutes: 15,
        },
    )
    .await
}

/// The tables of each system at one moment.
#[derive(Debug, Clone, Copy)]
struct Tables {
    /// Dead tuples in `outbox_messages`, `outbox_shards` and `outbox_leases`.
    outbox_dead: f64,
    /// Their size with their indexes, in MiB.
    outbox_mib: f64,
    /// Dead tuples in the baseline's table.
    queue_dead: f64,
    /// Its size with its index, in MiB.
    queue_mib: f64,
}

async fn tables(pool: &PgPool) -> Result<Tables, String> {
    // The statistics' counters reach shared memory about once a second.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let each: Vec<(String, f64, f64)> = sqlx::query_as(
        "SELECT relname::text, n_dead_tup::float8, \
            pg_total_relation_size(relid)::float8 / 1048576 \
         FROM pg_stat_user_tables \
         WHERE relname IN ('outbox_messages', 'outbox_shards', 'outbox_leases', 'plain_queue') \
         ORDER BY relname",
    )
    .fetch_all(pool)
    .await
    .map_err(failed("reading the tables' statistics"))?;
    let mut tables = Tables {
        outbox_dead: 0.0,
        outbox_mib: 0.0,
        queue_dead: 0.0,
        queue_mib: 0.0,
    };
    let shown: Vec<String> = each
        .iter()
        .map(|(name, dead, mib)| format!("{name} {dead:.0} dead, {mib:.1} MiB"))
        .collect();
    eprintln!("  tables: {}", shown.join("; "));
    for (name, dead, mib) in each {
        if name == "plain_queue" {
            (tables.queue_dead, tables.queue_mib) = (dead, mib);
        } else {
            tables.outbox_dead += dead;
            tables.outbox_mib += mib;
        }
    }
    Ok(tables)
}

/// Prints the statements that took the most time since the last call (with `None`: forgets
/// them), for whoever reads the run's progress: where a held horizon costs.
async fn statements(pool: &PgPool, since: Option<&str>) -> Result<(), String> {
    if let Some(since) = since {
        let top: Vec<(f64, i64, f64, String)> = sqlx::query_as(
            "SELECT total_exec_time, calls, mean_exec_time, \
                regexp_replace(left(query, 110), '\\s+', ' ', 'g') \
             FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 8",
        )
        .fetch_all(pool)
        .await
        .map_err(failed("reading pg_stat_statements"))?;
        eprintln!("  statements by time {since}: total ms, calls, mean ms, statement");
        for (total, calls, mean, query) in top {
            eprintln!("    {total:>10.0} {calls:>9} {mean:>8.3}  {query}");
        }
    }
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(pool)
        .await
        .map_err(failed("resetting pg_stat_statements"))?;
    Ok(())
}

/// `now` ÷ `then` (infinite when `then` is 0).
pub(super) fn ratio(now: f64, then: f64) -> f64 {
    if then > 0.0 {
        now / then
    } else {
        f64::INFINITY
    }
}

/// A stretch of the run, and the tables at its end.
struct Phase {
    name: String,
    from: Instant,
    to: Instant,
    tables: Tables,
}

/// What one system did in a phase: the latencies of the messages committed in it (sorted;
/// `Duration::MAX` for one never delivered), and the share of what it offered that it
/// delivered, in percent.
pub(super) fn figures(
    committed: &Instants,
    started: &Instants,
    phase: std::ops::Range<Instant>,
) -> (Vec<Duration>, f64) {
    let committed = committed.lock().unwrap_or_else(PoisonError::into_inner);
    let started = started.lock().unwrap_or_else(PoisonError::into_inner);
    let within = |at: &Instant| phase.contains(at);
    let latencies = latencies_where(&committed, &started, |_, at| within(at));
    let offered = latencies.len();
    let delivered = started.values().filter(|at| within(at)).count();
    let share = if offered == 0 {
        0.0
    } else {
        delivered as f64 * 100.0 / offered as f64
    };
    (latencies, share)
}

/// Commits one row to the baseline's queue, and wakes its consumer.
async fn enqueue(pool: PgPool, object: i64, wake: Arc<Notify>) -> Result<(), String> {
    let mut tx = pool.begin().await.map_err(failed("begin"))?;
    sqlx::query("INSERT INTO plain_queue (shard, object, payload) VALUES ($1, $2, $3::jsonb)")
        .bind(object % SHARDS)
        .bind(object)
        .bind(format!(r#"{{"account":{object},"amount":1}}"#))
        .execute(&mut *tx)
        .await
        .map_err(failed("enqueue"))?;
    tx.commit().await.map_err(failed("commit"))?;
    wake.notify_one();
    Ok(())
}

/// The baseline's consumer: takes the oldest rows nobody else holds, deletes them and
/// "delivers" them (notes the time) in one transaction, until `stop` says so.
async fn consume(
    pool: PgPool,
    started: Instants,
    wake: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), String> {
    loop {
        let mut tx = pool.begin().await.map_err(failed("begin"))?;
        let taken: Vec<(i64, String)> = sqlx::query_as(
            "DELETE FROM plain_queue WHERE id IN ( \
                SELECT id FROM plain_queue ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
             RETURNING object, payload::text",
        )
        .bind(QUEUE_BATCH)
        .fetch_all(&mut *tx)
        .await
        .map_err(failed("taking from the queue"))?;
        for (object, _) in &taken {
            note(&started, *object);
        }
        tx.commit().await.map_err(failed("commit"))?;
        if taken.len() as i64 == QUEUE_BATCH {
            continue;
        }
        if *stop.borrow() {
            return Ok(());
        }
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => {}
        }
    }
}

async fn run(args: &BenchArgs, hold: &Hold) -> Result<Vec<Row>, String> {
    let (quiet, minute, after) = (
        args.seconds(30, 3),
        args.seconds(60, 2),
        args.seconds(120, 4),
    );
    let cluster = Cluster::start_with(PRODUCTION)?;
    let server = Server::new(&cluster.url()).await?;
    let database = server.database(WRITERS as u32 * 2 + 24).await?;
    let pool = &database.pool;
    for statement in [QUEUE, "CREATE EXTENSION pg_stat_statements"] {
        sqlx::query(statement)
            .execute(pool)
            .await
            .map_err(failed("creating the baseline's queue"))?;
    }

    let (committed, started): (Instants, Instants) = Default::default();
    let (queued, taken): (Instants, Instants) = Default::default();
    let relay = Relay::with_config(
        PgStore::new(pool.clone()),
        noting_registry(&started)?,
        RelayConfig::default(),
    );
    let (stop_relay, running) = run_relay(&relay);
    let wake = Arc::new(Notify::new());
    let (stop_queue, queue_stopped) = watch::channel(false);
    let consumer = tokio::spawn(consume(
        pool.clone(),
        Arc::clone(&taken),
        Arc::clone(&wake),
        queue_stopped,
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (stop_live, live) = start_live(pool, &committed, hold.rate, WRITERS);
    let (stop_queued, queue_writers) = watch::channel(false);
    let queue_live = tokio::spawn({
        let (pool, queued, wake, rate) = (
            pool.clone(),
            Arc::clone(&queued),
            Arc::clone(&wake),
            hold.rate,
        );
        async move {
            let commit = move |pool, object| enqueue(pool, object, Arc::clone(&wake));
            live_traffic_with(&pool, 0, &queued, queue_writers, rate, WRITERS, commit).await
        }
    });

    // Before: the two systems at their working size.
    statements(pool, None).await?;
    let mut from = Instant::now();
    tokio::time::sleep(quiet).await;
    let mut phases = Vec::new();
    let mut end_phase = async |name: String, from: &mut Instant| {
        let to = Instant::now();
        let tables = tables(pool).await?;
        phases.push(Phase {
            name,
            from: *from,
            to,
            tables,
        });
        *from = to;
        Ok::<(), String>(())
    };
    end_phase("before".to_owned(), &mut from).await?;

    // The horizon: a REPEATABLE READ transaction whose snapshot, taken by its first
    // statement, is held to its end; it has read every table, as pg_dump does.
    let mut long = pool.acquire().await.map_err(failed("connecting"))?;
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *long)
        .await
        .map_err(failed("beginning the long transaction"))?;
    for table in [
        "outbox_messages",
        "outbox_shards",
        "outbox_leases",
        "plain_queue",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .execute(&mut *long)
            .await
            .map_err(failed("reading in the long transaction"))?;
    }
    statements(pool, Some("before the horizon")).await?;
    for held in 1..=hold.minutes {
        tokio::time::sleep_until((from + minute).into()).await;
        end_phase(
            format!("horizon held, minute {held} of {}", hold.minutes),
            &mut from,
        )
        .await?;
    }
    statements(pool, Some("while the horizon was held")).await?;
    sqlx::query("COMMIT")
        .execute(&mut *long)
        .await
        .map_err(failed("ending the long transaction"))?;
    drop(long);
    // After: left to autovacuum, as production would.
    tokio::time::sleep_until((from + after).into()).await;
    end_phase(
        format!("the {} s after it is released", after.as_secs()),
        &mut from,
    )
    .await?;

    let _ = stop_live.send(true);
    let _ = stop_queued.send(true);
    let written = live.await.map_err(failed("the live traffic"))??;
    let enqueued = queue_live.await.map_err(failed("the queue's writers"))??;
    delivered(&started, written as usize, Duration::from_secs(120)).await?;
    delivered(&taken, enqueued as usize, Duration::from_secs(120)).await?;
    let _ = stop_queue.send(true);
    consumer.await.map_err(failed("the queue's consumer"))??;
    stopped(stop_relay, running).await?;
    database.drop_database().await?;
    drop(cluster);
    Ok(rows(
        hold,
        &phases,
        [&committed, &started],
        [&queued, &taken],
    ))
}

/// The table's rows: each phase's figures, then the targets' ratios.
fn rows(hold: &Hold, phases: &[Phase], outbox: [&Instants; 2], queue: [&Instants; 2]) -> Vec<Row> {
    let Hold {
        number,
        rate,
        minutes,
    } = hold;
    let title = format!(
        "{number}. held horizon ({minutes} min), ~{rate}/s live, relay vs a SKIP LOCKED queue"
    );
    let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
    let mut rows = Vec::new();
    let mut p99s = Vec::new();
    for phase in phases {
        let scenario = format!("{title}, {}", phase.name);
        let (engine, engine_share) = figures(outbox[0], outbox[1], phase.from..phase.to);
        let (baseline, baseline_share) = figures(queue[0], queue[1], phase.from..phase.to);
        if engine.is_empty() || baseline.is_empty() {
            continue;
        }
        for (what, p) in [("p50", 0.5), ("p99", 0.99)] {
            rows.push(Row::compared(
                &format!("{scenario}: live latency {what}"),
                "ms",
                ms(percentile(&engine, p)),
                ms(percentile(&baseline, p)),
                Target::None,
            ));
        }
        p99s.push((
            ms(percentile(&engine, 0.99)),
            ms(percentile(&baseline, 0.99)),
        ));
        rows.push(Row::compared(
            &format!("{scenario}: delivered, share of offered"),
            "%",
            engine_share,
            baseline_share,
            Target::None,
        ));
        let tables = phase.tables;
        rows.push(Row::compared(
            &format!("{scenario}: dead tuples at its end"),
            "tuples",
            tables.outbox_dead,
            tables.queue_dead,
            Target::None,
        ));
        rows.push(Row::compared(
            &format!("{scenario}: tables with their indexes at its end"),
            "MiB",
            tables.outbox_mib,
            tables.queue_mib,
            Target::None,
        ));
    }
    // The targets, each a ratio within one system: (relay, queue).
    let (Some(before), Some(last), Some(first_minute), Some(released)) = (
        phases.first(),
        phases.iter().rev().nth(1),
        phases.get(1),
        phases.last(),
    ) else {
        return rows;
    };
    let mut target = |what: &str, engine: f64, baseline: f64, below: f64| {
        rows.push(Row::compared(
            &format!("{title}: {what}"),
            "×",
            engine,
            baseline,
            Target::Below(below),
        ));
    };
    if let (Some(p99_before), Some(p99_last)) = (p99s.first(), p99s.iter().rev().nth(1)) {
        target(
            "live p99 in the hold's last minute ÷ before",
            ratio(p99_last.0, p99_before.0),
            ratio(p99_last.1, p99_before.1),
            2.0,
        );
    }
    target(
        "dead tuples at the hold's end ÷ after its first minute",
        ratio(last.tables.outbox_dead, first_minute.tables.outbox_dead),
        ratio(last.tables.queue_dead, first_minute.tables.queue_dead),
        1.5,
    );
    target(
        "tables' size once released ÷ before",
        ratio(released.tables.outbox_mib, before.tables.outbox_mib),
        ratio(released.tables.queue_mib, before.tables.queue_mib),
        2.0,
    );
    rows
}
