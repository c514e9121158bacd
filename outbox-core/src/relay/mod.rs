//! The relay: finds due shards, claims them, delivers their messages, records the outcome.
//!
//! Its words, used the same way in names and docs:
//!
//! - to **drain** a shard is to claim it, deliver its groups in order until it is empty (up
//!   to a bound, for a flush), a delivery fails, its budget is spent or the relay stops, and
//!   release it recording how that ended;
//! - a **pass** walks discovery over every shard once, drains each due shard once, and waits
//!   for those drains: [`Relay::drain`] runs passes until one claims nothing,
//!   [`Relay::flush_due`] runs one bounded pass;
//! - a **sweep** is the background relay's walk of discovery over every shard: it starts the
//!   due shards' drains in its pool without waiting for them, and when a whole sweep found
//!   nothing due, [`Relay::run`] waits for a commit, a wake or the poll interval.
//!
//! The relay's pool bounds how many shards drain at once, in a pass, a flush or a run (a
//! claim's batch); their handlers take turns, `max_concurrent_shards` at once.
//!
//! Here too are what its runs report ([`DrainReport`], [`RunReport`], [`MaintenanceReport`],
//! [`FlushError`]), its health ([`Health`]) and how its delivery spans relate to the
//! writer's trace ([`TraceRelation`]).

mod config;
mod deliver;
mod flush;
mod health;
mod parked;
mod plan;
mod pool;
mod report;
mod run;
mod shard;
mod slots;
mod together;

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Notify, OnceCell, watch};
use tracing::{Instrument, debug, info, info_span};

pub use self::config::{Backoff, RelayConfig, RelayConfigBuilder};
pub use self::flush::{FlushError, Undelivered};
pub use self::health::Health;
use self::health::Vitals;
use self::parked::ParkedShards;
pub use self::parked::WaitingShard;
use self::pool::ShardPool;
pub use self::report::{DrainReport, MaintenanceReport, RunReport};
use self::run::RunLoop;
pub use self::shard::{DeadLettered, ShardFailure};
use self::shard::{DrainMode, ShardRun};
use self::slots::Lane;
use crate::backfill::{BackfillBatch, BackfillOptions, BackfillOutcome};
use crate::error::Error;
use crate::model::ShardKey;
use crate::registry::Registry;
use crate::store::{ClaimOptions, Lease, ShardSession, Store};
pub use crate::trace::TraceRelation;

/// How a shard's drain task ended: its run if the shard was claimed (`None` if it was not
/// due, or held by another worker), or the error that interrupted it.
type Drained = Result<Option<ShardRun>, Error>;

/// Delivers outbox messages: the backend-agnostic engine.
///
/// Cheap to clone; clones share the store, registry and configuration.
///
/// A service runs it in the background until shutdown ([`Relay::run`]); a job, a test or a
/// command delivers what is due and returns ([`Relay::drain`]); a request handler delivers
/// what its own transaction wrote before it answers ([`Relay::flush`]).
///
/// ```
/// use std::time::Duration;
///
/// use outbox_core::memory::MemoryStore;
/// use outbox_core::{Registry, Relay, RelayConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A backend's store (`outbox_postgres::PgStore::new(pool)`); here the in-memory one.
/// let store = MemoryStore::new();
/// let config = RelayConfig::builder()
///     .max_concurrent_shards(32)
///     .poll_interval(Duration::from_millis(500))
///     .build()?;
/// let relay = Relay::with_config(store, Registry::builder().build()?, config);
///
/// // Everything due now, delivered; then it returns.
/// let report = relay.drain().await?;
/// assert_eq!(report.rows_acknowledged, 0);
///
/// // In the background until shutdown (in a service: `relay.run(shutdown_signal())`).
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let background = relay.clone();
/// let running = tokio::spawn(async move {
///     background.run(async { stopped.await.unwrap_or(()) }).await
/// });
/// stop.send(()).ok();
/// running.await??;
/// # Ok(())
/// # }
/// ```
pub struct Relay<S: Store> {
    inner: Arc<Inner<S>>,
}

impl<S: Store> Clone for Relay<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: Store> std::fmt::Debug for Relay<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("config", &self.inner.config)
            .field("registry", &self.inner.registry)
            .finish_non_exhaustive()
    }
}

struct Inner<S: Store> {
    store: S,
    registry: Registry,
    config: RelayConfig,
    claim: ClaimOptions,
    wake: Notify,
    prepared: OnceCell<()>,
    /// Leases of shards whose drain the database interrupted: released once it answers again.
    interrupted: std::sync::Mutex<Vec<Lease>>,
    /// What [`Relay::health`] reports.
    vitals: Vitals,
    /// The shards being claimed, and the drained shards being finished, together.
    together: together::Together<S>,
    /// The turns of handlers: `max_concurrent_shards` run at once, whatever the shards held.
    handler_slots: slots::Slots,
    /// How fast the handlers take their turns: how many shards to hold.
    pace: pool::Pace,
    /// The rows that held shards may have read and not yet settled, one permit per row: two
    /// batches per handler slot, however many shards the relay holds.
    rows_read: tokio::sync::Semaphore,
    /// The metrics' handles, resolved at the first delivery.
    metrics: std::sync::OnceLock<crate::telemetry::RelayMetrics>,
}

impl<S: Store> Relay<S> {
    /// A relay with the default configuration.
    pub fn new(store: S, registry: Registry) -> Self {
        Self::with_config(store, registry, RelayConfig::default())
    }

    /// A relay with the given configuration (checked when it was built: see
    /// [`RelayConfig::builder`]).
    pub fn with_config(store: S, registry: Registry, config: RelayConfig) -> Self {
        let claim = ClaimOptions {
            worker: config.worker_id.clone(),
            lease: config.lease,
            mode: config.handler_mode,
        };
        let handler_slots = slots::Slots::new(config.max_concurrent_shards);
        let rows_read = tokio::sync::Semaphore::new(
            config
                .rows_per_turns()
                .saturating_mul(2)
                .min(tokio::sync::Semaphore::MAX_PERMITS),
        );
        Self {
            inner: Arc::new(Inner {
                store,
                registry,
                config,
                claim,
                wake: Notify::new(),
                prepared: OnceCell::new(),
                interrupted: std::sync::Mutex::default(),
                vitals: Vitals::default(),
                together: together::Together::default(),
                handler_slots,
                pace: pool::Pace::default(),
                rows_read,
                metrics: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The registry.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The configuration.
    pub fn config(&self) -> &RelayConfig {
        &self.inner.config
    }

    /// Wakes a running relay now, as a commit notification would: for backends without
    /// notifications, call it after committing outbox writes to cut latency below the poll
    /// interval.
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// Delivers everything that is due, then returns: passes until one claims nothing. Shards
    /// in backoff are left for later, and failures are reported, not returned as errors.
    /// Shards are drained concurrently, claimed in batches of up to `claim_batch`, their
    /// handlers up to `max_concurrent_shards` at once. For tests, examples and
    /// one-shot jobs.
    ///
    /// Fails if the schema is not migrated or the database fails; work already acknowledged
    /// stays acknowledged, and in-flight leases expire.
    pub async fn drain(&self) -> Result<DrainReport, Error> {
        self.inner.prepare().await?;
        let mut report = DrainReport::default();
        let mut parked = ParkedShards::default();
        loop {
            let claimed_before = report.shards_claimed;
            let unavailable_before = report.unavailable.len();
            self.pass(DrainMode::Relay, &mut report, &parked).await?;
            if report.shards_claimed == claimed_before {
                return Ok(report);
            }
            for waiting in &report.unavailable[unavailable_before..] {
                parked.park(waiting.shard.clone(), waiting.breaker.clone());
            }
        }
    }

    /// One pass: every due shard drained once, in `mode`, concurrently, after the leases an
    /// outage interrupted are released (their shards are due in this pass).
    async fn pass(
        &self,
        mode: DrainMode,
        report: &mut DrainReport,
        parked: &ParkedShards,
    ) -> Result<(), Error> {
        let config = &self.inner.config;
        let mut pool = match mode {
            DrainMode::Relay => ShardPool::relays(config),
            DrainMode::Flush { .. } => ShardPool::flushes(config),
        };
        let mut first_error = None;
        let mut cursor: Option<ShardKey> = None;
        // Leases an outage interrupted are given up first, so that this pass finds their
        // shards due (if the database still does not answer, they wait for the next).
        self.inner.release_interrupted().await;
        loop {
            let page = match self
                .inner
                .store
                .discover(cursor.as_ref(), config.discovery_page)
                .await
            {
                Ok(page) => page,
                Err(error) => {
                    first_error = Some(error);
                    break;
                }
            };
            let mut due = page.due;
            due.retain(|shard| !parked.holds(shard));
            while !due.is_empty() {
                self.inner.start_many(&mut pool, &mut due, mode).await;
                while let Some((_, drained)) = pool.finished() {
                    collect(drained, report, &mut first_error);
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        while let Some((_, drained)) = pool.next_finished().await {
            collect(drained, report, &mut first_error);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The relay's health, for a service's liveness and readiness probes (see [`Health`]):
    /// whether [`Relay::run`] runs, when this relay last claimed a shard and acknowledged
    /// messages, the shards it drains now, and, from one query to the database (which says
    /// whether it answers), how long the oldest message of a due shard has waited. That query
    /// reads pending rows in id order, skipping those of shards backing off or paused ahead of
    /// the first due one: cheap while the relays keep up. Never fails: a database that does
    /// not answer is [`Health::database_reachable`] `false`.
    pub async fn health(&self) -> Health {
        let lag = self
            .inner
            .store
            .oldest_due_age()
            .await
            .map_err(|error| crate::error::error_chain(&error));
        self.inner
            .vitals
            .health(lag, self.inner.prepared.initialized())
    }

    /// The relay's upkeep, once (what [`Relay::run`] does every
    /// [`maintenance_interval`](RelayConfigBuilder::maintenance_interval)): in paused shards,
    /// deletes the rows of coalescing groups that a newer row of the group makes redundant,
    /// keeping each group's oldest and newest rows so that resuming delivers each group once,
    /// in order; and purges the dead letters older than the
    /// [`dead_letter_retention`](RelayConfigBuilder::dead_letter_retention), if one is set.
    /// Each works in batches of a few hundred rows, one short statement each.
    pub async fn maintain(&self) -> Result<MaintenanceReport, Error> {
        self.inner.maintain().await
    }

    /// Reads the outbox's state with one query ([`Store::gauges`]) and sets the gauges of
    /// [`telemetry`](crate::telemetry) from it: what [`Relay::run`] does every
    /// [`gauge_interval`](RelayConfigBuilder::gauge_interval).
    pub async fn refresh_gauges(&self) -> Result<(), Error> {
        self.inner.refresh_gauges().await
    }

    /// One tick of the backfills (see [`crate::backfill`]), what [`Relay::run`] does
    /// every [`backfill_interval`](RelayConfigBuilder::backfill_interval): for each
    /// replicated model of the registry, in category order, walks the next batch of its
    /// backfill if an operator started one that this binary's code can walk and no other
    /// relay holds it ([`Store::backfill`]). Returns each model's batch; the first error, if
    /// a model's tick failed (the others still ticked, and the failure is recorded on its
    /// watermark).
    pub async fn backfill(&self) -> Result<Vec<BackfillBatch>, Error> {
        self.inner.prepare().await?;
        self.inner.backfill().await
    }

    /// Drains the given shards once each (if they are due and unclaimed), concurrently.
    pub async fn drain_shards(&self, shards: &[ShardKey]) -> Result<DrainReport, Error> {
        self.inner.prepare().await?;
        let mut pool = ShardPool::relays(&self.inner.config);
        for shard in shards {
            self.start(&mut pool, shard.clone(), DrainMode::Relay).await;
        }
        let mut report = DrainReport::default();
        let mut first_error = None;
        while let Some((_, drained)) = pool.next_finished().await {
            collect(drained, &mut report, &mut first_error);
        }
        first_error.map_or(Ok(report), Err)
    }

    /// Starts draining `shard` in `pool`, once a permit is free.
    async fn start(&self, pool: &mut ShardPool<Drained>, shard: ShardKey, mode: DrainMode) {
        let (inner, stopping, key) = (Arc::clone(&self.inner), pool.stopping(), shard.clone());
        pool.start(shard, move || {
            Inner::drain_owned(inner, key, stopping, mode)
        })
        .await;
    }

    /// Runs until `shutdown` completes: sweeps for due shards, drains them concurrently, and
    /// waits for commits (or polls) when a sweep found nothing. Rides out database outages,
    /// reconnecting with backoff. On shutdown, stops claiming and gives in-flight shards until
    /// the shutdown deadline to finish their current delivery and release; shards still
    /// running then are abandoned (their leases expire, nothing is lost).
    ///
    /// Fails only if the schema is missing or outdated.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RunReport, Error> {
        tokio::pin!(shutdown);
        // Boxed: the loop's state lives across every await of its steps, and would make the
        // future of every caller of `run` as large.
        Box::pin(RunLoop::new(&self.inner, shutdown).run()).await
    }
}

/// Adds a drain to a pass's report, or keeps its error (the first).
fn collect(drained: Drained, report: &mut DrainReport, first_error: &mut Option<Error>) {
    match drained {
        Ok(run) => report.absorb(run),
        Err(error) => {
            first_error.get_or_insert(error);
        }
    }
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
    /// The shards to hold at once now: what the handlers get through soon at their pace,
    /// within a claim's batch ([`pool::Pace`]).
    pub(super) fn shards_to_hold(&self) -> usize {
        let config = &self.config;
        self.pace
            .shards_to_hold(config.max_concurrent_shards, config.shards_held())
    }

    /// The rows of each shard's head to read with its claim: the rows that
    /// `max_concurrent_shards` full batches would hold, shared among the shards held now (at
    /// least one row each, at most a batch). A relay holding hundreds of shards keeps a few
    /// rows of each in memory, not a batch of each; a shard whose head was cut short reads
    /// its batch when its turn comes.
    pub(super) fn head_limit(&self) -> usize {
        let config = &self.config;
        (config.rows_per_turns() / self.shards_to_hold().max(1)).clamp(1, config.batch_size)
    }

    /// The metrics' handles (resolved from the recorder installed at the first call: install
    /// it before the relay delivers).
    pub(super) fn metrics(&self) -> &crate::telemetry::RelayMetrics {
        self.metrics
            .get_or_init(|| crate::telemetry::RelayMetrics::new(&self.registry))
    }

    /// See [`Relay::refresh_gauges`].
    async fn refresh_gauges(&self) -> Result<(), Error> {
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

    /// See [`Relay::backfill`].
    async fn backfill(&self) -> Result<Vec<BackfillBatch>, Error> {
        let options = BackfillOptions {
            worker: self.config.worker_id.clone(),
            budget: self.config.backfill_budget,
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
    async fn maintain(&self) -> Result<MaintenanceReport, Error> {
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
    async fn unpark(&self) -> Result<u64, Error> {
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
    async fn prepare(&self) -> Result<(), Error> {
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
    async fn drain_owned(
        self: Arc<Self>,
        shard: ShardKey,
        stopping: watch::Receiver<bool>,
        mode: DrainMode,
    ) -> Drained {
        self.drain_shard(&shard, &stopping, mode).await
    }

    /// Claims `shard` if it is due and free, and drains it.
    async fn drain_shard(
        &self,
        shard: &ShardKey,
        stopping: &watch::Receiver<bool>,
        mode: DrainMode,
    ) -> Drained {
        let Some(session) = self.store.claim(shard, &self.claim).await? else {
            return Ok(None);
        };
        self.drain_claimed(session, stopping, mode, Lane::Routine)
            .await
    }

    /// Claims as many of `due` as `pool` has free permits for (waiting for one), front first,
    /// and starts draining them: [`Inner::start_claimed`] after [`ShardPool::permits`].
    async fn start_many(
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
    fn start_claimed(
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
    async fn drain_batch(
        self: Arc<Self>,
        shards: Vec<ShardKey>,
        mut ends: pool::Ends<Drained>,
        stopping: watch::Receiver<bool>,
        mode: DrainMode,
        lane: Lane,
        head: usize,
    ) {
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
                .drain_sessions(sessions, ends, &stopping, mode, lane)
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
                Box::pin(inner.drain_sessions(theirs, their_ends, &stopping, mode, lane)).await;
            });
        }
        // Dropped with this task (aborted at shutdown), the parts are aborted too.
        while let Some(done) = parts.join_next().await {
            pool::joined(done);
        }
    }

    /// Drains claimed shards concurrently, in this task, reporting each shard's end as it
    /// comes.
    async fn drain_sessions(
        &self,
        sessions: Vec<(ShardKey, S::Session)>,
        mut ends: pool::Ends<Drained>,
        stopping: &watch::Receiver<bool>,
        mode: DrainMode,
        lane: Lane,
    ) {
        let mut drains: futures_util::stream::FuturesUnordered<_> = sessions
            .into_iter()
            .map(|(shard, session)| async move {
                // Boxed, so that the set holds small futures (a few kilobytes each on
                // PostgreSQL, unboxed).
                let drained = Box::pin(self.drain_claimed(session, stopping, mode, lane)).await;
                (shard, drained)
            })
            .collect();
        while let Some((shard, drained)) = futures_util::StreamExt::next(&mut drains).await {
            ends.end(shard, drained);
        }
    }

    /// Drains a claimed shard. A drain the database interrupted leaves its lease to be
    /// released once the database answers again, rather than leave the shard to wait for the
    /// lease to lapse.
    async fn drain_claimed(
        &self,
        session: S::Session,
        stopping: &watch::Receiver<bool>,
        mode: DrainMode,
        lane: Lane,
    ) -> Drained {
        let lease = session.lease().clone();
        let shard = &lease.shard;
        let span = info_span!(
            "outbox.drain_shard",
            scope = shard.scope.0,
            shard = %shard.shard_identifier,
            destination = shard.destination_str(),
        );
        async {
            let _in_flight = self.vitals.claimed();
            let started = tokio::time::Instant::now();
            let drained = shard::drain(session, self, stopping, mode, lane).await;
            if let Ok(run) = &drained {
                self.metrics().drained(
                    shard.scope,
                    started.elapsed(),
                    run.rows_acknowledged,
                    run.lost_lease(),
                );
            }
            if drained.is_err() {
                self.interrupted
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(lease.clone());
            }
            drained.map(Some)
        }
        .instrument(span)
        .await
    }

    /// Releases the leases of shards whose drain the database interrupted (see
    /// [`Store::release`]); those it cannot release yet are kept for the next call.
    async fn release_interrupted(&self) {
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
