//! Behaviour only PostgreSQL has: commit notifications, connection loss, URL errors.

use std::time::Duration;

use outbox_core::admin::Admin;
use outbox_core::backfill::{BackfillModel, BackfillOptions, BackfillOutcome, BackfillStart};
use outbox_core::store::Store;
use outbox_core::{Category, Error, Message, Relay, RelayConfig, RunReport};
use outbox_postgres::PgStore;
use outbox_testkit::fixtures::{MODEL_TABLES, OrgUpdate, Project, Recorder, note, org_shard};
use outbox_testkit::postgres::{PgTestDatabase, server_url};
use sqlx::postgres::{PgListener, PgPoolOptions, PgSslMode};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A relay that polls every `poll_interval`, however recently it found work: with an hour, it
/// only finds new work when woken.
fn config(worker: &str, wake_on_commit: bool, poll_interval: Duration) -> RelayConfig {
    RelayConfig::builder()
        .worker_id(worker.to_owned())
        .wake_on_commit(wake_on_commit)
        .poll_interval(poll_interval)
        .min_poll_interval(poll_interval)
        .max_reconnect_delay(Duration::from_millis(500))
        .build()
        .expect("a valid relay configuration")
}

async fn migrated() -> PgTestDatabase {
    let database = PgTestDatabase::create().await;
    outbox_postgres::migrate(database.pool())
        .await
        .expect("migrate");
    database
}

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<RunReport, Error>>,
}

impl Running {
    fn start(relay: &Relay<PgStore>) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let relay = relay.clone();
        let task = tokio::spawn(async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
        });
        Self { stop, task }
    }

    async fn stop(self) -> RunReport {
        let _ = self.stop.send(());
        self.task
            .await
            .expect("the relay task does not panic")
            .expect("the relay stops cleanly")
    }
}

/// Writes `message` with a plain transaction: nothing announces it.
async fn write(pool: &PgPool, message: Message) {
    let mut tx = pool.begin().await.expect("begin");
    outbox_postgres::write(&mut *tx, &message)
        .await
        .expect("write");
    tx.commit().await.expect("commit");
}

/// Writes `message` in an `OutboxTransaction`, which announces it after its commit.
async fn write_announced(pool: &PgPool, message: Message) {
    let mut tx = outbox_postgres::begin(pool).await.expect("begin");
    tx.write(&message).await.expect("write");
    tx.commit().await.expect("commit");
}

/// A listener on the relays' channel, as another process's relay would listen.
async fn eavesdrop(database: &PgTestDatabase) -> PgListener {
    let mut listener = PgListener::connect_with(database.pool())
        .await
        .expect("connect a listener");
    listener
        .listen(outbox_postgres::NOTIFY_CHANNEL)
        .await
        .expect("listen");
    listener
}

/// Sends what another process's `OutboxTransaction` sends after committing to `shards`.
async fn notify_from_elsewhere(database: &PgTestDatabase, shards: &str) {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(outbox_postgres::NOTIFY_CHANNEL)
        .bind(format!(
            "@0000000000000001 elsewhere:5432/{}\n{shards}",
            database.name()
        ))
        .execute(database.pool())
        .await
        .expect("notify");
}

/// The next notification on `listener` within `within`, if any.
async fn notification(listener: &mut PgListener, within: Duration) -> Option<String> {
    tokio::time::timeout(within, listener.recv())
        .await
        .ok()
        .map(|received| received.expect("a notification").payload().to_owned())
}

async fn delivered(recorder: &Recorder, seq: u64, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while !recorder.seen().iter().any(|seen| seen.seq == seq) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "message {seq} was not delivered within {within:?}; saw {:?}",
            recorder.triples()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sessions on `database` that are listening for commits.
async fn listeners(database: &PgTestDatabase) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )
    .fetch_one(database.pool())
    .await
    .expect("read pg_stat_activity")
}

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_wake_an_idle_relay_in_the_same_process() {
    let database = migrated().await;
    let recorder = Recorder::new();
    // Its own pool, on the same database: woken by this process's commits directly.
    let store = PgStore::new(database.connect().await);
    let relay = Relay::with_config(store, recorder.registry(), config("listener", true, HOUR));
    let running = Running::start(&relay);

    write_announced(database.pool(), note::<OrgUpdate>(1, 1, 1)).await;
    delivered(&recorder, 1, Duration::from_secs(15)).await;
    // The relay is now idle until woken, or an hour from now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(listeners(&database).await, 1, "the relay listens");

    for seq in 2..=4 {
        write_announced(
            database.pool(),
            note::<OrgUpdate>(seq as i64, seq as i64, seq),
        )
        .await;
        delivered(&recorder, seq, Duration::from_secs(10)).await;
    }
    // A nested scope's writes, deferred or not, are announced with the outermost commit.
    let mut tx = outbox_postgres::begin(database.pool())
        .await
        .expect("begin");
    let mut deferred = tx.deferred().await.expect("a deferred scope");
    deferred
        .write(&note::<OrgUpdate>(7, 1, 5))
        .await
        .expect("write");
    deferred.commit().await.expect("release the savepoint");
    tx.commit().await.expect("commit");
    delivered(&recorder, 5, Duration::from_secs(10)).await;
    let report = running.stop().await;
    assert_eq!(report.deliveries, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_are_announced_to_other_processes_after_the_commit_and_outside_it() {
    let database = migrated().await;
    let mut other = eavesdrop(&database).await;

    // A plain transaction announces nothing: no trigger notifies inside the writers' commits.
    write(database.pool(), note::<OrgUpdate>(1, 1, 1)).await;
    assert_eq!(
        notification(&mut other, Duration::from_millis(500)).await,
        None
    );

    // An OutboxTransaction's commit is followed by one NOTIFY naming its shards, marked
    // as this process's (whose relays heard it directly).
    let mut tx = outbox_postgres::begin(database.pool())
        .await
        .expect("begin");
    tx.write_all(&[note::<OrgUpdate>(2, 2, 2), note::<OrgUpdate>(3, 3, 3)])
        .await
        .expect("write");
    tx.commit().await.expect("commit");
    let payload = notification(&mut other, Duration::from_secs(10))
        .await
        .expect("a notification after the commit");
    let mut lines = payload.lines();
    let sender = lines.next().expect("the sender's line");
    assert!(
        sender.starts_with('@') && sender.ends_with(&format!("/{}", database.name())),
        "{payload:?}"
    );
    assert_eq!(lines.collect::<Vec<_>>(), ["1:2:", "1:3:"], "{payload:?}");

    // With the trigger enabled, every insert notifies at its commit.
    outbox_postgres::enable_commit_trigger(database.pool())
        .await
        .expect("enable the trigger");
    outbox_postgres::enable_commit_trigger(database.pool())
        .await
        .expect("enabling it twice");
    write(database.pool(), note::<OrgUpdate>(4, 4, 4)).await;
    assert_eq!(
        notification(&mut other, Duration::from_secs(10)).await,
        Some("1:4:".to_owned())
    );
    outbox_postgres::disable_commit_trigger(database.pool())
        .await
        .expect("disable the trigger");
    write(database.pool(), note::<OrgUpdate>(5, 5, 5)).await;
    assert_eq!(
        notification(&mut other, Duration::from_millis(500)).await,
        None
    );

    // Announcements to other processes turned off (no other test in this binary needs them).
    outbox_postgres::set_announce_interval(None);
    write_announced(database.pool(), note::<OrgUpdate>(6, 6, 6)).await;
    let silent = notification(&mut other, Duration::from_millis(500)).await;
    outbox_postgres::set_announce_interval(Some(Duration::ZERO));
    assert_eq!(silent, None);
    write_announced(database.pool(), note::<OrgUpdate>(7, 7, 7)).await;
    let payload = notification(&mut other, Duration::from_secs(10))
        .await
        .expect("announced again");
    assert!(payload.ends_with("\n1:7:"), "{payload:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_processs_announcement_wakes_an_idle_relay() {
    let database = migrated().await;
    let recorder = Recorder::new();
    let store = PgStore::new(database.connect().await);
    let relay = Relay::with_config(store, recorder.registry(), config("listener", true, HOUR));
    let running = Running::start(&relay);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(listeners(&database).await, 1, "the relay listens");

    // Written without an announcement: what another process's NOTIFY names is what wakes it.
    write(database.pool(), note::<OrgUpdate>(1, 1, 1)).await;
    notify_from_elsewhere(&database, "1:1:").await;
    delivered(&recorder, 1, Duration::from_secs(10)).await;
    // And the trigger's notifications (no sender line) too.
    write(database.pool(), note::<OrgUpdate>(2, 1, 2)).await;
    sqlx::query("SELECT pg_notify($1, '1:2:')")
        .bind(outbox_postgres::NOTIFY_CHANNEL)
        .execute(database.pool())
        .await
        .expect("notify");
    delivered(&recorder, 2, Duration::from_secs(10)).await;
    let report = running.stop().await;
    assert_eq!(report.deliveries, 2);
}

/// Behind a pooler that breaks `LISTEN`: the relay does not listen, and this process's
/// commits still wake it at once; another process's announcement does not (its messages wait
/// for the poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_listen_this_processs_commits_still_wake_the_relay() {
    let database = migrated().await;
    let recorder = Recorder::new();
    let store = PgStore::new(database.connect().await);
    let config = config("pooled", true, HOUR)
        .to_builder()
        .listen_for_other_processes(false)
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(store, recorder.registry(), config);
    let running = Running::start(&relay);

    write_announced(database.pool(), note::<OrgUpdate>(1, 1, 1)).await;
    delivered(&recorder, 1, Duration::from_secs(15)).await;
    // The relay is now idle until woken, or an hour from now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(listeners(&database).await, 0, "the relay does not listen");

    write(database.pool(), note::<OrgUpdate>(2, 2, 2)).await;
    notify_from_elsewhere(&database, "1:2:").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        recorder.seen().iter().all(|seen| seen.seq != 2),
        "another process's announcement reached a relay that does not listen"
    );
    // This process's next commit wakes it, for the shard it names (the other message waits
    // for the poll).
    write_announced(database.pool(), note::<OrgUpdate>(3, 3, 3)).await;
    delivered(&recorder, 3, Duration::from_secs(10)).await;
    let report = running.stop().await;
    assert_eq!(report.deliveries, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_notifications_the_relay_polls() {
    let database = migrated().await;
    let recorder = Recorder::new();
    let store = PgStore::new(database.connect().await);
    let config = config("poller", false, Duration::from_millis(100));
    let relay = Relay::with_config(store, recorder.registry(), config);
    let running = Running::start(&relay);

    write(database.pool(), note::<OrgUpdate>(1, 1, 1)).await;
    delivered(&recorder, 1, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    write(database.pool(), note::<OrgUpdate>(2, 1, 2)).await;
    delivered(&recorder, 2, Duration::from_secs(10)).await;
    assert_eq!(listeners(&database).await, 0, "the relay does not listen");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_survives_its_connections_being_killed() {
    let database = migrated().await;
    let recorder = Recorder::new();
    let store = PgStore::new(database.connect().await);
    // Polling hourly: after the outage only a restored LISTEN (or the sweep the relay makes
    // when it re-listens) can find the second message.
    let relay = Relay::with_config(store, recorder.registry(), config("survivor", true, HOUR));
    let running = Running::start(&relay);

    write_announced(database.pool(), note::<OrgUpdate>(1, 1, 1)).await;
    delivered(&recorder, 1, Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut admin = database.pool().acquire().await.expect("a connection");
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM ( \
            SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
            WHERE datname = current_database() AND pid <> pg_backend_pid() \
         ) AS killed",
    )
    .fetch_one(&mut *admin)
    .await
    .expect("terminate the relay's connections");
    drop(admin);
    assert!(
        killed >= 2,
        "the relay's pool and its listener were connected"
    );

    write_announced(database.pool(), note::<OrgUpdate>(2, 1, 2)).await;
    delivered(&recorder, 2, Duration::from_secs(15)).await;
    // And other processes' notifications wake it again afterwards.
    tokio::time::sleep(Duration::from_millis(300)).await;
    write(database.pool(), note::<OrgUpdate>(3, 1, 3)).await;
    notify_from_elsewhere(&database, "1:3:").await;
    delivered(&recorder, 3, Duration::from_secs(10)).await;

    let report = running.stop().await;
    assert_eq!(report.deliveries, 3);
}

#[tokio::test]
async fn connecting_reports_bad_urls_and_absent_servers() {
    let error = outbox_postgres::connect("not a url")
        .await
        .expect_err("not a URL");
    assert!(
        matches!(error, Error::InvalidDatabaseUrl { .. }),
        "{error:?}"
    );

    let error = outbox_postgres::connect("postgres://user:secret@127.0.0.1:1/nothing")
        .await
        .expect_err("nothing listens on port 1");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(
        !error.to_string().contains("secret"),
        "the password is not shown: {error}"
    );
}

/// A URL of another scheme is refused before anything connects, naming the scheme and what is
/// expected: a `postgress://` typo does not reach the (real, answering) server, a `mysql://`
/// URL is not looked up as a PostgreSQL host.
#[tokio::test]
async fn connecting_refuses_urls_of_other_schemes() {
    let database = PgTestDatabase::create().await;
    let url = database.url();
    outbox_postgres::connect(&url)
        .await
        .expect("the database's own URL connects")
        .close()
        .await;
    let authority = url.split_once("://").expect("a URL").1;
    for scheme in ["postgress", "mysql", "sqlite"] {
        let wrong = format!("{scheme}://{authority}");
        let error = outbox_postgres::connect(&wrong)
            .await
            .expect_err("another scheme is refused");
        assert!(
            matches!(error, Error::InvalidDatabaseUrl { .. }),
            "{wrong}: {error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains(&format!("`{scheme}:`")) && text.contains("`postgres://`"),
            "{text}"
        );
    }
    let error = outbox_postgres::connect("mysql://app:secret@db.example/x")
        .await
        .expect_err("another scheme is refused");
    assert!(!error.to_string().contains("secret"), "{error}");
}

/// A URL asking for TLS (`sslmode=require`) on this build, whose sqlx has no TLS, is a
/// configuration error, not an outage: `connect` says so, and a relay on a pool of the
/// caller's stops at start-up with it instead of retrying forever.
#[tokio::test]
async fn tls_without_tls_support_is_a_configuration_error() {
    let database = PgTestDatabase::create().await;
    let url = format!("{}?sslmode=require", database.url());
    let error = outbox_postgres::connect(&url)
        .await
        .expect_err("this build cannot do TLS");
    assert!(
        matches!(error, Error::InvalidConfig { setting: "TLS", .. }) && !error.is_unavailable(),
        "{error:?}"
    );
    assert!(error.to_string().contains("TLS"), "{error}");

    let options = database.connect_options().ssl_mode(PgSslMode::Require);
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options);
    let recorder = Recorder::new();
    let relay = Relay::with_config(
        PgStore::new(pool),
        recorder.registry(),
        config("tls", false, Duration::from_millis(50)),
    );
    let outcome = tokio::time::timeout(Duration::from_secs(30), relay.run(std::future::pending()))
        .await
        .expect("the relay stops instead of retrying");
    let error = outcome.expect_err("the relay cannot start");
    assert!(
        matches!(error, Error::InvalidConfig { setting: "TLS", .. }),
        "{error:?}"
    );
}

/// A shard whose drain the database interrupted is released as soon as the database answers
/// again, not a lease later; its redelivery says it is a second attempt. The interruption is
/// stepped: the acknowledgement is made to wait on a lock, its session is terminated while it
/// waits, and the lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_interrupted_by_the_database_are_released_when_it_answers() {
    let database = migrated().await;
    let recorder = Recorder::new();
    let (entered, inside) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let handler = {
        let (recorder, gate) = (recorder.clone(), std::sync::Arc::clone(&gate));
        let entered = std::sync::Mutex::new(entered);
        move |delivery: outbox_core::Delivery<OrgUpdate>| {
            recorder.record(&delivery);
            let _ = entered.lock().expect("entered").send(());
            let gate = std::sync::Arc::clone(&gate);
            async move {
                gate.acquire().await.expect("the gate").forget();
                Ok::<(), outbox_core::BoxError>(())
            }
        }
    };
    let config = config("interrupted", false, Duration::from_millis(50))
        .to_builder()
        .lease(Duration::from_secs(600))
        .build()
        .expect("a valid relay configuration");
    let relay = Relay::with_config(
        PgStore::new(database.connect().await),
        recorder.registry_with::<OrgUpdate>(handler),
        config,
    );
    write(database.pool(), note::<OrgUpdate>(1, 1, 1)).await;
    let running = Running::start(&relay);
    tokio::task::spawn_blocking(move || inside.recv())
        .await
        .expect("wait")
        .expect("the handler runs");

    // The acknowledgement will wait on the shard's lease, locked here.
    let mut admin = PgConnection::connect(&server_url())
        .await
        .expect("admin connection");
    let mut locker = holding(
        &database,
        "LOCK TABLE outbox_leases IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    gate.add_permits(1);
    // The batch finish, known by its first lines (`pg_stat_activity` keeps a statement's
    // first kilobyte).
    let waiting = format!(
        "SELECT pid FROM pg_stat_activity WHERE datname = '{}' AND wait_event_type = 'Lock' \
         AND query LIKE '%AS w(shard_scope, shard_identifier, destination, lease_token, keep,%'",
        database.name()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let acknowledging: i32 = loop {
        if let Some(pid) = sqlx::query_scalar(sqlx::AssertSqlSafe(waiting.clone()))
            .fetch_optional(&mut admin)
            .await
            .expect("pg_stat_activity")
        {
            break pid;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the acknowledgement never waited on the locked lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(acknowledging)
        .execute(&mut admin)
        .await
        .expect("terminate the acknowledging session");
    sqlx::query("COMMIT")
        .execute(&mut locker)
        .await
        .expect("unlock");

    // Released at once (the lease had ten minutes to run) and redelivered as a second attempt.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while recorder.seen().len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the interrupted shard was not redelivered: {:?}",
            recorder.seen()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gate.add_permits(10);
    let seen = recorder.seen();
    assert_eq!(
        seen.iter()
            .map(|seen| (seen.seq, seen.attempt))
            .collect::<Vec<_>>(),
        [(1, 1), (1, 2)]
    );
    assert!(seen[1].token > seen[0].token);
    let report = running.stop().await;
    assert!(report.database_errors >= 1, "{report:?}");
}

/// A connection of the application's with a transaction open in which `statement` ran: the
/// locks it took are held until the transaction ends.
async fn holding(database: &PgTestDatabase, statement: &str) -> PgConnection {
    let mut connection = PgConnection::connect_with(&database.connect_options())
        .await
        .expect("a connection of the application's");
    for sql in ["BEGIN", statement] {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut connection)
            .await
            .expect("hold a lock");
    }
    connection
}

/// Waits until a statement of `database` whose text is `LIKE` `statement` waits on a lock,
/// failing with `otherwise` if `task` (the one running it) ends first. Polled: the wait is
/// seen in `pg_stat_activity`, never assumed after a sleep.
async fn waits_on_a_lock<T>(
    database: &PgTestDatabase,
    statement: &str,
    task: &JoinHandle<T>,
    otherwise: &str,
) {
    let mut admin = PgConnection::connect(&server_url())
        .await
        .expect("admin connection");
    loop {
        let waiters: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
             AND wait_event_type = 'Lock' AND query LIKE $2",
        )
        .bind(database.name())
        .bind(statement)
        .fetch_one(&mut admin)
        .await
        .expect("pg_stat_activity");
        if waiters > 0 {
            return;
        }
        assert!(!task.is_finished(), "{otherwise}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// [`waits_on_a_lock`] for a claim of several shards.
async fn claim_waits_on_a_lock<T>(
    database: &PgTestDatabase,
    claiming: &JoinHandle<T>,
    otherwise: &str,
) {
    waits_on_a_lock(database, "WITH want AS%", claiming, otherwise).await;
}

/// The shards of a `claim_many` call that it claimed, by identifier.
async fn claimed_by_many(store: &PgStore, shards: &[i64]) -> Vec<i64> {
    use outbox_core::store::Store;
    use outbox_core::store::{ClaimOptions, HandlerMode, Outcome, ShardSession};
    let keys: Vec<_> = shards.iter().map(|&shard| org_shard(shard)).collect();
    let options = ClaimOptions {
        worker: "many".to_owned(),
        lease: Duration::from_secs(30),
        mode: HandlerMode::Leased,
    };
    let sessions = tokio::time::timeout(
        Duration::from_secs(10),
        store.claim_many(&keys, &options, 10),
    )
    .await
    .expect("claiming does not wait for a held shard")
    .expect("claim");
    let mut claimed = Vec::new();
    for session in sessions {
        claimed.push(
            session
                .lease()
                .shard
                .shard_identifier
                .as_integer()
                .expect("integer"),
        );
        session.finish(Outcome::Yielded).await.expect("release");
    }
    claimed.sort_unstable();
    claimed
}

/// Claiming several shards in one statement, stepped against another transaction: a shard
/// whose newest lease row that transaction holds is skipped, not waited for; a shard whose
/// chain's first row it is inserting (with a lease of its own) is waited for, then left to
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claiming_many_shards_skips_held_rows_and_waits_for_inserted_ones() {
    let database = migrated().await;
    for shard in 1..=4u64 {
        write(database.pool(), note::<OrgUpdate>(shard, 1, shard)).await;
    }
    let store = PgStore::new(database.connect().await);
    let scope = org_shard(1).scope.0;
    let mut other = PgConnection::connect_with(&database.connect_options())
        .await
        .expect("another connection");
    sqlx::query(
        "INSERT INTO outbox_leases (shard_scope, shard_identifier, destination, seq, first) \
         VALUES ($1, 1, '', 0, true)",
    )
    .bind(scope)
    .execute(&mut other)
    .await
    .expect("shard 1's released chain");

    // Shard 1's row is locked: skipped at once.
    sqlx::query("BEGIN")
        .execute(&mut other)
        .await
        .expect("begin");
    sqlx::query(
        "SELECT 1 FROM outbox_leases WHERE shard_scope = $1 AND shard_identifier = 1 FOR UPDATE",
    )
    .bind(scope)
    .execute(&mut other)
    .await
    .expect("lock shard 1");
    assert_eq!(claimed_by_many(&store, &[1, 3]).await, [3]);

    // Shard 2's first row is being inserted, leased: the claim waits for it, then leaves it.
    sqlx::query(
        "INSERT INTO outbox_leases (shard_scope, shard_identifier, destination, seq, first, \
         lease_owner, lease_token, lease_expires_at) \
         VALUES ($1, 2, '', 0, true, 'other', nextval('outbox_lease_tokens'), \
             now() + interval '1 hour')",
    )
    .bind(scope)
    .execute(&mut other)
    .await
    .expect("insert shard 2's first row");
    let claiming = {
        let store = store.clone();
        tokio::spawn(async move { claimed_by_many(&store, &[4, 2]).await })
    };
    claim_waits_on_a_lock(
        &database,
        &claiming,
        "the claim did not wait for the inserted row",
    )
    .await;
    sqlx::query("COMMIT")
        .execute(&mut other)
        .await
        .expect("commit");
    assert_eq!(claiming.await.expect("claim task"), [4]);
    // Shard 1, free now, is claimed as any due shard.
    assert_eq!(claimed_by_many(&store, &[1, 2]).await, [1]);
}

/// The shards commits name are claimed beside a sweep's claim, never queued behind it:
/// stepped so that the sweep's claim waits on a lock (another transaction inserting shard 1's
/// first lease row), a message committed to shard 2 is delivered meanwhile; shard 1's, once the
/// other transaction rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commits_claim_does_not_queue_behind_a_sweeps_claim() {
    let database = migrated().await;
    let recorder = Recorder::new();
    write(database.pool(), note::<OrgUpdate>(1, 1, 1)).await;
    let scope = org_shard(1).scope.0;
    let mut other = holding(
        &database,
        &format!(
            "INSERT INTO outbox_leases (shard_scope, shard_identifier, destination, seq, first, \
             lease_owner, lease_token, lease_expires_at) \
             VALUES ({scope}, 1, '', 0, true, 'other', nextval('outbox_lease_tokens'), \
             now() + interval '1 hour')"
        ),
    )
    .await;
    let store = PgStore::new(database.connect().await);
    let relay = Relay::with_config(store, recorder.registry(), config("lanes", true, HOUR));
    let running = Running::start(&relay);
    claim_waits_on_a_lock(
        &database,
        &running.task,
        "the sweep's claim did not wait for shard 1's first lease row",
    )
    .await;

    write_announced(database.pool(), note::<OrgUpdate>(2, 2, 2)).await;
    delivered(&recorder, 2, Duration::from_secs(10)).await;
    assert!(
        recorder.seen().iter().all(|seen| seen.seq != 1),
        "shard 1's claim still waits"
    );
    sqlx::query("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("roll back");
    delivered(&recorder, 1, Duration::from_secs(10)).await;
    let report = running.stop().await;
    assert_eq!(report.deliveries, 2);
}

/// A claim of several shards reads their heads in the statement's snapshot, taken before it
/// claims: stepped so that another transaction, which is inserting the shard's first lease
/// row, acknowledges the shard's rows and releases it while the claim waits for that row, the
/// claim still gets the shard, and its session does not deliver the rows already gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_read_never_holds_rows_acknowledged_since_it_began() {
    use outbox_core::store::Store;
    use outbox_core::store::{ClaimOptions, HandlerMode, Outcome, ShardSession};
    let database = migrated().await;
    for shard in [7u64, 8] {
        write(database.pool(), note::<OrgUpdate>(shard, 1, shard)).await;
    }
    let store = PgStore::new(database.connect().await);
    let options = |worker: &str| ClaimOptions {
        worker: worker.to_owned(),
        lease: Duration::from_secs(30),
        mode: HandlerMode::Leased,
    };
    // Another worker's claim of shard 7, and its acknowledgement, stepped: not yet
    // committed.
    let mut other = PgConnection::connect_with(&database.connect_options())
        .await
        .expect("another connection");
    sqlx::query("BEGIN")
        .execute(&mut other)
        .await
        .expect("begin");
    for sql in [
        "INSERT INTO outbox_leases (shard_scope, shard_identifier, destination, seq, first, \
            lease_owner, lease_token, lease_expires_at) \
         VALUES ($1, 7, '', 0, true, 'first', nextval('outbox_lease_tokens'), \
            now() + interval '30 seconds')",
        "DELETE FROM outbox_messages WHERE shard_scope = $1 AND shard_identifier = 7",
    ] {
        sqlx::query(sql)
            .bind(org_shard(7).scope.0)
            .execute(&mut other)
            .await
            .expect("claim and acknowledge");
    }
    let claiming = {
        let (store, options) = (store.clone(), options("second"));
        tokio::spawn(async move {
            store
                .claim_many(&[org_shard(7), org_shard(8)], &options, 10)
                .await
                .expect("claim")
        })
    };
    claim_waits_on_a_lock(
        &database,
        &claiming,
        "the claim did not wait for the other worker's first row",
    )
    .await;
    sqlx::query("DELETE FROM outbox_leases WHERE shard_scope = $1 AND shard_identifier = 7")
        .bind(org_shard(7).scope.0)
        .execute(&mut other)
        .await
        .expect("release");
    sqlx::query("COMMIT")
        .execute(&mut other)
        .await
        .expect("commit");
    let sessions = claiming.await.expect("claim task");
    let mut heads = Vec::new();
    for mut session in sessions {
        let shard = session
            .lease()
            .shard
            .shard_identifier
            .as_integer()
            .expect("integer");
        let head = session.fetch(10).await.expect("fetch");
        heads.push((shard, head.len()));
        session.finish(Outcome::Drained).await.expect("release");
    }
    heads.sort_unstable();
    assert_eq!(
        heads,
        [(7, 0), (8, 1)],
        "shard 7's row was acknowledged before the claim"
    );
}

/// A database with the test models' tables, projects 1 to `rows` written behind the outbox's
/// back, and their backfill started to version 2.
async fn backfilling(rows: i64) -> (PgTestDatabase, PgStore) {
    let database = migrated().await;
    for ddl in MODEL_TABLES {
        database.execute(ddl).await;
    }
    database
        .execute(&format!(
            "INSERT INTO projects (id, organization_id, name, archived, score) \
             SELECT g, 1, 'p' || g, FALSE, 0 FROM generate_series(1, {rows}) AS g"
        ))
        .await;
    let store = PgStore::new(database.pool().clone());
    store
        .start_backfill(&BackfillStart::new(Project::ID, 2))
        .await
        .expect("start");
    (database, store)
}

/// A relay skips a model whose watermark another transaction holds (another relay walking a
/// batch), instead of waiting for it or walking the same rows; once it is free, the relay
/// walks from where the other left it. Stepped: the holder locks, the tick runs, the holder
/// commits, the tick runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_held_by_another_relay_is_skipped() {
    let (database, store) = backfilling(5).await;
    let model = BackfillModel::of::<Project>();
    let options = BackfillOptions {
        worker: "second".to_owned(),
        budget: 100,
    };
    // Another relay takes the watermark (the start recorded it).
    let mut other = PgConnection::connect(&database.url())
        .await
        .expect("connect");
    let mut holding = other.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM outbox_backfills WHERE category = $1 FOR UPDATE")
        .bind(Project::ID.0)
        .fetch_one(&mut *holding)
        .await
        .expect("lock the watermark");
    let skipped = store.backfill(&model, &options).await.expect("tick");
    assert_eq!(skipped.outcome, BackfillOutcome::Busy);
    assert!(
        store
            .pending_messages(10)
            .await
            .expect("pending")
            .is_empty()
    );
    holding.commit().await.expect("release");
    let walked = store.backfill(&model, &options).await.expect("tick");
    assert!(
        matches!(
            walked.outcome,
            BackfillOutcome::Walked {
                rows: 5,
                complete: true,
                ..
            }
        ),
        "{walked:?}"
    );
    // Done: a tick sees it by a read, without taking the watermark another transaction holds.
    let mut holding = other.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM outbox_backfills WHERE category = $1 FOR UPDATE")
        .bind(Project::ID.0)
        .fetch_one(&mut *holding)
        .await
        .expect("lock the watermark");
    let idle = store.backfill(&model, &options).await.expect("tick");
    assert_eq!(idle.outcome, BackfillOutcome::Gated, "{idle:?}");
    holding.rollback().await.expect("release");
}

/// A relay killed in the middle of a batch (its connection terminated while the batch waits,
/// having taken the watermark and written nothing yet that is visible) loses nothing and
/// writes nothing: the database rolls the batch back and frees the watermark, and the next
/// tick walks every row once. Stepped: another session locks the model's table, the tick
/// blocks on it holding the watermark, the test terminates the tick's connection, unlocks,
/// and ticks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_batch_cut_off_mid_way_is_walked_again_whole() {
    let (database, store) = backfilling(40).await;
    let options = BackfillOptions {
        worker: "doomed".to_owned(),
        budget: 25,
    };
    let mut locker = holding(&database, "LOCK TABLE projects IN ACCESS EXCLUSIVE MODE").await;
    let doomed = tokio::spawn({
        let store = store.clone();
        let options = options.clone();
        async move {
            store
                .backfill(&BackfillModel::of::<Project>(), &options)
                .await
        }
    });
    // Wait until the tick's batch waits on the table, holding the watermark.
    let mut admin = PgConnection::connect(&database.url())
        .await
        .expect("connect");
    let waiting = loop {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE '%FROM \"projects\"%'",
        )
        .fetch_optional(&mut admin)
        .await
        .expect("pg_stat_activity");
        if let Some(pid) = pid {
            break pid;
        }
        tokio::task::yield_now().await;
    };
    let held: bool = sqlx::query_scalar(
        "SELECT NOT EXISTS (SELECT 1 FROM outbox_backfills WHERE category = $1 \
         FOR UPDATE SKIP LOCKED)",
    )
    .bind(Project::ID.0)
    .fetch_one(&mut admin)
    .await
    .expect("probe the watermark");
    assert!(held, "the batch holds the watermark while it waits");
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(waiting)
        .execute(&mut admin)
        .await
        .expect("terminate the tick's connection");
    let cut = doomed.await.expect("the tick's task");
    assert!(cut.is_err(), "the cut-off batch fails: {cut:?}");
    sqlx::query("COMMIT")
        .execute(&mut locker)
        .await
        .expect("unlock");
    assert!(
        store
            .pending_messages(100)
            .await
            .expect("pending")
            .is_empty()
    );
    let state = store.backfills().await.expect("list").remove(0);
    assert_eq!((state.low_bound, state.rows_walked), (None, 0), "{state:?}");

    let model = BackfillModel::of::<Project>();
    let first = store.backfill(&model, &options).await.expect("tick");
    assert!(
        matches!(first.outcome, BackfillOutcome::Walked { rows: 25, .. }),
        "{first:?}"
    );
    let mut objects: Vec<i64> = Vec::new();
    let big = BackfillOptions {
        budget: 1_000,
        ..options
    };
    let rest = store.backfill(&model, &big).await.expect("tick");
    assert!(
        matches!(
            rest.outcome,
            BackfillOutcome::Walked {
                rows: 15,
                complete: true,
                ..
            }
        ),
        "{rest:?}"
    );
    for row in store.pending_messages(100).await.expect("pending") {
        objects.push(row.object_identifier.as_integer().expect("an integer"));
    }
    assert_eq!(objects, (1..=40).collect::<Vec<_>>(), "each row once");
}

/// S25, stepped: a set-aside never waits on a shard another transaction holds (a claim in
/// progress, a drain in its claiming transaction): it is refused at once and changes nothing.
/// Two set-asides of one message: the second waits for the first's message lock, then finds
/// the message gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_aside_is_refused_while_a_transaction_holds_the_shard() {
    let database = migrated().await;
    let store = PgStore::new(database.pool().clone());
    write(database.pool(), note::<OrgUpdate>(1, 1, 1)).await;
    write(database.pool(), note::<OrgUpdate>(1, 2, 2)).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_messages ORDER BY id")
        .fetch_all(database.pool())
        .await
        .expect("ids");
    let first = outbox_core::MessageId(ids[0]);
    sqlx::query(
        "INSERT INTO outbox_leases (shard_scope, shard_identifier, destination, seq, first) \
         VALUES (1, 1, '', 0, true)",
    )
    .execute(database.pool())
    .await
    .expect("a released chain");

    // Another transaction holds the shard's newest lease row, as a claim does while it runs.
    let mut other = PgConnection::connect(&database.url())
        .await
        .expect("connect");
    let mut holding = other.begin().await.expect("begin");
    sqlx::query(
        "SELECT 1 FROM outbox_leases WHERE shard_scope = 1 AND shard_identifier = 1 FOR UPDATE",
    )
    .fetch_one(&mut *holding)
    .await
    .expect("lock the shard");
    let refused = tokio::time::timeout(Duration::from_secs(5), store.set_aside(first, "bad"))
        .await
        .expect("refused at once, without waiting");
    assert!(
        matches!(&refused, Err(Error::ShardHeld { shard, owner: None }) if *shard == org_shard(1)),
        "{refused:?}"
    );
    assert_eq!(store.pending_messages(10).await.expect("pending").len(), 2);
    holding.rollback().await.expect("release");

    // One set-aside holds the message; a second waits for it, then finds it gone.
    let mut holding = other.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM outbox_messages WHERE id = $1 FOR UPDATE")
        .bind(first.0)
        .fetch_one(&mut *holding)
        .await
        .expect("lock the message");
    let waiting = tokio::spawn({
        let store = store.clone();
        async move { store.set_aside(first, "second").await }
    });
    waits_on_a_lock(
        &database,
        "%",
        &waiting,
        "the second set-aside waits on the message",
    )
    .await;
    sqlx::query("DELETE FROM outbox_messages WHERE id = $1")
        .bind(first.0)
        .execute(&mut *holding)
        .await
        .expect("take the message");
    holding.commit().await.expect("commit");
    let second = waiting.await.expect("the set-aside task");
    assert!(
        matches!(second, Err(Error::NoSuchMessage { id }) if id == first),
        "{second:?}"
    );
    assert!(
        store
            .dead_letters(&Default::default())
            .await
            .expect("letters")
            .is_empty()
    );
}

/// Readiness waits for the relay's start-up checks: with the migrations table locked, the
/// relay runs (live) and the database answers, but it is not ready until its check passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_is_ready_only_after_its_start_up_checks() {
    let database = migrated().await;
    let relay = Relay::with_config(
        PgStore::new(database.pool().clone()),
        Recorder::new().registry(),
        config("starting", false, Duration::from_millis(50)),
    );
    let mut locker = holding(
        &database,
        "LOCK TABLE _outbox_migrations IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    let running = Running::start(&relay);
    waits_on_a_lock(
        &database,
        "%",
        &running.task,
        "the relay's start-up check waits on the migrations table",
    )
    .await;
    let starting = relay.health().await;
    assert!(
        starting.is_live() && starting.database_reachable && !starting.started,
        "{starting:?}"
    );
    assert!(
        !starting.is_ready(),
        "not ready before its checks: {starting:?}"
    );
    sqlx::query("ROLLBACK")
        .execute(&mut locker)
        .await
        .expect("unlock");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !relay.health().await.is_ready() {
        assert!(std::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.stop().await;
}

/// A database that does not exist yet is an outage, not a fault of the configuration: `run`
/// keeps retrying (live, not ready) and starts once the database is created and migrated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_waits_for_a_database_that_does_not_exist_yet() {
    let server = migrated().await;
    let name = format!("{}_later", server.name());
    let url = server.url().replacen(server.name(), &name, 1);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_lazy(&url)
        .expect("a lazy pool");
    let recorder = Recorder::new();
    let relay = Relay::with_config(
        PgStore::new(pool.clone()),
        recorder.registry(),
        config("waiting", false, Duration::from_millis(50)),
    );
    let running = Running::start(&relay);
    // `health` probes the database itself, so the error can show before the spawned loop
    // has marked itself running: wait for both.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let health = relay.health().await;
        if health.is_live()
            && health
                .database_error
                .as_deref()
                .is_some_and(|error| error.contains("does not exist"))
        {
            assert!(!health.is_ready(), "{health:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{health:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!running.task.is_finished(), "run did not return");

    // Created and migrated under another name, then renamed: the relay finds it whole (a
    // relay that found it unmigrated would stop with `MigrationMissing`, as it should).
    let making = format!("{name}_making");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{making}\"")))
        .execute(server.pool())
        .await
        .expect("create the database");
    let created = PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.url().replacen(server.name(), &making, 1))
        .await
        .expect("connect");
    outbox_postgres::migrate(&created).await.expect("migrate");
    write(&created, note::<OrgUpdate>(1, 1, 1)).await;
    created.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{making}\" RENAME TO \"{name}\""
    )))
    .execute(server.pool())
    .await
    .expect("rename the database");
    delivered(&recorder, 1, Duration::from_secs(30)).await;
    assert!(relay.health().await.is_ready());
    running.stop().await;
    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE \"{name}\" WITH (FORCE)"
    )))
    .execute(server.pool())
    .await
    .expect("drop the database");
}

/// Shard `shard` claimed on `store`, and the acknowledgement of its first row.
async fn claimed_with_its_head(
    store: &PgStore,
    shard: u64,
    options: &outbox_core::store::ClaimOptions,
) -> (
    <PgStore as Store>::Session,
    Vec<outbox_core::store::Acknowledgement>,
) {
    use outbox_core::store::{Acknowledgement, GroupKey, ShardSession};
    let mut session = store
        .claim(&org_shard(shard), options)
        .await
        .expect("claim")
        .expect("due");
    let rows = session.fetch(10).await.expect("fetch");
    let acks = vec![Acknowledgement {
        group: GroupKey {
            category: rows[0].category,
            object_identifier: rows[0].object_identifier,
        },
        ids: vec![rows[0].id],
    }];
    (session, acks)
}

/// Drained shards finished together are one transaction: stepped so that the batch waits on
/// shard 2's state row and its connection is terminated there, nothing of it is written (not
/// even shard 1's, whose row was free), each shard gets the error as an outage, and once
/// their leases are released every message is delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_finished_shards_that_fails_writes_nothing() {
    use outbox_core::store::{ClaimOptions, HandlerMode, ShardSession};
    let database = migrated().await;
    for shard in [1u64, 2] {
        write(database.pool(), note::<OrgUpdate>(shard, 1, shard)).await;
    }
    let store = PgStore::new(database.connect().await);
    let options = ClaimOptions {
        worker: "batch".to_owned(),
        lease: Duration::from_secs(30),
        mode: HandlerMode::Leased,
    };
    let mut finishing = Vec::new();
    let mut leases = Vec::new();
    for shard in [1u64, 2] {
        let (session, acks) = claimed_with_its_head(&store, shard, &options).await;
        leases.push(session.lease().clone());
        finishing.push((session, acks));
    }
    // Another transaction holds shard 2's lease row.
    let mut blocker = holding(
        &database,
        "SELECT 1 FROM outbox_leases WHERE shard_identifier = 2 FOR UPDATE",
    )
    .await;
    let batch = {
        let store = store.clone();
        tokio::spawn(async move { store.ack_and_finish_many(finishing).await })
    };
    waits_on_a_lock(
        &database,
        "%outbox_leases%",
        &batch,
        "the batch did not wait on shard 2's row",
    )
    .await;
    let mut admin = PgConnection::connect(&server_url())
        .await
        .expect("admin connection");
    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '%outbox_leases%'",
    )
    .bind(database.name())
    .fetch_one(&mut admin)
    .await
    .expect("terminate the batch's connection");
    assert_eq!(terminated, 1);
    let results = batch.await.expect("the batch's task");
    assert_eq!(results.len(), 2);
    for result in &results {
        assert!(
            matches!(result, Err(error) if error.is_unavailable()),
            "{result:?}"
        );
    }
    sqlx::query("ROLLBACK")
        .execute(&mut blocker)
        .await
        .expect("rollback");
    assert_eq!(
        store.pending_messages(10).await.expect("pending").len(),
        2,
        "nothing of the batch was written"
    );
    for lease in &leases {
        assert!(store.release(lease).await.expect("release"), "still held");
    }
    let recorder = Recorder::new();
    let relay = Relay::new(store.clone(), recorder.registry());
    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(recorder.seen().len(), 2, "both delivered again");
    assert!(
        store
            .pending_messages(10)
            .await
            .expect("pending")
            .is_empty()
    );
}

/// A finish that meets its own lease's extension (a heartbeat sent as its handler ended)
/// waits for it, then finds the lease where the extension left it: stepped so that the batch
/// finish waits on the extending transaction, the shard is acknowledged and released, not
/// reported lost (the statement reaches each lease row where its snapshot saw it, which the
/// extension moved; the store asks again for a lease found so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_beside_its_leases_extension_still_holds_the_lease() {
    use outbox_core::store::{ClaimOptions, HandlerMode};
    let database = migrated().await;
    write(database.pool(), note::<OrgUpdate>(1, 1, 1)).await;
    let store = PgStore::new(database.connect().await);
    let options = ClaimOptions {
        worker: "finish".to_owned(),
        lease: Duration::from_secs(30),
        mode: HandlerMode::Leased,
    };
    let (session, acks) = claimed_with_its_head(&store, 1, &options).await;
    let mut extension = holding(
        &database,
        "UPDATE outbox_leases SET lease_expires_at = now() + interval '1 minute' \
         WHERE shard_identifier = 1 AND lease_owner = 'finish'",
    )
    .await;
    let batch = {
        let store = store.clone();
        tokio::spawn(async move { store.ack_and_finish_many(vec![(session, acks)]).await })
    };
    waits_on_a_lock(
        &database,
        "%outbox_leases%",
        &batch,
        "the finish did not wait on the extension",
    )
    .await;
    sqlx::query("COMMIT")
        .execute(&mut extension)
        .await
        .expect("commit the extension");
    let results = batch.await.expect("the batch's task");
    assert!(
        matches!(results[..], [Ok((1, true))]),
        "acknowledged and released: {results:?}"
    );
    assert!(
        store
            .pending_messages(10)
            .await
            .expect("pending")
            .is_empty()
    );
    let leases: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_leases")
        .fetch_one(database.pool())
        .await
        .expect("the log");
    assert_eq!(leases, 0, "the lease ended with its chain");
}

/// A `REPEATABLE READ` transaction that has read the outbox (as `pg_dump` does) holds the
/// vacuum horizon: the status names its session (process id, application, state) and since
/// when, the gauges too; once it commits, it is no longer named.
#[tokio::test]
async fn status_names_the_session_that_holds_the_vacuum_horizon() {
    let database = migrated().await;
    let store = PgStore::new(database.pool().clone());
    let mut report = PgConnection::connect(&database.url())
        .await
        .expect("connect");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut report)
        .await
        .expect("pid");
    for statement in [
        "SET application_name = 'nightly-report'",
        "BEGIN ISOLATION LEVEL REPEATABLE READ",
        "SELECT count(*) FROM outbox_messages",
    ] {
        sqlx::query(statement)
            .execute(&mut report)
            .await
            .expect(statement);
    }
    let named = format!("session {pid} (nightly-report");
    for status in [
        store.status(0).await.expect("status"),
        store.gauges().await.expect("gauges"),
    ] {
        let horizon = status.horizon.expect("the horizon's holder");
        assert!(
            horizon.holder.starts_with(&named) && horizon.holder.contains("idle in transaction"),
            "{horizon:?}"
        );
        let since = horizon.since.expect("since when");
        assert!(since <= std::time::SystemTime::now(), "{horizon:?}");
        assert!(horizon.behind.is_some(), "{horizon:?}");
    }

    sqlx::query("COMMIT")
        .execute(&mut report)
        .await
        .expect("commit");
    let status = store.status(0).await.expect("status");
    assert!(
        status
            .horizon
            .as_ref()
            .is_none_or(|horizon| !horizon.holder.starts_with(&named)),
        "{:?}",
        status.horizon
    );
}
