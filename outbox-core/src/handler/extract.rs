//! What a handler takes besides its delivery: [`State<T>`], the claiming transaction's
//! [`Connection`], or anything else implementing [`FromContext`].

use std::any::{Any, TypeId};
use std::fmt;
use std::ops::{Deref, DerefMut};

use super::error::ExtractError;
use super::state::StateMap;

/// What the relay lends a handler call besides the delivery: the values given to
/// [`RegistryBuilder::state`](crate::RegistryBuilder::state) and, in
/// [`HandlerMode::InTransaction`](crate::HandlerMode::InTransaction), the transaction that
/// claimed the shard. Handlers take its parts as arguments ([`FromContext`]).
pub struct HandlerContext<'a> {
    connection: Option<&'a mut (dyn Any + Send)>,
    in_transaction: bool,
    state: &'a StateMap,
}

impl<'a> HandlerContext<'a> {
    /// A context for one call: the claiming transaction's connection, if the store lends one,
    /// and the registry's state.
    pub(crate) fn new(connection: Option<&'a mut (dyn Any + Send)>, state: &'a StateMap) -> Self {
        Self {
            in_transaction: connection.is_some(),
            connection,
            state,
        }
    }

    /// Whether the handler runs inside the claiming transaction.
    pub fn in_transaction(&self) -> bool {
        self.in_transaction
    }
}

impl fmt::Debug for HandlerContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerContext")
            .field("in_transaction", &self.in_transaction)
            .finish_non_exhaustive()
    }
}

/// What a handler needs from the registry, declared by its arguments ([`FromContext::requires`])
/// and checked when the registry is built: a handler taking a state nobody provided is refused
/// at start-up ([`RegistryProblem::MissingState`](crate::error::RegistryProblem::MissingState)).
#[derive(Debug, Default, Clone)]
pub struct Requirements {
    states: Vec<(TypeId, &'static str)>,
}

impl Requirements {
    /// Declares that the handler takes the state of type `T`.
    pub fn state<T: Any>(&mut self) {
        let id = TypeId::of::<T>();
        if !self.states.iter().any(|(seen, _)| *seen == id) {
            self.states.push((id, std::any::type_name::<T>()));
        }
    }

    /// The states declared, with their type names, in declaration order.
    pub(crate) fn states(&self) -> impl Iterator<Item = (TypeId, &'static str)> + '_ {
        self.states.iter().copied()
    }
}

/// Something a handler takes as an argument after its delivery, made from the
/// [`HandlerContext`] of each call: [`State<T>`], [`Connection<'_, T>`](Connection), or a type
/// of your own built from those.
///
/// `'a` is the call's lifetime: an argument may borrow from the call (as [`Connection`] does);
/// handlers given as closures (see [`handler_fn`](crate::handler::handler_fn)) take arguments that do
/// not, `FromContext<'a>` for every `'a`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an argument of an outbox handler",
    label = "not a handler argument",
    note = "a handler takes its delivery first (`Delivery<C>`, `Replication<M>` or `Deletion<M>`), then any of `State<T>` (a value given to `Registry::builder().state(..)`) and `Connection<'_, T>` (the claiming transaction, in `HandlerMode::InTransaction`)"
)]
pub trait FromContext<'a>: Sized + Send {
    /// Declares what the argument needs from the registry, checked when it is built.
    fn requires(requirements: &mut Requirements) {
        let _ = requirements;
    }

    /// Makes the argument for one call.
    fn from_context(cx: &mut HandlerContext<'a>) -> Result<Self, ExtractError>;
}

/// A clone of the value of type `T` given to
/// [`RegistryBuilder::state`](crate::RegistryBuilder::state): a pool on another database, a
/// client, a channel. A handler taking `State<T>` is refused when the registry is built if no
/// `T` was given.
///
/// The clone is made for each call: give a cheaply cloned value (a pool, an `Arc`).
#[derive(Debug, Clone, Copy, Default)]
pub struct State<T>(pub T);

impl<T> Deref for State<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> DerefMut for State<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T: Clone + Send + Sync + 'static> FromContext<'_> for State<T> {
    fn requires(requirements: &mut Requirements) {
        requirements.state::<T>();
    }

    fn from_context(cx: &mut HandlerContext<'_>) -> Result<Self, ExtractError> {
        cx.state
            .get::<T>()
            .map(|value| State(value.clone()))
            .ok_or(ExtractError::MissingState {
                type_name: std::any::type_name::<T>(),
            })
    }
}

/// The connection of the transaction that claimed the shard, in
/// [`HandlerMode::InTransaction`](crate::HandlerMode::InTransaction), as the backend's
/// connection type (`sqlx::PgConnection`, `sqlx::SqliteConnection`): the handler's writes
/// commit with the acknowledgement, or roll back with a failure.
///
/// `&mut *conn` is a `&mut T`, what `sqlx` executes on. Outside that mode (or for another
/// connection type) the delivery fails with
/// [`ExtractError::NoConnection`](crate::handler::ExtractError::NoConnection).
pub struct Connection<'a, T: ?Sized>(&'a mut T);

impl<T: ?Sized> Deref for Connection<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.0
    }
}

impl<T: ?Sized> DerefMut for Connection<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0
    }
}

impl<T: ?Sized> fmt::Debug for Connection<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Connection")
            .field(&std::any::type_name::<T>())
            .finish()
    }
}

impl<'a, T: Any + Send> FromContext<'a> for Connection<'a, T> {
    fn from_context(cx: &mut HandlerContext<'a>) -> Result<Self, ExtractError> {
        let type_name = std::any::type_name::<T>();
        let Some(connection) = cx.connection.take() else {
            return Err(if cx.in_transaction {
                ExtractError::ConnectionTaken { type_name }
            } else {
                ExtractError::NoConnection {
                    type_name,
                    in_transaction: false,
                }
            });
        };
        if !connection.is::<T>() {
            cx.connection = Some(connection);
            return Err(ExtractError::NoConnection {
                type_name,
                in_transaction: true,
            });
        }
        connection
            .downcast_mut::<T>()
            .map(Connection)
            .ok_or(ExtractError::NoConnection {
                type_name,
                in_transaction: true,
            })
    }
}
