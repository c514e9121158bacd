//! A claimed shard of the in-memory store.

use std::any::Any;
use std::time::Duration;

use super::MemoryStore;
use super::clock::later;
use crate::columns::ModelRow;
use crate::error::Error;
use crate::id::Id;
use crate::model::MessageId;
use crate::replicated::ModelTable;
use crate::store::{
    Acknowledgement, DeadLettering, GroupKey, GroupTail, Lease, Outcome, ShardSession,
    StoredMessage,
};

/// A shard claimed from a [`MemoryStore`], under a lease.
#[derive(Debug)]
pub struct MemorySession {
    store: MemoryStore,
    lease: Lease,
    lease_duration: Duration,
}

impl MemorySession {
    pub(super) fn new(store: MemoryStore, lease: Lease, lease_duration: Duration) -> Self {
        Self {
            store,
            lease,
            lease_duration,
        }
    }

    fn lease_lost(&self) -> Error {
        Error::LeaseLost {
            shard: self.lease.shard.clone(),
            token: self.lease.token,
        }
    }
}

impl ShardSession for MemorySession {
    fn lease(&self) -> &Lease {
        &self.lease
    }

    async fn fetch(&mut self, limit: usize) -> Result<Vec<StoredMessage>, Error> {
        self.store.operation("reading a shard", |tables, _| {
            tables.fetch(&self.lease.shard, limit)
        })
    }

    async fn fetch_newest(
        &mut self,
        groups: &[GroupKey],
        after: MessageId,
        up_to: MessageId,
    ) -> Result<Vec<GroupTail>, Error> {
        self.store.operation("reading a shard", |tables, _| {
            tables.fetch_newest(&self.lease.shard, groups, after, up_to)
        })
    }

    async fn load_model(&mut self, table: &ModelTable, key: Id) -> Result<Option<ModelRow>, Error> {
        self.store
            .operation("reading a replicated model", |tables, _| {
                tables.model(table.table, key)
            })
    }

    fn handler_connection(&mut self) -> Option<&mut (dyn Any + Send)> {
        None
    }

    async fn before_handler(&mut self) -> Result<(), Error> {
        Ok(())
    }

    async fn after_handler(&mut self, _succeeded: bool) -> Result<(), Error> {
        Ok(())
    }

    async fn ack(&mut self, acknowledged: &[Acknowledgement]) -> Result<u64, Error> {
        self.store
            .operation("acknowledging messages", |tables, now| {
                tables.ack(&self.lease, acknowledged, later(now, self.lease_duration))
            })?
    }

    async fn dead_letter(&mut self, letter: &DeadLettering) -> Result<u64, Error> {
        self.store
            .operation("setting a group aside as dead letters", |tables, now| {
                let until = later(now, self.lease_duration);
                tables.dead_letter(&self.lease, letter, until, now)
            })?
    }

    async fn finish(self, outcome: Outcome) -> Result<(), Error> {
        let held = self.store.operation("releasing a shard", |tables, now| {
            tables.finish(&self.lease, &outcome, now)
        })?;
        if held { Ok(()) } else { Err(self.lease_lost()) }
    }

    /// Both at once, under one lock: no other worker sees the rows deleted and the shard
    /// still held.
    async fn ack_and_finish(
        self,
        acknowledged: &[Acknowledgement],
        outcome: Outcome,
    ) -> Result<(u64, bool), Error> {
        self.store
            .operation("acknowledging messages", |tables, now| {
                let rows =
                    tables.ack(&self.lease, acknowledged, later(now, self.lease_duration))?;
                Ok((rows, tables.finish(&self.lease, &outcome, now)))
            })?
    }
}
