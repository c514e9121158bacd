//! Why a delivery failed, and why a handler could not be given an argument.

use std::time::Duration;

use crate::breaker::Unavailable;
use crate::error::{BoxError, Error};
use crate::model::{CategoryId, MessageId, ScopeId};

/// Why one delivery failed. Stored (with its causes) as the shard's last error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// The handler returned an error.
    #[error("handler for category `{category}` failed on message {message_id}")]
    Handler {
        /// The category's name.
        category: &'static str,
        /// The newest message of the delivered group.
        message_id: MessageId,
        /// The handler's error.
        #[source]
        source: BoxError,
    },

    /// The stored payload no longer deserializes into the category's payload type.
    #[error(
        "payload of message {message_id} does not deserialize as the payload of category `{category}`"
    )]
    Payload {
        /// The category's name.
        category: &'static str,
        /// The message whose payload is malformed.
        message_id: MessageId,
        /// The deserializer's error, with line and column.
        #[source]
        source: serde_json::Error,
    },

    /// The stored metadata is not a JSON object of strings (the row was written around the
    /// typed API).
    #[error(
        "metadata of message {message_id} of category `{category}` is not a JSON object of strings"
    )]
    Metadata {
        /// The category's name.
        category: &'static str,
        /// The message whose metadata is malformed.
        message_id: MessageId,
        /// The deserializer's error.
        #[source]
        source: serde_json::Error,
    },

    /// The relay could not read a replicated model's row.
    #[error(
        "reading object {object_identifier} of replicated model `{model}` from `{table}` failed"
    )]
    Lookup {
        /// The model's category name.
        model: &'static str,
        /// The model's table.
        table: &'static str,
        /// The object.
        object_identifier: crate::id::Id,
        /// The store's error.
        #[source]
        source: Box<Error>,
    },

    /// A replicated model's row does not deserialize into the model.
    #[error(
        "row {object_identifier} of `{table}` does not deserialize as replicated model `{model}`"
    )]
    Row {
        /// The model's category name.
        model: &'static str,
        /// The model's table.
        table: &'static str,
        /// The object.
        object_identifier: crate::id::Id,
        /// The deserializer's error.
        #[source]
        source: serde_json::Error,
    },

    /// The handler could not be given one of its arguments (its connection outside
    /// [`HandlerMode::InTransaction`](crate::HandlerMode::InTransaction), for example).
    #[error("handler for category `{category}` could not be called on message {message_id}")]
    Extract {
        /// The category's name.
        category: &'static str,
        /// The newest message of the delivered group.
        message_id: MessageId,
        /// Which argument, and why.
        #[source]
        source: ExtractError,
    },

    /// The handler panicked.
    #[error("handler for category `{category}` panicked on message {message_id}: {panic}")]
    Panicked {
        /// The category's name.
        category: &'static str,
        /// The newest message of the delivered group.
        message_id: MessageId,
        /// The panic message.
        panic: String,
    },

    /// The handler ran longer than the configured handler timeout.
    #[error(
        "handler for category `{category}` did not finish within {timeout:?} on message {message_id}"
    )]
    TimedOut {
        /// The category's name.
        category: &'static str,
        /// The newest message of the delivered group.
        message_id: MessageId,
        /// The configured timeout.
        timeout: Duration,
    },

    /// The handler's downstream system (a sink's broker) is unreachable: its breaker is open.
    /// The relay parks the shard until the breaker closes, and counts no attempt (nothing
    /// says the message is wrong).
    #[error("handler for category `{category}` could not reach its system on message {message_id}")]
    Unavailable {
        /// The category's name.
        category: &'static str,
        /// The newest message of the delivered group.
        message_id: MessageId,
        /// The breaker, and why the system is thought unreachable.
        #[source]
        source: Unavailable,
    },

    /// A row at the shard's head cannot be read (see [`Error::Undecodable`]): the shard waits,
    /// backing off, and nothing is deleted.
    #[error("the shard's head cannot be read")]
    Undecodable {
        /// What cannot be read.
        #[source]
        source: Box<Error>,
    },

    /// The message's category is not known to this binary: the shard is parked, and
    /// nothing is deleted, until a binary that knows the category drains it.
    #[error(
        "message {message_id} has category {category}, which this binary does not know; \
         the shard is parked until a binary that knows it runs"
    )]
    UnknownCategory {
        /// The message.
        message_id: MessageId,
        /// Its unknown category.
        category: CategoryId,
    },

    /// The message's scope is not its category's scope (the row was written around the typed
    /// API): nothing is delivered or deleted, and the shard backs off and retries the row, as
    /// after any failure, until it is repaired or removed.
    #[error(
        "message {message_id} has scope {found}, but its category `{category}` belongs to \
         scope {expected} (`{expected_name}`); the row is kept and its shard backs off, retrying \
         it, until the row is repaired or removed"
    )]
    ScopeMismatch {
        /// The message.
        message_id: MessageId,
        /// The category's name.
        category: &'static str,
        /// The category's own scope.
        expected: ScopeId,
        /// The name of the category's own scope.
        expected_name: &'static str,
        /// The scope in the row.
        found: ScopeId,
    },
}

impl DeliveryError {
    /// The failure's kind, as a short stable name: the `kind` label of the
    /// `outbox_handler_failures_total` metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Handler { .. } => "handler",
            Self::Payload { .. } => "payload",
            Self::Metadata { .. } => "metadata",
            Self::Lookup { .. } => "lookup",
            Self::Row { .. } => "row",
            Self::Extract { .. } => "extract",
            Self::Panicked { .. } => "panicked",
            Self::TimedOut { .. } => "timed_out",
            Self::Unavailable { .. } => "unavailable",
            Self::Undecodable { .. } => "undecodable",
            Self::UnknownCategory { .. } => "unknown_category",
            Self::ScopeMismatch { .. } => "scope_mismatch",
        }
    }

    /// The breaker of the unreachable system, for [`DeliveryError::Unavailable`].
    pub fn breaker(&self) -> Option<&crate::breaker::Breaker> {
        match self {
            Self::Unavailable { source, .. } => Some(&source.breaker),
            _ => None,
        }
    }

    /// The category that parks the shard, for errors that park it.
    pub fn parked_category(&self) -> Option<CategoryId> {
        match self {
            Self::UnknownCategory { category, .. } => Some(*category),
            _ => None,
        }
    }

    /// Whether the failure is the message's own (its handler failed, panicked or timed out on
    /// it; its payload or its model's row does not deserialize), and so counts towards its
    /// category's dead-letter policy. What would fail every message alike is not: a
    /// handler that cannot be called, a system it cannot reach (its breaker counts no attempt), a
    /// model table the database cannot read, a row the relay cannot decode, an unknown category or a scope mismatch. Those block the
    /// shard whatever the policy.
    pub fn is_message_failure(&self) -> bool {
        matches!(
            self,
            Self::Handler { .. }
                | Self::Payload { .. }
                | Self::Metadata { .. }
                | Self::Row { .. }
                | Self::Panicked { .. }
                | Self::TimedOut { .. }
        )
    }
}

/// Why a handler could not be given one of its arguments ([`FromContext`](crate::handler::FromContext)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExtractError {
    /// No state of the type was given to the registry. [`Registry`](crate::Registry) refuses
    /// to build in that case, so this is only seen from handlers that do not declare what they
    /// take ([`Handler::requires`](crate::handler::Handler::requires)).
    #[error("no `{type_name}` was given to `Registry::builder().state(..)`")]
    MissingState {
        /// The state's type.
        type_name: &'static str,
    },
    /// The handler takes the claiming transaction's connection, and there is none of that
    /// type: the relay does not run handlers in [`HandlerMode::InTransaction`](crate::HandlerMode::InTransaction),
    /// or its store's connection is of another type.
    #[error(
        "the handler takes `Connection<'_, {type_name}>`, but {}",
        if *.in_transaction {
            "the claiming transaction's connection is of another type"
        } else {
            "the relay does not run handlers in the claiming transaction \
             (`RelayConfig::builder().handler_mode(HandlerMode::InTransaction)`)"
        }
    )]
    NoConnection {
        /// The connection type the handler asked for.
        type_name: &'static str,
        /// Whether the handler runs in the claiming transaction at all.
        in_transaction: bool,
    },
    /// The connection was already taken by another of the handler's arguments.
    #[error("the handler takes the claiming transaction's connection twice (`{type_name}`)")]
    ConnectionTaken {
        /// The connection type asked for the second time.
        type_name: &'static str,
    },
}
