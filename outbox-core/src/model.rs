//! The vocabulary of the outbox: scopes, categories, shards and messages.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::id::{Id, Identifier};
pub use crate::key::{CategoryId, Destination, MAX_DESTINATION_LEN, MessageId, ScopeId, ShardKey};
use crate::metadata::Metadata;

/// What kind of thing a shard identifier names (an organization, a user, an audit log...).
///
/// A scope is declared once per application; every [`Category`] belongs to exactly one scope,
/// which is a fact of the type system: [`Category::Scope`] is an associated type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox scope",
    label = "not a scope",
    note = "declare the scope with `#[outbox_scope(id = ...)]` on a unit struct"
)]
pub trait Scope: Send + Sync + 'static {
    /// The stable identifier stored in the row. Never reuse one for another scope.
    const ID: ScopeId;
    /// A human-readable name, used in errors and inspection.
    const NAME: &'static str;
}

/// A kind of message: its scope, payload type, stable identifier and coalescing policy.
///
/// ```
/// use outbox_core::{Category, CategoryId, Scope, ScopeId};
///
/// struct Organization;
/// impl Scope for Organization {
///     const ID: ScopeId = ScopeId(1);
///     const NAME: &'static str = "organization";
/// }
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct ProjectChanged { name: String }
///
/// struct ProjectUpdate;
/// impl Category for ProjectUpdate {
///     type Scope = Organization;
///     type Payload = ProjectChanged;
///     const ID: CategoryId = CategoryId(10);
///     const NAME: &'static str = "project_update";
/// }
///
/// // The scope comes from the category: it cannot be got wrong through the typed API.
/// let message = outbox_core::Message::new::<ProjectUpdate>(7, 42, &ProjectChanged {
///     name: "Backend".into(),
/// })?;
/// assert_eq!(message.shard().scope, ScopeId(1));
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox category",
    label = "not a category",
    note = "declare the category with `#[outbox_category(scope = ..., id = ...)]` on its payload type"
)]
pub trait Category: Send + Sync + 'static {
    /// The one scope this category belongs to.
    type Scope: Scope;
    /// The payload carried by each message, serialized as JSON.
    type Payload: Payload;
    /// The stable identifier stored in the row. Never reuse one for another category.
    const ID: CategoryId;
    /// A human-readable name, used in errors and inspection.
    const NAME: &'static str;
    /// Whether messages of one coalescing group collapse into one delivery of the newest
    /// payload (the default), or are each delivered, in write order.
    const COALESCE: bool = true;
    /// The dead-letter policy. `None` (the default): a group whose delivery fails stays
    /// at the head of its shard, which backs off and retries it until it succeeds; the groups
    /// behind it wait. `Some(n)`: after `n` failed attempts the group's rows move to the dead
    /// letters, where an operator can list, replay or purge them, and the shard goes on.
    /// Never `Some(0)`. The registry can override it
    /// ([`RegistryBuilder::max_attempts`](crate::RegistryBuilder::max_attempts)).
    const MAX_ATTEMPTS: Option<u32> = None;
    /// The scope's id (what the declaration macros record without naming the scope again).
    #[doc(hidden)]
    const SCOPE_ID: ScopeId = <Self::Scope as Scope>::ID;
    /// The scope's name.
    #[doc(hidden)]
    const SCOPE_NAME: &'static str = <Self::Scope as Scope>::NAME;
}

/// A category's identity, as its declaration states it: its id and name, its scope, and how
/// its groups are delivered. What the registry knows of a category
/// ([`CategoryInfo::identity`](crate::registry::CategoryInfo::identity)), what the
/// declaration macros record, and what operators' tools show by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CategoryIdentity {
    /// The stable id stored in each row ([`Category::ID`]).
    pub id: CategoryId,
    /// The name ([`Category::NAME`]).
    pub name: &'static str,
    /// The scope the category belongs to.
    pub scope: ScopeId,
    /// The scope's name.
    pub scope_name: &'static str,
    /// Whether the category's groups coalesce to their newest message
    /// ([`Category::COALESCE`]).
    pub coalesce: bool,
    /// The declared dead-letter policy ([`Category::MAX_ATTEMPTS`]; a registry may override
    /// it).
    pub max_attempts: Option<u32>,
    /// The name of the type that declares it, without its path.
    pub type_name: &'static str,
}

impl CategoryIdentity {
    /// Category `C`'s, its type named `type_name`: what a declaration macro records, in a
    /// constant.
    pub const fn declared<C: Category>(type_name: &'static str) -> Self {
        Self {
            id: C::ID,
            name: C::NAME,
            scope: C::SCOPE_ID,
            scope_name: C::SCOPE_NAME,
            coalesce: C::COALESCE,
            max_attempts: C::MAX_ATTEMPTS,
            type_name,
        }
    }

    /// Category `C`'s.
    pub fn of<C: Category>() -> Self {
        let type_name = std::any::type_name::<C>();
        Self::declared::<C>(type_name.rsplit("::").next().unwrap_or(type_name))
    }
}

/// What a category's messages carry: any type serialized to JSON and back, that is any
/// `Serialize + DeserializeOwned` type.
///
/// The serde traits are not supertraits, so that a type that lacks them gets this trait's
/// one clear error rather than one from each serde trait.
#[diagnostic::on_unimplemented(
    message = "`{Self}` must be serializable to travel through the outbox: it does not implement `Serialize` and `Deserialize`",
    label = "not serializable",
    note = "derive them: `#[derive(serde::Serialize, serde::Deserialize)]`"
)]
pub trait Payload: Send + 'static {
    /// The payload as JSON text.
    fn to_json_string(&self) -> Result<String, serde_json::Error>;
    /// The payload as a JSON value.
    fn to_json_value(&self) -> Result<serde_json::Value, serde_json::Error>;
    /// A payload read from JSON text.
    fn from_json_str(json: &str) -> Result<Self, serde_json::Error>
    where
        Self: Sized;
    /// A payload read from a JSON value.
    fn from_json_value(json: serde_json::Value) -> Result<Self, serde_json::Error>
    where
        Self: Sized;

    /// A payload read from any serde deserializer (a replicated model from its row).
    fn from_deserializer<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Self, D::Error>
    where
        Self: Sized;
}

#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned + Send + 'static> Payload for T {
    fn to_json_string(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    fn to_json_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(self)
    }

    fn from_json_str(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }

    fn from_deserializer<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Self, D::Error> {
        T::deserialize(deserializer)
    }

    fn from_json_value(json: serde_json::Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value(json)
    }
}

impl Destination {
    /// Validates a destination name: 1 to [`MAX_DESTINATION_LEN`] bytes, no control characters.
    pub fn new(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        let reason = if name.is_empty() {
            Some("it is empty")
        } else if name.len() > MAX_DESTINATION_LEN {
            Some("it is longer than 200 bytes")
        } else if name.chars().any(char::is_control) {
            Some("it contains a control character")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(Error::InvalidDestination { name, reason }),
            None => Ok(Self(name)),
        }
    }
}

/// An outbox message, ready to be written in the caller's transaction.
///
/// Built from a typed [`Category`] with [`Message::new`], so its scope always matches its
/// category, or checked against a [`Registry`](crate::Registry) with [`Message::from_raw`].
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    shard: ShardKey,
    category: CategoryId,
    category_name: &'static str,
    scope_name: &'static str,
    object_identifier: Id,
    payload: String,
    metadata: Metadata,
}

impl Message {
    /// A local message of category `C` about `object_identifier`, in shard `shard_identifier`
    /// of `C`'s scope.
    pub fn new<C: Category>(
        shard_identifier: impl Identifier,
        object_identifier: impl Identifier,
        payload: &C::Payload,
    ) -> Result<Self, Error> {
        let payload = Payload::to_json_string(payload).map_err(|source| Error::Serialize {
            category: C::NAME,
            source,
        })?;
        Ok(Self {
            shard: ShardKey::local(<C::Scope as Scope>::ID, shard_identifier),
            category: C::ID,
            category_name: C::NAME,
            scope_name: <C::Scope as Scope>::NAME,
            object_identifier: object_identifier.into_id(),
            payload,
            metadata: crate::trace::current_metadata(),
        })
    }

    /// One fan-out message per destination: each destination gets its own row and shard.
    pub fn fan_out<C: Category>(
        destinations: impl IntoIterator<Item = Destination>,
        shard_identifier: impl Identifier,
        object_identifier: impl Identifier,
        payload: &C::Payload,
    ) -> Result<Vec<Self>, Error> {
        let local = Self::new::<C>(shard_identifier, object_identifier, payload)?;
        Ok(destinations
            .into_iter()
            .map(|destination| local.clone().with_destination(destination))
            .collect())
    }

    /// This message, addressed to a fan-out destination.
    pub fn with_destination(mut self, destination: Destination) -> Self {
        self.shard.destination = Some(destination);
        self
    }

    /// An untyped message whose category and scope the registry checked
    /// ([`Message::from_raw`]), with its payload as JSON text.
    pub(crate) fn from_checked(
        raw: RawMessage,
        category_name: &'static str,
        scope_name: &'static str,
        payload: String,
    ) -> Self {
        Self {
            shard: ShardKey {
                scope: raw.scope,
                shard_identifier: raw.shard_identifier,
                destination: raw.destination,
            },
            category: raw.category,
            category_name,
            scope_name,
            object_identifier: raw.object_identifier,
            payload,
            metadata: crate::trace::current_metadata(),
        }
    }

    /// The shard the message belongs to.
    pub fn shard(&self) -> &ShardKey {
        &self.shard
    }

    /// The message's category.
    pub fn category(&self) -> CategoryId {
        self.category
    }

    /// The object the message is about.
    pub fn object_identifier(&self) -> Id {
        self.object_identifier
    }

    /// The category's name, as declared.
    pub fn category_name(&self) -> &'static str {
        self.category_name
    }

    /// The name of the category's scope, as declared.
    pub fn scope_name(&self) -> &'static str {
        self.scope_name
    }

    /// The payload as JSON text.
    pub fn payload_json(&self) -> &str {
        &self.payload
    }

    /// The metadata stored with the message: with the `opentelemetry` feature, the W3C trace
    /// context of the span current when the message was built.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// This message with `value` stored under `key` in its metadata, for its handler to read
    /// from [`Delivery::metadata`](crate::Delivery::metadata).
    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key, value);
        self
    }
}

/// An untyped message, as an operator tool or a generic producer would build it.
///
/// Turn it into a [`Message`] with [`Message::from_raw`], which checks it against the registry.
#[derive(Debug, Clone, PartialEq)]
pub struct RawMessage {
    /// The scope the shard identifier belongs to.
    pub scope: ScopeId,
    /// The shard identifier.
    pub shard_identifier: Id,
    /// The fan-out destination, if any.
    pub destination: Option<Destination>,
    /// The category.
    pub category: CategoryId,
    /// The object the message is about.
    pub object_identifier: Id,
    /// The payload.
    pub payload: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_validated() {
        assert_eq!(Destination::new("eu-west").unwrap().as_str(), "eu-west");
        for (bad, why) in [
            ("", "empty"),
            ("a\nb", "control"),
            (&"x".repeat(201)[..], "longer"),
        ] {
            let error = Destination::new(bad).unwrap_err();
            assert!(error.to_string().contains(why), "{error}");
        }
    }

    #[test]
    fn shard_keys_store_local_as_the_empty_destination() {
        let local = ShardKey::local(ScopeId(1), 5);
        assert_eq!(local.destination_str(), "");
        assert_eq!(
            ShardKey::from_stored(1, Id::integer(5), String::new()),
            local
        );
        let fan_out = ShardKey::fan_out(ScopeId(1), 5, Destination::new("us").unwrap());
        assert_eq!(
            ShardKey::from_stored(1, Id::integer(5), "us".into()),
            fan_out
        );
        assert_eq!(fan_out.to_string(), "scope 1 shard 5 destination `us`");
    }
}
