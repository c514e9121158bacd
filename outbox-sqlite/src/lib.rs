//! # outbox-rs-sqlite
//!
//! The SQLite store of **outbox**, the embedded default: write outbox messages in your own
//! `sqlx` SQLite transactions, and let an [`outbox_core::Relay`] over a [`SqliteStore`] deliver
//! them.
//!
//! - [`migrate`] applies the embedded migrations, recorded in the library's own
//!   `_outbox_migrations` table (never the application's `_sqlx_migrations`). Run it (or give
//!   [`migrator`] to a migration tool of your own) before the relay starts; see
//!   [Upgrades](#upgrades) for rolling deploys.
//! - [`write()`] and [`write_all`] insert messages with the caller's transaction or connection;
//!   [`write_all`] uses one statement however many messages there are.
//! - [`save`], [`insert`], [`update`] and [`delete`] write replicated models (declared with
//!   `#[replicated_model]`) together with their outboxes, one statement per table. A key may
//!   appear only once in one call ([`Error::DuplicateKey`] otherwise, with nothing written).
//! - [`begin`] opens an [`OutboxTransaction`]: it remembers the shards its outboxes went to,
//!   so that `Relay::flush` delivers them as soon as it commits; its nested
//!   [`deferred`](outbox_sqlx::OutboxTransaction::deferred) scopes leave theirs to the relay.
//! - [`connect`] opens a pool configured for the relay: WAL journal, busy timeout.
//! - A consumer's [`Inbox`](outbox_core::inbox::Inbox) records the messages it applies in its
//!   own transaction (`&mut tx`, or a connection):
//!
//! ```
//! use outbox_core::MessageId;
//! use outbox_core::inbox::{Inbox, Received};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::sqlite::SqlitePoolOptions::new()
//!     .max_connections(1)
//!     .connect("sqlite::memory:")
//!     .await?;
//! outbox_sqlite::migrate(&pool).await?;
//!
//! let billing = Inbox::new("billing");
//! let message = MessageId(42); // the broker message's `Outbox-Message-Id`
//! for _delivery in 0..2 {
//!     let mut tx = pool.begin().await?;
//!     if billing.receive(&mut tx, message).await? == Received::First {
//!         sqlx::query("SELECT 1").execute(&mut *tx).await?; // the effect, in the same transaction
//!     }
//!     tx.commit().await?; // then acknowledge the broker
//! }
//! let mut connection = pool.acquire().await?;
//! assert_eq!(billing.receive(&mut *connection, message).await?, Received::Duplicate);
//! # Ok(())
//! # }
//! ```
//!
//! Claims run in `BEGIN IMMEDIATE` transactions, so two relays (threads or processes) on one
//! database file never drain the same shard at once. In-transaction handler mode holds the
//! database's write lock for the whole drain of a shard: keep such handlers short.
//!
//! ## Upgrades
//!
//! The outbox migrations are additive: each adds tables, columns, indexes or constraints and
//! never takes away what an older binary reads or writes. A binary of version N runs against a
//! schema at N or newer: in a rolling deploy, the first new binary migrates and the old ones
//! keep running beside it. An old binary's [`migrate`] on the newer schema applies nothing and
//! succeeds, and it and the relay's start-up check each log one `warn` line naming the
//! versions the binary knows and those the database has. A schema older than the binary is
//! not enough: the relay refuses to start ([`Error::MigrationMissing`]) until [`migrate`] has
//! run. So: migrate first (from the new binary, or a job before the rollout), then roll out.
//!
//! The body of the backend (transactions, writes, sessions, the store) is `outbox-sqlx`'s,
//! shared with `outbox-postgres`; this crate supplies SQLite's SQL, claims and error messages
//! ([`SqliteDialect`]).
//!
//! What an [`OutboxTransaction`] wrote can be flushed only once it has committed:
//!
//! ```compile_fail,E0308
//! # async fn before_commit(relay: outbox_core::Relay<outbox_sqlite::SqliteStore>, tx: outbox_sqlite::OutboxTransaction<'_>) {
//! // Does not compile: what is written before the commit is not something to flush.
//! relay.flush(tx.shards_written()).await;
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;
mod dialect;
mod model;

use outbox_core::Error;
use sqlx::SqlitePool;

pub use crate::connect::{WAL_SIZE_LIMIT, connect, connect_options};
pub use crate::dialect::SqliteDialect;
pub use outbox_core::store::MIGRATIONS_TABLE;
/// A replicated model this backend writes (`M: Writable<SqliteDialect>`): every field of a
/// type the driver encodes. The bound for code generic over models.
pub use outbox_sqlx::Writable;

/// The outbox store on a SQLite database: `SqliteStore::new(pool)`. Apply the migrations first
/// ([`migrate`]).
///
/// The relay's write transactions (claims, acknowledgements, releases) take turns on an
/// in-process lock shared by the store's clones before they ask SQLite for its write lock: the
/// relay's concurrent shards queue for it at once instead of sleeping in SQLite's busy handler.
pub type SqliteStore = outbox_sqlx::SqlxStore<SqliteDialect>;

/// A claimed shard on SQLite: under a lease, or inside the claiming `BEGIN IMMEDIATE`
/// transaction in in-transaction handler mode.
pub type SqliteSession = outbox_sqlx::SqlxSession<SqliteDialect>;

/// A SQLite transaction that remembers the shards its outboxes went to (see
/// [`outbox_sqlx::OutboxTransaction`]): it dereferences to the `SqliteConnection`.
pub type OutboxTransaction<'c> = outbox_sqlx::OutboxTransaction<'c, SqliteDialect>;

/// Begins a flushing transaction on `pool` (`BEGIN IMMEDIATE`: it is a writing transaction).
///
/// The SQLite this process links is checked first, once for the process's life: one older
/// than 3.45 is [`Error::Unsupported`], as the relay's start says, before anything is
/// written. (A write through any other executor that meets what an older SQLite lacks gets
/// the same error, not the database's "no such function".)
///
/// ```
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
/// # let dir = tempfile::tempdir()?;
/// # let pool = outbox_sqlite::connect(&dir.path().join("app.db")).await?;
/// # outbox_sqlite::migrate(&pool).await?;
/// # let registry = Registry::builder()
/// #     .handle::<Renamed>(|_: outbox_core::Delivery<Renamed>| async { Ok::<_, std::io::Error>(()) })
/// #     .build()?;
/// let relay = Relay::new(outbox_sqlite::SqliteStore::new(pool.clone()), registry);
///
/// let mut tx = outbox_sqlite::begin(&pool).await?;
/// // ... the business change, with `&mut *tx` as the executor ...
/// tx.write(&Message::new::<Renamed>(1, 1, &"Acme".to_owned())?).await?;
/// let written = tx.commit().await?; // the data is committed
/// relay.flush(&written).await?; // and delivered now: Err(_) if a handler failed
/// # Ok(())
/// # }
/// ```
pub async fn begin(pool: &SqlitePool) -> Result<OutboxTransaction<'static>, Error> {
    dialect::recent_enough_on(pool).await?;
    outbox_sqlx::begin::<SqliteDialect>(pool).await
}

outbox_sqlx::backend_functions!(SqliteDialect, sqlx::Sqlite, sqlx::SqliteConnection);

#[cfg(test)]
mod explain;
