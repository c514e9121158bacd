//! # outbox-testkit
//!
//! Test helpers for **outbox**:
//!
//! - fresh databases for tests: [`postgres::PgTestDatabase`] (a new PostgreSQL database per
//!   test, dropped afterwards) and [`sqlite::SqliteTestDatabase`] (a temporary file);
//! - [`fixtures`]: a small test domain and a [`fixtures::Recorder`] handler;
//! - [`recorder`]: recording handlers for any category ([`recorder::Recording`]) and any
//!   replicated model ([`recorder::ModelRecording`]);
//! - [`faults`]: fault injection, handlers that fail n times, always, panic or sleep
//!   ([`faults::Faulty`]);
//! - [`inspect`]: the written, not yet delivered outboxes of a store, and assertions on them
//!   whose failures show what was pending instead ([`inspect::Pending`]);
//! - the backend conformance suite: [`conformance`], run for a backend with one call to
//!   [`conformance_tests!`].

pub mod backend;
pub mod conformance;
pub mod counting;
pub mod faults;
pub mod fixtures;
pub mod inspect;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod recorder;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use crate::backend::{ModelWrite, TestBackend};
