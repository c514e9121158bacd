//! # outbox-sqlx
//!
//! The body that **outbox**'s `sqlx` backends share, written once over a [`Dialect`]:
//! transactions that remember what they wrote ([`OutboxTransaction`]), message and
//! replicated-model writes, migrations, the claimed shard's session and the store. A backend
//! (`outbox-postgres`, `outbox-sqlite`) supplies what truly differs: its SQL text
//! ([`Statements`]), its claim strategy, its wake-ups and how its errors read.
//!
//! Applications use the backends' crates, which name these types for their database
//! (`outbox_postgres::PgStore` is `SqlxStore<PgDialect>`); this crate is for writing a
//! backend. [`sql::Sql`] is everything it asks of a `sqlx` driver.
//!
//! ## Writing a third backend
//!
//! A dialect type implementing [`Dialect`] (usually a unit struct): the [`Statements`] in the
//! database's SQL, with the parameters each documents; how lists travel
//! ([`Dialect::bind_ids`] and its siblings: an array, or one JSON parameter); the model
//! statements; [`Dialect::claim`] (at most one holder per shard, increasing fencing tokens);
//! and [`Dialect::classify`]. The conformance suite in `outbox-testkit` then proves it.

pub mod dialect;
pub mod error;
pub mod migrate;
pub mod model;
pub mod session;
pub mod sql;
pub mod store;
pub mod transaction;
pub mod write;

pub use crate::dialect::{Ack, Claim, Claiming, Dialect, Fault, Statements};
pub use crate::migrate::{migrate, migrator};
pub use crate::model::Write;
pub use crate::session::SqlxSession;
pub use crate::store::SqlxStore;
pub use crate::transaction::{OutboxTransaction, begin};
pub use crate::write::{write, write_all};
