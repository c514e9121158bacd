//! The processor time a measured run costs: this process's (the relay, or a baseline's
//! client) and the local database server's processes' (PostgreSQL's, or MariaDB's), read
//! from `/proc` around the run.
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

use super::report::{Row, Target};

/// Linux's `USER_HZ`: the unit of `/proc/<pid>/stat`'s times.
const TICKS_PER_SECOND: u64 = 100;

/// Rows of the processor time per message of each of `measured` (what ran, what it cost), in
/// this process and in the processes of `server` (the server's name, as the rows say it).
pub(crate) fn cpu_rows(
    number: &str,
    server: &str,
    measured: Vec<(String, CpuPerMessage)>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for (what, cpu) in measured {
        for (side, micros) in [
            ("in its own process".to_owned(), cpu.process),
            (format!("in {server}'s processes"), cpu.server),
        ] {
            if let Some(micros) = micros {
                rows.push(Row::measured(
                    &format!("{number} processor time per message, {what}: {side}"),
                    "µs",
                    micros,
                    Target::None,
                ));
            }
        }
    }
    rows
}

/// The processor time of this process and of the server's processes at one moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuClock {
    process: Option<Duration>,
    server: Option<Duration>,
    /// The name of the server's processes (`comm`).
    server_name: &'static str,
}

/// What a run cost, per message: microseconds of processor time.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuPerMessage {
    /// In this process.
    pub(crate) process: Option<f64>,
    /// In the local database server's processes.
    pub(crate) server: Option<f64>,
}

impl CpuClock {
    /// Reads both clocks now, the server's that of the local PostgreSQL.
    pub(crate) fn start() -> Self {
        Self::start_on("postgres")
    }

    /// Reads both clocks now, the server's that of the processes named `server_name`
    /// (`postgres`, `mariadbd`).
    pub(crate) fn start_on(server_name: &'static str) -> Self {
        Self {
            process: process_time("self"),
            server: server_time(server_name),
            server_name,
        }
    }

    /// What was spent since [`CpuClock::start`], per message of `messages`.
    pub(crate) fn per_message(&self, messages: u64) -> CpuPerMessage {
        let now = Self::start_on(self.server_name);
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

/// The processor time of every process named `server_name`; `None` if there is none.
fn server_time(server_name: &str) -> Option<Duration> {
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
            .is_ok_and(|command| command.trim_end() == server_name);
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
