//! # outbox-postgres
//!
//! The PostgreSQL store of **outbox**: write outbox messages in your own `sqlx` PostgreSQL
//! transactions, and let an [`outbox_core::Relay`] over a [`PgStore`] deliver them.
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
//! - Claims use `FOR UPDATE SKIP LOCKED`; any number of relays, on any number of machines, can
//!   share one database. A trigger notifies `LISTEN`ing relays on commit; turn
//!   `RelayConfig::wake_on_commit` off behind poolers that break `LISTEN`.

mod connect;
mod error;
mod migrate;
mod model;
mod session;
mod store;
mod transaction;
mod write;

pub use crate::connect::connect;
pub use crate::migrate::{migrate, migrator};
pub use crate::model::{delete, insert, save, update};
pub use crate::session::PgSession;
pub use crate::store::{NOTIFY_CHANNEL, PgStore, PgWakeups};
pub use crate::transaction::{OutboxTransaction, begin};
pub use crate::write::{write, write_all};
pub use outbox_core::store::MIGRATIONS_TABLE;

#[cfg(test)]
mod explain;
