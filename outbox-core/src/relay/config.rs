//! Relay settings.

use std::time::Duration;

use crate::store::HandlerMode;

/// How the relay runs. Start from [`RelayConfig::default`] and change what you need.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// Name recorded on the leases this relay takes (defaults to `outbox-<pid>-<random>`).
    pub worker_id: String,
    /// How many shards are drained at once (16 by default). Each holds a connection of the
    /// store's pool while it works: give the pool a few more connections than this.
    pub max_concurrent_shards: usize,
    /// How many rows of a shard are read at once (500 by default).
    pub batch_size: usize,
    /// After delivering this many rows, a shard is released (still due) so others get a turn.
    pub shard_row_budget: usize,
    /// After this long, a shard is released (still due) so others get a turn.
    pub shard_time_budget: Duration,
    /// How long a claim lasts without an acknowledgement before another worker may take the
    /// shard over. Each acknowledgement extends it.
    pub lease: Duration,
    /// Backoff of a shard whose head keeps failing (S19).
    pub backoff: Backoff,
    /// Whether handlers run under a lease (default) or inside the claiming transaction.
    pub handler_mode: HandlerMode,
    /// A handler running longer than this fails its delivery. `None`: no limit.
    pub handler_timeout: Option<Duration>,
    /// How often an idle relay looks for due shards when nothing wakes it.
    pub poll_interval: Duration,
    /// Whether to listen for commits (PostgreSQL `LISTEN/NOTIFY`). Turn off behind connection
    /// poolers that break `LISTEN`, such as PgBouncer in transaction mode: the relay then polls.
    pub wake_on_commit: bool,
    /// How many shards one discovery query visits.
    pub discovery_page: usize,
    /// How long [`Relay::run`](crate::Relay::run) waits for in-flight shards after shutdown is
    /// requested before abandoning them (their leases expire; nothing is lost).
    pub shutdown_deadline: Duration,
    /// Longest pause between reconnection attempts while the database is unreachable.
    pub max_reconnect_delay: Duration,
    /// How long [`Relay::flush`](crate::Relay::flush) waits for a shard that another worker
    /// holds (5 s by default) before it gives up with
    /// [`FlushError::Incomplete`](crate::FlushError::Incomplete), naming the rows left.
    pub flush_wait: Duration,
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
            batch_size: 500,
            shard_row_budget: 1_000,
            shard_time_budget: Duration::from_secs(1),
            lease: Duration::from_secs(30),
            backoff: Backoff::default(),
            handler_mode: HandlerMode::Leased,
            handler_timeout: None,
            poll_interval: Duration::from_secs(1),
            wake_on_commit: true,
            discovery_page: 256,
            shutdown_deadline: Duration::from_secs(30),
            max_reconnect_delay: Duration::from_secs(30),
            flush_wait: Duration::from_secs(5),
        }
    }
}

/// Exponential, capped backoff per shard, with optional jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backoff {
    /// The delay after the first failure (default 2 s).
    pub initial: Duration,
    /// The longest delay (default 1 h).
    pub max: Duration,
    /// Whether to pick each delay at random between half and all of its value.
    pub jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(2),
            max: Duration::from_secs(3600),
            jitter: false,
        }
    }
}

impl Backoff {
    /// A backoff from `initial` doubling up to `max`, without jitter.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            jitter: false,
        }
    }

    /// This backoff with jitter on or off.
    pub fn with_jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// The delay after the `attempts`-th consecutive failure (1 for the first).
    pub fn delay(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(63);
        let factor = 1u64.checked_shl(doublings).unwrap_or(u64::MAX);
        let full = u32::try_from(factor)
            .ok()
            .and_then(|factor| self.initial.checked_mul(factor))
            .unwrap_or(self.max)
            .min(self.max);
        if self.jitter {
            let half = full / 2;
            half + full.saturating_sub(half).mul_f64(rand::random::<f64>())
        } else {
            full
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_initial_and_caps() {
        let backoff = Backoff::default();
        let delays: Vec<u64> = (1..=13)
            .map(|attempt| backoff.delay(attempt).as_secs())
            .collect();
        assert_eq!(
            delays,
            [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3600, 3600],
            "the seeds' schedule: 2 s doubling to 1 h"
        );
        assert_eq!(
            backoff.delay(u32::MAX),
            Duration::from_secs(3600),
            "no overflow"
        );
        assert_eq!(backoff.delay(0), Duration::from_secs(2));
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
