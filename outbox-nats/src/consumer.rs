//! The consumer's side: a JetStream durable pull consumer whose messages run through an
//! outbox [`Consumer`] (its inbox and handlers), acknowledged only once settled.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::{self, MessagesErrorKind};
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy};
use async_nats::jetstream::{self, AckKind};
use futures_util::StreamExt;
use outbox_core::BoxError;
use outbox_core::inbox::{ConsumeReport, Consumer, Incoming};
use tracing::{debug, warn};

/// How long JetStream waits for a message's acknowledgement before delivering it again, by
/// default. The consumer tells JetStream it is still working while it waits to retry.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// How many messages JetStream hands a consumer before their acknowledgements, by default.
pub const DEFAULT_MAX_ACK_PENDING: i64 = 1000;

/// How many messages one pull request asks for, by default. Each waits in the client until
/// the ones before it are applied, and its ack wait runs meanwhile: a batch must be applied
/// well within the ack wait, or JetStream delivers its last messages again.
pub const DEFAULT_BATCH: usize = 20;

/// How long one pull request waits for messages, and how often the server says it is alive
/// meanwhile.
const PULL_EXPIRES: Duration = Duration::from_secs(5);
const PULL_HEARTBEAT: Duration = Duration::from_secs(2);

/// How long the consumer waits before opening its message stream again after JetStream
/// ended it (the durable consumer deleted, the stream gone).
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// A JetStream durable pull consumer that applies each message through an outbox
/// [`Consumer`]: the handler's effect and the inbox record commit in one transaction of the
/// consumer's database, and the message is acknowledged only after that commit. A crash in
/// between delivers the message again, and the inbox finds it applied.
///
/// Messages are applied one at a time, in the order JetStream delivers them: a subject's
/// order is kept while the consumer runs (a failing message is retried in place, its
/// successors wait; JetStream is told the message is in progress meanwhile). After a crash,
/// JetStream delivers the unacknowledged messages again once their ack wait has passed,
/// after newer ones unless [`max_ack_pending`](Self::max_ack_pending) is 1. The consumer
/// decides when a message is a dead letter: the durable consumer redelivers without limit.
///
/// ```no_run
/// # async fn example(consumer: outbox_core::inbox::Consumer) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_nats::NatsConsumer;
///
/// let client = outbox_nats::connect("nats://127.0.0.1:4222", async_nats::ConnectOptions::new()).await?;
/// let report = NatsConsumer::new(consumer, "ORDERS", "billing")
///     .run(client, outbox_core::shutdown_signal())
///     .await?;
/// println!("applied {} messages", report.applied);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct NatsConsumer {
    consumer: Consumer,
    stream: String,
    durable: String,
    filter_subject: String,
    ack_wait: Duration,
    max_ack_pending: i64,
    batch: usize,
}

/// Why a [`NatsConsumer`] could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The stream does not exist, or JetStream did not answer.
    #[error("JetStream stream `{stream}` is not available")]
    Stream {
        /// The stream's name.
        stream: String,
        /// JetStream's error.
        #[source]
        source: BoxError,
    },
    /// The durable consumer could not be created or read (an existing one of the same name
    /// is configured otherwise, say).
    #[error("JetStream consumer `{durable}` on stream `{stream}` is not available")]
    Consumer {
        /// The stream's name.
        stream: String,
        /// The durable consumer's name.
        durable: String,
        /// JetStream's error.
        #[source]
        source: BoxError,
    },
}

impl NatsConsumer {
    /// Consumes stream `stream`, all its subjects, through durable consumer `durable`
    /// (created if missing, from the stream's first message).
    pub fn new(consumer: Consumer, stream: impl Into<String>, durable: impl Into<String>) -> Self {
        Self {
            consumer,
            stream: stream.into(),
            durable: durable.into(),
            filter_subject: String::new(),
            ack_wait: DEFAULT_ACK_WAIT,
            max_ack_pending: DEFAULT_MAX_ACK_PENDING,
            batch: DEFAULT_BATCH,
        }
    }

    /// Asks for `messages` at a time (default [`DEFAULT_BATCH`]). A batch waits in the
    /// client while its messages are applied one by one, its ack wait running: keep a
    /// batch's time well within the [ack wait](Self::ack_wait).
    pub fn batch(mut self, messages: usize) -> Self {
        self.batch = messages.max(1);
        self
    }

    /// Consumes only the subjects matching `subject` (wildcards allowed: `orders.>`).
    pub fn filter_subject(mut self, subject: impl Into<String>) -> Self {
        self.filter_subject = subject.into();
        self
    }

    /// How long JetStream waits for an acknowledgement before delivering a message again
    /// (default [`DEFAULT_ACK_WAIT`]): longer than a handler's slowest transaction.
    pub fn ack_wait(mut self, wait: Duration) -> Self {
        self.ack_wait = wait;
        self
    }

    /// How many messages JetStream hands out before their acknowledgements (default
    /// [`DEFAULT_MAX_ACK_PENDING`]). 1 keeps a subject's order across crashes too, at the
    /// cost of a round trip per message.
    pub fn max_ack_pending(mut self, pending: i64) -> Self {
        self.max_ack_pending = pending.max(1);
        self
    }

    /// The durable consumer's configuration.
    fn config(&self) -> pull::Config {
        pull::Config {
            durable_name: Some(self.durable.clone()),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_deliver: -1,
            max_ack_pending: self.max_ack_pending,
            filter_subject: self.filter_subject.clone(),
            ..pull::Config::default()
        }
    }

    /// The durable consumer's messages, the consumer created if missing.
    async fn open(&self, jetstream: &jetstream::Context) -> Result<pull::Stream, ConsumeError> {
        let stream =
            jetstream
                .get_stream(&self.stream)
                .await
                .map_err(|source| ConsumeError::Stream {
                    stream: self.stream.clone(),
                    source: Box::new(source),
                })?;
        let unavailable = |source: BoxError| ConsumeError::Consumer {
            stream: self.stream.clone(),
            durable: self.durable.clone(),
            source,
        };
        let consumer: jetstream::consumer::PullConsumer = stream
            .get_or_create_consumer(&self.durable, self.config())
            .await
            .map_err(|source| unavailable(Box::new(source)))?;
        // Short pull requests: after a reconnection the client pulls again at once only if
        // the server holds no pull request of the durable consumer (another process's may be
        // there, or a killed one's); otherwise it waits for its own to expire.
        consumer
            .stream()
            .max_messages_per_batch(self.batch)
            .expires(PULL_EXPIRES)
            .heartbeat(PULL_HEARTBEAT)
            .messages()
            .await
            .map_err(|source| unavailable(Box::new(source)))
    }

    /// Consumes until `stop` resolves, then returns what it settled. A message being
    /// retried when `stop` resolves is left unacknowledged (JetStream delivers it again); a
    /// message being applied is finished first.
    ///
    /// The connection may drop and come back meanwhile: the client reconnects, and JetStream
    /// delivers again what was not acknowledged. Fails only if the stream or the durable
    /// consumer cannot be opened at the start.
    pub async fn run(
        &self,
        client: async_nats::Client,
        stop: impl Future<Output = ()>,
    ) -> Result<ConsumeReport, ConsumeError> {
        let jetstream = jetstream::new(client);
        let mut messages = self.open(&jetstream).await?;
        let mut report = ConsumeReport::default();
        let mut stop = std::pin::pin!(stop);
        loop {
            let next = tokio::select! {
                biased;
                () = stop.as_mut() => return Ok(report),
                next = messages.next() => next,
            };
            let message = match next {
                Some(Ok(message)) => message,
                Some(Err(error))
                    if !matches!(
                        error.kind(),
                        MessagesErrorKind::ConsumerDeleted
                            | MessagesErrorKind::RequestLimitExceeded
                    ) =>
                {
                    // Heartbeats missed while the connection is down, a pull that failed:
                    // the stream recovers once the client has reconnected.
                    debug!(durable = %self.durable, %error, "JetStream consumer: waiting");
                    continue;
                }
                ended => {
                    warn!(
                        durable = %self.durable,
                        error = ?ended.and_then(Result::err),
                        "JetStream ended the consumer's messages; opening them again",
                    );
                    match self.reopen(&jetstream, stop.as_mut()).await {
                        Some(reopened) => {
                            messages = reopened;
                            continue;
                        }
                        None => return Ok(report),
                    }
                }
            };
            let (incoming, pending) = incoming(&message);
            self.consumer.record_lag(pending);
            let keep_alive = || async {
                if let Err(error) = message.ack_with(AckKind::Progress).await {
                    debug!(%error, "telling JetStream the message is in progress failed");
                }
            };
            let Some(settled) = self
                .consumer
                .process(&incoming, keep_alive, stop.as_mut())
                .await
            else {
                return Ok(report);
            };
            report.count(settled);
            if let Err(error) = message.double_ack().await {
                // Settled in the database: JetStream delivers it again, and the inbox finds
                // it applied.
                warn!(durable = %self.durable, %error, "acknowledging a settled message failed; it will be a duplicate");
            }
        }
    }

    /// Opens the messages again, retrying every [`REOPEN_AFTER`]; `None` once `stop`
    /// resolved.
    async fn reopen(
        &self,
        jetstream: &jetstream::Context,
        mut stop: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Option<pull::Stream> {
        loop {
            tokio::select! {
                biased;
                () = stop.as_mut() => return None,
                () = tokio::time::sleep(REOPEN_AFTER) => {}
            }
            match self.open(jetstream).await {
                Ok(messages) => return Some(messages),
                Err(error) => warn!(
                    durable = %self.durable,
                    error = %outbox_core::error::error_chain(&error),
                    "opening the JetStream consumer failed; trying again",
                ),
            }
        }
    }
}

/// `message` as the outbox consumer reads it (its headers but JetStream's own, its payload,
/// its delivery count), and how many messages JetStream holds for the consumer after it.
fn incoming(message: &jetstream::Message) -> (Incoming, u64) {
    let (delivered, pending) = message.info().map_or((0, 0), |info| {
        (
            u32::try_from(info.delivered).unwrap_or(u32::MAX),
            info.pending,
        )
    });
    let mut incoming = Incoming::new(message.payload.to_vec(), delivered);
    if let Some(headers) = &message.headers {
        for (name, values) in headers.iter() {
            let name: &str = name.as_ref();
            if name.starts_with("Nats-") {
                continue;
            }
            if let Some(value) = values.last() {
                incoming
                    .headers
                    .push((name.to_owned(), value.as_str().to_owned()));
            }
        }
    }
    (incoming, pending)
}
