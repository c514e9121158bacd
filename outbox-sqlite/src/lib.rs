//! # outbox-sqlite
//!
//! The SQLite store of **outbox**, the embedded default: write outbox messages in your own
//! `sqlx` SQLite transactions, and let an [`outbox_core::Relay`] over a [`SqliteStore`] deliver
//! them.
//!
//! - [`migrate`] applies the embedded migrations, recorded in the library's own
//!   `_outbox_migrations` table (never the application's `_sqlx_migrations`).
//! - [`write()`] and [`write_all`] insert messages with the caller's transaction or connection;
//!   [`write_all`] uses one statement however many messages there are.
//! - [`save`], [`insert`], [`update`] and [`delete`] write replicated models (declared with
//!   `#[replicated_model]`) together with their outboxes, one statement per table.
//! - [`begin`] opens an [`OutboxTransaction`]: it remembers the shards its outboxes went to,
//!   so that `Relay::flush` delivers them as soon as it commits (S2); its nested
//!   [`deferred`](OutboxTransaction::deferred) scopes leave theirs to the relay (S3).
//! - [`connect`] opens a pool configured for the relay: WAL journal, busy timeout.
//!
//! Claims run in `BEGIN IMMEDIATE` transactions, so two relays (threads or processes) on one
//! database file never drain the same shard at once. In-transaction handler mode holds the
//! database's write lock for the whole drain of a shard: keep such handlers short.

mod connect;
mod error;
mod migrate;
mod model;
mod session;
mod store;
mod transaction;
mod write;

pub use crate::connect::{connect, connect_options};
pub use crate::migrate::{migrate, migrator};
pub use crate::model::{delete, insert, save, update};
pub use crate::session::SqliteSession;
pub use crate::store::SqliteStore;
pub use crate::transaction::{OutboxTransaction, begin};
pub use crate::write::{write, write_all};
pub use outbox_core::store::MIGRATIONS_TABLE;

#[cfg(test)]
mod explain;
