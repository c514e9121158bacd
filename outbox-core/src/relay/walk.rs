//! How fast a backfill walks beside live traffic: the walk's pace, set from the delivery lag
//! the relay measures.
//!
//! A walk writes its batches into the same outbox the live messages go through: a live
//! message committed just after a batch waits behind it, and the database that writes the
//! batch is the one that claims the live message. So the relay measures what a walk costs
//! where it shows: every delivery's lag (from the message's creation to its handler's start,
//! as `outbox_delivery_lag_seconds` records it) goes into a [`LagMeter`], and at each tick
//! the [`WalkPace`] compares the lag of the deliveries since its last decision with the lag
//! measured while no walk ran (the quiet lag):
//!
//! - at most half the allowance: the walk writes half as many rows again per tick;
//! - within the allowance: a tenth more;
//! - beyond it: half as many (down to a row every [`MIN_ROWS_PER_TICK`]⁻¹ ticks).
//!
//! The allowance is the quiet lag's 99th percentile times 3/2, and at least that plus a
//! millisecond: live p99 during a walk stays within about 1.5× of before. The rows per tick
//! never exceed [`backfill_budget`](crate::RelayConfigBuilder::backfill_budget), the operator's
//! cap. The quiet lag is learned while no walk runs and, during a long walk, in a short pause
//! every [`PROBE_EVERY`] (the first at once when the relay has never seen one): traffic that
//! changes during a walk changes the allowance. A pause that sees no delivery means nothing
//! runs beside the walk: it then goes at the operator's cap until the next pause.
//!
//! The lags compare two readings of one clock against the same database's: a constant offset
//! between the relay's clock and the database's moves both alike.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Lags are counted in buckets of a quarter of an octave of microseconds: below
/// [`EXACT`] µs one bucket per microsecond, then four buckets per doubling.
const EXACT: u64 = 8;
/// Buckets: the last holds every lag from about 2^40 µs (12 days) on.
const BUCKETS: usize = 4 * 41;

/// The bucket of a lag of `micros` µs.
fn bucket(micros: u64) -> usize {
    if micros < EXACT {
        return micros as usize;
    }
    let octave = 63 - micros.leading_zeros() as usize;
    let quarter = ((micros >> (octave - 2)) & 3) as usize;
    (octave * 4 + quarter).min(BUCKETS - 1)
}

/// The highest lag (µs) bucket `index` holds: a percentile read from the buckets is never
/// below the lag it stands for.
fn bucket_ceiling(index: usize) -> u64 {
    if index < EXACT as usize {
        return index as u64;
    }
    let (octave, quarter) = (index / 4, (index % 4) as u64);
    ((5 + quarter) << (octave - 2)) - 1
}

/// Every delivery's lag since the last [`LagMeter::take`], in buckets: one atomic addition a
/// delivery.
pub(super) struct LagMeter {
    counts: [AtomicU32; BUCKETS],
}

impl Default for LagMeter {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

impl LagMeter {
    /// Counts a delivery whose handler started `lag` after its message was created.
    pub(super) fn record(&self, lag: Duration) {
        let micros = u64::try_from(lag.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket(micros)].fetch_add(1, Ordering::Relaxed);
    }

    /// The lags counted since the last call, and the meter empty.
    fn take(&self) -> Lags {
        let mut lags = Lags::default();
        for (count, taken) in self.counts.iter().zip(lags.counts.iter_mut()) {
            *taken = u64::from(count.swap(0, Ordering::Relaxed));
            lags.total += *taken;
        }
        lags
    }
}

/// Lags in [`LagMeter`]'s buckets.
#[derive(Clone)]
struct Lags {
    counts: [u64; BUCKETS],
    total: u64,
}

impl Default for Lags {
    fn default() -> Self {
        Self {
            counts: [0; BUCKETS],
            total: 0,
        }
    }
}

impl Lags {
    fn add(&mut self, other: &Self) {
        for (count, more) in self.counts.iter_mut().zip(&other.counts) {
            *count += more;
        }
        self.total += other.total;
    }

    /// Halves every count: older lags weigh half as much as those counted next.
    fn halve(&mut self) {
        self.total = 0;
        for count in &mut self.counts {
            *count /= 2;
            self.total += *count;
        }
    }

    /// The lag that a share `q` of the lags counted do not exceed (by its bucket's ceiling).
    fn percentile(&self, q: f64) -> Option<Duration> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(Duration::from_micros(bucket_ceiling(index)));
            }
        }
        None
    }
}

/// The fewest rows per tick a walk slows to: a row every 64 ticks.
pub(super) const MIN_ROWS_PER_TICK: f64 = 1.0 / 64.0;
/// The rows per tick a walk starts at (or the cap, if lower).
const START_ROWS_PER_TICK: f64 = 8.0;
/// A decision waits for this many deliveries since the last one...
const DECIDE_AFTER_DELIVERIES: u64 = 200;
/// ...or this long, with at least one delivery.
const DECIDE_AFTER: Duration = Duration::from_millis(500);
/// How often a walk pauses to measure the quiet lag again.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(60);
/// How long such a pause lasts.
pub(super) const PROBE_FOR: Duration = Duration::from_secs(1);
/// The start of a pause whose lags are not counted: the last batch's rows are delivered then.
const PROBE_SETTLE: Duration = Duration::from_millis(300);
/// The fewest deliveries that make a quiet lag; a pause that sees fewer finds no traffic
/// beside the walk.
const QUIET_DELIVERIES: u64 = 50;
/// The quiet lags kept: past this many, the older half their weight.
const QUIET_KEPT: u64 = 100_000;

/// Where the walk stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// No walk: every delivery's lag is quiet.
    Idle,
    /// Walking since the last pause (or its start).
    Walking { since: Instant },
    /// Paused since `since`, to measure the quiet lag.
    Probing { since: Instant },
}

struct State {
    phase: Phase,
    /// The lags measured while no walk ran, the older weighing less.
    quiet: Lags,
    /// The lags since the last decision, and when it was made.
    recent: Lags,
    decided: Instant,
    /// Rows per tick the walk writes now, and the part of a row carried to the next tick.
    rows_per_tick: f64,
    credit: f64,
    /// Whether the last pause saw no delivery: nothing runs beside the walk.
    alone: bool,
}

/// The pace of a relay's backfill walks (see the module's docs): what each tick may write.
pub(super) struct WalkPace {
    /// Every delivery's lag since the last tick.
    pub(super) meter: LagMeter,
    state: Mutex<State>,
}

/// What a tick of the backfills does, by [`WalkPace::tick`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tick {
    /// Walk at most this many rows per model.
    Walk(usize),
    /// Walk nothing this time: the pace allows less than a row, or the walk is paused to
    /// measure the quiet lag.
    Skip,
}

impl WalkPace {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            meter: LagMeter::default(),
            state: Mutex::new(State {
                phase: Phase::Idle,
                quiet: Lags::default(),
                recent: Lags::default(),
                decided: now,
                rows_per_tick: START_ROWS_PER_TICK,
                credit: 0.0,
                alone: false,
            }),
        }
    }

    /// The start of a tick at `now`, under the operator's cap of `cap` rows: what it walks.
    pub(super) fn tick(&self, cap: usize, now: Instant) -> Tick {
        let window = self.meter.take();
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let cap = cap.max(1) as f64;
        match state.phase {
            Phase::Idle => {
                state.quiet.add(&window);
                if state.quiet.total > QUIET_KEPT {
                    state.quiet.halve();
                }
                state.rows_per_tick = START_ROWS_PER_TICK.min(cap);
                state.credit = 0.0;
                state.recent = Lags::default();
                state.decided = now;
                // A walk that starts now starts at its first pace.
                return Tick::Walk(state.rows_per_tick as usize);
            }
            Phase::Probing { since } => {
                let paused = now.saturating_duration_since(since);
                if paused > PROBE_SETTLE {
                    state.quiet.add(&window);
                }
                if paused < PROBE_FOR {
                    return Tick::Skip;
                }
                // The pause measured the traffic beside the walk, or found none.
                state.alone = state.quiet.total < QUIET_DELIVERIES;
                state.phase = Phase::Walking { since: now };
                state.recent = Lags::default();
                state.decided = now;
            }
            Phase::Walking { since } => {
                state.recent.add(&window);
                let due_pause = now.saturating_duration_since(since) >= PROBE_EVERY;
                if due_pause || (state.quiet.total < QUIET_DELIVERIES && !state.alone) {
                    // Older quiet lags weigh half against those the pause measures.
                    state.quiet.halve();
                    state.phase = Phase::Probing { since: now };
                    return Tick::Skip;
                }
                state.decide(cap, now);
            }
        }
        state.credit += state.rows_per_tick;
        if state.credit < 1.0 {
            return Tick::Skip;
        }
        let rows = state.credit.floor().min(cap);
        state.credit -= rows;
        Tick::Walk(rows as usize)
    }

    /// The end of a tick that began at `began`: whether it walked rows of a walk that goes on.
    /// A tick that walked none (no backfill started, done, another relay walking) leaves the
    /// pace idle, its lags quiet.
    pub(super) fn walked(&self, walking: bool, began: Instant) {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match (walking, state.phase) {
            (true, Phase::Idle) => state.phase = Phase::Walking { since: began },
            (false, Phase::Walking { .. }) => state.phase = Phase::Idle,
            _ => {}
        }
    }

    /// The rows per tick allowed now.
    pub(super) fn rows_per_tick(&self) -> f64 {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .rows_per_tick
    }
}

impl State {
    /// The allowance for the lag of deliveries during a walk: `None` when no quiet lag is
    /// known, or nothing runs beside the walk.
    fn allowance(&self) -> Option<Duration> {
        if self.alone || self.quiet.total < QUIET_DELIVERIES {
            return None;
        }
        let quiet = self.quiet.percentile(0.99)?;
        Some((quiet * 3 / 2).max(quiet + Duration::from_millis(1)))
    }

    /// Sets the pace from the lags since the last decision, once there are enough of them.
    fn decide(&mut self, cap: f64, now: Instant) {
        let enough = self.recent.total >= DECIDE_AFTER_DELIVERIES
            || (self.recent.total > 0
                && now.saturating_duration_since(self.decided) >= DECIDE_AFTER);
        if !enough {
            return;
        }
        let factor = match (self.allowance(), self.recent.percentile(0.99)) {
            (Some(allowance), Some(lag)) if lag > allowance => 0.5,
            (Some(allowance), Some(lag)) if lag > allowance / 2 => 1.1,
            _ => 1.5,
        };
        self.rows_per_tick = (self.rows_per_tick * factor).clamp(MIN_ROWS_PER_TICK, cap);
        self.recent = Lags::default();
        self.decided = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lags(pace: &WalkPace, lag: Duration, count: usize) {
        for _ in 0..count {
            pace.meter.record(lag);
        }
    }

    const MS: Duration = Duration::from_millis(1);
    const TICK: Duration = Duration::from_millis(10);

    #[test]
    fn buckets_hold_their_lags_and_read_back_no_lower() {
        let mut last = 0;
        for micros in (0..5_000).chain([1 << 20, (1 << 30) + 17, u64::MAX]) {
            let index = bucket(micros);
            assert!(index >= last, "buckets are in order: {micros} µs");
            last = index;
            assert!(bucket_ceiling(index) >= micros.min(bucket_ceiling(BUCKETS - 1)));
            // A quarter of an octave: the ceiling is within 25% of the lag.
            if micros >= EXACT && index < BUCKETS - 1 {
                assert!(
                    bucket_ceiling(index) as f64 <= micros as f64 * 1.25,
                    "{micros}"
                );
            }
        }
    }

    #[test]
    fn percentiles_read_from_the_buckets() {
        let meter = LagMeter::default();
        for micros in 1..=1_000u64 {
            meter.record(Duration::from_micros(micros));
        }
        let lags = meter.take();
        assert_eq!(lags.total, 1_000);
        let p99 = lags.percentile(0.99).expect("lags");
        assert!(p99 >= Duration::from_micros(990) && p99 <= Duration::from_micros(1_250));
        let p50 = lags.percentile(0.5).expect("lags");
        assert!(p50 >= Duration::from_micros(500) && p50 <= Duration::from_micros(625));
        assert_eq!(meter.take().total, 0, "taking empties the meter");
    }

    /// A pace that learned a quiet lag of 2 ms, then started a walk at `start`.
    fn walking(start: Instant) -> WalkPace {
        let pace = WalkPace::new(start);
        lags(&pace, 2 * MS, 1_000);
        assert_eq!(
            pace.tick(2_000, start),
            Tick::Walk(8),
            "a walk starts at its first pace"
        );
        pace.walked(true, start);
        pace
    }

    #[test]
    fn a_walk_slows_down_when_the_lag_passes_its_allowance_and_speeds_up_below_it() {
        let start = Instant::now();
        let pace = walking(start);
        let mut now = start;
        // Lags well within the allowance (2 ms quiet: 3 ms allowed): faster each decision.
        let mut last = pace.rows_per_tick();
        for _ in 0..5 {
            now += TICK;
            lags(&pace, MS, 250);
            assert!(matches!(pace.tick(2_000, now), Tick::Walk(_)));
            assert!(
                pace.rows_per_tick() > last,
                "{} after {last}",
                pace.rows_per_tick()
            );
            last = pace.rows_per_tick();
        }
        // Lags past the allowance: half as fast.
        now += TICK;
        lags(&pace, 4 * MS, 250);
        pace.tick(2_000, now);
        assert!((pace.rows_per_tick() - last / 2.0).abs() < 1e-9);
        // A few lags are not enough for a decision.
        let before = pace.rows_per_tick();
        now += TICK;
        lags(&pace, Duration::from_micros(2_500), 10);
        pace.tick(2_000, now);
        assert_eq!(pace.rows_per_tick(), before);
        // Near the allowance: a little faster.
        now += TICK;
        lags(&pace, Duration::from_micros(2_500), 240);
        pace.tick(2_000, now);
        assert!((pace.rows_per_tick() - before * 1.1).abs() < 1e-9);
    }

    #[test]
    fn a_walk_never_passes_the_cap_and_slows_to_a_row_every_few_ticks() {
        let start = Instant::now();
        let pace = walking(start);
        let mut now = start;
        for _ in 0..40 {
            now += TICK;
            lags(&pace, MS, 250);
            match pace.tick(100, now) {
                Tick::Walk(rows) => assert!(rows <= 100),
                Tick::Skip => panic!("a fast walk skips no tick"),
            }
        }
        assert_eq!(pace.rows_per_tick(), 100.0);
        for _ in 0..40 {
            now += TICK;
            lags(&pace, 50 * MS, 250);
            pace.tick(100, now);
        }
        assert_eq!(pace.rows_per_tick(), MIN_ROWS_PER_TICK);
        // At the slowest, a row every 64 ticks (no new decision: no deliveries).
        let walked: usize = (0..640)
            .map(|_| {
                now += TICK;
                match pace.tick(100, now) {
                    Tick::Walk(rows) => rows,
                    Tick::Skip => 0,
                }
            })
            .sum();
        assert!((9..=11).contains(&walked), "{walked} rows in 640 ticks");
    }

    #[test]
    fn a_walk_pauses_to_measure_the_quiet_lag_and_takes_its_new_allowance() {
        let start = Instant::now();
        let pace = walking(start);
        let mut now = start + PROBE_EVERY;
        lags(&pace, MS, 250);
        assert_eq!(pace.tick(2_000, now), Tick::Skip, "the pause begins");
        // The last batch's rows, delivered as the pause begins, do not count as quiet.
        now += TICK;
        lags(&pace, 500 * MS, 1_000);
        assert_eq!(pace.tick(2_000, now), Tick::Skip);
        // The traffic beside the walk is slower now: 20 ms quiet.
        while now < start + PROBE_EVERY + PROBE_FOR {
            now += TICK * 10;
            lags(&pace, 20 * MS, 5_000);
            if now < start + PROBE_EVERY + PROBE_FOR {
                assert_eq!(pace.tick(2_000, now), Tick::Skip, "still paused");
            }
        }
        assert!(
            matches!(pace.tick(2_000, now), Tick::Walk(_)),
            "the pause ends"
        );
        // 25 ms is within the new allowance (30 ms): the walk speeds up.
        let before = pace.rows_per_tick();
        now += TICK;
        lags(&pace, 25 * MS, 250);
        pace.tick(2_000, now);
        assert!(pace.rows_per_tick() > before);
    }

    #[test]
    fn a_relay_that_never_saw_quiet_traffic_pauses_first_and_a_walk_alone_goes_at_the_cap() {
        let start = Instant::now();
        let pace = WalkPace::new(start);
        assert_eq!(pace.tick(500, start), Tick::Walk(8));
        pace.walked(true, start);
        let mut now = start + TICK;
        assert_eq!(
            pace.tick(500, now),
            Tick::Skip,
            "no quiet lag known: it pauses"
        );
        while now < start + TICK + PROBE_FOR {
            now += TICK;
            pace.tick(500, now);
        }
        // Nothing ran during the pause: the walk's own slow deliveries do not hold it back.
        for _ in 0..30 {
            now += TICK;
            lags(&pace, 200 * MS, 250);
            assert!(matches!(pace.tick(500, now), Tick::Walk(_)));
        }
        assert_eq!(pace.rows_per_tick(), 500.0);
    }

    #[test]
    fn a_tick_that_walks_nothing_ends_the_walk_and_its_lags_are_quiet_again() {
        let start = Instant::now();
        let pace = walking(start);
        pace.walked(false, start + TICK);
        // Idle: lags count as quiet, and the next walk starts at its first pace.
        lags(&pace, 30 * MS, 1_000);
        assert_eq!(pace.tick(2_000, start + TICK * 2), Tick::Walk(8));
        pace.walked(true, start + TICK * 2);
        // With 30 ms now in the quiet lags, 20 ms is within the allowance.
        lags(&pace, 20 * MS, 250);
        pace.tick(2_000, start + TICK * 3);
        assert!(pace.rows_per_tick() > 8.0);
    }
}
