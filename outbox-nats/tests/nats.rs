//! The NATS JetStream sink against the NATS server on 127.0.0.1:4222 (JetStream enabled),
//! with the outbox on SQLite. Each test makes its own stream, named uniquely, and deletes it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use outbox_core::sink::{Publisher, Sink, headers};
use outbox_core::{Admin, Delivery, Registry, Relay, RelayConfig};
use outbox_nats::NatsSink;
use outbox_testkit::StoreBackend;
use outbox_testkit::fixtures::{AuditEvent, Note, note};
use outbox_testkit::proxy::TcpProxy;
use outbox_testkit::sink::DiesAfterPublishing;
use outbox_testkit::sqlite::SqliteBackend;

const NATS: &str = "127.0.0.1:4222";

/// A stream of its own for one test, deleted at its end.
struct TestStream {
    name: String,
    jetstream: jetstream::Context,
}

impl TestStream {
    /// A new stream named `outbox_<test>_<pid>_<n>`, capturing `<name>.>`.
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

    /// Every message the stream holds, in stream order: (shard header, message id header,
    /// Nats-Msg-Id, seq of the note).
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
            messages.push(Stored {
                shard: header(headers::SHARD),
                message_id: header(headers::MESSAGE_ID),
                nats_msg_id: header("Nats-Msg-Id"),
                seq: note.seq,
            });
        }
        messages
    }

    async fn count(&self) -> u64 {
        let mut stream = self
            .jetstream
            .get_stream(&self.name)
            .await
            .expect("the test stream");
        stream.info().await.expect("stream info").state.messages
    }
}

impl TestStream {
    /// Deletes the stream.
    async fn remove(self) {
        self.jetstream
            .delete_stream(&self.name)
            .await
            .expect("delete the test stream");
    }
}

#[derive(Debug, Clone)]
struct Stored {
    shard: String,
    message_id: String,
    nats_msg_id: String,
    seq: u64,
}

/// The seqs stored for each shard, in stream order.
fn by_shard(messages: &[Stored]) -> BTreeMap<String, Vec<u64>> {
    let mut shards: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for message in messages {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_each_shard_in_order_with_its_message_id() {
    let stream = TestStream::create("order").await;
    let backend = SqliteBackend::create().await;
    let client = async_nats::connect(NATS).await.expect("NATS runs on 4222");
    let sink = NatsSink::new(client).with_subject_prefix(&stream.name);
    let registry = Registry::builder()
        .sink::<AuditEvent, _>(sink)
        .build()
        .expect("a registry");
    let relay = Relay::with_config(backend.store(), registry, config("nats-order"));
    let ids = backend.write(&events(40, 5)).await.expect("write");

    let report = relay.drain().await.expect("drain");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.deliveries, 200);
    let messages = stream.messages().await;
    assert_eq!(messages.len(), 200);
    let shards = by_shard(&messages);
    assert_eq!(shards.len(), 40);
    for (shard, seqs) in &shards {
        let number: u64 = shard.trim_start_matches("1:").parse().expect("a shard key");
        let expected: Vec<u64> = (1..=5).map(|n| number * 1000 + n).collect();
        assert_eq!(seqs, &expected, "shard {shard} in write order");
    }
    let mut message_ids: Vec<String> = messages
        .iter()
        .map(|message| {
            assert_eq!(message.nats_msg_id, message.message_id);
            message.message_id.clone()
        })
        .collect();
    message_ids.sort_by_key(|id| id.parse::<i64>().expect("a message id"));
    let written: Vec<String> = ids.iter().map(|id| id.0.to_string()).collect();
    assert_eq!(message_ids, written, "each message once, under its own id");
    stream.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_a_crash_carries_the_same_msg_id_and_is_stored_once() {
    let stream = TestStream::create("crash").await;
    let backend = SqliteBackend::create().await;
    let client = async_nats::connect(NATS).await.expect("NATS runs on 4222");
    let sink = NatsSink::new(client).with_subject_prefix(&stream.name);
    let lease = Duration::from_millis(300);
    let dying = DiesAfterPublishing::new(sink.clone());
    let doomed = Relay::with_config(
        backend.store(),
        Registry::builder()
            .sink::<AuditEvent, _>(dying.clone())
            .build()
            .expect("a registry"),
        config("doomed")
            .to_builder()
            .lease(lease)
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
    assert_eq!(stream.count().await, 1, "published before the crash");

    let survivor = Relay::with_config(
        backend.store(),
        Registry::builder()
            .sink::<AuditEvent, _>(sink)
            .build()
            .expect("a registry"),
        config("survivor"),
    );
    let mut redelivered = 0;
    eventually("the survivor takes the shard over", async || {
        let report = survivor.drain().await.expect("drain");
        redelivered += report.deliveries;
        redelivered == 1
    })
    .await;
    let messages = stream.messages().await;
    assert_eq!(messages.len(), 1, "JetStream recognised the redelivery");
    assert_eq!(messages[0].nats_msg_id, ids[0].0.to_string());
    stream.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_without_a_stream_fails_only_its_shard() {
    let stream = TestStream::create("refused").await;
    let backend = SqliteBackend::create().await;
    let client = async_nats::connect(NATS).await.expect("NATS runs on 4222");
    let sink = NatsSink::new(client).with_subject_prefix(&stream.name);
    let prefix = stream.name.clone();
    let publisher =
        Publisher::<AuditEvent, _>::new(sink.clone()).to(move |delivery: &Delivery<AuditEvent>| {
            if delivery.shard_identifier() == outbox_core::Id::from(1_i64) {
                format!("nowhere_{prefix}.audit")
            } else {
                format!("{prefix}.audit")
            }
        });
    let registry = Registry::builder()
        .publish(publisher)
        .build()
        .expect("a registry");
    let relay = Relay::with_config(backend.store(), registry, config("nats-refused"));
    backend.write(&events(3, 2)).await.expect("write");

    let report = relay.drain().await.expect("drain");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    let failure = &report.failures[0];
    assert_eq!(failure.shard.shard_identifier, outbox_core::Id::from(1_i64));
    let error = outbox_core::error_chain(&failure.error);
    assert!(error.contains("no stream"), "{error}");
    assert!(!sink.breaker().is_open(), "a refusal is not an outage");
    let shards = by_shard(&stream.messages().await);
    assert_eq!(shards.get("1:2"), Some(&vec![2001, 2002]));
    assert_eq!(shards.get("1:3"), Some(&vec![3001, 3002]));
    assert!(!shards.contains_key("1:1"));
    stream.remove().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_opens_the_breaker_and_loses_nothing() {
    let stream = TestStream::create("outage").await;
    let backend = SqliteBackend::create().await;
    let proxy = TcpProxy::start(NATS).await.expect("a proxy");
    let client = async_nats::ConnectOptions::new()
        .reconnect_delay_callback(|_| Duration::from_millis(50))
        .connect(proxy.addr().to_string())
        .await
        .expect("NATS through the proxy");
    let sink = NatsSink::new(client)
        .with_subject_prefix(&stream.name)
        .with_ack_timeout(Duration::from_secs(1));
    let registry = Registry::builder()
        .sink::<AuditEvent, _>(sink.clone())
        .build()
        .expect("a registry");
    let relay = Relay::with_config(backend.store(), registry, config("nats-outage"));
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
        stream.count().await == 5
    })
    .await;

    proxy.cut();
    backend
        .write(
            &(1..=5)
                .flat_map(|shard| {
                    [
                        note::<AuditEvent>(shard, 2, shard * 1000 + 2),
                        note::<AuditEvent>(shard, 3, shard * 1000 + 3),
                    ]
                })
                .collect::<Vec<_>>(),
        )
        .await
        .expect("write during the outage");
    eventually("the breaker opens", async || sink.breaker().is_open()).await;
    assert_eq!(stream.count().await, 5, "nothing published while cut");

    proxy.restore();
    eventually("everything is stored", async || stream.count().await == 15).await;
    let _ = stop.send(());
    let report = running
        .await
        .expect("the relay does not panic")
        .expect("the relay stops cleanly");
    assert_eq!(report.failures, 0, "{report:?}");
    assert!(report.unavailable >= 1, "{report:?}");
    assert!(!sink.breaker().is_open());
    let shards = by_shard(&stream.messages().await);
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
    stream.remove().await;
}
