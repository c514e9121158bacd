//! The writers. Sequenced writers each own every `writers`-th shard and write its messages
//! 0, 1, 2… in batches; coalescing writers update shared groups, several at once, each
//! transaction pausing before it commits so that rows commit out of id order. Every outbox
//! write commits with a row of the writer's own table, the "business data", so that what was
//! written is known exactly, even when a commit's outcome is lost to a server restart.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use outbox_core::Message;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::{MySqlPool, PgPool, SqlitePool};
use tokio::task::JoinSet;

use super::check::{CoalescedRow, Written};
use super::{Backend, Coalesced, Sequenced, Settings, Step, Update, now_ns};

/// Batches of the sequenced messages before the relays start, and after.
const PREFILL_BATCH: usize = 250;
const LIVE_BATCH: usize = 50;

/// The run's database, from the parent's side.
#[derive(Debug, Clone)]
pub(crate) enum Db {
    /// PostgreSQL.
    Pg(PgPool),
    /// SQLite.
    Sqlite(SqlitePool),
    /// MariaDB.
    My(MySqlPool),
}

fn failed<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |error| format!("{what}: {error}")
}

impl Db {
    pub(crate) async fn open(backend: Backend, database: &str) -> Result<Self, String> {
        Ok(match backend {
            Backend::Postgres => Self::Pg(
                PgPoolOptions::new()
                    .max_connections(10)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect(database)
                    .await
                    .map_err(failed("connecting to the private server"))?,
            ),
            Backend::Sqlite => Self::Sqlite(
                outbox_sqlite::connect(std::path::Path::new(database))
                    .await
                    .map_err(failed("opening the SQLite database"))?,
            ),
            Backend::Mariadb => Self::My(
                MySqlPoolOptions::new()
                    .max_connections(10)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect(database)
                    .await
                    .map_err(failed("connecting to the private server"))?,
            ),
        })
    }

    /// Migrates, and creates the writers' tables.
    pub(crate) async fn prepare(&self) -> Result<(), String> {
        const TABLES: &str = "\
            CREATE TABLE chaos_batches (writer INTEGER NOT NULL, batch INTEGER NOT NULL, \
                PRIMARY KEY (writer, batch)); \
            CREATE TABLE chaos_coalesced (message_id BIGINT PRIMARY KEY, grp BIGINT NOT NULL);";
        match self {
            Self::Pg(pool) => {
                outbox_postgres::migrate(pool)
                    .await
                    .map_err(failed("migrating"))?;
                sqlx::raw_sql(TABLES).execute(pool).await.map(drop)
            }
            Self::Sqlite(pool) => {
                outbox_sqlite::migrate(pool)
                    .await
                    .map_err(failed("migrating"))?;
                sqlx::raw_sql(TABLES).execute(pool).await.map(drop)
            }
            Self::My(pool) => {
                outbox_mysql::migrate(pool)
                    .await
                    .map_err(failed("migrating"))?;
                sqlx::raw_sql(TABLES).execute(pool).await.map(drop)
            }
        }
        .map_err(failed("creating the writers' tables"))
    }

    /// Writes batch `batch` of `writer` and its `chaos_batches` row in one transaction.
    async fn write_batch(
        &self,
        writer: u32,
        batch: u32,
        messages: &[Message],
    ) -> Result<(), String> {
        macro_rules! write_batch {
            ($begin:expr, $write_all:path, $insert:literal) => {{
                let mut tx = $begin.await.map_err(failed("begin"))?;
                $write_all(&mut *tx, messages)
                    .await
                    .map_err(failed("write_all"))?;
                sqlx::query($insert)
                    .bind(writer as i32)
                    .bind(batch as i32)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed("insert"))?;
                tx.commit().await.map_err(failed("commit"))
            }};
        }
        match self {
            Self::Pg(pool) => write_batch!(
                pool.begin(),
                outbox_postgres::write_all,
                "INSERT INTO chaos_batches (writer, batch) VALUES ($1, $2)"
            ),
            Self::Sqlite(pool) => write_batch!(
                pool.begin_with("BEGIN IMMEDIATE"),
                outbox_sqlite::write_all,
                "INSERT INTO chaos_batches (writer, batch) VALUES (?1, ?2)"
            ),
            Self::My(pool) => write_batch!(
                pool.begin(),
                outbox_mysql::write_all,
                "INSERT INTO chaos_batches (writer, batch) VALUES (?, ?)"
            ),
        }
    }

    /// Whether batch `batch` of `writer` committed.
    async fn batch_committed(&self, writer: u32, batch: u32) -> Result<bool, String> {
        let count: i64 = match self {
            Self::Pg(pool) => {
                sqlx::query_scalar(
                    "SELECT count(*) FROM chaos_batches WHERE writer = $1 AND batch = $2",
                )
                .bind(writer as i32)
                .bind(batch as i32)
                .fetch_one(pool)
                .await
            }
            Self::Sqlite(pool) => {
                sqlx::query_scalar(
                    "SELECT count(*) FROM chaos_batches WHERE writer = ?1 AND batch = ?2",
                )
                .bind(writer as i32)
                .bind(batch as i32)
                .fetch_one(pool)
                .await
            }
            Self::My(pool) => {
                sqlx::query_scalar(
                    "SELECT count(*) FROM chaos_batches WHERE writer = ? AND batch = ?",
                )
                .bind(writer as i32)
                .bind(batch as i32)
                .fetch_one(pool)
                .await
            }
        }
        .map_err(failed("checking a batch"))?;
        Ok(count > 0)
    }

    /// Writes one update of each group in one transaction, with their `chaos_coalesced`
    /// rows, pausing `hold` before the commit. Returns the rows it tried to commit (with the
    /// time just before the commit, if it got that far) and whether the commit succeeded.
    async fn write_updates(
        &self,
        writer: u32,
        shards: u64,
        groups: &[i64],
        hold: Duration,
    ) -> (Vec<CoalescedRow>, Result<(), String>) {
        let mut rows = Vec::new();
        let result = self
            .try_write_updates(writer, shards, groups, hold, &mut rows)
            .await;
        (rows, result)
    }

    async fn try_write_updates(
        &self,
        writer: u32,
        shards: u64,
        groups: &[i64],
        hold: Duration,
        rows: &mut Vec<CoalescedRow>,
    ) -> Result<(), String> {
        let messages = groups
            .iter()
            .map(|&group| {
                Message::new::<Coalesced>(group % shards as i64, group, &Update { group, writer })
                    .map_err(failed("a message"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        macro_rules! write_updates {
            ($begin:expr, $write:path, $insert:literal) => {{
                let mut tx = $begin.await.map_err(failed("begin"))?;
                let mut ids = Vec::new();
                for message in &messages {
                    ids.push($write(&mut *tx, message).await.map_err(failed("write"))?.0);
                }
                for (&id, &group) in ids.iter().zip(groups) {
                    sqlx::query($insert)
                        .bind(id)
                        .bind(group)
                        .execute(&mut *tx)
                        .await
                        .map_err(failed("insert"))?;
                }
                tokio::time::sleep(hold).await;
                let before_commit = now_ns();
                rows.extend(
                    ids.iter()
                        .zip(groups)
                        .map(|(&message_id, &group)| CoalescedRow {
                            message_id,
                            group,
                            before_commit,
                        }),
                );
                tx.commit().await.map_err(failed("commit"))
            }};
        }
        match self {
            Self::Pg(pool) => write_updates!(
                pool.begin(),
                outbox_postgres::write,
                "INSERT INTO chaos_coalesced (message_id, grp) VALUES ($1, $2)"
            ),
            Self::Sqlite(pool) => write_updates!(
                pool.begin_with("BEGIN IMMEDIATE"),
                outbox_sqlite::write,
                "INSERT INTO chaos_coalesced (message_id, grp) VALUES (?1, ?2)"
            ),
            Self::My(pool) => write_updates!(
                pool.begin(),
                outbox_mysql::write,
                "INSERT INTO chaos_coalesced (message_id, grp) VALUES (?, ?)"
            ),
        }
    }

    /// Rows in the outbox.
    pub(crate) async fn pending(&self) -> Result<i64, String> {
        const COUNT: &str = "SELECT count(*) FROM outbox_messages";
        match self {
            Self::Pg(pool) => sqlx::query_scalar(COUNT).fetch_one(pool).await,
            Self::Sqlite(pool) => sqlx::query_scalar(COUNT).fetch_one(pool).await,
            Self::My(pool) => sqlx::query_scalar(COUNT).fetch_one(pool).await,
        }
        .map_err(failed("counting the outbox"))
    }

    /// What committed: the sequenced messages of the batches recorded in `chaos_batches`
    /// (planned by `plans`), and the coalescing rows recorded in `chaos_coalesced` (with the
    /// commit times of `attempts`).
    pub(crate) async fn written(
        &self,
        plans: &[Plan],
        attempts: &[CoalescedRow],
    ) -> Result<Written, String> {
        const BATCHES: &str = "SELECT writer, batch FROM chaos_batches";
        const ROWS: &str = "SELECT message_id FROM chaos_coalesced";
        type Read = (
            Result<Vec<(i32, i32)>, sqlx::Error>,
            Result<Vec<i64>, sqlx::Error>,
        );
        let (batches, rows): Read = match self {
            Self::Pg(pool) => (
                sqlx::query_as(BATCHES).fetch_all(pool).await,
                sqlx::query_scalar(ROWS).fetch_all(pool).await,
            ),
            Self::Sqlite(pool) => (
                sqlx::query_as(BATCHES).fetch_all(pool).await,
                sqlx::query_scalar(ROWS).fetch_all(pool).await,
            ),
            Self::My(pool) => (
                sqlx::query_as(BATCHES).fetch_all(pool).await,
                sqlx::query_scalar(ROWS).fetch_all(pool).await,
            ),
        };
        let batches = batches.map_err(failed("reading the committed batches"))?;
        let rows = rows.map_err(failed("reading the committed coalescing rows"))?;
        let mut written = Written::default();
        for (writer, batch) in batches {
            let plan = plans
                .get(writer as usize)
                .and_then(|plan| plan.batches.get(batch as usize))
                .ok_or_else(|| format!("batch {batch} of writer {writer} was never planned"))?;
            for &(shard, seq) in plan {
                written.sequenced.entry(shard).or_default().push(seq);
            }
        }
        for seqs in written.sequenced.values_mut() {
            seqs.sort_unstable();
        }
        let attempts: HashMap<i64, &CoalescedRow> =
            attempts.iter().map(|row| (row.message_id, row)).collect();
        for id in rows {
            let row = attempts.get(&id).ok_or_else(|| {
                format!("coalescing message {id} committed unbeknownst to its writer")
            })?;
            written.coalesced.push(**row);
        }
        Ok(written)
    }

    pub(crate) async fn close(&self) {
        match self {
            Self::Pg(pool) => pool.close().await,
            Self::Sqlite(pool) => pool.close().await,
            Self::My(pool) => pool.close().await,
        }
    }
}

/// What one sequenced writer writes: its shards' messages, interleaved at random, in
/// batches.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    writer: u32,
    /// Each batch's `(shard, seq)`s.
    batches: Vec<Vec<(i64, i64)>>,
    /// How many batches are written before the relays start.
    prefill: usize,
}

impl Plan {
    /// The plans of the sequenced writers: writer `w` owns the shards `s` with
    /// `s % writers == w`; each shard gets `messages / shards` messages (the first few one
    /// more), numbered in write order.
    pub(crate) fn sequenced(settings: &Settings, rng: &mut StdRng) -> Vec<Self> {
        let (shards, writers) = (settings.shards, u64::from(settings.writers));
        (0..writers)
            .map(|writer| {
                // Each shard's remaining messages, picked at random one by one.
                let mut left: Vec<(i64, i64, u64)> = (writer..shards)
                    .step_by(writers as usize)
                    .map(|shard| {
                        let count = settings.messages / shards
                            + u64::from(shard < settings.messages % shards);
                        (shard as i64, 0, count)
                    })
                    .filter(|&(_, _, count)| count > 0)
                    .collect();
                let mut order = Vec::new();
                while !left.is_empty() {
                    let index = rng.random_range(0..left.len());
                    let (shard, seq, count) = &mut left[index];
                    order.push((*shard, *seq));
                    *seq += 1;
                    *count -= 1;
                    if *count == 0 {
                        left.swap_remove(index);
                    }
                }
                let half = order.len() / 2;
                let mut batches: Vec<Vec<(i64, i64)>> = order[..half]
                    .chunks(PREFILL_BATCH)
                    .map(<[_]>::to_vec)
                    .collect();
                let prefill = batches.len();
                batches.extend(order[half..].chunks(LIVE_BATCH).map(<[_]>::to_vec));
                Self {
                    writer: writer as u32,
                    batches,
                    prefill,
                }
            })
            .collect()
    }

    /// Writes batch `index`, retrying until it is known to have committed: after a failure
    /// (a server restart), the writer's table says whether the commit happened.
    async fn write(&self, db: &Db, index: usize, deadline: Instant) -> Result<(), String> {
        let messages = self.batches[index]
            .iter()
            .map(|&(shard, seq)| Message::new::<Sequenced>(shard, seq, &Step { shard, seq }))
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed("a message"))?;
        let batch = index as u32;
        loop {
            let error = match db.write_batch(self.writer, batch, &messages).await {
                Ok(()) => return Ok(()),
                Err(error) => error,
            };
            loop {
                if Instant::now() > deadline {
                    return Err(format!(
                        "writer {} could not write batch {batch} before the deadline: {error}",
                        self.writer
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                match db.batch_committed(self.writer, batch).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => break,
                    Err(_) => continue,
                }
            }
        }
    }
}

/// Writes the batches of each plan that precede the relays, the writers at once.
pub(crate) async fn prefill(db: &Db, plans: &[Plan], deadline: Instant) -> Result<(), String> {
    let mut tasks = JoinSet::new();
    for plan in plans {
        let (db, plan) = (db.clone(), plan.clone());
        tasks.spawn(async move {
            for index in 0..plan.prefill {
                plan.write(&db, index, deadline).await?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|error| format!("a writer panicked: {error}"))??;
    }
    Ok(())
}

/// Starts the writers that race the relays: the sequenced writers' remaining batches, paced
/// over the window, and the coalescing writers, for the window. Each returns the coalescing
/// rows it tried to commit.
pub(crate) fn start(
    db: &Db,
    plans: &[Plan],
    settings: &Settings,
    deadline: Instant,
    seed: u64,
) -> JoinSet<Result<Vec<CoalescedRow>, String>> {
    let mut tasks = JoinSet::new();
    for plan in plans {
        let (db, plan, window) = (db.clone(), plan.clone(), settings.window);
        tasks.spawn(async move {
            let live = plan.batches.len() - plan.prefill;
            let pace = window / u32::try_from(live.max(1)).unwrap_or(u32::MAX);
            let started = tokio::time::Instant::now();
            for (n, index) in (plan.prefill..plan.batches.len()).enumerate() {
                tokio::time::sleep_until(started + pace * n as u32).await;
                plan.write(&db, index, deadline).await?;
            }
            Ok(Vec::new())
        });
    }
    let all_groups: Vec<i64> = (0..settings.groups as i64).collect();
    for writer in 0..settings.coalescing_writers {
        let (db, window, shards) = (db.clone(), settings.window, settings.shards);
        let mut rng = StdRng::seed_from_u64(seed ^ u64::from(writer));
        let mut all_groups = all_groups.clone();
        tasks.spawn(async move {
            let mut attempted = Vec::new();
            let started = Instant::now();
            while started.elapsed() < window {
                let count = rng.random_range(1..=3usize).min(all_groups.len());
                all_groups.shuffle(&mut rng);
                let groups = &all_groups[..count];
                let hold = Duration::from_micros(rng.random_range(0..5_000));
                let (rows, result) = db.write_updates(writer, shards, groups, hold).await;
                // A failed commit may still have committed: the table will say.
                if result.is_err() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                attempted.extend(rows);
                tokio::time::sleep(Duration::from_micros(rng.random_range(2_000..20_000))).await;
            }
            Ok(attempted)
        });
    }
    tasks
}
