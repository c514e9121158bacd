//! What the relay reports: of a drain or flush, and of a run.

use super::parked::WaitingShard;
use super::shard::{DeadLettered, DrainEnd, ShardFailure, ShardRun};
use crate::model::ShardKey;

/// What a [`Relay::drain`](crate::Relay::drain) (or a flush) did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct DrainReport {
    /// How many shard claims were made.
    pub shards_claimed: u64,
    /// How many handler calls succeeded.
    pub deliveries: u64,
    /// How many rows were acknowledged (deleted), coalesced rows included.
    pub rows_acknowledged: u64,
    /// The deliveries that failed, each backing its shard off.
    pub failures: Vec<ShardFailure>,
    /// Shards whose lease lapsed and passed to another worker mid-drain.
    pub lost_leases: Vec<ShardKey>,
    /// Shards released with messages still pending because their row or time budget ran out
    /// (the relay's drains; a flush after commit has no budget): they stay due.
    pub yielded: Vec<ShardKey>,
    /// The failing groups set aside as dead letters by their category's policy.
    pub dead_lettered: Vec<DeadLettered>,
    /// Shards whose delivery found its system unreachable (a sink's breaker open): released
    /// with no attempt counted, still due. [`Relay::drain`](crate::Relay::drain) does not
    /// claim them again while the breaker stays open.
    pub unavailable: Vec<WaitingShard>,
}

impl DrainReport {
    /// Whether nothing failed, no lease was lost and no system was unreachable.
    pub fn is_clean(&self) -> bool {
        self.failures.is_empty() && self.lost_leases.is_empty() && self.unavailable.is_empty()
    }

    /// Whether shards were left with messages pending: failed, lost to another worker,
    /// waiting for an unreachable system, or out of budget.
    pub fn rows_remain(&self) -> bool {
        !self.is_clean() || !self.yielded.is_empty()
    }

    /// Adds a shard's drain, if the shard was claimed.
    pub(super) fn absorb(&mut self, run: Option<ShardRun>) {
        let Some(run) = run else {
            return;
        };
        self.shards_claimed += 1;
        self.deliveries += run.deliveries;
        self.rows_acknowledged += run.rows_acknowledged;
        if run.lost_lease() {
            self.lost_leases.push(run.shard.clone());
        }
        self.dead_lettered.extend(run.dead_lettered);
        match run.end {
            DrainEnd::Failed(failure) => self.failures.push(*failure),
            DrainEnd::Yielded => self.yielded.push(run.shard),
            DrainEnd::Unavailable(breaker) => self.unavailable.push(WaitingShard {
                shard: run.shard,
                breaker,
            }),
            DrainEnd::Drained | DrainEnd::LeaseLost | DrainEnd::ReleasedUnchanged => {}
        }
    }
}

/// What a [`Relay::run`](crate::Relay::run) did before it stopped.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// How many shard claims were made.
    pub shards_claimed: u64,
    /// How many handler calls succeeded.
    pub deliveries: u64,
    /// How many rows were acknowledged (deleted).
    pub rows_acknowledged: u64,
    /// How many deliveries failed.
    pub failures: u64,
    /// How many leases passed to another worker mid-drain.
    pub lost_leases: u64,
    /// How many failing groups were set aside as dead letters.
    pub dead_lettered: u64,
    /// How many drains ended on an unreachable system (a sink's breaker open), their shards
    /// parked until it answered.
    pub unavailable: u64,
    /// How many database errors the relay rode out.
    pub database_errors: u64,
    /// Shards still in flight when the shutdown deadline passed; their leases expire and
    /// another worker resumes them.
    pub abandoned: usize,
}

impl RunReport {
    /// Adds a shard's drain, if the shard was claimed.
    pub(super) fn absorb(&mut self, run: Option<&ShardRun>) {
        let Some(run) = run else {
            return;
        };
        self.shards_claimed += 1;
        self.deliveries += run.deliveries;
        self.rows_acknowledged += run.rows_acknowledged;
        self.failures += u64::from(run.failure().is_some());
        self.lost_leases += u64::from(run.lost_lease());
        self.dead_lettered += run.dead_lettered.len() as u64;
        self.unavailable += u64::from(matches!(run.end, DrainEnd::Unavailable(_)));
    }
}

/// What one round of the relay's upkeep ([`Relay::maintain`](crate::Relay::maintain)) did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MaintenanceReport {
    /// Rows of paused shards deleted because a newer row of their group carries the payload
    /// to deliver.
    pub compacted: u64,
    /// Dead letters purged for being older than the retention.
    pub purged_dead_letters: u64,
    /// Shards parked on a category this binary knows, made due.
    pub unparked: u64,
}
