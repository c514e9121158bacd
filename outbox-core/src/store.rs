//! The storage contract the relay drives and every backend implements.
//!
//! Core knows no SQL: a backend (`outbox-postgres`, `outbox-sqlite`, or a third party's) turns
//! these operations into statements. The conformance suite in `outbox-testkit` proves that a
//! backend implements them with the semantics the relay relies on.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::backfill::{
    BackfillBatch, BackfillModel, BackfillOptions, BackfillStart, BackfillState,
};
use crate::columns::ModelRow;
use crate::error::Error;
use crate::id::Id;
use crate::model::{CategoryId, MessageId, ScopeId, ShardKey};
use crate::replicated::ModelTable;

/// One pending row as the relay reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    /// The row's id.
    pub id: MessageId,
    /// The row's category.
    pub category: CategoryId,
    /// The row's scope, as stored (it may disagree with the category's own scope).
    pub scope: ScopeId,
    /// The object the row is about.
    pub object_identifier: Id,
    /// The payload as JSON text.
    pub payload: String,
    /// When the row was written (the database's clock).
    pub created_at: SystemTime,
    /// The row's metadata as stored (a JSON object), if any.
    pub metadata: Option<String>,
}

/// A claim on a shard, with the fencing token that proves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The claimed shard.
    pub shard: ShardKey,
    /// The fencing token: unique and increasing across all claims of all shards.
    pub token: i64,
    /// Attempts at the shard's head so far that did not get through (0 when the shard is
    /// healthy): failed deliveries, and claims that lapsed without a release (a worker that
    /// died or lost the database mid-drain may have delivered the head: its redelivery is
    /// not a first attempt).
    pub attempts: u32,
    /// The worker whose lease lapsed, if this claim took the shard over from it. That worker
    /// may have delivered any message of its last read without acknowledging it: the relay
    /// delivers the messages of its own first read as retries (attempt above 1).
    pub previous_owner: Option<String>,
}

/// How a claimed shard's handlers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HandlerMode {
    /// Handlers run outside any transaction, under a lease with a fencing token; a
    /// worker whose lease lapsed cannot acknowledge.
    #[default]
    Leased,
    /// Handlers run inside the transaction that claimed the shard: their writes to the same
    /// database commit atomically with the acknowledgement. Holds a connection and a row lock
    /// (on SQLite, the database's write lock) for the whole drain of the shard.
    InTransaction,
}

/// What a claim asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimOptions {
    /// Who claims; recorded for operators.
    pub worker: String,
    /// How long the lease lasts before another worker may take the shard over.
    pub lease: Duration,
    /// How the handlers run.
    pub mode: HandlerMode,
}

/// A coalescing group within a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupKey {
    /// The group's category.
    pub category: CategoryId,
    /// The group's object.
    pub object_identifier: Id,
}

/// The rows one delivery acknowledges: exactly `ids`, every one of them a row of `group` that
/// the relay read. Never a range: ids are assigned at insert, not at commit, so a range of
/// them may hold a row that committed after the read. A backend may use the group and
/// the span of the ids to find the rows, so long as it deletes only these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acknowledgement {
    /// The group.
    pub group: GroupKey,
    /// The rows, in id order.
    pub ids: Vec<MessageId>,
}

/// A coalescing group's newest row beyond a read, with every row of the group that it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupTail {
    /// The group's newest row in the range read: its payload is delivered.
    pub newest: StoredMessage,
    /// The ids of every row of the group in the range read, `newest` included, as one read saw
    /// them: the rows its delivery may acknowledge.
    pub ids: Vec<MessageId>,
}

/// How the drain of a claimed shard ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The shard has nothing left that the worker saw: release it and reset its failures.
    Drained,
    /// The worker used up its budget with messages left: release it, still due.
    Yielded,
    /// A delivery failed: back the shard off.
    Failed(Failure),
    /// Release the shard and leave its recorded state (attempts, last error, schedule) as it
    /// was: what a flush after commit does, whether it delivered or failed.
    Released,
}

/// A failed delivery, as the store records it on the shard.
///
/// A failure with a [`parked_category`](Self::parked_category) parks the shard: it is
/// not due again, whatever its retry time or newer messages, until
/// [`Store::unpark`] names the category (a relay that knows it runs) or an operator
/// reschedules it; `retry_in` and `watermark` are not used, and `attempts` is what the shard
/// had (a park is not an attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The error with its causes, shown to operators.
    pub error: String,
    /// The shard's failed attempts, counting this one (for a park, those before it).
    pub attempts: u32,
    /// How long until the shard is due again.
    pub retry_in: Duration,
    /// The highest message id the worker saw: a newer message makes the shard due at once.
    pub watermark: MessageId,
    /// The unknown category that parks the shard, if that is the failure.
    pub parked_category: Option<CategoryId>,
}

/// One page of due-shard discovery.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiscoveryPage {
    /// The shards on this page that are due: not leased, not backing off (or with a message
    /// newer than their failure).
    pub due: Vec<ShardKey>,
    /// Where the next page starts; `None` when the page reached the last shard.
    pub next: Option<ShardKey>,
}

/// A reason to look for due shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wakeup {
    /// Messages were committed to these shards.
    Shards(Vec<ShardKey>),
    /// Messages were committed somewhere.
    Any,
}

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

/// A failing group moved out of the outbox: what [`ShardSession::dead_letter`] records with
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
    /// Whether the figures are estimates: what [`Store::gauges`] reads above a backlog its
    /// store counts exactly (see the store's documentation), so that their cost does not grow
    /// with the backlog. [`Admin::status`] always counts.
    pub estimated: bool,
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
        }
    }
}

/// What a running relay says of itself at each heartbeat ([`Store::beat`]): the row
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

/// The storage contract of the relay: discovery, claims, leases. What operators and tests
/// read and change besides is [`Admin`].
pub trait Store: Clone + Send + Sync + 'static {
    /// A claimed shard.
    type Session: ShardSession;
    /// Notifications of committed messages.
    type Wakeups: WakeupStream;

    /// Verifies that the outbox tables exist and carry every migration this binary knows;
    /// fails with [`Error::MigrationMissing`] otherwise.
    fn check_schema(&self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Visits up to `limit` shards that have pending messages, in key order, starting after
    /// `after` (or at the first shard), and reports which of them are due. Must not read every
    /// row of the table: the cost follows the number of shards visited.
    fn discover(
        &self,
        after: Option<&ShardKey>,
        limit: usize,
    ) -> impl Future<Output = Result<DiscoveryPage, Error>> + Send;

    /// Claims a shard if it is due and no other worker holds it. Safe across threads and
    /// processes: at most one session exists for a shard at any time, and a new claim
    /// issues a fencing token greater than every earlier one.
    fn claim(
        &self,
        shard: &ShardKey,
        options: &ClaimOptions,
    ) -> impl Future<Output = Result<Option<Self::Session>, Error>> + Send;

    /// Claims those of `shards` that are due and free, as [`claim`](Self::claim) claims each
    /// (the same guarantees, shard by shard), and returns their sessions, in no particular
    /// order; the others are left alone. A backend may claim them all in one round trip, and
    /// read each claimed shard's head with its claim: a session may then answer its first
    /// [`fetch`](ShardSession::fetch) from that read, if no row of it was deleted since (a
    /// row committed since is read by the next fetch, as a row committed after any fetch is):
    /// a fetch of `first_read` rows, or of any number if the read found fewer than
    /// `first_read` (the shard's every row). The default claims them one at a time.
    fn claim_many(
        &self,
        shards: &[ShardKey],
        options: &ClaimOptions,
        first_read: usize,
    ) -> impl Future<Output = Result<Vec<Self::Session>, Error>> + Send {
        let _ = first_read;
        async move {
            let mut sessions = Vec::with_capacity(shards.len());
            for shard in shards {
                if let Some(session) = self.claim(shard, options).await? {
                    sessions.push(session);
                }
            }
            Ok(sessions)
        }
    }

    /// Acknowledges and releases several drained shards at once, each as its session's
    /// [`ack_and_finish`](ShardSession::ack_and_finish) with [`Outcome::Drained`] does, and
    /// fenced by its own lease: a lease no longer held acknowledges nothing of its shard
    /// ([`Error::LeaseLost`] for it) and takes nothing from the others. A backend may write
    /// them all in one transaction: then if that fails, nothing of it is written, and each
    /// shard gets the error ([`Error::shared_by`]). One result per session, in order. The
    /// default finishes them one at a time.
    fn ack_and_finish_many(
        &self,
        finishing: Vec<(Self::Session, Vec<Acknowledgement>)>,
    ) -> impl Future<Output = Vec<Result<(u64, bool), Error>>> + Send {
        async move {
            let mut results = Vec::with_capacity(finishing.len());
            for (session, acks) in finishing {
                results.push(session.ack_and_finish(&acks, Outcome::Drained).await);
            }
            results
        }
    }

    /// Reads the rows of a replicated model's objects whose key column holds one of `keys`,
    /// as [`ShardSession::load_model`] reads one, for the deliveries of shards held by
    /// leases: one answer per key, in order (`None` where no row has the key). A backend may
    /// read them all in one statement; the relay reads every row its drains need at once
    /// this way. The default answers nothing (an empty list): each delivery then reads its
    /// own row through its session.
    fn load_models(
        &self,
        table: &ModelTable,
        keys: &[Id],
    ) -> impl Future<Output = Result<Vec<Option<ModelRow>>, Error>> + Send {
        let _ = (table, keys);
        async { Ok(Vec::new()) }
    }

    /// A stream of wake-ups on commit, if the backend has one (PostgreSQL's `LISTEN`).
    fn wakeups(&self) -> impl Future<Output = Result<Option<Self::Wakeups>, Error>> + Send;

    /// Extends `lease` by `duration` from now if it is still the holder's: what keeps a shard
    /// with a handler running longer than the lease (a heartbeat, from beside the handler).
    /// Returns whether the lease was still held. Never called in in-transaction mode.
    fn extend_lease(
        &self,
        lease: &Lease,
        duration: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Gives up `lease`, if it is still the holder's, on a shard whose drain the database
    /// interrupted: the lease lapses now rather than at its end, so the shard is due at once
    /// and its next claim is a takeover (it may have been delivered: see
    /// [`Lease::previous_owner`]). What a relay does once the database answers again.
    /// Returns whether the lease was still held.
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Makes shards parked on one of `known` categories due now, and no longer parked;
    /// returns how many. Relays call it at start-up and at each upkeep, so that a shard an
    /// older binary parks during a rolling deploy resumes without another restart.
    fn unpark(&self, known: &[CategoryId]) -> impl Future<Output = Result<u64, Error>> + Send;

    /// The id of the newest message in the outbox, if there is any: the bound of a pass that
    /// leaves later writes for the next one.
    fn newest_message_id(&self) -> impl Future<Output = Result<Option<MessageId>, Error>> + Send;

    /// How many messages of `shard` with ids up to `up_to` are pending (committed and not yet
    /// acknowledged): what a flush after commit still has to deliver there.
    fn pending_in_shard(
        &self,
        shard: &ShardKey,
        up_to: MessageId,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// How long the oldest pending message of a shard that is due or held has waited (by the
    /// database's clock); `None` if there is none. Shards backing off after a failure (and not
    /// made due by a newer message) and paused shards are skipped: reading in id order, the
    /// cost follows the rows of those ahead of the first due one. What
    /// [`Relay::health`](crate::Relay::health) reports as lag.
    fn oldest_due_age(&self) -> impl Future<Output = Result<Option<Duration>, Error>> + Send;

    /// Whether a pause holds `shard`: what a flush asks before it waits for a shard it
    /// could not claim.
    fn is_paused(&self, shard: &ShardKey) -> impl Future<Output = Result<bool, Error>> + Send;

    /// The outbox's state for the relay's gauges (see [`crate::telemetry`]): what
    /// [`Admin::status`] reads, without its deepest shards. Every relay reads it at every
    /// gauge interval, so its cost must not grow with the backlog: a store may estimate the
    /// figures of a large one (and says so, [`OutboxStatus::estimated`]).
    fn gauges(&self) -> impl Future<Output = Result<OutboxStatus, Error>> + Send;

    /// In paused shards, deletes up to `limit` rows of the `coalescing` categories that are
    /// neither the oldest nor the newest row of their group: what a long pause would otherwise
    /// pile up. The newest row carries the payload to deliver and the oldest keeps the
    /// group's place in the shard's order, so resuming delivers each group once, in
    /// order. Returns how many rows went. Cheap when nothing is paused.
    fn compact_paused(
        &self,
        coalescing: &[CategoryId],
        limit: usize,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// One tick of `model`'s backfill (see [`crate::backfill`]): records the model (and
    /// the version this binary's code declares) on its watermark, then, if the watermark's
    /// target calls for a walk that this code can do and no other worker holds the
    /// watermark, walks the next batch of [`batch_size`](crate::backfill::batch_size) rows
    /// above the low bound in key order, writes their outboxes and moves the watermark, in
    /// one transaction. Two workers never walk the same batch; a batch whose watermark write
    /// fails writes nothing ([`Error::BackfillWatermark`]).
    fn backfill(
        &self,
        model: &BackfillModel,
        options: &BackfillOptions,
    ) -> impl Future<Output = Result<BackfillBatch, Error>> + Send;

    /// Deletes up to `limit` dead letters set aside at least `age` ago (the oldest first);
    /// returns how many went. The relay's retention calls it in small batches.
    fn purge_dead_letters_older_than(
        &self,
        age: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Records a running relay's heartbeat (its row, by worker id, written anew), and deletes
    /// the rows of relays that stopped answering more than [`FORGET_RELAYS_AFTER`] ago.
    fn beat(&self, heartbeat: &Heartbeat) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deletes a stopping relay's row.
    fn leave(&self, worker: &str) -> impl Future<Output = Result<(), Error>> + Send;
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
    fn shard(
        &self,
        shard: &ShardKey,
    ) -> impl Future<Output = Result<Option<ShardInfo>, Error>> + Send;

    /// The shards that pass `filter`, deepest first, at most `limit`.
    fn shards(
        &self,
        filter: ShardFilter,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ShardInfo>, Error>> + Send;

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

/// A claimed shard: read its messages, acknowledge delivered groups, finish.
pub trait ShardSession: Send + 'static {
    /// The lease.
    fn lease(&self) -> &Lease;

    /// The oldest pending messages of the shard, in id order, at most `limit`.
    fn fetch(
        &mut self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StoredMessage>, Error>> + Send;

    /// For each group that has rows with ids in `after + 1 ..= up_to`, its newest such row and
    /// the ids of all of them, read at once (one snapshot): a row that is not yet visible (its
    /// transaction has not committed, whatever its id) is in neither.
    fn fetch_newest(
        &mut self,
        groups: &[GroupKey],
        after: MessageId,
        up_to: MessageId,
    ) -> impl Future<Output = Result<Vec<GroupTail>, Error>> + Send;

    /// Reads the row of a replicated model's object whose key column holds `key`, each of
    /// the table's columns with its value; `None` if there is no such row. In transaction
    /// mode, reads within the claiming transaction.
    fn load_model(
        &mut self,
        table: &ModelTable,
        key: Id,
    ) -> impl Future<Output = Result<Option<ModelRow>, Error>> + Send;

    /// The connection a handler may use: the claiming transaction's, in transaction mode.
    fn handler_connection(&mut self) -> Option<&mut (dyn Any + Send)>;

    /// Called before each handler: in transaction mode, a savepoint.
    fn before_handler(&mut self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Called after each handler: in transaction mode, keeps or rolls back its writes.
    fn after_handler(&mut self, succeeded: bool) -> impl Future<Output = Result<(), Error>> + Send;

    /// Deletes exactly the acknowledged rows (see [`Acknowledgement`]) and extends the lease,
    /// if the lease is still this session's; fails with [`Error::LeaseLost`] and deletes
    /// nothing otherwise.
    fn ack(
        &mut self,
        acknowledged: &[Acknowledgement],
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Moves the rows of a failing group (exactly `letter.rows.ids`) to the dead letters with
    /// the failure, deleting them from the outbox in the same transaction, and extends the
    /// lease: the shard's head moves past them and its attempts start again. Returns
    /// the rows moved. Fails with [`Error::LeaseLost`], moving nothing, if the lease is no
    /// longer this session's.
    fn dead_letter(
        &mut self,
        letter: &DeadLettering,
    ) -> impl Future<Output = Result<u64, Error>> + Send;

    /// Records the outcome and releases the shard.
    fn finish(self, outcome: Outcome) -> impl Future<Output = Result<(), Error>> + Send;

    /// [`ack`](Self::ack) then [`finish`](Self::finish), which a backend may do in one round
    /// trip: the relay's last step on a shard it drained. Returns the rows deleted, and whether
    /// the release still found the lease. Fails with [`Error::LeaseLost`], deleting nothing, if
    /// the acknowledgement did not.
    fn ack_and_finish(
        self,
        acknowledged: &[Acknowledgement],
        outcome: Outcome,
    ) -> impl Future<Output = Result<(u64, bool), Error>> + Send
    where
        Self: Sized,
    {
        ack_then_finish(self, acknowledged, outcome)
    }
}

/// [`ShardSession::ack_and_finish`] in two steps: what a session does when it has no single
/// round trip for them (and what its own implementation can fall back to).
pub async fn ack_then_finish<S: ShardSession>(
    mut session: S,
    acknowledged: &[Acknowledgement],
    outcome: Outcome,
) -> Result<(u64, bool), Error> {
    let rows = session.ack(acknowledged).await?;
    match session.finish(outcome).await {
        Ok(()) => Ok((rows, true)),
        Err(Error::LeaseLost { .. }) => Ok((rows, false)),
        Err(error) => Err(error),
    }
}

/// Notifications of committed messages.
pub trait WakeupStream: Send + 'static {
    /// Waits for the next wake-up. Errors mean the notification channel broke; the relay
    /// falls back to polling and asks again later.
    fn next(&mut self) -> impl Future<Output = Result<Wakeup, Error>> + Send;
}

/// A [`WakeupStream`] that never wakes: for backends without notifications.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoWakeups;

impl WakeupStream for NoWakeups {
    async fn next(&mut self) -> Result<Wakeup, Error> {
        std::future::pending().await
    }
}

/// The table in which the backends record the outbox migrations a database has applied
/// (never the application's own `_sqlx_migrations`).
pub const MIGRATIONS_TABLE: &str = "_outbox_migrations";

/// A migration a backend embeds in its binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddedMigration {
    /// The version, increasing.
    pub version: i64,
    /// What it does.
    pub description: &'static str,
    /// The SQL.
    pub sql: &'static str,
}

/// Compares the migrations a database has applied with those a backend embeds, for
/// [`Store::check_schema`]: every embedded version must be applied.
pub fn check_migrations(applied: &[i64], embedded: &[EmbeddedMigration]) -> Result<(), Error> {
    let missing: Vec<String> = embedded
        .iter()
        .filter(|migration| !applied.contains(&migration.version))
        .map(|migration| format!("{} ({})", migration.version, migration.description))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::MigrationMissing {
            detail: format!("migration(s) {} not applied", missing.join(", ")),
        })
    }
}
