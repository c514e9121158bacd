//! Recording handlers: they acknowledge every delivery and remember it, in order, so a test
//! can check what was delivered.
//!
//! [`Recording<C>`] is a [`Handler`] of the deliveries of any category `C`; [`ModelRecording<M>`]
//! is both the replication and the deletion handler of a replicated model `M`, and records
//! both kinds of call in one sequence. Clones share what they record, safely across the tasks
//! the relay runs handlers on: register a clone and read the original.
//!
//! ```
//! use outbox_core::Registry;
//! use outbox_testkit::fixtures::{Note, OrgUpdate};
//! use outbox_testkit::recorder::Recording;
//!
//! let recording = Recording::<OrgUpdate>::new();
//! let registry = recording.register(Registry::builder()).build()?;
//! // ... write messages, drain a relay on `registry` ...
//! # let _ = registry;
//! assert_eq!(recording.payloads(), Vec::<Note>::new());
//! # Ok::<(), outbox_core::Error>(())
//! ```
//!
//! To make a recorded handler misbehave, wrap it in a [`Faulty`](crate::faults::Faulty): it
//! then records only the calls that reach it.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use outbox_core::{
    BoxError, Category, Deletion, Delivery, Id, MessageId, RegistryBuilder, ReplicatedModel,
    Replication, ShardKey,
};

use outbox_core::handler::{Handler, HandlerContext};
use tokio::sync::watch;

/// One delivery a [`Recording`] handled (or one deletion a [`ModelRecording`] handled, whose
/// payload is the model's tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recorded<P> {
    /// The shard.
    pub shard: ShardKey,
    /// The object.
    pub object_identifier: Id,
    /// The delivered payload: the newest of its group.
    pub payload: P,
    /// The delivered message.
    pub message_id: MessageId,
    /// The attempt at the shard's head: 1 the first time.
    pub attempt: u32,
    /// The fencing token of the lease the delivery ran under.
    pub fencing_token: i64,
}

/// One replication a [`ModelRecording`] handled.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Replicated<M> {
    /// The object, as the relay read it at delivery.
    pub object: M,
    /// The shard.
    pub shard: ShardKey,
    /// The newest message of the object's group.
    pub message_id: MessageId,
    /// The attempt at the shard's head: 1 the first time.
    pub attempt: u32,
    /// The fencing token of the lease the delivery ran under.
    pub fencing_token: i64,
}

/// One call a [`ModelRecording`] handled.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent<M: Category> {
    /// The object existed at delivery: its replication.
    Replicated(Replicated<M>),
    /// The object was gone at delivery: its deletion, with the tombstone as payload.
    Deleted(Recorded<M::Payload>),
}

impl<M: ReplicatedModel> ModelEvent<M> {
    /// The object's identifier.
    pub fn object_identifier(&self) -> Id {
        match self {
            Self::Replicated(replicated) => replicated.object.object_identifier(),
            Self::Deleted(deleted) => deleted.object_identifier,
        }
    }

    /// The shard.
    pub fn shard(&self) -> &ShardKey {
        match self {
            Self::Replicated(replicated) => &replicated.shard,
            Self::Deleted(deleted) => &deleted.shard,
        }
    }
}

/// What the clones of one recorder share: the entries, and their number for waiters.
struct Log<T> {
    entries: Mutex<Vec<T>>,
    count: watch::Sender<usize>,
}

impl<T> Default for Log<T> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(Vec::new()),
            count: watch::Sender::new(0),
        }
    }
}

impl<T> Log<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<T>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, entry: T) {
        let mut entries = self.lock();
        entries.push(entry);
        self.count.send_replace(entries.len());
    }

    fn take(&self) -> Vec<T> {
        let mut entries = self.lock();
        self.count.send_replace(0);
        std::mem::take(&mut *entries)
    }

    fn map<R>(&self, f: impl FnMut(&T) -> R) -> Vec<R> {
        self.lock().iter().map(f).collect()
    }

    /// Waits until at least `count` entries are recorded; panics after `within`.
    async fn wait_for(&self, count: usize, within: Duration, what: &str) {
        let mut changes = self.count.subscribe();
        let reached = tokio::time::timeout(within, changes.wait_for(|&len| len >= count)).await;
        if reached.is_err() {
            panic!(
                "waited {within:?} for {count} {what}; {} recorded",
                self.lock().len()
            );
        }
    }
}

/// Records every delivery of category `C` it handles, in order, and succeeds.
pub struct Recording<C: Category> {
    log: Arc<Log<Recorded<C::Payload>>>,
    category: PhantomData<fn() -> C>,
}

impl<C: Category> Clone for Recording<C> {
    fn clone(&self) -> Self {
        Self {
            log: Arc::clone(&self.log),
            category: PhantomData,
        }
    }
}

impl<C: Category> Default for Recording<C> {
    fn default() -> Self {
        Self {
            log: Arc::default(),
            category: PhantomData,
        }
    }
}

impl<C: Category> fmt::Debug for Recording<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recording")
            .field("category", &C::NAME)
            .field("recorded", &self.len())
            .finish()
    }
}

impl<C: Category> Recording<C> {
    /// A recording with nothing recorded.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds this recording to `builder` as the handler of `C`.
    pub fn register(&self, builder: RegistryBuilder) -> RegistryBuilder {
        builder.handle::<C>(self.clone())
    }

    /// How many deliveries were recorded.
    pub fn len(&self) -> usize {
        self.log.lock().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes everything recorded so far, in order, leaving the recording empty.
    pub fn take(&self) -> Vec<Recorded<C::Payload>> {
        self.log.take()
    }

    /// The objects of the recorded deliveries, in order.
    pub fn objects(&self) -> Vec<Id> {
        self.log.map(|recorded| recorded.object_identifier)
    }

    /// The shards of the recorded deliveries, in order.
    pub fn shards(&self) -> Vec<ShardKey> {
        self.log.map(|recorded| recorded.shard.clone())
    }

    /// Waits until at least `count` deliveries are recorded (for a relay that runs in the
    /// background); panics, saying how many were, if that takes longer than `within`.
    pub async fn wait_for(&self, count: usize, within: Duration) {
        let what = format!("deliveries of category `{}`", C::NAME);
        self.log.wait_for(count, within, &what).await;
    }
}

impl<C: Category> Recording<C>
where
    C::Payload: Clone,
{
    /// Everything recorded so far, in order.
    pub fn seen(&self) -> Vec<Recorded<C::Payload>> {
        self.log.map(Clone::clone)
    }

    /// The recorded payloads, in order.
    pub fn payloads(&self) -> Vec<C::Payload> {
        self.log.map(|recorded| recorded.payload.clone())
    }

    /// `(object, payload)` of each recorded delivery, in order.
    pub fn objects_and_payloads(&self) -> Vec<(Id, C::Payload)> {
        self.log
            .map(|recorded| (recorded.object_identifier, recorded.payload.clone()))
    }

    /// The deliveries recorded in `shard`, in order.
    pub fn in_shard(&self, shard: &ShardKey) -> Vec<Recorded<C::Payload>> {
        self.log
            .lock()
            .iter()
            .filter(|recorded| &recorded.shard == shard)
            .cloned()
            .collect()
    }
}

impl<C: Category> Handler<Delivery<C>> for Recording<C> {
    async fn call(
        &self,
        delivery: Delivery<C>,
        _cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        self.log.push(Recorded {
            shard: delivery.shard,
            object_identifier: delivery.object_identifier,
            payload: delivery.payload,
            message_id: delivery.message_id,
            attempt: delivery.attempt,
            fencing_token: delivery.fencing_token,
        });
        Ok(())
    }
}

/// Records every replication and deletion of replicated model `M` it handles, in one
/// sequence, in order, and succeeds.
pub struct ModelRecording<M: ReplicatedModel> {
    log: Arc<Log<ModelEvent<M>>>,
}

impl<M: ReplicatedModel> Clone for ModelRecording<M> {
    fn clone(&self) -> Self {
        Self {
            log: Arc::clone(&self.log),
        }
    }
}

impl<M: ReplicatedModel> Default for ModelRecording<M> {
    fn default() -> Self {
        Self {
            log: Arc::default(),
        }
    }
}

impl<M: ReplicatedModel> fmt::Debug for ModelRecording<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelRecording")
            .field("model", &M::NAME)
            .field("recorded", &self.len())
            .finish()
    }
}

impl<M: ReplicatedModel> ModelRecording<M> {
    /// A recording with nothing recorded.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds this recording to `builder` as both the replication and the deletion handler of
    /// `M`.
    pub fn register(&self, builder: RegistryBuilder) -> RegistryBuilder {
        builder
            .replication::<M>(self.clone())
            .deletion::<M>(self.clone())
    }

    /// How many replications and deletions were recorded.
    pub fn len(&self) -> usize {
        self.log.lock().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes everything recorded so far, in order, leaving the recording empty.
    pub fn take(&self) -> Vec<ModelEvent<M>> {
        self.log.take()
    }

    /// The objects of the recorded replications and deletions, in order.
    pub fn objects(&self) -> Vec<Id> {
        self.log.map(ModelEvent::object_identifier)
    }

    /// The identifiers of the deleted objects, in order.
    pub fn deleted(&self) -> Vec<Id> {
        self.log
            .lock()
            .iter()
            .filter_map(|event| match event {
                ModelEvent::Deleted(deleted) => Some(deleted.object_identifier),
                ModelEvent::Replicated(_) => None,
            })
            .collect()
    }

    /// Waits until at least `count` calls are recorded; panics, saying how many were, if that
    /// takes longer than `within`.
    pub async fn wait_for(&self, count: usize, within: Duration) {
        let what = format!("replications or deletions of model `{}`", M::NAME);
        self.log.wait_for(count, within, &what).await;
    }
}

impl<M: ReplicatedModel + Clone> ModelRecording<M>
where
    M::Payload: Clone,
{
    /// Everything recorded so far, in order.
    pub fn events(&self) -> Vec<ModelEvent<M>> {
        self.log.map(Clone::clone)
    }

    /// The objects replicated, as read at delivery, in order.
    pub fn replicated(&self) -> Vec<M> {
        self.log
            .lock()
            .iter()
            .filter_map(|event| match event {
                ModelEvent::Replicated(replicated) => Some(replicated.object.clone()),
                ModelEvent::Deleted(_) => None,
            })
            .collect()
    }

    /// The tombstones handed to the deletion handler, in order.
    pub fn tombstones(&self) -> Vec<M::Payload> {
        self.log
            .lock()
            .iter()
            .filter_map(|event| match event {
                ModelEvent::Deleted(deleted) => Some(deleted.payload.clone()),
                ModelEvent::Replicated(_) => None,
            })
            .collect()
    }
}

impl<M: ReplicatedModel> Handler<Replication<M>> for ModelRecording<M> {
    async fn call(
        &self,
        replication: Replication<M>,
        _cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        self.log.push(ModelEvent::Replicated(Replicated {
            object: replication.object,
            shard: replication.shard,
            message_id: replication.message_id,
            attempt: replication.attempt,
            fencing_token: replication.fencing_token,
        }));
        Ok(())
    }
}

impl<M: ReplicatedModel> Handler<Deletion<M>> for ModelRecording<M> {
    async fn call(
        &self,
        deletion: Deletion<M>,
        _cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        self.log.push(ModelEvent::Deleted(Recorded {
            shard: deletion.shard,
            object_identifier: deletion.object_identifier,
            payload: deletion.payload,
            message_id: deletion.message_id,
            attempt: deletion.attempt,
            fencing_token: deletion.fencing_token,
        }));
        Ok(())
    }
}
