//! The relay's hot queries use the indexes: `EXPLAIN QUERY PLAN` on a populated, analyzed
//! database shows no scan of `outbox_messages` or `outbox_shards`, only index searches.

use outbox_testkit::sqlite::SqliteTestDatabase;
use sqlx::sqlite::SqliteArguments;
use sqlx::{AssertSqlSafe, Row, Sqlite, SqlitePool};

use crate::dialect::together::{
    CLAIM_MANY, CLAIMED, DELETE_MESSAGES, HEADS, HELD, PRESENT, RELEASE_HELD, STATES,
};
use crate::dialect::{
    ACK, CLAIM, DEAD_LETTERS, DELETE_IF_EMPTY, DISCOVER, DISCOVER_JSON, EXTEND_LEASE,
    FAILING_SHARDS, FETCH, FETCH_NEWEST, GAUGES, SAMPLED_SHARDS,
};

async fn populated() -> SqliteTestDatabase {
    let database = SqliteTestDatabase::create().await;
    crate::migrate(database.pool()).await.expect("migrate");
    // 2,000 shards of 50 rows, in 10 groups each; one shard in backoff.
    sqlx::query(
        "WITH RECURSIVE n(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM n WHERE n < 100000) \
         INSERT INTO outbox_messages \
            (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
         SELECT 1, n % 2000, '', 1 + n % 3, n % 10, json_object('n', n) FROM n",
    )
    .execute(database.pool())
    .await
    .expect("populate");
    sqlx::query(
        "INSERT INTO outbox_shards (shard_scope, shard_identifier, destination, attempts, retry_at) \
         VALUES (1, 7, '', 3, 9999999999999)",
    )
    .execute(database.pool())
    .await
    .expect("a shard in backoff");
    sqlx::query("ANALYZE")
        .execute(database.pool())
        .await
        .expect("analyze");
    database
}

type Query = sqlx::query::Query<'static, Sqlite, SqliteArguments>;

/// The plan's steps.
async fn steps(pool: &SqlitePool, sql: &str, bind: impl FnOnce(Query) -> Query) -> Vec<String> {
    let explained = AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}"));
    bind(sqlx::query(explained))
        .fetch_all(pool)
        .await
        .unwrap_or_else(|error| panic!("EXPLAIN QUERY PLAN {sql}: {error}"))
        .iter()
        .map(|row| row.get::<String, _>("detail"))
        .collect()
}

/// The plan's steps; fails on a full scan of an outbox table (under its name or an alias).
async fn explain(pool: &SqlitePool, sql: &str, bind: impl FnOnce(Query) -> Query) -> Vec<String> {
    let steps = steps(pool, sql, bind).await;
    for step in &steps {
        let scanned = step
            .strip_prefix("SCAN ")
            .and_then(|rest| rest.split_whitespace().next());
        assert!(
            !matches!(
                scanned,
                Some("outbox_messages" | "outbox_shards" | "m" | "x" | "s")
            ),
            "full scan `{step}` in:\n{sql}\n{steps:#?}"
        );
    }
    steps
}

#[tokio::test]
async fn hot_queries_use_the_indexes() {
    let database = populated().await;
    let pool = database.pool();
    let groups = "[[1, 3], [2, 4]]";

    for discover in [DISCOVER, DISCOVER_JSON] {
        let discovery = explain(pool, discover, |q| {
            q.bind(0_i64).bind(0_i64).bind("").bind(256_i64)
        })
        .await;
        assert!(
            discovery
                .iter()
                .any(|step| step.contains("USING COVERING INDEX outbox_messages_shard")),
            "discovery seeks the shard index: {discovery:#?}"
        );
        // Each recursive step seeks the next shard; a row-value seek on the scope alone would read
        // every row of the scope before it, once per shard.
        assert!(
            discovery
                .iter()
                .any(|step| step
                    .contains("(shard_scope=? AND shard_identifier=? AND destination>?)"))
                && discovery
                    .iter()
                    .any(|step| step.contains("(shard_scope=? AND shard_identifier>?)")),
            "each discovery step seeks the next shard: {discovery:#?}"
        );
    }
    explain(pool, FETCH, |q| {
        q.bind(1_i64).bind(42_i64).bind("").bind(100_i64)
    })
    .await;
    explain(pool, FETCH_NEWEST, |q| {
        q.bind(1_i64)
            .bind(42_i64)
            .bind("")
            .bind(groups)
            .bind(0_i64)
            .bind(i64::MAX)
    })
    .await;
    explain(pool, EXTEND_LEASE, |q| {
        q.bind(1_i64).bind(42_i64).bind("").bind(1_i64).bind(0_i64)
    })
    .await;
    let ack = explain(pool, ACK, |q| {
        q.bind(1_i64).bind(42_i64).bind("").bind("[3, 500]")
    })
    .await;
    assert!(
        ack.iter()
            .any(|step| step.starts_with("SEARCH outbox_messages") && step.contains("id=?)")),
        "acknowledging seeks each row by id: {ack:#?}"
    );
    explain(pool, CLAIM, |q| {
        q.bind(1_i64)
            .bind(42_i64)
            .bind("")
            .bind("worker")
            .bind(1_i64)
            .bind(30_000_i64)
    })
    .await;
    explain(pool, DELETE_IF_EMPTY, |q| {
        q.bind(1_i64).bind(42_i64).bind("").bind(1_i64)
    })
    .await;
    // The finish of drained shards together: each lease and row sought by its key.
    let leases = r#"[[1, 42, "", 7], [1, 43, "", 8]]"#;
    let release = explain(pool, RELEASE_HELD, |q| q.bind(leases).bind("[7, 8]")).await;
    assert!(
        release
            .iter()
            .any(|step| step.starts_with("SEARCH outbox_shards USING PRIMARY KEY")),
        "releasing seeks each state row: {release:#?}"
    );
    explain(pool, HELD, |q| q.bind(leases)).await;
    let heads = explain(pool, HEADS, |q| q.bind(leases).bind(100_i64)).await;
    assert!(
        heads.iter().any(
            |step| step.starts_with("SEARCH m USING INDEX outbox_messages_shard")
                && step.contains("id<?")
        ),
        "each shard's rows are read up to its bound: {heads:#?}"
    );
    explain(pool, STATES, |q| q.bind(leases)).await;
    explain(pool, CLAIM_MANY, |q| {
        q.bind(leases).bind("worker").bind(30_000_i64)
    })
    .await;
    explain(pool, CLAIMED, |q| q.bind(leases)).await;
    explain(pool, PRESENT, |q| q.bind(r#"[[1, 42, "", 3]]"#)).await;
    explain(pool, DELETE_MESSAGES, |q| q.bind("[3, 500]")).await;
}

/// The console's failing (or parked) shards read the shard states whole (few rows: the shards
/// a relay holds, fails on or parked) and only those shards' messages, by their index: never
/// every message of a large backlog.
#[tokio::test]
async fn failing_shards_read_only_their_own_messages() {
    let database = populated().await;
    for which in ["failing", "parked"] {
        let steps = steps(database.pool(), FAILING_SHARDS, |q| {
            q.bind(which)
                .bind(100_i64)
                .bind(None::<i32>)
                .bind(None::<i32>)
        })
        .await;
        assert!(
            !steps
                .iter()
                .any(|step| step.starts_with("SCAN outbox_messages")),
            "a full scan of the messages: {steps:#?}"
        );
    }
}

/// The console's listing of a large backlog reads windows of ids by the primary key, and each
/// candidate shard's rows by its index: never every message (a full scan of a table of
/// messages, or of the messages under an alias).
#[tokio::test]
async fn sampled_shards_read_windows_and_candidates_only() {
    let database = populated().await;
    for (which, scope, category) in [
        ("pending", None, None),
        ("pending", Some(1_i32), None),
        ("pending", None, Some(2_i32)),
        ("paused", None, None),
    ] {
        let steps = explain(database.pool(), SAMPLED_SHARDS, |q| {
            q.bind(which)
                .bind(100_i64)
                .bind(scope)
                .bind(category)
                .bind(200_i64)
                .bind(100_i64)
                .bind(1_000_i64)
        })
        .await;
        assert!(
            steps
                .iter()
                .any(|step| step.contains("USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)")),
            "the windows are ranges of the primary key: {steps:#?}"
        );
    }
}

/// The console's overview and a dead letter's page cost the same at any backlog: the gauges
/// read the ends of the ids by the primary key (a `min` and a `max` in one `SELECT` would read
/// every row), and a letter asked for by id is read from its range of the primary key.
#[tokio::test]
async fn gauges_and_letters_by_id_read_no_table_whole() {
    let database = populated().await;
    let pool = database.pool();
    let gauges = steps(pool, GAUGES, |q| q.bind(10_000_i64)).await;
    assert!(
        !gauges
            .iter()
            .any(|step| step.starts_with("SCAN outbox_messages")),
        "{gauges:#?}"
    );
    // The dead letters' span: their least and greatest id, each one descent of the key (the
    // letters counted up to the limit, and the oldest, read an index up to a LIMIT).
    assert_eq!(
        gauges
            .iter()
            .filter(|step| *step == "SEARCH outbox_dead_letters")
            .count(),
        2,
        "{gauges:#?}"
    );
    let letter = steps(pool, DEAD_LETTERS, |q| {
        q.bind(None::<i32>)
            .bind(None::<i32>)
            .bind(None::<i32>)
            .bind(0_i64)
            .bind("")
            .bind(None::<i64>)
            .bind(i64::MAX)
            .bind(1_i32)
            .bind("[42]")
            .bind(42_i64)
            .bind(42_i64)
    })
    .await;
    assert!(
        letter
            .iter()
            .any(|step| step.contains("USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)")),
        "{letter:#?}"
    );
}
