//! The registry: every category this binary knows, with its scope, policy and handler.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::sync::Arc;

use crate::declare::{CategoryDeclaration, HandlerDeclaration, ScopeDeclaration, SourceLocation};
use crate::error::{Error, RegistryProblem, Site};
use crate::handler::{
    Delivery, ErasedHandler, FromRaw, Handler, NoOp, NoOpErased, Requirements, erase,
};
use crate::model::{Category, CategoryId, Scope, ScopeId};
use crate::replicated::{ModelTable, ReplicatedModel};
use crate::replication::{Deletion, ModelDispatch, Replication};

/// What the registry knows of one category.
#[derive(Clone)]
#[non_exhaustive]
pub struct CategoryInfo {
    /// The category's stable id.
    pub id: CategoryId,
    /// The category's name.
    pub name: &'static str,
    /// The scope the category belongs to.
    pub scope: ScopeId,
    /// The scope's name.
    pub scope_name: &'static str,
    /// Whether the category's groups coalesce to their newest message.
    pub coalesce: bool,
    /// Whether the handler was declared as a no-op.
    pub no_op: bool,
    /// For a replicated model: its table, where the relay looks each object up.
    pub model: Option<ModelTable>,
    pub(crate) handler: Arc<dyn ErasedHandler>,
}

impl fmt::Debug for CategoryInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CategoryInfo")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("scope", &self.scope)
            .field("scope_name", &self.scope_name)
            .field("coalesce", &self.coalesce)
            .field("no_op", &self.no_op)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

/// The values handlers take as [`State<T>`](crate::State), one per type.
#[derive(Clone, Default)]
pub(crate) struct StateMap(HashMap<TypeId, Arc<dyn Any + Send + Sync>>);

impl StateMap {
    pub(crate) fn get<T: Any>(&self) -> Option<&T> {
        self.0.get(&TypeId::of::<T>())?.downcast_ref::<T>()
    }
}

/// Every category this binary can deliver, keyed by id. Cheap to clone.
#[derive(Clone, Default)]
pub struct Registry {
    categories: Arc<HashMap<CategoryId, CategoryInfo>>,
    state: Arc<StateMap>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("categories", &self.categories())
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Starts a registry.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// The registry of everything declared with the macros in this binary:
    /// `Registry::builder().discovered().build()`.
    pub fn discover() -> Result<Self, Error> {
        Self::builder().discovered().build()
    }

    /// What the registry knows of a category.
    pub fn category(&self, id: CategoryId) -> Option<&CategoryInfo> {
        self.categories.get(&id)
    }

    /// All known categories, in id order.
    pub fn categories(&self) -> Vec<&CategoryInfo> {
        let mut all: Vec<_> = self.categories.values().collect();
        all.sort_by_key(|info| info.id);
        all
    }

    /// The ids of all known categories.
    pub fn category_ids(&self) -> Vec<CategoryId> {
        self.categories().into_iter().map(|info| info.id).collect()
    }

    pub(crate) fn state(&self) -> &StateMap {
        &self.state
    }
}

/// A category as declared (or, without declarations, as a handler names it).
#[derive(Clone, Copy)]
struct Declared {
    id: CategoryId,
    name: &'static str,
    scope: ScopeId,
    scope_name: &'static str,
    coalesce: bool,
    no_op: bool,
    model: Option<ModelTable>,
    type_name: &'static str,
    at: Option<SourceLocation>,
}

impl Declared {
    fn of<C: Category>(no_op: bool, at: Option<SourceLocation>) -> Self {
        let type_name = std::any::type_name::<C>();
        Self {
            id: C::ID,
            name: C::NAME,
            scope: <C::Scope as Scope>::ID,
            scope_name: <C::Scope as Scope>::NAME,
            coalesce: C::COALESCE,
            no_op,
            model: None,
            type_name: type_name.rsplit("::").next().unwrap_or(type_name),
            at,
        }
    }

    fn of_model<M: ReplicatedModel>(at: Option<SourceLocation>) -> Self {
        Self {
            model: Some(M::TABLE),
            ..Self::of::<M>(false, at)
        }
    }

    fn site(&self) -> Site {
        Site {
            name: self.name,
            id: i64::from(self.id.0),
            at: self.at,
        }
    }

    fn same_category(&self, other: &Self) -> bool {
        (self.id, self.name, self.scope) == (other.id, other.name, other.scope)
    }
}

/// What a registered handler receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// `Delivery<C>`: every message of a category.
    Delivery,
    /// `Replication<M>`: a replicated model whose row exists.
    Replication,
    /// `Deletion<M>`: a replicated model whose row is gone.
    Deletion,
}

struct HandlerEntry {
    category: Declared,
    role: Role,
    handler: Arc<dyn ErasedHandler>,
    /// What the handler takes from the registry.
    requirements: Requirements,
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
    /// Registers the handler of category `C`.
    #[track_caller]
    pub fn handle<C: Category>(self, handler: impl Handler<Delivery<C>>) -> Self {
        self.handle_declared(handler, SourceLocation::caller())
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
    pub fn handle_declared<C: Category>(
        self,
        handler: impl Handler<Delivery<C>>,
        at: SourceLocation,
    ) -> Self {
        self.push(Declared::of::<C>(false, Some(at)), Role::Delivery, handler)
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

    fn push<D, H>(mut self, category: Declared, role: Role, handler: H) -> Self
    where
        D: FromRaw + 'static,
        H: Handler<D>,
    {
        let mut requirements = Requirements::default();
        handler.requires(&mut requirements);
        self.handlers.push(HandlerEntry {
            category,
            role,
            handler: Arc::new(erase::<D, H>(handler)),
            requirements,
        });
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
                id: category.id,
                name: category.name,
                scope: category.scope,
                scope_name: category.scope_name,
                coalesce: category.coalesce,
                no_op: category.no_op,
                model: category.model,
                type_name: category.type_name,
                at: Some(category.at),
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
        self.state.0.insert(TypeId::of::<T>(), Arc::new(value));
        self
    }

    /// Checks the registrations and reports every problem at once: duplicate category ids or
    /// names, scope ids used by two scopes, categories with no handler or two, handlers for
    /// undeclared categories, handlers taking a [`State<T>`](crate::State) nobody gave.
    pub fn build(self) -> Result<Registry, Error> {
        let mut problems = Vec::new();
        for entry in &self.handlers {
            for (type_id, state_type) in entry.requirements.states() {
                if !self.state.0.contains_key(&type_id) {
                    problems.push(RegistryProblem::MissingState {
                        category: entry.category.site(),
                        handler: entry.category.at,
                        state_type,
                    });
                }
            }
        }
        let declarations = if self.discovered {
            self.declarations
        } else {
            // Without declarations, each handler declares its category (never `no_op`: a
            // `no_op` registration is itself the handler).
            let mut declared: Vec<Declared> = Vec::new();
            for entry in &self.handlers {
                match declared
                    .iter_mut()
                    .find(|d| d.same_category(&entry.category))
                {
                    Some(seen) => seen.model = seen.model.or(entry.category.model),
                    None => declared.push(Declared {
                        no_op: false,
                        ..entry.category
                    }),
                }
            }
            declared
        };

        // Scopes: the declared ones, then those the categories name.
        let mut scopes: HashMap<ScopeId, Site> = HashMap::new();
        let category_scopes = declarations
            .iter()
            .map(|d| (d.scope, d.scope_name, None::<SourceLocation>));
        for (id, name, at) in self.scopes.into_iter().chain(category_scopes) {
            let site = Site {
                name,
                id: i64::from(id.0),
                at,
            };
            match scopes.entry(id) {
                Entry::Occupied(seen) if seen.get().name != name => {
                    problems.push(RegistryProblem::DuplicateScopeId {
                        first: *seen.get(),
                        second: site,
                    });
                }
                Entry::Occupied(_) => {}
                Entry::Vacant(slot) => {
                    slot.insert(site);
                }
            }
        }

        // Categories: unique ids and names.
        let mut by_id: HashMap<CategoryId, Declared> = HashMap::new();
        let mut by_name: HashMap<&'static str, Declared> = HashMap::new();
        let mut unique = Vec::new();
        for declared in declarations {
            if let Some(seen) = by_name.get(declared.name)
                && seen.id != declared.id
            {
                problems.push(RegistryProblem::DuplicateCategoryName {
                    first: seen.site(),
                    second: declared.site(),
                });
            }
            by_name.entry(declared.name).or_insert(declared);
            match by_id.entry(declared.id) {
                Entry::Occupied(seen) => problems.push(RegistryProblem::DuplicateCategoryId {
                    first: seen.get().site(),
                    second: declared.site(),
                }),
                Entry::Vacant(slot) => {
                    slot.insert(declared);
                    unique.push(declared);
                }
            }
        }

        // Handlers: exactly one per category (one of each role for a replicated model), none
        // for a category nobody declared.
        let mut handlers: Vec<Option<HandlerEntry>> = self.handlers.into_iter().map(Some).collect();
        let mut categories = HashMap::new();
        for declared in unique {
            let mine: Vec<HandlerEntry> = handlers
                .iter_mut()
                .filter(|entry| {
                    entry
                        .as_ref()
                        .is_some_and(|entry| entry.category.same_category(&declared))
                })
                .filter_map(Option::take)
                .collect();
            let handler = if declared.model.is_some() {
                model_handler(&declared, mine, &mut problems)
            } else {
                category_handler(&declared, mine, &mut problems)
            };
            let Some((handler, no_op)) = handler else {
                continue;
            };
            categories.insert(
                declared.id,
                CategoryInfo {
                    id: declared.id,
                    name: declared.name,
                    scope: declared.scope,
                    scope_name: declared.scope_name,
                    coalesce: declared.coalesce,
                    no_op,
                    model: declared.model,
                    handler,
                },
            );
        }
        for stray in handlers.into_iter().flatten() {
            // A handler whose category id is taken by another category was reported above.
            if by_id.contains_key(&stray.category.id) && !self.discovered {
                continue;
            }
            problems.push(RegistryProblem::UndeclaredCategory {
                category: stray.category.site(),
            });
        }

        if problems.is_empty() {
            Ok(Registry {
                categories: Arc::new(categories),
                state: Arc::new(self.state),
            })
        } else {
            Err(Error::Registry { problems })
        }
    }
}

/// The one handler of a plain category, and whether it is a no-op; or the problems.
fn category_handler(
    declared: &Declared,
    mine: Vec<HandlerEntry>,
    problems: &mut Vec<RegistryProblem>,
) -> Option<(Arc<dyn ErasedHandler>, bool)> {
    let mut mine = mine.into_iter();
    match (mine.next(), mine.next()) {
        (Some(first), Some(second)) => {
            problems.push(RegistryProblem::DuplicateHandler {
                category: declared.site(),
                first: first.category.at,
                second: second.category.at,
            });
            None
        }
        (Some(handler), None) if declared.no_op => {
            problems.push(RegistryProblem::DuplicateHandler {
                category: declared.site(),
                first: declared.at,
                second: handler.category.at,
            });
            None
        }
        (Some(handler), None) => Some((handler.handler, handler.category.no_op)),
        (None, _) if declared.no_op => Some((Arc::new(NoOpErased), true)),
        (None, _) => {
            problems.push(RegistryProblem::MissingHandler {
                category: declared.site(),
                type_name: declared.type_name,
            });
            None
        }
    }
}

/// The replication and deletion handlers of a replicated model, joined; or the problems.
fn model_handler(
    declared: &Declared,
    mine: Vec<HandlerEntry>,
    problems: &mut Vec<RegistryProblem>,
) -> Option<(Arc<dyn ErasedHandler>, bool)> {
    let mut replication: Option<HandlerEntry> = None;
    let mut deletion: Option<HandlerEntry> = None;
    let before = problems.len();
    for entry in mine {
        let slot = match entry.role {
            Role::Delivery => {
                problems.push(RegistryProblem::DeliveryHandlerForModel {
                    category: declared.site(),
                    at: entry.category.at,
                });
                continue;
            }
            Role::Replication => &mut replication,
            Role::Deletion => &mut deletion,
        };
        match slot {
            Some(first) => problems.push(RegistryProblem::DuplicateHandler {
                category: declared.site(),
                first: first.category.at,
                second: entry.category.at,
            }),
            None => *slot = Some(entry),
        }
    }
    for (entry, kind) in [(&replication, "Replication"), (&deletion, "Deletion")] {
        if entry.is_none() {
            problems.push(RegistryProblem::MissingModelHandler {
                category: declared.site(),
                kind,
                model_type: declared.type_name,
            });
        }
    }
    match (replication, deletion) {
        (Some(replication), Some(deletion)) if problems.len() == before => {
            let dispatch = ModelDispatch {
                replication: replication.handler,
                deletion: deletion.handler,
            };
            Some((Arc::new(dispatch), false))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CategoryId, ScopeId};

    macro_rules! category {
        ($name:ident, $scope:ident, $id:expr, $label:expr) => {
            struct $name;
            impl Category for $name {
                type Scope = $scope;
                type Payload = ();
                const ID: CategoryId = CategoryId($id);
                const NAME: &'static str = $label;
            }
        };
    }
    struct Org;
    impl Scope for Org {
        const ID: ScopeId = ScopeId(1);
        const NAME: &'static str = "org";
    }
    struct Impostor;
    impl Scope for Impostor {
        const ID: ScopeId = ScopeId(1);
        const NAME: &'static str = "impostor";
    }
    category!(First, Org, 1, "first");
    category!(SameId, Org, 1, "same_id");
    category!(SameName, Org, 2, "first");
    category!(OtherScope, Impostor, 3, "other_scope");

    /// `(kind, first name, first id, second name, second id)` of each problem.
    fn summary(error: &Error) -> Vec<(&'static str, &'static str, i64, &'static str, i64)> {
        let Error::Registry { problems } = error else {
            panic!("{error:?}")
        };
        problems
            .iter()
            .map(|problem| match problem {
                RegistryProblem::DuplicateCategoryId { first, second } => {
                    ("id", first.name, first.id, second.name, second.id)
                }
                RegistryProblem::DuplicateCategoryName { first, second } => {
                    ("name", first.name, first.id, second.name, second.id)
                }
                RegistryProblem::DuplicateScopeId { first, second } => {
                    ("scope", first.name, first.id, second.name, second.id)
                }
                RegistryProblem::DuplicateHandler { category, .. } => {
                    ("handlers", category.name, category.id, "", 0)
                }
                RegistryProblem::MissingHandler { category, .. } => {
                    ("missing", category.name, category.id, "", 0)
                }
                RegistryProblem::UndeclaredCategory { category } => {
                    ("undeclared", category.name, category.id, "", 0)
                }
                RegistryProblem::MissingModelHandler { category, kind, .. } => {
                    ("missing model", category.name, category.id, *kind, 0)
                }
                RegistryProblem::DeliveryHandlerForModel { category, .. } => {
                    ("delivery for model", category.name, category.id, "", 0)
                }
                RegistryProblem::MissingState {
                    category,
                    state_type,
                    ..
                } => ("state", category.name, category.id, *state_type, 0),
            })
            .collect()
    }

    #[test]
    fn every_conflict_is_reported_at_once() {
        let error = Registry::builder()
            .no_op::<First>()
            .no_op::<SameId>()
            .no_op::<SameName>()
            .no_op::<OtherScope>()
            .build()
            .unwrap_err();
        assert_eq!(
            summary(&error),
            [
                ("scope", "org", 1, "impostor", 1),
                ("id", "first", 1, "same_id", 1),
                ("name", "first", 1, "first", 2),
            ]
        );
        let text = error.to_string();
        assert!(
            text.contains(
                "two categories use id 1: `first` (id 1, at outbox-core/src/registry.rs:"
            ) && text.contains("`org` (id 1) and `impostor` (id 1)"),
            "{text}"
        );
    }

    #[test]
    fn two_handlers_for_one_category_are_refused_with_both_places() {
        let error = Registry::builder()
            .no_op::<First>()
            .handle::<First>(NoOp)
            .build()
            .unwrap_err();
        assert_eq!(summary(&error), [("handlers", "first", 1, "", 0)]);
        let Error::Registry { problems } = &error else {
            unreachable!()
        };
        let RegistryProblem::DuplicateHandler { first, second, .. } = &problems[0] else {
            unreachable!()
        };
        let (first, second) = (first.unwrap(), second.unwrap());
        assert_eq!(first.file, file!());
        assert_eq!(second.line, first.line + 1, "each registration's own line");
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Thing {
        id: i64,
    }
    impl Category for Thing {
        type Scope = Org;
        type Payload = ();
        const ID: CategoryId = CategoryId(30);
        const NAME: &'static str = "thing";
    }
    impl ReplicatedModel for Thing {
        const TABLE: ModelTable = ModelTable {
            table: "things",
            key: "id",
            columns: &["id"],
            bool_columns: &[],
        };
        fn object_identifier(&self) -> i64 {
            self.id
        }
        fn shard_identifier(&self) -> i64 {
            1
        }
        fn tombstone(&self) {}
    }

    async fn ok<T>(_: T) -> Result<(), BoxErrorAlias> {
        Ok(())
    }
    type BoxErrorAlias = crate::BoxError;

    #[test]
    fn a_model_needs_one_replication_and_one_deletion_handler() {
        let registry = Registry::builder()
            .replication::<Thing>(ok::<Replication<Thing>>)
            .deletion::<Thing>(ok::<Deletion<Thing>>)
            .build()
            .unwrap();
        let info = registry.category(Thing::ID).unwrap();
        assert_eq!(info.model, Some(Thing::TABLE));

        let error = Registry::builder()
            .replication::<Thing>(ok::<Replication<Thing>>)
            .replication::<Thing>(ok::<Replication<Thing>>)
            .handle::<Thing>(NoOp)
            .build()
            .unwrap_err();
        assert_eq!(
            summary(&error),
            [
                ("handlers", "thing", 30, "", 0),
                ("delivery for model", "thing", 30, "", 0),
                ("missing model", "thing", 30, "Deletion", 0),
            ]
        );
        let text = error.to_string();
        assert!(
            text.contains(
                "has no Deletion handler: add an `#[outbox_handler]` async fn taking \
                 `Deletion<Thing>`, or call `Registry::builder().deletion::<Thing>(..)`"
            ) && text.contains("is a replicated model: its handlers take `Replication<_>`"),
            "{text}"
        );
    }

    #[derive(Clone)]
    struct Pool;
    #[derive(Clone)]
    struct Client;

    async fn takes_states(
        _: Delivery<First>,
        _: crate::State<Pool>,
        _: crate::State<Client>,
    ) -> Result<(), BoxErrorAlias> {
        Ok(())
    }

    #[test]
    fn a_state_a_handler_takes_and_nobody_gave_is_refused_naming_both() {
        let error = Registry::builder()
            .state(Client)
            .handle::<First>(crate::handler_fn(takes_states))
            .build()
            .unwrap_err();
        let pool = std::any::type_name::<Pool>();
        assert_eq!(summary(&error), [("state", "first", 1, pool, 0)]);
        let Error::Registry { problems } = &error else {
            unreachable!()
        };
        let RegistryProblem::MissingState { handler, .. } = &problems[0] else {
            unreachable!()
        };
        assert_eq!(handler.map(|at| at.file), Some(file!()));
        let text = error.to_string();
        assert!(
            text.contains("the handler of category `first` (id 1")
                && text.contains(&format!("takes `State<{pool}>`, but no `{pool}` was given")),
            "{text}"
        );

        let both = Registry::builder()
            .state(Pool)
            .state(Client)
            .handle::<First>(crate::handler_fn(takes_states))
            .build();
        assert!(both.is_ok(), "{both:?}");
    }

    #[test]
    fn lookups_know_scope_and_policy() {
        let registry = Registry::builder().no_op::<First>().build().unwrap();
        let info = registry.category(CategoryId(1)).unwrap();
        assert_eq!(
            (
                info.name,
                info.scope,
                info.scope_name,
                info.coalesce,
                info.no_op
            ),
            ("first", ScopeId(1), "org", true, true)
        );
        assert!(registry.category(CategoryId(2)).is_none());
        assert_eq!(registry.category_ids(), [CategoryId(1)]);
    }
}
