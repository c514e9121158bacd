//! # outbox-rs-postgres
//!
//! The PostgreSQL store of **outbox**: write outbox messages in your own `sqlx` PostgreSQL
//! transactions, and let an [`outbox_core::Relay`] over a [`PgStore`] deliver them.
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
//! - Claims use `FOR UPDATE SKIP LOCKED`; any number of relays, on any number of machines, can
//!   share one database.
//! - Wake-ups cost the writers' commits nothing: once an [`OutboxTransaction`] commits, the
//!   relays of this process on the same database are woken directly, and those of other
//!   processes by one `NOTIFY` sent after the commit, outside it, coalesced per process
//!   ([`outbox_sqlx::wake`]). Messages written with a plain transaction ([`write()`] and the
//!   model functions) are found by the relay's polling: within
//!   `RelayConfig::poll_interval` at worst, sooner while messages keep arriving. With few
//!   concurrent writers, [`enable_commit_trigger`] makes every insert notify at its commit
//!   instead (at the cost of serialising the commits of those transactions). Behind poolers
//!   that break `LISTEN`, turn `RelayConfigBuilder::listen_for_other_processes` off: this
//!   process's commits still wake its relays.
//!
//! ## TLS
//!
//! No TLS stack is built by default. To connect with `sslmode=require` (or `verify-ca`,
//! `verify-full`), turn on one of this crate's features, passed through to sqlx:
//!
//! - `tls-rustls`: rustls with the *ring* backend and the webpki root certificates (sqlx's
//!   `tls-rustls-ring-webpki`): pure Rust, no system library;
//! - `tls-native-tls`: the platform's TLS (sqlx's `tls-native-tls`: OpenSSL on Linux,
//!   Secure Transport on macOS, SChannel on Windows), with the system's root certificates.
//!
//! ```toml
//! outbox-postgres = { version = "0.1", features = ["tls-rustls"] }
//! ```
//!
//! Without either, a URL that requires TLS cannot connect, and the default
//! `sslmode=prefer` connects without TLS. Cargo unifies features: if your application already
//! turns on one of sqlx's TLS features, the relay's connections use it too.
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
//! shared with `outbox-sqlite`; this crate supplies PostgreSQL's SQL, claims, wake-ups and
//! error codes ([`PgDialect`]).
//!
//! What an [`OutboxTransaction`] wrote can be flushed only once it has committed:
//!
//! ```compile_fail,E0308
//! # async fn before_commit(relay: outbox_core::Relay<outbox_postgres::PgStore>, tx: outbox_postgres::OutboxTransaction<'_>) {
//! // Does not compile: what is written before the commit is not something to flush.
//! relay.flush(tx.shards_written()).await;
//! # }
//! ```
//!
//! A replicated model's fields are written as their own `sqlx` types: one PostgreSQL has no
//! type for (an `u64`) does not compile at the write, and the error names the field's type:
//!
//! ```compile_fail,E0277
//! use outbox_core::{outbox_scope, replicated_model};
//!
//! #[outbox_scope(id = 1)]
//! struct Organization;
//!
//! #[replicated_model(scope = Organization, id = 1, table = "counters", shard = organization_id)]
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Counter { id: i64, organization_id: i64, hits: u64 }
//!
//! # async fn write(mut tx: sqlx::Transaction<'_, sqlx::Postgres>, counter: Counter) {
//! // Does not compile: sqlx does not encode `u64` for PostgreSQL.
//! outbox_postgres::save(&mut tx, &counter).await;
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;
mod dialect;
mod model;

use outbox_core::Error;
use sqlx::PgPool;

pub use crate::connect::connect;
pub use crate::dialect::PgDialect;
pub use crate::dialect::wakeups::{NOTIFY_CHANNEL, PgWakeups, set_announce_interval};
pub use outbox_core::store::MIGRATIONS_TABLE;
/// A replicated model this backend writes (`M: Writable<PgDialect>`): every field of a type
/// the driver encodes. The bound for code generic over models.
pub use outbox_sqlx::Writable;

/// The outbox store on a PostgreSQL database: `PgStore::new(pool)`. Apply the migrations
/// first ([`migrate`]).
pub type PgStore = outbox_sqlx::SqlxStore<PgDialect>;

/// A claimed shard on PostgreSQL: under a lease, or inside the claiming transaction (which
/// holds the shard's state row locked) in in-transaction handler mode.
pub type PgSession = outbox_sqlx::SqlxSession<PgDialect>;

/// A PostgreSQL transaction that remembers the shards its outboxes went to (see
/// [`outbox_sqlx::OutboxTransaction`]): it dereferences to the `PgConnection`.
pub type OutboxTransaction<'c> = outbox_sqlx::OutboxTransaction<'c, PgDialect>;

/// Begins a flushing transaction on `pool`.
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
/// # let pool = outbox_postgres::connect("postgres://postgres@127.0.0.1:5432/app").await?;
/// # outbox_postgres::migrate(&pool).await?;
/// # let registry = Registry::builder()
/// #     .handle::<Renamed>(|_: outbox_core::Delivery<Renamed>| async { Ok::<_, std::io::Error>(()) })
/// #     .build()?;
/// let relay = Relay::new(outbox_postgres::PgStore::new(pool.clone()), registry);
///
/// let mut tx = outbox_postgres::begin(&pool).await?;
/// // ... the business change, with `&mut *tx` as the executor ...
/// tx.write(&Message::new::<Renamed>(1, 1, &"Acme".to_owned())?).await?;
/// let written = tx.commit().await?; // the data is committed
/// relay.flush(&written).await?; // and delivered now: Err(_) if a handler failed
/// # Ok(())
/// # }
/// ```
pub async fn begin(pool: &PgPool) -> Result<OutboxTransaction<'static>, Error> {
    outbox_sqlx::begin::<PgDialect>(pool).await
}

outbox_sqlx::backend_functions!(PgDialect, sqlx::Postgres, sqlx::PgConnection);

/// Installs a trigger that notifies the relays (on [`NOTIFY_CHANNEL`]) at the commit of every
/// transaction that inserts outbox messages, however they were written: relays in other
/// processes then hear of messages written with a plain transaction at once, rather than at
/// their next poll.
///
/// It has a cost: PostgreSQL commits the transactions that queued a `NOTIFY` one after
/// another, behind one lock held through the commit's WAL flush, so concurrent writers lose
/// group commit (on a 2-core machine, 16 writers commit at about half the rate). Use it with
/// few concurrent writers; [`OutboxTransaction`]s wake the relays without it. Idempotent;
/// undone by [`disable_commit_trigger`]. Apply the migrations ([`migrate`]) first.
pub async fn enable_commit_trigger(pool: &PgPool) -> Result<(), Error> {
    sqlx::raw_sql(
        "DROP TRIGGER IF EXISTS outbox_messages_notify ON outbox_messages; \
         CREATE TRIGGER outbox_messages_notify AFTER INSERT ON outbox_messages \
         REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()",
    )
    .execute(pool)
    .await
    .map_err(outbox_sqlx::error::database::<PgDialect>(
        "installing the commit trigger",
    ))?;
    Ok(())
}

/// Removes the trigger [`enable_commit_trigger`] installs (the default since migration 5).
/// Idempotent.
pub async fn disable_commit_trigger(pool: &PgPool) -> Result<(), Error> {
    sqlx::raw_sql("DROP TRIGGER IF EXISTS outbox_messages_notify ON outbox_messages")
        .execute(pool)
        .await
        .map_err(outbox_sqlx::error::database::<PgDialect>(
            "removing the commit trigger",
        ))?;
    Ok(())
}

#[cfg(test)]
mod explain;
