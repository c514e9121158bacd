//! The relay processes: the child (`cargo xtask chaos-relay`, hidden), which relays with
//! handlers that record every delivery, and the parent's side, which starts, kills and stops
//! them.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use outbox_core::store::Store;
use outbox_core::{Delivery, Registry, Relay, RelayConfig, RelayConfigBuilder};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::check::{Kind, Record};
use super::{Backend, Coalesced, Sequenced, now_ns, records_file};

/// Options of the relay child process.
#[derive(Debug, Clone, Args)]
pub(crate) struct RelayArgs {
    /// The database.
    #[arg(long, value_enum)]
    backend: Backend,
    /// Its URL (PostgreSQL) or file (SQLite).
    #[arg(long)]
    database: String,
    /// The directory of the record files.
    #[arg(long)]
    records: PathBuf,
    /// This relay's number in the run.
    #[arg(long)]
    worker: u32,
    /// The lease, in milliseconds.
    #[arg(long)]
    lease_ms: u64,
    /// Seed of the handlers' random pauses.
    #[arg(long)]
    seed: u64,
    /// One handler call in this many stalls for the lease and a second more (0: never).
    #[arg(long, default_value_t = 0)]
    stall_every: u32,
}

/// The relay child: relays until SIGTERM, then returns a summary of its run.
pub(crate) async fn relay(args: RelayArgs) -> Result<String, String> {
    // The relay's own log, to the log file the parent reads: what an operator would see.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .init();
    let path = records_file(&args.records, args.worker);
    let file = File::options()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|error| format!("cannot open {}: {error}", path.display()))?;
    let recorder = Arc::new(Recorder {
        file,
        worker: args.worker,
        rng: std::sync::Mutex::new(StdRng::seed_from_u64(args.seed)),
        stall: (args.stall_every > 0).then(|| {
            (
                args.stall_every,
                Duration::from_millis(args.lease_ms + 1_000),
            )
        }),
    });
    let sequenced = Arc::clone(&recorder);
    let coalesced = Arc::clone(&recorder);
    let registry = Registry::builder()
        .handle::<Sequenced>(move |delivery: Delivery<Sequenced>| {
            let recorder = Arc::clone(&sequenced);
            async move {
                let seq = delivery.payload.seq;
                recorder.deliver(Kind::Sequenced, &delivery, seq).await
            }
        })
        .handle::<Coalesced>(move |delivery: Delivery<Coalesced>| {
            let recorder = Arc::clone(&coalesced);
            async move { recorder.deliver(Kind::Coalesced, &delivery, 0).await }
        })
        .build()
        .map_err(|error| format!("the registry: {error}"))?;

    let config = RelayConfig::builder()
        .worker_id(format!(
            "chaos-relay-{}-{}",
            args.worker,
            std::process::id()
        ))
        .lease(Duration::from_millis(args.lease_ms))
        .poll_interval(Duration::from_millis(200))
        .shutdown_deadline(Duration::from_secs(10))
        .max_reconnect_delay(Duration::from_secs(1));
    let built = |config: RelayConfigBuilder| {
        config
            .build()
            .map_err(|error| format!("the relay configuration: {error}"))
    };
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|error| format!("cannot listen for SIGTERM: {error}"))?;
    let shutdown = async move {
        terminate.recv().await;
    };
    // The server may be restarting right now: try for a while.
    macro_rules! connect_retrying {
        ($connect:path) => {{
            let started = Instant::now();
            loop {
                match $connect(&args.database).await {
                    Ok(pool) => break pool,
                    Err(error) if started.elapsed() < Duration::from_secs(60) => {
                        eprintln!("relay {}: connecting: {error}; retrying", args.worker);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(error) => return Err(format!("connecting: {error}")),
                }
            }
        }};
    }
    match args.backend {
        Backend::Postgres => {
            let pool = connect_retrying!(outbox_postgres::connect);
            run(
                outbox_postgres::PgStore::new(pool),
                registry,
                built(config)?,
                shutdown,
            )
            .await
        }
        Backend::Mariadb => {
            let pool = connect_retrying!(outbox_mysql::connect);
            run(
                outbox_mysql::MySqlStore::new(pool),
                registry,
                built(config)?,
                shutdown,
            )
            .await
        }
        Backend::Sqlite => {
            let pool = outbox_sqlite::connect(std::path::Path::new(&args.database))
                .await
                .map_err(|error| format!("opening the database: {error}"))?;
            // The pool has 8 connections: fewer shards at once than that.
            run(
                outbox_sqlite::SqliteStore::new(pool),
                registry,
                built(config.max_concurrent_shards(4))?,
                shutdown,
            )
            .await
        }
    }
}

async fn run<S: Store>(
    store: S,
    registry: Registry,
    config: RelayConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<String, String> {
    let relay = Relay::with_config(store, registry, config);
    let report = relay.run(shutdown).await.map_err(|error| {
        format!(
            "the relay failed: {}",
            outbox_core::error::error_chain(&error)
        )
    })?;
    Ok(format!("{report:?}"))
}

/// The handlers' side: one line per delivery, appended to the relay's record file.
struct Recorder {
    file: File,
    worker: u32,
    rng: std::sync::Mutex<StdRng>,
    /// One call in `.0` stalls for `.1`.
    stall: Option<(u32, Duration)>,
}

impl Recorder {
    /// Records a delivery: one `write` of a whole line to a file opened for appending, done
    /// before the handler returns, so the record survives a SIGKILL that comes after it and
    /// precedes the acknowledgement. One delivery in ten first pauses up to 5 ms, so that
    /// kills land inside handlers too; with stalls on, a few stall past the lease.
    async fn deliver<C: outbox_core::Category>(
        &self,
        kind: Kind,
        delivery: &Delivery<C>,
        seq: i64,
    ) -> Result<(), std::io::Error> {
        let start = now_ns();
        let pause = {
            let mut rng = self
                .rng
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match self.stall {
                Some((every, stall)) if rng.random_ratio(1, every) => Some(stall),
                _ => rng
                    .random_ratio(1, 10)
                    .then(|| Duration::from_micros(rng.random_range(0..5_000))),
            }
        };
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let record = Record {
            kind,
            worker: self.worker,
            shard: i64::try_from(delivery.shard_identifier()).unwrap_or(-1),
            object: i64::try_from(delivery.object_identifier).unwrap_or(-1),
            seq,
            message_id: delivery.message_id.0,
            token: delivery.fencing_token,
            attempt: delivery.attempt,
            start,
            end: now_ns(),
        };
        (&self.file).write_all(record.line().as_bytes())
    }
}

/// The child processes of one kind in a run (relays, consumers), and the ones killed. Each
/// has a number of its own (its log is `<what>-<number>.log`) and a slot: the lowest not
/// taken by a running one, so that a process started after a kill takes the place (and the
/// name, where its arguments give one) of the one killed.
pub(crate) struct Processes {
    exe: PathBuf,
    what: &'static str,
    logs: PathBuf,
    /// The arguments of process `number` in slot `slot`.
    args: Box<dyn Fn(u32, u32) -> Vec<std::ffi::OsString> + Send>,
    /// The running ones: their number, slot and process.
    running: Vec<(u32, u32, Child)>,
    next: u32,
    /// Processes that exited on their own, with the end of their log.
    crashes: Vec<String>,
}

impl Processes {
    /// Processes of this binary, `what` (`"relay"`) in messages, logging into `logs`, each
    /// started with `args(number, slot)`.
    pub(crate) fn new(
        what: &'static str,
        logs: PathBuf,
        args: impl Fn(u32, u32) -> Vec<std::ffi::OsString> + Send + 'static,
    ) -> Result<Self, String> {
        Ok(Self {
            exe: std::env::current_exe()
                .map_err(|error| format!("finding this binary: {error}"))?,
            what,
            logs,
            args: Box::new(args),
            running: Vec::new(),
            next: 0,
            crashes: Vec::new(),
        })
    }

    fn log(&self, number: u32) -> PathBuf {
        self.logs.join(format!("{}-{number}.log", self.what))
    }

    /// Starts one more.
    pub(crate) fn spawn(&mut self) -> Result<(), String> {
        let number = self.next;
        self.next += 1;
        let slot = (0..)
            .find(|slot| self.running.iter().all(|(_, taken, _)| taken != slot))
            .unwrap_or_default();
        let log = File::create(self.log(number))
            .map_err(|error| format!("cannot create a {} log: {error}", self.what))?;
        let err = log
            .try_clone()
            .map_err(|error| format!("cannot create a {} log: {error}", self.what))?;
        let child = Command::new(&self.exe)
            .args((self.args)(number, slot))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|error| format!("cannot start a {}: {error}", self.what))?;
        self.running.push((number, slot, child));
        Ok(())
    }

    /// Kills a random one with SIGKILL; returns when (nanoseconds since the epoch).
    pub(crate) fn kill_one(&mut self, rng: &mut StdRng) -> Result<u64, String> {
        if self.running.is_empty() {
            return Err(format!("no {} to kill", self.what));
        }
        let (number, _, mut child) = self.running.remove(rng.random_range(0..self.running.len()));
        let at = now_ns();
        child
            .kill()
            .map_err(|error| format!("cannot kill {} {number}: {error}", self.what))?;
        child
            .wait()
            .map_err(|error| format!("cannot reap {} {number}: {error}", self.what))?;
        eprintln!(
            "chaos:   killed {} {number} (pid {})",
            self.what,
            child.id()
        );
        Ok(at)
    }

    /// Replaces those that exited on their own (each is a crash to report).
    pub(crate) fn respawn_crashed(&mut self) -> Result<(), String> {
        let mut index = 0;
        while index < self.running.len() {
            let (number, _, child) = &mut self.running[index];
            let number = *number;
            match child.try_wait() {
                Ok(None) => index += 1,
                Ok(Some(status)) => {
                    self.running.remove(index);
                    self.crash(number, &status.to_string());
                    self.spawn()?;
                }
                Err(error) => {
                    return Err(format!("cannot check {} {number}: {error}", self.what));
                }
            }
        }
        Ok(())
    }

    /// Every warning (and error) the outbox crates logged in these processes, in the order
    /// of their logs.
    pub(crate) fn warnings(&self) -> Vec<String> {
        (0..self.next)
            .flat_map(|number| {
                std::fs::read_to_string(self.log(number))
                    .unwrap_or_default()
                    .lines()
                    // The outbox's own, by their target: sqlx also logs the server's notice
                    // on each connection it closes (target `sqlx::postgres::notice`) and its
                    // slow statements (whose text names the outbox's tables), not ours to
                    // count.
                    .filter(|line| {
                        warning_target(line).is_some_and(|target| target.starts_with("outbox_"))
                    })
                    .map(|line| format!("{} {number}: {line}", self.what))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn crash(&mut self, number: u32, status: &str) {
        let log = std::fs::read_to_string(self.log(number)).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        eprintln!(
            "chaos:   {} {number} exited on its own ({status})",
            self.what
        );
        self.crashes.push(format!(
            "{} {number} exited ({status}): {}",
            self.what,
            tail.join(" | ")
        ));
    }

    /// Asks every one to stop (SIGTERM) and waits up to `grace` for them; those still
    /// running are killed. Returns the crashes: those that exited on their own during the
    /// run, failed to stop cleanly, or had to be killed.
    pub(crate) async fn shutdown(&mut self, grace: Duration) -> Result<Vec<String>, String> {
        for (_, _, child) in &self.running {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        let until = Instant::now() + grace;
        while let Some((number, _, mut child)) = self.running.pop() {
            loop {
                match child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => {
                        self.crash(number, &format!("{status} after SIGTERM"));
                        break;
                    }
                    Ok(None) if Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Ok(None) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        self.crash(number, "still running after SIGTERM; killed");
                        break;
                    }
                    Err(error) => {
                        return Err(format!("cannot wait for {} {number}: {error}", self.what));
                    }
                }
            }
        }
        Ok(std::mem::take(&mut self.crashes))
    }
}

impl Drop for Processes {
    /// No child outlives the run, whatever happened.
    fn drop(&mut self) {
        for (_, _, child) in &mut self.running {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The relay processes of a run: this binary's `chaos-relay`, recording into `records`.
pub(crate) fn relays(
    backend: Backend,
    database: &str,
    records: PathBuf,
    lease: Duration,
    stall_every: u32,
    seed: u64,
) -> Result<Processes, String> {
    let backend = match backend {
        Backend::Postgres => "postgres",
        Backend::Sqlite => "sqlite",
        Backend::Mariadb => "mariadb",
    };
    let database = database.to_owned();
    let logs = records.clone();
    Processes::new("relay", logs, move |worker, _| {
        let mut args: Vec<std::ffi::OsString> = vec!["chaos-relay".into()];
        args.extend(
            [
                "--backend",
                backend,
                "--database",
                &database,
                "--worker",
                &worker.to_string(),
                "--lease-ms",
                &lease.as_millis().to_string(),
                "--seed",
                &(seed ^ u64::from(worker)).to_string(),
                "--stall-every",
                &stall_every.to_string(),
                "--records",
            ]
            .map(Into::into),
        );
        args.push(records.clone().into());
        args
    })
}

/// The target of a warning or an error the relay logged (`outbox_core::relay::shard`), or
/// `None` for any other line: after the level and the spans (which hold spaces, braces or
/// dots), the first part that is a module path.
fn warning_target(line: &str) -> Option<&str> {
    let (_, rest) = line
        .split_once(" WARN ")
        .or_else(|| line.split_once(" ERROR "))?;
    rest.split(": ").find(|part| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    })
}

#[cfg(test)]
mod tests {
    use super::warning_target;

    #[test]
    fn a_warning_is_the_outboxs_by_its_target_not_its_text() {
        let ours = "2026-11-28T13:15:30.518888Z  WARN outbox.drain_shard{scope=1 shard=101 \
                    destination=\"\"}: outbox_core::relay::shard: lease lost; shard=1";
        assert_eq!(warning_target(ours), Some("outbox_core::relay::shard"));
        let unspanned = "2026-11-28T13:20:23.064710Z  WARN outbox_core::relay::run: database \
                         unavailable (looking for due shards)";
        assert_eq!(warning_target(unspanned), Some("outbox_core::relay::run"));
        let sqlx = "2026-11-28T13:23:00.006678Z  WARN sqlx::query: slow statement: execution \
                    time exceeded alert threshold summary=\"INSERT INTO outbox_relays (worker, …\"";
        assert_eq!(warning_target(sqlx), Some("sqlx::query"));
        let lapse = "2026-12-02T08:42:30.912397Z ERROR outbox.drain_shard{scope=1 shard=177 \
                     destination=\"\"}: outbox_core::relay::inner: a lease of this relay lapsed \
                     while its handler ran";
        assert_eq!(warning_target(lapse), Some("outbox_core::relay::inner"));
        assert_eq!(
            warning_target("2026-11-28T13:23:00Z  INFO outbox_core: up"),
            None
        );
    }
}
