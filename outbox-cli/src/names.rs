//! Shards, scopes and categories as the command line writes them: by name where the binary
//! knows the name ([`Catalog`]), by number otherwise.
//!
//! A shard is `SCOPE:IDENTIFIER[:DESTINATION]`: `organization:42`, `1:42`,
//! `1:3f2a0c4e-8a1b-4c7d-9e0f-1a2b3c4d5e6f:eu-west` (a wide identifier in UUID form, a
//! fan-out shard's destination last).

use outbox_core::admin::{Catalog, NameError};
use outbox_core::{CategoryId, ScopeId, ShardKey};

use crate::CliError;

/// A name the catalog could not read, refused; where the catalog knew no names, with how to
/// build the command with them.
fn refused(error: &NameError) -> CliError {
    if error.knows_no_names() {
        CliError::Refused(format!(
            "{error} (this binary knows no names: build the command into your service's binary \
             to use them; see the `outbox_cli` crate)"
        ))
    } else {
        CliError::Refused(error.to_string())
    }
}

/// Reads a scope: its name, or its number.
pub(crate) fn scope(catalog: &Catalog, text: &str) -> Result<ScopeId, CliError> {
    catalog.read_scope(text).map_err(|error| refused(&error))
}

/// Reads a category: its name, or its number.
pub(crate) fn category(catalog: &Catalog, text: &str) -> Result<CategoryId, CliError> {
    catalog.read_category(text).map_err(|error| refused(&error))
}

/// Reads a shard: `SCOPE:IDENTIFIER[:DESTINATION]`.
pub(crate) fn shard(catalog: &Catalog, text: &str) -> Result<ShardKey, CliError> {
    catalog.read_shard(text).map_err(|error| refused(&error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_without_names_says_how_to_build_one_with_them() {
        let catalog = Catalog::empty();
        let error = category(&catalog, "webhook").unwrap_err().to_string();
        assert!(error.contains("unknown category `webhook`"), "{error}");
        assert!(error.contains("knows no names"), "{error}");
        let error = shard(&catalog, "1:x").unwrap_err().to_string();
        assert!(!error.contains("knows no names"), "{error}");
    }
}
