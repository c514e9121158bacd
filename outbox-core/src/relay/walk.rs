//! The pace of a running relay's backfill walks: how many rows a tick walks, set from the
//! latency of the live messages the relay measures, so that a walk takes what live traffic
//! leaves and no more.
//!
//! The relay measures, for each drain of a shard a commit named (the urgent lane: live
//! traffic), the time from its claim being asked to its first handler's turn
//! ([`LiveLatency`]). That is the share of a live message's latency a walk can add to: the
//! walk's writes and the drains of its outboxes compete with the live claims for the database
//! and with the live handlers for the processor. [`WalkPace`] keeps the 99th percentile of it
//! measured while nothing is walked as the baseline, and while a walk goes on, adjusts the rows
//! per tick in windows: halved when the live 99th percentile rises past
//! [`WalkPace::OVER`] times the baseline, raised (doubled at first, then by a sixteenth of the
//! cap) while it stays within [`WalkPace::UNDER`] times it, up to the operator's cap
//! ([`backfill_budget`](crate::RelayConfigBuilder::backfill_budget)). With no live traffic to
//! measure, a walk goes at the cap.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Buckets per doubling of the latency histogram: a bucket spans a fifth to a quarter of its
/// values.
const PER_DOUBLING: usize = 4;
/// Buckets from 1 µs to 2³² µs (over an hour).
const BUCKETS: usize = 32 * PER_DOUBLING;

/// The bucket of `micros`: its exponent, then the two bits below its highest.
fn bucket(micros: u64) -> usize {
    let micros = micros.max(1);
    let exponent = 63 - micros.leading_zeros() as usize;
    let below = if exponent >= 2 {
        (micros >> (exponent - 2)) & 3
    } else {
        (micros << (2 - exponent)) & 3
    };
    (exponent * PER_DOUBLING + below as usize).min(BUCKETS - 1)
}

/// The top of latency bucket `index` (its values are below it).
fn bucket_top(index: usize) -> Duration {
    let (exponent, below) = (index / PER_DOUBLING, (index % PER_DOUBLING) as u64);
    // In nanoseconds: a quarter of the doubling's base is below a microsecond at first.
    Duration::from_nanos(((4 + below + 1) * 1_000 << exponent) >> 2)
}

/// The live latencies a relay measured since they were last taken: a histogram of log-spaced
/// buckets, recorded by every drain of the urgent lane and taken by the backfill's ticks.
#[derive(Debug)]
pub(super) struct LiveLatency {
    window: Mutex<Window>,
}

impl Default for LiveLatency {
    fn default() -> Self {
        Self {
            window: Mutex::new(Window::default()),
        }
    }
}

/// Latencies counted by bucket.
#[derive(Debug, Clone)]
pub(super) struct Window {
    counts: [u32; BUCKETS],
    total: u32,
}

impl Default for Window {
    fn default() -> Self {
        Self {
            counts: [0; BUCKETS],
            total: 0,
        }
    }
}

impl Window {
    fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let index = bucket(micros);
        self.counts[index] = self.counts[index].saturating_add(1);
        self.total = self.total.saturating_add(1);
    }

    /// The latency below which `share` of the window's latencies lie (rounded up to its
    /// bucket's top); `None` for an empty window.
    pub(super) fn quantile(&self, share: f64) -> Option<Duration> {
        if self.total == 0 {
            return None;
        }
        let rank = (f64::from(self.total) * share).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (index, count) in self.counts.iter().enumerate() {
            seen += u64::from(*count);
            if seen >= rank {
                return Some(bucket_top(index));
            }
        }
        Some(bucket_top(BUCKETS - 1))
    }
}

impl LiveLatency {
    /// A live drain waited `latency` from its claim to its first handler's turn.
    pub(super) fn record(&self, latency: Duration) {
        self.window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(latency);
    }

    /// The latencies since the last time they were taken.
    fn take(&self) -> Window {
        std::mem::take(&mut *self.window.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// How many latencies were recorded since they were last taken.
    fn count(&self) -> u32 {
        self.window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

/// The rows per tick of a relay's backfill walks (see the module's documentation).
#[derive(Debug)]
pub(super) struct WalkPace {
    /// The operator's cap: the most rows a tick walks.
    cap: usize,
    /// The fewest: a walk always goes on.
    floor: usize,
    /// The rows a tick walks now.
    rows: usize,
    /// The live 99th percentile while nothing is walked.
    baseline: Option<Duration>,
    /// When the current window began.
    window_began: Instant,
    /// Whether a tick walked rows in the current window.
    walked: bool,
    /// Whether the pace still doubles (it has not yet been over).
    doubling: bool,
}

impl WalkPace {
    /// A window lasts at least this long...
    const WINDOW: Duration = Duration::from_millis(500);
    /// ...and until it holds this many live latencies, or lasts [`Self::LONG_WINDOW`].
    const SAMPLES: u32 = 50;
    /// The longest a window waits for [`Self::SAMPLES`].
    const LONG_WINDOW: Duration = Duration::from_secs(5);
    /// Above this multiple of the baseline, the pace is halved.
    pub(super) const OVER: f64 = 1.5;
    /// Within this multiple of the baseline, the pace rises.
    pub(super) const UNDER: f64 = 1.25;

    /// A pace that walks at most `cap` rows a tick, starting at a sixteenth of it.
    pub(super) fn new(cap: usize, now: Instant) -> Self {
        let cap = cap.max(1);
        let floor = (cap / 100).max(1);
        Self {
            cap,
            floor,
            rows: (cap / 16).max(floor),
            baseline: None,
            window_began: now,
            walked: false,
            doubling: true,
        }
    }

    /// The rows the next tick may walk, once the window that ends by `now` (if one does) is
    /// judged by the live latencies `live` measured in it.
    pub(super) fn budget(&mut self, live: &LiveLatency, now: Instant) -> usize {
        let long = now.saturating_duration_since(self.window_began);
        if long >= Self::WINDOW && (live.count() >= Self::SAMPLES || long >= Self::LONG_WINDOW) {
            let window = live.take();
            self.judge(&window);
            self.window_began = now;
            self.walked = false;
        }
        self.rows
    }

    /// A tick walked `rows` rows (over every model).
    pub(super) fn walked(&mut self, rows: usize) {
        self.walked |= rows > 0;
    }

    /// The rows a tick walks now.
    #[cfg(test)]
    fn rows(&self) -> usize {
        self.rows
    }

    /// Takes in a window's live latencies: the baseline if nothing was walked in it, else
    /// whether the walk may go faster or must slow down.
    pub(super) fn judge(&mut self, window: &Window) {
        let p99 = window.quantile(0.99);
        if !self.walked {
            if let Some(p99) = p99 {
                // Moving, so that one quiet window's luck does not set it.
                self.baseline = Some(self.baseline.map_or(p99, |before| (before * 3 + p99) / 4));
            }
            return;
        }
        let Some(p99) = p99 else {
            // No live traffic to protect.
            self.rise();
            return;
        };
        // A relay that started during a walk takes its first window (at the slow pace it
        // starts at) as the baseline.
        let baseline = *self.baseline.get_or_insert(p99);
        if p99 > baseline.mul_f64(Self::OVER) {
            self.rows = (self.rows / 2).max(self.floor);
            self.doubling = false;
        } else if p99 <= baseline.mul_f64(Self::UNDER) {
            self.rise();
        }
    }

    fn rise(&mut self) {
        let step = if self.doubling {
            self.rows
        } else {
            (self.cap / 16).max(1)
        };
        self.rows = self.rows.saturating_add(step).min(self.cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(latencies: &[(u64, u32)]) -> Window {
        let mut window = Window::default();
        for &(millis, times) in latencies {
            for _ in 0..times {
                window.record(Duration::from_millis(millis));
            }
        }
        window
    }

    #[test]
    fn buckets_hold_their_values_within_a_quarter() {
        for micros in [
            1u64,
            2,
            3,
            5,
            7,
            100,
            999,
            1_000,
            12_345,
            250_000,
            3_600_000_000,
        ] {
            let (top, nanos) = (
                bucket_top(bucket(micros)).as_nanos(),
                u128::from(micros) * 1_000,
            );
            assert!(top > nanos, "{micros} µs in a bucket up to {top} ns");
            assert!(
                top * 4 <= nanos * 5,
                "{micros} µs in a bucket up to {top} ns"
            );
        }
        assert!(bucket(u64::MAX) < BUCKETS);
    }

    #[test]
    fn a_window_answers_its_quantiles() {
        assert_eq!(Window::default().quantile(0.99), None);
        let window = window(&[(1, 98), (40, 2)]);
        let p99 = window.quantile(0.99).expect("a quantile");
        assert!(p99 > Duration::from_millis(40) && p99 <= Duration::from_millis(50));
        let p50 = window.quantile(0.5).expect("a quantile");
        assert!(p50 > Duration::from_millis(1) && p50 <= Duration::from_millis(2));
    }

    #[test]
    fn a_walk_without_live_traffic_speeds_up_to_the_cap() {
        let mut pace = WalkPace::new(1_600, Instant::now());
        assert_eq!(pace.rows(), 100, "it starts at a sixteenth");
        for expected in [200, 400, 800, 1_600, 1_600] {
            pace.walked(10);
            pace.judge(&Window::default());
            assert_eq!(pace.rows(), expected);
        }
    }

    #[test]
    fn a_walk_slows_down_when_live_latency_rises_and_speeds_up_when_it_falls() {
        let mut pace = WalkPace::new(1_600, Instant::now());
        // Before the walk: the baseline, 3 ms at the 99th percentile (its bucket's top,
        // 3.07 ms: within a quarter of it is up to 3.84 ms, over half of it from 4.61 ms).
        let as_before = window(&[(1, 90), (3, 10)]);
        pace.judge(&as_before);
        assert_eq!(pace.rows(), 100, "no walk, no change");
        // Walking, live latency as before: faster.
        pace.walked(100);
        pace.judge(&as_before);
        assert_eq!(pace.rows(), 200);
        // Live latency twice the baseline: halved, and no more doubling.
        pace.walked(200);
        pace.judge(&window(&[(1, 90), (6, 10)]));
        assert_eq!(pace.rows(), 100);
        pace.walked(100);
        pace.judge(&window(&[(1, 90), (6, 10)]));
        assert_eq!(pace.rows(), 50);
        // Between the two bounds: held.
        pace.walked(50);
        pace.judge(&window(&[(1, 90), (4, 10)]));
        assert_eq!(pace.rows(), 50);
        // Back to the baseline: up by a sixteenth of the cap at a time.
        pace.walked(50);
        pace.judge(&as_before);
        assert_eq!(pace.rows(), 150);
        pace.walked(150);
        pace.judge(&as_before);
        assert_eq!(pace.rows(), 250);
    }

    #[test]
    fn a_walk_never_stops_and_never_passes_the_cap() {
        let mut pace = WalkPace::new(1_000, Instant::now());
        pace.judge(&window(&[(1, 100)]));
        for _ in 0..20 {
            pace.walked(1);
            pace.judge(&window(&[(1, 50), (100, 50)]));
        }
        assert_eq!(pace.rows(), 10, "a hundredth of the cap at least");
        let mut pace = WalkPace::new(1, Instant::now());
        pace.walked(1);
        pace.judge(&Window::default());
        assert_eq!(pace.rows(), 1);
    }

    #[test]
    fn a_relay_started_during_a_walk_takes_its_first_window_as_the_baseline() {
        let mut pace = WalkPace::new(1_600, Instant::now());
        pace.walked(100);
        pace.judge(&window(&[(4, 100)]));
        assert_eq!(
            pace.rows(),
            200,
            "the first window is the baseline: within it"
        );
        pace.walked(200);
        pace.judge(&window(&[(4, 90), (20, 10)]));
        assert_eq!(pace.rows(), 100, "five times the first window");
    }

    #[test]
    fn windows_close_after_their_length_and_enough_latencies() {
        let live = LiveLatency::default();
        let start = Instant::now();
        let mut pace = WalkPace::new(1_600, start);
        pace.walked(100);
        // Too soon: the window stays open, whatever it holds.
        assert_eq!(pace.budget(&live, start + WalkPace::WINDOW / 2), 100);
        // Long enough but too few latencies: still open.
        live.record(Duration::from_millis(1));
        assert_eq!(pace.budget(&live, start + WalkPace::WINDOW), 100);
        for _ in 0..WalkPace::SAMPLES {
            live.record(Duration::from_millis(1));
        }
        // Enough: judged (the first window while walking is the baseline; within it).
        assert_eq!(pace.budget(&live, start + WalkPace::WINDOW), 200);
        assert_eq!(live.count(), 0, "taken");
        // A window with too few latencies closes after the long window all the same.
        pace.walked(200);
        let later = start + WalkPace::WINDOW;
        assert_eq!(pace.budget(&live, later + WalkPace::WINDOW), 200);
        assert_eq!(pace.budget(&live, later + WalkPace::LONG_WINDOW), 400);
    }
}
