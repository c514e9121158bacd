//! The time the in-memory store keeps leases and backoff by.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

/// A clock that stands still until a test moves it: leases lapse and backoffs end exactly when
/// the test says, without sleeping. Give it to [`MemoryStore::with_clock`](super::MemoryStore::with_clock).
///
/// Only the store's own times follow it (lease expiry, `retry_at`, `created_at`); the relay's
/// budgets, heartbeats and timeouts run on tokio's clock.
///
/// Clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<SystemTime>>,
}

impl ManualClock {
    /// A clock that starts at the current system time.
    pub fn new() -> Self {
        Self::starting_at(SystemTime::now())
    }

    /// A clock that starts at `start`.
    pub fn starting_at(start: SystemTime) -> Self {
        Self {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// The clock's current time.
    pub fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = later(*now, by);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

/// The store's clock: the system's, or a test's [`ManualClock`].
#[derive(Debug, Clone, Default)]
pub(super) struct Clock(Option<ManualClock>);

impl Clock {
    pub(super) fn manual(clock: ManualClock) -> Self {
        Self(Some(clock))
    }

    pub(super) fn now(&self) -> SystemTime {
        self.0
            .as_ref()
            .map_or_else(SystemTime::now, ManualClock::now)
    }
}

/// `at + by`, saturating far in the future instead of overflowing.
pub(super) fn later(at: SystemTime, by: Duration) -> SystemTime {
    at.checked_add(by)
        .unwrap_or_else(|| at + Duration::from_secs(100 * 365 * 24 * 3600))
}
