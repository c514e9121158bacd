//! Draining one claimed shard: read its head, deliver its groups in order, acknowledge what got
//! through, and end (released, yielded, backed off) on a [`DrainEnd`].

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{SemaphorePermit, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::Inner;
use super::deliver::{deliver, deliver_all, keeping_the_lease};
use super::health::InFlight;
use super::plan::{Group, Plan};
use super::pool::Pace;
use super::slots::{Lane, Slot};
use super::together::Finished;
use crate::error::{Error, error_chain};
use crate::handler::DeliveryError;
use crate::handler::Pipeline;
use crate::model::{MessageId, ShardKey};
use crate::sink::Breaker;
use crate::store::{
    Acknowledgement, DeadLettering, Failure, HandlerMode, Lease, Outcome, ShardSession, Store,
};

/// A delivery failure that backed a shard off.
#[derive(Debug)]
#[non_exhaustive]
pub struct ShardFailure {
    /// The shard.
    pub shard: ShardKey,
    /// What failed.
    pub error: DeliveryError,
    /// The shard's consecutive failed attempts, counting this one.
    pub attempts: u32,
    /// How long until the shard is retried (sooner if a new message arrives).
    pub retry_in: Duration,
}

/// A failing group set aside by its category's dead-letter policy: the shard went on
/// with the groups behind it.
#[derive(Debug)]
#[non_exhaustive]
pub struct DeadLettered {
    /// The shard.
    pub shard: ShardKey,
    /// The last failure.
    pub error: DeliveryError,
    /// The failed attempts at the group, counting the last.
    pub attempts: u32,
    /// The rows set aside.
    pub rows: u64,
}

/// What a drain is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainMode {
    /// The relay's: everything due; the shard yields when its row or time budget is spent, so
    /// one hot shard cannot starve the others; a failure backs the shard off.
    Relay,
    /// A flush (after commit, or a runner's pass): the rows up to `up_to`, all of them (its
    /// caller waits for exactly these); a failure is reported and leaves the shard's
    /// schedule as it was, for the relay to retry.
    Flush {
        /// The newest row the flush delivers.
        up_to: MessageId,
    },
}

impl DrainMode {
    /// The newest row this drain may deliver.
    fn bound(self) -> MessageId {
        match self {
            Self::Relay => MessageId(i64::MAX),
            Self::Flush { up_to } => up_to,
        }
    }
}

/// How a drain of a claimed shard ended.
#[derive(Debug)]
pub(crate) enum DrainEnd {
    /// Nothing left that the drain saw (up to its bound): released, failures reset.
    Drained,
    /// The row or time budget was spent (or the relay is stopping) with rows left: released,
    /// still due.
    Yielded,
    /// A delivery failed: the shard backs off (a flush releases it as it was). Boxed: the
    /// rare end, and every drain's result moves with room for it.
    Failed(Box<ShardFailure>),
    /// Another worker took the shard over before the drain could acknowledge: nothing of
    /// this drain's deliveries was acknowledged after that.
    LeaseLost,
    /// A flush found none of its rows left: released with its recorded state as it was.
    ReleasedUnchanged,
    /// A delivery found its system unreachable (a sink's breaker is open): released with no
    /// attempt counted, to be drained again when the breaker closes.
    Unavailable(Breaker),
}

/// What one drain of one claimed shard did.
#[derive(Debug)]
pub(crate) struct ShardRun {
    pub(crate) shard: ShardKey,
    pub(crate) end: DrainEnd,
    /// Whether the release at the end found the lease gone (another worker owns the shard).
    pub(crate) lost_at_release: bool,
    pub(crate) deliveries: u64,
    pub(crate) rows_acknowledged: u64,
    pub(crate) dead_lettered: Vec<DeadLettered>,
}

impl ShardRun {
    /// Whether the lease passed to another worker during the drain.
    pub(crate) fn lost_lease(&self) -> bool {
        self.lost_at_release || matches!(self.end, DrainEnd::LeaseLost)
    }

    pub(crate) fn failure(&self) -> Option<&ShardFailure> {
        match &self.end {
            DrainEnd::Failed(failure) => Some(failure),
            _ => None,
        }
    }
}

/// A shard's head as one read found it.
struct Read<'a> {
    plan: Plan,
    /// Whether the read was full: the shard may hold more rows than it returned.
    full: bool,
    /// The read's share of the rows the relay's held shards may hold ([`DrainState::rows`]),
    /// returned when the read is settled.
    _rows: Option<SemaphorePermit<'a>>,
}

/// What a read's deliveries came to.
#[derive(Default)]
struct Delivered {
    /// What acknowledging the groups that got through acknowledges, in the order they did:
    /// their rows taken from the plan once the deliveries are done.
    acks: Vec<Acknowledgement>,
    failure: Option<Failed>,
    out_of_budget: bool,
    /// The lease lapsed and another worker took the shard over before the next delivery:
    /// nothing more is delivered, and nothing acknowledged.
    lease_lost: bool,
}

/// A group whose delivery failed.
struct Failed {
    error: DeliveryError,
    /// The group's rows that the delivery covered.
    rows: Acknowledgement,
    /// The attempt that failed.
    attempt: u32,
    /// Its category's dead-letter policy.
    max_attempts: Option<u32>,
    /// Its category.
    category: crate::model::CategoryId,
}

impl Failed {
    /// `group`'s delivery at `attempt` failed with `error`.
    fn of(group: &Group, attempt: u32, error: DeliveryError) -> Self {
        Self {
            error,
            rows: group.acknowledgement(),
            attempt,
            max_attempts: group.info.identity.max_attempts,
            category: group.info.identity.id,
        }
    }

    /// Whether the group goes to the dead letters rather than block the shard: the failure
    /// is the message's own and its category's attempts are spent.
    fn dead_letters(&self) -> bool {
        self.error.is_message_failure() && self.max_attempts.is_some_and(|n| self.attempt >= n)
    }
}

/// A handler's turn: one of the relay's slots, its length measured for the relay's pace
/// when it ends.
struct Turn<'a> {
    _slot: Option<Slot<'a>>,
    pace: &'a Pace,
    since: Instant,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.pace.turned(self.since.elapsed());
    }
}

/// A claimed shard being drained: its session, and where the drain stands.
struct ShardDrain<'a, St: Store> {
    session: St::Session,
    state: DrainState<'a, St>,
}

/// Where a drain stands.
struct DrainState<'a, St: Store> {
    lease: Lease,
    inner: &'a Inner<St>,
    /// Counts the drain among the relay's claimed shards (its health) until it ends.
    _in_flight: InFlight<'a>,
    /// When the drain began, after its claim: its length, for the relay's metrics.
    began: Instant,
    stopping: &'a watch::Receiver<bool>,
    mode: DrainMode,
    /// Where it waits for its handlers' turns.
    lane: Lane,
    /// When the drain's first handler turn began (`None` before it): the time budget counts
    /// from it, not from the claim, whose shard may wait behind the others of its batch.
    started: Option<Instant>,
    /// When the lease was last set, by this relay's clock: no later than the statement that
    /// claimed, acknowledged or extended it (see [`DrainState::extend_lease`]).
    held_since: Instant,
    /// Whether an acknowledgement moved the shard's head during this drain.
    progressed: bool,
    rows_delivered: u64,
    /// The highest message id seen.
    watermark: MessageId,
    deliveries: u64,
    rows_acknowledged: u64,
    dead_lettered: Vec<DeadLettered>,
}

/// The error that interrupted a drain's finish, with the lease it leaves to release (boxed: the
/// error path is rare, and the result of every finish carries room for it).
pub(crate) type Interrupted = Box<(Error, Lease)>;

/// Where a drain of a claimed shard stopped.
pub(crate) enum Ending<'a, St: Store> {
    /// It ended: released, its outcome recorded.
    Ended(ShardRun),
    /// It delivered everything its shard held: what got through is acknowledged with the
    /// shard's release by [`Emptied::finish`], or with the other shards emptied now
    /// ([`Emptied::finish_together`]).
    Emptied(Emptied<'a, St>),
}

/// A drain that delivered every row its shard held, waiting to acknowledge them and release
/// the shard in one statement.
pub(crate) struct Emptied<'a, St: Store> {
    session: St::Session,
    state: DrainState<'a, St>,
    acks: Vec<Acknowledgement>,
    /// The last read's share of the rows held shards may hold, returned once it is settled.
    _rows: Option<SemaphorePermit<'a>>,
}

/// Delivers a claimed shard's groups in order until it is empty (up to the mode's bound), a
/// delivery fails, the budget is spent, or the relay stops; then records the outcome and
/// releases the shard, or (emptied) leaves the last acknowledgement and the release to the
/// caller, to write with the other shards emptied now.
///
/// The steps that most drains never take (a wait, a second read, a failure, a yield) and the
/// store's statements are boxed where they are awaited: a future is as large as its largest
/// step, and a drain's future is made and moved whole for every shard (16 KB unboxed on
/// PostgreSQL, against 2.5 KB; at one message per shard the copies cost a tenth of the relay's
/// processor time).
pub(crate) async fn drain<'a, St: Store>(
    session: St::Session,
    inner: &'a Inner<St>,
    stopping: &'a watch::Receiver<bool>,
    mode: DrainMode,
    lane: Lane,
    claimed: Instant,
) -> Result<Ending<'a, St>, Error> {
    let lease = session.lease().clone();
    announce_takeover(&lease, &inner.config.worker_id);
    let mut drain = ShardDrain {
        session,
        state: DrainState {
            lease,
            inner,
            _in_flight: inner.vitals.in_flight(),
            began: Instant::now(),
            stopping,
            mode,
            lane,
            started: None,
            held_since: claimed,
            progressed: false,
            rows_delivered: 0,
            watermark: MessageId(0),
            deliveries: 0,
            rows_acknowledged: 0,
            dead_lettered: Vec::new(),
        },
    };
    loop {
        let mut read = match drain.read().await {
            Ok(Some(read)) => read,
            Ok(None) => return Box::pin(drain.nothing_left()).await.map(Ending::Ended),
            Err(error @ Error::Undecodable { .. }) => {
                return Box::pin(drain.undecodable(error)).await.map(Ending::Ended);
            }
            Err(error) => return Err(error),
        };
        let delivered = drain.deliver(&mut read.plan).await?;
        if drain.state.emptied(&read, &delivered) {
            let ShardDrain { session, state } = drain;
            return Ok(Ending::Emptied(Emptied {
                session,
                state,
                acks: delivered.acks,
                _rows: read._rows,
            }));
        }
        drain = match Box::pin(drain.settle(read, delivered)).await? {
            ControlFlow::Continue(drain) => drain,
            ControlFlow::Break(run) => return Ok(Ending::Ended(run)),
        };
    }
}

/// The run of groups from `index` that one pipelining handler takes at once: its pipeline, and
/// the index after the run's last group. `None` for a run of one group, a handler that does
/// not pipeline, or handlers in the claiming transaction.
fn pipelined_run<'p, St: Store>(
    inner: &Inner<St>,
    plan: &'p Plan,
    index: usize,
) -> Option<(&'p dyn Pipeline, usize)> {
    if inner.config.handler_mode == HandlerMode::InTransaction {
        return None;
    }
    let first = plan.groups.get(index)?;
    let pipeline = first.info.handler.pipeline()?;
    let end = index
        + plan.groups[index..]
            .iter()
            .take_while(|group| Arc::ptr_eq(&group.info.handler, &first.info.handler))
            .count();
    (end > index + 1).then_some((pipeline, end))
}

fn announce_takeover(lease: &Lease, worker_id: &str) {
    match &lease.previous_owner {
        // This relay's own drain, interrupted by the database: the outage was logged once.
        Some(previous) if previous == worker_id => {
            debug!(shard = %lease.shard, attempts = lease.attempts, "resuming a shard whose drain the database interrupted");
        }
        Some(previous) => {
            info!(shard = %lease.shard, previous_owner = %previous, attempts = lease.attempts, "took over a shard whose lease lapsed; its head is redelivered");
        }
        None => {}
    }
}

impl<'a, St: Store> DrainState<'a, St> {
    /// Whether `read` held every row the shard had and all got through: the drain ends by
    /// acknowledging them and releasing the shard at once, with no read to learn that it is
    /// empty (a row written since is not lost: releasing a shard that still has rows leaves it
    /// due).
    fn emptied(&self, read: &Read<'_>, delivered: &Delivered) -> bool {
        !delivered.lease_lost
            && delivered.failure.is_none()
            && !delivered.out_of_budget
            && !delivered.acks.is_empty()
            && read.plan.blocked.is_none()
            && !read.full
            && !self.budget_spent()
    }

    /// What acknowledging an emptied shard's rows and releasing it did: the drain's result,
    /// or the error that interrupted it with the lease it leaves to release.
    /// `now`: when the finish answered (read once for a batch).
    fn finished(mut self, finished: Finished, now: Instant) -> Result<ShardRun, Interrupted> {
        match finished {
            Ok((rows, released)) => {
                self.rows_acknowledged += rows;
                if !released {
                    warn!(shard = %self.lease.shard, "lease lost before releasing; another worker owns the shard");
                }
                Ok(self.end_at(DrainEnd::Drained, !released, now))
            }
            Err(Error::LeaseLost { shard, token }) => {
                warn!(%shard, token, "lease lost before acknowledging; another worker owns the shard");
                Ok(self.end_at(DrainEnd::LeaseLost, false, now))
            }
            Err(error) => Err(Box::new((error, self.lease))),
        }
    }

    /// Whether the drain should stop delivering: the relay is stopping, or (in the relay's
    /// drains) the row or time budget is spent.
    fn budget_spent(&self) -> bool {
        let config = &self.inner.config;
        self.stopping()
            || (self.mode == DrainMode::Relay
                && (self.rows_delivered >= config.shard_row_budget as u64
                    || self
                        .started
                        .is_some_and(|started| started.elapsed() >= config.shard_time_budget)))
    }

    fn stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Whether the drain holds its lease for a delivery that starts `now` with no need to
    /// extend it first (see [`DrainState::extend_lease`]): in transaction mode, or within a
    /// third of the lease since it was last set. Answered without a future, as most are.
    fn lease_fresh(&self, now: Instant) -> bool {
        let config = &self.inner.config;
        config.handler_mode == HandlerMode::InTransaction
            || now.saturating_duration_since(self.held_since) < config.lease / 3
    }

    /// Whether the drain still holds its lease for a delivery that starts now, asked where
    /// [`DrainState::lease_fresh`] says no: once a third of the lease has passed since it was
    /// last set (by this relay's clock, which can only be early), the lease is extended
    /// first: a lease that lapsed may have been taken over, and the worker that took it
    /// delivers this read again as retries; a delivery started here under the lapsed lease
    /// would be a second, unmarked one, running beside the new holder's. A lease extended now
    /// outlasts the first heartbeat of the handler that starts (a third of the lease in).
    /// `false` (said once) if another worker holds it. (In transaction mode the claiming
    /// transaction holds the shard, and the lease is always fresh.)
    async fn extend_lease(&mut self) -> Result<bool, Error> {
        let config = &self.inner.config;
        let asked = Instant::now();
        let inner = self.inner;
        let held = inner
            .together
            .extend(&inner.store, &self.lease, config.lease)
            .await?;
        if held {
            self.held_since = asked;
        } else {
            warn!(shard = %self.lease.shard, token = self.lease.token, "lease lapsed before a delivery; another worker owns the shard");
        }
        Ok(held)
    }

    /// A handler's turn (one of the relay's `max_concurrent_shards` slots), waited for with
    /// the lease kept alive; `None` if the relay stops first. A flush takes no slot: its own
    /// pool bounds its drains, and a handler that flushes what it writes, holding a slot,
    /// must not wait for another. `created`: when the first group's newest message was
    /// written (a live drain's first turn reports how long after it came, to pace the
    /// backfill walks).
    async fn turn(&mut self, created: SystemTime) -> Option<Turn<'a>> {
        let inner: &'a Inner<St> = self.inner;
        let turn = if matches!(self.mode, DrainMode::Flush { .. }) {
            None
        } else if let Some(turn) = inner.handler_slots.try_acquire() {
            Some(turn)
        } else {
            let (mut stopping, lane) = (self.stopping.clone(), self.lane);
            let shard = &self.lease.shard;
            debug!(%shard, ?lane, "waiting for a handler's turn");
            let wait = async move {
                tokio::select! {
                    turn = inner.handler_slots.acquire(lane, shard) => Some(turn),
                    _ = stopping.wait_for(|stop| *stop) => None,
                }
            };
            Some(
                Box::pin(keeping_the_lease(
                    wait,
                    inner,
                    &self.lease,
                    &mut self.held_since,
                ))
                .await?,
            )
        };
        let now = Instant::now();
        if self.started.is_none() {
            self.started = Some(now);
            if let (Some(live), Lane::Urgent, DrainMode::Relay) =
                (&inner.live, self.lane, self.mode)
            {
                // By the database's clock, which wrote `created`, against this one's.
                let waited = SystemTime::now()
                    .duration_since(created)
                    .unwrap_or_default();
                live.record(waited);
            }
        }
        Some(Turn {
            _slot: turn,
            pace: &inner.pace,
            since: now,
        })
    }

    /// Room for a read of `batch` rows among the rows the relay's held shards may hold at
    /// once, waited for with the lease kept alive: a relay holding hundreds of shards keeps
    /// in memory the batches its handlers are about to take, not a batch of every shard it
    /// holds. `None` (nothing to wait for) for a shard a commit named, whose live messages
    /// must not queue behind a backlog's reads, in a flush, which has its own bound, and in
    /// transaction mode, where the relay holds no more shards than it has slots; and when
    /// the relay stops while this waits (the drain reads, then finds no turn).
    async fn rows(&mut self, batch: usize) -> Option<SemaphorePermit<'a>> {
        let inner: &'a Inner<St> = self.inner;
        if self.mode != DrainMode::Relay
            || self.lane == Lane::Urgent
            || inner.config.handler_mode == HandlerMode::InTransaction
        {
            return None;
        }
        let wanted = u32::try_from(batch).unwrap_or(u32::MAX);
        if let Ok(rows) = inner.rows_read.try_acquire_many(wanted) {
            return Some(rows);
        }
        let mut stopping = self.stopping.clone();
        debug!(shard = %self.lease.shard, "waiting for room to read");
        let wait = async move {
            tokio::select! {
                rows = inner.rows_read.acquire_many(wanted) => rows.ok(),
                _ = stopping.wait_for(|stop| *stop) => None,
            }
        };
        Box::pin(keeping_the_lease(
            wait,
            inner,
            &self.lease,
            &mut self.held_since,
        ))
        .await
    }

    /// Counts the delivery of `group`, at `at` in the plan, which got through, and notes its
    /// place among those to acknowledge (`through`).
    fn got_through(&mut self, through: &mut Vec<usize>, at: usize, group: &Group) {
        through.push(at);
        self.rows_delivered += group.rows();
        self.deliveries += 1;
    }

    /// The attempt at the shard's head: 1 once a group of this drain got through, else one
    /// more than the claim found.
    fn head_attempt(&self) -> u32 {
        if self.progressed {
            1
        } else {
            self.lease.attempts + 1
        }
    }

    /// The drain's result, ending on `end`, counted in the relay's metrics.
    fn end(self, end: DrainEnd, lost_at_release: bool) -> ShardRun {
        self.end_at(end, lost_at_release, Instant::now())
    }

    /// [`DrainState::end`] at `now`.
    fn end_at(self, end: DrainEnd, lost_at_release: bool, now: Instant) -> ShardRun {
        let run = ShardRun {
            shard: self.lease.shard,
            end,
            lost_at_release,
            deliveries: self.deliveries,
            rows_acknowledged: self.rows_acknowledged,
            dead_lettered: self.dead_lettered,
        };
        self.inner.metrics().drained(
            run.shard.scope,
            now.saturating_duration_since(self.began),
            run.rows_acknowledged,
            run.lost_lease(),
        );
        run
    }
}

impl<'a, St: Store> Emptied<'a, St> {
    /// The emptied shard's lease.
    pub(crate) fn lease(&self) -> &Lease {
        &self.state.lease
    }

    /// Acknowledges what got through and releases the shard: with the other shards finishing
    /// now, outside the in-transaction mode, whose claiming transaction commits alone.
    pub(crate) async fn finish(self) -> Result<ShardRun, Error> {
        let Self {
            session,
            state,
            acks,
            _rows,
        } = self;
        let inner = state.inner;
        let finished = match inner.config.handler_mode {
            HandlerMode::InTransaction => {
                Box::pin(session.ack_and_finish(&acks, Outcome::Drained)).await
            }
            HandlerMode::Leased => inner.together.finish_one(&inner.store, session, acks).await,
        };
        if finished.is_ok() {
            inner.vitals.acknowledged();
        }
        state
            .finished(finished, Instant::now())
            .map_err(|interrupted| interrupted.0)
    }

    /// Acknowledges what got through in each of `emptied` and releases their shards, in one
    /// batch with the other shards finishing now: each drain's result with its tag, in order
    /// (an error with the lease it leaves to release). In transaction mode each commits alone.
    pub(crate) async fn finish_together<K>(
        emptied: Vec<(K, Self)>,
    ) -> Vec<(K, Result<ShardRun, Interrupted>)> {
        let Some((_, first)) = emptied.first() else {
            return Vec::new();
        };
        let inner = first.state.inner;
        if inner.config.handler_mode == HandlerMode::InTransaction {
            let mut runs = Vec::with_capacity(emptied.len());
            for (tag, one) in emptied {
                let lease = one.lease().clone();
                let run = one.finish().await.map_err(|error| Box::new((error, lease)));
                runs.push((tag, run));
            }
            return runs;
        }
        // Taken apart once: what the store finishes, and what the drains end with. The reads'
        // shares of the rows held go back once their rows are acknowledged.
        let mut finishing = Vec::with_capacity(emptied.len());
        let mut states = Vec::with_capacity(emptied.len());
        for (tag, one) in emptied {
            finishing.push((one.session, one.acks));
            states.push((tag, one.state, one._rows));
        }
        // One answer per session, in order.
        let finished = inner.together.finish(&inner.store, finishing).await;
        if finished.iter().any(Result::is_ok) {
            inner.vitals.acknowledged();
        }
        let now = Instant::now();
        states
            .into_iter()
            .zip(finished)
            .map(|((tag, state, _rows), finished)| (tag, state.finished(finished, now)))
            .collect()
    }
}

impl<'a, St: Store> ShardDrain<'a, St> {
    /// Reads the shard's head up to the bound and plans its groups; `None` if nothing is left.
    /// A full read is extended to each coalescing group's newest row beyond it.
    async fn read(&mut self) -> Result<Option<Read<'a>>, Error> {
        let batch_size = self.state.inner.config.batch_size;
        let mut rows = self.state.rows(batch_size).await;
        let state = &mut self.state;
        let bound = state.mode.bound();
        let mut head = self.session.fetch(batch_size).await?;
        if let Some(rows) = &mut rows {
            // What the read did not fill goes back at once.
            drop(rows.split(batch_size.saturating_sub(head.len())));
        }
        let full = head.len() >= batch_size;
        head.retain(|row| row.id <= bound);
        let Some(last) = head.last().map(|row| row.id) else {
            return Ok(None);
        };
        state.watermark = state.watermark.max(last);
        let rows_read = head.len();
        let mut plan = Plan::new(head, &state.lease.shard, &state.inner.registry);
        // A full read may not hold a group's newest row; a read the bound cut holds them all.
        if full && rows_read >= batch_size {
            let keys = plan.coalescing_keys();
            if !keys.is_empty() {
                for tail in Box::pin(self.session.fetch_newest(&keys, last, bound)).await? {
                    state.watermark = state.watermark.max(tail.newest.id);
                    plan.extend(&tail);
                }
            }
        }
        // Replicated models' rows are read now, with those of every drain reading now: one
        // statement per model for them all, not one per delivery. Each row is read after
        // its group's newest message was (so it holds that change or a later one, whose
        // message comes later). In transaction mode a row is read in the claiming
        // transaction, by its delivery.
        if state.inner.config.handler_mode == HandlerMode::Leased {
            for (table, keys) in plan.model_keys() {
                let inner = state.inner;
                let load = inner.together.load(&inner.store, table, keys.clone());
                if let Some(rows) = Box::pin(load).await {
                    plan.give_rows(&table, &keys, &rows);
                }
            }
        }
        Ok(Some(Read {
            plan,
            full,
            _rows: rows,
        }))
    }

    /// Delivers the planned groups in order, until one fails or the budget is spent. Runs of
    /// consecutive groups whose handler takes them at once (a sink's publisher) are delivered
    /// together, pipelined, outside the in-transaction mode.
    async fn deliver(&mut self, plan: &mut Plan) -> Result<Delivered, Error> {
        let state = &mut self.state;
        // After a takeover, every group of the first read may have been delivered by the
        // worker whose lease lapsed: each is a retry.
        let retrying = !state.progressed && state.lease.previous_owner.is_some();
        let mut attempt = state.head_attempt();
        let mut delivered = Delivered::default();
        // The places of the groups that got through, in the order they did.
        let mut through = Vec::with_capacity(plan.groups.len());
        let mut index = 0;
        while let Some(group) = plan.groups.get(index) {
            // After a takeover the whole first read is delivered before the shard yields: the
            // worker whose lease lapsed may have delivered any of it, and only this drain
            // knows to call its deliveries retries.
            if state.budget_spent()
                && (state.progressed || !through.is_empty())
                && (!retrying || state.stopping())
            {
                delivered.out_of_budget = true;
                break;
            }
            // A held shard waits for a handler's turn; if the relay stops first, it is
            // released undelivered.
            let Some(turn) = state.turn(group.newest.created_at).await else {
                delivered.out_of_budget = true;
                break;
            };
            // The turn began now: most leases need no extension, asked for with no future.
            if !state.lease_fresh(turn.since) && !Box::pin(state.extend_lease()).await? {
                delivered.lease_lost = true;
                break;
            }
            if let Some((pipeline, end)) = pipelined_run(state.inner, plan, index) {
                let groups = &plan.groups[index..end];
                let attempts: Vec<u32> = (0..groups.len())
                    .map(|at| if at == 0 || retrying { attempt } else { 1 })
                    .collect();
                let pipelined = Box::pin(deliver_all(
                    pipeline,
                    state.inner,
                    &state.lease,
                    &mut state.held_since,
                    groups,
                    &attempts,
                ))
                .await;
                for (at, group) in groups[..pipelined.confirmed.min(groups.len())]
                    .iter()
                    .enumerate()
                {
                    state.got_through(&mut through, index + at, group);
                }
                if pipelined.confirmed > 0 && !retrying {
                    attempt = 1;
                }
                if let Some(error) = pipelined.error {
                    // Stored by the broker after the one it refused: acknowledged now, not
                    // published again; the failed one, retried, follows them.
                    for &after in &pipelined.confirmed_after {
                        if let Some(group) = groups.get(after) {
                            state.got_through(&mut through, index + after, group);
                        }
                    }
                    let failed = &groups[pipelined.confirmed.min(groups.len() - 1)];
                    delivered.failure = Some(Failed::of(failed, attempt, error));
                    break;
                }
                index = end;
                continue;
            }
            self.session.before_handler().await?;
            let result = deliver(
                &mut self.session,
                state.inner,
                &state.lease,
                &mut state.held_since,
                group,
                attempt,
            )
            .await;
            self.session.after_handler(result.is_ok()).await?;
            match result {
                Ok(()) => {
                    // Once a group gets through, the next is on its first attempt.
                    if !retrying {
                        attempt = 1;
                    }
                    state.got_through(&mut through, index, group);
                }
                Err(error) => {
                    delivered.failure = Some(Failed::of(group, attempt, error));
                    break;
                }
            }
            index += 1;
        }
        delivered.acks = plan.acknowledgements(&through);
        Ok(delivered)
    }

    /// Acknowledges what got through, then ends the drain if the read and its deliveries say
    /// so, or continues it (to read again).
    async fn settle(
        mut self,
        read: Read<'a>,
        delivered: Delivered,
    ) -> Result<ControlFlow<ShardRun, Self>, Error> {
        let Delivered {
            acks,
            failure,
            out_of_budget,
            lease_lost,
        } = delivered;
        if lease_lost {
            return Ok(ControlFlow::Break(
                self.state.end(DrainEnd::LeaseLost, false),
            ));
        }
        let all_delivered = failure.is_none() && !out_of_budget;
        if !acks.is_empty() && !Box::pin(self.acknowledge(&acks)).await? {
            return Ok(ControlFlow::Break(
                self.state.end(DrainEnd::LeaseLost, false),
            ));
        }
        let dead_letters = self.state.mode == DrainMode::Relay;
        let failure = match failure {
            Some(Failed {
                error: DeliveryError::Unavailable { source, .. },
                ..
            }) if dead_letters => {
                return Box::pin(self.park(source.breaker))
                    .await
                    .map(ControlFlow::Break);
            }
            Some(failed) if dead_letters && failed.dead_letters() => {
                if !Box::pin(self.dead_letter(failed)).await? {
                    return Ok(ControlFlow::Break(
                        self.state.end(DrainEnd::LeaseLost, false),
                    ));
                }
                None
            }
            // The delivery's span reported the error.
            Some(failed) => Some((failed.error, true)),
            None if all_delivered => read.plan.blocked.map(|error| (error, false)),
            None => None,
        };
        if let Some((error, reported)) = failure {
            return Box::pin(self.fail(error, reported))
                .await
                .map(ControlFlow::Break);
        }
        if out_of_budget || self.state.budget_spent() {
            let state = &self.state;
            debug!(shard = %state.lease.shard, rows_delivered = state.rows_delivered, "budget spent; shard yields");
            return Box::pin(self.release(Outcome::Yielded, DrainEnd::Yielded))
                .await
                .map(ControlFlow::Break);
        }
        Ok(ControlFlow::Continue(self))
    }

    /// Acknowledges `acks`, extending the lease; `false` if the lease was lost.
    async fn acknowledge(&mut self, acks: &[Acknowledgement]) -> Result<bool, Error> {
        let asked = Instant::now();
        match self.session.ack(acks).await {
            Ok(rows) => {
                self.state.held_since = asked;
                self.state.inner.vitals.acknowledged();
                self.state.rows_acknowledged += rows;
                self.state.progressed = true;
                Ok(true)
            }
            Err(Error::LeaseLost { shard, token }) => {
                warn!(%shard, token, "lease lost before acknowledging; another worker owns the shard");
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Sets a failing group aside as dead letters, so that the shard goes on with the groups
    /// behind it; `false` if the lease was lost.
    async fn dead_letter(&mut self, failed: Failed) -> Result<bool, Error> {
        let letter = DeadLettering {
            rows: failed.rows,
            error: error_chain(&failed.error),
            attempts: failed.attempt,
        };
        match self.session.dead_letter(&letter).await {
            Ok(rows) => {
                self.state.inner.vitals.acknowledged();
                if let Some(metrics) = self.state.inner.metrics().category(failed.category) {
                    metrics.dead_lettered(rows);
                }
                let shard = self.state.lease.shard.clone();
                warn!(%shard, attempts = failed.attempt, rows, error = %letter.error, "group set aside as dead letters after its category's max_attempts; the shard goes on");
                self.state.progressed = true;
                self.state.dead_lettered.push(DeadLettered {
                    shard,
                    error: failed.error,
                    attempts: failed.attempt,
                    rows,
                });
                Ok(true)
            }
            Err(Error::LeaseLost { shard, token }) => {
                warn!(%shard, token, "lease lost before setting a group aside; another worker owns the shard");
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Nothing (left) to deliver. A flush that delivered nothing leaves the shard's state as
    /// it found it.
    async fn nothing_left(self) -> Result<ShardRun, Error> {
        if self.state.progressed || self.state.mode == DrainMode::Relay {
            self.release(Outcome::Drained, DrainEnd::Drained).await
        } else {
            self.release(Outcome::Released, DrainEnd::ReleasedUnchanged)
                .await
        }
    }

    /// A row written around the schema's checks: the shard waits on it, backing off, and
    /// nothing is deleted. Only a message written after this moment makes it due before its
    /// backoff ends.
    async fn undecodable(mut self, error: Error) -> Result<ShardRun, Error> {
        let state = &mut self.state;
        let newest = state.inner.store.newest_message_id().await?;
        state.watermark = newest.unwrap_or(state.watermark);
        let error = DeliveryError::Undecodable {
            source: Box::new(error),
        };
        self.fail(error, false).await
    }

    /// Ends the relay's drain on a delivery that found its system unreachable: the shard is
    /// released with no attempt counted (its failures reset if this drain got a group
    /// through), and waits for the breaker to close.
    async fn park(self, breaker: Breaker) -> Result<ShardRun, Error> {
        self.state.inner.vitals.waiting_on(&breaker);
        debug!(shard = %self.state.lease.shard, breaker = breaker.name(), "shard waits for its breaker to close");
        let outcome = if self.state.progressed {
            Outcome::Yielded
        } else {
            Outcome::Released
        };
        self.release(outcome, DrainEnd::Unavailable(breaker)).await
    }

    /// Ends the drain on a failed delivery: the relay backs the shard off; a flush releases it
    /// as it was and reports the failure. The error is logged here unless `reported`
    /// (by the delivery's span).
    async fn fail(self, error: DeliveryError, reported: bool) -> Result<ShardRun, Error> {
        let state = &self.state;
        let shard = state.lease.shard.clone();
        if !reported {
            // Found before any handler ran: no delivery's span or metrics counted it.
            state.inner.metrics().head_failed(shard.scope, error.kind());
        }
        if let DrainMode::Flush { .. } = state.mode {
            debug!(%shard, error = %error_chain(&error), "delivery failed during a flush; the relay will retry");
            let failure = ShardFailure {
                shard,
                error,
                attempts: state.lease.attempts,
                retry_in: Duration::ZERO,
            };
            return self
                .release(Outcome::Released, DrainEnd::Failed(Box::new(failure)))
                .await;
        }
        let parked = error.parked_category();
        let (attempts, retry_in) = match parked {
            // Parked (S26): not an attempt, no backoff; due again once a relay that knows the
            // category unparks it. Said once, here: the shard is not claimed again until then.
            Some(category) => {
                warn!(%shard, category = category.0, error = %error_chain(&error), "shard parked: its head's category is unknown to this binary; it resumes when a relay that knows the category runs");
                (state.lease.attempts, Duration::ZERO)
            }
            None => {
                let attempts = state.head_attempt();
                let retry_in = state.inner.config.backoff.delay(attempts);
                if reported {
                    info!(%shard, attempts, ?retry_in, "shard backs off after a failed delivery");
                } else {
                    warn!(%shard, attempts, ?retry_in, error = %error_chain(&error), "delivery failed; shard backs off");
                }
                (attempts, retry_in)
            }
        };
        let recorded = Failure {
            error: error_chain(&error),
            attempts,
            retry_in,
            watermark: state.watermark,
            parked_category: parked,
        };
        let failure = ShardFailure {
            shard,
            error,
            attempts,
            retry_in,
        };
        self.release(
            Outcome::Failed(recorded),
            DrainEnd::Failed(Box::new(failure)),
        )
        .await
    }

    /// Records `outcome` and releases the shard, ending the drain on `end`; a lease lost
    /// meanwhile is reported, not an error: the new owner carries on.
    async fn release(self, outcome: Outcome, end: DrainEnd) -> Result<ShardRun, Error> {
        let Self { session, state } = self;
        let lost = match session.finish(outcome).await {
            Ok(()) => false,
            Err(Error::LeaseLost { shard, token }) => {
                warn!(%shard, token, "lease lost before releasing; another worker owns the shard");
                true
            }
            Err(error) => return Err(error),
        };
        Ok(state.end(end, lost))
    }
}
