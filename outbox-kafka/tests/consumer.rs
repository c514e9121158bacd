//! The consumer's side against librdkafka's mock cluster (the Kafka protocol, in process),
//! through the consumer suite of `outbox-testkit`: an orders database's relay produces to the
//! topic `outbox.audit_event`, and billing's `KafkaConsumer` applies each record into billing's
//! own SQLite database through its inbox, committing its offset after the commit.

use std::time::Duration;

use outbox_core::handler::BoxFuture;
use outbox_core::inbox::{ConsumeReport, Consumer};
use outbox_kafka::{KafkaConsumer, KafkaSink};
use outbox_testkit::consumers::{self, ConsumerBroker};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const TOPIC: &str = "outbox.audit_event";
const PARTITIONS: i32 = 2;

/// A mock cluster of one broker with the audit events' topic; it runs until dropped.
fn mock_cluster() -> MockCluster<'static, DefaultProducerContext> {
    let cluster = MockCluster::new(1).expect("a mock cluster");
    cluster
        .create_topic(TOPIC, PARTITIONS, 1)
        .expect("create the topic");
    cluster
}

/// A mock cluster, as its clients reach it.
struct TestCluster {
    bootstrap: String,
}

impl TestCluster {
    fn of(cluster: &MockCluster<'static, DefaultProducerContext>) -> Self {
        Self {
            bootstrap: cluster.bootstrap_servers(),
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

macro_rules! suite {
    ($($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let mock = mock_cluster();
                let cluster = TestCluster::of(&mock);
                consumers::$scenario(&cluster).await;
                cluster.remove().await;
            }
        )*
    };
}

suite!(
    each_message_is_applied_once_and_acknowledged,
    a_failing_message_is_retried_in_place_keeping_the_order,
    a_poison_message_is_a_dead_letter_and_the_rest_flow,
    a_crash_between_the_commit_and_the_ack_charges_nothing_twice,
);

/// The loop records no lag for Kafka (the group's lag is Kafka's to report).
#[test]
fn the_lag_and_the_failures_are_reported() {
    let mock = mock_cluster();
    let cluster = TestCluster::of(&mock);
    consumers::the_lag_and_the_failures_are_reported(|| Box::pin(async { cluster }), false);
}
