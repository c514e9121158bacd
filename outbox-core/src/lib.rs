//! # outbox-rs-core
//!
//! The backend-agnostic heart of **outbox**, the transactional outbox framework for Rust
//! services on PostgreSQL, MariaDB and SQLite.
//!
//! A service writes an outbox [`Message`] in the same `sqlx` transaction as the data change
//! that caused it. After commit, a [`Relay`] delivers it to the [`Handler`](handler::Handler) registered for its
//! [`Category`]: sharded by [`ShardKey`], in order within a shard, coalesced to the newest
//! payload of each group, retried with per-shard backoff until it succeeds.
//!
//! This crate holds the model, the [`Registry`], the [`Store`](store::Store) contract and the relay; it
//! knows no SQL. The backends are `outbox-postgres` and `outbox-sqlite`; [`memory::MemoryStore`]
//! keeps the outbox in process, for tests and examples.
//!
//! - [`ReplicatedModel`]s: one category covers a domain struct's creation, updates and
//!   deletion; at delivery the relay reads the row and calls its [`Replication`] or its
//!   [`Deletion`] handler.
//! - [`Relay::flush`]: deliver what a committed transaction wrote before answering its caller
//!   (the backends' `OutboxTransaction` collects the [`WrittenShards`]); [`Relay::run`] is the
//!   background relay, [`Relay::drain`] delivers everything due and returns.
//! - [`shutdown_signal`]: `relay.run(shutdown_signal())` stops gracefully on SIGTERM (what
//!   Kubernetes and systemd send) or Ctrl-C.
//!
//! Scopes, categories, replicated models and handlers are declared with attribute macros
//! ([`outbox_scope`], [`outbox_category`], [`replicated_model`], [`outbox_handler`]); the
//! traits they implement ([`Scope`], [`Category`], [`ReplicatedModel`]) can be written by hand
//! too.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//!
//! use outbox_core::memory::MemoryStore;
//! use outbox_core::{BoxError, Delivery, Message, Registry, Relay, State};
//! use outbox_core::{outbox_category, outbox_handler, outbox_scope};
//! use serde::{Deserialize, Serialize};
//!
//! #[outbox_scope(id = 1)]
//! struct Organization;
//!
//! #[outbox_category(scope = Organization, id = 1)]
//! #[derive(Serialize, Deserialize)]
//! struct OrganizationRenamed {
//!     name: String,
//! }
//!
//! /// What the handler saw.
//! #[derive(Clone, Default)]
//! struct Seen(Arc<Mutex<Vec<String>>>);
//!
//! // A handler takes its delivery, then what it needs: here a clone of the `Seen` given to
//! // the registry (a registry without one refuses to build, naming the handler and `Seen`).
//! #[outbox_handler]
//! async fn record(
//!     delivery: Delivery<OrganizationRenamed>,
//!     State(seen): State<Seen>,
//! ) -> Result<(), BoxError> {
//!     seen.0.lock().unwrap().push(delivery.payload.name);
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The backends write in the caller's `sqlx` transaction (`outbox_postgres::write(&mut *tx,
//! // ..)`); here the in-memory store stands in for the database.
//! let store = MemoryStore::new();
//! for name in ["Acme", "Acme Inc", "Acme Corp"] {
//!     let renamed = OrganizationRenamed { name: name.into() };
//!     store.write(&Message::new::<OrganizationRenamed>(42, 42, &renamed)?);
//! }
//!
//! // Deliver: three writes to one group coalesce into one delivery of the newest payload.
//! let seen = Seen::default();
//! let registry = Registry::builder().discovered().state(seen.clone()).build()?;
//! let relay = Relay::new(store, registry);
//! let report = relay.drain().await?;
//!
//! assert_eq!(*seen.0.lock().unwrap(), ["Acme Corp"]);
//! assert_eq!(report.rows_acknowledged, 3);
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]

// Layers: each module uses only the modules listed before it, never one after it, so that no
// two modules import each other (`xtask/tests/layers.rs` checks it, and fails on a module not
// listed here).
//
// 1. The vocabulary: `future`, `hashed`, `id`, `metadata`, `secret`, `shutdown`, `key`,
//    `trace`, `error`, `model`, `categories`, `columns`, `replicated`.
// 2. The storage contract: `flush`, `backfill`, `store`, `telemetry`.
// 3. Delivery: `breaker`, `handler`, `sink`.
// 4. Declarations: `test_models`, `registry`, `catalog`.
// 5. The engine, the consumer's side and the tools: `relay`, `inbox`, `admin`, `memory`,
//    `__private`.

pub mod admin;
pub mod backfill;
mod breaker;
mod catalog;
mod categories;
pub mod columns;
pub mod error;
mod flush;
mod future;
pub mod handler;
mod hashed;
mod id;
pub mod inbox;
mod key;
pub mod memory;
pub mod metadata;
pub mod model;
pub mod registry;
pub mod relay;
pub mod replicated;
mod secret;
mod shutdown;
pub mod sink;
pub mod store;
pub mod telemetry;
#[cfg(test)]
mod test_models;
mod trace;

// The root holds what a service writes: its declarations, its messages, its handlers, its
// registry and its relay. The rest lives in the modules named for their readers.
pub use crate::error::{BoxError, Error};
pub use crate::flush::WrittenShards;
pub use crate::handler::{Connection, Deletion, Delivery, DeliveryError, Replication, State};
pub use crate::id::{Id, Identifier};
pub use crate::model::{
    Category, CategoryId, Destination, Message, MessageId, Payload, Scope, ScopeId, ShardKey,
};
pub use crate::registry::{Registry, RegistryBuilder};
pub use crate::relay::{Backoff, DrainReport, Relay, RelayConfig, RelayConfigBuilder, RunReport};
pub use crate::replicated::{FanOutModel, IntoModelBatch, LocalModel, ModelBatch, ReplicatedModel};
pub use crate::secret::{redact_url, redact_url_in};
pub use crate::shutdown::shutdown_signal;
pub use crate::store::HandlerMode;

/// The crate's example above declares a scope and a category and registers a handler.
#[cfg(feature = "macros")]
pub use outbox_macros::{outbox_category, outbox_handler, outbox_scope};

/// A scope's categories as one enum, handled by one handler:
///
/// ```
/// use outbox_core::memory::MemoryStore;
/// use outbox_core::{BoxError, Delivery, Message, Registry, Relay};
/// use outbox_core::{outbox_categories, outbox_handler, outbox_scope};
/// use serde::{Deserialize, Serialize};
///
/// #[outbox_scope(id = 1)]
/// struct Team;
///
/// #[derive(Serialize, Deserialize)]
/// struct Renamed {
///     name: String,
/// }
///
/// #[derive(Serialize, Deserialize)]
/// struct MemberAdded {
///     user: i64,
/// }
///
/// #[outbox_categories(scope = Team)]
/// enum TeamEvent {
///     #[category(id = 1)]
///     Renamed(Renamed),
///     #[category(id = 2, coalesce = false)]
///     MemberAdded(MemberAdded),
/// }
///
/// #[outbox_handler]
/// async fn on_team_event(delivery: Delivery<TeamEvent>) -> Result<(), BoxError> {
///     match delivery.payload {
///         TeamEvent::Renamed(renamed) => assert_eq!(renamed.name, "platform"),
///         TeamEvent::MemberAdded(added) => assert_eq!(added.user, 7),
///     }
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// store.write(&Message::new::<Renamed>(42, 42, &Renamed { name: "platform".into() })?);
/// store.write(&Message::new::<MemberAdded>(42, 7, &MemberAdded { user: 7 })?);
/// let report = Relay::new(store, Registry::discover()?).drain().await?;
/// assert_eq!(report.rows_acknowledged, 2);
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "macros")]
pub use outbox_macros::outbox_categories;

/// A replicated model: one category covering a row's creation, updates and deletion. The
/// backends' `save`, `insert`, `update` and `delete` write the row and its message together;
/// at delivery the relay reads the row and calls the model's [`Replication`] handler (or its
/// [`Deletion`] handler once the row is gone).
///
/// ```
/// use outbox_core::{BoxError, Deletion, ReplicatedModel, Replication};
/// use outbox_core::{outbox_handler, outbox_scope, replicated_model};
/// use serde::{Deserialize, Serialize};
///
/// #[outbox_scope(id = 1)]
/// struct Organization;
///
/// #[replicated_model(scope = Organization, id = 3, table = "projects", shard = organization_id)]
/// #[derive(Debug, Clone, Serialize, Deserialize)]
/// struct Project {
///     id: i64,
///     organization_id: i64,
///     name: String,
/// }
///
/// #[outbox_handler]
/// async fn copy_project(replication: Replication<Project>) -> Result<(), BoxError> {
///     let _row: &Project = &replication.object;
///     Ok(())
/// }
///
/// #[outbox_handler]
/// async fn forget_project(_deletion: Deletion<Project>) -> Result<(), BoxError> {
///     Ok(())
/// }
///
/// assert_eq!(<Project as ReplicatedModel>::TABLE.table, "projects");
/// let registry = outbox_core::Registry::discover()?;
/// assert!(registry.category(outbox_core::CategoryId(3)).is_some());
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[cfg(feature = "macros")]
pub use outbox_macros::replicated_model;

/// What the macros' expansions use. Not public API.
#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
