//! A Kafka sink for the `outbox` transactional outbox framework.
//!
//! [`KafkaSink`] produces each delivery with librdkafka's idempotent producer (`acks=all`),
//! keyed by its shard (so a shard's messages share a partition, in order), and returns once
//! the delivery report says the partition's leader and its in-sync replicas stored it; only
//! then does the outbox delete the message. The idempotent producer keeps its own retries from
//! duplicating or reordering a partition's messages; a redelivery after a relay crash is
//! recognised by the `Outbox-Message-Id` header, beside the other
//! [`headers`](outbox_core::sink::headers) (category, scope, shard, object, creation time,
//! the producer's trace context).
//!
//! ```no_run
//! # fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_core::Registry;
//! use outbox_kafka::KafkaSink;
//! # #[derive(Debug)] struct Org;
//! # impl outbox_core::Scope for Org { const ID: outbox_core::ScopeId = outbox_core::ScopeId(1); const NAME: &'static str = "org"; }
//! # #[derive(Debug)] struct OrderPlaced;
//! # impl outbox_core::Category for OrderPlaced { type Scope = Org; type Payload = String; const ID: outbox_core::CategoryId = outbox_core::CategoryId(1); const NAME: &'static str = "order_placed"; }
//!
//! // Topics `orders.<category>`.
//! let sink = KafkaSink::new("kafka-1:9092,kafka-2:9092")?.with_topic_prefix("orders");
//! let registry = Registry::builder().sink::<OrderPlaced, _>(sink).build()?;
//! # let _ = registry;
//! # Ok(())
//! # }
//! ```
//!
//! Errors: a message the cluster refuses (too large, no such topic, not authorized, invalid) is
//! a [refusal](SinkError::Refused) of that message. One whose delivery report does not come
//! within `message.timeout.ms` (30 s unless you set it), or that fails because the brokers are
//! down, is an [outage](SinkError::Unavailable): the sink's breaker opens, the relay parks the
//! shards, and resumes them once the cluster answers the breaker's probe (a metadata request).
//!
//! **Consuming.** [`KafkaConsumer`] is a consumer group member with automatic commits off that
//! applies each message through an outbox [`Consumer`](outbox_core::inbox::Consumer) (its inbox
//! and the producer's handlers) and acknowledges the broker only after the consumer's
//! transaction committed: a message delivered again is found in the inbox and applied once.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod consumer;

pub use crate::consumer::KafkaConsumer;

use std::time::Duration;

use outbox_core::BoxError;
use outbox_core::sink::{Breaker, Envelope, Published, Sink, SinkError, send_then_confirm};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

/// How long the producer tries to deliver a message unless its configuration says otherwise
/// (`message.timeout.ms`).
pub const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a probe's metadata request may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A [`Sink`] producing to Kafka. Cheap to clone; clones share the producer and the breaker.
#[derive(Clone)]
pub struct KafkaSink {
    producer: FutureProducer,
    prefix: String,
    breaker: Breaker,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("prefix", &self.prefix)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// A sink producing to the cluster at `bootstrap_servers` (`host:port,host:port`), to
    /// topics `outbox.<category>`.
    pub fn new(bootstrap_servers: &str) -> KafkaResult<Self> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", bootstrap_servers);
        Self::with_config(config)
    }

    /// A sink producing through a producer made from `config` (TLS, SASL, `linger.ms`,
    /// `message.timeout.ms`...), with what the sink's guarantees need set over it: the
    /// idempotent producer and `acks=all`. `message.timeout.ms` is 30 s and `linger.ms` 0
    /// unless `config` sets them.
    pub fn with_config(mut config: ClientConfig) -> KafkaResult<Self> {
        config.set("enable.idempotence", "true").set("acks", "all");
        // The relay has one message of each shard in flight, so waiting to fill a batch
        // only delays it: send at once unless `config` says otherwise.
        if config.get("linger.ms").is_none() {
            config.set("linger.ms", "0");
        }
        if config.get("message.timeout.ms").is_none() {
            config.set(
                "message.timeout.ms",
                DEFAULT_MESSAGE_TIMEOUT.as_millis().to_string(),
            );
        }
        let producer: FutureProducer = config.create()?;
        let probed = producer.clone();
        let breaker = Breaker::new("Kafka", move || {
            let producer = probed.clone();
            async move {
                // librdkafka's metadata request blocks its caller.
                tokio::task::spawn_blocking(move || {
                    producer
                        .client()
                        .fetch_metadata(None, PROBE_TIMEOUT)
                        .map(drop)
                })
                .await
                .map_err(BoxError::from)?
                .map_err(BoxError::from)
            }
        });
        Ok(Self {
            producer,
            prefix: "outbox".to_owned(),
            breaker,
        })
    }

    /// Produces a category's messages to topic `<prefix>.<category>` (the category's name)
    /// unless its publisher routes them elsewhere.
    pub fn with_topic_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The producer.
    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }
}

impl KafkaSink {
    /// Queues `envelope` in the producer: the future of its delivery report.
    fn enqueue(&self, envelope: &Envelope) -> Result<DeliveryFuture, SinkError> {
        let mut headers = OwnedHeaders::new_with_capacity(envelope.headers.len());
        for (name, value) in &envelope.headers {
            headers = headers.insert(Header {
                key: name.as_ref(),
                value: Some(value.as_bytes()),
            });
        }
        let record = FutureRecord::to(&envelope.destination)
            .key(envelope.key.as_bytes())
            .payload(envelope.payload.as_slice())
            .headers(headers);
        self.producer
            .send_result(record)
            .map_err(|(error, _)| classify(error))
    }
}

/// Waits for a record's delivery report.
async fn reported(report: DeliveryFuture) -> Result<(), SinkError> {
    match report.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((error, _))) => Err(classify(error)),
        Err(_) => Err(SinkError::Unavailable(
            "the producer dropped the record without a delivery report".into(),
        )),
    }
}

impl Sink for KafkaSink {
    async fn publish(&self, envelope: Envelope) -> Result<(), SinkError> {
        reported(self.enqueue(&envelope)?).await
    }

    /// Queues every envelope in the producer (the idempotent producer keeps a partition's
    /// order through its retries), then waits for the delivery reports in order.
    async fn publish_all(&self, envelopes: Vec<Envelope>) -> Published {
        let enqueue = |envelope: Envelope| std::future::ready(self.enqueue(&envelope));
        send_then_confirm(envelopes, enqueue, reported).await
    }

    fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    fn destination(&self, category: &'static str) -> String {
        format!("{}.{category}", self.prefix)
    }
}

/// A production error as a refusal of the message (it would fail again as it is) or an
/// outage (anything else: timeouts, brokers down, leaders moving, a full queue).
fn classify(error: KafkaError) -> SinkError {
    let refused = matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::UnsupportedForMessageFormat
                | RDKafkaErrorCode::InvalidArgument
        )
    );
    if refused {
        SinkError::Refused(Box::new(error))
    } else {
        SinkError::Unavailable(Box::new(error))
    }
}
