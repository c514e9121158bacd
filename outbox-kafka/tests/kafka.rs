//! The Kafka sink against librdkafka's mock cluster (the Kafka protocol, in process), through
//! the broker suite of `outbox-testkit`. Each test makes a cluster and topics of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use outbox_core::sink::{Publisher, headers};
use outbox_core::{BoxError, Delivery, Id};
use outbox_kafka::KafkaSink;
use outbox_testkit::brokers::{self, Stored};
use outbox_testkit::fixtures::{AuditEvent, Note};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

type Cluster = MockCluster<'static, DefaultProducerContext>;

const PARTITIONS: i32 = 4;

/// A mock cluster of one broker with topic `outbox.audit_event` (4 partitions).
fn cluster() -> Cluster {
    let cluster = MockCluster::new(1).expect("a mock cluster");
    cluster
        .create_topic("outbox.audit_event", PARTITIONS, 1)
        .expect("create the topic");
    cluster
}

fn sink(cluster: &Cluster) -> KafkaSink {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("message.timeout.ms", "1500");
    KafkaSink::with_config(config).expect("a producer")
}

/// A consumer of every partition of `outbox.audit_event` from its beginning, and what it
/// has read so far.
struct Consumed {
    consumer: BaseConsumer,
    records: Mutex<Vec<(i32, Stored)>>,
}

impl Consumed {
    fn new(cluster: &Cluster) -> Self {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("group.id", "outbox-test")
            .set("enable.auto.commit", "false")
            .create()
            .expect("a consumer");
        let mut assignment = TopicPartitionList::new();
        for partition in 0..PARTITIONS {
            assignment
                .add_partition_offset("outbox.audit_event", partition, Offset::Beginning)
                .expect("an offset");
        }
        consumer.assign(&assignment).expect("assign the partitions");
        Self {
            consumer,
            records: Mutex::default(),
        }
    }

    /// Reads what has come: how many records were read in all.
    async fn poll(&self) -> usize {
        // While the broker is down, the consumer reports it: read on at the next call.
        while let Some(Ok(record)) = self.consumer.poll(Duration::from_millis(10)) {
            let header = |name: &str| -> String {
                record
                    .headers()
                    .and_then(|headers| {
                        headers
                            .iter()
                            .find(|header| header.key == name)
                            .and_then(|header| header.value)
                            .map(|value| String::from_utf8_lossy(value).into_owned())
                    })
                    .unwrap_or_default()
            };
            let note: Note = serde_json::from_slice(record.payload().expect("a payload"))
                .expect("a note payload");
            assert_eq!(
                record.key(),
                Some(header(headers::SHARD).as_bytes()),
                "keyed by shard"
            );
            let stored = Stored {
                shard: header(headers::SHARD),
                message_id: header(headers::MESSAGE_ID),
                seq: note.seq,
            };
            self.records
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((record.partition(), stored));
        }
        tokio::task::yield_now().await;
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Reads until `count` records have come: all of them, in partition order.
    async fn read(&self, count: usize) -> Vec<(i32, Stored)> {
        brokers::eventually("every record is read", async || self.poll().await >= count).await;
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn stored(&self, count: usize) -> Vec<Stored> {
        self.read(count)
            .await
            .into_iter()
            .map(|(_, stored)| stored)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produces_each_shard_in_order_to_one_partition() {
    let cluster = cluster();
    let consumed = Consumed::new(&cluster);
    brokers::publishes_in_order(sink(&cluster), async |count| consumed.stored(count).await).await;
    let mut partitions: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for (partition, stored) in consumed.read(200).await {
        partitions
            .entry(stored.shard)
            .or_default()
            .insert(partition);
    }
    assert!(
        partitions.values().all(|partitions| partitions.len() == 1),
        "each shard keeps to one partition: {partitions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_crash_carries_the_same_message_id() {
    let cluster = cluster();
    let consumed = Consumed::new(&cluster);
    let id = brokers::crash_and_redeliver(sink(&cluster), async || {
        assert_eq!(consumed.read(1).await.len(), 1, "produced before the crash");
    })
    .await;
    let records = consumed.stored(2).await;
    assert!(
        records
            .iter()
            .all(|record| record.message_id == id.0.to_string()),
        "both under the message's id: {records:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_too_large_fails_only_its_shard() {
    let cluster = cluster();
    let consumed = Consumed::new(&cluster);
    let sink = sink(&cluster);
    // Shard 1's messages are encoded past the producer's 1 MB `message.max.bytes`.
    let publisher = Publisher::<AuditEvent, _>::new(sink.clone()).encode_with(
        "application/json",
        |delivery: &Delivery<AuditEvent>| {
            let mut payload = serde_json::to_vec(&delivery.payload)?;
            if delivery.shard_identifier() == Id::from(1_i64) {
                payload.resize(2 * 1024 * 1024, b' ');
            }
            Ok::<_, BoxError>(payload)
        },
    );
    brokers::refusal_fails_only_its_shard(publisher, &sink, "refused", async |count| {
        consumed.stored(count).await
    })
    .await;
}

/// A record refused by the broker (a topic this producer may not write) does not stop those
/// queued after it for another topic: they are confirmed and never produced twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_after_a_refused_one_are_produced_once() {
    let cluster = cluster();
    cluster
        .topic_error(
            "outbox.forbidden",
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .expect("refuse the topic");
    let consumed = Consumed::new(&cluster);
    let sink = sink(&cluster);
    brokers::refusal_in_a_run_publishes_nothing_twice(
        sink,
        "outbox.audit_event".to_owned(),
        "outbox.forbidden".to_owned(),
        async |count| consumed.stored(count).await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_opens_the_breaker_and_loses_nothing() {
    let cluster = cluster();
    let consumed = Consumed::new(&cluster);
    brokers::rides_out_an_outage(
        sink(&cluster),
        async || consumed.poll().await,
        || cluster.broker_down(1).expect("take the broker down"),
        || cluster.broker_up(1).expect("bring the broker back"),
        async |count| consumed.stored(count).await,
    )
    .await;
}
