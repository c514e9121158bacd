//! The settled frontier and the shards' positions against a real PostgreSQL: writers' and the
//! relay's connections stepped in a fixed order, with no sleeps.

use std::time::Duration;

use outbox_core::store::{
    Acknowledgement, ClaimOptions, GroupKey, HandlerMode, ShardSession, Store,
};
use outbox_core::{ScopeId, ShardKey};
use outbox_testkit::postgres::PgTestDatabase;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Postgres};

use crate::{PgDialect, PgStore};

pub(crate) fn shard(identifier: i64) -> ShardKey {
    ShardKey::local(ScopeId(1), identifier)
}

/// Writes a message to `shard` on `conn` (committed when `conn` is not in a transaction): its
/// id. `padding` characters of payload that do not compress.
pub(crate) async fn insert(conn: &mut PgConnection, shard: i64, padding: i32) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO outbox_messages \
            (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
         VALUES (1, $1, '', 1, 1, jsonb_build_object('pad', \
            (SELECT coalesce(string_agg(md5(random()::text), ''), '') \
             FROM generate_series(1, $2 / 32)))) \
         RETURNING id",
    )
    .bind(shard)
    .bind(padding)
    .fetch_one(conn)
    .await
    .expect("a message")
}

fn options() -> ClaimOptions {
    ClaimOptions {
        worker: "positions".to_owned(),
        lease: Duration::from_secs(30),
        mode: HandlerMode::Leased,
    }
}

/// A store, and its dialect (which shares the store's positions).
pub(crate) fn store(pool: &PgPool) -> (PgStore, PgDialect) {
    let dialect = PgDialect::default();
    (
        PgStore::with_dialect(pool.clone(), dialect.clone()),
        dialect,
    )
}

/// Drains `shard` once as the relay does: claims it with its head read, acknowledges every
/// row read, and releases it in one statement. The ids it read.
pub(crate) async fn drain(store: &PgStore, shard: &ShardKey) -> Vec<i64> {
    let mut sessions = store
        .claim_many(std::slice::from_ref(shard), &options(), 16)
        .await
        .expect("claim");
    let mut session = sessions.pop().expect("the shard is due and free");
    let head = session.fetch(16).await.expect("read the head");
    let acks: Vec<Acknowledgement> = head
        .iter()
        .map(|message| Acknowledgement {
            group: GroupKey {
                category: message.category,
                object_identifier: message.object_identifier,
            },
            ids: vec![message.id],
        })
        .collect();
    let finished = store.ack_and_finish_many(vec![(session, acks)]).await;
    let (deleted, released) = finished
        .into_iter()
        .next()
        .expect("one result")
        .expect("acknowledged");
    assert!(released);
    assert_eq!(deleted, u64::try_from(head.len()).unwrap());
    head.iter().map(|message| message.id.0).collect()
}

/// A writer that drew a low id and commits after a higher id was read, acknowledged and its
/// shard released: the shard's position stays below the low id (the frontier waited for
/// the writer), and the next drain reads the row.
#[tokio::test]
async fn a_row_committed_after_higher_ids_were_drained_is_still_read() {
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let (store, dialect) = store(pool);
    // Positions are kept while the horizon is held.
    dialect.leases.assume_held().await;
    let positions = &dialect.positions;
    let mut writes = pool.acquire().await.expect("connect");

    // A first message elsewhere, settled: the frontier starts there.
    let first = insert(&mut writes, 9, 0).await;
    positions.sample(pool).await;
    assert_eq!(positions.settled(), first);

    // Writer A draws an id and holds its transaction open; writer B draws a higher one and
    // commits.
    let mut slow = pool.begin().await.expect("begin");
    let low = insert(&mut slow, 5, 0).await;
    let high = insert(&mut writes, 5, 0).await;
    assert!(low < high);
    positions.sample(pool).await;
    positions.sample(pool).await;
    assert_eq!(
        positions.settled(),
        first,
        "A still writes: nothing above settles"
    );

    assert_eq!(drain(&store, &shard(5)).await, vec![high]);
    assert!(positions.after(&shard(5)) < low);

    slow.commit().await.expect("A commits");
    positions.sample(pool).await;
    assert_eq!(positions.settled(), high, "A ended: B's id settles");
    assert_eq!(drain(&store, &shard(5)).await, vec![low]);
    assert_eq!(positions.after(&shard(5)), low);

    // A later row is read past the position.
    let later = insert(&mut writes, 5, 0).await;
    assert_eq!(drain(&store, &shard(5)).await, vec![later]);
}

/// A transaction that only reads the outbox (as `pg_dump`, a report) holds no lock a writer
/// holds: the frontier moves on while it stays open.
#[tokio::test]
async fn a_reader_does_not_hold_the_frontier_back() {
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let (_, dialect) = store(pool);
    let positions = &dialect.positions;
    let mut holder = pool.begin().await.expect("begin");
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *holder)
        .await
        .expect("repeatable read");
    sqlx::query("SELECT count(*) FROM outbox_messages")
        .execute(&mut *holder)
        .await
        .expect("read the outbox");
    let mut writes = pool.acquire().await.expect("connect");
    let id = insert(&mut writes, 1, 0).await;
    positions.sample(pool).await;
    assert_eq!(positions.settled(), id);
    holder.rollback().await.expect("rollback");
}

/// A sequence that hands ids out of a session's cache may give a later writer an id below the
/// last value read: no position is used.
#[tokio::test]
async fn a_cached_sequence_settles_nothing() {
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    sqlx::query("ALTER TABLE outbox_messages ALTER COLUMN id SET CACHE 20")
        .execute(pool)
        .await
        .expect("cache ids");
    let (store, dialect) = store(pool);
    let mut writes = pool.acquire().await.expect("connect");
    let id = insert(&mut writes, 1, 0).await;
    dialect.positions.sample(pool).await;
    assert_eq!(dialect.positions.settled(), 0);
    assert_eq!(drain(&store, &shard(1)).await, vec![id]);
    assert_eq!(dialect.positions.after(&shard(1)), 0);
}

/// A row written below a shard's position (with an id of its own, as a restore writes it) is
/// still delivered: claims read past it until a whole sweep sees it, which lowers the
/// position below it; the next claim reads it, and its drain raises the position again.
#[tokio::test]
async fn a_row_below_the_position_is_read_once_a_sweep_sees_it() {
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let (store, dialect) = store(pool);
    dialect.leases.assume_held().await;
    let mut writes = pool.acquire().await.expect("connect");
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(insert(&mut writes, 5, 0).await);
    }
    let newest = insert(&mut writes, 5, 0).await;
    sqlx::query("DELETE FROM outbox_messages WHERE id = ANY($1)")
        .bind(&ids)
        .execute(&mut *writes)
        .await
        .expect("make room below");
    dialect.positions.sample(pool).await;
    assert_eq!(drain(&store, &shard(5)).await, vec![newest]);
    assert_eq!(dialect.positions.after(&shard(5)), newest);

    let restored: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_messages (id, shard_scope, shard_identifier, destination, category, \
            object_identifier, payload) OVERRIDING SYSTEM VALUE \
         VALUES ($1, 1, 5, '', 1, 1, '{}') RETURNING id",
    )
    .bind(ids[1])
    .fetch_one(&mut *writes)
    .await
    .expect("a restored row");
    assert!(restored < newest);
    assert_eq!(drain(&store, &shard(5)).await, Vec::<i64>::new());
    assert_eq!(dialect.positions.after(&shard(5)), newest, "not seen yet");

    // A claim made before the sweep that lowers the position reads past the row; its drain
    // does not raise the position again.
    let later = insert(&mut writes, 5, 0).await;
    dialect.positions.sample(pool).await;
    let mut early = store
        .claim_many(&[shard(5)], &options(), 16)
        .await
        .expect("claim");
    let page = store.discover(None, 100).await.expect("a whole sweep");
    assert!(page.due.is_empty(), "claimed: {page:?}");
    assert_eq!(dialect.positions.after(&shard(5)), restored - 1);
    let mut session = early.pop().expect("claimed");
    let head = session.fetch(16).await.expect("read");
    assert_eq!(head.iter().map(|m| m.id.0).collect::<Vec<_>>(), vec![later]);
    let acks = vec![Acknowledgement {
        group: GroupKey {
            category: head[0].category,
            object_identifier: head[0].object_identifier,
        },
        ids: vec![head[0].id],
    }];
    let finished = store.ack_and_finish_many(vec![(session, acks)]).await;
    assert_eq!(finished[0].as_ref().expect("acknowledged"), &(1, true));
    assert_eq!(dialect.positions.after(&shard(5)), restored - 1);

    assert_eq!(drain(&store, &shard(5)).await, vec![restored]);
    assert_eq!(dialect.positions.after(&shard(5)), restored);
}

/// A sample dropped while it waits on the database (the claim that ran it was cancelled)
/// does not stop the next one.
#[tokio::test]
async fn a_cancelled_sample_does_not_stop_the_next() {
    let _horizon = HORIZON.lock().await;
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let (_, dialect) = store(pool);
    let positions = &dialect.positions;
    // A pool whose one connection is taken: the sample waits for it, whatever the timing.
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .expect("a pool of one");
    let taken = one.acquire().await.expect("its connection");
    let cancelled = tokio::time::timeout(Duration::ZERO, positions.sample(&one)).await;
    assert!(cancelled.is_err(), "the sample waits on the database");
    drop(taken);
    let mut writes = pool.acquire().await.expect("connect");
    let id = insert(&mut writes, 1, 0).await;
    positions.sample(&one).await;
    assert_eq!(positions.settled(), id);
}

/// Held for their whole run by the tests that hold the vacuum horizon or whose outcome needs
/// it free: the horizon is the server's, not a database's, so that one such test's hold would
/// be another's (a rewrite found the horizon held by the test beside it, and refused nothing).
pub(crate) static HORIZON: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A connection holding a `REPEATABLE READ` snapshot that has read `table`, as `pg_dump`
/// holds one: every row deleted after it stays behind until it commits.
pub(crate) async fn snapshot_held(
    pool: &PgPool,
    table: &str,
) -> sqlx::pool::PoolConnection<Postgres> {
    let mut holder = pool.acquire().await.expect("connect");
    let read = format!("SELECT count(*) FROM {table}");
    for statement in ["BEGIN ISOLATION LEVEL REPEATABLE READ", read.as_str()] {
        sqlx::query(AssertSqlSafe(statement.to_owned()))
            .execute(&mut *holder)
            .await
            .expect(statement);
    }
    holder
}
