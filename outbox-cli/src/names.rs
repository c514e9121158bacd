//! Shards, scopes and categories as the command line writes them: by name where the binary
//! knows the name ([`Catalog`]), by number otherwise.
//!
//! A shard is `SCOPE:IDENTIFIER[:DESTINATION]`: `organization:42`, `1:42`,
//! `1:3f2a0c4e-8a1b-4c7d-9e0f-1a2b3c4d5e6f:eu-west` (a wide identifier in UUID form, a
//! fan-out shard's destination last).

use outbox_core::{CategoryId, Destination, Id, ScopeId, ShardKey};

use outbox_core::admin::Catalog;

use crate::CliError;

/// Reads a scope: its name, or its number.
pub(crate) fn scope(catalog: &Catalog, text: &str) -> Result<ScopeId, CliError> {
    if let Some(id) = catalog.scope_named(text) {
        return Ok(id);
    }
    text.parse::<i16>().map(ScopeId).map_err(|_| {
        CliError::Refused(format!(
            "unknown scope `{text}`: give its number{}",
            known(catalog.categories().is_empty(), || {
                let mut names: Vec<&str> = catalog
                    .categories()
                    .iter()
                    .filter_map(|category| catalog.scope_name(category.identity.scope))
                    .collect();
                names.dedup();
                names.join(", ")
            })
        ))
    })
}

/// Reads a category: its name, or its number.
pub(crate) fn category(catalog: &Catalog, text: &str) -> Result<CategoryId, CliError> {
    if let Some(category) = catalog.category_named(text) {
        return Ok(category.identity.id);
    }
    text.parse::<i32>().map(CategoryId).map_err(|_| {
        CliError::Refused(format!(
            "unknown category `{text}`: give its number{}",
            known(catalog.categories().is_empty(), || {
                catalog
                    .categories()
                    .iter()
                    .map(|category| category.identity.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
        ))
    })
}

/// ", or one of the names this binary knows: …", when it knows some.
fn known(none: bool, names: impl FnOnce() -> String) -> String {
    if none {
        " (this binary knows no names: build the command into your service's binary to use \
         them; see the `outbox_cli` crate)"
            .to_owned()
    } else {
        format!(", or one of the names this binary knows: {}", names())
    }
}

/// Reads a shard: `SCOPE:IDENTIFIER[:DESTINATION]`.
pub(crate) fn shard(catalog: &Catalog, text: &str) -> Result<ShardKey, CliError> {
    let mut parts = text.splitn(3, ':');
    let (Some(scope_text), Some(identifier)) = (parts.next(), parts.next()) else {
        return Err(CliError::Refused(format!(
            "`{text}` is not a shard: write SCOPE:IDENTIFIER[:DESTINATION], e.g. 1:42"
        )));
    };
    let scope = scope(catalog, scope_text)?;
    let identifier: Id = identifier.parse().map_err(|error| {
        CliError::Refused(format!(
            "`{identifier}` is not a shard identifier ({error}): an integer, or a UUID"
        ))
    })?;
    match parts.next() {
        None => Ok(ShardKey::local(scope, identifier)),
        Some(destination) => {
            let destination = Destination::new(destination)
                .map_err(|error| CliError::Refused(error.to_string()))?;
            Ok(ShardKey::fan_out(scope, identifier, destination))
        }
    }
}

/// A shard as the command line writes it (what [`shard`] reads back).
pub(crate) fn shard_text(catalog: &Catalog, shard: &ShardKey) -> String {
    let scope = scope_text(catalog, shard.scope);
    match shard.destination_str() {
        "" => format!("{scope}:{}", shard.shard_identifier),
        destination => format!("{scope}:{}:{destination}", shard.shard_identifier),
    }
}

/// A scope's name, or its number.
pub(crate) fn scope_text(catalog: &Catalog, scope: ScopeId) -> String {
    catalog
        .scope_name(scope)
        .map_or_else(|| scope.0.to_string(), str::to_owned)
}

/// A category's name, or its number.
pub(crate) fn category_text(catalog: &Catalog, category: CategoryId) -> String {
    catalog.category(category).map_or_else(
        || category.0.to_string(),
        |known| known.identity.name.to_owned(),
    )
}

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
            let key = shard(&catalog, text).expect(text);
            assert_eq!(shard_text(&catalog, &key), text);
        }
        let fan_out = shard(&catalog, "2:42:eu-west:a").unwrap();
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
            let error = shard(&catalog, text).expect_err(text).to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
        assert!(
            category(&catalog, "webhook")
                .unwrap_err()
                .to_string()
                .contains("knows no names")
        );
    }
}
