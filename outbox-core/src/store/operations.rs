//! The operators' side of a store: what is pending, each shard's state, dead letters,
//! pauses and relays, and [`Admin`], which reads and changes them. Tools need only this; the
//! relay never calls it.

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::backfill::{BackfillStart, BackfillState};
use crate::error::Error;
use crate::id::Id;
use crate::model::{CategoryId, MessageId, ScopeId, ShardKey};

use super::Acknowledgement;

/// The state of a shard the relay has worked on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardState {
    /// The shard.
    pub shard: ShardKey,
    /// Failed attempts at the head of the shard.
    pub attempts: u32,
    /// The last error, with its causes.
    pub last_error: Option<String>,
    /// When the shard is due again after a failure.
    pub retry_at: Option<SystemTime>,
    /// The worker holding the lease, if any.
    pub lease_owner: Option<String>,
    /// When the lease ends.
    pub lease_expires_at: Option<SystemTime>,
    /// The latest fencing token issued for the shard.
    pub lease_token: Option<i64>,
    /// The unknown category that parks the shard, if any.
    pub parked_category: Option<CategoryId>,
}

impl ShardState {
    /// A state record (backends build these when inspecting).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shard: ShardKey,
        attempts: u32,
        last_error: Option<String>,
        retry_at: Option<SystemTime>,
        lease_owner: Option<String>,
        lease_expires_at: Option<SystemTime>,
        lease_token: Option<i64>,
        parked_category: Option<CategoryId>,
    ) -> Self {
        Self {
            shard,
            attempts,
            last_error,
            retry_at,
            lease_owner,
            lease_expires_at,
            lease_token,
            parked_category,
        }
    }
}

/// A written, not yet delivered, message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PendingMessage {
    /// The row's id.
    pub id: MessageId,
    /// The shard.
    pub shard: ShardKey,
    /// The category.
    pub category: CategoryId,
    /// The object.
    pub object_identifier: Id,
    /// The payload as JSON text.
    pub payload: String,
    /// When the row was written.
    pub created_at: SystemTime,
    /// The row's metadata as stored (a JSON object), if any.
    pub metadata: Option<String>,
}

impl PendingMessage {
    /// A pending message record (backends build these when inspecting).
    pub fn new(
        id: MessageId,
        shard: ShardKey,
        category: CategoryId,
        object_identifier: Id,
        payload: String,
        created_at: SystemTime,
    ) -> Self {
        Self {
            id,
            shard,
            category,
            object_identifier,
            payload,
            created_at,
            metadata: None,
        }
    }

    /// This record with the row's stored metadata.
    pub fn with_metadata(mut self, metadata: Option<String>) -> Self {
        self.metadata = metadata;
        self
    }

    /// The payload parsed as JSON.
    pub fn payload_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.payload).unwrap_or(serde_json::Value::Null)
    }
}

/// A failing group moved out of the outbox: what [`ShardSession::dead_letter`](super::ShardSession::dead_letter) records with
/// its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLettering {
    /// The group and the rows of it that the relay read: exactly these move.
    pub rows: Acknowledgement,
    /// The last error, with its causes.
    pub error: String,
    /// The failed attempts at the group, counting the last.
    pub attempts: u32,
}

/// A message set aside by its category's dead-letter policy: one row of a group that
/// failed `max_attempts` times, with what the relay knew of its failure.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The message's id in the outbox (a dead letter keeps it: ids are never reused).
    pub message_id: MessageId,
    /// The shard.
    pub shard: ShardKey,
    /// The category.
    pub category: CategoryId,
    /// The object.
    pub object_identifier: Id,
    /// The payload as JSON text.
    pub payload: String,
    /// When the message was written.
    pub created_at: SystemTime,
    /// The message's metadata as stored (a JSON object), if any: a replay keeps it.
    pub metadata: Option<String>,
    /// The last error, with its causes.
    pub error: String,
    /// The failed attempts at its group.
    pub attempts: u32,
    /// When its group first failed.
    pub first_failed_at: SystemTime,
    /// When its group failed the last time and was set aside.
    pub dead_lettered_at: SystemTime,
    /// The fencing token of the lease under which it was set aside.
    pub lease_token: i64,
}

impl DeadLetter {
    /// A dead letter record (backends build these when listing).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        message: PendingMessage,
        error: String,
        attempts: u32,
        first_failed_at: SystemTime,
        dead_lettered_at: SystemTime,
        lease_token: i64,
    ) -> Self {
        Self {
            message_id: message.id,
            shard: message.shard,
            category: message.category,
            object_identifier: message.object_identifier,
            payload: message.payload,
            created_at: message.created_at,
            metadata: message.metadata,
            error,
            attempts,
            first_failed_at,
            dead_lettered_at,
            lease_token,
        }
    }
}

/// Which dead letters to list: every condition given must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DeadLetterFilter {
    /// Of this category.
    pub category: Option<CategoryId>,
    /// In this scope.
    pub scope: Option<ScopeId>,
    /// In this shard.
    pub shard: Option<ShardKey>,
    /// Set aside at least this long ago.
    pub older_than: Option<Duration>,
    /// At most this many (the oldest messages first).
    pub limit: Option<usize>,
    /// Only those with these message ids.
    pub ids: Option<Vec<MessageId>>,
}

impl DeadLetterFilter {
    /// Every dead letter.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only those of `category`.
    pub fn category(mut self, category: CategoryId) -> Self {
        self.category = Some(category);
        self
    }

    /// Only those in `scope`.
    pub fn scope(mut self, scope: ScopeId) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Only those in `shard`.
    pub fn shard(mut self, shard: ShardKey) -> Self {
        self.shard = Some(shard);
        self
    }

    /// Only those set aside at least `age` ago.
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// At most `limit` of them.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Only those with message ids among `ids`.
    pub fn ids(mut self, ids: impl IntoIterator<Item = MessageId>) -> Self {
        self.ids = Some(ids.into_iter().collect());
        self
    }

    /// Whether `letter` passes the filter's conditions (the limit aside), at time `now`.
    pub fn matches(&self, letter: &DeadLetter, now: SystemTime) -> bool {
        self.category
            .is_none_or(|category| letter.category == category)
            && self.scope.is_none_or(|scope| letter.shard.scope == scope)
            && self
                .shard
                .as_ref()
                .is_none_or(|shard| &letter.shard == shard)
            && self
                .ids
                .as_ref()
                .is_none_or(|ids| ids.contains(&letter.message_id))
            && self.older_than.is_none_or(|age| {
                now.duration_since(letter.dead_lettered_at)
                    .is_ok_and(|since| since >= age)
            })
    }
}

/// What a pause stops: one shard, every shard of a scope, or every shard that holds a
/// message of a category. A paused shard delivers nothing (and no group of it starts), so
/// its order is kept; a category pause therefore holds back the other categories' messages
/// in the shards it pauses. Relays see a pause at their next claim: a drain in flight when it
/// lands ends at its row or time budget, as any drain does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PauseTarget {
    /// One shard.
    Shard(ShardKey),
    /// Every shard holding a pending message of the category.
    Category(CategoryId),
    /// Every shard of the scope.
    Scope(ScopeId),
}

impl PauseTarget {
    /// Whether the target pauses `shard`, given whether the shard holds a pending message of
    /// the target's category (asked only for a category pause).
    pub fn pauses(&self, shard: &ShardKey, holds: impl FnOnce(CategoryId) -> bool) -> bool {
        match self {
            Self::Shard(paused) => paused == shard,
            Self::Scope(scope) => shard.scope == *scope,
            Self::Category(category) => holds(*category),
        }
    }
}

impl fmt::Display for PauseTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shard(shard) => write!(f, "shard {shard}"),
            Self::Category(category) => write!(f, "category {}", category.0),
            Self::Scope(scope) => write!(f, "scope {}", scope.0),
        }
    }
}

/// A pause in force.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pause {
    /// What it stops.
    pub target: PauseTarget,
    /// Why, as the operator said.
    pub reason: Option<String>,
    /// Since when.
    pub paused_at: SystemTime,
}

impl Pause {
    /// A pause record (backends build these when listing).
    pub fn new(target: PauseTarget, reason: Option<String>, paused_at: SystemTime) -> Self {
        Self {
            target,
            reason,
            paused_at,
        }
    }
}

/// The outbox at a glance: what `outbox status` shows, from [`Admin::status`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxStatus {
    /// Pending messages.
    pub pending_messages: u64,
    /// When the oldest pending message was written.
    pub oldest_pending_at: Option<SystemTime>,
    /// Shards with pending messages.
    pub shards: u64,
    /// Of those, the shards waiting for a relay ([`ShardStatus::Due`]). The five counts that
    /// follow are the shards by [`ShardStatus`]: they add up to [`shards`](Self::shards), and
    /// [`deepest`](Self::deepest) shows each shard with the status it is counted under.
    pub shards_due: u64,
    /// Shards a relay holds now ([`ShardStatus::InFlight`]).
    pub shards_in_flight: u64,
    /// Shards backing off after a failure ([`ShardStatus::BackingOff`]).
    pub shards_in_backoff: u64,
    /// Shards parked on a category no running binary knows ([`ShardStatus::Parked`]).
    pub shards_parked: u64,
    /// Shards a pause holds ([`ShardStatus::Paused`]).
    pub shards_paused: u64,
    /// Dead letters.
    pub dead_letters: u64,
    /// When the oldest dead letter was set aside.
    pub oldest_dead_letter_at: Option<SystemTime>,
    /// The shards with the most pending messages, deepest first.
    pub deepest: Vec<ShardInfo>,
    /// Whether the figures are estimates: what [`Store::gauges`](super::Store::gauges) reads above a backlog its
    /// store counts exactly (see the store's documentation), so that their cost does not grow
    /// with the backlog. [`Admin::status`] always counts.
    pub estimated: bool,
    /// What holds back the database's cleanup of the rows the outbox deleted, oldest first:
    /// `None` where the store cannot tell (SQLite, the in-memory store) or nothing does.
    pub horizon: Option<Horizon>,
}

/// The oldest holder of the database's cleanup horizon: a transaction whose snapshot (or a
/// replication slot, or a standby's feedback, or a prepared transaction) keeps PostgreSQL's
/// vacuum from removing the rows deleted since it began, or, on MariaDB, the oldest open
/// transaction, behind which InnoDB's purge waits. While it holds, every row the outbox
/// acknowledges stays behind as a dead row; `docs/operating.md` says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Horizon {
    /// Who holds it, as an operator finds it: a session (its process id, application,
    /// client and state), a replication slot or a prepared transaction, by name.
    pub holder: String,
    /// Since when, where the database knows: the holding transaction's start.
    pub since: Option<SystemTime>,
    /// How far behind it is: PostgreSQL, the transactions begun since its snapshot (the age
    /// of its `xmin`); MariaDB, the undo records waiting for purge (the history list).
    pub behind: Option<u64>,
}

impl Horizon {
    /// A horizon's holder (backends build these when reading the status).
    pub fn new(holder: String, since: Option<SystemTime>, behind: Option<u64>) -> Self {
        Self {
            holder,
            since,
            behind,
        }
    }

    /// How long it has been held at `now`, where the database knows since when.
    pub fn held_for(&self, now: SystemTime) -> Option<Duration> {
        self.since.and_then(|since| now.duration_since(since).ok())
    }
}

/// When a failed shard is tried again ([`ShardInfo::next_retry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextRetry {
    /// It is due: a relay may claim it now.
    Now,
    /// It backs off until then.
    At(SystemTime),
}

/// What a shard with pending messages is doing, as [`Admin::status`] counts it and every
/// listing shows it: one status per shard, the first that applies in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardStatus {
    /// A pause holds it.
    Paused,
    /// A relay holds it under a live lease.
    InFlight,
    /// Its head is of a category no running binary knows: it waits for one that does.
    Parked,
    /// Its head failed, and it waits for its next retry.
    BackingOff,
    /// A relay may claim it now: never failed, its retry time passed, or a message newer than
    /// its failure arrived.
    Due,
}

impl ShardStatus {
    /// The status of a shard that a pause holds or not, that a relay holds or not, that is
    /// parked or not, and that waits for a retry or not (its retry time is ahead, and no
    /// message arrived since its failure). The stores' SQL computes the same
    /// ([`ShardStatus::from_label`] reads it back).
    pub fn of(paused: bool, in_flight: bool, parked: bool, waiting: bool) -> Self {
        if paused {
            Self::Paused
        } else if in_flight {
            Self::InFlight
        } else if parked {
            Self::Parked
        } else if waiting {
            Self::BackingOff
        } else {
            Self::Due
        }
    }

    /// The status as operators read it: `paused`, `in flight`, `parked`, `backing off`, `due`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Paused => "paused",
            Self::InFlight => "in flight",
            Self::Parked => "parked",
            Self::BackingOff => "backing off",
            Self::Due => "due",
        }
    }

    /// The status whose [`label`](Self::label) is `label`.
    pub fn from_label(label: &str) -> Option<Self> {
        [
            Self::Paused,
            Self::InFlight,
            Self::Parked,
            Self::BackingOff,
            Self::Due,
        ]
        .into_iter()
        .find(|status| status.label() == label)
    }
}

impl fmt::Display for ShardStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// One shard as an operator sees it: its pending messages and its recorded state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardInfo {
    /// The shard.
    pub shard: ShardKey,
    /// What it is doing, as [`OutboxStatus`] counts it.
    pub status: ShardStatus,
    /// Its pending messages.
    pub pending: u64,
    /// When its oldest pending message was written.
    pub oldest_pending_at: Option<SystemTime>,
    /// Failed attempts at its head.
    pub attempts: u32,
    /// The last error, with its causes.
    pub last_error: Option<String>,
    /// When it is due again after a failure.
    pub retry_at: Option<SystemTime>,
    /// The unknown category that parks it, if any.
    pub parked_category: Option<CategoryId>,
    /// The worker holding it now, if any.
    pub lease_owner: Option<String>,
    /// Whether a pause holds it.
    pub paused: bool,
    /// Whether [`ShardInfo::pending`] is an estimate: a listing ranked from a sample
    /// ([`ShardList::sampled`]) counts each shard's messages up to a cap, and estimates a
    /// shard that holds more from the sample (never below the cap).
    pub pending_estimated: bool,
}

impl ShardInfo {
    /// A shard record (backends build these when listing).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shard: ShardKey,
        pending: u64,
        oldest_pending_at: Option<SystemTime>,
        attempts: u32,
        last_error: Option<String>,
        retry_at: Option<SystemTime>,
        parked_category: Option<CategoryId>,
        lease_owner: Option<String>,
        paused: bool,
        status: ShardStatus,
    ) -> Self {
        Self {
            shard,
            status,
            pending,
            oldest_pending_at,
            attempts,
            last_error,
            retry_at,
            parked_category,
            lease_owner,
            paused,
            pending_estimated: false,
        }
    }

    /// When the shard's failed head is tried again, as its status has it: at its retry time
    /// while it backs off, now once it is due again (its retry time passed, or a message newer
    /// than its failure made it due before then); `None` for a shard with no failure to retry,
    /// or one that a relay, a pause or a park holds. Every listing shows this, never the raw
    /// [`ShardInfo::retry_at`], so that the state and the next attempt agree.
    pub fn next_retry(&self) -> Option<NextRetry> {
        match self.status {
            ShardStatus::BackingOff => self.retry_at.map(NextRetry::At),
            ShardStatus::Due if self.attempts > 0 => Some(NextRetry::Now),
            _ => None,
        }
    }

    /// The same record, its pending count an estimate if `estimated`.
    pub fn with_pending_estimated(mut self, estimated: bool) -> Self {
        self.pending_estimated = estimated;
        self
    }
}

/// What a running relay says of itself at each heartbeat ([`Store::beat`](super::Store::beat)): the row
/// [`Admin::relays`] reads back, so that an operator's `outbox status` sees the relays that
/// run and the systems they are waiting on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Heartbeat {
    /// The relay's worker id.
    pub worker: String,
    /// When its [`Relay::run`](crate::Relay::run) started.
    pub started_at: SystemTime,
    /// The shards it is draining now.
    pub shards_in_flight: u64,
    /// The shards it holds back while their breaker is open.
    pub shards_waiting: u64,
    /// The names of the breakers it found open that are open still.
    pub open_breakers: Vec<String>,
    /// How long the row stands for a running relay without another heartbeat (a few of its
    /// intervals): past it, the relay stopped answering.
    pub expires_in: Duration,
}

impl Heartbeat {
    /// A heartbeat (stores' tests build these; the relay makes its own).
    pub fn new(worker: impl Into<String>, started_at: SystemTime, expires_in: Duration) -> Self {
        Self {
            worker: worker.into(),
            started_at,
            shards_in_flight: 0,
            shards_waiting: 0,
            open_breakers: Vec::new(),
            expires_in,
        }
    }

    /// With `in_flight` shards being drained and `waiting` held back behind
    /// `open_breakers`.
    pub fn with_shards(mut self, in_flight: u64, waiting: u64, open_breakers: Vec<String>) -> Self {
        self.shards_in_flight = in_flight;
        self.shards_waiting = waiting;
        self.open_breakers = open_breakers;
        self
    }
}

/// A relay as its last heartbeat recorded it ([`Admin::relays`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayInfo {
    /// The relay's worker id.
    pub worker: String,
    /// When it started.
    pub started_at: SystemTime,
    /// Its last heartbeat, by the database's clock.
    pub seen_at: SystemTime,
    /// Whether it is running: its last heartbeat has not expired. A relay that stops
    /// deletes its row; one whose row expired stopped answering (killed, hung, or cut off
    /// from the database).
    pub live: bool,
    /// The shards it was draining.
    pub shards_in_flight: u64,
    /// The shards it held back while their breaker was open.
    pub shards_waiting: u64,
    /// The breakers it found open (the systems that did not answer it).
    pub open_breakers: Vec<String>,
}

impl RelayInfo {
    /// A relay record (backends build these when listing).
    pub fn new(heartbeat: Heartbeat, seen_at: SystemTime, live: bool) -> Self {
        Self {
            worker: heartbeat.worker,
            started_at: heartbeat.started_at,
            seen_at,
            live,
            shards_in_flight: heartbeat.shards_in_flight,
            shards_waiting: heartbeat.shards_waiting,
            open_breakers: heartbeat.open_breakers,
        }
    }
}

/// How long a relay that stopped answering stays in [`Admin::relays`] (then its row is
/// deleted at another relay's heartbeat).
pub const FORGET_RELAYS_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// Which shards [`Admin::shards`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardFilter {
    /// Every shard with pending messages.
    #[default]
    Pending,
    /// Those whose head has failed (backing off, or parked).
    Failing,
    /// Those a pause holds.
    Paused,
    /// Those parked on an unknown category.
    Parked,
}

/// Which shards [`Admin::shards`] lists, and how many.
///
/// ```
/// use outbox_core::admin::{ShardFilter, ShardQuery};
/// use outbox_core::{CategoryId, ScopeId};
///
/// let query = ShardQuery::new(ShardFilter::Failing, 50)
///     .scope(ScopeId(1))
///     .category(CategoryId(7));
/// assert_eq!(query.limit, 50);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardQuery {
    /// Which state of shard.
    pub filter: ShardFilter,
    /// Only the shards of this scope.
    pub scope: Option<ScopeId>,
    /// Only the shards with a pending message of this category.
    pub category: Option<CategoryId>,
    /// The most shards listed.
    pub limit: usize,
}

impl ShardQuery {
    /// The shards that pass `filter`, of any scope and category, at most `limit`.
    pub fn new(filter: ShardFilter, limit: usize) -> Self {
        Self {
            filter,
            scope: None,
            category: None,
            limit,
        }
    }

    /// Only the shards of `scope`.
    pub fn scope(mut self, scope: ScopeId) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Only the shards with a pending message of `category`.
    pub fn category(mut self, category: CategoryId) -> Self {
        self.category = Some(category);
        self
    }
}

/// What [`Admin::shards`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ShardList {
    /// The shards, deepest first.
    pub shards: Vec<ShardInfo>,
    /// `None` if every shard of the filter was ranked; `Some(n)` if the store, above the
    /// backlog it counts exactly, ranked them from a sample of `n` pending messages (spread
    /// evenly over the ids), so that the listing's cost does not grow with the backlog. Then
    /// the order is approximate, a shard the sample missed is not listed (save those found
    /// from their own rows: a scope's first shards, the failing, parked and paused ones), and
    /// counts above a cap are estimates ([`ShardInfo::pending_estimated`]).
    pub sampled: Option<u64>,
}

impl ShardList {
    /// A listing of `shards`, every one ranked.
    pub fn ranked(shards: Vec<ShardInfo>) -> Self {
        Self {
            shards,
            sampled: None,
        }
    }

    /// A listing of `shards` ranked from a sample of `messages`.
    pub fn sampled(shards: Vec<ShardInfo>, messages: u64) -> Self {
        Self {
            shards,
            sampled: Some(messages),
        }
    }
}

/// The operator's side of a store: what is pending, each shard's state, and a shard made due
/// now. Tools (the test kit's inspection, an operator command) need only this; the relay never
/// calls it. A tool that opens databases by URL works on
/// [`admin::Operations`](crate::admin::Operations) instead, which every store implements.
///
/// ```
/// use outbox_core::memory::MemoryStore;
/// use outbox_core::{ScopeId};
/// use outbox_core::admin::{Admin, PauseTarget};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), outbox_core::Error> {
/// // A backend's store (`PgStore`, `SqliteStore`); here the in-memory one.
/// let store = MemoryStore::new();
/// let status = store.status(10).await?;
/// assert_eq!(status.pending_messages, 0);
///
/// // An incident: every relay stops claiming the scope's shards until it is resumed.
/// let scope = PauseTarget::Scope(ScopeId(1));
/// assert!(store.pause(&scope, Some("incident 42")).await?);
/// assert_eq!(store.pauses().await?.len(), 1);
/// assert!(store.resume(&scope).await?);
/// # Ok(())
/// # }
/// ```
pub trait Admin: Send + Sync {
    /// Makes a shard in backoff due now, keeping its attempt count; returns whether it was.
    fn reschedule(&self, shard: &ShardKey) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Pending messages in id order, at most `limit`.
    fn pending_messages(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingMessage>, Error>> + Send;

    /// The recorded state of every shard the relay holds state for.
    fn shard_states(&self) -> impl Future<Output = Result<Vec<ShardState>, Error>> + Send;

    /// The outbox at a glance, with the `deepest` shards with the most pending messages, read
    /// at one moment (one statement): the counts by [`ShardStatus`] and the deepest shards'
    /// statuses cannot disagree. It counts every pending row: meant for operators, not for a
    /// tight loop.
    fn status(&self, deepest: usize) -> impl Future<Output = Result<OutboxStatus, Error>> + Send;

    /// One shard with pending messages, as [`Admin::shards`] lists it; `None` if it has none.
    /// A store may count a very deep shard's messages up to a bound and estimate the rest
    /// ([`ShardInfo::pending_estimated`]), so that its cost does not grow with the shard.
    fn shard(
        &self,
        shard: &ShardKey,
    ) -> impl Future<Output = Result<Option<ShardInfo>, Error>> + Send;

    /// The shards that pass `query`, deepest first. Its cost is bounded whatever the
    /// backlog: a store may rank the shards from a sample above the backlog it counts exactly
    /// ([`ShardList::sampled`] says so); failing and parked shards are always found from
    /// their recorded states.
    fn shards(&self, query: &ShardQuery) -> impl Future<Output = Result<ShardList, Error>> + Send;

    /// The oldest pending messages of `shard`, in id order, at most `limit`.
    fn shard_messages(
        &self,
        shard: &ShardKey,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingMessage>, Error>> + Send;

    /// The dead letters that pass `filter`, in message id order.
    fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, Error>> + Send;

    /// Writes the dead letters `ids` back to the outbox as new messages, in the order of
    /// their original ids, and removes them, in one transaction; returns the new messages'
    /// ids in that order. If one of `ids` is not a dead letter (say, replayed or purged
    /// already) nothing changes and the error is [`Error::NoSuchDeadLetter`].
    fn replay_dead_letters(
        &self,
        ids: &[MessageId],
    ) -> impl Future<Output = Result<Vec<MessageId>, Error>> + Send;

    /// Sets the pending message `id` aside as a dead letter, so that its shard goes on
    /// without it: the operator's way past a message that can never succeed, whatever its
    /// category's dead-letter policy. The letter records `reason` as its error, with the
    /// shard's attempts so far; it can be replayed like any other. If the message was the
    /// shard's head, the shard's failures are cleared and it is due at once.
    ///
    /// Fenced against the relays: a message whose shard a relay holds now (a live lease, or a
    /// drain's transaction) is refused with [`Error::ShardHeld`], and one that is not pending
    /// with [`Error::NoSuchMessage`]; nothing changes then. A relay that claims the shard
    /// after the set-aside does not see the message.
    fn set_aside(
        &self,
        id: MessageId,
        reason: &str,
    ) -> impl Future<Output = Result<DeadLetter, Error>> + Send;

    /// Deletes the dead letters `ids`; returns how many there were.
    fn purge_dead_letters(
        &self,
        ids: &[MessageId],
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Pauses `target`: every relay sees it at its next claim; returns whether it was
    /// not paused already (a second pause keeps the first one's reason and time).
    fn pause(
        &self,
        target: &PauseTarget,
        reason: Option<&str>,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Lifts the pause of `target`; returns whether it was paused. A shard paused by another
    /// target (its scope, a category) stays paused.
    fn resume(&self, target: &PauseTarget) -> impl Future<Output = Result<bool, Error>> + Send;

    /// The pauses in force.
    fn pauses(&self) -> impl Future<Output = Result<Vec<Pause>, Error>> + Send;

    /// Every model's backfill as the watermarks record it, by category.
    fn backfills(&self) -> impl Future<Output = Result<Vec<BackfillState>, Error>> + Send;

    /// Starts (or resumes) a model's backfill to `start.version`, restricted to
    /// `start.destinations` if given: relays whose code declares that version walk it from
    /// their next tick. Returns the model's state.
    fn start_backfill(
        &self,
        start: &BackfillStart,
    ) -> impl Future<Output = Result<BackfillState, Error>> + Send;

    /// Pauses a model's backfill where it is (its target lowered to the version done);
    /// returns whether it was started and not done. Starting it again to the same version
    /// goes on from where it stopped.
    fn pause_backfill(
        &self,
        category: CategoryId,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// The relays as their heartbeats recorded them, by worker id: those running, and those
    /// that stopped answering in the last [`FORGET_RELAYS_AFTER`] (`live` false). A relay
    /// that stopped on its own is not listed.
    fn relays(&self) -> impl Future<Output = Result<Vec<RelayInfo>, Error>> + Send;
}
