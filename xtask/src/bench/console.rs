//! Scenario 14: the console's pages at a large outbox. At full scale, 10,000,000 pending
//! messages over 100,000 shards (100 of them failing, with an error recorded), a hot shard of
//! 500,000 more, a paused scope of 10 shards and 1,000 messages, a paused shard, and
//! 1,000,000 dead letters, written with `INSERT … SELECT generate_series`; then each page, through the
//! console's router in this process (its queries and its rendering, no network), the median
//! of a few requests. The target: every page under 200 ms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use outbox_postgres::PgStore;
use outbox_web::ConsoleOptions;
use tower::ServiceExt;

use super::BenchArgs;
use super::report::{Row, Target};
use super::setup::{Server, failed};

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

/// Scenario 14 on PostgreSQL.
pub(crate) async fn run(args: &BenchArgs, server: &Server) -> Result<Vec<Row>, String> {
    let pending = args.sized(10_000_000, 20_000);
    let letters = args.sized(1_000_000, 2_000);
    let shards: i64 = 100_000
        .min(i64::try_from(pending / 10).unwrap_or(i64::MAX))
        .max(10);
    // One shard far deeper than the others, half of its messages of a category of their own.
    let hot = args.sized(500_000, 1_000);
    let database = server.database(4).await?;
    let pool = database.pool.clone();
    let statements = [
        (
            "writing the backlog",
            format!(
                "INSERT INTO outbox_messages (shard_scope, shard_identifier, destination, \
                     category, object_identifier, payload) \
                 SELECT 1, g % {shards}, '', 1, g, '{{\"seq\": 1}}'::jsonb \
                 FROM generate_series(1, {pending}) g"
            ),
        ),
        (
            "recording failing shards",
            format!(
                "INSERT INTO outbox_shards (shard_scope, shard_identifier, destination, attempts, \
                     last_error, retry_at, watermark) \
                 SELECT 1, g, '', 3, 'handler failed: the service answered 503', \
                     now() + interval '1 hour', {pending} \
                 FROM generate_series(0, 99) g"
            ),
        ),
        (
            "writing the dead letters",
            format!(
                "INSERT INTO outbox_dead_letters (message_id, shard_scope, shard_identifier, \
                     destination, category, object_identifier, payload, created_at, error, \
                     attempts, first_failed_at, dead_lettered_at, lease_token) \
                 SELECT {pending} + g, 1, g % {shards}, '', 1, g, '{{\"seq\": 1}}'::jsonb, now(), \
                     'handler failed: no such project', 5, now(), \
                     now() - g * interval '1 second', g \
                 FROM generate_series(1, {letters}) g"
            ),
        ),
        (
            "writing a hot shard",
            format!(
                "INSERT INTO outbox_messages (shard_scope, shard_identifier, destination, \
                     category, object_identifier, payload) \
                 SELECT 1, {shards}, '', 1 + g % 2, g, '{{\"seq\": 1}}'::jsonb \
                 FROM generate_series(1, {hot}) g"
            ),
        ),
        (
            "writing a small scope",
            "INSERT INTO outbox_messages (shard_scope, shard_identifier, destination, \
                 category, object_identifier, payload) \
             SELECT 2, g % 10, '', 3, g, '{\"seq\": 1}'::jsonb FROM generate_series(1, 1000) g"
                .to_owned(),
        ),
        (
            "pausing the small scope and a shard",
            "INSERT INTO outbox_pauses (kind, shard_scope, shard_identifier, reason) \
             VALUES ('scope', 2, 0, 'bench'), ('shard', 1, 5, 'bench')"
                .to_owned(),
        ),
        ("analyzing", "ANALYZE".to_owned()),
    ];
    for (what, sql) in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .map_err(failed(what))?;
    }
    let store = PgStore::new(pool.clone());
    let app = outbox_web::router(Arc::new(store), ConsoleOptions::read_only());
    let deepest = format!("/shard?key=1%3A{}", shards - 1);
    let hottest = format!("/shard?key=1%3A{shards}");
    let letter = format!("/dead-letter?id={}", pending + letters / 2);
    let pages: [(&str, &str); 14] = [
        ("overview", "/"),
        ("shards, deepest first", "/shards"),
        ("failing shards", "/shards?filter=failing"),
        ("paused shards", "/shards?filter=paused"),
        ("shards of a small scope", "/shards?scope=2"),
        ("shards of a category", "/shards?category=2"),
        ("parked shards", "/shards?filter=parked"),
        ("a shard's page", &deepest),
        ("the hot shard's page", &hottest),
        ("dead letters", "/dead-letters"),
        ("dead letters of a category", "/dead-letters?category=1"),
        ("a dead letter's page", &letter),
        ("pauses", "/pauses"),
        ("backfills", "/backfills"),
    ];
    let backlog = format!(
        "{} pending over {} shards, {letters} dead letters",
        pending + hot + 1_000,
        shards + 11
    );
    let mut rows = Vec::new();
    for (name, path) in pages {
        let (time, status) = median(&app, path, 3).await?;
        if !status.is_success() {
            return Err(format!("the console's {name} ({path}) answered {status}"));
        }
        rows.push(Row::measured(
            &format!("14. console: {name}, {backlog}"),
            "ms",
            time.as_secs_f64() * 1_000.0,
            Target::Below(200.0),
        ));
    }
    database.drop_database().await?;
    Ok(rows)
}
