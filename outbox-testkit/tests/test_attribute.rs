//! `#[outbox_testkit::test]` and the functions behind it: each test gets a database of its own
//! (a new PostgreSQL database, a temporary SQLite file) with the outbox migrations applied, or
//! an empty one with `migrations = false`, and the database is gone once the test has passed,
//! failed or panicked, on either runtime flavor.
//!
//! The tests of the clean-up define a test with the attribute inside a plain `#[test]` and
//! call it by hand, as the test harness would, then look for its database.

#![cfg(all(feature = "postgres", feature = "sqlite"))]
// The expansion is lint-clean in a strict crate.
#![deny(
    warnings,
    clippy::all,
    clippy::pedantic,
    rust_2018_idioms,
    unused_qualifications
)]
#![allow(clippy::doc_markdown)] // the prose names PostgreSQL and SQLite

use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use outbox_core::Message;
use outbox_testkit::fixtures::{AuditEvent, Note};
use outbox_testkit::postgres::{PgTestDatabase, server_url};
use outbox_testkit::sqlite::SqliteTestDatabase;
use sqlx::{Connection, PgConnection};
use tokio::runtime::{Handle, RuntimeFlavor};

/// Writes an outbox message whose note says `text`, and returns the notes of every message in
/// the database.
async fn write_and_read_pg(db: &PgTestDatabase, text: &str) -> Vec<String> {
    let mut note = Note::new(1);
    text.clone_into(&mut note.text);
    let message = Message::new::<AuditEvent>(1, 1, &note).expect("a message");
    outbox_postgres::write(db.pool(), &message)
        .await
        .expect("write an outbox message");
    sqlx::query_scalar("SELECT payload->>'text' FROM outbox_messages ORDER BY id")
        .fetch_all(db.pool())
        .await
        .expect("read the outbox")
}

/// [`write_and_read_pg`] on SQLite.
async fn write_and_read_sqlite(db: &SqliteTestDatabase, text: &str) -> Vec<String> {
    let mut note = Note::new(1);
    text.clone_into(&mut note.text);
    let message = Message::new::<AuditEvent>(1, 1, &note).expect("a message");
    outbox_sqlite::write(db.pool(), &message)
        .await
        .expect("write an outbox message");
    sqlx::query_scalar("SELECT json_extract(payload, '$.text') FROM outbox_messages ORDER BY id")
        .fetch_all(db.pool())
        .await
        .expect("read the outbox")
}

/// Whether the PostgreSQL server has a database named `name`, asked on a connection of its own.
async fn database_exists(name: &str) -> bool {
    let mut server = PgConnection::connect(&server_url())
        .await
        .expect("connect to the PostgreSQL server");
    let exists = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(&mut server)
        .await
        .expect("look the database up");
    server.close().await.expect("close the connection");
    exists
}

/// [`database_exists`], from outside any runtime (after a test ran on its own).
fn database_exists_now(name: &str) -> bool {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(database_exists(name))
}

fn recorded(slot: &Mutex<Option<String>>) -> String {
    slot.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .expect("the test recorded its database's name")
}

fn record(slot: &Mutex<Option<String>>, name: &str) {
    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(name.to_owned());
}

// A database of the test's own, migrated.

#[outbox_testkit::test]
async fn a_postgres_test_gets_a_new_migrated_database(db: PgTestDatabase) {
    let current: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(db.pool())
        .await
        .expect("ask the pool's database");
    assert_eq!(current, db.name());
    assert!(database_exists(db.name()).await);
    // The outbox tables are there, and hold only what this test writes.
    assert_eq!(write_and_read_pg(&db, "mine").await, ["mine"]);
    assert_eq!(
        Handle::current().runtime_flavor(),
        RuntimeFlavor::MultiThread
    );
}

#[outbox_testkit::test]
async fn postgres_tests_do_not_share_databases_one(db: PgTestDatabase) {
    assert_eq!(write_and_read_pg(&db, "one").await, ["one"]);
}

#[outbox_testkit::test]
async fn postgres_tests_do_not_share_databases_two(db: PgTestDatabase) {
    assert_eq!(write_and_read_pg(&db, "two").await, ["two"]);
}

#[outbox_testkit::test]
async fn a_sqlite_test_gets_a_new_migrated_database(db: SqliteTestDatabase) {
    assert!(db.path().exists());
    assert_eq!(write_and_read_sqlite(&db, "mine").await, ["mine"]);
}

#[outbox_testkit::test]
async fn sqlite_tests_do_not_share_databases_one(db: SqliteTestDatabase) {
    assert_eq!(write_and_read_sqlite(&db, "one").await, ["one"]);
}

#[outbox_testkit::test]
async fn sqlite_tests_do_not_share_databases_two(db: SqliteTestDatabase) {
    assert_eq!(write_and_read_sqlite(&db, "two").await, ["two"]);
}

// Options.

#[outbox_testkit::test(migrations = false)]
async fn an_unmigrated_postgres_database_is_empty(db: PgTestDatabase) {
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_one(db.pool())
    .await
    .expect("count the tables");
    assert_eq!(tables, 0);
    outbox_postgres::migrate(db.pool())
        .await
        .expect("migrate by hand");
    assert_eq!(write_and_read_pg(&db, "later").await, ["later"]);
}

#[outbox_testkit::test(migrations = false, flavor = "current_thread")]
async fn an_unmigrated_sqlite_database_is_empty(db: SqliteTestDatabase) {
    let objects: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master")
        .fetch_one(db.pool())
        .await
        .expect("count the schema's objects");
    assert_eq!(objects, 0);
}

#[outbox_testkit::test(flavor = "current_thread")]
async fn a_test_may_run_on_a_current_thread_runtime(db: PgTestDatabase) {
    assert_eq!(
        Handle::current().runtime_flavor(),
        RuntimeFlavor::CurrentThread
    );
    assert_eq!(write_and_read_pg(&db, "here").await, ["here"]);
}

#[outbox_testkit::test(flavor = "multi_thread", migrations = true)]
async fn a_test_may_return_a_result(db: SqliteTestDatabase) -> Result<(), sqlx::Error> {
    let one: i64 = sqlx::query_scalar("SELECT 1").fetch_one(db.pool()).await?;
    assert_eq!(one, 1);
    Ok(())
}

/// The test's attributes apply to the generated `#[test]`, and a panic reaches the harness
/// with its own message.
#[outbox_testkit::test]
#[should_panic(expected = "the test's own message")]
async fn a_panic_fails_the_test_with_its_message(db: SqliteTestDatabase) {
    let _ = db;
    panic!("the test's own message");
}

// The clean-up.

#[test]
#[allow(unnameable_test_items)] // the test inside is called by hand, below
fn a_passing_postgres_test_drops_its_database() {
    static NAME: Mutex<Option<String>> = Mutex::new(None);

    #[outbox_testkit::test]
    async fn passing(db: PgTestDatabase) {
        record(&NAME, db.name());
        assert!(database_exists(db.name()).await);
    }

    passing();
    assert!(!database_exists_now(&recorded(&NAME)));
}

#[test]
#[allow(unnameable_test_items)] // the test inside is called by hand, below
fn a_postgres_test_returning_an_error_drops_its_database() {
    static NAME: Mutex<Option<String>> = Mutex::new(None);

    #[outbox_testkit::test(flavor = "current_thread")]
    async fn failing(db: PgTestDatabase) -> Result<(), String> {
        record(&NAME, db.name());
        Err("the test fails".to_owned())
    }

    assert_eq!(failing(), Err("the test fails".to_owned()));
    assert!(!database_exists_now(&recorded(&NAME)));
}

/// The hardest case for the clean-up: a current-thread runtime (blocked while the database is
/// dropped, so it cannot drive the pool's connections), a panic, and a task left holding a
/// connection in an open transaction.
#[test]
#[allow(unnameable_test_items)] // the test inside is called by hand, below
fn a_panicking_postgres_test_on_a_current_thread_drops_its_database() {
    static NAME: Mutex<Option<String>> = Mutex::new(None);

    #[outbox_testkit::test(flavor = "current_thread")]
    async fn panicking(db: PgTestDatabase) {
        record(&NAME, db.name());
        let mut tx = db.pool().begin().await.expect("begin");
        sqlx::query("LOCK TABLE outbox_messages")
            .execute(&mut *tx)
            .await
            .expect("lock the outbox");
        tokio::spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
        panic!("the test fails");
    }

    let outcome = panic::catch_unwind(panicking);
    let payload = outcome.expect_err("the test panics");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"the test fails"));
    assert!(!database_exists_now(&recorded(&NAME)));
}

#[test]
#[allow(unnameable_test_items)] // the test inside is called by hand, below
fn a_panicking_postgres_test_on_many_threads_drops_its_database() {
    static NAME: Mutex<Option<String>> = Mutex::new(None);

    #[outbox_testkit::test]
    async fn panicking(db: PgTestDatabase) {
        record(&NAME, db.name());
        let _connection = db.pool().acquire().await.expect("a connection");
        panic!("the test fails");
    }

    assert!(panic::catch_unwind(panicking).is_err());
    assert!(!database_exists_now(&recorded(&NAME)));
}

#[test]
#[allow(unnameable_test_items)] // the test inside is called by hand, below
fn a_sqlite_test_removes_its_file_passing_or_panicking() {
    static PATH: Mutex<Option<PathBuf>> = Mutex::new(None);
    fn recorded_path() -> PathBuf {
        PATH.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .expect("the test recorded its file")
    }

    #[outbox_testkit::test]
    async fn passing(db: SqliteTestDatabase) {
        *PATH.lock().unwrap_or_else(PoisonError::into_inner) = Some(db.path().to_owned());
    }

    #[outbox_testkit::test(flavor = "current_thread")]
    async fn panicking(db: SqliteTestDatabase) {
        *PATH.lock().unwrap_or_else(PoisonError::into_inner) = Some(db.path().to_owned());
        let _connection = db.pool().acquire().await.expect("a connection");
        panic!("the test fails");
    }

    passing();
    let path = recorded_path();
    assert!(!path.exists(), "{} is left behind", path.display());
    assert!(panic::catch_unwind(AssertUnwindSafe(panicking)).is_err());
    let path = recorded_path();
    assert!(!path.exists(), "{} is left behind", path.display());
    let dir = path.parent().expect("the file's directory");
    assert!(!dir.exists(), "{} is left behind", dir.display());
}

// The functions, without the attribute.

#[tokio::test(flavor = "current_thread")]
async fn migrated_test_databases_come_with_the_outbox_tables() {
    let pg = PgTestDatabase::migrated().await;
    assert_eq!(write_and_read_pg(&pg, "pg").await, ["pg"]);
    let name = pg.name().to_owned();
    drop(pg);
    assert!(!database_exists(&name).await);

    let sqlite = SqliteTestDatabase::migrated().await;
    assert_eq!(write_and_read_sqlite(&sqlite, "sqlite").await, ["sqlite"]);
    let path = sqlite.path().to_owned();
    drop(sqlite);
    assert!(!path.exists());
}
