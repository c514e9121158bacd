//! The relay's handle, [`Relay`]: what a service calls.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Notify, OnceCell};

use super::config::RelayConfig;
use super::health::{Health, Vitals};
use super::inner::Inner;
use super::parked::ParkedShards;
use super::pool::ShardPool;
use super::report::{DrainReport, MaintenanceReport, RunReport};
use super::run::RunLoop;
use super::shard::DrainMode;
use super::{Drained, pool, slots, together, walk};
use crate::backfill::BackfillBatch;
use crate::error::Error;
use crate::model::ShardKey;
use crate::registry::Registry;
use crate::store::{ClaimOptions, Store};

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
    pub(super) inner: Arc<Inner<S>>,
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

impl<S: Store> Relay<S> {
    /// Takes every handler's turn so far to have lasted `turn` (see
    /// [`crate::__private::assume_turns_take`]).
    pub(crate) fn assume_turns_take(&self, turn: std::time::Duration) {
        self.inner.pace.assume(turn);
    }

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
        // Measured only where a walk is paced by it.
        let live = (config.backfill_paced
            && config.backfill_interval.is_some()
            && !registry.backfill_models().is_empty())
        .then(walk::LiveLatency::default);
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
                lapse_told: std::sync::atomic::AtomicBool::new(false),
                live,
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
    pub(super) async fn pass(
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
    /// [`maintenance_interval`](super::RelayConfigBuilder::maintenance_interval)): in paused shards,
    /// deletes the rows of coalescing groups that a newer row of the group makes redundant,
    /// keeping each group's oldest and newest rows so that resuming delivers each group once,
    /// in order; and purges the dead letters older than the
    /// [`dead_letter_retention`](super::RelayConfigBuilder::dead_letter_retention), if one is set.
    /// Each works in batches of a few hundred rows, one short statement each.
    pub async fn maintain(&self) -> Result<MaintenanceReport, Error> {
        self.inner.maintain().await
    }

    /// Reads the outbox's state with one query ([`Store::gauges`]) and sets the gauges of
    /// [`telemetry`](crate::telemetry) from it: what [`Relay::run`] does every
    /// [`gauge_interval`](super::RelayConfigBuilder::gauge_interval).
    pub async fn refresh_gauges(&self) -> Result<(), Error> {
        self.inner.refresh_gauges().await
    }

    /// One tick of the backfills (see [`crate::backfill`]), what [`Relay::run`] does
    /// every [`backfill_interval`](super::RelayConfigBuilder::backfill_interval): for each
    /// replicated model of the registry, in category order, walks the next batch of its
    /// backfill if an operator started one that this binary's code can walk and no other
    /// relay holds it ([`Store::backfill`]), of at most
    /// [`backfill_budget`](super::RelayConfigBuilder::backfill_budget) rows (a running relay
    /// paces its ticks below it: see [`backfill_paced`](super::RelayConfigBuilder::backfill_paced)).
    /// Returns each model's batch; the first error, if a model's tick failed (the others
    /// still ticked, and the failure is recorded on its watermark).
    pub async fn backfill(&self) -> Result<Vec<BackfillBatch>, Error> {
        self.inner.prepare().await?;
        self.inner.backfill(self.inner.config.backfill_budget).await
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
    pub(super) async fn start(
        &self,
        pool: &mut ShardPool<Drained>,
        shard: ShardKey,
        mode: DrainMode,
    ) {
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
