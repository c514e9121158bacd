//! The pace of a running relay's backfill walks: how many rows a tick walks, set from the
//! latency of the live messages the relay measures, so that a walk takes what live traffic
//! leaves and no more.
//!
//! The relay measures, for each drain of a shard a commit named (the urgent lane: live
//! traffic), the time from its newest message's write (`created_at`, by the database's clock)
//! to its first handler's turn ([`LiveLatency`]): a live message's latency, which a walk adds
//! to as its writes and the drains of its outboxes compete with the live claims for the
//! database and with the live handlers for the processor. The pace compares it only with
//! itself (its baseline), so that a constant difference between the two clocks matters
//! little. [`WalkPace`] keeps the 99th percentile of it measured while nothing is walked
//! (over the whole quiet time) as the baseline, and while a walk goes on, adjusts the rows
//! per tick in windows: halved when the live 99th percentile rises past [`WalkPace::OVER`]
//! times the baseline, raised (doubled at first, then by a sixty-fourth of the cap) while it
//! stays within [`WalkPace::UNDER`] times it, up to the operator's cap
//! ([`backfill_budget`](crate::RelayConfigBuilder::backfill_budget)). With no live traffic to
//! measure, a walk goes at the cap.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

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
    Duration::from_nanos((((4 + below + 1) * 1_000) << exponent) >> 2)
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
    /// The most latencies the quiet time keeps: past it, the older count for half, so that
    /// the baseline follows a change of the live traffic over hours.
    const KEPT: u32 = 1 << 20;

    /// Adds `other`'s latencies to this window's.
    fn merge(&mut self, other: &Window) {
        if self.total.saturating_add(other.total) > Self::KEPT {
            for count in &mut self.counts {
                *count /= 2;
            }
            self.total = self.counts.iter().sum();
        }
        for (count, more) in self.counts.iter_mut().zip(other.counts) {
            *count = count.saturating_add(more);
        }
        self.total = self.total.saturating_add(other.total);
    }

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
    /// A live drain's first handler's turn came `latency` after its message was written.
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
    /// The live latencies measured while nothing was walked, all windows together: their
    /// 99th percentile is the baseline (that of the whole quiet time, as an operator reads
    /// it, not the typical window's, which is lower).
    quiet: Window,
    /// When the current window began.
    window_began: Instant,
    /// Whether a tick walked rows in the current window (or skipped its turn in a walk).
    walked: bool,
    /// Whether the last tick that ran walked rows: a walk is under way.
    walking: bool,
    /// The rows saved up by ticks skipped (see [`WalkPace::budget`]).
    owed: usize,
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
    /// Above this multiple of the baseline, the pace is halved: below twice it, with room for
    /// a window's noise.
    pub(super) const OVER: f64 = 1.5;
    /// Within this multiple of the baseline, the pace rises.
    pub(super) const UNDER: f64 = 1.25;
    /// Once it has been over, the pace rises by this fraction of the cap at a time: small
    /// steps, so that it stays near the most the live latency allows rather than swinging
    /// past it and back.
    const STEPS: usize = 64;

    /// A pace that walks at most `cap` rows a tick, starting at a sixteenth of it.
    pub(super) fn new(cap: usize, now: Instant) -> Self {
        let cap = cap.max(1);
        Self {
            cap,
            floor: (cap / 100).max(1),
            rows: Self::least_of(cap),
            quiet: Window::default(),
            window_began: now,
            walked: false,
            walking: false,
            owed: 0,
            doubling: true,
        }
    }

    /// The rows the next tick may walk, once the window that ends by `now` (if one does) is
    /// judged by the live latencies `live` measured in it; 0: skip this tick.
    ///
    /// Below [`Self::least`] rows a tick, the rows are saved up and walked in one batch every
    /// few ticks: each batch costs its statements and a sweep of the relay whatever its size,
    /// and a pace that live latency holds down must not be spent on them.
    pub(super) fn budget(&mut self, live: &LiveLatency, now: Instant) -> usize {
        let long = now.saturating_duration_since(self.window_began);
        if long >= Self::WINDOW && (live.count() >= Self::SAMPLES || long >= Self::LONG_WINDOW) {
            let window = live.take();
            self.judge(&window);
            self.window_began = now;
            self.walked = false;
        }
        self.owed = self.owed.saturating_add(self.rows).min(self.cap);
        if self.owed < self.least() {
            // A walk under way goes on in this window, a tick later.
            self.walked |= self.walking;
            return 0;
        }
        std::mem::take(&mut self.owed)
    }

    /// The fewest rows a tick walks: a sixteenth of the cap (where a walk starts).
    fn least(&self) -> usize {
        Self::least_of(self.cap)
    }

    /// A sixteenth of `cap`, at least one row.
    fn least_of(cap: usize) -> usize {
        (cap / 16).max(1)
    }

    /// A tick walked `rows` rows (over every model).
    pub(super) fn walked(&mut self, rows: usize) {
        self.walking = rows > 0;
        self.walked |= self.walking;
    }

    /// The rows per tick the pace allows now.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// Takes in a window's live latencies: the baseline if nothing was walked in it, else
    /// whether the walk may go faster or must slow down.
    pub(super) fn judge(&mut self, window: &Window) {
        let p99 = window.quantile(0.99);
        if !self.walked {
            self.quiet.merge(window);
            // The next walk starts slow again.
            (self.rows, self.doubling, self.owed) = (self.least(), true, 0);
            return;
        }
        let Some(p99) = p99 else {
            // No live traffic to protect.
            self.rise();
            return;
        };
        // A relay that started during a walk takes its first window (at the slow pace it
        // starts at) as the baseline.
        if self.quiet.total == 0 {
            self.quiet.merge(window);
        }
        let baseline = self.quiet.quantile(0.99).unwrap_or(p99);
        let before = self.rows;
        if p99 > baseline.mul_f64(Self::OVER) {
            self.rows = (self.rows / 2).max(self.floor);
            self.doubling = false;
        } else if p99 <= baseline.mul_f64(Self::UNDER) {
            self.rise();
        }
        if self.rows != before {
            debug!(rows = self.rows, before, ?p99, ?baseline, "backfill pace");
        }
    }

    fn rise(&mut self) {
        let step = if self.doubling {
            self.rows
        } else {
            (self.cap / Self::STEPS).max(1)
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
        // Back to the baseline: up by a sixty-fourth of the cap at a time.
        pace.walked(50);
        pace.judge(&as_before);
        assert_eq!(pace.rows(), 75);
        pace.walked(75);
        pace.judge(&as_before);
        assert_eq!(pace.rows(), 100);
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
    fn a_slow_pace_saves_its_rows_up_for_fewer_larger_batches_and_a_new_walk_starts_afresh() {
        let live = LiveLatency::default();
        let start = Instant::now();
        let mut pace = WalkPace::new(1_000, start);
        pace.judge(&window(&[(1, 100)]));
        for _ in 0..6 {
            pace.walked(1);
            pace.judge(&window(&[(1, 50), (100, 50)]));
        }
        assert_eq!(pace.rows(), 10, "held down to its floor");
        // 10 rows a tick: skipped until 62 (a sixteenth of the cap) are owed, then walked
        // at once.
        let ticks: Vec<usize> = (0..14).map(|_| pace.budget(&live, start)).collect();
        assert_eq!(ticks, [0, 0, 0, 0, 0, 0, 70, 0, 0, 0, 0, 0, 0, 70]);
        pace.walked(70);
        // A window of skipped ticks in a walk is still a walk's: no baseline taken from it.
        let later = start + WalkPace::LONG_WINDOW;
        assert_eq!(pace.budget(&live, later), 0);
        assert!(
            pace.walked,
            "the next window is a walk's too, while it skips"
        );
        // A window with no walk at all: the next walk starts from a sixteenth again.
        pace.walked(0);
        pace.walked = false;
        pace.judge(&window(&[(1, 100)]));
        assert_eq!(pace.rows(), 62);
    }

    #[test]
    fn the_baseline_is_the_whole_quiet_times_percentile_not_a_typical_windows() {
        let mut pace = WalkPace::new(1_600, Instant::now());
        // Two quiet windows: one calm, one with a twentieth of its latencies at 10 ms. Over
        // both, 1 in 40 is at 10 ms: the 99th percentile is 10 ms (its bucket's top, 10.24).
        pace.judge(&window(&[(1, 100)]));
        pace.judge(&window(&[(1, 95), (10, 5)]));
        // Walking at 12 ms: within a quarter of 10.24 ms, so faster.
        pace.walked(100);
        pace.judge(&window(&[(1, 90), (12, 10)]));
        assert_eq!(pace.rows(), 200);
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
