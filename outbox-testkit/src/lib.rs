//! # outbox-testkit
//!
//! Test helpers for **outbox**:
//!
//! - fresh databases for tests: [`postgres::PgTestDatabase`] (a new PostgreSQL database per
//!   test, dropped afterwards) and [`sqlite::SqliteTestDatabase`] (a temporary file);
//! - [`fixtures`]: a small test domain and a [`fixtures::Recorder`] handler;
//! - the backend conformance suite: [`conformance`], run for a backend with one call to
//!   [`conformance_tests!`].

pub mod backend;
pub mod conformance;
pub mod counting;
pub mod fixtures;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use crate::backend::{ModelWrite, TestBackend};
