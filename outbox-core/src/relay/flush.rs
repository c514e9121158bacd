//! Flushes: draining what a committed transaction wrote, and the runner's bounded pass.

use std::time::Duration;

use tokio::sync::watch;
use tracing::debug;

use super::parked::ParkedShards;
use super::pool::ShardPool;
use super::report::DrainReport;
use super::shard::{DrainMode, ShardFailure, ShardRun};
use super::{Inner, Relay};
use crate::error::Error;
use crate::flush::WrittenShards;
use crate::handler::DeliveryError;
use crate::model::{MessageId, ShardKey};
use crate::store::Store;

/// What flushing one shard came to: its drains, and the rows it could not reach.
type Flushed = Result<(Vec<ShardRun>, Option<Undelivered>), Error>;

impl<S: Store> Relay<S> {
    /// Flush-after-commit: drains exactly the shards a committed transaction wrote to,
    /// each up to the newest row the transaction wrote there, and returns `Ok` only once every
    /// one of those rows is delivered. The caller learns the outcome: a handler that fails is
    /// a [`FlushError::Delivery`], its data committed, its rows left for the relay, the
    /// shard's schedule not pushed back. Budgets do not cut a flush short. A shard another
    /// worker holds is waited for, up to [`RelayConfig::flush_wait`], then drained; past
    /// that, the flush is a [`FlushError::Incomplete`] naming the rows left. A paused shard
    /// is not waited for: its rows are named at once, as paused.
    ///
    /// `written` comes from the backend's `OutboxTransaction::commit`: the shards of a
    /// transaction that has not committed cannot be had.
    ///
    /// [`RelayConfig::flush_wait`]: crate::RelayConfig::flush_wait
    pub async fn flush(&self, written: &WrittenShards) -> Result<DrainReport, FlushError> {
        if written.is_empty() {
            return Ok(DrainReport::default());
        }
        self.inner.prepare().await.map_err(FlushError::Store)?;
        let mut pool: ShardPool<Flushed> = ShardPool::flushes(&self.inner.config);
        for (shard, up_to) in written.iter() {
            let inner = std::sync::Arc::clone(&self.inner);
            let stopping = pool.stopping();
            let task_shard = shard.clone();
            let begin =
                move || async move { inner.flush_shard(&task_shard, up_to, &stopping).await };
            pool.start(shard.clone(), begin).await;
        }
        let mut report = DrainReport::default();
        let mut remaining = Vec::new();
        let mut first_error = None;
        while let Some((_, flushed)) = pool.next_finished().await {
            match flushed {
                Ok((runs, left)) => {
                    runs.into_iter().for_each(|run| report.absorb(Some(run)));
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
        self.inner.prepare().await.map_err(FlushError::Store)?;
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
        self.pass(
            DrainMode::Flush { up_to: newest },
            &mut report,
            &ParkedShards::default(),
        )
        .await
        .map_err(FlushError::Store)?;
        FlushError::check(report, Vec::new())
    }
}

impl<S: Store> Inner<S> {
    /// Drains `shard` up to `up_to` for a flush: claims it, waiting (up to the configured
    /// bound) while another worker holds it, until none of its rows up to the bound is pending
    /// or a delivery fails. Returns the drains, and the shard if rows were left.
    async fn flush_shard(
        &self,
        shard: &ShardKey,
        up_to: MessageId,
        stopping: &watch::Receiver<bool>,
    ) -> Flushed {
        let started = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(2);
        let mut runs = Vec::new();
        loop {
            let run = self
                .drain_shard(shard, stopping, DrainMode::Flush { up_to })
                .await?;
            if let Some(run) = run {
                let (failed, settled) = (run.failure().is_some(), !run.lost_lease());
                runs.push(run);
                if failed || settled {
                    // Drained to the bound, or failed: either way the caller hears of it.
                    return Ok((runs, None));
                }
            }
            // Not claimed (held by another worker, or nothing left), or taken over mid-drain.
            let messages = self.store.pending_in_shard(shard, up_to).await?;
            if messages == 0 {
                return Ok((runs, None));
            }
            let waited = started.elapsed();
            // A paused shard is not waited for: a pause can last, and writers must not stall.
            let paused = self.store.is_paused(shard).await?;
            if paused || waited >= self.config.flush_wait {
                let left = Undelivered {
                    shard: shard.clone(),
                    messages,
                    waited,
                    paused,
                };
                return Ok((runs, Some(left)));
            }
            debug!(%shard, messages, "shard held by another worker; the flush waits");
            tokio::time::sleep(pause.min(self.config.flush_wait.saturating_sub(waited))).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

/// Why a flush after commit did not deliver everything it drained. The data is committed
/// either way: what was not delivered stays for the relay.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlushError {
    /// A handler failed (or a row could not be delivered): its message and the later ones of
    /// its shard stay for the relay, and the shard's schedule is not pushed back. The other
    /// shards of the flush were drained.
    #[error("flushing the outboxes of {shard} failed")]
    Delivery {
        /// The shard whose delivery failed (the first, if several did).
        shard: ShardKey,
        /// What failed, with the handler's error as its source.
        #[source]
        error: Box<DeliveryError>,
        /// The other shards of the flush that failed, if any.
        others: Vec<ShardFailure>,
        /// What the flush delivered before and besides the failure.
        report: Box<DrainReport>,
    },
    /// Rows the transaction wrote are still pending: another worker held their shard for
    /// longer than [`RelayConfig::flush_wait`](crate::RelayConfig::flush_wait). They are
    /// committed and stay for the relay (or that worker); nothing failed.
    #[error("flushing left {} message(s) undelivered in {} shard(s): {}",
        remaining.iter().map(|shard| shard.messages).sum::<u64>(), remaining.len(),
        remaining.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Incomplete {
        /// The shards with rows left, and why.
        remaining: Vec<Undelivered>,
        /// What the flush delivered.
        report: Box<DrainReport>,
    },
    /// The database failed while flushing.
    #[error("flushing the outboxes failed")]
    Store(#[source] Error),
}

/// A shard a flush could not finish: its rows up to the flush's bound are still pending.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Undelivered {
    /// The shard.
    pub shard: ShardKey,
    /// How many of its messages, up to the newest the transaction wrote there, are pending.
    pub messages: u64,
    /// How long the flush waited for the shard.
    pub waited: Duration,
    /// Whether a pause holds the shard: the flush did not wait for it, and its rows are
    /// delivered once it is resumed.
    pub paused: bool,
}

impl std::fmt::Display for Undelivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.paused {
            return write!(
                f,
                "{} message(s) in {}, which is paused: they are delivered once it is resumed",
                self.messages, self.shard
            );
        }
        write!(
            f,
            "{} message(s) in {}, which another worker held (or which was backing off) for the \
             {:?} the flush waited",
            self.messages, self.shard, self.waited
        )
    }
}

impl FlushError {
    /// A flush's report, or the failure it contains, or the rows it left.
    pub(crate) fn check(
        mut report: DrainReport,
        remaining: Vec<Undelivered>,
    ) -> Result<DrainReport, Self> {
        if report.failures.is_empty() {
            if remaining.is_empty() {
                return Ok(report);
            }
            return Err(Self::Incomplete {
                remaining,
                report: Box::new(report),
            });
        }
        let mut failures = std::mem::take(&mut report.failures).into_iter();
        let first = failures.next().expect("failures is not empty");
        Err(Self::Delivery {
            shard: first.shard,
            error: Box::new(first.error),
            others: failures.collect(),
            report: Box::new(report),
        })
    }

    /// The failed delivery, if a delivery failed.
    pub fn delivery_error(&self) -> Option<&DeliveryError> {
        match self {
            Self::Delivery { error, .. } => Some(error),
            Self::Incomplete { .. } | Self::Store(_) => None,
        }
    }
}
