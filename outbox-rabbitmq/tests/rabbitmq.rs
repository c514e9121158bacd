//! The RabbitMQ sink against the RabbitMQ server on 127.0.0.1:5672 (guest/guest), with the
//! outbox on SQLite. Each test declares a queue of its own, named uniquely, and deletes it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties};
use outbox_core::sink::{Publisher, Sink, headers};
use outbox_core::{Admin, Delivery, Id, Registry, Relay, RelayConfig};
use outbox_rabbitmq::RabbitSink;
use outbox_testkit::StoreBackend;
use outbox_testkit::fixtures::{AuditEvent, Note, note};
use outbox_testkit::proxy::TcpProxy;
use outbox_testkit::sink::DiesAfterPublishing;
use outbox_testkit::sqlite::SqliteBackend;

const RABBITMQ: &str = "127.0.0.1:5672";

fn uri(addr: &str) -> String {
    format!("amqp://guest:guest@{addr}/%2f")
}

/// A queue of one test, receiving the audit events (routing key `<prefix>.audit_event` on
/// the default exchange).
struct TestQueue {
    prefix: String,
    _connection: Connection,
    channel: Channel,
}

/// A message as the queue holds it.
#[derive(Debug, Clone)]
struct Received {
    shard: String,
    message_id: String,
    header_message_id: String,
    content_type: String,
    seq: u64,
}

impl TestQueue {
    async fn declare(test: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let prefix = format!(
            "outbox_test_{test}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let connection = Connection::connect(&uri(RABBITMQ), ConnectionProperties::default())
            .await
            .expect("RabbitMQ runs on 5672");
        let channel = connection.create_channel().await.expect("a channel");
        let queue = Self {
            prefix,
            _connection: connection,
            channel,
        };
        queue
            .channel
            .queue_declare(
                ShortString::from(queue.name()),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare the test queue");
        queue
    }

    fn name(&self) -> String {
        format!("{}.audit_event", self.prefix)
    }

    /// Takes every message the queue holds, in order.
    async fn take(&self) -> Vec<Received> {
        let mut received = Vec::new();
        let options = BasicGetOptions { no_ack: true };
        while let Some(message) = self
            .channel
            .basic_get(ShortString::from(self.name()), options)
            .await
            .expect("get from the test queue")
        {
            let properties = &message.delivery.properties;
            let header = |name: &str| -> String {
                match properties
                    .headers()
                    .as_ref()
                    .and_then(|table| table.inner().get(name))
                {
                    Some(AMQPValue::LongString(value)) => value.to_string(),
                    _ => String::new(),
                }
            };
            let note: Note =
                serde_json::from_slice(&message.delivery.data).expect("a note payload");
            received.push(Received {
                shard: header(headers::SHARD),
                message_id: properties
                    .message_id()
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                header_message_id: header(headers::MESSAGE_ID),
                content_type: properties
                    .content_type()
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                seq: note.seq,
            });
        }
        received
    }

    async fn remove(self) {
        self.channel
            .queue_delete(
                ShortString::from(self.name()),
                QueueDeleteOptions::default(),
            )
            .await
            .expect("delete the test queue");
    }
}

async fn sink(queue: &TestQueue, addr: &str) -> RabbitSink {
    RabbitSink::connect(uri(addr))
        .await
        .expect("RabbitMQ runs on 5672")
        .with_routing_prefix(&queue.prefix)
}

/// The seqs received for each shard, in queue order.
fn by_shard(received: &[Received]) -> BTreeMap<String, Vec<u64>> {
    let mut shards: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for message in received {
        shards
            .entry(message.shard.clone())
            .or_default()
            .push(message.seq);
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
async fn publishes_each_shard_in_order_with_its_message_id() {
    let queue = TestQueue::declare("order").await;
    let backend = SqliteBackend::create().await;
    let relay = Relay::with_config(
        backend.store(),
        registry(sink(&queue, RABBITMQ).await),
        config("rabbit-order"),
    );
    let ids = backend.write(&events(40, 5)).await.expect("write");

    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    let received = queue.take().await;
    assert_eq!(received.len(), 200);
    let shards = by_shard(&received);
    assert_eq!(shards.len(), 40);
    for (shard, seqs) in &shards {
        let number: u64 = shard.trim_start_matches("1:").parse().expect("a shard key");
        let expected: Vec<u64> = (1..=5).map(|n| number * 1000 + n).collect();
        assert_eq!(seqs, &expected, "shard {shard} in write order");
    }
    let mut message_ids: Vec<i64> = received
        .iter()
        .map(|message| {
            assert_eq!(message.message_id, message.header_message_id);
            assert_eq!(message.content_type, "application/json");
            message.message_id.parse().expect("a message id")
        })
        .collect();
    message_ids.sort_unstable();
    let written: Vec<i64> = ids.iter().map(|id| id.0).collect();
    assert_eq!(message_ids, written, "each message once, under its own id");
    queue.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_crash_carries_the_same_message_id() {
    let queue = TestQueue::declare("crash").await;
    let backend = SqliteBackend::create().await;
    let sink = sink(&queue, RABBITMQ).await;
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

    let survivor = Relay::with_config(backend.store(), registry(sink), config("survivor"));
    let mut redelivered = 0;
    eventually("the survivor takes the shard over", async || {
        let report = survivor.drain().await.expect("drain");
        redelivered += report.deliveries;
        redelivered == 1
    })
    .await;
    let received = queue.take().await;
    assert_eq!(received.len(), 2, "published again: {received:?}");
    assert!(
        received
            .iter()
            .all(|message| message.message_id == ids[0].0.to_string()),
        "both under the message's id: {received:?}"
    );
    queue.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_message_fails_only_its_shard() {
    let queue = TestQueue::declare("refused").await;
    let sink = sink(&queue, RABBITMQ).await;
    let (routed, nowhere) = (queue.name(), format!("{}.nowhere", queue.prefix));
    let publisher =
        Publisher::<AuditEvent, _>::new(sink.clone()).to(move |delivery: &Delivery<AuditEvent>| {
            if delivery.shard_identifier() == Id::from(1_i64) {
                nowhere.clone()
            } else {
                routed.clone()
            }
        });
    let registry = Registry::builder()
        .publish(publisher)
        .build()
        .expect("a registry");
    let backend = SqliteBackend::create().await;
    let relay = Relay::with_config(backend.store(), registry, config("rabbit-refused"));
    backend.write(&events(3, 2)).await.expect("write");

    let report = relay.drain().await.expect("drain");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    let failure = &report.failures[0];
    assert_eq!(failure.shard.shard_identifier, Id::from(1_i64));
    let error = outbox_core::error_chain(&failure.error);
    assert!(error.contains("unroutable"), "{error}");
    assert!(!sink.breaker().is_open(), "a refusal is not an outage");
    let shards = by_shard(&queue.take().await);
    assert_eq!(shards.get("1:2"), Some(&vec![2001, 2002]));
    assert_eq!(shards.get("1:3"), Some(&vec![3001, 3002]));
    assert!(!shards.contains_key("1:1"));
    queue.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_opens_the_breaker_and_loses_nothing() {
    let queue = TestQueue::declare("outage").await;
    let backend = SqliteBackend::create().await;
    let proxy = TcpProxy::start(RABBITMQ).await.expect("a proxy");
    let sink = sink(&queue, &proxy.addr().to_string()).await;
    let relay = Relay::with_config(
        backend.store(),
        registry(sink.clone()),
        config("rabbit-outage"),
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
    let mut received = Vec::new();

    backend.write(&events(5, 1)).await.expect("write");
    eventually("the first messages are published", async || {
        received.extend(queue.take().await);
        received.len() == 5
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
    received.extend(queue.take().await);
    assert_eq!(received.len(), 5, "nothing published while cut");

    proxy.restore();
    eventually("everything is published", async || {
        received.extend(queue.take().await);
        received.len() >= 15
    })
    .await;
    let _ = stop.send(());
    let report = running
        .await
        .expect("the relay does not panic")
        .expect("the relay stops cleanly");
    assert_eq!(report.failures, 0, "{report:?}");
    assert!(report.unavailable >= 1, "{report:?}");
    assert!(!sink.breaker().is_open());
    let shards = by_shard(&received);
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
    queue.remove().await;
}
