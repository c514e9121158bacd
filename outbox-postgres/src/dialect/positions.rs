//! Where each shard's pending rows begin, so that a claim's head read seeks past the rows its
//! shard's earlier drains acknowledged instead of walking them.
//!
//! A deleted row stays in the table and its index, dead, until no snapshot can see it. While
//! something holds the vacuum horizon (a long `REPEATABLE READ` report, `pg_dump`, a lagging
//! replica or slot), every row acknowledged since it began stays, and a head read from a
//! shard's start visits each of them: its cost grows with the length of the hold. A read from
//! a shard's *position* (`id >` an id below which nothing of the shard is pending) visits none
//! of them.
//!
//! Ids are drawn at insert, not at commit: a row with a low id may commit after rows with
//! higher ids were read and acknowledged. A position is therefore never more than the
//! **settled frontier**: an id at or below which every row has committed or never will. It is
//! found from the id sequence and the lock table. Every transaction that inserts into
//! `outbox_messages` holds `RowExclusiveLock` on it from before it draws its id until it ends.
//! So once the sequence's last value `S` is read, and then every transaction holding that lock
//! is listed, `S` is settled when all of those have ended; readers (`pg_dump`, reports) take
//! only `AccessShareLock` and hold nothing back. A sequence that caches values in sessions
//! (`CACHE` above 1) hands out ids below `S` later: positions are then not used.
//!
//! After a drain that read its shard's every row and acknowledged them all, every row of the
//! shard with an id at or below `min(frontier before the claim, highest id acknowledged)` is
//! gone (the claim's read saw every settled row; a flush's bound stops at the acknowledged
//! rows): that is the shard's new position. Positions are facts that stay true (ids are never
//! reused), kept in this process only; losing them (a restart, another relay draining the
//! shard) costs a read from an older position, never a row.
//!
//! Positions are used while the horizon is held ([`Leases::held`](super::leases::Leases::held)):
//! while it is not, what a drain deletes is removed by vacuum, or marked dead in the index by
//! the next scan that meets it, and a head read from the shard's start costs no more; a
//! position then costs its bookkeeping for nothing. A shard's first claim after the horizon is
//! found held reads from its start and founds its position.
//!
//! One kind of row can land below a position: one written with an id of its own rather than
//! the sequence's (`OVERRIDING SYSTEM VALUE`, as a restore writes it). A whole discovery sweep
//! meets it: each of its pages says the lowest pending id of every shard it lists (the first
//! live entry of the shard's index, which the sweep reads anyway), and a position at or above
//! it is lowered below it ([`Positions::seen`]), so the shard's next claim reads the row. A
//! position is never re-read from the shard's start on a timer: under a held horizon such a
//! read walks every row the shard's drains acknowledged since the hold began, and reads of
//! every shard from its start, once a minute, made the claims of a 15-minute hold slower
//! with each minute.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use outbox_core::ShardKey;
use sqlx::PgPool;
use tracing::debug;

/// How often the frontier is sampled (at most).
const REFRESH: Duration = Duration::from_millis(100);

/// Shards whose positions are kept; past this the map starts again (positions are hints).
const MOST_SHARDS: usize = 200_000;

/// The id sequence's last value, and whether it caches ids in sessions (then no position is
/// safe).
const SEQUENCE: &str = "\
    SELECT coalesce(pg_sequence_last_value(q.seq), 0), \
        coalesce((SELECT seqcache FROM pg_sequence WHERE seqrelid = q.seq), 1) \
    FROM (SELECT pg_get_serial_sequence('outbox_messages', 'id')::regclass AS seq) q";

/// The transactions (other than this session's) that may be inserting into the outbox.
const WRITERS: &str = "\
    SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM pg_locks \
    WHERE locktype = 'relation' AND relation = 'outbox_messages'::regclass \
        AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
        AND mode = 'RowExclusiveLock' AND pid IS DISTINCT FROM pg_backend_pid()";

/// The frontier and the positions of the shards this process drained.
#[derive(Debug, Default)]
pub(crate) struct Positions {
    state: Mutex<State>,
    refreshing: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    /// Every id at or below it has committed or never will.
    settled: i64,
    /// A last value read, and the transactions that held the lock just after: it is settled
    /// when none of them holds it any more.
    pending: Option<(i64, Vec<String>)>,
    refreshed: Option<Instant>,
    /// The sequence caches ids: nothing is ever settled.
    disabled: bool,
    shards: HashMap<ShardKey, Position>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Position {
    /// Nothing of the shard at or below this id is pending (if `founded`).
    after: i64,
    /// A read from the shard's start founded `after`.
    founded: bool,
    /// How many times a sweep lowered `after` ([`Positions::seen`]).
    lowered: u64,
    /// The newest claim: its token, the frontier before it, whether it read from the shard's
    /// start, and `lowered` when it was made.
    claim: Option<(i64, i64, bool, u64)>,
}

impl Position {
    /// Where a claim made now reads from.
    fn after(&self) -> i64 {
        if self.founded { self.after } else { 0 }
    }
}

impl Positions {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Samples the frontier if it was not sampled in the last [`REFRESH`] (and nobody is
    /// sampling it now). Best effort: a failure leaves it where it was.
    pub(crate) async fn refresh(&self, pool: &PgPool) {
        let recent = self
            .state()
            .refreshed
            .is_some_and(|at| at.elapsed() < REFRESH);
        if !recent {
            self.sample(pool).await;
        }
    }

    /// Samples the frontier now (unless nobody may, or somebody is).
    pub(crate) async fn sample(&self, pool: &PgPool) {
        if self.state().disabled || self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let sampling = Sampling(&self.refreshing);
        let sampled = sample(pool).await;
        drop(sampling);
        match sampled {
            Ok(Some((last, writers))) => self.sampled(last, writers),
            Ok(None) => {
                debug!(
                    "the outbox's id sequence caches ids in sessions: heads are read from the start"
                );
                self.state().disabled = true;
            }
            Err(error) => {
                debug!(%error, "could not sample the settled frontier");
                self.state().refreshed = Some(Instant::now());
            }
        }
    }

    /// A sample: `last` read first, then `writers`.
    fn sampled(&self, last: i64, writers: Vec<String>) {
        let mut state = self.state();
        state.refreshed = Some(Instant::now());
        if let Some((value, waiting)) = &state.pending {
            if waiting.iter().any(|writer| writers.contains(writer)) {
                return;
            }
            state.settled = state.settled.max(*value);
        }
        if writers.is_empty() {
            state.settled = state.settled.max(last);
            state.pending = None;
        } else {
            state.pending = Some((last, writers));
        }
    }

    /// The frontier now, and where each of `shards` begins (0: its start).
    pub(crate) fn before_claim(&self, shards: &[ShardKey]) -> (i64, Vec<i64>) {
        let state = self.state();
        let afters = shards
            .iter()
            .map(|shard| state.shards.get(shard).map_or(0, Position::after))
            .collect();
        (state.settled, afters)
    }

    /// Claims made with the frontier at `settled`, each with its token and where it read
    /// from: each drain that empties its shard moves the shard's position
    /// ([`Positions::drained`]).
    pub(crate) fn claimed<'k>(
        &self,
        settled: i64,
        claims: impl Iterator<Item = (&'k ShardKey, i64, i64)>,
    ) {
        if settled <= 0 {
            return;
        }
        let mut state = self.state();
        for (shard, token, after) in claims {
            if state.shards.len() >= MOST_SHARDS && !state.shards.contains_key(shard) {
                state.shards.clear();
            }
            let position = state.shards.entry(shard.clone()).or_default();
            position.claim = Some((token, settled, after == 0, position.lowered));
        }
    }

    /// A whole sweep's page saw each shard's lowest pending id: a position at or above it
    /// (a row written below it with an id of its own) is lowered below it, so that the
    /// shard's next claim reads the row.
    pub(crate) fn seen<'k>(&self, lowest: impl Iterator<Item = (&'k ShardKey, i64)>) {
        let mut state = self.state();
        if state.shards.is_empty() {
            return;
        }
        for (shard, id) in lowest {
            if let Some(position) = state.shards.get_mut(shard)
                && position.founded
                && id <= position.after
            {
                position.after = id - 1;
                position.lowered += 1;
            }
        }
    }

    /// The claim `token` of `shard` emptied it, acknowledging up to `highest`.
    pub(crate) fn drained(&self, shard: &ShardKey, token: i64, highest: i64) {
        let mut state = self.state();
        if let Some(position) = state.shards.get_mut(shard)
            && let Some((claimed, settled, from_start, lowered)) = position.claim
            && claimed == token
        {
            // A sweep that lowered the position since the claim saw a row the claim may not
            // have read: the position stays where the sweep put it.
            if lowered == position.lowered {
                if from_start {
                    // Read from the start: the position is founded anew.
                    position.after = settled.min(highest);
                    position.founded = true;
                } else if position.founded {
                    position.after = position.after.max(settled.min(highest));
                }
            }
            position.claim = None;
        }
    }

    /// Where a claim of `shard` made now reads from, for tests.
    #[cfg(test)]
    pub(crate) fn after(&self, shard: &ShardKey) -> i64 {
        self.state().shards.get(shard).map_or(0, Position::after)
    }

    /// The frontier: every id at or below it has committed or never will (0: none known).
    pub(crate) fn settled(&self) -> i64 {
        self.state().settled
    }
}

/// A sample in flight: whoever drops it (having awaited it, or a claim cancelled while it
/// waited) lets the next one run.
struct Sampling<'a>(&'a AtomicBool);

impl Drop for Sampling<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The sequence's last value, then the writers: `None` if the sequence caches ids.
async fn sample(pool: &PgPool) -> Result<Option<(i64, Vec<String>)>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let (last, cache): (i64, i64) = sqlx::query_as(SEQUENCE).fetch_one(&mut *conn).await?;
    if cache > 1 {
        return Ok(None);
    }
    let (writers,): (Vec<String>,) = sqlx::query_as(WRITERS).fetch_one(&mut *conn).await?;
    Ok(Some((last, writers)))
}

#[cfg(test)]
pub(crate) mod tests;
