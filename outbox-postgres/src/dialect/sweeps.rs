//! Discovery sweeps that read only what was written since the last one, while whole sweeps
//! are slow.
//!
//! A whole sweep walks the shard index in key order. While something holds the vacuum
//! horizon, every row acknowledged since it began is still in that index, and each sweep walks
//! them all: pages that took a millisecond take seconds, and the walk evicts the pages the
//! relay's claims need from the buffer cache.
//!
//! Every row at or below the settled frontier (see `positions`) had committed before a sweep
//! that began after the frontier was read, so every page of that sweep saw it if it was
//! pending. Once that sweep has ended, the next needs only the rows above the frontier read
//! at its start: a range of the primary key, as long as the traffic since. That sweep is
//! *recent*; a *whole* sweep is the key-order walk.
//!
//! What a recent sweep does not look at is a shard whose rows are older and that was not due
//! when a sweep saw it: in backoff, held by a relay that since died, paused, or whose claim
//! failed. Those are the whole sweep's to find. So recent sweeps are used only while whole
//! sweeps are slow ([`SLOW`]), and a whole sweep still runs at least every [`WHOLE_EVERY`] (or
//! ten times the time the last one took, if that is longer): it finds them then.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A whole sweep whose pages took this long (in all) makes the next sweeps recent ones.
pub(crate) const SLOW: Duration = Duration::from_millis(250);

/// The longest time between whole sweeps (unless ten times the last one's reading is
/// longer).
pub(crate) const WHOLE_EVERY: Duration = Duration::from_secs(10);

/// The sweeps of one store.
#[derive(Debug, Default)]
pub(crate) struct Sweeps {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Every row at or below it was seen by an ended sweep while it was pending (0: none).
    floor: i64,
    /// The sweep going on.
    current: Option<Current>,
    /// The last whole sweep: when it ended, and how long its pages took.
    whole: Option<(Instant, Duration)>,
}

#[derive(Debug, Clone, Copy)]
struct Current {
    /// Read the rows above this id only (a recent sweep), or all (`None`: a whole sweep).
    above: Option<i64>,
    /// The settled frontier when it began.
    frontier: i64,
    /// The time its pages took so far.
    reading: Duration,
}

impl Sweeps {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A page is about to be read (`first`: the first of a sweep, which begins with the
    /// settled frontier at `frontier`): the id above which it reads, or `None` to read all.
    pub(crate) fn page(&self, first: bool, frontier: i64) -> Option<i64> {
        let mut state = self.state();
        if first || state.current.is_none() {
            let recent = match state.whole {
                Some((ended, took)) => took >= SLOW && ended.elapsed() < WHOLE_EVERY.max(took * 10),
                None => false,
            };
            let above = (recent && state.floor > 0 && frontier > 0).then_some(state.floor);
            state.current = Some(Current {
                above,
                frontier,
                reading: Duration::ZERO,
            });
        }
        state.current.and_then(|current| current.above)
    }

    /// A page was read in `took`; `last`: it ended its sweep.
    pub(crate) fn read(&self, took: Duration, last: bool) {
        let mut state = self.state();
        let Some(current) = state.current.as_mut() else {
            return;
        };
        current.reading += took;
        if !last {
            return;
        }
        let current = *current;
        state.current = None;
        state.floor = state.floor.max(current.frontier);
        if current.above.is_none() {
            state.whole = Some((Instant::now(), current.reading));
        }
    }

    /// Makes the last whole sweep as old and as slow as `took` and `ago` say, for tests.
    #[cfg(test)]
    pub(crate) fn set_whole(&self, took: Duration, ago: Duration) {
        let now = Instant::now();
        self.state().whole = Some((now.checked_sub(ago).unwrap_or(now), took));
    }
}

#[cfg(test)]
mod tests;
