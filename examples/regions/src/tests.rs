//! The story on both backends, with exactly the deliveries it must make.

use sqlx::{Connection, PgConnection};

use crate::backend::Backend;
use crate::story::{self, Outcome};

/// Every handler call, in order: the region relay's, then the control relay's.
const DELIVERED: [&str; 11] = [
    // Region, shard (organization 1): three renames coalesced into the newest name...
    r#"organization 1 is now called "Acme Corporation""#,
    // ... three audit events, each delivered, in order...
    r#"audit event 1 in organization 1: user 7 renamed the organization to "Acme Inc""#,
    r#"audit event 2 in organization 1: user 7 renamed the organization to "Acme Corp""#,
    r#"audit event 3 in organization 1: user 7 renamed the organization to "Acme Corporation""#,
    // ... project 10 created and renamed: one replication of its newest state; project 11
    // deleted: its deletion.
    r#"project 10 "website v2" of organization 1 copied to control"#,
    r#"project 11 "legacy" of organization 1 is gone: deleted from control"#,
    // Control, shard (organization 1, eu), then (organization 1, us): each region gets the
    // new member and the removal...
    "member 100 (user 7, owner) of organization 1 to region eu",
    "member 101 (user 8) of organization 1 is gone: removed from region eu",
    "member 100 (user 7, owner) of organization 1 to region us",
    "member 101 (user 8) of organization 1 is gone: removed from region us",
    // ... then shard (user 7): two email changes coalesced into the newest.
    r#"user 7's email is now "ada.lovelace@acme.example""#,
];

fn check(outcome: &Outcome) {
    assert_eq!(outcome.delivered, DELIVERED);
    assert_eq!(
        outcome.control_projects,
        [(10, 1, "website v2".to_owned())],
        "project 10 copied, project 11's copy deleted"
    );
}

#[tokio::test]
async fn on_sqlite_the_relays_deliver_exactly_the_expected_calls() {
    let backend = Backend::sqlite().expect("a temporary directory");
    let outcome = story::run(backend).await.expect("the story runs on SQLite");
    check(&outcome);
}

#[tokio::test]
async fn on_postgres_the_relays_deliver_exactly_the_expected_calls_and_the_databases_are_dropped() {
    let url = outbox::testkit::postgres::server_url();
    let backend = Backend::postgres(&url).await.unwrap_or_else(|error| {
        panic!(
            "this test needs a PostgreSQL server, and none answered at DATABASE_URL or the \
             local default: {error}\nSet DATABASE_URL=postgres://user@host:port/database, or \
             start the local server."
        )
    });
    let prefix = backend
        .database_prefix()
        .expect("a PostgreSQL backend")
        .to_owned();
    let outcome = story::run(backend)
        .await
        .expect("the story runs on PostgreSQL");
    check(&outcome);

    let mut server = PgConnection::connect(&url).await.expect("connect");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname LIKE $1")
        .bind(format!("{prefix}%"))
        .fetch_one(&mut server)
        .await
        .expect("list databases");
    assert_eq!(left, 0, "the example drops the databases it created");
}
