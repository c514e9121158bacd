//! What a registry refuses to build, for whoever declares scopes, categories and handlers:
//! each problem, and where the declarations it names are.

use std::fmt;

/// A place in the source: where a scope, category or handler was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceLocation {
    /// The file, as `file!()` gives it.
    pub file: &'static str,
    /// The line, from 1.
    pub line: u32,
    /// The column, from 1.
    pub column: u32,
}

impl SourceLocation {
    /// The location of the caller of a `#[track_caller]` function.
    #[track_caller]
    pub(crate) fn caller() -> Self {
        let location = std::panic::Location::caller();
        Self {
            file: location.file(),
            line: location.line(),
            column: location.column(),
        }
    }
}

impl fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// A declared scope or category, as a registry problem names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Site {
    /// Its name.
    pub name: &'static str,
    /// Its id.
    pub id: i64,
    /// Where it was declared or registered, when known.
    pub at: Option<SourceLocation>,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` (id {}", self.name, self.id)?;
        if let Some(at) = &self.at {
            write!(f, ", at {at}")?;
        }
        f.write_str(")")
    }
}

struct At(Option<SourceLocation>);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(at) => write!(f, "{at}"),
            None => f.write_str("an unknown place"),
        }
    }
}

/// One conflict found while building a [`Registry`](crate::Registry).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryProblem {
    /// Two categories share an id.
    #[error("two categories use id {}: {first} and {second}", first.id)]
    DuplicateCategoryId {
        /// The category seen first.
        first: Site,
        /// The category seen second.
        second: Site,
    },
    /// Two categories share a name.
    #[error("two categories are named `{}`: {first} and {second}", first.name)]
    DuplicateCategoryName {
        /// The category seen first.
        first: Site,
        /// The category seen second.
        second: Site,
    },
    /// Two scopes share an id.
    #[error("two scopes use id {}: {first} and {second}", first.id)]
    DuplicateScopeId {
        /// The scope seen first.
        first: Site,
        /// The scope seen second.
        second: Site,
    },
    /// A category has two handlers (or a handler and a `no_op` declaration).
    #[error("category {category} has two handlers: at {} and at {}", At(*first), At(*second))]
    DuplicateHandler {
        /// The category.
        category: Site,
        /// Where the first handler was registered.
        first: Option<SourceLocation>,
        /// Where the second handler was registered.
        second: Option<SourceLocation>,
    },
    /// A declared category has no handler and is not declared `no_op`: its messages would
    /// never be delivered.
    #[error(
        "category {category} has no handler: add an `#[outbox_handler]` function taking \
         `Delivery<{type_name}>` or call `Registry::builder().handle::<{type_name}>(..)`, or \
         declare it with `no_op` if its messages need no handling. If its handler is in another \
         crate, that crate may not be linked into this binary: a dependency named only in \
         Cargo.toml is linked once the source names it, e.g. `use the_handlers_crate as _;`"
    )]
    MissingHandler {
        /// The category.
        category: Site,
        /// The category's type, as the source names it.
        type_name: &'static str,
    },
    /// A replicated model lacks its replication or its deletion handler.
    #[error(
        "replicated model {category} has no {kind} handler: add an `#[outbox_handler]` async fn \
         taking `{kind}<{model_type}>`, or call `Registry::builder().{}::<{model_type}>(..)`. \
         If it is in another crate, that crate may not be linked into this binary: name it in \
         the source, e.g. `use the_handlers_crate as _;`",
        kind.to_lowercase()
    )]
    MissingModelHandler {
        /// The model's category.
        category: Site,
        /// `Replication` or `Deletion`.
        kind: &'static str,
        /// The model's type, as the handler names it.
        model_type: &'static str,
    },
    /// A handler taking `Delivery<_>` is registered for a replicated model, whose handlers take
    /// `Replication<_>` and `Deletion<_>`.
    #[error(
        "category {category} is a replicated model: its handlers take `Replication<_>` and \
         `Deletion<_>`, not the `Delivery<_>` of the handler at {}",
        At(*at)
    )]
    DeliveryHandlerForModel {
        /// The model's category.
        category: Site,
        /// Where the handler was registered.
        at: Option<SourceLocation>,
    },
    /// A handler is registered for a category that no `#[outbox_category]` declares.
    #[error(
        "a handler is registered for category {category}, which no `#[outbox_category]` in \
         this binary declares"
    )]
    UndeclaredCategory {
        /// The handler's category, located at the handler.
        category: Site,
    },
    /// A handler takes `State<T>`, and no value of type `T` was given to
    /// [`RegistryBuilder::state`](crate::RegistryBuilder::state).
    #[error(
        "the handler of category {category} takes `State<{state_type}>`, but no \
         `{state_type}` was given: call `Registry::builder().state(value)` with one"
    )]
    MissingState {
        /// The handler's category, located at the handler.
        category: Site,
        /// Where the handler was registered.
        handler: Option<SourceLocation>,
        /// The state's type, as `std::any::type_name` gives it.
        state_type: &'static str,
    },
    /// A dead-letter policy of 0 attempts was given to
    /// [`RegistryBuilder::max_attempts`](crate::RegistryBuilder::max_attempts).
    #[error(
        "`max_attempts` for category {category} is 0: it must be at least 1 (or call \
         `block_on_failure` to keep failing groups at the head of their shard)"
    )]
    ZeroMaxAttempts {
        /// The category, located at the override.
        category: Site,
    },
    /// A dead-letter policy was given for a category the registry does not hold.
    #[error(
        "a dead-letter policy is given for category {category}, which the registry does not \
         hold: register its handler (or declare it) too"
    )]
    PolicyForUnknownCategory {
        /// The category, located at the override.
        category: Site,
    },
}

/// Items shown one after the other, separated by semicolons.
pub(super) struct DisplayList<'a, T>(pub(super) &'a [T]);

impl<T: fmt::Display> fmt::Display for DisplayList<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, item) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str("; ")?;
            }
            item.fmt(f)?;
        }
        Ok(())
    }
}
