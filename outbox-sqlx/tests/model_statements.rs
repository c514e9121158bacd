//! Model writes are one statement per table however many models, on every backend.

use outbox_core::ModelBatch;
use outbox_sqlx::Write;
use outbox_sqlx::model::apply;
use outbox_sqlx::sql::{Executes, get};
use outbox_testkit::counting::CountingExecutor;
use outbox_testkit::fixtures::{MODEL_TABLES, Project};
use outbox_testkit::postgres::PgDatabase;
use outbox_testkit::sqlite::SqliteFile;
use outbox_testkit::sqlx::{Provision, SqlxTestDatabase};

/// One statement for the table, one for the outbox, however many models: 100 models, each
/// write two statements, 100 rows and 100 outboxes.
async fn bulk_model_writes_are_one_statement_per_table<P: Provision>() {
    let database = SqlxTestDatabase::<P>::migrated().await;
    database.execute(MODEL_TABLES[0]).await;
    let projects: Vec<_> = (1..=100).map(|id| Project::new(id, id % 7, "p")).collect();
    let batch = ModelBatch::local(&projects);
    let mut tx = database.pool().begin().await.expect("begin");
    for write in [Write::Insert, Write::Update, Write::Save, Write::Delete] {
        let mut counting = CountingExecutor::new(&mut tx);
        let written = apply::<P::Dialect, Project, _>(&mut counting, write, &batch)
            .await
            .unwrap_or_else(|error| panic!("{write:?}: {error}"));
        assert_eq!(
            (
                write,
                written.rows,
                written.ids.len(),
                counting.statements()
            ),
            (write, 100, 100, 2)
        );
    }
    let row = sqlx::query("SELECT count(*) FROM outbox_messages")
        .fetch_one(<P::Dialect as outbox_sqlx::Dialect>::Database::on(&mut tx))
        .await
        .expect("count");
    let outboxes: i64 =
        get::<<P::Dialect as outbox_sqlx::Dialect>::Database, _>(&row, 0).expect("a count");
    assert_eq!(outboxes, 400, "one outbox per model and write");
}

#[tokio::test]
async fn postgres_model_writes_are_one_statement_per_table() {
    bulk_model_writes_are_one_statement_per_table::<PgDatabase>().await;
}

#[tokio::test]
async fn sqlite_model_writes_are_one_statement_per_table() {
    bulk_model_writes_are_one_statement_per_table::<SqliteFile>().await;
}
