//! The consumer's side against the NATS server on 127.0.0.1:4222, through the consumer suite
//! of `outbox-testkit`: an orders database's relay publishes to a JetStream stream of the
//! test's own, and billing's `NatsConsumer` applies each message into billing's own SQLite
//! database through its inbox, effectively once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use outbox_core::handler::BoxFuture;
use outbox_core::inbox::{ConsumeReport, Consumer};
use outbox_nats::{NatsConsumer, NatsSink};
use outbox_testkit::consumers::ConsumerBroker;

const NATS: &str = "127.0.0.1:4222";

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
}

async fn client() -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|_| Duration::from_millis(50))
        .connect(NATS)
        .await
        .expect("NATS runs on 4222")
}

impl ConsumerBroker for TestStream {
    type Sink = NatsSink;

    async fn sink(&self) -> NatsSink {
        NatsSink::new(client().await).with_subject_prefix(&self.name)
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
            nats.run(client().await, stop)
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
        self.jetstream
            .delete_stream(&self.name)
            .await
            .expect("delete the test stream");
    }
}

outbox_testkit::consumer_suite!(TestStream::create, reports_lag: true);
