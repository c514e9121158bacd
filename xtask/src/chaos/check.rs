//! The checker: reads the relays' delivery records and computes what the chaos run proves
//! (or disproves): nothing lost, every shard in order, no shard held twice at once.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;

/// Which category a delivery was of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// The non-coalescing category: every message delivered, in order within its shard.
    Sequenced,
    /// The coalescing category: the newest row of each group delivered.
    Coalesced,
}

impl Kind {
    fn letter(self) -> char {
        match self {
            Self::Sequenced => 'S',
            Self::Coalesced => 'C',
        }
    }
}

/// One handler call, as a relay recorded it (one line of a record file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The category.
    pub(crate) kind: Kind,
    /// The relay process (its index in the run).
    pub(crate) worker: u32,
    /// The shard identifier.
    pub(crate) shard: i64,
    /// The object identifier: the coalescing group of a coalesced message.
    pub(crate) object: i64,
    /// The message's sequence number in its shard (sequenced messages; 0 otherwise).
    pub(crate) seq: i64,
    /// The delivered message's id.
    pub(crate) message_id: i64,
    /// The fencing token of the lease the delivery ran under.
    pub(crate) token: i64,
    /// `Delivery::attempt`.
    pub(crate) attempt: u32,
    /// When the handler started, in nanoseconds since the Unix epoch.
    pub(crate) start: u64,
    /// When it finished (just before the record was written).
    pub(crate) end: u64,
}

impl Record {
    /// The record as one line of a record file, newline included: written with a single
    /// `write`, so a killed relay leaves whole lines only.
    pub(crate) fn line(&self) -> String {
        format!(
            "{} {} {} {} {} {} {} {} {} {}\n",
            self.kind.letter(),
            self.worker,
            self.shard,
            self.object,
            self.seq,
            self.message_id,
            self.token,
            self.attempt,
            self.start,
            self.end
        )
    }

    /// Reads a line written by [`Record::line`]; `None` for anything else.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let mut fields = line.split_ascii_whitespace();
        let kind = match fields.next()? {
            "S" => Kind::Sequenced,
            "C" => Kind::Coalesced,
            _ => return None,
        };
        let mut next = || fields.next()?.parse::<i64>().ok();
        let record = Self {
            kind,
            worker: u32::try_from(next()?).ok()?,
            shard: next()?,
            object: next()?,
            seq: next()?,
            message_id: next()?,
            token: next()?,
            attempt: u32::try_from(next()?).ok()?,
            start: u64::try_from(next()?).ok()?,
            end: u64::try_from(next()?).ok()?,
        };
        fields.next().is_none().then_some(record)
    }
}

/// Reads every record file in `dir`: the records, and how many lines did not read.
pub(crate) fn read_records(dir: &Path) -> Result<(Vec<Record>, u64), String> {
    let mut records = Vec::new();
    let mut torn = 0;
    let entries = std::fs::read_dir(dir)
        .map_err(|error| format!("cannot list the records in {}: {error}", dir.display()))?;
    for entry in entries {
        let path = entry
            .map_err(|error| format!("cannot list the records: {error}"))?
            .path();
        if path
            .extension()
            .is_none_or(|extension| extension != "records")
        {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        for line in text.lines() {
            match Record::parse(line) {
                Some(record) => records.push(record),
                None => torn += 1,
            }
        }
    }
    Ok((records, torn))
}

/// A coalescing row that was committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CoalescedRow {
    /// Its id.
    pub(crate) message_id: i64,
    /// Its group (object identifier).
    pub(crate) group: i64,
    /// A time before its transaction committed (nanoseconds since the epoch): a relay that
    /// read the row started its handler after this.
    pub(crate) before_commit: u64,
}

/// What the writers committed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Written {
    /// Sequenced messages: each shard's sequence numbers, ascending.
    pub(crate) sequenced: HashMap<i64, Vec<i64>>,
    /// Coalescing rows.
    pub(crate) coalesced: Vec<CoalescedRow>,
}

/// When the faults happened, in nanoseconds since the epoch.
#[derive(Debug, Clone, Default)]
pub(crate) struct Faults {
    /// Relays killed with SIGKILL.
    pub(crate) kills: Vec<u64>,
    /// Database server restarts: when the server went down, and when it was back.
    pub(crate) restarts: Vec<(u64, u64)>,
}

/// Median and maximum of a few durations, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Spread {
    /// How many values.
    pub(crate) count: usize,
    /// The median.
    pub(crate) median_ms: f64,
    /// The maximum.
    pub(crate) max_ms: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_by(f64::total_cmp);
        Self {
            count: values.len(),
            median_ms: values[values.len() / 2],
            max_ms: values[values.len() - 1],
        }
    }
}

impl fmt::Display for Spread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 0 {
            return write!(f, "-");
        }
        write!(
            f,
            "median {:.0} ms, max {:.0} ms (n = {})",
            self.median_ms, self.max_ms, self.count
        )
    }
}

/// What the records show.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Figures {
    /// Sequenced messages committed.
    pub(crate) sequenced_written: u64,
    /// Coalescing rows committed.
    pub(crate) coalesced_written: u64,
    /// Coalescing groups written to.
    pub(crate) groups: u64,
    /// Handler calls recorded.
    pub(crate) deliveries: u64,
    /// Record lines that did not read (a relay killed mid-line would leave one).
    pub(crate) torn_records: u64,
    /// Sequenced messages committed and never delivered.
    pub(crate) lost_sequenced: u64,
    /// Coalescing rows neither delivered nor covered by a later delivery of their group that
    /// started after they were committed (S11, S13).
    pub(crate) lost_coalesced: u64,
    /// Deliveries of messages that were never committed.
    pub(crate) phantoms: u64,
    /// Deliveries beyond the first of a message.
    pub(crate) duplicates: u64,
    /// Of those, how many said `attempt = 1`.
    pub(crate) duplicates_attempt_one: u64,
    /// First deliveries of a sequenced message while an earlier one of its shard had not been
    /// delivered yet.
    pub(crate) order_violations: u64,
    /// Pairs of deliveries of one shard under different fencing tokens that overlap in time.
    pub(crate) overlaps: u64,
    /// From each kill to the next delivery anywhere.
    pub(crate) recovery_kill: Spread,
    /// From each restart (the server back) to the next delivery anywhere.
    pub(crate) recovery_restart: Spread,
    /// For each shard a kill interrupted (a delivery before the kill, not acknowledged, so
    /// delivered again after it): from the kill to the shard's first redelivery. A lease's
    /// expiry is expected here.
    pub(crate) resume_kill: Spread,
    /// The same for restarts: from the server's return to the first redelivery of each shard
    /// a restart interrupted.
    pub(crate) resume_restart: Spread,
    /// A few examples of what went wrong, for the report.
    pub(crate) examples: Vec<String>,
}

impl Figures {
    /// Everything lost: sequenced messages and coalescing rows.
    pub(crate) fn lost(&self) -> u64 {
        self.lost_sequenced + self.lost_coalesced
    }

    /// Each way the deliveries failed, in words: lost, reordered, held twice, invented, or
    /// redelivered without saying so (`attempt` 1).
    pub(crate) fn failures(&self) -> Vec<String> {
        [
            (self.lost(), "lost"),
            (self.order_violations, "out of order"),
            (self.overlaps, "overlapping holders"),
            (self.phantoms, "phantoms"),
            (
                self.duplicates_attempt_one,
                "redeliveries marked as first attempts",
            ),
        ]
        .into_iter()
        .filter(|&(count, _)| count > 0)
        .map(|(count, what)| format!("{count} {what}"))
        .collect()
    }

    /// Whether the deliveries prove what they should (no [`Figures::failures`]).
    #[cfg(test)]
    pub(crate) fn passed(&self) -> bool {
        self.failures().is_empty()
    }

    /// Counts a delivery of what was delivered before; one that says it is a first attempt
    /// is an unmarked redelivery, kept as an example.
    fn duplicate(&mut self, record: &Record, what: impl FnOnce() -> String) {
        self.duplicates += 1;
        if record.attempt == 1 {
            self.duplicates_attempt_one += 1;
            self.example(|| {
                format!(
                    "unmarked redelivery: {} delivered again as attempt 1 (worker {}, token {})",
                    what(),
                    record.worker,
                    record.token
                )
            });
        }
    }

    /// Keeps an example of what went wrong (the first twelve distinct ones).
    fn example(&mut self, example: impl FnOnce() -> String) {
        if self.examples.len() < 12 {
            let example = example();
            if !self.examples.contains(&example) {
                self.examples.push(example);
            }
        }
    }
}

/// Computes the figures of a run from what was written, what was delivered and when the
/// faults happened.
pub(crate) fn check(written: &Written, records: &[Record], faults: &Faults) -> Figures {
    let mut figures = Figures {
        sequenced_written: written
            .sequenced
            .values()
            .map(|seqs| seqs.len() as u64)
            .sum(),
        coalesced_written: written.coalesced.len() as u64,
        groups: written
            .coalesced
            .iter()
            .map(|row| row.group)
            .collect::<HashSet<_>>()
            .len() as u64,
        deliveries: records.len() as u64,
        ..Figures::default()
    };
    // Every check walks the deliveries in the order the handlers started.
    let mut by_start: Vec<&Record> = records.iter().collect();
    by_start.sort_by_key(|record| (record.start, record.end));

    check_sequenced(written, &by_start, &mut figures);
    check_coalesced(written, &by_start, &mut figures);
    check_overlaps(&by_start, &mut figures);

    let starts: Vec<u64> = by_start.iter().map(|record| record.start).collect();
    let recovery = |events: &[u64]| {
        Spread::of(
            events
                .iter()
                .filter_map(|&at| {
                    let next = starts.get(starts.partition_point(|&start| start <= at))?;
                    Some((next - at) as f64 / 1e6)
                })
                .collect(),
        )
    };
    figures.recovery_kill = recovery(&faults.kills);
    let back: Vec<u64> = faults.restarts.iter().map(|&(_, up)| up).collect();
    figures.recovery_restart = recovery(&back);
    (figures.resume_kill, figures.resume_restart) = resumes(&by_start, faults);
    figures
}

/// How long the shards interrupted by each fault waited to be delivered again: for each
/// message delivered twice with a fault in between (the latest one before the redelivery),
/// from the fault (the server's return, for a restart) to the redelivery; per fault and
/// shard, the first. Returns the spreads for kills and for restarts.
fn resumes(by_start: &[&Record], faults: &Faults) -> (Spread, Spread) {
    // (down, back, is a restart), by time.
    let mut events: Vec<(u64, u64, bool)> = faults
        .kills
        .iter()
        .map(|&at| (at, at, false))
        .chain(faults.restarts.iter().map(|&(down, up)| (down, up, true)))
        .collect();
    events.sort_unstable();
    let mut last: HashMap<(Kind, i64), u64> = HashMap::new();
    let mut waits: HashMap<(usize, i64), u64> = HashMap::new();
    for record in by_start {
        let key = (record.kind, record.message_id);
        if let Some(previous) = last.insert(key, record.start) {
            let index = events.partition_point(|&(down, _, _)| down <= record.start);
            if let Some(&(down, back, _)) = index.checked_sub(1).map(|i| &events[i])
                && down > previous
            {
                let wait = record.start.saturating_sub(back);
                let entry = waits.entry((index - 1, record.shard)).or_insert(wait);
                *entry = (*entry).min(wait);
            }
        }
    }
    let (mut kills, mut restarts) = (Vec::new(), Vec::new());
    for ((event, _), wait) in waits {
        let list = if events[event].2 {
            &mut restarts
        } else {
            &mut kills
        };
        list.push(wait as f64 / 1e6);
    }
    (Spread::of(kills), Spread::of(restarts))
}

/// Losses, phantoms, duplicates and order of the sequenced messages.
fn check_sequenced(written: &Written, by_start: &[&Record], figures: &mut Figures) {
    // Per shard: the written sequence numbers, and how many of the lowest are delivered.
    let mut delivered: HashSet<(i64, i64)> = HashSet::new();
    let mut low: HashMap<i64, usize> = HashMap::new();
    for record in by_start.iter().filter(|r| r.kind == Kind::Sequenced) {
        let (shard, seq) = (record.shard, record.seq);
        let Some(seqs) = written
            .sequenced
            .get(&shard)
            .filter(|s| s.binary_search(&seq).is_ok())
        else {
            figures.phantoms += 1;
            figures.example(|| format!("phantom: shard {shard} seq {seq} was never committed"));
            continue;
        };
        if !delivered.insert((shard, seq)) {
            figures.duplicate(record, || format!("shard {shard} seq {seq}"));
            continue;
        }
        let low = low.entry(shard).or_default();
        if seqs[*low] != seq {
            figures.order_violations += 1;
            let missing = seqs[*low];
            figures.example(|| {
                format!(
                    "order: shard {shard} seq {seq} first delivered (worker {}, token {}) before \
                     seq {missing}",
                    record.worker, record.token
                )
            });
        }
        while *low < seqs.len() && delivered.contains(&(shard, seqs[*low])) {
            *low += 1;
        }
    }
    let mut lost: Vec<(i64, i64)> = written
        .sequenced
        .iter()
        .flat_map(|(&shard, seqs)| seqs.iter().map(move |&seq| (shard, seq)))
        .filter(|key| !delivered.contains(key))
        .collect();
    lost.sort_unstable();
    figures.lost_sequenced = lost.len() as u64;
    for (shard, seq) in lost.into_iter().take(5) {
        figures.example(|| format!("lost: shard {shard} seq {seq} was never delivered"));
    }
}

/// Losses, phantoms and duplicates of the coalescing rows. A committed row is delivered if a
/// delivery of its group carried it or a newer row and started after the row's transaction
/// began to commit: a relay that read the group before the row committed could not have seen
/// it, and must deliver the group again (S13).
fn check_coalesced(written: &Written, by_start: &[&Record], figures: &mut Figures) {
    let committed: HashSet<i64> = written.coalesced.iter().map(|row| row.message_id).collect();
    // Per group: its deliveries' starts (ascending) and the highest message id delivered
    // from each one on.
    let mut groups: HashMap<i64, (Vec<u64>, Vec<i64>)> = HashMap::new();
    let mut seen: HashSet<i64> = HashSet::new();
    for record in by_start.iter().filter(|r| r.kind == Kind::Coalesced) {
        if !committed.contains(&record.message_id) {
            figures.phantoms += 1;
            figures.example(|| {
                format!(
                    "phantom: coalescing message {} (group {}) was never committed",
                    record.message_id, record.object
                )
            });
            continue;
        }
        if !seen.insert(record.message_id) {
            figures.duplicate(record, || {
                format!(
                    "coalescing message {} (group {})",
                    record.message_id, record.object
                )
            });
        }
        let (starts, ids) = groups.entry(record.object).or_default();
        starts.push(record.start);
        ids.push(record.message_id);
    }
    for (_, ids) in groups.values_mut() {
        for index in (0..ids.len().saturating_sub(1)).rev() {
            ids[index] = ids[index].max(ids[index + 1]);
        }
    }
    let mut lost: Vec<&CoalescedRow> = written
        .coalesced
        .iter()
        .filter(|row| {
            let Some((starts, newest)) = groups.get(&row.group) else {
                return true;
            };
            let from = starts.partition_point(|&start| start < row.before_commit);
            newest.get(from).is_none_or(|&id| id < row.message_id)
        })
        .collect();
    lost.sort_by_key(|row| row.message_id);
    figures.lost_coalesced = lost.len() as u64;
    for row in lost.into_iter().take(5) {
        figures.example(|| {
            format!(
                "lost: coalescing message {} of group {}: no delivery of the group carried it \
                 or a newer row after it committed",
                row.message_id, row.group
            )
        });
    }
}

/// Pairs of deliveries of one shard, under different fencing tokens, whose handler runs
/// overlap (S15).
fn check_overlaps(by_start: &[&Record], figures: &mut Figures) {
    let mut running: HashMap<i64, Vec<&Record>> = HashMap::new();
    for &record in by_start {
        let active = running.entry(record.shard).or_default();
        active.retain(|other| other.end > record.start);
        for other in active.iter() {
            if other.token != record.token {
                figures.overlaps += 1;
                figures.example(|| {
                    format!(
                        "overlap: shard {} delivered by worker {} (token {}) and worker {} \
                         (token {}) at once",
                        record.shard, other.worker, other.token, record.worker, record.token
                    )
                });
            }
        }
        active.push(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sequenced(worker: u32, shard: i64, seq: i64, token: i64, start: u64, end: u64) -> Record {
        Record {
            kind: Kind::Sequenced,
            worker,
            shard,
            object: seq,
            seq,
            message_id: shard * 1_000 + seq,
            token,
            attempt: 1,
            start,
            end,
        }
    }

    fn coalesced(group: i64, message_id: i64, token: i64, start: u64) -> Record {
        Record {
            kind: Kind::Coalesced,
            worker: 0,
            shard: 99,
            object: group,
            seq: 0,
            message_id,
            token,
            attempt: 1,
            start,
            end: start + 1,
        }
    }

    fn written(shards: &[(i64, i64)]) -> Written {
        Written {
            sequenced: shards
                .iter()
                .map(|&(shard, count)| (shard, (0..count).collect()))
                .collect(),
            coalesced: Vec::new(),
        }
    }

    #[test]
    fn a_clean_run_passes() {
        let written = written(&[(1, 3), (2, 2)]);
        let records = [
            sequenced(0, 1, 0, 10, 100, 110),
            sequenced(0, 2, 0, 11, 105, 115),
            sequenced(0, 1, 1, 10, 120, 130),
            sequenced(1, 2, 1, 12, 140, 150),
            sequenced(1, 1, 2, 13, 160, 170),
        ];
        let figures = check(&written, &records, &Faults::default());
        assert_eq!(figures.sequenced_written, 5);
        assert_eq!(figures.deliveries, 5);
        assert_eq!(
            (
                figures.lost(),
                figures.duplicates,
                figures.order_violations,
                figures.overlaps
            ),
            (0, 0, 0, 0)
        );
        assert!(figures.passed(), "{figures:?}");
    }

    #[test]
    fn a_redelivery_must_say_it_is_a_retry() {
        let written = written(&[(1, 2)]);
        let first = sequenced(0, 1, 0, 10, 100, 110);
        let mut again = sequenced(1, 1, 0, 11, 200, 210);
        let last = sequenced(1, 1, 1, 11, 220, 230);
        again.attempt = 2;
        let marked = check(
            &written,
            &[first.clone(), again.clone(), last.clone()],
            &Faults::default(),
        );
        assert_eq!((marked.duplicates, marked.duplicates_attempt_one), (1, 0));
        assert!(marked.passed(), "{marked:?}");
        again.attempt = 1;
        let unmarked = check(&written, &[first, again, last], &Faults::default());
        assert_eq!(unmarked.duplicates_attempt_one, 1);
        assert!(
            !unmarked.passed(),
            "a redelivery that says attempt 1 fails the run"
        );
    }

    #[test]
    fn finds_a_loss_a_duplicate_an_order_violation_and_an_overlap() {
        let written = written(&[(1, 4), (2, 2)]);
        let records = [
            // Shard 1: seq 0, then 2 before 1 (a violation), then 1, and seq 3 never.
            sequenced(0, 1, 0, 10, 100, 110),
            sequenced(0, 1, 2, 10, 120, 130),
            sequenced(0, 1, 1, 10, 140, 150),
            // Shard 2: seq 0 twice (a duplicate), the second by a relay that took over
            // while the first still ran (an overlap), then seq 1.
            sequenced(0, 2, 0, 20, 200, 300),
            sequenced(1, 2, 0, 21, 250, 260),
            sequenced(1, 2, 1, 21, 270, 280),
        ];
        let figures = check(&written, &records, &Faults::default());
        assert_eq!(figures.lost_sequenced, 1, "{figures:?}");
        assert_eq!(figures.duplicates, 1);
        assert_eq!(figures.duplicates_attempt_one, 1);
        assert_eq!(figures.order_violations, 1);
        // Both of worker 1's deliveries ran while worker 0's (200..300) did.
        assert_eq!(figures.overlaps, 2);
        assert_eq!(figures.phantoms, 0);
        assert!(!figures.passed());
        assert!(
            figures.examples.iter().any(|e| e.contains("shard 1 seq 3")),
            "{:?}",
            figures.examples
        );
    }

    #[test]
    fn the_same_token_never_overlaps_itself_and_touching_intervals_do_not_overlap() {
        let written = written(&[(1, 3)]);
        let records = [
            sequenced(0, 1, 0, 10, 100, 200),
            sequenced(0, 1, 1, 10, 150, 160),
            sequenced(1, 1, 2, 11, 200, 210),
        ];
        let figures = check(&written, &records, &Faults::default());
        assert_eq!(figures.overlaps, 0, "{figures:?}");
    }

    #[test]
    fn a_delivery_of_something_never_written_is_a_phantom() {
        let written = written(&[(1, 1)]);
        let records = [
            sequenced(0, 1, 0, 10, 100, 110),
            sequenced(0, 1, 7, 10, 120, 130),
        ];
        let figures = check(&written, &records, &Faults::default());
        assert_eq!(figures.phantoms, 1);
        assert!(!figures.passed());
    }

    #[test]
    fn a_coalescing_row_is_covered_only_by_a_newer_delivery_after_its_commit() {
        let row = |message_id, group, before_commit| CoalescedRow {
            message_id,
            group,
            before_commit,
        };
        let written = Written {
            sequenced: HashMap::new(),
            coalesced: vec![
                // Group 1: rows 1 and 3 delivered as 3 (coalesced); row 2 committed after
                // that delivery started (an out-of-order commit) and was never delivered.
                row(1, 1, 10),
                row(3, 1, 20),
                row(2, 1, 150),
                // Group 2: its newest row, never delivered.
                row(4, 2, 10),
                row(5, 2, 30),
                // Group 3: delivered twice.
                row(6, 3, 10),
            ],
        };
        let records = [
            coalesced(1, 3, 1, 100),
            coalesced(2, 4, 1, 110),
            coalesced(3, 6, 1, 120),
            coalesced(3, 6, 2, 130),
        ];
        let figures = check(&written, &records, &Faults::default());
        assert_eq!(figures.lost_coalesced, 2, "{figures:?}");
        assert_eq!(figures.groups, 3);
        assert_eq!(figures.duplicates, 1);
        assert!(
            figures
                .examples
                .iter()
                .any(|e| e.contains("message 2 of group 1")),
            "{:?}",
            figures.examples
        );
        assert!(
            figures
                .examples
                .iter()
                .any(|e| e.contains("message 5 of group 2")),
            "{:?}",
            figures.examples
        );
    }

    #[test]
    fn recovery_is_the_time_to_the_next_delivery() {
        let written = written(&[(1, 3)]);
        let records = [
            sequenced(0, 1, 0, 10, 1_000_000, 1_000_001),
            sequenced(0, 1, 1, 10, 5_000_000, 5_000_001),
            sequenced(0, 1, 2, 10, 9_000_000, 9_000_001),
        ];
        let faults = Faults {
            kills: vec![2_000_000, 4_000_000, 10_000_000],
            restarts: vec![(0, 0)],
        };
        let figures = check(&written, &records, &faults);
        // Kills at 2 ms and 4 ms: 3 ms and 1 ms to the next delivery; the last has none.
        assert_eq!(
            figures.recovery_kill,
            Spread {
                count: 2,
                median_ms: 3.0,
                max_ms: 3.0
            }
        );
        assert_eq!(figures.recovery_restart.max_ms, 1.0);
    }

    #[test]
    fn a_shard_resumes_at_its_first_redelivery_after_the_fault() {
        let ms = 1_000_000;
        let written = written(&[(1, 2), (2, 1)]);
        let records = [
            // Shard 1: seqs 0 and 1 delivered, the relay killed at 10 ms before acknowledging,
            // both delivered again at 2010 and 2011 ms.
            sequenced(0, 1, 0, 10, ms, ms + 1),
            sequenced(0, 1, 1, 10, 2 * ms, 2 * ms + 1),
            sequenced(1, 1, 0, 11, 2_010 * ms, 2_010 * ms + 1),
            sequenced(1, 1, 1, 11, 2_011 * ms, 2_011 * ms + 1),
            // Shard 2: delivered at 3000 ms, the server down at 3001 ms and back at 3500 ms,
            // delivered again at 5000 ms.
            sequenced(1, 2, 0, 12, 3_000 * ms, 3_000 * ms + 1),
            sequenced(1, 2, 0, 13, 5_000 * ms, 5_000 * ms + 1),
        ];
        let faults = Faults {
            kills: vec![10 * ms],
            restarts: vec![(3_001 * ms, 3_500 * ms)],
        };
        let figures = check(&written, &records, &faults);
        assert_eq!(figures.resume_kill.count, 1, "one shard: {figures:?}");
        assert_eq!(figures.resume_kill.max_ms, 2_000.0);
        assert_eq!(figures.resume_restart.max_ms, 1_500.0);
        assert_eq!(figures.duplicates, 3);
    }

    #[test]
    fn records_read_back_and_torn_lines_are_counted() {
        let record = sequenced(3, 7, 42, 99, 123, 456);
        let line = record.line();
        assert!(line.ends_with('\n'));
        assert_eq!(Record::parse(line.trim_end()), Some(record));
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(
            dir.path().join("relay-0.records"),
            format!("{line}{line}S 3 7 4"),
        )
        .expect("write");
        std::fs::write(dir.path().join("relay-0.log"), "not a record").expect("write");
        let (records, torn) = read_records(dir.path()).expect("read");
        assert_eq!((records.len(), torn), (2, 1));
    }
}
