//! # outbox-rs-testkit
//!
//! Test helpers for **outbox**:
//!
//! - fresh databases for tests: [`postgres::PgTestDatabase`] (a new PostgreSQL database per
//!   test, dropped afterwards) and [`sqlite::SqliteTestDatabase`] (a temporary file);
//! - [`outbox_runner`]: run the code under test, then deliver what it wrote, round after
//!   round while handlers write more (at most [`runner::MAX_ROUNDS`]);
//! - [`fixtures`]: a small test domain and a [`fixtures::Recorder`] handler;
//! - [`recorder`]: recording handlers for any category ([`recorder::Recording`]) and any
//!   replicated model ([`recorder::ModelRecording`]);
//! - [`faults`]: fault injection, handlers that fail n times, always, panic or sleep
//!   ([`faults::Faulty`]);
//! - [`inspect`]: the written, not yet delivered outboxes of a store, and assertions on them
//!   whose failures show what was pending instead ([`inspect::Pending`]);
//! - the backend conformance suite: [`conformance`], run for a backend with one call to
//!   [`conformance_tests!`] (or [`store_conformance_tests!`], its store and relay part, for a
//!   store without SQL such as [`memory::MemoryBackend`]).
//!
//! ## A database per test
//!
//! [`#[outbox_testkit::test]`](macro@test) makes an `async fn` taking a
//! [`PgTestDatabase`](postgres::PgTestDatabase) or a
//! [`SqliteTestDatabase`](sqlite::SqliteTestDatabase) a `#[test]`, like `#[sqlx::test]`: it
//! builds a tokio runtime, creates a database of the argument's type with the outbox
//! migrations applied, runs the function, and drops the database (`DROP DATABASE` on the
//! PostgreSQL server, the temporary SQLite file removed) when it returns or panics. A test may
//! return `Result<(), E>` with `E: Debug`; its other attributes (`#[should_panic]`,
//! `#[ignore]`...) apply to the generated `#[test]`. A crate needs only `outbox-testkit` among
//! its dev-dependencies for it: the runtime comes through the test kit.
//!
//! ```
//! use outbox_testkit::postgres::PgTestDatabase;
//! use outbox_testkit::sqlite::SqliteTestDatabase;
//!
//! #[outbox_testkit::test]
//! async fn starts_with_an_empty_outbox(db: PgTestDatabase) -> Result<(), sqlx::Error> {
//!     let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_messages")
//!         .fetch_one(db.pool())
//!         .await?;
//!     assert_eq!(pending, 0);
//!     Ok(())
//! }
//!
//! // Options: the runtime's `flavor` ("multi_thread" by default), and `migrations = false`
//! // for an empty database.
//! #[outbox_testkit::test(flavor = "current_thread", migrations = false)]
//! async fn starts_without_tables(db: SqliteTestDatabase) {
//!     outbox_sqlite::migrate(db.pool()).await.unwrap();
//! }
//! ```
//!
//! The PostgreSQL server is the one `DATABASE_URL` names, else the local one (see
//! [`postgres::server_url`]); if none answers, the test fails, saying how to provide one.
//!
//! In a test of your own, [`PgTestDatabase::migrated`](postgres::PgTestDatabase::migrated) and
//! [`SqliteTestDatabase::migrated`](sqlite::SqliteTestDatabase::migrated) create the same
//! databases (`create` an empty one), dropped with the value:
//!
//! ```
//! use outbox_testkit::sqlite::SqliteTestDatabase;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let db = SqliteTestDatabase::migrated().await;
//! let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_messages")
//!     .fetch_one(db.pool())
//!     .await
//!     .unwrap();
//! assert_eq!(pending, 0);
//! let file = db.path().to_owned();
//! drop(db);
//! assert!(!file.exists());
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backend;
#[cfg(feature = "sqlite")]
pub mod brokers;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod commit_order;
pub mod conformance;
#[cfg(feature = "sqlite")]
pub mod consumers;
pub mod counting;
mod database;
pub mod faults;
pub mod fixtures;
pub mod inspect;
pub mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod proxy;
pub mod recorder;
pub mod runner;
pub mod secrets;
pub mod sink;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub mod sqlx;
pub mod telemetry;

pub use crate::backend::{ModelWrite, Scoped, StoreBackend, TestBackend};
pub use crate::runner::{RunnerError, outbox_runner};

pub use crate::database::TestDatabase;
pub use outbox_macros::outbox_test as test;

/// What `#[outbox_testkit::test]` expands to uses. Not public API.
#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
