//! Declarations collected across the binary: what `#[outbox_scope]`, `#[outbox_category]`,
//! `#[replicated_model]` and `#[outbox_handler]` register with `inventory`, read by [`RegistryBuilder::discovered`].
//!
//! [`RegistryBuilder::discovered`]: crate::RegistryBuilder::discovered

use std::fmt;

use crate::model::{CategoryId, ScopeId};
use crate::registry::RegistryBuilder;
use crate::replicated::ModelTable;

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

/// A scope declared with `#[outbox_scope]`.
#[doc(hidden)]
#[derive(Debug)]
pub struct ScopeDeclaration {
    pub id: ScopeId,
    pub name: &'static str,
    pub at: SourceLocation,
}

/// A category declared with `#[outbox_category]`.
#[doc(hidden)]
#[derive(Debug)]
pub struct CategoryDeclaration {
    pub id: CategoryId,
    pub name: &'static str,
    pub scope: ScopeId,
    pub scope_name: &'static str,
    pub coalesce: bool,
    pub max_attempts: Option<u32>,
    pub no_op: bool,
    /// `Some` for a `#[replicated_model]`.
    pub model: Option<ModelTable>,
    /// A replicated model's replication version (0 for any other category).
    pub replication_version: u32,
    /// The type's name as written in the source.
    pub type_name: &'static str,
    pub at: SourceLocation,
}

/// A handler declared with `#[outbox_handler]`: `register` adds it to a builder.
#[doc(hidden)]
pub struct HandlerDeclaration {
    pub register: fn(RegistryBuilder, SourceLocation) -> RegistryBuilder,
    pub at: SourceLocation,
}

impl fmt::Debug for HandlerDeclaration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerDeclaration")
            .field("at", &self.at)
            .finish_non_exhaustive()
    }
}

inventory::collect!(ScopeDeclaration);
inventory::collect!(CategoryDeclaration);
inventory::collect!(HandlerDeclaration);
