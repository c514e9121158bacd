//! A Redis Streams sink for the `outbox` transactional outbox framework.
//!
//! [`RedisSink`] appends each delivery to a stream with `XADD` and returns once Redis replied
//! with the entry's id, so the outbox deletes a message only after Redis stored it. The entry's
//! fields are the [`headers`](outbox_core::sink::headers) (the outbox message id under
//! `Outbox-Message-Id`, the category, scope, shard, object, creation time, the producer's
//! trace context), then `payload`: a consumer recognises a redelivery after a relay crash by
//! its message id. With [`RedisSink::deduplicated`], Redis itself recognises it: the entry is
//! added only if no entry with the same message id was added to the stream within the window.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_core::Registry;
//! use outbox_redis::RedisSink;
//! # #[derive(Debug)] struct Org;
//! # impl outbox_core::Scope for Org { const ID: outbox_core::ScopeId = outbox_core::ScopeId(1); const NAME: &'static str = "org"; }
//! # #[derive(Debug)] struct OrderPlaced;
//! # impl outbox_core::Category for OrderPlaced { type Scope = Org; type Payload = String; const ID: outbox_core::CategoryId = outbox_core::CategoryId(1); const NAME: &'static str = "order_placed"; }
//!
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! // Stream keys `orders:<category>`.
//! let sink = RedisSink::connect(client).await?.with_key_prefix("orders");
//! let registry = Registry::builder().sink::<OrderPlaced, _>(sink).build()?;
//! # let _ = registry;
//! # Ok(())
//! # }
//! ```
//!
//! Errors: a connection that is down, a reply that does not come within the response timeout,
//! or a server that is loading, read-only or out of memory is an
//! [outage](SinkError::Unavailable): the sink's breaker opens, the relay parks the shards and
//! resumes them once Redis answers its probe (`PING`). Any other error reply (`WRONGTYPE`: the
//! key is not a stream) is a [refusal](SinkError::Refused) of that message.
//!
//! **Consuming.** [`RedisConsumer`] is a member of a stream's consumer group that applies each
//! message through an outbox [`Consumer`](outbox_core::inbox::Consumer) (its inbox and the
//! producer's handlers) and acknowledges the broker only after the consumer's transaction
//! committed: a message delivered again is found in the inbox and applied once.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod consumer;

pub use crate::consumer::{DEFAULT_BATCH, DEFAULT_CLAIM_AFTER, RedisConsumer};

use std::time::Duration;

use outbox_core::BoxError;
use outbox_core::sink::{Breaker, Envelope, Published, Sink, SinkError, one_at_a_time};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};

/// How long a command waits for Redis's reply by default.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The field of an entry that holds the payload.
pub const PAYLOAD_FIELD: &str = "payload";

/// Adds the entry unless the marker of its message id exists; the marker expires after the
/// window. `KEYS`: the stream, the marker. `ARGV`: the window in seconds, then the entry's
/// fields and values.
const DEDUPLICATED_XADD: &str = r"
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[1]) then
  return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
end
return false
";

/// A [`Sink`] appending to Redis Streams. Cheap to clone; clones share the connection and the
/// breaker.
#[derive(Clone)]
pub struct RedisSink {
    connection: ConnectionManager,
    prefix: String,
    dedup_window: Option<Duration>,
    script: redis::Script,
    breaker: Breaker,
}

impl std::fmt::Debug for RedisSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSink")
            .field("prefix", &self.prefix)
            .field("dedup_window", &self.dedup_window)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

impl RedisSink {
    /// Connects to `client`'s server through a [`ConnectionManager`] that reconnects on its
    /// own, waiting up to [`DEFAULT_RESPONSE_TIMEOUT`] for each reply; appends to streams
    /// `outbox:<category>`.
    pub async fn connect(client: redis::Client) -> Result<Self, RedisError> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(DEFAULT_RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(DEFAULT_RESPONSE_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(100));
        let connection = ConnectionManager::new_with_config(client, config).await?;
        Ok(Self::new(connection))
    }

    /// Appends through `connection` (give it a response timeout: a reply that never comes
    /// is how an unreachable server shows) to streams `outbox:<category>`.
    pub fn new(connection: ConnectionManager) -> Self {
        let probed = connection.clone();
        let breaker = Breaker::new("Redis", move || {
            let mut connection = probed.clone();
            async move {
                redis::cmd("PING")
                    .query_async::<()>(&mut connection)
                    .await
                    .map_err(BoxError::from)
            }
        });
        Self {
            connection,
            prefix: "outbox".to_owned(),
            dedup_window: None,
            script: redis::Script::new(DEDUPLICATED_XADD),
            breaker,
        }
    }

    /// Appends a category's messages to `<prefix>:<category>` (the category's name) unless
    /// its publisher routes them elsewhere.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Adds an entry only if no entry with the same de-duplication key was added to the same
    /// stream within `window` (a marker key `<stream>:dedup:<key>` that expires after it,
    /// set in the same script as the `XADD`). A redelivery after a relay crash is then
    /// stored once. On Redis Cluster, give the stream key a hash tag (`{orders}:placed`) so
    /// that its markers share its slot.
    pub fn deduplicated(mut self, window: Duration) -> Self {
        self.dedup_window = Some(window.max(Duration::from_secs(1)));
        self
    }

    async fn append(&self, envelope: &Envelope) -> Result<(), RedisError> {
        let mut connection = self.connection.clone();
        match self.dedup_window {
            None => {
                xadd(envelope)
                    .query_async::<String>(&mut connection)
                    .await?;
            }
            Some(window) => {
                let mut invocation = self.script.prepare_invoke();
                invocation
                    .key(&envelope.destination)
                    .key(format!(
                        "{}:dedup:{}",
                        envelope.destination, envelope.dedup_key
                    ))
                    .arg(window.as_secs());
                for (name, value) in fields(envelope) {
                    invocation.arg(name).arg(value);
                }
                // The entry's id, or nil for a redelivery within the window.
                invocation
                    .invoke_async::<Option<String>>(&mut connection)
                    .await?;
            }
        }
        Ok(())
    }
}

/// An entry's fields: the headers, then the payload.
fn fields(envelope: &Envelope) -> impl Iterator<Item = (&str, &[u8])> {
    envelope
        .headers
        .iter()
        .map(|(name, value)| (name.as_ref(), value.as_bytes()))
        .chain(std::iter::once((
            PAYLOAD_FIELD,
            envelope.payload.as_slice(),
        )))
}

/// The `XADD` of an envelope.
fn xadd(envelope: &Envelope) -> redis::Cmd {
    let mut xadd = redis::cmd("XADD");
    xadd.arg(&envelope.destination).arg("*");
    for (name, value) in fields(envelope) {
        xadd.arg(name).arg(value);
    }
    xadd
}

impl Sink for RedisSink {
    async fn publish(&self, envelope: Envelope) -> Result<(), SinkError> {
        self.append(&envelope).await.map_err(classify)
    }

    /// Sends every `XADD` in one pipeline (one round trip; Redis runs them in order) and
    /// reads each one's reply: an entry Redis refused (a key of another type) does not stop
    /// it from storing those after it, which are confirmed all the same. Deduplicated, one
    /// script call at a time. A pipeline whose connection fails confirms none of its entries
    /// (they may be stored: a redelivery repeats them).
    async fn publish_all(&self, envelopes: Vec<Envelope>) -> Published {
        if self.dedup_window.is_some() {
            return one_at_a_time(self, envelopes).await;
        }
        let mut pipeline = redis::pipe();
        pipeline.ignore_errors();
        for envelope in &envelopes {
            pipeline.add_command(xadd(envelope));
        }
        let mut connection = self.connection.clone();
        match pipeline
            .query_async::<Vec<RedisResult<String>>>(&mut connection)
            .await
        {
            Ok(replies) => Published::from_outcomes(
                replies
                    .into_iter()
                    .map(|reply| reply.map(drop).map_err(classify)),
            ),
            Err(error) => Published::new(0, Some(classify(error))),
        }
    }

    fn breaker(&self) -> &Breaker {
        &self.breaker
    }

    fn destination(&self, category: &'static str) -> String {
        format!("{}:{category}", self.prefix)
    }
}

/// Whether `error` says the connection to Redis is gone or could not be made (an I/O error,
/// a dropped or refused connection, a timeout): an outage, whatever the command was.
fn connection_lost(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
}

/// A Redis error as an outage or a refusal of the message.
fn classify(error: RedisError) -> SinkError {
    let unavailable = connection_lost(&error)
        || error.is_unrecoverable_error()
        || matches!(
            error.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ReadOnly
            )
        )
        || error.code() == Some("OOM");
    if unavailable {
        SinkError::Unavailable(Box::new(error))
    } else {
        SinkError::Refused(Box::new(error))
    }
}
