//! An in-memory [`Store`]: the relay without a database, for unit tests, examples and
//! prototypes.
//!
//! [`MemoryStore`] keeps the outbox's two tables (pending messages, and shard state: leases,
//! attempts, backoff) in process, behind one mutex, and applies to them the rules the SQL
//! backends' statements do: discovery pages through shards in key order and reports the due
//! ones, claims issue increasing fencing tokens, a lease that lapsed without a release counts
//! as an attempt at the head and names its holder, acknowledgements delete exactly the rows
//! read and only while the lease is current, and so on. It passes the relay and store groups
//! of the conformance suite in `outbox-testkit`.
//!
//! What it adds for tests: a [`ManualClock`] that leases and backoffs follow, so that a test
//! moves time instead of sleeping, and fault injection ([`MemoryStore::fail_next`],
//! [`MemoryStore::set_unavailable`]) that makes operations fail as a lost database would.
//!
//! What it does not do: transactions. Writes ([`MemoryStore::write`], [`MemoryStore::save`])
//! are visible at once, and [`HandlerMode::InTransaction`] is refused at the claim with
//! [`Error::Unsupported`] (there is no transaction to lend a handler). Nothing is persisted.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//!
//! use outbox_core::memory::MemoryStore;
//! use outbox_core::{BoxError, Delivery, Message, Registry, Relay};
//! use outbox_core::{outbox_category, outbox_scope};
//! use serde::{Deserialize, Serialize};
//!
//! #[outbox_scope(id = 1)]
//! struct Organization;
//!
//! #[outbox_category(scope = Organization, id = 1)]
//! #[derive(Serialize, Deserialize)]
//! struct Renamed {
//!     name: String,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! for name in ["Acme", "Acme Inc"] {
//!     store.write(&Message::new::<Renamed>(42, 7, &Renamed { name: name.into() })?);
//! }
//!
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let record = {
//!     let seen = Arc::clone(&seen);
//!     move |delivery: Delivery<Renamed>| {
//!         seen.lock().unwrap().push(delivery.payload.name);
//!         async { Ok::<(), BoxError>(()) }
//!     }
//! };
//! let registry = Registry::builder().handle::<Renamed>(record).build()?;
//! let report = Relay::new(store.clone(), registry).drain().await?;
//!
//! assert_eq!(*seen.lock().unwrap(), ["Acme Inc"]);
//! assert_eq!(report.rows_acknowledged, 2);
//! # Ok(())
//! # }
//! ```
//!
//! [`HandlerMode::InTransaction`]: crate::HandlerMode::InTransaction

mod clock;
mod session;
mod state;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

pub use self::clock::ManualClock;
use self::clock::{Clock, later};
pub use self::session::MemorySession;
use self::state::{Row, Tables};
use crate::backfill::{
    BackfillBatch, BackfillModel, BackfillOptions, BackfillStart, BackfillState,
};
use crate::columns::ModelRow;
use crate::error::Error;
use crate::future::BoxFuture;
use crate::id::{Id, Identifier};
use crate::model::{CategoryId, Message, MessageId, ShardKey};
use crate::replicated::{IntoModelBatch, ModelTable, ReplicatedModel};
use crate::store::{
    Admin, ClaimOptions, DeadLetter, DeadLetterFilter, DiscoveryPage, HandlerMode, Heartbeat,
    Lease, OutboxStatus, Pause, PauseTarget, PendingMessage, RelayInfo, ShardInfo, ShardList,
    ShardQuery, ShardState, Store, Wakeup, WakeupStream,
};

/// The outbox in memory: a [`Store`] without a database (see [the module](self)).
///
/// Cheap to clone; clones share the same messages, shard states, clock and faults.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    tables: Mutex<Tables>,
    clock: Clock,
    faults: Mutex<Faults>,
    /// The senders of every [`MemoryWakeups`] handed out.
    listeners: Mutex<Vec<mpsc::UnboundedSender<Vec<ShardKey>>>>,
    /// The hold on discovery, while a test keeps one ([`MemoryStore::hold_discovery`]).
    discovery: Mutex<Option<Held>>,
}

/// What a discovery waits on while it is held: the hold's end (its sender dropped), and the
/// signal that one is waiting.
#[derive(Debug, Clone)]
struct Held {
    released: tokio::sync::watch::Receiver<()>,
    waiting: Arc<tokio::sync::Notify>,
}

/// A hold on a [`MemoryStore`]'s discovery ([`MemoryStore::hold_discovery`]): every page of
/// a sweep read while it lives waits until it is dropped, as a page that walks a large
/// table (or one a held vacuum horizon filled with dead rows) takes long.
#[derive(Debug)]
pub struct DiscoveryHold {
    _release: tokio::sync::watch::Sender<()>,
    waiting: Arc<tokio::sync::Notify>,
}

impl DiscoveryHold {
    /// Waits until a discovery is waiting on this hold.
    pub async fn reached(&self) {
        self.waiting.notified().await;
    }
}

/// Injected failures.
#[derive(Debug, Default)]
struct Faults {
    /// How many of the next operations fail.
    fail_next: usize,
    /// Whether every operation fails, until cleared.
    unavailable: bool,
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose leases and backoffs follow `clock`: they lapse and end when the
    /// test advances it.
    pub fn with_clock(clock: ManualClock) -> Self {
        Self {
            shared: Arc::new(Shared {
                clock: Clock::manual(clock),
                ..Shared::default()
            }),
        }
    }

    /// The store's current time.
    pub fn now(&self) -> SystemTime {
        self.shared.clock.now()
    }

    /// Writes `message`, visible at once; returns its id. Ids increase with each write.
    pub fn write(&self, message: &Message) -> MessageId {
        self.write_all(std::slice::from_ref(message))[0]
    }

    /// Writes `messages` at once (no relay sees some of them without the others); returns
    /// their ids, in order.
    pub fn write_all(&self, messages: &[Message]) -> Vec<MessageId> {
        let _span = tracing::debug_span!("outbox.write", messages = messages.len()).entered();
        let now = self.now();
        let ids = self.tables(|tables| {
            messages
                .iter()
                .map(|message| tables.insert(row(message, now)))
                .collect()
        });
        self.notify(messages.iter().map(Message::shard));
        crate::telemetry::record_written(messages);
        ids
    }

    /// Writes a row as a caller going around the typed API could: any category, any payload
    /// text, the scope of `shard`. What tests of unknown categories and malformed payloads
    /// use.
    pub fn insert_raw(
        &self,
        shard: &ShardKey,
        category: CategoryId,
        object_identifier: impl Identifier,
        payload: impl Into<String>,
    ) -> MessageId {
        let row = Row {
            shard: shard.clone(),
            category,
            object_identifier: object_identifier.into_id(),
            payload: payload.into(),
            created_at: self.now(),
            metadata: None,
        };
        let id = self.tables(|tables| tables.insert(row));
        self.notify(std::iter::once(shard));
        id
    }

    /// Inserts or updates replicated models' rows and writes their outboxes, at once: what the
    /// SQL backends' `save` does in a transaction. At delivery the relay finds the rows and
    /// calls the models' replication handlers. Returns the outboxes' ids.
    pub fn save<'a, M: ReplicatedModel>(
        &self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<Vec<MessageId>, Error> {
        let batch = models.into_batch();
        let messages = batch.messages()?;
        let rows = batch.rows_json()?;
        let now = self.now();
        let ids = self.tables(|tables| {
            for (model, row) in batch.models().iter().zip(rows) {
                tables.put_model(M::TABLE.table, model.object_identifier(), row);
            }
            messages
                .iter()
                .map(|message| tables.insert(row(message, now)))
                .collect()
        });
        self.notify(messages.iter().map(Message::shard));
        Ok(ids)
    }

    /// Deletes replicated models' rows and writes their outboxes, at once: at delivery the
    /// relay finds the rows gone and calls the models' deletion handlers with their
    /// tombstones. Returns the outboxes' ids.
    pub fn delete<'a, M: ReplicatedModel>(
        &self,
        models: impl IntoModelBatch<'a, M>,
    ) -> Result<Vec<MessageId>, Error> {
        let batch = models.into_batch();
        let messages = batch.messages()?;
        let now = self.now();
        let ids = self.tables(|tables| {
            for model in batch.models() {
                tables.remove_model(M::TABLE.table, model.object_identifier());
            }
            messages
                .iter()
                .map(|message| tables.insert(row(message, now)))
                .collect()
        });
        self.notify(messages.iter().map(Message::shard));
        Ok(ids)
    }

    /// The pending messages, in id order: [`Admin::pending_messages`] without a limit, at
    /// once and untouched by injected faults.
    pub fn pending(&self) -> Vec<PendingMessage> {
        self.tables(|tables| tables.pending_messages(usize::MAX))
    }

    /// The shards' recorded states: [`Admin::shard_states`], at once and untouched by
    /// injected faults.
    pub fn states(&self) -> Vec<ShardState> {
        self.tables(|tables| tables.shard_states())
    }

    /// Makes the next `operations` calls of the [`Store`] and [`ShardSession`] methods (on
    /// this store, its clones and its sessions) fail with [`Error::Unavailable`], as calls on
    /// a lost connection would. Writes are not affected.
    ///
    /// [`ShardSession`]: crate::store::ShardSession
    pub fn fail_next(&self, operations: usize) {
        self.faults().fail_next = operations;
    }

    /// Makes every [`Store`] and session operation fail with [`Error::Unavailable`] until
    /// called again with `false`: a database outage.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.faults().unavailable = unavailable;
    }

    /// Holds discovery: every page read from now until the returned hold is dropped waits
    /// for that (other operations go on). For tests of what a relay does while a slow page
    /// is read.
    pub fn hold_discovery(&self) -> DiscoveryHold {
        let (release, released) = tokio::sync::watch::channel(());
        let waiting = Arc::new(tokio::sync::Notify::new());
        *self
            .shared
            .discovery
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Held {
            released,
            waiting: Arc::clone(&waiting),
        });
        DiscoveryHold {
            _release: release,
            waiting,
        }
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn tables<T>(&self, f: impl FnOnce(&mut Tables) -> T) -> T {
        f(&mut self
            .shared
            .tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
    }

    /// Runs one operation of the store on its tables at the clock's time, unless a fault is
    /// injected.
    fn operation<T>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut Tables, SystemTime) -> T,
    ) -> Result<T, Error> {
        {
            let mut faults = self.faults();
            let injected = faults.unavailable || faults.fail_next > 0;
            faults.fail_next = faults.fail_next.saturating_sub(1);
            if injected {
                return Err(Error::Unavailable {
                    source: format!("injected fault while {what}").into(),
                });
            }
        }
        let now = self.now();
        Ok(self.tables(|tables| f(tables, now)))
    }

    fn notify<'a>(&self, shards: impl Iterator<Item = &'a ShardKey>) {
        let mut shards: Vec<ShardKey> = shards.cloned().collect();
        shards.sort_unstable();
        shards.dedup();
        self.shared
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|listener| listener.send(shards.clone()).is_ok());
    }
}

fn row(message: &Message, now: SystemTime) -> Row {
    Row {
        shard: message.shard().clone(),
        category: message.category(),
        object_identifier: message.object_identifier(),
        payload: message.payload_json().to_owned(),
        created_at: now,
        metadata: message.metadata().to_json(),
    }
}

impl Store for MemoryStore {
    type Session = MemorySession;
    type Wakeups = MemoryWakeups;

    async fn check_schema(&self) -> Result<(), Error> {
        self.operation("checking the outbox schema", |_, _| ())
    }

    async fn discover(
        &self,
        after: Option<&ShardKey>,
        limit: usize,
    ) -> Result<DiscoveryPage, Error> {
        let held = self
            .shared
            .discovery
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(mut held) = held {
            held.waiting.notify_one();
            // Ends with an error once the hold is dropped: the page is read then.
            let _ = held.released.changed().await;
        }
        self.operation("discovering due shards", |tables, now| {
            tables.discover(after, limit, now)
        })
    }

    async fn claim(
        &self,
        shard: &ShardKey,
        options: &ClaimOptions,
    ) -> Result<Option<MemorySession>, Error> {
        if options.mode == HandlerMode::InTransaction {
            return Err(Error::Unsupported {
                store: "the in-memory store",
                feature: "HandlerMode::InTransaction (it has no transaction to lend a handler)",
            });
        }
        let lease = self.operation("claiming a shard", |tables, now| {
            tables.claim(shard, options, now)
        })?;
        Ok(lease.map(|lease| MemorySession::new(self.clone(), lease, options.lease)))
    }

    async fn load_models(
        &self,
        table: &ModelTable,
        keys: &[Id],
    ) -> Result<Vec<Option<ModelRow>>, Error> {
        self.operation("reading a replicated model", |tables, _| {
            keys.iter()
                .map(|key| tables.model(table.table, *key))
                .collect()
        })
    }

    /// One process: there are no other processes' commits to hear.
    async fn wakeups(&self, _other_processes: bool) -> Result<Option<MemoryWakeups>, Error> {
        self.operation("listening for commits", |_, _| ())?;
        let (sender, receiver) = mpsc::unbounded_channel();
        self.shared
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(sender);
        Ok(Some(MemoryWakeups { receiver }))
    }

    async fn extend_lease(&self, lease: &Lease, duration: Duration) -> Result<bool, Error> {
        self.operation("extending a lease", |tables, now| {
            tables.extend_lease(lease, later(now, duration))
        })
    }

    async fn release(&self, lease: &Lease) -> Result<bool, Error> {
        self.operation("releasing a lease", |tables, now| {
            tables.extend_lease(lease, now)
        })
    }

    async fn unpark(&self, known: &[CategoryId]) -> Result<u64, Error> {
        self.operation("resuming parked shards", |tables, now| {
            tables.unpark(known, now)
        })
    }

    async fn newest_message_id(&self) -> Result<Option<MessageId>, Error> {
        self.operation("reading the newest message id", |tables, _| {
            tables.newest_message_id()
        })
    }

    async fn pending_in_shard(&self, shard: &ShardKey, up_to: MessageId) -> Result<u64, Error> {
        self.operation("counting a shard's pending messages", |tables, _| {
            tables.pending_in_shard(shard, up_to)
        })
    }

    async fn oldest_due_age(&self) -> Result<Option<Duration>, Error> {
        self.operation("reading the oldest due message", |tables, now| {
            tables.oldest_due_age(now)
        })
    }

    async fn gauges(&self) -> Result<OutboxStatus, Error> {
        Admin::status(self, 0).await
    }

    async fn is_paused(&self, shard: &ShardKey) -> Result<bool, Error> {
        self.operation("reading a shard's pauses", |tables, _| {
            tables.is_paused(shard)
        })
    }

    async fn compact_paused(&self, coalescing: &[CategoryId], limit: usize) -> Result<u64, Error> {
        self.operation("compacting paused shards", |tables, _| {
            tables.compact_paused(coalescing, limit)
        })
    }

    async fn backfill(
        &self,
        model: &BackfillModel,
        options: &BackfillOptions,
    ) -> Result<BackfillBatch, Error> {
        let (batch, messages) = self.operation("walking a backfill", |tables, now| {
            tables.backfill(model, options, now)
        })??;
        self.notify(messages.iter().map(Message::shard));
        crate::telemetry::record_written(&messages);
        Ok(batch)
    }

    async fn purge_dead_letters_older_than(
        &self,
        age: Duration,
        limit: usize,
    ) -> Result<u64, Error> {
        self.operation("purging expired dead letters", |tables, now| {
            tables.purge_dead_letters_older_than(age, limit, now)
        })
    }

    async fn beat(&self, heartbeat: &Heartbeat) -> Result<(), Error> {
        self.operation("recording the relay's heartbeat", |tables, now| {
            tables.beat(heartbeat, now);
        })
    }

    async fn leave(&self, worker: &str) -> Result<(), Error> {
        self.operation("deleting the relay's heartbeat", |tables, _| {
            tables.leave(worker);
        })
    }
}

impl Admin for MemoryStore {
    async fn reschedule(&self, shard: &ShardKey) -> Result<bool, Error> {
        self.operation("rescheduling a shard", |tables, now| {
            tables.reschedule(shard, now)
        })
    }

    async fn pending_messages(&self, limit: usize) -> Result<Vec<PendingMessage>, Error> {
        self.operation("listing pending messages", |tables, _| {
            tables.pending_messages(limit)
        })
    }

    async fn shard_states(&self) -> Result<Vec<ShardState>, Error> {
        self.operation("listing shard states", |tables, _| tables.shard_states())
    }

    async fn status(&self, deepest: usize) -> Result<OutboxStatus, Error> {
        self.operation("reading the outbox's status", |tables, now| {
            tables.status(deepest, now)
        })
    }

    async fn set_aside(&self, id: MessageId, reason: &str) -> Result<DeadLetter, Error> {
        let letter = self.operation("setting a message aside", |tables, now| {
            tables.set_aside(id, reason, now)
        })??;
        self.notify(std::iter::once(&letter.shard));
        Ok(letter)
    }

    async fn shard(&self, shard: &ShardKey) -> Result<Option<ShardInfo>, Error> {
        self.operation("reading a shard", |tables, now| {
            tables.shard_listed(shard, now)
        })
    }

    async fn shards(&self, query: &ShardQuery) -> Result<ShardList, Error> {
        self.operation("listing shards", |tables, now| {
            tables.shards_listed(query, now)
        })
    }

    async fn shard_messages(
        &self,
        shard: &ShardKey,
        limit: usize,
    ) -> Result<Vec<PendingMessage>, Error> {
        self.operation("listing a shard's messages", |tables, _| {
            tables.shard_messages(shard, limit)
        })
    }

    async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>, Error> {
        self.operation("listing dead letters", |tables, now| {
            tables.dead_letters(filter, now)
        })
    }

    async fn replay_dead_letters(&self, ids: &[MessageId]) -> Result<Vec<MessageId>, Error> {
        let replayed = self.operation("replaying dead letters", |tables, now| {
            tables.replay_dead_letters(ids, now)
        })??;
        self.notify(replayed.iter().map(|(_, shard)| shard));
        Ok(replayed.into_iter().map(|(id, _)| id).collect())
    }

    async fn purge_dead_letters(&self, ids: &[MessageId]) -> Result<u64, Error> {
        self.operation("purging dead letters", |tables, _| {
            tables.purge_dead_letters(ids)
        })
    }

    async fn pause(&self, target: &PauseTarget, reason: Option<&str>) -> Result<bool, Error> {
        self.operation("pausing", |tables, now| tables.pause(target, reason, now))
    }

    async fn resume(&self, target: &PauseTarget) -> Result<bool, Error> {
        self.operation("resuming", |tables, _| tables.resume(target))
    }

    async fn pauses(&self) -> Result<Vec<Pause>, Error> {
        self.operation("listing pauses", |tables, _| tables.pauses())
    }

    async fn backfills(&self) -> Result<Vec<BackfillState>, Error> {
        self.operation("listing backfills", |tables, _| tables.backfills())
    }

    async fn start_backfill(&self, start: &BackfillStart) -> Result<BackfillState, Error> {
        start.check()?;
        self.operation("starting a backfill", |tables, now| {
            tables.start_backfill(start, now)
        })
    }

    async fn pause_backfill(&self, category: CategoryId) -> Result<bool, Error> {
        self.operation("pausing a backfill", |tables, now| {
            tables.pause_backfill(category, now)
        })
    }

    async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        self.operation("listing the relays", |tables, now| tables.relays(now))
    }
}

/// Wake-ups of a [`MemoryStore`]: one for each write, naming the shards it wrote to.
#[derive(Debug)]
pub struct MemoryWakeups {
    receiver: mpsc::UnboundedReceiver<Vec<ShardKey>>,
}

/// An in-memory outbox as the database of an operators' tool (a test's): nothing to migrate,
/// nothing to close.
impl crate::admin::Database for MemoryStore {
    fn applied_migrations(&self) -> BoxFuture<'_, Result<Vec<i64>, Error>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async { Ok(()) })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

impl WakeupStream for MemoryWakeups {
    async fn next(&mut self) -> Result<Wakeup, Error> {
        match self.receiver.recv().await {
            Some(shards) => Ok(Wakeup::Shards(shards)),
            // The store is gone: nothing will be written again.
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests;
