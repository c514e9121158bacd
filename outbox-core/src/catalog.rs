//! The names of scopes and categories a binary knows: for tools that show and read them
//! (the `outbox` command), without handlers.

use crate::model::{CategoryId, CategoryIdentity, ScopeId};
use crate::registry::Registry;
use crate::registry::declare::{CategoryDeclaration, ScopeDeclaration};

/// A category's names, as a [`Catalog`] knows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NamedCategory {
    /// Its identity: id, name, scope.
    pub identity: CategoryIdentity,
    /// For a replicated model: the replication version its code declares (what a backfill
    /// started without a version walks to).
    pub replication_version: Option<u32>,
}

/// The scopes and categories a binary knows by name: those declared with the attribute macros
/// in any crate it links ([`Catalog::discovered`]), or a registry's ([`Catalog::of`]). What the
/// `outbox` command uses to show names instead of ids, to read names given on its command
/// line, and to refuse to replay a dead letter of a category this binary does not know.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    scopes: Vec<(ScopeId, &'static str)>,
    categories: Vec<NamedCategory>,
}

impl Catalog {
    /// No names: every scope and category is shown by its id.
    pub fn empty() -> Self {
        Self::default()
    }

    /// The scopes and categories declared with `#[outbox_scope]`, `#[outbox_category]`,
    /// `#[outbox_categories]` and `#[replicated_model]` in this binary (in any crate it links).
    pub fn discovered() -> Self {
        let mut catalog = Self::default();
        for scope in inventory::iter::<ScopeDeclaration> {
            catalog.add_scope(scope.id, scope.name);
        }
        for category in inventory::iter::<CategoryDeclaration> {
            let version = category.model.map(|_| category.replication_version);
            catalog.add_category(category.identity, version);
        }
        catalog
    }

    /// The scopes and categories of `registry`, added to this catalog's.
    pub fn with_registry(mut self, registry: &Registry) -> Self {
        for info in registry.categories() {
            let version = info.backfill.map(|model| model.version);
            self.add_category(info.identity, version);
        }
        self
    }

    /// The scopes and categories of `registry`.
    pub fn of(registry: &Registry) -> Self {
        Self::empty().with_registry(registry)
    }

    fn add_scope(&mut self, id: ScopeId, name: &'static str) {
        if !self.scopes.iter().any(|(known, _)| *known == id) {
            self.scopes.push((id, name));
            self.scopes.sort_unstable();
        }
    }

    /// Adds a category, and its scope.
    fn add_category(&mut self, identity: CategoryIdentity, replication_version: Option<u32>) {
        self.add_scope(identity.scope, identity.scope_name);
        if !self
            .categories
            .iter()
            .any(|known| known.identity.id == identity.id)
        {
            self.categories.push(NamedCategory {
                identity,
                replication_version,
            });
            self.categories
                .sort_unstable_by_key(|category| category.identity.id);
        }
    }

    /// The category with id `id`, if known.
    pub fn category(&self, id: CategoryId) -> Option<&NamedCategory> {
        self.categories
            .iter()
            .find(|category| category.identity.id == id)
    }

    /// The category named `name`, if known.
    pub fn category_named(&self, name: &str) -> Option<&NamedCategory> {
        self.categories
            .iter()
            .find(|category| category.identity.name == name)
    }

    /// Every known category, by id.
    pub fn categories(&self) -> &[NamedCategory] {
        &self.categories
    }

    /// The name of scope `id`, if known.
    pub fn scope_name(&self, id: ScopeId) -> Option<&'static str> {
        self.scopes
            .iter()
            .find(|(known, _)| *known == id)
            .map(|(_, name)| *name)
    }

    /// The scope named `name`, if known.
    pub fn scope_named(&self, name: &str) -> Option<ScopeId> {
        self.scopes
            .iter()
            .find(|(_, known)| *known == name)
            .map(|(id, _)| *id)
    }
}
