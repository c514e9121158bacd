//! The NATS JetStream sink and its consumer against the NATS server on 127.0.0.1:4222
//! (JetStream enabled), through the broker and consumer suites of `outbox-testkit`. Each test
//! makes its own stream, named uniquely, and deletes it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use outbox_core::handler::BoxFuture;
use outbox_core::inbox::{ConsumeReport, Consumer};
use outbox_core::sink::{Publisher, headers};
use outbox_core::{Delivery, Id};
use outbox_nats::{NatsConsumer, NatsSink};
use outbox_testkit::brokers::{self, Stored};
use outbox_testkit::consumers::ConsumerBroker;
use outbox_testkit::fixtures::{AuditEvent, Note};
use outbox_testkit::proxy::TcpProxy;

const NATS: &str = "127.0.0.1:4222";

/// A stream of its own for one test, capturing `<name>.>`; deleted at its end.
struct TestStream {
    name: String,
    jetstream: jetstream::Context,
}

impl TestStream {
    /// A new stream named `outbox_<test>_<pid>_<n>`.
    async fn create(test: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "outbox_{test}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let client = async_nats::connect(NATS).await.expect("NATS runs on 4222");
        let jetstream = jetstream::new(client);
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

    /// A sink publishing the audit events into this stream.
    async fn sink(&self, addr: &str) -> NatsSink {
        NatsSink::new(client(addr).await)
            .with_subject_prefix(&self.name)
            .with_ack_timeout(Duration::from_secs(1))
    }

    /// Every message the stream holds, in stream order; each one's `Nats-Msg-Id` checked to
    /// be its outbox message id.
    async fn messages(&self) -> Vec<Stored> {
        let mut stream = self
            .jetstream
            .get_stream(&self.name)
            .await
            .expect("the test stream");
        let info = stream.info().await.expect("stream info").state.clone();
        let mut messages = Vec::new();
        if info.messages == 0 {
            return messages;
        }
        for sequence in info.first_sequence..=info.last_sequence {
            let message = stream
                .get_raw_message(sequence)
                .await
                .expect("a stored message");
            let header = |name: &str| {
                message
                    .headers
                    .get(name)
                    .map(|value| value.as_str().to_owned())
                    .unwrap_or_default()
            };
            let note: Note = serde_json::from_slice(&message.payload).expect("a note payload");
            assert_eq!(header("Nats-Msg-Id"), header(headers::MESSAGE_ID));
            messages.push(Stored {
                shard: header(headers::SHARD),
                message_id: header(headers::MESSAGE_ID),
                seq: note.seq,
            });
        }
        messages
    }

    async fn count(&self) -> usize {
        let mut stream = self
            .jetstream
            .get_stream(&self.name)
            .await
            .expect("the test stream");
        let messages = stream.info().await.expect("stream info").state.messages;
        usize::try_from(messages).expect("a count")
    }

    async fn remove(self) {
        self.jetstream
            .delete_stream(&self.name)
            .await
            .expect("delete the test stream");
    }
}

/// A client of the server at `addr`, reconnecting quickly.
async fn client(addr: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|_| Duration::from_millis(50))
        .connect(addr)
        .await
        .expect("NATS runs on 4222")
}

/// The consumer's side, through the consumer suite: `NatsConsumer` applying this stream's
/// messages into billing's database through its inbox.
impl ConsumerBroker for TestStream {
    type Sink = NatsSink;

    async fn sink(&self) -> NatsSink {
        TestStream::sink(self, NATS).await
    }

    async fn publish_raw(&self, headers: &[(&str, &str)], payload: &[u8]) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, *value);
        }
        self.jetstream
            .publish_with_headers(
                format!("{}.audit_event", self.name),
                map,
                payload.to_vec().into(),
            )
            .await
            .expect("publish")
            .await
            .expect("stored");
    }

    /// A durable pull consumer named `group` (one member: JetStream's durable consumers
    /// have no member names), redelivering after a second.
    fn consume(
        &self,
        consumer: Consumer,
        group: &str,
        _member: &str,
        stop: BoxFuture<'static, ()>,
    ) -> BoxFuture<'static, ConsumeReport> {
        let nats = NatsConsumer::new(consumer, &self.name, group).ack_wait(Duration::from_secs(1));
        Box::pin(async move {
            nats.run(client(NATS).await, stop)
                .await
                .expect("the consumer ran")
        })
    }

    async fn all_acknowledged(&self, group: &str) -> bool {
        let Ok(mut consumer) = self
            .jetstream
            .get_consumer_from_stream::<jetstream::consumer::pull::Config, _, _>(group, &self.name)
            .await
        else {
            return false;
        };
        let info = consumer.info().await.expect("consumer info");
        (info.num_pending, info.num_ack_pending) == (0, 0)
    }

    async fn remove(self) {
        TestStream::remove(self).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_each_shard_in_order_with_its_message_id() {
    let stream = TestStream::create("order").await;
    brokers::publishes_in_order(stream.sink(NATS).await, async |_| stream.messages().await).await;
    stream.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_crash_is_stored_once() {
    let stream = TestStream::create("crash").await;
    let id = brokers::crash_and_redeliver(stream.sink(NATS).await, async || {
        assert_eq!(stream.count().await, 1, "published before the crash");
    })
    .await;
    let messages = stream.messages().await;
    assert_eq!(
        messages.len(),
        1,
        "JetStream recognised the redelivery: {messages:?}"
    );
    assert_eq!(messages[0].message_id, id.0.to_string());
    stream.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_without_a_stream_fails_only_its_shard() {
    let stream = TestStream::create("refused").await;
    let sink = stream.sink(NATS).await;
    let prefix = stream.name.clone();
    let publisher =
        Publisher::<AuditEvent, _>::new(sink.clone()).to(move |delivery: &Delivery<AuditEvent>| {
            if delivery.shard_identifier() == Id::from(1_i64) {
                format!("nowhere_{prefix}.audit")
            } else {
                format!("{prefix}.audit")
            }
        });
    brokers::refusal_fails_only_its_shard(publisher, &sink, "no stream", async |_| {
        stream.messages().await
    })
    .await;
    stream.remove().await;
}

/// JetStream refuses a message whose subject no stream takes and stores those published after
/// it: they are confirmed and never published twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_after_a_refused_one_are_published_once() {
    let stream = TestStream::create("after").await;
    let sink = stream.sink(NATS).await;
    let prefix = stream.name.clone();
    brokers::refusal_in_a_run_publishes_nothing_twice(
        sink,
        format!("{prefix}.audit"),
        format!("nowhere_{prefix}.audit"),
        async |_| stream.messages().await,
    )
    .await;
    stream.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_opens_the_breaker_and_loses_nothing() {
    let stream = TestStream::create("outage").await;
    let proxy = TcpProxy::start(NATS).await.expect("a proxy");
    let sink = stream.sink(&proxy.addr().to_string()).await;
    brokers::rides_out_an_outage(
        sink,
        async || stream.count().await,
        || proxy.cut(),
        || proxy.restore(),
        async |_| stream.messages().await,
    )
    .await;
    stream.remove().await;
}

outbox_testkit::consumer_suite!(TestStream::create, reports_lag: true);
