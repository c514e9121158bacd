//! Handlers: the user code a delivered message runs.
//!
//! One abstraction, in the way of axum's extractors: a [`Handler<D>`] handles deliveries of
//! kind `D` ([`Delivery<C>`], [`Replication<M>`](crate::Replication) or
//! [`Deletion<M>`](crate::Deletion)). An `#[outbox_handler]` async fn, a closure given through
//! [`handler_fn`], or a closure taking only its delivery is one; what it takes after its
//! delivery ([`State<T>`], [`Connection<'_, T>`](Connection)) is made from the
//! [`HandlerContext`] of each call, and what that needs is declared up front
//! ([`Handler::requires`]) and checked when the registry is built.

mod erased;
mod error;
mod extract;
mod function;
mod replication;
mod state;

use std::future::Future;
use std::time::SystemTime;

pub use crate::categories::Deliverable;
use crate::error::BoxError;
use crate::id::Id;
use crate::metadata::Metadata;
use crate::model::{Destination, MessageId, ShardKey};

pub(crate) use self::erased::{
    ErasedHandler, FromRaw, NoOpErased, Pipeline, Pipelined, RawDelivery, erase,
};
pub use self::error::{DeliveryError, ExtractError};
pub use self::extract::{Connection, FromContext, HandlerContext, Requirements, State};
pub use self::function::{
    FnHandler, HandlerFn, HandlerOutput, WithConnection, handler_fn, with_connection,
};
pub(crate) use self::replication::ModelDispatch;
pub use self::replication::{Deletion, Replication};
pub(crate) use self::state::StateMap;

pub use crate::future::BoxFuture;

/// One delivery of a coalescing group (or of one message, for non-coalescing categories).
///
/// Delivery is at-least-once: a handler must be idempotent.
#[derive(Debug)]
#[non_exhaustive]
pub struct Delivery<C: Deliverable> {
    /// The shard the message belongs to.
    pub shard: ShardKey,
    /// The object the message is about.
    pub object_identifier: Id,
    /// The newest payload of the group.
    pub payload: C::Payload,
    /// The newest message of the group: the one whose payload is delivered.
    pub message_id: MessageId,
    /// Which attempt at the shard's head this is: 1 the first time, more after failures.
    pub attempt: u32,
    /// The fencing token of the lease under which the delivery runs. It increases with every
    /// claim of the shard, so a downstream system can refuse writes from a stale worker.
    pub fencing_token: i64,
    /// When the delivered message was written (the database's clock: on PostgreSQL, the start
    /// of the writing transaction).
    pub created_at: SystemTime,
    /// The delivered message's metadata: the producer's trace context, and entries set with
    /// [`Message::with_metadata`](crate::Message::with_metadata).
    pub metadata: Metadata,
}

impl<C: Deliverable> Delivery<C> {
    /// The shard identifier (an organization id, a user id...).
    pub fn shard_identifier(&self) -> Id {
        self.shard.shard_identifier
    }

    /// The fan-out destination, for fan-out outboxes.
    pub fn destination(&self) -> Option<&Destination> {
        self.shard.destination.as_ref()
    }
}

/// What a handler's first argument is: [`Delivery<C>`], [`Replication<M>`](crate::Replication)
/// or [`Deletion<M>`](crate::Deletion). Each tells where and how often it was delivered.
pub trait DeliveryKind: Send + Sized + 'static {
    /// The shard the message belongs to.
    fn shard(&self) -> &ShardKey;
    /// The object the message is about.
    fn object_identifier(&self) -> Id;
    /// The newest message of the group: the one delivered.
    fn message_id(&self) -> MessageId;
    /// Which attempt at the shard's head this is: 1 the first time, more after failures or a
    /// takeover.
    fn attempt(&self) -> u32;
    /// The fencing token of the lease under which the delivery runs.
    fn fencing_token(&self) -> i64;
    /// When the delivered message was written.
    fn created_at(&self) -> SystemTime;
    /// The delivered message's metadata.
    fn metadata(&self) -> &Metadata;
}

/// Implements [`DeliveryKind`] for a delivery type whose fields are named alike; `$object`
/// reads its object's identifier from `$this`.
macro_rules! delivery_kind {
    ($delivery:ident<$param:ident: $bound:path>, |$this:ident| $object:expr) => {
        impl<$param: $bound> $crate::handler::DeliveryKind for $delivery<$param> {
            fn shard(&self) -> &$crate::model::ShardKey {
                &self.shard
            }
            fn object_identifier(&self) -> $crate::Id {
                let $this = self;
                $object
            }
            fn message_id(&self) -> $crate::model::MessageId {
                self.message_id
            }
            fn attempt(&self) -> u32 {
                self.attempt
            }
            fn fencing_token(&self) -> i64 {
                self.fencing_token
            }
            fn created_at(&self) -> ::std::time::SystemTime {
                self.created_at
            }
            fn metadata(&self) -> &$crate::metadata::Metadata {
                &self.metadata
            }
        }
    };
}
pub(crate) use delivery_kind;

delivery_kind!(Delivery<C: Deliverable>, |delivery| delivery.object_identifier);

/// Handles deliveries of kind `D`: every [`Delivery<C>`] of a category, or the
/// [`Replication<M>`](crate::Replication)s or [`Deletion<M>`](crate::Deletion)s of a
/// replicated model.
///
/// Handlers are usually functions: an `#[outbox_handler]` async fn, a closure taking only its
/// delivery (`|delivery: Delivery<C>| async move { .. }`), or a closure taking more arguments
/// wrapped in [`handler_fn`]. Implement the trait directly for a handler type of your own;
/// declare in [`Handler::requires`] what it takes from the [`HandlerContext`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox handler of `{D}`",
    label = "not a handler of `{D}`",
    note = "a handler is an `#[outbox_handler]` async fn, a closure `|delivery: {D}| async move {{ .. }}` returning `Result<(), E>`, a closure taking more arguments (`State<T>`, ..) wrapped in `outbox_core::handler_fn(..)`, or a type implementing `Handler<{D}>`"
)]
pub trait Handler<D>: Send + Sync + 'static {
    /// Declares what the handler takes from the registry (its [`State`]s), checked when the
    /// registry is built. Nothing, by default.
    fn requires(&self, requirements: &mut Requirements) {
        let _ = requirements;
    }

    /// Handles one delivery. An error leaves the group pending and backs the shard off.
    fn call(
        &self,
        delivery: D,
        cx: &mut HandlerContext<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
}

impl<D, F, Fut, E> Handler<D> for F
where
    D: DeliveryKind,
    F: Fn(D) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: Into<BoxError>,
{
    async fn call(&self, delivery: D, _cx: &mut HandlerContext<'_>) -> Result<(), BoxError> {
        self(delivery).await.map_err(Into::into)
    }
}

/// A handler that acknowledges every delivery without doing anything: the explicit way to
/// declare that a category needs no handler.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoOp;

impl<D: DeliveryKind> Handler<D> for NoOp {
    async fn call(&self, _delivery: D, _cx: &mut HandlerContext<'_>) -> Result<(), BoxError> {
        Ok(())
    }
}
