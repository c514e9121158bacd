//! The consumer's half of effectively-once delivery: an inbox that remembers, in the
//! consumer's own database, which messages it has applied.
//!
//! The relay delivers at least once, and each sink stamps its message with the outbox's id
//! (`Outbox-Message-Id`). A consumer records that id in the transaction that applies the
//! message's effect: the record and the effect commit together or not at all, so a message
//! delivered again is seen as a [`Received::Duplicate`] and skipped.
//!
//! Each backend implements [`InboxTarget`] for its connection and transaction: see
//! `outbox_sqlite`'s or `outbox_postgres`'s crate documentation for an example.
//!
//! Two consumers racing on one id never both see [`Received::First`]: the second waits for
//! the first one's transaction, then sees [`Received::Duplicate`] if it committed, or
//! [`Received::First`] if it rolled back.
//!
//! **Retention.** [`Inbox::purge_older_than`] deletes the records older than a window. A
//! message delivered again after its record was purged is applied again: the window must
//! exceed the longest time a message can take to be redelivered (the relay's and the broker's
//! retries, an outage, a replay of dead letters). A [`Consumer`] built with a
//! [retention](ConsumerBuilder::retention) purges its own records as it goes; the `outbox`
//! command's `inbox purge` does it from outside.
//!
//! **Consumers.** A [`Consumer`] does all of the above for a broker's messages: each broker
//! crate's consumer loop runs the messages it reads through one.

mod consumer;

use std::borrow::Cow;
use std::time::Duration;

use crate::error::Error;
use crate::future::BoxFuture;
use crate::model::MessageId;
use crate::telemetry;

pub use self::consumer::{
    ConsumeReport, Consumer, ConsumerBuilder, ConsumerError, ConsumerProblem, DEFAULT_MAX_ATTEMPTS,
    InboxDatabase, InboxDeadLetter, InboxTransaction, Incoming, KEEP_ALIVE_EVERY, Settled,
    StoredInboxDeadLetter, Undecodable,
};

/// Whether a consumer has applied a message before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a duplicate must not be applied again"]
pub enum Received {
    /// The first time: apply its effect in the same transaction.
    First,
    /// Applied before (by this consumer, in a committed transaction): skip it.
    Duplicate,
}

/// Where an inbox records what it received: a backend's transaction or connection
/// (`&mut tx`, `&mut *tx`, `&mut conn`). The backends implement it; `B` is the backend's
/// dialect, so that each executor type has one implementation.
pub trait InboxTarget<B>: Send {
    /// Records `message` for `consumer` unless it is recorded; returns whether it was new.
    fn record<'a>(
        self,
        consumer: &'a str,
        message: MessageId,
    ) -> BoxFuture<'a, Result<bool, Error>>
    where
        Self: 'a;

    /// Deletes `consumer`'s records older than `age`; returns how many.
    fn purge<'a>(self, consumer: &'a str, age: Duration) -> BoxFuture<'a, Result<u64, Error>>
    where
        Self: 'a;
}

/// A consumer's inbox, by name: the messages it has applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbox {
    consumer: Cow<'static, str>,
}

impl Inbox {
    /// The inbox of `consumer`: a name of its own for each consumer of the same messages
    /// (`"billing"`, `"search-index"`), and for each producer whose message ids it receives
    /// (ids are unique per producing database: `"billing/orders"`).
    ///
    /// # Panics
    ///
    /// If `consumer` is empty.
    pub fn new(consumer: impl Into<Cow<'static, str>>) -> Self {
        let consumer = consumer.into();
        assert!(!consumer.is_empty(), "an inbox needs a consumer name");
        Self { consumer }
    }

    /// The consumer's name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Records `message` in `target`, the consumer's transaction, and says whether it is the
    /// first time: apply its effect in the same transaction only if [`Received::First`].
    /// Waits while another transaction that recorded the same message is open. Counted in
    /// [`INBOX_RECEIVED`](crate::telemetry::INBOX_RECEIVED) and
    /// [`INBOX_DUPLICATES`](crate::telemetry::INBOX_DUPLICATES).
    pub async fn receive<B, T: InboxTarget<B>>(
        &self,
        target: T,
        message: MessageId,
    ) -> Result<Received, Error> {
        let first = target.record(&self.consumer, message).await?;
        telemetry::record_received(&self.consumer, !first);
        Ok(if first {
            Received::First
        } else {
            Received::Duplicate
        })
    }

    /// Deletes this consumer's records older than `age`; returns how many. A message
    /// delivered again after its record is gone is applied again (see the module's docs).
    pub async fn purge_older_than<B, T: InboxTarget<B>>(
        &self,
        target: T,
        age: Duration,
    ) -> Result<u64, Error> {
        target.purge(&self.consumer, age).await
    }
}

/// A consumer's transaction ([`InboxDatabase::begin`]) is a target too:
/// `inbox.receive(transaction.as_mut(), id)`.
impl<'t, 'd> InboxTarget<Box<dyn InboxTransaction>> for &'t mut (dyn InboxTransaction + 'd) {
    fn record<'a>(self, consumer: &'a str, message: MessageId) -> BoxFuture<'a, Result<bool, Error>>
    where
        Self: 'a,
    {
        InboxTransaction::record(self, consumer, message)
    }

    fn purge<'a>(self, consumer: &'a str, age: Duration) -> BoxFuture<'a, Result<u64, Error>>
    where
        Self: 'a,
    {
        InboxTransaction::purge(self, consumer, age)
    }
}
