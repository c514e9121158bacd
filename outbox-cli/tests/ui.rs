//! `outbox ui`: the console served by the command, on a database given with a password. It
//! serves the pages, refuses actions without the token, acts with it, stops on SIGTERM, and
//! never shows the password: not in what it prints, not in a page.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use sqlx::Connection;

const PASSWORD: &str = "hunter2";
const TOKEN: &str = "a-console-token-for-the-ui-test";

/// A fresh PostgreSQL database, dropped at the end.
struct Database {
    name: String,
}

impl Database {
    async fn create() -> Self {
        let name = format!("outbox_test_ui_{}", std::process::id());
        let mut admin = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/postgres")
            .await
            .expect("the local PostgreSQL");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name}"
        )))
        .execute(&mut admin)
        .await
        .expect("drop");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .expect("create");
        Self { name }
    }

    /// Its URL, with a password the local server (which trusts its clients) ignores.
    fn url(&self) -> String {
        format!(
            "postgres://postgres:{PASSWORD}@127.0.0.1:5432/{}",
            self.name
        )
    }

    async fn drop(self) {
        let mut admin = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/postgres")
            .await
            .expect("the local PostgreSQL");
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut admin)
        .await;
    }
}

fn outbox(url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_outbox"));
    command
        .env("DATABASE_URL", url)
        .env_remove(outbox_cli::TOKEN_VARIABLE);
    command
}

/// A running console: the process, and the address its first line said it serves.
struct Console {
    child: Child,
    address: String,
    first_line: String,
}

impl Console {
    fn start(mut command: Command) -> Self {
        let mut child = command
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("outbox ui");
        let mut first_line = String::new();
        BufReader::new(child.stdout.as_mut().expect("its output"))
            .read_line(&mut first_line)
            .expect("its first line");
        let address = first_line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("an address in {first_line:?}"))
            .to_owned();
        Self {
            child,
            address,
            first_line,
        }
    }

    /// Sends `request` (without its Host and Connection headers), returns the response.
    fn http(&self, method_and_path: &str, headers: &str, body: &str) -> String {
        let mut stream = TcpStream::connect(&self.address).expect("the console listens");
        let request = format!(
            "{method_and_path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{headers}\
             Content-Length: {}\r\n\r\n{body}",
            self.address,
            body.len()
        );
        stream.write_all(request.as_bytes()).expect("sent");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("a response");
        response
    }

    /// Stops it with SIGTERM; returns whether it exited cleanly, and what it printed.
    fn stop(self) -> (bool, String) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let output = self.child.wait_with_output().expect("it stops");
        let printed = format!(
            "{}{}{}",
            self.first_line,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), printed)
    }
}

#[tokio::test]
async fn the_console_serves_acts_with_the_token_and_shows_no_password() {
    let database = Database::create().await;
    let url = database.url();
    let migrated = outbox(&url).arg("migrate").output().expect("migrate");
    assert!(migrated.status.success(), "{migrated:?}");

    let console = Console::start({
        let mut command = outbox(&url);
        command.arg("ui");
        command
    });
    assert!(
        console.first_line.contains("read-only"),
        "{}",
        console.first_line
    );
    for path in ["/", "/shards", "/dead-letters", "/pauses", "/backfills"] {
        let response = console.http(&format!("GET {path}"), "", "");
        assert!(response.starts_with("HTTP/1.1 200"), "{path}: {response}");
        assert!(
            !response.contains(PASSWORD) && !response.contains("postgres://"),
            "{path}"
        );
    }
    let refused = console.http(
        "POST /pauses",
        &format!(
            "Authorization: Bearer {TOKEN}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        ),
        "kind=scope&what=1",
    );
    assert!(refused.starts_with("HTTP/1.1 403"), "read-only: {refused}");
    let (clean, printed) = console.stop();
    assert!(clean, "stopped cleanly on SIGTERM: {printed}");
    assert!(!printed.contains(PASSWORD), "{printed}");

    let console = Console::start({
        let mut command = outbox(&url);
        command.env(outbox_cli::TOKEN_VARIABLE, TOKEN).args([
            "ui",
            "--actions",
            "--secure-cookies",
        ]);
        command
    });
    assert!(
        console.first_line.contains("actions enabled"),
        "{}",
        console.first_line
    );
    let paused = console.http(
        "POST /pauses",
        &format!(
            "Authorization: Bearer {TOKEN}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        ),
        "kind=scope&what=1&reason=maintenance",
    );
    assert!(paused.starts_with("HTTP/1.1 303"), "{paused}");
    let login = console.http(
        "POST /login",
        "Content-Type: application/x-www-form-urlencoded\r\n",
        &format!("operator=ada&token={TOKEN}"),
    );
    assert!(login.starts_with("HTTP/1.1 303"), "{login}");
    assert!(
        login.contains("HttpOnly; SameSite=Strict; Secure"),
        "{login}"
    );
    let wrong = console.http(
        "POST /pauses/remove",
        "Authorization: Bearer not-the-token\r\nContent-Type: application/x-www-form-urlencoded\r\n",
        "kind=scope&what=1",
    );
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let (clean, printed) = console.stop();
    assert!(
        clean && !printed.contains(PASSWORD) && !printed.contains(TOKEN),
        "{printed}"
    );
    let pauses = outbox(&url)
        .args(["--json", "pauses"])
        .output()
        .expect("pauses");
    let pauses = String::from_utf8_lossy(&pauses.stdout);
    assert!(
        pauses.contains("maintenance"),
        "the pause the console made: {pauses}"
    );

    database.drop().await;
}

#[test]
fn actions_need_a_long_token_in_the_environment() {
    let url = "postgres://postgres:hunter2@127.0.0.1:5432/postgres";
    let missing = outbox(url).args(["ui", "--actions"]).output().expect("run");
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(said.contains(outbox_cli::TOKEN_VARIABLE), "{said}");
    let short = outbox(url)
        .env(outbox_cli::TOKEN_VARIABLE, "short")
        .args(["ui", "--actions"])
        .output()
        .expect("run");
    assert_eq!(short.status.code(), Some(2), "{short:?}");
    let said = String::from_utf8_lossy(&short.stderr);
    assert!(said.contains("at least 16"), "{said}");
    assert!(
        !said.contains(PASSWORD) && !said.contains("short"),
        "{said}"
    );
}
