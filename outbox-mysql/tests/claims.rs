//! MariaDB's statements on many shards at once. The claim (`Store::claim_many`: one to three
//! statements however many shards), stepped against another transaction: a state row that
//! transaction holds, or is creating, leaves that shard to it, the others are claimed, and
//! nothing waits for a lock. The heads the claim reads with it: those of small shards,
//! never a busy shard's rows whole. The finish of drained shards
//! (`Store::ack_and_finish_many`: two statements): each shard's state row goes, also that of
//! a shard with a message committed after its read, which stays due.

use std::time::Duration;

use outbox_core::ShardKey;
use outbox_core::store::{
    Acknowledgement, ClaimOptions, GroupKey, HandlerMode, ShardSession, Store,
};
use outbox_core::{CategoryId, Id};
use outbox_mysql::{MySqlSession, MySqlStore};
use outbox_testkit::mysql::MySqlTestDatabase;
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, MySqlPool};

mod support;
use support::{index_reads, one_connection, shard};

fn options() -> ClaimOptions {
    ClaimOptions {
        worker: "batch".to_owned(),
        lease: Duration::from_secs(30),
        mode: HandlerMode::Leased,
    }
}

/// The identifiers of the shards `store` claims of 1 to 6: at once, or the test fails (a
/// claim that waited for the other transaction's lock would wait 50 s).
async fn claimed(store: &MySqlStore) -> Vec<i64> {
    let wanted: Vec<ShardKey> = (1..=6).map(shard).collect();
    let sessions = tokio::time::timeout(
        Duration::from_secs(10),
        store.claim_many(&wanted, &options(), 10),
    )
    .await
    .expect("a claim never waits for another transaction's lock")
    .expect("claim");
    let mut claimed: Vec<i64> = sessions
        .iter()
        .map(|session| {
            let identifier = session.lease().shard.shard_identifier;
            identifier.as_integer().expect("an integer shard")
        })
        .collect();
    claimed.sort_unstable();
    claimed
}

/// A migrated database with a message in each of shards 1 to `shards`, and a pool on it.
async fn with_messages(shards: u32) -> (MySqlTestDatabase, MySqlPool) {
    let database = MySqlTestDatabase::migrated().await;
    let pool = outbox_mysql::connect(&database.url())
        .await
        .expect("connect");
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO outbox_messages (shard_scope, shard_identifier, category, \
         object_identifier, payload) SELECT 1, seq, 1, seq, '{{}}' FROM seq_1_to_{shards}"
    )))
    .execute(&pool)
    .await
    .expect("a message in each shard");
    (database, pool)
}

#[tokio::test]
async fn rows_another_transaction_holds_or_creates_leave_only_those_shards_to_it() {
    let (database, pool) = with_messages(6).await;
    // Shards 1 and 2 have state rows (as after a failure that has since expired).
    sqlx::query(
        "INSERT INTO outbox_shards (shard_scope, shard_identifier, destination, attempts) \
         VALUES (1, 1, '', 2), (1, 2, '', 0)",
    )
    .execute(&pool)
    .await
    .expect("state rows");

    // The other transaction locks shard 2's row and is creating shard 4's.
    let mut other = MySqlConnection::connect(&database.url())
        .await
        .expect("connect");
    sqlx::raw_sql(
        "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION; \
         SELECT 1 FROM outbox_shards WHERE shard_scope = 1 AND shard_identifier = 2 \
             AND destination = '' FOR UPDATE; \
         INSERT INTO outbox_shards (shard_scope, shard_identifier, destination) \
             VALUES (1, 4, '')",
    )
    .execute(&mut other)
    .await
    .expect("the other transaction's locks");

    let store = MySqlStore::new(pool.clone());
    assert_eq!(
        claimed(&store).await,
        [1, 3, 5, 6],
        "each shard but those the other transaction holds"
    );
    let attempts: i64 = sqlx::query_scalar(
        "SELECT attempts FROM outbox_shards WHERE shard_scope = 1 AND shard_identifier = 1",
    )
    .fetch_one(&pool)
    .await
    .expect("shard 1's state");
    assert_eq!(attempts, 2, "a claim of a free shard counts no attempt");

    // Once the other transaction ends, its shards are free and the others held.
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("rollback");
    assert_eq!(claimed(&store).await, [2, 4]);
}

#[tokio::test]
async fn each_shard_is_claimed_once_with_a_token_of_its_own() {
    let (_database, pool) = with_messages(6).await;
    sqlx::query(
        "INSERT INTO outbox_shards (shard_scope, shard_identifier, destination) \
         VALUES (1, 1, ''), (1, 3, '')",
    )
    .execute(&pool)
    .await
    .expect("state rows");
    let store = MySqlStore::new(pool.clone());
    // Shard 5 asked for twice.
    let wanted: Vec<ShardKey> = [1, 2, 3, 4, 5, 6, 5].into_iter().map(shard).collect();
    let sessions = store
        .claim_many(&wanted, &options(), 10)
        .await
        .expect("claim");
    let mut tokens: Vec<(ShardKey, i64)> = sessions
        .iter()
        .map(|session| (session.lease().shard.clone(), session.lease().token))
        .collect();
    tokens.sort();
    assert_eq!(tokens.len(), 6, "{tokens:?}");
    for (shard, token) in &tokens {
        let identifier = shard
            .shard_identifier
            .as_integer()
            .expect("an integer shard");
        let stored: (i64, String) = sqlx::query_as(
            "SELECT lease_token, lease_owner FROM outbox_shards \
             WHERE shard_scope = 1 AND shard_identifier = ? AND destination = ''",
        )
        .bind(identifier)
        .fetch_one(&pool)
        .await
        .expect("the claimed shard's state row");
        assert_eq!(stored, (*token, "batch".to_owned()), "shard {identifier}");
    }
    let mut distinct: Vec<i64> = tokens.iter().map(|(_, token)| *token).collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 6, "one token per shard: {tokens:?}");
    assert!(
        store
            .claim_many(&wanted, &options(), 10)
            .await
            .expect("claim")
            .is_empty(),
        "a held shard is not claimed again"
    );
}

/// Shards 1 to `shards`, claimed at once (each of them, or the test fails), each with the
/// acknowledgement of every message its session read first, one group a message.
async fn claimed_and_read(
    store: &MySqlStore,
    shards: i64,
) -> Vec<(MySqlSession, Vec<Acknowledgement>)> {
    let wanted: Vec<ShardKey> = (1..=shards).map(shard).collect();
    let sessions = store
        .claim_many(&wanted, &options(), 10)
        .await
        .expect("claim");
    assert_eq!(sessions.len(), wanted.len(), "every shard is claimed");
    let mut read = Vec::new();
    for mut session in sessions {
        let head = session.fetch(10).await.expect("fetch");
        let acks = head
            .iter()
            .map(|message| Acknowledgement {
                group: GroupKey {
                    category: CategoryId(1),
                    object_identifier: message.object_identifier,
                },
                ids: vec![message.id],
            })
            .collect();
        read.push((session, acks));
    }
    read
}

#[tokio::test]
async fn drained_shards_finished_together_keep_no_state_row_and_a_new_message_stays_due() {
    let (_database, pool) = with_messages(3).await;
    let store = MySqlStore::new(pool.clone());
    let finishing = claimed_and_read(&store, 3).await;
    assert!(finishing.iter().all(|(_, acks)| acks.len() == 1));
    // Shard 2 gets a message after its read.
    sqlx::query(
        "INSERT INTO outbox_messages (shard_scope, shard_identifier, category, \
         object_identifier, payload) VALUES (1, 2, 1, 99, '{}')",
    )
    .execute(&pool)
    .await
    .expect("a new message");
    let results = store.ack_and_finish_many(finishing).await;
    for result in &results {
        assert!(matches!(result, Ok((1, true))), "{results:?}");
    }
    let states: Vec<(i64, Option<String>, i64)> = sqlx::query_as(
        "SELECT shard_identifier, lease_owner, attempts FROM outbox_shards ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .expect("the state rows");
    // A released state row and none say the same: no shard keeps one, shard 2 included.
    assert_eq!(states, [], "no drained shard keeps its state row");
    let pending: Vec<(i64, i64)> =
        sqlx::query_as("SELECT shard_identifier, object_identifier FROM outbox_messages")
            .fetch_all(&pool)
            .await
            .expect("the outbox");
    assert_eq!(pending, [(2, 99)]);
    let mut again = store
        .claim(&shard(2), &options())
        .await
        .expect("claim")
        .expect("shard 2 is due again");
    let head = again.fetch(10).await.expect("fetch");
    assert_eq!(head[0].object_identifier, Id::integer(99));
}

/// A finish of more shards than one statement names (1,024): every shard's state row and
/// message go, in several statements, but for the shard whose lease another claim took
/// meanwhile (in the second statement's part): it keeps its message and that claim's row.
#[tokio::test]
async fn a_finish_of_more_shards_than_one_statement_names_releases_each_held_shard() {
    const SHARDS: i64 = 1_100;
    let (_database, pool) = with_messages(SHARDS as u32).await;
    let store = MySqlStore::new(pool.clone());
    let finishing = claimed_and_read(&store, SHARDS).await;
    // Shard 1,050's lease lapsed and another claim holds it, with a token of its own.
    sqlx::query(
        "UPDATE outbox_shards SET lease_token = NEXTVAL(outbox_lease_tokens), \
         lease_owner = 'other' WHERE shard_identifier = 1050",
    )
    .execute(&pool)
    .await
    .expect("another claim");
    let results = store.ack_and_finish_many(finishing).await;
    for (at, result) in results.iter().enumerate() {
        if at == 1049 {
            assert!(
                matches!(result, Err(outbox_core::Error::LeaseLost { .. })),
                "{result:?}"
            );
        } else {
            assert!(
                matches!(result, Ok((1, true))),
                "shard {}: {result:?}",
                at + 1
            );
        }
    }
    let states: Vec<(i64, Option<String>)> =
        sqlx::query_as("SELECT shard_identifier, lease_owner FROM outbox_shards")
            .fetch_all(&pool)
            .await
            .expect("the state rows");
    assert_eq!(states, [(1050, Some("other".to_owned()))]);
    let pending: Vec<i64> = sqlx::query_scalar("SELECT shard_identifier FROM outbox_messages")
        .fetch_all(&pool)
        .await
        .expect("the outbox");
    assert_eq!(pending, [1050]);
}

/// The messages of `shard` (1 to 4) a claim's session reads first, and the index entries the
/// claim read: shard 1 holds one message, shard 2 three, shard 3 none, shard 4 5,000. Each
/// claimed shard gets a message more once the claim is done; a session answering from the
/// head its claim read does not see it.
#[tokio::test]
async fn claims_read_the_heads_of_small_shards_and_leave_a_busy_shard_unread() {
    let database = MySqlTestDatabase::migrated().await;
    // One connection: the session's counters are the claim's.
    let pool = one_connection(&database).await;
    sqlx::query(
        "INSERT INTO outbox_messages (shard_scope, shard_identifier, category, \
         object_identifier, payload) \
         SELECT 1, CASE WHEN seq = 1 THEN 1 WHEN seq <= 4 THEN 2 ELSE 4 END, 1, seq, \
         CONCAT('{\"n\": ', seq, '}') FROM seq_1_to_5004",
    )
    .execute(&pool)
    .await
    .expect("seed");
    let store = MySqlStore::new(pool.clone());
    let wanted: Vec<ShardKey> = (1..=4).map(shard).collect();
    let (reads, sessions) = index_reads(&pool, store.claim_many(&wanted, &options(), 10)).await;
    let mut sessions = sessions.expect("claim");
    assert!(
        reads < 1_000,
        "the claim read {reads} entries: it read the busy shard whole"
    );
    sqlx::query(
        "INSERT INTO outbox_messages (shard_scope, shard_identifier, category, \
         object_identifier, payload) SELECT 1, seq, 1, 0, '{}' FROM seq_1_to_4",
    )
    .execute(&pool)
    .await
    .expect("a message more in each shard");
    sessions.sort_by_key(|session| session.lease().shard.clone());
    assert_eq!(sessions.len(), 4, "every shard is claimed");
    let mut first_reads = Vec::new();
    for session in &mut sessions {
        let read = session.fetch(10).await.expect("fetch");
        let payloads: Vec<String> = read
            .iter()
            .map(|message| message.payload.replace(' ', ""))
            .collect();
        first_reads.push(payloads);
    }
    let numbered = |numbers: std::ops::RangeInclusive<i64>| -> Vec<String> {
        numbers.map(|n| format!("{{\"n\":{n}}}")).collect()
    };
    assert_eq!(first_reads[0], numbered(1..=1), "shard 1: its head");
    assert_eq!(first_reads[1], numbered(2..=4), "shard 2: its head");
    assert!(first_reads[2].is_empty(), "shard 3: its empty head");
    assert_eq!(
        first_reads[3],
        numbered(5..=14),
        "shard 4: its own first read"
    );
}
