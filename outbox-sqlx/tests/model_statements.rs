//! Model writes: one statement per table however many models (up to the database's parameter
//! limit), on every backend, and the statements each dialect makes of a table.

use outbox_core::{ModelBatch, ReplicatedModel};

use outbox_core::replicated::ModelTable;
use outbox_postgres::PgDialect;
use outbox_sqlite::SqliteDialect;
use outbox_sqlx::model::{apply, check_pooled};
use outbox_sqlx::sql::{Executes, get};
use outbox_sqlx::{Dialect, Writable, Write};
use outbox_testkit::counting::CountingExecutor;
use outbox_testkit::fixtures::{MODEL_TABLES, Project};
use outbox_testkit::postgres::PgDatabase;
use outbox_testkit::sqlite::SqliteFile;
use outbox_testkit::sqlx::{Provision, SqlxTestDatabase};

/// One statement for the table, one for the outbox, however many models: 100 models, each
/// write two statements, 100 rows and 100 outboxes.
async fn bulk_model_writes_are_one_statement_per_table<P: Provision>()
where
    Project: Writable<P::Dialect>,
{
    let database = SqlxTestDatabase::<P>::migrated().await;
    database.execute(MODEL_TABLES[0]).await;
    let projects: Vec<_> = (1..=100).map(|id| Project::new(id, id % 7, "p")).collect();
    let batch = ModelBatch::local(&projects);
    // The model's check against its table, otherwise one more statement on its first write.
    check_pooled::<P::Dialect, Project>(database.pool())
        .await
        .expect("the model matches");
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

/// A batch larger than one statement's parameters takes as many statements as it needs, each
/// as full as the database allows, and writes every row.
async fn batches_beyond_the_parameter_limit_take_more_statements<P: Provision>()
where
    Project: Writable<P::Dialect>,
{
    let database = SqlxTestDatabase::<P>::migrated().await;
    database.execute(MODEL_TABLES[0]).await;
    let per_statement = <P::Dialect as Dialect>::MAX_PARAMETERS / Project::TABLE.columns.len();
    let count = per_statement * 2 + 1;
    let projects: Vec<_> = (1..=i64::try_from(count).expect("a count"))
        .map(|id| Project::new(id, id % 7, "p"))
        .collect();
    check_pooled::<P::Dialect, Project>(database.pool())
        .await
        .expect("the model matches");
    let mut tx = database.pool().begin().await.expect("begin");
    let mut counting = CountingExecutor::new(&mut tx);
    let written = apply::<P::Dialect, Project, _>(
        &mut counting,
        Write::Insert,
        &ModelBatch::local(&projects),
    )
    .await
    .expect("insert");
    assert_eq!(
        (written.rows, written.ids.len(), counting.statements()),
        (count as u64, count, 3 + 1),
        "three statements of rows, one of outboxes"
    );
    let row = sqlx::query("SELECT count(*), sum(id) FROM projects")
        .fetch_one(<P::Dialect as Dialect>::Database::on(&mut tx))
        .await
        .expect("count");
    let rows: i64 = get::<<P::Dialect as Dialect>::Database, _>(&row, 0).expect("a count");
    assert_eq!(rows, i64::try_from(count).expect("a count"));
}

#[tokio::test]
async fn postgres_batches_beyond_the_parameter_limit_take_more_statements() {
    batches_beyond_the_parameter_limit_take_more_statements::<PgDatabase>().await;
}

#[tokio::test]
async fn sqlite_batches_beyond_the_parameter_limit_take_more_statements() {
    batches_beyond_the_parameter_limit_take_more_statements::<SqliteFile>().await;
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
};

/// Each model's columns are parameters of their own types, numbered row by row; an update
/// joins the rows as a `WITH` of `VALUES`; identifiers are quoted part by part.
#[test]
fn postgres_statements_quote_identifiers_and_bind_each_column() {
    assert_eq!(
        PgDialect::model_sql(Write::Save, &TABLE, 2),
        "INSERT INTO \"app\".\"projects\" (\"id\", \"organization_id\", \"name\") \
         VALUES ($1, $2, $3), ($4, $5, $6) \
         ON CONFLICT (\"id\") DO UPDATE SET \"organization_id\" = EXCLUDED.\"organization_id\", \
         \"name\" = EXCLUDED.\"name\""
    );
    assert_eq!(
        PgDialect::model_sql(Write::Update, &TABLE, 1),
        "WITH s (\"id\", \"organization_id\", \"name\") AS (VALUES ($1, $2, $3)) \
         UPDATE \"app\".\"projects\" SET \"organization_id\" = s.\"organization_id\", \
         \"name\" = s.\"name\" FROM s WHERE \"app\".\"projects\".\"id\" = s.\"id\""
    );
    assert_eq!(
        PgDialect::model_sql(Write::Delete, &TABLE, 2),
        "DELETE FROM \"app\".\"projects\" WHERE \"id\" IN ($1, $2)"
    );
    assert_eq!(
        PgDialect::load_model_sql(&TABLE, false),
        "SELECT to_json(s)::text, s.* FROM (SELECT \"id\", \"organization_id\", \"name\" \
         FROM \"app\".\"projects\" WHERE \"id\" = $1) AS s"
    );
    assert_eq!(
        PgDialect::load_model_sql(&TABLE, true),
        "SELECT to_json(s)::text, s.* FROM (SELECT \"id\", \"organization_id\", \"name\" \
         FROM \"app\".\"projects\" WHERE \"id\" = encode($1::bytea, 'hex')::uuid) AS s"
    );
}

/// SQLite numbers its parameters `?N`; it reads a row's columns as they are.
#[test]
fn sqlite_statements_quote_identifiers_and_bind_each_column() {
    assert_eq!(
        SqliteDialect::model_sql(Write::Insert, &TABLE, 2),
        "INSERT INTO \"app\".\"projects\" (\"id\", \"organization_id\", \"name\") \
         VALUES (?1, ?2, ?3), (?4, ?5, ?6)"
    );
    assert_eq!(
        SqliteDialect::model_sql(Write::Delete, &TABLE, 2),
        "DELETE FROM \"app\".\"projects\" WHERE \"id\" IN (?1, ?2)"
    );
    assert_eq!(
        SqliteDialect::load_model_sql(&TABLE, true),
        "SELECT \"id\", \"organization_id\", \"name\", (SELECT json_group_array(name) \
         FROM pragma_table_info('projects', 'app') WHERE lower(type) IN ('json', 'jsonb')) \
         FROM \"app\".\"projects\" WHERE \"id\" = ?1"
    );
}

/// A table of only its key updates the key on conflict (an empty `SET` is not SQL).
#[test]
fn a_key_only_table_updates_its_key() {
    let table = ModelTable {
        columns: &["id"],
        ..TABLE
    };
    assert!(
        SqliteDialect::model_sql(Write::Save, &table, 1)
            .ends_with("DO UPDATE SET \"id\" = EXCLUDED.\"id\"")
    );
    assert!(
        PgDialect::model_sql(Write::Save, &table, 1)
            .ends_with("DO UPDATE SET \"id\" = EXCLUDED.\"id\"")
    );
}
