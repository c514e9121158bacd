//! The benchmark's table, and the machine it ran on.

use std::fmt::Write as _;
use std::process::Command;

use super::BenchArgs;
use super::setup::Server;

/// What a figure is held to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// No target: reported for information.
    None,
    /// The engine at least this fraction of the baseline.
    Ratio(f64),
    /// The figure below this.
    Below(f64),
    /// The figure exactly this.
    Exactly(f64),
}

/// One line of the table.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    scenario: String,
    unit: &'static str,
    engine: f64,
    baseline: Option<f64>,
    target: Target,
}

impl Row {
    /// The engine against a baseline of the same work.
    pub(crate) fn compared(
        scenario: &str,
        unit: &'static str,
        engine: f64,
        baseline: f64,
        target: Target,
    ) -> Self {
        Self {
            scenario: scenario.to_owned(),
            unit,
            engine,
            baseline: Some(baseline),
            target,
        }
    }

    /// A figure of the engine alone.
    pub(crate) fn measured(scenario: &str, unit: &'static str, value: f64, target: Target) -> Self {
        Self {
            scenario: scenario.to_owned(),
            unit,
            engine: value,
            baseline: None,
            target,
        }
    }

    fn ratio(&self) -> Option<f64> {
        self.baseline.map(|baseline| self.engine / baseline)
    }

    fn target(&self) -> String {
        match self.target {
            Target::None => "—".to_owned(),
            Target::Ratio(ratio) => format!("≥ {:.0}% of baseline", ratio * 100.0),
            Target::Below(value) => format!("< {value} {}", self.unit),
            Target::Exactly(value) => format!("= {value}"),
        }
    }

    fn verdict(&self) -> &'static str {
        let met = match self.target {
            Target::None => return "",
            Target::Ratio(ratio) => self.ratio().is_some_and(|found| found >= ratio),
            Target::Below(value) => self.engine < value,
            Target::Exactly(value) => (self.engine - value).abs() < f64::EPSILON,
        };
        if met { "met" } else { "MISSED" }
    }

    /// One line for the progress output.
    pub(crate) fn brief(&self) -> String {
        let mut line = format!("{}: {} {}", self.scenario, number(self.engine), self.unit);
        if let (Some(baseline), Some(ratio)) = (self.baseline, self.ratio()) {
            let _ = write!(
                line,
                " (baseline {}, {:.0}%)",
                number(baseline),
                ratio * 100.0
            );
        }
        line
    }
}

fn number(value: f64) -> String {
    if value >= 100.0 {
        let whole = value.round() as u64;
        let digits = whole.to_string();
        let mut grouped = String::new();
        for (index, digit) in digits.chars().enumerate() {
            if index > 0 && (digits.len() - index).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(digit);
        }
        grouped
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// The whole run.
pub(crate) struct Report {
    command: String,
    machine: Vec<(String, String)>,
    /// The figures, in scenario order.
    pub(crate) rows: Vec<Row>,
}

fn run(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

fn cpu() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    format!("{model}, {cores} cores available")
}

fn memory() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let kib: u64 = info
                .lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some(format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0))
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

impl Report {
    pub(crate) async fn new(args: &BenchArgs, server: &Server) -> Self {
        let mut command = String::from("cargo xtask bench");
        if (args.scale - 1.0).abs() > f64::EPSILON {
            let _ = write!(command, " --scale {}", args.scale);
        }
        if !args.only.is_empty() {
            let _ = write!(command, " --only {}", args.only.join(","));
        }
        let sqlite = match sqlx::SqlitePool::connect("sqlite::memory:").await {
            Ok(pool) => sqlx::query_scalar("SELECT sqlite_version()")
                .fetch_one(&pool)
                .await
                .unwrap_or_else(|_| "unknown".to_owned()),
            Err(_) => "unknown".to_owned(),
        };
        let machine = vec![
            ("CPU".to_owned(), cpu()),
            ("Memory".to_owned(), memory()),
            ("Kernel".to_owned(), run("uname", &["-sr"])),
            ("PostgreSQL".to_owned(), server.version.clone()),
            ("SQLite".to_owned(), sqlite),
            ("Rust".to_owned(), run("rustc", &["--version"])),
            (
                "Build".to_owned(),
                if cfg!(debug_assertions) {
                    "debug"
                } else {
                    "release"
                }
                .to_owned(),
            ),
            (
                "Commit".to_owned(),
                run("git", &["rev-parse", "--short", "HEAD"]),
            ),
            (
                "Date".to_owned(),
                run("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            ),
        ];
        Self {
            command,
            machine,
            rows: Vec::new(),
        }
    }

    /// The table as Markdown, with the machine and the command.
    pub(crate) fn render(&self) -> String {
        let mut text = String::from("# Benchmarks\n\n");
        let _ = writeln!(
            text,
            "Produced by `{}` (PostgreSQL from `DATABASE_URL`, else the local server; SQLite in \
             a temporary directory). Each comparison runs the engine and a hand-written `sqlx` \
             baseline of the same work in the same run; the ratio is engine / baseline.\n",
            self.command
        );
        text.push_str("| Machine | |\n| --- | --- |\n");
        for (what, value) in &self.machine {
            let _ = writeln!(text, "| {what} | {value} |");
        }
        text.push_str(
            "\n| Scenario | Unit | Engine | Baseline | Ratio | Target | |\n\
             | --- | --- | ---: | ---: | ---: | --- | --- |\n",
        );
        for row in &self.rows {
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} | {} | {} | {} |",
                row.scenario,
                row.unit,
                number(row.engine),
                row.baseline.map_or_else(|| "—".to_owned(), number),
                row.ratio()
                    .map_or_else(|| "—".to_owned(), |ratio| format!("{:.0}%", ratio * 100.0)),
                row.target(),
                row.verdict(),
            );
        }
        text
    }
}
