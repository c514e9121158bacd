//! A private PostgreSQL cluster in a temporary directory, so that restarting the server
//! mid-drain never touches a shared one. Stopped and deleted when dropped, also on failure.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A running PostgreSQL server of our own, on a free port of 127.0.0.1.
pub(crate) struct Cluster {
    /// The temporary directory: the data directory, the socket and the server log.
    dir: tempfile::TempDir,
    /// Where `initdb`, `pg_ctl` and `postgres` are.
    bin: PathBuf,
    /// Whether to run the server's commands as the `postgres` user (we are root, which
    /// PostgreSQL refuses to run as).
    as_postgres: bool,
    /// The port it listens on.
    port: u16,
    /// Its log is kept when it is dropped (`BENCH_EXPLAIN` set it to log slow plans).
    keep_log: bool,
}

impl Cluster {
    /// Creates the chaos run's cluster (`initdb`, trust authentication, no fsync: a restart,
    /// even `-m immediate`, keeps what the operating system holds) and starts it.
    ///
    /// `synchronous_commit` stays on: with it off, a commit is acknowledged before its WAL
    /// leaves the server's memory, and an immediate restart loses transactions that writers
    /// and relays saw committed (a relay then delivers a row that, after the restart, was
    /// never written).
    pub(crate) fn start() -> Result<Self, String> {
        Self::start_with("fsync = off\nfull_page_writes = off\n")
    }

    /// Creates a cluster with `settings` (lines of `postgresql.conf`) after this module's own
    /// (port, sockets, connections, memory), and starts it.
    ///
    /// With `BENCH_EXPLAIN=<ms>` in the environment, the server logs the plan of every
    /// statement that ran that long or longer (`auto_explain`, with its buffers), and its log
    /// is copied to `target/private-pg-<port>.log` when the cluster is dropped: what a held
    /// horizon made slow, read after the run.
    pub(crate) fn start_with(settings: &str) -> Result<Self, String> {
        let bin = binaries()?;
        let dir = tempfile::Builder::new()
            .prefix("outbox-pg-")
            .tempdir()
            .map_err(|error| format!("cannot create a temporary directory: {error}"))?;
        let as_postgres = is_root();
        if as_postgres {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path()))?;
        }
        let port = free_port()?;
        let explain = explain_settings(settings);
        let cluster = Self {
            dir,
            bin,
            as_postgres,
            port,
            keep_log: explain.is_some(),
        };
        let data = cluster.data();
        let mut initdb: Vec<&OsStr> = [
            "--auth=trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "-D",
        ]
        .map(OsStr::new)
        .to_vec();
        initdb.push(data.as_os_str());
        cluster.run_tool("initdb", &initdb)?;
        let settings = format!(
            "\n# outbox: a private, disposable server\n\
             port = {port}\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\n\
             max_connections = 200\n\
             shared_buffers = 128MB\n\
             log_min_messages = warning\n\
             {settings}{}",
            cluster.dir.path().display(),
            explain.unwrap_or_default(),
        );
        let config = cluster.data().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&config)
            .map_err(|error| format!("cannot read {}: {error}", config.display()))?;
        text.push_str(&settings);
        std::fs::write(&config, text)
            .map_err(|error| format!("cannot write {}: {error}", config.display()))?;
        cluster.pg_ctl(&["start", "-w", "-t", "60"])?;
        Ok(cluster)
    }

    /// The URL of its `postgres` database.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Restarts the server: `immediate` kills it as a crash would (recovery at start), else
    /// a fast shutdown (every connection closed). Returns once it accepts connections again,
    /// with how long it was away.
    pub(crate) fn restart(&self, immediate: bool) -> Result<Duration, String> {
        let started = Instant::now();
        let mode = if immediate { "immediate" } else { "fast" };
        self.pg_ctl(&["restart", "-w", "-t", "60", "-m", mode])?;
        Ok(started.elapsed())
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let (data, log) = (self.data(), self.dir.path().join("server.log"));
        let mut all: Vec<&OsStr> = vec![
            OsStr::new("-D"),
            data.as_os_str(),
            OsStr::new("-l"),
            log.as_os_str(),
        ];
        all.extend(args.iter().map(OsStr::new));
        self.run_tool("pg_ctl", &all)
    }

    fn run_tool(&self, tool: &str, args: &[&OsStr]) -> Result<(), String> {
        let program = self.bin.join(tool);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        command.args(args);
        // pg_ctl's server inherits our standard streams: give it none, so that it cannot
        // hold the pipes of whoever runs us open.
        command.stdin(std::process::Stdio::null());
        run(&mut command).map_err(|error| {
            let log =
                std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(10).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("{error}\nserver log (last lines):\n{}", tail.join("\n"))
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Stopped whether or not it runs (a failed restart may have left a server up).
        let _ = self.pg_ctl(&["stop", "-w", "-t", "30", "-m", "immediate"]);
        if self.keep_log {
            // The workspace's `target/`, wherever the command was run from.
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .unwrap_or(Path::new("."));
            let kept = workspace.join(format!("target/private-pg-{}.log", self.port));
            match std::fs::copy(self.dir.path().join("server.log"), &kept) {
                Ok(_) => eprintln!("  the private server's log: {}", kept.display()),
                Err(error) => eprintln!("  the private server's log was not kept: {error}"),
            }
        }
    }
}

/// The settings `BENCH_EXPLAIN=<ms>` adds after `settings`: `auto_explain` loaded (beside
/// the libraries `settings` loads) and logging the plans of statements of that many
/// milliseconds or more, with their buffers. `None` without it.
fn explain_settings(settings: &str) -> Option<String> {
    let ms: u32 = std::env::var("BENCH_EXPLAIN").ok()?.parse().ok()?;
    let libraries = settings
        .lines()
        .filter_map(|line| line.trim().strip_prefix("shared_preload_libraries"))
        .filter_map(|value| value.split('\'').nth(1))
        .next_back()
        .filter(|libraries| !libraries.is_empty())
        .map_or_else(
            || "auto_explain".to_owned(),
            |libraries| format!("{libraries},auto_explain"),
        );
    Some(format!(
        "\nshared_preload_libraries = '{libraries}'\n\
         auto_explain.log_min_duration = '{ms}ms'\n\
         auto_explain.log_analyze = on\n\
         auto_explain.log_buffers = on\n\
         auto_explain.log_timing = off\n"
    ))
}

/// The newest installed PostgreSQL's `bin` directory (`/usr/lib/postgresql/<version>/bin`).
fn binaries() -> Result<PathBuf, String> {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .map_err(|error| {
            format!(
                "no PostgreSQL installation in {} ({error}): the chaos run starts a private \
                 server of its own and needs initdb and pg_ctl",
                root.display()
            )
        })?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| format!("no initdb under {}/*/bin", root.display()))
}

/// Whether this process runs as root.
pub(super) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// A TCP port of 127.0.0.1 free right now.
pub(super) fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|error| format!("cannot find a free port: {error}"))?;
    listener
        .local_addr()
        .map(|address| address.port())
        .map_err(|error| format!("cannot find a free port: {error}"))
}

/// Runs a command to completion; its output is the error if it fails.
pub(super) fn run(command: &mut Command) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|error| format!("cannot run {command:?}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
