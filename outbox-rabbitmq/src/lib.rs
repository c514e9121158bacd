//! A RabbitMQ sink for the `outbox` transactional outbox framework.
//!
//! [`RabbitSink`] publishes each delivery to an exchange with publisher confirms, `mandatory`
//! set and persistent delivery, and returns once RabbitMQ confirmed it, so the outbox deletes
//! a message only after the broker took responsibility for it. The outbox message id travels
//! as the AMQP `message_id`, by which a consumer recognises a redelivery after a relay crash;
//! the [`headers`] travel in the message's header table (the
//! category, scope, shard, object, creation time and the producer's trace context).
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_core::Registry;
//! use outbox_rabbitmq::RabbitSink;
//! # #[derive(Debug)] struct Org;
//! # impl outbox_core::Scope for Org { const ID: outbox_core::ScopeId = outbox_core::ScopeId(1); const NAME: &'static str = "org"; }
//! # #[derive(Debug)] struct OrderPlaced;
//! # impl outbox_core::Category for OrderPlaced { type Scope = Org; type Payload = String; const ID: outbox_core::CategoryId = outbox_core::CategoryId(1); const NAME: &'static str = "order_placed"; }
//!
//! // Routing keys `orders.<category>` on the `events` exchange.
//! let sink = RabbitSink::connect("amqp://guest:guest@127.0.0.1:5672/%2f")
//!     .await?
//!     .with_exchange("events")
//!     .with_routing_prefix("orders");
//! let registry = Registry::builder().sink::<OrderPlaced, _>(sink).build()?;
//! # let _ = registry;
//! # Ok(())
//! # }
//! ```
//!
//! Errors: a message no queue is bound for (returned as unroutable), or one the broker refuses
//! on its channel (no such exchange, too large, not allowed), is a
//! [refusal](SinkError::Refused) of that message. A connection that is down, a negative
//! confirm, or a confirm that does not come within the confirm timeout is an
//! [outage](SinkError::Unavailable): the sink's breaker opens, the relay parks the shards,
//! and the breaker's probe reconnects (a new connection and confirming channel) and closes it.
//!
//! **Consuming.** [`RabbitConsumer`] is a queue consumer with manual acknowledgements that
//! applies each message through an outbox [`Consumer`](outbox_core::inbox::Consumer) (its inbox
//! and the producer's handlers) and acknowledges the broker only after the consumer's
//! transaction committed: a message delivered again is found in the inbox and applied once.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod consumer;

pub use crate::consumer::{ConsumeError, DEFAULT_PREFETCH, RabbitConsumer};

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, PublisherConfirm,
};
use outbox_core::BoxError;
use outbox_core::sink::{Breaker, Envelope, Published, Sink, SinkError, headers};
use tracing::debug;

/// How long a publish waits for its confirm by default (and a connection attempt, to be made).
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// A [`Sink`] publishing to RabbitMQ. Cheap to clone; clones share the connection and the
/// breaker.
#[derive(Clone)]
pub struct RabbitSink {
    link: Arc<Link>,
    exchange: String,
    prefix: String,
    breaker: Breaker,
}

impl std::fmt::Debug for RabbitSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSink")
            .field("exchange", &self.exchange)
            .field("prefix", &self.prefix)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

/// The connection and its confirming channel (the probe's), made again after they fail, and
/// the idle channels publishes take in turn.
///
/// Each publish has a channel of its own while it runs: RabbitMQ may confirm several
/// messages of a channel at once, and lapin then hands a returned (unroutable) message to any
/// of the confirms it resolves together, so a channel's returns can be matched to their
/// messages (by message id) only among the publishes of one caller.
struct Link {
    uri: AMQPUri,
    timeout: Duration,
    open: tokio::sync::Mutex<Option<(Connection, Channel)>>,
    idle: std::sync::Mutex<Vec<Channel>>,
}

impl Link {
    /// The confirming channel, connecting (again) if there is none or it failed.
    async fn channel(&self) -> Result<Channel, ConnectError> {
        let mut open = self.open.lock().await;
        self.opened(&mut open)
            .await
            .map(|(_, channel)| channel.clone())
    }

    /// The connection and channel `open` holds, made (again) if there are none or they failed.
    async fn opened<'o>(
        &self,
        open: &'o mut Option<(Connection, Channel)>,
    ) -> Result<&'o (Connection, Channel), ConnectError> {
        let pair = match open.take() {
            Some((connection, channel))
                if connection.status().connected() && channel.status().connected() =>
            {
                (connection, channel)
            }
            // Only the channel failed (a refused message closes it): keep the connection.
            Some((connection, _)) if connection.status().connected() => {
                let channel = confirming(&connection).await?;
                (connection, channel)
            }
            _ => {
                let connect =
                    Connection::connect_uri(self.uri.clone(), ConnectionProperties::default());
                let connection = tokio::time::timeout(self.timeout, connect)
                    .await
                    .map_err(|_| ConnectError::TimedOut(self.timeout))??;
                let channel = confirming(&connection).await?;
                (connection, channel)
            }
        };
        Ok(open.insert(pair))
    }

    /// A confirming channel for one publish alone: an idle one, or a new one.
    async fn checkout(&self) -> Result<Channel, ConnectError> {
        while let Some(channel) = self.idle.lock().expect("the idle channels").pop() {
            if channel.status().connected() {
                return Ok(channel);
            }
        }
        let mut open = self.open.lock().await;
        let (connection, _) = self.opened(&mut open).await?;
        Ok(confirming(connection).await?)
    }

    /// Gives back a channel whose publish saw every confirm and nothing returned; a channel
    /// left with confirms outstanding is closed instead.
    async fn checkin(&self, channel: Channel, clean: bool) {
        if clean && channel.status().connected() {
            self.idle.lock().expect("the idle channels").push(channel);
        } else if channel.status().connected() {
            channel
                .close(200, "outbox: publish abandoned".into())
                .await
                .ok();
        }
    }

    /// Forgets the connection after a connection-level failure: the next publish or probe
    /// connects again.
    async fn reset(&self) {
        self.idle.lock().expect("the idle channels").clear();
        self.open.lock().await.take();
    }
}

/// An AMQP URI that does not read as one, shown without its password (neither the URI nor
/// the reason quoting it: [`outbox_core::redact_url`]).
#[derive(Debug, thiserror::Error)]
#[error("invalid AMQP URI {uri}: {reason}")]
pub struct InvalidUri {
    uri: String,
    reason: String,
}

/// `uri` as lapin reads it (`amqp://user:password@host:port/vhost`, or `amqps://`), read once
/// here so that lapin's own error, which quotes the URI whole, is never shown. A secret in a
/// parameter (`?password=`, or one behind a stray `?`) is refused: lapin reads none, and would
/// connect with its default password instead.
pub(crate) fn parse_uri(uri: &str) -> Result<AMQPUri, InvalidUri> {
    let invalid = |reason: String| InvalidUri {
        uri: outbox_core::redact_url(uri),
        reason: outbox_core::redact_url_in(&reason, uri),
    };
    if let Some(secret) = outbox_core::admin::secret_parameters(uri).first() {
        return Err(invalid(format!(
            "the parameter `{secret}` holds a secret lapin does not read (a password goes in \
             the user-info: `amqp://user:password@host/vhost`): remove it"
        )));
    }
    uri.parse().map_err(invalid)
}

/// Why the sink could not open its connection and confirming channel.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URI does not read as an AMQP URI.
    #[error(transparent)]
    InvalidUri(#[from] InvalidUri),
    /// The broker refused the connection or the channel, or could not be reached.
    #[error("connecting to RabbitMQ failed")]
    Amqp(#[from] lapin::Error),
    /// The connection was not made in time.
    #[error("connecting to RabbitMQ timed out after {0:?}")]
    TimedOut(Duration),
}

/// A new channel on `connection`, in confirm mode.
async fn confirming(connection: &Connection) -> Result<Channel, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

impl RabbitSink {
    /// Connects to `uri` (`amqp://user:password@host:port/vhost`) and publishes to the
    /// default exchange with routing keys `outbox.<category>` (so to the queue of that name),
    /// waiting up to [`DEFAULT_CONFIRM_TIMEOUT`] for each confirm. Fails if the broker cannot
    /// be reached now: a misconfigured address shows at start-up. No error shows the URI's
    /// password.
    pub async fn connect(uri: impl Into<String>) -> Result<Self, ConnectError> {
        let link = Arc::new(Link {
            uri: parse_uri(&uri.into())?,
            timeout: DEFAULT_CONFIRM_TIMEOUT,
            open: tokio::sync::Mutex::new(None),
            idle: std::sync::Mutex::new(Vec::new()),
        });
        link.channel().await?;
        let probed = Arc::clone(&link);
        let breaker = Breaker::new("RabbitMQ", move || {
            let link = Arc::clone(&probed);
            async move { link.channel().await.map(drop).map_err(BoxError::from) }
        });
        Ok(Self {
            link,
            exchange: String::new(),
            prefix: "outbox".to_owned(),
            breaker,
        })
    }

    /// Publishes to `exchange` rather than the default exchange.
    pub fn with_exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// Publishes a category's messages with routing key `<prefix>.<category>` (the category's
    /// name) unless its publisher routes them elsewhere.
    pub fn with_routing_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Publishes `envelope` on `channel`: the future of its confirm.
    async fn send(
        &self,
        channel: &Channel,
        envelope: &Envelope,
    ) -> Result<PublisherConfirm, SinkError> {
        let mut table = FieldTable::default();
        let mut content_type = Cow::Borrowed("application/json");
        for (name, value) in &envelope.headers {
            if name.eq_ignore_ascii_case(headers::CONTENT_TYPE) {
                content_type = Cow::Owned(value.clone());
                continue;
            }
            table.insert(
                ShortString::from(name.as_ref()),
                AMQPValue::LongString(LongString::from(value.as_str())),
            );
        }
        let properties = BasicProperties::default()
            .with_message_id(ShortString::from(envelope.dedup_key.as_str()))
            .with_content_type(ShortString::from(content_type.as_ref()))
            .with_delivery_mode(2)
            .with_headers(table);
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        channel
            .basic_publish(
                ShortString::from(self.exchange.as_str()),
                ShortString::from(envelope.destination.as_str()),
                options,
                &envelope.payload,
                properties,
            )
            .await
            .map_err(|error| self.classify(error))
    }

    /// What the confirm of one message said: its outcome, and a returned message it carried
    /// (which may be another message's, see [`Link`]). Waits at most `wait`.
    async fn confirmed(
        &self,
        confirm: PublisherConfirm,
        wait: Duration,
    ) -> (Result<(), SinkError>, Option<BasicReturnMessage>) {
        let confirmation = match tokio::time::timeout(wait, confirm).await {
            Err(_) => {
                let error = SinkError::Unavailable("RabbitMQ did not confirm in time".into());
                return (Err(error), None);
            }
            Ok(Err(error)) => return (Err(self.classify(error)), None),
            Ok(Ok(confirmation)) => confirmation,
        };
        match confirmation {
            Confirmation::Ack(returned) => (Ok(()), returned),
            Confirmation::Nack(returned) => (
                Err(SinkError::Unavailable(
                    "RabbitMQ could not take the message (negative confirm)".into(),
                )),
                returned,
            ),
            Confirmation::NotRequested => {
                debug!("a channel without confirms: connecting again");
                let error = SinkError::Unavailable("the channel does not confirm publishes".into());
                (Err(error), None)
            }
        }
    }

    /// Publishes `envelopes` in order on a channel of their own, then reads every confirm:
    /// the confirmed prefix ends at the first message that was returned (matched by its
    /// message id, whichever confirm carried it), not confirmed, or not sent. Those confirmed
    /// after a returned one (routed where a queue is bound) are confirmed all the same.
    async fn publish_on_channel(&self, envelopes: Vec<Envelope>) -> Published {
        let channel = match self.link.checkout().await {
            Ok(channel) => channel,
            Err(error) => return Published::new(0, Some(SinkError::Unavailable(Box::new(error)))),
        };
        let mut sent = Vec::with_capacity(envelopes.len());
        let mut unsent = None;
        for envelope in &envelopes {
            match self.send(&channel, envelope).await {
                Ok(confirm) => sent.push(confirm),
                Err(error) => {
                    unsent = Some(error);
                    break;
                }
            }
        }
        let mut outcomes = Vec::with_capacity(sent.len());
        let mut returned = Vec::new();
        let mut failed = false;
        for confirm in sent {
            // After a failure, only the confirms already resolved are read, for the returned
            // messages they carry.
            let wait = if failed {
                Duration::ZERO
            } else {
                self.link.timeout
            };
            let (outcome, carried) = self.confirmed(confirm, wait).await;
            failed |= outcome.is_err();
            returned.extend(carried);
            outcomes.push(outcome);
        }
        let clean = unsent.is_none() && !failed && returned.is_empty();
        let mut outcomes: Vec<Result<(), SinkError>> = envelopes
            .iter()
            .zip(outcomes)
            .map(|(envelope, outcome)| {
                let own = returned.iter().position(|message| {
                    message
                        .properties
                        .message_id()
                        .as_ref()
                        .map(ShortString::as_str)
                        == Some(envelope.dedup_key.as_str())
                });
                match own {
                    Some(at) => Err(self.unroutable(envelope, &returned.swap_remove(at))),
                    None => outcome,
                }
            })
            .collect();
        outcomes.extend(unsent.map(Err));
        self.link.checkin(channel, clean).await;
        Published::from_outcomes(outcomes)
    }

    /// The refusal of `envelope`, which RabbitMQ returned as `returned`.
    fn unroutable(&self, envelope: &Envelope, returned: &BasicReturnMessage) -> SinkError {
        SinkError::Refused(
            format!(
                "unroutable: no queue is bound for routing key `{}` on exchange `{}` ({} {})",
                envelope.destination, self.exchange, returned.reply_code, returned.reply_text
            )
            .into(),
        )
    }

    /// A channel-level error (no such exchange, message too large, access refused) refuses
    /// the message; any other error is an outage.
    fn classify(&self, error: lapin::Error) -> SinkError {
        if error.is_amqp_soft_error() {
            SinkError::Refused(Box::new(error))
        } else {
            SinkError::Unavailable(Box::new(error))
        }
    }
}

impl Sink for RabbitSink {
    async fn publish(&self, envelope: Envelope) -> Result<(), SinkError> {
        self.publish_all(vec![envelope])
            .await
            .error
            .map_or(Ok(()), Err)
    }

    /// Publishes every envelope on a channel of this call's own (RabbitMQ keeps their order
    /// on it), then reads every confirm, matching returned messages by message id.
    async fn publish_all(&self, envelopes: Vec<Envelope>) -> Published {
        let published = self.publish_on_channel(envelopes).await;
        if let Some(SinkError::Unavailable(_)) = &published.error {
            self.link.reset().await;
        }
        published
    }

    fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    fn destination(&self, category: &'static str) -> String {
        format!("{}.{category}", self.prefix)
    }
}
