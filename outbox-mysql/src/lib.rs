//! # outbox-rs-mysql
//!
//! The MariaDB store of **outbox**: write outbox messages in your own `sqlx` MySQL-protocol
//! transactions, and let an [`outbox_core::Relay`] over a [`MySqlStore`] deliver them. It runs
//! on MariaDB 10.6 and later. MySQL is not supported: the statements use what MariaDB has and
//! MySQL 8 does not (`RETURNING`, sequences, `SET STATEMENT … FOR`).
//!
//! - [`migrate`] applies the embedded migrations, recorded in the library's own
//!   `_outbox_migrations` table. Run it (or give [`migrator`] to a migration tool of your
//!   own) before the relay starts. (The first migration's header still names MySQL 8.0.16
//!   beside MariaDB: it is kept as written, since a migration's checksum covers its text and
//!   a changed one would be refused by the databases that applied it. MySQL is not supported.)
//! - [`write()`] and [`write_all`] insert messages with the caller's transaction or
//!   connection; [`write_all`] uses one statement however many messages there are.
//! - [`save`], [`insert`], [`update`] and [`delete`] write replicated models (declared with
//!   `#[replicated_model]`) together with their outboxes, one statement per table.
//! - [`begin`] opens an [`OutboxTransaction`]: it remembers the shards its outboxes went to,
//!   so that `Relay::flush` delivers them as soon as it commits.
//! - Claims lock the shard's state row with `FOR UPDATE SKIP LOCKED`, in transactions at
//!   `READ COMMITTED`; any number of relays, on any number of machines, can share one
//!   database.
//! - MariaDB has no notifications: relays in other processes find new messages by polling
//!   (`RelayConfig::poll_interval`); the relays of this process on the same database are woken
//!   at once when an [`OutboxTransaction`] commits.
//! - Payloads and metadata are JSON text, checked at the write (`CHECK (JSON_VALID(...))`):
//!   malformed JSON is refused by the database in the writer's transaction.
//!
//! ## TLS
//!
//! No TLS stack is built by default. To connect with `ssl-mode=REQUIRED` (or `VERIFY_CA`,
//! `VERIFY_IDENTITY`), turn on one of this crate's features, passed through to sqlx:
//! `tls-rustls` (rustls with the *ring* backend and the webpki roots) or `tls-native-tls`
//! (the platform's TLS).

#![cfg_attr(docsrs, feature(doc_cfg))]

#[macro_use]
mod sql;
mod admin;
mod code;
mod connect;
mod dialect;
mod model;
mod relay;
mod space;

use outbox_core::Error;
use sqlx::MySqlPool;

pub use crate::connect::connect;
pub use crate::dialect::MySqlDialect;
pub use outbox_core::store::MIGRATIONS_TABLE;
/// A replicated model this backend writes (`M: Writable<MySqlDialect>`): every field of a
/// type the driver encodes. The bound for code generic over models.
pub use outbox_sqlx::Writable;

/// The outbox store on a MariaDB database: `MySqlStore::new(pool)`. Apply the migrations
/// first ([`migrate`]).
pub type MySqlStore = outbox_sqlx::SqlxStore<MySqlDialect>;

/// A claimed shard on MariaDB: under a lease, or inside the claiming transaction (which holds
/// the shard's state row locked) in in-transaction handler mode.
pub type MySqlSession = outbox_sqlx::SqlxSession<MySqlDialect>;

/// A MariaDB transaction that remembers the shards its outboxes went to (see
/// [`outbox_sqlx::OutboxTransaction`]): it dereferences to the `MySqlConnection`.
pub type OutboxTransaction<'c> = outbox_sqlx::OutboxTransaction<'c, MySqlDialect>;

/// Begins a flushing transaction on `pool`, at the isolation level of the connection's
/// session (the server's default, `REPEATABLE READ`, unless the pool sets another): only
/// the relay's own transactions run at `READ COMMITTED`.
///
/// ```no_run
/// # use outbox_core::{Category, CategoryId, Message, Registry, Relay, Scope, ScopeId};
/// # struct Org;
/// # impl Scope for Org { const ID: ScopeId = ScopeId(1); const NAME: &'static str = "org"; }
/// # struct Renamed;
/// # impl Category for Renamed {
/// #     type Scope = Org; type Payload = String;
/// #     const ID: CategoryId = CategoryId(1); const NAME: &'static str = "renamed";
/// # }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = outbox_mysql::connect("mysql://root@127.0.0.1:3306/app").await?;
/// # outbox_mysql::migrate(&pool).await?;
/// # let registry = Registry::builder()
/// #     .handle::<Renamed>(|_: outbox_core::Delivery<Renamed>| async { Ok::<_, std::io::Error>(()) })
/// #     .build()?;
/// let relay = Relay::new(outbox_mysql::MySqlStore::new(pool.clone()), registry);
///
/// let mut tx = outbox_mysql::begin(&pool).await?;
/// // ... the business change, with `&mut *tx` as the executor ...
/// tx.write(&Message::new::<Renamed>(1, 1, &"Acme".to_owned())?).await?;
/// let written = tx.commit().await?; // the data is committed
/// relay.flush(&written).await?; // and delivered now: Err(_) if a handler failed
/// # Ok(())
/// # }
/// ```
pub async fn begin(pool: &MySqlPool) -> Result<OutboxTransaction<'static>, Error> {
    outbox_sqlx::begin::<MySqlDialect>(pool).await
}

outbox_sqlx::backend_functions!(MySqlDialect, sqlx::MySql, sqlx::MySqlConnection);
