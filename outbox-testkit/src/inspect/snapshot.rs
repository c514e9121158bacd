//! The snapshot: every pending outbox of a store, and its failing shards.

use std::fmt::Write as _;
use std::time::SystemTime;

use outbox_core::admin::Admin;
use outbox_core::store::Store;
use outbox_core::store::{PendingMessage, ShardState};
use outbox_core::{
    Category, CategoryId, Destination, Error, Id, MessageId, Payload, Registry, Relay, Scope,
    ScopeId, ShardKey,
};

use super::Expected;

/// One written, not yet delivered, outbox row.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PendingOutbox {
    /// The row's id: rows are listed in id (write) order.
    pub id: MessageId,
    /// The shard: scope, shard identifier and fan-out destination.
    pub shard: ShardKey,
    /// The category's id.
    pub category: CategoryId,
    /// The category's name, if the snapshot was given a registry that knows it.
    pub category_name: Option<&'static str>,
    /// The object.
    pub object_identifier: Id,
    /// The payload as stored (JSON text).
    pub payload_json: String,
    /// The payload as JSON, or `None` if the stored text is not JSON.
    pub payload: Option<serde_json::Value>,
    /// When the row was written.
    pub created_at: SystemTime,
}

impl PendingOutbox {
    fn from_message(message: PendingMessage) -> Self {
        Self {
            payload: serde_json::from_str(&message.payload).ok(),
            id: message.id,
            shard: message.shard,
            category: message.category,
            category_name: None,
            object_identifier: message.object_identifier,
            payload_json: message.payload,
            created_at: message.created_at,
        }
    }

    /// The scope of the row's shard.
    pub fn scope(&self) -> ScopeId {
        self.shard.scope
    }

    /// The shard identifier.
    pub fn shard_identifier(&self) -> Id {
        self.shard.shard_identifier
    }

    /// The fan-out destination, for a fan-out row.
    pub fn destination(&self) -> Option<&Destination> {
        self.shard.destination.as_ref()
    }

    /// Whether the row is of category `C` (and in `C`'s scope).
    pub fn is<C: Category>(&self) -> bool {
        self.category == C::ID && self.shard.scope == <C::Scope as Scope>::ID
    }

    /// The payload read as `C`'s.
    pub fn payload_as<C: Category>(&self) -> Result<C::Payload, serde_json::Error> {
        <C::Payload as Payload>::from_json_str(&self.payload_json)
    }

    /// The payload as shown in tables: compact JSON, or the stored text if it is not JSON.
    pub(super) fn payload_text(&self) -> String {
        self.payload
            .as_ref()
            .map_or_else(|| self.payload_json.clone(), ToString::to_string)
    }
}

/// A snapshot of the pending outboxes of a store, in write order, with the shards whose
/// deliveries failed; see the [module](crate::inspect).
#[derive(Debug, Clone)]
pub struct Pending {
    pub(super) rows: Vec<PendingOutbox>,
    pub(super) failing: Vec<ShardState>,
}

impl Pending {
    /// Reads every pending outbox of `store`, and the state of its failing shards.
    pub async fn read(store: &impl Admin) -> Result<Self, Error> {
        let rows = store.pending_messages(usize::MAX).await?;
        let failing = store
            .shard_states()
            .await?
            .into_iter()
            .filter(|state| state.attempts > 0 || state.parked_category.is_some())
            .collect();
        Ok(Self {
            rows: rows.into_iter().map(PendingOutbox::from_message).collect(),
            failing,
        })
    }

    /// Reads every pending outbox of `store`; panics if the store fails.
    pub async fn of(store: &impl Admin) -> Self {
        Self::read(store)
            .await
            .unwrap_or_else(|error| panic!("reading the pending outboxes failed: {error}"))
    }

    /// Reads every pending outbox of the relay's store, named after the relay's registry.
    pub async fn of_relay<S: Store + Admin>(relay: &Relay<S>) -> Self {
        Self::of(relay.store()).await.named(relay.registry())
    }

    /// This snapshot, with each row's category named after `registry`.
    #[must_use]
    pub fn named(mut self, registry: &Registry) -> Self {
        for row in &mut self.rows {
            if let Some(info) = registry.category(row.category) {
                row.category_name = Some(info.identity.name);
            }
        }
        self
    }

    /// The pending outboxes, in write order.
    pub fn rows(&self) -> &[PendingOutbox] {
        &self.rows
    }

    /// How many outboxes are pending.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The recorded state of the shards whose deliveries failed (or that are parked).
    pub fn failing_shards(&self) -> &[ShardState] {
        &self.failing
    }

    /// The pending outboxes `expected` matches, in write order.
    pub fn matching(&self, expected: &Expected) -> Vec<&PendingOutbox> {
        self.rows
            .iter()
            .filter(|row| expected.matches(row))
            .collect()
    }

    /// The pending outboxes of category `C`, in write order.
    pub fn of_category<C: Category>(&self) -> Vec<&PendingOutbox> {
        self.rows.iter().filter(|row| row.is::<C>()).collect()
    }

    /// The payloads of the pending outboxes of category `C`, in write order; panics if one
    /// does not read as `C`'s.
    #[track_caller]
    pub fn payloads<C: Category>(&self) -> Vec<C::Payload> {
        self.of_category::<C>()
            .into_iter()
            .map(|row| {
                row.payload_as::<C>().unwrap_or_else(|error| {
                    panic!(
                        "pending message {} does not read as a payload of category `{}`: {error}\n{}",
                        row.id,
                        C::NAME,
                        self.table(&[])
                    )
                })
            })
            .collect()
    }

    /// Asserts that nothing is pending.
    #[track_caller]
    pub fn assert_empty(&self) {
        if !self.is_empty() {
            panic!(
                "expected no pending outboxes; found {} pending:\n{}",
                self.len(),
                self.table(&[])
            );
        }
    }

    /// Asserts that exactly one pending outbox matches `expected`, and returns it.
    #[track_caller]
    pub fn assert_one(&self, expected: &Expected) -> &PendingOutbox {
        self.assert_count(expected, 1);
        self.rows
            .iter()
            .find(|row| expected.matches(row))
            .expect("one row matches")
    }

    /// Asserts that no pending outbox matches `expected`.
    #[track_caller]
    pub fn assert_none(&self, expected: &Expected) {
        self.assert_count(expected, 0);
    }

    /// Asserts that exactly `count` pending outboxes match `expected`.
    #[track_caller]
    pub fn assert_count(&self, expected: &Expected, count: usize) {
        let found = self.matching(expected).len();
        if found == count {
            return;
        }
        let wanted = match count {
            0 => "no pending outbox".to_owned(),
            1 => "one pending outbox".to_owned(),
            n => format!("{n} pending outboxes"),
        };
        panic!(
            "expected {wanted} of {expected}; {}",
            self.found(found, std::slice::from_ref(expected))
        );
    }

    /// Asserts that the pending outboxes are exactly `expected`, one row each, in write order.
    #[track_caller]
    pub fn assert_exactly(&self, expected: &[Expected]) {
        let mismatch = (0..self.len().max(expected.len())).find(|&i| {
            match (self.rows.get(i), expected.get(i)) {
                (Some(row), Some(expected)) => !expected.matches(row),
                _ => true,
            }
        });
        let Some(index) = mismatch else { return };
        let mut message = format!(
            "expected exactly {} pending outbox(es), in write order:\n",
            expected.len()
        );
        for (i, expected) in expected.iter().enumerate() {
            let _ = writeln!(message, "  {}. {expected}", i + 1);
        }
        let position = index + 1;
        let difference = match (self.rows.get(index), expected.get(index)) {
            (Some(row), Some(_)) => format!("row {position} (message {}) differs", row.id),
            (Some(row), None) => format!("row {position} (message {}) is extra", row.id),
            (None, _) => format!("row {position} is missing"),
        };
        let _ = write!(
            message,
            "{difference}; found {} pending:\n{}",
            self.len(),
            self.table(expected)
        );
        panic!("{message}");
    }

    /// "found 2 matching among 3 pending:" and the table.
    fn found(&self, found: usize, expected: &[Expected]) -> String {
        if self.is_empty() {
            return "found nothing pending".to_owned();
        }
        let found = match found {
            0 => "none".to_owned(),
            n => n.to_string(),
        };
        format!(
            "found {found} matching among {} pending:\n{}",
            self.len(),
            self.table(expected)
        )
    }
}
