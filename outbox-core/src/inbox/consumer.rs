//! Consumers: a broker's messages applied through an [`Inbox`], effectively once.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tracing::{Instrument, debug, error, warn};

use super::{Inbox, Received};
use crate::catalog::Catalog;
use crate::categories::Deliverable;
use crate::error::{Error, error_chain};
use crate::future::BoxFuture;
use crate::handler::{
    Delivery, DeliveryError, ErasedHandler, Handler, HandlerContext, RawDelivery, Requirements,
    StateMap, erase,
};
use crate::metadata::Metadata;
use crate::model::{CategoryIdentity, MessageId, ShardKey};
use crate::relay::Backoff;
use crate::sink::headers;
use crate::store::StoredMessage;
use crate::telemetry;

/// How many times a handler may fail on one message before it is a dead letter, by default.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// How often [`Consumer::process`] calls its keep-alive while it waits to retry.
pub const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);

/// How often, at most, a consumer with a retention purges its old inbox records.
const PURGE_EVERY: Duration = Duration::from_secs(60);

/// A message as a broker handed it to a consumer: its headers (or fields), its payload, and
/// how many times the broker has delivered it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Incoming {
    /// The headers the sink sent ([`headers`]) and the message's metadata entries, without
    /// the broker's own.
    pub headers: Vec<(String, String)>,
    /// The payload: the category's JSON.
    pub payload: Vec<u8>,
    /// How many times the broker has delivered it, this time included (1 the first time; 0
    /// when the broker does not say).
    pub delivered: u32,
}

impl Incoming {
    /// A message with `payload` and no headers, delivered for the `delivered`-th time.
    pub fn new(payload: impl Into<Vec<u8>>, delivered: u32) -> Self {
        Self {
            headers: Vec::new(),
            payload: payload.into(),
            delivered,
        }
    }

    /// This message with header `name` set to `value`.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The value of header `name` (compared without case), if it has one.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

impl From<&crate::sink::Envelope> for Incoming {
    /// What a broker hands over of `envelope`, delivered for the first time.
    fn from(envelope: &crate::sink::Envelope) -> Self {
        Self {
            headers: envelope
                .headers
                .iter()
                .map(|(name, value)| (name.clone().into_owned(), value.clone()))
                .collect(),
            payload: envelope.payload.clone(),
            delivered: 1,
        }
    }
}

/// Why an incoming message could not be decoded: it is a dead letter at once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Undecodable {
    /// A header every outbox message carries is missing.
    #[error("the message has no `{0}` header: it was not published by an outbox sink")]
    MissingHeader(&'static str),
    /// A header does not read.
    #[error("header `{header}` does not read: `{value}`")]
    BadHeader {
        /// The header's name.
        header: &'static str,
        /// Its value.
        value: String,
    },
    /// No handler of the consumer takes the message's category.
    #[error("no handler of this consumer takes category `{0}`")]
    UnknownCategory(String),
    /// The payload is not UTF-8 text (the publisher encoded it otherwise than as JSON).
    #[error("the payload is not UTF-8 JSON text")]
    NotText(#[source] std::str::Utf8Error),
}

/// How [`Consumer::process`] settled a message: the broker may now acknowledge it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "acknowledge the broker once the message is settled"]
pub enum Settled {
    /// Applied: the handler's effect and the inbox record committed.
    Applied,
    /// Applied before: nothing was done.
    Duplicate,
    /// A dead letter, recorded in `outbox_inbox_dead_letters`.
    DeadLettered,
}

/// What a broker's consumer loop settled before it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumeReport {
    /// Messages applied.
    pub applied: u64,
    /// Messages found applied already.
    pub duplicates: u64,
    /// Messages recorded as dead letters.
    pub dead_lettered: u64,
}

impl ConsumeReport {
    /// Counts one settled message.
    pub fn count(&mut self, settled: Settled) {
        match settled {
            Settled::Applied => self.applied += 1,
            Settled::Duplicate => self.duplicates += 1,
            Settled::DeadLettered => self.dead_lettered += 1,
        }
    }
}

/// A dead letter of a consumer, as [`InboxTransaction::dead_letter`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxDeadLetter<'a> {
    /// The consumer.
    pub consumer: &'a str,
    /// The outbox message id, if the message had one that reads.
    pub message_id: Option<MessageId>,
    /// The category's name, if the message had one.
    pub category: Option<&'a str>,
    /// The headers, as a JSON object.
    pub headers: String,
    /// The payload, as received.
    pub payload: &'a [u8],
    /// The error, with its causes.
    pub error: String,
    /// How many attempts failed (0 for a message that could not be decoded).
    pub attempts: u32,
}

/// A dead letter as [`InboxDatabase::dead_letters`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredInboxDeadLetter {
    /// Its id in `outbox_inbox_dead_letters`.
    pub id: i64,
    /// The consumer.
    pub consumer: String,
    /// The outbox message id, if the message had one that reads.
    pub message_id: Option<MessageId>,
    /// The category's name, if the message had one.
    pub category: Option<String>,
    /// The headers, as a JSON object.
    pub headers: String,
    /// The payload, as received.
    pub payload: Vec<u8>,
    /// The error, with its causes.
    pub error: String,
    /// How many attempts failed (0 for a message that could not be decoded).
    pub attempts: u32,
    /// When it was recorded.
    pub failed_at: SystemTime,
}

impl StoredInboxDeadLetter {
    /// A stored dead letter (what a backend reads).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: i64,
        consumer: String,
        message_id: Option<MessageId>,
        category: Option<String>,
        headers: String,
        payload: Vec<u8>,
        error: String,
        attempts: u32,
        failed_at: SystemTime,
    ) -> Self {
        Self {
            id,
            consumer,
            message_id,
            category,
            headers,
            payload,
            error,
            attempts,
            failed_at,
        }
    }
}

/// A consumer's database: where its inbox and its handlers' effects are, one transaction per
/// message. The backends implement it for their store (`PgStore`, `SqliteStore`).
pub trait InboxDatabase: Send + Sync + 'static {
    /// Opens a transaction.
    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn InboxTransaction>, Error>>;

    /// Deletes the inbox records older than `age`, of `consumer` or of every consumer;
    /// returns how many.
    fn purge_inbox<'a>(
        &'a self,
        consumer: Option<&'a str>,
        age: Duration,
    ) -> BoxFuture<'a, Result<u64, Error>>;

    /// The dead letters of `consumer` (of every consumer if `None`), oldest first, up to
    /// `limit`.
    fn dead_letters<'a>(
        &'a self,
        consumer: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<StoredInboxDeadLetter>, Error>>;
}

/// One open transaction of an [`InboxDatabase`]. Dropped without [`commit`](Self::commit),
/// it rolls back.
pub trait InboxTransaction: Send {
    /// Records `message` for `consumer` unless it is recorded; returns whether it was new.
    /// Waits while another open transaction has recorded it.
    fn record<'a>(
        &'a mut self,
        consumer: &'a str,
        message: MessageId,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Deletes `consumer`'s records older than `age`; returns how many.
    fn purge<'a>(
        &'a mut self,
        consumer: &'a str,
        age: Duration,
    ) -> BoxFuture<'a, Result<u64, Error>>;

    /// Records a dead letter.
    fn dead_letter<'a>(
        &'a mut self,
        letter: &'a InboxDeadLetter<'a>,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// The transaction's connection, as handlers take it
    /// ([`Connection<'_, T>`](crate::Connection)).
    fn connection(&mut self) -> &mut (dyn Any + Send);

    /// Commits.
    fn commit(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>>;
}

/// Why a [`Consumer`] cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerProblem {
    /// No handler was given.
    #[error("consumer `{0}` has no handler")]
    NoHandler(String),
    /// Two handlers take one category.
    #[error("category `{0}` has two handlers")]
    HandledTwice(&'static str),
    /// A handler takes a state nobody gave.
    #[error(
        "the handler of category `{category}` takes `State<{state_type}>`, and no such value was given to `ConsumerBuilder::state`"
    )]
    MissingState {
        /// The category.
        category: &'static str,
        /// The state's type.
        state_type: &'static str,
    },
}

/// Every problem found building a [`Consumer`].
#[derive(Debug, thiserror::Error)]
#[error("the consumer cannot be built: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ConsumerError(pub Vec<ConsumerProblem>);

/// One category's handler.
struct Route {
    identity: CategoryIdentity,
    handler: Arc<dyn ErasedHandler>,
}

/// Runs broker messages through handlers and an [`Inbox`], effectively once. Cheap to clone.
///
/// Each broker crate's consumer loop (`outbox_nats::NatsConsumer`, ...) runs the messages it
/// reads through [`process`](Self::process). For one message it opens a transaction on the
/// consumer's database, records the message in the inbox and, the first time, decodes it into
/// the [`Delivery<C>`] of the category the producer declared and runs the category's
/// [`Handler`] in that transaction: the effect and the record commit together. The loop
/// acknowledges the broker only once the message is [`Settled`], after the commit: a crash
/// in between delivers the message again, and the inbox finds it applied.
///
/// Handlers are the relay's: an `#[outbox_handler]` fn or a closure taking a [`Delivery<C>`],
/// then [`State<T>`](crate::State)s and the transaction's
/// [`Connection<'_, T>`](crate::Connection) (`sqlx::PgConnection`, `sqlx::SqliteConnection`).
/// A delivery's `attempt` counts the broker's deliveries and the retries in place; its
/// `fencing_token` is 0 (a consumer holds no lease).
///
/// Failures: a handler that fails is retried in place after the consumer's [`Backoff`] (the
/// broker's order is kept: the next message waits); once it has failed on its
/// [`max_attempts`](ConsumerBuilder::max_attempts)-th attempt, the message is a *dead
/// letter*: recorded with its error in `outbox_inbox_dead_letters`, and in the inbox (so
/// that the broker's next delivery of it is a duplicate), then acknowledged. A message that
/// cannot be decoded (no message id, a category no handler takes, a payload that does not
/// read as the category's) is a dead letter at once. A database that is unavailable is
/// waited for, with the same backoff, and counts no attempt.
#[derive(Clone)]
pub struct Consumer {
    inner: Arc<Inner>,
}

struct Inner {
    inbox: Inbox,
    database: Arc<dyn InboxDatabase>,
    routes: HashMap<&'static str, Route>,
    state: StateMap,
    backoff: Backoff,
    max_attempts: u32,
    dedup_prefix: String,
    retention: Option<Duration>,
    /// When the inbox was last purged.
    purged: Mutex<Option<tokio::time::Instant>>,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut categories: Vec<_> = self.inner.routes.keys().collect();
        categories.sort();
        f.debug_struct("Consumer")
            .field("consumer", &self.inner.inbox.consumer())
            .field("categories", &categories)
            .field("max_attempts", &self.inner.max_attempts)
            .field("retention", &self.inner.retention)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Consumer`]: its handlers, their state, its retry policy.
pub struct ConsumerBuilder {
    inbox: Inbox,
    database: Arc<dyn InboxDatabase>,
    routes: HashMap<&'static str, Route>,
    requirements: Vec<(&'static str, Requirements)>,
    duplicates: Vec<&'static str>,
    state: StateMap,
    backoff: Backoff,
    max_attempts: u32,
    dedup_prefix: String,
    retention: Option<Duration>,
}

impl fmt::Debug for ConsumerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("consumer", &self.inbox.consumer())
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// A consumer recording in `inbox`, on `database`: the consumer's own, which holds the
    /// inbox's table (the outbox migrations) and the handlers' effects.
    pub fn builder(inbox: Inbox, database: impl InboxDatabase) -> ConsumerBuilder {
        ConsumerBuilder {
            inbox,
            database: Arc::new(database),
            routes: HashMap::new(),
            requirements: Vec::new(),
            duplicates: Vec::new(),
            state: StateMap::default(),
            backoff: Backoff::default(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            dedup_prefix: String::new(),
            retention: None,
        }
    }

    /// The consumer's inbox.
    pub fn inbox(&self) -> &Inbox {
        &self.inner.inbox
    }

    /// Records how many messages the broker holds for this consumer, not yet delivered
    /// ([`INBOX_LAG`](crate::telemetry::INBOX_LAG)): broker loops call it where their broker
    /// says.
    pub fn record_lag(&self, pending: u64) {
        telemetry::record_consumer_lag(self.inner.inbox.consumer(), pending);
    }
}

impl ConsumerBuilder {
    /// Handles category `C`'s messages (each of a category enum's) with `handler`.
    pub fn handle<C: Deliverable, H: Handler<Delivery<C>>>(mut self, handler: H) -> Self {
        let mut requirements = Requirements::default();
        handler.requires(&mut requirements);
        let handler: Arc<dyn ErasedHandler> = Arc::new(erase::<Delivery<C>, H>(handler));
        for identity in C::categories() {
            self.requirements
                .push((identity.name, requirements.clone()));
            let route = Route {
                identity,
                handler: Arc::clone(&handler),
            };
            if self.routes.insert(identity.name, route).is_some() {
                self.duplicates.push(identity.name);
            }
        }
        self
    }

    /// Gives handlers a value they take as [`State<T>`](crate::State).
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.state.insert(value);
        self
    }

    /// Waits after a failed attempt as `backoff` says (default: 2 s doubling to 1 h, with
    /// jitter). The broker's next message waits meanwhile.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Makes a message a dead letter once a handler has failed on its `attempts`-th attempt
    /// (default [`DEFAULT_MAX_ATTEMPTS`]; at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Reads message ids behind `prefix`: the
    /// [de-duplication prefix](crate::sink::Publisher::dedup_prefix) of the producer's
    /// publisher.
    pub fn dedup_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.dedup_prefix = prefix.into();
        self
    }

    /// Purges the inbox's records older than `window` as it goes (at most once a minute,
    /// after a message). A message delivered again after its record is gone is applied
    /// again: `window` must exceed the longest redelivery (the relay's retries, an outage, a
    /// replay of dead letters). Without it, records are kept until purged otherwise
    /// ([`Inbox::purge_older_than`], the `outbox` command's `inbox purge`).
    pub fn retention(mut self, window: Duration) -> Self {
        self.retention = Some(window);
        self
    }

    /// The consumer, or every problem found: no handler, a category handled twice, a state
    /// a handler takes that was not given.
    pub fn build(self) -> Result<Consumer, ConsumerError> {
        let mut problems = Vec::new();
        if self.routes.is_empty() {
            problems.push(ConsumerProblem::NoHandler(self.inbox.consumer().to_owned()));
        }
        problems.extend(
            self.duplicates
                .into_iter()
                .map(ConsumerProblem::HandledTwice),
        );
        for (category, requirements) in &self.requirements {
            for (type_id, state_type) in requirements.states() {
                if !self.state.contains(type_id) {
                    problems.push(ConsumerProblem::MissingState {
                        category,
                        state_type,
                    });
                }
            }
        }
        if !problems.is_empty() {
            return Err(ConsumerError(problems));
        }
        Ok(Consumer {
            inner: Arc::new(Inner {
                inbox: self.inbox,
                database: self.database,
                routes: self.routes,
                state: self.state,
                backoff: self.backoff,
                max_attempts: self.max_attempts,
                dedup_prefix: self.dedup_prefix,
                retention: self.retention,
                purged: Mutex::new(None),
            }),
        })
    }
}

/// A message decoded as far as its handler takes it over: for which route, of which shard.
struct Decoded<'r> {
    route: &'r Route,
    shard: ShardKey,
    message: StoredMessage,
    /// The producer's trace context is read from it.
    #[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
    metadata: Metadata,
}

/// What one attempt came to.
enum Attempt {
    Settled(Settled),
    /// The handler failed, or its delivery did not decode.
    Failed(DeliveryError),
    /// The database failed: nothing is known of the message.
    Unavailable(Error),
}

/// The stop signal [`Consumer::process`] watches, pinned.
type Stop<'s, S> = Pin<&'s mut S>;

impl Consumer {
    /// Settles `incoming`: applies it once, through the inbox, retrying a failing handler (or
    /// waiting for an unavailable database) in place; returns once the broker may
    /// acknowledge it. While it waits to retry it calls `keep_alive` every
    /// [`KEEP_ALIVE_EVERY`] (to tell the broker the message is still being worked on), and it
    /// returns `None` as soon as `stop` resolves during a wait: leave the message
    /// unacknowledged, the broker delivers it again.
    ///
    /// Cancel-safe: dropped at any point, it rolls back what it had not committed, and the
    /// broker delivers the message again.
    pub async fn process<K, KF, S>(
        &self,
        incoming: &Incoming,
        mut keep_alive: K,
        stop: S,
    ) -> Option<Settled>
    where
        K: FnMut() -> KF,
        KF: Future<Output = ()>,
        S: Future<Output = ()>,
    {
        let mut stop = std::pin::pin!(stop);
        let settled = match self.decode(incoming) {
            Ok(decoded) => {
                self.apply(incoming, &decoded, &mut keep_alive, &mut stop)
                    .await?
            }
            Err(problem) => {
                let category = incoming.header(headers::CATEGORY);
                let message_id = self.message_id(incoming).ok();
                let burial = Burial {
                    message_id,
                    category,
                    problem: &problem,
                    attempts: 0,
                };
                self.bury(incoming, burial, &mut keep_alive, &mut stop)
                    .await?
            }
        };
        self.purge_if_due().await;
        Some(settled)
    }

    /// Applies a decoded message, retrying its handler.
    async fn apply<K, KF, S>(
        &self,
        incoming: &Incoming,
        decoded: &Decoded<'_>,
        keep_alive: &mut K,
        stop: &mut Stop<'_, S>,
    ) -> Option<Settled>
    where
        K: FnMut() -> KF,
        KF: Future<Output = ()>,
        S: Future<Output = ()>,
    {
        let inner = &*self.inner;
        let consumer = inner.inbox.consumer();
        let category = decoded.route.identity.name;
        let message_id = decoded.message.id;
        let mut attempt = incoming.delivered.max(1);
        let mut outages = 0;
        loop {
            let span = tracing::info_span!(
                "outbox.consume",
                consumer,
                category,
                message_id = message_id.0,
                attempt,
            );
            #[cfg(feature = "opentelemetry")]
            crate::trace::relate(&span, &decoded.metadata, crate::trace::TraceRelation::Link);
            let wait = match self.attempt(decoded, attempt).instrument(span).await {
                Attempt::Settled(settled) => return Some(settled),
                Attempt::Failed(failure) => {
                    telemetry::record_consumer_failure(consumer, category);
                    // A delivery that does not decode fails the same way every time.
                    let undecodable = !matches!(failure, DeliveryError::Handler { .. });
                    if undecodable || attempt >= inner.max_attempts {
                        let burial = Burial {
                            message_id: Some(message_id),
                            category: Some(category),
                            problem: &failure,
                            attempts: attempt,
                        };
                        return self.bury(incoming, burial, keep_alive, stop).await;
                    }
                    let wait = inner.backoff.delay(attempt);
                    warn!(
                        consumer,
                        category,
                        message_id = message_id.0,
                        attempt,
                        retry_in = ?wait,
                        error = %error_chain(&failure),
                        "a consumer's handler failed; retrying",
                    );
                    attempt += 1;
                    wait
                }
                Attempt::Unavailable(failure) => {
                    outages += 1;
                    let wait = inner.backoff.delay(outages);
                    warn!(
                        consumer,
                        category,
                        message_id = message_id.0,
                        retry_in = ?wait,
                        error = %error_chain(&failure),
                        "a consumer's database is unavailable; waiting",
                    );
                    wait
                }
            };
            if !wait_keeping_alive(wait, keep_alive, stop).await {
                return None;
            }
        }
    }

    /// The message's id, behind the consumer's de-duplication prefix.
    fn message_id(&self, incoming: &Incoming) -> Result<MessageId, Undecodable> {
        let text = incoming
            .header(headers::MESSAGE_ID)
            .ok_or(Undecodable::MissingHeader(headers::MESSAGE_ID))?;
        text.strip_prefix(self.inner.dedup_prefix.as_str())
            .and_then(|digits| digits.parse().ok())
            .map(MessageId)
            .ok_or_else(|| Undecodable::BadHeader {
                header: headers::MESSAGE_ID,
                value: text.to_owned(),
            })
    }

    /// Reads what the handler needs from `incoming`'s headers; the payload is decoded with
    /// the delivery, as the relay decodes it.
    fn decode(&self, incoming: &Incoming) -> Result<Decoded<'_>, Undecodable> {
        let id = self.message_id(incoming)?;
        let required = |name: &'static str| {
            incoming
                .header(name)
                .ok_or(Undecodable::MissingHeader(name))
        };
        let bad = |header: &'static str, value: &str| Undecodable::BadHeader {
            header,
            value: value.to_owned(),
        };
        let category = required(headers::CATEGORY)?;
        let route = self
            .inner
            .routes
            .get(category)
            .ok_or_else(|| Undecodable::UnknownCategory(category.to_owned()))?;
        let shard = required(headers::SHARD)?;
        // The sink's ordering key is a shard as an operator writes it, its scope a number.
        let shard = Catalog::empty()
            .read_shard(shard)
            .map_err(|_| bad(headers::SHARD, shard))?;
        let object = required(headers::OBJECT)?;
        let object_identifier = object.parse().map_err(|_| bad(headers::OBJECT, object))?;
        let created = required(headers::CREATED_AT)?;
        let created_at = chrono::DateTime::parse_from_rfc3339(created)
            .map(SystemTime::from)
            .map_err(|_| bad(headers::CREATED_AT, created))?;
        let payload = std::str::from_utf8(&incoming.payload)
            .map_err(Undecodable::NotText)?
            .to_owned();
        let mut metadata = Metadata::new();
        for (name, value) in &incoming.headers {
            if !headers::ALL
                .iter()
                .any(|known| known.eq_ignore_ascii_case(name))
            {
                metadata.insert(name.clone(), value.clone());
            }
        }
        Ok(Decoded {
            route,
            shard,
            message: StoredMessage {
                id,
                category: route.identity.id,
                scope: route.identity.scope,
                object_identifier,
                payload,
                created_at,
                metadata: metadata.to_json(),
            },
            metadata,
        })
    }

    /// One attempt: a transaction recording the message and, the first time, running its
    /// handler.
    async fn attempt(&self, decoded: &Decoded<'_>, attempt: u32) -> Attempt {
        let inner = &*self.inner;
        let mut transaction = match inner.database.begin().await {
            Ok(transaction) => transaction,
            Err(error) => return Attempt::Unavailable(error),
        };
        match inner
            .inbox
            .receive(transaction.as_mut(), decoded.message.id)
            .await
        {
            Ok(Received::First) => {}
            Ok(Received::Duplicate) => {
                debug!("applied before: a duplicate");
                return Attempt::Settled(Settled::Duplicate);
            }
            Err(error) => return Attempt::Unavailable(error),
        }
        let raw = RawDelivery {
            category: decoded.route.identity.name,
            scope_name: decoded.route.identity.scope_name,
            shard: &decoded.shard,
            message: &decoded.message,
            attempt,
            fencing_token: 0,
            row: None,
        };
        let handled = {
            let mut cx = HandlerContext::new(Some(transaction.connection()), &inner.state);
            decoded.route.handler.call(raw, &mut cx).await
        };
        if let Err(failure) = handled {
            return Attempt::Failed(failure);
        }
        match transaction.commit().await {
            Ok(()) => Attempt::Settled(Settled::Applied),
            Err(error) => Attempt::Unavailable(error),
        }
    }

    /// Records `incoming` as a dead letter (and in the inbox, if it has an id), waiting for
    /// the database while it is unavailable.
    async fn bury<K, KF, S>(
        &self,
        incoming: &Incoming,
        burial: Burial<'_>,
        keep_alive: &mut K,
        stop: &mut Stop<'_, S>,
    ) -> Option<Settled>
    where
        K: FnMut() -> KF,
        KF: Future<Output = ()>,
        S: Future<Output = ()>,
    {
        let inner = &*self.inner;
        let consumer = inner.inbox.consumer();
        let letter = InboxDeadLetter {
            consumer,
            message_id: burial.message_id,
            category: burial.category,
            headers: headers_json(&incoming.headers),
            payload: &incoming.payload,
            error: error_chain(burial.problem),
            attempts: burial.attempts,
        };
        let mut outages = 0;
        loop {
            match self.record_dead_letter(&letter).await {
                Ok(settled) => {
                    if settled == Settled::DeadLettered {
                        telemetry::record_consumer_dead_letter(
                            consumer,
                            letter.category.unwrap_or(""),
                        );
                        error!(
                            consumer,
                            category = letter.category,
                            message_id = letter.message_id.map(|id| id.0),
                            attempts = letter.attempts,
                            error = %letter.error,
                            "a consumer's message is a dead letter",
                        );
                    }
                    return Some(settled);
                }
                Err(failure) => {
                    outages += 1;
                    let wait = inner.backoff.delay(outages);
                    warn!(
                        consumer,
                        retry_in = ?wait,
                        error = %error_chain(&failure),
                        "a consumer's database is unavailable; waiting to record a dead letter",
                    );
                    if !wait_keeping_alive(wait, keep_alive, stop).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Records `letter`, and its message in the inbox, in one transaction.
    async fn record_dead_letter(&self, letter: &InboxDeadLetter<'_>) -> Result<Settled, Error> {
        let inner = &*self.inner;
        let mut transaction = inner.database.begin().await?;
        if let Some(id) = letter.message_id
            && inner.inbox.receive(transaction.as_mut(), id).await? == Received::Duplicate
        {
            return Ok(Settled::Duplicate);
        }
        transaction.dead_letter(letter).await?;
        transaction.commit().await?;
        Ok(Settled::DeadLettered)
    }

    /// Purges the records older than the retention, if the consumer has one and its last
    /// purge is a minute old. A failure is logged: the next message tries again.
    async fn purge_if_due(&self) {
        let inner = &*self.inner;
        let Some(window) = inner.retention else {
            return;
        };
        let now = tokio::time::Instant::now();
        {
            let mut purged = inner.purged.lock().unwrap_or_else(|e| e.into_inner());
            if purged.is_some_and(|at| now.duration_since(at) < PURGE_EVERY) {
                return;
            }
            *purged = Some(now);
        }
        let consumer = inner.inbox.consumer();
        match inner.database.purge_inbox(Some(consumer), window).await {
            Ok(purged) => debug!(consumer, purged, "purged the inbox's old records"),
            Err(failure) => warn!(
                consumer,
                error = %error_chain(&failure),
                "purging the inbox's old records failed; trying again after the next message",
            ),
        }
    }
}

/// What a dead letter is recorded with.
struct Burial<'a> {
    message_id: Option<MessageId>,
    category: Option<&'a str>,
    problem: &'a (dyn std::error::Error + Send + Sync + 'static),
    attempts: u32,
}

/// Waits `wait`, calling `keep_alive` every [`KEEP_ALIVE_EVERY`]; `false` if `stop`
/// resolved first.
async fn wait_keeping_alive<K, KF, S>(
    wait: Duration,
    keep_alive: &mut K,
    stop: &mut Stop<'_, S>,
) -> bool
where
    K: FnMut() -> KF,
    KF: Future<Output = ()>,
    S: Future<Output = ()>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return true;
        }
        keep_alive().await;
        let next = deadline.min(now + KEEP_ALIVE_EVERY);
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = stop.as_mut() => return false,
        }
    }
}

/// `headers` as a JSON object (the last of a repeated name wins).
fn headers_json(headers: &[(String, String)]) -> String {
    let object: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(name, value)| (name.clone(), serde_json::Value::String(value.clone())))
        .collect();
    serde_json::Value::Object(object).to_string()
}
