//! The keys of the outbox's rows: scope, category and message ids, destinations and shards.
//! The lowest layer with the identifiers: it names no error, so that errors can name it.

use std::fmt;

use crate::id::{Id, Identifier};

/// Stable identifier of a [`Scope`](crate::Scope), stored in every outbox row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeId(pub i16);

/// Stable identifier of a [`Category`](crate::Category), stored in every outbox row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CategoryId(pub i32);

/// Identifier the database assigned to one outbox row. Increases with every write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub i64);

impl fmt::Display for ScopeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for CategoryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The name of the destination a fan-out message is delivered to (a region, a cell...).
///
/// Part of the shard key: each destination drains independently of the others.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Destination(pub(crate) String);

/// The longest destination name accepted, in bytes.
pub const MAX_DESTINATION_LEN: usize = 200;

impl Destination {
    /// The destination name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A shard: the unit of ordering, exclusive processing and backoff.
///
/// `(scope, shard_identifier)` for local outboxes, plus the destination for fan-out outboxes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardKey {
    /// The scope the shard identifier belongs to.
    pub scope: ScopeId,
    /// The identifier of the thing the shard is about (an organization id, a user id...).
    pub shard_identifier: Id,
    /// The destination of a fan-out outbox; `None` for a local outbox.
    pub destination: Option<Destination>,
}

impl ShardKey {
    /// A local shard.
    pub fn local(scope: ScopeId, shard_identifier: impl Identifier) -> Self {
        Self {
            scope,
            shard_identifier: shard_identifier.into_id(),
            destination: None,
        }
    }

    /// A fan-out shard for one destination.
    pub fn fan_out(
        scope: ScopeId,
        shard_identifier: impl Identifier,
        destination: Destination,
    ) -> Self {
        Self {
            scope,
            shard_identifier: shard_identifier.into_id(),
            destination: Some(destination),
        }
    }

    /// The destination as stored in a row: the empty string for a local outbox.
    pub fn destination_str(&self) -> &str {
        self.destination.as_ref().map_or("", Destination::as_str)
    }

    /// Rebuilds a key from its stored form, where the empty destination means "local".
    pub fn from_stored(scope: i16, shard_identifier: Id, destination: String) -> Self {
        Self {
            scope: ScopeId(scope),
            shard_identifier,
            destination: (!destination.is_empty()).then_some(Destination(destination)),
        }
    }
}

impl fmt::Display for ShardKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "scope {} shard {}", self.scope, self.shard_identifier)?;
        if let Some(destination) = &self.destination {
            write!(f, " destination `{destination}`")?;
        }
        Ok(())
    }
}
