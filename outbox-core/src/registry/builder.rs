//! Building a registry: handlers, declarations and states given to a [`RegistryBuilder`].

use std::fmt;
use std::sync::Arc;

use super::declare::{CategoryDeclaration, HandlerDeclaration, ScopeDeclaration};
use super::lookup::Registry;
use super::validate::{self, Registrations};
use crate::backfill::BackfillModel;
use crate::categories::Deliverable;
use crate::error::SourceLocation;
use crate::error::{Error, Site};
use crate::handler::StateMap;
use crate::handler::{Deletion, Replication};
use crate::handler::{
    Delivery, ErasedHandler, FromRaw, Handler, NoOp, NoOpErased, Requirements, erase,
};
use crate::model::{Category, CategoryIdentity, ScopeId};
use crate::replicated::{ModelTable, ReplicatedModel};
use crate::sink::{Publisher, Sink};

/// A category as declared (or, without declarations, as a handler names it).
#[derive(Clone, Copy)]
pub(super) struct Declared {
    pub(super) identity: CategoryIdentity,
    pub(super) no_op: bool,
    pub(super) model: Option<ModelTable>,
    /// A replicated model as a backfill walks it (known where its type is: its handlers).
    pub(super) backfill: Option<BackfillModel>,
    pub(super) at: Option<SourceLocation>,
}

impl Declared {
    fn of<C: Category>(no_op: bool, at: Option<SourceLocation>) -> Self {
        Self::of_identity(CategoryIdentity::of::<C>(), no_op, at)
    }

    fn of_identity(identity: CategoryIdentity, no_op: bool, at: Option<SourceLocation>) -> Self {
        Self {
            identity,
            no_op,
            model: None,
            backfill: None,
            at,
        }
    }

    fn of_model<M: ReplicatedModel>(at: Option<SourceLocation>) -> Self {
        Self {
            model: Some(M::TABLE),
            backfill: Some(BackfillModel::of::<M>()),
            ..Self::of::<M>(false, at)
        }
    }

    pub(super) fn site(&self) -> Site {
        Site {
            name: self.identity.name,
            id: i64::from(self.identity.id.0),
            at: self.at,
        }
    }

    pub(super) fn same_category(&self, other: &Self) -> bool {
        let (one, other) = (&self.identity, &other.identity);
        (one.id, one.name, one.scope) == (other.id, other.name, other.scope)
    }
}

/// What a registered handler receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// `Delivery<C>`: every message of a category.
    Delivery,
    /// `Replication<M>`: a replicated model whose row exists.
    Replication,
    /// `Deletion<M>`: a replicated model whose row is gone.
    Deletion,
}

/// A registered handler, its kind erased.
pub(super) struct HandlerEntry {
    /// Its category, as the handler names it, located at the registration.
    pub(super) category: Declared,
    pub(super) role: Role,
    pub(super) handler: Arc<dyn ErasedHandler>,
    /// What the handler takes from the registry.
    pub(super) requirements: Requirements,
    /// Makes the handler from the registry's state when it is built (a sink given as a
    /// state): `None` while that state is missing, which the requirements report.
    pub(super) resolve: Option<Resolve>,
}

/// Makes a handler from the registry's state.
pub(super) type Resolve = fn(&StateMap) -> Option<Arc<dyn ErasedHandler>>;

/// The publisher of `C` through the sink of type `K` in `state`.
fn publisher_from_state<C: Deliverable, K: Sink + Clone>(
    state: &StateMap,
) -> Option<Arc<dyn ErasedHandler>> {
    let sink = state.get::<K>()?.clone();
    Some(Arc::new(Publisher::<C, K>::new(sink)))
}

/// Builds a [`Registry`]; [`RegistryBuilder::build`] reports every conflict at once.
///
/// Without [`RegistryBuilder::discovered`], the categories are those the handlers name. With
/// it, the categories are those declared with `#[outbox_category]` anywhere in the binary:
/// each needs exactly one handler (or a `no_op` declaration), and a handler for a category
/// nobody declared is refused.
#[derive(Default)]
pub struct RegistryBuilder {
    declarations: Vec<Declared>,
    scopes: Vec<(ScopeId, &'static str, Option<SourceLocation>)>,
    handlers: Vec<HandlerEntry>,
    /// Dead-letter policies given over the declarations', with the category as named there.
    policies: Vec<(Declared, Option<u32>)>,
    discovered: bool,
    state: StateMap,
}

impl fmt::Debug for RegistryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryBuilder")
            .field("declarations", &self.declarations.len())
            .field("handlers", &self.handlers.len())
            .field("discovered", &self.discovered)
            .finish_non_exhaustive()
    }
}

impl RegistryBuilder {
    /// Sets `C`'s failing groups aside as dead letters after `attempts` failed attempts,
    /// whatever its declaration says: the shard goes on with the groups behind them. At least
    /// 1 ([`build`](Self::build) refuses 0).
    #[track_caller]
    pub fn max_attempts<C: Category>(self, attempts: u32) -> Self {
        self.policy::<C>(Some(attempts), SourceLocation::caller())
    }

    /// Keeps `C`'s failing groups at the head of their shard, retried with backoff until they
    /// succeed, whatever its declaration says: the default policy.
    #[track_caller]
    pub fn block_on_failure<C: Category>(self) -> Self {
        self.policy::<C>(None, SourceLocation::caller())
    }

    fn policy<C: Category>(mut self, max_attempts: Option<u32>, at: SourceLocation) -> Self {
        self.policies
            .push((Declared::of::<C>(false, Some(at)), max_attempts));
        self
    }

    /// Registers the handler of category `C`.
    #[track_caller]
    ///
    /// `C` is a category, or an enum of a scope's categories declared with
    /// `#[outbox_categories]`: the handler then handles each of them.
    pub fn handle<C: Deliverable>(self, handler: impl Handler<Delivery<C>>) -> Self {
        self.handle_declared(handler, SourceLocation::caller())
    }

    /// Registers `sink` as the handler of category `C` (or of each category of a category
    /// enum): each delivery is published to the sink's destination for its category, its
    /// payload the category's JSON, and acknowledged once the broker confirmed it. For another
    /// destination, encoder or de-duplication prefix, give a [`Publisher`] to
    /// [`RegistryBuilder::publish`].
    #[track_caller]
    pub fn sink<C: Deliverable, K: Sink>(self, sink: K) -> Self {
        self.publish(Publisher::<C, K>::new(sink))
    }

    /// Registers `publisher` as the handler of category `C` (or of each category of a
    /// category enum).
    #[track_caller]
    pub fn publish<C: Deliverable, K: Sink>(self, publisher: Publisher<C, K>) -> Self {
        let at = SourceLocation::caller();
        let categories = C::categories()
            .into_iter()
            .map(|identity| Declared::of_identity(identity, false, Some(at)));
        self.push_erased(
            categories,
            Role::Delivery,
            &(Arc::new(publisher) as Arc<dyn ErasedHandler>),
            Requirements::default(),
        )
    }

    /// Registers the sink of type `K` given to [`RegistryBuilder::state`] as the handler of
    /// category `C` (or of each category of a category enum), as [`RegistryBuilder::sink`]
    /// would: what `#[outbox_category(..., sink = K)]` declares. Without a `K` in the state,
    /// [`build`](Self::build) refuses with
    /// [`RegistryProblem::MissingState`](crate::error::RegistryProblem::MissingState).
    #[track_caller]
    pub fn sink_from_state<C: Deliverable, K: Sink + Clone>(self) -> Self {
        self.sink_from_state_declared::<C, K>(SourceLocation::caller())
    }

    /// Registers a sink from the state, declared at `at` (what `#[outbox_category(sink = K)]`
    /// generates).
    #[doc(hidden)]
    pub fn sink_from_state_declared<C: Deliverable, K: Sink + Clone>(
        mut self,
        at: SourceLocation,
    ) -> Self {
        let mut requirements = Requirements::default();
        requirements.state::<K>();
        // Replaced when the registry is built; a missing `K` fails the build first.
        let unresolved: Arc<dyn ErasedHandler> = Arc::new(NoOpErased);
        for identity in C::categories() {
            self.handlers.push(HandlerEntry {
                category: Declared::of_identity(identity, false, Some(at)),
                role: Role::Delivery,
                handler: Arc::clone(&unresolved),
                requirements: requirements.clone(),
                resolve: Some(publisher_from_state::<C, K>),
            });
        }
        self
    }

    /// Registers category `C` as needing no handler: its deliveries are acknowledged as they
    /// come. Without this (or `no_op` in its declaration), a category without a handler is
    /// refused.
    #[track_caller]
    pub fn no_op<C: Category>(self) -> Self {
        let at = SourceLocation::caller();
        self.push::<Delivery<C>, _>(Declared::of::<C>(true, Some(at)), Role::Delivery, NoOp)
    }

    /// Registers the replication handler of model `M`: it runs for each object whose row
    /// the relay finds at delivery.
    #[track_caller]
    pub fn replication<M: ReplicatedModel>(self, handler: impl Handler<Replication<M>>) -> Self {
        self.replication_declared(handler, SourceLocation::caller())
    }

    /// Registers the deletion handler of model `M`: it runs for each object whose row is
    /// gone at delivery.
    #[track_caller]
    pub fn deletion<M: ReplicatedModel>(self, handler: impl Handler<Deletion<M>>) -> Self {
        self.deletion_declared(handler, SourceLocation::caller())
    }

    /// Registers a handler declared at `at` (what `#[outbox_handler]` generates).
    #[doc(hidden)]
    pub fn handle_declared<C: Deliverable>(
        self,
        handler: impl Handler<Delivery<C>>,
        at: SourceLocation,
    ) -> Self {
        let categories = C::categories()
            .into_iter()
            .map(|identity| Declared::of_identity(identity, false, Some(at)));
        self.push_each(categories, Role::Delivery, handler)
    }

    /// Registers a replication handler declared at `at`.
    #[doc(hidden)]
    pub fn replication_declared<M: ReplicatedModel>(
        self,
        handler: impl Handler<Replication<M>>,
        at: SourceLocation,
    ) -> Self {
        self.push(
            Declared::of_model::<M>(Some(at)),
            Role::Replication,
            handler,
        )
    }

    /// Registers a deletion handler declared at `at`.
    #[doc(hidden)]
    pub fn deletion_declared<M: ReplicatedModel>(
        self,
        handler: impl Handler<Deletion<M>>,
        at: SourceLocation,
    ) -> Self {
        self.push(Declared::of_model::<M>(Some(at)), Role::Deletion, handler)
    }

    fn push<D, H>(self, category: Declared, role: Role, handler: H) -> Self
    where
        D: FromRaw + 'static,
        H: Handler<D>,
    {
        self.push_each(std::iter::once(category), role, handler)
    }

    /// Registers `handler` as the handler of each of `categories` (those of a category enum).
    /// What it requires is checked once, with the first.
    fn push_each<D, H>(
        self,
        categories: impl IntoIterator<Item = Declared>,
        role: Role,
        handler: H,
    ) -> Self
    where
        D: FromRaw + 'static,
        H: Handler<D>,
    {
        let mut requirements = Requirements::default();
        handler.requires(&mut requirements);
        let handler: Arc<dyn ErasedHandler> = Arc::new(erase::<D, H>(handler));
        self.push_erased(categories, role, &handler, requirements)
    }

    /// Registers an erased handler as the handler of each of `categories`.
    fn push_erased(
        mut self,
        categories: impl IntoIterator<Item = Declared>,
        role: Role,
        handler: &Arc<dyn ErasedHandler>,
        mut requirements: Requirements,
    ) -> Self {
        for category in categories {
            self.handlers.push(HandlerEntry {
                category,
                role,
                handler: Arc::clone(handler),
                requirements: std::mem::take(&mut requirements),
                resolve: None,
            });
        }
        self
    }

    /// Adds everything declared with `#[outbox_scope]`, `#[outbox_category]` and
    /// `#[outbox_handler]` in this binary (in any crate it links), and makes those declarations
    /// the list of categories: each must have exactly one handler, from `#[outbox_handler]` or
    /// from [`RegistryBuilder::handle`], unless declared `no_op`.
    pub fn discovered(mut self) -> Self {
        self.discovered = true;
        for scope in inventory::iter::<ScopeDeclaration> {
            self.scopes.push((scope.id, scope.name, Some(scope.at)));
        }
        for category in inventory::iter::<CategoryDeclaration> {
            self.declarations.push(Declared {
                model: category.model,
                ..Declared::of_identity(category.identity, category.no_op, Some(category.at))
            });
        }
        for handler in inventory::iter::<HandlerDeclaration> {
            self = (handler.register)(self, handler.at);
        }
        self
    }

    /// Gives `value` to every handler that takes [`State<T>`](crate::State) of its type (a
    /// second value of the same type replaces the first). A handler taking a state nobody
    /// gave is refused by [`RegistryBuilder::build`].
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.state.insert(value);
        self
    }

    /// Checks the registrations and reports every problem at once: duplicate category ids or
    /// names, scope ids used by two scopes, categories with no handler or two, handlers for
    /// undeclared categories, handlers taking a [`State<T>`](crate::State) nobody gave.
    pub fn build(self) -> Result<Registry, Error> {
        let Self {
            declarations,
            scopes,
            mut handlers,
            policies,
            discovered,
            state,
        } = self;
        for entry in &mut handlers {
            if let Some(handler) = entry.resolve.and_then(|resolve| resolve(&state)) {
                entry.handler = handler;
            }
        }
        let registrations = Registrations {
            declarations,
            scopes,
            handlers,
            policies,
            discovered,
        };
        match validate::validate(registrations, &state) {
            Ok(categories) => Ok(Registry::new(categories, state)),
            Err(problems) => Err(Error::Registry { problems }),
        }
    }
}
