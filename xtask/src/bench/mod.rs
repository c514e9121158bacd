//! `cargo xtask bench`: what the engine costs and how fast it delivers, each scenario side by
//! side with a hand-written `sqlx` baseline of the same work, in the same run, on the same
//! machine. Prints a table and writes it, with the machine and the command, to
//! `BENCHMARKS.md`.

mod backfill;
mod baselines;
mod console;
mod cpu;
mod drain;
mod gauges;
mod held;
mod horizon;
mod inbox;
mod latency;
mod mariadb;
mod memory;
mod models;
mod report;
mod setup;
mod sinks;
mod telemetry;
mod write;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

pub(crate) use self::memory::child as memory_child;
use self::report::{Report, Row};
use self::setup::Server;

/// Options of `cargo xtask bench`.
#[derive(Debug, Clone, Args)]
pub(crate) struct BenchArgs {
    /// The PostgreSQL server to create the benchmark databases on (dropped afterwards).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        hide_env_values = true
    )]
    database_url: String,
    /// The MariaDB (or MySQL) server of scenario 16 (its databases are dropped afterwards).
    #[arg(
        long,
        env = "MYSQL_URL",
        default_value = "mysql://root@127.0.0.1:3306",
        hide_env_values = true
    )]
    mysql_url: String,
    /// Scales every scenario's size (1.0: the full sizes; 0.01 for a quick run).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Where to write the table; nothing is written when the scale is not 1.
    #[arg(long, default_value = "BENCHMARKS.md")]
    output: PathBuf,
    /// Runs only the scenarios named (write, drain, coalescing, latency, memory, models,
    /// sqlite, metrics, sinks, backfill, gauges, sparse, horizon-short, horizon-long,
    /// horizon-mariadb, horizon-sqlite, console, inbox, mariadb; `horizon` runs every hold).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

impl BenchArgs {
    /// `full` scaled, at least `min`.
    pub(crate) fn sized(&self, full: u64, min: u64) -> u64 {
        ((full as f64 * self.scale).round() as u64).max(min)
    }

    /// `full` scaled, at least `min`.
    pub(crate) fn seconds(&self, full: u64, min: u64) -> Duration {
        Duration::from_secs(self.sized(full, min))
    }

    /// Whether `scenario` is to run: every one without `--only`; else those named, a word
    /// naming the scenario or the family before its dash (`horizon`: every hold), never a
    /// scenario whose name merely contains it (`sqlite` is not `horizon-sqlite`).
    fn runs(&self, scenario: &str) -> bool {
        self.only.is_empty()
            || self.only.iter().any(|word| {
                scenario == word
                    || scenario
                        .split_once('-')
                        .is_some_and(|(family, _)| family == word)
            })
    }
}

/// Runs the benchmarks; the error says what failed.
pub(crate) async fn bench(args: BenchArgs) -> Result<(), String> {
    let server = Server::new(&args.database_url).await?;
    let mut report = Report::new(&args, &server).await;
    let scenarios: [(&str, Scenario); 19] = [
        ("write", |a, s| Box::pin(write::postgres(a, s))),
        ("drain", |a, s| Box::pin(drain::plain(a, s))),
        ("coalescing", |a, s| Box::pin(drain::coalescing(a, s))),
        ("latency", |a, s| Box::pin(latency::run(a, s))),
        ("memory", |a, s| Box::pin(memory::run(a, s))),
        ("models", |a, s| Box::pin(models::postgres(a, s))),
        ("sqlite", |a, _| Box::pin(sqlite(a))),
        ("metrics", |a, s| Box::pin(telemetry::postgres(a, s))),
        ("sinks", |a, s| Box::pin(sinks::run(a, s))),
        ("backfill", |a, s| Box::pin(backfill::run(a, s))),
        ("gauges", |a, s| Box::pin(gauges::run(a, s))),
        ("sparse", |a, s| Box::pin(drain::sparse(a, s))),
        ("horizon-short", |a, s| Box::pin(horizon::short(a, s))),
        ("horizon-long", |a, s| Box::pin(horizon::long(a, s))),
        ("horizon-mariadb", |a, _| Box::pin(held::mariadb(a))),
        ("horizon-sqlite", |a, _| Box::pin(held::sqlite(a))),
        ("console", |a, s| Box::pin(console::run(a, s))),
        ("inbox", |a, s| Box::pin(inbox::run(a, s))),
        ("mariadb", |a, _| Box::pin(mariadb::run(a))),
    ];
    for (name, scenario) in scenarios {
        if !args.runs(name) {
            continue;
        }
        eprintln!("bench: {name}…");
        let rows = scenario(&args, &server).await?;
        for row in &rows {
            eprintln!("  {}", row.brief());
        }
        report.rows.extend(rows);
    }
    let table = report.render();
    println!("{table}");
    if (args.scale - 1.0).abs() < f64::EPSILON && args.only.is_empty() {
        std::fs::write(&args.output, &table)
            .map_err(|error| format!("cannot write {}: {error}", args.output.display()))?;
        eprintln!("bench: wrote {}", args.output.display());
    } else {
        eprintln!(
            "bench: a partial run (scale or --only): {} left as it was",
            args.output.display()
        );
    }
    Ok(())
}

type Scenario =
    for<'a> fn(
        &'a BenchArgs,
        &'a Server,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<Row>, String>> + 'a>>;

/// Scenario 6: the write path and the drain on SQLite, at a tenth of the PostgreSQL sizes.
async fn sqlite(args: &BenchArgs) -> Result<Vec<Row>, String> {
    let mut rows = write::sqlite(args).await?;
    rows.extend(drain::sqlite(args).await?);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn runs(only: &str, scenario: &str) -> bool {
        Command::parse_from(["bench", "--only", only])
            .bench
            .runs(scenario)
    }

    #[test]
    fn only_runs_the_scenarios_named_or_their_family() {
        assert!(runs("sqlite", "sqlite"));
        assert!(!runs("sqlite", "horizon-sqlite"));
        assert!(!runs("mariadb", "horizon-mariadb"));
        assert!(runs("horizon", "horizon-mariadb"));
        assert!(runs("horizon-long", "horizon-long"));
        assert!(!runs("horizon-long", "horizon-short"));
        assert!(runs("write,sparse", "sparse"));
        assert!(!runs("spar", "sparse"));
    }
}
