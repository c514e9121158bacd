//! # outbox
//!
//! The transactional outbox for Rust services on PostgreSQL, MariaDB and SQLite. A service writes an
//! outbox [`Message`] in the same `sqlx` transaction as the data change that caused it; after
//! commit, a [`Relay`] delivers it to the [`Handler`](handler::Handler) of its [`Category`] — sharded, in order
//! within a shard, coalesced to the newest payload of each group, retried with backoff until it
//! succeeds — or publishes it to a broker.
//!
//! This crate is the one to add: the engine is at its root, and each part comes with a
//! feature.
//!
//! | feature | what it adds |
//! | --- | --- |
//! | `postgres` | `outbox::postgres`: the PostgreSQL store, writes and migrations |
//! | `mysql` | `outbox::mysql`: the MariaDB store, writes and migrations |
//! | `sqlite` | `outbox::sqlite`: the SQLite store (bundled SQLite) |
//! | `nats`, `kafka`, `rabbitmq`, `redis` | `outbox::nats`, `outbox::kafka`, `outbox::rabbitmq`, `outbox::redis`: sinks publishing each delivery to a broker |
//! | `cli` | `outbox::cli`: the `outbox` command, to build into a service's own binary |
//! | `web` | `outbox::web`: the operator console in the browser, to mount in an axum application |
//! | `testkit` | `outbox::testkit`: a fresh database per test, the test runner, fault injection |
//! | `uuid` | `uuid::Uuid` as an identifier |
//! | `opentelemetry` | the writer's trace context carried to the delivery's span |
//! | `tls-rustls`, `tls-native-tls` | TLS to PostgreSQL and MariaDB |
//!
//! ```toml
//! [dependencies]
//! outbox = { version = "0.1", features = ["postgres"] }
//!
//! [dev-dependencies]
//! outbox = { version = "0.1", features = ["postgres", "testkit"] }
//! ```
//!
//! The declaration macros are at the root too, and find the engine through this crate:
//!
//! ```
//! use outbox::memory::MemoryStore;
//! use outbox::{BoxError, Delivery, Message, Registry, Relay};
//! use outbox::{outbox_category, outbox_handler, outbox_scope};
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
//! #[outbox_handler]
//! async fn announce(delivery: Delivery<OrganizationRenamed>) -> Result<(), BoxError> {
//!     assert_eq!(delivery.payload.name, "Acme Corp");
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The backends write in the caller's `sqlx` transaction (`outbox::postgres::write(&mut *tx,
//! // ..)`); here the in-memory store stands in for the database.
//! let store = MemoryStore::new();
//! for name in ["Acme", "Acme Corp"] {
//!     let renamed = OrganizationRenamed { name: name.into() };
//!     store.write(&Message::new::<OrganizationRenamed>(42, 42, &renamed)?);
//! }
//! let relay = Relay::new(store, Registry::discover()?);
//! let report = relay.drain().await?;
//! assert_eq!(report.rows_acknowledged, 2);
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(inline)]
pub use outbox_core::*;

#[cfg(feature = "postgres")]
#[doc(inline)]
pub use outbox_postgres as postgres;

#[cfg(feature = "mysql")]
#[doc(inline)]
pub use outbox_mysql as mysql;

#[cfg(feature = "sqlite")]
#[doc(inline)]
pub use outbox_sqlite as sqlite;

#[cfg(feature = "nats")]
#[doc(inline)]
pub use outbox_nats as nats;

#[cfg(feature = "kafka")]
#[doc(inline)]
pub use outbox_kafka as kafka;

#[cfg(feature = "rabbitmq")]
#[doc(inline)]
pub use outbox_rabbitmq as rabbitmq;

#[cfg(feature = "redis")]
#[doc(inline)]
pub use outbox_redis as redis;

#[cfg(feature = "cli")]
#[doc(inline)]
pub use outbox_cli as cli;

#[cfg(feature = "web")]
#[doc(inline)]
pub use outbox_web as web;

#[cfg(feature = "testkit")]
#[doc(inline)]
pub use outbox_testkit as testkit;

/// The engine, where the declaration macros' expansions find it when a service depends on this
/// crate alone. Not part of the API.
#[doc(hidden)]
pub use outbox_core as __core;

/// The test kit, where `#[outbox::testkit::test]` finds it. Not part of the API.
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub use outbox_testkit as __testkit;

/// The README's first outbox, compiled and run as a doctest (with the `sqlite` feature, which
/// it uses), so that the front page's code stays true.
#[cfg(all(doctest, feature = "sqlite"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
