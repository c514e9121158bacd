//! Delivering replicated models: the relay reads the object's row, then runs the model's
//! replication handler if it is there, or its deletion handler if it is gone.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::error::{BoxError, DeliveryError};
use crate::handler::{
    BoxFuture, Delivery, ErasedHandler, HandlerContext, RawDelivery, handler_failed,
};
use crate::model::{Category, Destination, MessageId, ShardKey};
use crate::replicated::{ReplicatedModel, model_from_row};

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
}

/// A replicated model whose row is gone at delivery: its identifiers and the tombstone its
/// last write saved.
#[derive(Debug)]
#[non_exhaustive]
pub struct Deletion<M: Category> {
    /// The deleted object's identifier.
    pub object_identifier: i64,
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
}

macro_rules! shard_accessors {
    ($($delivery:ident),*) => {$(
        impl<M: Category> $delivery<M> {
            /// The shard identifier (an organization id, a user id...).
            pub fn shard_identifier(&self) -> i64 {
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

/// Handles the [`Replication`]s of model `M`: create or update its copy elsewhere.
///
/// Closures `Fn(Replication<M>) -> impl Future<Output = Result<(), E>>` are replication
/// handlers; implement the trait to reach the [`HandlerContext`].
pub trait ReplicationHandler<M>: Send + Sync + 'static {
    /// Handles one replication. An error leaves the object pending and backs the shard off.
    fn replicate(
        &self,
        replication: Replication<M>,
        cx: &mut HandlerContext<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// Handles the [`Deletion`]s of model `M`: remove its copy elsewhere.
///
/// Closures `Fn(Deletion<M>) -> impl Future<Output = Result<(), E>>` are deletion handlers;
/// implement the trait to reach the [`HandlerContext`].
pub trait DeletionHandler<M: Category>: Send + Sync + 'static {
    /// Handles one deletion. An error leaves the object pending and backs the shard off.
    fn delete(
        &self,
        deletion: Deletion<M>,
        cx: &mut HandlerContext<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
}

impl<M, F, Fut, E> ReplicationHandler<M> for F
where
    M: Send + 'static,
    F: Fn(Replication<M>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: Into<BoxError>,
{
    async fn replicate(
        &self,
        replication: Replication<M>,
        _cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        self(replication).await.map_err(Into::into)
    }
}

impl<M, F, Fut, E> DeletionHandler<M> for F
where
    M: Category,
    F: Fn(Deletion<M>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: Into<BoxError>,
{
    async fn delete(
        &self,
        deletion: Deletion<M>,
        _cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        self(deletion).await.map_err(Into::into)
    }
}

/// A replication handler with its model erased: it runs when the relay found the row.
pub(crate) struct TypedReplication<M, H> {
    handler: H,
    model: PhantomData<fn() -> M>,
}

impl<M, H> TypedReplication<M, H> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler,
            model: PhantomData,
        }
    }
}

impl<M: ReplicatedModel, H: ReplicationHandler<M>> ErasedHandler for TypedReplication<M, H> {
    fn call<'a>(
        &'a self,
        delivery: RawDelivery<'a>,
        cx: &'a mut HandlerContext<'_>,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let message_id = delivery.message.id;
            let object_identifier = delivery.message.object_identifier;
            let row = delivery.row.unwrap_or_default();
            let object = model_from_row::<M>(row).map_err(|source| DeliveryError::Row {
                model: M::NAME,
                table: M::TABLE.table,
                object_identifier,
                source,
            })?;
            let replication = Replication {
                object,
                shard: delivery.shard.clone(),
                message_id,
                attempt: delivery.attempt,
                fencing_token: delivery.fencing_token,
            };
            self.handler
                .replicate(replication, cx)
                .await
                .map_err(handler_failed::<M>(message_id))
        })
    }
}

/// A deletion handler with its model erased: it runs when the row is gone.
pub(crate) struct TypedDeletion<M, H> {
    handler: H,
    model: PhantomData<fn() -> M>,
}

impl<M, H> TypedDeletion<M, H> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler,
            model: PhantomData,
        }
    }
}

impl<M: ReplicatedModel, H: DeletionHandler<M>> ErasedHandler for TypedDeletion<M, H> {
    fn call<'a>(
        &'a self,
        delivery: RawDelivery<'a>,
        cx: &'a mut HandlerContext<'_>,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let Delivery {
                shard,
                object_identifier,
                payload,
                message_id,
                attempt,
                fencing_token,
            } = delivery.typed::<M>()?;
            let deletion = Deletion {
                object_identifier,
                shard,
                payload,
                message_id,
                attempt,
                fencing_token,
            };
            self.handler
                .delete(deletion, cx)
                .await
                .map_err(handler_failed::<M>(message_id))
        })
    }
}

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
