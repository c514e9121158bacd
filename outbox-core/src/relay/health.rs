//! What a service's liveness and readiness probes read: [`Relay::health`](crate::Relay::health).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::sink::Breaker;
use crate::store::Heartbeat;

/// A relay's health, as [`Relay::health`](crate::Relay::health) found it.
///
/// Wire [`Health::is_live`] to the liveness probe (an orchestrator restarts an instance that
/// fails it) and [`Health::is_ready`] to the readiness probe (it takes the instance out of
/// service meanwhile). A database outage makes a relay not ready, never not live: restarting
/// it would not bring the database back, and it reconnects by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Whether [`Relay::run`](crate::Relay::run) is running (it keeps running through
    /// database outages, retrying).
    pub running: bool,
    /// Whether the relay passed its start-up checks (the schema's migrations, the shards
    /// parked on categories it knows): until then it delivers nothing, and is not ready.
    pub started: bool,
    /// Whether the database answered the health check's query just now.
    pub database_reachable: bool,
    /// The database's error, when it did not.
    pub database_error: Option<String>,
    /// When this relay last claimed a shard.
    pub last_claim_at: Option<SystemTime>,
    /// When this relay last acknowledged messages (delivered, or set aside as dead letters).
    pub last_ack_at: Option<SystemTime>,
    /// The shards this relay is draining now.
    pub shards_in_flight: usize,
    /// How long the oldest message of a shard that is due (or in flight) has waited: how far
    /// the relays are behind. `None` when no such message is pending (or the database did not
    /// answer). Shards backing off after a failure, parked or paused are not counted: `outbox
    /// status` shows those.
    pub oldest_due_lag: Option<Duration>,
    /// The names of the breakers (of sinks, or handlers of your own) that this relay found
    /// open and that are open still: the systems that do not answer. Their shards wait, with
    /// no attempt counted, until each closes; the relay stays ready meanwhile (it does its
    /// work, and restarting it would not bring the system back).
    pub open_breakers: Vec<String>,
}

impl Health {
    /// Whether the relay is alive: its loop runs. For the liveness probe.
    pub fn is_live(&self) -> bool {
        self.running
    }

    /// Whether the relay can do its work: its loop runs, it passed its start-up checks, and
    /// the database answers. For the readiness probe.
    pub fn is_ready(&self) -> bool {
        self.running && self.started && self.database_reachable
    }
}

/// What the relay records as it works, for [`Health`]: atomics, one store each.
#[derive(Debug, Default)]
pub(crate) struct Vitals {
    running: AtomicUsize,
    /// Milliseconds since the Unix epoch; 0 for never.
    last_claim_ms: AtomicU64,
    last_ack_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// The breakers a drain found open, until they close.
    breakers: Mutex<Vec<Breaker>>,
    /// The shards parked on open breakers.
    waiting: AtomicUsize,
    /// Asks for a heartbeat now (a breaker found open, shards parked or resumed).
    beat_now: tokio::sync::Notify,
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

fn time(ms: u64) -> Option<SystemTime> {
    (ms > 0).then(|| UNIX_EPOCH + Duration::from_millis(ms))
}

impl Vitals {
    /// Shards were claimed now (once for a claim's batch: the clock is read once).
    pub(crate) fn claimed(&self) {
        self.last_claim_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Counts a claimed shard's drain among those in flight until the guard drops.
    pub(crate) fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// A drain found `breaker` open: its shards wait for it.
    pub(crate) fn waiting_on(&self, breaker: &Breaker) {
        let mut breakers = self.breakers.lock().unwrap_or_else(PoisonError::into_inner);
        breakers.retain(Breaker::is_open);
        if !breakers.iter().any(|known| known.id() == breaker.id()) {
            breakers.push(breaker.clone());
            self.beat_now.notify_one();
        }
    }

    /// `count` shards are parked on open breakers now.
    pub(crate) fn set_waiting(&self, count: usize) {
        if self.waiting.swap(count, Ordering::Relaxed) != count {
            self.beat_now.notify_one();
        }
    }

    /// Ends when a heartbeat is wanted before the next interval.
    pub(crate) async fn beat_wanted(&self) {
        self.beat_now.notified().await;
    }

    /// The relay's heartbeat now.
    pub(crate) fn heartbeat(
        &self,
        worker: &str,
        started_at: SystemTime,
        expires_in: Duration,
    ) -> Heartbeat {
        Heartbeat::new(worker, started_at, expires_in).with_shards(
            self.in_flight.load(Ordering::Relaxed) as u64,
            self.waiting.load(Ordering::Relaxed) as u64,
            self.open_breakers(),
        )
    }

    /// The names of the breakers found open that are open still.
    fn open_breakers(&self) -> Vec<String> {
        self.breakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|breaker| breaker.is_open())
            .map(|breaker| breaker.name().to_owned())
            .collect()
    }

    /// Rows were acknowledged now (once for a batch of finishes).
    pub(crate) fn acknowledged(&self) {
        self.last_ack_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub(crate) fn running(&self) -> Running<'_> {
        self.running.fetch_add(1, Ordering::Relaxed);
        Running(self)
    }

    pub(crate) fn health(&self, lag: Result<Option<Duration>, String>, started: bool) -> Health {
        let (database_reachable, oldest_due_lag, database_error) = match lag {
            Ok(lag) => (true, lag, None),
            Err(error) => (false, None, Some(error)),
        };
        Health {
            running: self.running.load(Ordering::Relaxed) > 0,
            started,
            database_reachable,
            database_error,
            last_claim_at: time(self.last_claim_ms.load(Ordering::Relaxed)),
            last_ack_at: time(self.last_ack_ms.load(Ordering::Relaxed)),
            shards_in_flight: self.in_flight.load(Ordering::Relaxed),
            oldest_due_lag,
            open_breakers: self.open_breakers(),
        }
    }
}

/// A shard being drained: counted in flight until dropped.
pub(crate) struct InFlight<'a>(&'a Vitals);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A running [`Relay::run`](crate::Relay::run): counted until dropped.
pub(crate) struct Running<'a>(&'a Vitals);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}
