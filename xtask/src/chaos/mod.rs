//! `cargo xtask chaos`: proves "nothing lost" under faults. Relays run as child processes
//! (this binary, a hidden subcommand) and are killed with SIGKILL at random points of a drain;
//! two run at once; on PostgreSQL and MariaDB the server (a private one, started in a
//! temporary directory) is restarted mid-drain; coalescing writers race the relays; SQLite
//! runs the same under kills. Handlers record every delivery durably, and the records are checked for
//! losses, duplicates, per-shard order and overlapping holders.

mod check;
mod child;
mod cluster;
mod inbox;
mod mariadb;
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

    /// The most "database unavailable" warnings one relay logged: at most one per restart,
    /// however many of its shards a restart interrupted.
    fn outage_warnings_per_relay(&self) -> u64 {
        let mut per_relay: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        for warning in &self.warnings {
            if warning.contains("database unavailable") {
                let relay = warning.split(':').next().unwrap_or_default();
                *per_relay.entry(relay).or_default() += 1;
            }
        }
        per_relay.into_values().max().unwrap_or(0)
    }
}

/// Runs the chaos scenarios; `Ok(false)` when a run lost, reordered or overlapped anything.
pub(crate) async fn chaos(args: ChaosArgs) -> Result<bool, String> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let settings = Settings::new(&args);
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
    let crashes = relays.shutdown(Duration::from_secs(30)).await?;
    let warnings = relays.warnings();
    let written = db.written(&plans, &coalesced_attempts).await?;
    db.close().await;
    let (records, torn) = check::read_records(&records)?;
    let mut figures = check::check(&written, &records, &faults);
    figures.torn_records = torn;
    drop(cluster);
    Ok(Outcome {
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
    })
}

/// A random pause, in `range` seconds.
fn pause(rng: &mut StdRng, (low, high): (f64, f64)) -> Duration {
    Duration::from_secs_f64(rng.random_range(low..high))
}

/// Where a relay child records its deliveries: `dir/relay-<worker>.records`.
fn records_file(dir: &std::path::Path, worker: u32) -> PathBuf {
    dir.join(format!("relay-{worker}.records"))
}
