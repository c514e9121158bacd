//! Model writes: one statement per table however many models, on every backend, and the
//! statements each dialect makes of a table.

use outbox_core::{ModelBatch, ModelTable};
use outbox_postgres::PgDialect;
use outbox_sqlite::SqliteDialect;
use outbox_sqlx::model::{apply, model_sql};
use outbox_sqlx::sql::{Executes, get};
use outbox_sqlx::{Dialect, Write};
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
        .fetch_one(<P::Dialect as Dialect>::Database::on(&mut tx))
        .await
        .expect("count");
    let outboxes: i64 = get::<<P::Dialect as Dialect>::Database, _>(&row, 0).expect("a count");
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

const TABLE: ModelTable = ModelTable {
    table: "app.projects",
    key: "id",
    columns: &["id", "organization_id", "name"],
    bool_columns: &[],
};

/// PostgreSQL types the rows as the table's own (`json_populate_recordset`), so it converts
/// each value to its column's type; identifiers are quoted part by part.
#[test]
fn postgres_statements_quote_identifiers_and_type_the_rows() {
    assert_eq!(
        model_sql::<PgDialect>(Write::Save, &TABLE),
        "INSERT INTO \"app\".\"projects\" (\"id\", \"organization_id\", \"name\") \
         SELECT s.\"id\", s.\"organization_id\", s.\"name\" \
         FROM json_populate_recordset(NULL::\"app\".\"projects\", $1::text::json) AS s \
         WHERE true \
         ON CONFLICT (\"id\") DO UPDATE SET \"organization_id\" = EXCLUDED.\"organization_id\", \
         \"name\" = EXCLUDED.\"name\""
    );
    assert_eq!(
        model_sql::<PgDialect>(Write::Update, &TABLE),
        "UPDATE \"app\".\"projects\" SET \"organization_id\" = s.\"organization_id\", \
         \"name\" = s.\"name\" \
         FROM json_populate_recordset(NULL::\"app\".\"projects\", $1::text::json) AS s \
         WHERE \"app\".\"projects\".\"id\" = s.\"id\""
    );
    assert_eq!(
        model_sql::<PgDialect>(Write::Delete, &TABLE),
        "DELETE FROM \"app\".\"projects\" WHERE \"id\" = ANY($1)"
    );
    assert_eq!(
        PgDialect::load_model_sql(&TABLE),
        "SELECT to_json(s)::text FROM (SELECT \"id\", \"organization_id\", \"name\" \
         FROM \"app\".\"projects\" WHERE \"id\" = $1) AS s"
    );
}

/// SQLite reads each column out of the JSON rows; a column name is quoted inside its label.
#[test]
fn sqlite_statements_quote_identifiers_and_read_json() {
    assert_eq!(
        model_sql::<SqliteDialect>(Write::Save, &TABLE),
        "INSERT INTO \"app\".\"projects\" (\"id\", \"organization_id\", \"name\") \
         SELECT s.value ->> 'id', s.value ->> 'organization_id', s.value ->> 'name' \
         FROM json_each(?1) AS s WHERE true \
         ON CONFLICT (\"id\") DO UPDATE SET \"organization_id\" = EXCLUDED.\"organization_id\", \
         \"name\" = EXCLUDED.\"name\""
    );
    assert_eq!(
        model_sql::<SqliteDialect>(Write::Update, &TABLE),
        "UPDATE \"app\".\"projects\" SET \"organization_id\" = s.value ->> 'organization_id', \
         \"name\" = s.value ->> 'name' FROM json_each(?1) AS s \
         WHERE \"app\".\"projects\".\"id\" = s.value ->> 'id'"
    );
    assert_eq!(
        SqliteDialect::load_model_sql(&TABLE),
        "SELECT json_object('id', \"id\", 'organization_id', \"organization_id\", 'name', \
         \"name\") FROM \"app\".\"projects\" WHERE \"id\" = ?1"
    );
    assert_eq!(SqliteDialect::model_value("it's"), "s.value ->> 'it''s'");
}

/// A table of only its key updates the key on conflict (an empty `SET` is not SQL).
#[test]
fn a_key_only_table_updates_its_key() {
    let table = ModelTable {
        columns: &["id"],
        ..TABLE
    };
    assert!(
        model_sql::<SqliteDialect>(Write::Save, &table)
            .ends_with("DO UPDATE SET \"id\" = EXCLUDED.\"id\"")
    );
    assert!(
        model_sql::<PgDialect>(Write::Save, &table)
            .ends_with("DO UPDATE SET \"id\" = EXCLUDED.\"id\"")
    );
}
