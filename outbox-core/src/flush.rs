//! Flush-after-commit: what a transaction wrote, for the relay to flush once it committed.

use std::collections::BTreeMap;

use crate::model::{Message, MessageId, ShardKey};

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
