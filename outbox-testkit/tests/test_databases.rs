//! The test kit's databases on a shared server: each one listed while a test holds it and gone
//! once it is dropped, and a drop that fails failing loudly rather than leaving the database
//! behind without a word.

#![cfg(feature = "postgres")]

use std::panic::{AssertUnwindSafe, catch_unwind};

use outbox_testkit::postgres::{PgTestDatabase, server_url, test_databases};
use sqlx::{AssertSqlSafe, Connection, PgConnection};

async fn server() -> PgConnection {
    PgConnection::connect(&server_url())
        .await
        .expect("the test server")
}

#[tokio::test]
async fn a_postgres_test_database_is_listed_until_it_is_dropped() {
    let db = PgTestDatabase::create().await;
    let name = db.name().to_owned();
    assert!(name.starts_with(outbox_testkit::sqlx::TEST_DATABASE_PREFIX));
    assert!(test_databases().await.expect("listed").contains(&name));
    drop(db);
    assert!(!test_databases().await.expect("listed").contains(&name));
}

#[tokio::test]
async fn a_test_database_that_cannot_be_dropped_fails_its_test_naming_it() {
    let db = PgTestDatabase::create().await;
    let name = db.name().to_owned();
    let mut server = server().await;
    // PostgreSQL refuses to drop a template database.
    sqlx::query(AssertSqlSafe(format!(
        "ALTER DATABASE \"{name}\" IS_TEMPLATE true"
    )))
    .execute(&mut server)
    .await
    .expect("mark the database a template");

    let dropped = catch_unwind(AssertUnwindSafe(|| drop(db)));

    let panic = dropped.expect_err("a drop that failed must fail the test");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains(&name) && message.contains("template"),
        "the panic names the database and the server's reason: {message}"
    );
    assert!(test_databases().await.expect("listed").contains(&name));
    for statement in [
        format!("ALTER DATABASE \"{name}\" IS_TEMPLATE false"),
        format!("DROP DATABASE \"{name}\""),
    ] {
        sqlx::query(AssertSqlSafe(statement))
            .execute(&mut server)
            .await
            .expect("drop the database by hand");
    }
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn a_mariadb_test_database_is_listed_until_it_is_dropped() {
    use outbox_testkit::mysql::{MySqlTestDatabase, test_databases};
    let db = MySqlTestDatabase::create().await;
    let name = db.name().to_owned();
    assert!(test_databases().await.expect("listed").contains(&name));
    drop(db);
    assert!(!test_databases().await.expect("listed").contains(&name));
}
