//! Delivering replicated models: the relay reads the object's row, then runs the model's
//! replication handler if it is there, or its deletion handler if it is gone.

use std::sync::Arc;
use std::time::SystemTime;

use super::{BoxFuture, DeliveryError, ErasedHandler, HandlerContext, RawDelivery, delivery_kind};
use crate::id::{Id, IdOutOfRange, Identifier};
use crate::metadata::Metadata;
use crate::model::{Category, Destination, MessageId, ShardKey};
use crate::replicated::ReplicatedModel;

/// A replicated model that exists at delivery: its row as it is now.
///
/// Delivery is at-least-once and coalesced: a handler must be idempotent, and sees the
/// object's current state, not each intermediate one.
#[derive(Debug)]
#[non_exhaustive]
pub struct Replication<M> {
    /// The object, read from its table at delivery.
    pub object: M,
    /// The shard the outbox was written to.
    pub shard: ShardKey,
    /// The newest outbox message of the object's group.
    pub message_id: MessageId,
    /// Which attempt at the shard's head this is: 1 the first time.
    pub attempt: u32,
    /// The fencing token of the lease under which the delivery runs.
    pub fencing_token: i64,
    /// When the delivered message was written (the database's clock).
    pub created_at: SystemTime,
    /// The delivered message's metadata: the producer's trace context, if any.
    pub metadata: Metadata,
}

/// A replicated model whose row is gone at delivery: its identifiers and the tombstone its
/// last write saved.
#[derive(Debug)]
#[non_exhaustive]
pub struct Deletion<M: Category> {
    /// The deleted object's identifier ([`Deletion::key`]: as the model's key type).
    pub object_identifier: Id,
    /// The shard the outbox was written to.
    pub shard: ShardKey,
    /// The tombstone saved by the object's last write ([`ReplicatedModel::tombstone`]).
    pub payload: M::Payload,
    /// The newest outbox message of the object's group.
    pub message_id: MessageId,
    /// Which attempt at the shard's head this is: 1 the first time.
    pub attempt: u32,
    /// The fencing token of the lease under which the delivery runs.
    pub fencing_token: i64,
    /// When the delivered message was written (the database's clock).
    pub created_at: SystemTime,
    /// The delivered message's metadata: the producer's trace context, if any.
    pub metadata: Metadata,
}

macro_rules! shard_accessors {
    ($($delivery:ident),*) => {$(
        impl<M: Category> $delivery<M> {
            /// The shard identifier (an organization id, a user id...).
            pub fn shard_identifier(&self) -> Id {
                self.shard.shard_identifier
            }

            /// The fan-out destination, for fan-out models.
            pub fn destination(&self) -> Option<&Destination> {
                self.shard.destination.as_ref()
            }
        }
    )*};
}

shard_accessors!(Replication, Deletion);

impl<M: ReplicatedModel> Deletion<M> {
    /// The deleted object's key, as the model's key field has it: the row to delete
    /// downstream. An error only if the outbox row holds an identifier of another kind (one
    /// written around the typed API).
    pub fn key(&self) -> Result<M::Key, IdOutOfRange> {
        M::Key::from_id(self.object_identifier).ok_or(IdOutOfRange {
            id: self.object_identifier,
            target: std::any::type_name::<M::Key>(),
        })
    }
}

delivery_kind!(Replication<M: ReplicatedModel>, |replication| replication
    .object
    .object_identifier());
delivery_kind!(Deletion<M: ReplicatedModel>, |deletion| deletion.object_identifier);

/// The handler of a replicated model's category: replication if the relay found the row,
/// deletion if it did not.
pub(crate) struct ModelDispatch {
    pub(crate) replication: Arc<dyn ErasedHandler>,
    pub(crate) deletion: Arc<dyn ErasedHandler>,
}

impl ErasedHandler for ModelDispatch {
    fn call<'a>(
        &'a self,
        delivery: RawDelivery<'a>,
        cx: &'a mut HandlerContext<'_>,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        if delivery.row.is_some() {
            self.replication.call(delivery, cx)
        } else {
            self.deletion.call(delivery, cx)
        }
    }
}
