//! Relay settings.

use std::time::Duration;

use crate::error::Error;
use crate::store::HandlerMode;
use crate::trace::TraceRelation;

/// How the relay runs: a configuration checked when it was built, so that a relay never
/// starts with settings that cannot work.
///
/// [`RelayConfig::default`] is the usual start; [`RelayConfig::builder`] changes what you
/// need with chained setters and checks the result at [`RelayConfigBuilder::build`]:
///
/// ```
/// use std::time::Duration;
///
/// use outbox_core::{Error, RelayConfig};
///
/// let config = RelayConfig::builder()
///     .max_concurrent_shards(4)
///     .lease(Duration::from_secs(60))
///     .handler_timeout(Some(Duration::from_secs(20)))
///     .build()?;
/// assert_eq!(config.max_concurrent_shards(), 4);
///
/// let refused = RelayConfig::builder().batch_size(0).build();
/// assert!(matches!(refused, Err(Error::InvalidConfig { setting: "batch_size", .. })));
/// # Ok::<(), Error>(())
/// ```
///
/// Some settings steer only [`Relay::run`](crate::Relay::run), the background relay: the poll
/// interval, `wake_on_commit`, the shutdown deadline and the reconnection delay.
/// [`Relay::drain`](crate::Relay::drain), [`Relay::flush`](crate::Relay::flush) and
/// [`Relay::flush_due`](crate::Relay::flush_due) return when their work is done or fails, and
/// do not read them; each setter says which.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub(crate) worker_id: String,
    pub(crate) max_concurrent_shards: usize,
    pub(crate) claim_batch: usize,
    pub(crate) batch_size: usize,
    pub(crate) shard_row_budget: usize,
    pub(crate) shard_time_budget: Duration,
    pub(crate) lease: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) handler_mode: HandlerMode,
    pub(crate) handler_timeout: Option<Duration>,
    pub(crate) poll_interval: Duration,
    pub(crate) min_poll_interval: Duration,
    pub(crate) wake_on_commit: bool,
    pub(crate) listen_for_other_processes: bool,
    pub(crate) discovery_page: usize,
    pub(crate) shutdown_deadline: Duration,
    pub(crate) max_reconnect_delay: Duration,
    pub(crate) flush_wait: Duration,
    pub(crate) maintenance_interval: Duration,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) dead_letter_retention: Option<Duration>,
    pub(crate) gauge_interval: Option<Duration>,
    pub(crate) backfill_interval: Option<Duration>,
    pub(crate) backfill_budget: usize,
    pub(crate) backfill_paced: bool,
    pub(crate) trace_relation: TraceRelation,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            worker_id: format!(
                "outbox-{}-{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ),
            max_concurrent_shards: 16,
            claim_batch: 2_048,
            batch_size: 500,
            shard_row_budget: 1_000,
            shard_time_budget: Duration::from_secs(1),
            lease: Duration::from_secs(30),
            backoff: Backoff::default(),
            handler_mode: HandlerMode::Leased,
            handler_timeout: None,
            poll_interval: Duration::from_secs(1),
            min_poll_interval: Duration::from_millis(10),
            wake_on_commit: true,
            listen_for_other_processes: true,
            discovery_page: 512,
            shutdown_deadline: Duration::from_secs(30),
            max_reconnect_delay: Duration::from_secs(30),
            flush_wait: Duration::from_secs(5),
            maintenance_interval: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(10),
            dead_letter_retention: None,
            gauge_interval: Some(Duration::from_secs(15)),
            backfill_interval: Some(Duration::from_millis(100)),
            backfill_budget: 1_000,
            backfill_paced: true,
            trace_relation: TraceRelation::Link,
        }
    }
}

impl RelayConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> RelayConfigBuilder {
        RelayConfigBuilder {
            config: Self::default(),
        }
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> RelayConfigBuilder {
        RelayConfigBuilder {
            config: self.clone(),
        }
    }

    /// The name recorded on the leases this relay takes.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// How many handlers run at once: the shards whose groups are being delivered at once.
    pub fn max_concurrent_shards(&self) -> usize {
        self.max_concurrent_shards
    }

    /// How many shards one claim takes at most: the shards a relay holds at once, read and
    /// finished together, whose handlers take turns at the `max_concurrent_shards` slots.
    pub fn claim_batch(&self) -> usize {
        self.claim_batch
    }

    /// The shards drained at once: a claim's batch, but no more than run at once in
    /// [`HandlerMode::InTransaction`], where each holds its claiming transaction (and a
    /// connection) for its whole drain, and never fewer than run at once.
    pub(crate) fn shards_held(&self) -> usize {
        match self.handler_mode {
            HandlerMode::InTransaction => self.max_concurrent_shards,
            HandlerMode::Leased => self.claim_batch.max(self.max_concurrent_shards),
        }
    }

    /// The rows of one full batch per handler slot: what the relay's memory is sized by
    /// (the heads its claims read share them; its reads hold twice as many).
    pub(crate) fn rows_per_turns(&self) -> usize {
        self.max_concurrent_shards.saturating_mul(self.batch_size)
    }

    /// The rows of each shard's head that a claim of `held` shards reads: the
    /// [`rows_per_turns`](Self::rows_per_turns) shared among them, at most a batch, and at
    /// least two. A read of two rows that finds one says the shard holds nothing more, so
    /// that a one-message shard's drain needs no read of its own; a read of one row cannot
    /// say so, and every shard would be read again.
    pub(crate) fn head_limit(&self, held: usize) -> usize {
        (self.rows_per_turns() / held.max(1)).clamp(2.min(self.batch_size), self.batch_size)
    }

    /// How many rows of a shard are read at once.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// After delivering this many rows, a relay's drain releases its shard (still due).
    pub fn shard_row_budget(&self) -> usize {
        self.shard_row_budget
    }

    /// After this long, a relay's drain releases its shard (still due).
    pub fn shard_time_budget(&self) -> Duration {
        self.shard_time_budget
    }

    /// How long a claim lasts without an acknowledgement or a heartbeat.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The backoff of a shard whose head keeps failing.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// How handlers run.
    pub fn handler_mode(&self) -> HandlerMode {
        self.handler_mode
    }

    /// How long a handler may run before its delivery fails; `None`: no limit.
    pub fn handler_timeout(&self) -> Option<Duration> {
        self.handler_timeout
    }

    /// How often an idle background relay looks for due shards.
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// How soon a background relay that just found work looks again (at most the poll
    /// interval).
    pub fn min_poll_interval(&self) -> Duration {
        self.min_poll_interval.min(self.poll_interval)
    }

    /// Whether the background relay listens for commits.
    pub fn wake_on_commit(&self) -> bool {
        self.wake_on_commit
    }

    /// Whether the background relay, when it listens for commits, also listens for those of
    /// other processes (PostgreSQL's `LISTEN`).
    pub fn listen_for_other_processes(&self) -> bool {
        self.listen_for_other_processes
    }

    /// How many shards one discovery query visits.
    pub fn discovery_page(&self) -> usize {
        self.discovery_page
    }

    /// How long a stopping background relay waits for its in-flight shards.
    pub fn shutdown_deadline(&self) -> Duration {
        self.shutdown_deadline
    }

    /// The longest pause between reconnection attempts of the background relay.
    pub fn max_reconnect_delay(&self) -> Duration {
        self.max_reconnect_delay
    }

    /// How long a flush waits for a shard another worker holds.
    pub fn flush_wait(&self) -> Duration {
        self.flush_wait
    }

    /// How often the background relay does its upkeep ([`Relay::maintain`](crate::Relay::maintain)).
    pub fn maintenance_interval(&self) -> Duration {
        self.maintenance_interval
    }

    /// How often the background relay records its heartbeat ([`Admin::relays`](crate::admin::Admin::relays)).
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
    }

    /// How long dead letters are kept before the relay's upkeep purges them; `None`: for ever.
    pub fn dead_letter_retention(&self) -> Option<Duration> {
        self.dead_letter_retention
    }

    /// How often the background relay refreshes the outbox's gauges; `None`: never.
    pub fn gauge_interval(&self) -> Option<Duration> {
        self.gauge_interval
    }

    /// How often the background relay ticks the backfills; `None`: never.
    pub fn backfill_interval(&self) -> Option<Duration> {
        self.backfill_interval
    }

    /// The most rows a backfill tick walks per model, before the backlog is taken off.
    pub fn backfill_budget(&self) -> usize {
        self.backfill_budget
    }

    /// Whether the background relay paces its backfill ticks by the live latency it
    /// measures (up to [`backfill_budget`](Self::backfill_budget) rows), or walks the whole
    /// budget every tick.
    pub fn backfill_paced(&self) -> bool {
        self.backfill_paced
    }

    /// How a delivery's span relates to the trace of the request that wrote its message.
    pub fn trace_relation(&self) -> TraceRelation {
        self.trace_relation
    }

    /// The first setting that cannot work, if any.
    fn check(&self) -> Result<(), Error> {
        let invalid =
            |setting: &'static str, problem: String| Err(Error::InvalidConfig { setting, problem });
        let at_least_one = [
            (
                "max_concurrent_shards",
                self.max_concurrent_shards,
                "a relay that drains no shard at once delivers nothing",
            ),
            (
                "claim_batch",
                self.claim_batch,
                "a claim of no shards drains nothing",
            ),
            (
                "batch_size",
                self.batch_size,
                "a read of no rows never empties a shard: drains would never end",
            ),
            (
                "shard_row_budget",
                self.shard_row_budget,
                "a budget of no rows cannot be spent",
            ),
            (
                "discovery_page",
                self.discovery_page,
                "a page of no shards finds nothing due",
            ),
            (
                "backfill_budget",
                self.backfill_budget,
                "a backfill with no rows to spend would walk one row per tick",
            ),
        ];
        for (setting, value, why) in at_least_one {
            if value == 0 {
                return invalid(setting, format!("is 0, and must be at least 1: {why}"));
            }
        }
        let not_zero = [
            (
                "shard_time_budget",
                self.shard_time_budget,
                "every drain would yield before its first delivery",
            ),
            ("lease", self.lease, "every claim would lapse at once"),
            (
                "poll_interval",
                self.poll_interval,
                "an idle relay would poll without pause",
            ),
            (
                "min_poll_interval",
                self.min_poll_interval,
                "a relay that found work would poll without pause",
            ),
            (
                "maintenance_interval",
                self.maintenance_interval,
                "the relay's upkeep would run without pause",
            ),
            (
                "heartbeat_interval",
                self.heartbeat_interval,
                "the relay's heartbeat would be written without pause",
            ),
            (
                "max_reconnect_delay",
                self.max_reconnect_delay,
                "a relay would retry an unreachable database without pause",
            ),
            (
                "backoff.initial",
                self.backoff.initial,
                "a failing shard would be retried without pause, and a drain would never end",
            ),
        ];
        for (setting, value, why) in not_zero {
            if value.is_zero() {
                return invalid(setting, format!("is zero: {why}"));
            }
        }
        if self.backoff.max < self.backoff.initial {
            return invalid(
                "backoff.max",
                format!(
                    "({:?}) is shorter than backoff.initial ({:?})",
                    self.backoff.max, self.backoff.initial
                ),
            );
        }
        if self.worker_id.is_empty() {
            return invalid(
                "worker_id",
                "is empty: it names the leases the relay takes".into(),
            );
        }
        if self
            .gauge_interval
            .is_some_and(|interval| interval.is_zero())
        {
            return invalid(
                "gauge_interval",
                "is zero: the gauges' query would run without pause (`None` turns it off)".into(),
            );
        }
        if self
            .backfill_interval
            .is_some_and(|interval| interval.is_zero())
        {
            return invalid(
                "backfill_interval",
                "is zero: backfills would walk without pause, ahead of live traffic (`None` \
                 turns them off)"
                    .into(),
            );
        }
        if let Some(timeout) = self.handler_timeout {
            if timeout.is_zero() {
                return invalid(
                    "handler_timeout",
                    "is zero: every delivery would time out".into(),
                );
            }
            if self.lease <= timeout {
                return invalid(
                    "lease",
                    format!(
                        "({:?}) must outlast handler_timeout ({timeout:?}): a handler within its \
                         timeout could lose its shard before it is acknowledged",
                        self.lease
                    ),
                );
            }
        }
        Ok(())
    }
}

/// Chained setters for a [`RelayConfig`], checked at [`build`](Self::build) (in the style of
/// sqlx's `PoolOptions`). Every setting starts at its default.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until it is built"]
pub struct RelayConfigBuilder {
    config: RelayConfig,
}

impl RelayConfigBuilder {
    /// The configuration, if every setting can work; else [`Error::InvalidConfig`] naming the
    /// first that cannot, and why.
    pub fn build(self) -> Result<RelayConfig, Error> {
        self.config.check()?;
        Ok(self.config)
    }

    /// Name recorded on the leases this relay takes (default `outbox-<pid>-<random>`); not
    /// empty.
    pub fn worker_id(mut self, worker_id: impl Into<String>) -> Self {
        self.config.worker_id = worker_id.into();
        self
    }

    /// How many handlers run at once (16 by default; at least 1): the shards whose groups are
    /// being delivered at once, each in order. Each holds a connection of the store's pool
    /// while it works: give the pool a few more connections than this.
    pub fn max_concurrent_shards(mut self, shards: usize) -> Self {
        self.config.max_concurrent_shards = shards;
        self
    }

    /// How many shards one claim takes at most (2,048 by default; at least 1): with
    /// [`HandlerMode::Leased`], the relay holds up to this many shards at once, claims them
    /// together (PostgreSQL: one statement, which reads their heads too; SQLite: one write
    /// transaction), and finishes those it empties together, while their handlers take
    /// turns, `max_concurrent_shards` at a time. Most traffic is one or two messages per
    /// shard, and then the relay's cost is per shard: batches are what make it small. Hold
    /// more than a [`discovery_page`](Self::discovery_page) (four pages by default), so that
    /// the next page's shards are claimed whole while the last page's are finishing, not a
    /// few at a time as their permits come free. A held
    /// shard waiting for its turn keeps its lease alive, and no other relay can take it
    /// meanwhile, so a relay holds no more shards than its handlers get through in about
    /// 10 ms at the pace it measures (as many as run at once, until it has measured): with
    /// slow handlers it leaves the rest to other relays. In [`HandlerMode::InTransaction`]
    /// each shard holds its transaction, and the relay holds `max_concurrent_shards` at most.
    pub fn claim_batch(mut self, shards: usize) -> Self {
        self.config.claim_batch = shards;
        self
    }

    /// How many rows of a shard are read at once (500 by default; at least 1). The relay keeps
    /// about `2 × max_concurrent_shards` such batches in memory, however many shards it
    /// holds: a held shard reads its batch when there is room among them (a shard a commit
    /// named reads at once).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.config.batch_size = rows;
        self
    }

    /// After delivering this many rows (1,000 by default; at least 1), a shard is released,
    /// still due, so others get a turn. The relay's drains only: a flush delivers every row
    /// it is for.
    pub fn shard_row_budget(mut self, rows: usize) -> Self {
        self.config.shard_row_budget = rows;
        self
    }

    /// After this long (1 s by default; not zero), a shard is released, still due, so others
    /// get a turn. The relay's drains only: a flush delivers every row it is for.
    pub fn shard_time_budget(mut self, budget: Duration) -> Self {
        self.config.shard_time_budget = budget;
        self
    }

    /// How long a claim lasts (30 s by default; not zero) before another worker may take the
    /// shard over. Each acknowledgement extends it, and so does a heartbeat every third of it
    /// while a handler runs. With a handler timeout, it must be longer than the timeout.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Backoff of a shard whose head keeps failing (2 s doubling to 1 h, with jitter, by
    /// default): its initial delay is not zero, its cap not below it. Its jitter setting
    /// also applies to the pauses between reconnection attempts of
    /// [`Relay::run`](crate::Relay::run).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.config.backoff = backoff;
        self
    }

    /// Whether handlers run under a lease (default) or inside the claiming transaction.
    pub fn handler_mode(mut self, mode: HandlerMode) -> Self {
        self.config.handler_mode = mode;
        self
    }

    /// A handler running longer than this fails its delivery (`None`, the default: no
    /// limit). Not zero, and shorter than the lease.
    pub fn handler_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.handler_timeout = timeout;
        self
    }

    /// How often an idle [`Relay::run`](crate::Relay::run) looks for due shards when nothing
    /// wakes it (1 s by default; not zero): the longest a message written without a wake-up
    /// (with a plain transaction, or by another program) waits for a relay that has been idle
    /// a while. Only the background relay polls.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// Polling adapts to the work: after a sweep that found due shards, an idle
    /// [`Relay::run`](crate::Relay::run) looks again after this interval (10 ms by default;
    /// not zero; at most [`poll_interval`](Self::poll_interval)), then after twice as long at
    /// each sweep that finds nothing, up to the poll interval. So messages written without a
    /// wake-up, while messages keep arriving, wait about this long rather than the poll
    /// interval; an idle relay costs one discovery query per poll interval.
    pub fn min_poll_interval(mut self, interval: Duration) -> Self {
        self.config.min_poll_interval = interval;
        self
    }

    /// Whether [`Relay::run`](crate::Relay::run) listens for commits (on by default):
    /// wake-ups from the backends' `OutboxTransaction`s committing in this process, and on
    /// PostgreSQL those of other processes, through `LISTEN`
    /// ([`listen_for_other_processes`](Self::listen_for_other_processes)). Off, the relay
    /// only polls. Only the background relay listens.
    pub fn wake_on_commit(mut self, wake: bool) -> Self {
        self.config.wake_on_commit = wake;
        self
    }

    /// Whether [`Relay::run`](crate::Relay::run), listening for commits, also hears those of
    /// other processes (on by default): on PostgreSQL, through `LISTEN` on a connection of
    /// its own. Turn off behind connection poolers that break `LISTEN`, such as PgBouncer in
    /// transaction mode: the `OutboxTransaction`s committing in this process still wake the
    /// relay at once (they need no connection), and other processes' messages are found by
    /// polling.
    pub fn listen_for_other_processes(mut self, listen: bool) -> Self {
        self.config.listen_for_other_processes = listen;
        self
    }

    /// How many shards one discovery query visits (512 by default; at least 1): the due
    /// shards of a page are claimed in batches of up to `claim_batch`.
    pub fn discovery_page(mut self, shards: usize) -> Self {
        self.config.discovery_page = shards;
        self
    }

    /// How long a stopping [`Relay::run`](crate::Relay::run) waits for in-flight shards
    /// before abandoning them (30 s by default; their leases expire, nothing is lost). Only
    /// the background relay has a shutdown.
    pub fn shutdown_deadline(mut self, deadline: Duration) -> Self {
        self.config.shutdown_deadline = deadline;
        self
    }

    /// Longest pause between reconnection attempts of [`Relay::run`](crate::Relay::run)
    /// while the database is unreachable (30 s by default; not zero). The pauses double from
    /// 100 ms up to it, jittered as the [`backoff`](Self::backoff) is (on by default: relays
    /// that lost the same database do not come back in lockstep). The other ways to deliver
    /// return the database's error instead of retrying.
    pub fn max_reconnect_delay(mut self, delay: Duration) -> Self {
        self.config.max_reconnect_delay = delay;
        self
    }

    /// How long [`Relay::flush`](crate::Relay::flush) waits for a shard that another worker
    /// holds (5 s by default) before it gives up with
    /// [`FlushError::Incomplete`](crate::relay::FlushError::Incomplete), naming the rows left. Only
    /// a flush waits for a held shard: the relay's drains leave it to its holder.
    pub fn flush_wait(mut self, wait: Duration) -> Self {
        self.config.flush_wait = wait;
        self
    }

    /// How often [`Relay::run`](crate::Relay::run) does its upkeep (60 s by default; not
    /// zero): compacting paused shards, and purging dead letters past their
    /// [`retention`](Self::dead_letter_retention). [`Relay::maintain`](crate::Relay::maintain)
    /// does it once, on demand.
    pub fn maintenance_interval(mut self, interval: Duration) -> Self {
        self.config.maintenance_interval = interval;
        self
    }

    /// How often [`Relay::run`](crate::Relay::run) records its heartbeat (10 s by default;
    /// not zero), and at once when it finds a breaker open: its worker id, when it started,
    /// the shards it drains and those waiting on open breakers, which
    /// [`Admin::relays`](crate::admin::Admin::relays) and `outbox status` read. A heartbeat stands for
    /// three intervals: a relay silent longer stopped answering.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.config.heartbeat_interval = interval;
        self
    }

    /// How long dead letters are kept: the relay's upkeep purges those set aside longer ago,
    /// a few hundred at a time, so that no statement holds a long lock (`None`, the default:
    /// they are kept until an operator replays or purges them).
    pub fn dead_letter_retention(mut self, retention: Option<Duration>) -> Self {
        self.config.dead_letter_retention = retention;
        self
    }

    /// How often [`Relay::run`](crate::Relay::run) refreshes the outbox's gauges (pending
    /// messages, oldest pending age, shards by state, dead letters: see
    /// [`telemetry`](crate::telemetry)) with one query (15 s by default; not zero; `None`:
    /// never, for all relays but one of a deployment, or when no recorder is installed).
    /// [`Relay::refresh_gauges`](crate::Relay::refresh_gauges) does it once, on demand.
    /// A reading that takes long (seconds, while a held vacuum horizon keeps every
    /// acknowledged row in the tables) spaces the next out to twenty times its length, so the
    /// gauges never keep the database busy beside the relay.
    pub fn gauge_interval(mut self, interval: Option<Duration>) -> Self {
        self.config.gauge_interval = interval;
        self
    }

    /// How often [`Relay::run`](crate::Relay::run) ticks the backfills of its registry's
    /// replicated models (see [`crate::backfill`]): 100 ms by default; not zero; `None`:
    /// never (this relay walks no backfill; others may). A tick that finds a model's backfill
    /// not started costs one short statement per model. [`Relay::backfill`](crate::Relay::backfill)
    /// ticks once, on demand.
    pub fn backfill_interval(mut self, interval: Option<Duration>) -> Self {
        self.config.backfill_interval = interval;
        self
    }

    /// The most rows one backfill tick walks per model (1,000 by default; at least 1), less
    /// the messages pending in the outbox: a backfill goes behind live traffic, and walks one
    /// row per tick while the backlog exceeds the budget. The operator's cap: a running
    /// relay walks fewer while live messages wait longer for it (see
    /// [`backfill_paced`](Self::backfill_paced)).
    pub fn backfill_budget(mut self, rows: usize) -> Self {
        self.config.backfill_budget = rows;
        self
    }

    /// Whether [`Relay::run`](crate::Relay::run) paces its backfill walks by the latency of
    /// live messages (`true`, the default) or walks
    /// [`backfill_budget`](Self::backfill_budget) rows every tick (`false`).
    ///
    /// Paced, the relay measures how long after its message was written (by the database's
    /// clock) each drain of a shard a commit named (live traffic) gets its handler's turn.
    /// The 99th percentile of that, while nothing is walked, is the baseline; while a walk
    /// goes on, every half second or so (and fifty live messages) the rows per tick are
    /// halved when the live 99th percentile is over one and a half times the baseline, and
    /// raised while it is within a quarter of it (doubling from a sixteenth of the budget at
    /// first, then by a sixty-fourth at a time), but never to fewer than a hundredth of the
    /// budget: a walk always goes on. Below a sixteenth a tick, the rows are saved up and
    /// walked every few ticks, so that a slow walk costs few statements and sweeps. A relay
    /// that hears no live traffic (none is written, or it hears no commit notifications)
    /// walks the whole budget. Each relay paces the walks it ticks from what it measures
    /// itself.
    pub fn backfill_paced(mut self, paced: bool) -> Self {
        self.config.backfill_paced = paced;
        self
    }

    /// How a delivery's span relates to the trace of the request that wrote its message,
    /// with the `opentelemetry` feature ([`TraceRelation::Link`] by default: a trace of its
    /// own, linked to the producer's; [`TraceRelation::Child`]: one trace from the request to
    /// the handler).
    pub fn trace_relation(mut self, relation: TraceRelation) -> Self {
        self.config.trace_relation = relation;
        self
    }
}

/// Exponential, capped backoff: the delay after a shard's `n`-th consecutive failure, and the
/// pause between the background relay's reconnection attempts.
///
/// The nominal delay doubles from [`initial`](Self::initial) and is capped at
/// [`max`](Self::max). With [`jitter`](Self::jitter) (on by default), each delay is drawn at
/// random between half and all of the nominal one, the "equal jitter" of the AWS
/// Architecture Blog's *Exponential Backoff And Jitter*: shards that fail together (a
/// downstream service went away) spread their retries instead of retrying in lockstep, and
/// a delay is never shorter than half its nominal value nor longer than `max`. Turn jitter
/// off ([`Backoff::with_jitter`]) for exact, reproducible delays, as tests that assert them
/// do:
///
/// ```
/// use std::time::Duration;
///
/// use outbox_core::Backoff;
///
/// let backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
/// let delay = backoff.delay(3); // nominal 8 s
/// assert!(delay >= Duration::from_secs(4) && delay <= Duration::from_secs(8));
///
/// let exact = backoff.with_jitter(false);
/// assert_eq!(exact.delay(3), Duration::from_secs(8));
/// assert_eq!(exact.delay(10), Duration::from_secs(60), "capped");
/// ```
///
/// Computed here rather than with a backoff crate: the delay is a function of an attempt
/// count that the store keeps per shard (it survives restarts and moves between workers),
/// while `backon`, the maintained backoff crate, gives delays from an iterator held in
/// memory, one step per retry (reaching the `n`-th delay means stepping `n` times); its
/// jitter also adds up to the initial delay on top of the capped one, so its delays may
/// exceed the cap. One small function serves both the shards' backoff and the relay's
/// reconnections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backoff {
    /// The delay after the first failure (default 2 s), before jitter.
    pub initial: Duration,
    /// The longest delay (default 1 h); jitter never exceeds it.
    pub max: Duration,
    /// Whether to draw each delay at random between half and all of its nominal value
    /// (default `true`).
    pub jitter: bool,
}

impl Default for Backoff {
    /// 2 s doubling to 1 h, with jitter.
    fn default() -> Self {
        Self::new(Duration::from_secs(2), Duration::from_secs(3600))
    }
}

impl Backoff {
    /// A backoff from `initial` doubling up to `max`, with jitter (turn it off with
    /// [`with_jitter(false)`](Self::with_jitter)).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            jitter: true,
        }
    }

    /// This backoff with jitter on or off.
    pub fn with_jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// The delay after the `attempts`-th consecutive failure (1 for the first; 0 counts as
    /// 1): `initial` doubled `attempts - 1` times, capped at `max`, then jittered if jitter
    /// is on. Never overflows, and never exceeds `max`.
    pub fn delay(&self, attempts: u32) -> Duration {
        let nominal = self.nominal(attempts);
        if self.jitter {
            let half = nominal / 2;
            (half + (nominal - half).mul_f64(rand::random::<f64>())).min(nominal)
        } else {
            nominal
        }
    }

    /// The delay after the `attempts`-th failure without jitter.
    fn nominal(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(63);
        let factor = 1u64.checked_shl(doublings).unwrap_or(u64::MAX);
        u32::try_from(factor)
            .ok()
            .and_then(|factor| self.initial.checked_mul(factor))
            .unwrap_or(self.max)
            .min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The setting a builder is refused for.
    fn refused(builder: RelayConfigBuilder) -> &'static str {
        match builder.build() {
            Err(Error::InvalidConfig { setting, problem }) => {
                assert!(!problem.is_empty());
                setting
            }
            other => panic!("expected an invalid configuration, got {other:?}"),
        }
    }

    #[test]
    fn the_defaults_are_valid() {
        let config = RelayConfig::builder().build().expect("the defaults work");
        assert_eq!(
            (config.batch_size(), config.max_concurrent_shards()),
            (500, 16)
        );
    }

    #[test]
    fn a_batch_size_of_zero_is_refused() {
        assert_eq!(refused(RelayConfig::builder().batch_size(0)), "batch_size");
    }

    #[test]
    fn zero_concurrent_shards_are_refused_not_clamped() {
        assert_eq!(
            refused(RelayConfig::builder().max_concurrent_shards(0)),
            "max_concurrent_shards"
        );
        assert_eq!(
            refused(RelayConfig::builder().claim_batch(0)),
            "claim_batch"
        );
    }

    #[test]
    fn shards_held_are_a_claims_batch_but_one_transaction_each_in_transaction_mode() {
        let leased = RelayConfig::builder()
            .max_concurrent_shards(4)
            .claim_batch(100)
            .build()
            .expect("valid");
        assert_eq!(leased.shards_held(), 100);
        let few = leased.to_builder().claim_batch(2).build().expect("valid");
        assert_eq!(few.shards_held(), 4, "never fewer than run at once");
        let in_transaction = leased
            .to_builder()
            .handler_mode(HandlerMode::InTransaction)
            .build()
            .expect("valid");
        assert_eq!(in_transaction.shards_held(), 4);
    }

    #[test]
    fn a_claim_reads_the_rows_of_its_turns_shared_and_at_least_two_of_each_shard() {
        let config = RelayConfig::builder()
            .max_concurrent_shards(16)
            .batch_size(500)
            .build()
            .expect("valid");
        assert_eq!(config.head_limit(16), 500, "at most a batch");
        assert_eq!(config.head_limit(2_000), 4, "8,000 rows shared");
        // One row each would leave every one-message shard to be read again: a read that
        // fills its limit cannot say the shard holds nothing more.
        assert_eq!(config.head_limit(4_096), 2);
        assert_eq!(config.head_limit(1_000_000), 2);
        let one_row = config.to_builder().batch_size(1).build().expect("valid");
        assert_eq!(one_row.head_limit(4_096), 1, "never more than a batch");
    }

    #[test]
    fn a_lease_no_longer_than_the_handler_timeout_is_refused() {
        let timeout = Duration::from_secs(30);
        let builder = RelayConfig::builder().handler_timeout(Some(timeout));
        assert_eq!(
            refused(builder.clone().lease(Duration::from_secs(10))),
            "lease"
        );
        assert_eq!(refused(builder.clone().lease(timeout)), "lease");
        let config = builder
            .lease(Duration::from_secs(31))
            .build()
            .expect("a longer lease works");
        assert_eq!(config.handler_timeout(), Some(timeout));
        assert_eq!(
            refused(RelayConfig::builder().handler_timeout(Some(Duration::ZERO))),
            "handler_timeout"
        );
    }

    #[test]
    fn settings_that_would_spin_or_never_deliver_are_refused() {
        let zero = Duration::ZERO;
        let cases = [
            (
                RelayConfig::builder().shard_row_budget(0),
                "shard_row_budget",
            ),
            (RelayConfig::builder().discovery_page(0), "discovery_page"),
            (
                RelayConfig::builder().shard_time_budget(zero),
                "shard_time_budget",
            ),
            (RelayConfig::builder().lease(zero), "lease"),
            (RelayConfig::builder().poll_interval(zero), "poll_interval"),
            (
                RelayConfig::builder().min_poll_interval(zero),
                "min_poll_interval",
            ),
            (
                RelayConfig::builder().max_reconnect_delay(zero),
                "max_reconnect_delay",
            ),
            (RelayConfig::builder().worker_id(""), "worker_id"),
            (
                RelayConfig::builder().backoff(Backoff::new(zero, Duration::from_secs(1))),
                "backoff.initial",
            ),
            (
                RelayConfig::builder()
                    .backoff(Backoff::new(Duration::from_secs(2), Duration::from_secs(1))),
                "backoff.max",
            ),
        ];
        for (builder, setting) in cases {
            assert_eq!(refused(builder), setting);
        }
    }

    #[test]
    fn a_valid_configuration_can_be_changed_and_checked_again() {
        let config = RelayConfig::builder().worker_id("a").build().unwrap();
        let changed = config.to_builder().batch_size(7).build().unwrap();
        assert_eq!((changed.worker_id(), changed.batch_size()), ("a", 7));
        assert_eq!(refused(config.to_builder().batch_size(0)), "batch_size");
    }

    #[test]
    fn backoff_without_jitter_doubles_from_initial_and_caps() {
        let backoff = Backoff::default().with_jitter(false);
        let delays: Vec<u64> = (1..=13)
            .map(|attempt| backoff.delay(attempt).as_secs())
            .collect();
        assert_eq!(
            delays,
            [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3600, 3600],
            "the seeds' schedule: 2 s doubling to 1 h"
        );
        assert_eq!(
            (1..=13).map(|_| backoff.delay(5)).collect::<Vec<_>>(),
            vec![Duration::from_secs(32); 13],
            "without jitter, a delay is exact and the same every time"
        );
        assert_eq!(
            backoff.delay(u32::MAX),
            Duration::from_secs(3600),
            "no overflow"
        );
        assert_eq!(backoff.delay(0), Duration::from_secs(2));
    }

    #[test]
    fn the_default_backoff_is_jittered_within_its_bounds_and_never_above_max() {
        let backoff = Backoff::default();
        assert!(backoff.jitter, "jitter is on by default");
        assert_eq!(RelayConfig::default().backoff(), backoff);
        assert!(Backoff::new(Duration::from_secs(1), Duration::from_secs(2)).jitter);
        for (attempts, nominal) in [(1, 2), (6, 64), (12, 3600), (u32::MAX, 3600)] {
            let nominal = Duration::from_secs(nominal);
            let delays: Vec<Duration> = (0..200).map(|_| backoff.delay(attempts)).collect();
            assert!(
                delays
                    .iter()
                    .all(|delay| *delay >= nominal / 2 && *delay <= nominal),
                "attempt {attempts}: every delay within [{:?}, {nominal:?}]",
                nominal / 2
            );
            assert!(
                delays.windows(2).any(|pair| pair[0] != pair[1]),
                "attempt {attempts}: the delays vary"
            );
        }
        assert!(
            (0..1000).all(|_| backoff.delay(100) <= backoff.max),
            "never above max"
        );
    }

    #[test]
    fn jitter_stays_between_half_and_all_of_the_delay() {
        let backoff =
            Backoff::new(Duration::from_secs(2), Duration::from_secs(60)).with_jitter(true);
        let delays: Vec<Duration> = (0..200).map(|_| backoff.delay(3)).collect();
        assert!(
            delays
                .iter()
                .all(|delay| *delay >= Duration::from_secs(4) && *delay <= Duration::from_secs(8))
        );
        assert!(
            delays.windows(2).any(|pair| pair[0] != pair[1]),
            "jitter varies the delay"
        );
    }
}
