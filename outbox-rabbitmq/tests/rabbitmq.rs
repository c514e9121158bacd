//! The RabbitMQ sink against the RabbitMQ server on 127.0.0.1:5672 (guest/guest), through
//! the broker suite of `outbox-testkit`. Each test declares a queue of its own, named
//! uniquely, and deletes it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties};
use outbox_core::sink::{Publisher, headers};
use outbox_core::{Delivery, Id};
use outbox_rabbitmq::RabbitSink;
use outbox_testkit::brokers::{self, Stored};
use outbox_testkit::fixtures::{AuditEvent, Note};
use outbox_testkit::proxy::TcpProxy;

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

    /// Takes every message the queue holds, in order; each one's AMQP `message_id` checked to
    /// be its outbox message id, its content type JSON.
    async fn take(&self) -> Vec<Stored> {
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
            let message_id = properties
                .message_id()
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            assert_eq!(message_id, header(headers::MESSAGE_ID));
            let content_type = properties.content_type().as_ref().map(ToString::to_string);
            assert_eq!(content_type.as_deref(), Some("application/json"));
            received.push(Stored {
                shard: header(headers::SHARD),
                message_id,
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

/// What a queue handed out so far (taking from a queue empties it).
#[derive(Default)]
struct Taken(Mutex<Vec<Stored>>);

impl Taken {
    /// Takes what the queue holds now: how many messages were taken in all.
    async fn take(&self, queue: &TestQueue) -> usize {
        let more = queue.take().await;
        let mut taken = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        taken.extend(more);
        taken.len()
    }

    fn all(&self) -> Vec<Stored> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_each_shard_in_order_with_its_message_id() {
    let queue = TestQueue::declare("order").await;
    brokers::publishes_in_order(sink(&queue, RABBITMQ).await, async |_| queue.take().await).await;
    queue.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_crash_carries_the_same_message_id() {
    let queue = TestQueue::declare("crash").await;
    let taken = Taken::default();
    let id = brokers::crash_and_redeliver(sink(&queue, RABBITMQ).await, async || {
        assert_eq!(taken.take(&queue).await, 1, "published before the crash");
    })
    .await;
    taken.take(&queue).await;
    let received = taken.all();
    assert_eq!(received.len(), 2, "published again: {received:?}");
    assert!(
        received
            .iter()
            .all(|message| message.message_id == id.0.to_string()),
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
    brokers::refusal_fails_only_its_shard(publisher, &sink, "unroutable", async |_| {
        queue.take().await
    })
    .await;
    queue.remove().await;
}

/// RabbitMQ returns an unroutable message and routes those published after it on the channel:
/// they are confirmed and never published twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_after_an_unroutable_one_are_published_once() {
    let queue = TestQueue::declare("after").await;
    let sink = sink(&queue, RABBITMQ).await;
    let taken = Taken::default();
    brokers::refusal_in_a_run_publishes_nothing_twice(
        sink,
        queue.name(),
        format!("{}.nowhere", queue.prefix),
        async |_| {
            taken.take(&queue).await;
            taken.all()
        },
    )
    .await;
    queue.remove().await;
}

/// RabbitMQ confirms several messages of a channel at once, and lapin hands a returned message
/// to any confirm it resolves with it: with many shards publishing at once, each return must
/// still fail its own message and no other (the odd shards all route nowhere, the even ones
/// to the queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returns_fail_their_own_messages_with_many_shards_in_flight() {
    use outbox_testkit::backend::StoreBackend;
    use outbox_testkit::sqlite::SqliteBackend;
    for round in 0..4 {
        let queue = TestQueue::declare("returns").await;
        let sink = sink(&queue, RABBITMQ).await;
        let (routed, nowhere) = (queue.name(), format!("{}.nowhere", queue.prefix));
        let publisher = Publisher::<AuditEvent, _>::new(sink.clone()).to(
            move |delivery: &Delivery<AuditEvent>| {
                if [1_i64, 3, 5, 7, 9, 11, 13, 15]
                    .iter()
                    .any(|odd| delivery.shard_identifier() == *odd)
                {
                    nowhere.clone()
                } else {
                    routed.clone()
                }
            },
        );
        let registry = outbox_core::Registry::builder()
            .publish(publisher)
            .build()
            .expect("a registry");
        let backend = SqliteBackend::create().await;
        let relay = outbox_core::Relay::with_config(
            backend.store(),
            registry,
            brokers::relay_config("returns"),
        );
        backend.write(&brokers::events(16, 5)).await.expect("write");
        let report = relay.drain().await.expect("drain");
        let mut failed: Vec<Id> = report
            .failures
            .iter()
            .map(|failure| failure.shard.shard_identifier)
            .collect();
        failed.sort();
        let odd: Vec<Id> = (1..=15_i64).step_by(2).map(Id::from).collect();
        assert_eq!(failed, odd, "round {round}: {report:?}");
        assert_eq!(report.rows_acknowledged, 40, "round {round}: {report:?}");
        let stored = brokers::by_shard(&queue.take().await);
        for shard in (2..=16).step_by(2) {
            let ids: Vec<u64> = (1..=5).map(|n| shard * 1000 + n).collect();
            assert_eq!(
                stored.get(&format!("1:{shard}")),
                Some(&ids),
                "round {round}"
            );
        }
        assert_eq!(stored.len(), 8, "round {round}: {stored:?}");
        queue.remove().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_opens_the_breaker_and_loses_nothing() {
    let queue = TestQueue::declare("outage").await;
    let proxy = TcpProxy::start(RABBITMQ).await.expect("a proxy");
    let sink = sink(&queue, &proxy.addr().to_string()).await;
    let taken = Taken::default();
    brokers::rides_out_an_outage(
        sink,
        async || taken.take(&queue).await,
        || proxy.cut(),
        || proxy.restore(),
        async |_| taken.all(),
    )
    .await;
    queue.remove().await;
}
