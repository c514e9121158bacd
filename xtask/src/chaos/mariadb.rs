//! A private MariaDB server in a temporary directory (`mariadb-install-db`, then `mariadbd`
//! as our child), so that killing and restarting the server mid-drain never touches the
//! shared one. Killed and deleted when dropped, also on failure.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::cluster::{free_port, is_root, run};

/// The database the run uses on it.
const DATABASE: &str = "chaos";

/// A running MariaDB server of our own, on a free port of 127.0.0.1.
pub(crate) struct MariaDb {
    /// The temporary directory: the data directory, the socket and the server log.
    dir: tempfile::TempDir,
    /// The port it listens on.
    port: u16,
    /// The server process (none between a kill and the next start).
    server: Mutex<Option<Child>>,
}

impl MariaDb {
    /// Creates the data directory and starts the server, with the `chaos` database.
    ///
    /// `innodb_flush_log_at_trx_commit = 2`: a commit writes its redo log to the operating
    /// system before it is acknowledged (only the flush to the disk waits for the next
    /// second), so a killed server, whose machine keeps running, loses no transaction that
    /// a writer or a relay saw committed, exactly as with the setting's default of 1.
    pub(crate) fn start() -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("outbox-chaos-mariadb-")
            .tempdir()
            .map_err(|error| format!("cannot create a temporary directory: {error}"))?;
        let server = Self {
            port: free_port()?,
            dir,
            server: Mutex::new(None),
        };
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", server.data().display()))
            .arg("--skip-test-db")
            .stdin(Stdio::null());
        if is_root() {
            install.arg("--user=root");
        }
        run(&mut install).map_err(|error| {
            format!(
                "{error}\nthe chaos run starts a private MariaDB server of its own and needs \
                 mariadb-install-db and mariadbd (Debian's mariadb-server)"
            )
        })?;
        server.launch()?;
        run(Command::new("mariadb")
            .args(server.client_args())
            .args(["-e", &format!("CREATE DATABASE {DATABASE}")]))?;
        Ok(server)
    }

    /// The URL of the run's database.
    pub(crate) fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// Restarts the server: `immediate` kills it (SIGKILL, crash recovery at the start),
    /// else a normal shutdown (SIGTERM: every connection closed, the buffer pool written
    /// out). Returns once it answers again, with how long it was away.
    pub(crate) fn restart(&self, immediate: bool) -> Result<Duration, String> {
        let started = Instant::now();
        self.stop(immediate)?;
        self.launch()?;
        Ok(started.elapsed())
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The `mariadb` client's arguments that reach the server as root.
    fn client_args(&self) -> Vec<String> {
        vec![
            "--no-defaults".into(),
            "-h127.0.0.1".into(),
            format!("-P{}", self.port),
            "-uroot".into(),
        ]
    }

    /// Starts `mariadbd` and waits until it answers: a blocking wait, as `pg_ctl start -w`'s
    /// (the run restarts servers on a blocking thread).
    #[allow(clippy::disallowed_methods)]
    fn launch(&self) -> Result<(), String> {
        let dir = self.dir.path();
        let mut command = Command::new("mariadbd");
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.data().display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", dir.join("mariadb.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
            .arg(format!("--log-error={}", self.log().display()))
            .args([
                "--skip-log-bin",
                "--max-connections=300",
                "--innodb-buffer-pool-size=128M",
                "--innodb-flush-log-at-trx-commit=2",
                // Anyone connects as anyone: PostgreSQL's trust authentication.
                "--skip-grant-tables",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if is_root() {
            command.arg("--user=root");
        }
        let child = command
            .spawn()
            .map_err(|error| format!("cannot start mariadbd: {error}"))?;
        *self.server.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ping = Command::new("mariadb-admin")
                .args(self.client_args())
                .args(["--connect-timeout=2", "ping"])
                .stdin(Stdio::null())
                .output();
            if ping.is_ok_and(|output| output.status.success()) {
                return Ok(());
            }
            let exited = self
                .server
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                return Err(format!(
                    "the private MariaDB server did not start ({})\nserver log (last lines):\n{}",
                    exited.map_or("no answer in 60 s".to_owned(), |status| status.to_string()),
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the server: SIGKILL when `immediate`, else SIGTERM, and waits for its exit.
    fn stop(&self, immediate: bool) -> Result<(), String> {
        let Some(mut child) = self.server.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Ok(());
        };
        let signal = if immediate { "-KILL" } else { "-TERM" };
        run(Command::new("kill").args([signal, &child.id().to_string()]))?;
        child
            .wait()
            .map(drop)
            .map_err(|error| format!("waiting for mariadbd: {error}"))
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        let mut tail: Vec<&str> = log.lines().rev().take(10).collect();
        tail.reverse();
        tail.join("\n")
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        let _ = self.stop(true);
    }
}
