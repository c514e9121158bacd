//! Handlers as the registry stores them: their delivery kind erased behind one call taking the
//! message as the relay read it.

use std::marker::PhantomData;

use super::error::{DeliveryError, ExtractError};
use super::extract::HandlerContext;
use super::replication::{Deletion, Replication};
use super::{BoxFuture, Delivery, Handler};
use crate::breaker::Unavailable;
use crate::categories::Deliverable;
use crate::columns::ModelRow;
use crate::error::BoxError;
use crate::metadata::Metadata;
use crate::model::{MessageId, ShardKey};
use crate::replicated::ReplicatedModel;
use crate::store::StoredMessage;

/// What the relay hands a type-erased handler.
#[derive(Debug)]
pub(crate) struct RawDelivery<'a> {
    /// The category's name, as the registry knows it.
    pub(crate) category: &'static str,
    /// The name of the category's scope.
    pub(crate) scope_name: &'static str,
    pub(crate) shard: &'a ShardKey,
    pub(crate) message: &'a StoredMessage,
    pub(crate) attempt: u32,
    pub(crate) fencing_token: i64,
    /// For a replicated model: its row, if the relay found it.
    pub(crate) row: Option<&'a ModelRow>,
}

impl RawDelivery<'_> {
    /// The message's metadata (metadata that does not read is a precise failure).
    fn metadata(&self) -> Result<Metadata, DeliveryError> {
        match &self.message.metadata {
            None => Ok(Metadata::new()),
            Some(json) => Metadata::from_json(json).map_err(|source| DeliveryError::Metadata {
                category: self.category,
                message_id: self.message.id,
                source,
            }),
        }
    }
}

/// A delivery kind made from what the relay read.
pub(crate) trait FromRaw: Sized {
    /// The delivery (a payload or row that no longer reads is a precise failure).
    fn from_raw(raw: &RawDelivery<'_>) -> Result<Self, DeliveryError>;
}

impl<C: Deliverable> FromRaw for Delivery<C> {
    fn from_raw(raw: &RawDelivery<'_>) -> Result<Self, DeliveryError> {
        let message_id = raw.message.id;
        let payload = C::decode(raw.message.category, &raw.message.payload).map_err(|source| {
            DeliveryError::Payload {
                category: raw.category,
                message_id,
                source,
            }
        })?;
        Ok(Delivery {
            shard: raw.shard.clone(),
            object_identifier: raw.message.object_identifier,
            payload,
            message_id,
            attempt: raw.attempt,
            fencing_token: raw.fencing_token,
            created_at: raw.message.created_at,
            metadata: raw.metadata()?,
        })
    }
}

impl<M: ReplicatedModel> FromRaw for Replication<M> {
    fn from_raw(raw: &RawDelivery<'_>) -> Result<Self, DeliveryError> {
        let object_identifier = raw.message.object_identifier;
        let object = match raw.row {
            Some(row) => row.deserialize::<M>(),
            None => ModelRow::new().deserialize::<M>(),
        };
        let object = object.map_err(|source| DeliveryError::Row {
            model: raw.category,
            table: M::TABLE.table,
            object_identifier,
            source,
        })?;
        Ok(Replication {
            object,
            shard: raw.shard.clone(),
            message_id: raw.message.id,
            attempt: raw.attempt,
            fencing_token: raw.fencing_token,
            created_at: raw.message.created_at,
            metadata: raw.metadata()?,
        })
    }
}

impl<M: ReplicatedModel> FromRaw for Deletion<M> {
    fn from_raw(raw: &RawDelivery<'_>) -> Result<Self, DeliveryError> {
        let Delivery {
            shard,
            object_identifier,
            payload,
            message_id,
            attempt,
            fencing_token,
            created_at,
            metadata,
        } = Delivery::<M>::from_raw(raw)?;
        Ok(Deletion {
            object_identifier,
            shard,
            payload,
            message_id,
            attempt,
            fencing_token,
            created_at,
            metadata,
        })
    }
}

/// A handler with its delivery kind erased, as the registry stores it.
pub(crate) trait ErasedHandler: Send + Sync {
    fn call<'a>(
        &'a self,
        delivery: RawDelivery<'a>,
        cx: &'a mut HandlerContext<'_>,
    ) -> BoxFuture<'a, Result<(), DeliveryError>>;

    /// The handler's way of taking several consecutive groups of a shard at once, if it has
    /// one (a sink's publisher, which pipelines them).
    fn pipeline(&self) -> Option<&dyn Pipeline> {
        None
    }
}

/// A handler that takes several consecutive groups of one shard at once, in order.
pub(crate) trait Pipeline: Send + Sync {
    /// Delivers `deliveries` in order: how many, from the first, got through, and the error of
    /// the first that did not.
    fn call_all<'a>(&'a self, deliveries: &'a [RawDelivery<'a>]) -> BoxFuture<'a, Pipelined>;
}

/// What [`Pipeline::call_all`] got through.
#[derive(Debug, Default)]
pub(crate) struct Pipelined {
    /// How many deliveries, from the first, got through.
    pub(crate) confirmed: usize,
    /// Why the next one did not, if one did not.
    pub(crate) error: Option<DeliveryError>,
    /// The deliveries after the failed one that got through all the same (a broker that
    /// stored them after refusing it), by index, ascending.
    pub(crate) confirmed_after: Vec<usize>,
}

impl Pipelined {
    /// `confirmed` deliveries got through, then one failed with `error`.
    pub(crate) fn failed(confirmed: usize, error: DeliveryError) -> Self {
        Self {
            confirmed,
            error: Some(error),
            confirmed_after: Vec::new(),
        }
    }
}

/// `H`, a handler of `D`, erased.
struct Erased<D, H> {
    handler: H,
    kind: PhantomData<fn() -> D>,
}

/// Erases `handler`'s delivery kind.
pub(crate) fn erase<D, H>(handler: H) -> impl ErasedHandler
where
    D: FromRaw + 'static,
    H: Handler<D>,
{
    Erased {
        handler,
        kind: PhantomData,
    }
}

impl<D: FromRaw + 'static, H: Handler<D>> ErasedHandler for Erased<D, H> {
    fn call<'a>(
        &'a self,
        raw: RawDelivery<'a>,
        cx: &'a mut HandlerContext<'_>,
    ) -> BoxFuture<'a, Result<(), DeliveryError>> {
        Box::pin(async move {
            let delivery = D::from_raw(&raw)?;
            self.handler
                .call(delivery, cx)
                .await
                .map_err(|source| handler_failed(raw.category, raw.message.id, source))
        })
    }
}

/// A handler's error as the failure of a delivery: an argument it could not be given, its
/// downstream system unreachable ([`Unavailable`]), or its own error.
fn handler_failed(
    category: &'static str,
    message_id: MessageId,
    source: BoxError,
) -> DeliveryError {
    let source = match source.downcast::<ExtractError>() {
        Ok(extract) => {
            return DeliveryError::Extract {
                category,
                message_id,
                source: *extract,
            };
        }
        Err(source) => source,
    };
    match source.downcast::<Unavailable>() {
        Ok(unavailable) => DeliveryError::Unavailable {
            category,
            message_id,
            source: *unavailable,
        },
        Err(source) => DeliveryError::Handler {
            category,
            message_id,
            source,
        },
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
