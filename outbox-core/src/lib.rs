//! # outbox-core
//!
//! The backend-agnostic heart of **outbox**, the transactional outbox framework for Rust
//! services on PostgreSQL and SQLite.
//!
//! A service writes an outbox [`Message`] in the same `sqlx` transaction as the data change
//! that caused it. After commit, a [`Relay`] delivers it to the [`Handler`] registered for its
//! [`Category`]: sharded by [`ShardKey`], in order within a shard, coalesced to the newest
//! payload of each group, retried with per-shard backoff until it succeeds.
//!
//! This crate holds the model, the [`Registry`], the [`Store`] contract and the relay; it
//! knows no SQL. The backends are `outbox-postgres` and `outbox-sqlite`.
//!
//! ```
//! use outbox_core::{Category, CategoryId, Delivery, Message, Registry, Relay, Scope, ScopeId};
//! use serde::{Deserialize, Serialize};
//! use std::sync::{Arc, Mutex};
//!
//! struct Organization;
//! impl Scope for Organization {
//!     const ID: ScopeId = ScopeId(1);
//!     const NAME: &'static str = "organization";
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Renamed { name: String }
//!
//! struct OrganizationUpdate;
//! impl Category for OrganizationUpdate {
//!     type Scope = Organization;
//!     type Payload = Renamed;
//!     const ID: CategoryId = CategoryId(1);
//!     const NAME: &'static str = "organization_update";
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let pool = outbox_sqlite::connect(&dir.path().join("app.db")).await?;
//! outbox_sqlite::migrate(&pool).await?;
//!
//! // Write the outbox in the same transaction as the change it announces.
//! let mut tx = pool.begin().await?;
//! for name in ["Acme", "Acme Inc", "Acme Corp"] {
//!     let message = Message::new::<OrganizationUpdate>(42, 42, &Renamed { name: name.into() })?;
//!     outbox_sqlite::write(&mut *tx, &message).await?;
//! }
//! tx.commit().await?;
//!
//! // Deliver: three writes to one group coalesce into one delivery of the newest payload.
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let recorder = Arc::clone(&seen);
//! let registry = Registry::builder()
//!     .handle::<OrganizationUpdate>(move |delivery: Delivery<OrganizationUpdate>| {
//!         let recorder = Arc::clone(&recorder);
//!         async move {
//!             recorder.lock().unwrap().push(delivery.payload.name);
//!             Ok::<_, std::io::Error>(())
//!         }
//!     })
//!     .build()?;
//! let relay = Relay::new(outbox_sqlite::SqliteStore::new(pool), registry);
//! let report = relay.drain().await?;
//!
//! assert_eq!(*seen.lock().unwrap(), ["Acme Corp"]);
//! assert_eq!(report.rows_acknowledged, 3);
//! # Ok(())
//! # }
//! ```
#![doc(test(attr(deny(warnings))))]

mod declare;
mod error;
mod handler;
mod model;
mod registry;
mod relay;
mod replicated;
mod replication;
pub mod store;

pub use crate::declare::SourceLocation;
pub use crate::error::{BoxError, DeliveryError, Error, RegistryProblem, Site, error_chain};
pub use crate::handler::{BoxFuture, Delivery, Handler, HandlerContext, NoOp};
pub use crate::model::{
    Category, CategoryId, Destination, MAX_DESTINATION_LEN, Message, MessageId, Payload,
    RawMessage, Scope, ScopeId, ShardKey,
};
pub use crate::registry::{CategoryInfo, Registry, RegistryBuilder};
pub use crate::relay::{Backoff, DrainReport, Relay, RelayConfig, RunReport, ShardFailure};
pub use crate::replicated::{
    FanOutModel, IntoModelBatch, LocalModel, ModelBatch, ModelRefs, ModelTable, ReplicatedModel,
};
pub use crate::replication::{Deletion, DeletionHandler, Replication, ReplicationHandler};
pub use crate::store::{HandlerMode, Store};

#[cfg(feature = "macros")]
pub use outbox_macros::{outbox_category, outbox_handler, outbox_scope, replicated_model};

/// What the macros' expansions use. Not public API.
#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
