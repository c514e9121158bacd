//! Handlers: the user code a delivered message runs.

use std::any::Any;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use crate::error::{BoxError, DeliveryError};
use crate::model::{Category, Destination, MessageId, Payload, ShardKey};
use crate::registry::StateMap;
use crate::store::StoredMessage;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One delivery of a coalescing group (or of one message, for non-coalescing categories).
///
/// Delivery is at-least-once: a handler must be idempotent.
#[derive(Debug)]
#[non_exhaustive]
pub struct Delivery<C: Category> {
    /// The shard the message belongs to.
    pub shard: ShardKey,
    /// The object the message is about.
    pub object_identifier: i64,
    /// The newest payload of the group.
    pub payload: C::Payload,
    /// The newest message of the group: the one whose payload is delivered.
    pub message_id: MessageId,
    /// Which attempt at the shard's head this is: 1 the first time, more after failures.
    pub attempt: u32,
    /// The fencing token of the lease under which the delivery runs. It increases with every
    /// claim of the shard, so a downstream system can refuse writes from a stale worker.
    pub fencing_token: i64,
}

impl<C: Category> Delivery<C> {
    /// The shard identifier (an organization id, a user id...).
    pub fn shard_identifier(&self) -> i64 {
        self.shard.shard_identifier
    }

    /// The fan-out destination, for fan-out outboxes.
    pub fn destination(&self) -> Option<&Destination> {
        self.shard.destination.as_ref()
    }
}

/// What a handler may use besides the message.
///
/// In the in-transaction handler mode it lends the transaction that claimed the shard, so the
/// handler's writes to the same database commit atomically with the acknowledgement.
pub struct HandlerContext<'a> {
    connection: Option<&'a mut (dyn Any + Send)>,
    state: Option<&'a StateMap>,
}

impl<'a> HandlerContext<'a> {
    /// A context; backends pass the claiming transaction's connection in transaction mode.
    pub fn new(connection: Option<&'a mut (dyn Any + Send)>) -> Self {
        Self {
            connection,
            state: None,
        }
    }

    pub(crate) fn with_state(mut self, state: &'a StateMap) -> Self {
        self.state = Some(state);
        self
    }

    /// The value of type `T` given to [`RegistryBuilder::state`](crate::RegistryBuilder::state)
    /// (a pool on another database, a client...), or `None` if none was.
    pub fn state<T: Any>(&self) -> Option<&T> {
        self.state?.get::<T>()
    }

    /// Whether the handler runs inside the claiming transaction.
    pub fn in_transaction(&self) -> bool {
        self.connection.is_some()
    }

    /// The claiming transaction's connection, as the backend's connection type
    /// (`sqlx::PgConnection`, `sqlx::SqliteConnection`). `None` outside transaction mode, or if
    /// `T` is not the backend's connection type.
    pub fn connection<T: Any>(&mut self) -> Option<&mut T> {
        self.connection.as_deref_mut()?.downcast_mut::<T>()
    }
}

impl std::fmt::Debug for HandlerContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerContext")
            .field("in_transaction", &self.in_transaction())
            .finish()
    }
}

/// Handles the deliveries of one category.
///
/// Closures `Fn(Delivery<C>) -> impl Future<Output = Result<(), E>>` are handlers; implement the
/// trait directly to reach the [`HandlerContext`].
pub trait Handler<C: Category>: Send + Sync + 'static {
    /// Handles one delivery. An error leaves the group pending and backs the shard off.
    fn handle(
        &self,
        delivery: Delivery<C>,
        cx: &mut HandlerContext<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
}

impl<C, F, Fut, E> Handler<C> for F
where
    C: Category,
    F: Fn(Delivery<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: Into<BoxError>,
{
    async fn handle(
        &self,
        delivery: Delivery<C>,
        _cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        self(delivery).await.map_err(Into::into)
    }
}

/// A handler that acknowledges every delivery without doing anything: the explicit way to
/// declare that a category needs no handler.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoOp;

impl<C: Category> Handler<C> for NoOp {
    async fn handle(
        &self,
        _delivery: Delivery<C>,
        _cx: &mut HandlerContext<'_>,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}

/// The handler of a category declared `no_op` that nobody registered a handler for.
pub(crate) struct NoOpErased;

impl ErasedHandler for NoOpErased {
    fn call<'a>(
        &'a self,
        _delivery: RawDelivery<'a>,
        _cx: &'a mut HandlerContext<'_>,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async { Ok(()) })
    }
}

/// What the relay hands a type-erased handler.
#[derive(Debug)]
pub(crate) struct RawDelivery<'a> {
    pub(crate) shard: &'a ShardKey,
    pub(crate) message: &'a StoredMessage,
    pub(crate) attempt: u32,
    pub(crate) fencing_token: i64,
    /// For a replicated model: its row as JSON, if the relay found it.
    pub(crate) row: Option<&'a str>,
}

impl RawDelivery<'_> {
    /// The delivery with its payload read as category `C`'s (S21: a payload that no longer
    /// reads is a precise failure).
    pub(crate) fn typed<C: Category>(&self) -> Result<Delivery<C>, DeliveryError> {
        let message_id = self.message.id;
        let payload =
            <C::Payload as Payload>::from_json_str(&self.message.payload).map_err(|source| {
                DeliveryError::Payload {
                    category: C::NAME,
                    message_id,
                    source,
                }
            })?;
        Ok(Delivery {
            shard: self.shard.clone(),
            object_identifier: self.message.object_identifier,
            payload,
            message_id,
            attempt: self.attempt,
            fencing_token: self.fencing_token,
        })
    }
}

/// A handler's error, as the failure of the delivery of `message_id` of category `C`.
pub(crate) fn handler_failed<C: Category>(
    message_id: MessageId,
) -> impl FnOnce(BoxError) -> DeliveryError {
    move |source| DeliveryError::Handler {
        category: C::NAME,
        message_id,
        source,
    }
}

/// A handler with its category erased, as the registry stores it.
pub(crate) trait ErasedHandler: Send + Sync {
    fn call<'a>(
        &'a self,
        delivery: RawDelivery<'a>,
        cx: &'a mut HandlerContext<'_>,
    ) -> BoxFuture<'a, Result<(), DeliveryError>>;
}

pub(crate) struct Typed<C, H> {
    handler: H,
    category: PhantomData<fn() -> C>,
}

impl<C, H> Typed<C, H> {
    pub(crate) fn new(handler: H) -> Self {
        Self {
            handler,
            category: PhantomData,
        }
    }
}

impl<C: Category, H: Handler<C>> ErasedHandler for Typed<C, H> {
    fn call<'a>(
        &'a self,
        delivery: RawDelivery<'a>,
        cx: &'a mut HandlerContext<'_>,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let typed = delivery.typed::<C>()?;
            let message_id = typed.message_id;
            self.handler
                .handle(typed, cx)
                .await
                .map_err(handler_failed::<C>(message_id))
        })
    }
}
