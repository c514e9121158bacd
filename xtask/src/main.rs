//! Repository tasks, run as `cargo xtask <task>`.
//!
//! - `cargo xtask migrate --database-url URL` applies the outbox migrations to a PostgreSQL
//!   (`postgres://…`) or SQLite (`sqlite://path`) database, idempotently: what the `outbox`
//!   command's `outbox migrate` does (`outbox-cli`), for this repository's developers.
//! - `cargo xtask bench` measures the engine against hand-written `sqlx` baselines and writes
//!   `BENCHMARKS.md` (`--scale 0.01` for a quick run).
//! - `cargo xtask chaos` kills relays, restarts the database and races writers against the
//!   relays, then checks that nothing was lost or reordered (`--short` for CI's run).
//! - `cargo xtask test` runs everything CI runs: formatting, lints, documentation, packaging and the
//!   whole test suite, on SQLite, PostgreSQL (`DATABASE_URL`, else 127.0.0.1:5432) and MariaDB
//!   (`MYSQL_URL`, else 127.0.0.1:3306), then fails if the tests left a database behind, and
//!   ends with the release check (not in a run filtered by test name).
//! - `cargo xtask release-check` publishes every crate to a registry on this machine and uses
//!   them from there as a user would: `cargo add outbox`, the README's first outbox run.

// A command-line tool talks to its user on stdout and stderr.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::{Command, ExitCode};

mod bench;
mod chaos;
mod release;

use clap::{Parser, Subcommand};

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
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
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
    /// The orders relay of the chaos run's inbox scenario (internal).
    #[command(hide = true)]
    ChaosInboxRelay(chaos::InboxChildArgs),
    /// A billing consumer of the chaos run's inbox scenario (internal).
    #[command(hide = true)]
    ChaosInboxConsumer(chaos::InboxChildArgs),
    /// Check formatting, lints and docs, then run every test of the workspace.
    Test {
        /// Arguments passed on to `cargo test` (after `--`), e.g. a test name filter.
        #[arg(last = true)]
        cargo_test_args: Vec<String>,
    },
    /// Publish every crate to a registry on this machine, then build and run the README's
    /// first outbox from it in a new crate, as a user would (needs `cargo-http-registry`).
    ReleaseCheck,
}

/// The exit of a chaos child: its summary printed, or its error.
fn child(outcome: Result<String, String>) -> ExitCode {
    match outcome {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(error) => report(Err(error)),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.task {
        Task::Migrate { database_url } => migrate(database_url),
        Task::Test { cargo_test_args } => test(&cargo_test_args),
        Task::ReleaseCheck => release_check(),
        Task::Bench(args) => {
            if cfg!(debug_assertions) {
                return release(&["bench"], "the benchmark");
            }
            // `BENCH_TRACE=sqlx::query=debug`: every statement, with its time, on stdout.
            if let Ok(filter) = std::env::var("BENCH_TRACE") {
                tracing_subscriber::fmt()
                    .with_writer(std::io::stdout)
                    .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                    .init();
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
        Task::ChaosRelay(args) => child(runtime().block_on(chaos::relay(args))),
        Task::ChaosInboxRelay(args) => child(runtime().block_on(chaos::inbox_relay(args))),
        Task::ChaosInboxConsumer(args) => child(runtime().block_on(chaos::inbox_consumer(args))),
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
    let cargo = cargo();
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

/// `outbox migrate`, as the `outbox` command runs it.
fn migrate(database_url: String) -> ExitCode {
    let cli = outbox_cli::Cli {
        database_url: Some(database_url),
        json: false,
        command: outbox_cli::Command::Migrate { print: false },
    };
    let mut stdout = std::io::stdout().lock();
    let migrated = runtime().block_on(outbox_cli::run(
        cli,
        &outbox_core::admin::Catalog::empty(),
        &mut stdout,
    ));
    match migrated {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
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

/// The workspace's packages that are published (those without `publish = false`), read from
/// `cargo metadata`.
fn published_packages(cargo: &str) -> Result<Vec<String>, String> {
    let output = Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .map_err(|error| format!("cannot run {cargo}: {error}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).map_err(|error| error.to_string())?;
    let packages = metadata["packages"]
        .as_array()
        .ok_or("`cargo metadata` listed no packages")?;
    Ok(packages
        .iter()
        // `publish = false` is an empty list of registries; no `publish` key is null.
        .filter(|package| package["publish"].is_null())
        .filter_map(|package| package["name"].as_str().map(str::to_owned))
        .collect())
}

/// The cargo that runs this task (`CARGO`), else the one on the path.
fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// `cargo xtask release-check`: [`rehearsed`] with the published packages.
fn release_check() -> ExitCode {
    let cargo = cargo();
    match published_packages(&cargo) {
        Ok(published) => rehearsed(&cargo, &published),
        Err(error) => {
            eprintln!("==> cannot list the published packages: {error}");
            ExitCode::FAILURE
        }
    }
}

/// [`release::rehearse`] with `published`, building in the workspace's target directory; says
/// how it ended and how long it took.
fn rehearsed(cargo: &str, published: &[String]) -> ExitCode {
    let started = std::time::Instant::now();
    let target = std::env::var("CARGO_TARGET_DIR").map_or_else(
        |_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        std::path::PathBuf::from,
    );
    match release::rehearse(cargo, published, &target) {
        Ok(()) => {
            eprintln!("==> release check passed in {}", took(started));
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("==> release check: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The programs the console's browser tests run (`outbox-web/tests/browser.rs`).
const BROWSER: [&str; 2] = ["/usr/bin/chromium", "/usr/bin/chromedriver"];

/// Runs the checks CI runs, stopping at the first that fails.
fn test(cargo_test_args: &[String]) -> ExitCode {
    let cargo = cargo();
    let mut test = vec!["test", "--workspace"];
    if !cargo_test_args.is_empty() {
        test.push("--");
        test.extend(cargo_test_args.iter().map(String::as_str));
    }
    let published = match published_packages(&cargo) {
        Ok(published) => published,
        Err(error) => {
            eprintln!("==> cannot list the published packages: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Every published package packages: a path-only dependency, a README or licence file
    // missing, a manifest crates.io would refuse. Not built from its package (what `cargo
    // publish` verifies): that would build every dependency again, librdkafka included.
    let mut package = vec!["package", "--no-verify", "--allow-dirty", "--quiet"];
    for name in &published {
        package.extend(["--package", name.as_str()]);
    }
    // The console's browser tests drive Debian's Chromium through its ChromeDriver: said
    // before the build, not after it, when they fail.
    let missing: Vec<&str> = BROWSER
        .iter()
        .filter(|program| !std::path::Path::new(program).exists())
        .copied()
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "==> the console's browser tests need {}: install Debian's chromium and \
             chromium-driver (apt-get install chromium chromium-driver; .ci/run installs them)",
            missing.join(" and ")
        );
        return ExitCode::FAILURE;
    }
    // The release check publishes to a registry server of its own (not in a filtered run).
    let release_check_runs = cargo_test_args.is_empty();
    if release_check_runs && !release::server_installed() {
        eprintln!("==> the release check needs {}", release::INSTALL_SERVER);
        return ExitCode::FAILURE;
    }
    // The test databases on the shared servers before the run: those of another run going on
    // now, or left by an earlier one, are not this run's.
    let before = match test_databases() {
        Ok(names) => names,
        Err(error) => {
            eprintln!("==> cannot list the test databases: {error}");
            return ExitCode::FAILURE;
        }
    };
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
        // The TLS features the docs offer build (one of them: both choose sqlx's TLS stack).
        Step::new(
            "TLS feature",
            &[
                "check",
                "--package",
                "outbox-rs-cli",
                "--features",
                "tls-rustls",
            ],
        ),
        Step::new("packaging", &package),
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
    let began = std::time::Instant::now();
    for Step { what, args, env } in steps {
        eprintln!("==> {what}: cargo {}", args.join(" "));
        let started = std::time::Instant::now();
        let status = Command::new(&cargo).args(args).envs(env).status();
        match status {
            Ok(status) if status.success() => {
                eprintln!("==> {what}: done in {}", took(started));
            }
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
    eprintln!("==> test databases left behind: checking");
    let left = test_databases().map(|after| {
        after
            .into_iter()
            .filter(|name| !before.contains(name))
            .collect::<Vec<_>>()
    });
    match left {
        Ok(left) if left.is_empty() => {}
        Ok(left) => {
            eprintln!(
                "==> the tests left {} database(s) behind (a test database is dropped with the \
                 value that holds it): {}",
                left.len(),
                left.join(", ")
            );
            return ExitCode::FAILURE;
        }
        Err(error) => {
            eprintln!("==> cannot list the test databases: {error}");
            return ExitCode::FAILURE;
        }
    }
    if release_check_runs && rehearsed(&cargo, &published) != ExitCode::SUCCESS {
        return ExitCode::FAILURE;
    }
    eprintln!("==> all checks passed in {}", took(began));
    ExitCode::SUCCESS
}

/// The time since `started`, in minutes and seconds.
fn took(started: std::time::Instant) -> String {
    let seconds = started.elapsed().as_secs();
    format!("{} min {:02} s", seconds / 60, seconds % 60)
}

/// The test databases on the PostgreSQL and MariaDB servers the tests use (`DATABASE_URL`,
/// `MYSQL_URL`, else the local ones), each named with the server it is on.
fn test_databases() -> Result<Vec<String>, String> {
    runtime().block_on(async {
        let postgres = outbox_testkit::postgres::test_databases()
            .await
            .map_err(|error| format!("on PostgreSQL: {error}"))?;
        let mariadb = outbox_testkit::mysql::test_databases()
            .await
            .map_err(|error| format!("on MariaDB: {error}"))?;
        Ok(postgres
            .into_iter()
            .map(|name| format!("{name} (PostgreSQL)"))
            .chain(mariadb.into_iter().map(|name| format!("{name} (MariaDB)")))
            .collect())
    })
}
