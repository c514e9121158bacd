//! What the macros' expansions name, through `::outbox_core::__private`. Not public API.

pub use crate::declare::{
    CategoryDeclaration, HandlerDeclaration, ScopeDeclaration, SourceLocation,
};
pub use inventory;

use crate::BoxError;
use crate::handler::{Delivery, Handler, HandlerContext};
use crate::model::Category;
use crate::registry::RegistryBuilder;
use crate::replicated::ReplicatedModel;
use crate::replication::{Deletion, DeletionHandler, Replication, ReplicationHandler};

/// An `#[outbox_handler]` function, seen through its first argument's type `D` (so that the
/// expansion names the category only with the user's own tokens).
pub trait DeclaredHandler<D>: Send + Sync + 'static {
    /// Calls the function.
    fn handle(
        &self,
        delivery: D,
        cx: &mut HandlerContext<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// The handler of an `#[outbox_handler]` function.
pub struct Declared<H>(pub H);

impl<C, H> Handler<C> for Declared<H>
where
    C: Category,
    H: DeclaredHandler<Delivery<C>>,
{
    fn handle(
        &self,
        delivery: Delivery<C>,
        cx: &mut HandlerContext<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        self.0.handle(delivery, cx)
    }
}

impl<M, H> ReplicationHandler<M> for Declared<H>
where
    H: DeclaredHandler<Replication<M>>,
{
    fn replicate(
        &self,
        replication: Replication<M>,
        cx: &mut HandlerContext<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        self.0.handle(replication, cx)
    }
}

impl<M, H> DeletionHandler<M> for Declared<H>
where
    M: Category,
    H: DeclaredHandler<Deletion<M>>,
{
    fn delete(
        &self,
        deletion: Deletion<M>,
        cx: &mut HandlerContext<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        self.0.handle(deletion, cx)
    }
}

/// What an `#[outbox_handler]` function's first argument is, and so what it handles: every
/// delivery of a category, or the replications or deletions of a model.
pub trait HandlerKind: Sized {
    /// Adds the handler to a registry builder.
    fn register<H: DeclaredHandler<Self>>(
        builder: RegistryBuilder,
        handler: H,
        at: SourceLocation,
    ) -> RegistryBuilder;
}

impl<C: Category> HandlerKind for Delivery<C> {
    fn register<H: DeclaredHandler<Self>>(
        builder: RegistryBuilder,
        handler: H,
        at: SourceLocation,
    ) -> RegistryBuilder {
        builder.handle_declared::<C>(Declared(handler), at)
    }
}

impl<M: ReplicatedModel> HandlerKind for Replication<M> {
    fn register<H: DeclaredHandler<Self>>(
        builder: RegistryBuilder,
        handler: H,
        at: SourceLocation,
    ) -> RegistryBuilder {
        builder.replication_declared::<M>(Declared(handler), at)
    }
}

impl<M: ReplicatedModel> HandlerKind for Deletion<M> {
    fn register<H: DeclaredHandler<Self>>(
        builder: RegistryBuilder,
        handler: H,
        at: SourceLocation,
    ) -> RegistryBuilder {
        builder.deletion_declared::<M>(Declared(handler), at)
    }
}

/// The scope of a category whose declaration failed to compile (its error is reported).
pub struct Undeclared;

impl crate::model::Scope for Undeclared {
    const ID: crate::model::ScopeId = crate::model::ScopeId(0);
    const NAME: &'static str = "";
}

/// Checks what an `#[outbox_handler]` function returns.
#[diagnostic::on_unimplemented(
    message = "an outbox handler must return `Result<(), E>` with an error type `E` that converts into `Box<dyn Error + Send + Sync>`; it returns `{Self}`",
    label = "this return type is not a handler result"
)]
pub trait HandlerOutput {
    /// The result, with the error boxed.
    fn into_result(self) -> Result<(), BoxError>;
}

impl<E: Into<BoxError>> HandlerOutput for Result<(), E> {
    fn into_result(self) -> Result<(), BoxError> {
        self.map_err(Into::into)
    }
}

/// A replicated model's key or shard field, as the `i64` identifier the outbox stores.
#[diagnostic::on_unimplemented(
    message = "a replicated model's key and shard fields must be integers that fit in an `i64`; `{Self}` does not",
    label = "not an integer identifier",
    note = "use `i64`, `i32`, `i16`, `i8`, `u32`, `u16` or `u8`"
)]
pub trait Identifier {
    /// The identifier.
    fn to_i64(&self) -> i64;
}

macro_rules! identifiers {
    ($($int:ty),*) => {$(
        impl Identifier for $int {
            fn to_i64(&self) -> i64 {
                i64::from(*self)
            }
        }
    )*};
}

identifiers!(i64, i32, i16, i8, u32, u16, u8);
