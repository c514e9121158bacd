//! The processor time a measured run costs: this process's (the relay, or a baseline's
//! client) and the local PostgreSQL server's processes', read from `/proc` around the run.
//! Divided by the messages drained, it says what a message costs on each side of the
//! connection, a figure that moves less between runs and machines than a rate does (a rate
//! also counts the time neither side works: round trips, waits for the disk).
//!
//! `/proc/<pid>/stat` counts in clock ticks of 10 ms (Linux's `USER_HZ`, 100 on every
//! architecture it exposes to user space), so a run should last a second or more. The
//! server's figure sums the processes named `postgres` that live through the run (its
//! backends, its WAL writer, its checkpointer): a connection opened and closed inside the run
//! is not counted, and none of the scenarios' pools close one. On a machine whose server is
//! not local, it is not reported.

use std::time::Duration;

/// Linux's `USER_HZ`: the unit of `/proc/<pid>/stat`'s times.
const TICKS_PER_SECOND: u64 = 100;

/// The processor time of this process and of the server's processes at one moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuClock {
    process: Option<Duration>,
    server: Option<Duration>,
}

/// What a run cost, per message: microseconds of processor time.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuPerMessage {
    /// In this process.
    pub(crate) process: Option<f64>,
    /// In the local PostgreSQL server's processes.
    pub(crate) server: Option<f64>,
}

impl CpuClock {
    /// Reads both clocks now.
    pub(crate) fn start() -> Self {
        Self {
            process: process_time("self"),
            server: server_time(),
        }
    }

    /// What was spent since [`CpuClock::start`], per message of `messages`.
    pub(crate) fn per_message(&self, messages: u64) -> CpuPerMessage {
        let now = Self::start();
        let per = |before: Option<Duration>, after: Option<Duration>| {
            let spent = after?.checked_sub(before?)?;
            (messages > 0).then(|| spent.as_secs_f64() * 1e6 / messages as f64)
        };
        CpuPerMessage {
            process: per(self.process, now.process),
            server: per(self.server, now.server),
        }
    }
}

/// User and system time of `/proc/<pid>/stat` (`self`, or a process id).
fn process_time(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: the fields start after it.
    // utime and stime are fields 14 and 15, the 12th and 13th after the name.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 1_000 / TICKS_PER_SECOND))
}

/// The processor time of every process named `postgres`; `None` if there is none.
fn server_time() -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut found = false;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|name| name.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let is_server = std::fs::read_to_string(entry.path().join("comm"))
            .is_ok_and(|command| command.trim_end() == "postgres");
        if let Some(time) = is_server.then(|| process_time(pid)).flatten() {
            total += time;
            found = true;
        }
    }
    found.then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock advances with work done: spinning ends once it has counted 30 ms (a
    /// clock that never moved would spin until the cap).
    #[test]
    fn this_process_has_a_clock_that_counts_work() {
        let clock = CpuClock::start();
        let cap = std::time::Instant::now() + Duration::from_secs(30);
        let mut sum = 0u64;
        let counted = loop {
            for _ in 0..100_000 {
                sum = sum.wrapping_add(std::hint::black_box(sum) | 1);
            }
            let spent = clock
                .per_message(1)
                .process
                .expect("Linux has /proc/self/stat");
            if spent >= 30_000.0 || std::time::Instant::now() > cap {
                break spent;
            }
        };
        assert!(counted >= 30_000.0, "30 s of spinning counted {counted} µs");
    }
}
