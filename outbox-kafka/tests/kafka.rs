//! The Kafka sink against librdkafka's mock cluster (the Kafka protocol, in process), with the
//! outbox on SQLite. Each test makes a cluster and topics of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_core::sink::{Publisher, Sink, headers};
use outbox_core::{Admin, BoxError, Delivery, Id, Registry, Relay, RelayConfig};
use outbox_kafka::KafkaSink;
use outbox_testkit::StoreBackend;
use outbox_testkit::fixtures::{AuditEvent, Note, note};
use outbox_testkit::sink::DiesAfterPublishing;
use outbox_testkit::sqlite::SqliteBackend;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const PARTITIONS: i32 = 4;

/// A record as the topic holds it.
#[derive(Debug, Clone)]
struct Received {
    partition: i32,
    shard: String,
    message_id: String,
    seq: u64,
}

/// A mock cluster of one broker with topic `outbox.audit_event` (4 partitions).
fn cluster() -> MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
    let cluster = MockCluster::new(1).expect("a mock cluster");
    cluster
        .create_topic("outbox.audit_event", PARTITIONS, 1)
        .expect("create the topic");
    cluster
}

fn sink(cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>) -> KafkaSink {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("message.timeout.ms", "1500");
    KafkaSink::with_config(config).expect("a producer")
}

/// Reads every record of `outbox.audit_event` until `count` have come, in partition order.
async fn read(
    cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    count: usize,
) -> Vec<Received> {
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
    let mut received = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while received.len() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {count} records came",
            received.len()
        );
        let Some(record) = consumer.poll(Duration::from_millis(100)) else {
            tokio::task::yield_now().await;
            continue;
        };
        let record = record.expect("a record");
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
        let note: Note =
            serde_json::from_slice(record.payload().expect("a payload")).expect("a note payload");
        assert_eq!(
            record.key(),
            Some(header(headers::SHARD).as_bytes()),
            "keyed by shard"
        );
        received.push(Received {
            partition: record.partition(),
            shard: header(headers::SHARD),
            message_id: header(headers::MESSAGE_ID),
            seq: note.seq,
        });
    }
    received
}

/// The seqs received for each shard, in the order of its partition.
fn by_shard(received: &[Received]) -> BTreeMap<String, Vec<u64>> {
    let mut shards: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for record in received {
        shards
            .entry(record.shard.clone())
            .or_default()
            .push(record.seq);
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

fn registry(sink: impl Sink) -> Registry {
    Registry::builder()
        .sink::<AuditEvent, _>(sink)
        .build()
        .expect("a registry")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produces_each_shard_in_order_to_one_partition() {
    let cluster = cluster();
    let backend = SqliteBackend::create().await;
    let relay = Relay::with_config(backend.store(), registry(sink(&cluster)), config("kafka"));
    let ids = backend.write(&events(40, 5)).await.expect("write");

    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    let received = read(&cluster, 200).await;
    let shards = by_shard(&received);
    assert_eq!(shards.len(), 40);
    for (shard, seqs) in &shards {
        let number: u64 = shard.trim_start_matches("1:").parse().expect("a shard key");
        let expected: Vec<u64> = (1..=5).map(|n| number * 1000 + n).collect();
        assert_eq!(seqs, &expected, "shard {shard} in write order");
        let partitions: std::collections::BTreeSet<i32> = received
            .iter()
            .filter(|record| &record.shard == shard)
            .map(|record| record.partition)
            .collect();
        assert_eq!(partitions.len(), 1, "shard {shard} keeps to one partition");
    }
    let mut message_ids: Vec<i64> = received
        .iter()
        .map(|record| record.message_id.parse().expect("a message id"))
        .collect();
    message_ids.sort_unstable();
    let written: Vec<i64> = ids.iter().map(|id| id.0).collect();
    assert_eq!(message_ids, written, "each message once, under its own id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_crash_carries_the_same_message_id() {
    let cluster = cluster();
    let backend = SqliteBackend::create().await;
    let sink = sink(&cluster);
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut redelivered = 0;
    while redelivered == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never taken over");
        redelivered += survivor.drain().await.expect("drain").deliveries;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let received = read(&cluster, 2).await;
    assert!(
        received
            .iter()
            .all(|record| record.message_id == ids[0].0.to_string()),
        "both under the message's id: {received:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_too_large_fails_only_its_shard() {
    let cluster = cluster();
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
    let registry = Registry::builder()
        .publish(publisher)
        .build()
        .expect("a registry");
    let backend = SqliteBackend::create().await;
    let relay = Relay::with_config(backend.store(), registry, config("kafka-refused"));
    backend.write(&events(3, 2)).await.expect("write");

    let report = relay.drain().await.expect("drain");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    let failure = &report.failures[0];
    assert_eq!(failure.shard.shard_identifier, Id::from(1_i64));
    let error = outbox_core::error_chain(&failure.error);
    assert!(error.contains("refused"), "{error}");
    assert!(!sink.breaker().is_open(), "a refusal is not an outage");
    let shards = by_shard(&read(&cluster, 4).await);
    assert_eq!(shards.get("1:2"), Some(&vec![2001, 2002]));
    assert_eq!(shards.get("1:3"), Some(&vec![3001, 3002]));
    assert!(!shards.contains_key("1:1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_opens_the_breaker_and_loses_nothing() {
    let cluster = cluster();
    let backend = SqliteBackend::create().await;
    let sink = sink(&cluster);
    let relay = Relay::with_config(backend.store(), registry(sink.clone()), config("kafka-out"));

    backend.write(&events(5, 1)).await.expect("write");
    assert!(relay.drain().await.expect("drain").is_clean());

    cluster.broker_down(1).expect("take the broker down");
    let during: Vec<_> = (1..=5)
        .flat_map(|shard| [2, 3].map(|n| note::<AuditEvent>(shard, n, shard * 1000 + n)))
        .collect();
    backend
        .write(&during)
        .await
        .expect("write during the outage");
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !sink.breaker().is_open() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the breaker never opened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    cluster.broker_up(1).expect("bring the broker back");
    let received = read(&cluster, 15).await;
    let _ = stop.send(());
    let report = running
        .await
        .expect("the relay does not panic")
        .expect("the relay stops cleanly");
    assert_eq!(report.failures, 0, "{report:?}");
    assert!(report.unavailable >= 1, "{report:?}");
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
}
