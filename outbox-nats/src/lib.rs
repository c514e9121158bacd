//! A NATS JetStream sink for the `outbox` transactional outbox framework.
//!
//! [`NatsSink`] publishes each delivery to a JetStream subject and returns once the stream
//! acknowledged it, so the outbox deletes a message only after JetStream stored it. The
//! outbox message id travels as `Nats-Msg-Id`: a redelivery after a relay crash, within the
//! stream's duplicate window, is recognised by JetStream and stored once. The other
//! [`headers`](outbox_core::sink::headers) carry the category, scope, shard, object, creation
//! time and the producer's trace context.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_core::Registry;
//! use outbox_nats::NatsSink;
//! # #[derive(Debug)] struct Org;
//! # impl outbox_core::Scope for Org { const ID: outbox_core::ScopeId = outbox_core::ScopeId(1); const NAME: &'static str = "org"; }
//! # #[derive(Debug)] struct OrderPlaced;
//! # impl outbox_core::Category for OrderPlaced { type Scope = Org; type Payload = String; const ID: outbox_core::CategoryId = outbox_core::CategoryId(1); const NAME: &'static str = "order_placed"; }
//!
//! let client = outbox_nats::connect("nats://127.0.0.1:4222", async_nats::ConnectOptions::new()).await?;
//! // Subjects `orders.<category>`: a stream capturing `orders.>` stores them.
//! let sink = NatsSink::new(client).with_subject_prefix("orders");
//! let registry = Registry::builder().sink::<OrderPlaced, _>(sink).build()?;
//! # let _ = registry;
//! # Ok(())
//! # }
//! ```
//!
//! Errors: no stream for the subject, or a message larger than the server's `max_payload`,
//! is a [refusal](SinkError::Refused) of that message (its shard backs off). A connection
//! that is down, or an ack that does not come within the ack timeout, is an
//! [outage](SinkError::Unavailable): the sink's breaker opens, the relay parks the shards and
//! resumes them once JetStream answers its probe (a request to its account-info API).
//!
//! **Connecting.** [`connect`] opens the client from a URL with its credentials handed to the
//! client as options: `async_nats` logs each server address it tries, at `debug`, and a
//! password left in the address would reach the service's log.
//!
//! **Consuming.** [`NatsConsumer`] is a JetStream durable pull consumer that applies each
//! message through an outbox [`Consumer`](outbox_core::inbox::Consumer) (its inbox and the
//! producer's handlers) and acknowledges the broker only after the consumer's transaction
//! committed: a message delivered again is found in the inbox and applied once.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;
mod consumer;

pub use crate::connect::{ConnectError, connect};
pub use crate::consumer::{
    ConsumeError, DEFAULT_ACK_WAIT, DEFAULT_BATCH, DEFAULT_MAX_ACK_PENDING, NatsConsumer,
};

use std::time::Duration;

use async_nats::connection::State;
use async_nats::header::{HeaderMap, NATS_MESSAGE_ID};
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::{self};
use outbox_core::BoxError;
use outbox_core::sink::{Breaker, Envelope, Published, Sink, SinkError, send_then_confirm};
use tracing::debug;

/// How long a publish waits for its JetStream ack by default.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// A [`Sink`] publishing to NATS JetStream. Cheap to clone; clones share the connection and
/// the breaker.
#[derive(Debug, Clone)]
pub struct NatsSink {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    prefix: String,
    breaker: Breaker,
}

impl NatsSink {
    /// A sink publishing through `client` to subjects `outbox.<category>`, waiting up to
    /// [`DEFAULT_ACK_TIMEOUT`] for each ack.
    pub fn new(client: async_nats::Client) -> Self {
        Self::with_ack_timeout_of(client, "outbox".to_owned(), DEFAULT_ACK_TIMEOUT)
    }

    fn with_ack_timeout_of(client: async_nats::Client, prefix: String, timeout: Duration) -> Self {
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(timeout)
            .build(client.clone());
        let probed = client.clone();
        let breaker = Breaker::new("NATS JetStream", move || {
            let client = probed.clone();
            async move { probe(&client, timeout).await }
        });
        Self {
            client,
            jetstream,
            prefix,
            breaker,
        }
    }

    /// Publishes a category's messages to `<prefix>.<category>` (the category's name) unless
    /// its publisher routes them elsewhere.
    pub fn with_subject_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Waits up to `timeout` for each publish's ack before calling JetStream unavailable.
    pub fn with_ack_timeout(self, timeout: Duration) -> Self {
        Self::with_ack_timeout_of(self.client, self.prefix, timeout)
    }

    /// The client it publishes through.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }
}

/// Whether JetStream answers: the connection is up and JetStream's account-info API replies
/// (whatever it replies: the reply's shape differs between server versions).
async fn probe(client: &async_nats::Client, timeout: Duration) -> Result<(), BoxError> {
    if client.connection_state() != State::Connected {
        return Err("not connected to NATS".into());
    }
    let request = client.request("$JS.API.INFO", Vec::new().into());
    tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| "JetStream did not answer in time")??;
    Ok(())
}

impl NatsSink {
    /// Sends `envelope` on the connection: the future of its ack.
    async fn send(&self, envelope: Envelope) -> Result<PublishAckFuture, SinkError> {
        let mut headers = HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, envelope.dedup_key.as_str());
        for (name, value) in &envelope.headers {
            headers.insert(name.as_ref(), value.as_str());
        }
        self.jetstream
            .publish_with_headers(envelope.destination, headers, envelope.payload.into())
            .await
            .map_err(classify)
    }

    fn connected(&self) -> Result<(), SinkError> {
        if self.client.connection_state() == State::Connected {
            Ok(())
        } else {
            Err(SinkError::Unavailable("not connected to NATS".into()))
        }
    }
}

/// Waits for a publish's ack.
async fn acked(ack: PublishAckFuture) -> Result<(), SinkError> {
    let ack = ack.await.map_err(classify)?;
    if ack.duplicate {
        debug!(stream = %ack.stream, sequence = ack.sequence, "JetStream already held this message: a redelivery");
    }
    Ok(())
}

impl Sink for NatsSink {
    async fn publish(&self, envelope: Envelope) -> Result<(), SinkError> {
        self.connected()?;
        acked(self.send(envelope).await?).await
    }

    /// Sends every envelope on the one connection (NATS keeps their order), then waits for
    /// the acks in order.
    async fn publish_all(&self, envelopes: Vec<Envelope>) -> Published {
        if let Err(error) = self.connected() {
            return Published::new(0, Some(error));
        }
        send_then_confirm(envelopes, |envelope| self.send(envelope), acked).await
    }

    fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    fn destination(&self, category: &'static str) -> String {
        format!("{}.{category}", self.prefix)
    }
}

/// A publish error as an outage or a refusal of the message.
fn classify(error: jetstream::context::PublishError) -> SinkError {
    match error.kind() {
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::MaxAckPending => SinkError::Unavailable(Box::new(error)),
        PublishErrorKind::Other if temporarily_unavailable(&error) => {
            SinkError::Unavailable(Box::new(error))
        }
        _ => SinkError::Refused(Box::new(error)),
    }
}

/// Whether JetStream answered that it is temporarily unavailable (HTTP-like code 503: no
/// quorum, a stream leader being elected).
fn temporarily_unavailable(error: &jetstream::context::PublishError) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<jetstream::Error>())
        .is_some_and(|api| api.code() == 503)
}
