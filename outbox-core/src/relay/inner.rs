//! The relay's shared state, and the steps its passes, flushes and runs share: claiming and
//! draining shards, upkeep, backfill ticks.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Notify, OnceCell, watch};
use tracing::{Instrument, debug, info, info_span};

use super::config::RelayConfig;
use super::health::Vitals;
use super::pool::ShardPool;
use super::report::MaintenanceReport;
use super::shard::{DrainMode, Emptied, Ending};
use super::slots::Lane;
use super::{Drained, pool, shard, slots, together, walk};
use crate::backfill::{BackfillBatch, BackfillOptions, BackfillOutcome};
use crate::error::Error;
use crate::model::ShardKey;
use crate::registry::Registry;
use crate::store::{ClaimOptions, HandlerMode, Lease, ShardSession, Store};

pub(super) struct Inner<S: Store> {
    pub(super) store: S,
    pub(super) registry: Registry,
    pub(super) config: RelayConfig,
    pub(super) claim: ClaimOptions,
    pub(super) wake: Notify,
    pub(super) prepared: OnceCell<()>,
    /// Leases of shards whose drain the database interrupted: released once it answers again.
    pub(super) interrupted: std::sync::Mutex<Vec<Lease>>,
    /// What [`Relay::health`] reports.
    pub(super) vitals: Vitals,
    /// The shards being claimed, and the drained shards being finished, together.
    pub(super) together: together::Together<S>,
    /// The turns of handlers: `max_concurrent_shards` run at once, whatever the shards held.
    pub(super) handler_slots: slots::Slots,
    /// How fast the handlers take their turns: how many shards to hold.
    pub(super) pace: pool::Pace,
    /// The rows that held shards may have read and not yet settled, one permit per row: two
    /// batches per handler slot, however many shards the relay holds.
    pub(super) rows_read: tokio::sync::Semaphore,
    /// The metrics' handles, resolved at the first delivery.
    pub(super) metrics: std::sync::OnceLock<crate::telemetry::RelayMetrics>,
    /// Whether the relay said that its leases lapse ([`Inner::lapsed`]).
    pub(super) lapse_told: std::sync::atomic::AtomicBool,
    /// The live latencies its urgent drains measure, which pace its backfill walks; `None`
    /// where it walks none, or at a fixed pace.
    pub(super) live: Option<walk::LiveLatency>,
}

/// The fewest claimed shards a task of the relay drains, when a claim's shards are shared among
/// the runtime's threads ([`Inner::drain_batch`]): below it, a task costs more than it shares.
const SHARDS_PER_TASK: usize = 16;

/// The rows one statement of the relay's upkeep deletes at most.
const MAINTENANCE_BATCH: usize = 500;

/// Runs `batch` until it deletes fewer than a whole batch; returns the total.
async fn in_batches<F, Fut>(mut batch: F) -> Result<u64, Error>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<u64, Error>>,
{
    let mut total = 0;
    loop {
        let deleted = batch(MAINTENANCE_BATCH).await?;
        total += deleted;
        if deleted < MAINTENANCE_BATCH as u64 {
            return Ok(total);
        }
    }
}

impl<S: Store> Inner<S> {
    /// Notes that `lease`, last set at `set` (by this relay's clock, before it asked), may
    /// have lapsed: its extension, asked at `asked`, took `waited` and landed past the
    /// lease's end, or found another worker holding the shard. Said once a relay, at error
    /// level, with what to do: a lapsed lease lets another worker deliver the shard while
    /// this one's handler still runs.
    pub(super) fn lapsed(
        &self,
        lease: &Lease,
        set: tokio::time::Instant,
        asked: tokio::time::Instant,
        waited: std::time::Duration,
    ) {
        if self
            .lapse_told
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let lease_ms = self.config.lease.as_millis() as u64;
        tracing::error!(
            shard = %lease.shard,
            token = lease.token,
            lease_ms,
            asked_ms_after_set = asked.saturating_duration_since(set).as_millis() as u64,
            waited_ms = waited.as_millis() as u64,
            "a lease of this relay lapsed while its handler ran: its extension landed after \
             the lease's end, so another worker may have delivered the shard at the same time; \
             this process was stalled or the database's write lock was held that long (said \
             once): set a lease longer than the longest such wait \
             (RelayConfigBuilder::lease)"
        );
    }

    /// The shards to hold at once now: what the handlers get through soon at their pace,
    /// within a claim's batch ([`pool::Pace`]).
    pub(super) fn shards_to_hold(&self) -> usize {
        let config = &self.config;
        self.pace
            .shards_to_hold(config.max_concurrent_shards, config.shards_held())
    }

    /// The rows of each shard's head to read with its claim: the rows that
    /// `max_concurrent_shards` full batches would hold, shared among the shards held now (at
    /// least two rows each, at most a batch: [`RelayConfig::head_limit`]). A relay holding
    /// hundreds of shards keeps a few rows of each in memory, not a batch of each; a shard
    /// whose head was cut short reads its batch when its turn comes.
    pub(super) fn head_limit(&self) -> usize {
        self.config.head_limit(self.shards_to_hold())
    }

    /// The metrics' handles (resolved from the recorder installed at the first call: install
    /// it before the relay delivers).
    pub(super) fn metrics(&self) -> &crate::telemetry::RelayMetrics {
        self.metrics
            .get_or_init(|| crate::telemetry::RelayMetrics::new(&self.registry))
    }

    /// See [`Relay::refresh_gauges`].
    pub(super) async fn refresh_gauges(&self) -> Result<(), Error> {
        match self.store.gauges().await {
            Ok(status) => {
                crate::telemetry::gauges(&status, std::time::SystemTime::now());
                Ok(())
            }
            Err(error) => {
                crate::telemetry::database_error("gauges");
                Err(error)
            }
        }
    }

    /// See [`Relay::backfill`]: a tick of every model's walk, at most `budget` rows each.
    pub(super) async fn backfill(&self, budget: usize) -> Result<Vec<BackfillBatch>, Error> {
        let options = BackfillOptions {
            worker: self.config.worker_id.clone(),
            budget,
        };
        let mut batches = Vec::new();
        let mut first_error = None;
        for model in self.registry.backfill_models() {
            match self.store.backfill(&model, &options).await {
                Ok(batch) => {
                    crate::telemetry::backfilled(&batch);
                    if let BackfillOutcome::Walked {
                        version,
                        rows,
                        complete,
                        ..
                    } = batch.outcome
                    {
                        debug!(model = model.name, version, rows, "backfill batch walked");
                        if complete {
                            info!(model = model.name, version, "backfill complete");
                        }
                    }
                    batches.push(batch);
                }
                Err(error) => {
                    crate::telemetry::backfill_failed(model.name);
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(batches), Err)
    }

    /// See [`Relay::maintain`].
    pub(super) async fn maintain(&self) -> Result<MaintenanceReport, Error> {
        let coalescing = self.registry.coalescing_category_ids();
        let mut report = MaintenanceReport {
            unparked: self.unpark().await?,
            ..MaintenanceReport::default()
        };
        if !coalescing.is_empty() {
            report.compacted =
                in_batches(|limit| self.store.compact_paused(&coalescing, limit)).await?;
        }
        if let Some(age) = self.config.dead_letter_retention {
            report.purged_dead_letters =
                in_batches(|limit| self.store.purge_dead_letters_older_than(age, limit)).await?;
        }
        if report.compacted > 0 || report.purged_dead_letters > 0 {
            info!(
                compacted = report.compacted,
                purged_dead_letters = report.purged_dead_letters,
                "relay upkeep"
            );
        }
        Ok(report)
    }

    /// Makes the shards parked on a category this binary knows due, and says so once;
    /// returns how many.
    pub(super) async fn unpark(&self) -> Result<u64, Error> {
        let known = self.registry.category_ids();
        let unparked = self.store.unpark(&known).await?;
        if unparked > 0 {
            info!(
                unparked,
                "resumed shards parked on categories this binary knows"
            );
        }
        Ok(unparked)
    }

    /// Checks the schema and un-parks shards waiting for a category this binary knows.
    /// Runs once per relay.
    pub(super) async fn prepare(&self) -> Result<(), Error> {
        self.prepared
            .get_or_try_init(|| async {
                self.store.check_schema().await?;
                self.unpark().await?;
                Ok::<_, Error>(())
            })
            .await
            .map(|_| ())
    }

    /// [`Inner::drain_shard`] as a task of a [`ShardPool`].
    pub(super) async fn drain_owned(
        self: Arc<Self>,
        shard: ShardKey,
        stopping: watch::Receiver<bool>,
        mode: DrainMode,
    ) -> Drained {
        self.drain_shard(&shard, &stopping, mode).await
    }

    /// Claims `shard` if it is due and free, and drains it.
    pub(super) async fn drain_shard(
        &self,
        shard: &ShardKey,
        stopping: &watch::Receiver<bool>,
        mode: DrainMode,
    ) -> Drained {
        let asked = tokio::time::Instant::now();
        let Some(session) = self.store.claim(shard, &self.claim).await? else {
            return Ok(None);
        };
        self.drain_claimed(session, asked, stopping, mode, Lane::Routine)
            .await
    }

    /// Claims as many of `due` as `pool` has free permits for (waiting for one), front first,
    /// and starts draining them: [`Inner::start_claimed`] after [`ShardPool::permits`].
    pub(super) async fn start_many(
        self: &Arc<Self>,
        pool: &mut ShardPool<Drained>,
        due: &mut Vec<ShardKey>,
        mode: DrainMode,
    ) {
        pool.to_start(due, |_| true);
        let permits = pool.permits(due.len(), self.shards_to_hold()).await;
        self.start_claimed(pool, due, permits, mode, Lane::Routine);
    }

    /// Starts draining one of `due` (none of which the pool is draining) per permit, front
    /// first, in one task of the pool: it claims them together with every other shard being
    /// started meanwhile ([`together::Together::claim`]: one call to [`Store::claim_many`],
    /// one round trip that reads each shard's head too, on PostgreSQL), then drains those
    /// claimed concurrently ([`Inner::drain_batch`]). The caller does not wait for the claim.
    pub(super) fn start_claimed(
        self: &Arc<Self>,
        pool: &mut ShardPool<Drained>,
        due: &mut Vec<ShardKey>,
        permits: Vec<tokio::sync::OwnedSemaphorePermit>,
        mode: DrainMode,
        lane: Lane,
    ) {
        let batch: Vec<_> = due
            .drain(..permits.len().min(due.len()))
            .zip(permits)
            .collect();
        let head = self.head_limit();
        let (inner, stopping) = (Arc::clone(self), pool.stopping());
        pool.spawn_many(batch, move |shards, ends| async move {
            // Boxed: the task is made and moved whole at every claim.
            Box::pin(inner.drain_batch(shards, ends, stopping, mode, lane, head)).await;
        });
    }

    /// Claims `shards` and drains those claimed, concurrently, each shard's end reported as
    /// it comes, so that one slow shard holds none of the others. A shard not claimed ends at
    /// once; a failed claim is the error of one of the shards. The claimed shards are shared
    /// among as many tasks as the runtime has threads, at least [`SHARDS_PER_TASK`] each: a
    /// claim's handlers run on every thread, not only on this task's.
    pub(super) async fn drain_batch(
        self: Arc<Self>,
        shards: Vec<ShardKey>,
        mut ends: pool::Ends<Drained>,
        stopping: watch::Receiver<bool>,
        mode: DrainMode,
        lane: Lane,
        head: usize,
    ) {
        let asked = tokio::time::Instant::now();
        let claimed = self
            .together
            .claim(&self.store, shards.clone(), &self.claim, head, lane)
            .await;
        let mut sessions = Vec::with_capacity(claimed.len());
        for (shard, claimed) in shards.into_iter().zip(claimed) {
            match claimed {
                Ok(Some(session)) => sessions.push((shard, session)),
                Ok(None) => ends.end(shard, Ok(None)),
                Err(error) => ends.end(shard, Err(error)),
            }
        }
        let threads = tokio::runtime::Handle::current().metrics().num_workers();
        let tasks = threads.min(sessions.len().div_ceil(SHARDS_PER_TASK));
        if tasks <= 1 {
            return self
                .drain_sessions(sessions, asked, ends, &stopping, mode, lane)
                .await;
        }
        // Every part in a task of its own, this one waiting for them: the runtime runs a task
        // spawned last on its spawner's thread next, and no other thread may take it, so that
        // a part kept here, or spawned alone, would share this thread.
        let mut parts = tokio::task::JoinSet::new();
        for part in 0..tasks {
            let share = sessions.len() * (tasks - part - 1) / (tasks - part);
            let theirs = sessions.split_off(share);
            let (inner, their_ends, stopping) = (
                Arc::clone(&self),
                ends.split(theirs.len()),
                stopping.clone(),
            );
            parts.spawn(async move {
                Box::pin(inner.drain_sessions(theirs, asked, their_ends, &stopping, mode, lane))
                    .await;
            });
        }
        // Dropped with this task (aborted at shutdown), the parts are aborted too.
        while let Some(done) = parts.join_next().await {
            pool::joined(done);
        }
    }

    /// Drains claimed shards concurrently, in this task, reporting each shard's end as it
    /// comes. The shards emptied at once are acknowledged and released in one batch
    /// ([`Emptied::finish_together`]), while the others go on. `asked`: when the claim was
    /// asked for (its leases run from no earlier).
    ///
    /// Each drain is polled once as it is made: most drains of a shard of one message end
    /// there (their handler answers at once), and only those that wait are kept in a set to
    /// be polled again.
    pub(super) async fn drain_sessions(
        &self,
        sessions: Vec<(ShardKey, S::Session)>,
        asked: tokio::time::Instant,
        mut ends: pool::Ends<Drained>,
        stopping: &watch::Receiver<bool>,
        mode: DrainMode,
        lane: Lane,
    ) {
        use futures_util::{FutureExt, StreamExt};
        use std::task::Poll;
        if !sessions.is_empty() {
            self.vitals.claimed();
        }
        let mut emptied = Vec::with_capacity(sessions.len());
        let mut drains = futures_util::stream::FuturesUnordered::new();
        for (shard, session) in sessions {
            let lease = session.lease().clone();
            // Boxed, so that a drain that waits is a small future in the set (a few
            // kilobytes each on PostgreSQL, unboxed).
            let mut ending = Box::pin(self.drain_to_ending(session, asked, stopping, mode, lane));
            match std::future::poll_fn(|cx| Poll::Ready(ending.as_mut().poll(cx))).await {
                Poll::Ready(ending) => self.ended(&mut ends, &mut emptied, shard, &lease, ending),
                Poll::Pending => drains.push(async move { (shard, lease, ending.await) }),
            }
        }
        let mut finishing = futures_util::stream::FuturesUnordered::new();
        loop {
            if self.config.handler_mode == HandlerMode::InTransaction {
                // Each claiming transaction commits alone: none waits for another's.
                for one in emptied.drain(..) {
                    finishing.push(self.finish_emptied(vec![one]));
                }
            } else if !emptied.is_empty() {
                let room = Vec::with_capacity(drains.len());
                finishing.push(self.finish_emptied(std::mem::replace(&mut emptied, room)));
            }
            tokio::select! {
                biased;
                Some(finished) = finishing.next() => ends.end_all(finished),
                Some(first) = drains.next() => {
                    // With the drains that are ready now: one batch of those they emptied.
                    let mut next = Some(first);
                    while let Some((shard, lease, ending)) = next {
                        self.ended(&mut ends, &mut emptied, shard, &lease, ending);
                        next = drains.next().now_or_never().flatten();
                    }
                }
                else => return,
            }
        }
    }

    /// Takes in the end of `shard`'s drain: a shard it emptied joins `emptied`, to be
    /// finished with the others; any other end is reported.
    fn ended<'a>(
        &self,
        ends: &mut pool::Ends<Drained>,
        emptied: &mut Vec<(ShardKey, Emptied<'a, S>)>,
        shard: ShardKey,
        lease: &Lease,
        ending: Result<Ending<'a, S>, Error>,
    ) {
        match ending {
            Ok(Ending::Emptied(one)) => emptied.push((shard, one)),
            Ok(Ending::Ended(run)) => ends.end(shard, Ok(Some(run))),
            Err(error) => ends.end(shard, self.interrupted_drain(lease, error)),
        }
    }

    /// Acknowledges and releases the shards of `emptied` in one batch: each shard's end.
    async fn finish_emptied(
        &self,
        emptied: Vec<(ShardKey, Emptied<'_, S>)>,
    ) -> Vec<(ShardKey, Drained)> {
        Emptied::finish_together(emptied)
            .await
            .into_iter()
            .map(|(shard, run)| {
                let drained = match run {
                    Ok(run) => Ok(Some(run)),
                    Err(interrupted) => {
                        let (error, lease) = *interrupted;
                        self.interrupted_drain(&lease, error)
                    }
                };
                (shard, drained)
            })
            .collect()
    }

    /// Drains a claimed shard. A drain the database interrupted leaves its lease to be
    /// released once the database answers again, rather than leave the shard to wait for the
    /// lease to lapse.
    pub(super) async fn drain_claimed(
        &self,
        session: S::Session,
        asked: tokio::time::Instant,
        stopping: &watch::Receiver<bool>,
        mode: DrainMode,
        lane: Lane,
    ) -> Drained {
        self.vitals.claimed();
        let lease = session.lease().clone();
        let ran = match self
            .drain_to_ending(session, asked, stopping, mode, lane)
            .await
        {
            Ok(Ending::Ended(run)) => Ok(run),
            Ok(Ending::Emptied(emptied)) => Box::pin(emptied.finish()).await,
            Err(error) => Err(error),
        };
        match ran {
            Ok(run) => Ok(Some(run)),
            Err(error) => self.interrupted_drain(&lease, error),
        }
    }

    /// Drains a claimed shard until its drain ends or empties it ([`shard::drain`]), in the
    /// drain's span.
    async fn drain_to_ending<'a>(
        &'a self,
        session: S::Session,
        asked: tokio::time::Instant,
        stopping: &'a watch::Receiver<bool>,
        mode: DrainMode,
        lane: Lane,
    ) -> Result<Ending<'a, S>, Error> {
        let shard = &session.lease().shard;
        let span = info_span!(
            "outbox.drain_shard",
            scope = shard.scope.0,
            shard = %shard.shard_identifier,
            destination = shard.destination_str(),
        );
        shard::drain(session, self, stopping, mode, lane, asked)
            .instrument(crate::telemetry::recorded(span))
            .await
    }

    /// The end of a drain the database interrupted with `error`: its lease is released once
    /// the database answers again ([`Inner::release_interrupted`]), rather than left to lapse.
    fn interrupted_drain(&self, lease: &Lease, error: Error) -> Drained {
        self.interrupted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(lease.clone());
        Err(error)
    }

    /// Releases the leases of shards whose drain the database interrupted (see
    /// [`Store::release`]); those it cannot release yet are kept for the next call.
    pub(super) async fn release_interrupted(&self) {
        let leases = std::mem::take(
            &mut *self
                .interrupted
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if leases.is_empty() {
            return;
        }
        let mut released = 0usize;
        let mut leases = leases.into_iter();
        while let Some(lease) = leases.next() {
            match self.store.release(&lease).await {
                Ok(held) => released += usize::from(held),
                Err(error) => {
                    debug!(error = %crate::error::error_chain(&error), "cannot release interrupted shards yet");
                    self.interrupted
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .extend(std::iter::once(lease).chain(leases));
                    break;
                }
            }
        }
        if released > 0 {
            info!(
                released,
                "released the shards whose drain the database interrupted"
            );
        }
    }
}
