//! The Redis Streams sink against the Redis server on 127.0.0.1:6379, with the outbox on
//! SQLite. Each test uses keys under a prefix of its own, and deletes them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_core::sink::{Publisher, Sink, headers};
use outbox_core::{Admin, Delivery, Id, Registry, Relay, RelayConfig};
use outbox_redis::{PAYLOAD_FIELD, RedisSink};
use outbox_testkit::StoreBackend;
use outbox_testkit::fixtures::{AuditEvent, Note, note};
use outbox_testkit::proxy::TcpProxy;
use outbox_testkit::sink::DiesAfterPublishing;
use outbox_testkit::sqlite::SqliteBackend;
use redis::AsyncCommands;
use redis::streams::StreamRangeReply;

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

    /// The audit events' stream.
    fn stream(&self) -> String {
        format!("{}:audit_event", self.prefix)
    }

    /// The stream's entries, in order: (shard, message id, seq).
    async fn entries(&self) -> Vec<(String, String, u64)> {
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
                (field(headers::SHARD), field(headers::MESSAGE_ID), note.seq)
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
}

impl TestKeys {
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

async fn sink(keys: &TestKeys) -> RedisSink {
    RedisSink::connect(client(REDIS))
        .await
        .expect("Redis runs on 6379")
        .with_key_prefix(&keys.prefix)
}

/// The seqs stored for each shard, in stream order.
fn by_shard(entries: &[(String, String, u64)]) -> BTreeMap<String, Vec<u64>> {
    let mut shards: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (shard, _, seq) in entries {
        shards.entry(shard.clone()).or_default().push(*seq);
    }
    shards
}

fn config(worker: &str) -> RelayConfig {
    RelayConfig::builder()
        .worker_id(worker.to_owned())
        .poll_interval(Duration::from_millis(50))
        .max_concurrent_shards(16)
        .build()
        .expect("a valid relay configuration")
}

/// `shards` shards of `per_shard` audit events each, the seq `shard * 1000 + n`.
fn events(shards: u64, per_shard: u64) -> Vec<outbox_core::Message> {
    (1..=shards)
        .flat_map(|shard| {
            (1..=per_shard).map(move |n| note::<AuditEvent>(shard, n, shard * 1000 + n))
        })
        .collect()
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn registry(sink: impl Sink) -> Registry {
    Registry::builder()
        .sink::<AuditEvent, _>(sink)
        .build()
        .expect("a registry")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_each_shard_in_order_with_its_message_id() {
    let keys = TestKeys::new("order").await;
    let backend = SqliteBackend::create().await;
    let relay = Relay::with_config(
        backend.store(),
        registry(sink(&keys).await),
        config("redis-order"),
    );
    let ids = backend.write(&events(40, 5)).await.expect("write");

    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    let entries = keys.entries().await;
    assert_eq!(entries.len(), 200);
    let shards = by_shard(&entries);
    assert_eq!(shards.len(), 40);
    for (shard, seqs) in &shards {
        let number: u64 = shard.trim_start_matches("1:").parse().expect("a shard key");
        let expected: Vec<u64> = (1..=5).map(|n| number * 1000 + n).collect();
        assert_eq!(seqs, &expected, "shard {shard} in write order");
    }
    let mut message_ids: Vec<i64> = entries
        .iter()
        .map(|(_, id, _)| id.parse().expect("a message id"))
        .collect();
    message_ids.sort_unstable();
    let written: Vec<i64> = ids.iter().map(|id| id.0).collect();
    assert_eq!(message_ids, written, "each message once, under its own id");
    keys.remove().await;
}

/// Publishes one event through a relay that dies after Redis replied, then lets another
/// relay take the shard over: the entries the stream holds then.
async fn crash_and_redeliver(
    keys: &TestKeys,
    sink: RedisSink,
) -> (Vec<(String, String, u64)>, i64) {
    let backend = SqliteBackend::create().await;
    let dying = DiesAfterPublishing::new(sink.clone());
    let doomed = Relay::with_config(
        backend.store(),
        registry(dying.clone()),
        config("doomed")
            .to_builder()
            .lease(Duration::from_millis(300))
            .build()
            .expect("config"),
    );
    let ids = backend
        .write(&[note::<AuditEvent>(1, 1, 1)])
        .await
        .expect("write");
    let running = tokio::spawn(async move { doomed.drain().await });
    dying.published().await;
    running.abort();
    assert_eq!(keys.len().await, 1, "appended before the crash");

    let survivor = Relay::with_config(backend.store(), registry(sink), config("survivor"));
    let mut redelivered = 0;
    eventually("the survivor takes the shard over", async || {
        let report = survivor.drain().await.expect("drain");
        redelivered += report.deliveries;
        redelivered == 1
    })
    .await;
    (keys.entries().await, ids[0].0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_crash_carries_the_same_message_id() {
    let keys = TestKeys::new("crash").await;
    let (entries, id) = crash_and_redeliver(&keys, sink(&keys).await).await;
    assert_eq!(entries.len(), 2, "appended again: {entries:?}");
    assert!(
        entries
            .iter()
            .all(|(_, message_id, _)| *message_id == id.to_string()),
        "both under the message's id: {entries:?}"
    );
    keys.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deduplicated_sink_stores_a_redelivery_once() {
    let keys = TestKeys::new("dedup").await;
    let sink = sink(&keys).await.deduplicated(Duration::from_secs(60));
    let (entries, id) = crash_and_redeliver(&keys, sink).await;
    assert_eq!(
        entries.len(),
        1,
        "Redis recognised the redelivery: {entries:?}"
    );
    assert_eq!(entries[0].1, id.to_string());
    keys.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_a_stream_fails_only_its_shard() {
    let keys = TestKeys::new("refused").await;
    let mut connection = keys.connection.clone();
    let not_a_stream = format!("{}:plain", keys.prefix);
    let _: () = connection
        .set(&not_a_stream, "a string")
        .await
        .expect("set a plain key");
    let sink = sink(&keys).await;
    let stream = keys.stream();
    let publisher =
        Publisher::<AuditEvent, _>::new(sink.clone()).to(move |delivery: &Delivery<AuditEvent>| {
            if delivery.shard_identifier() == Id::from(1_i64) {
                not_a_stream.clone()
            } else {
                stream.clone()
            }
        });
    let registry = Registry::builder()
        .publish(publisher)
        .build()
        .expect("a registry");
    let backend = SqliteBackend::create().await;
    let relay = Relay::with_config(backend.store(), registry, config("redis-refused"));
    backend.write(&events(3, 2)).await.expect("write");

    let report = relay.drain().await.expect("drain");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    let failure = &report.failures[0];
    assert_eq!(failure.shard.shard_identifier, Id::from(1_i64));
    let error = outbox_core::error_chain(&failure.error);
    assert!(error.contains("WRONGTYPE"), "{error}");
    assert!(!sink.breaker().is_open(), "a refusal is not an outage");
    let shards = by_shard(&keys.entries().await);
    assert_eq!(shards.get("1:2"), Some(&vec![2001, 2002]));
    assert_eq!(shards.get("1:3"), Some(&vec![3001, 3002]));
    assert!(!shards.contains_key("1:1"));
    keys.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_opens_the_breaker_and_loses_nothing() {
    let keys = TestKeys::new("outage").await;
    let backend = SqliteBackend::create().await;
    let proxy = TcpProxy::start(REDIS).await.expect("a proxy");
    let sink = RedisSink::connect(client(&proxy.addr().to_string()))
        .await
        .expect("Redis through the proxy")
        .with_key_prefix(&keys.prefix);
    let relay = Relay::with_config(
        backend.store(),
        registry(sink.clone()),
        config("redis-outage"),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let relay = relay.clone();
        tokio::spawn(async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await
        })
    };

    backend.write(&events(5, 1)).await.expect("write");
    eventually("the first messages are stored", async || {
        keys.len().await == 5
    })
    .await;

    proxy.cut();
    let during: Vec<_> = (1..=5)
        .flat_map(|shard| [2, 3].map(|n| note::<AuditEvent>(shard, n, shard * 1000 + n)))
        .collect();
    backend
        .write(&during)
        .await
        .expect("write during the outage");
    eventually("the breaker opens", async || sink.breaker().is_open()).await;
    assert_eq!(keys.len().await, 5, "nothing appended while cut");

    proxy.restore();
    eventually("everything is stored", async || keys.len().await == 15).await;
    let _ = stop.send(());
    let report = running
        .await
        .expect("the relay does not panic")
        .expect("the relay stops cleanly");
    assert_eq!(report.failures, 0, "{report:?}");
    assert!(report.unavailable >= 1, "{report:?}");
    assert!(!sink.breaker().is_open());
    let shards = by_shard(&keys.entries().await);
    for shard in 1..=5_u64 {
        assert_eq!(
            shards.get(&format!("1:{shard}")),
            Some(&vec![shard * 1000 + 1, shard * 1000 + 2, shard * 1000 + 3]),
            "shard {shard} in order, each once"
        );
    }
    let pending = backend
        .store()
        .pending_messages(100)
        .await
        .expect("pending");
    assert!(pending.is_empty());
    keys.remove().await;
}
