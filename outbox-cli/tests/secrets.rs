//! No password reaches what the `outbox` command prints (S27): every form of password sqlx
//! accepts, through every way the command can fail or explain itself, on stdout and stderr.

use std::process::Output;

use assert_cmd::Command;
use outbox_testkit::secrets::{assert_hidden, urls};

/// A PostgreSQL URL to `place` (`host:port/database`) with the password in each form
/// ([`urls`]), and `query` as its parameters.
fn forms(place: &str, query: &str) -> Vec<String> {
    urls("postgres", "postgres", place, "", query)
}

/// A MariaDB URL to `place` as `user` with the password in each form ([`urls`]).
fn mariadb_forms(place: &str, user: &str) -> Vec<String> {
    urls("mysql", user, place, "", "")
}

fn outbox() -> Command {
    let mut command = Command::cargo_bin("outbox").expect("the outbox binary");
    command.env_remove("DATABASE_URL");
    command
}

#[track_caller]
fn assert_no_secret(what: &str, output: &Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_hidden(what, &format!("stdout: {stdout}\nstderr: {stderr}"));
}

/// Runs `outbox ARGS` with the URL in `DATABASE_URL`, then as `--database-url` before and
/// after the command; checks nothing it prints holds the password, and that it fails with
/// `code` (or succeeds, for 0).
#[track_caller]
fn each_way(url: &str, args: &[&str], code: i32) {
    let runs = [
        (
            "DATABASE_URL",
            outbox().env("DATABASE_URL", url).args(args).output(),
        ),
        (
            "--database-url first",
            outbox().arg("--database-url").arg(url).args(args).output(),
        ),
        (
            "--database-url=… last",
            outbox()
                .args(args)
                .arg(format!("--database-url={url}"))
                .output(),
        ),
    ];
    for (how, output) in runs {
        let output = output.expect("run outbox");
        let what = format!("outbox {args:?} with {url} as {how}");
        assert_no_secret(&what, &output);
        assert_eq!(
            output.status.code(),
            Some(code),
            "{what}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn url_errors_never_show_the_password() {
    for (host, query) in [
        ("127.0.0.1:notaport/postgres", ""),
        ("127.0.0.1:5432/postgres", "sslmode=bogus"),
        ("127.0.0.1:5432/postgres", "statement-cache-capacity=many"),
    ] {
        for url in forms(host, query) {
            each_way(&url, &["status"], 1);
            each_way(&url, &["migrate"], 1);
        }
    }
    for url in [
        "postgress://app:hunter2@db/app",
        "mysql://root:hunter2@db/app",
        // No `//`: the driver would read it all as the database's name, which the server's
        // error quotes.
        "mysql:root:hunter2@127.0.0.1:3306/app",
        "mariadb:root:hun%40ter2@127.0.0.1/app",
        "postgres:postgres:hunter2@127.0.0.1:5432/postgres",
        "postgresql:/postgres:hunt%65r2@127.0.0.1/postgres",
        "mysql://root@db/app?password=hunter2",
        "mariadb://root@db/app?pass%77ord=hunter2",
    ] {
        each_way(url, &["status"], 1);
    }
    let mut mariadb = mariadb_forms("127.0.0.1:notaport/app", "root");
    mariadb.extend(urls(
        "mysql",
        "root",
        "127.0.0.1:3306",
        "/app",
        "ssl-mode=bogus",
    ));
    for url in mariadb {
        each_way(&url, &["status"], 1);
        each_way(&url, &["migrate"], 1);
    }
}

#[test]
fn connection_failures_never_show_the_password() {
    // Nothing listens on port 1; the server on 5432 has no such database.
    for host in [
        "127.0.0.1:1/postgres",
        "127.0.0.1:5432/outbox_no_such_database",
    ] {
        for url in forms(host, "") {
            each_way(&url, &["status"], 1);
        }
    }
    // Nothing listens on port 1; MariaDB's root has no password, so one is refused.
    for host in ["127.0.0.1:1/app", "127.0.0.1:3306/outbox_no_such_database"] {
        for url in mariadb_forms(host, "root") {
            each_way(&url, &["status"], 1);
        }
    }
}

#[test]
fn a_missing_sqlite_file_never_shows_the_password() {
    let dir = tempfile::tempdir().expect("a directory");
    let url = format!(
        "sqlite://{}?password=hunter2",
        dir.path().join("none.db").display()
    );
    each_way(&url, &["status"], 1);
}

#[test]
fn usage_errors_and_help_never_show_the_password() {
    let url = "postgres://postgres:hunter2@127.0.0.1:1/postgres";
    let cases: [(&str, &[&str], i32); 6] = [
        ("--help", &["--help"], 0),
        ("a command's --help", &["status", "--help"], 0),
        ("no command", &[], 2),
        ("a stray argument", &["status", url], 2),
        (
            "a mistyped flag",
            &["status", &format!("--database-ur={url}")],
            2,
        ),
        ("a mistyped command", &["statsu", url], 2),
    ];
    for (what, args, code) in cases {
        let output = outbox()
            .env("DATABASE_URL", url)
            .args(args)
            .output()
            .expect("run outbox");
        assert_no_secret(what, &output);
        assert_eq!(output.status.code(), Some(code), "{what}");
    }
    let typo = outbox()
        .args(["--database-ur", url, "status"])
        .output()
        .expect("run outbox");
    assert_no_secret("a mistyped --database-url", &typo);
    assert!(
        String::from_utf8_lossy(&typo.stderr).contains("--database-url"),
        "clap suggests the flag meant: {}",
        String::from_utf8_lossy(&typo.stderr)
    );
}

#[test]
fn a_command_that_works_never_shows_the_password() {
    // The local server trusts its clients: the password is sent, and ignored.
    for url in forms("127.0.0.1:5432/postgres", "") {
        for args in [&["status"][..], &["--json", "status"], &["pauses"]] {
            let output = outbox()
                .env("DATABASE_URL", &url)
                .args(args)
                .output()
                .expect("run outbox");
            assert_no_secret(&format!("outbox {args:?}"), &output);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_that_works_on_mariadb_never_shows_the_password() {
    use outbox_testkit::mysql::MySqlTestDatabase;
    use sqlx::AssertSqlSafe;

    let database = MySqlTestDatabase::migrated().await;
    // A user of the test's own, whose password is the secret, with rights on its database only.
    let user = format!("secrets_{}", std::process::id());
    for statement in [
        format!("CREATE USER IF NOT EXISTS '{user}'@'%' IDENTIFIED BY 'hun@ter2'"),
        format!("GRANT ALL ON `{}`.* TO '{user}'@'%'", database.name()),
    ] {
        sqlx::raw_sql(AssertSqlSafe(statement))
            .execute(database.pool())
            .await
            .expect("a user with a password");
    }
    let host = format!("127.0.0.1:3306/{}", database.name());
    let url = format!("mysql://{user}:hun%40ter2@{host}");
    for args in [&["status"][..], &["--json", "status"], &["pauses"]] {
        let output = outbox()
            .env("DATABASE_URL", &url)
            .args(args)
            .output()
            .expect("run outbox");
        assert_no_secret(&format!("outbox {args:?}"), &output);
        assert!(
            output.status.success(),
            "outbox {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP USER '{user}'@'%'")))
        .execute(database.pool())
        .await;
}
