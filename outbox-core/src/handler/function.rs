//! Functions as handlers: a closure taking its delivery and then any [`FromContext`]
//! arguments, through [`handler_fn`].

use std::future::Future;
use std::marker::PhantomData;

use super::extract::{FromContext, HandlerContext, Requirements};
use super::{DeliveryKind, Handler};
use crate::error::BoxError;

/// What an outbox handler returns: `Result<(), E>` with an error that converts into a
/// [`BoxError`].
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

/// A function handling deliveries of kind `D` with arguments `Args` after the delivery, each
/// [`FromContext`]: implemented for `Fn(D, A1, .., An) -> impl Future<Output = Result<(), E>>`
/// with up to six arguments after the delivery. [`handler_fn`] makes it a [`Handler`].
#[diagnostic::on_unimplemented(
    message = "this function cannot handle `{D}`",
    label = "not a handler of `{D}`",
    note = "a handler takes `{D}` first, then arguments implementing `FromContext` (`State<T>`, ..) that own what they hold, and returns a `Send` future of `Result<(), E>`; an argument borrowing from the call (`Connection<'_, T>`) needs an `#[outbox_handler]` async fn"
)]
pub trait HandlerFn<D, Args>: Send + Sync + 'static {
    /// What the arguments need from the registry.
    fn requires(requirements: &mut Requirements);

    /// Makes the arguments, then calls the function.
    fn call(
        &self,
        delivery: D,
        cx: &mut HandlerContext<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// A function taking its delivery and more arguments, as a [`Handler`]: see [`handler_fn`].
pub struct FnHandler<F, Args> {
    function: F,
    arguments: PhantomData<fn() -> Args>,
}

impl<F, Args> std::fmt::Debug for FnHandler<F, Args> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnHandler")
            .field("arguments", &std::any::type_name::<Args>())
            .finish_non_exhaustive()
    }
}

impl<F: Clone, Args> Clone for FnHandler<F, Args> {
    fn clone(&self) -> Self {
        Self {
            function: self.function.clone(),
            arguments: PhantomData,
        }
    }
}

/// Makes a closure (or function) taking its delivery and then arguments made from each call
/// ([`State<T>`](crate::State), ..) a [`Handler`]; the states it takes are checked when the
/// registry is built.
///
/// ```
/// use outbox_core::{BoxError, Delivery, Registry, State};
/// use outbox_core::handler::handler_fn;
/// # use outbox_core::{Category, CategoryId, Scope, ScopeId};
/// # struct Org;
/// # impl Scope for Org { const ID: ScopeId = ScopeId(1); const NAME: &'static str = "org"; }
/// # struct Renamed;
/// # impl Category for Renamed {
/// #     type Scope = Org; type Payload = String;
/// #     const ID: CategoryId = CategoryId(1); const NAME: &'static str = "renamed";
/// # }
///
/// #[derive(Clone)]
/// struct Directory;
///
/// let handler = handler_fn(|renamed: Delivery<Renamed>, State(_directory): State<Directory>| async move {
///     let _ = renamed.payload;
///     Ok::<(), BoxError>(())
/// });
/// let refused = Registry::builder().handle::<Renamed>(handler.clone()).build();
/// assert!(refused.unwrap_err().to_string().contains("takes `State<"));
/// let registry = Registry::builder().state(Directory).handle::<Renamed>(handler).build()?;
/// # let _ = registry;
/// # Ok::<(), outbox_core::Error>(())
/// ```
pub fn handler_fn<D, Args, F: HandlerFn<D, Args>>(function: F) -> FnHandler<F, Args> {
    FnHandler {
        function,
        arguments: PhantomData,
    }
}

impl<D, Args, F> Handler<D> for FnHandler<F, Args>
where
    F: HandlerFn<D, Args>,
    Args: 'static,
{
    fn requires(&self, requirements: &mut Requirements) {
        F::requires(requirements);
    }

    fn call(
        &self,
        delivery: D,
        cx: &mut HandlerContext<'_>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send {
        self.function.call(delivery, cx)
    }
}

macro_rules! handler_fns {
    ($($argument:ident),+) => {
        impl<D, F, Fut, Out, $($argument),+> HandlerFn<D, ($($argument,)+)> for F
        where
            D: DeliveryKind,
            F: Fn(D, $($argument),+) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Out> + Send,
            Out: HandlerOutput,
            $($argument: for<'a> FromContext<'a>,)+
        {
            fn requires(requirements: &mut Requirements) {
                $(<$argument as FromContext<'_>>::requires(requirements);)+
            }

            #[allow(non_snake_case)] // the arguments are named by their types
            fn call(
                &self,
                delivery: D,
                cx: &mut HandlerContext<'_>,
            ) -> impl Future<Output = Result<(), BoxError>> + Send {
                // Made before the call, so the future does not hold the context.
                let arguments = (|| {
                    Ok::<_, crate::handler::ExtractError>(($(<$argument as FromContext<'_>>::from_context(cx)?,)+))
                })();
                async move {
                    let ($($argument,)+) = arguments?;
                    self(delivery, $($argument),+).await.into_result()
                }
            }
        }
    };
}

impl<D, F, Fut, Out> HandlerFn<D, ()> for F
where
    D: DeliveryKind,
    F: Fn(D) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Out> + Send,
    Out: HandlerOutput,
{
    fn requires(_requirements: &mut Requirements) {}

    async fn call(&self, delivery: D, _cx: &mut HandlerContext<'_>) -> Result<(), BoxError> {
        self(delivery).await.into_result()
    }
}

handler_fns!(A1);
handler_fns!(A1, A2);
handler_fns!(A1, A2, A3);
handler_fns!(A1, A2, A3, A4);
handler_fns!(A1, A2, A3, A4, A5);
handler_fns!(A1, A2, A3, A4, A5, A6);

/// A closure taking its delivery and the transaction's connection (`&mut T`: a
/// `sqlx::PgConnection`, a `sqlx::SqliteConnection`), as a [`Handler`]: see
/// [`with_connection`].
pub struct WithConnection<T: ?Sized, F> {
    function: F,
    connection: PhantomData<fn(&mut T)>,
}

impl<T: ?Sized, F> std::fmt::Debug for WithConnection<T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithConnection")
            .field("connection", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

/// Makes a closure taking its delivery and the transaction's connection a [`Handler`]: its
/// writes commit with the delivery's acknowledgement (a consumer's
/// [inbox record](crate::inbox::Consumer), the relay's in
/// [`HandlerMode::InTransaction`](crate::HandlerMode::InTransaction)) or roll back with its
/// failure. The closure returns its future boxed, as it borrows the connection (the way of
/// `sqlx`'s own `Connection::transaction`):
///
/// ```
/// use outbox_core::handler::{Handler, with_connection};
/// use outbox_core::{BoxError, Delivery};
/// # #[derive(Debug)] struct Org;
/// # impl outbox_core::Scope for Org { const ID: outbox_core::ScopeId = outbox_core::ScopeId(1); const NAME: &'static str = "org"; }
/// # #[derive(Debug)] struct OrderPlaced;
/// # impl outbox_core::Category for OrderPlaced { type Scope = Org; type Payload = i64; const ID: outbox_core::CategoryId = outbox_core::CategoryId(1); const NAME: &'static str = "order_placed"; }
/// # struct Connection;
///
/// let charge = with_connection(|placed: Delivery<OrderPlaced>, conn: &mut Connection| {
///     Box::pin(async move {
///         // sqlx::query("INSERT INTO charges ...").bind(placed.payload).execute(conn).await?;
///         let _ = (placed, conn);
///         Ok::<_, BoxError>(())
///     })
/// });
/// # fn is_handler(_: impl Handler<Delivery<OrderPlaced>>) {}
/// # is_handler(charge);
/// ```
///
/// Given no connection of type `T` (another backend's, or a relay not in
/// `HandlerMode::InTransaction`), a delivery fails with
/// [`ExtractError::NoConnection`](crate::handler::ExtractError::NoConnection).
pub fn with_connection<D, T, F, E>(function: F) -> WithConnection<T, F>
where
    D: DeliveryKind,
    T: std::any::Any + Send,
    F: for<'c> Fn(D, &'c mut T) -> crate::future::BoxFuture<'c, Result<(), E>>
        + Send
        + Sync
        + 'static,
    E: Into<BoxError>,
{
    WithConnection {
        function,
        connection: PhantomData,
    }
}

impl<D, T, F, E> Handler<D> for WithConnection<T, F>
where
    D: DeliveryKind,
    T: std::any::Any + Send,
    F: for<'c> Fn(D, &'c mut T) -> crate::future::BoxFuture<'c, Result<(), E>>
        + Send
        + Sync
        + 'static,
    E: Into<BoxError>,
{
    async fn call(&self, delivery: D, cx: &mut HandlerContext<'_>) -> Result<(), BoxError> {
        let mut connection = super::Connection::<T>::from_context(cx)?;
        (self.function)(delivery, &mut connection)
            .await
            .map_err(Into::into)
    }
}
