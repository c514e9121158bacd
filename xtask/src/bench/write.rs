//! Scenario 1 (and 6): the write path. A business transaction (update one row) plus one outbox
//! write through an `OutboxTransaction` (which wakes the relays after its commit), against the
//! identical UPDATE + INSERT written by hand into the same table, which has no trigger: at 1,
//! 16 and 64 concurrent writers; at 1 and 16 again while a relay of another process listens
//! (each commit is then announced to it with a `NOTIFY`, coalesced per round trip). And 100
//! messages in one transaction, against the same bulk INSERT written by hand.

use std::time::{Duration, Instant};

use outbox_core::{Message, Payload};
use sqlx::{PgPool, SqlitePool};

use super::BenchArgs;
use super::report::{Row, Target};
use super::setup::{Server, SqliteDatabase, Transfer, Transferred, failed};

pub(super) const ACCOUNTS: i64 = 10_000;
const UPDATE_PG: &str = "UPDATE accounts SET balance = balance + 1 WHERE id = $1";
const UPDATE_SQLITE: &str = "UPDATE accounts SET balance = balance + 1 WHERE id = ?1";
const INSERT_PG: &str = "INSERT INTO outbox_messages \
    (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
    VALUES ($1, $2, $3, $4, $5, $6::text::jsonb)";
const INSERT_SQLITE: &str = "INSERT INTO outbox_messages \
    (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
const INSERT_MANY_PG: &str = "INSERT INTO outbox_messages \
    (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
    SELECT scope, shard, destination, category, object, payload::jsonb \
    FROM unnest($1::smallint[], $2::bigint[], $3::text[], $4::integer[], $5::bigint[], \
        $6::text[]) AS rows(scope, shard, destination, category, object, payload)";

/// Which side of a comparison runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Engine,
    Baseline,
}

pub(super) fn transfer(account: i64) -> Transfer {
    Transfer { account, amount: 1 }
}

/// The two sides, three runs each in the order baseline, engine, engine, baseline, baseline,
/// engine (so that a drift of the machine or the tables along the runs favours neither side):
/// the best rate of each, in operations per second, as `(engine, baseline)`. Three runs a side:
/// this machine's noise between runs (several percent) is of the order of the targets.
pub(super) async fn compare<F, Fut>(operations: u64, mut run: F) -> Result<(f64, f64), String>
where
    F: FnMut(Side) -> Fut,
    Fut: Future<Output = Result<Duration, String>>,
{
    use Side::{Baseline, Engine};
    let mut best = [0.0f64; 2];
    for side in [Baseline, Engine, Engine, Baseline, Baseline, Engine] {
        let elapsed = run(side).await?;
        let rate = operations as f64 / elapsed.as_secs_f64();
        let slot = usize::from(side == Engine);
        best[slot] = best[slot].max(rate);
    }
    Ok((best[1], best[0]))
}

/// PostgreSQL: 1, 16 and 64 connections writing at once, the engine through an
/// `OutboxTransaction` (which wakes the relays after its commit) against the same UPDATE +
/// INSERT written by hand into the same table (which has no trigger); at 16 writers with the
/// opt-in commit trigger, for comparison; at 1 and 16 writers the same while a relay of
/// another process listens; then 100 messages per transaction.
pub(crate) async fn postgres(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (workers, full) in [(1u64, 10_000), (16, 40_000), (64, 40_000)] {
        let database = server.database(workers as u32 + 2).await?;
        let pool = database.pool.clone();
        accounts_pg(&pool).await?;
        let transactions = args.sized(full, 400).div_ceil(workers) * workers;
        // Both sides, the same transactions, in each configuration of the database below.
        let measure = || {
            compare(transactions, |side| {
                one_message_pg(pool.clone(), side, workers, transactions / workers)
            })
        };
        let (engine, baseline) = measure().await?;
        rows.push(Row::compared(
            &format!("1. write: UPDATE + 1 outbox, {workers} writers (PostgreSQL)"),
            "transactions/s",
            engine,
            baseline,
            Target::Ratio(0.95),
        ));
        if workers == 16 {
            outbox_postgres::enable_commit_trigger(&pool)
                .await
                .map_err(failed("enabling the commit trigger"))?;
            let (engine, baseline) = measure().await?;
            rows.push(Row::compared(
                "1. write: the same, 16 writers, with the opt-in commit trigger (both sides)",
                "transactions/s",
                engine,
                baseline,
                Target::None,
            ));
            outbox_postgres::disable_commit_trigger(&pool)
                .await
                .map_err(failed("disabling the commit trigger"))?;
        }
        if workers <= 16 {
            // Where relays run in other processes, each commit is announced to them. Last on
            // this database: its writers' process takes what it read of listeners for a second.
            let listening = listening_elsewhere(&pool).await?;
            let (engine, baseline) = measure().await?;
            listening.abort();
            rows.push(Row::compared(
                &format!(
                    "1. write: the same, {workers} writers, a relay of another process listening"
                ),
                "transactions/s",
                engine,
                baseline,
                Target::None,
            ));
        }
        database.drop_database().await?;
    }
    let workers = 8u64;
    let database = server.database(workers as u32 + 2).await?;
    let pool = database.pool.clone();
    accounts_pg(&pool).await?;
    let batches = args.sized(2_000, 40) / workers * workers;
    let (engine_bulk, baseline_bulk) = compare(batches * 100, |side| {
        hundred_messages_pg(pool.clone(), side, workers, batches / workers)
    })
    .await?;
    database.drop_database().await?;
    rows.push(Row::compared(
        "1. write: UPDATE + 100 outboxes in one transaction, 8 writers (PostgreSQL)",
        "messages/s",
        engine_bulk,
        baseline_bulk,
        Target::None,
    ));
    Ok(rows)
}

/// A connection that listens for the relays' notifications, as a relay in another process
/// does, and reads each as it comes.
async fn listening_elsewhere(pool: &PgPool) -> Result<tokio::task::JoinHandle<()>, String> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .map_err(failed("connecting a listener"))?;
    listener
        .listen(outbox_postgres::NOTIFY_CHANNEL)
        .await
        .map_err(failed("listening"))?;
    Ok(tokio::spawn(async move {
        while listener.recv().await.is_ok() {}
    }))
}

/// The accounts the business transactions update.
pub(super) async fn accounts_pg(pool: &PgPool) -> Result<(), String> {
    sqlx::raw_sql(
        "CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL); \
         INSERT INTO accounts SELECT g, 0 FROM generate_series(1, 10000) g",
    )
    .execute(pool)
    .await
    .map_err(failed("creating the accounts"))?;
    Ok(())
}

/// Runs `workers` tasks at once, each making `each` calls of `transaction(pool, worker, i)`
/// one after another; the time until all are done.
pub(super) async fn concurrently<P, F, Fut>(
    pool: &P,
    workers: u64,
    each: u64,
    transaction: F,
) -> Result<Duration, String>
where
    P: Clone + Send + 'static,
    F: Fn(P, u64, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let (pool, transaction) = (pool.clone(), transaction.clone());
        tasks.spawn(async move {
            for i in 0..each {
                transaction(pool.clone(), worker, i).await?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(failed("a writer"))??;
    }
    Ok(started.elapsed())
}

pub(super) async fn truncate_pg(pool: &PgPool) -> Result<(), String> {
    sqlx::query("TRUNCATE outbox_messages")
        .execute(pool)
        .await
        .map_err(failed("emptying the outbox"))?;
    Ok(())
}

pub(super) async fn one_message_pg(
    pool: PgPool,
    side: Side,
    workers: u64,
    each: u64,
) -> Result<Duration, String> {
    truncate_pg(&pool).await?;
    concurrently(&pool, workers, each, move |pool, worker, i| async move {
        let account = ((worker * each + i) as i64 % ACCOUNTS) + 1;
        match side {
            Side::Engine => {
                let mut tx = outbox_postgres::begin(&pool)
                    .await
                    .map_err(failed("begin"))?;
                update_pg(&mut tx, account).await?;
                let message = Message::new::<Transferred>(account, account, &transfer(account))
                    .map_err(failed("message"))?;
                tx.write(&message).await.map_err(failed("write"))?;
                tx.commit().await.map_err(failed("commit"))?;
            }
            Side::Baseline => {
                let mut tx = pool.begin().await.map_err(failed("begin"))?;
                update_pg(&mut tx, account).await?;
                let payload = transfer(account)
                    .to_json_string()
                    .map_err(failed("payload"))?;
                sqlx::query(INSERT_PG)
                    .bind(1i16)
                    .bind(account)
                    .bind("")
                    .bind(1i32)
                    .bind(account)
                    .bind(payload)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed("insert"))?;
                tx.commit().await.map_err(failed("commit"))?;
            }
        }
        Ok(())
    })
    .await
}

/// The business change: one account's balance.
async fn update_pg(conn: &mut sqlx::PgConnection, account: i64) -> Result<(), String> {
    sqlx::query(UPDATE_PG)
        .bind(account)
        .execute(conn)
        .await
        .map_err(failed("update"))?;
    Ok(())
}

async fn hundred_messages_pg(
    pool: PgPool,
    side: Side,
    workers: u64,
    each: u64,
) -> Result<Duration, String> {
    truncate_pg(&pool).await?;
    concurrently(&pool, workers, each, move |pool, worker, i| async move {
        let account = ((worker * each + i) as i64 % ACCOUNTS) + 1;
        let objects: Vec<i64> = (0..100).map(|n| account * 100 + n).collect();
        match side {
            Side::Engine => {
                let mut tx = outbox_postgres::begin(&pool)
                    .await
                    .map_err(failed("begin"))?;
                update_pg(&mut tx, account).await?;
                let messages = objects
                    .iter()
                    .map(|&object| Message::new::<Transferred>(account, object, &transfer(object)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(failed("messages"))?;
                tx.write_all(&messages).await.map_err(failed("write_all"))?;
                tx.commit().await.map_err(failed("commit"))?;
            }
            Side::Baseline => {
                let mut tx = pool.begin().await.map_err(failed("begin"))?;
                update_pg(&mut tx, account).await?;
                let payloads = objects
                    .iter()
                    .map(|&object| transfer(object).to_json_string())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(failed("payloads"))?;
                sqlx::query(INSERT_MANY_PG)
                    .bind(vec![1i16; 100])
                    .bind(vec![account; 100])
                    .bind(vec![""; 100])
                    .bind(vec![1i32; 100])
                    .bind(&objects)
                    .bind(payloads)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed("insert"))?;
                tx.commit().await.map_err(failed("commit"))?;
            }
        }
        Ok(())
    })
    .await
}

/// SQLite: one writer (SQLite has one), `BEGIN IMMEDIATE` on both sides.
pub(crate) async fn sqlite(args: &BenchArgs) -> Result<Vec<Row>, String> {
    let database = SqliteDatabase::new().await?;
    let pool = database.pool.clone();
    sqlx::raw_sql(
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL); \
         WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 10000) \
         INSERT INTO accounts SELECT n, 0 FROM g",
    )
    .execute(&pool)
    .await
    .map_err(failed("creating the accounts"))?;
    let transactions = args.sized(10_000, 200);
    let (engine, baseline) = compare(transactions, |side| {
        one_message_sqlite(pool.clone(), side, transactions)
    })
    .await?;
    Ok(vec![Row::compared(
        "6. SQLite write: UPDATE + 1 outbox",
        "transactions/s",
        engine,
        baseline,
        Target::None,
    )])
}

async fn one_message_sqlite(pool: SqlitePool, side: Side, count: u64) -> Result<Duration, String> {
    sqlx::query("DELETE FROM outbox_messages")
        .execute(&pool)
        .await
        .map_err(failed("emptying the outbox"))?;
    let started = Instant::now();
    for i in 0..count {
        let account = (i as i64 % ACCOUNTS) + 1;
        let mut tx = pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(failed("begin"))?;
        sqlx::query(UPDATE_SQLITE)
            .bind(account)
            .execute(&mut *tx)
            .await
            .map_err(failed("update"))?;
        match side {
            Side::Engine => {
                let message = Message::new::<Transferred>(account, account, &transfer(account))
                    .map_err(failed("message"))?;
                outbox_sqlite::write(&mut *tx, &message)
                    .await
                    .map_err(failed("write"))?;
            }
            Side::Baseline => {
                let payload = transfer(account)
                    .to_json_string()
                    .map_err(failed("payload"))?;
                sqlx::query(INSERT_SQLITE)
                    .bind(1i16)
                    .bind(account)
                    .bind("")
                    .bind(1i32)
                    .bind(account)
                    .bind(payload)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed("insert"))?;
            }
        }
        tx.commit().await.map_err(failed("commit"))?;
    }
    Ok(started.elapsed())
}
