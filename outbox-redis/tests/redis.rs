//! The Redis Streams sink and its consumer against the Redis server on 127.0.0.1:6379, through
//! the broker and consumer suites of `outbox-testkit`. Each test uses keys under a prefix of
//! its own, and deletes them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_core::handler::BoxFuture;
use outbox_core::inbox::{ConsumeReport, Consumer};
use outbox_core::sink::{Publisher, headers};
use outbox_core::{Delivery, Id};
use outbox_redis::{PAYLOAD_FIELD, RedisConsumer, RedisSink};
use outbox_testkit::brokers::{self, Stored};
use outbox_testkit::consumers::ConsumerBroker;
use outbox_testkit::fixtures::{AuditEvent, Note};
use outbox_testkit::proxy::TcpProxy;
use redis::AsyncCommands;
use redis::streams::{StreamInfoGroupsReply, StreamRangeReply};

const REDIS: &str = "127.0.0.1:6379";

/// Keys of one test (`outbox_test_<test>_<pid>_<n>:*`), deleted at its end.
struct TestKeys {
    prefix: String,
    connection: redis::aio::MultiplexedConnection,
}

impl TestKeys {
    async fn new(test: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let prefix = format!(
            "outbox_test_{test}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let connection = client(REDIS)
            .get_multiplexed_async_connection()
            .await
            .expect("Redis runs on 6379");
        Self { prefix, connection }
    }

    /// A sink appending the audit events to this test's stream, through `addr`.
    async fn sink(&self, addr: &str) -> RedisSink {
        RedisSink::connect(client(addr))
            .await
            .expect("Redis runs on 6379")
            .with_key_prefix(&self.prefix)
    }

    /// The audit events' stream.
    fn stream(&self) -> String {
        format!("{}:audit_event", self.prefix)
    }

    /// A key holding a plain string, where Redis refuses an `XADD` (WRONGTYPE).
    async fn plain_key(&self) -> String {
        let key = format!("{}:plain", self.prefix);
        let mut connection = self.connection.clone();
        let _: () = connection
            .set(&key, "a string")
            .await
            .expect("set a plain key");
        key
    }

    /// The stream's entries, in order.
    async fn entries(&self) -> Vec<Stored> {
        let mut connection = self.connection.clone();
        let reply: StreamRangeReply = connection
            .xrange_all(self.stream())
            .await
            .expect("read the stream");
        reply
            .ids
            .iter()
            .map(|entry| {
                let field = |name: &str| -> String { entry.get(name).unwrap_or_default() };
                let payload: Vec<u8> = entry.get(PAYLOAD_FIELD).expect("a payload field");
                let note: Note = serde_json::from_slice(&payload).expect("a note payload");
                Stored {
                    shard: field(headers::SHARD),
                    message_id: field(headers::MESSAGE_ID),
                    seq: note.seq,
                }
            })
            .collect()
    }

    async fn len(&self) -> usize {
        let mut connection = self.connection.clone();
        connection
            .xlen(self.stream())
            .await
            .expect("the stream's length")
    }

    /// Deletes the test's keys.
    async fn remove(self) {
        let mut connection = self.connection.clone();
        let keys: Vec<String> = connection
            .keys(format!("{}*", self.prefix))
            .await
            .expect("list the test's keys");
        if !keys.is_empty() {
            let _: () = connection.del(keys).await.expect("delete the test's keys");
        }
    }
}

fn client(addr: &str) -> redis::Client {
    redis::Client::open(format!("redis://{addr}")).expect("a Redis address")
}

/// The consumer's side, through the consumer suite: `RedisConsumer` applying this test's
/// stream into billing's database through its inbox.
impl ConsumerBroker for TestKeys {
    type Sink = RedisSink;

    async fn sink(&self) -> RedisSink {
        TestKeys::sink(self, REDIS).await
    }

    async fn publish_raw(&self, headers: &[(&str, &str)], payload: &[u8]) {
        let mut fields: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(name, value)| (*name, value.as_bytes()))
            .collect();
        fields.push((PAYLOAD_FIELD, payload));
        let mut connection = self.connection.clone();
        let _: String = connection
            .xadd(self.stream(), "*", &fields)
            .await
            .expect("XADD");
    }

    /// Member `member` of group `group`, claiming what another member left pending for a
    /// second.
    fn consume(
        &self,
        consumer: Consumer,
        group: &str,
        member: &str,
        stop: BoxFuture<'static, ()>,
    ) -> BoxFuture<'static, ConsumeReport> {
        let redis = RedisConsumer::new(consumer, self.stream(), group, member)
            .claim_after(Duration::from_secs(1));
        Box::pin(async move {
            redis
                .run(client(REDIS), stop)
                .await
                .expect("the consumer ran")
        })
    }

    async fn all_acknowledged(&self, group: &str) -> bool {
        let mut connection = self.connection.clone();
        let groups: StreamInfoGroupsReply = connection
            .xinfo_groups(self.stream())
            .await
            .unwrap_or_default();
        groups
            .groups
            .iter()
            .find(|info| info.name == group)
            .is_some_and(|info| info.pending == 0 && info.lag == Some(0))
    }

    async fn remove(self) {
        TestKeys::remove(self).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_each_shard_in_order_with_its_message_id() {
    let keys = TestKeys::new("order").await;
    brokers::publishes_in_order(keys.sink(REDIS).await, async |_| keys.entries().await).await;
    keys.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_crash_carries_the_same_message_id() {
    let keys = TestKeys::new("crash").await;
    let id = brokers::crash_and_redeliver(keys.sink(REDIS).await, async || {
        assert_eq!(keys.len().await, 1, "appended before the crash");
    })
    .await;
    let entries = keys.entries().await;
    assert_eq!(entries.len(), 2, "appended again: {entries:?}");
    assert!(
        entries
            .iter()
            .all(|entry| entry.message_id == id.0.to_string()),
        "both under the message's id: {entries:?}"
    );
    keys.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deduplicated_sink_stores_a_redelivery_once() {
    let keys = TestKeys::new("dedup").await;
    let sink = keys.sink(REDIS).await.deduplicated(Duration::from_secs(60));
    let id = brokers::crash_and_redeliver(sink, async || {
        assert_eq!(keys.len().await, 1, "appended before the crash");
    })
    .await;
    let entries = keys.entries().await;
    assert_eq!(
        entries.len(),
        1,
        "Redis recognised the redelivery: {entries:?}"
    );
    assert_eq!(entries[0].message_id, id.0.to_string());
    keys.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_a_stream_fails_only_its_shard() {
    let keys = TestKeys::new("refused").await;
    let not_a_stream = keys.plain_key().await;
    let sink = keys.sink(REDIS).await;
    let stream = keys.stream();
    let publisher =
        Publisher::<AuditEvent, _>::new(sink.clone()).to(move |delivery: &Delivery<AuditEvent>| {
            if delivery.shard_identifier() == Id::from(1_i64) {
                not_a_stream.clone()
            } else {
                stream.clone()
            }
        });
    brokers::refusal_fails_only_its_shard(publisher, &sink, "WRONGTYPE", async |_| {
        keys.entries().await
    })
    .await;
    keys.remove().await;
}

/// Redis runs a pipeline's `XADD`s one by one: the entry refused in the middle (a key of another
/// type) does not stop those after it, which are confirmed and never appended twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_after_a_refused_one_are_appended_once() {
    let keys = TestKeys::new("after").await;
    let not_a_stream = keys.plain_key().await;
    let sink = keys.sink(REDIS).await;
    brokers::refusal_in_a_run_publishes_nothing_twice(
        sink,
        keys.stream(),
        not_a_stream,
        async |_| keys.entries().await,
    )
    .await;
    keys.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_opens_the_breaker_and_loses_nothing() {
    let keys = TestKeys::new("outage").await;
    let proxy = TcpProxy::start(REDIS).await.expect("a proxy");
    let sink = keys.sink(&proxy.addr().to_string()).await;
    brokers::rides_out_an_outage(
        sink,
        async || keys.len().await,
        || proxy.cut(),
        || proxy.restore(),
        async |_| keys.entries().await,
    )
    .await;
    keys.remove().await;
}

outbox_testkit::consumer_suite!(TestKeys::new, reports_lag: true);

/// A consumer started while Redis is away waits for it, as it waits out an outage later: the
/// first connection's failure does not end its run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_started_during_an_outage_waits_for_redis() {
    let keys = TestKeys::new("consumer_waits").await;
    let proxy = TcpProxy::start(REDIS).await.expect("a proxy");
    proxy.cut();
    let billing = outbox_testkit::consumers::billing_database().await;
    let consumer = outbox_testkit::consumers::billing_consumer(
        outbox_sqlite::SqliteStore::new(billing.pool().clone()),
        outbox_testkit::consumers::Charge::default(),
    );
    let redis = RedisConsumer::new(consumer, keys.stream(), "billing", "waiting");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let address = proxy.addr().to_string();
    let mut run = tokio::spawn(async move {
        redis
            .run(client(&address), async {
                let _ = stopped.await;
            })
            .await
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(4), &mut run)
            .await
            .is_err(),
        "the consumer keeps trying while Redis is away"
    );
    proxy.restore();
    stop.send(()).expect("the consumer runs");
    let report = run
        .await
        .expect("the consumer's task")
        .expect("the consumer ran");
    assert_eq!(report, ConsumeReport::default());
    keys.remove().await;
}
