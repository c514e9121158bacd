//! The lease log against a real PostgreSQL: connections stepped in a fixed order, with no
//! sleeps.

use std::time::Duration;

use outbox_core::store::{Admin, ClaimOptions, HandlerMode, Outcome, ShardSession, Store};
use outbox_testkit::postgres::PgTestDatabase;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};

use super::{CLAIM_MANY, HELD_BEHIND};
use crate::PgDialect;
use crate::dialect::ClaimAnswer;
use crate::dialect::positions::tests::{drain, insert, shard, snapshot_held, store};

/// Holds the vacuum horizon (a `REPEATABLE READ` snapshot that read the log), puts it
/// [`HELD_BEHIND`] transactions and more behind (subtransactions that each write), and has
/// `dialect` look: from here on its busy shards keep their chains. The holder, to commit.
pub(crate) async fn horizon_held(pool: &PgPool, dialect: &PgDialect) -> PoolConnection<Postgres> {
    let holder = snapshot_held(pool, "outbox_leases").await;
    transactions_pass(pool).await;
    dialect.leases.look_at_horizon(pool).await;
    assert!(
        dialect.leases.held(),
        "a snapshot {HELD_BEHIND} transactions behind holds the horizon"
    );
    holder
}

/// [`HELD_BEHIND`] transactions and more (subtransactions that each write) begin and end: a
/// snapshot taken before is that far behind.
pub(crate) async fn transactions_pass(pool: &PgPool) {
    let burn = format!(
        "CREATE TEMP TABLE burnt (i integer); \
         DO $$ BEGIN FOR i IN 1..{} LOOP \
             BEGIN INSERT INTO burnt VALUES (i); EXCEPTION WHEN OTHERS THEN NULL; END; \
         END LOOP; END $$",
        HELD_BEHIND + 100
    );
    let mut burner = pool.acquire().await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(burn))
        .execute(&mut *burner)
        .await
        .expect("transactions");
    burner.detach();
}

/// Commits `holder` and has `dialect` look again: the horizon is no longer held.
async fn horizon_released(
    pool: &PgPool,
    dialect: &PgDialect,
    mut holder: PoolConnection<Postgres>,
) {
    sqlx::query("COMMIT")
        .execute(&mut *holder)
        .await
        .expect("commit");
    dialect.leases.look_at_horizon(pool).await;
    assert!(!dialect.leases.held(), "nothing holds the horizon");
}

fn options(worker: &str) -> ClaimOptions {
    ClaimOptions {
        worker: worker.to_owned(),
        lease: Duration::from_secs(30),
        mode: HandlerMode::Leased,
    }
}

/// The rows of the log, as (identifier, first, superseded, owner).
async fn log(pool: &PgPool) -> Vec<(i64, bool, bool, Option<String>)> {
    sqlx::query_as(
        "SELECT shard_identifier, first, superseded, lease_owner FROM outbox_leases \
         ORDER BY shard_identifier, seq",
    )
    .fetch_all(pool)
    .await
    .expect("the log")
}

/// Index entries of `index` this transaction of `conn` has read so far.
async fn entries_read(conn: &mut PgConnection, index: &str) -> i64 {
    sqlx::query_scalar("SELECT pg_stat_get_xact_tuples_returned($1::regclass)")
        .bind(index)
        .fetch_one(conn)
        .await
        .expect("the transaction's statistics")
}

/// `sql` (the batch claim, or a statement around it) bound to claim shard `1:identifier` for
/// `worker` for 30 s, with the first `first_read` rows of its head above `after`.
pub(crate) fn claim_of<'q>(
    sql: impl sqlx::SqlSafeStr,
    identifier: i64,
    worker: &'q str,
    first_read: i64,
    after: i64,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql)
        .bind(vec![1_i16])
        .bind(vec![identifier])
        .bind(vec![String::new()])
        .bind(worker)
        .bind(30_000_i64)
        .bind(first_read)
        .bind(vec![after])
}

/// Runs the batch claim of shard `identifier` on `conn` for `worker`: the tokens claimed.
async fn claim_on(conn: &mut PgConnection, identifier: i64, worker: &str) -> Vec<i64> {
    let row = claim_of(CLAIM_MANY, identifier, worker, 0, 0)
        .fetch_one(conn)
        .await
        .expect("the claim");
    let (answer, order) = ClaimAnswer::of(Some(&row)).expect("the claim's arrays");
    order.into_iter().map(|at| answer.tokens[at]).collect()
}

/// Under a held vacuum horizon, every drain of a busy shard deletes the row it follows. The
/// claim finds the shard's lease by a backward seek of its key, which reads the newest entry
/// and none of the deleted ones below it: a handful of entries, however many drains came
/// before (where a read of the key in order walks them all).
#[tokio::test]
async fn a_claim_reads_a_handful_of_lease_entries_however_long_the_horizon_is_held() {
    let _horizon = crate::dialect::positions::tests::HORIZON.lock().await;
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let (store, dialect) = store(pool);
    let mut writes = pool.acquire().await.expect("connect");
    insert(&mut writes, 5, 0).await;
    drain(&store, &shard(5)).await;
    let holder = horizon_held(pool, &dialect).await;
    for _ in 0..150 {
        insert(&mut writes, 5, 0).await;
        drain(&store, &shard(5)).await;
    }
    insert(&mut writes, 5, 0).await;

    let mut claim = pool.begin().await.expect("begin");
    // The counters of this backend not yet reported (earlier transactions' too): read
    // before and after, within the transaction.
    let before = entries_read(&mut claim, "outbox_leases_pkey").await;
    let row = claim_of(CLAIM_MANY, 5, "worker", 16, 0)
        .fetch_one(&mut *claim)
        .await
        .expect("the claim");
    let (answer, _) = ClaimAnswer::of(Some(&row)).expect("the claim's arrays");
    assert_eq!(
        answer.ids.iter().flatten().count(),
        1,
        "the shard is claimed with its one message"
    );
    assert_eq!(answer.tokens.len(), 1);
    let after_claim = entries_read(&mut claim, "outbox_leases_pkey").await;
    let by_claim = after_claim - before;
    // A read of the key's rows in order: the chain's first row, the newest, and every entry
    // the drains deleted between them.
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM outbox_leases \
            WHERE shard_scope = 1 AND shard_identifier = 5 AND destination = '' \
            ORDER BY seq) r",
    )
    .fetch_one(&mut *claim)
    .await
    .expect("a read of the key");
    assert_eq!(live, 2, "the chain's first row and the claim");
    let by_forward = entries_read(&mut claim, "outbox_leases_pkey").await - after_claim;
    assert!(
        by_claim <= 6 && by_forward >= 150,
        "entries the claim read: {by_claim}; a forward read of the key: {by_forward}"
    );
    claim.rollback().await.expect("rollback");
    horizon_released(pool, &dialect, holder).await;
}

/// Two claimers that both found no row for a shard both insert its chain's first row: the
/// second waits for the first's transaction, then conflicts, and claims nothing.
#[tokio::test]
async fn two_claimers_that_found_no_row_conflict_on_the_first() {
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let mut writes = pool.acquire().await.expect("connect");
    insert(&mut writes, 9, 0).await;

    let mut first = pool.begin().await.expect("begin the first");
    assert_eq!(claim_on(&mut first, 9, "first").await.len(), 1);
    let second_pid: i32 = {
        let mut second = pool.acquire().await.expect("connect the second");
        let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *second)
            .await
            .expect("pid");
        let claiming = tokio::spawn(async move { claim_on(&mut second, 9, "second").await });
        // The second claim waits on the first's uncommitted first row.
        loop {
            let waiting: bool = sqlx::query_scalar(
                "SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity \
                 WHERE pid = $1",
            )
            .bind(pid)
            .fetch_one(pool)
            .await
            .expect("activity");
            if waiting {
                break;
            }
            tokio::task::yield_now().await;
        }
        first.commit().await.expect("commit the first");
        assert_eq!(
            claiming.await.expect("the second claim"),
            Vec::<i64>::new(),
            "the second claimer conflicts"
        );
        pid
    };
    assert!(second_pid > 0);
    assert_eq!(
        log(pool).await,
        [(9, true, false, Some("first".to_owned()))]
    );
}

/// A claimer that read a newest row another claimer has since followed finds it gone once
/// it may lock it, and claims nothing: the fence between two claimers of a released chain.
#[tokio::test]
async fn a_claimer_that_read_a_followed_row_claims_nothing() {
    let _horizon = crate::dialect::positions::tests::HORIZON.lock().await;
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let (store, dialect) = store(pool);
    let mut writes = pool.acquire().await.expect("connect");
    let holder = horizon_held(pool, &dialect).await;
    // Two drains under the held horizon: the chain stays (a busy shard), its newest row
    // released.
    for _ in 0..2 {
        insert(&mut writes, 3, 0).await;
        drain(&store, &shard(3)).await;
    }
    insert(&mut writes, 3, 0).await;
    let released = log(pool).await;
    assert_eq!(
        released,
        [
            (3, true, true, Some("positions".to_owned())),
            (3, false, false, None)
        ],
        "a busy shard keeps its chain"
    );

    // The first claimer follows the released row and holds its transaction open.
    let mut first = pool.begin().await.expect("begin the first");
    assert_eq!(claim_on(&mut first, 3, "first").await.len(), 1);
    // The second read the same released row; it skips the locked row.
    let mut second = pool.acquire().await.expect("connect the second");
    assert_eq!(claim_on(&mut second, 3, "second").await, Vec::<i64>::new());
    first.commit().await.expect("commit the first");
    // Read again, the newest row is the first claimer's live lease.
    assert_eq!(claim_on(&mut second, 3, "second").await, Vec::<i64>::new());
    let rows = log(pool).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[1].3.as_deref(), Some("first"));
    horizon_released(pool, &dialect, holder).await;
}

/// A drained shard leaves no row in the log, however often it is drained. While the horizon is
/// held, one drained again soon keeps its chain (its first row, superseded, and its newest,
/// released), which the store deletes once idle; a chain kept then ends at the shard's first
/// drain after the horizon moves.
#[tokio::test]
async fn a_drained_shard_leaves_no_row_unless_the_horizon_is_held() {
    let _horizon = crate::dialect::positions::tests::HORIZON.lock().await;
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let (store, dialect) = store(pool);
    let mut writes = pool.acquire().await.expect("connect");
    insert(&mut writes, 1, 0).await;
    insert(&mut writes, 2, 0).await;
    drain(&store, &shard(1)).await;
    drain(&store, &shard(2)).await;
    assert_eq!(log(pool).await, [], "drained once: no row");
    insert(&mut writes, 2, 0).await;
    drain(&store, &shard(2)).await;
    assert_eq!(
        log(pool).await,
        [],
        "drained again, nothing holding the horizon: no row"
    );

    // Releases are remembered only while the horizon is held: the first drain then ends its
    // chain, the next keeps it.
    let holder = horizon_held(pool, &dialect).await;
    insert(&mut writes, 2, 0).await;
    drain(&store, &shard(2)).await;
    assert_eq!(
        log(pool).await,
        [],
        "drained first under the held horizon: no row"
    );
    insert(&mut writes, 2, 0).await;
    drain(&store, &shard(2)).await;
    let kept = [
        (2, true, true, Some("positions".to_owned())),
        (2, false, false, None),
    ];
    assert_eq!(
        log(pool).await,
        kept,
        "drained again, the horizon held: the chain stays"
    );
    assert!(
        store.shard_states().await.expect("states").is_empty(),
        "a released chain holds no state"
    );
    dialect.leases.tidy_now(pool).await.expect("tidy");
    assert_eq!(log(pool).await, [], "idle: the chain goes");
    // The shard claims as new after that, and keeps its chain again.
    insert(&mut writes, 2, 0).await;
    assert_eq!(drain(&store, &shard(2)).await.len(), 1);
    assert_eq!(log(pool).await, kept);

    // The horizon moves: the next drain follows the kept chain and ends it, its first row
    // with it.
    horizon_released(pool, &dialect, holder).await;
    insert(&mut writes, 2, 0).await;
    assert_eq!(drain(&store, &shard(2)).await.len(), 1);
    assert_eq!(log(pool).await, [], "the kept chain ended");
}

/// A claim whose drain ends without an acknowledgement (its shard found empty, or given up
/// with messages left) deletes its lease row: a chain of one row ends there, and nothing is
/// left for a later claim to follow. A chain's later row is followed by a released row, as
/// before.
#[tokio::test]
async fn a_claim_released_without_an_acknowledgement_leaves_no_row() {
    let _horizon = crate::dialect::positions::tests::HORIZON.lock().await;
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let (store, dialect) = store(pool);
    let mut writes = pool.acquire().await.expect("connect");
    insert(&mut writes, 4, 0).await;
    insert(&mut writes, 6, 0).await;
    let mut sessions = store
        .claim_many(&[shard(4), shard(6)], &options("worker"), 0)
        .await
        .expect("claim");
    assert_eq!(sessions.len(), 2);
    // Shard 4's message goes behind the relay's back: its drain finds it empty.
    sqlx::query("DELETE FROM outbox_messages WHERE shard_identifier = 4")
        .execute(pool)
        .await
        .expect("delete");
    let six = sessions.pop().expect("shard 6");
    let four = sessions.pop().expect("shard 4");
    four.finish(Outcome::Drained).await.expect("finish shard 4");
    six.finish(Outcome::Released)
        .await
        .expect("give shard 6 up");
    assert_eq!(log(pool).await, [], "both chains of one row ended");
    // Shard 6 is claimed anew, and drained.
    assert_eq!(drain(&store, &shard(6)).await.len(), 1);

    // Under a held horizon a busy shard keeps its chain; a claim of it given up leaves the
    // chain's first row and a released row, as before.
    let holder = horizon_held(pool, &dialect).await;
    for _ in 0..2 {
        insert(&mut writes, 6, 0).await;
        drain(&store, &shard(6)).await;
    }
    insert(&mut writes, 6, 0).await;
    let session = store
        .claim_many(&[shard(6)], &options("worker"), 0)
        .await
        .expect("claim")
        .pop()
        .expect("shard 6");
    session
        .finish(Outcome::Released)
        .await
        .expect("give shard 6 up");
    assert_eq!(
        log(pool).await,
        [
            (6, true, true, Some("positions".to_owned())),
            (6, false, false, None)
        ]
    );
    horizon_released(pool, &dialect, holder).await;
}

/// A relay of this version claims nothing while a relay of the protocol before the log runs
/// (its heartbeat is live). Once it stops, the switch moves the older relay's live lease into
/// the log (nobody else takes that shard until it ends), and the older relay's next claim in
/// `outbox_shards` is refused.
#[tokio::test]
async fn a_relay_waits_for_older_relays_then_takes_over_their_leases() {
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    sqlx::query("DELETE FROM outbox_protocol")
        .execute(pool)
        .await
        .expect("a database from before the switch");
    let (store, dialect) = store(pool);
    let mut writes = pool.acquire().await.expect("connect");
    insert(&mut writes, 1, 0).await;
    insert(&mut writes, 2, 0).await;
    sqlx::query(
        "INSERT INTO outbox_relays (worker, started_at, expires_at) \
         VALUES ('older', now(), now() + interval '1 minute')",
    )
    .execute(pool)
    .await
    .expect("an older relay's heartbeat");
    // The older relay holds shard 2, in its own way.
    sqlx::query(
        "INSERT INTO outbox_shards (shard_scope, shard_identifier, destination, lease_owner, \
            lease_token, lease_expires_at) \
         VALUES (1, 2, '', 'older', nextval('outbox_lease_tokens'), now() + interval '1 hour')",
    )
    .execute(pool)
    .await
    .expect("the older relay's lease");

    let both = [shard(1), shard(2)];
    assert!(
        store
            .claim_many(&both, &options("newer"), 4)
            .await
            .expect("claim")
            .is_empty(),
        "an older relay runs: the newer one waits"
    );
    sqlx::query("DELETE FROM outbox_relays WHERE worker = 'older'")
        .execute(pool)
        .await
        .expect("the older relay stops");
    dialect.leases.look_again().await;
    let claimed = store
        .claim_many(&both, &options("newer"), 4)
        .await
        .expect("claim");
    assert_eq!(
        claimed
            .iter()
            .map(|claim| claim.lease().shard.clone())
            .collect::<Vec<_>>(),
        [shard(1)],
        "the older relay's lease holds until it ends"
    );
    let states = store.shard_states().await.expect("states");
    let held: Vec<_> = states
        .iter()
        .filter_map(|state| Some((state.shard.clone(), state.lease_owner.clone()?)))
        .collect();
    assert!(
        held.contains(&(shard(2), "older".to_owned())),
        "moved into the log: {states:?}"
    );
    let refused = sqlx::query(
        "UPDATE outbox_shards SET lease_owner = 'older', \
            lease_expires_at = now() + interval '1 hour' \
         WHERE shard_scope = 1 AND shard_identifier = 2",
    )
    .execute(pool)
    .await;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_shards")
        .fetch_one(pool)
        .await
        .expect("count");
    assert_eq!(stored, 0, "a row that held only a lease goes");
    let refused_insert = sqlx::query(
        "INSERT INTO outbox_shards (shard_scope, shard_identifier, destination, lease_owner, \
            lease_token) VALUES (1, 7, '', 'older', 99)",
    )
    .execute(pool)
    .await
    .expect_err("an older relay's claim is refused");
    assert!(
        refused_insert.to_string().contains("outbox_leases"),
        "{refused_insert}"
    );
    assert_eq!(refused.expect("nothing left to update").rows_affected(), 0);
}

/// Once the horizon was held, it counts as held until vacuum has removed what it kept: the
/// first scans to meet those rows would walk each one. A store that never saw it held does
/// not look at the dead rows.
#[tokio::test]
async fn after_a_hold_it_counts_as_held_until_vacuum_removes_what_it_kept() {
    let _horizon = crate::dialect::positions::tests::HORIZON.lock().await;
    let database = PgTestDatabase::create().await;
    let pool = database.pool();
    crate::migrate(pool).await.expect("migrate");
    let (_, dialect) = store(pool);
    let (_, unaware) = store(pool);
    let mut holder = horizon_held(pool, &dialect).await;
    let mut conn = pool.acquire().await.expect("connect");
    // The deletes' counters reach the statistics at once (`pg_stat_force_next_flush`), and
    // vacuum counts the rows the horizon keeps.
    for statement in [
        "INSERT INTO outbox_messages \
            (shard_scope, shard_identifier, destination, category, object_identifier, payload) \
         SELECT 1, n % 40, '', 1, 1, '{}' FROM generate_series(1, 3000) AS n",
        "DELETE FROM outbox_messages",
        "SELECT pg_stat_force_next_flush()",
        "VACUUM outbox_messages",
    ] {
        sqlx::query(statement)
            .execute(&mut *conn)
            .await
            .expect(statement);
    }
    sqlx::query("COMMIT")
        .execute(&mut *holder)
        .await
        .expect("commit");
    dialect.leases.look_at_horizon_counting(pool, 1_000).await;
    assert!(dialect.leases.held(), "3,000 dead rows not yet removed");
    unaware.leases.look_at_horizon_counting(pool, 1_000).await;
    assert!(!unaware.leases.held(), "never held");
    sqlx::query("VACUUM outbox_messages")
        .execute(&mut *conn)
        .await
        .expect("vacuum");
    dialect.leases.look_at_horizon_counting(pool, 1_000).await;
    assert!(!dialect.leases.held(), "the rows removed");
}
