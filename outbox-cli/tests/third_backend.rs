//! A backend the command was never told of: registered by being linked, it answers its own
//! URLs, and every verb works on it through the same operations as on PostgreSQL and SQLite.

use std::sync::LazyLock;

use clap::Parser;
use outbox_core::admin::Catalog;
use outbox_core::admin::{Backend, Database, Open, Opening};
use outbox_core::memory::MemoryStore;
use outbox_core::{Message, outbox_category, outbox_scope};
use serde::{Deserialize, Serialize};

#[outbox_scope(id = 1)]
struct Team;

#[outbox_category(scope = Team, id = 1, no_op)]
#[derive(Serialize, Deserialize)]
struct TeamRenamed {
    name: String,
}

/// The one in-memory outbox every `memory:` URL opens.
static OUTBOX: LazyLock<MemoryStore> = LazyLock::new(MemoryStore::new);

fn open(_url: String, _open: Open) -> Opening {
    Box::pin(async { Ok(Box::new(OUTBOX.clone()) as Box<dyn Database>) })
}

inventory::submit! {
    Backend {
        name: "in-memory",
        schemes: &["memory"],
        open,
        migration_script: || "-- an in-memory outbox has no schema\n".to_owned(),
    }
}

/// Runs the command with `args`, returning what it printed.
async fn outbox(args: &[&str]) -> Result<String, outbox_cli::CliError> {
    let cli = outbox_cli::Cli::parse_from(["outbox"].iter().chain(args));
    let mut out = Vec::new();
    outbox_cli::run(cli, &Catalog::empty(), &mut out).await?;
    Ok(String::from_utf8(out).expect("UTF-8"))
}

#[tokio::test]
async fn a_backend_linked_in_answers_its_urls_for_every_verb() {
    for name in ["Acme", "Acme Corp"] {
        let renamed = TeamRenamed { name: name.into() };
        OUTBOX.write(&Message::new::<TeamRenamed>(7, 7, &renamed).expect("a message"));
    }

    let status = outbox(&["--database-url", "memory:", "--json", "status"])
        .await
        .expect("status");
    let status: serde_json::Value = serde_json::from_str(&status).expect("JSON");
    assert_eq!(status["pending_messages"], 2, "{status}");

    // The scheme is matched in any case, as URLs' are.
    outbox(&["--database-url", "MEMORY:", "pause", "--scope", "1"])
        .await
        .expect("pause");
    let pauses = outbox(&["--database-url", "memory:", "--json", "pauses"])
        .await
        .expect("pauses");
    assert!(pauses.contains("scope 1"), "{pauses}");

    let script = outbox(&["--database-url", "memory:", "migrate", "--print"])
        .await
        .expect("migrate --print");
    assert!(
        script.contains("an in-memory outbox has no schema"),
        "{script}"
    );

    // PostgreSQL and SQLite are not linked into this test: their URLs are refused, naming
    // the schemes there are.
    let refused = outbox(&["--database-url", "postgres://app:secret@db/app", "status"])
        .await
        .expect_err("no PostgreSQL backend here");
    let refused = refused.to_string();
    assert!(refused.contains("`memory:`"), "{refused}");
    assert!(!refused.contains("postgres:`"), "{refused}");
    assert!(!refused.contains("secret"), "{refused}");
}
