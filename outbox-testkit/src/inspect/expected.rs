//! What a test expects to be pending.

use std::fmt;

use outbox_core::{Category, CategoryId, Destination, Id, Identifier, Payload, Scope, ScopeId};

use super::PendingOutbox;

/// An outbox a test expects to be pending: its category, shard, object, and optionally its
/// destination and payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    pub(super) category: CategoryId,
    pub(super) name: &'static str,
    pub(super) scope: ScopeId,
    pub(super) shard_identifier: Id,
    pub(super) object_identifier: Option<Id>,
    pub(super) destination: Option<Destination>,
    pub(super) payload: Option<serde_json::Value>,
}

impl Expected {
    /// A local outbox of category `C` in shard `shard_identifier` of `C`'s scope, about
    /// `object_identifier`, with any payload.
    pub fn of<C: Category>(
        shard_identifier: impl Identifier,
        object_identifier: impl Identifier,
    ) -> Self {
        Self {
            object_identifier: Some(object_identifier.into_id()),
            ..Self::any_object::<C>(shard_identifier)
        }
    }

    /// A local outbox of category `C` in shard `shard_identifier` of `C`'s scope, about any
    /// object, with any payload.
    pub fn any_object<C: Category>(shard_identifier: impl Identifier) -> Self {
        Self {
            category: C::ID,
            name: C::NAME,
            scope: <C::Scope as Scope>::ID,
            shard_identifier: shard_identifier.into_id(),
            object_identifier: None,
            destination: None,
            payload: None,
        }
    }

    /// Like [`Expected::of`], with payload `payload` (compared as JSON).
    #[track_caller]
    pub fn with_payload<C: Category>(
        shard_identifier: impl Identifier,
        object_identifier: impl Identifier,
        payload: &C::Payload,
    ) -> Self {
        let payload = Payload::to_json_value(payload).unwrap_or_else(|error| {
            panic!(
                "the expected payload of category `{}` does not serialize: {error}",
                C::NAME
            )
        });
        Self {
            payload: Some(payload),
            ..Self::of::<C>(shard_identifier, object_identifier)
        }
    }

    /// This outbox, fanned out to `destination` instead of local.
    #[track_caller]
    #[must_use]
    pub fn to(self, destination: &str) -> Self {
        let destination = Destination::new(destination)
            .unwrap_or_else(|error| panic!("an expected destination: {error}"));
        Self {
            destination: Some(destination),
            ..self
        }
    }

    /// Whether `row` is this outbox, payload aside.
    pub(super) fn addresses(&self, row: &PendingOutbox) -> bool {
        row.category == self.category
            && row.shard.scope == self.scope
            && row.shard.shard_identifier == self.shard_identifier
            && row.shard.destination == self.destination
            && self
                .object_identifier
                .is_none_or(|object| object == row.object_identifier)
    }

    /// Whether `row` is this outbox.
    pub fn matches(&self, row: &PendingOutbox) -> bool {
        self.addresses(row)
            && self
                .payload
                .as_ref()
                .is_none_or(|payload| row.payload.as_ref() == Some(payload))
    }
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "category `{}` (#{})", self.name, self.category)?;
        match self.object_identifier {
            Some(object) => write!(f, " for object {object}")?,
            None => f.write_str(" for any object")?,
        }
        write!(
            f,
            " in scope {} shard {}",
            self.scope, self.shard_identifier
        )?;
        if let Some(destination) = &self.destination {
            write!(f, " destination `{destination}`")?;
        }
        if let Some(payload) = &self.payload {
            write!(f, " with payload {payload}")?;
        }
        Ok(())
    }
}
