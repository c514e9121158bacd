//! The storage contract the relay drives and every backend implements.
//!
//! Core knows no SQL: a backend (`outbox-postgres`, `outbox-sqlite`, or a third party's) turns
//! these operations into statements. The conformance suite in `outbox-testkit` proves that a
//! backend implements them with the semantics the relay relies on.

use std::any::Any;
use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::backfill::{BackfillBatch, BackfillModel, BackfillOptions};
use crate::columns::ModelRow;
use crate::error::Error;
use crate::id::Id;
use crate::model::{CategoryId, MessageId, ScopeId, ShardKey};
use crate::replicated::ModelTable;

mod operations;

pub use self::operations::{
    Admin, DeadLetter, DeadLetterFilter, DeadLettering, FORGET_RELAYS_AFTER, Heartbeat, Horizon,
    NextRetry, OutboxStatus, Pause, PauseTarget, PendingMessage, RelayInfo, ShardFilter, ShardInfo,
    ShardList, ShardQuery, ShardState, ShardStatus,
};

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

    /// A stream of wake-ups on commit, if the backend has one: of the commits announced in
    /// this process, and if `other_processes`, of those of other processes too (PostgreSQL's
    /// `LISTEN`, which holds a connection of its own; see
    /// [`RelayConfigBuilder::listen_for_other_processes`](crate::RelayConfigBuilder::listen_for_other_processes)).
    fn wakeups(
        &self,
        other_processes: bool,
    ) -> impl Future<Output = Result<Option<Self::Wakeups>, Error>> + Send;

    /// Extends `lease` by `duration` from now if it is still the holder's: what keeps a shard
    /// with a handler running longer than the lease (a heartbeat, from beside the handler).
    /// Returns whether the lease was still held. Never called in in-transaction mode.
    fn extend_lease(
        &self,
        lease: &Lease,
        duration: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Extends each of `leases` by `duration` from now if it is still the holder's, as
    /// [`extend_lease`](Store::extend_lease) extends one: whether each was still held, in
    /// order. The relay extends the leases of all the shards it keeps at one moment this way
    /// (a batch of heartbeats); a backend with one writer at a time (SQLite) should write
    /// them in one transaction that goes before its other queued writes, so that a relay
    /// holding many shards takes the write lock once per heartbeat, not once per shard. An
    /// error is the whole batch's. The default extends them one at a time.
    fn extend_leases(
        &self,
        leases: &[Lease],
        duration: Duration,
    ) -> impl Future<Output = Result<Vec<bool>, Error>> + Send {
        async move {
            let mut held = Vec::with_capacity(leases.len());
            for lease in leases {
                held.push(self.extend_lease(lease, duration).await?);
            }
            Ok(held)
        }
    }

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
