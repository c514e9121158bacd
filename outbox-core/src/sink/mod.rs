//! Sinks: ready-made handlers that publish each delivery to a broker and wait for its
//! confirmation before the outbox acknowledges.
//!
//! A [`Sink`] is a broker connection (the `outbox-nats`, `outbox-redis`, `outbox-rabbitmq` and
//! `outbox-kafka` crates each provide one). A [`Publisher`] makes it the handler of a category:
//! it maps each delivery to an [`Envelope`] (destination, ordering key, de-duplication key,
//! [`headers`], payload), publishes it, and returns once the broker confirmed it. Register one
//! with [`RegistryBuilder::sink`](crate::RegistryBuilder::sink) (the category's default
//! destination, its stored JSON as the payload) or
//! [`RegistryBuilder::publish`](crate::RegistryBuilder::publish) (a [`Publisher`] configured
//! with its own destination, encoder or de-duplication prefix).
//!
//! Order: the relay hands a sink the consecutive groups of a shard's read at once
//! ([`Sink::publish_all`]); a sink whose broker keeps one connection's order sends them all,
//! in order, before awaiting their confirmations, and the outbox acknowledges them as far as
//! they were confirmed in an unbroken run from the first. One case breaks that run: the broker
//! refuses message N (no stream, unroutable, wrong type) and stores N+1, already sent behind
//! it. The broker's order is broken then, whatever the outbox does; publishing N+1 again would
//! add a duplicate to it. So what the broker confirmed after a refusal
//! ([`Published::confirmed_after`]) is acknowledged too, and N, retried, follows it. Shards are
//! published concurrently, up to the relay's `max_concurrent_shards`.
//!
//! Outages: a sink reports an unreachable broker as [`SinkError::Unavailable`]. That opens
//! its [`Breaker`]: the relay parks the shards that found it open, counts no attempt against
//! them, and drains them again as soon as the breaker's probe finds the broker answering. A
//! message the broker refuses ([`SinkError::Refused`]: too large, no such stream) is a failure
//! of that message: its shard backs off, and its category's dead-letter policy applies.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::SystemTime;

pub use crate::breaker::{Breaker, ProbeDelays, Unavailable};
use crate::categories::Deliverable;
use crate::error::BoxError;
use crate::handler::DeliveryError;
use crate::handler::{
    BoxFuture, Delivery, ErasedHandler, FromRaw, HandlerContext, Pipeline, Pipelined, RawDelivery,
};
use crate::model::{MessageId, ShardKey};

/// The names of the headers (or fields) every sink sends with a message, beside the message's
/// own metadata entries (its trace context: `traceparent`, `tracestate`).
pub mod headers {
    /// The outbox message's id, as decimal digits (after the publisher's de-duplication
    /// prefix, if it has one): the same for every delivery of the message.
    pub const MESSAGE_ID: &str = "Outbox-Message-Id";
    /// The category's name.
    pub const CATEGORY: &str = "Outbox-Category";
    /// The name of the category's scope.
    pub const SCOPE: &str = "Outbox-Scope";
    /// The shard's ordering key (see [`ordering_key`](super::ordering_key)).
    pub const SHARD: &str = "Outbox-Shard";
    /// The object the message is about.
    pub const OBJECT: &str = "Outbox-Object";
    /// When the message was written, RFC 3339 in UTC.
    pub const CREATED_AT: &str = "Outbox-Created-At";
    /// The payload's media type: `application/json` unless an encoder says otherwise.
    pub const CONTENT_TYPE: &str = "Content-Type";

    /// Every header above: what a consumer does not read as the message's metadata.
    pub const ALL: [&str; 7] = [
        MESSAGE_ID,
        CATEGORY,
        SCOPE,
        SHARD,
        OBJECT,
        CREATED_AT,
        CONTENT_TYPE,
    ];
}

/// One message as a sink publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Envelope {
    /// Where it goes: a subject, topic, routing key or stream key.
    pub destination: String,
    /// The ordering key: the shard's ([`ordering_key`]). Kafka's partition key; the others
    /// keep a shard's order on their one connection.
    pub key: String,
    /// The de-duplication key: the outbox message id (behind the publisher's prefix, if
    /// any). A redelivery after a relay crash carries the same one.
    pub dedup_key: String,
    /// The outbox message.
    pub message_id: MessageId,
    /// Its category's name.
    pub category: &'static str,
    /// The headers: those of [`headers`], then the message's metadata entries.
    pub headers: Vec<(Cow<'static, str>, String)>,
    /// The encoded payload: the category's JSON unless the publisher has an encoder.
    pub payload: Vec<u8>,
}

impl Envelope {
    /// The value of header `name`, if it has one.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// The broker did not answer, or the connection to it is down: nothing says the message
    /// is wrong. Opens the sink's breaker.
    #[error("the broker is unavailable")]
    Unavailable(#[source] BoxError),
    /// The broker answered and refused this message (too large, no such stream, not
    /// allowed): a failure of the message, counted towards its category's dead-letter
    /// policy.
    #[error("the broker refused the message")]
    Refused(#[source] BoxError),
}

/// A broker connection that publishes envelopes and waits for their confirmation.
pub trait Sink: Send + Sync + 'static {
    /// Publishes `envelope` and returns once the broker confirmed it (a JetStream ack, a
    /// Kafka delivery report, a RabbitMQ confirm, an `XADD` reply).
    fn publish(&self, envelope: Envelope) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// The breaker in front of the broker: opened by [`SinkError::Unavailable`], closed when
    /// its probe finds the broker answering.
    fn breaker(&self) -> &Breaker;

    /// Where a category's messages go unless the publisher says otherwise.
    fn destination(&self, category: &'static str) -> String;

    /// Publishes `envelopes` (consecutive messages of one shard) in order and waits for their
    /// confirmations: how many of them, from the first, were confirmed, and the error of the
    /// first that was not. A sink whose broker keeps the order of one connection's messages
    /// sends them all before awaiting the first confirmation (pipelining within the shard);
    /// by default they are published one at a time.
    fn publish_all(&self, envelopes: Vec<Envelope>) -> impl Future<Output = Published> + Send {
        one_at_a_time(self, envelopes)
    }
}

/// [`Sink::publish_all`] one envelope at a time: each published and confirmed before the next,
/// stopping at the first that is not.
pub async fn one_at_a_time<K: Sink + ?Sized>(sink: &K, envelopes: Vec<Envelope>) -> Published {
    let mut confirmed = 0;
    for envelope in envelopes {
        if let Err(error) = sink.publish(envelope).await {
            return Published::new(confirmed, Some(error));
        }
        confirmed += 1;
    }
    Published::new(confirmed, None)
}

/// [`Sink::publish_all`] for a client that hands messages to one connection in order and
/// confirms them later: `send` each envelope in turn (stopping at the first that cannot be
/// sent), then `confirm` what was sent, in order. After a refusal the broker is answering, so
/// the rest's confirmations are read too (what it stored after the refused one is
/// [`Published::confirmed_after`]); after an outage they are not waited for.
pub async fn send_then_confirm<T, S, SentFuture, C, ConfirmFuture>(
    envelopes: Vec<Envelope>,
    mut send: S,
    mut confirm: C,
) -> Published
where
    S: FnMut(Envelope) -> SentFuture,
    SentFuture: Future<Output = Result<T, SinkError>>,
    C: FnMut(T) -> ConfirmFuture,
    ConfirmFuture: Future<Output = Result<(), SinkError>>,
{
    let mut sent = Vec::with_capacity(envelopes.len());
    let mut unsent = None;
    for envelope in envelopes {
        match send(envelope).await {
            Ok(pending) => sent.push(pending),
            Err(error) => {
                unsent = Some(error);
                break;
            }
        }
    }
    let mut outcomes = Vec::with_capacity(sent.len() + 1);
    for pending in sent {
        let outcome = confirm(pending).await;
        let outage = matches!(outcome, Err(SinkError::Unavailable(_)));
        outcomes.push(outcome);
        if outage {
            break;
        }
    }
    outcomes.extend(unsent.map(Err));
    Published::from_outcomes(outcomes)
}

/// What [`Sink::publish_all`] got through.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Published {
    /// How many envelopes, from the first, the broker confirmed.
    pub confirmed: usize,
    /// Why the next one was not, if one was not.
    pub error: Option<SinkError>,
    /// The envelopes after the failed one that the broker confirmed all the same, by their
    /// index in the call's envelopes (ascending): a broker that took the run pipelined went on
    /// after refusing one of them. The outbox acknowledges them with the first `confirmed`
    /// and never publishes them again; the failed one, retried, follows them.
    pub confirmed_after: Vec<usize>,
}

impl Published {
    /// `confirmed` envelopes confirmed, then `error` (if any).
    pub fn new(confirmed: usize, error: Option<SinkError>) -> Self {
        Self {
            confirmed,
            error,
            confirmed_after: Vec::new(),
        }
    }

    /// From the outcome of each envelope, in order (as far as they are known): those
    /// confirmed from the first, the first error, and those confirmed after it.
    pub fn from_outcomes(outcomes: impl IntoIterator<Item = Result<(), SinkError>>) -> Self {
        let mut published = Self::default();
        for (index, outcome) in outcomes.into_iter().enumerate() {
            match (outcome, &published.error) {
                (Ok(()), None) => published.confirmed += 1,
                (Ok(()), Some(_)) => published.confirmed_after.push(index),
                (Err(error), None) => published.error = Some(error),
                (Err(_), Some(_)) => {}
            }
        }
        published
    }
}

/// The ordering key of a shard: `scope:identifier`, then `:destination` for a fan-out shard.
pub fn ordering_key(shard: &ShardKey) -> String {
    match &shard.destination {
        None => format!("{}:{}", shard.scope.0, shard.shard_identifier),
        Some(destination) => format!("{}:{}:{destination}", shard.scope.0, shard.shard_identifier),
    }
}

type Route<C> = dyn Fn(&Delivery<C>) -> String + Send + Sync;
type Encode<C> = dyn Fn(&Delivery<C>) -> Result<Vec<u8>, BoxError> + Send + Sync;

/// The handler that publishes category `C`'s deliveries through sink `K`.
///
/// By default a delivery goes to the sink's destination for its category, its payload is
/// the category's JSON as stored, and its de-duplication key is the message id.
pub struct Publisher<C: Deliverable, K> {
    sink: K,
    route: Option<Arc<Route<C>>>,
    encoder: Option<(Cow<'static, str>, Arc<Encode<C>>)>,
    dedup_prefix: String,
    pipelined: bool,
    category: PhantomData<fn() -> C>,
}

impl<C: Deliverable, K> fmt::Debug for Publisher<C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("category", &std::any::type_name::<C>())
            .field("routed", &self.route.is_some())
            .field("content_type", &self.encoder.as_ref().map(|(kind, _)| kind))
            .field("dedup_prefix", &self.dedup_prefix)
            .field("pipelined", &self.pipelined)
            .finish_non_exhaustive()
    }
}

impl<C: Deliverable, K: Sink> Publisher<C, K> {
    /// Publishes through `sink`, with the defaults.
    pub fn new(sink: K) -> Self {
        Self {
            sink,
            route: None,
            encoder: None,
            dedup_prefix: String::new(),
            pipelined: true,
            category: PhantomData,
        }
    }

    /// Sends each delivery where `route` says (a subject, topic, routing key or stream key),
    /// rather than to the sink's destination for its category.
    pub fn to(mut self, route: impl Fn(&Delivery<C>) -> String + Send + Sync + 'static) -> Self {
        self.route = Some(Arc::new(route));
        self
    }

    /// Encodes each delivery's payload with `encode`, sent with media type `content_type`,
    /// rather than as the category's JSON. An encoding error is a failure of that message.
    pub fn encode_with<E>(
        mut self,
        content_type: impl Into<Cow<'static, str>>,
        encode: impl Fn(&Delivery<C>) -> Result<Vec<u8>, E> + Send + Sync + 'static,
    ) -> Self
    where
        E: Into<BoxError>,
    {
        let encode = move |delivery: &Delivery<C>| encode(delivery).map_err(Into::into);
        self.encoder = Some((content_type.into(), Arc::new(encode)));
        self
    }

    /// Puts `prefix` before every de-duplication key: for several outboxes (databases,
    /// regions) publishing to one stream, whose message ids would collide.
    pub fn dedup_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.dedup_prefix = prefix.into();
        self
    }

    /// Publishes a shard's messages one at a time, each once the broker confirmed the one
    /// before, rather than the consecutive messages of a read all at once. A message the
    /// broker refuses then stops its shard before anything behind it is sent, so the broker
    /// holds each shard's messages in order even past a refusal (pipelined, the messages sent
    /// behind a refused one are stored before it). It costs a round trip to the broker per
    /// message.
    pub fn one_at_a_time(mut self) -> Self {
        self.pipelined = false;
        self
    }

    /// The envelope of one delivery.
    fn envelope(
        &self,
        raw: &RawDelivery<'_>,
        delivery: &Delivery<C>,
    ) -> Result<Envelope, BoxError> {
        let (content_type, payload) = match &self.encoder {
            Some((content_type, encode)) => (content_type.clone(), encode(delivery)?),
            None => (
                Cow::Borrowed("application/json"),
                raw.message.payload.as_bytes().to_vec(),
            ),
        };
        let destination = match &self.route {
            Some(route) => route(delivery),
            None => self.sink.destination(raw.category),
        };
        let key = ordering_key(raw.shard);
        let dedup_key = format!("{}{}", self.dedup_prefix, raw.message.id.0);
        let mut headers: Vec<(Cow<'static, str>, String)> = vec![
            (headers::MESSAGE_ID.into(), dedup_key.clone()),
            (headers::CATEGORY.into(), raw.category.to_owned()),
            (headers::SCOPE.into(), raw.scope_name.to_owned()),
            (headers::SHARD.into(), key.clone()),
            (
                headers::OBJECT.into(),
                raw.message.object_identifier.to_string(),
            ),
            (headers::CREATED_AT.into(), rfc3339(raw.message.created_at)),
            (headers::CONTENT_TYPE.into(), content_type.into_owned()),
        ];
        headers.extend(
            delivery
                .metadata
                .iter()
                .map(|(name, value)| (Cow::Owned(name.to_owned()), value.to_owned())),
        );
        Ok(Envelope {
            destination,
            key,
            dedup_key,
            message_id: raw.message.id,
            category: raw.category,
            headers,
            payload,
        })
    }
}

/// `time` as RFC 3339 in UTC, to the microsecond.
fn rfc3339(time: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(time).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

impl<C: Deliverable, K: Sink> Publisher<C, K> {
    /// The error of a delivery whose system is unavailable (its breaker now open).
    fn unavailable(raw: &RawDelivery<'_>, source: Unavailable) -> DeliveryError {
        DeliveryError::Unavailable {
            category: raw.category,
            message_id: raw.message.id,
            source,
        }
    }

    /// A delivery's error when the breaker is open already: nothing is sent.
    fn open(&self, raw: &RawDelivery<'_>) -> DeliveryError {
        Self::unavailable(
            raw,
            Unavailable {
                breaker: self.sink.breaker().clone(),
                source: "its breaker is open: waiting for a probe to find it answering".into(),
            },
        )
    }

    /// A delivery's envelope, or why it has none (a payload that does not read as the
    /// category's fails here, whatever the encoder).
    fn prepare(&self, raw: &RawDelivery<'_>) -> Result<Envelope, DeliveryError> {
        let delivery = Delivery::<C>::from_raw(raw)?;
        self.envelope(raw, &delivery)
            .map_err(|source| DeliveryError::Handler {
                category: raw.category,
                message_id: raw.message.id,
                source,
            })
    }

    /// A publish error as the error of the delivery it was for.
    fn failed(&self, raw: &RawDelivery<'_>, error: SinkError) -> DeliveryError {
        match error {
            SinkError::Unavailable(source) => {
                Self::unavailable(raw, self.sink.breaker().unavailable(source))
            }
            refused => DeliveryError::Handler {
                category: raw.category,
                message_id: raw.message.id,
                source: Box::new(refused),
            },
        }
    }
}

impl<C: Deliverable, K: Sink> Pipeline for Publisher<C, K> {
    fn call_all<'a>(&'a self, deliveries: &'a [RawDelivery<'a>]) -> BoxFuture<'a, Pipelined> {
        Box::pin(async move {
            let Some(first) = deliveries.first() else {
                return Pipelined::default();
            };
            if self.sink.breaker().is_open() {
                return Pipelined::failed(0, self.open(first));
            }
            let mut envelopes = Vec::with_capacity(deliveries.len());
            let mut unprepared = None;
            for (index, raw) in deliveries.iter().enumerate() {
                match self.prepare(raw) {
                    Ok(envelope) => envelopes.push(envelope),
                    Err(error) => {
                        unprepared = Some((index, error));
                        break;
                    }
                }
            }
            let sent = envelopes.len();
            let Published {
                confirmed,
                error,
                confirmed_after,
            } = if envelopes.is_empty() {
                Published::default()
            } else {
                self.sink.publish_all(envelopes).await
            };
            let confirmed = confirmed.min(sent);
            match (error, unprepared) {
                (Some(error), _) => {
                    let mut failed =
                        Pipelined::failed(confirmed, self.failed(&deliveries[confirmed], error));
                    failed.confirmed_after = confirmed_after
                        .into_iter()
                        .filter(|&index| index > confirmed && index < sent)
                        .collect();
                    failed
                }
                (None, _) if confirmed < sent => Pipelined::failed(
                    confirmed,
                    self.failed(
                        &deliveries[confirmed],
                        SinkError::Unavailable(
                            "the sink confirmed fewer messages than it was given".into(),
                        ),
                    ),
                ),
                (None, Some((index, error))) => Pipelined::failed(index, error),
                (None, None) => Pipelined {
                    confirmed,
                    ..Pipelined::default()
                },
            }
        })
    }
}

impl<C: Deliverable, K: Sink> ErasedHandler for Publisher<C, K> {
    fn pipeline(&self) -> Option<&dyn Pipeline> {
        self.pipelined.then_some(self as &dyn Pipeline)
    }

    fn call<'a>(
        &'a self,
        raw: RawDelivery<'a>,
        _cx: &'a mut HandlerContext<'_>,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let envelope = self.prepare(&raw)?;
            if self.sink.breaker().is_open() {
                return Err(self.open(&raw));
            }
            self.sink
                .publish(envelope)
                .await
                .map_err(|error| self.failed(&raw, error))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    fn envelopes(count: i64) -> Vec<Envelope> {
        (1..=count)
            .map(|id| Envelope {
                destination: "outbox.test".into(),
                key: "1:1".into(),
                dedup_key: id.to_string(),
                message_id: MessageId(id),
                category: "test",
                headers: Vec::new(),
                payload: Vec::new(),
            })
            .collect()
    }

    /// Publishes five envelopes whose confirmations are `outcome(id)`: what got through, and
    /// the ids whose confirmation was awaited.
    async fn confirming(
        outcome: impl Fn(i64) -> Result<(), SinkError>,
        unsendable: Option<i64>,
    ) -> (Published, Vec<i64>) {
        let awaited = RefCell::new(Vec::new());
        let send = |envelope: Envelope| {
            let id = envelope.message_id.0;
            std::future::ready(match unsendable {
                Some(refused) if refused == id => Err(SinkError::Refused("too large".into())),
                _ => Ok(id),
            })
        };
        let confirm = |id: i64| {
            awaited.borrow_mut().push(id);
            std::future::ready(outcome(id))
        };
        let published = send_then_confirm(envelopes(5), send, confirm).await;
        (published, awaited.into_inner())
    }

    #[tokio::test]
    async fn confirmations_after_a_refusal_are_read_and_reported() {
        let (published, awaited) = confirming(
            |id| match id {
                3 => Err(SinkError::Refused("no stream".into())),
                _ => Ok(()),
            },
            None,
        )
        .await;
        assert_eq!(published.confirmed, 2);
        assert!(matches!(published.error, Some(SinkError::Refused(_))));
        assert_eq!(
            published.confirmed_after,
            [3, 4],
            "the fourth and fifth, by index"
        );
        assert_eq!(awaited, [1, 2, 3, 4, 5]);
    }

    #[tokio::test]
    async fn confirmations_after_an_outage_are_not_awaited() {
        let (published, awaited) = confirming(
            |id| match id {
                2 => Err(SinkError::Unavailable("timed out".into())),
                _ => Ok(()),
            },
            None,
        )
        .await;
        assert_eq!(published.confirmed, 1);
        assert!(matches!(published.error, Some(SinkError::Unavailable(_))));
        assert!(published.confirmed_after.is_empty());
        assert_eq!(awaited, [1, 2], "nothing waited for after the outage");
    }

    #[tokio::test]
    async fn a_message_that_cannot_be_sent_ends_the_run() {
        let (published, awaited) = confirming(|_| Ok(()), Some(4)).await;
        assert_eq!(published.confirmed, 3);
        assert!(matches!(published.error, Some(SinkError::Refused(_))));
        assert!(
            published.confirmed_after.is_empty(),
            "nothing sent after it"
        );
        assert_eq!(awaited, [1, 2, 3]);
    }

    #[test]
    fn outcomes_make_the_prefix_the_error_and_what_follows() {
        let published = Published::from_outcomes([
            Ok(()),
            Err(SinkError::Refused("first".into())),
            Err(SinkError::Refused("second".into())),
            Ok(()),
        ]);
        assert_eq!(published.confirmed, 1);
        let error = published.error.expect("an error");
        assert_eq!(
            std::error::Error::source(&error).map(ToString::to_string),
            Some("first".to_owned()),
            "the first error is the run's"
        );
        assert_eq!(published.confirmed_after, [3]);
    }
}
