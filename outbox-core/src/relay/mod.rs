//! The relay: finds due shards, claims them, delivers their messages, records the outcome.

mod config;
mod plan;
mod shard;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, OnceCell, Semaphore, watch};
use tokio::task::{JoinError, JoinSet};
use tracing::{Instrument, debug, info, info_span, warn};

pub use self::config::{Backoff, RelayConfig};
pub use self::shard::ShardFailure;
use self::shard::{DrainMode, ShardRun};
use crate::error::Error;
use crate::flush::{FlushError, WrittenShards};
use crate::model::ShardKey;
use crate::registry::Registry;
use crate::store::{ClaimOptions, Lease, ShardSession, Store, Wakeup, WakeupStream};

/// What a [`Relay::drain`] did.
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
}

impl DrainReport {
    /// Whether nothing failed and no lease was lost.
    pub fn is_clean(&self) -> bool {
        self.failures.is_empty() && self.lost_leases.is_empty()
    }

    /// Whether shards were left with messages pending: failed, lost to another worker, or
    /// out of budget.
    pub fn rows_remain(&self) -> bool {
        !self.is_clean() || !self.yielded.is_empty()
    }

    fn absorb(&mut self, run: ShardRun) {
        self.shards_claimed += u64::from(run.claimed);
        self.deliveries += run.deliveries;
        self.rows_acknowledged += run.rows_acknowledged;
        self.failures.extend(run.failure);
        self.lost_leases.extend(run.lease_lost);
        self.yielded.extend(run.yielded);
    }
}

/// What a [`Relay::run`] did before it stopped.
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
    /// How many database errors the relay rode out.
    pub database_errors: u64,
    /// Shards still in flight when the shutdown deadline passed; their leases expire and
    /// another worker resumes them.
    pub abandoned: usize,
}

impl RunReport {
    fn absorb(&mut self, run: &ShardRun) {
        self.shards_claimed += u64::from(run.claimed);
        self.deliveries += run.deliveries;
        self.rows_acknowledged += run.rows_acknowledged;
        self.failures += u64::from(run.failure.is_some());
        self.lost_leases += u64::from(run.lease_lost.is_some());
    }
}

/// Delivers outbox messages: the backend-agnostic engine.
///
/// Cheap to clone; clones share the store, registry and configuration.
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

struct Inner<S> {
    store: S,
    registry: Registry,
    config: RelayConfig,
    claim: ClaimOptions,
    wake: Notify,
    prepared: OnceCell<()>,
    /// Leases of shards whose drain the database interrupted: released once it answers again.
    interrupted: std::sync::Mutex<Vec<Lease>>,
}

type Task = (ShardKey, Result<ShardRun, Error>);

impl<S: Store> Relay<S> {
    /// A relay with the default configuration.
    pub fn new(store: S, registry: Registry) -> Self {
        Self::with_config(store, registry, RelayConfig::default())
    }

    /// A relay with the given configuration.
    pub fn with_config(store: S, registry: Registry, config: RelayConfig) -> Self {
        let claim = ClaimOptions {
            worker: config.worker_id.clone(),
            lease: config.lease,
            mode: config.handler_mode,
        };
        Self {
            inner: Arc::new(Inner {
                store,
                registry,
                config,
                claim,
                wake: Notify::new(),
                prepared: OnceCell::new(),
                interrupted: std::sync::Mutex::default(),
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

    /// Checks the schema and un-parks shards waiting for a category this binary knows.
    /// Runs once per relay.
    async fn prepare(&self) -> Result<(), Error> {
        self.inner
            .prepared
            .get_or_try_init(|| async {
                self.inner.store.check_schema().await?;
                let known = self.inner.registry.category_ids();
                let unparked = self.inner.store.unpark(&known).await?;
                if unparked > 0 {
                    info!(
                        unparked,
                        "resumed shards parked on categories this binary knows"
                    );
                }
                Ok::<_, Error>(())
            })
            .await
            .map(|_| ())
    }

    /// Delivers everything that is due, then returns: shards in backoff are left for later,
    /// and failures are reported, not returned as errors. Shards are drained concurrently, up
    /// to `max_concurrent_shards`. For tests, examples and one-shot jobs.
    ///
    /// Fails if the schema is not migrated or the database fails; work already acknowledged
    /// stays acknowledged, and in-flight leases expire.
    pub async fn drain(&self) -> Result<DrainReport, Error> {
        self.prepare().await?;
        let mut report = DrainReport::default();
        loop {
            let claimed_before = report.shards_claimed;
            self.pass(DrainMode::RELAY, &mut report).await?;
            if report.shards_claimed == claimed_before {
                return Ok(report);
            }
        }
    }

    /// One discovery pass: every due shard drained once, in `mode`, concurrently.
    async fn pass(&self, mode: DrainMode, report: &mut DrainReport) -> Result<(), Error> {
        let (_keep_running, running) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let limit = Arc::new(Semaphore::new(
            self.inner.config.max_concurrent_shards.max(1),
        ));
        let mut first_error = None;
        let mut cursor: Option<ShardKey> = None;
        loop {
            let page = match self
                .inner
                .store
                .discover(cursor.as_ref(), self.inner.config.discovery_page)
                .await
            {
                Ok(page) => {
                    if cursor.is_none() {
                        self.inner.release_interrupted().await;
                    }
                    page
                }
                Err(error) => {
                    first_error = Some(error);
                    break;
                }
            };
            for shard in page.due {
                let permit = Arc::clone(&limit)
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed");
                spawn_shard(&mut tasks, &self.inner, shard, permit, &running, mode);
                while let Some(done) = tasks.try_join_next() {
                    collect(done, report, &mut first_error);
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        while let Some(done) = tasks.join_next().await {
            collect(done, report, &mut first_error);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Drains the given shards once each (if they are due and unclaimed), concurrently.
    pub async fn drain_shards(&self, shards: &[ShardKey]) -> Result<DrainReport, Error> {
        self.prepare().await?;
        let unique: HashSet<ShardKey> = shards.iter().cloned().collect();
        let (_keep_running, running) = watch::channel(false);
        let limit = Arc::new(Semaphore::new(
            self.inner.config.max_concurrent_shards.max(1),
        ));
        let mut tasks = JoinSet::new();
        for shard in unique {
            let permit = Arc::clone(&limit)
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            spawn_shard(
                &mut tasks,
                &self.inner,
                shard,
                permit,
                &running,
                DrainMode::RELAY,
            );
        }
        let mut report = DrainReport::default();
        let mut first_error = None;
        while let Some(done) = tasks.join_next().await {
            collect(done, &mut report, &mut first_error);
        }
        first_error.map_or(Ok(report), Err)
    }

    /// Flush-after-commit (S2): drains exactly the shards a committed transaction wrote to,
    /// each up to the newest row the transaction wrote there, and returns `Ok` only once every
    /// one of those rows is delivered. The caller learns the outcome: a handler that fails is
    /// a [`FlushError::Delivery`], its data committed, its rows left for the relay, the
    /// shard's schedule not pushed back. Budgets do not cut a flush short. A shard another
    /// worker holds is waited for, up to [`RelayConfig::flush_wait`], then drained; past
    /// that, the flush is a [`FlushError::Incomplete`] naming the rows left.
    ///
    /// `written` comes from the backend's `OutboxTransaction::commit`: the shards of a
    /// transaction that has not committed cannot be had.
    pub async fn flush(&self, written: &WrittenShards) -> Result<DrainReport, FlushError> {
        if written.is_empty() {
            return Ok(DrainReport::default());
        }
        self.prepare().await.map_err(FlushError::Store)?;
        let mut tasks = JoinSet::new();
        let limit = Arc::new(Semaphore::new(
            self.inner.config.max_concurrent_shards.max(1),
        ));
        for (shard, up_to) in written.iter() {
            let inner = Arc::clone(&self.inner);
            let limit = Arc::clone(&limit);
            let shard = shard.clone();
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await;
                inner.flush_shard(&shard, up_to).await
            });
        }
        let mut report = DrainReport::default();
        let mut remaining = Vec::new();
        let mut first_error = None;
        while let Some(done) = tasks.join_next().await {
            match joined(done) {
                Ok((runs, left)) => {
                    runs.into_iter().for_each(|run| report.absorb(run));
                    remaining.extend(left);
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        if let Some(error) = first_error {
            return Err(FlushError::Store(error));
        }
        // What the flush drained was its own: lease losses along the way were retried.
        report.lost_leases.clear();
        FlushError::check(report, remaining)
    }

    /// One pass over every due shard, up to the newest row present when the pass begins (rows
    /// written meanwhile, by handlers too, wait for the next pass), with failures reported as
    /// by [`Relay::flush`] rather than backing shards off. What a test runner repeats until
    /// a pass delivers nothing.
    pub async fn flush_due(&self) -> Result<DrainReport, FlushError> {
        self.prepare().await.map_err(FlushError::Store)?;
        let Some(newest) = self
            .inner
            .store
            .newest_message_id()
            .await
            .map_err(FlushError::Store)?
        else {
            return Ok(DrainReport::default());
        };
        let mut report = DrainReport::default();
        self.pass(DrainMode::flush(newest), &mut report)
            .await
            .map_err(FlushError::Store)?;
        FlushError::check(report, Vec::new())
    }

    /// Runs until `shutdown` completes: discovers due shards, drains them concurrently, and
    /// waits for commits (or polls) when idle. Rides out database outages, reconnecting with
    /// backoff. On shutdown, stops claiming and gives in-flight shards until the shutdown
    /// deadline to finish their current delivery and release; shards still running then are
    /// abandoned (their leases expire, nothing is lost).
    ///
    /// Fails only if the schema is missing or outdated.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RunReport, Error> {
        let inner = &self.inner;
        let config = &inner.config;
        let mut report = RunReport::default();
        tokio::pin!(shutdown);

        let mut reconnect = Reconnect::new(config.max_reconnect_delay);
        loop {
            match self.prepare().await {
                Ok(()) => break,
                Err(error) if error.is_unavailable() => {
                    report.database_errors += 1;
                    let delay = reconnect.next_delay();
                    warn!(error = %crate::error::error_chain(&error), ?delay, "database unavailable at start; retrying");
                    tokio::select! {
                        () = &mut shutdown => return Ok(report),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                Err(error) => return Err(error),
            }
        }
        reconnect.reset();

        let (stop, running) = watch::channel(false);
        let limit = Arc::new(Semaphore::new(config.max_concurrent_shards.max(1)));
        let mut tasks: JoinSet<Task> = JoinSet::new();
        let mut in_flight: HashSet<ShardKey> = HashSet::new();
        let mut wakeups = None;
        // Whether to listen for commits: configured, and not found unsupported by the store.
        let mut listen = config.wake_on_commit;
        let mut listen_retry_at = tokio::time::Instant::now();
        let mut cursor: Option<ShardKey> = None;
        let mut found_this_sweep = false;
        let mut outage = Outage::default();
        info!(worker = %config.worker_id, "relay running");

        'run: loop {
            while let Some(done) = tasks.try_join_next() {
                finish_task(done, &mut in_flight, &mut report, &mut outage);
            }
            if listen && wakeups.is_none() && tokio::time::Instant::now() >= listen_retry_at {
                match inner.store.wakeups().await {
                    Ok(Some(stream)) => wakeups = Some(stream),
                    Ok(None) => listen = false,
                    Err(error) => {
                        debug!(error = %crate::error::error_chain(&error), "cannot listen for commits; polling");
                        listen_retry_at = tokio::time::Instant::now() + Duration::from_secs(1);
                    }
                }
            }

            let page = match inner
                .store
                .discover(cursor.as_ref(), config.discovery_page)
                .await
            {
                Ok(page) => {
                    reconnect.reset();
                    outage.end();
                    inner.release_interrupted().await;
                    page
                }
                Err(error) => {
                    report.database_errors += 1;
                    let delay = reconnect.next_delay();
                    if error.is_unavailable() {
                        outage.retry(&error);
                    } else {
                        warn!(error = %crate::error::error_chain(&error), ?delay, "discovery failed; retrying");
                    }
                    tokio::select! {
                        () = &mut shutdown => break 'run,
                        () = tokio::time::sleep(delay) => continue 'run,
                    }
                }
            };
            for shard in page.due {
                if in_flight.contains(&shard) {
                    continue;
                }
                found_this_sweep = true;
                let permit = tokio::select! {
                    () = &mut shutdown => break 'run,
                    permit = Arc::clone(&limit).acquire_owned() => permit.expect("the semaphore is never closed"),
                };
                in_flight.insert(shard.clone());
                spawn_shard(&mut tasks, inner, shard, permit, &running, DrainMode::RELAY);
            }
            cursor = page.next;
            if cursor.is_some() {
                continue;
            }
            if std::mem::take(&mut found_this_sweep) {
                continue;
            }

            // A whole sweep found nothing due: wait for a reason to look again. Without
            // commit notifications that should be there, wait no longer than the next attempt
            // to listen again.
            let mut idle_until = tokio::time::Instant::now() + config.poll_interval;
            if listen && wakeups.is_none() {
                idle_until = idle_until.min(listen_retry_at);
            }
            let woken = tokio::select! {
                () = &mut shutdown => break 'run,
                () = inner.wake.notified() => None,
                () = tokio::time::sleep_until(idle_until) => None,
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    finish_task(done, &mut in_flight, &mut report, &mut outage);
                    None
                }
                wakeup = next_wakeup(wakeups.as_mut()) => Some(wakeup),
            };
            match woken {
                Some(Ok(Wakeup::Shards(shards))) => {
                    for shard in shards {
                        if !in_flight.insert(shard.clone()) {
                            continue;
                        }
                        let permit = tokio::select! {
                            () = &mut shutdown => break 'run,
                            permit = Arc::clone(&limit).acquire_owned() => permit.expect("the semaphore is never closed"),
                        };
                        spawn_shard(&mut tasks, inner, shard, permit, &running, DrainMode::RELAY);
                    }
                }
                Some(Ok(Wakeup::Any)) | None => {}
                Some(Err(error)) => {
                    warn!(error = %crate::error::error_chain(&error), "commit notifications broke; polling until they come back");
                    wakeups = None;
                    listen_retry_at = tokio::time::Instant::now() + Duration::from_secs(1);
                }
            }
        }

        info!(in_flight = tasks.len(), "relay stopping");
        let _ = stop.send(true);
        let deadline = tokio::time::sleep(config.shutdown_deadline);
        tokio::pin!(deadline);
        while !tasks.is_empty() {
            tokio::select! {
                () = &mut deadline => {
                    report.abandoned = tasks.len();
                    warn!(abandoned = report.abandoned, "shutdown deadline passed; abandoning in-flight shards to their leases");
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    break;
                }
                Some(done) = tasks.join_next() => finish_task(done, &mut in_flight, &mut report, &mut outage),
            }
        }
        Ok(report)
    }
}

impl<S: Store> Inner<S> {
    /// Drains `shard` up to `up_to` for a flush: claims it, waiting (up to the configured
    /// bound) while another worker holds it, until none of its rows up to the bound is pending
    /// or a delivery fails. Returns the runs, and the shard if rows were left.
    async fn flush_shard(
        &self,
        shard: &ShardKey,
        up_to: crate::model::MessageId,
    ) -> Result<(Vec<ShardRun>, Option<crate::flush::Undelivered>), Error> {
        let (_keep_running, running) = watch::channel(false);
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(2);
        let mut runs = Vec::new();
        loop {
            let run = self
                .process(shard, &running, DrainMode::flush(up_to))
                .await?;
            let settled = run.claimed && run.lease_lost.is_none();
            let failed = run.failure.is_some();
            runs.push(run);
            if failed || settled {
                // Drained to the bound, or failed: either way the caller hears of it.
                return Ok((runs, None));
            }
            // Not claimed (held by another worker, or nothing left), or taken over mid-drain.
            let messages = self.store.pending_in_shard(shard, up_to).await?;
            if messages == 0 {
                return Ok((runs, None));
            }
            let waited = started.elapsed();
            if waited >= self.config.flush_wait {
                return Ok((
                    runs,
                    Some(crate::flush::Undelivered {
                        shard: shard.clone(),
                        messages,
                        waited,
                    }),
                ));
            }
            debug!(%shard, messages, "shard held by another worker; the flush waits");
            tokio::time::sleep(pause.min(self.config.flush_wait.saturating_sub(waited))).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    async fn process(
        &self,
        shard: &ShardKey,
        running: &watch::Receiver<bool>,
        mode: DrainMode,
    ) -> Result<ShardRun, Error> {
        let span = info_span!(
            "outbox.drain_shard",
            scope = shard.scope.0,
            shard = shard.shard_identifier,
            destination = shard.destination_str(),
        );
        async {
            let Some(session) = self.store.claim(shard, &self.claim).await? else {
                return Ok(ShardRun::default());
            };
            let lease = session.lease().clone();
            let drained = shard::drain(
                session,
                &self.store,
                &self.registry,
                &self.config,
                running,
                mode,
            )
            .await;
            if drained.is_err() {
                // The drain stopped holding the lease: release it as soon as the database
                // answers again, rather than leave the shard to wait for the lease to lapse.
                self.interrupted
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(lease);
            }
            drained
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

fn spawn_shard<S: Store>(
    tasks: &mut JoinSet<Task>,
    inner: &Arc<Inner<S>>,
    shard: ShardKey,
    permit: tokio::sync::OwnedSemaphorePermit,
    running: &watch::Receiver<bool>,
    mode: DrainMode,
) {
    let inner = Arc::clone(inner);
    let running = running.clone();
    tasks.spawn(async move {
        let _permit = permit;
        let result = inner.process(&shard, &running, mode).await;
        (shard, result)
    });
}

async fn next_wakeup<W: WakeupStream>(stream: Option<&mut W>) -> Result<Wakeup, Error> {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

fn collect(
    done: Result<Task, JoinError>,
    report: &mut DrainReport,
    first_error: &mut Option<Error>,
) {
    match joined(done) {
        (_, Ok(run)) => report.absorb(run),
        (_, Err(error)) => {
            first_error.get_or_insert(error);
        }
    }
}

fn finish_task(
    done: Result<Task, JoinError>,
    in_flight: &mut HashSet<ShardKey>,
    report: &mut RunReport,
    outage: &mut Outage,
) {
    let (shard, result) = joined(done);
    in_flight.remove(&shard);
    match result {
        Ok(run) => report.absorb(&run),
        Err(error) => {
            report.database_errors += 1;
            if error.is_unavailable() {
                outage.interrupted(&shard, &error);
            } else {
                warn!(%shard, error = %crate::error::error_chain(&error), "draining the shard failed; it is released once the database answers");
            }
        }
    }
}

/// The relay's view of the database's availability, so that an outage is logged once when it
/// begins and once when it ends, however many shards and retries it touches (drains on
/// connections that died in it may fail a moment after it ended: they are the same event).
#[derive(Debug, Default)]
struct Outage {
    since: Option<tokio::time::Instant>,
    ended: Option<tokio::time::Instant>,
    announced: bool,
    shards: u64,
    retries: u64,
}

impl Outage {
    /// Failures this soon after an outage ended belong to it.
    const AFTERMATH: Duration = Duration::from_secs(10);

    fn begin(&mut self, error: &Error, what: &str) {
        if self.since.is_some() {
            debug!(error = %crate::error::error_chain(error), "database still unavailable ({what})");
            return;
        }
        self.since = Some(tokio::time::Instant::now());
        if self
            .ended
            .is_some_and(|ended| ended.elapsed() < Self::AFTERMATH)
        {
            debug!(error = %crate::error::error_chain(error), "database unavailable again, just after an outage ({what})");
        } else {
            self.announced = true;
            warn!(error = %crate::error::error_chain(error), "database unavailable ({what}); retrying with backoff");
        }
    }

    /// A shard's drain stopped on the outage.
    fn interrupted(&mut self, shard: &ShardKey, error: &Error) {
        self.shards += 1;
        debug!(%shard, "a shard's drain was interrupted by the database");
        self.begin(error, "a shard's drain was interrupted");
    }

    /// A discovery failed on the outage.
    fn retry(&mut self, error: &Error) {
        self.retries += 1;
        self.begin(error, "looking for due shards");
    }

    /// The database answered.
    fn end(&mut self) {
        let Some(since) = self.since.take() else {
            return;
        };
        self.ended = Some(tokio::time::Instant::now());
        let (shards, retries) = (
            std::mem::take(&mut self.shards),
            std::mem::take(&mut self.retries),
        );
        if std::mem::take(&mut self.announced) {
            info!(
                after = ?since.elapsed(),
                interrupted_shards = shards,
                retries,
                "database reachable again"
            );
        }
    }
}

/// Handler panics are caught where handlers run; a panicking task is a bug in the relay itself,
/// so it is re-raised rather than hidden.
fn joined<T>(done: Result<T, JoinError>) -> T {
    match done {
        Ok(task) => task,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(error) => panic!("relay task was cancelled unexpectedly: {error}"),
    }
}

/// Exponential delay between reconnection attempts.
struct Reconnect {
    next: Duration,
    max: Duration,
}

impl Reconnect {
    const FIRST: Duration = Duration::from_millis(100);

    fn new(max: Duration) -> Self {
        Self {
            next: Self::FIRST,
            max,
        }
    }

    fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}
