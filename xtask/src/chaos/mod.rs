//! `cargo xtask chaos`: proves "nothing lost" under faults. Relays run as child processes
//! (this binary, a hidden subcommand) and are killed with SIGKILL at random points of a drain;
//! two run at once; on PostgreSQL and MariaDB the server (a private one, started in a
//! temporary directory) is restarted mid-drain; coalescing writers race the relays; SQLite
//! runs the same under kills. Handlers record every delivery durably, and the records are checked for
//! losses, duplicates, per-shard order and overlapping holders.

mod check;
mod child;
pub(crate) mod cluster;
mod horizon;
mod inbox;
pub(crate) mod mariadb;
mod report;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use outbox_core::{Category, CategoryId, Scope, ScopeId};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

use self::check::{Faults, Figures};
pub(crate) use self::child::{RelayArgs, relay};
use self::cluster::Cluster;
pub(crate) use self::inbox::{InboxChildArgs, consumer as inbox_consumer, relay as inbox_relay};
use self::mariadb::MariaDb;
use self::workload::{Db, Plan};

/// Which databases a chaos run covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backends {
    /// PostgreSQL (a private server the command starts).
    Postgres,
    /// SQLite (a file in a temporary directory).
    Sqlite,
    /// MariaDB (a private server the command starts).
    Mariadb,
    /// All three.
    All,
}

/// One database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
    /// PostgreSQL.
    Postgres,
    /// SQLite.
    Sqlite,
    /// MariaDB.
    Mariadb,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Self::Postgres => "PostgreSQL",
            Self::Sqlite => "SQLite",
            Self::Mariadb => "MariaDB",
        }
    }
}

/// A private database server of the run, restarted as a fault.
enum Server {
    Postgres(Cluster),
    MariaDb(MariaDb),
}

impl Server {
    fn url(&self) -> String {
        match self {
            Self::Postgres(cluster) => cluster.url(),
            Self::MariaDb(server) => server.url(),
        }
    }

    /// Restarts it, killed as in a crash when `immediate`; returns how long it was away.
    fn restart(&self, immediate: bool) -> Result<Duration, String> {
        match self {
            Self::Postgres(cluster) => cluster.restart(immediate),
            Self::MariaDb(server) => server.restart(immediate),
        }
    }
}

/// Which scenarios a chaos run covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenarios {
    /// Relays killed, the database restarted, writers racing them: nothing lost, reordered
    /// or overlapped.
    Relay,
    /// Orders relayed through a broker and consumed into billing's database through its
    /// inbox, relays and consumers killed, the broker cut: every order charged exactly once.
    Inbox,
    /// Both.
    All,
}

/// Options of `cargo xtask chaos`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ChaosArgs {
    /// Which scenarios to run.
    #[arg(long, value_enum, default_value_t = Scenarios::All)]
    scenario: Scenarios,
    /// Which databases the relay scenario runs on.
    #[arg(long, value_enum, default_value_t = Backends::All)]
    backend: Backends,
    /// Which brokers the inbox scenario runs through (repeat the flag for more; both by
    /// default).
    #[arg(long = "broker", value_enum)]
    brokers: Vec<inbox::Broker>,
    /// Orders written in the inbox scenario.
    #[arg(long, default_value_t = 20_000)]
    orders: u64,
    /// Non-coalescing messages written per database.
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    /// Shards they are written over.
    #[arg(long, default_value_t = 1_000)]
    shards: u64,
    /// Relay processes running at once.
    #[arg(long, default_value_t = 2)]
    relays: usize,
    /// Coalescing groups the coalescing writers update (few, so that writers often race on
    /// one group).
    #[arg(long, default_value_t = 50)]
    groups: u64,
    /// One handler call in this many stalls for longer than the lease (0: never), so that
    /// another relay may take the shard over while the handler still runs.
    #[arg(long, default_value_t = 0)]
    stall_every: u32,
    /// Server restarts per run (PostgreSQL and MariaDB) (default: 3, or 1 with `--short`).
    #[arg(long)]
    restarts: Option<u32>,
    /// A small run for CI: 5,000 messages over 200 shards per database, a few kills and one
    /// restart, in a debug build.
    #[arg(long)]
    short: bool,
    /// Seed of the random kill points and workload (printed, so that a run can be replayed).
    #[arg(long)]
    seed: Option<u64>,
    /// Runs it this many times, each with a seed of its own (the next after `--seed`, if
    /// given), stopping at the first that fails and printing its seed.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Threads that keep the processor busy meanwhile, as a loaded machine (CI's) does.
    #[arg(long, default_value_t = 0)]
    cpu_hogs: u32,
}

impl ChaosArgs {
    /// Whether this run is the short one (which runs in a debug build).
    pub(crate) fn is_short(&self) -> bool {
        self.short
    }
}

/// What a run does, resolved from the arguments.
#[derive(Debug, Clone)]
struct Settings {
    messages: u64,
    shards: u64,
    groups: u64,
    relays: usize,
    /// Writers of sequenced messages, each owning every `writers`-th shard.
    writers: u32,
    /// Writers of coalescing rows, on shared groups.
    coalescing_writers: u32,
    /// How long the writers keep writing once the relays run.
    window: Duration,
    /// Seconds between faults: uniform in this range.
    fault_every: (f64, f64),
    restarts: u32,
    /// Give up (and report what remains as lost) after this long.
    deadline: Duration,
    lease: Duration,
    /// One handler call in this many stalls past the lease (0: never).
    stall_every: u32,
}

impl Settings {
    fn new(args: &ChaosArgs) -> Self {
        let (messages, shards, groups) = if args.short {
            (5_000, 200, 8)
        } else {
            (args.messages, args.shards, args.groups)
        };
        Self {
            messages,
            shards: shards.max(1),
            groups: groups.max(1),
            relays: args.relays.max(1),
            writers: 4,
            coalescing_writers: 4,
            window: if args.short {
                Duration::from_secs(5)
            } else {
                Duration::from_secs(30)
            },
            fault_every: if args.short { (0.4, 1.2) } else { (0.5, 3.0) },
            restarts: args.restarts.unwrap_or(if args.short { 1 } else { 3 }),
            deadline: Duration::from_secs(60 + messages / 250),
            lease: Duration::from_secs(2),
            stall_every: args.stall_every,
        }
    }
}

/// The scope of the chaos messages.
pub(crate) struct Streams;

impl Scope for Streams {
    const ID: ScopeId = ScopeId(1);
    const NAME: &'static str = "streams";
}

/// A sequenced message: its shard and its place in the shard's write order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Step {
    /// The shard it was written to.
    pub(crate) shard: i64,
    /// Its sequence number in the shard: 0, 1, 2… in write order.
    pub(crate) seq: i64,
}

/// The non-coalescing category: every message delivered, in write order within its shard.
pub(crate) struct Sequenced;

impl Category for Sequenced {
    type Scope = Streams;
    type Payload = Step;
    const ID: CategoryId = CategoryId(1);
    const NAME: &'static str = "sequenced";
    const COALESCE: bool = false;
}

/// A coalescing message: a new state of its group.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Update {
    /// The group (object identifier).
    pub(crate) group: i64,
    /// The writer that wrote it.
    pub(crate) writer: u32,
}

/// The coalescing category: the newest row of each group delivered.
pub(crate) struct Coalesced;

impl Category for Coalesced {
    type Scope = Streams;
    type Payload = Update;
    const ID: CategoryId = CategoryId(2);
    const NAME: &'static str = "coalesced";
}

/// The outcome of a run on one database.
#[derive(Debug)]
pub(crate) struct Outcome {
    backend: Backend,
    shards: u64,
    relays: usize,
    stall_every: u32,
    figures: Figures,
    kills: u64,
    restarts: u64,
    /// How long the server was away, per restart.
    downtime: Vec<Duration>,
    /// Relays that exited on their own (not killed, not asked to stop).
    crashes: Vec<String>,
    /// Rows still in the outbox at the end (past the deadline).
    remaining: Option<i64>,
    /// From the relays' start to the empty outbox.
    drain: Duration,
    /// The warnings the relays logged.
    warnings: Vec<String>,
    /// How long a snapshot held the cleanup horizon ([`horizon::Holder`]); `None` where
    /// none is held (SQLite).
    horizon: Option<Duration>,
    /// The run's work directory (each relay's whole log, its records), kept when the run
    /// failed (or `CHAOS_KEEP_LOGS` is set).
    logs: Option<PathBuf>,
}

impl Outcome {
    fn passed(&self) -> bool {
        self.failures().is_empty()
    }

    /// Each way the run failed, in words (none: it passed).
    fn failures(&self) -> Vec<String> {
        let mut failures = self.figures.failures();
        if !self.crashes.is_empty() {
            failures.push(format!("{} relay crashes", self.crashes.len()));
        }
        if let Some(remaining) = self.remaining {
            failures.push(format!("{remaining} rows left at the deadline"));
        }
        if self.horizon.is_some_and(|held| held.is_zero()) {
            failures.push("the cleanup horizon was never held".to_owned());
        }
        let outage_warnings = self.outage_warnings_per_relay();
        if outage_warnings > self.restarts {
            failures.push(format!(
                "{outage_warnings} \"database unavailable\" warnings from one relay for {} \
                 restarts",
                self.restarts
            ));
        }
        failures
    }

    /// The relays whose leases lapsed while their handlers ran, each with what its log says
    /// of it: how long the extension that came too late waited, how long after the lease
    /// was set it was asked, and how many of its leases other workers took meanwhile (with
    /// the longest wait of those extensions). What explains an overlap.
    fn lapses(&self) -> Vec<String> {
        let field = |line: &str, name: &str| -> Option<u64> {
            let (_, rest) = line.split_once(&format!(" {name}="))?;
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        };
        let mut relays: Vec<(&str, Option<String>, u64, u64)> = Vec::new();
        for warning in &self.warnings {
            let relay = warning.split(':').next().unwrap_or_default();
            let lapsed = warning.contains("lapsed while its handler ran");
            let lost = warning.contains("lease lost while a handler runs");
            if !lapsed && !lost {
                continue;
            }
            let at = match relays.iter().position(|(name, ..)| *name == relay) {
                Some(at) => at,
                None => {
                    relays.push((relay, None, 0, 0));
                    relays.len() - 1
                }
            };
            let waited = field(warning, "waited_ms").unwrap_or(0);
            let entry = &mut relays[at];
            if lapsed {
                entry.1 = Some(format!(
                    "an extension asked {} ms after the lease was set waited {waited} ms",
                    field(warning, "asked_ms_after_set").unwrap_or(0)
                ));
            } else {
                entry.2 += 1;
                entry.3 = entry.3.max(waited);
            }
        }
        relays
            .into_iter()
            .map(|(relay, lapse, lost, longest)| {
                format!(
                    "{relay}: {}; {lost} leases taken by others while its handlers ran \
                     (their extensions waited up to {longest} ms)",
                    lapse.as_deref().unwrap_or("no lapse said")
                )
            })
            .collect()
    }

    /// The most "database unavailable" warnings one relay logged: at most one per restart,
    /// however many of its shards a restart interrupted.
    fn outage_warnings_per_relay(&self) -> u64 {
        let mut per_relay: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        for warning in &self.warnings {
            // The outage's own warning ("database unavailable (looking for due shards)…"),
            // not another warning quoting an unavailable database's error (the commit
            // listener's "commit notifications broke … error=database unavailable: …").
            if warning.contains("database unavailable (") {
                let relay = warning.split(':').next().unwrap_or_default();
                *per_relay.entry(relay).or_default() += 1;
            }
        }
        per_relay.into_values().max().unwrap_or(0)
    }
}

/// Runs the chaos scenarios (`--repeat` times, beside `--cpu-hogs` busy threads); `Ok(false)`
/// when a run lost, reordered or overlapped anything.
pub(crate) async fn chaos(args: ChaosArgs) -> Result<bool, String> {
    let hogs = CpuHogs::start(args.cpu_hogs);
    let first = args.seed.unwrap_or_else(rand::random);
    for run in 0..args.repeat.max(1) {
        let seed = first.wrapping_add(u64::from(run));
        if args.repeat > 1 {
            eprintln!("chaos: run {} of {}", run + 1, args.repeat);
        }
        if !chaos_once(&args, seed).await? {
            if args.repeat > 1 {
                eprintln!(
                    "chaos: run {} of {} failed, after {run} that passed (seed {seed}; replay \
                     with --seed {seed}{})",
                    run + 1,
                    args.repeat,
                    if args.short { " --short" } else { "" }
                );
            }
            return Ok(false);
        }
    }
    drop(hogs);
    if args.repeat > 1 {
        eprintln!("chaos: all {} runs passed", args.repeat);
    }
    Ok(true)
}

/// Threads that spin until dropped.
struct CpuHogs {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpuHogs {
    fn start(count: u32) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..count)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// One run of the chaos scenarios with `seed`.
async fn chaos_once(args: &ChaosArgs, seed: u64) -> Result<bool, String> {
    let settings = Settings::new(args);
    let backends: &[Backend] = match args.backend {
        Backends::Postgres => &[Backend::Postgres],
        Backends::Sqlite => &[Backend::Sqlite],
        Backends::Mariadb => &[Backend::Mariadb],
        Backends::All => &[Backend::Postgres, Backend::Sqlite, Backend::Mariadb],
    };
    eprintln!(
        "chaos: seed {seed} (replay with --seed {seed}{})",
        if args.short { " --short" } else { "" }
    );
    let mut passed = true;
    let relay_scenario = args.scenario != Scenarios::Inbox;
    for &backend in backends.iter().filter(|_| relay_scenario) {
        eprintln!(
            "chaos: {}: {} messages over {} shards, {} relays…",
            backend.name(),
            settings.messages,
            settings.shards,
            settings.relays
        );
        let outcome = run(backend, &settings, seed).await?;
        println!("{}", report::render(&outcome, seed));
        passed &= outcome.passed();
    }
    if args.scenario != Scenarios::Relay {
        let brokers = if args.brokers.is_empty() {
            vec![inbox::Broker::Nats, inbox::Broker::Redis]
        } else {
            args.brokers.clone()
        };
        let settings = inbox::InboxSettings::new(args.short, args.orders);
        for broker in brokers {
            eprintln!(
                "chaos: inbox through {broker:?}: {} orders, {} consumers…",
                settings.orders, settings.consumers
            );
            let outcome = inbox::run(broker, &settings, seed).await?;
            println!("{}", outcome.render(seed));
            passed &= outcome.passed();
        }
    }
    Ok(passed)
}

/// Nanoseconds since the Unix epoch: the clock every process of the run records with.
pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64)
}

/// One run on one database.
async fn run(backend: Backend, settings: &Settings, seed: u64) -> Result<Outcome, String> {
    let work = tempfile::Builder::new()
        .prefix("outbox-chaos-")
        .tempdir()
        .map_err(|error| format!("cannot create a temporary directory: {error}"))?;
    let records = work.path().join("records");
    std::fs::create_dir(&records)
        .map_err(|error| format!("cannot create {}: {error}", records.display()))?;
    let server = match backend {
        Backend::Postgres => Some(Server::Postgres(Cluster::start()?)),
        Backend::Mariadb => Some(Server::MariaDb(MariaDb::start()?)),
        Backend::Sqlite => None,
    };
    let database = server.as_ref().map_or_else(
        || work.path().join("chaos.db").display().to_string(),
        Server::url,
    );
    let cluster = server.map(Arc::new);
    let db = Db::open(backend, &database).await?;
    db.prepare().await?;
    let holder = horizon::Holder::start(backend, &database);

    let mut rng = StdRng::seed_from_u64(seed);
    let plans = Plan::sequenced(settings, &mut rng);
    let deadline = Instant::now() + settings.deadline;

    // Half of the messages are waiting when the relays start; the rest race them.
    workload::prefill(&db, &plans, deadline).await?;
    let mut relays = child::relays(
        backend,
        &database,
        records.clone(),
        settings.lease,
        settings.stall_every,
        rng.random(),
    )?;
    for _ in 0..settings.relays {
        relays.spawn()?;
    }
    let started = Instant::now();
    let mut writers = workload::start(&db, &plans, settings, deadline, rng.random());

    let mut faults = Faults::default();
    let mut downtime = Vec::new();
    let mut events = 0u32;
    let mut next_fault = Instant::now() + pause(&mut rng, settings.fault_every);
    let mut coalesced_attempts = Vec::new();
    let mut remaining = None;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        relays.respawn_crashed()?;
        while let Some(done) = writers.try_join_next() {
            let written = done.map_err(|error| format!("a writer panicked: {error}"))??;
            coalesced_attempts.extend(written);
        }
        let pending = db.pending().await.ok();
        if writers.is_empty() && pending == Some(0) {
            break;
        }
        if Instant::now() >= deadline {
            remaining = Some(pending.unwrap_or(-1));
            writers.abort_all();
            break;
        }
        if Instant::now() < next_fault {
            continue;
        }
        events += 1;
        let restart = cluster
            .as_ref()
            .filter(|_| faults.restarts.len() < settings.restarts as usize && events % 3 == 2);
        if let Some(cluster) = restart {
            let cluster = Arc::clone(cluster);
            let immediate = faults.restarts.len() % 2 == 0;
            eprintln!(
                "chaos:   restarting the server ({})",
                if immediate { "immediate" } else { "fast" }
            );
            let down = now_ns();
            let away = tokio::task::spawn_blocking(move || cluster.restart(immediate))
                .await
                .map_err(|error| format!("the restart panicked: {error}"))??;
            faults.restarts.push((down, now_ns()));
            downtime.push(away);
        } else {
            faults.kills.push(relays.kill_one(&mut rng)?);
            relays.spawn()?;
        }
        next_fault = Instant::now() + pause(&mut rng, settings.fault_every);
    }
    let drain = started.elapsed();
    let horizon = match holder {
        Some(holder) => Some(holder.stop().await),
        None => None,
    };
    let crashes = relays.shutdown(Duration::from_secs(30)).await?;
    let warnings = relays.warnings();
    let written = db.written(&plans, &coalesced_attempts).await?;
    db.close().await;
    let (records, torn) = check::read_records(&records)?;
    let mut figures = check::check(&written, &records, &faults);
    figures.torn_records = torn;
    drop(cluster);
    let mut outcome = Outcome {
        backend,
        shards: settings.shards,
        relays: settings.relays,
        stall_every: settings.stall_every,
        figures,
        kills: faults.kills.len() as u64,
        restarts: faults.restarts.len() as u64,
        downtime,
        crashes,
        remaining,
        drain,
        warnings,
        horizon,
        logs: None,
    };
    outcome.logs = kept_unless(outcome.passed(), work);
    Ok(outcome)
}

/// A run's work directory (its children's whole logs, its records), kept where it is unless
/// the run `passed` (and `CHAOS_KEEP_LOGS` is not set), when it is deleted: where it is kept.
pub(crate) fn kept_unless(passed: bool, work: tempfile::TempDir) -> Option<PathBuf> {
    (!passed || std::env::var_os("CHAOS_KEEP_LOGS").is_some()).then(|| work.keep())
}

/// A random pause, in `range` seconds.
fn pause(rng: &mut StdRng, (low, high): (f64, f64)) -> Duration {
    Duration::from_secs_f64(rng.random_range(low..high))
}

/// Where a relay child records its deliveries: `dir/relay-<worker>.records`.
fn records_file(dir: &std::path::Path, worker: u32) -> PathBuf {
    dir.join(format!("relay-{worker}.records"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Backend, Figures, Outcome, kept_unless, report};

    fn outcome(warnings: &[&str]) -> Outcome {
        Outcome {
            backend: Backend::Sqlite,
            shards: 200,
            relays: 2,
            stall_every: 300,
            figures: Figures::default(),
            kills: 0,
            restarts: 0,
            downtime: Vec::new(),
            crashes: Vec::new(),
            remaining: None,
            drain: Duration::from_secs(1),
            warnings: warnings.iter().map(|line| (*line).to_owned()).collect(),
            horizon: None,
            logs: None,
        }
    }

    #[test]
    fn the_report_names_the_relay_whose_leases_lapsed_and_how_long_it_waited() {
        let outcome = outcome(&[
            "relay 4: 2026-12-02T08:42:30Z ERROR outbox.drain_shard{scope=1 shard=141}: \
             outbox_core::relay::inner: a lease of this relay lapsed while its handler ran \
             shard=scope 1 shard 141 token=823 lease_ms=2000 asked_ms_after_set=1980 \
             waited_ms=1204",
            "relay 4: 2026-12-02T08:42:30Z  WARN outbox.drain_shard{scope=1 shard=141}: \
             outbox_core::relay::deliver: lease lost while a handler runs; another worker owns \
             the shard shard=scope 1 shard 141 token=823 waited_ms=1204 set_ms_ago=3184",
            "relay 4: 2026-12-02T08:42:30Z  WARN outbox.drain_shard{scope=1 shard=89}: \
             outbox_core::relay::deliver: lease lost while a handler runs; another worker owns \
             the shard shard=scope 1 shard 89 token=801 waited_ms=1310 set_ms_ago=3290",
            "relay 6: 2026-12-02T08:42:31Z  WARN outbox_core::relay::run: database unavailable",
        ]);
        assert_eq!(
            outcome.lapses(),
            [
                "relay 4: an extension asked 1980 ms after the lease was set waited 1204 ms; 2 \
              leases taken by others while its handlers ran (their extensions waited up to \
              1310 ms)"
            ]
        );
        assert!(report::render(&outcome, 7).contains("leases lapsed"));
        assert!(self::outcome(&[]).lapses().is_empty());
    }

    #[test]
    fn a_failed_run_keeps_its_relays_logs_and_says_where() {
        let work = tempfile::tempdir().expect("a directory");
        let log = work.path().join("relay-0.log");
        std::fs::write(&log, "the relay's whole log").expect("a log");
        let mut failed = outcome(&[]);
        failed.crashes.push("relay 0: exit status: 101".to_owned());
        assert!(!failed.passed());
        failed.logs = kept_unless(failed.passed(), work);
        let kept = failed.logs.clone().expect("kept");
        assert!(log.exists(), "the log stays after the run");
        let report = report::render(&failed, 7);
        assert!(report.contains(&kept.display().to_string()), "{report}");
        std::fs::remove_dir_all(kept).expect("clean up");

        let work = tempfile::tempdir().expect("a directory");
        let path = work.path().to_owned();
        if std::env::var_os("CHAOS_KEEP_LOGS").is_none() {
            assert_eq!(kept_unless(true, work), None);
            assert!(!path.exists(), "a passed run's directory goes");
        }
    }

    #[test]
    fn only_the_outage_warning_counts_as_one() {
        let outcome = outcome(&[
            "relay 1: 2026-12-02T16:35:17.595852Z  WARN outbox_core::relay::run: commit \
             notifications broke; polling until they come back error=database unavailable: \
             error communicating with database: Connection reset by peer (os error 104)",
            "relay 1: 2026-12-02T16:35:17.595977Z  WARN outbox_core::relay::run: database \
             unavailable (a shard's drain was interrupted); retrying with backoff \
             error=database unavailable: error communicating with database",
            "relay 2: 2026-12-02T16:35:17.595994Z  WARN outbox_core::relay::run: database \
             unavailable (looking for due shards); retrying with backoff",
            "relay 2: 2026-12-02T16:35:19.595994Z  WARN outbox_core::relay::run: database \
             unavailable (looking for due shards); retrying with backoff",
        ]);
        assert_eq!(outcome.outage_warnings_per_relay(), 2);
        let once = self::outcome(
            &outcome.warnings[..3]
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        assert_eq!(once.outage_warnings_per_relay(), 1);
    }
}
