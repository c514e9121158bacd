//! The service's command line: its help and its start-up errors show no password (S27), and
//! `service outbox …` is the `outbox` command knowing the service's names.

use std::process::{Command, Output};

use outbox::testkit::postgres::PgTestDatabase;

fn service(database_url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_service"))
        .env("DATABASE_URL", database_url)
        .args(args)
        .output()
        .expect("run the service")
}

fn printed(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn help_and_start_up_errors_show_no_password() {
    for url in [
        "postgres://postgres:hunter2@127.0.0.1:5432/shop",
        "postgres://postgres@127.0.0.1:5432/shop?password=hunter2",
    ] {
        for args in [&["--help"][..], &["outbox", "--help"]] {
            let help = service(url, args);
            assert_eq!(help.status.code(), Some(0), "{}", printed(&help));
            assert!(
                printed(&help).contains("DATABASE_URL"),
                "{}",
                printed(&help)
            );
            assert!(!printed(&help).contains("hunter2"), "{}", printed(&help));
        }
    }
    for url in [
        "postgres://postgres:hunter2@127.0.0.1:notaport/shop",
        "postgres://postgres@127.0.0.1:notaport/shop?password=hunter2",
        "postgres://postgres:hunter2@127.0.0.1:5432/shop?sslmode=bogus",
        "postgres://postgres:hunter2@127.0.0.1:1/shop",
    ] {
        let failed = service(url, &["--listen", "127.0.0.1:0"]);
        let shown = printed(&failed);
        assert_eq!(failed.status.code(), Some(1), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("ERROR"), "one error line: {shown}");
        assert!(!shown.contains("Error {"), "not a Debug dump: {shown}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn its_outbox_command_knows_its_names() {
    let database = PgTestDatabase::migrated().await;
    let url = database.url();
    let paused = service(&url, &["outbox", "pause", "--category", "order_placed"]);
    assert_eq!(paused.status.code(), Some(0), "{}", printed(&paused));
    assert!(
        printed(&paused).contains("paused category order_placed"),
        "{}",
        printed(&paused)
    );
    let pauses = service(&url, &["outbox", "--json", "pauses"]);
    assert!(
        printed(&pauses).contains("category order_placed"),
        "{}",
        printed(&pauses)
    );
    let resumed = service(&url, &["outbox", "resume", "--category", "order_placed"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", printed(&resumed));
}
