//! Scenario 14: the console's pages at a large outbox, on PostgreSQL and on SQLite. At full
//! scale, 10,000,000 pending messages over 100,000 shards (100 of them failing, with an error
//! recorded), a hot shard of 500,000 more, a paused scope of 10 shards and 1,000 messages, a
//! paused shard, and 1,000,000 dead letters, written with `INSERT … SELECT` over a series;
//! then each page, through the console's router in this process (its queries and its
//! rendering, no network), the median of a few requests. The target: every page under 200 ms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use outbox_core::admin::Operations;
use outbox_postgres::PgStore;
use outbox_sqlite::SqliteStore;
use outbox_web::ConsoleOptions;
use tower::ServiceExt;

use super::BenchArgs;
use super::report::{Row, Target};
use super::setup::{Server, SqliteDatabase, failed};

/// The median time of `reads` requests for `path`, and the status of the last.
async fn median(
    app: &axum::Router,
    path: &str,
    reads: usize,
) -> Result<(Duration, StatusCode), String> {
    let mut times = Vec::with_capacity(reads);
    let mut status = StatusCode::OK;
    for _ in 0..reads {
        let request = Request::get(path)
            .body(Body::empty())
            .map_err(|error| error.to_string())?;
        let started = Instant::now();
        let response = app
            .clone()
            .oneshot(request)
            .await
            .map_err(|error| error.to_string())?;
        status = response.status();
        response
            .into_body()
            .collect()
            .await
            .map_err(|error| error.to_string())?;
        times.push(started.elapsed());
    }
    times.sort_unstable();
    Ok((times[times.len() / 2], status))
}

/// The outbox both databases hold.
struct Shape {
    pending: u64,
    letters: u64,
    shards: i64,
    /// One shard far deeper than the others, half of its messages of a category of their own.
    hot: u64,
}

impl Shape {
    fn new(args: &BenchArgs) -> Self {
        let pending = args.sized(10_000_000, 20_000);
        Self {
            pending,
            letters: args.sized(1_000_000, 2_000),
            shards: 100_000
                .min(i64::try_from(pending / 10).unwrap_or(i64::MAX))
                .max(10),
            hot: args.sized(500_000, 1_000),
        }
    }

    /// The statements that write it, each with what it does, in a dialect whose series of
    /// `1..=n` is `series(n)` (a source of rows `g`) and whose time in `seconds` from now is
    /// `at(seconds)`.
    fn statements(
        &self,
        series: impl Fn(u64) -> String,
        at: impl Fn(&str) -> String,
    ) -> Vec<(&'static str, String)> {
        let Self {
            pending,
            letters,
            shards,
            hot,
        } = self;
        let messages = "INSERT INTO outbox_messages (shard_scope, shard_identifier, destination, \
                        category, object_identifier, payload)";
        vec![
            (
                "writing the backlog",
                format!(
                    "{messages} SELECT 1, g % {shards}, '', 1, g, '{{\"seq\": 1}}' FROM {}",
                    series(*pending)
                ),
            ),
            (
                "recording failing shards",
                format!(
                    "INSERT INTO outbox_shards (shard_scope, shard_identifier, destination, \
                         attempts, last_error, retry_at, watermark) \
                     SELECT 1, g - 1, '', 3, 'handler failed: the service answered 503', {}, \
                         {pending} FROM {}",
                    at("3600"),
                    series(100)
                ),
            ),
            (
                "writing the dead letters",
                format!(
                    "INSERT INTO outbox_dead_letters (message_id, shard_scope, shard_identifier, \
                         destination, category, object_identifier, payload, created_at, error, \
                         attempts, first_failed_at, dead_lettered_at, lease_token) \
                     SELECT {pending} + g, 1, g % {shards}, '', 1, g, '{{\"seq\": 1}}', {now}, \
                         'handler failed: no such project', 5, {now}, {ago}, g FROM {}",
                    series(*letters),
                    now = at("0"),
                    ago = at("-g"),
                ),
            ),
            (
                "writing a hot shard",
                format!(
                    "{messages} SELECT 1, {shards}, '', 1 + g % 2, g, '{{\"seq\": 1}}' FROM {}",
                    series(*hot)
                ),
            ),
            (
                "writing a small scope",
                format!(
                    "{messages} SELECT 2, g % 10, '', 3, g, '{{\"seq\": 1}}' FROM {}",
                    series(1_000)
                ),
            ),
            (
                "pausing the small scope and a shard",
                format!(
                    "INSERT INTO outbox_pauses (kind, shard_scope, shard_identifier, reason, \
                         paused_at) \
                     VALUES ('scope', 2, 0, 'bench', {now}), ('shard', 1, 5, 'bench', {now})",
                    now = at("0")
                ),
            ),
            ("analyzing", "ANALYZE".to_owned()),
        ]
    }

    /// Each page measured, and its path.
    fn pages(&self) -> Vec<(&'static str, String)> {
        let shards = self.shards;
        vec![
            ("overview", "/".to_owned()),
            ("shards, deepest first", "/shards".to_owned()),
            ("failing shards", "/shards?filter=failing".to_owned()),
            ("paused shards", "/shards?filter=paused".to_owned()),
            ("shards of a small scope", "/shards?scope=2".to_owned()),
            ("shards of a category", "/shards?category=2".to_owned()),
            ("parked shards", "/shards?filter=parked".to_owned()),
            ("a shard's page", format!("/shard?key=1%3A{}", shards - 1)),
            ("the hot shard's page", format!("/shard?key=1%3A{shards}")),
            ("dead letters", "/dead-letters".to_owned()),
            (
                "dead letters of a category",
                "/dead-letters?category=1".to_owned(),
            ),
            (
                "a dead letter's page",
                format!("/dead-letter?id={}", self.pending + self.letters / 2),
            ),
            ("pauses", "/pauses".to_owned()),
            ("backfills", "/backfills".to_owned()),
        ]
    }

    /// Each page of the console over `outbox`, on `database`.
    async fn measure(
        &self,
        database: &str,
        outbox: Arc<dyn Operations>,
    ) -> Result<Vec<Row>, String> {
        let app = outbox_web::router(outbox, ConsoleOptions::read_only());
        let backlog = format!(
            "{} pending over {} shards, {} dead letters",
            self.pending + self.hot + 1_000,
            self.shards + 11,
            self.letters
        );
        let mut rows = Vec::new();
        for (name, path) in self.pages() {
            let (time, status) = median(&app, &path, 3).await?;
            if !status.is_success() {
                return Err(format!("the console's {name} ({path}) answered {status}"));
            }
            rows.push(Row::measured(
                &format!("14. console on {database}: {name}, {backlog}"),
                "ms",
                time.as_secs_f64() * 1_000.0,
                Target::Below(200.0),
            ));
        }
        Ok(rows)
    }
}

/// Scenario 14 on PostgreSQL, then SQLite.
pub(crate) async fn run(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let shape = Shape::new(args);
    let database = server.database(4).await?;
    let pool = database.pool.clone();
    let statements = shape.statements(
        |n| format!("generate_series(1, {n}) g"),
        |seconds| format!("now() + ({seconds}) * interval '1 second'"),
    );
    for (what, sql) in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .map_err(failed(what))?;
    }
    let mut rows = shape
        .measure("PostgreSQL", Arc::new(PgStore::new(pool.clone())))
        .await?;
    database.drop_database().await?;

    let sqlite = SqliteDatabase::new().await?;
    let statements = shape.statements(
        |n| {
            format!(
                "(WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {n}) \
                 SELECT g FROM s)"
            )
        },
        |seconds| format!("(CAST(unixepoch('subsec') * 1000 AS INTEGER) + ({seconds}) * 1000)"),
    );
    for (what, sql) in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&sqlite.pool)
            .await
            .map_err(failed(what))?;
    }
    rows.extend(
        shape
            .measure("SQLite", Arc::new(SqliteStore::new(sqlite.pool.clone())))
            .await?,
    );
    Ok(rows)
}
