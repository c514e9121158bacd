//! Flush-after-commit (S2): what a transaction wrote, and what flushing it can report.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::{DeliveryError, Error};
use crate::model::{Message, MessageId, ShardKey};
use crate::relay::{DrainReport, ShardFailure};

/// The shards a transaction wrote outboxes to, each with the newest message id written there:
/// what [`Relay::flush`](crate::Relay::flush) drains once the transaction has committed.
///
/// The backends' transaction wrappers (`outbox_sqlite::OutboxTransaction`,
/// `outbox_postgres::OutboxTransaction`) keep one; a nested scope's is merged into its
/// parent's when it commits, and dropped when it rolls back or defers its writes. Only the
/// top-level `commit()` hands it out, so the shards of a transaction that has not committed
/// cannot be flushed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WrittenShards {
    shards: BTreeMap<ShardKey, MessageId>,
}

impl WrittenShards {
    /// Nothing written.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that message `id` was written to `shard`.
    pub fn record(&mut self, shard: &ShardKey, id: MessageId) {
        let newest = self.shards.entry(shard.clone()).or_insert(id);
        *newest = (*newest).max(id);
    }

    /// Records a bulk write of `messages`, whose ids are `ids`: each shard is bounded by the
    /// newest id of the write.
    pub fn record_all(&mut self, messages: &[Message], ids: &[MessageId]) {
        if let Some(&newest) = ids.iter().max() {
            for message in messages {
                self.record(message.shard(), newest);
            }
        }
    }

    /// Adds what a nested scope wrote.
    pub fn merge(&mut self, other: Self) {
        for (shard, id) in other.shards {
            self.record(&shard, id);
        }
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// How many shards were written to.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// The shards, in key order, each with the newest id written there.
    pub fn iter(&self) -> impl Iterator<Item = (&ShardKey, MessageId)> {
        self.shards.iter().map(|(shard, id)| (shard, *id))
    }
}

/// Why a flush after commit did not deliver everything it drained. The data is committed
/// either way: what was not delivered stays for the relay.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlushError {
    /// A handler failed (or a row could not be delivered): its message and the later ones of
    /// its shard stay for the relay, and the shard's schedule is not pushed back. The other
    /// shards of the flush were drained.
    #[error("flushing the outboxes of {shard} failed")]
    Delivery {
        /// The shard whose delivery failed (the first, if several did).
        shard: ShardKey,
        /// What failed, with the handler's error as its source.
        #[source]
        error: Box<DeliveryError>,
        /// The other shards of the flush that failed, if any.
        others: Vec<ShardFailure>,
        /// What the flush delivered before and besides the failure.
        report: Box<DrainReport>,
    },
    /// Rows the transaction wrote are still pending: another worker held their shard for
    /// longer than [`RelayConfig::flush_wait`](crate::RelayConfig::flush_wait). They are
    /// committed and stay for the relay (or that worker); nothing failed.
    #[error("flushing left {} message(s) undelivered in {} shard(s): {}",
        remaining.iter().map(|shard| shard.messages).sum::<u64>(), remaining.len(),
        remaining.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Incomplete {
        /// The shards with rows left, and why.
        remaining: Vec<Undelivered>,
        /// What the flush delivered.
        report: Box<DrainReport>,
    },
    /// The database failed while flushing.
    #[error("flushing the outboxes failed")]
    Store(#[source] Error),
}

/// A shard a flush could not finish: its rows up to the flush's bound are still pending.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Undelivered {
    /// The shard.
    pub shard: ShardKey,
    /// How many of its messages, up to the newest the transaction wrote there, are pending.
    pub messages: u64,
    /// How long the flush waited for the shard.
    pub waited: Duration,
    /// Whether a pause holds the shard (S23): the flush did not wait for it, and its rows are
    /// delivered once it is resumed.
    pub paused: bool,
}

impl std::fmt::Display for Undelivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.paused {
            return write!(
                f,
                "{} message(s) in {}, which is paused: they are delivered once it is resumed",
                self.messages, self.shard
            );
        }
        write!(
            f,
            "{} message(s) in {}, which another worker held (or which was backing off) for the \
             {:?} the flush waited",
            self.messages, self.shard, self.waited
        )
    }
}

impl FlushError {
    /// A flush's report, or the failure it contains, or the rows it left.
    pub(crate) fn check(
        mut report: DrainReport,
        remaining: Vec<Undelivered>,
    ) -> Result<DrainReport, Self> {
        if report.failures.is_empty() {
            if remaining.is_empty() {
                return Ok(report);
            }
            return Err(Self::Incomplete {
                remaining,
                report: Box::new(report),
            });
        }
        let mut failures = std::mem::take(&mut report.failures).into_iter();
        let first = failures.next().expect("failures is not empty");
        Err(Self::Delivery {
            shard: first.shard,
            error: Box::new(first.error),
            others: failures.collect(),
            report: Box::new(report),
        })
    }

    /// The failed delivery, if a delivery failed.
    pub fn delivery_error(&self) -> Option<&DeliveryError> {
        match self {
            Self::Delivery { error, .. } => Some(error),
            Self::Incomplete { .. } | Self::Store(_) => None,
        }
    }
}
