//! The names of scopes and categories a binary knows: for tools that show and read them
//! (the `outbox` command), without handlers.

use crate::id::Id;
use crate::key::Destination;
use crate::model::{CategoryId, CategoryIdentity, ScopeId, ShardKey};
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

    /// Reads a scope as an operator writes it: its name, or its number.
    pub fn read_scope(&self, text: &str) -> Result<ScopeId, NameError> {
        if let Some(id) = self.scope_named(text) {
            return Ok(id);
        }
        text.parse::<i16>().map(ScopeId).map_err(|_| {
            let names: Vec<&str> = self.scopes.iter().map(|(_, name)| *name).collect();
            NameError::unknown(&format!("unknown scope `{text}`"), &names)
        })
    }

    /// Reads a category as an operator writes it: its name, or its number.
    pub fn read_category(&self, text: &str) -> Result<CategoryId, NameError> {
        if let Some(category) = self.category_named(text) {
            return Ok(category.identity.id);
        }
        text.parse::<i32>().map(CategoryId).map_err(|_| {
            let names: Vec<&str> = self
                .categories
                .iter()
                .map(|category| category.identity.name)
                .collect();
            NameError::unknown(&format!("unknown category `{text}`"), &names)
        })
    }

    /// Reads a shard as an operator writes it: `SCOPE:IDENTIFIER[:DESTINATION]`, the scope by
    /// its name or number, the identifier an integer or a UUID, a fan-out shard's
    /// destination last (`organization:42`, `1:42`, `1:3f2a0c4e-…:eu-west`).
    pub fn read_shard(&self, text: &str) -> Result<ShardKey, NameError> {
        let mut parts = text.splitn(3, ':');
        let (Some(scope), Some(identifier)) = (parts.next(), parts.next()) else {
            return Err(NameError::new(format!(
                "`{text}` is not a shard: write SCOPE:IDENTIFIER[:DESTINATION], e.g. 1:42"
            )));
        };
        let scope = self.read_scope(scope)?;
        let identifier: Id = identifier.parse().map_err(|error| {
            NameError::new(format!(
                "`{identifier}` is not a shard identifier ({error}): an integer, or a UUID"
            ))
        })?;
        match parts.next() {
            None => Ok(ShardKey::local(scope, identifier)),
            Some(destination) => {
                let destination = Destination::new(destination)
                    .map_err(|error| NameError::new(error.to_string()))?;
                Ok(ShardKey::fan_out(scope, identifier, destination))
            }
        }
    }

    /// A shard as an operator writes it (what [`Catalog::read_shard`] reads back).
    pub fn shard_text(&self, shard: &ShardKey) -> String {
        let scope = self.scope_text(shard.scope);
        match shard.destination_str() {
            "" => format!("{scope}:{}", shard.shard_identifier),
            destination => format!("{scope}:{}:{destination}", shard.shard_identifier),
        }
    }

    /// A scope's name, or its number.
    pub fn scope_text(&self, scope: ScopeId) -> String {
        self.scope_name(scope)
            .map_or_else(|| scope.0.to_string(), str::to_owned)
    }

    /// A category's name, or its number.
    pub fn category_text(&self, category: CategoryId) -> String {
        self.category(category).map_or_else(
            || category.0.to_string(),
            |known| known.identity.name.to_owned(),
        )
    }
}

/// A scope, category or shard an operator wrote that a [`Catalog`] cannot read: what to write
/// instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError {
    message: String,
    /// Whether the name was unknown and the catalog knew none to offer.
    no_names: bool,
}

impl NameError {
    fn new(message: String) -> Self {
        Self {
            message,
            no_names: false,
        }
    }

    /// An unknown name: give its number, or one of `names`.
    fn unknown(what: &str, names: &[&str]) -> Self {
        if names.is_empty() {
            Self {
                message: format!("{what}: give its number"),
                no_names: true,
            }
        } else {
            Self::new(format!(
                "{what}: give its number, or one of the names this binary knows: {}",
                names.join(", ")
            ))
        }
    }

    /// Whether the name was unknown and the catalog knew none to offer: a tool built
    /// without the declarations (the `outbox` command as installed) may say how to build one
    /// with them.
    pub fn knows_no_names(&self) -> bool {
        self.no_names
    }
}

impl std::fmt::Display for NameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for NameError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_read_back_as_they_are_written() {
        let catalog = Catalog::empty();
        for text in [
            "1:42",
            "-3:-7",
            "2:42:eu-west:a",
            "1:3f2a0c4e-8a1b-4c7d-9e0f-1a2b3c4d5e6f",
        ] {
            let key = catalog.read_shard(text).expect(text);
            assert_eq!(catalog.shard_text(&key), text);
        }
        let fan_out = catalog.read_shard("2:42:eu-west:a").unwrap();
        assert_eq!(fan_out.destination_str(), "eu-west:a");
    }

    #[test]
    fn mistakes_are_refused_with_what_to_write() {
        let catalog = Catalog::empty();
        for (text, says) in [
            ("42", "SCOPE:IDENTIFIER"),
            ("org:42", "unknown scope `org`"),
            ("1:x", "not a shard identifier"),
            ("1:2:", "it is empty"),
        ] {
            let error = catalog.read_shard(text).expect_err(text).to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
        let unknown = catalog.read_category("webhook").unwrap_err();
        assert!(unknown.knows_no_names(), "{unknown}");
        assert!(!catalog.read_shard("1:x").unwrap_err().knows_no_names());
    }

    #[test]
    fn names_are_read_and_offered() {
        let mut catalog = Catalog::empty();
        catalog.add_category(
            CategoryIdentity::declared::<crate::test_models::Thing>("Thing"),
            None,
        );
        let identity = CategoryIdentity::declared::<crate::test_models::Thing>("Thing");
        assert_eq!(
            catalog.read_category(identity.name),
            Ok(identity.id),
            "by name"
        );
        assert_eq!(catalog.read_category("7"), Ok(CategoryId(7)), "by number");
        assert_eq!(catalog.read_scope(identity.scope_name), Ok(identity.scope));
        let key = catalog
            .read_shard(&format!("{}:42", identity.scope_name))
            .expect("a shard in a named scope");
        assert_eq!(
            catalog.shard_text(&key),
            format!("{}:42", identity.scope_name)
        );
        assert_eq!(catalog.category_text(identity.id), identity.name);
        let unknown = catalog.read_category("webhook").unwrap_err();
        assert!(!unknown.knows_no_names());
        assert!(unknown.to_string().contains(identity.name), "{unknown}");
    }
}
