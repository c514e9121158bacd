//! The registry: every category this binary knows, with its scope, policy and handler.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::sync::Arc;

use crate::error::{Error, RegistryProblem};
use crate::handler::{ErasedHandler, Handler, NoOp, Typed};
use crate::model::{Category, CategoryId, Scope, ScopeId};

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
            .finish_non_exhaustive()
    }
}

/// Every category this binary can deliver, keyed by id. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    categories: Arc<HashMap<CategoryId, CategoryInfo>>,
}

impl Registry {
    /// Starts a registry.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
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
}

/// Builds a [`Registry`]; [`RegistryBuilder::build`] reports every conflict at once.
#[derive(Default)]
pub struct RegistryBuilder {
    entries: Vec<CategoryInfo>,
}

impl fmt::Debug for RegistryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryBuilder")
            .field("entries", &self.entries)
            .finish()
    }
}

impl RegistryBuilder {
    /// Registers category `C` with its handler.
    pub fn handle<C: Category>(self, handler: impl Handler<C>) -> Self {
        self.push::<C>(Arc::new(Typed::<C, _>::new(handler)), false)
    }

    /// Registers category `C` as needing no handler: its deliveries are acknowledged as they
    /// come. Without this, a category cannot be registered without a handler.
    pub fn no_op<C: Category>(self) -> Self {
        self.push::<C>(Arc::new(Typed::<C, _>::new(NoOp)), true)
    }

    fn push<C: Category>(mut self, handler: Arc<dyn ErasedHandler>, no_op: bool) -> Self {
        self.entries.push(CategoryInfo {
            id: C::ID,
            name: C::NAME,
            scope: <C::Scope as Scope>::ID,
            scope_name: <C::Scope as Scope>::NAME,
            coalesce: C::COALESCE,
            no_op,
            handler,
        });
        self
    }

    /// Checks for duplicate category ids and names and for scope ids used by two scopes.
    pub fn build(self) -> Result<Registry, Error> {
        let mut problems = Vec::new();
        let mut by_id: HashMap<CategoryId, CategoryInfo> = HashMap::new();
        let mut by_name: HashMap<&'static str, CategoryId> = HashMap::new();
        let mut scopes: HashMap<ScopeId, &'static str> = HashMap::new();
        for info in self.entries {
            match scopes.entry(info.scope) {
                Entry::Occupied(seen) if *seen.get() != info.scope_name => {
                    problems.push(RegistryProblem::DuplicateScopeId {
                        id: info.scope,
                        first: seen.get(),
                        second: info.scope_name,
                    });
                }
                Entry::Occupied(_) => {}
                Entry::Vacant(slot) => {
                    slot.insert(info.scope_name);
                }
            }
            match by_name.entry(info.name) {
                Entry::Occupied(seen) => problems.push(RegistryProblem::DuplicateCategoryName {
                    name: info.name,
                    first: *seen.get(),
                    second: info.id,
                }),
                Entry::Vacant(slot) => {
                    slot.insert(info.id);
                }
            }
            match by_id.entry(info.id) {
                Entry::Occupied(seen) => problems.push(RegistryProblem::DuplicateCategoryId {
                    id: info.id,
                    first: seen.get().name,
                    second: info.name,
                }),
                Entry::Vacant(slot) => {
                    slot.insert(info);
                }
            }
        }
        if problems.is_empty() {
            Ok(Registry {
                categories: Arc::new(by_id),
            })
        } else {
            Err(Error::Registry { problems })
        }
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

    #[test]
    fn every_conflict_is_reported_at_once() {
        let error = Registry::builder()
            .no_op::<First>()
            .no_op::<SameId>()
            .no_op::<SameName>()
            .no_op::<OtherScope>()
            .build()
            .unwrap_err();
        let Error::Registry { problems } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(
            problems,
            &[
                RegistryProblem::DuplicateCategoryId {
                    id: CategoryId(1),
                    first: "first",
                    second: "same_id"
                },
                RegistryProblem::DuplicateCategoryName {
                    name: "first",
                    first: CategoryId(1),
                    second: CategoryId(2)
                },
                RegistryProblem::DuplicateScopeId {
                    id: ScopeId(1),
                    first: "org",
                    second: "impostor"
                },
            ]
        );
        let text = error.to_string();
        assert!(
            text.contains("`first` and `same_id`") && text.contains("`org` and `impostor`"),
            "{text}"
        );
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
