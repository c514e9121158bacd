//! Inspecting written, not yet delivered outboxes, and asserting on them.
//!
//! [`Pending`] is a snapshot of a [`Store`]'s pending outboxes (with the shards whose
//! deliveries failed), in write order. Its assertions take [`Expected`] outboxes; when one
//! fails, its message shows what was pending instead, as a table:
//!
//! ```text
//! expected one pending outbox of category `project_update` (#2) for object 7 in scope 1 shard 3; found 2 matching among 3 pending:
//!      id  scope  shard  destination  category             object  payload
//!   *   1  1      3      -            project_update (#2)  7       {"seq":1,"text":"note 1"}
//!   *   2  1      3      -            project_update (#2)  7       {"seq":2,"text":"note 2"}
//!       3  1      3      -            #1                   7       {"seq":3,"text":"note 3"}
//!   (* matches)
//! ```
//!
//! Rows a registry does not name show their category by id (`#1`); a row that matches but for
//! its payload is marked `~`. Below the table come the shards whose deliveries failed, with
//! their attempts and last error: usually why something is still pending.
//!
//! The `async` functions [`assert_no_pending`], [`assert_one_pending`],
//! [`assert_pending_payload`] and [`assert_pending`] read a snapshot and assert in one call.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_testkit::fixtures::{Note, ProjectUpdate, note};
//! use outbox_testkit::inspect::{Expected, Pending, assert_pending_payload};
//! use outbox_testkit::sqlite::SqliteTestDatabase;
//!
//! let database = SqliteTestDatabase::create().await;
//! outbox_sqlite::migrate(database.pool()).await?;
//! let store = outbox_sqlite::SqliteStore::new(database.pool().clone());
//! let mut tx = database.pool().begin().await?;
//! outbox_sqlite::write(&mut *tx, &note::<ProjectUpdate>(3, 7, 1)).await?;
//! tx.commit().await?;
//!
//! assert_pending_payload::<ProjectUpdate>(&store, 3, 7, &Note::new(1)).await;
//! let pending = Pending::of(&store).await;
//! pending.assert_one(&Expected::of::<ProjectUpdate>(3, 7));
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::SystemTime;

use outbox_core::store::{PendingMessage, ShardState};
use outbox_core::{
    Category, CategoryId, Destination, Error, MessageId, Payload, Registry, Relay, Scope, ScopeId,
    ShardKey, Store,
};

/// At most this many rows are shown in a failure message; the counts are always exact.
const SHOWN_ROWS: usize = 100;

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
    pub object_identifier: i64,
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
    pub fn shard_identifier(&self) -> i64 {
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
    fn payload_text(&self) -> String {
        self.payload
            .as_ref()
            .map_or_else(|| self.payload_json.clone(), ToString::to_string)
    }
}

/// An outbox a test expects to be pending: its category, shard, object, and optionally its
/// destination and payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    category: CategoryId,
    name: &'static str,
    scope: ScopeId,
    shard_identifier: i64,
    object_identifier: Option<i64>,
    destination: Option<Destination>,
    payload: Option<serde_json::Value>,
}

impl Expected {
    /// A local outbox of category `C` in shard `shard_identifier` of `C`'s scope, about
    /// `object_identifier`, with any payload.
    pub fn of<C: Category>(shard_identifier: i64, object_identifier: i64) -> Self {
        Self {
            object_identifier: Some(object_identifier),
            ..Self::any_object::<C>(shard_identifier)
        }
    }

    /// A local outbox of category `C` in shard `shard_identifier` of `C`'s scope, about any
    /// object, with any payload.
    pub fn any_object<C: Category>(shard_identifier: i64) -> Self {
        Self {
            category: C::ID,
            name: C::NAME,
            scope: <C::Scope as Scope>::ID,
            shard_identifier,
            object_identifier: None,
            destination: None,
            payload: None,
        }
    }

    /// Like [`Expected::of`], with payload `payload` (compared as JSON).
    #[track_caller]
    pub fn with_payload<C: Category>(
        shard_identifier: i64,
        object_identifier: i64,
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
    fn addresses(&self, row: &PendingOutbox) -> bool {
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

/// A snapshot of the pending outboxes of a store, in write order, with the shards whose
/// deliveries failed; see the [module](self).
#[derive(Debug, Clone)]
pub struct Pending {
    rows: Vec<PendingOutbox>,
    failing: Vec<ShardState>,
}

impl Pending {
    /// Reads every pending outbox of `store`, and the state of its failing shards.
    pub async fn read(store: &impl Store) -> Result<Self, Error> {
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
    pub async fn of(store: &impl Store) -> Self {
        Self::read(store)
            .await
            .unwrap_or_else(|error| panic!("reading the pending outboxes failed: {error}"))
    }

    /// Reads every pending outbox of the relay's store, named after the relay's registry.
    pub async fn of_relay<S: Store>(relay: &Relay<S>) -> Self {
        Self::of(relay.store()).await.named(relay.registry())
    }

    /// This snapshot, with each row's category named after `registry`.
    #[must_use]
    pub fn named(mut self, registry: &Registry) -> Self {
        for row in &mut self.rows {
            if let Some(info) = registry.category(row.category) {
                row.category_name = Some(info.name);
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

    /// The pending rows as a table, each marked `*` if one of `expected` matches it or `~` if
    /// one matches it but for its payload; then the failing shards.
    pub fn table(&self, expected: &[Expected]) -> String {
        let mut names: BTreeMap<CategoryId, &'static str> = BTreeMap::new();
        for expected in expected {
            names.insert(expected.category, expected.name);
        }
        let header = [
            "",
            "id",
            "scope",
            "shard",
            "destination",
            "category",
            "object",
            "payload",
        ]
        .map(str::to_owned);
        let mut lines = vec![header];
        for row in self.rows.iter().take(SHOWN_ROWS) {
            let mark = if expected.iter().any(|e| e.matches(row)) {
                "*"
            } else if expected.iter().any(|e| e.addresses(row)) {
                "~"
            } else {
                ""
            };
            let category = match row
                .category_name
                .or_else(|| names.get(&row.category).copied())
            {
                Some(name) => format!("{name} (#{})", row.category),
                None => format!("#{}", row.category),
            };
            lines.push([
                mark.to_owned(),
                row.id.to_string(),
                row.shard.scope.to_string(),
                row.shard.shard_identifier.to_string(),
                row.destination()
                    .map_or("-".to_owned(), ToString::to_string),
                category,
                row.object_identifier.to_string(),
                row.payload_text(),
            ]);
        }
        let mut widths = [0; 8];
        for line in &lines {
            for (width, cell) in widths.iter_mut().zip(line) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut table = String::new();
        for line in &lines {
            // The marks' column only if a row is marked; ids right-aligned.
            if widths[0] > 0 {
                let _ = write!(table, "  {:<w$}", line[0], w = widths[0]);
            }
            let _ = write!(table, "  {:>w$}", line[1], w = widths[1]);
            for (cell, width) in line[2..].iter().zip(&widths[2..]) {
                let _ = write!(table, "  {cell:<width$}");
            }
            table.truncate(table.trim_end().len());
            table.push('\n');
        }
        if self.len() > SHOWN_ROWS {
            let _ = writeln!(table, "  ... and {} more", self.len() - SHOWN_ROWS);
        }
        let (matched, addressed) = self.rows.iter().fold((false, false), |(m, a), row| {
            (
                m || expected.iter().any(|e| e.matches(row)),
                a || expected.iter().any(|e| e.addresses(row) && !e.matches(row)),
            )
        });
        if matched || addressed {
            let mut legend = Vec::new();
            if matched {
                legend.push("* matches");
            }
            if addressed {
                legend.push("~ matches but for its payload");
            }
            let _ = writeln!(table, "  ({})", legend.join("; "));
        }
        if !self.failing.is_empty() {
            table.push_str("shards whose deliveries failed:\n");
            for state in &self.failing {
                let _ = write!(
                    table,
                    "  {}: {} failed attempt(s)",
                    state.shard, state.attempts
                );
                if let Some(category) = state.parked_category {
                    let _ = write!(table, ", parked on unknown category #{category}");
                }
                if let Some(error) = &state.last_error {
                    let _ = write!(table, "; last error: {error}");
                }
                table.push('\n');
            }
        }
        table.truncate(table.trim_end().len());
        table
    }
}

impl fmt::Display for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            f.write_str("nothing pending")
        } else {
            write!(f, "{} pending:\n{}", self.len(), self.table(&[]))
        }
    }
}

/// Asserts that `store` has no pending outbox (everything written was delivered); the
/// failure message shows what is pending, and the shards whose deliveries failed.
pub async fn assert_no_pending(store: &impl Store) {
    Pending::of(store).await.assert_empty();
}

/// Asserts that `store` has exactly one pending local outbox of category `C` about
/// `object_identifier` in shard `shard_identifier`, and returns it.
pub async fn assert_one_pending<C: Category>(
    store: &impl Store,
    shard_identifier: i64,
    object_identifier: i64,
) -> PendingOutbox {
    Pending::of(store)
        .await
        .assert_one(&Expected::of::<C>(shard_identifier, object_identifier))
        .clone()
}

/// Asserts that `store` has exactly one pending local outbox of category `C` about
/// `object_identifier` in shard `shard_identifier`, with payload `payload` (compared as JSON),
/// and returns it.
pub async fn assert_pending_payload<C: Category>(
    store: &impl Store,
    shard_identifier: i64,
    object_identifier: i64,
    payload: &C::Payload,
) -> PendingOutbox {
    let expected = Expected::with_payload::<C>(shard_identifier, object_identifier, payload);
    Pending::of(store).await.assert_one(&expected).clone()
}

/// Asserts that the pending outboxes of `store` are exactly `expected`, in write order.
pub async fn assert_pending(store: &impl Store, expected: &[Expected]) {
    Pending::of(store).await.assert_exactly(expected);
}
