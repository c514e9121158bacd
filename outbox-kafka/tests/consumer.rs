//! The consumer's side against librdkafka's mock cluster (the Kafka protocol, in process),
//! through the consumer suite of `outbox-testkit`: an orders database's relay produces to the
//! topic `outbox.audit_event`, and billing's `KafkaConsumer` applies each record into billing's
//! own SQLite database through its inbox, committing its offset after the commit.

use std::time::Duration;

use outbox_core::handler::BoxFuture;
use outbox_core::inbox::{ConsumeReport, Consumer};
use outbox_kafka::{KafkaConsumer, KafkaSink};
use outbox_testkit::consumers::ConsumerBroker;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const TOPIC: &str = "outbox.audit_event";
const PARTITIONS: i32 = 2;

/// A mock cluster of one broker with the audit events' topic, run by a thread of its own (the
/// cluster cannot move between threads) until the harness is removed.
struct TestCluster {
    bootstrap: String,
    _running: std::sync::mpsc::Sender<()>,
}

impl TestCluster {
    async fn start(_test: &str) -> Self {
        let (bootstrap_tx, bootstrap_rx) = tokio::sync::oneshot::channel();
        let (running, stopped) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let cluster: MockCluster<'static, DefaultProducerContext> =
                MockCluster::new(1).expect("a mock cluster");
            cluster
                .create_topic(TOPIC, PARTITIONS, 1)
                .expect("create the topic");
            let _ = bootstrap_tx.send(cluster.bootstrap_servers());
            // Until the harness is dropped.
            let _ = stopped.recv();
        });
        Self {
            bootstrap: bootstrap_rx.await.expect("the mock cluster started"),
            _running: running,
        }
    }

    fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        config
    }
}

impl ConsumerBroker for TestCluster {
    type Sink = KafkaSink;

    async fn sink(&self) -> KafkaSink {
        let mut config = self.config();
        config.set("message.timeout.ms", "5000");
        KafkaSink::with_config(config).expect("a producer")
    }

    async fn publish_raw(&self, headers: &[(&str, &str)], payload: &[u8]) {
        let producer: FutureProducer = self.config().create().expect("a producer");
        let mut owned = OwnedHeaders::new();
        for (key, value) in headers {
            owned = owned.insert(Header {
                key,
                value: Some(*value),
            });
        }
        // The shard's key of organization 7: its partition, behind the events before it.
        let record = FutureRecord::to(TOPIC)
            .key("1:7")
            .payload(payload)
            .headers(owned);
        producer
            .send(record, Duration::from_secs(5))
            .await
            .expect("produced");
    }

    /// A member of group `group` (Kafka's members have no names the group keeps).
    fn consume(
        &self,
        consumer: Consumer,
        group: &str,
        _member: &str,
        stop: BoxFuture<'static, ()>,
    ) -> BoxFuture<'static, ConsumeReport> {
        // A member killed without leaving the group (the crash) is taken for dead after
        // 3 s, not Kafka's default 45.
        let mut config = self.config();
        config
            .set("session.timeout.ms", "3000")
            .set("heartbeat.interval.ms", "500");
        let kafka = KafkaConsumer::new(consumer, config, TOPIC, group);
        Box::pin(async move { kafka.run(stop).await.expect("the consumer ran") })
    }

    /// The group's committed offset of each partition is its high watermark.
    async fn all_acknowledged(&self, group: &str) -> bool {
        let mut config = self.config();
        config.set("group.id", group);
        let reader: BaseConsumer = config.create().expect("a consumer");
        let mut partitions = TopicPartitionList::new();
        for partition in 0..PARTITIONS {
            partitions.add_partition(TOPIC, partition);
        }
        let Ok(committed) = reader.committed_offsets(partitions, Duration::from_secs(5)) else {
            return false;
        };
        (0..PARTITIONS).all(|partition| {
            let (_, high) = reader
                .fetch_watermarks(TOPIC, partition, Duration::from_secs(5))
                .expect("the watermarks");
            match committed
                .find_partition(TOPIC, partition)
                .map(|element| element.offset())
            {
                Some(Offset::Offset(offset)) => offset == high,
                _ => high == 0,
            }
        })
    }

    async fn remove(self) {}
}

// The loop records no lag for Kafka (the group's lag is Kafka's to report).
outbox_testkit::consumer_suite!(TestCluster::start, reports_lag: false);
