//! Scenarios 2, 3 (and 6): draining a backlog with a no-op handler; on PostgreSQL against the
//! best of plain-SQL deletes that return every row ([`super::baselines`]), on
//! SQLite against its same-guarantee loop, with a raw delete loop as the ceiling.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use outbox_core::{Delivery, Registry, Relay, RelayConfig};

use outbox_core::store::Store;
use outbox_postgres::PgStore;
use outbox_sqlite::SqliteStore;
use sqlx::{AssertSqlSafe, PgPool, Row as _, SqlitePool};

use super::BenchArgs;
use super::baselines::{self, Strategy};
use super::cpu::{CpuClock, CpuPerMessage, cpu_rows};
use super::report::{Row, Target};
use super::setup::{Server, SqliteDatabase, Transferred, failed};

pub(super) const PAYLOAD: &str = r#"{"account":1,"amount":1}"#;

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

/// Drains with the relay: `(rows, handler calls, seconds)`.
pub(super) async fn relay_pg(pool: &PgPool) -> Result<(u64, u64, f64), String> {
    relay_drain(PgStore::new(pool.clone())).await
}

/// Drains `store` with a counting relay: `(rows, handler calls, seconds)`; an error unless the
/// drain was clean.
pub(super) async fn relay_drain<S: Store>(store: S) -> Result<(u64, u64, f64), String> {
    let (relay, calls) = counting_relay(store, RelayConfig::default());
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

/// What one drain scenario measured: the relay's best rates, and each baseline's.
struct Measured {
    relay_rows: f64,
    relay_groups: f64,
    /// The processor time of the relay's fastest run.
    relay_cpu: CpuPerMessage,
    /// `(strategy, connections, rows/s, processor time)`.
    baselines: Vec<(Strategy, u64, f64, CpuPerMessage)>,
}

impl Measured {
    /// The best baseline: `(what it is, rows/s)`.
    fn best(&self) -> (String, f64) {
        self.best_of(|_| true)
    }

    /// The best same-guarantee loop: `(what it is, rows/s)`.
    fn best_same_guarantee(&self) -> (String, f64) {
        self.best_of(Strategy::same_guarantee)
    }

    /// The best of the baselines whose strategy `which` takes: `(what it is, rows/s)`.
    fn best_of(&self, which: impl Fn(Strategy) -> bool) -> (String, f64) {
        self.fastest(which)
            .map(|(strategy, connections, rate, _)| {
                (
                    format!("{}, {connections} conn.", strategy.describe()),
                    *rate,
                )
            })
            .unwrap_or_default()
    }

    /// The fastest of the baselines whose strategy `which` takes.
    fn fastest(
        &self,
        which: impl Fn(Strategy) -> bool,
    ) -> Option<&(Strategy, u64, f64, CpuPerMessage)> {
        self.baselines
            .iter()
            .filter(|(strategy, ..)| which(*strategy))
            .max_by(|a, b| a.2.total_cmp(&b.2))
    }

    /// The processor time per message of the relay and of the fastest same-guarantee loops,
    /// in this process and in the server's.
    fn cpu_rows(&self, number: &str) -> Vec<Row> {
        let mut measured = vec![("the relay".to_owned(), self.relay_cpu)];
        for which in [Strategy::same_guarantee, Strategy::ordered] {
            if let Some((strategy, connections, _, cpu)) = self.fastest(which) {
                let what = format!("{}, {connections} conn.", strategy.describe());
                measured.push((what, *cpu));
            }
        }
        cpu_rows(number, "PostgreSQL", measured)
    }

    /// The relay against the best ordered loop (the bar: `ratio` of it), the best
    /// same-guarantee loop that keeps no order per shard (the bar instead where no ordered
    /// loop ran) and the best ceiling, where measured (for information); then a row per
    /// baseline.
    fn against_the_bar(&self, scenario: &str, number: &str, ratio: f64) -> Vec<Row> {
        let mut rows = Vec::new();
        let (ordered, rate) = self.best_of(Strategy::ordered);
        let ordered_ran = rate > 0.0;
        if ordered_ran {
            rows.push(Row::compared(
                &format!(
                    "{scenario}, vs the same-guarantee loop that also keeps order per shard ({ordered})"
                ),
                "messages/s",
                self.relay_rows,
                rate,
                Target::Ratio(ratio),
            ));
        }
        let (bar, rate) = self.best_same_guarantee();
        rows.push(Row::compared(
            &format!("{scenario}, vs the same-guarantee loop ({bar})"),
            "messages/s",
            self.relay_rows,
            rate,
            if ordered_ran {
                Target::None
            } else {
                Target::Ratio(ratio)
            },
        ));
        let (ceiling, rate) =
            self.best_of(|strategy| !strategy.same_guarantee() && !strategy.ordered());
        if rate > 0.0 {
            rows.push(Row::compared(
                &format!("{scenario}, vs the physical ceiling ({ceiling})"),
                "messages/s",
                self.relay_rows,
                rate,
                Target::None,
            ));
        }
        rows.extend(self.cpu_rows(number));
        rows.extend(self.rows(number));
        rows
    }

    /// A row per baseline, for the table.
    fn rows(&self, scenario: &str) -> Vec<Row> {
        self.baselines
            .iter()
            .map(|(strategy, connections, rate, _)| {
                Row::measured(
                    &format!(
                        "{scenario} baseline: {}, {connections} connection(s), RETURNING id, payload",
                        strategy.describe()
                    ),
                    "rows/s",
                    *rate,
                    Target::None,
                )
            })
            .collect()
    }
}

/// The relay twice, then each of `strategies` over 1, 2 and 4 connections, each on freshly
/// seeded rows: the relay's best rate, and each baseline's.
async fn compare_pg(
    pool: &PgPool,
    messages: u64,
    shards: u64,
    groups_per_shard: u64,
    calls_expected: u64,
    strategies: &[Strategy],
) -> Result<Measured, String> {
    let (mut relay_rows, mut relay_groups) = (0.0f64, 0.0f64);
    let mut relay_cpu = CpuPerMessage::default();
    for _ in 0..2 {
        seed_pg(pool, messages, shards, groups_per_shard).await?;
        let clock = CpuClock::start();
        let (rows, calls, seconds) = relay_pg(pool).await?;
        let cpu = clock.per_message(rows);
        check(rows, messages, "rows drained")?;
        check(calls, calls_expected, "handler calls")?;
        let rate = rows as f64 / seconds;
        if rate > relay_rows {
            relay_rows = rate;
            relay_cpu = cpu;
        }
        relay_groups = relay_groups.max(calls as f64 / seconds);
    }
    let mut baselines = Vec::new();
    for strategy in strategies {
        for connections in [1, 2, 4] {
            seed_pg(pool, messages, shards, groups_per_shard).await?;
            let clock = CpuClock::start();
            let (rows, rate) =
                baselines::drain(pool, *strategy, connections, shards, messages / shards).await?;
            let cpu = clock.per_message(rows);
            check(rows, messages, &strategy.describe())?;
            baselines.push((*strategy, connections, rate, cpu));
        }
    }
    Ok(Measured {
        relay_rows,
        relay_groups,
        relay_cpu,
        baselines,
    })
}

/// Scenario 2: 1,000,000 pending messages over 10,000 shards, no coalescing: against the
/// ordered loop shaped for dense shards (the bar: at least as fast), the same-guarantee loops
/// and the ceilings.
pub(crate) async fn plain(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let (messages, shards) = (args.sized(1_000_000, 10_000), args.sized(10_000, 100));
    let database = server.database(20).await?;
    let strategies = [
        &Strategy::SAME_GUARANTEE[..],
        &Strategy::ORDERED_DENSE[..],
        &Strategy::CEILINGS[..],
    ]
    .concat();
    let measured = compare_pg(&database.pool, messages, shards, 0, messages, &strategies).await?;
    database.drop_database().await?;
    let scenario =
        format!("2. drain, no coalescing: {messages} messages, {shards} shards (PostgreSQL)");
    Ok(measured.against_the_bar(&scenario, "2.", 1.0))
}

/// Scenario 12: the sparse shape, one message per shard: 100,000 messages over 100,000
/// shards, against the loop that also keeps order per shard (the bar: 80% of it), and the
/// same-guarantee loop that keeps none.
pub(crate) async fn sparse(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let messages = args.sized(100_000, 2_000);
    let database = server.database(20).await?;
    let strategies = [&Strategy::SAME_GUARANTEE[..], &Strategy::ORDERED[..]].concat();
    let measured = compare_pg(&database.pool, messages, messages, 0, messages, &strategies).await?;
    database.drop_database().await?;
    let scenario = format!(
        "12. sparse drain, one message per shard: {messages} messages, {messages} shards (PostgreSQL)"
    );
    Ok(measured.against_the_bar(&scenario, "12.", 0.8))
}

/// Scenario 3: 1,000,000 messages in 100,000 groups over 10,000 shards: one handler call per
/// group (checked: the run fails otherwise).
pub(crate) async fn coalescing(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let (messages, shards) = (args.sized(1_000_000, 10_000), args.sized(10_000, 100));
    let groups = shards * 10;
    let database = server.database(20).await?;
    let measured = compare_pg(
        &database.pool,
        messages,
        shards,
        10,
        groups,
        &Strategy::CEILINGS,
    )
    .await?;
    database.drop_database().await?;
    let (best, rate) = measured.best();
    let mut rows = vec![
        Row::compared(
            &format!(
                "3. drain, coalescing: {messages} messages, {groups} groups, {shards} shards \
                 (PostgreSQL), vs the best baseline ({best})"
            ),
            "rows/s",
            measured.relay_rows,
            rate,
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
            measured.relay_groups,
            Target::None,
        ),
    ];
    rows.extend(measured.rows("3."));
    Ok(rows)
}

pub(super) fn check(found: u64, expected: u64, what: &str) -> Result<(), String> {
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

/// Scenario 6: scenario 2 on SQLite, at 100,000 messages over 1,000 shards, and the sparse
/// shape (scenario 12) at 20,000 messages over as many shards, each against the SQLite
/// same-guarantee loop, with the raw delete loop (no lease, no delivery outside its
/// statement) beside it as the ceiling.
pub(crate) async fn sqlite(args: &BenchArgs) -> Result<Vec<Row>, String> {
    let dense = (args.sized(100_000, 2_000), args.sized(1_000, 20));
    let sparse = args.sized(20_000, 1_000);
    let mut rows = Vec::new();
    for (messages, shards, shape) in [
        (dense.0, dense.1, "no coalescing"),
        (sparse, sparse, "sparse, one message per shard"),
    ] {
        let measured = compare_sqlite(messages, shards).await?;
        let (best, bar, best_cpu) = measured
            .loops
            .iter()
            .copied()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .ok_or("no same-guarantee loop ran")?;
        rows.push(Row::compared(
            &format!(
                "6. SQLite drain, {shape}: {messages} messages, {shards} shards, vs the \
                 same-guarantee loop (lease {best}, commit, deliver, delete by id)"
            ),
            "messages/s",
            measured.relay,
            bar,
            Target::Ratio(0.8),
        ));
        rows.push(Row::compared(
            &format!(
                "6. SQLite drain, {shape}: {messages} messages, {shards} shards, vs the \
                 same-guarantee loop that also keeps order per shard (ordered loop: lease the \
                 shards of 1000 rows, read them, commit, deliver, delete rows and leases by token)"
            ),
            "messages/s",
            measured.relay,
            measured.ordered.0,
            Target::None,
        ));
        for (what, cpu) in [
            ("the relay".to_owned(), measured.relay_cpu),
            (format!("the same-guarantee loop (lease {best})"), best_cpu),
            ("the ordered loop".to_owned(), measured.ordered.1),
        ] {
            if let Some(micros) = cpu {
                rows.push(Row::measured(
                    &format!(
                        "6. processor time per message ({shape}), {what}, SQLite's work included"
                    ),
                    "µs",
                    micros,
                    Target::None,
                ));
            }
        }
        for (batch, rate, _) in &measured.loops {
            rows.push(Row::measured(
                &format!(
                    "6. baseline ({shape}): same-guarantee loop (lease {batch}, commit, \
                     deliver, delete by id), 1 connection"
                ),
                "rows/s",
                *rate,
                Target::None,
            ));
        }
        rows.push(Row::measured(
            &format!(
                "6. ceiling ({shape}): raw loop deleting the oldest 1,000 rows, returning \
                 id and payload"
            ),
            "rows/s",
            measured.ceiling,
            Target::None,
        ));
    }
    Ok(rows)
}

/// Scenario 6's figures of one shape.
struct SqliteDrains {
    /// The relay's messages/s.
    relay: f64,
    /// The relay's processor time per message (SQLite works in this process).
    relay_cpu: Option<f64>,
    /// The same-guarantee loop's rows/s and processor time per message, by lease batch.
    loops: Vec<(i64, f64, Option<f64>)>,
    /// The ordered loop's rows/s and processor time per message (leases of 1,000 rows' shards).
    ordered: (f64, Option<f64>),
    /// The raw delete loop's rows/s.
    ceiling: f64,
}

/// The relay's drain of `messages` over `shards` on SQLite, then the same-guarantee loop at
/// each batch size and the raw delete loop, each on freshly seeded rows: their rates.
async fn compare_sqlite(messages: u64, shards: u64) -> Result<SqliteDrains, String> {
    let database = SqliteDatabase::new().await?;
    let pool = &database.pool;
    seed_sqlite(pool, messages, shards).await?;
    let (relay, calls) = counting_relay(SqliteStore::new(pool.clone()), RelayConfig::default());
    let (started, clock) = (Instant::now(), CpuClock::start());
    let report = relay
        .drain()
        .await
        .map_err(failed("draining with the relay"))?;
    let seconds = started.elapsed().as_secs_f64();
    let relay_cpu = clock.per_message(report.rows_acknowledged).process;
    check(report.rows_acknowledged, messages, "rows drained")?;
    check(calls.load(Ordering::Relaxed), messages, "handler calls")?;

    sqlx::query("ALTER TABLE outbox_messages ADD COLUMN leased_until INTEGER")
        .execute(pool)
        .await
        .map_err(failed("adding the loop's lease column"))?;
    let mut loops = Vec::new();
    for batch in [100, 1_000] {
        seed_sqlite(pool, messages, shards).await?;
        let (started, clock) = (Instant::now(), CpuClock::start());
        let rows = sqlite_leased(pool, batch).await?;
        let rate = rows as f64 / started.elapsed().as_secs_f64();
        loops.push((batch, rate, clock.per_message(rows).process));
        check(rows, messages, "rows delivered by the same-guarantee loop")?;
    }

    sqlx::query(
        "CREATE TABLE bench_shard_leases (shard_scope INTEGER NOT NULL, \
         shard_identifier INTEGER NOT NULL, destination TEXT NOT NULL, token INTEGER NOT NULL, \
         expires_at INTEGER NOT NULL, \
         PRIMARY KEY (shard_scope, shard_identifier, destination)) WITHOUT ROWID",
    )
    .execute(pool)
    .await
    .map_err(failed("creating the ordered loop's lease table"))?;
    seed_sqlite(pool, messages, shards).await?;
    let (started, clock) = (Instant::now(), CpuClock::start());
    let rows = sqlite_ordered(pool, 1_000).await?;
    let ordered = (
        rows as f64 / started.elapsed().as_secs_f64(),
        clock.per_message(rows).process,
    );
    check(rows, messages, "rows delivered by the ordered loop")?;

    seed_sqlite(pool, messages, shards).await?;
    let started = Instant::now();
    let mut rows = 0;
    loop {
        let deleted = sqlx::query(
            "DELETE FROM outbox_messages WHERE id IN \
             (SELECT id FROM outbox_messages ORDER BY id LIMIT 1000) \
             RETURNING id, payload",
        )
        .fetch_all(pool)
        .await
        .map_err(failed("the raw delete loop"))?;
        if deleted.is_empty() {
            break;
        }
        rows += baselines::read(&deleted)?;
    }
    let ceiling = rows as f64 / started.elapsed().as_secs_f64();
    check(rows, messages, "rows deleted by the raw loop")?;
    Ok(SqliteDrains {
        relay: messages as f64 / seconds,
        relay_cpu,
        loops,
        ordered,
        ceiling,
    })
}

/// SQLite's same-guarantee loop, as PostgreSQL's: lease up to `batch` unleased rows in one
/// committed statement (their ids and payloads returned), deliver them outside it (read
/// them), delete them by id in a second one. It goes on from the highest id it leased.
async fn sqlite_leased(pool: &SqlitePool, batch: i64) -> Result<u64, String> {
    let mut rows = 0;
    let mut after = i64::MIN;
    loop {
        let leased = sqlx::query(
            "UPDATE outbox_messages \
             SET leased_until = CAST(unixepoch('subsec') * 1000 AS INTEGER) + 30000 \
             WHERE id IN (SELECT id FROM outbox_messages \
                 WHERE id > ?2 AND (leased_until IS NULL \
                     OR leased_until < CAST(unixepoch('subsec') * 1000 AS INTEGER)) \
                 ORDER BY id LIMIT ?1) \
             RETURNING id, payload",
        )
        .bind(batch)
        .bind(after)
        .fetch_all(pool)
        .await
        .map_err(failed("the same-guarantee loop's lease"))?;
        if leased.is_empty() {
            return Ok(rows);
        }
        let ids = delivered(&leased, &mut rows, &mut after)?;
        sqlx::query("DELETE FROM outbox_messages WHERE id IN (SELECT value FROM json_each(?1))")
            .bind(ids)
            .execute(pool)
            .await
            .map_err(failed("the same-guarantee loop's delete"))?;
    }
}

/// What a SQLite loop leased, read as a relay reads what it delivers: counted into `rows`,
/// `after` moved past it; its ids as the JSON array the loop's delete binds.
fn delivered(
    leased: &[sqlx::sqlite::SqliteRow],
    rows: &mut u64,
    after: &mut i64,
) -> Result<String, String> {
    *rows += baselines::read(leased)?;
    let ids: Vec<i64> = leased.iter().map(|row| row.get(0)).collect();
    *after = ids.iter().copied().max().unwrap_or(*after);
    let ids: Vec<String> = ids.iter().map(i64::to_string).collect();
    Ok(format!("[{}]", ids.join(",")))
}

/// SQLite's ordered loop, as PostgreSQL's (`baselines::shard_leased`): in one write
/// transaction, lease the shards of the next `batch` rows (a lease row per shard, with a
/// token) and read all of those shards' rows; deliver them outside it (read them); then, in a
/// second one, delete the rows whose shard's lease is still held by the token, and the leases.
/// With one connection (SQLite has one writer) every shard of a page is leased by it, so the
/// rows delivered include the whole page and it goes on from the highest id delivered.
async fn sqlite_ordered(pool: &SqlitePool, batch: i64) -> Result<u64, String> {
    let mut rows = 0;
    let mut after = i64::MIN;
    for token in 1_i64.. {
        let mut tx = pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(failed("the ordered loop's lease"))?;
        sqlx::query(
            "INSERT INTO bench_shard_leases \
                 (shard_scope, shard_identifier, destination, token, expires_at) \
             SELECT DISTINCT shard_scope, shard_identifier, destination, ?3, \
                 CAST(unixepoch('subsec') * 1000 AS INTEGER) + 30000 \
             FROM (SELECT shard_scope, shard_identifier, destination FROM outbox_messages \
                 WHERE id > ?2 ORDER BY id LIMIT ?1) WHERE true \
             ON CONFLICT DO NOTHING",
        )
        .bind(batch)
        .bind(after)
        .bind(token)
        .execute(&mut *tx)
        .await
        .map_err(failed("the ordered loop's lease"))?;
        let leased = sqlx::query(
            "SELECT m.id, m.payload FROM bench_shard_leases l JOIN outbox_messages m \
                 ON m.shard_scope = l.shard_scope AND m.shard_identifier = l.shard_identifier \
                 AND m.destination = l.destination \
             WHERE l.token = ?1",
        )
        .bind(token)
        .fetch_all(&mut *tx)
        .await
        .map_err(failed("the ordered loop's read"))?;
        tx.commit()
            .await
            .map_err(failed("the ordered loop's lease"))?;
        if leased.is_empty() {
            return Ok(rows);
        }
        let ids = delivered(&leased, &mut rows, &mut after)?;
        let mut tx = pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(failed("the ordered loop's delete"))?;
        sqlx::query(
            "DELETE FROM outbox_messages AS m WHERE id IN (SELECT value FROM json_each(?1)) \
             AND EXISTS (SELECT 1 FROM bench_shard_leases l WHERE l.token = ?2 \
                 AND l.shard_scope = m.shard_scope AND l.shard_identifier = m.shard_identifier \
                 AND l.destination = m.destination)",
        )
        .bind(ids)
        .bind(token)
        .execute(&mut *tx)
        .await
        .map_err(failed("the ordered loop's delete"))?;
        sqlx::query("DELETE FROM bench_shard_leases WHERE token = ?1")
            .bind(token)
            .execute(&mut *tx)
            .await
            .map_err(failed("the ordered loop's release"))?;
        tx.commit()
            .await
            .map_err(failed("the ordered loop's delete"))?;
    }
    Ok(rows)
}
