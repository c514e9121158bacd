//! Repository tasks, run as `cargo xtask <task>`.
//!
//! - `cargo xtask migrate --database-url URL` applies the outbox migrations to a PostgreSQL
//!   (`postgres://…`) or SQLite (`sqlite://path`) database, idempotently.
//! - `cargo xtask bench` measures the engine against hand-written `sqlx` baselines and writes
//!   `BENCHMARKS.md` (`--scale 0.01` for a quick run).
//! - `cargo xtask chaos` kills relays, restarts the database and races writers against the
//!   relays, then checks that nothing was lost or reordered (`--short` for CI's run).
//! - `cargo xtask test` runs everything CI runs: formatting, lints, documentation and the
//!   whole test suite, on SQLite and on PostgreSQL (`DATABASE_URL`, else 127.0.0.1:5432).

// A command-line tool talks to its user on stdout and stderr.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::{Command, ExitCode};
use std::str::FromStr;
use std::time::Duration;

mod bench;
mod chaos;

use clap::{Parser, Subcommand};
use outbox_core::Error;
use outbox_core::store::MIGRATIONS_TABLE;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, Executor};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "Repository tasks for outbox")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Apply the outbox migrations to a database (idempotent).
    Migrate {
        /// `postgres://user@host:port/database` or `sqlite://path/to/file.db` (the file is
        /// created if missing).
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
    },
    /// Measure the engine against hand-written sqlx baselines and write BENCHMARKS.md (runs
    /// itself in release mode).
    Bench(bench::BenchArgs),
    /// The relay process of the memory benchmark (internal).
    #[command(hide = true)]
    BenchMemoryChild {
        /// The database to drain.
        #[arg(long)]
        database_url: String,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<u64>,
    },
    /// Kill relays, restart the database and race writers against the relays, then check
    /// that nothing was lost or reordered (runs itself in release mode unless `--short`).
    Chaos(chaos::ChaosArgs),
    /// A relay process of the chaos run (internal).
    #[command(hide = true)]
    ChaosRelay(chaos::RelayArgs),
    /// Check formatting, lints and docs, then run every test of the workspace.
    Test {
        /// Arguments passed on to `cargo test` (after `--`), e.g. a test name filter.
        #[arg(last = true)]
        cargo_test_args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.task {
        Task::Migrate { database_url } => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a Tokio runtime");
            match runtime.block_on(migrate(&database_url)) {
                Ok(report) => {
                    println!("{report}");
                    ExitCode::SUCCESS
                }
                Err(error) => {
                    eprintln!("error: {}", outbox_core::error_chain(&error));
                    ExitCode::FAILURE
                }
            }
        }
        Task::Test { cargo_test_args } => test(&cargo_test_args),
        Task::Bench(args) => {
            if cfg!(debug_assertions) {
                return release(&["bench"], "the benchmark");
            }
            report(runtime().block_on(bench::bench(args)))
        }
        Task::BenchMemoryChild {
            database_url,
            seconds,
        } => match runtime().block_on(bench::memory_child(&database_url, seconds)) {
            Ok(line) => {
                println!("{line}");
                ExitCode::SUCCESS
            }
            Err(error) => report(Err(error)),
        },
        Task::Chaos(args) => {
            if cfg!(debug_assertions) && !args.is_short() {
                return release(&["chaos"], "the full chaos run");
            }
            match runtime().block_on(chaos::chaos(args)) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => {
                    eprintln!("error: the chaos run lost, reordered or overlapped deliveries");
                    ExitCode::FAILURE
                }
                Err(error) => report(Err(error)),
            }
        }
        Task::ChaosRelay(args) => match runtime().block_on(chaos::relay(args)) {
            Ok(summary) => {
                println!("{summary}");
                ExitCode::SUCCESS
            }
            Err(error) => report(Err(error)),
        },
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

fn report(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs this task again from a release build, with the same arguments: a benchmark of a debug
/// build measures the debug build, and a full chaos run would take too long in one.
fn release(task: &[&str], what: &str) -> ExitCode {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let args: Vec<String> = std::env::args().skip(1).collect();
    let position = args
        .iter()
        .position(|arg| arg == task[0])
        .map_or(0, |index| index + 1);
    eprintln!("==> building xtask in release mode for {what}");
    let status = Command::new(cargo)
        .args(["run", "--quiet", "--release", "--package", "xtask", "--"])
        .args(task)
        .args(&args[position..])
        .status();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: cannot run cargo: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What `migrate` did.
struct MigrateReport {
    database: String,
    before: Vec<i64>,
    after: Vec<i64>,
}

impl std::fmt::Display for MigrateReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let applied: Vec<_> = self
            .after
            .iter()
            .filter(|version| !self.before.contains(version))
            .collect();
        if applied.is_empty() {
            write!(f, "{}: up to date", self.database)?;
        } else {
            write!(f, "{}: applied migrations {applied:?}", self.database)?;
        }
        write!(
            f,
            " (schema version {})",
            self.after.last().copied().unwrap_or_default()
        )
    }
}

/// The versions recorded in the outbox migrations table; none if it does not exist yet.
fn applied_versions_query() -> AssertSqlSafe<String> {
    AssertSqlSafe(format!(
        "SELECT version FROM {MIGRATIONS_TABLE} WHERE success ORDER BY version"
    ))
}

async fn migrate(url: &str) -> Result<MigrateReport, Error> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let pool = outbox_postgres::connect(url).await?;
        let before = applied(&pool).await;
        outbox_postgres::migrate(&pool).await?;
        let after = applied(&pool).await;
        pool.close().await;
        let database = pool
            .connect_options()
            .get_database()
            .unwrap_or("postgres")
            .to_owned();
        Ok(MigrateReport {
            database: format!("PostgreSQL database `{database}`"),
            before,
            after,
        })
    } else if url.starts_with("sqlite:") {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|error| Error::InvalidDatabaseUrl {
                url: url.to_owned(),
                reason: error.to_string(),
            })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        let file = options.get_filename().display().to_string();
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(|error| Error::Unavailable {
                source: Box::new(error),
            })?;
        let before = applied(&pool).await;
        outbox_sqlite::migrate(&pool).await?;
        let after = applied(&pool).await;
        pool.close().await;
        Ok(MigrateReport {
            database: format!("SQLite database `{file}`"),
            before,
            after,
        })
    } else {
        // Show the scheme only: the rest may hold a password.
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        Err(Error::InvalidDatabaseUrl {
            url: format!("{scheme}:…"),
            reason: "expected a postgres:// or sqlite:// URL".to_owned(),
        })
    }
}

async fn applied<'a, E>(executor: E) -> Vec<i64>
where
    E: Executor<'a>,
    i64: sqlx::Type<E::Database> + for<'r> sqlx::Decode<'r, E::Database>,
    for<'q> <E::Database as sqlx::Database>::Arguments: sqlx::IntoArguments<E::Database>,
    usize: sqlx::ColumnIndex<<E::Database as sqlx::Database>::Row>,
{
    sqlx::query_scalar(applied_versions_query())
        .fetch_all(executor)
        .await
        .unwrap_or_default()
}

/// One `cargo` invocation of `cargo xtask test`.
struct Step<'a> {
    what: &'a str,
    args: &'a [&'a str],
    env: Vec<(&'a str, &'a str)>,
}

impl<'a> Step<'a> {
    fn new(what: &'a str, args: &'a [&'a str]) -> Self {
        Self {
            what,
            args,
            env: Vec::new(),
        }
    }

    fn env(mut self, key: &'a str, value: &'a str) -> Self {
        self.env.push((key, value));
        self
    }
}

/// Runs the checks CI runs, stopping at the first that fails.
fn test(cargo_test_args: &[String]) -> ExitCode {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut test = vec!["test", "--workspace"];
    if !cargo_test_args.is_empty() {
        test.push("--");
        test.extend(cargo_test_args.iter().map(String::as_str));
    }
    let steps = [
        Step::new("formatting", &["fmt", "--all", "--check"]),
        Step::new(
            "lints",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ),
        Step::new("documentation", &["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
        Step::new("tests", &test),
        Step::new(
            "chaos (short)",
            &[
                "run",
                "--quiet",
                "--package",
                "xtask",
                "--",
                "chaos",
                "--short",
                "--stall-every",
                "300",
            ],
        ),
    ];
    for Step { what, args, env } in steps {
        eprintln!("==> {what}: cargo {}", args.join(" "));
        let status = Command::new(&cargo).args(args).envs(env).status();
        match status {
            Ok(status) if status.success() => {}
            Ok(status) => {
                eprintln!("==> {what} failed ({status})");
                return ExitCode::FAILURE;
            }
            Err(error) => {
                eprintln!("==> cannot run {cargo}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!("==> all checks passed");
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use outbox_testkit::postgres::PgTestDatabase;

    use super::*;

    #[tokio::test]
    async fn migrates_a_new_sqlite_file_idempotently() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("app.db");
        let url = format!("sqlite://{}", path.display());

        let first = migrate(&url).await.expect("migrate");
        assert!(path.exists(), "the file is created");
        assert_eq!(
            (first.before.as_slice(), first.after.as_slice()),
            (&[][..], &[1, 2, 3][..])
        );
        assert!(
            first.to_string().contains("applied migrations [1, 2, 3]"),
            "{first}"
        );

        let second = migrate(&url).await.expect("migrate again");
        assert_eq!(second.before, second.after);
        assert!(second.to_string().contains("up to date"), "{second}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn migrates_postgres_idempotently() {
        let database = PgTestDatabase::create().await;
        let first = migrate(&database.url()).await.expect("migrate");
        assert_eq!(first.after, [1, 2]);
        assert!(first.before.is_empty());
        let second = migrate(&database.url()).await.expect("migrate again");
        assert_eq!(second.before, [1, 2]);
        assert_eq!(second.after, [1, 2]);
        let tables: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_tables WHERE tablename IN ('outbox_messages', 'outbox_shards')",
        )
        .fetch_one(database.pool())
        .await
        .expect("count tables");
        assert_eq!(tables, 2);
    }

    #[tokio::test]
    async fn rejects_other_urls_without_showing_them() {
        let error = migrate("mysql://app:secret@db/app")
            .await
            .err()
            .expect("not supported");
        assert!(
            matches!(error, Error::InvalidDatabaseUrl { .. }),
            "{error:?}"
        );
        assert!(!error.to_string().contains("secret"), "{error}");
        let error = migrate("postgres://app:secret@127.0.0.1:1/app")
            .await
            .err()
            .expect("no server");
        assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    }
}
