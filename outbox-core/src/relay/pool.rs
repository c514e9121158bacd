//! The shards being drained at once: their permits, tasks and stop signal.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::{JoinError, JoinSet};

use super::config::RelayConfig;
use crate::hashed::Set;
use crate::model::ShardKey;

/// Shards drained concurrently, at most the pool's capacity at once ([`ShardPool::relays`],
/// [`ShardPool::flushes`]), each at most once at a time: one pool per pass, flush or run of
/// the relay.
///
/// Starting a shard waits for a free permit. A task of the pool drains one shard or several
/// (the shards of one claim: [`ShardPool::spawn_many`]) and reports each shard's end as it
/// comes ([`Ends::end`]), its permit going back then. The pool's stop signal
/// ([`ShardPool::stopping`]) tells the drains it started that the relay is stopping, so that
/// they yield after their current delivery.
pub(super) struct ShardPool<T> {
    permits: Arc<Semaphore>,
    /// The permits in all.
    capacity: usize,
    /// Notified when a drain ends (its permit back) with no more than `wake_at` running.
    ended: Arc<Notify>,
    /// The most drains running at which one that ends wakes the wait for permits: a wait for
    /// room for several is woken once there is room, not by every drain that ends (a wake-up
    /// of a task on another thread costs more than most drains at one message per shard).
    wake_at: Arc<AtomicUsize>,
    /// The tasks; what they drained comes through `ends`.
    tasks: JoinSet<()>,
    /// Where the tasks report shards' ends, several at once where they end together.
    report: mpsc::UnboundedSender<Vec<(ShardKey, T)>>,
    ends: mpsc::UnboundedReceiver<Vec<(ShardKey, T)>>,
    /// The ends of the last report not yet handed out.
    received: std::vec::IntoIter<(ShardKey, T)>,
    in_flight: Set<ShardKey>,
    stop: watch::Sender<bool>,
}

/// How a task of a [`ShardPool`] reports the end of each shard it drains: the shard's permit
/// goes back then, not when the whole task ends, so that one slow shard of a claim does not
/// hold the room of the others.
pub(super) struct Ends<T> {
    permits: Vec<OwnedSemaphorePermit>,
    report: mpsc::UnboundedSender<Vec<(ShardKey, T)>>,
    pool_permits: Arc<Semaphore>,
    capacity: usize,
    ended: Arc<Notify>,
    wake_at: Arc<AtomicUsize>,
}

impl<T> Ends<T> {
    /// The ends of `count` of the task's shards, for a task of its own to report.
    pub(super) fn split(&mut self, count: usize) -> Self {
        let keep = self.permits.len().saturating_sub(count);
        Self {
            permits: self.permits.split_off(keep),
            report: self.report.clone(),
            pool_permits: Arc::clone(&self.pool_permits),
            capacity: self.capacity,
            ended: Arc::clone(&self.ended),
            wake_at: Arc::clone(&self.wake_at),
        }
    }

    /// `shard`, one of the task's, ended with `output`: its permit goes back, and the pool
    /// hears it.
    pub(super) fn end(&mut self, shard: ShardKey, output: T) {
        self.end_all(vec![(shard, output)]);
    }

    /// The shards of `ended`, the task's, ended each with its output: their permits go back,
    /// and the pool hears them in one report.
    pub(super) fn end_all(&mut self, ended: Vec<(ShardKey, T)>) {
        if ended.is_empty() {
            return;
        }
        let keep = self.permits.len().saturating_sub(ended.len());
        self.permits.truncate(keep);
        fence(Ordering::SeqCst);
        let running = self.capacity - self.pool_permits.available_permits();
        if running <= self.wake_at.load(Ordering::SeqCst) {
            self.ended.notify_one();
        }
        // The pool outlives its tasks' reports unless it was dropped: then nobody listens.
        let _ = self.report.send(ended);
    }
}

impl<T: Send + 'static> ShardPool<T> {
    /// The pool of the relay's own drains: they hold up to a claim's batch
    /// ([`RelayConfig::shards_held`]), their handlers taking turns at the relay's slots.
    pub(super) fn relays(config: &RelayConfig) -> Self {
        Self::new(config.shards_held())
    }

    /// The pool of a flush's drains, which take no handler slot (a handler may flush what it
    /// writes, and must not wait for the slot it holds): this pool alone bounds them, at
    /// `max_concurrent_shards`.
    pub(super) fn flushes(config: &RelayConfig) -> Self {
        Self::new(config.max_concurrent_shards)
    }

    pub(super) fn new(shards_held: usize) -> Self {
        let (report, ends) = mpsc::unbounded_channel();
        Self {
            permits: Arc::new(Semaphore::new(shards_held)),
            capacity: shards_held,
            ended: Arc::new(Notify::new()),
            wake_at: Arc::new(AtomicUsize::new(usize::MAX)),
            tasks: JoinSet::new(),
            report,
            ends,
            received: Vec::new().into_iter(),
            in_flight: Set::default(),
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

    /// Keeps those of `shards` that this pool is not draining and that `keep` keeps, each
    /// once, in order: the shards to start. (A list of shards to start may name one twice: a
    /// shard that two commit notifications named before it started.)
    pub(super) fn to_start(&self, shards: &mut Vec<ShardKey>, keep: impl Fn(&ShardKey) -> bool) {
        // A discovery's page is in key order, each shard once: no set is needed to see that.
        if shards.is_sorted_by(|a, b| a < b) {
            shards.retain(|shard| !self.is_draining(shard) && keep(shard));
            return;
        }
        let mut seen = Set::with_capacity_and_hasher(shards.len(), Default::default());
        shards
            .retain(|shard| !self.is_draining(shard) && keep(shard) && seen.insert(shard.clone()));
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

    /// Up to `want` permits (at least one, if `want` is), with no more than `hold` drains
    /// running (the shards the handlers' pace can take soon: [`Pace::shards_to_hold`]): waits
    /// until none runs, or room is free for `want` or a quarter of `hold`, whichever is
    /// fewer, then takes those free at once. So a busy relay claims in batches (each claim
    /// costs a commit, whatever its size), and an idle one at once. Cancel-safe. Each starts
    /// one drain ([`ShardPool::spawn`]); those left unused go back when dropped.
    pub(super) async fn permits(&self, want: usize, hold: usize) -> Vec<OwnedSemaphorePermit> {
        if want == 0 {
            return Vec::new();
        }
        let hold = hold.max(1);
        let enough = want.min(hold / 4).max(1);
        self.wake_at.store(hold - enough, Ordering::SeqCst);
        // The threshold is stored before the count is read, and a drain that ends reads it
        // after its permit is back: one of the two sees the other (and the last drain to end
        // always wakes the wait, none then running).
        fence(Ordering::SeqCst);
        let running = loop {
            // Registered before the count is read: a drain that ends in between still wakes
            // this wait.
            let ended = self.ended.notified();
            let running = self.capacity - self.permits.available_permits();
            if running == 0 || running + enough <= hold {
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

    /// Starts `work` on `shard` under `permit` (from [`ShardPool::permits`]), unless this pool
    /// is draining the shard already (see [`ShardPool::spawn_many`]).
    pub(super) fn spawn<F>(&mut self, shard: ShardKey, permit: OwnedSemaphorePermit, work: F)
    where
        F: Future<Output = T> + Send + 'static,
    {
        self.spawn_many(
            vec![(shard, permit)],
            move |mut shards, mut ends| async move {
                let output = work.await;
                if let Some(shard) = shards.pop() {
                    ends.end(shard, output);
                }
            },
        );
    }

    /// Starts one task on `shards`, each under its permit (from [`ShardPool::permits`]): the
    /// task `begin` makes from the shards started and their [`Ends`], through which it must
    /// report each shard's end. A shard this pool is draining already is not started again
    /// (its permit goes back): two drains of one shard in one pool would each end its being
    /// in flight, and the first to end would let a third start beside the other.
    pub(super) fn spawn_many<F>(
        &mut self,
        shards: Vec<(ShardKey, OwnedSemaphorePermit)>,
        begin: impl FnOnce(Vec<ShardKey>, Ends<T>) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut started = Vec::with_capacity(shards.len());
        let mut permits = Vec::with_capacity(shards.len());
        for (shard, permit) in shards {
            if self.in_flight.insert(shard.clone()) {
                started.push(shard);
                permits.push(permit);
            }
        }
        if started.is_empty() {
            return;
        }
        let ends = Ends {
            permits,
            report: self.report.clone(),
            pool_permits: Arc::clone(&self.permits),
            capacity: self.capacity,
            ended: Arc::clone(&self.ended),
            wake_at: Arc::clone(&self.wake_at),
        };
        self.tasks.spawn(begin(started, ends));
    }

    /// A drain that has ended, if one has.
    pub(super) fn finished(&mut self) -> Option<(ShardKey, T)> {
        while let Some(done) = self.tasks.try_join_next() {
            joined(done);
        }
        self.try_next_end()
    }

    /// The next end reported, if one is there now: from the last report, or the next one.
    fn try_next_end(&mut self) -> Option<(ShardKey, T)> {
        if self.received.len() == 0 {
            self.received = self.ends.try_recv().ok()?.into_iter();
        }
        self.received.next().map(|end| self.ended(end))
    }

    /// Waits for the next drain to end; `None` if none is running.
    pub(super) async fn next_finished(&mut self) -> Option<(ShardKey, T)> {
        loop {
            if let Some(end) = self.received.next() {
                return Some(self.ended(end));
            }
            if self.in_flight.is_empty() {
                return None;
            }
            tokio::select! {
                biased;
                Some(ends) = self.ends.recv() => self.received = ends.into_iter(),
                done = self.tasks.join_next() => match done {
                    // A task whose shards all reported ends; one that panicked panics here.
                    Some(done) => joined(done),
                    None => {
                        let ends = self.ends.try_recv().unwrap_or_else(|_| {
                            panic!("a relay task ended without reporting {} of its shards", self.in_flight.len())
                        });
                        self.received = ends.into_iter();
                    }
                },
            }
        }
    }

    /// How many shards are draining.
    pub(super) fn len(&self) -> usize {
        self.in_flight.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
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
        loop {
            tokio::select! {
                () = &mut deadline => break,
                end = self.next_finished() => match end {
                    Some((shard, output)) => finished(shard, output),
                    None => return 0,
                },
            }
        }
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        // Those that ended while the tasks were aborted are not abandoned.
        while let Some((shard, output)) = self.try_next_end() {
            finished(shard, output);
        }
        let abandoned = self.in_flight.len();
        self.in_flight.clear();
        abandoned
    }

    fn ended(&mut self, (shard, output): (ShardKey, T)) -> (ShardKey, T) {
        self.in_flight.remove(&shard);
        (shard, output)
    }
}

/// Handler panics are caught where handlers run; a panicking task is a bug in the relay itself,
/// so it is re-raised rather than hidden.
pub(super) fn joined<T>(done: Result<T, JoinError>) -> T {
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

    /// Takes every turn so far to have lasted `turn`: the pace a test pins (see
    /// [`crate::__private::assume_turns_take`]).
    pub(super) fn assume(&self, turn: Duration) {
        let turn = u64::try_from(turn.as_nanos()).unwrap_or(u64::MAX);
        self.nanos_per_turn.store(turn.max(1), Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;
    use tokio::sync::oneshot;

    use super::*;
    use crate::model::ScopeId;

    fn shard(id: i64) -> ShardKey {
        ShardKey::local(ScopeId(1), id)
    }

    /// A permit of `pool`, which has one free.
    fn free_permit<T: Send + 'static>(pool: &ShardPool<T>) -> OwnedSemaphorePermit {
        pool.permits(1, usize::MAX)
            .now_or_never()
            .expect("a permit is free")
            .pop()
            .expect("one permit")
    }

    /// Starts `count` drains that each end when told, from shard `first` on.
    fn blocked(pool: &mut ShardPool<()>, first: i64, count: i64) -> Vec<oneshot::Sender<()>> {
        let mut ends = Vec::new();
        for id in first..first + count {
            let permit = free_permit(pool);
            let (end, ended) = oneshot::channel::<()>();
            pool.spawn(shard(id), permit, async move {
                let _ = ended.await;
            });
            ends.push(end);
        }
        ends
    }

    #[tokio::test]
    async fn a_shard_named_twice_is_started_once_and_stays_in_flight_until_its_drain_ends() {
        let mut pool: ShardPool<()> = ShardPool::new(8);
        let mut ends = blocked(&mut pool, 1, 1);
        // Shard 2 named twice (two notifications before it started), shard 1 draining.
        let mut due = vec![shard(2), shard(1), shard(3), shard(2)];
        pool.to_start(&mut due, |_| true);
        assert_eq!(
            due,
            [shard(2), shard(3)],
            "each once, in order, none draining"
        );
        let mut kept = vec![shard(3), shard(4), shard(5)];
        pool.to_start(&mut kept, |key| *key != shard(4));
        assert_eq!(kept, [shard(3), shard(5)]);
        // A second drain of a shard in flight is not started, and its permit goes back.
        let permit = free_permit(&pool);
        pool.spawn(shard(1), permit, async {});
        assert_eq!(pool.len(), 1, "shard 1 drains once");
        assert_eq!(
            pool.permits.available_permits(),
            7,
            "the second's permit went back"
        );
        let _ = ends.pop().expect("a drain").send(());
        let (ended, ()) = pool.next_finished().await.expect("a drain ended");
        assert_eq!(ended, shard(1));
        assert!(!pool.is_draining(&shard(1)));
        assert!(pool.next_finished().await.is_none(), "no second drain ran");
    }

    #[tokio::test]
    async fn a_task_of_several_shards_ends_each_when_it_ends_and_skips_those_in_flight() {
        let mut pool: ShardPool<u32> = ShardPool::new(8);
        let held = free_permit(&pool);
        pool.spawn(shard(9), held, std::future::pending());
        let permits: Vec<_> = (0..4).map(|_| free_permit(&pool)).collect();
        let (go, wait) = oneshot::channel::<()>();
        let shards = [1, 2, 9, 3].map(shard);
        pool.spawn_many(
            shards.into_iter().zip(permits).collect(),
            |started, mut ends| {
                assert_eq!(
                    started,
                    [1, 2, 3].map(shard),
                    "shard 9 is in flight already"
                );
                async move {
                    let mut started = started.into_iter();
                    ends.end(started.next().expect("shard 1"), 1);
                    let _ = wait.await;
                    for (shard, output) in started.zip(2..) {
                        ends.end(shard, output);
                    }
                }
            },
        );
        assert_eq!(
            pool.permits.available_permits(),
            4,
            "9 and the three started"
        );
        assert_eq!(pool.next_finished().await, Some((shard(1), 1)));
        assert!(!pool.is_draining(&shard(1)), "ended while its task runs on");
        assert!(pool.is_draining(&shard(2)));
        assert_eq!(pool.len(), 3);
        assert_eq!(pool.permits.available_permits(), 5, "its permit is back");
        let _ = go.send(());
        assert_eq!(pool.next_finished().await, Some((shard(2), 2)));
        assert_eq!(pool.next_finished().await, Some((shard(3), 3)));
        assert_eq!(pool.len(), 1, "shard 9 still drains");
    }

    #[tokio::test]
    async fn a_busy_pool_hands_out_permits_in_batches_and_an_idle_one_at_once() {
        let mut pool: ShardPool<()> = ShardPool::new(8);
        assert_eq!(
            pool.permits(3, 8)
                .now_or_never()
                .map(|permits| permits.len()),
            Some(3),
            "nothing runs: at once"
        );
        let mut ends = blocked(&mut pool, 1, 8);
        for _ in 0..1 {
            let _ = ends.pop().expect("a drain").send(());
            pool.next_finished().await.expect("a drain ended");
        }
        assert!(
            pool.permits(8, 8).now_or_never().is_none(),
            "one free of 8: a claim waits for a quarter of the batch"
        );
        let _ = ends.pop().expect("a drain").send(());
        pool.next_finished().await.expect("a drain ended");
        let permits = pool
            .permits(8, 8)
            .now_or_never()
            .expect("a quarter is free");
        assert_eq!(permits.len(), 2);
        drop(permits);
        assert_eq!(
            pool.permits(1, 8)
                .now_or_never()
                .map(|permits| permits.len()),
            Some(1),
            "a claim of one waits for one"
        );
        assert!(
            pool.permits(2, 6).now_or_never().is_none(),
            "no more running than the pace holds"
        );
        drop(ends);
        while pool.next_finished().await.is_some() {}
    }

    #[tokio::test]
    async fn a_wait_for_room_is_woken_once_there_is_room_not_by_every_drain_that_ends() {
        let mut pool: ShardPool<()> = ShardPool::new(8);
        let mut ends = blocked(&mut pool, 1, 8);
        // A claim of 8 with 8 held waits for a quarter of them: woken at 6 running.
        assert!(pool.permits(8, 8).now_or_never().is_none());
        // The wake-up a drain leaves, if any, is taken by the next wait.
        let woken = |pool: &ShardPool<()>| pool.ended.notified().now_or_never().is_some();
        let _ = ends.pop().expect("a drain").send(());
        pool.next_finished().await.expect("a drain ended");
        assert!(!woken(&pool), "7 running: no room yet, the wait sleeps on");
        let _ = ends.pop().expect("a drain").send(());
        pool.next_finished().await.expect("a drain ended");
        assert!(woken(&pool), "6 running: room for 2, the wait is woken");
        assert_eq!(
            pool.permits(8, 8)
                .now_or_never()
                .map(|permits| permits.len()),
            Some(2)
        );
        // Whatever the wait asked for, the last drain to end wakes it.
        assert!(pool.permits(1, 1).now_or_never().is_none());
        for end in ends.drain(..) {
            let _ = end.send(());
            pool.next_finished().await.expect("a drain ended");
        }
        assert!(woken(&pool), "none running: the wait is woken");
    }

    #[test]
    fn the_pace_holds_what_the_handlers_get_through_soon() {
        let pace = Pace::default();
        assert_eq!(
            pace.shards_to_hold(16, 512),
            16,
            "unmeasured: as many as run"
        );
        for _ in 0..100 {
            pace.turned(Duration::from_micros(10));
        }
        assert_eq!(
            pace.shards_to_hold(16, 512),
            512,
            "quick handlers: a whole batch"
        );
        for _ in 0..100 {
            pace.turned(Duration::from_millis(2));
        }
        let held = pace.shards_to_hold(16, 512);
        assert!(
            (70..=90).contains(&held),
            "16 slots of 2 ms for 10 ms: {held}"
        );
        for _ in 0..100 {
            pace.turned(Duration::from_secs(1));
        }
        assert_eq!(
            pace.shards_to_hold(16, 512),
            16,
            "slow handlers: as many as run"
        );
        assert_eq!(pace.shards_to_hold(16, 4), 4, "never more than a batch");
    }
}
