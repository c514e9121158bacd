//! The consumer's side: a RabbitMQ queue consumed with manual acknowledgements, each message
//! run through an outbox [`Consumer`] (its inbox and handlers) and acknowledged only once
//! settled.

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::uri::AMQPUri;
use lapin::{Channel, Connection, ConnectionProperties};
use outbox_core::inbox::{ConsumeReport, Consumer, Incoming};
use tracing::{debug, warn};

/// How many unacknowledged messages RabbitMQ hands the consumer at once, by default.
pub const DEFAULT_PREFETCH: u16 = 20;

/// How long the consumer waits before connecting again after the connection failed.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);

/// How often the consumer asks the queue how many messages wait in it (its lag).
const LAG_EVERY: Duration = Duration::from_secs(5);

/// Why a [`RabbitConsumer`] could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The URI does not read as an AMQP URI.
    #[error(transparent)]
    InvalidUri(#[from] crate::InvalidUri),
    /// The first connection, or the first `basic.consume` (no such queue), failed.
    #[error("consuming from RabbitMQ failed")]
    Amqp(#[from] lapin::Error),
}

/// A consumer of a RabbitMQ queue with manual acknowledgements that applies each message
/// through an outbox [`Consumer`]: the handler's effect and the inbox record commit in one
/// transaction of the consumer's database, and the message is acknowledged (`basic.ack`)
/// only after that commit. A crash (or a lost connection) in between returns the message to
/// the queue, and the inbox finds it applied when it comes again.
///
/// Messages are applied one at a time, in the order RabbitMQ delivers them (a failing one is
/// retried in place, its successors wait). A message returned to the queue by a crash comes
/// again marked redelivered, possibly after newer ones. The queue is not declared: bind it
/// to the sink's exchange and routing keys beforehand.
///
/// ```no_run
/// # async fn example(consumer: outbox_core::inbox::Consumer) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_rabbitmq::RabbitConsumer;
///
/// let report = RabbitConsumer::new(consumer, "billing.orders")
///     .run("amqp://guest:guest@127.0.0.1:5672/%2f", outbox_core::shutdown_signal())
///     .await?;
/// println!("applied {} messages", report.applied);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RabbitConsumer {
    consumer: Consumer,
    queue: String,
    prefetch: u16,
}

impl RabbitConsumer {
    /// Consumes queue `queue`.
    pub fn new(consumer: Consumer, queue: impl Into<String>) -> Self {
        Self {
            consumer,
            queue: queue.into(),
            prefetch: DEFAULT_PREFETCH,
        }
    }

    /// Lets RabbitMQ hand out `messages` before their acknowledgements (default
    /// [`DEFAULT_PREFETCH`]; at least 1).
    pub fn prefetch(mut self, messages: u16) -> Self {
        self.prefetch = messages.max(1);
        self
    }

    /// Consumes until `stop` resolves, then returns what it settled. A message being retried
    /// when `stop` resolves is left unacknowledged (RabbitMQ delivers it again once the
    /// connection closes); a message being applied is finished first.
    ///
    /// The connection may fail meanwhile: the consumer connects again, and RabbitMQ delivers
    /// again what was not acknowledged. Fails only if `uri` does not read as an AMQP URI, or
    /// the first connection, or the first `basic.consume` (no such queue), fails; no error
    /// shows the URI's password.
    pub async fn run(
        &self,
        uri: &str,
        stop: impl Future<Output = ()>,
    ) -> Result<ConsumeReport, ConsumeError> {
        let uri = crate::parse_uri(uri)?;
        let mut report = ConsumeReport::default();
        let mut stop = std::pin::pin!(stop);
        let mut first = true;
        loop {
            let opened = tokio::select! {
                biased;
                () = stop.as_mut() => return Ok(report),
                opened = self.open(&uri) => opened,
            };
            let (connection, channel, mut deliveries) = match opened {
                Ok(opened) => opened,
                Err(error) if first => return Err(error.into()),
                Err(error) => {
                    warn!(queue = %self.queue, %error, "connecting to RabbitMQ failed; trying again");
                    tokio::select! {
                        biased;
                        () = stop.as_mut() => return Ok(report),
                        () = tokio::time::sleep(RECONNECT_AFTER) => continue,
                    }
                }
            };
            first = false;
            let mut lag_at = Instant::now();
            loop {
                let next = tokio::select! {
                    biased;
                    () = stop.as_mut() => {
                        let _ = connection.close(200, "stopping".into()).await;
                        return Ok(report);
                    }
                    next = deliveries.next() => next,
                };
                let delivery = match next {
                    Some(Ok(delivery)) => delivery,
                    Some(Err(error)) => {
                        warn!(queue = %self.queue, %error, "the RabbitMQ connection failed; connecting again");
                        break;
                    }
                    None => {
                        warn!(queue = %self.queue, "RabbitMQ ended the consumer; connecting again");
                        break;
                    }
                };
                let Some(settled) = self
                    .consumer
                    .process(&incoming(&delivery), || async {}, stop.as_mut())
                    .await
                else {
                    let _ = connection.close(200, "stopping".into()).await;
                    return Ok(report);
                };
                report.count(settled);
                if let Err(error) = delivery.ack(BasicAckOptions::default()).await {
                    // Settled in the database: RabbitMQ delivers it again, and the inbox
                    // finds it applied.
                    warn!(queue = %self.queue, %error, "acknowledging a settled message failed; it will be a duplicate");
                }
                if lag_at.elapsed() >= LAG_EVERY {
                    lag_at = Instant::now();
                    self.record_lag(&channel).await;
                }
            }
            let _ = connection.close(200, "reconnecting".into()).await;
        }
    }

    /// A connection, its channel (with the prefetch), and the queue's deliveries.
    async fn open(
        &self,
        uri: &AMQPUri,
    ) -> Result<(Connection, Channel, lapin::Consumer), lapin::Error> {
        let connection =
            Connection::connect_uri(uri.clone(), ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await?;
        let deliveries = channel
            .basic_consume(
                ShortString::from(self.queue.as_str()),
                ShortString::from(""),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok((connection, channel, deliveries))
    }

    /// Records how many messages wait in the queue, not yet delivered (a passive declare).
    async fn record_lag(&self, channel: &Channel) {
        let declared = channel
            .queue_declare(
                ShortString::from(self.queue.as_str()),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        match declared {
            Ok(queue) => self.consumer.record_lag(u64::from(queue.message_count())),
            Err(error) => debug!(%error, "reading the queue's length failed"),
        }
    }
}

/// `delivery` as the outbox consumer reads it: its header table's strings, its payload, and
/// its delivery count (a quorum queue's `x-delivery-count`, else 2 for a message marked
/// redelivered).
fn incoming(delivery: &Delivery) -> Incoming {
    let mut incoming = Incoming::new(
        delivery.data.clone(),
        if delivery.redelivered { 2 } else { 1 },
    );
    if let Some(table) = delivery.properties.headers() {
        for (name, value) in table {
            let name = name.as_str();
            match value {
                AMQPValue::LongString(text) => incoming.headers.push((
                    name.to_owned(),
                    String::from_utf8_lossy(text.as_bytes()).into_owned(),
                )),
                AMQPValue::ShortString(text) => {
                    incoming
                        .headers
                        .push((name.to_owned(), text.as_str().to_owned()));
                }
                AMQPValue::LongLongInt(count) if name == "x-delivery-count" => {
                    incoming.delivered = u32::try_from(*count + 1).unwrap_or(u32::MAX);
                }
                AMQPValue::LongInt(count) if name == "x-delivery-count" => {
                    incoming.delivered = u32::try_from(*count + 1).unwrap_or(u32::MAX);
                }
                _ => {}
            }
        }
    }
    incoming
}
