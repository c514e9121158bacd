//! The consumer's side: a Kafka consumer group member whose records run through an outbox
//! [`Consumer`] (its inbox and handlers), its offsets committed only once settled.

use std::future::Future;

use outbox_core::inbox::{ConsumeReport, Consumer, Incoming};
use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use tracing::warn;

/// How long the consumer waits after a failed read before it reads again.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// A member of a Kafka consumer group that applies each record through an outbox
/// [`Consumer`]: the handler's effect and the inbox record commit in one transaction of the
/// consumer's database, and the record's offset is committed only after that commit. A crash
/// in between delivers the record again (to this member or to another, from the partition's
/// last committed offset), and the inbox finds it applied.
///
/// Records are applied one at a time, in each partition's order (a shard's messages share a
/// partition: the sink keys them by shard), a failing one retried in place, its successors
/// waiting. Automatic commits are turned off, whatever the configuration says. A retry wait
/// must stay below `max.poll.interval.ms` (5 minutes unless configured), or the group takes
/// the partition away; the consumer's backoff caps it. The group's lag is Kafka's to report
/// (its committed offsets against the partitions' ends): the loop records none.
///
/// ```no_run
/// # async fn example(consumer: outbox_core::inbox::Consumer) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_kafka::KafkaConsumer;
/// use rdkafka::ClientConfig;
///
/// let mut config = ClientConfig::new();
/// config.set("bootstrap.servers", "kafka-1:9092");
/// let report = KafkaConsumer::new(consumer, config, "orders.order_placed", "billing")
///     .run(outbox_core::shutdown_signal())
///     .await?;
/// println!("applied {} records", report.applied);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct KafkaConsumer {
    consumer: Consumer,
    config: ClientConfig,
    topic: String,
    group: String,
}

impl KafkaConsumer {
    /// Reads topic `topic` as a member of consumer group `group`, with the client settings of
    /// `config` (`bootstrap.servers`, security). A group without a committed offset starts at
    /// the topic's earliest record unless `auto.offset.reset` says otherwise.
    pub fn new(
        consumer: Consumer,
        config: ClientConfig,
        topic: impl Into<String>,
        group: impl Into<String>,
    ) -> Self {
        Self {
            consumer,
            config,
            topic: topic.into(),
            group: group.into(),
        }
    }

    /// Consumes until `stop` resolves, then returns what it settled. A record being retried
    /// when `stop` resolves is left uncommitted (the group delivers it again); a record being
    /// applied is finished first.
    ///
    /// Fails only if the consumer cannot be created or subscribed; the brokers may go away
    /// and come back meanwhile (librdkafka reconnects).
    pub async fn run(&self, stop: impl Future<Output = ()>) -> Result<ConsumeReport, KafkaError> {
        let mut config = self.config.clone();
        config
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        if config.get("auto.offset.reset").is_none() {
            config.set("auto.offset.reset", "earliest");
        }
        let kafka: StreamConsumer = config.create()?;
        kafka.subscribe(&[&self.topic])?;
        let mut report = ConsumeReport::default();
        let mut stop = std::pin::pin!(stop);
        loop {
            let record = tokio::select! {
                biased;
                () = stop.as_mut() => break,
                record = kafka.recv() => record,
            };
            let record = match record {
                Ok(record) => record,
                Err(error) => {
                    warn!(topic = %self.topic, %error, "reading from Kafka failed; trying again");
                    tokio::select! {
                        biased;
                        () = stop.as_mut() => break,
                        () = tokio::time::sleep(RETRY_AFTER) => continue,
                    }
                }
            };
            let Some(settled) = self
                .consumer
                .process(&incoming(&record), || async {}, stop.as_mut())
                .await
            else {
                break;
            };
            report.count(settled);
            if let Err(error) = kafka.commit_message(&record, CommitMode::Async) {
                // Settled in the database: the group delivers it again, and the inbox finds
                // it applied.
                warn!(topic = %self.topic, %error, "committing a settled record's offset failed; it will be a duplicate");
            }
        }
        // What was committed asynchronously reaches the group before the member leaves.
        if let Err(error) = kafka.commit_consumer_state(CommitMode::Sync) {
            warn!(topic = %self.topic, %error, "committing the offsets on stopping failed");
        }
        Ok(report)
    }
}

/// `record` as the outbox consumer reads it: its headers, its payload (Kafka does not count
/// deliveries).
fn incoming(record: &BorrowedMessage<'_>) -> Incoming {
    let mut incoming = Incoming::new(record.payload().unwrap_or_default().to_vec(), 0);
    if let Some(headers) = record.headers() {
        for header in headers.iter() {
            if let Some(value) = header.value {
                incoming.headers.push((
                    header.key.to_owned(),
                    String::from_utf8_lossy(value).into_owned(),
                ));
            }
        }
    }
    incoming
}
