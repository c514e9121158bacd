//! Inspecting written, not yet delivered outboxes, and asserting on them.
//!
//! [`Pending`] is a snapshot of a store's pending outboxes (with the shards whose
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

//!
//! The module's parts: [`Pending`] and [`PendingOutbox`], the snapshot (`snapshot.rs`);
//! [`Expected`], what a test looks for (`expected.rs`); the table a failure shows
//! (`table.rs`).

mod expected;
mod snapshot;
mod table;

use outbox_core::{Category, Identifier};

use outbox_core::admin::Admin;

pub use self::expected::Expected;
pub use self::snapshot::{Pending, PendingOutbox};

/// Asserts that `store` has no pending outbox (everything written was delivered); the
/// failure message shows what is pending, and the shards whose deliveries failed.
pub async fn assert_no_pending(store: &impl Admin) {
    Pending::of(store).await.assert_empty();
}

/// Asserts that `store` has exactly one pending local outbox of category `C` about
/// `object_identifier` in shard `shard_identifier`, and returns it.
pub async fn assert_one_pending<C: Category>(
    store: &impl Admin,
    shard_identifier: impl Identifier,
    object_identifier: impl Identifier,
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
    store: &impl Admin,
    shard_identifier: impl Identifier,
    object_identifier: impl Identifier,
    payload: &C::Payload,
) -> PendingOutbox {
    let expected = Expected::with_payload::<C>(shard_identifier, object_identifier, payload);
    Pending::of(store).await.assert_one(&expected).clone()
}

/// Asserts that the pending outboxes of `store` are exactly `expected`, in write order.
pub async fn assert_pending(store: &impl Admin, expected: &[Expected]) {
    Pending::of(store).await.assert_exactly(expected);
}
