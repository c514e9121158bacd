//! Declarations collected across the binary: what `#[outbox_scope]`, `#[outbox_category]`,
//! `#[replicated_model]` and `#[outbox_handler]` register with `inventory`, read by [`RegistryBuilder::discovered`].
//!
//! [`RegistryBuilder::discovered`]: crate::RegistryBuilder::discovered

use std::fmt;

use super::RegistryBuilder;
use crate::error::SourceLocation;
use crate::model::{CategoryIdentity, ScopeId};
use crate::replicated::ModelTable;

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
    /// Its identity (its type's name as written in the source).
    pub identity: CategoryIdentity,
    pub no_op: bool,
    /// `Some` for a `#[replicated_model]`.
    pub model: Option<ModelTable>,
    /// A replicated model's replication version (0 for any other category).
    pub replication_version: u32,
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
