//! The background relay ([`Relay::run`](crate::Relay::run)) as a loop of small steps.

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::config::Backoff;
use super::parked::Parked;
use super::pool::ShardPool;
use super::report::RunReport;
use super::shard::{DrainEnd, DrainMode};
use super::slots::Lane;
use super::walk::WalkPace;
use super::{Drained, Inner};
use crate::backfill::BackfillBatch;
use crate::error::{Error, error_chain};
use crate::hashed::{Map, Set};
use crate::model::ShardKey;
use crate::store::{DiscoveryPage, Store, Wakeup, WakeupStream};

/// The background relay: sweeps discovery for due shards and drains them in its pool, waits
/// for commits (or polls) after a sweep that found nothing, rides out outages, and stops on
/// shutdown. Each step is a method; each returns `Break` when shutdown came first.
pub(super) struct RunLoop<'r, S: Store, F> {
    inner: &'r Arc<Inner<S>>,
    shutdown: Pin<&'r mut F>,
    pool: ShardPool<Drained>,
    listener: Listener<S::Wakeups>,
    sweep: Sweep,
    /// Shards a commit notification named while they were draining: drained again when
    /// their drain ends.
    rewake: Set<ShardKey>,
    /// Shards to drain again, whose drain ended with rows left (or perhaps left).
    again: Vec<ShardKey>,
    /// Shards to start in the urgent lane: named by a commit notification (while they
    /// drained, or while the relay was busy with a sweep).
    again_urgent: Vec<ShardKey>,
    /// Whether a commit notification named no shard, or the notifications broke, since the
    /// last sweep began: the relay sweeps again before it waits.
    heard_any: bool,
    /// The shards commit notifications named lately, and when: their drains are the
    /// notifications' work, not a sweep's ([`Heard`]).
    heard: Heard,
    /// Whether a drain or a claim failed since the last sweep.
    resweep: bool,
    /// Shards whose delivery found a breaker open: not claimed until it closes.
    parked: Parked,
    outage: Outage,
    reconnect: Reconnect,
    report: RunReport,
}

/// What an idle relay woke up for.
enum Woken {
    /// Time to look again: polled, or woken by [`Relay::wake`](crate::Relay::wake).
    Look,
    /// A drain ended (boxed: a drain's outcome is much larger than the other wake-ups).
    Finished(Box<(ShardKey, Drained)>),
    /// A commit notification, or its stream broke.
    Wakeup(Result<Wakeup, Error>),
    /// A breaker closed: the shards parked on it.
    Closed(Vec<ShardKey>),
}

impl<'r, S: Store, F: Future<Output = ()> + Send> RunLoop<'r, S, F> {
    pub(super) fn new(inner: &'r Arc<Inner<S>>, shutdown: Pin<&'r mut F>) -> Self {
        let config = &inner.config;
        Self {
            inner,
            shutdown,
            pool: ShardPool::relays(config),
            listener: Listener::new(config.wake_on_commit, config.listen_for_other_processes),
            sweep: Sweep::default(),
            rewake: Set::default(),
            again: Vec::new(),
            again_urgent: Vec::new(),
            heard_any: false,
            heard: Heard::default(),
            resweep: false,
            parked: Parked::default(),
            outage: Outage::default(),
            reconnect: Reconnect::new(config.max_reconnect_delay, config.backoff.jitter),
            report: RunReport::default(),
        }
    }

    /// Runs until shutdown, then stops: the whole of [`Relay::run`](crate::Relay::run).
    pub(super) async fn run(mut self) -> Result<RunReport, Error> {
        let inner: &'r Arc<Inner<S>> = self.inner;
        let _running = inner.vitals.running();
        crate::telemetry::register(&inner.registry);
        if self.prepare().await?.is_break() {
            return Ok(self.report);
        }
        info!(worker = %self.inner.config.worker_id, "relay running");
        let upkeep = Upkeep::start(self.inner);
        let heartbeat = Heartbeats::start(self.inner);
        while self.turn().await.is_continue() {}
        let report = self.stop().await;
        drop(upkeep);
        // The heartbeat in flight lands before the row is deleted, never after.
        heartbeat.stop().await;
        let worker = &inner.config.worker_id;
        if let Err(error) = inner.store.leave(worker).await {
            debug!(error = %error_chain(&error), "deleting the relay's heartbeat failed; it expires");
        }
        Ok(report)
    }

    /// Checks the schema, retrying with backoff while the database is unavailable.
    async fn prepare(&mut self) -> Result<ControlFlow<()>, Error> {
        loop {
            match self.inner.prepare().await {
                Ok(()) => {
                    self.reconnect.reset();
                    return Ok(ControlFlow::Continue(()));
                }
                Err(error) if error.is_unavailable() => {
                    self.report.database_errors += 1;
                    crate::telemetry::database_error("prepare");
                    let delay = self.reconnect.next_delay();
                    warn!(error = %error_chain(&error), ?delay, "database unavailable at start; retrying");
                    if self.pause(delay).await.is_break() {
                        return Ok(ControlFlow::Break(()));
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// One turn: take in the drains that ended, listen for commits, read one page of the
    /// sweep and start draining its due shards; after a sweep that found nothing due, wait.
    async fn turn(&mut self) -> ControlFlow<()> {
        self.take_finished();
        self.start_again().await?;
        self.resweep = false;
        self.listener.listen(&self.inner.store).await;
        let read_at = Instant::now();
        let Some(page) = self.discover().await? else {
            return ControlFlow::Continue(());
        };
        self.sweep.read(read_at.elapsed());
        // Shards parked on an open breaker are neither work found nor work going on: during
        // an outage the relay polls at its pace instead of sweeping again and again. Nor are
        // the shards a commit notification named lately: their drains (started, or done since
        // the page was read) are the notifications' work. Otherwise, under steady traffic,
        // every sweep would find the shards just committed, sweep again at once, and claim
        // each a second time after its drain emptied it.
        let mut due = page.due;
        due.retain(|shard| !self.parked.holds(shard) && !self.heard.lately(shard, read_at));
        if page.next.is_none() {
            self.heard.forget_before(read_at);
        }
        self.sweep.busy |= !due.is_empty();
        self.sweep.found |= due.iter().any(|shard| !self.pool.is_draining(shard));
        self.start(due, Lane::Routine).await?;
        if self.sweep.advance(page.next) && !self.sweep.resting(&self.inner.config) {
            return ControlFlow::Continue(());
        }
        self.idle().await
    }

    /// One page of the sweep, after the leases an outage interrupted are released (once the
    /// database answers); `None` after a failure (and the pause before retrying).
    ///
    /// While the page is read the relay goes on listening: the shards a commit names start
    /// at once, in the urgent lane, and drains that end are taken in. A page can take long
    /// (while a held vacuum horizon keeps every acknowledged row, each page walks them), and
    /// live messages must not wait for it.
    async fn discover(&mut self) -> ControlFlow<(), Option<DiscoveryPage>> {
        let inner: &'r Arc<Inner<S>> = self.inner;
        let config = &inner.config;
        // Released before the page is read, so that it finds their shards due.
        inner.release_interrupted().await;
        let cursor = self.sweep.cursor.clone();
        let read = inner.store.discover(cursor.as_ref(), config.discovery_page);
        tokio::pin!(read);
        let read = loop {
            let draining = !self.pool.is_empty();
            tokio::select! {
                biased;
                () = &mut self.shutdown => return ControlFlow::Break(()),
                read = &mut read => break read,
                wakeup = self.listener.next() => self.heard(wakeup),
                Some((shard, drained)) = self.pool.next_finished(), if draining => {
                    self.absorb(shard, drained);
                }
            }
            let urgent = std::mem::take(&mut self.again_urgent);
            if !urgent.is_empty() {
                self.start(urgent, Lane::Urgent).await?;
            }
        };
        match read {
            Ok(page) => {
                self.reconnect.reset();
                self.outage.end();
                ControlFlow::Continue(Some(page))
            }
            Err(error) => {
                self.report.database_errors += 1;
                crate::telemetry::database_error("discover");
                let delay = self.reconnect.next_delay();
                if error.is_unavailable() {
                    self.outage.retry(&error);
                } else {
                    warn!(error = %error_chain(&error), ?delay, "discovery failed; retrying");
                }
                self.pause(delay).await?;
                ControlFlow::Continue(None)
            }
        }
    }

    /// Claims the `due` shards that are not being drained already as permits come free,
    /// several per round trip, and starts draining those claimed. While routine shards (a
    /// sweep's) wait for permits, the relay still listens: the shards a commit names are
    /// started first, in the urgent lane, so that live messages do not wait behind a sweep
    /// of a large backlog (which could last as long as the backlog keeps growing).
    async fn start(&mut self, mut due: Vec<ShardKey>, lane: Lane) -> ControlFlow<()> {
        let inner: &'r Arc<Inner<S>> = self.inner;
        loop {
            if lane == Lane::Routine {
                // Notifications that came while the page was read go first: a shard committed
                // since is on the page too, and must start in the urgent lane, not this one.
                while let Some(wakeup) = self.listener.next().now_or_never() {
                    self.heard(wakeup);
                }
            }
            if lane == Lane::Routine && !self.again_urgent.is_empty() {
                let urgent = std::mem::take(&mut self.again_urgent);
                Box::pin(self.start(urgent, Lane::Urgent)).await?;
            }
            let parked = &self.parked;
            self.pool.to_start(&mut due, |shard| !parked.holds(shard));
            if due.is_empty() {
                return ControlFlow::Continue(());
            }
            let permits = tokio::select! {
                () = &mut self.shutdown => return ControlFlow::Break(()),
                permits = self.pool.permits(due.len(), inner.shards_to_hold()) => permits,
                wakeup = self.listener.next(), if lane == Lane::Routine => {
                    self.heard(wakeup);
                    continue;
                }
            };
            inner.start_claimed(&mut self.pool, &mut due, permits, DrainMode::Relay, lane);
            self.take_finished();
        }
    }

    /// Takes in a commit notification: the shards it names are started next, urgent (or
    /// again when their drain ends, if they are draining); one that names none, or the
    /// stream's failure, makes the relay sweep again before it waits.
    fn heard(&mut self, wakeup: Result<Wakeup, Error>) {
        match wakeup {
            Ok(Wakeup::Shards(shards)) => {
                let now = Instant::now();
                for shard in shards {
                    self.heard.named(&shard, now);
                    if self.pool.is_draining(&shard) {
                        // Held already (a sweep found it before its commit was heard): its
                        // turns go before the sweep's other shards'.
                        let waiting = self.inner.handler_slots.promote(&shard);
                        debug!(%shard, waiting, "a shard a commit named is held already; its turns are urgent");
                        self.rewake.insert(shard);
                    } else {
                        self.again_urgent.push(shard);
                    }
                }
            }
            // Commits that named no shard (or went unannounced) may be on any shard, those
            // named lately among them: the sweep this makes leaves none to a notification.
            Ok(Wakeup::Any) => {
                self.heard_any = true;
                self.heard.clear();
            }
            Err(error) => {
                self.listener.broke(&error);
                self.heard_any = true;
                self.heard.clear();
            }
        }
    }

    /// A whole sweep found nothing due: waits for a reason to look again (the poll interval,
    /// a wake, a commit notification naming no shard), then returns to sweep. Meanwhile it
    /// takes in the drains that end and starts the shards that commit notifications name,
    /// without sweeping: the shards a commit names are all it wrote, and any other message
    /// is found by the next poll.
    async fn idle(&mut self) -> ControlFlow<()> {
        let poll = Instant::now() + self.sweep.poll_after(&self.inner.config);
        loop {
            self.start_again().await?;
            if std::mem::take(&mut self.resweep) | std::mem::take(&mut self.heard_any) {
                // A drain or a claim failed: sweep (and retry with backoff) rather than wait,
                // its shards are still due. Or a commit notification named no shard, or the
                // notifications broke (commits may have gone unannounced): look everywhere.
                return ControlFlow::Continue(());
            }
            let until = self.listener.idle_until(poll);
            let draining = !self.pool.is_empty();
            let parked = self.parked.is_waiting();
            let woken = tokio::select! {
                () = &mut self.shutdown => return ControlFlow::Break(()),
                () = self.inner.wake.notified() => Woken::Look,
                () = tokio::time::sleep_until(until) => Woken::Look,
                Some((shard, drained)) = self.pool.next_finished(), if draining => {
                    Woken::Finished(Box::new((shard, drained)))
                }
                wakeup = self.listener.next() => Woken::Wakeup(wakeup),
                shards = self.parked.next_closed(), if parked => Woken::Closed(shards),
            };
            match woken {
                Woken::Look => return ControlFlow::Continue(()),
                Woken::Finished(done) => {
                    let (shard, drained) = *done;
                    self.absorb(shard, drained);
                }
                // Started (or swept for) at the top of the loop.
                Woken::Wakeup(wakeup) => self.heard(wakeup),
                Woken::Closed(shards) => {
                    self.inner.vitals.set_waiting(self.parked.len());
                    self.start(shards, Lane::Routine).await?;
                }
            }
        }
    }

    /// Sleeps for `delay`, unless shutdown comes first.
    async fn pause(&mut self, delay: Duration) -> ControlFlow<()> {
        tokio::select! {
            () = &mut self.shutdown => ControlFlow::Break(()),
            () = tokio::time::sleep(delay) => ControlFlow::Continue(()),
        }
    }

    fn take_finished(&mut self) {
        while let Some((shard, drained)) = self.pool.finished() {
            self.absorb(shard, drained);
        }
    }

    /// Takes in a drain that ended. A shard that yielded has rows left, and one a commit
    /// named while it drained may have: it is drained again ([`RunLoop::start_again`]). A
    /// drain (or claim) that failed makes the relay sweep, retrying with backoff.
    fn absorb(&mut self, shard: ShardKey, drained: Drained) {
        let yielded = matches!(&drained, Ok(Some(run)) if matches!(run.end, DrainEnd::Yielded));
        if let Ok(Some(run)) = &drained
            && let DrainEnd::Unavailable(breaker) = &run.end
        {
            self.parked.park(shard.clone(), breaker.clone());
            self.inner.vitals.set_waiting(self.parked.len());
        }
        match &drained {
            // The sweep that retries it must not leave the shard to the notification that
            // named it.
            Err(_) => {
                self.resweep = true;
                self.heard.clear();
            }
            // Due again when its backoff ends, for sweeps to find.
            Ok(Some(run)) if run.failure().is_some() => self.heard.forget(&shard),
            Ok(_) => {}
        }
        finished(&mut self.report, &mut self.outage, &shard, drained);
        // The shards a commit named while they drained, and only those, were promoted.
        if self.rewake.remove(&shard) {
            self.inner.handler_slots.forget(&shard);
            self.again_urgent.push(shard);
        } else if yielded {
            self.again.push(shard);
        }
    }

    /// Drains again the shards [`RunLoop::absorb`] set aside, and those parked on a breaker
    /// that closed.
    async fn start_again(&mut self) -> ControlFlow<()> {
        let closed = self.parked.closed_now();
        if !closed.is_empty() {
            self.inner.vitals.set_waiting(self.parked.len());
        }
        self.again.extend(closed);
        let urgent = std::mem::take(&mut self.again_urgent);
        if !urgent.is_empty() {
            self.start(urgent, Lane::Urgent).await?;
        }
        let again = std::mem::take(&mut self.again);
        if again.is_empty() {
            return ControlFlow::Continue(());
        }
        self.start(again, Lane::Routine).await
    }

    /// Stops claiming, and gives the drains in flight until the shutdown deadline to finish
    /// their current delivery and release; those still running then are abandoned.
    async fn stop(self) -> RunReport {
        let Self {
            inner,
            mut pool,
            mut report,
            mut outage,
            ..
        } = self;
        info!(in_flight = pool.len(), "relay stopping");
        let abandoned = pool
            .stop_within(inner.config.shutdown_deadline, |shard, drained| {
                finished(&mut report, &mut outage, &shard, drained);
            })
            .await;
        if abandoned > 0 {
            report.abandoned = abandoned;
            warn!(
                abandoned,
                "shutdown deadline passed; abandoning in-flight shards to their leases"
            );
        }
        report
    }
}

/// The relay's periodic tasks beside the loop: its upkeep
/// ([`Relay::maintain`](crate::Relay::maintain)) every maintenance interval, and its gauges
/// ([`Relay::refresh_gauges`](crate::Relay::refresh_gauges)) every gauge interval; stopped
/// when dropped.
struct Upkeep(Vec<tokio::task::JoinHandle<()>>);

impl Upkeep {
    fn start<S: Store>(inner: &Arc<Inner<S>>) -> Self {
        let config = &inner.config;
        let upkeep = config.maintenance_interval;
        let mut tasks = vec![every(inner, upkeep, upkeep, |inner| async move {
            if let Err(error) = inner.maintain().await {
                warn!(error = %error_chain(&error), "relay upkeep failed; retried at the next interval");
            }
        })];
        if let Some(interval) = config.gauge_interval {
            tasks.push(paced(inner, interval, |inner| async move {
                if let Err(error) = inner.refresh_gauges().await {
                    debug!(error = %error_chain(&error), "refreshing the outbox's gauges failed; retried at the next interval");
                }
            }));
        }
        if let Some(interval) = config.backfill_interval
            && !inner.registry.backfill_models().is_empty()
        {
            let walks = Arc::new(std::sync::Mutex::new(Walks {
                pace: inner
                    .live
                    .is_some()
                    .then(|| WalkPace::new(config.backfill_budget, Instant::now())),
                last_error: None,
            }));
            tasks.push(every(inner, interval, interval, move |inner| {
                let walks = Arc::clone(&walks);
                async move {
                    let Some(budget) = lock(&walks).budget(&inner) else {
                        return;
                    };
                    let result = inner.backfill(budget).await;
                    lock(&walks).ticked(result);
                }
            }));
        }
        Self(tasks)
    }
}

/// What the backfill's ticks carry from one to the next.
struct Walks {
    /// The rows a tick walks, set by the live latency (`None`: the whole budget each tick).
    pace: Option<WalkPace>,
    /// The last tick's error: an error is logged as a warning when it differs from the last
    /// one, since a backfill that cannot go on (a row that does not read back) would
    /// otherwise warn at every tick.
    last_error: Option<String>,
}

impl Walks {
    /// The rows the next tick walks, at most, per model; `None`: it skips its turn.
    fn budget<S: Store>(&mut self, inner: &Inner<S>) -> Option<usize> {
        let (budget, pace) = match (&mut self.pace, &inner.live) {
            (Some(pace), Some(live)) => (pace.budget(live, Instant::now()), pace.rows()),
            _ => (inner.config.backfill_budget, inner.config.backfill_budget),
        };
        crate::telemetry::backfill_pace(pace);
        (budget > 0).then_some(budget)
    }

    /// Takes in a tick's result.
    fn ticked(&mut self, result: Result<Vec<BackfillBatch>, Error>) {
        match result {
            Ok(batches) => {
                self.last_error = None;
                if let Some(pace) = &mut self.pace {
                    pace.walked(batches.iter().map(BackfillBatch::rows).sum());
                }
            }
            Err(error) => {
                let text = error_chain(&error);
                if self.last_error.as_deref() == Some(text.as_str()) {
                    debug!(error = %text, "backfill tick failed again; retried at the next interval");
                } else {
                    warn!(error = %text, "backfill tick failed; retried at the next interval");
                    self.last_error = Some(text);
                }
            }
        }
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The task that records the relay's heartbeat ([`beat`]): stopped between two heartbeats
/// by [`Heartbeats::stop`], aborted if dropped.
struct Heartbeats {
    stop: Arc<tokio::sync::Notify>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Heartbeats {
    fn start<S: Store>(inner: &Arc<Inner<S>>) -> Self {
        let stop = Arc::new(tokio::sync::Notify::new());
        let task = tokio::spawn(beat(Arc::clone(inner), Arc::clone(&stop)));
        Self {
            stop,
            task: Some(task),
        }
    }

    /// Stops the task once its heartbeat in flight (if any) is recorded.
    async fn stop(mut self) {
        self.stop.notify_one();
        if let Some(task) = self.task.take() {
            // The task ends on its own; it cannot panic short of a bug, logged by tokio.
            let _ = task.await;
        }
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Records the relay's heartbeat now, then every heartbeat interval, and at once when its
/// shards start or stop waiting on a breaker, until `stop`. A failure is logged once until
/// one succeeds.
async fn beat<S: Store>(inner: Arc<Inner<S>>, stop: Arc<tokio::sync::Notify>) {
    let config = &inner.config;
    let started_at = SystemTime::now();
    let interval = config.heartbeat_interval;
    let expires_in = interval.saturating_mul(3);
    let mut failing = false;
    loop {
        let heartbeat = inner
            .vitals
            .heartbeat(&config.worker_id, started_at, expires_in);
        match inner.store.beat(&heartbeat).await {
            Ok(()) => failing = false,
            Err(error) if !failing => {
                failing = true;
                debug!(error = %error_chain(&error), "recording the relay's heartbeat failed; retried at the next interval");
            }
            Err(_) => {}
        }
        tokio::select! {
            () = stop.notified() => return,
            () = tokio::time::sleep(interval) => {}
            () = inner.vitals.beat_wanted() => {}
        }
    }
}

/// Runs `task` after `first`, then every `interval`, in a task of its own.
fn every<S: Store, F, Fut>(
    inner: &Arc<Inner<S>>,
    first: Duration,
    interval: Duration,
    task: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(Arc<Inner<S>>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let inner = Arc::clone(inner);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(Instant::now() + first, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            task(Arc::clone(&inner)).await;
        }
    })
}

/// A paced task waits at least this many times as long as its last run took before the
/// next: it keeps the database busy for at most one part in `PACE + 1` of the time.
const PACE: u32 = 20;

/// Runs `task` at once, then again `interval` after each run began or, if that is later,
/// [`PACE`] times the run's length after it ended. The gauges read the whole outbox; while a
/// held vacuum horizon keeps every acknowledged row in the tables, one reading takes seconds,
/// and at a fixed interval it would keep one of the database's cores busy beside the relay's
/// claims.
fn paced<C, F, Fut>(context: &C, interval: Duration, task: F) -> tokio::task::JoinHandle<()>
where
    C: Clone + Send + 'static,
    F: Fn(C) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let context = context.clone();
    tokio::spawn(async move {
        loop {
            let began = Instant::now();
            task(context.clone()).await;
            let took = began.elapsed();
            let next = (began + interval).max(Instant::now() + took * PACE);
            tokio::time::sleep_until(next).await;
        }
    })
}

impl Drop for Upkeep {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Takes in a drain that ended: its counts, or the error that interrupted it.
fn finished(report: &mut RunReport, outage: &mut Outage, shard: &ShardKey, drained: Drained) {
    match drained {
        Ok(run) => report.absorb(run.as_ref()),
        Err(error) => {
            report.database_errors += 1;
            crate::telemetry::database_error("drain");
            if error.is_unavailable() {
                outage.interrupted(shard, &error);
            } else {
                warn!(%shard, error = %error_chain(&error), "draining the shard failed; it is released once the database answers");
            }
        }
    }
}

/// Where the sweep stands: the next page, whether it found a due shard to start so far,
/// whether it found any due shard (one being drained included), and how many whole sweeps in
/// a row found none.
#[derive(Debug)]
struct Sweep {
    cursor: Option<ShardKey>,
    found: bool,
    busy: bool,
    quiet: u32,
    /// The time this sweep's pages took to read so far.
    reading: Duration,
    /// The rest after the last whole sweep: [`Sweep::REST`] times its reading.
    rest: Duration,
}

impl Default for Sweep {
    /// A relay that has found nothing yet polls at the poll interval.
    fn default() -> Self {
        Self {
            cursor: None,
            found: false,
            busy: false,
            quiet: u32::MAX,
            reading: Duration::ZERO,
            rest: Duration::ZERO,
        }
    }
}

impl Sweep {
    /// A whole sweep is followed by a rest of this many times its reading (when that is
    /// longer than the minimum poll interval), so that sweeps take at most a quarter of the
    /// relay's time. Sweeps are the safety net (commit notifications start the drains of live
    /// messages); when pages are slow to read (a held vacuum horizon leaves every
    /// acknowledged row in the index they walk), sweeping again at once after each would keep
    /// a connection and a processor of the database busy with them.
    const REST: u32 = 3;

    /// A page read in `took`.
    fn read(&mut self, took: Duration) {
        self.reading += took;
    }

    /// Whether a whole sweep just ended that must rest before the next
    /// ([`Sweep::poll_after`]), even though it found due shards.
    fn resting(&self, config: &crate::RelayConfig) -> bool {
        self.cursor.is_none() && self.rest >= config.min_poll_interval()
    }

    /// Moves to the page after this one; whether to go on at once (to that page, or to a new
    /// sweep after one that found due shards) rather than wait.
    fn advance(&mut self, next: Option<ShardKey>) -> bool {
        self.cursor = next;
        if self.cursor.is_some() {
            return true;
        }
        self.rest = std::mem::take(&mut self.reading) * Self::REST;
        let found = std::mem::take(&mut self.found);
        self.quiet = if std::mem::take(&mut self.busy) {
            0
        } else {
            self.quiet.saturating_add(1)
        };
        found
    }

    /// How long an idle relay waits before it polls: the minimum poll interval after the
    /// first sweep that found nothing following work, doubling with each further one, up
    /// to the poll interval; and at least the last sweep's rest, up to the poll interval.
    fn poll_after(&self, config: &crate::RelayConfig) -> Duration {
        let doublings = self.quiet.saturating_sub(1).min(20);
        (config.min_poll_interval() * 2u32.pow(doublings))
            .max(self.rest)
            .min(config.poll_interval)
    }
}

/// The shards commit notifications named lately, each with when it was last named.
///
/// A sweep leaves such a shard alone: a notification started its drain (in the urgent lane)
/// when it came, and a page read before that drain emptied the shard still shows it due. A
/// shard is left alone for [`Heard::COVER`] after a notification named it: time enough for
/// its drain to start. After that (or after a drain failed, when the relay sweeps to retry)
/// sweeps treat it as any other, so that a message whose drain did not happen is found.
#[derive(Debug, Default)]
struct Heard {
    named: Map<ShardKey, Instant>,
}

impl Heard {
    /// How long after a notification names a shard sweeps leave it to that notification.
    const COVER: Duration = Duration::from_secs(1);

    /// A notification named `shard` at `now`.
    fn named(&mut self, shard: &ShardKey, now: Instant) {
        match self.named.get_mut(shard) {
            Some(at) => *at = now,
            None => {
                self.named.insert(shard.clone(), now);
            }
        }
    }

    /// Whether a notification named `shard` within [`Heard::COVER`] before `at`, or after it.
    fn lately(&self, shard: &ShardKey, at: Instant) -> bool {
        self.named
            .get(shard)
            .is_some_and(|named| *named + Self::COVER > at)
    }

    /// Forgets the shards named more than [`Heard::COVER`] before `at`.
    fn forget_before(&mut self, at: Instant) {
        self.named.retain(|_, named| *named + Self::COVER > at);
    }

    /// Forgets that a notification named `shard`.
    fn forget(&mut self, shard: &ShardKey) {
        self.named.remove(shard);
    }

    fn clear(&mut self) {
        self.named.clear();
    }
}

#[cfg(test)]
mod heard_tests {
    use super::*;
    use crate::model::ScopeId;

    fn shard(id: i64) -> ShardKey {
        ShardKey::local(ScopeId(1), id)
    }

    #[test]
    fn a_sweep_leaves_a_shard_to_the_notification_that_named_it_for_a_while() {
        let mut heard = Heard::default();
        let start = Instant::now();
        heard.named(&shard(1), start);
        // A page read before the notification came, or within the cover after it.
        assert!(heard.lately(&shard(1), start - Duration::from_millis(5)));
        assert!(heard.lately(&shard(1), start + Heard::COVER / 2));
        assert!(!heard.lately(&shard(2), start), "a shard never named");
        // After the cover, sweeps treat it as any other shard.
        assert!(!heard.lately(&shard(1), start + Heard::COVER));
        // Named again: covered again, from then.
        heard.named(&shard(1), start + Heard::COVER);
        assert!(heard.lately(&shard(1), start + Heard::COVER * 3 / 2));
        heard.named(&shard(2), start);
        heard.forget_before(start + Heard::COVER * 3 / 2);
        assert_eq!(heard.named.len(), 1, "shard 2's cover ended: forgotten");
        heard.forget(&shard(1));
        assert!(!heard.lately(&shard(1), start + Heard::COVER));
    }
}

/// The stream of commit notifications, when the store has one and it is wanted.
struct Listener<W> {
    stream: Option<W>,
    /// Whether to listen: configured, and not found unsupported by the store.
    enabled: bool,
    /// Whether to hear other processes' commits too.
    other_processes: bool,
    /// When to try to listen again after a failure.
    retry_at: Instant,
}

impl<W: WakeupStream> Listener<W> {
    /// How long a broken stream waits before the relay listens again.
    const RETRY: Duration = Duration::from_secs(1);

    fn new(enabled: bool, other_processes: bool) -> Self {
        Self {
            stream: None,
            enabled,
            other_processes,
            retry_at: Instant::now(),
        }
    }

    /// Opens the stream if it is wanted, missing, and due for another try.
    async fn listen<S: Store<Wakeups = W>>(&mut self, store: &S) {
        if !self.enabled || self.stream.is_some() || Instant::now() < self.retry_at {
            return;
        }
        match store.wakeups(self.other_processes).await {
            Ok(Some(stream)) => self.stream = Some(stream),
            Ok(None) => self.enabled = false,
            Err(error) => {
                debug!(error = %error_chain(&error), "cannot listen for commits; polling");
                self.retry_at = Instant::now() + Self::RETRY;
            }
        }
    }

    /// When an idle relay looks again: at `poll`, or sooner to listen again if commit
    /// notifications that should be there are missing.
    fn idle_until(&self, poll: Instant) -> Instant {
        if self.enabled && self.stream.is_none() {
            poll.min(self.retry_at)
        } else {
            poll
        }
    }

    /// The next notification; never, without a stream.
    async fn next(&mut self) -> Result<Wakeup, Error> {
        match &mut self.stream {
            Some(stream) => stream.next().await,
            None => std::future::pending().await,
        }
    }

    /// The stream broke: poll until it can be opened again.
    fn broke(&mut self, error: &Error) {
        warn!(error = %error_chain(error), "commit notifications broke; polling until they come back");
        self.stream = None;
        self.retry_at = Instant::now() + Self::RETRY;
    }
}

/// The relay's view of the database's availability, so that an outage is logged once when it
/// begins and once when it ends, however many shards and retries it touches (drains on
/// connections that died in it may fail a moment after it ended: they are the same event).
#[derive(Debug, Default)]
struct Outage {
    since: Option<Instant>,
    ended: Option<Instant>,
    announced: bool,
    shards: u64,
    retries: u64,
}

impl Outage {
    /// Failures this soon after an outage ended belong to it.
    const AFTERMATH: Duration = Duration::from_secs(10);

    fn begin(&mut self, error: &Error, what: &str) {
        if self.since.is_some() {
            debug!(error = %error_chain(error), "database still unavailable ({what})");
            return;
        }
        self.since = Some(Instant::now());
        if self
            .ended
            .is_some_and(|ended| ended.elapsed() < Self::AFTERMATH)
        {
            debug!(error = %error_chain(error), "database unavailable again, just after an outage ({what})");
        } else {
            self.announced = true;
            warn!(error = %error_chain(error), "database unavailable ({what}); retrying with backoff");
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
        self.ended = Some(Instant::now());
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

/// The pauses between reconnection attempts: the relay's [`Backoff`] from
/// [`Reconnect::FIRST`] up to `max_reconnect_delay`, jittered as the shards' backoff is, over
/// a count of consecutive failures that a success resets.
#[derive(Debug)]
struct Reconnect {
    backoff: Backoff,
    failures: u32,
}

impl Reconnect {
    /// The nominal pause after the first failure.
    const FIRST: Duration = Duration::from_millis(100);

    fn new(max: Duration, jitter: bool) -> Self {
        Self {
            backoff: Backoff::new(Self::FIRST.min(max), max).with_jitter(jitter),
            failures: 0,
        }
    }

    /// The pause after one more consecutive failure.
    fn next_delay(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.backoff.delay(self.failures)
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_paced_task_rests_twenty_times_a_slow_run_and_keeps_its_interval_when_quick() {
        let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let start = Instant::now();
        // Each run takes 2 s at first, then 10 ms: the interval is 1 s.
        let task = paced(&runs, Duration::from_secs(1), move |runs| async move {
            let slow = runs.lock().unwrap().len() < 2;
            runs.lock().unwrap().push(start.elapsed().as_millis());
            let took = if slow { 2_000 } else { 10 };
            tokio::time::sleep(Duration::from_millis(took)).await;
        });
        tokio::time::sleep(Duration::from_millis(87_500)).await;
        task.abort();
        let runs = runs.lock().unwrap().clone();
        // 0 → 2 s, then rests 40 s; 42 → 44 s, rests 40 s; then every second from 84 s.
        assert_eq!(runs, [0, 42_000, 84_000, 85_000, 86_000, 87_000]);
    }

    #[test]
    fn polling_speeds_up_after_work_and_slows_down_to_the_poll_interval() {
        let config = crate::RelayConfig::builder()
            .poll_interval(Duration::from_millis(100))
            .min_poll_interval(Duration::from_millis(10))
            .build()
            .unwrap();
        let mut sweep = Sweep::default();
        let waits = |sweep: &mut Sweep, found: &[bool]| -> Vec<u128> {
            found
                .iter()
                .map(|&found| {
                    sweep.found = found;
                    sweep.busy = found;
                    assert_eq!(sweep.advance(None), found);
                    sweep.poll_after(&config).as_millis()
                })
                .collect()
        };
        assert_eq!(waits(&mut sweep, &[false]), [100], "idle from the start");
        assert_eq!(
            waits(&mut sweep, &[true, false, false, false, false, false]),
            [10, 10, 20, 40, 80, 100]
        );
        assert_eq!(waits(&mut sweep, &[true, false]), [10, 10]);
        // A sweep whose due shards are all being drained already starts nothing, but work is
        // still arriving: the next poll comes soon.
        waits(&mut sweep, &[false, false, false]);
        sweep.busy = true;
        assert!(!sweep.advance(None));
        assert_eq!(sweep.poll_after(&config).as_millis(), 10);
        sweep.found = true;
        assert!(sweep.advance(Some(ShardKey::local(crate::ScopeId(1), 1))));
        assert!(sweep.found, "a sweep's pages share what it found");
    }

    #[test]
    fn a_slow_sweep_rests_three_times_its_reading_before_the_next() {
        let config = crate::RelayConfig::builder()
            .poll_interval(Duration::from_secs(1))
            .min_poll_interval(Duration::from_millis(10))
            .build()
            .unwrap();
        let mut sweep = Sweep::default();
        // Pages read quickly: a sweep that found due shards sweeps again at once.
        sweep.read(Duration::from_millis(1));
        sweep.found = true;
        sweep.busy = true;
        assert!(sweep.advance(None));
        assert!(!sweep.resting(&config));
        assert_eq!(sweep.poll_after(&config).as_millis(), 10);
        // Two pages of 60 ms: the next page follows at once, the next sweep after 360 ms,
        // even though this one found due shards.
        sweep.read(Duration::from_millis(60));
        sweep.found = true;
        sweep.busy = true;
        assert!(sweep.advance(Some(ShardKey::local(crate::ScopeId(1), 1))));
        assert!(
            !sweep.resting(&config),
            "a sweep does not rest between its pages"
        );
        sweep.read(Duration::from_millis(60));
        assert!(sweep.advance(None));
        assert!(sweep.resting(&config));
        assert_eq!(sweep.poll_after(&config).as_millis(), 360);
        // Never longer than the poll interval.
        sweep.read(Duration::from_secs(2));
        sweep.advance(None);
        assert_eq!(sweep.poll_after(&config), config.poll_interval);
    }

    #[test]
    fn reconnect_pauses_double_to_the_cap_and_reset() {
        let mut reconnect = Reconnect::new(Duration::from_secs(1), false);
        let millis: Vec<u128> = (0..7).map(|_| reconnect.next_delay().as_millis()).collect();
        assert_eq!(millis, [100, 200, 400, 800, 1000, 1000, 1000]);
        reconnect.reset();
        assert_eq!(reconnect.next_delay(), Duration::from_millis(100));
        let mut short = Reconnect::new(Duration::from_millis(30), false);
        assert_eq!(
            short.next_delay(),
            Duration::from_millis(30),
            "a cap below 100 ms"
        );
    }

    #[test]
    fn reconnect_pauses_are_jittered_within_their_bounds_and_capped() {
        let max = Duration::from_secs(30);
        let config = crate::RelayConfig::builder()
            .max_reconnect_delay(max)
            .build()
            .unwrap();
        let mut reconnect = Reconnect::new(config.max_reconnect_delay, config.backoff.jitter);
        let mut capped = Vec::new();
        for failure in 1..=40u32 {
            let delay = reconnect.next_delay();
            let nominal = (Reconnect::FIRST * 2u32.pow(failure.min(20) - 1)).min(max);
            assert!(
                delay >= nominal / 2 && delay <= nominal,
                "failure {failure}: {delay:?} outside [{:?}, {nominal:?}]",
                nominal / 2
            );
            if nominal == max {
                capped.push(delay);
            }
        }
        assert!(capped.len() > 20);
        assert!(
            capped.windows(2).any(|pair| pair[0] != pair[1]),
            "by default, reconnection pauses are jittered: {capped:?}"
        );
    }
}
