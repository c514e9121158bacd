//! The shards being drained at once: their permits, tasks and stop signal.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::{JoinError, JoinSet};

use crate::model::ShardKey;

/// Shards drained concurrently, at most the configuration's `shards_held` at once (whose
/// handlers take turns at the relay's slots), each at most once at a time: one pool per pass,
/// flush or run of the relay.
///
/// Starting a shard waits for a free permit; its task holds the permit until it ends. The
/// pool's stop signal ([`ShardPool::stopping`]) tells the drains it started that the relay is
/// stopping, so that they yield after their current delivery.
pub(super) struct ShardPool<T> {
    permits: Arc<Semaphore>,
    /// The permits in all.
    capacity: usize,
    /// Notified when a drain ends (its permit back).
    ended: Arc<Notify>,
    tasks: JoinSet<(ShardKey, T)>,
    in_flight: HashSet<ShardKey>,
    stop: watch::Sender<bool>,
}

impl<T: Send + 'static> ShardPool<T> {
    pub(super) fn new(shards_held: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(shards_held)),
            capacity: shards_held,
            ended: Arc::new(Notify::new()),
            tasks: JoinSet::new(),
            in_flight: HashSet::new(),
            stop: watch::Sender::new(false),
        }
    }

    /// Whether the relay is stopping, for the drains this pool starts.
    pub(super) fn stopping(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Whether `shard` is being drained.
    pub(super) fn is_draining(&self, shard: &ShardKey) -> bool {
        self.in_flight.contains(shard)
    }

    /// Starts the work `begin` makes on `shard` once a permit is free, unless the shard is
    /// being drained already; returns whether it started. Cancel-safe: cancelled while it
    /// waits for a permit, it starts nothing. (The work is made only once it starts, so that
    /// this future does not carry it while it waits.)
    pub(super) async fn start<F>(&mut self, shard: ShardKey, begin: impl FnOnce() -> F) -> bool
    where
        F: Future<Output = T> + Send + 'static,
    {
        if self.in_flight.contains(&shard) {
            return false;
        }
        let Some(permit) = self.permits(1, usize::MAX).await.pop() else {
            return false;
        };
        self.spawn(shard, permit, begin());
        true
    }

    /// Up to `want` permits (at least one, if `want` is), while fewer than `hold` drains run
    /// (the shards the handlers' pace can take soon: [`Pace::shards_to_hold`]): waits until
    /// one more may start, then takes those free at once, up to `hold` running. Cancel-safe.
    /// Each starts one drain ([`ShardPool::spawn`]); those left unused go back when dropped.
    pub(super) async fn permits(&self, want: usize, hold: usize) -> Vec<OwnedSemaphorePermit> {
        if want == 0 {
            return Vec::new();
        }
        let hold = hold.max(1);
        let running = loop {
            // Registered before the count is read: a drain that ends in between still wakes
            // this wait.
            let ended = self.ended.notified();
            let running = self.capacity - self.permits.available_permits();
            if running < hold {
                break running;
            }
            ended.await;
        };
        let want = want.min(hold - running);
        let first = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the pool never closes its semaphore");
        let mut permits = vec![first];
        while permits.len() < want {
            match Arc::clone(&self.permits).try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        permits
    }

    /// Starts `work` on `shard` under `permit` (from [`ShardPool::permits`]): what a claim
    /// made for this pool drains. The shard must not be draining in this pool already.
    pub(super) fn spawn<F>(&mut self, shard: ShardKey, permit: OwnedSemaphorePermit, work: F)
    where
        F: Future<Output = T> + Send + 'static,
    {
        debug_assert!(!self.in_flight.contains(&shard), "{shard} drains twice");
        self.in_flight.insert(shard.clone());
        let ended = Arc::clone(&self.ended);
        self.tasks.spawn(async move {
            let output = work.await;
            drop(permit);
            ended.notify_one();
            (shard, output)
        });
    }

    /// A drain that has ended, if one has.
    pub(super) fn finished(&mut self) -> Option<(ShardKey, T)> {
        let done = self.tasks.try_join_next()?;
        Some(self.joined(done))
    }

    /// Waits for the next drain to end; `None` if none is running.
    pub(super) async fn next_finished(&mut self) -> Option<(ShardKey, T)> {
        let done = self.tasks.join_next().await?;
        Some(self.joined(done))
    }

    /// How many drains are running.
    pub(super) fn len(&self) -> usize {
        self.tasks.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Tells the drains to stop, and waits up to `deadline` for them, handing each that ends
    /// to `finished`. Drains still running then are abandoned (their leases expire; nothing is
    /// lost); returns how many.
    pub(super) async fn stop_within(
        &mut self,
        deadline: Duration,
        mut finished: impl FnMut(ShardKey, T),
    ) -> usize {
        let _ = self.stop.send(true);
        let deadline = tokio::time::sleep(deadline);
        tokio::pin!(deadline);
        while !self.tasks.is_empty() {
            tokio::select! {
                () = &mut deadline => {
                    let abandoned = self.tasks.len();
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                    return abandoned;
                }
                Some(done) = self.tasks.join_next() => {
                    let (shard, output) = self.joined(done);
                    finished(shard, output);
                }
            }
        }
        0
    }

    fn joined(&mut self, done: Result<(ShardKey, T), JoinError>) -> (ShardKey, T) {
        let (shard, output) = joined(done);
        self.in_flight.remove(&shard);
        (shard, output)
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

/// How fast handlers take their turns: a relay holds no more shards than its handlers get
/// through within [`Pace::HORIZON`], so that with slow handlers it leaves the rest to other
/// relays, and with fast ones claims whole batches.
#[derive(Debug)]
pub(super) struct Pace {
    /// A moving average of a turn's length, in nanoseconds.
    nanos_per_turn: AtomicU64,
}

impl Default for Pace {
    /// Until a turn is measured, a relay holds as many shards as run at once.
    fn default() -> Self {
        Self {
            nanos_per_turn: AtomicU64::new(Self::HORIZON.as_nanos() as u64),
        }
    }
}

impl Pace {
    /// How long a held shard should wait for its turn, at most, at the handlers' pace.
    pub(super) const HORIZON: Duration = Duration::from_millis(10);

    /// A turn took `took`.
    pub(super) fn turned(&self, took: Duration) {
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let average = self.nanos_per_turn.load(Ordering::Relaxed);
        let next = average - average / 8 + took / 8;
        self.nanos_per_turn.store(next.max(1), Ordering::Relaxed);
    }

    /// The shards to hold at once: what `slots` handlers at the measured pace get through
    /// within the horizon, no fewer than `slots` and no more than `most`.
    pub(super) fn shards_to_hold(&self, slots: usize, most: usize) -> usize {
        let per_turn = u128::from(self.nanos_per_turn.load(Ordering::Relaxed).max(1));
        let soon = slots as u128 * Self::HORIZON.as_nanos() / per_turn;
        usize::try_from(soon)
            .unwrap_or(usize::MAX)
            .clamp(slots.min(most), most)
    }
}
