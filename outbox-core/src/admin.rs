//! Operators' tools over any backend: the `outbox` command, a console, a script.
//!
//! [`Admin`] and [`Store`] are generic traits, for code that knows its store's type. A tool
//! that takes a database URL does not: it finds the [`Backend`] registered for the URL's
//! scheme ([`Backend::for_url`]), opens the [`Database`] there, and works on it through
//! [`Operations`], which every `Store + Admin` implements as a trait object.
//!
//! A backend registers itself by linking: `outbox-rs-postgres` registers `postgres://` and
//! `postgresql://`, `outbox-rs-sqlite` registers `sqlite:`. A backend of your own registers
//! with `inventory::submit!` of a [`Backend`]; every
//! tool built with it then speaks to its URLs, unchanged.

use crate::backfill::{BackfillStart, BackfillState};
pub use crate::catalog::{Catalog, NameError, NamedCategory};
use crate::error::Error;
use crate::future::BoxFuture;
use crate::model::{CategoryId, MessageId, ShardKey};
pub use crate::secret::secret_parameters;
pub use crate::store::{
    Admin, DeadLetter, DeadLetterFilter, FORGET_RELAYS_AFTER, Heartbeat, Horizon, NextRetry,
    OutboxStatus, Pause, PauseTarget, RelayInfo, ShardFilter, ShardInfo, ShardList, ShardQuery,
    ShardStatus,
};
use crate::store::{PendingMessage, ShardState, Store};

/// What an operator's tool does to an outbox, as a trait object: [`Admin`]'s operations and
/// [`Store::check_schema`], each a boxed future. Every `Store + Admin` implements it.
pub trait Operations: Send + Sync {
    /// See [`Store::check_schema`].
    fn check_schema(&self) -> BoxFuture<'_, Result<(), Error>>;
    /// See [`Admin::reschedule`].
    fn reschedule<'a>(&'a self, shard: &'a ShardKey) -> BoxFuture<'a, Result<bool, Error>>;
    /// See [`Admin::pending_messages`].
    fn pending_messages(&self, limit: usize) -> BoxFuture<'_, Result<Vec<PendingMessage>, Error>>;
    /// See [`Admin::shard_states`].
    fn shard_states(&self) -> BoxFuture<'_, Result<Vec<ShardState>, Error>>;
    /// See [`Admin::status`].
    fn status(&self, deepest: usize) -> BoxFuture<'_, Result<OutboxStatus, Error>>;
    /// See [`Store::gauges`]: the status without its deepest shards, estimated above a
    /// backlog the store counts exactly, so that its cost does not grow with the backlog.
    fn gauges(&self) -> BoxFuture<'_, Result<OutboxStatus, Error>>;
    /// See [`Admin::shard`].
    fn shard<'a>(&'a self, shard: &'a ShardKey) -> BoxFuture<'a, Result<Option<ShardInfo>, Error>>;
    /// See [`Admin::shards`].
    fn shards<'a>(&'a self, query: &'a ShardQuery) -> BoxFuture<'a, Result<ShardList, Error>>;
    /// See [`Admin::shard_messages`].
    fn shard_messages<'a>(
        &'a self,
        shard: &'a ShardKey,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<PendingMessage>, Error>>;
    /// See [`Admin::dead_letters`].
    fn dead_letters<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, Error>>;
    /// See [`Admin::replay_dead_letters`].
    fn replay_dead_letters<'a>(
        &'a self,
        ids: &'a [MessageId],
    ) -> BoxFuture<'a, Result<Vec<MessageId>, Error>>;
    /// See [`Admin::set_aside`].
    fn set_aside<'a>(
        &'a self,
        id: MessageId,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<DeadLetter, Error>>;
    /// See [`Admin::purge_dead_letters`].
    fn purge_dead_letters<'a>(&'a self, ids: &'a [MessageId]) -> BoxFuture<'a, Result<u64, Error>>;
    /// See [`Admin::pause`].
    fn pause<'a>(
        &'a self,
        target: &'a PauseTarget,
        reason: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>>;
    /// See [`Admin::resume`].
    fn resume<'a>(&'a self, target: &'a PauseTarget) -> BoxFuture<'a, Result<bool, Error>>;
    /// See [`Admin::pauses`].
    fn pauses(&self) -> BoxFuture<'_, Result<Vec<Pause>, Error>>;
    /// See [`Admin::backfills`].
    fn backfills(&self) -> BoxFuture<'_, Result<Vec<BackfillState>, Error>>;
    /// See [`Admin::start_backfill`].
    fn start_backfill<'a>(
        &'a self,
        start: &'a BackfillStart,
    ) -> BoxFuture<'a, Result<BackfillState, Error>>;
    /// See [`Admin::pause_backfill`].
    fn pause_backfill(&self, category: CategoryId) -> BoxFuture<'_, Result<bool, Error>>;
    /// See [`Admin::relays`].
    fn relays(&self) -> BoxFuture<'_, Result<Vec<RelayInfo>, Error>>;
}

impl<S: Store + Admin> Operations for S {
    fn check_schema(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(Store::check_schema(self))
    }
    fn reschedule<'a>(&'a self, shard: &'a ShardKey) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(Admin::reschedule(self, shard))
    }
    fn pending_messages(&self, limit: usize) -> BoxFuture<'_, Result<Vec<PendingMessage>, Error>> {
        Box::pin(Admin::pending_messages(self, limit))
    }
    fn shard_states(&self) -> BoxFuture<'_, Result<Vec<ShardState>, Error>> {
        Box::pin(Admin::shard_states(self))
    }
    fn status(&self, deepest: usize) -> BoxFuture<'_, Result<OutboxStatus, Error>> {
        Box::pin(Admin::status(self, deepest))
    }
    fn gauges(&self) -> BoxFuture<'_, Result<OutboxStatus, Error>> {
        Box::pin(Store::gauges(self))
    }
    fn shard<'a>(&'a self, shard: &'a ShardKey) -> BoxFuture<'a, Result<Option<ShardInfo>, Error>> {
        Box::pin(Admin::shard(self, shard))
    }
    fn shards<'a>(&'a self, query: &'a ShardQuery) -> BoxFuture<'a, Result<ShardList, Error>> {
        Box::pin(Admin::shards(self, query))
    }
    fn shard_messages<'a>(
        &'a self,
        shard: &'a ShardKey,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<PendingMessage>, Error>> {
        Box::pin(Admin::shard_messages(self, shard, limit))
    }
    fn dead_letters<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, Error>> {
        Box::pin(Admin::dead_letters(self, filter))
    }
    fn replay_dead_letters<'a>(
        &'a self,
        ids: &'a [MessageId],
    ) -> BoxFuture<'a, Result<Vec<MessageId>, Error>> {
        Box::pin(Admin::replay_dead_letters(self, ids))
    }
    fn set_aside<'a>(
        &'a self,
        id: MessageId,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<DeadLetter, Error>> {
        Box::pin(Admin::set_aside(self, id, reason))
    }
    fn purge_dead_letters<'a>(&'a self, ids: &'a [MessageId]) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(Admin::purge_dead_letters(self, ids))
    }
    fn pause<'a>(
        &'a self,
        target: &'a PauseTarget,
        reason: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(Admin::pause(self, target, reason))
    }
    fn resume<'a>(&'a self, target: &'a PauseTarget) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(Admin::resume(self, target))
    }
    fn pauses(&self) -> BoxFuture<'_, Result<Vec<Pause>, Error>> {
        Box::pin(Admin::pauses(self))
    }
    fn backfills(&self) -> BoxFuture<'_, Result<Vec<BackfillState>, Error>> {
        Box::pin(Admin::backfills(self))
    }
    fn start_backfill<'a>(
        &'a self,
        start: &'a BackfillStart,
    ) -> BoxFuture<'a, Result<BackfillState, Error>> {
        Box::pin(Admin::start_backfill(self, start))
    }
    fn pause_backfill(&self, category: CategoryId) -> BoxFuture<'_, Result<bool, Error>> {
        Box::pin(Admin::pause_backfill(self, category))
    }
    fn relays(&self) -> BoxFuture<'_, Result<Vec<RelayInfo>, Error>> {
        Box::pin(Admin::relays(self))
    }
}

/// An outbox database a tool opened through its [`Backend`]: the operations on its outbox
/// ([`Operations`], which a `Box<dyn Database>` or an `Arc<dyn Database>` becomes by
/// coercion), and its migrations.
pub trait Database: Operations {
    /// The versions of the outbox migrations the database has applied, in order (none before
    /// the first migration).
    fn applied_migrations(&self) -> BoxFuture<'_, Result<Vec<i64>, Error>>;

    /// Applies the outbox migrations the database lacks.
    fn migrate(&self) -> BoxFuture<'_, Result<(), Error>>;

    /// Closes the connections.
    fn close(&self) -> BoxFuture<'_, ()>;

    /// The database as a consumer's ([`InboxDatabase`](crate::inbox::InboxDatabase)): its
    /// inbox records and dead letters. `None` if the backend has no inbox.
    fn inbox(&self) -> Option<&dyn crate::inbox::InboxDatabase> {
        None
    }
}

/// A database being opened: what [`Backend::open`] returns.
pub type Opening = BoxFuture<'static, Result<Box<dyn Database>, Error>>;

/// Whether [`Backend::open`] may create the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// The database must exist (a SQLite file not there is an error, not a new file).
    Existing,
    /// Create it where the backend can (a SQLite file): what a first migration does.
    OrCreate,
}

/// A database an operator's tool can open by URL, registered by its backend's crate with
/// `inventory`: the schemes it answers to, how it opens a URL, and its migrations as SQL.
#[derive(Debug)]
pub struct Backend {
    /// The database's name, as messages show it (`"PostgreSQL"`).
    pub name: &'static str,
    /// The URL schemes it opens, in lower case, as the URL starts (`"postgres"` for
    /// `postgres://…`).
    pub schemes: &'static [&'static str],
    /// Opens the database at a URL of one of its schemes.
    pub open: fn(url: String, open: Open) -> Opening,
    /// Every outbox migration as SQL for a migration tool of the user's own: each recorded in
    /// the migrations table as the backend's own migrator records it, so that a relay's
    /// start-up check finds them.
    pub migration_script: fn() -> String,
}

inventory::collect!(Backend);

impl Backend {
    /// Every backend linked into this program.
    pub fn all() -> impl Iterator<Item = &'static Backend> {
        inventory::iter::<Backend>.into_iter()
    }

    /// The backend registered for `url`'s scheme; [`Error::InvalidDatabaseUrl`] naming the
    /// schemes there are (never the URL's other parts, which may hold a password) if none is.
    pub fn for_url(url: &str) -> Result<&'static Backend, Error> {
        let scheme = url
            .split_once(':')
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        let found = scheme
            .as_deref()
            .and_then(|scheme| Self::all().find(|backend| backend.schemes.contains(&scheme)));
        found.ok_or_else(|| {
            let mut known: Vec<String> = Self::all()
                .flat_map(|backend| backend.schemes.iter().map(|scheme| format!("`{scheme}:`")))
                .collect();
            known.sort();
            let expected = if known.is_empty() {
                "no database backend is linked into this program".to_owned()
            } else {
                format!("expected a URL starting with {}", known.join(", "))
            };
            Error::invalid_database_url(url, expected)
        })
    }

    /// Opens the database at `url` (see [`Backend::for_url`]).
    pub async fn connect(url: &str, open: Open) -> Result<Box<dyn Database>, Error> {
        let backend = Self::for_url(url)?;
        (backend.open)(url.to_owned(), open).await
    }
}

/// The backfill an operator asks for of the replicated model `category`: to `version`, or to
/// the replication version this binary's declarations give the model (`catalog`), or to the
/// one the running relays recorded; named as the catalog names it. `None` if no version is
/// known: the operator must give one.
pub async fn backfill_start(
    outbox: &dyn Operations,
    catalog: &Catalog,
    category: CategoryId,
    version: Option<u32>,
) -> Result<Option<BackfillStart>, Error> {
    let known = catalog.category(category);
    let version = match version.or(known.and_then(|known| known.replication_version)) {
        Some(version) => Some(version),
        // The version the relays recorded, read only when needed.
        None => outbox
            .backfills()
            .await?
            .into_iter()
            .find(|state| state.category == category)
            .map(|state| state.declared_version)
            .filter(|version| *version > 0),
    };
    Ok(version.map(|version| {
        let start = BackfillStart::new(category, version);
        match known {
            Some(known) => start.model(known.identity.name),
            None => start,
        }
    }))
}
