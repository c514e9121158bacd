//! The tests every broker's consumer loop passes against its real broker, written once: a
//! broker crate gives each a [`ConsumerBroker`] (its sink, a way to publish a raw message, its
//! consumer loop, whether a group has acknowledged everything) and asserts what is
//! particular to it.
//!
//! An orders database (a SQLite file) writes [`AuditEvent`]s of organization 7, each an order
//! (its seq), and a relay publishes them through the broker's sink; billing (another SQLite
//! file) charges each order in the consumer's transaction, one `charges` row per charge, so
//! that a second charge of an order would show.
//!
//! - [`each_message_is_applied_once_and_acknowledged`]: 20 orders charged once, in order,
//!   everything acknowledged; a second group of the same inbox finds all 20 applied.
//! - [`a_failing_message_is_retried_in_place_keeping_the_order`]: order 3 fails once after
//!   charging; its charge rolls back, the later orders wait, the order holds.
//! - [`a_poison_message_is_a_dead_letter_and_the_rest_flow`]: a message no sink wrote is a
//!   dead letter in billing's database, acknowledged; the orders around it are charged.
//! - [`a_crash_between_the_commit_and_the_ack_charges_nothing_twice`]: the consumer dies
//!   after its commit and before its acknowledgement; its successor gets the message again
//!   and finds it applied.
//! - [`the_lag_and_the_failures_are_reported`]: the handler's failures counted, the lag set.
//!
//! [`consumer_suite!`](crate::consumer_suite) makes a `#[test]` of each, for a broker made by
//! an `async fn(test_name) -> impl ConsumerBroker`:
//!
//! ```ignore
//! outbox_testkit::consumer_suite!(TestStream::create, reports_lag: true);
//! ```

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use outbox_core::handler::{BoxFuture, FromContext, Handler, HandlerContext};
use outbox_core::inbox::{
    ConsumeReport, Consumer, Inbox, InboxDatabase, InboxDeadLetter, InboxTransaction,
    StoredInboxDeadLetter,
};
use outbox_core::sink::{Sink, headers};
use outbox_core::{Backoff, BoxError, Connection, Delivery, Error, MessageId, Registry};
use outbox_sqlite::SqliteStore;
use sqlx::SqliteConnection;
use tokio::sync::{Notify, oneshot};

use crate::fixtures::{AuditEvent, note};
use crate::sqlite::SqliteFile;
use crate::sqlx::SqlxTestDatabase;

/// A SQLite database of the suite (orders, billing).
pub type Database = SqlxTestDatabase<SqliteFile>;

/// A broker as the consumer suite drives it.
pub trait ConsumerBroker: Send + Sync {
    /// The broker's sink: what the orders relay publishes with.
    type Sink: Sink + Clone;

    /// A sink publishing the audit events where [`consume`](Self::consume) reads them.
    fn sink(&self) -> impl Future<Output = Self::Sink> + Send;

    /// Publishes a message no outbox sink wrote, with `headers` and `payload`, where the
    /// audit events go.
    fn publish_raw(
        &self,
        headers: &[(&str, &str)],
        payload: &[u8],
    ) -> impl Future<Output = ()> + Send;

    /// Runs `consumer` as member `member` of consumer group (or durable consumer) `group`
    /// until `stop` resolves; what it settled. A message left unacknowledged is delivered
    /// again within a second or two (the loop's redelivery settings are the test's to make
    /// short).
    fn consume(
        &self,
        consumer: Consumer,
        group: &str,
        member: &str,
        stop: BoxFuture<'static, ()>,
    ) -> BoxFuture<'static, ConsumeReport>;

    /// Whether group `group` exists and has every message acknowledged, once its consumer
    /// loop has stopped (what it had not acknowledged is then back with the broker).
    fn all_acknowledged(&self, group: &str) -> impl Future<Output = bool> + Send;

    /// Deletes what the test made on the broker (its stream).
    fn remove(self) -> impl Future<Output = ()> + Send
    where
        Self: Sized;
}

/// Billing's database: a `charges` table, one row per charge.
pub async fn billing_database() -> Database {
    let billing = Database::migrated().await;
    billing
        .execute("CREATE TABLE charges (order_id INTEGER NOT NULL, attempt INTEGER NOT NULL)")
        .await;
    billing
}

/// The orders billing charged, in the order it charged them.
pub async fn charges(billing: &Database) -> Vec<i64> {
    sqlx::query_scalar("SELECT order_id FROM charges ORDER BY rowid")
        .fetch_all(billing.pool())
        .await
        .expect("charges")
}

/// Billing's handler: each audit event charges its order (its seq) in the consumer's
/// transaction; the orders in `fail_once` fail on their first attempt, after charging.
#[derive(Debug, Clone, Default)]
pub struct Charge {
    /// The orders whose first attempt fails.
    pub fail_once: Vec<u64>,
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

/// Billing's consumer on `database`, charging with `charge`: quick retries, a dead letter
/// after 3 attempts.
pub fn billing_consumer(database: impl InboxDatabase, charge: Charge) -> Consumer {
    Consumer::builder(Inbox::new("billing"), database)
        .handle::<AuditEvent, _>(charge)
        .backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .max_attempts(3)
        .build()
        .expect("billing's consumer")
}

/// Billing's store.
fn store(billing: &Database) -> SqliteStore {
    SqliteStore::new(billing.pool().clone())
}

/// Writes orders `seqs` (audit events of organization 7) in `orders` and relays them
/// through `broker`'s sink.
pub async fn publish<K: ConsumerBroker>(
    broker: &K,
    orders: &Database,
    seqs: impl IntoIterator<Item = u64>,
) {
    let messages: Vec<_> = seqs
        .into_iter()
        .map(|seq| note::<AuditEvent>(7, seq, seq))
        .collect();
    orders.write_messages(&messages).await;
    let registry = Registry::builder()
        .sink::<AuditEvent, _>(broker.sink().await)
        .build()
        .expect("a registry");
    let report = orders.relay(registry).drain().await.expect("drain");
    assert!(report.failures.is_empty(), "{:?}", report.failures);
}

/// Runs `consumer` in `group` as `member` until billing's charges satisfy `until` (30 s at
/// most), then stops it; what it settled.
pub async fn consume_until<K: ConsumerBroker>(
    broker: &K,
    consumer: Consumer,
    (group, member): (&str, &str),
    billing: &Database,
    until: impl Fn(&[i64]) -> bool,
) -> ConsumeReport {
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(broker.consume(
        consumer,
        group,
        member,
        Box::pin(async {
            let _ = stopped.await;
        }),
    ));
    eventually("billing charges", || async {
        until(&charges(billing).await)
    })
    .await;
    stop.send(()).expect("the consumer runs");
    running.await.expect("the consumer task")
}

/// Waits until `group`, its consumer loop stopped, has acknowledged everything (30 s at
/// most).
pub async fn all_acknowledged<K: ConsumerBroker>(broker: &K, group: &str) {
    eventually("every message acknowledged", || {
        broker.all_acknowledged(group)
    })
    .await;
}

/// Waits until `condition` holds, checking every 20 ms, failing after 30 s.
async fn eventually<F: Future<Output = bool>>(what: &str, condition: impl Fn() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 30 s for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every order is charged once, in the stream's order, each message acknowledged after its
/// commit; a second group of the same inbox finds every message applied.
pub async fn each_message_is_applied_once_and_acknowledged<K: ConsumerBroker>(broker: &K) {
    let orders = Database::migrated().await;
    let billing = billing_database().await;
    publish(broker, &orders, 1..=20).await;

    let consumer = billing_consumer(store(&billing), Charge::default());
    let report = consume_until(broker, consumer, ("billing", "b1"), &billing, |charged| {
        charged.len() == 20
    })
    .await;
    assert_eq!(charges(&billing).await, (1..=20).collect::<Vec<_>>());
    assert_eq!(report.applied, 20);
    all_acknowledged(broker, "billing").await;

    // The same messages, delivered again: another group, billing's inbox.
    let watched = Watched::new(store(&billing));
    let (stop, stopped) = oneshot::channel::<()>();
    let again = tokio::spawn(broker.consume(
        billing_consumer(watched.clone(), Charge::default()),
        "billing-again",
        "b1",
        Box::pin(async {
            let _ = stopped.await;
        }),
    ));
    eventually("all 20 messages seen again", || async {
        watched.commits.load(Ordering::SeqCst) + watched.duplicates.load(Ordering::SeqCst) >= 20
    })
    .await;
    stop.send(()).expect("running");
    let report = again.await.expect("the consumer task");
    assert_eq!((report.applied, report.duplicates), (0, 20));
    assert_eq!(charges(&billing).await.len(), 20, "nothing charged twice");
    all_acknowledged(broker, "billing-again").await;
}

/// A failing message is retried in place: its charge rolls back with the failure, the next
/// messages wait, and the order holds.
pub async fn a_failing_message_is_retried_in_place_keeping_the_order<K: ConsumerBroker>(
    broker: &K,
) {
    let orders = Database::migrated().await;
    let billing = billing_database().await;
    publish(broker, &orders, 1..=6).await;

    let charge = Charge { fail_once: vec![3] };
    let consumer = billing_consumer(store(&billing), charge);
    let report = consume_until(broker, consumer, ("billing", "b1"), &billing, |charged| {
        charged.len() == 6
    })
    .await;
    assert_eq!(charges(&billing).await, vec![1, 2, 3, 4, 5, 6]);
    let attempt: i64 = sqlx::query_scalar("SELECT attempt FROM charges WHERE order_id = 3")
        .fetch_one(billing.pool())
        .await
        .expect("order 3's charge");
    assert_eq!(attempt, 2, "the first attempt's charge rolled back");
    assert_eq!(report.applied, 6);
}

/// A message that is not an outbox message of a category billing handles is a dead letter in
/// billing's database, acknowledged; the messages after it are applied.
pub async fn a_poison_message_is_a_dead_letter_and_the_rest_flow<K: ConsumerBroker>(broker: &K) {
    let orders = Database::migrated().await;
    let billing = billing_database().await;
    publish(broker, &orders, 1..=2).await;
    broker
        .publish_raw(
            &[
                (headers::MESSAGE_ID, "999999"),
                (headers::CATEGORY, "audit_event"),
            ],
            b"not json",
        )
        .await;
    publish(broker, &orders, 3..=4).await;

    let consumer = billing_consumer(store(&billing), Charge::default());
    let report = consume_until(broker, consumer, ("billing", "b1"), &billing, |charged| {
        charged.len() == 4
    })
    .await;
    assert_eq!(charges(&billing).await, vec![1, 2, 3, 4]);
    assert_eq!((report.applied, report.dead_lettered), (4, 1));
    all_acknowledged(broker, "billing").await;
    let letters = store(&billing)
        .dead_letters(Some("billing"), 10)
        .await
        .expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].payload, b"not json");
    assert_eq!(letters[0].message_id, Some(MessageId(999_999)));
    assert!(
        letters[0].error.contains(headers::SHARD),
        "{}",
        letters[0].error
    );
}

/// Billing's database, watched: how many of its transactions committed, and how many found
/// their message recorded already; with a crash, its `crash_at`-th commit commits and then
/// never returns (the consumer's process dies after its transaction committed and before the
/// broker heard of it).
#[derive(Clone)]
struct Watched {
    store: SqliteStore,
    commits: Arc<AtomicUsize>,
    duplicates: Arc<AtomicUsize>,
    crash_at: Option<usize>,
    crashed: Arc<Notify>,
}

impl Watched {
    fn new(store: SqliteStore) -> Self {
        Self {
            store,
            commits: Arc::new(AtomicUsize::new(0)),
            duplicates: Arc::new(AtomicUsize::new(0)),
            crash_at: None,
            crashed: Arc::new(Notify::new()),
        }
    }
}

struct WatchedTransaction {
    inner: Box<dyn InboxTransaction>,
    database: Watched,
}

impl InboxDatabase for Watched {
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn InboxTransaction>, Error>> {
        Box::pin(async move {
            let inner = self.store.begin().await?;
            Ok(Box::new(WatchedTransaction {
                inner,
                database: self.clone(),
            }) as Box<dyn InboxTransaction>)
        })
    }

    fn purge_inbox<'a>(
        &'a self,
        consumer: Option<&'a str>,
        age: Duration,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        self.store.purge_inbox(consumer, age)
    }

    fn dead_letters<'a>(
        &'a self,
        consumer: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredInboxDeadLetter>, Error>> {
        self.store.dead_letters(consumer, limit)
    }
}

impl InboxTransaction for WatchedTransaction {
    fn record<'a>(
        &'a mut self,
        consumer: &'a str,
        message: MessageId,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let first = self.inner.record(consumer, message).await?;
            if !first {
                self.database.duplicates.fetch_add(1, Ordering::SeqCst);
            }
            Ok(first)
        })
    }

    fn purge<'a>(
        &'a mut self,
        consumer: &'a str,
        age: Duration,
    ) -> BoxFuture<'a, Result<u64, Error>> {
        self.inner.purge(consumer, age)
    }

    fn dead_letter<'a>(
        &'a mut self,
        letter: &'a InboxDeadLetter<'a>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.dead_letter(letter)
    }

    fn connection(&mut self) -> &mut (dyn std::any::Any + Send) {
        self.inner.connection()
    }

    fn commit(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            self.inner.commit().await?;
            let database = self.database;
            let committed = database.commits.fetch_add(1, Ordering::SeqCst) + 1;
            if database.crash_at == Some(committed) {
                database.crashed.notify_one();
                std::future::pending::<()>().await;
            }
            Ok(())
        })
    }
}

/// A consumer that dies after its transaction committed and before it acknowledged: the
/// message is delivered again, to its successor (the same member, restarted), which finds it
/// applied. Every order is charged once.
pub async fn a_crash_between_the_commit_and_the_ack_charges_nothing_twice<K: ConsumerBroker>(
    broker: &K,
) {
    let orders = Database::migrated().await;
    let billing = billing_database().await;
    publish(broker, &orders, 1..=10).await;

    let dying = Watched {
        crash_at: Some(5),
        ..Watched::new(store(&billing))
    };
    let crashed = Arc::clone(&dying.crashed);
    let running = tokio::spawn(broker.consume(
        billing_consumer(dying, Charge::default()),
        "billing",
        "b1",
        Box::pin(std::future::pending()),
    ));
    crashed.notified().await;
    running.abort();
    let _ = running.await;
    assert_eq!(
        charges(&billing).await,
        vec![1, 2, 3, 4, 5],
        "committed, not acknowledged"
    );

    let successor = billing_consumer(store(&billing), Charge::default());
    let report = consume_until(broker, successor, ("billing", "b1"), &billing, |charged| {
        charged.len() >= 10
    })
    .await;
    assert_eq!(charges(&billing).await, (1..=10).collect::<Vec<_>>());
    assert!(report.duplicates >= 1, "order 5 came again: {report:?}");
    assert_eq!(report.applied, 5);
    all_acknowledged(broker, "billing").await;
}

/// The consumer reports its handler's failures and, where the broker says, its lag (what the
/// broker holds for it after the message it applies: none once all are applied). Runs on
/// the current thread, under [`capture`](crate::telemetry::capture).
pub fn the_lag_and_the_failures_are_reported<K: ConsumerBroker + 'static>(
    broker: impl FnOnce() -> BoxFuture<'static, K>,
    reports_lag: bool,
) {
    let ((), telemetry) = crate::telemetry::capture(|_| async move {
        let broker = broker().await;
        let orders = Database::migrated().await;
        let billing = billing_database().await;
        publish(&broker, &orders, 1..=3).await;
        let consumer = billing_consumer(store(&billing), Charge { fail_once: vec![2] });
        consume_until(&broker, consumer, ("billing", "b1"), &billing, |charged| {
            charged.len() == 3
        })
        .await;
        broker.remove().await;
    });
    use outbox_core::telemetry::{INBOX_HANDLER_FAILURES, INBOX_LAG, INBOX_RECEIVED};
    let billing = [("consumer", "billing")];
    if reports_lag {
        assert_eq!(
            telemetry.gauge(INBOX_LAG, &billing),
            Some(0.0),
            "set at the last message"
        );
    }
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

/// One `#[test]` per behaviour of the consumer suite, for the broker `$create(name).await`
/// makes (`name`: the test's, for naming its stream or queue), removed after each test. With
/// `reports_lag: true` the lag test checks the lag gauge too.
#[macro_export]
macro_rules! consumer_suite {
    ($create:expr, reports_lag: $lag:expr) => {
        $crate::consumer_suite!(@each $create;
            each_message_is_applied_once_and_acknowledged,
            a_failing_message_is_retried_in_place_keeping_the_order,
            a_poison_message_is_a_dead_letter_and_the_rest_flow,
            a_crash_between_the_commit_and_the_ack_charges_nothing_twice,
        );

        #[test]
        fn the_lag_and_the_failures_are_reported() {
            $crate::consumers::the_lag_and_the_failures_are_reported(
                || ::std::boxed::Box::pin($create("lag")),
                $lag,
            );
        }
    };
    (@each $create:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let broker = $create(stringify!($scenario)).await;
                $crate::consumers::$scenario(&broker).await;
                $crate::consumers::ConsumerBroker::remove(broker).await;
            }
        )*
    };
}
