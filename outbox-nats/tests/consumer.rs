//! The consumer's side against the NATS server on 127.0.0.1:4222: an orders database's relay
//! publishes to a JetStream stream of the test's own, and billing's `NatsConsumer` applies
//! each message into billing's own SQLite database through its inbox, effectively once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use outbox_core::handler::{BoxFuture, FromContext, Handler, HandlerContext};
use outbox_core::inbox::{
    Consumer, Inbox, InboxDatabase, InboxDeadLetter, InboxTransaction, StoredInboxDeadLetter,
};
use outbox_core::sink::headers;
use outbox_core::{Backoff, BoxError, Connection, Delivery, MessageId, Registry};
use outbox_nats::{ConsumeReport, NatsConsumer, NatsSink};
use outbox_testkit::fixtures::{AuditEvent, note};
use outbox_testkit::sqlite::SqliteFile;
use outbox_testkit::sqlx::SqlxTestDatabase;
use sqlx::SqliteConnection;
use tokio::sync::{Notify, oneshot};

const NATS: &str = "127.0.0.1:4222";

type Database = SqlxTestDatabase<SqliteFile>;

/// A stream of the test's own, capturing `<name>.>`; deleted at the end.
struct TestStream {
    name: String,
    jetstream: jetstream::Context,
}

impl TestStream {
    async fn create(test: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "inbox_{test}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let jetstream = jetstream::new(client().await);
        jetstream
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.>")],
                ..Default::default()
            })
            .await
            .expect("create the test stream");
        Self { name, jetstream }
    }

    /// Writes audit events `seqs` of organization 7 in the orders database and relays them
    /// into the stream.
    async fn publish(&self, orders: &Database, seqs: impl IntoIterator<Item = u64>) {
        let messages: Vec<_> = seqs
            .into_iter()
            .map(|seq| note::<AuditEvent>(7, seq, seq))
            .collect();
        orders.write_messages(&messages).await;
        let sink = NatsSink::new(client().await).with_subject_prefix(&self.name);
        let registry = Registry::builder()
            .sink::<AuditEvent, _>(sink)
            .build()
            .expect("a registry");
        let report = orders.relay(registry).drain().await.expect("drain");
        assert!(report.failures.is_empty(), "{:?}", report.failures);
    }

    /// The messages the durable consumer has not been delivered, and those delivered and
    /// not acknowledged; `None` before it exists.
    async fn unacknowledged(&self, durable: &str) -> Option<(u64, usize)> {
        let mut consumer: jetstream::consumer::PullConsumer = self
            .jetstream
            .get_consumer_from_stream(durable, &self.name)
            .await
            .ok()?;
        let info = consumer.info().await.expect("consumer info");
        Some((info.num_pending, info.num_ack_pending))
    }

    async fn remove(self) {
        self.jetstream
            .delete_stream(&self.name)
            .await
            .expect("delete the test stream");
    }
}

async fn client() -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|_| Duration::from_millis(50))
        .connect(NATS)
        .await
        .expect("NATS runs on 4222")
}

/// Billing's database: a `charges` table, one row per charge (a second charge of an order
/// would be a second row).
async fn billing_database() -> Database {
    let billing = Database::migrated().await;
    billing
        .execute("CREATE TABLE charges (order_id INTEGER NOT NULL, attempt INTEGER NOT NULL)")
        .await;
    billing
}

/// The orders billing charged, in the order it charged them.
async fn charges(billing: &Database) -> Vec<i64> {
    sqlx::query_scalar("SELECT order_id FROM charges ORDER BY rowid")
        .fetch_all(billing.pool())
        .await
        .expect("charges")
}

/// Billing's handler: each audit event charges its order (its seq) in the consumer's
/// transaction; the orders in `fail_once` fail on their first attempt, after charging.
struct Charge {
    fail_once: Vec<u64>,
}

impl Handler<Delivery<AuditEvent>> for Charge {
    async fn call(
        &self,
        delivery: Delivery<AuditEvent>,
        cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        let mut conn = Connection::<SqliteConnection>::from_context(cx)?;
        let seq = delivery.payload.seq;
        sqlx::query("INSERT INTO charges (order_id, attempt) VALUES (?1, ?2)")
            .bind(i64::try_from(seq)?)
            .bind(i64::from(delivery.attempt))
            .execute(&mut *conn)
            .await?;
        if delivery.attempt == 1 && self.fail_once.contains(&seq) {
            return Err(format!("card declined for order {seq}").into());
        }
        Ok(())
    }
}

/// Billing's consumer, charging with [`Charge`].
fn billing_consumer(billing: &Database, fail_once: &[u64]) -> Consumer {
    Consumer::builder(
        Inbox::new("billing"),
        outbox_sqlite::SqliteStore::new(billing.pool().clone()),
    )
    .handle::<AuditEvent, _>(Charge {
        fail_once: fail_once.to_vec(),
    })
    .backoff(Backoff::new(
        Duration::from_millis(10),
        Duration::from_millis(50),
    ))
    .max_attempts(3)
    .build()
    .expect("billing's consumer")
}

/// Runs `consumer` on `stream` through durable `durable` until billing holds `until`
/// charges, then stops it; returns what it settled.
async fn consume_until(
    consumer: NatsConsumer,
    billing: &Database,
    until: impl Fn(&[i64]) -> bool,
) -> ConsumeReport {
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        consumer
            .run(client().await, async {
                let _ = stopped.await;
            })
            .await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if until(&charges(billing).await) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "billing charged only {:?}",
            charges(billing).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).expect("the consumer runs");
    running
        .await
        .expect("the consumer task")
        .expect("the consumer ran")
}

/// Every order is charged once, in the stream's order, each message acknowledged after its
/// commit; a second durable consumer of the same inbox finds every message applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_order_is_charged_once_and_acknowledged_after_its_commit() {
    let stream = TestStream::create("once").await;
    let orders = Database::migrated().await;
    let billing = billing_database().await;
    stream.publish(&orders, 1..=20).await;

    let consumer = NatsConsumer::new(billing_consumer(&billing, &[]), &stream.name, "billing");
    let report = consume_until(consumer, &billing, |charged| charged.len() == 20).await;
    assert_eq!(charges(&billing).await, (1..=20).collect::<Vec<_>>());
    assert_eq!(report.applied, 20);
    tokio::time::timeout(Duration::from_secs(10), async {
        while stream.unacknowledged("billing").await != Some((0, 0)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every message acknowledged");

    // The same messages, delivered again (another durable consumer, billing's inbox).
    let again = NatsConsumer::new(
        billing_consumer(&billing, &[]),
        &stream.name,
        "billing-again",
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        again
            .run(client().await, async {
                let _ = stopped.await;
            })
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), async {
        while stream.unacknowledged("billing-again").await != Some((0, 0)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every redelivery acknowledged");
    stop.send(()).expect("running");
    let report = running.await.expect("task").expect("ran");
    assert_eq!((report.applied, report.duplicates), (0, 20));
    assert_eq!(charges(&billing).await.len(), 20, "nothing charged twice");
    stream.remove().await;
}

/// A failing message is retried in place: its charge rolls back with the failure, the next
/// messages wait, and the stream's order holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_message_is_retried_in_place_keeping_the_order() {
    let stream = TestStream::create("retry").await;
    let orders = Database::migrated().await;
    let billing = billing_database().await;
    stream.publish(&orders, 1..=6).await;

    let consumer = NatsConsumer::new(billing_consumer(&billing, &[3]), &stream.name, "billing");
    let report = consume_until(consumer, &billing, |charged| charged.len() == 6).await;
    assert_eq!(charges(&billing).await, vec![1, 2, 3, 4, 5, 6]);
    let attempt: i64 = sqlx::query_scalar("SELECT attempt FROM charges WHERE order_id = 3")
        .fetch_one(billing.pool())
        .await
        .expect("order 3's charge");
    assert_eq!(attempt, 2, "the first attempt's charge rolled back");
    assert_eq!(report.applied, 6);
    stream.remove().await;
}

/// A message that is not an outbox message of a category billing handles is a dead letter
/// in billing's database, acknowledged; the messages after it are applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_a_dead_letter_and_the_rest_flow() {
    let stream = TestStream::create("poison").await;
    let orders = Database::migrated().await;
    let billing = billing_database().await;
    stream.publish(&orders, 1..=2).await;
    let mut poison = HeaderMap::new();
    poison.insert(headers::MESSAGE_ID, "999999");
    poison.insert(headers::CATEGORY, "audit_event");
    stream
        .jetstream
        .publish_with_headers(
            format!("{}.audit_event", stream.name),
            poison,
            "not json".into(),
        )
        .await
        .expect("publish")
        .await
        .expect("stored");
    stream.publish(&orders, 3..=4).await;

    let consumer = NatsConsumer::new(billing_consumer(&billing, &[]), &stream.name, "billing");
    let report = consume_until(consumer, &billing, |charged| charged.len() == 4).await;
    assert_eq!(charges(&billing).await, vec![1, 2, 3, 4]);
    assert_eq!((report.applied, report.dead_lettered), (4, 1));
    let store = outbox_sqlite::SqliteStore::new(billing.pool().clone());
    let letters = store
        .dead_letters(Some("billing"), 10)
        .await
        .expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].payload, b"not json");
    assert!(
        letters[0].error.contains(headers::SHARD),
        "{}",
        letters[0].error
    );
    stream.remove().await;
}

/// The consumer reports its lag (what JetStream holds for it after the message it applies)
/// and its handler's failures.
#[test]
fn the_lag_and_the_failures_are_reported() {
    let ((), telemetry) = outbox_testkit::telemetry::capture(|_| async {
        let stream = TestStream::create("lag").await;
        let orders = Database::migrated().await;
        let billing = billing_database().await;
        stream.publish(&orders, 1..=3).await;
        let consumer = NatsConsumer::new(billing_consumer(&billing, &[2]), &stream.name, "billing")
            .max_ack_pending(1);
        consume_until(consumer, &billing, |charged| charged.len() == 3).await;
        stream.remove().await;
    });
    use outbox_core::telemetry::{INBOX_HANDLER_FAILURES, INBOX_LAG, INBOX_RECEIVED};
    let billing = [("consumer", "billing")];
    assert_eq!(
        telemetry.gauge(INBOX_LAG, &billing),
        Some(0.0),
        "set at the last message"
    );
    assert_eq!(
        telemetry.counter(INBOX_RECEIVED, &billing),
        4,
        "three messages, one twice"
    );
    assert_eq!(
        telemetry.counter(
            INBOX_HANDLER_FAILURES,
            &[("consumer", "billing"), ("category", "audit_event")]
        ),
        1
    );
}

/// Billing's database, whose `crash_at`-th commit commits and then never returns: the
/// consumer's process dies after its transaction committed and before the broker heard of
/// it.
#[derive(Clone)]
struct CrashAfterCommit {
    store: outbox_sqlite::SqliteStore,
    commits: Arc<AtomicUsize>,
    crash_at: usize,
    crashed: Arc<Notify>,
}

struct CrashingTransaction {
    inner: Box<dyn InboxTransaction>,
    database: CrashAfterCommit,
}

impl InboxDatabase for CrashAfterCommit {
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn InboxTransaction>, outbox_core::Error>> {
        Box::pin(async move {
            let inner = self.store.begin().await?;
            Ok(Box::new(CrashingTransaction {
                inner,
                database: self.clone(),
            }) as Box<dyn InboxTransaction>)
        })
    }

    fn purge_inbox<'a>(
        &'a self,
        consumer: Option<&'a str>,
        age: Duration,
    ) -> BoxFuture<'a, Result<u64, outbox_core::Error>> {
        self.store.purge_inbox(consumer, age)
    }

    fn dead_letters<'a>(
        &'a self,
        consumer: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredInboxDeadLetter>, outbox_core::Error>> {
        self.store.dead_letters(consumer, limit)
    }
}

impl InboxTransaction for CrashingTransaction {
    fn record<'a>(
        &'a mut self,
        consumer: &'a str,
        message: MessageId,
    ) -> BoxFuture<'a, Result<bool, outbox_core::Error>> {
        self.inner.record(consumer, message)
    }

    fn purge<'a>(
        &'a mut self,
        consumer: &'a str,
        age: Duration,
    ) -> BoxFuture<'a, Result<u64, outbox_core::Error>> {
        self.inner.purge(consumer, age)
    }

    fn dead_letter<'a>(
        &'a mut self,
        letter: &'a InboxDeadLetter<'a>,
    ) -> BoxFuture<'a, Result<(), outbox_core::Error>> {
        self.inner.dead_letter(letter)
    }

    fn connection(&mut self) -> &mut (dyn std::any::Any + Send) {
        self.inner.connection()
    }

    fn commit(self: Box<Self>) -> BoxFuture<'static, Result<(), outbox_core::Error>> {
        Box::pin(async move {
            self.inner.commit().await?;
            let database = self.database;
            if database.commits.fetch_add(1, Ordering::SeqCst) + 1 == database.crash_at {
                database.crashed.notify_one();
                std::future::pending::<()>().await;
            }
            Ok(())
        })
    }
}

/// A consumer that dies after its transaction committed and before it acknowledged: the
/// message is delivered again, to its successor, which finds it applied. Every order is
/// charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_commit_and_the_ack_charges_nothing_twice() {
    let stream = TestStream::create("crash").await;
    let orders = Database::migrated().await;
    let billing = billing_database().await;
    stream.publish(&orders, 1..=10).await;

    let crashed = Arc::new(Notify::new());
    let dying = CrashAfterCommit {
        store: outbox_sqlite::SqliteStore::new(billing.pool().clone()),
        commits: Arc::new(AtomicUsize::new(0)),
        crash_at: 5,
        crashed: Arc::clone(&crashed),
    };
    let consumer = Consumer::builder(Inbox::new("billing"), dying)
        .handle::<AuditEvent, _>(Charge {
            fail_once: Vec::new(),
        })
        .build()
        .expect("a consumer");
    let ack_wait = Duration::from_secs(1);
    let first = NatsConsumer::new(consumer, &stream.name, "billing").ack_wait(ack_wait);
    let running =
        tokio::spawn(async move { first.run(client().await, std::future::pending()).await });
    crashed.notified().await;
    running.abort();
    let _ = running.await;
    assert_eq!(
        charges(&billing).await,
        vec![1, 2, 3, 4, 5],
        "committed, not acknowledged"
    );

    let successor = NatsConsumer::new(billing_consumer(&billing, &[]), &stream.name, "billing")
        .ack_wait(ack_wait);
    let report = consume_until(successor, &billing, |charged| charged.len() == 10).await;
    assert_eq!(charges(&billing).await, (1..=10).collect::<Vec<_>>());
    assert!(report.duplicates >= 1, "order 5 came again: {report:?}");
    assert_eq!(report.applied, 5);
    stream.remove().await;
}
